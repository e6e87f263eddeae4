// Hugging Face model folders (engine/io): what `export` writes loads back to
// the same logits as the synthetic weights it came from, in f32 exactly and in
// bf16/f16 closely; a broken folder is refused by `run` with exit 2, one
// stderr line naming the file (and tensor), an `error` event, and no logits
// file left behind.
#include <QtTest>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/allocator.h"
#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "io/checkpoint.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "protocol/events.h"

namespace fs = std::filesystem;

Q_DECLARE_METATYPE(ss::DType)

namespace {

constexpr uint64_t kSeed = 11;
const std::vector<int32_t> kTokens = {3, 141, 59, 26, 5, 35, 89, 79, 32, 38, 46};

fs::path to_path(const QString& s) {
  return fs::path(s.toStdString());
}

// Logits [T, vocab] of a whole-prompt forward, weights from `dir` (a model
// folder) or, when `dir` is empty, the synthetic weights of kSeed.
std::vector<float> forward_logits(const ss::ModelConfig& cfg, const fs::path& dir) {
  ss::Allocator alloc;
  ss::Recorder rec;
  ss::CpuBackend be(alloc, rec);
  ss::Model model(cfg, be);
  std::unique_ptr<ss::TensorSource> src;
  if (dir.empty())
    src = std::make_unique<ss::SyntheticSource>(kSeed);
  else
    src = std::make_unique<ss::CheckpointSource>(dir, model.weights());
  model.load(*src);
  ss::Cache cache = model.make_cache(int64_t(kTokens.size()));
  std::vector<int32_t> pos(kTokens.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i);
  ss::Tensor logits = model.forward(kTokens, pos, cache, /*all_logits=*/true);
  std::vector<float> out(size_t(logits.numel()));
  be.download(logits, out.data());
  return out;
}

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = double(got[i]) - double(want[i]);
    num += d * d;
    den += double(want[i]) * double(want[i]);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// max |got - want| / max |want|: every element, not only on average.
double rel_max(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff = std::max(diff, std::fabs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  return diff / std::max(scale, 1e-300);
}

std::vector<fs::path> files_ending(const fs::path& dir, const std::string& suffix) {
  std::vector<fs::path> out;
  for (auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() >= suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      out.push_back(e.path());
  }
  return out;
}

std::vector<ss::TensorBlob> read_all(const ss::SafetensorsIndex& idx) {
  std::vector<ss::TensorBlob> blobs;
  for (auto& [name, e] : idx.entries()) blobs.push_back({name, e.dtype, e.shape, idx.read(name)});
  return blobs;
}

void rewrite(const fs::path& file, const std::vector<ss::TensorBlob>& blobs) {
  std::vector<const ss::TensorBlob*> ptrs;
  for (auto& b : blobs) ptrs.push_back(&b);
  ss::write_safetensors(file, ptrs);
}

// The ways a model folder can be broken; each row of errorCases names one.
enum class Break {
  MissingTensor,
  WrongShape,
  ShapeDisagreesWithOffsets,
  ShapeOverflows,
  OffsetsBeyondInt64,
  UnsupportedDtype,
  IntegerTensor,
  TruncatedData,
  TruncatedHeader,
  CorruptHeader,
  ZeroHeaderLength,
  MissingShardFile,
  TensorMissingFromShard,
  UnknownArchitecture,
  MissingConfig,
  ConfigNotJson,
};

// Rewrites the JSON header of a safetensors file, keeping its data bytes.
void edit_header(const fs::path& file, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(file, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | uint8_t(all[size_t(i)]);
  nlohmann::json h = nlohmann::json::parse(all.substr(8, hlen));
  edit(h);
  std::string text = h.dump();
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(char((uint64_t(text.size()) >> (8 * i)) & 0xff));
  out += text;
  out += all.substr(8 + hlen);
  std::ofstream(file, std::ios::binary | std::ios::trunc) << out;
}

const char* kVictim = "model.layers.1.mlp.up_proj.weight";  // tiny-llama: [160, 64]

}  // namespace

class TestCheckpoint : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() { QVERIFY2(QFileInfo::exists(SHARDSCOPE_ENGINE_BIN), SHARDSCOPE_ENGINE_BIN); }

  void exportedWeightsGiveSyntheticLogits_data() {
    QTest::addColumn<QString>("preset");
    QTest::addColumn<ss::DType>("dtype");
    QTest::addColumn<int>("shards");
    QTest::addColumn<double>("tolerance");  // on rel_max for f32, on rel_l2 otherwise
    for (const char* preset : {"tiny-llama", "tiny-mamba", "tiny-falcon-mamba", "tiny-mamba2"}) {
      for (int shards : {1, 3}) {
        const QByteArray tag = QByteArray(preset) + (shards > 1 ? " sharded" : " single");
        QTest::newRow((tag + " f32").constData()) << preset << ss::DType::F32 << shards << 1e-6;
        QTest::newRow((tag + " bf16").constData()) << preset << ss::DType::BF16 << shards << 2e-2;
        QTest::newRow((tag + " f16").constData()) << preset << ss::DType::F16 << shards << 2e-2;
      }
    }
  }
  void exportedWeightsGiveSyntheticLogits() {
    QFETCH(QString, preset);
    QFETCH(ss::DType, dtype);
    QFETCH(int, shards);
    QFETCH(double, tolerance);
    QTemporaryDir tmp;
    QVERIFY(tmp.isValid());
    const fs::path dir = to_path(tmp.path()) / "model";

    const ss::ModelConfig cfg = ss::resolve_model(preset.toStdString(), nullptr);
    ss::export_checkpoint(cfg, kSeed, dir, dtype, shards);

    // The folder has the layout Hugging Face tools expect.
    QVERIFY(fs::exists(dir / "config.json"));
    if (shards == 1) {
      QVERIFY(fs::exists(dir / "model.safetensors"));
      QVERIFY(!fs::exists(dir / "model.safetensors.index.json"));
    } else {
      QVERIFY(fs::exists(dir / "model.safetensors.index.json"));
      QVERIFY(!fs::exists(dir / "model.safetensors"));
      QCOMPARE(int(files_ending(dir, ".safetensors").size()), shards);
      for (int s = 1; s <= shards; ++s) {
        char name[64];
        std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s, shards);
        QVERIFY2(fs::exists(dir / name), name);
      }
    }
    QVERIFY(files_ending(dir, ".tmp").empty());

    fs::path found;
    const ss::ModelConfig loaded = ss::resolve_model(dir.string(), &found);
    QCOMPARE(found.string(), dir.string());
    QCOMPARE(loaded.model_type, cfg.model_type);
    QCOMPARE(loaded.to_json().dump(), cfg.to_json().dump());

    // Every tensor is stored in the dtype asked for, once.
    const ss::SafetensorsIndex idx = ss::SafetensorsIndex::open_dir(dir);
    {
      ss::Allocator alloc;
      ss::Recorder rec;
      ss::CpuBackend be(alloc, rec);
      ss::Model model(cfg, be);
      QCOMPARE(idx.entries().size(), model.weights().size());
    }
    for (auto& [name, e] : idx.entries()) QVERIFY2(e.dtype == dtype, name.c_str());

    const std::vector<float> want = forward_logits(cfg, {});
    const std::vector<float> got = forward_logits(loaded, dir);
    QCOMPARE(got.size(), size_t(kTokens.size()) * size_t(cfg.vocab));
    if (dtype == ss::DType::F32) {
      const double err = rel_max(got, want);
      QVERIFY2(err <= tolerance, qPrintable(QString("relative max error %1").arg(err)));
    } else {
      const double err = rel_l2(got, want);
      QVERIFY2(err < tolerance, qPrintable(QString("relative L2 error %1").arg(err)));
      // The folder really holds rounded weights, so the logits move a little.
      QVERIFY2(err > 0, "16-bit weights gave exactly the f32 logits");
    }
  }

  // The CLI end to end: `export` then `run --model DIR` gives, token for
  // token through prefill and decode, the logits of the preset it came from.
  void cliExportThenRunMatchesPreset() {
    QTemporaryDir tmp;
    QVERIFY(tmp.isValid());
    const QString dir = tmp.filePath("m2");
    auto engine = [&](const QStringList& args) {
      QProcess p;
      p.start(SHARDSCOPE_ENGINE_BIN, args);
      if (!p.waitForFinished(60000)) return QString("timed out");
      if (p.exitStatus() != QProcess::NormalExit || p.exitCode() != 0)
        return QString("exit %1: %2")
            .arg(p.exitCode())
            .arg(QString::fromUtf8(p.readAllStandardError()));
      return QString();
    };
    QCOMPARE(
        engine({"export", "--model", "tiny-mamba2", "--seed", "7", "--out", dir, "--shards", "3"}),
        QString());
    const QStringList common = {"--tokens", "5,17,200,3,9,9,41", "--decode", "4", "--seed", "7"};
    QCOMPARE(engine(QStringList{"run", "--model", dir, "--logits-out", tmp.filePath("ckpt.npy")} +
                    common),
             QString());
    QCOMPARE(engine(QStringList{"run", "--model", "tiny-mamba2", "--logits-out",
                                tmp.filePath("preset.npy")} +
                    common),
             QString());
    const ss::NpyArray a = ss::read_npy(to_path(tmp.filePath("ckpt.npy")));
    const ss::NpyArray b = ss::read_npy(to_path(tmp.filePath("preset.npy")));
    QCOMPARE(a.shape, (std::vector<int64_t>{7 + 4, 256}));
    QCOMPARE(b.shape, a.shape);
    const double err = rel_max(a.data, b.data);
    QVERIFY2(err <= 1e-6, qPrintable(QString("relative max error %1").arg(err)));
  }

  void errorCases_data() {
    QTest::addColumn<int>("how");
    QTest::addColumn<int>("shards");
    QTest::addColumn<QString>("file");    // the file the message must name
    QTest::addColumn<QString>("tensor");  // the tensor it must name, if any
    const QString single = "model.safetensors", shard2 = "model-00002-of-00003.safetensors";
    QTest::newRow("missing tensor") << int(Break::MissingTensor) << 1 << single << kVictim;
    QTest::newRow("wrong shape") << int(Break::WrongShape) << 1 << single << kVictim;
    QTest::newRow("shape disagrees with data_offsets")
        << int(Break::ShapeDisagreesWithOffsets) << 1 << single << kVictim;
    // Regressions: sizes that overflow int64 were computed before being refused.
    QTest::newRow("shape product overflows") << int(Break::ShapeOverflows) << 1 << single << kVictim;
    QTest::newRow("data_offsets beyond int64") << int(Break::OffsetsBeyondInt64) << 1 << single << kVictim;
    QTest::newRow("unsupported dtype") << int(Break::UnsupportedDtype) << 1 << single << kVictim;
    // A dtype the engine has (token ids) but weights cannot be: refused by name as the file is opened.
    QTest::newRow("integer weight") << int(Break::IntegerTensor) << 1 << single << kVictim;
    QTest::newRow("truncated data") << int(Break::TruncatedData) << 1 << single << "";
    QTest::newRow("truncated header") << int(Break::TruncatedHeader) << 1 << single << "";
    QTest::newRow("corrupt header") << int(Break::CorruptHeader) << 1 << single << "";
    QTest::newRow("zero header length") << int(Break::ZeroHeaderLength) << 1 << single << "";
    QTest::newRow("sharded: truncated shard") << int(Break::TruncatedData) << 3 << shard2 << "";
    QTest::newRow("sharded: missing shard file")
        << int(Break::MissingShardFile) << 3 << shard2 << "";
    QTest::newRow("sharded: tensor missing from its shard")
        << int(Break::TensorMissingFromShard) << 3 << shard2 << "";
    QTest::newRow("sharded: missing tensor")
        << int(Break::MissingTensor) << 3 << "model.safetensors.index.json" << kVictim;
    QTest::newRow("unknown architecture") << int(Break::UnknownArchitecture) << 1 << "config.json"
                                          << "gpt2";
    QTest::newRow("missing config.json") << int(Break::MissingConfig) << 1 << "config.json"
                                         << "";
    QTest::newRow("config.json not JSON") << int(Break::ConfigNotJson) << 1 << "config.json"
                                          << "";
  }
  void errorCases() {
    QFETCH(int, how);
    QFETCH(int, shards);
    QFETCH(QString, file);
    QFETCH(QString, tensor);
    QTemporaryDir tmp;
    QVERIFY(tmp.isValid());
    const fs::path dir = to_path(tmp.path()) / "broken";
    ss::export_checkpoint(ss::resolve_model("tiny-llama", nullptr), kSeed, dir, ss::DType::F32,
                          shards);
    const fs::path st = dir / file.toStdString();

    switch (Break(how)) {
      case Break::MissingTensor: {
        // Drop the tensor from its file (and from the index when sharded).
        fs::path holder = dir / "model.safetensors";
        if (shards > 1) {
          std::ifstream in(dir / "model.safetensors.index.json");
          nlohmann::json index = nlohmann::json::parse(in);
          holder = dir / index["weight_map"][kVictim].get<std::string>();
          index["weight_map"].erase(kVictim);
          in.close();
          std::ofstream(dir / "model.safetensors.index.json") << index.dump(2);
        }
        std::vector<ss::TensorBlob> blobs = read_all(ss::SafetensorsIndex::open_file(holder));
        std::erase_if(blobs, [](const ss::TensorBlob& b) { return b.name == kVictim; });
        rewrite(holder, blobs);
        break;
      }
      case Break::WrongShape: {
        // Same byte count, other shape: only the model's own check can see it.
        std::vector<ss::TensorBlob> blobs = read_all(ss::SafetensorsIndex::open_file(st));
        for (auto& b : blobs)
          if (b.name == kVictim) b.shape = {64, 160};
        rewrite(st, blobs);
        break;
      }
      case Break::ShapeDisagreesWithOffsets:
        edit_header(st, [](nlohmann::json& h) { h[kVictim]["shape"] = {160, 65}; });
        break;
      case Break::ShapeOverflows:
        edit_header(st, [](nlohmann::json& h) { h[kVictim]["shape"] = {uint64_t(1) << 62, 128}; });
        break;
      case Break::OffsetsBeyondInt64:
        edit_header(st, [](nlohmann::json& h) {
          h[kVictim]["data_offsets"] = {0, uint64_t(18446744073709551000ull)};
        });
        break;
      case Break::UnsupportedDtype:
        edit_header(st, [](nlohmann::json& h) { h[kVictim]["dtype"] = "I8"; });
        break;
      case Break::IntegerTensor:  // the same 4 bytes a value, read as int32
        edit_header(st, [](nlohmann::json& h) { h[kVictim]["dtype"] = "I32"; });
        break;
      case Break::TruncatedData:
        fs::resize_file(st, fs::file_size(st) / 2);
        break;
      case Break::TruncatedHeader:
        fs::resize_file(st, 40);
        break;
      case Break::CorruptHeader: {
        std::fstream f(st, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(8);
        f.write("#!garbage{{{[[", 14);
        break;
      }
      case Break::ZeroHeaderLength: {
        std::fstream f(st, std::ios::in | std::ios::out | std::ios::binary);
        f.write("\0\0\0\0\0\0\0\0", 8);
        break;
      }
      case Break::MissingShardFile:
        fs::remove(st);
        break;
      case Break::TensorMissingFromShard: {
        std::vector<ss::TensorBlob> blobs = read_all(ss::SafetensorsIndex::open_file(st));
        QVERIFY(blobs.size() > 1);
        blobs.erase(blobs.begin());
        rewrite(st, blobs);
        break;
      }
      case Break::UnknownArchitecture: {
        std::ifstream in(dir / "config.json");
        nlohmann::json j = nlohmann::json::parse(in);
        in.close();
        j["model_type"] = "gpt2";
        std::ofstream(dir / "config.json") << j.dump(2);
        break;
      }
      case Break::MissingConfig:
        fs::remove(dir / "config.json");
        break;
      case Break::ConfigNotJson:
        std::ofstream(dir / "config.json") << "{\"model_type\": \"llama\",";
        break;
    }

    const QString out = tmp.filePath("logits.npy");
    QProcess p;
    p.start(SHARDSCOPE_ENGINE_BIN, {"run", "--model", QString::fromStdString(dir.string()),
                                    "--prompt-len", "8", "--logits-out", out});
    QVERIFY(p.waitForFinished(60000));
    QCOMPARE(p.exitStatus(), QProcess::NormalExit);  // not a signal: no crash
    QCOMPARE(p.exitCode(), int(ss::kExitUsage));

    const QString err = QString::fromUtf8(p.readAllStandardError());
    const QStringList lines = err.split('\n', Qt::SkipEmptyParts);
    QVERIFY2(lines.size() == 1, qPrintable(err));
    const QString line = lines.front();
    QVERIFY2(line.startsWith("shardscope-engine: error: "), qPrintable(line));
    // The path as given, so a person can open the file named.
    QVERIFY2(line.contains(QString::fromStdString(st.string())), qPrintable(line));
    if (!tensor.isEmpty()) QVERIFY2(line.contains(tensor), qPrintable(line));
    // Sizes that do not fit in int64 are refused as such, not after wrapping around.
    if (Break(how) == Break::ShapeOverflows) QVERIFY2(line.contains("too large"), qPrintable(line));
    if (Break(how) == Break::OffsetsBeyondInt64) QVERIFY2(line.contains("within the file"), qPrintable(line));
    if (Break(how) == Break::IntegerTensor) QVERIFY2(line.contains("dtype I32 is not supported"), qPrintable(line));

    // The stream a GUI reads says the same, and ends.
    ss::proto::Reader reader;
    std::vector<ss::proto::Event> events;
    std::vector<std::string> bad;
    const QByteArray stream = p.readAllStandardOutput();
    reader.feed(
        std::string_view(stream.constData(), size_t(stream.size())),
        [&](ss::proto::Event e) { events.push_back(std::move(e)); },
        [&](const std::string& m) { bad.push_back(m); });
    reader.finish([&](ss::proto::Event e) { events.push_back(std::move(e)); },
                  [&](const std::string& m) { bad.push_back(m); });
    QVERIFY2(bad.empty(), bad.empty() ? "" : bad.front().c_str());
    QVERIFY(events.size() >= 3);
    QVERIFY(std::holds_alternative<ss::proto::Hello>(events.front()));
    int errors = 0;
    for (auto& e : events)
      if (auto* x = std::get_if<ss::proto::Error>(&e)) {
        ++errors;
        QCOMPARE(x->code, std::string("format"));
        QCOMPARE("shardscope-engine: error: " + QString::fromStdString(x->message), line);
      }
    QCOMPARE(errors, 1);
    const auto* done = std::get_if<ss::proto::Done>(&events.back());
    QVERIFY(done);
    QCOMPARE(done->status, std::string("failed"));
    QCOMPARE(done->exit_code, int(ss::kExitUsage));

    QVERIFY(!QFileInfo::exists(out));
    QVERIFY(!QFileInfo::exists(out + ".tmp"));
    QVERIFY(files_ending(to_path(tmp.path()), ".tmp").empty());
  }

  // The same checks in the library, without a process: the source refuses the
  // folder before a byte of weights is allocated.
  void sourceRefusesBeforeAllocating() {
    QTemporaryDir tmp;
    QVERIFY(tmp.isValid());
    const fs::path dir = to_path(tmp.path()) / "m";
    const ss::ModelConfig cfg = ss::resolve_model("tiny-llama", nullptr);
    ss::export_checkpoint(cfg, kSeed, dir, ss::DType::F32, 1);
    std::vector<ss::TensorBlob> blobs =
        read_all(ss::SafetensorsIndex::open_file(dir / "model.safetensors"));
    std::erase_if(blobs, [](const ss::TensorBlob& b) { return b.name == kVictim; });
    rewrite(dir / "model.safetensors", blobs);

    ss::Allocator alloc;
    ss::Recorder rec;
    ss::CpuBackend be(alloc, rec);
    ss::Model model(cfg, be);
    try {
      ss::CheckpointSource src(dir, model.weights());
      QFAIL("a folder without a needed tensor was accepted");
    } catch (const ss::FormatError& e) {
      QVERIFY2(std::string(e.what()).find(kVictim) != std::string::npos, e.what());
    }
    QCOMPARE(alloc.state().peak_total, int64_t(0));
  }
};

QTEST_GUILESS_MAIN(TestCheckpoint)
#include "tst_checkpoint.moc"

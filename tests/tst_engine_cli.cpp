// The `shardscope-engine` command line, run as the GUI runs it (QProcess):
// a `run` writes a whole v1 stream the Reader accepts, --logits-out and
// --events write what they promise, running out of --capacity is an `oom`
// with exit 3, and bad input is exit 2 with one stderr line.
#include <QTemporaryDir>
#include <QtTest>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/allocator.h"
#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "io/npy.h"
#include "model/model.h"
#include "engine_process.h"
#include "protocol/analysis.h"
#include "protocol/events.h"
#include "runtime/sampling.h"
#include "text/bpe_train.h"

using namespace ss::proto;

namespace {

const QStringList kPresets = {"tiny-llama", "tiny-mamba", "tiny-falcon-mamba", "tiny-mamba2",
                              "tiny-hybrid"};
const std::vector<std::string> kCategories = {"weights",   "activations",  "kv_cache",
                                              "ssm_state", "comm_buffers", "workspace"};

int count_lines(const QByteArray& bytes) {
  return int(bytes.split('\n').size()) - (bytes.endsWith('\n') ? 1 : 0);
}

// The weights a preset's model declares, by HF name.
std::map<std::string, ss::Shape> weight_shapes(const std::string& preset) {
  ss::Allocator alloc;
  ss::Recorder rec;
  ss::CpuBackend be(alloc, rec);
  ss::Model model(ss::resolve_model(preset, nullptr), be);
  std::map<std::string, ss::Shape> out;
  for (auto& w : model.weights()) out[w.name] = w.shape;
  return out;
}

// A stream with its times and measured values (metrics, a cpu device's share
// of host memory) blanked: what two runs of the
// same configuration must agree on. Memory samples are left out: changes
// closer than a microsecond share one sample, so their count varies.
std::vector<std::string> without_times(const Stream& s) {
  std::vector<std::string> out;
  for (auto& e : s.events) {
    if (std::holds_alternative<Mem>(e)) continue;
    nlohmann::json j = to_json(e);
    for (const char* k : {"t", "t0", "t1"}) j.erase(k);
    if (j["type"] == "metric") j.erase("value");
    if (j["type"] == "device") j.erase("capacity");  // the host's available memory, measured as it starts
    out.push_back(j.dump());
  }
  return out;
}

// Bad input's ending: exit 2, no crash, one stderr line that says `says`.
void refusedInOneLine(const Ran& r, const QString& says) {
  QVERIFY2(!r.crashed, "the engine crashed");
  QCOMPARE(r.exit_code, int(ss::kExitUsage));
  QVERIFY2(count_lines(r.err) == 1, r.err.constData());
  QVERIFY2(one_line(r.err).contains(says), r.err.constData());
}

}  // namespace

class TestEngineCli : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() { QVERIFY2(QFileInfo::exists(SHARDSCOPE_ENGINE_BIN), SHARDSCOPE_ENGINE_BIN); }

  void runStream_data() {
    QTest::addColumn<QString>("preset");
    for (auto& p : kPresets) QTest::newRow(qPrintable(p)) << p;
  }
  void runStream() {
    QFETCH(QString, preset);
    const int prompt = 12, decode = 4;
    const Ran r = engine({"run", "--model", preset, "--prompt-len", QString::number(prompt),
                          "--decode", QString::number(decode), "--seed", "3"});
    QVERIFY(!r.crashed);
    QVERIFY2(r.exit_code == 0, r.err.constData());
    QVERIFY2(r.err.isEmpty(), r.err.constData());

    const Stream s = read_stream(r.out);
    QVERIFY2(s.errors.empty(), s.errors.empty() ? "" : s.errors.front().c_str());
    QCOMPARE(s.rejected, int64_t(0));
    QCOMPARE(int(s.events.size()), count_lines(r.out));  // every line became a record

    // Framing: hello first, done last and ok.
    QVERIFY(std::holds_alternative<Hello>(s.events.front()));
    QCOMPARE(std::get<Hello>(s.events.front()).version, 1);
    const auto* done = std::get_if<Done>(&s.events.back());
    QVERIFY(done);
    QCOMPARE(done->status, std::string("ok"));
    QCOMPARE(done->exit_code, 0);
    QCOMPARE(int(s.all<Done>().size()), 1);
    QVERIFY(s.all<Error>().empty());

    // Setup records.
    QCOMPARE(int(s.all<Config>().size()), 1);
    const nlohmann::json& conf = s.all<Config>().front()->config;
    QCOMPARE(conf["model"]["name"].get<std::string>(), preset.toStdString());
    QCOMPARE(conf["workload"]["prompt_len"].get<int>(), prompt);
    QCOMPARE(conf["workload"]["decode"].get<int>(), decode);
    QCOMPARE(int(s.all<Device>().size()), 1);
    QCOMPARE(s.all<Device>().front()->kind, std::string("cpu"));
    QCOMPARE(s.all<Device>().front()->rank, 0);
    QCOMPARE(int(s.all<Tokens>().size()), 1);
    QCOMPARE(s.all<Tokens>().front()->ranges,
             (std::vector<std::pair<int64_t, int64_t>>{{0, int64_t(prompt + decode)}}));

    // One placement per weight of the model, with its global shape, held whole.
    const auto shapes = weight_shapes(preset.toStdString());
    std::set<std::string> placed;
    int64_t placed_bytes = 0;
    for (auto* p : s.all<Placement>()) {
      QVERIFY2(shapes.count(p->tensor), p->tensor.c_str());
      QVERIFY2(placed.insert(p->tensor).second, p->tensor.c_str());
      QCOMPARE(p->shape, shapes.at(p->tensor));
      QCOMPARE(p->mode, std::string("mirrored"));
      QCOMPARE(p->bytes, ss::numel(p->shape) * 4);
      QCOMPARE(p->rank, 0);
      placed_bytes += p->bytes;
    }
    QCOMPARE(placed.size(), shapes.size());

    // Phases in order, and spans of prefill and decode inside the run.
    std::vector<std::string> phases;
    for (auto* p : s.all<Phase>()) phases.push_back(p->name);
    QCOMPARE(phases, (std::vector<std::string>{"load", "prefill", "decode"}));
    std::map<std::string, int> spans_by_phase;
    for (auto* sp : s.all<Span>()) {
      QVERIFY(sp->t0 >= 0 && sp->t1 >= sp->t0 && sp->t1 <= done->t);
      QVERIFY2(sp->stream == "compute" || sp->stream == "comm", sp->stream.c_str());
      QVERIFY(!sp->op.empty());
      QVERIFY(sp->flops >= 0 && sp->bytes >= 0);
      ++spans_by_phase[sp->phase];
    }
    QVERIFY(spans_by_phase["prefill"] > 0);
    QVERIFY(spans_by_phase["decode"] > 0);

    // Memory samples: non-negative, in time order, peaks consistent.
    const auto mems = s.all<Mem>();
    QVERIFY(!mems.empty());
    int64_t last_t = 0, max_peak = 0;
    for (auto* m : mems) {
      int64_t total = 0;
      for (int64_t b : m->bytes) {
        QVERIFY(b >= 0);
        total += b;
      }
      QVERIFY2(total <= m->peak, qPrintable(QString("total %1 > peak %2").arg(total).arg(m->peak)));
      QVERIFY(m->t >= last_t);
      last_t = m->t;
      max_peak = std::max(max_peak, m->peak);
    }

    // Metrics.
    const auto m = s.metrics();
    for (const char* name :
         {"ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "decode_ms_per_token"}) {
      QVERIFY2(m.count(name), name);
      QVERIFY2(m.at(name) > 0 && std::isfinite(m.at(name)), name);
    }
    QVERIFY(m.count("parameters"));
    QCOMPARE(int64_t(m.at("parameters")), conf["parameters"].get<int64_t>());
    for (auto& c : kCategories) QVERIFY2(m.count("peak_" + c + "_bytes"), c.c_str());
    QVERIFY(m.count("peak_bytes"));
    QCOMPARE(int64_t(m.at("peak_weights_bytes")), placed_bytes);
    QVERIFY(m.at("peak_bytes") >= m.at("peak_weights_bytes"));
    QCOMPARE(int64_t(m.at("peak_bytes")), max_peak);
    // Each family's state lands in its own category.
    const bool attention = preset == "tiny-llama" || preset == "tiny-hybrid";
    const bool ssm = preset != "tiny-llama";
    QCOMPARE(m.at("peak_kv_cache_bytes") > 0, attention);
    QCOMPARE(m.at("peak_ssm_state_bytes") > 0, ssm);
    QVERIFY(m.at("peak_activations_bytes") > 0);
  }

  // Row i of --logits-out is the logits after token i; decoding token by token
  // must give the rows that one prefill of the whole sequence gives.
  void logitsOut_data() {
    QTest::addColumn<QString>("preset");
    for (auto& p : kPresets) QTest::newRow(qPrintable(p)) << p;
  }
  void logitsOut() {
    QFETCH(QString, preset);
    QTemporaryDir tmp;
    QVERIFY(tmp.isValid());
    const QStringList prompt = {"7", "250", "3", "3", "99", "18"};
    const int decode = 5, vocab = 256;
    const QString a = tmp.filePath("decoded.npy");
    Ran r = engine({"run", "--model", preset, "--tokens", prompt.join(','), "--decode",
                    QString::number(decode), "--logits-out", a});
    QVERIFY2(r.exit_code == 0 && !r.crashed, r.err.constData());
    const ss::NpyArray got = ss::read_npy(a.toStdString());
    QCOMPARE(got.shape, (std::vector<int64_t>{int64_t(prompt.size()) + decode, vocab}));
    // The header is padded to a multiple of 64 bytes, then float32 data.
    QCOMPARE((QFileInfo(a).size() - qint64(got.data.size() * 4)) % 64, qint64(0));
    QVERIFY(!QFileInfo::exists(a + ".tmp"));
    for (float v : got.data) QVERIFY(std::isfinite(v));

    // The greedy tokens, read back from the rows, then the whole sequence at once.
    QStringList all = prompt;
    for (int k = 0; k < decode - 1; ++k) {
      const float* row = got.data.data() + size_t(int(prompt.size()) - 1 + k) * vocab;
      all << QString::number(std::max_element(row, row + vocab) - row);
    }
    const QString b = tmp.filePath("prefilled.npy");
    r = engine({"run", "--model", preset, "--tokens", all.join(','), "--logits-out", b});
    QVERIFY2(r.exit_code == 0 && !r.crashed, r.err.constData());
    const ss::NpyArray want = ss::read_npy(b.toStdString());
    QCOMPARE(want.shape, (std::vector<int64_t>{int64_t(all.size()), vocab}));
    double diff = 0, scale = 0;
    for (size_t i = 0; i < want.data.size(); ++i) {
      diff = std::max(diff, double(std::fabs(got.data[i] - want.data[i])));
      scale = std::max(scale, double(std::fabs(want.data[i])));
    }
    QVERIFY2(diff <= 1e-4 * scale,
             qPrintable(QString("decode vs prefill: max diff %1 of %2").arg(diff).arg(scale)));
  }

  // Capacity just under what a phase needs: the category that overflowed is
  // named, the stream ends with oom, the exit code is 3.
  void outOfMemory_data() {
    QTest::addColumn<QString>("preset");
    QTest::addColumn<QString>("capacity");  // "" = weights + 1 byte, measured
    QTest::addColumn<QString>("category");  // "" = anything but weights
    QTest::newRow("llama, weights") << "tiny-llama"
                                    << "100KiB"
                                    << "weights";
    QTest::newRow("mamba2, weights") << "tiny-mamba2"
                                     << "1000"
                                     << "weights";
    QTest::newRow("llama, after weights") << "tiny-llama"
                                          << ""
                                          << "";
    QTest::newRow("mamba, after weights") << "tiny-mamba"
                                          << ""
                                          << "";
  }
  void outOfMemory() {
    QFETCH(QString, preset);
    QFETCH(QString, capacity);
    QFETCH(QString, category);
    if (capacity.isEmpty()) {
      const Ran ok = engine({"run", "--model", preset, "--prompt-len", "8"});
      QCOMPARE(ok.exit_code, 0);
      capacity =
          QString::number(int64_t(read_stream(ok.out).metrics().at("peak_weights_bytes")) + 1);
    }
    QTemporaryDir tmp;
    const QString logits = tmp.filePath("l.npy");
    const Ran r = engine({"run", "--model", preset, "--prompt-len", "8", "--capacity", capacity,
                          "--logits-out", logits});
    QVERIFY(!r.crashed);
    QCOMPARE(r.exit_code, int(ss::kExitOom));
    QCOMPARE(count_lines(r.err), 1);
    QVERIFY2(r.err.contains("out of memory"), r.err.constData());
    QVERIFY(!QFileInfo::exists(logits));

    const Stream s = read_stream(r.out);
    QCOMPARE(s.rejected, int64_t(0));
    QCOMPARE(int(s.all<Error>().size()), 1);
    const Error& e = *s.all<Error>().front();
    QCOMPARE(e.code, std::string("oom"));
    QVERIFY(e.detail.is_object());
    const std::string cat = e.detail.value("category", "");
    QVERIFY2(std::find(kCategories.begin(), kCategories.end(), cat) != kCategories.end(),
             cat.c_str());
    if (!category.isEmpty())
      QCOMPARE(cat, category.toStdString());
    else
      QVERIFY2(cat != "weights", cat.c_str());
    const int64_t cap = ss::parse_bytes(capacity.toStdString());
    QCOMPARE(e.detail.value("capacity", int64_t(-1)), cap);
    QVERIFY(e.detail.value("requested", int64_t(0)) > 0);
    QVERIFY(e.detail.value("in_use", int64_t(0)) + e.detail.value("requested", int64_t(0)) > cap);
    QVERIFY(std::holds_alternative<Done>(s.events.back()));
    QCOMPARE(std::get<Done>(s.events.back()).status, std::string("oom"));
    QCOMPARE(std::get<Done>(s.events.back()).exit_code, int(ss::kExitOom));
    // Memory never went over the capacity on the way.
    for (auto* m : s.all<Mem>()) QVERIFY(m->peak <= cap);
  }

  // Each row: arguments after `run`, and a word the one stderr line must hold.
  void badInput_data() {
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<QString>("says");
    QTest::newRow("prompt-len 0") << QStringList{"--prompt-len", "0"} << "--prompt-len";
    QTest::newRow("no prompt") << QStringList{"--model", "tiny-llama"} << "--prompt-len";
    QTest::newRow("unknown model")
        << QStringList{"--model", "nosuch", "--prompt-len", "4"} << "nosuch";
    QTest::newRow("token not a number") << QStringList{"--tokens", "1,x"} << "'x'";
    QTest::newRow("empty token") << QStringList{"--tokens", "1,,2"} << "--tokens";
    QTest::newRow("token outside vocab") << QStringList{"--tokens", "1,256"} << "256";
    QTest::newRow("prompt-len and tokens")
        << QStringList{"--tokens", "1,2", "--prompt-len", "3"} << "either";
    QTest::newRow("prompt text without a tokenizer") << QStringList{"--prompt", "hi"} << "tokenizer.json";
    QTest::newRow("prompt text and tokens") << QStringList{"--prompt", "hi", "--tokens", "1"} << "use one";
    QTest::newRow("capacity unit")
        << QStringList{"--prompt-len", "4", "--capacity", "12XB"} << "12XB";
    QTest::newRow("capacity negative")
        << QStringList{"--prompt-len", "4", "--capacity", "-5"} << "-5";
    QTest::newRow("decode negative")
        << QStringList{"--prompt-len", "4", "--decode", "-1"} << "--decode";
    QTest::newRow("decode not a number")
        << QStringList{"--prompt-len", "4", "--decode", "abc"} << "--decode";
    QTest::newRow("unknown flag") << QStringList{"--prompt-len", "4", "--bogus"} << "unknown option --bogus for run";
    QTest::newRow("mistyped flag") << QStringList{"--prompt-len", "4", "--modle", "tiny-llama"} << "did you mean --model?";
    QTest::newRow("mistyped model") << QStringList{"--model", "tiny-lama", "--prompt-len", "4"}
                                    << "did you mean 'tiny-llama'?";
    QTest::newRow("model folder missing") << QStringList{"--model", "/nonexistent/folder", "--prompt-len", "4"}
                                          << "/nonexistent/folder: no such folder";
    QTest::newRow("temperature negative")
        << QStringList{"--prompt-len", "4", "--temperature", "-1"} << "--temperature";
    QTest::newRow("top-k without temperature")
        << QStringList{"--prompt-len", "4", "--top-k", "5"} << "--temperature";
    QTest::newRow("events file cannot be created")
        << QStringList{"--prompt-len", "4", "--events", "/nonexistent-dir/x.jsonl"}
        << "nonexistent-dir";
    QTest::newRow("logits folder missing")
        << QStringList{"--prompt-len", "4", "--logits-out", "/nonexistent-dir/l.npy"}
        << "nonexistent-dir";
    // An override the model's parser never reads would change nothing.
    QTest::newRow("set: a mistyped field")
        << QStringList{"--model", "tiny-mamba2", "--prompt-len", "4", "--set", "headdim=32"} << "did you mean 'head_dim'?";
    QTest::newRow("set: another family's field")
        << QStringList{"--model", "tiny-llama", "--prompt-len", "4", "--set", "n_groups=2"} << "does not read 'n_groups'";
    QTest::newRow("set: the checkpoint's dtype")
        << QStringList{"--model", "tiny-llama", "--prompt-len", "4", "--set", "torch_dtype=float16"} << "--dtype";
    QTest::newRow("set: a field another overrules")
        << QStringList{"--model", "tiny-llama", "--prompt-len", "4", "--set", "n_layer=1"}
        << "takes num_hidden_layers over n_layer";
    QTest::newRow("set: attention_every under a layer_pattern")
        << QStringList{"--model", "tiny-hybrid", "--prompt-len", "4", "--set", "attention_every=2"}
        << "takes layer_pattern over attention_every";
    QTest::newRow("set: no value") << QStringList{"--prompt-len", "4", "--set", "=2"} << "key=value";
    QTest::newRow("set: the last of a key is the one blamed")
        << QStringList{"--prompt-len", "4", "--set", "hidden_size=64", "--set", "hidden_size=abc"}
        << "--set 'hidden_size=abc'";
    QTest::newRow("set: another field's check")
        << QStringList{"--prompt-len", "4", "--set", "num_attention_heads=5"} << "(with --set num_attention_heads=5)";
    QTest::newRow("set: a key inside a field")
        << QStringList{"--prompt-len", "4", "--set", "rope_scaling.factor=4"} << "rope_scaling={...}";
    QTest::newRow("set: a value of the wrong kind")
        << QStringList{"--prompt-len", "4", "--set", "hidden_size=abc"}
        << "--set 'hidden_size=abc': field 'hidden_size' must be an integer";
    // Each option's refusal names the option once.
    QTest::newRow("dtype unknown") << QStringList{"--prompt-len", "4", "--dtype", "bf17"} << "--dtype: 'bf17'";
    QTest::newRow("comm precision unknown")
        << QStringList{"--prompt-len", "4", "--comm-precision", "int3"} << "--comm-precision: unknown precision 'int3'";
    QTest::newRow("comm precision site")
        << QStringList{"--prompt-len", "4", "--comm-precision", "ffn=int8"} << "--comm-precision: unknown all-reduce site 'ffn'";
  }
  void badInput() {
    QFETCH(QStringList, args);
    QFETCH(QString, says);
    const Ran r = engine(QStringList{"run"} + args);
    refusedInOneLine(r, says);
    if (QTest::currentTestFailed()) return;
    // Whatever reached stdout is a stream a reader accepts, ending in failure.
    const Stream s = read_stream(r.out);
    QCOMPARE(s.rejected, int64_t(0));
    if (!s.events.empty()) {
      QVERIFY(std::holds_alternative<Done>(s.events.back()));
      QCOMPARE(std::get<Done>(s.events.back()).exit_code, int(ss::kExitUsage));
      QCOMPARE(int(s.all<Error>().size()), 1);
    }
  }

  // Mistakes outside `run`'s options: one line, exit 2, naming the fix.
  void otherCommandsRefuseInOneLine_data() {
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<QString>("says");
    QTest::newRow("mistyped command") << QStringList{"rn", "--model", "tiny-llama"} << "unknown command 'rn'; did you mean 'run'?";
    QTest::newRow("unknown command") << QStringList{"frobnicate"} << "commands: run, launch";
    QTest::newRow("mistyped flag of a nested command")
        << QStringList{"tokenizer", "train", "--corpus", "/nonexistent", "--vocab-sise", "9", "--out", "/tmp/x"}
        << "unknown option --vocab-sise for tokenizer train; did you mean --vocab-size?";
    QTest::newRow("simulate on a backend")
        << QStringList{"simulate", "--model", "tiny-llama", "--prompt-len", "4", "--backend", "cuda"} << "--backend cuda";
    QTest::newRow("export dtype") << QStringList{"export", "--model", "tiny-llama", "--dtype", "bf17", "--out", "/tmp/x"}
                                  << "'bf17' is not a compute dtype";
    // The counts offered are those every layer splits over: tiny-llama's 4
    // heads split over 4, its 2 KV heads do not; tiny-hybrid's Mamba2 heads
    // split over 8, its attention's KV heads over 2 only.
    const QStringList tp3{"--strategy", "tp", "--devices", "3", "--prompt-len", "8"};
    QTest::newRow("launch: counts that split every layer")
        << QStringList{"launch", "--model", "tiny-llama"} + tp3
        << "num_attention_heads 4 does not split over 3 ranks; use a device count that every layer splits over (2)";
    QTest::newRow("launch: counts that split every layer of a hybrid")
        << QStringList{"launch", "--model", "tiny-hybrid"} + tp3 << "does not split over 3 ranks; use a device count that every layer splits over (2)";
    QTest::newRow("launch: a token outside the vocabulary, before any rank starts")
        << QStringList{"launch", "--model", "tiny-llama", "--strategy", "tp", "--devices", "2", "--tokens", "1,2,300"}
        << "shardscope-engine: error: --tokens: id 300 is outside the vocabulary [0, 256)";
    QTest::newRow("launch: a mesh that is not TxS")
        << QStringList{"launch", "--model", "tiny-llama", "--strategy", "tp_sp", "--mesh", "2by2", "--devices", "4",
                       "--prompt-len", "8"}
        << "--mesh '2by2' is not TxS";
    QTest::newRow("summarize: not a stream") << QStringList{"summarize", "/dev/null"}
                                             << "/dev/null: not an event stream (no hello line)";
    QTest::newRow("summarize: no such file") << QStringList{"summarize", "/nonexistent/run.jsonl"}
                                             << "/nonexistent/run.jsonl: cannot open (No such file or directory)";
  }
  void otherCommandsRefuseInOneLine() {
    QFETCH(QStringList, args);
    QFETCH(QString, says);
    const Ran r = engine(args);
    refusedInOneLine(r, says);
    QVERIFY2(!one_line(r.err).contains("exited"), r.err.constData());  // refused here, not by a rank
    QVERIFY2(r.out.isEmpty() || args.first() != "summarize", r.out.constData());
  }

  // bench --sim's per-op run is STRATEGY:D[:MESH]; anything else is refused
  // in one line before anything is measured.
  void simCheckRefused_data() {
    QTest::addColumn<QString>("spec");
    for (const char* spec : {"tsp", "tsp:1", "tsp:x", ":4", "tp_sp:4:", "tp;true:2", "tp_sp:4:2x2;true"}) QTest::newRow(spec) << QString(spec);
  }
  void simCheckRefused() {
    QFETCH(QString, spec);
    const Ran r = engine({"bench", "--sim", "--sim-accuracy", "--sim-check", spec});
    QVERIFY2(!r.crashed, "the engine crashed");
    QCOMPARE(r.exit_code, int(ss::kExitUsage));
    QVERIFY2(count_lines(r.err) == 1, r.err.constData());
    QVERIFY2(one_line(r.err).contains("--sim-check " + spec + ": give STRATEGY:D[:MESH]"), r.err.constData());
    QVERIFY2(r.out.isEmpty(), r.out.constData());
  }

  // The sampler's draws follow softmax(l / T) over the top k: 40,000 steps
  // on fixed logits land on each token with its probability, worked out
  // here, within 5 standard errors; nothing outside the top k is drawn.
  void samplerDistribution_data() {
    QTest::addColumn<float>("temperature");
    QTest::addColumn<int>("top_k");
    QTest::newRow("T 1") << 1.0f << 0;
    QTest::newRow("T 0.5, top 3") << 0.5f << 3;
    QTest::newRow("T 2, top 1") << 2.0f << 1;
  }
  void samplerDistribution() {
    QFETCH(float, temperature);
    QFETCH(int, top_k);
    const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 2.5f, 0.0f, 2.5f, -1.0f};
    std::vector<int> order = {1, 3, 5, 0, 4, 6, 2};  // by logit, ties to the lower id
    const size_t k = top_k ? size_t(top_k) : logits.size();
    std::vector<double> p(logits.size(), 0.0);
    double z = 0;
    for (size_t i = 0; i < k; ++i) z += std::exp(double(logits[size_t(order[i])]) / temperature);
    for (size_t i = 0; i < k; ++i) p[size_t(order[i])] = std::exp(double(logits[size_t(order[i])]) / temperature) / z;
    const int n = 40000;
    std::vector<int> seen(logits.size(), 0);
    const ss::Sampling s{temperature, top_k};
    for (int step = 0; step < n; ++step) ++seen[size_t(ss::sample_token(logits, s, 5, 0, uint64_t(step)))];
    for (size_t i = 0; i < logits.size(); ++i) {
      const double se = std::sqrt(p[i] * (1 - p[i]) / n), got = double(seen[i]) / n;
      QVERIFY2(p[i] > 0 || seen[i] == 0, qPrintable(QString("token %1 outside the top %2 drawn").arg(i).arg(k)));
      QVERIFY2(std::abs(got - p[i]) <= 5 * se + 1e-12,
               qPrintable(QString("token %1: drawn %2, probability %3").arg(i).arg(got).arg(p[i])));
    }
    // Greedy is the argmax, ties to the lower id.
    QCOMPARE(ss::sample_token(logits, ss::Sampling{}, 9, 2, 17), 1);
    QCOMPARE(ss::sample_token(std::vector<float>{0.5f, 2.0f, 2.0f}, ss::Sampling{}, 0, 0, 0), 1);
  }

  // Sampled decode through the engine: repeatable with a seed, the same
  // under tp as on one device, each token among the top k of the logits row
  // it was drawn from, and other seeds give other answers.
  void sampledDecode() {
    QTemporaryDir dir;
    auto run = [&](const QStringList& how, const QString& seed, const QString& logits) {
      const Ran r = engine(how + QStringList{"--model", "tiny-llama", "--prompt-len", "8", "--decode", "12",
                                             "--temperature", "1.5", "--top-k", "4", "--seed", seed, "--logits-out",
                                             dir.filePath(logits)});
      if (r.exit_code != 0) qWarning("%s", r.err.constData());
      const Stream s = read_stream(r.out);
      return s.all<Generation>().empty() ? std::vector<int64_t>{} : s.all<Generation>().back()->tokens;
    };
    const auto a = run({"run"}, "3", "a.npy"), b = run({"run"}, "3", "b.npy");
    QCOMPARE(int(a.size()), 13);
    QCOMPARE(a, b);
    QCOMPARE(run({"launch", "--strategy", "tp", "--devices", "2"}, "3", "tp.npy"), a);
    const ss::NpyArray l = ss::read_npy(dir.filePath("a.npy").toStdString());
    const int64_t V = l.shape.back();
    for (size_t i = 0; i < a.size(); ++i) {
      const int64_t row = 7 + int64_t(i);  // token i was drawn from the logits after prompt token 7 + i
      int above = 0;
      for (int64_t v = 0; v < V; ++v) above += l.data[size_t(row * V + v)] > l.data[size_t(row * V + a[i])];
      QVERIFY2(above < 4, qPrintable(QString("token %1 ranks %2 in its row").arg(i).arg(above + 1)));
    }
    int differ = 0;
    for (const QString seed : {"4", "5", "6"}) differ += run({"run"}, seed, "c.npy") != a;
    QVERIFY(differ >= 2);
  }

  // export of a model folder writes its own weights (not synthetic ones) in
  // --dtype, with its tokenizer: brown-llama ships in bf16, so widening it
  // to f32 and rounding that back are both exact, and all three folders give
  // the same logits for the same text.
  void exportKeepsAFolderModel() {
    QTemporaryDir dir;
    const QString f32 = dir.filePath("f32"), back = dir.filePath("bf16");
    Ran ex = engine({"export", "--model", "brown-llama", "--dtype", "f32", "--out", f32});
    QVERIFY2(ex.exit_code == 0, ex.err.constData());
    ex = engine({"export", "--model", f32, "--dtype", "bf16", "--out", back});
    QVERIFY2(ex.exit_code == 0, ex.err.constData());
    QVERIFY(QFile::exists(f32 + "/tokenizer.json") && QFile::exists(back + "/tokenizer.json"));
    QVERIFY(QFileInfo(f32 + "/model.safetensors").size() > QFileInfo(back + "/model.safetensors").size());
    std::vector<ss::NpyArray> logits;
    for (const QString& m : {QString("brown-llama"), f32, back}) {
      const QString out = dir.filePath(QString("logits-%1.npy").arg(logits.size()));
      const Ran r = engine({"run", "--model", m, "--prompt", "The jury said that the city", "--decode", "3",
                            "--logits-out", out});
      QVERIFY2(r.exit_code == 0, r.err.constData());
      logits.push_back(ss::read_npy(out.toStdString()));
    }
    QCOMPARE(logits[1].shape, logits[0].shape);
    QVERIFY(logits[1].data == logits[0].data);
    QVERIFY(logits[2].data == logits[0].data);
    // Its own folder is refused before anything is written.
    const Ran self = engine({"export", "--model", f32, "--out", f32});
    QCOMPARE(self.exit_code, 2);
    QVERIFY2(self.err.contains("--out is the model's own folder"), self.err.constData());
  }

  // --prompt: a model folder's tokenizer.json encodes the text; the stream
  // carries it as a `prompt` record and the answer as `generation` records
  // that grow a token at a time, decoded by the same tokenizer.
  void promptText() {
    QTemporaryDir dir;
    const QString model = dir.filePath("model");
    std::string corpus;
    for (int i = 0; i < 200; ++i) corpus += "the jury said the city of the state was fine, and the court said no.\n";
    std::istringstream in(corpus);
    ss::text::BpeTrainOptions o;
    o.vocab_size = 300;
    const ss::text::Tokenizer tok = ss::text::train_bpe(in, o);
    Ran ex = engine({"export", "--model", "tiny-llama", "--set", "vocab_size=300", "--out", model});
    QVERIFY2(ex.exit_code == 0, ex.err.constData());
    tok.save((model + "/tokenizer.json").toStdString());

    const std::string text = "The jury said \xE2\x80\x94 caf\xC3\xA9.";
    const int decode = 4;
    const Ran r = engine({"run", "--model", model, "--prompt", QString::fromStdString(text), "--decode",
                          QString::number(decode)});
    QVERIFY2(r.exit_code == 0, r.err.constData());
    const Stream s = read_stream(r.out);
    QCOMPARE(s.rejected, int64_t(0));
    const auto prompts = s.all<Prompt>();
    QCOMPARE(int(prompts.size()), 1);
    QCOMPARE(prompts[0]->text, text);
    const std::vector<int32_t> ids = tok.encode(text);
    QCOMPARE(prompts[0]->ids, std::vector<int64_t>(ids.begin(), ids.end()));
    QCOMPARE(prompts[0]->ids.front(), int64_t(0));  // the BOS
    const auto gens = s.all<Generation>();
    QCOMPARE(int(gens.size()), decode + 1);
    const Generation& answer = *gens.back();
    QVERIFY(!answer.partial);
    QCOMPARE(int(answer.tokens.size()), decode + 1);
    const std::vector<int32_t> got(answer.tokens.begin(), answer.tokens.end());
    QVERIFY(answer.text.has_value());
    // Random weights choose byte tokens too: bytes that are not UTF-8 reach the stream as U+FFFD.
    const auto as_written = [](const std::string& t) {
      return nlohmann::json::parse(nlohmann::json(t).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
          .get<std::string>();
    };
    QCOMPARE(*answer.text, as_written(tok.decode(got)));
    for (int k = 0; k < decode; ++k) {  // each partial record: the answer's first k + 1 tokens
      QVERIFY(gens[size_t(k)]->partial);
      QCOMPARE(gens[size_t(k)]->tokens, std::vector<int64_t>(answer.tokens.begin(), answer.tokens.begin() + k + 1));
    }
    // The same run from the ids: the same answer, and the prompt record decodes them.
    QStringList idList;
    for (const int32_t id : ids) idList << QString::number(id);
    const Ran byIds = engine({"run", "--model", model, "--tokens", idList.join(','), "--decode", QString::number(decode)});
    const Stream t = read_stream(byIds.out);
    QCOMPARE(t.all<Prompt>().at(0)->text, as_written(tok.decode(ids)));
    QCOMPARE(t.all<Generation>().back()->tokens, answer.tokens);

    const Ran empty = engine({"run", "--model", model, "--prompt", ""});
    QCOMPARE(empty.exit_code, int(ss::kExitUsage));
    QVERIFY2(one_line(empty.err).contains("encodes to no tokens"), empty.err.constData());
  }

  // train --tokenizer: --data is text the tokenizer encodes, a BOS before each
  // blank-line-separated document; the saved folder carries the tokenizer, so
  // it takes --prompt, and trains on text through it by default. Without a
  // text file --tokenizer is refused.
  void trainOnText() {
    QTemporaryDir dir;
    const QString corpus = dir.filePath("corpus.txt"), tokfile = dir.filePath("tokenizer.json"),
                  out = dir.filePath("trained");
    std::string text;
    for (int i = 0; i < 60; ++i) text += "the court said no.\nthe jury said yes.\n\n";
    { std::ofstream(corpus.toStdString()) << text; }
    std::istringstream in(text);
    ss::text::BpeTrainOptions o;
    o.vocab_size = 300;
    const ss::text::Tokenizer tok = ss::text::train_bpe(in, o);
    tok.save(tokfile.toStdString());
    const Ran r = engine({"train", "--model", "tiny-llama", "--set", "vocab_size=300", "--data", corpus, "--tokenizer",
                          tokfile, "--seq-len", "16", "--steps", "2", "--save", out});
    QVERIFY2(r.exit_code == 0, r.err.constData());
    const auto data_of = [](const Ran& ran) {
      const Stream s = read_stream(ran.out);
      return QString::fromStdString(std::get<Config>(*std::find_if(s.events.begin(), s.events.end(), [](auto& e) {
                                      return std::holds_alternative<Config>(e);
                                    })).config["training"]["data"].get<std::string>());
    };
    QVERIFY2(data_of(r).contains("60 documents"), qPrintable(data_of(r)));
    // summarize reads it as training: the steps' losses, not a prompt and decode.
    {
      QFile f(dir.filePath("train.jsonl"));
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write(r.out);
    }
    const Ran sum = engine({"summarize", dir.filePath("train.jsonl")});
    QCOMPARE(sum.exit_code, 0);
    const Stream trained = read_stream(r.out);
    const auto steps = trained.all<TrainStep>();
    QCOMPARE(int(steps.size()), 2);
    const QString losses = QString("loss: %1 at step 1, %2 at step 2")
                               .arg(steps[0]->loss, 0, 'f', 4)
                               .arg(steps[1]->loss, 0, 'f', 4);
    QVERIFY2(sum.out.contains("train: tiny-llama") && sum.out.contains("training, 2 steps") &&
                 sum.out.contains(losses.toUtf8()) && !sum.out.contains("decode steps"),
             sum.out.constData());
    QFile a(tokfile), b(out + "/tokenizer.json");
    QVERIFY(a.open(QIODevice::ReadOnly) && b.open(QIODevice::ReadOnly));
    QCOMPARE(b.readAll(), a.readAll());
    const Ran run = engine({"run", "--model", out, "--prompt", "the jury", "--decode", "2"});
    QVERIFY2(run.exit_code == 0, run.err.constData());
    // A model folder with a tokenizer trains on text through it unless told otherwise.
    const Ran again = engine({"train", "--model", out, "--data", corpus, "--seq-len", "16", "--steps", "1"});
    QVERIFY2(again.exit_code == 0, again.err.constData());
    QVERIFY2(data_of(again).contains("60 documents") && data_of(again).contains(out + "/tokenizer.json"),
             qPrintable(data_of(again)));
    const Ran bytes =
        engine({"train", "--model", out, "--data", corpus, "--tokenizer", "none", "--seq-len", "16", "--steps", "1"});
    QVERIFY2(bytes.exit_code == 0, bytes.err.constData());
    QVERIFY2(data_of(bytes).endsWith(QString("(%1 bytes)").arg(text.size())), qPrintable(data_of(bytes)));
    const Ran refused = engine({"train", "--model", "tiny-llama", "--tokenizer", tokfile, "--seq-len", "16"});
    QCOMPARE(refused.exit_code, int(ss::kExitUsage));
    QVERIFY2(one_line(refused.err).contains("--tokenizer encodes the text of --data FILE"), refused.err.constData());
  }

  // `tokenizer encode` and `decode` on a shipped model by name: ids there and text back; bad ids are one line.
  void tokenizerCommands() {
    const Ran enc = engine({"tokenizer", "encode", "--tokenizer", "brown-llama", "--text", "The jury said."});
    QVERIFY2(enc.exit_code == 0, enc.err.constData());
    const QString ids = QString::fromUtf8(enc.out).trimmed();
    QVERIFY2(ids.startsWith("0,"), qPrintable(ids));  // the BOS first
    const Ran dec = engine({"tokenizer", "decode", "--tokenizer", "brown-llama", "--ids", ids.section(',', 1)});
    QCOMPARE(QString::fromUtf8(dec.out), QString("The jury said.\n"));
    const Ran bad = engine({"tokenizer", "decode", "--tokenizer", "brown-llama", "--ids", "1,x"});
    QCOMPARE(bad.exit_code, int(ss::kExitUsage));
    QVERIFY2(one_line(bad.err).contains("'x' is not a token id"), bad.err.constData());
  }

  // Host memory is the capacity of a cpu device (its host's available memory,
  // shared by the host's ranks; lowered here with SHARDSCOPE_HOST_MEMORY): a
  // setup whose weights cannot fit is refused before anything starts, naming
  // the bytes and what to change, and an allocation past the share is an oom.
  void hostMemoryIsACapacity() {
    auto with_host_memory = [](const QString& bytes, const QStringList& args) {
      return engine(args, 120000, {{"SHARDSCOPE_HOST_MEMORY", bytes}});
    };
    const QStringList big = {"--model", "small-llama", "--prompt-len", "16"};
    for (const QStringList& args :
         {QStringList{"check"} + big, QStringList{"run"} + big,
          QStringList{"launch", "--strategy", "tp", "--devices", "2", "--dtype", "bf16"} + big}) {
      const Ran r = with_host_memory("256MiB", args);
      QVERIFY2(!r.crashed, r.err.constData());
      QCOMPARE(r.exit_code, int(ss::kExitUsage));
      QVERIFY2(count_lines(r.err) == 1, r.err.constData());
      const QString line = one_line(r.err);
      QVERIFY2(line.contains("the weights alone need") && line.contains("256.00 MiB"), qPrintable(line));
      if (args.contains("launch")) QVERIFY2(line.contains("2 ranks (128.00 MiB each)"), qPrintable(line));
      else QVERIFY2(line.contains("594.07 MiB") && line.contains("--dtype bf16"), qPrintable(line));
    }
    // Weights fit, the KV cache of 4096 tokens does not: an oom naming its category.
    const Ran r = with_host_memory("2MiB", {"run", "--model", "tiny-llama", "--prompt-len", "4096"});
    QVERIFY(!r.crashed);
    QCOMPARE(r.exit_code, int(ss::kExitOom));
    const Stream s = read_stream(r.out);
    QCOMPARE(int(s.all<Error>().size()), 1);
    QCOMPARE(s.all<Error>().front()->code, std::string("oom"));
    QVERIFY(!s.all<Device>().empty());
    QCOMPARE(s.all<Device>().front()->capacity, int64_t(2) << 20);
    // Without the override the device's capacity is what the host has.
    const Stream plain = read_stream(engine({"run", "--model", "tiny-llama", "--prompt-len", "4"}).out);
    QVERIFY(!plain.all<Device>().empty());
    QVERIFY(plain.all<Device>().front()->capacity > 0);
  }

  // calibrate --for: a run the simulator refuses is one line, and no profile is written.
  void calibrateForABadRun() {
    QTemporaryDir dir;
    const QString out = dir.filePath("p.json");
    const Ran r = engine({"calibrate", "--out", out, "--for", "--model nosuch --strategy tp --devices 2"});
    QCOMPARE(r.exit_code, int(ss::kExitUsage));
    QVERIFY2(count_lines(r.err) == 1 && one_line(r.err).contains("--for"), r.err.constData());
    QVERIFY(!QFile::exists(out));
  }

  void help_data() {
    QTest::addColumn<QStringList>("args");
    QTest::newRow("--help") << QStringList{"--help"};
    for (const char* sub : {"run", "info", "presets", "export", "bench"})
      QTest::newRow(sub) << QStringList{sub, "--help"};
  }
  void help() {
    QFETCH(QStringList, args);
    const Ran r = engine(args);
    QVERIFY(!r.crashed);
    QCOMPARE(r.exit_code, 0);
    QVERIFY2(r.out.contains("Usage") || r.out.contains("usage"), r.out.constData());
    if (args.size() > 1) QVERIFY2(r.out.contains(args.front().toUtf8()), r.out.constData());
  }

  // The cuda backend without a GPU: `info` says why in one line, runs are
  // refused before they start with the reason, and the GPU benchmark's code
  // runs whole on the emulated device (its figures mean nothing there).
  void cudaWithoutGpu() {
    const Ran info = engine({"info"});
    QCOMPARE(info.exit_code, 0);
    QVERIFY2(info.out.contains("  cuda  "), info.out.constData());
    if (info.out.contains("cuda  available")) QSKIP("this machine has a GPU: the gpu suites cover it");
    for (const QStringList& args : {QStringList{"run", "--backend", "cuda", "--prompt-len", "8"},
                                    QStringList{"launch", "--backend", "cuda", "--devices", "2", "--strategy", "tp",
                                                "--prompt-len", "8"},
                                    QStringList{"train", "--backend", "cuda", "--seq-len", "16", "--steps", "1"},
                                    QStringList{"bench", "--backend", "cuda"},
                                    QStringList{"calibrate", "--backend", "cuda", "--out", "/tmp/never.json"}}) {
      const Ran r = engine(args);
      QCOMPARE(r.exit_code, 2);
      const QList<QByteArray> lines = r.err.trimmed().split('\n');
      QCOMPARE(lines.size(), 1);
      QVERIFY2(lines[0].contains("--backend cuda") || lines[0].contains("bench --backend cuda"), r.err.constData());
      QVERIFY(r.out.isEmpty() || !r.out.contains("\"span\""));
    }
    const Ran bench = engine({"bench", "--backend", "cuda-emu", "--quick"});
    QCOMPARE(bench.exit_code, 0);
    for (const char* part : {"forward GEMMs", "of bare", "decode, batch 1", "of the limit", "ssd_scan", "selective_scan"})
      QVERIFY2(bench.out.contains(part), bench.out.constData());
    // calibrate's GPU profile, as a simulation reads it.
    QTemporaryDir dir;
    const QString profile = dir.filePath("gpu.json");
    const Ran cal = engine({"calibrate", "--backend", "cuda-emu", "--quick", "--out", profile});
    QVERIFY2(cal.exit_code == 0, cal.err.constData());
    const Ran sim = engine({"simulate", "--hardware", profile, "--model", "tiny-llama", "--prompt-len", "16",
                            "--events", "/dev/null"});
    QVERIFY2(sim.exit_code == 0, sim.err.constData());
  }

  // --warm-start runs the same prefill and a decode step first, untimed: the
  // run's tokens and logits are those of a run without it, byte for byte,
  // its spans carry phase "warmup" after a "warmup" phase record and before
  // "prefill", and the run's statistics (bytes communicated, flops) leave
  // them out. Single and tsp on two ranks (its broadcasts and ring).
  void warmupChangesOnlyTimes_data() {
    QTest::addColumn<QStringList>("how");
    QTest::newRow("single") << QStringList{"run"};
    QTest::newRow("tsp") << QStringList{"launch", "--strategy", "tsp", "--devices", "2"};
  }
  void warmupChangesOnlyTimes() {
    QFETCH(QStringList, how);
    QTemporaryDir dir;
    auto run = [&](bool warm) {
      const QString logits = dir.filePath(warm ? "warm.npy" : "cold.npy");
      const Ran r = engine(how + QStringList{"--model", "tiny-llama", "--prompt-len", "24", "--decode", "3",
                                             "--logits-out", logits} +
                           (warm ? QStringList{"--warm-start"} : QStringList{}));
      if (r.exit_code != 0) qWarning("%s", r.err.constData());
      return std::make_pair(read_stream(r.out), ss::read_npy(logits.toStdString()));
    };
    const auto [cold, cold_logits] = run(false);
    const auto [warm, warm_logits] = run(true);
    QVERIFY(!cold.all<Generation>().empty() && !warm.all<Generation>().empty());
    QCOMPARE(warm.all<Generation>().back()->tokens, cold.all<Generation>().back()->tokens);
    QCOMPARE(warm_logits.shape, cold_logits.shape);
    QVERIFY(warm_logits.data == cold_logits.data);

    std::vector<std::string> phases;
    for (auto* p : warm.all<Phase>()) phases.push_back(p->name);
    QCOMPARE(phases, (std::vector<std::string>{"load", "warmup", "prefill", "decode"}));
    int warm_spans = 0;
    for (auto* sp : warm.all<Span>()) warm_spans += sp->phase == "warmup";
    QVERIFY(warm_spans > 0);
    for (auto* sp : cold.all<Span>()) QVERIFY(sp->phase != "warmup");

    const RunStats a = analyze(cold.events), b = analyze(warm.events);
    QCOMPARE(b.comm_bytes, a.comm_bytes);
    QCOMPARE(int(b.ranks.size()), int(a.ranks.size()));
    for (auto& [rank, r] : a.ranks) {
      QCOMPARE(b.ranks.at(rank).flops, r.flops);
      QCOMPARE(b.ranks.at(rank).forward_flops, r.forward_flops);
    }
  }

  // --events FILE: the stream goes to the file, stdout stays empty, and it is
  // the stream stdout would have carried.
  void eventsFile() {
    QTemporaryDir tmp;
    const QString file = tmp.filePath("run.jsonl");
    const QStringList args = {"run",      "--model", "tiny-mamba2", "--prompt-len", "9",
                              "--decode", "2"};
    const Ran to_file = engine(args + QStringList{"--events", file});
    QCOMPARE(to_file.exit_code, 0);
    QVERIFY2(to_file.out.isEmpty(), to_file.out.left(200).constData());
    QFile f(file);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const Stream from_file = read_stream(f.readAll());
    QCOMPARE(from_file.rejected, int64_t(0));
    QVERIFY(std::holds_alternative<Done>(from_file.events.back()));

    const Ran to_stdout = engine(args);
    QCOMPARE(to_stdout.exit_code, 0);
    const Stream from_stdout = read_stream(to_stdout.out);
    QCOMPARE(without_times(from_file), without_times(from_stdout));

    const Ran dash = engine(args + QStringList{"--events", "-"});
    QCOMPARE(dash.exit_code, 0);
    QCOMPARE(without_times(read_stream(dash.out)), without_times(from_stdout));

    // The stream of a run refused before its setup was recorded (hello, error,
    // done) summarizes as that error.
    const Ran refused = engine({"run", "--model", "tiny-llama", "--devices", "2", "--prompt-len", "4", "--events", file});
    QCOMPARE(refused.exit_code, int(ss::kExitUsage));
    const Ran sum = engine({"summarize", file});
    QVERIFY2(!sum.crashed && sum.exit_code == 0 && sum.err.isEmpty(), sum.err.constData());
    QVERIFY2(sum.out.contains("status: failed") && sum.out.contains("error (usage, rank 0): --strategy single runs on one device"),
             sum.out.constData());
  }
};

QTEST_GUILESS_MAIN(TestEngineCli)
#include "tst_engine_cli.moc"

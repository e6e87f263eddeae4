// The simulator against real runs. `simulate` runs the same model, strategy
// and allocator code as `launch` (one thread per rank instead of one MPI
// process), so for the same options the two streams must agree on everything
// but time: peak memory per rank and category to the byte, placements, token
// ranges, and the sequence of compute and comm spans. Beyond that: malformed
// hardware profiles are refused naming the field, 7B-class models at 64K-128K
// tokens and a 64-rank mesh simulate to the end with the weights their
// strategy promises, and running out of a simulated device's memory is an
// `oom` result, not a crash.
#include <QtTest>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "engine_process.h"
#include "protocol/events.h"
#include "sim/cost_model.h"
#include "sim/sim_backend.h"

using namespace ss::proto;
using json = nlohmann::json;

namespace {

const std::vector<std::string> kCategories = {"weights",   "activations",  "kv_cache",
                                              "ssm_state", "comm_buffers", "workspace"};
const QStringList kFamilies = {"tiny-llama", "tiny-mamba", "tiny-falcon-mamba", "tiny-mamba2",
                               "tiny-hybrid"};
constexpr int kPrompt = 24, kDecode = 4;

QString resources_dir() {
  return qEnvironmentVariable("SHARDSCOPE_RESOURCES", SHARDSCOPE_TESTS_DIR "/../resources");
}

json read_json(const QString& path) {
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) return json();
  return json::parse(f.readAll().toStdString(), nullptr, false);
}

// Per-rank metrics keyed by (rank, name), for comparing two runs entry by entry.
std::map<std::pair<int, std::string>, double> flat_rank_metrics(const Stream& s) {
  std::map<std::pair<int, std::string>, double> out;
  for (auto& [rank, m] : s.rank_metrics())
    for (auto& [name, v] : m) out[{rank, name}] = v;
  return out;
}

// Records of one type per rank, in stream order, as JSON text without the
// fields named in `drop` (and, for spans, only those of `stream_kind`).
using PerRank = std::map<int, std::vector<std::string>>;
PerRank records(const Stream& s, const std::string& type, const std::vector<const char*>& drop,
                const std::string& stream_kind = {}) {
  PerRank out;
  for (auto& e : s.events) {
    json j = to_json(e);
    if (j["type"] != type) continue;
    if (!stream_kind.empty() && j["stream"] != stream_kind) continue;
    for (const char* k : drop) j.erase(k);
    out[j["rank"].get<int>()].push_back(j.dump());
  }
  return out;
}

// Empty when both agree; else where they first part.
QString first_difference(const PerRank& real, const PerRank& sim) {
  std::set<int> ranks;
  for (auto& [r, v] : real) ranks.insert(r);
  for (auto& [r, v] : sim) ranks.insert(r);
  for (int r : ranks) {
    const auto a = real.count(r) ? real.at(r) : std::vector<std::string>{};
    const auto b = sim.count(r) ? sim.at(r) : std::vector<std::string>{};
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
      const std::string x = i < a.size() ? a[i] : "(none)", y = i < b.size() ? b[i] : "(none)";
      if (x != y)
        return QString("rank %1, record %2 of %3 (cpu) / %4 (sim):\n  cpu %5\n  sim %6")
            .arg(r)
            .arg(i)
            .arg(a.size())
            .arg(b.size())
            .arg(QString::fromStdString(x), QString::fromStdString(y));
    }
  }
  return {};
}

// Shapes each family needs at D = 4: tiny-llama and the hybrid's attention
// have 2 kv heads in the preset; every other dimension divides as it is.
QStringList shape_sets(const QString& model, int D) {
  if (D < 4) return {};
  if (model == "tiny-llama") return {"num_attention_heads=8", "num_key_value_heads=4"};
  if (model == "tiny-hybrid")
    return {
        R"(attention={"num_attention_heads":8,"num_key_value_heads":4,"intermediate_size":160})"};
  return {};
}

QStringList with_sets(QStringList args, const QStringList& sets) {
  for (auto& s : sets) args << "--set" << s;
  return args;
}

// Parameters of a preset from its config file, counted here with the model's
// own dimensions (not the engine's count): `whole` is what every rank holds,
// `split` what tensor parallelism (and tsp) divides over its shards.
struct Params {
  int64_t whole = 0, split = 0;
  int64_t total() const { return whole + split; }
};

int64_t get(const json& c, const char* key, int64_t fallback = -1) {
  return c.contains(key) ? c[key].get<int64_t>() : fallback;
}

// Llama: q, k, v, o and the gated MLP are split; the two norms per layer,
// the final norm, the embedding and an untied lm_head are whole.
Params llama_params(const json& c) {
  const int64_t V = get(c, "vocab_size"), d = get(c, "hidden_size"),
                L = get(c, "num_hidden_layers");
  const int64_t F = get(c, "intermediate_size"), H = get(c, "num_attention_heads");
  const int64_t KV = get(c, "num_key_value_heads", H), hd = get(c, "head_dim", d / H);
  const bool tied = c.value("tie_word_embeddings", false);
  return {V * d * (tied ? 1 : 2) + L * 2 * d + d, L * (d * hd * (2 * H + 2 * KV) + 3 * d * F)};
}

// Mamba2 per layer: norm; in_proj [z, x, B, C, dt] x d; conv1d over x, B, C
// (+ bias); dt_bias, A_log and D per head; gated norm over d_inner; out_proj.
// Whole: the embedding (+ untied head) and the final norm.
Params mamba2_params(const json& c) {
  const int64_t V = get(c, "vocab_size"), d = get(c, "hidden_size"),
                L = get(c, "num_hidden_layers");
  const int64_t N = get(c, "state_size"), P = get(c, "head_dim"), G = get(c, "n_groups", 1);
  const int64_t K = get(c, "conv_kernel"), Di = get(c, "expand", 2) * d, H = Di / P;
  const int64_t conv = Di + 2 * G * N;
  const int64_t layer = d + (2 * Di + 2 * G * N + H) * d + conv * K +
                        (c.value("use_conv_bias", true) ? conv : 0) + 3 * H + Di + d * Di;
  const bool tied = c.value("tie_word_embeddings", false);
  return {V * d * (tied ? 1 : 2) + d, L * layer};
}

}  // namespace

class TestSim : public QObject {
  Q_OBJECT

  QTemporaryDir m_dir;
  json m_h100;

  // A real run and its simulation with the same options, run once per row
  // and shared by the memory and the record checks.
  struct Pair {
    Ran real, sim;
    Stream real_stream, sim_stream;
  };
  std::map<QString, Pair> m_pairs;

  // `simulate --hardware` a copy of `profile` written as `name` in the test's
  // directory, with `args`; a run that exits 3 when the file cannot be written.
  Ran simulate_with(const QString& name, const json& profile, const QStringList& args) {
    const QString file = m_dir.filePath(name);
    QFile f(file);
    if (!f.open(QIODevice::WriteOnly) || f.write(QByteArray::fromStdString(profile.dump(2))) < 0) {
      Ran failed;
      failed.exit_code = 3;
      failed.err = "cannot write " + file.toUtf8();
      return failed;
    }
    f.close();
    return engine(QStringList{"simulate", "--hardware", file} + args);
  }

  const Pair& pair(const QStringList& args) {
    const QString key = args.join(' ');
    auto it = m_pairs.find(key);
    if (it != m_pairs.end()) return it->second;
    Pair p;
    p.real = engine(QStringList{"launch"} + args);
    p.sim = engine(QStringList{"simulate", "--hardware", "h100-sxm"} + args);
    p.real_stream = read_stream(p.real.out);
    p.sim_stream = read_stream(p.sim.out);
    return m_pairs.emplace(key, std::move(p)).first->second;
  }

  static void rows() {
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<int>("devices");
    auto row = [](const QString& model, const QString& strategy, int D, const QStringList& extra,
                  const QString& tag = {}) {
      const QStringList args =
          with_sets(
              {"--model", model, "--strategy", strategy, "--devices", QString::number(D),
               "--prompt-len", QString::number(kPrompt), "--decode", QString::number(kDecode)},
              shape_sets(model, D)) +
          extra;
      QTest::newRow(qPrintable(QString("%1/%2/D%3%4").arg(model, strategy).arg(D).arg(tag)))
          << args << D;
    };
    // SHARDSCOPE_STRATEGY_ROWS=sample (the sanitizer leg): every strategy of
    // every family once (on 2 ranks, tp_sp on 2x2) and one bf16 row each;
    // the plain leg runs them all.
    const bool sample = qEnvironmentVariable("SHARDSCOPE_STRATEGY_ROWS") == "sample";
    for (const QString& model : kFamilies) {
      row(model, "single", 1, {});
      for (int D : {2, 4}) {
        if (sample && D == 4) continue;
        row(model, "dp", D, {"--batch", QString::number(D)});
        row(model, "tp", D, {});
        row(model, "sp", D, {});
        row(model, "tsp", D, {});
      }
      row(model, "tp_sp", 4, {"--mesh", "2x2"}, "/2x2");
      // bf16: weights, activations, caches and comm buffers in 2 bytes,
      // SSM states and attention statistics in fp32, the same on both sides.
      const QStringList bf16 = {"--dtype", "bf16"};
      row(model, "tsp", 4, bf16, "/bf16");
      if (sample) continue;
      row(model, "single", 1, bf16, "/bf16");
      row(model, "tp", 2, bf16, "/bf16");
      row(model, "sp", 4, bf16, "/bf16");
      row(model, "tp_sp", 4, bf16 + QStringList{"--mesh", "2x2"}, "/2x2/bf16");
    }
    // Variants that allocate differently: K/V blocks on a ring instead of a
    // gathered K/V, contiguous token chunks, two sequences per dp rank.
    row("tiny-llama", "sp", 4, {"--attention", "ring"}, "/ring");
    row("tiny-hybrid", "sp", 2, {"--attention", "ring"}, "/ring");
    row("tiny-mamba2", "sp", 4, {"--split", "contiguous"}, "/contiguous");
    row("tiny-mamba", "dp", 2, {"--batch", "4"}, "/batch4");
  }

  // Both runs finished, each with a whole stream that ends in done ok.
  static bool finished(const Pair& p, QString* why) {
    for (auto [name, r, s] : {std::tuple{"launch", &p.real, &p.real_stream},
                              std::tuple{"simulate", &p.sim, &p.sim_stream}}) {
      if (r->crashed || r->exit_code != 0 || !s->errors.empty() || !s->done() ||
          s->done()->status != "ok") {
        *why = QString("%1 exit %2: %3 %4")
                   .arg(name)
                   .arg(r->exit_code)
                   .arg(one_line(r->err))
                   .arg(s->errors.empty() ? "" : QString::fromStdString(s->errors.front()));
        return false;
      }
    }
    return true;
  }

 private slots:
  void initTestCase() {
    QVERIFY2(QFileInfo::exists(SHARDSCOPE_ENGINE_BIN), SHARDSCOPE_ENGINE_BIN);
    QVERIFY(m_dir.isValid());
    m_h100 = read_json(resources_dir() + "/hardware/h100-sxm.json");
    QVERIFY2(m_h100.is_object(), "resources/hardware/h100-sxm.json is not readable");
  }

  // --- 1. memory: simulated equals measured, per rank and category ---------

  void memoryEqualsMeasured_data() { rows(); }
  void memoryEqualsMeasured() {
    QFETCH(QStringList, args);
    QFETCH(int, devices);
    const Pair& p = pair(args);
    QString why;
    QVERIFY2(finished(p, &why), qPrintable(why));

    const auto real = flat_rank_metrics(p.real_stream), sim = flat_rank_metrics(p.sim_stream);
    std::vector<std::string> names;
    for (auto& c : kCategories) names.push_back("peak_" + c + "_bytes");
    names.push_back("peak_bytes");
    for (int r = 0; r < devices; ++r)
      for (auto& n : names) {
        const auto key = std::make_pair(r, n);
        QVERIFY2(real.count(key),
                 qPrintable(QString("cpu rank %1 has no %2").arg(r).arg(n.c_str())));
        QVERIFY2(sim.count(key),
                 qPrintable(QString("sim rank %1 has no %2").arg(r).arg(n.c_str())));
        const auto a = int64_t(real.at(key)), b = int64_t(sim.at(key));
        QVERIFY2(a == b, qPrintable(QString("rank %1 %2: cpu %3, sim %4 (sim - cpu = %5)")
                                        .arg(r)
                                        .arg(n.c_str())
                                        .arg(a)
                                        .arg(b)
                                        .arg(b - a)));
      }
    // Not a comparison of two zeros: every rank holds weights and activations.
    for (int r = 0; r < devices; ++r) {
      QVERIFY(real.at({r, "peak_weights_bytes"}) > 0);
      QVERIFY(real.at({r, "peak_activations_bytes"}) > 0);
    }
    // No rank beyond the run's devices.
    QCOMPARE(real.rbegin()->first.first, devices - 1);
    QCOMPARE(sim.rbegin()->first.first, devices - 1);
  }

  // --- 2. placements, tokens and span order: identical but for time --------

  void recordsEqualButTimes_data() { rows(); }
  void recordsEqualButTimes() {
    QFETCH(QStringList, args);
    QFETCH(int, devices);
    const Pair& p = pair(args);
    QString why;
    QVERIFY2(finished(p, &why), qPrintable(why));
    const Stream &real = p.real_stream, &sim = p.sim_stream;

    // Every field of placement (step included) and tokens records.
    const PerRank placed = records(real, "placement", {});
    QCOMPARE(int(placed.size()), devices);
    QString diff = first_difference(placed, records(sim, "placement", {}));
    QVERIFY2(diff.isEmpty(), qPrintable("placement: " + diff));
    const PerRank tokens = records(real, "tokens", {});
    QCOMPARE(int(tokens.size()), devices);
    for (auto& [r, v] : tokens) QCOMPARE(int(v.size()), 1);
    diff = first_difference(tokens, records(sim, "tokens", {}));
    QVERIFY2(diff.isEmpty(), qPrintable("tokens: " + diff));

    // Spans per rank and stream in stream order: op, site, layer and phase
    // (and shape, flops, bytes, peers) agree; only t0 and t1 may differ.
    const PerRank compute = records(real, "span", {"t0", "t1"}, "compute");
    QCOMPARE(int(compute.size()), devices);
    diff = first_difference(compute, records(sim, "span", {"t0", "t1"}, "compute"));
    QVERIFY2(diff.isEmpty(), qPrintable("compute spans: " + diff));
    const PerRank comm = records(real, "span", {"t0", "t1"}, "comm");
    const bool communicates = devices > 1 && !args.contains("dp");
    QCOMPARE(int(comm.size()), communicates ? devices : 0);
    diff = first_difference(comm, records(sim, "span", {"t0", "t1"}, "comm"));
    QVERIFY2(diff.isEmpty(), qPrintable("comm spans: " + diff));

    // Where the two must differ: each says which backend ran it.
    QCOMPARE(int(sim.all<Config>().size()), 1);
    QCOMPARE(int(real.all<Config>().size()), 1);
    QCOMPARE(sim.all<Config>().front()->config.value("backend", ""), std::string("sim"));
    QCOMPARE(real.all<Config>().front()->config.value("backend", ""), std::string("cpu"));
    QCOMPARE(int(sim.all<Device>().size()), devices);
    for (auto* d : sim.all<Device>()) QCOMPARE(d->kind, std::string("sim"));
    for (auto* d : real.all<Device>()) QCOMPARE(d->kind, std::string("cpu"));
  }

  // The config record of a simulation carries the hardware profile it ran on,
  // and each device says what it simulates.
  void simulatedConfigNamesHardware() {
    const Ran r =
        engine({"simulate", "--hardware", "h100-sxm", "--model", "tiny-hybrid", "--strategy", "tp",
                "--devices", "2", "--prompt-len", "24", "--decode", "4"});
    QVERIFY(!r.crashed);
    QVERIFY2(r.exit_code == 0, r.err.constData());
    const Stream s = read_stream(r.out);
    QVERIFY(s.errors.empty());
    QCOMPARE(int(s.all<Config>().size()), 1);
    const json& conf = s.all<Config>().front()->config;
    QCOMPARE(conf.value("backend", ""), std::string("sim"));
    const std::string device_name = m_h100["device"]["name"];
    for (auto* d : s.all<Device>()) {
      QCOMPARE(d->kind, std::string("sim"));
      QCOMPARE(d->capacity, m_h100["device"]["memory_bytes"].get<int64_t>());
      QVERIFY2(d->name.find(device_name) != std::string::npos, d->name.c_str());
    }
    QVERIFY2(conf.contains("hardware"),
             qPrintable("the simulated config record has no hardware profile; its fields: " +
                        QString::fromStdString([&] {
                          std::string k;
                          for (auto& [key, v] : conf.items()) k += key + " ";
                          return k;
                        }())));
    QVERIFY2(conf["hardware"] == m_h100, conf["hardware"].dump().c_str());
  }

  // --- 3. malformed profiles: exit 2, one line naming field and reason -----

  void malformedProfile_data() {
    QTest::addColumn<QString>("edit");
    QTest::addColumn<QString>("field");  // empty: a file that is not JSON names none
    QTest::addColumn<QString>("reason");
    QTest::newRow("missing") << "missing"
                             << "device.memory_bandwidth_gbps"
                             << "is missing";
    QTest::newRow("negative") << "negative"
                              << "node.link.bandwidth_gbps"
                              << "must be positive";
    QTest::newRow("string") << "string"
                            << "device.fp32_tflops"
                            << "must be a number";
    QTest::newRow("zero") << "zero"
                          << "network.latency_us"
                          << "must be positive";
    QTest::newRow("not-object") << "not-object"
                                << "node"
                                << "must be an object";
    QTest::newRow("not-json") << "not-json"
                              << ""
                              << "not valid JSON";
    // The measured tables calibrate writes (optional fields).
    QTest::newRow("grid-shape") << "grid-shape"
                                << "device.kernel_times.add.us"
                                << "must be 2 arrays (one per rows) of 3 positive numbers (one per cols)";
    QTest::newRow("grid-axis") << "grid-axis"
                               << "device.kernel_times.add.cols"
                               << "must be strictly increasing";
    QTest::newRow("table-source") << "table-source"
                                  << "device.gemm_times.source"
                                  << "is missing";
    QTest::newRow("gemm-times") << "gemm-times"
                                << "device.gemm_times.shapes[0].us"
                                << "must hold one time per entry";
    QTest::newRow("attention-heads") << "attention-heads"
                                     << "device.attention_times.heads"
                                     << "must be positive";
    QTest::newRow("collective") << "collective"
                                << "node.link.collectives.all_reduce.latency_us"
                                << "must be positive";
    QTest::newRow("contention") << "contention"
                                << "device.contention.comm"
                                << "must be a number >= 0";
    QTest::newRow("contention-hold") << "contention-hold"
                                     << "device.contention.hold_us"
                                     << "must be a number >= 0";
    QTest::newRow("contention-source") << "contention-source"
                                       << "device.contention.source"
                                       << "is missing";
    QTest::newRow("core-share") << "core-share"
                                << "device.core_share.share"
                                << "at most 1";
    QTest::newRow("core-share-count") << "core-share-count"
                                      << "device.core_share.share"
                                      << "one share per kernel_us";
    QTest::newRow("collective-missing") << "collective-missing"
                                        << "network.collectives.broadcast.bandwidth_gbps"
                                        << "is missing";
  }
  void malformedProfile() {
    QFETCH(QString, edit);
    QFETCH(QString, field);
    QFETCH(QString, reason);
    json j = m_h100;
    if (edit == "missing") j["device"].erase("memory_bandwidth_gbps");
    if (edit == "negative") j["node"]["link"]["bandwidth_gbps"] = -370;
    if (edit == "string") j["device"]["fp32_tflops"] = "67";
    if (edit == "zero") j["network"]["latency_us"] = 0;
    if (edit == "not-object") j["node"] = 8;
    if (edit.startsWith("grid")) {
      j["device"]["kernel_times"] = {{"source", "test"},
                                     {"add", {{"rows", {1, 8}}, {"cols", {64, 512, 4096}}, {"us", {{1, 2, 3}, {4, 5}}}}}};
      if (edit == "grid-axis") j["device"]["kernel_times"]["add"] = {{"rows", {1}}, {"cols", {64, 64}}, {"us", {{1, 2}}}};
    }
    if (edit == "table-source") j["device"]["gemm_times"] = {{"shapes", json::array()}};
    if (edit == "gemm-times")
      j["device"]["gemm_times"] = {{"source", "test"}, {"shapes", {{{"n", 64}, {"k", 64}, {"m", {1, 2}}, {"us", {3}}}}}};
    if (edit == "attention-heads")
      j["device"]["attention_times"] = {{"source", "test"}, {"heads", 0}, {"kv_heads", 1}, {"head_dim", 64},
                                        {"tq", {1}}, {"tk", {64}}, {"us", {{1}}}};
    if (edit == "collective") j["node"]["link"]["collectives"] = {{"all_reduce", {{"latency_us", -2}, {"bandwidth_gbps", 5}}}};
    if (edit == "collective-missing") j["network"]["collectives"] = {{"broadcast", {{"latency_us", 2}}}};
    if (edit == "contention") j["device"]["contention"] = {{"source", "test"}, {"compute", 1}, {"comm", -0.5}};
    if (edit == "contention-source") j["device"]["contention"] = {{"compute", 1}, {"comm", 1}};
    if (edit == "contention-hold") j["device"]["contention"] = {{"source", "test"}, {"hold_us", -1}};
    if (edit == "core-share")
      j["device"]["core_share"] = {{"source", "test"}, {"kernel_us", {100, 1000}}, {"share", {0.4, 1.5}}};
    if (edit == "core-share-count")
      j["device"]["core_share"] = {{"source", "test"}, {"kernel_us", {100, 1000}}, {"share", {0.4}}};
    const QString file = m_dir.filePath(edit + ".json");
    {
      QFile f(file);
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write(edit == "not-json" ? QByteArray("name: h100\n[device]\nmemory_bytes = 80e9\n")
                                 : QByteArray::fromStdString(j.dump(2)));
    }
    const Ran r =
        engine({"simulate", "--hardware", file, "--model", "tiny-llama", "--prompt-len", "8"});
    QVERIFY(!r.crashed);
    QCOMPARE(r.exit_code, 2);
    QVERIFY2(r.out.isEmpty(), r.out.left(200).constData());  // refused before any rank ran
    const QString err = one_line(r.err);
    QVERIFY2(!err.isEmpty() && !err.contains('\n'), qPrintable(err));
    QVERIFY2(err.contains(file), qPrintable(err));
    if (!field.isEmpty()) QVERIFY2(err.contains("'" + field + "'"), qPrintable(err));
    QVERIFY2(err.contains(reason), qPrintable(err));
  }

  // --- measured tables: the simulator uses them as calibrate wrote them ----

  // With measured times in the profile, a kernel lasts what its table says at
  // its size (bilinear between grid points), a GEMM what its nearest measured
  // weight shape says scaled by N*K, and a collective what its own alpha and
  // beta give; ops without a table keep the roofline.
  void measuredTablesDriveTimes() {
    json j = m_h100;
    // add: 1 us + 2 us per row + 0.01 us per element, on a 2 x 2 grid.
    auto add_us = [](double r, double c) { return 1 + 2 * r + 0.01 * r * c; };
    j["device"]["kernel_times"] = {
        {"source", "test"},
        {"add", {{"rows", {1, 64}}, {"cols", {16, 1024}},
                 {"us", {{add_us(1, 16), add_us(1, 1024)}, {add_us(64, 16), add_us(64, 1024)}}}}}};
    // GEMMs: one measured weight shape, 100 us at one row and 1000 us at 101 rows.
    j["device"]["gemm_times"] = {{"source", "test"},
                                 {"shapes", {{{"n", 100}, {"k", 100}, {"m", {1, 101}}, {"us", {100, 1000}}}}}};
    j["node"]["link"]["collectives"] = {{"all_reduce", {{"latency_us", 3}, {"bandwidth_gbps", 2}}}};
    const Ran r = simulate_with("measured.json", j,
                                {"--model", "tiny-llama", "--strategy", "tp", "--devices", "2", "--prompt-len", "24",
                                 "--decode", "4"});
    QVERIFY(!r.crashed);
    QVERIFY2(r.exit_code == 0, r.err.constData());
    const Stream s = read_stream(r.out);
    int adds = 0, gemms = 0, reduces = 0;
    std::map<std::pair<int, int>, int64_t> shortest;  // all_reduce i: the last arrival's span
    std::map<int, int> seen;
    for (auto* sp : s.all<Span>()) {
      const double ns = double(sp->t1 - sp->t0);
      auto near = [&](double want_ns) { return std::abs(ns - want_ns) <= 2 + 1e-9 * want_ns; };
      if (sp->op == "add") {
        QCOMPARE(int(sp->dims.size()), 2);
        const double want = add_us(double(sp->dims[0]), double(sp->dims[1])) * 1e3;
        QVERIFY2(near(want), qPrintable(QString("add %1x%2: %3 ns, want %4")
                                            .arg(sp->dims[0]).arg(sp->dims[1]).arg(ns).arg(want)));
        ++adds;
      } else if (sp->op == "gemm") {
        const double M = double(sp->dims[0]), NK = double(sp->dims[1] * sp->dims[2]);
        const double want = (M <= 1 ? 100 : 100 + 900 * (M - 1) / 100) * 1e3 * NK / 1e4;
        QVERIFY2(near(want), qPrintable(QString("gemm %1x%2x%3: %4 ns, want %5")
                                            .arg(sp->dims[0]).arg(sp->dims[1]).arg(sp->dims[2]).arg(ns).arg(want)));
        ++gemms;
      } else if (sp->op == "all_reduce") {
        const int i = seen[sp->rank]++;
        auto& v = shortest[{i, int(sp->dims[0])}];
        v = v == 0 ? sp->t1 - sp->t0 : std::min<int64_t>(v, sp->t1 - sp->t0);
        ++reduces;
      }
    }
    QVERIFY(adds > 0 && gemms > 0 && reduces > 0);
    // Ring all-reduce over 2 ranks: 2 alpha + S / beta, from the last arrival.
    for (auto& [key, ns] : shortest) {
      const double want = (2 * 3e-6 + 4.0 * key.second / 2e9) * 1e9;
      QVERIFY2(std::abs(double(ns) - want) <= 2,
               qPrintable(QString("all_reduce of %1 floats: %2 ns, want %3").arg(key.second).arg(ns).arg(want)));
    }
  }

  // Contention (device.contention, measured by calibrate for ranks sharing a
  // host): work on one stream runs 1 + c times slower where the other stream
  // is busy. The stretch in closed form; then whole runs: tp's collectives
  // block (no kernel runs beside them), so its times do not move; tsp keeps a
  // ring transfer in flight beside its GEMMs, so it slows down, by at most
  // 1 + c overall.
  void contentionSlowsOverlapOnly() {
    using ss::SimClock;
    // 10 ns of work from 0, the other stream busy over [2, 6): 2 ns free, 2 ns
    // of progress in the 4 busy ns, the 6 left after 6: ends at 12.
    QCOMPARE(SimClock::stretched_end(0, 10, {{2, 6}}, 1.0), 12.0);
    QCOMPARE(SimClock::stretched_end(0, 10, {{2, 6}}, 0.0), 10.0);
    QCOMPARE(SimClock::stretched_end(3, 0.5, {{2, 6}}, 3.0), 5.0);  // at a quarter speed
    QCOMPARE(SimClock::stretched_end(3, 1, {{2, 6}}, 3.0), 6.25);   // 0.75 by 6, the rest free
    QCOMPARE(SimClock::stretched_end(0, 4, {{1, 2}, {3, 4}}, 1.0), 5.0);  // 1 + 0.5 + 1 + 0.5 by 4
    SimClock::Intervals busy;
    for (auto [a, b] : {std::pair{5.0, 7.0}, {1.0, 2.0}, {6.0, 9.0}, {2.0, 3.0}, {4.0, 4.0}})
      SimClock::add_busy(busy, a, b);
    QCOMPARE(busy, (SimClock::Intervals{{1, 3}, {5, 9}}));

    auto end_ns = [&](const QString& strategy, double c) -> int64_t {
      json j = m_h100;
      if (c > 0) j["device"]["contention"] = {{"compute", c}, {"comm", c}, {"source", "test"}};
      const Ran r = simulate_with(QString("contention-%1.json").arg(c), j,
                                  {"--model", "tiny-llama", "--strategy", strategy, "--devices", "2", "--prompt-len",
                                   "64", "--decode", "4"});
      if (r.crashed || r.exit_code != 0) return -1;
      const Stream st = read_stream(r.out);
      int64_t end = 0;
      for (auto* sp : st.all<Span>()) end = std::max(end, sp->t1);
      return end;
    };
    const int64_t tp0 = end_ns("tp", 0), tp1 = end_ns("tp", 1), tsp0 = end_ns("tsp", 0), tsp1 = end_ns("tsp", 1);
    QVERIFY(tp0 > 0 && tp1 > 0 && tsp0 > 0 && tsp1 > 0);
    QCOMPARE(tp1, tp0);
    QVERIFY2(tsp1 > tsp0 && tsp1 <= 2 * tsp0 + 2, qPrintable(QString("tsp: %1 ns without, %2 with").arg(tsp0).arg(tsp1)));
  }

  // The hold (device.contention.hold_us): a collective posted beside kernels
  // waits for the core until they stop to wait or the hold passes, making no
  // progress and slowing nothing meanwhile. In closed form on one rank's
  // clock (ns; slowdowns 1: a stream at half speed beside the other), then
  // whole runs.
  void holdKeepsTheCoreForOneStream() {
    using ss::SimClock;
    auto clock = [](double hold) {
      SimClock c;
      c.compute_slowdown = c.comm_slowdown = 1;
      c.hold_ns = hold;
      return c;
    };
    {  // Two short kernels after the post, then the wait: in turn, not beside.
      SimClock c = clock(100);
      auto op = c.post(0, 50);
      QCOMPARE(c.kernel(30), 30.0);
      QCOMPARE(c.kernel(30), 60.0);
      QVERIFY(!c.done(op));
      c.wait(op);
      QCOMPARE(c.compute_ns, 110.0);
    }
    {  // The same without a hold: both at half speed while they overlap.
      // Kernel 1: 25 of its 30 by 50 (beside the post's estimate), the rest
      // by 55; kernel 2 alone to 85; the collective, beside both kernels,
      // makes 42.5 of its 50 by 85 and ends at 92.5.
      SimClock c = clock(0);
      auto op = c.post(0, 50);
      QCOMPARE(c.kernel(30), 55.0);
      QCOMPARE(c.kernel(30), 85.0);
      c.wait(op);
      QCOMPARE(c.compute_ns, 92.5);
    }
    {  // A kernel longer than the hold: alone to 100, then both at half speed.
      // The collective makes its 50 in [100, 200); the kernel, 25 of its
      // work in [100, 150) (the collective's estimate), ends 25 late.
      SimClock c = clock(100);
      auto op = c.post(0, 50);
      QCOMPARE(c.kernel(300), 325.0);
      QVERIFY(c.done(op));
      c.wait(op);
      QCOMPARE(c.compute_ns, 325.0);
    }
    {  // Woken while the comm thread has a second collective: kernels resume
       // when it is done (at 90), or a hold after the first ends (150).
      SimClock c = clock(100);
      auto a = c.post(0, 50), b = c.post(50, 40);
      c.wait(a);
      QCOMPARE(c.compute_ns, 90.0);
      SimClock l = clock(100);
      auto a2 = l.post(0, 50), b2 = l.post(50, 400);
      l.wait(a2);
      QCOMPARE(l.compute_ns, 150.0);
      l.wait(b2);
      QCOMPARE(l.compute_ns, 450.0);
      c.wait(b);
      QCOMPARE(c.compute_ns, 90.0);
    }

    // Whole runs. With a hold longer than any stretch of kernels, no kernel
    // ever has the comm thread beside it: every kernel span keeps its length
    // from the run without contention, and tsp, whose transfers then wait
    // for the kernels, ends later. tp blocks on every collective: unchanged.
    auto run = [&](const QString& strategy, const json& contention) {
      json j = m_h100;
      if (!contention.is_null()) j["device"]["contention"] = contention;
      const Ran r = simulate_with(QString("hold-%1-%2.json").arg(strategy).arg(contention.is_null()), j,
                                  {"--model", "tiny-llama", "--strategy", strategy, "--devices", "2", "--prompt-len",
                                   "64", "--decode", "4"});
      std::vector<int64_t> kernels;
      int64_t end = -1;
      if (r.crashed || r.exit_code != 0) return std::make_pair(kernels, end);
      const Stream st = read_stream(r.out);
      for (auto* sp : st.all<Span>()) {
        end = std::max(end, sp->t1);
        if (sp->rank == 0 && sp->stream == "compute") kernels.push_back(sp->t1 - sp->t0);
      }
      return std::make_pair(kernels, end);
    };
    const json held = {{"source", "test"}, {"compute", 1}, {"comm", 1}, {"hold_us", 1e6}};
    const auto [tsp0, tsp_end0] = run("tsp", json());
    const auto [tsp1, tsp_end1] = run("tsp", held);
    QVERIFY(!tsp0.empty() && tsp_end0 > 0);
    QCOMPARE(tsp1.size(), tsp0.size());
    for (size_t i = 0; i < tsp0.size(); ++i)  // to the ns the span ends are rounded to
      QVERIFY2(std::abs(tsp1[i] - tsp0[i]) <= 2, qPrintable(QString("kernel %1: %2 ns, %3 without").arg(i).arg(tsp1[i]).arg(tsp0[i])));
    QVERIFY2(tsp_end1 > tsp_end0, qPrintable(QString("tsp: %1 ns without, %2 with").arg(tsp_end0).arg(tsp_end1)));
    QCOMPARE(run("tp", held).second, run("tp", json()).second);
  }

  // A calibrated collective's own times (collectives.<op>.us at `ranks`):
  // for that many ranks the cost model interpolates them, log-log between
  // the measured sizes and linear past the last; other counts take the fit.
  void measuredCollectiveTimes() {
    ss::LinkProfile l;
    l.latency = 1e-6;
    l.bandwidth = 1e9;
    ss::CollectiveFit& f = l.collectives["broadcast"];
    f.latency = 2e-6;
    f.bandwidth = 4e9;
    f.ranks = 4;
    f.bytes = {1e3, 1e6, 4e6};
    f.seconds = {10e-6, 250e-6, 1000e-6};
    auto at = [&](double bytes, int n) { return ss::collective_seconds(l, "broadcast", bytes, n).seconds; };
    QCOMPARE(at(1e6, 4), 250e-6);
    QCOMPARE(at(10, 4), 10e-6);                                  // below the smallest: its time
    QVERIFY(std::abs(at(2e6, 4) - 500e-6) < 1e-12);              // 250 us * 2^(log 4 / log 4)
    QVERIFY(std::abs(at(std::pow(10, 4.5), 4) - 50e-6) < 1e-12);  // halfway on a log scale: 10 us * 25^(1/2)
    QVERIFY(std::abs(at(6e6, 4) - 1500e-6) < 1e-12);             // the last segment's 250 us per MB
    // 2 ranks: the fitted ring, alpha + S / beta.
    QVERIFY(std::abs(at(1e6, 2) - (2e-6 + 1e6 / 4e9)) < 1e-15);
  }

  // The simulator costs an attention call run by run (AttentionRun): from a
  // measured grid of contiguous causal blocks, zigzag's two chunks take the
  // time of their two blocks, not that of one block of all their queries.
  void attentionCostedByRuns() {
    ss::HardwareProfile hw;
    auto& a = hw.attention_times;
    a.heads = 4;
    a.kv_heads = 4;
    a.head_dim = 64;
    a.grid.x = {128, 256};
    a.grid.y = {128, 512};
    a.grid.seconds = {{100e-6, 300e-6}, {250e-6, 900e-6}};
    const double per_pair = 4 * 4.0 * 64;  // the call's heads and head_dim: FLOPs per visible pair
    const std::vector<ss::AttentionRun> runs = {{128, 128, 128.0 * 129 / 2}, {128, 512, 128.0 * 384 + 128.0 * 129 / 2}};
    const double pairs = runs[0].pairs + runs[1].pairs;
    const double t = ss::kernel_seconds(hw, "attention", pairs * per_pair, 0, {256, 512, 4, 64}, ss::DType::F32, runs);
    QVERIFY2(std::abs(t - 400e-6) < 1e-12, qPrintable(QString::number(t)));
    // Costed whole (no runs): the 256-query block's time scaled by its pairs.
    const double whole = ss::kernel_seconds(hw, "attention", pairs * per_pair, 0, {256, 512, 4, 64});
    const double block_pairs = 256.0 * 512 - 256.0 * 255 / 2;
    QVERIFY2(std::abs(whole - 900e-6 * pairs / block_pairs) < 1e-12, qPrintable(QString::number(whole)));
  }

  // Core share (device.core_share, measured by calibrate for more ranks than
  // cores): a kernel's time is divided by the share at its length, log-linear
  // between the measured lengths. In closed form, then a whole run: at a flat
  // share of 1/2 every kernel span is twice as long, and comm spans keep their
  // lengths.
  void coreShareDividesKernelTimes() {
    ss::HardwareProfile hw;
    QCOMPARE(ss::core_share_at(hw, 1e-3), 1.0);
    hw.core_share_seconds = {1e-4, 1e-2};
    hw.core_share = {0.3, 0.5};
    QCOMPARE(ss::core_share_at(hw, 1e-5), 0.3);
    QCOMPARE(ss::core_share_at(hw, 1.0), 0.5);
    QVERIFY(std::abs(ss::core_share_at(hw, 1e-3) - 0.4) < 1e-12);  // halfway on a log scale
    QVERIFY(std::abs(ss::segment_wall(hw, 1e-3) - 1e-3 / 0.4) < 1e-15);

    // (stream:op, start, duration) of rank 0's spans, in order.
    using Spans = std::vector<std::tuple<std::string, int64_t, int64_t>>;
    auto spans = [&](const char* name, const json& share) {
      json j = m_h100;
      if (!share.is_null()) j["device"]["core_share"] = share;
      const Ran r = simulate_with(name, j,
                                  {"--model", "tiny-llama", "--strategy", "tp", "--devices", "2", "--prompt-len", "32",
                                   "--decode", "2"});
      Spans out;
      if (r.crashed || r.exit_code != 0) return out;
      const Stream st = read_stream(r.out);
      for (auto* sp : st.all<Span>())
        if (sp->rank == 0) out.emplace_back(sp->stream + ":" + sp->op, sp->t0, sp->t1 - sp->t0);
      std::stable_sort(out.begin(), out.end(), [](auto& a, auto& b) { return std::get<1>(a) < std::get<1>(b); });
      return out;
    };
    auto flat = [](double v) { return json{{"source", "test"}, {"kernel_us", {1}}, {"share", {v}}}; };
    const Spans whole = spans("share-none.json", json()), half = spans("share-half.json", flat(0.5));
    QVERIFY(!whole.empty());
    QCOMPARE(half.size(), whole.size());
    int kernels = 0;
    for (size_t i = 0; i < whole.size(); ++i) {
      const auto& [op, t0, d] = whole[i];
      QCOMPARE(std::get<0>(half[i]), op);
      const bool compute = op.rfind("compute:", 0) == 0;
      kernels += compute;
      const int64_t want = compute ? 2 * d : d;
      QVERIFY2(std::abs(std::get<2>(half[i]) - want) <= 2,
               qPrintable(QString("%1: %2 ns at share 1/2, %3 at 1").arg(QString::fromStdString(op))
                              .arg(std::get<2>(half[i])).arg(d)));
    }
    QVERIFY(kernels > 10);

    // A share that grows with the segment: between two collectives (tp's
    // block on every one), the kernels take segment_wall of their summed
    // CPU time, each the part its own CPU time adds.
    const json rising = {{"source", "test"}, {"kernel_us", {1, 1000}}, {"share", {0.25, 0.75}}};
    ss::HardwareProfile hw2;
    hw2.core_share_seconds = {1e-6, 1e-3};
    hw2.core_share = {0.25, 0.75};
    const Spans grown = spans("share-rising.json", rising);
    QCOMPARE(grown.size(), whole.size());
    int segments = 0;
    double cpu = 0, wall = 0;
    int64_t n = 0;
    auto close_segment = [&] {
      if (n == 0) return true;
      ++segments;
      const double want = ss::segment_wall(hw2, cpu);
      const bool ok = std::abs(wall - want) <= 2e-9 * double(n) + 1e-9 * want;
      if (!ok) qWarning("segment of %lld kernels, %.9f s CPU: %.9f s, want %.9f", (long long)n, cpu, wall, want);
      cpu = wall = 0;
      n = 0;
      return ok;
    };
    for (size_t i = 0; i < whole.size(); ++i) {
      if (std::get<0>(whole[i]).rfind("comm:", 0) == 0) {
        QVERIFY(close_segment());
        continue;
      }
      cpu += double(std::get<2>(whole[i])) * 1e-9;
      wall += double(std::get<2>(grown[i])) * 1e-9;
      ++n;
    }
    QVERIFY(close_segment());
    QVERIFY(segments > 4);
  }

  // With more ranks than cores, calibrate measures the core share at a few
  // kernel lengths, each a fraction of a core with its source.
  void calibrateOversubscribed() {
    const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
    if (cores > 4) QSKIP("more than 4 cores: a calibration with more ranks than cores would be long here");
    const QString file = m_dir.filePath("calibrated-over.json");
    const Ran c = engine({"calibrate", "--ranks", QString::number(cores + 1), "--out", file}, 300000);
    QVERIFY(!c.crashed);
    QVERIFY2(c.exit_code == 0, c.err.constData());
    const json d = read_json(file)["device"];
    QVERIFY2(d.contains("core_share") && d["core_share"].contains("source"), d.dump().c_str());
    const json& cs = d["core_share"];
    QCOMPARE(cs["share"].size(), cs["kernel_us"].size());
    QVERIFY(cs["share"].size() >= 2);
    for (const auto& v : cs["share"]) QVERIFY2(v.get<double>() > 0 && v.get<double>() <= 1, cs.dump().c_str());
    QVERIFY(!d.contains("core_steps"));  // the raw steps stay inside calibrate
  }

  // calibrate writes a profile the simulator accepts, with the measured tables
  // and per-collective alpha-beta, each with its source.
  void calibratedProfile() {
    const QString file = m_dir.filePath("calibrated.json");
    const Ran c = engine({"calibrate", "--ranks", "2", "--out", file}, 300000);
    QVERIFY(!c.crashed);
    QVERIFY2(c.exit_code == 0, c.err.constData());
    const json p = read_json(file);
    QVERIFY(p.is_object());
    const json& d = p["device"];
    for (const char* k : {"kernel_times", "gemm_times", "attention_times"}) {
      QVERIFY2(d.contains(k) && d[k].contains("source"), k);
    }
    for (const char* op : {"add", "rmsnorm", "rope", "silu_mul", "embedding", "argmax"})
      QVERIFY2(d["kernel_times"].contains(op), op);
    QVERIFY(d["gemm_times"]["shapes"].size() >= 4);
    // A core for each rank: the ranks measured each GEMM at once, as a tp step runs it.
    if (std::thread::hardware_concurrency() >= 2)
      QVERIFY(d["gemm_times"].value("note", "").find("every rank called the same GEMM at once") != std::string::npos);
    // Two ranks: the slowdown of each stream beside the other, measured.
    QVERIFY(d.contains("contention") && d["contention"].contains("source"));
    for (const char* k : {"compute", "comm"})
      QVERIFY2(d["contention"].contains(k) && d["contention"][k].get<double>() >= 0, k);
    if (std::thread::hardware_concurrency() >= 2) {
      QVERIFY(!d.contains("core_share"));  // a core for each rank
      // ... which its comm thread shares: how long either waits for the other.
      QVERIFY2(d["contention"].contains("hold_us") && d["contention"]["hold_us"].get<double>() >= 0,
               d["contention"].dump().c_str());
    }
    for (const char* op : {"all_reduce", "all_gather", "broadcast", "sendrecv"}) {
      QVERIFY2(p["node"]["link"].contains("collectives") && p["node"]["link"]["collectives"].contains(op), op);
      const json& c = p["node"]["link"]["collectives"][op];  // the measured times beside the fit
      QVERIFY2(c.value("ranks", 0) == 2 && c["bytes"].size() >= 2 && c["us"].size() == c["bytes"].size(), op);
    }
    const Ran r = engine({"simulate", "--hardware", file, "--model", "tiny-llama", "--strategy", "tp", "--devices",
                          "2", "--prompt-len", "24", "--decode", "4"});
    QVERIFY(!r.crashed);
    QVERIFY2(r.exit_code == 0, r.err.constData());
    const Stream s = read_stream(r.out);
    QVERIFY(s.done() && s.done()->status == "ok");
  }

  void unknownProfileListsProfiles() {
    const Ran r = engine(
        {"simulate", "--hardware", "h900-nvl", "--model", "tiny-llama", "--prompt-len", "8"});
    QVERIFY(!r.crashed);
    QCOMPARE(r.exit_code, 2);
    const QString err = one_line(r.err);
    QVERIFY2(!err.contains('\n'), qPrintable(err));
    QVERIFY2(err.contains("h900-nvl"), qPrintable(err));
    const QStringList profiles =
        QDir(resources_dir() + "/hardware").entryList({"*.json"}, QDir::Files, QDir::Name);
    QVERIFY(profiles.size() >= 2);
    for (QString p : profiles) QVERIFY2(err.contains(p.chopped(5)), qPrintable(err));
  }

  // --- 4. scale: big models and many ranks run to the end ------------------

  void scale_data() {
    QTest::addColumn<QString>("model");
    QTest::addColumn<QString>("strategy");
    QTest::addColumn<int>("devices");
    QTest::addColumn<QStringList>("extra");
    QTest::addColumn<int>("shards");  // ranks each split weight is divided over
    QTest::addColumn<int>("per_node");
    QTest::addColumn<int>("bytes_per_value");
    // tsp: 1/D of every projection on each rank, norms and embeddings whole.
    QTest::newRow("llama2-7b/tsp/D8/128K")
        << "llama2-7b"
        << "tsp" << 8 << QStringList{"--prompt-len", "131072", "--decode", "2"} << 8 << 8 << 4;
    // A bf16 deployment: exactly 2 bytes a parameter, and a KV cache of 2 bytes a value.
    QTest::newRow("llama2-7b/single/bf16")
        << "llama2-7b"
        << "single" << 1 << QStringList{"--prompt-len", "4096", "--decode", "2", "--dtype", "bf16"} << 1 << 8
        << 2;
    QTest::newRow("llama2-7b/tp/D8/bf16")
        << "llama2-7b"
        << "tp" << 8 << QStringList{"--prompt-len", "4096", "--decode", "2", "--dtype", "bf16"} << 8 << 8 << 2;
    // sp: every rank holds all parameters.
    QTest::newRow("mamba2-2.7b/sp/D4/64K")
        << "mamba2-2.7b"
        << "sp" << 4 << QStringList{"--prompt-len", "65536", "--decode", "2"} << 1 << 4 << 4;
    // 64 ranks over 8 nodes: tp over 8, sp over 8 (kv heads raised to 8).
    QTest::newRow("small-llama/tp_sp/8x8")
        << "small-llama"
        << "tp_sp" << 64
        << QStringList{"--mesh",       "8x8",  "--nodes",  "8", "--set", "num_key_value_heads=8",
                       "--prompt-len", "1024", "--decode", "2"}
        << 8 << 8 << 4;
  }
  void scale() {
    QFETCH(QString, model);
    QFETCH(QString, strategy);
    QFETCH(int, devices);
    QFETCH(QStringList, extra);
    QFETCH(int, shards);
    QFETCH(int, per_node);
    QFETCH(int, bytes_per_value);

    json c = read_json(resources_dir() + "/models/" + model + ".json");
    QVERIFY2(c.is_object(), qPrintable(model));
    for (int i = 0; i + 1 < extra.size(); ++i)
      if (extra[i] == "--set") {
        const QStringList kv = extra[i + 1].split('=');
        c[kv[0].toStdString()] = kv[1].toLongLong();
      }
    const Params params = c["model_type"] == "mamba2" ? mamba2_params(c) : llama_params(c);
    QCOMPARE(params.split % shards, int64_t(0));
    const int64_t want = bytes_per_value * (params.whole + params.split / shards);

    const QString events =
        m_dir.filePath(QString(QTest::currentDataTag()).replace('/', '_') + ".jsonl");
    const Ran r =
        engine(QStringList{"simulate", "--hardware", "h100-sxm", "--model", model, "--strategy",
                           strategy, "--devices", QString::number(devices), "--events", events} +
                   extra,
               300000);
    QVERIFY(!r.crashed);
    QVERIFY2(r.exit_code == 0, r.err.constData());
    QFile f(events);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const Stream s = read_stream(f.readAll());
    QVERIFY2(s.errors.empty(), s.errors.empty() ? "" : s.errors.front().c_str());
    QVERIFY(s.done());
    QCOMPARE(s.done()->status, std::string("ok"));
    QCOMPARE(s.done()->exit_code, 0);
    QVERIFY(s.all<Error>().empty());

    // The engine's parameter count agrees with the one counted here.
    QCOMPARE(int(s.all<Config>().size()), 1);
    QCOMPARE(s.all<Config>().front()->config.value("parameters", int64_t(-1)), params.total());
    const auto metrics = flat_rank_metrics(s);
    for (int r = 0; r < devices; ++r) {
      const auto it = metrics.find({r, "peak_weights_bytes"});
      QVERIFY2(it != metrics.end(), qPrintable(QString("rank %1 reports no weights").arg(r)));
      QVERIFY2(int64_t(it->second) == want, qPrintable(QString("rank %1: weights %2, expected %3")
                                                           .arg(r)
                                                           .arg(int64_t(it->second))
                                                           .arg(want)));
    }
    // Llama's KV cache: K and V of every layer for every token, kv heads split by tp.
    if (c["model_type"] == "llama" && (strategy == "single" || strategy == "tp")) {
      const int64_t L = get(c, "num_hidden_layers"), H = get(c, "num_attention_heads");
      const int64_t KV = get(c, "num_key_value_heads", H), hd = get(c, "head_dim", get(c, "hidden_size") / H);
      int64_t tokens = 0;
      for (int i = 0; i + 1 < extra.size(); ++i)
        if (extra[i] == "--prompt-len" || extra[i] == "--decode") tokens += extra[i + 1].toLongLong();
      const int64_t kv = bytes_per_value * 2 * L * tokens * (KV / shards) * hd;
      for (int r = 0; r < devices; ++r)
        QCOMPARE(int64_t(metrics.at({r, "peak_kv_cache_bytes"})), kv);
    }
    // One device per rank, on the node its rank belongs to (a single device runs on this host).
    std::set<int> ranks;
    for (auto* d : s.all<Device>()) {
      QVERIFY(ranks.insert(d->rank).second);
      if (devices > 1) QCOMPARE(d->host, "node" + std::to_string(d->rank / per_node));
    }
    QCOMPARE(int(ranks.size()), devices);
  }

  // --- 5. out of memory in the simulator: a result, not a crash ------------

  void oomIsAResult() {
    const json a6000 = read_json(resources_dir() + "/hardware/a6000-pcie.json");
    QVERIFY(a6000.is_object());
    const Ran r = engine({"simulate", "--hardware", "a6000-pcie", "--model", "llama2-7b",
                          "--strategy", "sp", "--devices", "2", "--prompt-len", "131072"});
    QVERIFY(!r.crashed);
    QCOMPARE(r.exit_code, 3);
    const Stream s = read_stream(r.out);
    QVERIFY2(s.errors.empty(), s.errors.empty() ? "" : s.errors.front().c_str());
    QVERIFY(std::holds_alternative<Hello>(s.events.front()));
    QCOMPARE(int(s.all<Error>().size()), 1);
    const Error& e = *s.all<Error>().front();
    QCOMPARE(e.code, std::string("oom"));
    QVERIFY(e.rank >= 0 && e.rank < 2);
    QVERIFY2(e.detail.is_object() && e.detail.contains("category"), e.detail.dump().c_str());
    const std::string category = e.detail["category"];
    QVERIFY2(std::find(kCategories.begin(), kCategories.end(), category) != kCategories.end(),
             category.c_str());
    QVERIFY2(e.message.find(category) != std::string::npos, e.message.c_str());
    // Over the simulated device's capacity, the one the profile gives.
    const int64_t capacity = e.detail["capacity"], requested = e.detail["requested"],
                  in_use = e.detail["in_use"];
    QCOMPARE(capacity, a6000["device"]["memory_bytes"].get<int64_t>());
    QVERIFY(requested > 0 && in_use + requested > capacity);
    QVERIFY(s.done());
    QCOMPARE(s.done()->status, std::string("oom"));
    QCOMPARE(s.done()->exit_code, 3);
    // One stderr line saying which rank ran out.
    const QString err = one_line(r.err);
    QVERIFY2(!err.isEmpty() && !err.contains('\n'), qPrintable(err));
    QVERIFY2(err.contains("oom"), qPrintable(err));
  }

  // Exactness at the edge: with the capacity set to the measured peak both
  // backends finish, one byte less and both fail at the same allocation.
  void capacityAtMeasuredPeak_data() {
    QTest::addColumn<QString>("model");
    for (const QString& m : kFamilies) QTest::newRow(qPrintable(m)) << m;
  }
  void capacityAtMeasuredPeak() {
    QFETCH(QString, model);
    const QStringList args = {"--model",      model,
                              "--prompt-len", QString::number(kPrompt),
                              "--decode",     QString::number(kDecode)};
    const Ran measured = engine(QStringList{"run"} + args);
    QVERIFY2(measured.exit_code == 0, measured.err.constData());
    const auto m = flat_rank_metrics(read_stream(measured.out));
    QVERIFY(m.count({0, "peak_bytes"}));
    const auto peak = int64_t(m.at({0, "peak_bytes"}));

    for (int64_t capacity : {peak, peak - 1}) {
      const QStringList with = args + QStringList{"--capacity", QString::number(capacity)};
      const Ran real = engine(QStringList{"run"} + with);
      const Ran sim = engine(QStringList{"simulate"} + with);
      QVERIFY(!real.crashed && !sim.crashed);
      const int want = capacity == peak ? 0 : 3;
      QVERIFY2(real.exit_code == want, real.err.constData());
      QVERIFY2(sim.exit_code == want, sim.err.constData());
      if (want == 0) continue;
      const Stream a = read_stream(real.out), b = read_stream(sim.out);
      QCOMPARE(int(a.all<Error>().size()), 1);
      QCOMPARE(int(b.all<Error>().size()), 1);
      const json &da = a.all<Error>().front()->detail, &db = b.all<Error>().front()->detail;
      QVERIFY2(da == db,
               qPrintable(QString("cpu %1\nsim %2").arg(da.dump().c_str(), db.dump().c_str())));
      QCOMPARE(b.all<Error>().front()->message, a.all<Error>().front()->message);
    }
  }
};

QTEST_GUILESS_MAIN(TestSim)
#include "tst_sim.moc"

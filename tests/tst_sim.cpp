// The simulator against real runs. `simulate` runs the same model, strategy
// and allocator code as `launch` (one thread per rank instead of one MPI
// process), so for the same options the two streams must agree on everything
// but time: peak memory per rank and category to the byte, placements, token
// ranges, and the sequence of compute and comm spans. Beyond that (malformed
// hardware profiles: tst_sim_profiles): 7B-class models at 64K-128K
// tokens and a 64-rank mesh simulate to the end with the weights their
// strategy promises, and running out of a simulated device's memory is an
// `oom` result, not a crash.
#include <QtTest>
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "engine_process.h"
#include "sim_profiles.h"
#include "protocol/events.h"

using namespace ss::proto;
using json = nlohmann::json;

namespace {

const std::vector<std::string> kCategories = {"weights",   "activations",  "kv_cache",
                                              "ssm_state", "comm_buffers", "workspace"};
const QStringList kFamilies = {"tiny-llama", "tiny-mamba", "tiny-falcon-mamba", "tiny-mamba2",
                               "tiny-hybrid"};
constexpr int kPrompt = 24, kDecode = 4;
// A calibration's limit: it measures in passes and turns (a few minutes under
// ASan with more ranks than cores, longer on a loaded host); a hung one still ends.
constexpr int kCalibrateMs = 600000;

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

  Ran simulate_with(const QString& name, const json& profile, const QStringList& args) {
    return ::simulate_with(m_dir, name, profile, args);
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
    QVERIFY(m_dir.isValid());
    QVERIFY(sim_suite_ready(m_h100));
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

  // With more ranks than cores, calibrate measures the core share at a few
  // kernel lengths, each a fraction of a core with its source.
  void calibrateOversubscribed() {
    const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
    if (cores > 4) QSKIP("more than 4 cores: a calibration with more ranks than cores would be long here");
    // Under ASan tst_sim was the leg's longest suite (728 s of a 54-minute CI
    // run, this case 195 s of it). Under ASan calibratedProfile runs the same
    // code with a core for each rank.
    if (qEnvironmentVariableIsSet("SHARDSCOPE_SANITIZER_LEG")) QSKIP("runs in the plain leg");
    // --quick: the core share is measured as in a full calibration; the grids
    // once and the collectives at fewer sizes.
    const QString file = m_dir.filePath("calibrated-over.json");
    // An even count, so that the ranks also form groups of 2 (a mesh's).
    const int ranks = (cores / 2 + 1) * 2;
    const Ran c = engine({"calibrate", "--quick", "--ranks", QString::number(ranks), "--out", file}, kCalibrateMs);
    QVERIFY(!c.crashed);
    QVERIFY2(c.exit_code == 0, c.err.constData());
    const json profile = read_json(file);
    QVERIFY2(profile.value("name", "").find("quickly (--quick)") != std::string::npos, profile.value("name", "").c_str());
    // The GEMMs timed in step, as a tensor-parallel decode runs them, on the CPU clock.
    const json& gt = profile["device"]["gemm_times"];
    for (const char* part : {"median of 1 pass", "every rank called the same GEMM at once"})
      QVERIFY2(gt.value("note", "").find(part) != std::string::npos, gt.dump().c_str());
    QVERIFY2(gt.value("source", "").find("thread CPU clock") != std::string::npos, gt.dump().c_str());
    const json d = profile["device"];
    QVERIFY2(d.contains("core_share") && d["core_share"].contains("source"), d.dump().c_str());
    const json& cs = d["core_share"];
    QCOMPARE(cs["share"].size(), cs["kernel_us"].size());
    QVERIFY(cs["share"].size() >= 2);
    for (const auto& v : cs["share"]) QVERIFY2(v.get<double>() > 0 && v.get<double>() <= 1, cs.dump().c_str());
    QVERIFY(!d.contains("core_steps"));  // the raw steps stay inside calibrate
    // ... and the same GEMMs beside a broadcast and a ring step in flight.
    QVERIFY2(d.contains("overlap_steps") && d["overlap_steps"].contains("source"), d.dump().c_str());
    const json& ov = d["overlap_steps"];
    QCOMPARE(ov["share"].size(), ov["kernel_us"].size());
    for (const auto& v : ov["share"]) QVERIFY2(v.get<double>() > 0 && v.get<double>() <= 1, ov.dump().c_str());
    for (const char* op : {"broadcast", "sendrecv"}) {
      QVERIFY2(ov["wait_us"].contains(op) && ov["wait_us"][op].size() == ov["kernel_us"].size(), op);
      for (const auto& v : ov["wait_us"][op]) QVERIFY2(v.get<double>() > 0, ov.dump().c_str());
    }
    QVERIFY(!d.contains("overlap_raw"));
    QVERIFY(!d.contains("contention"));  // the steps stand for it
    // Every collective also timed in groups of each count that divides the
    // ranks, at the world's sizes, and read back by the simulator.
    if (ranks < 4) return;
    for (const char* op : {"all_reduce", "all_gather", "broadcast", "sendrecv"}) {
      const json& c = profile["node"]["link"]["collectives"][op];
      QVERIFY2(c.value("ranks", 0) == ranks && c.contains("groups"), c.dump().c_str());
      std::vector<int> counts;
      for (const json& g : c["groups"]) {
        counts.push_back(g.value("ranks", 0));
        QVERIFY2(g["bytes"] == c["bytes"] && g["us"].size() == c["us"].size(), g.dump().c_str());
        for (const json& us : g["us"]) QVERIFY2(us.get<double>() > 0, g.dump().c_str());
      }
      std::vector<int> want;
      for (int n = 2; n < ranks; ++n)
        if (ranks % n == 0) want.push_back(n);
      QCOMPARE(counts, want);
    }
    const Ran r = engine({"simulate", "--hardware", file, "--model", "tiny-llama", "--strategy", "tp_sp", "--mesh",
                          "2x" + QString::number(ranks / 2), "--devices", QString::number(ranks), "--prompt-len", "24",
                          "--decode", "2"});
    QVERIFY(!r.crashed);
    QVERIFY2(r.exit_code == 0, r.err.constData());
  }

  // calibrate writes a profile the simulator accepts, with the measured tables
  // and per-collective alpha-beta, each with its source.
  // Under a sanitizer, --quick (the same tables from one pass of each grid,
  // the collectives at 4 sizes): a full calibration there took 140 s.
  // With --for a run, its GEMM shapes and its collectives' own message sizes
  // are measured too.
  void calibratedProfile() {
    const bool quick = qEnvironmentVariableIsSet("SHARDSCOPE_SANITIZER_LEG");
    const QString file = m_dir.filePath("calibrated.json");
    const QStringList run = {"--model", "tiny-llama", "--strategy", "tsp", "--devices", "2", "--prompt-len", "24",
                             "--decode", "4"};
    const Ran c = engine(QStringList{"calibrate", "--ranks", "2", "--out", file, "--for", run.join(' ')} +
                             (quick ? QStringList{"--quick"} : QStringList{}),
                         kCalibrateMs);
    QVERIFY(!c.crashed);
    QVERIFY2(c.exit_code == 0, c.err.constData());
    const json p = read_json(file);
    QVERIFY(p.is_object());
    QCOMPARE(p.value("name", "").find("quickly") != std::string::npos, quick);
    const json& d = p["device"];
    for (const char* k : {"kernel_times", "gemm_times", "attention_times"}) {
      QVERIFY2(d.contains(k) && d[k].contains("source"), k);
    }
    for (const char* op : {"add", "rmsnorm", "rope", "silu_mul", "embedding", "argmax"})
      QVERIFY2(d["kernel_times"].contains(op), op);
    // The engine's own time between kernels, from a decode of the --for run's model.
    QVERIFY2(d.contains("host_gap") && d["host_gap"].contains("source") && d["host_gap"].value("us", 0.0) > 0 &&
                 d["host_gap"].value("note", "").find("tiny-llama") != std::string::npos,
             d.value("host_gap", json()).dump().c_str());
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
      QVERIFY(!d.contains("overlap_steps"));
      // ... which its comm thread shares: how long either waits for the other.
      QVERIFY2(d["contention"].contains("hold_us") && d["contention"]["hold_us"].get<double>() >= 0,
               d["contention"].dump().c_str());
    }
    for (const char* op : {"all_reduce", "all_gather", "broadcast", "sendrecv"}) {
      QVERIFY2(p["node"]["link"].contains("collectives") && p["node"]["link"]["collectives"].contains(op), op);
      const json& c = p["node"]["link"]["collectives"][op];  // the measured times beside the fit
      QVERIFY2(c.value("ranks", 0) == 2 && c["bytes"].size() >= 2 && c["us"].size() == c["bytes"].size(), op);
      QVERIFY2(!c.contains("groups"), op);  // 2 ranks form no smaller group
    }
    const Ran r = engine(QStringList{"simulate", "--hardware", file} + run);
    QVERIFY(!r.crashed);
    QVERIFY2(r.exit_code == 0, r.err.constData());
    const Stream s = read_stream(r.out);
    QVERIFY(s.done() && s.done()->status == "ok");
    // Every message of the run is a size of its collective's table: the
    // buffer it moves (fp32 elements, dims[0]), whatever its wire bytes.
    const json& colls = p["node"]["link"]["collectives"];
    int odd = 0;  // sizes no 64 B times a power of 4 matches: off the fixed list, measured because --for asked
    for (const ss::proto::Span* sp : s.all<ss::proto::Span>()) {
      if (sp->stream != "comm" || sp->dims.empty() || sp->bytes <= 0) continue;
      const double want = 4.0 * double(sp->dims[0]);
      const json& bytes = colls[sp->op]["bytes"];
      QVERIFY2(std::find(bytes.begin(), bytes.end(), json(want)) != bytes.end(),
               qPrintable(QString::fromStdString(sp->op) + " of " + QString::number(want) + " B not in " +
                          QString::fromStdString(bytes.dump())));
      odd += std::log2(want / 64) / 2 != std::floor(std::log2(want / 64) / 2);
    }
    QVERIFY(odd > 0);
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

  // --- 3. scale: big models and many ranks run to the end ------------------

  void scale_data() {
    QTest::addColumn<QString>("model");
    QTest::addColumn<QString>("strategy");
    QTest::addColumn<int>("devices");
    QTest::addColumn<QStringList>("extra");
    QTest::addColumn<int>("shards");  // ranks each split weight is divided over
    QTest::addColumn<int>("per_node");
    QTest::addColumn<int>("bytes_per_value");
    // tsp: 1/D of every projection on each rank, norms and embeddings whole.
    // Under ASan at 16K (128K was 23 s there; what this row checks does not
    // depend on the length); the plain and TSan legs run 128K.
    const bool sanitized = qEnvironmentVariableIsSet("SHARDSCOPE_SANITIZER_LEG");
    QTest::newRow(sanitized ? "llama2-7b/tsp/D8/16K" : "llama2-7b/tsp/D8/128K")
        << "llama2-7b"
        << "tsp" << 8 << QStringList{"--prompt-len", sanitized ? "16384" : "131072", "--decode", "2"} << 8 << 8 << 4;
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

  // --- 4. out of memory in the simulator: a result, not a crash ------------

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

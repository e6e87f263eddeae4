// Every strategy equals single: `shardscope-engine launch` over 2, 3 and 4
// ranks must give the logits a one-device `run` gives, row for row, for every
// model family. The launched ranks use the backend SHARDSCOPE_STRATEGIES_BACKEND
// names (cpu by default; ctest also runs the suite with cuda-emu, the cuda
// kernels under the host emulator over MPI, and cuda, on a GPU), the
// reference is always a cpu run. Also checks the memory each strategy promises per rank (from
// the stream's per-rank metrics, against closed forms worked out here from the
// model dimensions), and what happens when a rank dies or a shape cannot be
// split: the launcher must say which rank or which number, and start nothing
// for a shape it refuses.
#include <signal.h>

#include <QtTest>
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "engine_process.h"
#include "npy_compare.h"
#include "protocol/events.h"

using namespace ss::proto;

namespace {

// Prompt length for the equivalence rows: a multiple of 2D for D = 2, 3, 4
// (zigzag chunks), and each chunk (24 / 8 = 3 tokens at D = 4) still holds
// the d_conv - 1 = 3 tokens a conv halo needs.
constexpr int kPrompt = 24;
constexpr int kDecode = 8;
constexpr double kTolerance = 1e-5;
// bf16 rows: a strategy rounds at other points than single does (a
// tensor-parallel partial sum is rounded before it is reduced, a sequence
// shard's state or K/V after), and sums in another order, so each run's
// residual stream carries a few independent roundings of u = 2^-8 per layer
// and site. Through the 2-4 layers of the tiny models that stays well inside
// 8u = 2^-5 ~ 3.1e-2; an error in the sharding itself (a wrong shard, a lost
// partial sum) moves logits by O(1). Decode is teacher-forced in these rows
// (--force-decode) so a near-tie flipping a greedy token cannot change the
// contexts compared.
constexpr double kToleranceBf16 = 0.03125;

QStringList with_sets(QStringList args, const QStringList& sets) {
  for (auto& s : sets) args << "--set" << s;
  return args;
}

// Overrides that make the preset's shapes split over D ranks, chosen per
// family so that the rows cover the sharding cases each family has.
QStringList shape_sets(const QString& model, int D) {
  if (model == "tiny-llama") {
    // Preset: 4 heads, 2 kv heads, intermediate 160 (fits D = 2 as it is).
    if (D == 3)
      return {"num_attention_heads=12", "num_key_value_heads=6", "head_dim=8",
              "intermediate_size=192"};
    if (D == 4) return {"num_attention_heads=8", "num_key_value_heads=4"};
    return {};
  }
  if (model == "tiny-mamba" || model == "tiny-falcon-mamba") {
    // Preset d_inner is 2 * 64 = 128, which 3 does not divide.
    if (D == 3) return {"intermediate_size=96"};
    return {};
  }
  if (model == "tiny-mamba2") {
    // Preset: 8 heads of 16 in 2 groups. D = 2: one whole group per rank;
    // D = 4: each group spans two ranks (the gated norm needs the partner).
    // D = 3: d_inner 96 gives 6 heads, one group spread over all ranks.
    if (D == 3) return {"hidden_size=48", "n_groups=1"};
    return {};
  }
  if (model == "tiny-hybrid") {
    // The sub-blocks keep their own values over top-level ones, so whole
    // sub-objects are replaced. D = 3: attention 12/6 heads of 8, Mamba2 12
    // heads in 3 groups (4 heads per rank = one group); D = 4: attention 8/4,
    // Mamba2 as the preset (8 heads, 2 groups: a group spans two ranks).
    if (D == 3)
      return {
          "hidden_size=96",
          R"(attention={"num_attention_heads":12,"num_key_value_heads":6,"intermediate_size":192})",
          R"(mamba2={"state_size":16,"expand":2,"head_dim":16,"n_groups":3,"conv_kernel":4,"chunk_size":16})"};
    if (D == 4)
      return {
          R"(attention={"num_attention_heads":8,"num_key_value_heads":4,"intermediate_size":160})"};
    return {};
  }
  return {};
}

// Positions whose K/V (or state) sequence rank `r` of `S` keeps: its prompt
// chunks (zigzag: chunks r and 2S-1-r of 2S; contiguous: chunk r of S) and
// the decode tokens p with p % S == r. Worked out here, not taken from the engine.
std::set<int64_t> owned_positions(int S, int r, bool zigzag) {
  std::set<int64_t> out;
  const int n = zigzag ? 2 * S : S;
  for (int k = 0; k < n; ++k) {
    const int owner = !zigzag || k < S ? k : 2 * S - 1 - k;
    if (owner != r) continue;
    for (int64_t p = kPrompt * k / n; p < kPrompt * (k + 1) / n; ++p) out.insert(p);
  }
  for (int64_t p = kPrompt; p < kPrompt + kDecode; ++p)
    if (p % S == r) out.insert(p);
  return out;
}

// /proc: parent pid of each process, and the descendants of one.
std::map<pid_t, pid_t> parents() {
  std::map<pid_t, pid_t> out;
  for (const QString& name : QDir("/proc").entryList(QDir::Dirs | QDir::NoDotAndDotDot)) {
    bool ok = false;
    const pid_t pid = pid_t(name.toInt(&ok));
    if (!ok) continue;
    QFile f("/proc/" + name + "/stat");
    if (!f.open(QIODevice::ReadOnly)) continue;
    const QByteArray stat = f.readAll();
    // "pid (comm) state ppid ...": comm may hold spaces, so split after ')'.
    const qsizetype close = stat.lastIndexOf(')');
    if (close < 0) continue;
    const QList<QByteArray> fields = stat.mid(close + 2).split(' ');
    if (fields.size() > 1) out[pid] = pid_t(fields[1].toInt());
  }
  return out;
}

std::vector<pid_t> descendants(pid_t root) {
  const auto parent = parents();
  std::vector<pid_t> out;
  std::set<pid_t> frontier = {root};
  while (!frontier.empty()) {
    std::set<pid_t> next;
    for (auto& [pid, ppid] : parent)
      if (frontier.count(ppid)) {
        out.push_back(pid);
        next.insert(pid);
      }
    frontier = std::move(next);
  }
  return out;
}

// The MPI rank a process runs as (-1 when it is not a rank).
int mpi_rank_of(pid_t pid) {
  QFile f(QString("/proc/%1/environ").arg(pid));
  if (!f.open(QIODevice::ReadOnly)) return -1;
  for (const QByteArray& kv : f.readAll().split('\0'))
    if (kv.startsWith("OMPI_COMM_WORLD_RANK=")) return kv.mid(21).toInt();
  return -1;
}

// Ends a launch and every process under it when a check fails half way, so
// no ranks are left running.
struct KillTree {
  QProcess& p;
  ~KillTree() {
    if (p.state() == QProcess::NotRunning) return;
    for (pid_t pid : descendants(pid_t(p.processId()))) ::kill(pid, SIGKILL);
    p.kill();
    p.waitForFinished();
  }
};

bool alive(pid_t pid) {
  QFile f(QString("/proc/%1/stat").arg(pid));
  if (!f.open(QIODevice::ReadOnly)) return false;
  const QByteArray stat = f.readAll();
  const qsizetype close = stat.lastIndexOf(')');
  return close >= 0 && stat.size() > close + 2 && stat[close + 2] != 'Z';
}

// Dimensions of the memory checks' model: tiny-llama with every shape set
// here, so the expectations below never depend on the preset file.
struct Dims {
  int64_t vocab = 256, d = 64, layers = 2, heads = 8, kv_heads = 4, head_dim = 8, ffn = 192;
  QStringList sets() const {
    return {QString("vocab_size=%1").arg(vocab),
            QString("hidden_size=%1").arg(d),
            QString("num_hidden_layers=%1").arg(layers),
            QString("num_attention_heads=%1").arg(heads),
            QString("num_key_value_heads=%1").arg(kv_heads),
            QString("head_dim=%1").arg(head_dim),
            QString("intermediate_size=%1").arg(ffn),
            "tie_word_embeddings=false"};
  }
  // Elements of a layer's weights that tensor parallelism splits: q, k, v, o
  // by heads, gate, up, down by MLP columns/rows.
  int64_t sharded_per_layer() const {
    return d * head_dim * (2 * heads + 2 * kv_heads) + 3 * d * ffn;
  }
  // Elements every rank holds whole: two norms per layer, the final norm,
  // the embedding and the (untied) lm_head.
  int64_t mirrored() const { return layers * 2 * d + d + 2 * vocab * d; }
  int64_t weight_bytes(int T) const { return 4 * (layers * sharded_per_layer() / T + mirrored()); }
  // K and V of every attention layer for `tokens` tokens and kv_heads / T heads.
  int64_t kv_bytes(int64_t tokens, int T) const {
    return 4 * 2 * layers * tokens * (kv_heads / T) * head_dim;
  }
};

}  // namespace

class TestStrategies : public QObject {
  Q_OBJECT

  QTemporaryDir m_dir;
  // Reference logits by run arguments: the file, or why the run failed.
  std::map<QString, std::pair<QString, QString>> m_single;
  int m_hung = 0;  // runs that did not finish in time
  // The launched runs' backend; the single-device reference is always cpu.
  const QString m_backend = qEnvironmentVariable("SHARDSCOPE_STRATEGIES_BACKEND", "cpu");
  // What only the cpu backend's rows check (a killed rank, refusals before launch).
  QString not_cpu() const {
    return m_backend == "cpu" ? QString() : "checked with --backend cpu (this pass runs " + m_backend + ")";
  }

  // Runs the engine, counting runs that hang (a tiny run takes a second).
  Ran engine_run(const QStringList& args) {
    const Ran r = engine(args, 60000);
    if (r.timed_out) ++m_hung;
    return r;
  }

  // The single-device logits for these arguments, run once and shared:
  // (file, "") or ("", why it failed).
  std::pair<QString, QString> single_logits(const QStringList& args) {
    const QString key = args.join(' ');
    if (auto it = m_single.find(key); it != m_single.end()) return it->second;
    const QString file = m_dir.filePath(QString("single-%1.npy").arg(m_single.size()));
    const Ran r = engine_run(QStringList{"run"} + args + QStringList{"--logits-out", file});
    if (r.crashed || r.exit_code != 0)
      return m_single[key] = {QString(),
                              QString("the single-device reference failed (exit %1%2): %3")
                                  .arg(r.exit_code)
                                  .arg(r.timed_out ? ", hung" : "")
                                  .arg(QString::fromUtf8(r.err).trimmed())};
    return m_single[key] = {file, QString()};
  }

  // Rows of the equivalence table for one model family: tp, sp, tsp and dp
  // on 2, 3 and 4 ranks, sp with the contiguous split, tp_sp on a 2x2 mesh.
  static void family_rows(const QString& model) {
    QTest::addColumn<QString>("model");
    QTest::addColumn<QString>("strategy");
    QTest::addColumn<int>("devices");
    QTest::addColumn<QStringList>("extra");  // --mesh, --split, --batch
    QTest::addColumn<QStringList>("sets");
    QTest::addColumn<int>("batch");
    QTest::addColumn<QString>("dtype");

    auto row = [&](const QString& strategy, int D, const QStringList& extra, const QStringList& sets, int batch,
                   const QString& tag = {}, const QString& dtype = "fp32") {
      const QString name =
          QString("%1/%2/D%3%4%5").arg(model, strategy).arg(D).arg(tag, dtype == "fp32" ? "" : "/" + dtype);
      QTest::newRow(qPrintable(name)) << model << strategy << D << extra << sets << batch << dtype;
    };
    // SHARDSCOPE_STRATEGY_ROWS=sample (the emulated cuda pass, the sanitizer
    // leg): every strategy of every family on 2 and 4 ranks once (dp on 2),
    // and two bf16 rows; the plain cpu pass runs them all.
    const bool sample = qEnvironmentVariable("SHARDSCOPE_STRATEGY_ROWS") == "sample";
    for (int D : {2, 3, 4}) {
      if (sample && D == 3) continue;
      const QStringList sets = shape_sets(model, D);
      row("tp", D, {}, sets, 1);
      row("sp", D, {}, sets, 1);
      row("tsp", D, {}, sets, 1);
      // dp splits the batch: one sequence per rank, against single with
      // the same batch.
      if (!sample || D == 2) row("dp", D, {"--batch", QString::number(D)}, sets, D);
    }
    if (!sample) row("sp", 4, {"--split", "contiguous"}, shape_sets(model, 4), 1, "/contiguous");
    row("tp_sp", 4, {"--mesh", "2x2"}, shape_sets(model, 4), 1, "/2x2");
    // bf16: every strategy on 2 and 4 ranks against single in bf16.
    for (int D : {2, 4}) {
      const QStringList sets = shape_sets(model, D);
      for (const QString strategy : {"tp", "sp", "tsp"})
        if (!sample || (strategy == "tsp" && D == 2) || (strategy == "tp" && D == 4))
          row(strategy, D, {}, sets, 1, {}, "bf16");
      if (!sample) row("dp", D, {"--batch", QString::number(D)}, sets, D, {}, "bf16");
    }
    if (!sample) row("tp_sp", 4, {"--mesh", "2x2"}, shape_sets(model, 4), 1, "/2x2", "bf16");
    // Mamba2 group layouts beyond the ones above: several whole groups per
    // rank (D = 2, 4 groups), and one group spread over four ranks.
    const QString one_group =
        R"(mamba2={"state_size":16,"expand":2,"head_dim":16,"n_groups":1,"conv_kernel":4,"chunk_size":16})";
    for (const QString strategy : {"tp", "tsp"}) {
      if (model == "tiny-mamba2") {
        row(strategy, 2, {}, {"n_groups=4"}, 1, "/groups4");
        row(strategy, 4, {}, {"n_groups=1"}, 1, "/groups1");
      }
      if (model == "tiny-hybrid")
        row(strategy, 4, {}, shape_sets(model, 4) + QStringList{one_group}, 1, "/groups1");
    }
  }

  void equals_single() {
    QFETCH(QString, model);
    QFETCH(QString, strategy);
    QFETCH(int, devices);
    QFETCH(QStringList, extra);
    QFETCH(QStringList, sets);
    QFETCH(int, batch);
    QFETCH(QString, dtype);
    // Every row runs in well under a minute; once runs hang, more would only
    // run into the test's time limit.
    if (m_hung >= 3) QFAIL("three engine runs hung already; not starting another");

    QStringList common =
        with_sets({"--model", model, "--prompt-len", QString::number(kPrompt), "--decode",
                   QString::number(kDecode), "--seed", "3", "--dtype", dtype},
                  sets);
    const bool bf16 = dtype == "bf16";
    if (bf16) common << "--force-decode" << "5,17,3,250,9,0,77,128";
    const auto [reference, why] =
        single_logits(batch > 1 ? common + QStringList{"--batch", QString::number(batch)} : common);
    QVERIFY2(!reference.isEmpty(), qPrintable(why));

    const QString file =
        m_dir.filePath(QString("%1.npy").arg(QTest::currentDataTag()).replace('/', '_'));
    const Ran r = engine_run(
        QStringList{"launch", "--backend", m_backend, "--strategy", strategy, "--devices", QString::number(devices)} +
        extra + common + QStringList{"--logits-out", file});
    QVERIFY2(!r.timed_out, "launch did not finish in 60 s");
    QVERIFY2(r.exit_code == 0, qPrintable(QString("launch exit %1: %2")
                                              .arg(r.exit_code)
                                              .arg(QString::fromUtf8(r.err).trimmed())));

    // The stream: whole, every line a record, one device per rank, done ok.
    const Stream s = read_stream(r.out);
    QVERIFY2(s.errors.empty(), s.errors.empty() ? "" : s.errors.front().c_str());
    QCOMPARE(s.rejected, int64_t(0));
    QVERIFY(!s.events.empty());
    QVERIFY(std::holds_alternative<Hello>(s.events.front()));
    const auto* done = std::get_if<Done>(&s.events.back());
    QVERIFY2(done, "the stream does not end with done");
    QCOMPARE(done->status, std::string("ok"));
    QCOMPARE(done->exit_code, 0);
    QVERIFY(s.all<Error>().empty());
    QCOMPARE(int(s.all<Config>().size()), 1);
    const nlohmann::json& conf = s.all<Config>().front()->config;
    QCOMPARE(conf["strategy"].get<std::string>(), strategy.toStdString());
    QCOMPARE(conf["devices"].get<int>(), devices);
    // The emulated ranks' collectives are the ones this pass means: NCCL's
    // communicator where SHARDSCOPE_NCCL_LIBRARY names a library for it.
    if (m_backend == "cuda-emu" && devices > 1)
      QCOMPARE(QString::fromStdString(conf.value("/gpu/collectives"_json_pointer, std::string())).startsWith("nccl"),
               !qEnvironmentVariable("SHARDSCOPE_NCCL_LIBRARY").isEmpty());
    std::set<int> ranks;
    for (auto* d : s.all<Device>()) QVERIFY(ranks.insert(d->rank).second);
    QCOMPARE(int(ranks.size()), devices);
    QCOMPARE(*ranks.rbegin(), devices - 1);

    // Each rank's tokens record follows the split: rank = sp_rank * T + tp_rank
    // (dp: every rank holds its own sequences whole).
    const bool zigzag = !extra.contains("contiguous");
    const int T = strategy == "tp" ? devices : strategy == "tp_sp" ? 2 : 1;
    const int S = strategy == "sp" || strategy == "tsp" ? devices : strategy == "tp_sp" ? 2 : 1;
    std::map<int, std::set<int64_t>> held;
    for (auto* t : s.all<Tokens>())
      for (auto& [a, b] : t->ranges)
        for (int64_t p = a; p < b; ++p) held[t->rank].insert(p);
    for (int rank = 0; rank < devices; ++rank)
      QVERIFY2(held[rank] == owned_positions(S, rank / T % S, zigzag),
               qPrintable(QString("rank %1 holds the wrong tokens").arg(rank)));

    // The logits: every prefill row and every decode row.
    ss::NpyArray got, want;
    try {
      got = ss::read_npy(file.toStdString());
      want = ss::read_npy(reference.toStdString());
    } catch (const std::exception& e) {
      QFAIL(e.what());
    }
    const std::vector<int64_t> shape =
        batch > 1 ? std::vector<int64_t>{batch, kPrompt + kDecode, want.shape.back()}
                  : std::vector<int64_t>{kPrompt + kDecode, want.shape.back()};
    QCOMPARE(want.shape, shape);
    QCOMPARE(got.shape, shape);
    const auto [worst, at] = worst_row(got, want);
    const int64_t total = kPrompt + kDecode;
    if (bf16) qInfo("%s: worst row relative L2 %.3g (bound %.3g)", QTest::currentDataTag(), worst, kToleranceBf16);
    QVERIFY2(worst <= (bf16 ? kToleranceBf16 : kTolerance),
             qPrintable(QString("relative L2 %1 at sequence %2, position %3 (%4)")
                            .arg(worst)
                            .arg(at / total)
                            .arg(at % total)
                            .arg(at % total < kPrompt ? "prefill" : "decode")));
  }

 private slots:
  void initTestCase() {
    QVERIFY2(QFileInfo::exists(SHARDSCOPE_ENGINE_BIN), SHARDSCOPE_ENGINE_BIN);
    QVERIFY(m_dir.isValid());
    if (m_backend == "cuda") {
      const Ran info = engine({"info"});
      if (!info.out.contains("cuda  available"))
        QSKIP("skipped: no CUDA device (`shardscope-engine info` finds none)");
    }
  }

  // --- 1. every strategy equals single ------------------------------------
  // One test function per family keeps each under the per-function limit.

  void tinyLlama_data() { family_rows("tiny-llama"); }
  void tinyLlama() { equals_single(); }
  void tinyMamba_data() { family_rows("tiny-mamba"); }
  void tinyMamba() { equals_single(); }
  void tinyFalconMamba_data() { family_rows("tiny-falcon-mamba"); }
  void tinyFalconMamba() { equals_single(); }
  void tinyMamba2_data() { family_rows("tiny-mamba2"); }
  void tinyMamba2() { equals_single(); }
  void tinyHybrid_data() { family_rows("tiny-hybrid"); }
  void tinyHybrid() { equals_single(); }

  // --- 2. memory per rank in closed form ----------------------------------

  void memoryClosedForm_data() {
    QTest::addColumn<QString>("strategy");
    QTest::addColumn<int>("devices");
    QTest::addColumn<int>("T");
    QTest::addColumn<int>("S");
    QTest::newRow("tp/D2") << "tp" << 2 << 2 << 1;
    QTest::newRow("tp/D4") << "tp" << 4 << 4 << 1;
    QTest::newRow("sp/D2") << "sp" << 2 << 1 << 2;
    QTest::newRow("sp/D4") << "sp" << 4 << 1 << 4;
    QTest::newRow("tp_sp/D4/2x2") << "tp_sp" << 4 << 2 << 2;
  }

  void memoryClosedForm() {
    QFETCH(QString, strategy);
    QFETCH(int, devices);
    QFETCH(int, T);
    QFETCH(int, S);
    const Dims dims;
    // An odd decode count leaves the sp ranks with different numbers of
    // decode tokens, so the check sees which rank stores which.
    const int64_t P = 24, decode = 7;
    QStringList args = {"launch",
                        "--backend",
                        m_backend,
                        "--model",
                        "tiny-llama",
                        "--strategy",
                        strategy,
                        "--devices",
                        QString::number(devices),
                        "--prompt-len",
                        QString::number(P),
                        "--decode",
                        QString::number(decode),
                        "--seed",
                        "3"};
    if (strategy == "tp_sp") args << "--mesh" << QString("%1x%2").arg(T).arg(S);
    const Ran r = engine(with_sets(args, dims.sets()));
    QVERIFY2(r.exit_code == 0, r.err.constData());
    const Stream s = read_stream(r.out);
    QCOMPARE(s.rejected, int64_t(0));
    const auto metrics = s.rank_metrics();
    QCOMPARE(int(metrics.size()), devices);

    std::map<int, int64_t> token_count;
    for (auto* t : s.all<Tokens>())
      for (auto& [a, b] : t->ranges) token_count[t->rank] += b - a;

    for (int rank = 0; rank < devices; ++rank) {
      QVERIFY2(metrics.count(rank), qPrintable(QString("no metrics of rank %1").arg(rank)));
      const auto& m = metrics.at(rank);
      QVERIFY(m.count("peak_weights_bytes") && m.count("peak_kv_cache_bytes"));
      // Rank = sp_rank * T + tp_rank.
      const int sp_rank = rank / T;
      // sp ranks own prompt / S tokens; decode token p is stored on p % S.
      int64_t tokens = P / S;
      for (int64_t p = P; p < P + decode; ++p)
        if (p % S == sp_rank) ++tokens;
      const QString who = QString("rank %1").arg(rank);
      QVERIFY2(int64_t(m.at("peak_weights_bytes")) == dims.weight_bytes(T),
               qPrintable(QString("%1: weights %2, expected %3")
                              .arg(who)
                              .arg(int64_t(m.at("peak_weights_bytes")))
                              .arg(dims.weight_bytes(T))));
      QVERIFY2(int64_t(m.at("peak_kv_cache_bytes")) == dims.kv_bytes(tokens, T),
               qPrintable(QString("%1: kv_cache %2, expected %3 (%4 tokens)")
                              .arg(who)
                              .arg(int64_t(m.at("peak_kv_cache_bytes")))
                              .arg(dims.kv_bytes(tokens, T))
                              .arg(tokens)));
      QVERIFY2(token_count[rank] == tokens,
               qPrintable(QString("%1: tokens record holds %2 tokens, expected %3")
                              .arg(who)
                              .arg(token_count[rank])
                              .arg(tokens)));
    }
    if (strategy == "sp") {
      // Sequence parallelism keeps every weight whole on every rank.
      const int64_t full = 4 * (dims.layers * dims.sharded_per_layer() + dims.mirrored());
      for (auto& [rank, m] : metrics) QCOMPARE(int64_t(m.at("peak_weights_bytes")), full);
    }
  }

  // The quantized all-reduce (--comm-precision int8: each rank's partial sum
  // quantized, the pieces gathered in place, dequantized and summed) on this
  // pass's backend against the cpu's. The same bytes are quantized, so the
  // logits agree far inside the quantization's own error (2e-2 against the
  // unquantized run here; the emulated kernels agree to 3e-7); 1e-3 leaves
  // room for a GEMM summing in another order and flipping a rounding.
  void quantizedAllReduceAsCpu() {
    SKIP_IF(m_backend == "cpu" ? QString("the cpu's quantized collectives are tst_quant's and tst_sweep's") : QString());
    const QStringList common = {"--model", "tiny-llama", "--prompt-len", "24", "--decode", "6", "--seed", "3",
                                "--force-decode", "5,17,3,250,9,0", "--strategy", "tp", "--devices", "2",
                                "--comm-precision", "int8"};
    std::map<QString, ss::NpyArray> logits;
    for (const QString& backend : {QString("cpu"), m_backend}) {
      const QString file = m_dir.filePath("quantized-" + backend + ".npy");
      const Ran r = engine_run(QStringList{"launch", "--backend", backend} + common + QStringList{"--logits-out", file});
      QVERIFY2(r.exit_code == 0, qPrintable(QString("launch --backend %1 exit %2: %3")
                                                .arg(backend)
                                                .arg(r.exit_code)
                                                .arg(QString::fromUtf8(r.err).trimmed())));
      const Stream st = read_stream(r.out);
      QVERIFY(!st.all<Config>().empty());
      QCOMPARE(st.all<Config>().front()->config["comm_precision"].get<std::string>(), std::string("all=int8:128"));
      try {
        logits[backend] = ss::read_npy(file.toStdString());
      } catch (const std::exception& e) {
        QFAIL(e.what());
      }
    }
    QCOMPARE(logits[m_backend].shape, logits["cpu"].shape);
    const auto [worst, at] = worst_row(logits[m_backend], logits["cpu"]);
    QVERIFY2(worst <= 1e-3, qPrintable(QString("relative L2 %1 at position %2").arg(worst).arg(at)));
  }

  // A long prompt: each sp rank holds a quarter of the activations, each tp
  // rank all tokens' residual stream.
  void spActivationsBelowTp() {
    const Dims dims;
    std::map<QString, double> worst;
    for (const QString strategy : {"tp", "sp"}) {
      const Ran r =
          engine(with_sets({"launch", "--backend", m_backend, "--model", "tiny-llama", "--strategy", strategy,
                            "--devices", "4", "--prompt-len", "96", "--decode", "2", "--seed", "3"},
                           dims.sets()));
      QVERIFY2(r.exit_code == 0, r.err.constData());
      const auto metrics = read_stream(r.out).rank_metrics();
      QCOMPARE(int(metrics.size()), 4);
      for (auto& [rank, m] : metrics) {
        QVERIFY(m.count("peak_activations_bytes"));
        QVERIFY(m.at("peak_activations_bytes") > 0);
        worst[strategy] = std::max(worst[strategy], m.at("peak_activations_bytes"));
      }
    }
    QVERIFY2(
        worst["sp"] < worst["tp"],
        qPrintable(QString("sp peak activations %1 >= tp %2").arg(worst["sp"]).arg(worst["tp"])));
  }

  // --- 3. failures ----------------------------------------------------------

  // SIGKILL one rank mid-run: the launcher ends soon, non-zero, and its stream
  // ends with an error naming that rank and done failed; no rank lives on.
  void killedRank() {
    SKIP_IF(not_cpu());
    QProcess p;
    p.start(SHARDSCOPE_ENGINE_BIN,
            {"launch", "--model", "tiny-llama", "--strategy", "tp", "--devices", "2",
             "--prompt-len", "64", "--decode", "200000", "--seed", "3"});
    QVERIFY(p.waitForStarted());
    const KillTree cleanup{p};
    const pid_t launcher = pid_t(p.processId());

    // Wait for the stream to reach decode: every rank is in the collectives.
    QByteArray out;
    QElapsedTimer wait;
    wait.start();
    while (!out.contains("\"name\":\"decode\"") && wait.elapsed() < 90000 &&
           p.state() == QProcess::Running) {
      p.waitForReadyRead(200);
      out += p.readAllStandardOutput();
    }
    QVERIFY2(out.contains("\"name\":\"decode\""),
             qPrintable("the run did not reach decode: " + p.readAllStandardError()));

    // Rank 1 among the launcher's descendants (mpirun's children).
    pid_t victim = 0;
    std::vector<pid_t> ranks;
    for (pid_t pid : descendants(launcher)) {
      const int rank = mpi_rank_of(pid);
      if (rank < 0) continue;
      ranks.push_back(pid);
      if (rank == 1) victim = pid;
    }
    QCOMPARE(int(ranks.size()), 2);
    QVERIFY2(victim > 0, "no process of rank 1 under the launcher");
    QCOMPARE(::kill(victim, SIGKILL), 0);

    QElapsedTimer after;
    after.start();
    const bool ended = p.waitForFinished(10000);
    QVERIFY2(ended, "the launcher did not end within 10 s of the kill");
    qInfo("launcher ended %lld ms after the kill", static_cast<long long>(after.elapsed()));
    QCOMPARE(p.exitStatus(), QProcess::NormalExit);
    const int code = p.exitCode();
    QVERIFY2(code != 0, "a run with a dead rank exited 0");
    out += p.readAllStandardOutput();
    const QString err = QString::fromUtf8(p.readAllStandardError());
    QVERIFY2(err.contains("rank 1"), qPrintable(err));

    // The dead rank may leave half a line; the records around it must parse.
    const Stream s = read_stream(out);
    QVERIFY(s.events.size() >= 3);
    QVERIFY(std::holds_alternative<Hello>(s.events.front()));
    const auto* done = std::get_if<Done>(&s.events.back());
    QVERIFY2(done, "the stream does not end with done");
    QCOMPARE(done->status, std::string("failed"));
    QCOMPARE(done->exit_code, code);
    const auto* error = std::get_if<Error>(&s.events[s.events.size() - 2]);
    QVERIFY2(error, "done is not preceded by an error record");
    QVERIFY2(QString::fromStdString(error->message).contains("rank 1"), error->message.c_str());
    QCOMPARE(error->rank, 1);
    QCOMPARE(error->code, std::string("rank_died"));
    QCOMPARE(int(s.all<Done>().size()), 1);

    // No rank outlives the launcher.
    QElapsedTimer reap;
    reap.start();
    auto any_alive = [&] {
      return std::any_of(ranks.begin(), ranks.end(), [](pid_t pid) { return alive(pid); });
    };
    while (any_alive() && reap.elapsed() < 2000) QThread::msleep(20);
    QVERIFY2(!any_alive(), "a rank is still running after the launcher ended");
  }

  // Shapes that cannot be split are refused by the launcher itself: exit 2,
  // one stderr line naming the number to change, no stream, no mpirun (no
  // child process seen while it ran; not a time limit, which a loaded
  // machine under a sanitizer missed).
  void refusedBeforeLaunch_data() {
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<QStringList>("names");  // what the message must mention
    QTest::newRow("mesh 3x2 on 4 devices")
        << QStringList{"--model", "tiny-llama", "--strategy", "tp_sp",        "--devices",
                       "4",       "--mesh",     "3x2",        "--prompt-len", "24"}
        << QStringList{"--mesh 3x2", "4"};
    QTest::newRow("kv heads over 4 devices")
        << QStringList{"--model",   "tiny-llama", "--strategy",   "tp",
                       "--devices", "4",          "--prompt-len", "24"}
        << QStringList{"num_key_value_heads 2", "4"};
    QTest::newRow("prompt not in zigzag chunks")
        << QStringList{"--model",   "tiny-llama", "--strategy",   "sp",
                       "--devices", "4",          "--prompt-len", "20"}
        << QStringList{"--prompt-len 20", "8"};
    QTest::newRow("chunk shorter than the conv halo")
        << QStringList{"--model",   "tiny-mamba", "--strategy",   "sp",
                       "--devices", "4",          "--prompt-len", "16"}
        << QStringList{"--prompt-len", "24"};
    QTest::newRow("mamba2 heads per rank vs per group")
        << QStringList{"--model",   "tiny-mamba2", "--strategy",   "tp",
                       "--devices", "3",           "--set",        "hidden_size=48",
                       "--set",     "n_groups=2",  "--prompt-len", "24"}
        << QStringList{"n_groups"};
    QTest::newRow("batch over dp devices")
        << QStringList{"--model", "tiny-llama", "--strategy", "dp",           "--devices",
                       "2",       "--batch",    "3",          "--prompt-len", "24"}
        << QStringList{"--batch 3", "2"};
  }

  void refusedBeforeLaunch() {
    SKIP_IF(not_cpu());
    QFETCH(QStringList, args);
    QFETCH(QStringList, names);
    QProcess p;
    QElapsedTimer timer;
    timer.start();
    p.start(SHARDSCOPE_ENGINE_BIN, QStringList{"launch"} + args);
    QVERIFY(p.waitForStarted());
    const KillTree cleanup{p};
    const pid_t launcher = pid_t(p.processId());
    // Watch for any child (mpirun) while it runs.
    bool had_child = false;
    while (!p.waitForFinished(1)) {
      if (timer.elapsed() > 30000) QFAIL("the refusal did not return");
      if (!descendants(launcher).empty()) had_child = true;
    }
    QCOMPARE(p.exitStatus(), QProcess::NormalExit);
    const QByteArray out = p.readAllStandardOutput();
    const QString err = QString::fromUtf8(p.readAllStandardError());
    QVERIFY2(p.exitCode() == 2, qPrintable(QString("exit %1: %2").arg(p.exitCode()).arg(err)));
    QVERIFY2(out.isEmpty(),
             qPrintable("a refused run wrote a stream: " + QString::fromUtf8(out.left(300))));
    QVERIFY2(!had_child, "the launcher started a child process for a refused shape");
    const QStringList lines = err.trimmed().split('\n');
    QVERIFY2(lines.size() == 1, qPrintable(err));
    QVERIFY2(lines.front().startsWith("shardscope-engine: error:"), qPrintable(err));
    for (auto& n : names) QVERIFY2(lines.front().contains(n), qPrintable(n + " not in: " + err));
  }
};

QTEST_GUILESS_MAIN(TestStrategies)
#include "tst_strategies.moc"

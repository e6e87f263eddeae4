// `shardscope-engine scale` against the runs it summarises. Every point is a
// whole simulated run, so its memory must equal, to the byte, what `train
// --backend sim` (or `simulate`) reports for the same configuration, and
// what a real cpu run measures where one fits this machine, and its rate,
// step time and MFU are that run's. Beyond that: the
// TSP paper's ordering on a 7B Transformer trained on 8 MI300X-class devices,
// the SSM state cache constant in length while activations grow (Mamba2,
// the hybrid), the closed-form parameter count against the engine's, a
// strategy the model does not split over reported with its reason, and bad
// options refused with one line.
#include <QRegularExpression>
#include <QTemporaryDir>
#include <QtTest>
#include <map>
#include <string>
#include <vector>

#include "engine_process.h"
#include "protocol/analysis.h"
#include "protocol/events.h"

using namespace ss::proto;

namespace {

const std::vector<std::string> kCategories(std::begin(ss::proto::kCategoryNames), std::end(ss::proto::kCategoryNames));

struct Sweep {
  Stream stream;
  std::vector<const ScalePoint*> points;
  const ScalePoint* find(const std::string& strategy, int64_t seq_len, const std::string& mesh = {}) const {
    for (auto* p : points)
      if (p->strategy == strategy && p->seq_len == seq_len && p->mesh == mesh) return p;
    return nullptr;
  }
};

Sweep scale(const QStringList& args, QString* failure) {
  Sweep s;
  const Ran r = engine(QStringList{"scale"} + args, 300000);
  if (r.exit_code != 0 || r.crashed) {
    *failure = "scale " + args.join(' ') + " exited " + QString::number(r.exit_code) + ": " + one_line(r.err);
    return s;
  }
  s.stream = read_stream(r.out);
  s.points = s.stream.all<ScalePoint>();
  if (!s.stream.errors.empty()) *failure = "rejected line: " + QString::fromStdString(s.stream.errors.front());
  return s;
}

// Per-rank peaks of a run's stream: peak_bytes and at_peak_<category>_bytes.
struct RankPeaks {
  int64_t peak = 0;
  std::map<std::string, int64_t> at_peak;
};
std::map<int, RankPeaks> rank_peaks(const Stream& s) {
  std::map<int, RankPeaks> out;
  for (auto& [rank, m] : s.rank_metrics()) {
    out[rank].peak = int64_t(m.at("peak_bytes"));
    for (auto& c : kCategories) out[rank].at_peak[c] = int64_t(m.at("at_peak_" + c + "_bytes"));
  }
  return out;
}

// The point equals the fullest rank of `run`: its peak, and its bytes per category at that peak.
QString compare_point(const ScalePoint& p, const Stream& run) {
  const auto peaks = rank_peaks(run);
  if (peaks.empty()) return "the run wrote no per-rank peaks";
  int fullest = peaks.begin()->first;
  for (auto& [rank, rp] : peaks)
    if (rp.peak > peaks.at(fullest).peak) fullest = rank;
  const RankPeaks& want = peaks.at(fullest);
  if (p.peak_bytes != want.peak)
    return QString("peak %1 against the run's %2 (rank %3)").arg(p.peak_bytes).arg(want.peak).arg(fullest);
  int64_t sum = 0;
  for (size_t c = 0; c < kCategories.size(); ++c) {
    sum += p.bytes[c];
    if (p.bytes[c] != want.at_peak.at(kCategories[c]))
      return QString("%1 at the peak: %2 against the run's %3")
          .arg(QString::fromStdString(kCategories[c]))
          .arg(p.bytes[c])
          .arg(want.at_peak.at(kCategories[c]));
  }
  if (sum != p.peak_bytes) return QString("categories sum to %1, not the peak %2").arg(sum).arg(p.peak_bytes);
  return {};
}

}  // namespace

class TestScale : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() { QVERIFY2(QFileInfo::exists(SHARDSCOPE_ENGINE_BIN), SHARDSCOPE_ENGINE_BIN); }

  // --- a point is the run it names ------------------------------------------

  void trainPointEqualsSimulatedRun_data() {
    QTest::addColumn<QString>("model");
    QTest::addColumn<QString>("strategy");
    QTest::addColumn<int>("devices");
    QTest::addColumn<QString>("mesh");
    QTest::addColumn<QString>("recompute");
    QTest::newRow("llama tp 2") << "tiny-llama" << "tp" << 2 << "" << "none";
    QTest::newRow("llama sp 4") << "tiny-llama" << "sp" << 4 << "" << "none";
    QTest::newRow("llama tp_sp 2x2") << "tiny-llama" << "tp_sp" << 4 << "2x2" << "selective";
    QTest::newRow("llama tsp 2") << "tiny-llama" << "tsp" << 2 << "" << "full";
    QTest::newRow("llama dp 2") << "tiny-llama" << "dp" << 2 << "" << "none";
    QTest::newRow("mamba2 tp 2") << "tiny-mamba2" << "tp" << 2 << "" << "none";
    QTest::newRow("hybrid sp 2") << "tiny-hybrid" << "sp" << 2 << "" << "none";
  }
  void trainPointEqualsSimulatedRun() {
    QFETCH(QString, model);
    QFETCH(QString, strategy);
    QFETCH(int, devices);
    QFETCH(QString, mesh);
    QFETCH(QString, recompute);
    QString failure;
    const Sweep s = scale({"--model", model, "--hardware", "h100-sxm", "--devices", QString::number(devices),
                           "--strategies", strategy, "--seq-lens", "64", "--micro-batches", "2", "--recompute",
                           recompute, "--no-batch-search"},
                          &failure);
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    QCOMPARE(s.points.size(), size_t(1));
    const ScalePoint& p = *s.points.front();
    QVERIFY2(p.applicable(), p.reason.c_str());
    // Two steps, as a training point runs: the second can hold more than the first (tsp).
    QStringList args = {"train", "--backend", "sim", "--hardware", "h100-sxm", "--model", model, "--strategy", strategy,
                        "--devices", QString::number(devices), "--seq-len", "64", "--micro-batch", "2", "--dtype",
                        "bf16", "--recompute", recompute, "--steps", "2"};
    if (!mesh.isEmpty()) args << "--mesh" << mesh;
    const Ran r = engine(args);
    QVERIFY2(r.exit_code == 0, qPrintable(one_line(r.err)));
    const Stream run = read_stream(r.out);
    const QString diff = compare_point(p, run);
    QVERIFY2(diff.isEmpty(), qPrintable(diff));
    // Its rate is the run's; its step reads a step's tokens at that rate; its
    // MFU is three times the run's forward FLOPs a step (the backward's two
    // GEMMs per forward one) over the devices' datasheet bf16 rate that long.
    QCOMPARE(p.tokens_per_s, run.metrics().at("train_tokens_per_s"));
    const double tokens = 64.0 * 2 * (strategy == "dp" ? devices : 1);
    QVERIFY2(std::abs(p.step_s * p.tokens_per_s / tokens - 1) < 1e-9, qPrintable(QString::number(p.step_s)));
    QFile profile(qEnvironmentVariable("SHARDSCOPE_RESOURCES") + "/hardware/h100-sxm.json");
    QVERIFY2(profile.open(QIODevice::ReadOnly), qPrintable(profile.fileName()));
    const double peak = nlohmann::json::parse(profile.readAll().toStdString())["device"]["bf16_tflops"].get<double>() * 1e12;
    double forward = 0;
    for (auto& [rank, rs] : analyze(run.events).ranks) forward += rs.forward_flops / 2;
    QVERIFY(forward > 0 && p.mfu > 0);
    QVERIFY2(std::abs(p.mfu / (3 * forward / (p.step_s * peak * devices)) - 1) < 1e-9, qPrintable(QString::number(p.mfu)));
    // Its traffic is a step's: the busiest device's bytes in a run of one step.
    args[args.indexOf("--steps") + 1] = "1";
    const Ran one = engine(args);
    QVERIFY2(one.exit_code == 0, qPrintable(one_line(one.err)));
    double busiest = 0;
    for (auto& [rank, rs] : analyze(read_stream(one.out).events).ranks) busiest = std::max(busiest, double(rs.comm_bytes));
    QVERIFY(busiest > 0);
    QCOMPARE(p.comm_activation_bytes + p.comm_weight_bytes, busiest);
  }

  void inferPointEqualsSimulatedRun_data() {
    QTest::addColumn<QString>("strategy");
    QTest::addColumn<int>("batch");
    QTest::newRow("tsp") << "tsp" << 1;
    QTest::newRow("dp, two sequences a device") << "dp" << 2;
  }
  void inferPointEqualsSimulatedRun() {
    QFETCH(QString, strategy);
    QFETCH(int, batch);
    QString failure;
    const Sweep s = scale({"--model", "tiny-hybrid", "--hardware", "h100-sxm", "--devices", "2", "--strategies", strategy,
                           "--mode", "infer", "--seq-lens", "48", "--decode", "3", "--micro-batches",
                           QString::number(batch)},
                          &failure);
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    QCOMPARE(s.points.size(), size_t(1));
    const Ran r = engine({"simulate", "--hardware", "h100-sxm", "--model", "tiny-hybrid", "--strategy", strategy,
                          "--devices", "2", "--prompt-len", "48", "--decode", "3", "--dtype", "bf16", "--batch",
                          QString::number(strategy == "dp" ? 2 * batch : batch)});
    QVERIFY2(r.exit_code == 0, qPrintable(one_line(r.err)));
    const QString diff = compare_point(*s.points.front(), read_stream(r.out));
    QVERIFY2(diff.isEmpty(), qPrintable(diff));
    QCOMPARE(s.points.front()->max_micro_batch, -1);  // searched in training only
    if (batch > 1) {
      // A replica's sequences run one after another: the step of two takes twice one's, at the same rate.
      const Sweep one = scale({"--model", "tiny-hybrid", "--hardware", "h100-sxm", "--devices", "2", "--strategies",
                               strategy, "--mode", "infer", "--seq-lens", "48", "--decode", "3"},
                              &failure);
      QVERIFY2(failure.isEmpty() && one.points.size() == 1, qPrintable(failure));
      const double ratio = s.points.front()->step_s / one.points.front()->step_s;
      QVERIFY2(std::abs(ratio - batch) < 0.02 * batch, qPrintable(QString("step ratio %1").arg(ratio)));
      const double rate = s.points.front()->tokens_per_s / one.points.front()->tokens_per_s;
      QVERIFY2(std::abs(rate - 1) < 0.02, qPrintable(QString("rate ratio %1").arg(rate)));
    }
  }

  // The simulator charges what the cpu backend allocates: a point equals
  // real training steps on cpu ranks of this machine.
  void trainPointEqualsCpuRun() {
    QString failure;
    const Sweep s = scale({"--model", "tiny-llama", "--hardware", "h100-sxm", "--devices", "2", "--strategies", "tsp",
                           "--seq-lens", "64", "--no-batch-search"},
                          &failure);
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    QCOMPARE(s.points.size(), size_t(1));
    const Ran r = engine({"train", "--model", "tiny-llama", "--strategy", "tsp", "--devices", "2", "--seq-len", "64",
                          "--dtype", "bf16", "--steps", "2"},
                         240000);
    QVERIFY2(r.exit_code == 0, qPrintable(one_line(r.err)));
    const QString diff = compare_point(*s.points.front(), read_stream(r.out));
    QVERIFY2(diff.isEmpty(), qPrintable(diff));
  }

  // --- the figure the paper draws -------------------------------------------

  // llama2-7b, bf16 weights and activations, fp32 gradients, master weights
  // and AdamW moments (no optimizer sharding), micro-batch 1, 8 x MI300X
  // (192 GiB). At 128K tokens tsp needs the least of tp, every tp_sp mesh
  // and tsp, with or without recomputation; at 4K tokens with full
  // recomputation (parameters dominate) tsp and tp are within 5%.
  void paperOrdering7B() {
    // Minutes of arithmetic over code paths the other cases already cover;
    // the plain leg runs it, the sanitizer leg (10x slower) does not.
    if (qEnvironmentVariableIsSet("SHARDSCOPE_SANITIZER_LEG")) QSKIP("runs in the plain leg");
    for (const QString rc : {"none", "full"}) {
      QString failure;
      const Sweep s = scale({"--model", "llama2-7b", "--hardware", "mi300x", "--devices", "8", "--strategies",
                             "tp,tp_sp,tsp", "--seq-lens", "4096,131072", "--recompute", rc, "--no-batch-search"},
                            &failure);
      QVERIFY2(failure.isEmpty(), qPrintable(failure));
      QCOMPARE(s.points.size(), size_t(8));  // tp, tp_sp 2x4 and 4x2, tsp at two lengths
      const ScalePoint* tsp_long = s.find("tsp", 131072);
      QVERIFY(tsp_long && tsp_long->applicable());
      for (auto* p : s.points) {
        QVERIFY2(p->applicable(), p->reason.c_str());
        if (p->seq_len == 131072 && p != tsp_long)
          QVERIFY2(tsp_long->peak_bytes < p->peak_bytes,
                   qPrintable(QString("recompute %1: tsp %2 GiB is not below %3 %4 %5 GiB at 128K")
                                  .arg(rc)
                                  .arg(tsp_long->peak_bytes / double(1 << 30))
                                  .arg(QString::fromStdString(p->strategy), QString::fromStdString(p->mesh))
                                  .arg(p->peak_bytes / double(1 << 30))));
      }
      // Without recomputation tp needs more than the 192 GiB at 128K; with full recomputation it fits.
      QVERIFY(s.find("tp", 131072));
      QCOMPARE(s.find("tp", 131072)->fits, rc == "full");
      QVERIFY(tsp_long->fits);
      if (rc == "full") {
        const double tp = double(s.find("tp", 4096)->peak_bytes), tsp = double(s.find("tsp", 4096)->peak_bytes);
        QVERIFY2(std::abs(tsp - tp) / tp < 0.05, qPrintable(QString("4K: tsp %1 against tp %2").arg(tsp).arg(tp)));
      }
    }
  }

  // Mamba2 and the hybrid: the SSM state cache does not grow with the
  // sequence; activations (and the hybrid's KV cache) do.
  void ssmStateConstantInLength_data() {
    QTest::addColumn<QString>("model");
    QTest::newRow("mamba2") << "mamba2-130m";
    QTest::newRow("hybrid") << "tiny-hybrid";
  }
  void ssmStateConstantInLength() {
    QFETCH(QString, model);
    QString failure;
    const Sweep s = scale({"--model", model, "--hardware", "h100-sxm", "--devices", "2", "--strategies", "tp,sp,tsp",
                           "--mode", "infer", "--seq-lens", "512,4096"},
                          &failure);
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    for (const char* st : {"tp", "sp", "tsp"}) {
      const ScalePoint *a = s.find(st, 512), *b = s.find(st, 4096);
      QVERIFY(a && b && a->applicable() && b->applicable());
      QVERIFY(a->bytes[3] > 0);  // ssm_state
      QCOMPARE(a->bytes[3], b->bytes[3]);
      QVERIFY2(b->bytes[1] > a->bytes[1], st);  // activations
      QVERIFY(b->peak_bytes > a->peak_bytes);
    }
  }

  // --- the closed form beside ------------------------------------------------

  void textbookParametersEqualTheEngines_data() {
    QTest::addColumn<QString>("model");
    for (const char* m : {"llama2-7b", "mamba-2.8b", "falcon-mamba-7b", "mamba2-2.7b", "zamba2-2.7b-class"})
      QTest::newRow(m) << m;
  }
  void textbookParametersEqualTheEngines() {
    QFETCH(QString, model);
    QString failure;
    const Sweep s = scale({"--model", model, "--hardware", "mi300x", "--devices", "1", "--mode", "infer", "--seq-lens",
                           "16", "--decode", "0"},
                          &failure);
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    QCOMPARE(s.points.size(), size_t(1));
    const ScalePoint& p = *s.points.front();
    const Ran r = engine({"simulate", "--hardware", "mi300x", "--model", model, "--prompt-len", "16", "--dtype", "bf16"});
    QVERIFY2(r.exit_code == 0, qPrintable(one_line(r.err)));
    QCOMPARE(p.textbook.at("parameters").get<double>(), read_stream(r.out).metrics().at("parameters"));
    // Weights on one device: parameters x 2 bytes, in both.
    QCOMPARE(p.textbook.at("bytes").at("weights").get<int64_t>(), p.bytes[0]);
  }

  // --- what cannot run ------------------------------------------------------

  void notApplicableSaysWhy() {
    QString failure;
    // tiny-llama has 2 KV heads: tp and tsp cannot split them over 4 devices; sp can.
    const Sweep s = scale({"--model", "tiny-llama", "--hardware", "h100-sxm", "--devices", "4", "--strategies",
                           "tp,sp,tsp", "--seq-lens", "64", "--no-batch-search"},
                          &failure);
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    QCOMPARE(s.points.size(), size_t(3));
    QVERIFY(!s.find("tp", 64)->applicable());
    QVERIFY2(s.find("tp", 64)->reason.find("num_key_value_heads") != std::string::npos, s.find("tp", 64)->reason.c_str());
    QVERIFY(s.find("sp", 64)->applicable());
    QVERIFY(s.find("sp", 64)->fits);
    QCOMPARE(s.stream.done()->status, std::string("ok"));
    // Inference serves one sequence at a time under the model-parallel strategies.
    const Sweep batched = scale({"--model", "tiny-llama", "--hardware", "h100-sxm", "--devices", "2", "--strategies",
                                 "tp,dp", "--mode", "infer", "--seq-lens", "64", "--micro-batches", "2"},
                                &failure);
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    QVERIFY(batched.find("tp", 64) && !batched.find("tp", 64)->applicable());
    QVERIFY2(batched.find("tp", 64)->reason.find("one sequence at a time") != std::string::npos,
             batched.find("tp", 64)->reason.c_str());
    QVERIFY(batched.find("dp", 64) && batched.find("dp", 64)->applicable());
    // A length too short for the conv halo: the refusal speaks of the
    // point's length, never of an option scale does not take.
    const Sweep halo = scale({"--model", "tiny-mamba", "--hardware", "h100-sxm", "--devices", "4", "--strategies",
                              "sp", "--seq-lens", "16", "--no-batch-search"},
                             &failure);
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    QVERIFY(halo.find("sp", 16) && !halo.find("sp", 16)->applicable());
    const std::string why = halo.find("sp", 16)->reason;
    QVERIFY2(why.find("conv halo; make the length at least 24") != std::string::npos &&
                 why.find("--") == std::string::npos,
             why.c_str());
  }

  // The micro-batch search's runs are untimed: their ranks run on without
  // meeting at collectives. Every rank's peak and its categories there are
  // those of the timed run, to the byte, under every strategy.
  void untimedPeaksAreTimedPeaks_data() {
    QTest::addColumn<QStringList>("args");
    QTest::newRow("tsp/D4") << QStringList{"--strategy", "tsp", "--devices", "4"};
    QTest::newRow("tp_sp/D4/2x2/selective")
        << QStringList{"--strategy", "tp_sp", "--devices", "4", "--mesh", "2x2", "--recompute", "selective"};
    QTest::newRow("sp/D2") << QStringList{"--strategy", "sp", "--devices", "2"};
    QTest::newRow("tp/D2/mb3") << QStringList{"--strategy", "tp", "--devices", "2", "--micro-batch", "3"};
    QTest::newRow("dp/D2") << QStringList{"--strategy", "dp", "--devices", "2"};
    QTest::newRow("tsp/D2/hybrid") << QStringList{"--strategy", "tsp", "--devices", "2", "--model", "tiny-hybrid"};
  }
  void untimedPeaksAreTimedPeaks() {
    QFETCH(QStringList, args);
    if (qEnvironmentVariableIsSet("SHARDSCOPE_SANITIZER_LEG") && QTest::currentDataTag() != QLatin1String("tsp/D4"))
      QSKIP("the first row under a sanitizer (the same code on every row); every row in the plain leg");
    const QStringList common = QStringList{"train", "--backend", "sim", "--hardware", "h100-sxm", "--seq-len", "1024",
                                           "--dtype", "bf16"} +
                               (args.contains("--model") ? QStringList{} : QStringList{"--model", "small-llama"}) + args;
    const Ran timed = engine(common), untimed = engine(common + QStringList{"--untimed"});
    QVERIFY2(timed.exit_code == 0 && !timed.crashed, timed.err.constData());
    QVERIFY2(untimed.exit_code == 0 && !untimed.crashed, untimed.err.constData());
    const Stream ts = read_stream(timed.out), us = read_stream(untimed.out);
    QVERIFY(us.all<Span>().empty());  // peaks only
    const auto a = rank_peaks(ts), b = rank_peaks(us);
    QCOMPARE(b.size(), a.size());
    for (auto& [rank, p] : a) {
      QVERIFY(b.count(rank));
      QCOMPARE(b.at(rank).peak, p.peak);
      QVERIFY(p.peak > 0);
      for (auto& [c, bytes] : p.at_peak) QCOMPARE(b.at(rank).at_peak.at(c), bytes);
    }
  }

  // The largest micro-batch that fits is simulated to fit, and one more is
  // not, in timed runs of the sizes the (untimed) search found.
  void largestMicroBatchFits_data() {
    QTest::addColumn<QString>("strategy");
    QTest::addColumn<int>("devices");
    QTest::addColumn<QString>("mesh");
    QTest::newRow("tsp/D2") << "tsp" << 2 << "";
    QTest::newRow("tp_sp/D4/2x2") << "tp_sp" << 4 << "2x2";
    QTest::newRow("sp/D2") << "sp" << 2 << "";
  }
  void largestMicroBatchFits() {
    QFETCH(QString, strategy);
    QFETCH(int, devices);
    QFETCH(QString, mesh);
    if (qEnvironmentVariableIsSet("SHARDSCOPE_SANITIZER_LEG") && strategy != "tsp")
      QSKIP("tsp alone under a sanitizer (the same search on every row); every row in the plain leg");
    const QString D = QString::number(devices);
    const QStringList meshArgs = mesh.isEmpty() ? QStringList{} : QStringList{"--mesh", mesh};
    QString failure;
    const Sweep s = scale({"--model", "small-llama", "--hardware", "a6000-pcie", "--devices", D, "--strategies",
                           strategy, "--seq-lens", "8192"},  // tp_sp on 4: the 2x2 mesh alone
                          &failure);
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    QCOMPARE(s.points.size(), size_t(1));
    const ScalePoint& p = *s.points.front();
    QCOMPARE(QString::fromStdString(p.mesh), mesh);
    QVERIFY2(p.fits && p.max_micro_batch >= 1, "small-llama at 8K should fit a 48 GB device");
    for (int mb : {p.max_micro_batch, p.max_micro_batch + 1}) {
      const Ran r = engine(QStringList{"train", "--backend", "sim", "--hardware", "a6000-pcie", "--model", "small-llama",
                                       "--strategy", strategy, "--devices", D, "--seq-len", "8192", "--micro-batch",
                                       QString::number(mb), "--dtype", "bf16", "--steps", "2"} +
                           meshArgs);
      QCOMPARE(r.exit_code, mb == p.max_micro_batch ? 0 : 3);  // 3: out of memory
    }
    if (strategy != "tsp") return;
    // A point whose own micro-batch does not fit searches below it, and finds the same size.
    const int over = p.max_micro_batch + 3;
    const Sweep above = scale({"--model", "small-llama", "--hardware", "a6000-pcie", "--devices", "2", "--strategies",
                               "tsp", "--seq-lens", "8192", "--micro-batches", QString::number(over)},
                              &failure);
    QVERIFY2(failure.isEmpty(), qPrintable(failure));
    QCOMPARE(above.points.size(), size_t(1));
    QVERIFY(!above.points.front()->fits);
    QCOMPARE(above.points.front()->max_micro_batch, p.max_micro_batch);
  }

  // `summarize` reads a scale stream as a sweep: the table of peaks, and why a strategy does not apply.
  void summarizeShowsTheTable() {
    QTemporaryDir dir;
    const QString file = dir.filePath("scale.jsonl");
    // small-llama has 16 heads: tp cannot split them over 3 devices; sp can (lengths of 6 zigzag chunks).
    const Ran r = engine({"scale", "--model", "small-llama", "--hardware", "h100-sxm", "--devices", "3", "--strategies",
                          "tp,sp", "--seq-lens", "1536,3072", "--no-batch-search", "--events", file});
    QCOMPARE(r.exit_code, 0);
    QVERIFY(r.out.contains("strategy"));  // the table goes to stdout when the stream goes to a file
    const Ran sum = engine({"summarize", file});
    QCOMPARE(sum.exit_code, 0);
    const QString text = QString::fromUtf8(sum.out);
    QVERIFY2(text.contains("scaling sweep: small-llama") && text.contains("4 points"), qPrintable(text));
    QVERIFY2(text.contains("tp at 1536: num_attention_heads"), qPrintable(text));
    // sp's row holds its two peaks in GiB, as the stream has them.
    QFile f(file);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const Stream st = read_stream(f.readAll());
    QStringList want;
    for (int64_t L : {1536, 3072})
      for (auto* p : st.all<ScalePoint>())
        if (p->strategy == "sp" && p->seq_len == L) want << QString::number(p->peak_bytes / double(1 << 30), 'f', 1);
    QCOMPARE(want.size(), 2);
    QVERIFY2(want[0] != "0.0" && want[1] != "0.0", qPrintable(want.join(' ')));
    const QRegularExpression row("\\nsp +" + QRegularExpression::escape(want[0]) + " +" +
                                 QRegularExpression::escape(want[1]) + " *\\n");
    QVERIFY2(row.match(text).hasMatch(), qPrintable(text));
    // A tiny model's peaks in KiB (not rows of 0.0 GiB); a length sp cannot
    // split named as the sweep names it (a point's length, not a --prompt-len).
    const QString tiny = dir.filePath("tiny.jsonl");
    QCOMPARE(engine({"scale", "--model", "tiny-llama", "--hardware", "h100-sxm", "--devices", "3", "--strategies",
                     "single,sp", "--mode", "infer", "--seq-lens", "64", "--events", tiny})
                 .exit_code,
             0);
    const QString tinyText = QString::fromUtf8(engine({"summarize", tiny}).out);
    QVERIFY2(tinyText.contains("peak memory per device (KiB;") &&
                 tinyText.contains("sp at 64: the length 64 does not split into 6 equal zigzag chunks"),
             qPrintable(tinyText));
  }

  void badOptionsOneLine_data() {
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<QString>("says");
    const QStringList tiny = {"--model", "tiny-llama", "--seq-lens", "64"};
    QTest::newRow("mode") << tiny + QStringList{"--mode", "serve"} << "--mode";
    QTest::newRow("length") << QStringList{"--model", "tiny-llama", "--seq-lens", "64,0"} << "--seq-lens";
    QTest::newRow("nodes") << tiny + QStringList{"--devices", "8", "--nodes", "3"} << "--nodes";
    QTest::newRow("no nodes") << tiny + QStringList{"--devices", "8", "--nodes", "0"} << "--nodes must be at least 1";
    QTest::newRow("strategy") << tiny + QStringList{"--strategies", "pipeline"} << "pipeline";
    QTest::newRow("model") << QStringList{"--model", "no-such-model", "--seq-lens", "64"} << "no-such-model";
    QTest::newRow("fp16 training") << tiny + QStringList{"--dtype", "fp16"} << "fp16";
    QTest::newRow("recompute") << tiny + QStringList{"--recompute", "some"} << "recompute";
  }
  void badOptionsOneLine() {
    QFETCH(QStringList, args);
    QFETCH(QString, says);
    const Ran r = engine(QStringList{"scale"} + args);
    QCOMPARE(r.exit_code, 2);
    const QString err = one_line(r.err);
    QVERIFY2(!err.contains('\n') && err.contains(says), qPrintable(err));
    QVERIFY2(r.out.isEmpty(), "nothing is streamed before the options are checked");
  }
};

QTEST_GUILESS_MAIN(TestScale)
#include "tst_scale.moc"

// `check` and `train --check-only` forecast a run's memory by simulating it
// (runtime/forecast.h). Each row runs the setup for real on cpu ranks, takes
// the fullest rank's measured peak P, and asks the check again with
// --capacity P (must pass, naming P and that rank) and P - 1 (must refuse in
// one line, exit 3): so the forecast is P to the byte. Rows cover each
// family and strategy, and the options that change what a run holds
// (--logits-out keeps every row's logits, --no-cache, --warm-start's second
// cache, a bf16 KV cache, dp's batch, a measured quantized all-reduce,
// sampling, training's recompute, accumulation and --resume).
#include <QtTest>

#include "core/allocator.h"
#include "core/error.h"
#include "engine_process.h"

namespace {

// The fullest rank's measured peak, from a finished run's stream.
std::pair<int, int64_t> fullest(const Stream& s) {
  std::pair<int, int64_t> best{-1, -1};
  for (auto& [rank, m] : s.rank_metrics())
    if (auto it = m.find("peak_bytes"); it != m.end() && int64_t(it->second) > best.second) best = {rank, int64_t(it->second)};
  return best;
}

}  // namespace

class TestForecast : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() { QVERIFY2(QFileInfo::exists(SHARDSCOPE_ENGINE_BIN), SHARDSCOPE_ENGINE_BIN); }

  // Each row: the mode (infer or train), the devices, and the options the run and its check share.
  void peakToTheByte_data() {
    QTest::addColumn<QString>("mode");
    QTest::addColumn<int>("devices");
    QTest::addColumn<QStringList>("args");
    QTest::newRow("llama tp") << "infer" << 2
                              << QStringList{"--model", "tiny-llama", "--strategy", "tp", "--prompt-len", "24", "--decode", "4"};
    QTest::newRow("mamba2 sp bf16") << "infer" << 2
                                    << QStringList{"--model", "tiny-mamba2", "--strategy", "sp", "--dtype", "bf16",
                                                   "--prompt-len", "32", "--decode", "3"};
    QTest::newRow("hybrid tsp") << "infer" << 2
                                << QStringList{"--model", "tiny-hybrid", "--strategy", "tsp", "--prompt-len", "32", "--decode", "2"};
    QTest::newRow("mamba tp_sp 2x2") << "infer" << 4
                                     << QStringList{"--model", "tiny-mamba", "--strategy", "tp_sp", "--mesh", "2x2",
                                                    "--prompt-len", "32", "--decode", "2"};
    QTest::newRow("llama dp, every row's logits") << "infer" << 2
                                                  << QStringList{"--model", "tiny-llama", "--set", "vocab_size=8192", "--strategy",
                                                                 "dp", "--batch", "2", "--prompt-len", "32", "--decode", "2",
                                                                 "--logits-out", "@logits"};
    QTest::newRow("falcon-mamba tp") << "infer" << 2
                                     << QStringList{"--model", "tiny-falcon-mamba", "--strategy", "tp", "--prompt-len", "16",
                                                    "--decode", "3"};
    QTest::newRow("llama tp, int8 measured") << "infer" << 2
                                             << QStringList{"--model", "tiny-llama", "--strategy", "tp", "--prompt-len", "24",
                                                            "--decode", "4", "--comm-precision", "int8", "--measure-sites"};
    QTest::newRow("llama single, sampled") << "infer" << 1
                                           << QStringList{"--model", "tiny-llama", "--prompt-len", "8", "--decode", "4",
                                                          "--temperature", "0.8", "--top-k", "5"};
    QTest::newRow("llama single, no cache") << "infer" << 1
                                            << QStringList{"--model", "tiny-llama", "--prompt-len", "12", "--decode", "4", "--no-cache"};
    QTest::newRow("llama sp ring, warm start, bf16 cache")
        << "infer" << 2
        << QStringList{"--model", "tiny-llama", "--strategy", "sp", "--attention", "ring", "--warm-start",
                       "--kv-dtype", "bf16", "--prompt-len", "32", "--decode", "2"};
    QTest::newRow("train llama tp") << "train" << 2
                                    << QStringList{"--model", "tiny-llama", "--strategy", "tp", "--seq-len", "32", "--steps", "2"};
    QTest::newRow("train mamba2 tsp, selective") << "train" << 2
                                                 << QStringList{"--model", "tiny-mamba2", "--strategy", "tsp", "--seq-len", "32",
                                                                "--recompute", "selective", "--steps", "2"};
    QTest::newRow("train llama tsp (the second step holds more)")
        << "train" << 2 << QStringList{"--model", "tiny-llama", "--strategy", "tsp", "--seq-len", "32", "--steps", "3"};
    QTest::newRow("train hybrid dp, accumulation") << "train" << 2
                                                   << QStringList{"--model", "tiny-hybrid", "--strategy", "dp", "--seq-len", "16",
                                                                  "--micro-batch", "2", "--grad-accum", "2", "--steps", "2"};
  }
  void peakToTheByte() {
    QFETCH(QString, mode);
    QFETCH(int, devices);
    QFETCH(QStringList, args);
    QTemporaryDir dir;
    args.replaceInStrings("@logits", dir.filePath("logits.npy"));
    args << "--devices" << QString::number(devices);
    const bool train = mode == "train";

    const Ran real = engine(QStringList{train ? "train" : "launch"} + args, 240000);
    QVERIFY2(!real.crashed && real.exit_code == 0, real.err.constData());
    const auto [rank, peak] = fullest(read_stream(real.out));
    QVERIFY2(peak > 0, "the run streamed no peak_bytes");

    const QStringList check = train ? QStringList{"train", "--check-only"} + args : QStringList{"check"} + args;
    const Ran fits = engine(check + QStringList{"--capacity", QString::number(peak)});
    QVERIFY2(!fits.crashed && fits.exit_code == 0, fits.err.constData());
    const QString ok = one_line(fits.out);
    QVERIFY2(ok.startsWith(QString("ok: rank %1 peaks at %2").arg(rank).arg(QString::fromStdString(ss::format_bytes(peak)))),
             qPrintable(ok));

    const Ran over = engine(check + QStringList{"--capacity", QString::number(peak - 1)});
    QVERIFY(!over.crashed);
    QCOMPARE(over.exit_code, int(ss::kExitOom));
    QVERIFY2(over.err.count('\n') == 1 && one_line(over.err).contains("would run out of memory"), over.err.constData());
    QVERIFY2(over.out.isEmpty(), over.out.constData());
  }

  // --resume: the model, weights and optimizer state of the folder, whatever --model says.
  void resumedTraining() {
    QTemporaryDir dir;
    const QString saved = dir.filePath("ck");
    const Ran save = engine({"train", "--model", "tiny-mamba2", "--seq-len", "16", "--steps", "1", "--save", saved});
    QVERIFY2(save.exit_code == 0, save.err.constData());
    const QStringList args = {"--resume", saved, "--seq-len", "16", "--steps", "2"};
    const Ran real = engine(QStringList{"train"} + args);
    QVERIFY2(real.exit_code == 0, real.err.constData());
    const int64_t peak = fullest(read_stream(real.out)).second;
    QVERIFY(peak > 0);
    QCOMPARE(engine(QStringList{"train", "--check-only", "--capacity", QString::number(peak)} + args).exit_code, 0);
    QCOMPARE(engine(QStringList{"train", "--check-only", "--capacity", QString::number(peak - 1)} + args).exit_code,
             int(ss::kExitOom));
  }

  // A simulation that outlasts --forecast-seconds (the explorer's 5) ends the
  // check with ok and says the memory was not forecast.
  void aBudgetEndsTheForecast() {
    // A budget the simulation keeps to changes nothing.
    const Ran kept = engine({"check", "--model", "tiny-llama", "--prompt-len", "8", "--forecast-seconds", "60"});
    QVERIFY2(kept.exit_code == 0 && one_line(kept.out).startsWith("ok: rank 0 peaks at "), kept.out.constData());
    // One it outlasts ends it.
    QElapsedTimer t;
    t.start();
    const Ran r = engine({"check", "--model", "llama2-7b", "--hardware", "mi300x", "--strategy", "dp", "--devices", "8",
                          "--batch", "512", "--prompt-len", "512", "--decode", "64", "--dtype", "bf16",
                          "--forecast-seconds", "0.2"});
    QVERIFY2(!r.crashed && r.exit_code == 0, r.err.constData());
    QVERIFY2(one_line(r.out) == "ok: options and shapes; its memory was not forecast, simulating this run takes over 0.2 s",
             r.out.constData());
    QVERIFY2(t.elapsed() < 60000, "the budget did not end the check");
    // Budgets past a day (where a wait would overflow), negative ones, and one without --check-only are refused.
    for (const QStringList& args :
         {QStringList{"check", "--model", "tiny-llama", "--prompt-len", "8", "--forecast-seconds", "1e12"},
          QStringList{"check", "--model", "tiny-llama", "--prompt-len", "8", "--forecast-seconds", "-1"},
          QStringList{"train", "--check-only", "--model", "tiny-llama", "--seq-len", "8", "--forecast-seconds", "inf"},
          QStringList{"train", "--model", "tiny-llama", "--seq-len", "8", "--forecast-seconds", "5"}}) {
      const Ran bad = engine(args);
      QVERIFY2(bad.exit_code == int(ss::kExitUsage) && bad.err.count('\n') == 1 && bad.err.contains("--forecast-seconds"),
               qPrintable(args.join(' ') + ": " + bad.err));
    }
  }

  // Without --capacity: a simulated run's device has its profile's memory,
  // a cpu rank its share of this host's, a cuda rank its share of its GPU's free memory.
  void capacityWithoutTheOption() {
    const Ran sim = engine({"check", "--model", "llama2-7b", "--hardware", "mi300x", "--strategy", "tp", "--devices", "8",
                            "--dtype", "bf16", "--prompt-len", "4096"});
    QVERIFY2(sim.exit_code == 0, sim.err.constData());
    QVERIFY2(one_line(sim.out).endsWith("of its 192.00 GiB (profile mi300x)"), sim.out.constData());
    const Ran shared = engine({"check", "--model", "tiny-llama", "--strategy", "tp", "--devices", "2", "--prompt-len", "8"},
                              60000, {{"SHARDSCOPE_HOST_MEMORY", "8GiB"}});
    QCOMPARE(shared.exit_code, 0);
    const QString cpu = one_line(shared.out);
    QVERIFY2(cpu.endsWith("of its 4.00 GiB (this host's available 8.00 GiB shared by 2 ranks)"), qPrintable(cpu));
    const Ran gpu = engine({"check", "--model", "tiny-llama", "--backend", "cuda", "--prompt-len", "8"});
    QVERIFY2(gpu.exit_code == 0, gpu.err.constData());
    // With no GPU here the peak stands alone; with one, against its free memory (cuda_rank_setup's share).
    const QString line = one_line(gpu.out);
    QVERIFY2(line.contains(QRegularExpression("; no GPU here to set it against \\(.+\\)$")) ||
                 line.endsWith("(its GPU's free memory, less the CUDA context's reserve)"),
             gpu.out.constData());
  }

  // What does not fit says which part is largest and what shrinks it.
  void adviceFollowsTheLargestPart_data() {
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<QString>("says");
    QTest::newRow("activations, training")
        << QStringList{"train", "--check-only", "--model", "llama2-7b", "--backend", "sim", "--hardware", "mi300x", "--devices",
                       "8", "--strategy", "tp", "--dtype", "bf16", "--seq-len", "131072"}
        << "its largest part is activations: try --recompute selective or full, a shorter --seq-len, or more devices "
           "under sp, tp_sp or tsp;";
    QTest::newRow("activations, training, selective, 2 a micro-batch")
        << QStringList{"train", "--check-only", "--model", "llama2-7b", "--backend", "sim", "--hardware", "mi300x", "--devices",
                       "8", "--strategy", "tp", "--dtype", "bf16", "--seq-len", "131072", "--recompute", "selective",
                       "--micro-batch", "2"}
        << "try --recompute full, a smaller --micro-batch, a shorter --seq-len, or more devices under sp, tp_sp or tsp;";
    QTest::newRow("kv cache") << QStringList{"check", "--model", "llama2-7b", "--hardware", "h100-sxm", "--devices", "8",
                                             "--strategy", "tp", "--prompt-len", "1000000", "--decode", "8"}
                              << "its largest part is kv_cache: try a shorter prompt, fewer --decode steps, --kv-dtype bf16, "
                                 "or more devices (tp splits the cache by head; sp, tp_sp and tsp by token);";
    QTest::newRow("weights") << QStringList{"check", "--model", "llama2-7b", "--hardware", "h100-sxm", "--capacity", "20GiB",
                                            "--prompt-len", "16"}
                             << "its largest part is weights: try a strategy that shards the weights (tp or tsp) or "
                                "--dtype bf16";
    QTest::newRow("weights, already sharded")
        << QStringList{"check", "--model", "llama2-7b", "--hardware", "h100-sxm", "--capacity", "10GiB", "--strategy",
                       "tsp", "--devices", "2", "--prompt-len", "16"}
        << "its largest part is weights: try more --devices (tsp shards the weights over all of them) or --dtype bf16";
  }
  void adviceFollowsTheLargestPart() {
    QFETCH(QStringList, args);
    QFETCH(QString, says);
    const Ran r = engine(args);
    QVERIFY(!r.crashed);
    QCOMPARE(r.exit_code, int(ss::kExitOom));
    QVERIFY2(r.err.count('\n') == 1 && one_line(r.err).contains(says), r.err.constData());
  }
};

QTEST_GUILESS_MAIN(TestForecast)
#include "tst_forecast.moc"

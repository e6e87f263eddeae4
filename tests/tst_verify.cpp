// `verify` (runtime/verify.h): a strategy's run against the same run on one
// cpu device. Its verdicts, its figures against the test's own comparison of
// the two runs' logits (launched here, compared with npy_compare.h), a
// quantized all-reduce it must call a difference, a run that fails, and what
// it refuses before starting anything.
#include <QtTest>

#include <cmath>

#include "core/error.h"
#include "engine_process.h"
#include "io/npy.h"
#include "npy_compare.h"
#include "runtime/verify.h"

namespace {

// The figure after `marker` in verify's output ("its worst row is 3.1e-07").
double figure_after(const QString& out, const QString& marker) {
  const int at = out.indexOf(marker);
  if (at < 0) return NAN;
  const QString rest = out.mid(at + marker.size()).trimmed();
  return rest.section(' ', 0, 0).toDouble();
}

int64_t argmax_row(const ss::NpyArray& a, int64_t row) {
  const int64_t V = a.shape.back();
  const float* z = &a.data[size_t(row * V)];
  return std::max_element(z, z + V) - z;
}

}  // namespace

class TestVerify : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() { QVERIFY2(QFileInfo::exists(SHARDSCOPE_ENGINE_BIN), SHARDSCOPE_ENGINE_BIN); }

  // What each dtype allows: the strategy tests' bounds through four layers,
  // growing as the square root of the depth past them.
  void bounds() {
    QCOMPARE(ss::verify_bound(ss::DType::F32, ss::DType::F32, 2), 1e-5);
    QCOMPARE(ss::verify_bound(ss::DType::F32, ss::DType::F32, 16), 2e-5);
    QCOMPARE(ss::verify_bound(ss::DType::BF16, ss::DType::BF16, 4), 0.03125);
    QCOMPARE(ss::verify_bound(ss::DType::F16, ss::DType::F16, 4), 0x1p-8);
    QCOMPARE(ss::verify_bound(ss::DType::F32, ss::DType::BF16, 4), 0.03125);  // a bf16 KV cache rounds too
    QCOMPARE(ss::verify_bound(ss::DType::F16, ss::DType::BF16, 64), 0.125);
  }

  void strategiesAgree_data() {
    QTest::addColumn<QStringList>("args");
    QTest::newRow("llama tsp") << QStringList{"--model", "tiny-llama", "--strategy", "tsp", "--devices", "2",
                                              "--prompt-len", "24", "--decode", "4"};
    QTest::newRow("mamba2 sp, ring") << QStringList{"--model", "tiny-mamba2", "--strategy", "sp", "--devices", "2",
                                                    "--attention", "ring", "--prompt-len", "32", "--decode", "3"};
    QTest::newRow("hybrid tp_sp 2x2 bf16") << QStringList{"--model", "tiny-hybrid", "--strategy", "tp_sp", "--mesh", "2x2",
                                                          "--devices", "4", "--dtype", "bf16", "--prompt-len", "32",
                                                          "--decode", "2"};
    QTest::newRow("mamba tp fp16") << QStringList{"--model", "tiny-mamba", "--strategy", "tp", "--devices", "2",
                                                  "--dtype", "fp16", "--prompt-len", "16", "--decode", "3"};
    QTest::newRow("falcon-mamba sp, contiguous") << QStringList{"--model", "tiny-falcon-mamba", "--strategy", "sp",
                                                               "--devices", "2", "--split", "contiguous", "--prompt-len",
                                                               "16", "--decode", "2"};
    QTest::newRow("llama dp, a batch") << QStringList{"--model", "tiny-llama", "--strategy", "dp", "--devices", "2",
                                                      "--batch", "2", "--prompt-len", "8", "--decode", "3"};
  }
  void strategiesAgree() {
    QFETCH(QStringList, args);
    const Ran r = engine(QStringList{"verify"} + args, 300000);
    const QString out = QString::fromUtf8(r.out);
    QVERIFY2(!r.crashed && r.exit_code == 0, qPrintable(out + r.err));
    const QStringList lines = out.trimmed().split('\n');
    QVERIFY2(lines.last().startsWith("ok: "), qPrintable(out));
    // Both runs were made, each timed.
    QVERIFY2(out.contains("\n  one cpu device: ") && out.contains("\n  " + args[args.indexOf("--strategy") + 1] + " "),
             qPrintable(out));
    const double worst = figure_after(out, "its worst row is"), bound = figure_after(out, "within the bound of");
    QVERIFY2(worst >= 0 && bound > 0 && worst <= bound, qPrintable(out));
    // A batch is compared sequence by sequence, every row of each.
    if (args.contains("--batch")) QVERIFY2(out.contains("prefill, 16 rows") && out.contains("decode, 6 rows"), qPrintable(out));
  }

  // A GPU against the cpu: the emulated device (the cuda kernels on the
  // host) with NCCL's communicator of one rank and the tp_sp mesh's two split
  // from it, on the stand-in library, as tests/gpu/run.sh runs it on a GPU.
  void emulatedGpuAgainstCpu() {
    if (qEnvironmentVariable("SHARDSCOPE_NCCL_LIBRARY").isEmpty())
      QSKIP("this build has no cuda emulator and NCCL stand-in (no nvcc or NCCL header when it was configured)");
    const Ran r = engine({"verify", "--backend", "cuda-emu", "--model", "tiny-hybrid", "--strategy", "tp_sp", "--mesh",
                          "1x1", "--devices", "1", "--dtype", "bf16", "--prompt-len", "16", "--decode", "2"},
                         300000);
    const QString out = QString::fromUtf8(r.out);
    QVERIFY2(r.exit_code == 0, qPrintable(out + r.err));
    QVERIFY2(out.trimmed().split('\n').last().startsWith("ok: tp_sp 1x1 on one cuda-emu device computes what one device "
                                                         "computes"),
             qPrintable(out));
    // The same run's own stream says whose collectives those were.
    const Ran run = engine({"launch", "--backend", "cuda-emu", "--model", "tiny-hybrid", "--strategy", "tp_sp", "--mesh",
                            "1x1", "--devices", "1", "--prompt-len", "16", "--events", "-"});
    QCOMPARE(run.exit_code, 0);
    QVERIFY2(run.out.contains("\"collectives\":\"nccl ("), run.out.left(2000).constData());
  }

  // verify's figure is the worst row of the two runs' logits as this test
  // compares them itself: the same two runs launched here (one thread each,
  // so both times the sums run in one order), decode fed one device's greedy
  // tokens.
  void figuresAreTheRuns() {
    const QStringList common{"--model", "tiny-llama", "--set", "num_hidden_layers=3", "--prompt-len", "24",
                             "--decode", "4", "--threads", "1", "--events", "/dev/null"};
    const QString dir = QDir::tempPath() + "/tst_verify_" + QString::number(QCoreApplication::applicationPid());
    QVERIFY(QDir().mkpath(dir));
    const Ran one = engine(QStringList{"launch"} + common + QStringList{"--logits-out", dir + "/one.npy"});
    QVERIFY2(one.exit_code == 0, one.err.constData());
    const ss::NpyArray want = ss::read_npy((dir + "/one.npy").toStdString());
    QStringList forced;
    for (int k = 0; k < 4; ++k) forced << QString::number(argmax_row(want, 23 + k));
    const Ran tsp = engine(QStringList{"launch"} + common +
                           QStringList{"--strategy", "tsp", "--devices", "2", "--force-decode", forced.join(','),
                                       "--logits-out", dir + "/tsp.npy"});
    QVERIFY2(tsp.exit_code == 0, tsp.err.constData());
    const auto [mine, at] = worst_row(ss::read_npy((dir + "/tsp.npy").toStdString()), want);
    QDir(dir).removeRecursively();

    QStringList args = common;
    args.removeAt(args.indexOf("--events") + 1);
    args.removeAll("--events");
    const Ran r = engine(QStringList{"verify", "--strategy", "tsp", "--devices", "2"} + args);
    const QString out = QString::fromUtf8(r.out);
    QVERIFY2(r.exit_code == 0, qPrintable(out + r.err));
    const double theirs = figure_after(out, "its worst row is");
    qInfo("verify: %.3g, this test: %.3g (row %lld)", theirs, mine, static_cast<long long>(at));
    QVERIFY2(mine > 0, "the two runs are bit-identical: nothing for verify's figure to show");
    QVERIFY2(std::fabs(theirs - mine) <= 0.005 * mine, qPrintable(out));  // printed to 3 significant digits
    QVERIFY2(out.contains(at < 24 ? QString("at position %1,").arg(at) : QString("at decode step %1,").arg(at - 23)),
             qPrintable(out));
  }

  // A quantized all-reduce changes what tp computes: verify says where, by
  // how much, and that it is the quantization's error.
  void quantizedAllReduceDiffers() {
    const Ran r = engine({"verify", "--model", "tiny-llama", "--strategy", "tp", "--devices", "2", "--prompt-len", "24",
                          "--decode", "2", "--comm-precision", "int4:32"});
    const QString out = QString::fromUtf8(r.out);
    QCOMPARE(r.exit_code, 1);
    const QString last = out.trimmed().split('\n').last();
    QVERIFY2(last.startsWith("differs: tp on 2 cpu devices with --comm-precision int4:32 is "), qPrintable(out));
    QVERIFY2(last.contains("past the bound of 1e-05 for fp32 over 2 layers") && last.contains("`sweep`"), qPrintable(out));
    QVERIFY2(figure_after(last, "int4:32 is") > 1e-3, qPrintable(out));
  }

  // A run that fails ends verify with its exit code and its one line. The
  // capacity is the strategy's run's: one device runs without it.
  void aFailedRunIsReported() {
    const QString stream = QDir::tempPath() + "/tst_verify_oom.jsonl";
    const Ran r = engine({"verify", "--model", "tiny-llama", "--strategy", "tp", "--devices", "2", "--prompt-len", "24",
                          "--capacity", "64KiB", "--events", stream});
    const QString out = QString::fromUtf8(r.out);
    QCOMPARE(r.exit_code, int(ss::kExitOom));
    QVERIFY2(out.contains("\n  one cpu device: "), qPrintable(out));  // the reference ran, unlimited
    const QString last = out.trimmed().split('\n').last();
    QVERIFY2(last.startsWith("failed: tp on 2 cpu devices failed: ") && last.contains("capacity"), qPrintable(out));
    QFile f(stream);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QByteArray events = f.readAll();
    QVERIFY2(events.contains("\"code\":\"oom\"") && events.contains("\"status\":\"oom\""), events.constData());
    f.remove();
  }

  // Stop (SIGTERM, as the explorer sends it) reaches the run verify started
  // and everything it started: nothing is left running, no files behind.
  void stopEndsTheRunsItStarted() {
    QProcess p;
    p.start(SHARDSCOPE_ENGINE_BIN, {"verify", "--model", "small-llama", "--strategy", "tp", "--devices", "2",
                                    "--prompt-len", "256", "--decode", "400"});
    QVERIFY(p.waitForStarted());
    const QString base = QString("/tmp/shardscope-verify-%1-").arg(p.processId());
    QTRY_VERIFY_WITH_TIMEOUT(QFileInfo::exists(base + "reference.err"), 60000);
    QTest::qWait(500);
    p.terminate();
    QVERIFY(p.waitForFinished(60000));
    QVERIFY(p.exitCode() != 0);
    const QString out = QString::fromUtf8(p.readAllStandardOutput()).trimmed();
    QVERIFY2(out.split('\n').last().startsWith("failed: one cpu device failed: "), qPrintable(out));
    // Whatever the child started is gone (a rank may take a moment to exit).
    auto left = [&] {
      QStringList found;
      for (const QString& pid : QDir("/proc").entryList(QDir::Dirs))
        if (QFile c("/proc/" + pid + "/cmdline"); c.open(QIODevice::ReadOnly) && c.readAll().contains(base.toUtf8()))
          found << pid;
      return found;
    };
    QTRY_VERIFY2_WITH_TIMEOUT(left().isEmpty(), qPrintable(left().join(' ')), 20000);
    for (const char* ext : {"reference.npy", "reference.jsonl", "reference.err"})
      QVERIFY2(!QFileInfo::exists(base + ext), ext);
  }

  // What verify cannot compare is refused in one line, before anything runs.
  void refusals_data() {
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<QString>("says");
    const QStringList run{"--model", "tiny-llama", "--prompt-len", "24", "--decode", "2"};
    QTest::newRow("simulated") << run + QStringList{"--backend", "sim", "--strategy", "tp", "--devices", "2"}
                               << "simulated devices compute none";
    QTest::newRow("sampled") << run + QStringList{"--strategy", "tp", "--devices", "2", "--temperature", "0.7"}
                             << "leave out --temperature";
    QTest::newRow("logits-out") << run + QStringList{"--strategy", "tp", "--devices", "2", "--logits-out", "x.npy"}
                                << "leave out --logits-out";
    QTest::newRow("single on the cpu") << run << "choose --strategy";
    QTest::newRow("an unknown backend") << run + QStringList{"--backend", "tpu", "--strategy", "tp", "--devices", "2"}
                                        << "--backend tpu is not available";
    QTest::newRow("shapes") << QStringList{"--model", "tiny-llama", "--strategy", "tsp", "--devices", "2", "--prompt-len", "7"}
                            << "--prompt-len 7";
  }
  void refusals() {
    QFETCH(QStringList, args);
    QFETCH(QString, says);
    const Ran r = engine(QStringList{"verify"} + args);
    QCOMPARE(r.exit_code, int(ss::kExitUsage));
    QVERIFY2(r.out.isEmpty(), r.out.constData());
    const QString err = QString::fromUtf8(r.err).trimmed();
    QVERIFY2(!err.contains('\n') && err.contains(says), qPrintable(err));
  }
};

QTEST_GUILESS_MAIN(TestVerify)
#include "tst_verify.moc"

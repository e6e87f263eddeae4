// `train --verify` (runtime/verify.h): a strategy's training step against
// the same step on one cpu device. Its verdicts across families, dtypes and
// batching; its figures against the test's own comparison of the two runs'
// dumped gradients; a rank that computes something else, which it must call
// a difference; a run that fails; the scratch files a killed one left; and
// what it refuses before starting.
#include <QTemporaryDir>
#include <QtTest>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>

#include "core/error.h"
#include "engine_process.h"
#include "tensor_compare.h"

using ss::proto::Accuracy;

namespace {

Ran train_verify(const QStringList& args, const QList<std::pair<QString, QString>>& env = {}) {
  return engine(QStringList{"train", "--verify"} + args, 300000, env);
}

// This run's (not the reference's) grad_rel_l2 records, by tensor.
std::map<std::string, double> tensor_figures(const Stream& s) {
  std::map<std::string, double> m;
  for (const Accuracy* a : s.all<Accuracy>())
    if (a->metric == "grad_rel_l2" && a->config.empty() && a->site != "whole") m[a->site] = a->value;
  return m;
}

QByteArray read_file(const QString& path) {
  QFile f(path);
  return f.open(QIODevice::ReadOnly) ? f.readAll() : QByteArray();
}

}  // namespace

class TestVerifyTrain : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() { QVERIFY2(QFileInfo::exists(SHARDSCOPE_ENGINE_BIN), SHARDSCOPE_ENGINE_BIN); }

  void strategiesTrainAsOneDevice_data() {
    QTest::addColumn<QStringList>("args");
    QTest::newRow("llama tp") << QStringList{"--model", "tiny-llama", "--strategy", "tp", "--devices", "2"};
    QTest::newRow("mamba2 tsp, bf16, 3 steps") << QStringList{"--model", "tiny-mamba2", "--strategy", "tsp", "--devices",
                                                              "2", "--dtype", "bf16", "--steps", "3"};
    QTest::newRow("hybrid tp_sp 2x2, bf16") << QStringList{"--model", "tiny-hybrid", "--strategy", "tp_sp", "--mesh",
                                                           "2x2", "--devices", "4", "--dtype", "bf16"};
    // Replicas fed two sequences each, twice a step: one device is fed four at a time, twice.
    QTest::newRow("mamba dp, micro-batches of 2, 2 of them")
        << QStringList{"--model", "tiny-mamba", "--strategy", "dp", "--devices", "2", "--micro-batch", "2",
                       "--grad-accum", "2"};
    // The replicas' micro-batches from --global-batch: one device reads 2 sequences at a time, twice.
    QTest::newRow("llama dp, a global batch of 4")
        << QStringList{"--model", "tiny-llama", "--strategy", "dp", "--devices", "2", "--global-batch", "4"};
    QTest::newRow("llama tp, one explicit sequence")
        << QStringList{"--model", "tiny-llama", "--strategy", "tp", "--devices", "2", "--tokens",
                       "5,9,14,2,77,31,8,8,101,64,3,12,250,7,19,40,41"};
    QTest::newRow("falcon-mamba sp, contiguous") << QStringList{"--model", "tiny-falcon-mamba", "--strategy", "sp",
                                                                "--devices", "2", "--split", "contiguous"};
  }
  void strategiesTrainAsOneDevice() {
    QFETCH(QStringList, args);
    QTemporaryDir dir;
    const QString events = dir.filePath("verdict.jsonl");
    const QStringList length = args.contains("--tokens") ? QStringList{} : QStringList{"--seq-len", "32"};
    const Ran r = train_verify(args + length + QStringList{"--events", events});
    const QString out = QString::fromUtf8(r.out);
    QVERIFY2(!r.crashed && r.exit_code == 0, qPrintable(out + r.err));
    QVERIFY2(out.trimmed().split('\n').last().startsWith("ok: " + args[args.indexOf("--strategy") + 1] + " "),
             qPrintable(out));
    // Each run was made and timed: in bf16, one device's fp32 gradient too.
    const bool bf16 = args.contains("bf16");
    QVERIFY2(out.contains(bf16 ? "\n  one cpu device in bf16: " : "\n  one cpu device: ") &&
                 out.contains("\n  one cpu device in fp32: ") == bf16,
             qPrintable(out));
    if (args.contains("--steps"))
      QVERIFY2(out.contains("steps 1 to 3: the losses differ by at most "), qPrintable(out));
    // The stream: every tensor's figure, none past its bound, and done.
    const Stream s = read_stream(read_file(events));
    QCOMPARE(s.rejected, int64_t(0));
    QVERIFY(s.done() && s.done()->status == "ok");
    const auto figures = tensor_figures(s);
    QVERIFY(figures.size() > 10);
    QCOMPARE(s.metrics().at("verify_tensors"), double(figures.size()));
    QCOMPARE(s.metrics().at("verify_tensors_past"), 0.0);
    if (!bf16)
      for (auto& [name, e] : figures) QVERIFY2(e <= 1e-5, name.c_str());
    // summarize reads the verdict back.
    const Ran sum = engine({"summarize", events});
    const QString text = QString::fromUtf8(sum.out);
    QVERIFY2(sum.exit_code == 0 && text.contains(" trains against one cpu device (") &&
                 text.contains("\nstatus: ok\n") && text.contains(QString("step 1 gradient, %1 tensors: ").arg(figures.size())) &&
                 text.contains("; 0 past their bound\n"),
             qPrintable(text));
  }

  // A GPU's training step against the cpu's: the emulated device (the cuda
  // kernels, backward ones included, on the host) with NCCL's communicator
  // of one rank and the tp_sp mesh's split from it, on the stand-in library,
  // as tests/gpu/run.sh runs it on a GPU.
  void emulatedGpuTrainsAsCpu() {
    if (qEnvironmentVariable("SHARDSCOPE_NCCL_LIBRARY").isEmpty())
      QSKIP("this build has no cuda emulator and NCCL stand-in (no nvcc or NCCL header when it was configured)");
    const Ran r = train_verify({"--backend", "cuda-emu", "--model", "tiny-hybrid", "--strategy", "tp_sp", "--mesh",
                                "1x1", "--devices", "1", "--dtype", "bf16", "--seq-len", "32"});
    const QString out = QString::fromUtf8(r.out);
    QVERIFY2(r.exit_code == 0, qPrintable(out + r.err));
    QVERIFY2(out.trimmed().split('\n').last().startsWith("ok: tp_sp 1x1 on one cuda-emu device trains as one device "
                                                         "does"),
             qPrintable(out));
  }

  // verify's figures are the two runs' gradients as this test compares them
  // itself: the same two runs made here (one thread each, so that both
  // times the sums run in one order), each dumping step 1's gradient.
  void figuresAreTheRuns() {
    QTemporaryDir dir;
    const QStringList common{"--model",   "tiny-llama", "--set",     "num_hidden_layers=3",
                             "--seq-len", "24",         "--threads", "1"};
    const QStringList quiet{"--events", "/dev/null", "--dump-grads"};
    const Ran one = engine(QStringList{"train"} + common + quiet + QStringList{dir.filePath("one")});
    QVERIFY2(one.exit_code == 0, one.err.constData());
    const QStringList tsp2{"--strategy", "tsp", "--devices", "2"};
    const Ran tsp = engine(QStringList{"train"} + common + tsp2 + quiet + QStringList{dir.filePath("tsp")});
    QVERIFY2(tsp.exit_code == 0, tsp.err.constData());
    const Tensors want = load_tensors(dir.filePath("one/gradients.safetensors"));
    const Tensors got = load_tensors(dir.filePath("tsp/gradients.safetensors"));

    const Ran r = train_verify(common + tsp2 + QStringList{"--events", dir.filePath("v.jsonl")});
    QVERIFY2(r.exit_code == 0, qPrintable(QString::fromUtf8(r.out + r.err)));
    const auto theirs = tensor_figures(read_stream(read_file(dir.filePath("v.jsonl"))));
    QCOMPARE(theirs.size(), want.size());
    double largest = 0;
    for (auto& [name, ref] : want) {
      const double mine = rel_l2(got.at(name), ref);
      largest = std::max(largest, mine);
      QVERIFY2(theirs.count(name) && std::fabs(theirs.at(name) - mine) <= 1e-9 + 1e-6 * mine,
               qPrintable(QString("%1: verify %2, this test %3").arg(name.c_str()).arg(theirs.at(name)).arg(mine)));
    }
    QVERIFY2(largest > 0, "the two runs' gradients are bit-identical: nothing for verify's figures to show");
    const auto [worst_e, worst_name] = worst(got, want);
    QVERIFY2(QString::fromUtf8(r.out).contains(QString("the worst tensor %1, ").arg(worst_name.c_str())),
             r.out.constData());
  }

  // A rank that computes something else (here every rank of the run reads
  // another norm epsilon, appended to their command line by a stand-in
  // mpirun; one device runs in-process, unaffected): verify says it differs,
  // in what, and ends with its own error record.
  void aRankThatComputesOtherwiseIsCaught_data() {
    QTest::addColumn<QString>("dtype");
    QTest::newRow("fp32") << "fp32";
    QTest::newRow("bf16") << "bf16";
  }
  void aRankThatComputesOtherwiseIsCaught() {
    QFETCH(QString, dtype);
    QTemporaryDir dir;
    const QString script = stand_in_mpirun(dir.path(), "exec \"$MPIRUN\" \"$@\" --set rms_norm_eps=0.25\n");
    QVERIFY2(!script.isEmpty(), "no mpirun, or its stand-in cannot be written");
    const QString events = dir.filePath("v.jsonl");
    const Ran r = train_verify({"--model", "tiny-llama", "--seq-len", "32", "--strategy", "sp", "--devices", "2",
                                "--dtype", dtype, "--events", events},
                               {{"SHARDSCOPE_MPIRUN", script}});
    const QString out = QString::fromUtf8(r.out);
    QCOMPARE(r.exit_code, 1);
    const QString last = out.trimmed().split('\n').last();
    QVERIFY2(last.startsWith("differs: sp on 2 cpu devices does not train as one device does: its step 1 loss is "),
             qPrintable(out));
    QVERIFY2(last.contains(" gradient tensors are past their bound"), qPrintable(out));
    const Stream s = read_stream(read_file(events));
    QVERIFY(s.done() && s.done()->status == "failed");
    QVERIFY(s.metrics().at("verify_tensors_past") > 0);
    bool differs = false;
    for (auto* e : s.all<ss::proto::Error>()) differs = differs || e->code == "differs";
    QVERIFY(differs);
  }

  // A run that fails ends verify with its exit code and its one line; one
  // device ran without the run's capacity.
  void aFailedRunIsReported() {
    const Ran r = train_verify({"--model", "tiny-llama", "--seq-len", "32", "--strategy", "tp", "--devices", "2",
                                "--capacity", "64KiB"});
    const QString out = QString::fromUtf8(r.out);
    QCOMPARE(r.exit_code, int(ss::kExitOom));
    QVERIFY2(out.contains("\n  one cpu device: "), qPrintable(out));
    const QString last = out.trimmed().split('\n').last();
    QVERIFY2(last.startsWith("failed: tp on 2 cpu devices failed: ") && last.contains("capacity"), qPrintable(out));
  }

  // A verify killed outright leaves its scratch files in /tmp beside its
  // lock file; the next one removes those whose lock nobody holds, and
  // leaves a live process's (here this test's, its lock held) alone.
  void scratchOfAKilledVerifyIsRemoved() {
    const pid_t dead = fork();
    if (dead == 0) _exit(0);
    QVERIFY(dead > 0);
    QCOMPARE(waitpid(dead, nullptr, 0), dead);
    const QString stale = QString("/tmp/shardscope-verify-%1").arg(dead);
    const QString alive = QString("/tmp/shardscope-verify-%1").arg(getpid());
    for (const QString& base : {stale, alive}) {
      QVERIFY(QDir().mkpath(base + "-run-grads"));
      QFile f(base + "-run-grads/gradients.safetensors");
      QVERIFY(f.open(QIODevice::WriteOnly) && f.write("x") == 1);
      QFile lock(base + ".lock");
      QVERIFY(lock.open(QIODevice::WriteOnly));
    }
    const int held = open(qPrintable(alive + ".lock"), O_RDWR | O_CLOEXEC);
    QVERIFY(held >= 0 && flock(held, LOCK_EX | LOCK_NB) == 0);
    const Ran r = train_verify({"--model", "tiny-llama", "--seq-len", "32", "--strategy", "tp", "--devices", "2",
                                "--capacity", "64KiB"});
    close(held);
    const bool staleGone = !QFileInfo::exists(stale + "-run-grads") && !QFileInfo::exists(stale + ".lock");
    const bool aliveKept = QFileInfo::exists(alive + "-run-grads/gradients.safetensors");
    QDir(alive + "-run-grads").removeRecursively();
    QFile::remove(alive + ".lock");
    QCOMPARE(r.exit_code, int(ss::kExitOom));
    QVERIFY2(staleGone, qPrintable(stale));
    QVERIFY2(aliveKept, qPrintable(alive));
  }

  // What --verify cannot compare is refused in one line, before anything runs.
  void refusals_data() {
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<QString>("says");
    const QStringList run{"--model", "tiny-llama", "--seq-len", "32"};
    const QStringList tp{"--strategy", "tp", "--devices", "2"};
    QTest::newRow("simulated") << run + tp + QStringList{"--backend", "sim", "--hardware", "h100-sxm"}
                               << "simulated devices compute none";
    QTest::newRow("dump-grads") << run + tp + QStringList{"--dump-grads", "/tmp/x"} << "leave out --dump-grads";
    QTest::newRow("save") << run + tp + QStringList{"--save", "/tmp/x"} << "leave out --save";
    QTest::newRow("check-only") << run + tp + QStringList{"--check-only"} << "leave out --check-only";
    QTest::newRow("hostfile") << run + tp + QStringList{"--hostfile", "hosts"} << "leave out --hostfile";
    QTest::newRow("timeout") << run + tp + QStringList{"--timeout", "60"} << "leave out --timeout";
    QTest::newRow("single on the cpu") << run << "choose --strategy";
    QTest::newRow("shapes") << QStringList{"--model", "tiny-llama", "--seq-len", "30", "--strategy", "sp", "--devices", "4"}
                            << "30";
  }
  void refusals() {
    QFETCH(QStringList, args);
    QFETCH(QString, says);
    const Ran r = train_verify(args);
    QCOMPARE(r.exit_code, int(ss::kExitUsage));
    QVERIFY2(r.out.isEmpty(), r.out.constData());
    const QString err = one_line(r.err);
    QVERIFY2(!err.contains('\n') && err.contains(says), qPrintable(err));
  }
};

QTEST_GUILESS_MAIN(TestVerifyTrain)
#include "tst_verify_train.moc"

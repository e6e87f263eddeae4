// Faults that must neither hang a run nor lose data, tried many times each:
// - a rank stopped with SIGSTOP at a random point (loading, prefill, decode)
//   ends the run with an `error` event naming that rank, within the
//   --rank-timeout the user set, and leaves no process behind: 20 of 20;
// - the engine killed with SIGKILL at random points while `train --save`
//   writes leaves the folder holding the previous checkpoint or the new one,
//   byte for byte, never a mix or a half; the next save clears what the
//   killed ones left beside it.
// - a rank of NCCL's communicator (emulated ranks, the stand-in library)
//   hung or gone inside an operation ends the run with an error event.
// SHARDSCOPE_FAULT_TRIALS lowers the count (the sanitizer leg, where every
// start is slower).
#include <QtTest>

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "core/error.h"
#include "engine_process.h"
#include "runtime/process.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

int trials(int wanted) {
  const int env = qEnvironmentVariableIntValue("SHARDSCOPE_FAULT_TRIALS");
  return env > 0 ? std::min(env, wanted) : wanted;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The processes below `root`, with their argv and environment.
struct Proc {
  pid_t pid;
  std::vector<std::string> argv;
  std::string environ;
};
std::vector<Proc> descendants(pid_t root) {
  std::vector<Proc> out;
  for (pid_t pid : ss::descendant_pids(root)) {
    const fs::path proc = fs::path("/proc") / std::to_string(pid);
    Proc p{pid, {}, read_all(proc / "environ")};
    const std::string cmd = read_all(proc / "cmdline");
    for (size_t at = 0; at < cmd.size();) {
      const size_t end = cmd.find('\0', at);
      p.argv.push_back(cmd.substr(at, end - at));
      at = end == std::string::npos ? cmd.size() : end + 1;
    }
    out.push_back(std::move(p));
  }
  return out;
}

// The engine ranks (`run` under mpirun) below the launcher, by MPI rank.
std::map<int, pid_t> rank_pids(pid_t launcher) {
  std::map<int, pid_t> out;
  for (const Proc& p : descendants(launcher)) {
    if (p.argv.size() < 2 || p.argv[1] != "run" || p.argv[0].find("shardscope-engine") == std::string::npos) continue;
    const std::string key = std::string("OMPI_COMM_WORLD_RANK=");
    size_t at = p.environ.find(key);
    if (at != std::string::npos && (at == 0 || p.environ[at - 1] == '\0'))
      out[std::atoi(p.environ.c_str() + at + key.size())] = p.pid;
  }
  return out;
}

// The argument after `flag` in a process's argv.
std::string arg_after(const std::vector<std::string>& argv, const std::string& flag) {
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == flag) return argv[i + 1];
  return {};
}

// Ends whatever a trial left running below `root` (on every exit path of a trial).
struct ReapBelow {
  pid_t root;
  ~ReapBelow() {
    if (root <= 0) return;
    for (const Proc& p : descendants(root)) {
      kill(p.pid, SIGCONT);
      kill(p.pid, SIGKILL);
    }
  }
};

// What `train --save DIR` names its temporary folder while it writes.
std::string saving_name(const std::string& dir_name, qint64 pid) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return "." + dir_name + ".saving-" + host + "-" + std::to_string(pid);
}


// Every file of a checkpoint folder, by name.
std::map<std::string, std::string> files_of(const fs::path& dir) {
  std::map<std::string, std::string> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) out[e.path().filename().string()] = read_all(e.path());
  return out;
}

void copy_dir(const fs::path& from, const fs::path& to) {
  fs::remove_all(to);
  fs::copy(from, to, fs::copy_options::recursive);
}

}  // namespace

class TstFaults : public QObject {
  Q_OBJECT
  QTemporaryDir m_tmp;
  fs::path tmp() const { return fs::path(m_tmp.path().toStdString()); }

 private slots:
  // SIGSTOP on one rank of a two-rank tp run, at a random moment after it
  // started beating: the launcher names it within --rank-timeout (+ the
  // time to read the beats and end the job), and every rank is gone after.
  void stoppedRankEndsTheRunNamingIt() {
    const int n = trials(20);
    const double rank_timeout = 2.0;
    std::mt19937 rng(20261201);
    int named = 0;
    double slowest = 0, fastest = 1e9;
    for (int trial = 0; trial < n; ++trial) {
      const QString events = QString::fromStdString((tmp() / ("hang-" + std::to_string(trial) + ".jsonl")).string());
      QProcess p;
      p.start(SHARDSCOPE_ENGINE_BIN,
              {"launch", "--model", "tiny-llama", "--strategy", "tp", "--devices", "2", "--prompt-len", "64",
               "--decode", "200000", "--rank-timeout", QString::number(rank_timeout), "--timeout", "120",
               "--events", events});
      QVERIFY(p.waitForStarted());
      ReapBelow reap{pid_t(p.processId())};
      std::map<int, pid_t> ranks;
      std::map<int, std::string> beat_files;
      const auto t_start = Clock::now();
      // Both ranks started and beating (their beat files name their pids).
      while (Clock::now() - t_start < std::chrono::seconds(60)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        ranks = rank_pids(pid_t(p.processId()));
        int beating = 0;
        for (const Proc& q : descendants(pid_t(p.processId()))) {
          const std::string dir = arg_after(q.argv, "--heartbeat");
          for (auto& [r, pid] : ranks)
            if (pid == q.pid && !dir.empty() && !read_all(dir + "/rank-" + std::to_string(r)).empty()) ++beating;
        }
        if (ranks.size() == 2 && beating == 2) break;
      }
      QVERIFY2(ranks.size() == 2, "the two ranks did not start beating");
      // A random moment: still loading, in prefill, or decoding.
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 1200));
      const int victim = int(rng() % 2);
      QVERIFY(kill(ranks[victim], SIGSTOP) == 0);
      const auto t_stop = Clock::now();
      QVERIFY2(p.waitForFinished(int((rank_timeout + 20) * 1000)), "the launcher did not end the run");
      const double took = std::chrono::duration<double>(Clock::now() - t_stop).count();
      const Stream s = read_stream(QByteArray::fromStdString(read_all(events.toStdString())));
      const auto errors = s.all<ss::proto::Error>();
      QVERIFY2(!errors.empty(), qPrintable("no error event; stderr: " + p.readAllStandardError()));
      QCOMPARE(QString::fromStdString(errors.back()->code), QStringLiteral("rank_hung"));
      QCOMPARE(errors.back()->rank, victim);
      QVERIFY2(QString::fromStdString(errors.back()->message).contains("stopped by a signal"),
               errors.back()->message.c_str());
      QVERIFY(s.done() && s.done()->status == "failed");
      QCOMPARE(p.exitCode(), int(ss::kExitFailure));
      // Within the timeout (counted from the last beat seen, up to one beat
      // before the stop), plus reading the beats and ending mpirun's job.
      QVERIFY2(took < rank_timeout + 6.0, qPrintable(QString("the error came %1 s after the stop").arg(took)));
      QVERIFY2(took > rank_timeout - 0.5, qPrintable(QString("the error came %1 s after the stop").arg(took)));
      for (auto& [r, pid] : ranks) QVERIFY2(!ss::process_alive(pid), qPrintable(QString("rank %1 outlived the run").arg(r)));
      ++named;
      slowest = std::max(slowest, took);
      fastest = std::min(fastest, took);
    }
    qInfo("%d of %d stopped ranks named, %.2f to %.2f s after the stop (--rank-timeout %.1f)", named, n, fastest,
          slowest, rank_timeout);
    QCOMPARE(named, n);
  }

  // SIGKILL at random points of a save over a good checkpoint (A): the
  // folder is A or the new checkpoint (B), whole; most kills land while
  // the new one is still being written, or the test proves nothing.
  void killedSaveLeavesAWholeCheckpoint() {
    // Under a sanitizer, no kills: they check where a kill leaves the files,
    // not the save's memory, and their 13 training runs were 79 s of the ASan
    // leg. The final save still runs there (over A, beside a dead save's
    // folder): the save's exchange and clearing, which no other suite's save
    // reaches.
    const bool sanitized = qEnvironmentVariableIsSet("SHARDSCOPE_SANITIZER_LEG");
    const QStringList model = {"--model", "tiny-llama", "--set", "vocab_size=4096", "--set", "hidden_size=256",
                               "--set", "intermediate_size=704", "--set", "num_hidden_layers=2",
                               "--seq-len", "32", "--steps", "1", "--threads", "1"};
    const fs::path a = tmp() / "a", b = tmp() / "b", ckpt = tmp() / "ckpt";
    auto train = [&](const fs::path& out, const char* lr) {
      return engine(QStringList{"train"} + model + QStringList{"--lr", lr, "--save", QString::fromStdString(out.string()),
                                                               "--events", "/dev/null"});
    };
    Ran r = train(a, "1e-3");
    QVERIFY2(r.exit_code == 0, r.err.constData());
    // B, timed: from its saving folder's appearance to the process's exit.
    QProcess clean;
    clean.start(SHARDSCOPE_ENGINE_BIN, QStringList{"train"} + model +
                                           QStringList{"--lr", "2e-3", "--save", QString::fromStdString(b.string()),
                                                       "--events", "/dev/null"});
    QVERIFY(clean.waitForStarted());
    const qint64 clean_pid = clean.processId();
    const fs::path b_saving = tmp() / saving_name("b", clean_pid);
    Clock::time_point appeared{};
    while (clean.state() != QProcess::NotRunning) {
      if (appeared == Clock::time_point{} && fs::exists(b_saving)) appeared = Clock::now();
      clean.waitForFinished(1);
    }
    QCOMPARE(clean.exitCode(), 0);
    QVERIFY2(appeared != Clock::time_point{}, "the save was too quick to see");
    const int64_t save_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - appeared).count();
    const auto A = files_of(a), B = files_of(b);
    QVERIFY(A.count("model.safetensors") && A.count("optimizer.safetensors") && A.count("trainer_state.json"));
    QVERIFY(A != B);

    // At least 10 kills even where the trials are lowered (the check below is
    // a count); none under a sanitizer.
    const int n = sanitized ? 0 : std::max(10, trials(20));
    std::mt19937 rng(7);
    int mid_save = 0, old_kept = 0, new_whole = 0;
    // Kills land in the first half of the clean save's time; a trial whose
    // save had already finished halves that window, so a clean save timed
    // slower than the trials run (a busier machine then) cannot make most
    // kills miss.
    int64_t window_us = save_us / 2;
    for (int trial = 0; trial < n; ++trial) {
      copy_dir(a, ckpt);
      QProcess p;
      p.start(SHARDSCOPE_ENGINE_BIN, QStringList{"train"} + model +
                                         QStringList{"--lr", "2e-3", "--save", QString::fromStdString(ckpt.string()),
                                                     "--events", "/dev/null"});
      QVERIFY(p.waitForStarted());
      const fs::path saving = tmp() / saving_name("ckpt", p.processId());
      while (!fs::exists(saving) && p.state() != QProcess::NotRunning) p.waitForFinished(0), std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::microseconds(int64_t(rng() % uint64_t(window_us + 1))));
      const bool running = p.state() != QProcess::NotRunning;
      if (!running) window_us = std::max<int64_t>(window_us / 2, 1000);
      p.kill();  // SIGKILL, through QProcess: it knows whether the pid is still its child
      p.waitForFinished();
      if (running && p.exitStatus() == QProcess::CrashExit) ++mid_save;
      const auto now = files_of(ckpt);
      if (now == A) ++old_kept;
      else if (now == B) ++new_whole;
      else QFAIL(qPrintable(QString("trial %1: the folder is neither checkpoint (%2 files)").arg(trial).arg(now.size())));
    }
    if (n > 0) {
      qInfo("%d kills: %d during the save, folder kept the old checkpoint %d times and held the whole new one %d "
            "times (clean save %.0f ms, kill window at the end %.0f ms)",
            n, mid_save, old_kept, new_whole, double(save_us) * 1e-3, double(window_us) * 1e-3);
      QVERIFY2(mid_save * 2 >= n, "too few kills landed during the save");
    }
    // A save over A that finishes clears the folders the killed saves left
    // beside it, and one more whatever the kills left: the clean save's
    // process has exited, so its folder here is a dead save's.
    copy_dir(a, ckpt);
    const fs::path dead = tmp() / saving_name("ckpt", clean_pid);
    fs::create_directories(dead);
    std::ofstream(dead / "model.safetensors") << "half";
    r = train(ckpt, "2e-3");
    QVERIFY2(r.exit_code == 0, r.err.constData());
    QCOMPARE(files_of(ckpt), B);
    for (const auto& e : fs::directory_iterator(tmp()))
      QVERIFY2(e.path().filename().string().rfind(".ckpt.saving-", 0) != 0, e.path().c_str());
  }

  // NCCL's communicator between emulated ranks (over the tests' stand-in for
  // libnccl, tests/fake_nccl): one rank hangs inside an NCCL operation, or
  // its process exits there. The run must end, failed, with an error event
  // within seconds of SHARDSCOPE_NCCL_TIMEOUT, its ranks breaking none of
  // NCCL's rules on the way (the stand-in logs any).
  void ncclFaultEndsTheRun_data() {
    QTest::addColumn<QString>("fault");
    QTest::addColumn<double>("timeout");  // SHARDSCOPE_NCCL_TIMEOUT
    QTest::addColumn<int>("decode");      // steps after the prompt
    QTest::addColumn<QString>("says");
    // Hung: rank 1 never returns from its first call, the world's init,
    // and neither does rank 0's, which waits for it; both wait until the
    // timeout (long enough that ranks starting apart under a sanitizer meet
    // before it). The sixth operation of rank 1 is one of prefill's
    // all-reduces. Stalled there, the call returns and its transfer, queued
    // on the stream as NCCL's kernel would be, never ends (nor does rank
    // 0's, which waits for it): the watchdog finds it outstanding. Gone,
    // rank 0's NCCL finds its peer's process missing or the launcher its
    // exit, whichever first, long before a timeout: either error names
    // rank 1. Stalled with no decode after the prompt, no call on tp follows
    // the abort: the stalled transfer ends unwritten, the logits are read
    // after it, and the read must fail the run (DeviceFailure), not return
    // them (the world's broadcast of the token after it succeeds).
    QTest::newRow("hung peer") << "hang:1:1" << 10.0 << 8 << "ncclCommInitRankConfig on world did not return in 10 s";
    QTest::newRow("stalled peer") << "stall:1:6" << 10.0 << 8 << "did not complete in 10 s";
    QTest::newRow("stalled peer, prompt only") << "stall:1:6" << 10.0 << 0 << "did not complete in 10 s";
    QTest::newRow("lost peer") << "exit:1:6" << 120.0 << 8 << "rank 1";
    // Gone where NCCL cannot see it (one host: shared memory, NVLink), the
    // launcher's notice of its exit alone ends the run.
    QTest::newRow("lost peer, unseen by NCCL") << "vanish:1:6" << 120.0 << 8 << "rank 1";
    // A transfer of rank 1 breaks on its stream (NCCL's asynchronous error),
    // with no decode after the prompt: no later call on tp asks, and the
    // watchdog asks only every 200 ms. The logits' read must ask first
    // (DeviceFailure's probes), and so end the run at once, rather than
    // return what the broken transfer left and leave rank 0 waiting for it
    // until the timeout.
    QTest::newRow("broken transfer, prompt only") << "break:1:6" << 120.0 << 0 << "a transfer broke";
    // No unique id on rank 0: every rank hears it and fails alike.
    QTest::newRow("no unique id") << "noid:0:0" << 120.0 << 8 << "ncclGetUniqueId failed on rank 0 of world";
  }
  void ncclFaultEndsTheRun() {
#ifndef SHARDSCOPE_FAKE_NCCL
    QSKIP("the emulator was built without NCCL's header: there is no NCCL communicator to fault");
#else
    QFETCH(QString, fault);
    QFETCH(double, timeout);
    QFETCH(int, decode);
    QFETCH(QString, says);
    const std::string name = "nccl-" + fault.toStdString() + "-" + std::to_string(decode);
    const QString events = QString::fromStdString((tmp() / (name + ".jsonl")).string());
    QProcess p;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("SHARDSCOPE_NCCL_LIBRARY", SHARDSCOPE_FAKE_NCCL);
    env.insert("SHARDSCOPE_FAKE_NCCL_FAULT", fault);
    env.insert("SHARDSCOPE_NCCL_TIMEOUT", QString::number(timeout));
    const std::string log = (tmp() / (name + ".log")).string();
    env.insert("SHARDSCOPE_FAKE_NCCL_LOG", QString::fromStdString(log));
    p.setProcessEnvironment(env);
    const auto t0 = Clock::now();
    p.start(SHARDSCOPE_ENGINE_BIN, {"launch", "--backend", "cuda-emu", "--model", "tiny-llama", "--strategy", "tp",
                                    "--devices", "2", "--prompt-len", "16", "--decode", QString::number(decode),
                                    "--timeout", "120",
                                    "--events", events});
    QVERIFY(p.waitForStarted());
    ReapBelow reap{pid_t(p.processId())};
    QVERIFY2(p.waitForFinished(90000), "the launcher did not end the run");
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    const QString err = QString::fromUtf8(p.readAllStandardError());
    const Stream s = read_stream(QByteArray::fromStdString(read_all(events.toStdString())));
    const auto errors = s.all<ss::proto::Error>();
    QVERIFY2(!errors.empty(), qPrintable("no error event; stderr: " + err));
    QString messages;
    for (const auto* e : errors) messages += QString::fromStdString(e->message) + "\n";
    QVERIFY2(messages.contains(says), qPrintable(messages));
    QVERIFY(s.done() && s.done()->status == "failed");
    QVERIFY(p.exitCode() != 0);
    // The fault fired where it was asked to, and failing, no rank broke
    // NCCL's rules (a handle used after its abort, a call before the last
    // one was polled to the end, ...).
    const QString logged = QString::fromStdString(read_all(log));
    const QStringList kind_rank_n = fault.split(':');
    QVERIFY2(logged.contains(QString("fault: world rank %1 %2 at operation %3")
                                 .arg(kind_rank_n[1], kind_rank_n[0], kind_rank_n[2])),
             qPrintable("the fault did not fire: " + logged));
    QVERIFY2(!logged.contains("misuse:"), qPrintable(logged));
    qInfo("%s: ended %.1f s after the launch (SHARDSCOPE_NCCL_TIMEOUT %.0f s): %s", qPrintable(fault), took, timeout,
          qPrintable(messages.trimmed()));
    QVERIFY2(took < std::min(timeout, 30.0) + 30, qPrintable(QString("the run took %1 s to end").arg(took)));
#endif
  }

  // An NCCL operation's time counts from when its stream reaches it, not
  // from when it was queued: prefill queues its all-reduces (two a layer)
  // seconds ahead of the emulated kernels they follow, and none of them is
  // late for that. Counted from the queueing, a 2 or 3 s timeout aborted
  // this run; from the stream, each waits only for the other rank's kernels
  // since the one before (half a layer, about 0.5 s here). Under a
  // sanitizer, whose kernels are slower, a prompt of 192 tokens outlasts the
  // timeout as 512 do here (512 there were 48 s of the ASan leg).
  void ncclTimeoutCountsFromTheStream() {
#ifndef SHARDSCOPE_FAKE_NCCL
    QSKIP("the emulator was built without NCCL's header: there is no NCCL communicator to time");
#else
    constexpr double kTimeout = 3;
    const QString prompt = qEnvironmentVariableIsSet("SHARDSCOPE_SANITIZER_LEG") ? "192" : "512";
    const QString events = QString::fromStdString((tmp() / "nccl-queued.jsonl").string());
    QProcess p;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("SHARDSCOPE_NCCL_LIBRARY", SHARDSCOPE_FAKE_NCCL);
    env.insert("SHARDSCOPE_NCCL_TIMEOUT", QString::number(kTimeout));
    p.setProcessEnvironment(env);
    p.start(SHARDSCOPE_ENGINE_BIN, {"launch", "--backend", "cuda-emu", "--model", "small-llama", "--strategy", "tp",
                                    "--devices", "2", "--prompt-len", prompt, "--timeout", "600", "--events", events});
    QVERIFY(p.waitForStarted());
    ReapBelow reap{pid_t(p.processId())};
    QVERIFY2(p.waitForFinished(600000), "the launcher did not end the run");
    const Stream s = read_stream(QByteArray::fromStdString(read_all(events.toStdString())));
    QString messages;
    for (const auto* e : s.all<ss::proto::Error>()) messages += QString::fromStdString(e->message) + "\n";
    QVERIFY2(messages.isEmpty(), qPrintable(messages));
    QVERIFY2(s.done() && s.done()->status == "ok", qPrintable(QString::fromUtf8(p.readAllStandardError())));
    // The check shows something only where the prefill's kernels outlast the timeout.
    int64_t prefill = -1;
    for (const auto* ph : s.all<ss::proto::Phase>())
      if (ph->name == "prefill") prefill = ph->t;
    QVERIFY(prefill >= 0);
    const double seconds = double(s.done()->t - prefill) * 1e-9;
    qInfo("the prefill took %.1f s against SHARDSCOPE_NCCL_TIMEOUT %.0f s", seconds, kTimeout);
    QVERIFY2(seconds > 1.5 * kTimeout, "the prefill was too quick to show the timeout's start: raise --prompt-len");
#endif
  }
};

QTEST_GUILESS_MAIN(TstFaults)
#include "tst_faults.moc"

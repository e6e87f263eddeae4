#include "runtime/launch.h"
#include "runtime/rank.h"

#include "runtime/heartbeat.h"
#include "runtime/host_memory.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <thread>

#include "core/error.h"
#include "model/parallel.h"
#include "protocol/events.h"
#include "runtime/process.h"

namespace ss {
namespace {

constexpr size_t kStderrLines = 12;
volatile sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }

// What the ranks said on stderr, by rank (mpirun --tag-output: "[job,rank]<stderr>:").
struct StderrLog {
  std::map<int, std::deque<std::string>> by_rank;
  std::deque<std::string> untagged;  // mpirun's own messages
  std::string partial;

  void feed(const char* data, size_t n) {
    partial.append(data, n);
    size_t nl;
    while ((nl = partial.find('\n')) != std::string::npos) {
      line(partial.substr(0, nl));
      partial.erase(0, nl + 1);
    }
  }
  void line(const std::string& l) {
    static const std::regex tag(R"(^\[\d+,(\d+)\]<std(err|out)>:(.*)$)");
    std::smatch m;
    auto push = [](std::deque<std::string>& d, std::string s) {
      d.push_back(std::move(s));
      if (d.size() > kStderrLines) d.pop_front();
    };
    if (std::regex_match(l, m, tag)) push(by_rank[std::stoi(m[1])], m[3]);
    else if (!l.empty()) push(untagged, l);
  }
};

struct Failure {
  std::string code = "rank_died";
  int rank = -1;
  std::string message;
  nlohmann::json detail;
  int exit_code = kExitFailure;
};

// Works out who failed and why from the ranks' stderr and mpirun's report.
Failure diagnose(const StderrLog& log, int mpirun_status) {
  Failure f;
  static const std::regex engine_err(R"(shardscope-engine: error \[rank (\d+), (\w+)\]: (.*))");
  static const std::regex noticed(R"(process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+) \(([^)]*)\))");
  static const std::regex exited(R"(Process name: \[\[\d+,\d+\],(\d+)\])");
  std::smatch m;
  // The lowest rank that reported an error (ranks in order, as rank 0 would report).
  for (auto& [rank, lines] : log.by_rank) {
    if (f.rank >= 0) break;
    for (auto& l : lines)
      if (f.rank < 0 && std::regex_search(l, m, engine_err)) {
        f.rank = std::stoi(m[1]);
        f.code = m[2];
        f.message = "rank " + std::string(m[1]) + ": " + std::string(m[3]);
        f.exit_code = f.code == "oom" ? kExitOom : (f.code == "usage" || f.code == "format") ? kExitUsage : kExitFailure;
      }
  }
  if (f.rank < 0) {
    for (auto& l : log.untagged) {
      if (std::regex_search(l, m, noticed)) {
        f.rank = std::stoi(m[1]);
        f.message = "rank " + std::string(m[1]) + " died on signal " + std::string(m[2]) + " (" + std::string(m[3]) + ")";
        break;
      }
      if (std::regex_search(l, m, exited)) f.rank = std::stoi(m[1]);
    }
    if (f.message.empty())
      f.message = f.rank >= 0 ? "rank " + std::to_string(f.rank) + " exited without finishing the run"
                              : "the ranks ended without finishing the run (mpirun status " + std::to_string(mpirun_status) + ")";
  }
  nlohmann::json tail = nlohmann::json::array();
  if (auto it = log.by_rank.find(f.rank); it != log.by_rank.end())
    for (auto& l : it->second) tail.push_back(l);
  nlohmann::json launcher = nlohmann::json::array();
  for (auto& l : log.untagged) launcher.push_back(l);
  f.detail = {{"stderr", tail}, {"mpirun", launcher}};
  if (!tail.empty() && f.code == "rank_died") f.message += "; its last stderr line: " + tail.back().get<std::string>();
  // No rank said anything: mpirun's own last words are the only clue (a rank it could not start, a lost daemon).
  if (f.rank < 0)
    for (auto it = log.untagged.rbegin(); it != log.untagged.rend(); ++it)
      if (it->find_first_not_of(" \t-*") != std::string::npos) {
        f.message += "; mpirun's last line: " + *it;
        break;
      }
  return f;
}

}  // namespace

int launch(const RunOptions& o, const LaunchOptions& l) {
  // Refuse what cannot run before anything starts.
  const bool gpu = o.backend == "cuda";
  const RunPlan plan = plan_inference(o, o.backend == "cuda" || o.backend == "cuda-emu" ? o.backend : "cpu");
  // Every rank on this host (with a hostfile, each rank checks its own host as it starts).
  if (!gpu && l.hostfile.empty()) check_host_memory(plan.cfg, o, o.devices, host_available_bytes());
  rank_setup_for(o.backend, o.devices);  // refuses here, before any rank starts, what cannot run
  if (gpu && l.hostfile.empty()) check_gpu_count(o.devices);
  return start_ranks(o.devices, l, "run");
}

int start_ranks(int devices, const LaunchOptions& l, const std::string& subcommand) {
  if (!l.hostfile.empty() && !std::filesystem::exists(l.hostfile))
    throw UsageError("--hostfile " + l.hostfile + " does not exist");

  std::FILE* out = stdout;
  if (!l.events.empty() && l.events != "-") {
    out = std::fopen(l.events.c_str(), "we");  // close-on-exec: mpirun and its ranks do not inherit it
    if (!out) throw UsageError("--events " + l.events + ": cannot create the file");
  }
  char tmpl[] = "/tmp/shardscope-launch-XXXXXX";
  const int tmpfd = mkostemp(tmpl, O_CLOEXEC);  // the ranks open it by name
  if (tmpfd < 0) throw std::runtime_error("cannot create a temporary stream file in /tmp");
  const std::string stream_path = tmpl;

  std::vector<std::string> argv = {mpirun_program(), "-np", std::to_string(devices), "--tag-output"};
  if (needs_oversubscribe(devices) || !l.hostfile.empty())
    argv.push_back("--oversubscribe");
  if (!l.hostfile.empty()) argv.insert(argv.end(), {"--hostfile", l.hostfile});
  argv.insert(argv.end(), {self_exe(), subcommand});
  argv.insert(argv.end(), l.run_args.begin(), l.run_args.end());
  // Without a hostfile every rank runs here, and each one must beat.
  HeartbeatWatch beats(stream_path + ".beats", l.rank_timeout_s, l.hostfile.empty() ? devices : 0);
  argv.insert(argv.end(), {"--events", stream_path, "--heartbeat", beats.dir()});

  int err_pipe[2];
  if (pipe2(err_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    setpgid(0, 0);  // the whole job in one group, so a stop reaches every rank
    dup2(err_pipe[1], STDERR_FILENO);
    dup2(err_pipe[1], STDOUT_FILENO);  // rank stdout is empty: the stream goes to the file
    for (auto& [k, v] : mpirun_environment(l.hostfile.empty())) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "shardscope-engine: cannot start %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(err_pipe[1]);
  setpgid(pid, pid);
  signal(SIGTERM, on_stop_signal);
  signal(SIGINT, on_stop_signal);

  StderrLog log;
  std::string pending;  // forwarded stream bytes not yet ending in a newline
  bool saw_hello = false, saw_done = false, stopping = false;
  std::optional<HungRank> hung;
  std::chrono::steady_clock::time_point stop_sent;
  std::vector<pid_t> signalled;  // the job's processes told to end
  auto forward = [&](const char* data, size_t n) {
    pending.append(data, n);
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      std::string_view line(pending.data(), nl);
      if (line.find("\"type\":\"hello\"") != std::string_view::npos) saw_hello = true;
      if (line.find("\"type\":\"done\"") != std::string_view::npos) saw_done = true;
      std::fwrite(pending.data(), 1, nl + 1, out);
      pending.erase(0, nl + 1);
    }
    std::fflush(out);
  };
  char buf[1 << 16];
  auto drain_stream = [&] {
    ssize_t n;
    while ((n = read(tmpfd, buf, sizeof buf)) > 0) forward(buf, size_t(n));
  };
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  bool err_open = true;
  while (true) {
    drain_stream();
    if (err_open) {
      pollfd p{err_pipe[0], POLLIN, 0};
      if (poll(&p, 1, 20) > 0) {
        const ssize_t n = read(err_pipe[0], buf, sizeof buf);
        if (n > 0) log.feed(buf, size_t(n));
        else err_open = false;
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const auto now = std::chrono::steady_clock::now();
    // Every process of the job, ranks included: OpenMPI gives each rank a
    // process group of its own, so a signal to mpirun's group misses them.
    auto signal_job = [&](int sig) {
      for (pid_t p : descendant_pids(pid)) {
        if (sig == SIGKILL) kill(p, SIGCONT);
        kill(p, sig);
        signalled.push_back(p);
      }
      kill(-pid, sig);
    };
    if (!stopping && !hung) {
      if (g_stop_signal || (l.timeout_s > 0 && std::chrono::duration<double>(now - start).count() > l.timeout_s)) {
        stopping = true;
        signal_job(SIGTERM);  // mpirun and the ranks end in order
      } else if ((hung = beats.poll())) {
        signal_job(SIGKILL);  // the run is over; a stopped rank takes nothing else
      }
      stop_sent = now;
    } else if (now - stop_sent > std::chrono::seconds(5)) {
      signal_job(SIGKILL);  // whatever did not take the SIGTERM
      stop_sent = now;
    }
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
  }
  // A process ended by a signal may take a moment to go (a large address
  // space to unmap): the run is over when its ranks are, within 10 s.
  const auto gone_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (pid_t p : signalled)
    while (process_alive(p) && std::chrono::steady_clock::now() < gone_by)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // Whatever is left: the rest of stderr and of the stream.
  ssize_t n;
  while (err_open && (n = read(err_pipe[0], buf, sizeof buf)) > 0) log.feed(buf, size_t(n));
  if (!log.partial.empty()) log.line(log.partial);
  close(err_pipe[0]);
  drain_stream();
  close(tmpfd);
  std::filesystem::remove(stream_path);

  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  int exit_code = kExitOk;
  if (!saw_done || code != 0) {
    proto::Writer w(out);
    if (!pending.empty()) w.write_raw("\n");  // end a line the dead rank left unfinished
    if (!saw_hello) w.write(proto::Hello{proto::kVersion, engine_version(), host_name()});
    if (hung) {
      nlohmann::json tail = nlohmann::json::array();
      if (auto it = log.by_rank.find(hung->rank); it != log.by_rank.end())
        for (auto& line : it->second) tail.push_back(line);
      char silent[32];
      std::snprintf(silent, sizeof silent, "%.1f", hung->silent_s);
      const std::string msg =
          hung->pid > 0
              ? "rank " + std::to_string(hung->rank) + " stopped responding: no heartbeat for " + silent +
                    " s, its process " + std::to_string(hung->pid) + " " + hung->state +
                    "; the run was ended (--rank-timeout sets how long a rank may be silent)"
              : "rank " + std::to_string(hung->rank) + " never started beating in " + silent +
                    " s; the run was ended (--rank-timeout sets how long a rank may be silent)";
      if (!saw_done) {  // a rank stopped after the stream ended: its end stays the record
        w.write(proto::Error{"rank_hung", hung->rank, msg,
                             {{"pid", hung->pid}, {"silent_s", hung->silent_s}, {"state", hung->state}, {"stderr", tail}}});
        w.write(proto::Done{"failed", 0, kExitFailure});
      }
      std::fprintf(stderr, "shardscope-engine: error: %s\n", msg.c_str());
      exit_code = kExitFailure;
    } else if (stopping) {
      w.write(proto::Error{"stopped", -1, g_stop_signal ? "the run was stopped" : "the run exceeded --timeout", {}});
      w.write(proto::Done{"stopped", 0, kExitFailure});
      exit_code = kExitFailure;
    } else if (!saw_done) {
      Failure f = diagnose(log, code);
      w.write(proto::Error{f.code, f.rank, f.message, f.detail});
      w.write(proto::Done{f.exit_code == kExitOom ? "oom" : "failed", 0, f.exit_code});
      exit_code = f.exit_code;
      std::fprintf(stderr, "shardscope-engine: error: %s\n", f.message.c_str());
      for (auto& line : f.detail["stderr"]) std::fprintf(stderr, "  rank %d stderr: %s\n", f.rank, line.get<std::string>().c_str());
    } else {
      Failure f = diagnose(log, code);  // the stream finished but a rank did not exit cleanly
      exit_code = code == 0 ? kExitFailure : std::min(code, 125);
      std::fprintf(stderr, "shardscope-engine: error: %s\n", f.message.c_str());
    }
    w.flush();
  }
  if (out != stdout) std::fclose(out);
  return exit_code;
}

}  // namespace ss

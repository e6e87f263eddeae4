#include "runtime/child_run.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>

#include "core/error.h"
#include "runtime/process.h"

namespace ss {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

namespace {
template <class T>
std::string joined(const std::vector<T>& v) {
  std::string s;
  for (const T& x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// What launch and train share: the model, where it runs and how it is split.
std::vector<std::string> common_arguments(const RunOptions& o) {
  std::vector<std::string> a = {"--model",   o.model,    "--backend", o.backend, "--strategy", o.strategy,
                                "--devices", std::to_string(o.devices), "--split", o.split,
                                "--dtype",   std::string(compute_dtype_name(o.dtype)),
                                "--seed",    std::to_string(o.seed),    "--threads", std::to_string(o.threads)};
  for (const std::string& s : o.overrides) a.insert(a.end(), {"--set", s});
  if (!o.mesh.empty()) a.insert(a.end(), {"--mesh", o.mesh});
  if (o.capacity > 0) a.insert(a.end(), {"--capacity", std::to_string(o.capacity)});
  return a;
}

// A double as the digits that read back as the same double.
std::string exact(double v) {
  char t[32];
  std::snprintf(t, sizeof t, "%.17g", v);
  return t;
}
}  // namespace

std::vector<std::string> to_arguments(const RunOptions& o) {
  std::vector<std::string> a = common_arguments(o);
  a.insert(a.end(), {"--attention", o.attention, "--decode", std::to_string(o.decode)});
  if (o.kv_dtype) a.insert(a.end(), {"--kv-dtype", std::string(compute_dtype_name(*o.kv_dtype))});
  if (!o.comm_precision.empty()) a.insert(a.end(), {"--comm-precision", o.comm_precision});
  if (o.measure_sites) a.push_back("--measure-sites");
  if (o.no_cache) a.push_back("--no-cache");
  if (o.warm_start) a.push_back("--warm-start");
  if (!o.force_decode.empty()) a.insert(a.end(), {"--force-decode", joined(o.force_decode)});
  if (!o.tokens.empty()) a.insert(a.end(), {"--tokens", joined(o.tokens)});
  else a.insert(a.end(), {"--prompt-len", std::to_string(o.prompt_len)});
  if (o.window > 0) a.insert(a.end(), {"--window", std::to_string(o.window)});  // the batch follows from it
  else if (o.batch != 1) a.insert(a.end(), {"--batch", std::to_string(o.batch)});
  if (!o.sampling.greedy())
    a.insert(a.end(), {"--temperature", exact(double(o.sampling.temperature)), "--top-k",
                       std::to_string(o.sampling.top_k)});
  if (!o.logits_out.empty()) a.insert(a.end(), {"--logits-out", o.logits_out});
  return a;
}

std::vector<std::string> to_arguments(const TrainOptions& o) {
  std::vector<std::string> a = common_arguments(o.run);
  auto add = [&](const char* option, const std::string& value) { a.insert(a.end(), {option, value}); };
  if (o.seq_len > 0) add("--seq-len", std::to_string(o.seq_len));
  add("--micro-batch", std::to_string(o.micro_batch));
  if (o.global_batch > 0) add("--global-batch", std::to_string(o.global_batch));
  else add("--grad-accum", std::to_string(o.grad_accum));
  add("--steps", std::to_string(o.steps));
  add("--lr", exact(o.lr));
  add("--min-lr-ratio", exact(o.min_lr_ratio));
  add("--warmup", std::to_string(o.warmup));
  if (o.schedule_steps > 0) add("--schedule-steps", std::to_string(o.schedule_steps));
  add("--weight-decay", exact(o.weight_decay));
  add("--clip", exact(o.clip));
  add("--beta1", exact(o.beta1));
  add("--beta2", exact(o.beta2));
  add("--adam-eps", exact(o.adam_eps));
  add("--recompute", o.recompute);
  add("--data", o.data);
  if (!o.tokenizer.empty()) add("--tokenizer", o.tokenizer);
  if (!o.tokens.empty()) add("--tokens", joined(o.tokens));
  if (!o.save.empty()) add("--save", o.save);
  if (!o.resume.empty()) add("--resume", o.resume);
  if (!o.dump_grads.empty()) add("--dump-grads", o.dump_grads);
  if (!o.hardware.empty()) add("--hardware", o.hardware);
  if (o.nodes != 1) add("--nodes", std::to_string(o.nodes));
  return a;
}

void check_child_arguments(const RunOptions& o) {
  const std::vector<std::string> args = to_arguments(o);
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].size() > 120000)  // under Linux's 128 KiB (MAX_ARG_STRLEN), with room to spare
      throw UsageError(std::string(i > 0 ? args[i - 1] : "an option") + ": " +
                       (args[i - 1] == "--tokens" ? std::to_string(o.tokens.size()) + " tokens are"
                                                  : std::to_string(args[i].size()) + " bytes are") +
                       " too long for the command line of the runs this starts; give a shorter prompt (about 16K "
                       "tokens at most)");
}

int64_t argmax_row(const float* z, int64_t n) { return std::max_element(z, z + n) - z; }

namespace {
// The child's process group while one runs (0: none), for the handler.
std::atomic<pid_t> g_child_group{0};
std::atomic<bool> g_stopped{false};
extern "C" void pass_on(int sig) {
  g_stopped = true;
  if (const pid_t g = g_child_group.load(); g > 0) ::kill(-g, sig);
}
}  // namespace

namespace {
// Runs this engine's `command` with `args`, its stream and stderr in files
// under `base` (removed after): how it ended and why, its time; `each` sees
// every event of its stream.
ChildRun run_engine(const char* command, const std::vector<std::string>& args, const std::string& base,
                    const std::function<void(const proto::Event&)>& each) {
  const std::string events = base + ".jsonl", err = base + ".err";
  std::string cmd = shell_quote(self_exe()) + " " + command;
  for (const std::string& a : args) cmd += " " + shell_quote(a);
  cmd += " --events " + shell_quote(events) + " 2>" + shell_quote(err);
  ChildRun r;
  if (g_stopped) {  // stopped between two runs: start no more
    r.exit_code = kExitFailure;
    r.error = "stopped";
    r.error_code = "stopped";
    return r;
  }
  // In a group of its own, so that a signal reaches it and everything it
  // starts (launch's mpirun and ranks), and this process waits for them.
  struct sigaction on{}, old_term{}, old_int{};
  on.sa_handler = pass_on;
  sigemptyset(&on.sa_mask);
  sigaction(SIGTERM, &on, &old_term);
  sigaction(SIGINT, &on, &old_int);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  pid_t pid = 0;
  const auto t0 = std::chrono::steady_clock::now();
  int status = -1;
  if (posix_spawn(&pid, "/bin/sh", nullptr, &attr, const_cast<char* const*>(argv), environ) == 0) {
    g_child_group = pid;
    if (g_stopped) ::kill(-pid, SIGTERM);  // a stop that came as it started
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    g_child_group = 0;
  }
  posix_spawnattr_destroy(&attr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGINT, &old_int, nullptr);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.exit_code = status == -1 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  proto::Reader reader;
  std::ifstream in(events);
  for (std::string line; std::getline(in, line);) {
    const auto parsed = reader.parse_line(line);
    if (!parsed.event) continue;
    if (const auto* e = std::get_if<proto::Error>(&*parsed.event)) {
      r.error = e->message;
      r.error_code = e->code;
    }
    if (each) each(*parsed.event);
  }
  r.ok = r.exit_code == 0;
  if (!r.ok && r.error.empty()) {
    std::ifstream e(err);
    std::getline(e, r.error);
    const std::string prefix = "shardscope-engine: error: ";
    if (r.error.rfind(prefix, 0) == 0) r.error.erase(0, prefix.size());
    if (r.error.empty()) r.error = g_stopped ? "stopped" : "exit status " + std::to_string(r.exit_code);
  }
  if (!r.ok && r.error_code.empty())
    r.error_code = g_stopped ? "stopped" : r.exit_code == kExitUsage ? "usage" : r.exit_code == kExitOom ? "oom" : "internal";
  for (const std::string& f : {events, err}) std::filesystem::remove(f);
  return r;
}
}  // namespace

std::string scratch_base(const std::string& kind) {
  namespace fs = std::filesystem;
  const std::string prefix = "shardscope-" + kind + "-", mine = "/tmp/" + prefix + std::to_string(getpid());
  // The locks this process holds, one a kind, given up (and their files
  // removed) as it exits; a process that dies releases its own.
  static struct Held {
    std::map<std::string, int> fds;
    ~Held() {
      for (auto& [path, fd] : fds) {
        ::unlink(path.c_str());
        ::close(fd);
      }
    }
  } held;
  static std::mutex mutex;
  std::lock_guard<std::mutex> guard(mutex);
  const std::string lock = mine + ".lock";
  if (held.fds.count(lock)) return mine;
  // This user's entries of the kind, by the process they belong to.
  const auto own = [](const fs::path& p) {
    struct stat st;
    return ::lstat(p.c_str(), &st) == 0 && st.st_uid == ::getuid();
  };
  std::error_code ec;
  std::vector<fs::path> entries;
  for (auto it = fs::directory_iterator("/tmp", ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    if (it->path().filename().string().rfind(prefix, 0) == 0 && own(it->path())) entries.push_back(it->path());
  // A lock file that can be taken belongs to a process that is gone: its scratch goes.
  std::set<std::string> gone;  // "shardscope-<kind>-<pid>"
  for (const fs::path& p : entries) {
    const std::string name = p.filename().string();
    if (name.size() <= 5 || name.compare(name.size() - 5, 5, ".lock") != 0 || p.string() == lock) continue;
    const int fd = ::open(p.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) gone.insert(name.substr(0, name.size() - 5));
    ::close(fd);
  }
  for (const fs::path& p : entries) {
    const std::string name = p.filename().string();
    for (const std::string& g : gone)
      if (name.rfind(g, 0) == 0 && (name.size() == g.size() || name[g.size()] == '-' || name[g.size()] == '.'))
        fs::remove_all(p, ec);
  }
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0) held.fds[lock] = fd;
  else if (fd >= 0) ::close(fd);
  return mine;
}

ChildRun run_child(RunOptions o, const std::string& base, const std::function<void(const proto::Event&)>& each) {
  const std::string npy = base + ".npy";
  o.logits_out = npy;
  ChildRun r = run_engine("launch", to_arguments(o), base, each);
  try {
    if (r.ok) r.logits = read_npy(npy);
  } catch (const std::exception& e) {
    r.ok = false;
    r.error = std::string("its logits: ") + e.what();
    r.error_code = "internal";
  }
  std::filesystem::remove(npy);
  return r;
}

ChildRun run_child(const TrainOptions& o, const std::string& base,
                   const std::function<void(const proto::Event&)>& each) {
  return run_engine("train", to_arguments(o), base, each);
}

}  // namespace ss

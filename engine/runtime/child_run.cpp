#include "runtime/child_run.h"

#include <signal.h>
#include <spawn.h>
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
}  // namespace

std::vector<std::string> to_arguments(const RunOptions& o) {
  std::vector<std::string> a = {"--model",    o.model,       "--backend", o.backend,
                                "--strategy", o.strategy,    "--devices", std::to_string(o.devices),
                                "--split",    o.split,       "--attention", o.attention,
                                "--dtype",    std::string(compute_dtype_name(o.dtype)),
                                "--decode",   std::to_string(o.decode),
                                "--seed",     std::to_string(o.seed),
                                "--threads",  std::to_string(o.threads)};
  for (const std::string& s : o.overrides) a.insert(a.end(), {"--set", s});
  if (o.kv_dtype) a.insert(a.end(), {"--kv-dtype", std::string(compute_dtype_name(*o.kv_dtype))});
  if (!o.mesh.empty()) a.insert(a.end(), {"--mesh", o.mesh});
  if (!o.comm_precision.empty()) a.insert(a.end(), {"--comm-precision", o.comm_precision});
  if (o.measure_sites) a.push_back("--measure-sites");
  if (o.no_cache) a.push_back("--no-cache");
  if (o.warm_start) a.push_back("--warm-start");
  if (!o.force_decode.empty()) a.insert(a.end(), {"--force-decode", joined(o.force_decode)});
  if (!o.tokens.empty()) a.insert(a.end(), {"--tokens", joined(o.tokens)});
  else a.insert(a.end(), {"--prompt-len", std::to_string(o.prompt_len)});
  if (o.window > 0) a.insert(a.end(), {"--window", std::to_string(o.window)});  // the batch follows from it
  else if (o.batch != 1) a.insert(a.end(), {"--batch", std::to_string(o.batch)});
  if (!o.sampling.greedy()) {
    char t[32];
    std::snprintf(t, sizeof t, "%.9g", double(o.sampling.temperature));
    a.insert(a.end(), {"--temperature", t, "--top-k", std::to_string(o.sampling.top_k)});
  }
  if (o.capacity > 0) a.insert(a.end(), {"--capacity", std::to_string(o.capacity)});
  if (!o.logits_out.empty()) a.insert(a.end(), {"--logits-out", o.logits_out});
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

ChildRun run_child(RunOptions o, const std::string& base, const std::function<void(const proto::Event&)>& each) {
  const std::string npy = base + ".npy", events = base + ".jsonl", err = base + ".err";
  o.logits_out = npy;
  std::string cmd = shell_quote(self_exe()) + " launch";
  for (const std::string& a : to_arguments(o)) cmd += " " + shell_quote(a);
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
  try {
    if (r.exit_code == 0 && std::filesystem::exists(npy)) {
      r.logits = read_npy(npy);
      r.ok = true;
    }
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  if (!r.ok && r.error.empty()) {
    std::ifstream e(err);
    std::getline(e, r.error);
    const std::string prefix = "shardscope-engine: error: ";
    if (r.error.rfind(prefix, 0) == 0) r.error.erase(0, prefix.size());
    if (r.error.empty()) r.error = g_stopped ? "stopped" : "exit status " + std::to_string(r.exit_code);
  }
  if (!r.ok && r.error_code.empty())
    r.error_code = g_stopped ? "stopped" : r.exit_code == kExitUsage ? "usage" : r.exit_code == kExitOom ? "oom" : "internal";
  for (const std::string& f : {npy, events, err}) std::filesystem::remove(f);
  return r;
}

}  // namespace ss

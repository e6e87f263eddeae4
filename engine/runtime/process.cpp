#include "runtime/process.h"

#include <cstdlib>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#ifndef SHARDSCOPE_MPIEXEC
#define SHARDSCOPE_MPIEXEC "mpirun"
#endif

namespace ss {

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "shardscope-engine";
  // Rebuilt while this one runs: the kernel names the old file "PATH (deleted)";
  // the engine now at PATH is the one to start.
  std::string path = p.string();
  const std::string gone = " (deleted)";
  if (path.size() > gone.size() && path.compare(path.size() - gone.size(), gone.size(), gone) == 0)
    path.resize(path.size() - gone.size());
  return path;
}

// SHARDSCOPE_MPIRUN: another mpirun (an OpenMPI carried to a machine with none, tests/gpu/bundle.sh).
const char* mpirun_program() {
  const char* env = std::getenv("SHARDSCOPE_MPIRUN");
  return env && *env ? env : SHARDSCOPE_MPIEXEC;
}

bool needs_oversubscribe(int ranks) { return unsigned(ranks) > std::max(1u, std::thread::hardware_concurrency()); }

namespace {
bool on_path(const char* program) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  for (size_t at = 0; at <= dirs.size();) {
    const size_t colon = std::min(dirs.find(':', at), dirs.size());
    const std::string file = dirs.substr(at, colon - at) + "/" + program;
    if (colon > at && access(file.c_str(), X_OK) == 0) return true;
    at = colon + 1;
  }
  return false;
}
}  // namespace

std::vector<std::pair<std::string, std::string>> mpirun_environment(bool local_only) {
  std::vector<std::pair<std::string, std::string>> env;
  if (geteuid() == 0) env.insert(env.end(), {{"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}});
  // OpenMPI's launcher looks for ssh even when every rank is local, and
  // refuses to start without one (containers, GPU machines lent bare).
  if (local_only && !std::getenv("OMPI_MCA_plm_rsh_agent") && !on_path("ssh") && !on_path("rsh"))
    env.push_back({"OMPI_MCA_plm_rsh_agent", "false"});
  // Ranks on one host talk through shared memory (ob1 over vader), which
  // OpenMPI picks anyway, after first trying its network transports (UCX):
  // naming them saves that search, 0.54 -> 0.33 s for a 2-rank tiny-llama
  // launch here, the same CPU time. A person's own choice stands.
  if (local_only && !std::getenv("OMPI_MCA_pml") && !std::getenv("OMPI_MCA_btl"))
    env.insert(env.end(), {{"OMPI_MCA_pml", "ob1"}, {"OMPI_MCA_btl", "self,vader"}});
  // mpirun's PMIx server shares the job's data with its ranks through a
  // shared-memory store it clears page by page as each job starts: 2,100 of
  // the 9,700 first-touch faults of a 2-rank tiny-llama launch here, 345 ms
  // of CPU against 335 ms with its hash store, which the ranks of one host
  // read the same few keys from instead.
  if (local_only && !std::getenv("PMIX_MCA_gds")) env.push_back({"PMIX_MCA_gds", "hash"});
  return env;
}

std::string mpirun_self_command(int ranks, const std::string& args) {
  std::string cmd = std::string(mpirun_program()) + " -np " + std::to_string(ranks) +
                    (needs_oversubscribe(ranks) ? " --oversubscribe" : "") + " '" + self_exe() + "' " + args;
  for (auto& [k, v] : mpirun_environment(true)) cmd = k + "=" + v + " " + cmd;
  return cmd;
}

bool stream_command(const std::string& cmd, std::ostream& out) {
  std::FILE* p = popen(cmd.c_str(), "r");
  if (!p) return false;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out << buf << std::flush;
  return pclose(p) == 0;
}

char process_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return 0;
  const size_t close = stat.rfind(')');  // the command name may hold spaces and parentheses
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
}

bool process_alive(pid_t pid) {
  const char state = process_state(pid);
  return state != 0 && state != 'Z' && state != 'X';
}

std::vector<pid_t> descendant_pids(pid_t root) {
  std::map<pid_t, pid_t> parent;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat;
    if (!std::getline(in, stat)) continue;
    const size_t close = stat.rfind(')');  // the command name may hold spaces and parentheses
    if (close == std::string::npos || close + 4 >= stat.size()) continue;
    parent[pid_t(std::stol(name))] = pid_t(std::atol(stat.c_str() + close + 4));
  }
  std::vector<pid_t> out;
  for (auto& [pid, pp] : parent) {
    pid_t up = pp;
    for (int depth = 0; depth < 64 && up > 1 && up != root; ++depth) {
      auto it = parent.find(up);
      up = it == parent.end() ? 0 : it->second;
    }
    if (up == root) out.push_back(pid);
  }
  return out;
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", bytes / (1 << 20));
  return buf;
}

}  // namespace ss

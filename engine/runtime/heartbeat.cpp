#include "runtime/heartbeat.h"

#include "runtime/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ss {
namespace fs = std::filesystem;

namespace {

// A process's state in words; empty when the process is gone.
std::string state_in_words(pid_t pid) {
  switch (process_state(pid)) {
    case 0: return {};
    case 'T': return "stopped by a signal";
    case 't': return "stopped by a debugger";
    case 'D': return "waiting in the kernel (uninterruptible)";
    case 'Z': return "a zombie";
    case 'R': return "running but not beating";
    case '?': return "in an unknown state";
    default: return "sleeping but not beating";
  }
}

}  // namespace

Heartbeat::Heartbeat(const std::string& dir) {
  const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
  const std::string file = dir + "/rank-" + (r && *r ? std::string(r) : std::string("0"));
  m_fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (m_fd < 0) return;  // the launcher then reports it as never beating
  m_thread = std::thread([this] {
    const std::string pid = std::to_string(::getpid());
    std::unique_lock<std::mutex> lock(m_mutex);
    for (unsigned long beat = 0; !m_stop; ++beat) {
      char line[64];
      const int n = std::snprintf(line, sizeof line, "%s %020lu\n", pid.c_str(), beat);
      // A failed write is tried again at the next beat: stopping would read as a hang.
      [[maybe_unused]] const ssize_t w = ::pwrite(m_fd, line, size_t(n), 0);
      m_wake.wait_for(lock, kInterval, [this] { return m_stop; });
    }
  });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_stop = true;
  }
  m_wake.notify_all();
  if (m_thread.joinable()) m_thread.join();
  if (m_fd >= 0) {
    // Same length as a beat, so no stale digits remain after it.
    char line[64];
    const int n = std::snprintf(line, sizeof line, "%d %-20s\n", int(::getpid()), "exited");
    [[maybe_unused]] const ssize_t w = ::pwrite(m_fd, line, size_t(n), 0);
    ::close(m_fd);
  }
}

HeartbeatWatch::HeartbeatWatch(std::string dir, double timeout_s, int expected)
    : m_dir(std::move(dir)), m_timeout_s(timeout_s), m_expected(expected) {
  if (::mkdir(m_dir.c_str(), 0700) != 0)
    throw std::runtime_error("cannot create the heartbeat folder " + m_dir + ": " + std::strerror(errno));
}

HeartbeatWatch::~HeartbeatWatch() {
  std::error_code ec;
  fs::remove_all(m_dir, ec);
}

std::optional<HungRank> HeartbeatWatch::poll() {
  const auto now = std::chrono::steady_clock::now();
  if (m_timeout_s <= 0 || now - m_last_read < Heartbeat::kInterval) return std::nullopt;
  m_last_read = now;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(m_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("rank-", 0) != 0) continue;
    const int rank = std::atoi(name.c_str() + 5);
    std::ifstream in(e.path());
    std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Seen& s = m_seen[rank];
    if (content != s.content || s.content.empty()) {
      s.content = content;
      s.changed = now;
      s.pid = pid_t(std::atol(content.c_str()));
    }
  }
  // A rank of this host that has not beaten once, long after the start.
  const double since_start = std::chrono::duration<double>(now - m_start).count();
  if (since_start > std::max(m_timeout_s, 10.0))
    for (int rank = 0; rank < m_expected; ++rank) {
      auto it = m_seen.find(rank);
      if (it == m_seen.end() || it->second.pid <= 0)
        return HungRank{rank, 0, since_start, "never started beating"};
    }
  for (auto& [rank, s] : m_seen) {
    if (s.pid <= 0 || s.content.find("exited") != std::string::npos) continue;
    const double silent = std::chrono::duration<double>(now - s.changed).count();
    if (silent <= m_timeout_s) continue;
    const std::string state = state_in_words(s.pid);
    if (state.empty() || state == "a zombie") continue;  // gone: mpirun reports the death
    return HungRank{rank, s.pid, silent, state};
  }
  return std::nullopt;
}

std::vector<pid_t> HeartbeatWatch::pids() const {
  std::vector<pid_t> out;
  for (auto& [rank, s] : m_seen)
    if (s.pid > 0) out.push_back(s.pid);
  return out;
}

}  // namespace ss

// Liveness of the ranks a launcher started. A rank that dies is reported by
// mpirun; a rank that stops without dying (SIGSTOP, a frozen host process)
// leaves the others blocked in a collective and mpirun waiting for ever.
// So each rank beats: a thread of its own rewrites a small file in a folder
// the launcher made (DIR/rank-N: its pid and a counter) every 100 ms, and
// the launcher ends the run when a live rank's file has not changed for
// --rank-timeout seconds, naming the rank and the state of its process. A
// rank expected on this host that never beats is reported too, once the
// start has had max(--rank-timeout, 10 s). Only ranks on the launcher's
// host are watched (the folder is local).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ss {

// The rank side: beats from construction until destruction, when it writes
// "exited" so a rank that finished before the others is not taken for hung.
class Heartbeat {
 public:
  static constexpr std::chrono::milliseconds kInterval{100};
  // Beats into dir/rank-<OMPI_COMM_WORLD_RANK> (rank 0 outside mpirun).
  explicit Heartbeat(const std::string& dir);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  int m_fd = -1;
  std::mutex m_mutex;
  std::condition_variable m_wake;
  bool m_stop = false;
  std::thread m_thread;
};

struct HungRank {
  int rank = -1;
  pid_t pid = 0;
  double silent_s = 0;
  std::string state;  // of its process, in words ("stopped by a signal", ...)
};

// The launcher side: makes the folder (refusing one that exists), reads the
// beats, removes it at the end. `expected`: ranks 0..expected-1 run on this
// host (0: unknown, a hostfile run).
class HeartbeatWatch {
 public:
  HeartbeatWatch(std::string dir, double timeout_s, int expected);
  ~HeartbeatWatch();
  const std::string& dir() const { return m_dir; }
  // The first live rank whose beat is older than the timeout (or that never
  // beat), if any; reads the folder at most once per beat interval.
  std::optional<HungRank> poll();
  // The pids the ranks wrote (to reach each one at the end).
  std::vector<pid_t> pids() const;

 private:
  struct Seen {
    std::string content;
    std::chrono::steady_clock::time_point changed;
    pid_t pid = 0;
  };
  std::string m_dir;
  double m_timeout_s;
  int m_expected;
  std::chrono::steady_clock::time_point m_start = std::chrono::steady_clock::now();
  std::map<int, Seen> m_seen;
  std::chrono::steady_clock::time_point m_last_read{};
};

}  // namespace ss

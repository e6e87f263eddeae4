// The NCCL stand-in's communicator and the transport its operations run on
// (fake_nccl.cpp says what the stand-in keeps of NCCL): messages as files
// between the processes of one host, and the faults the tests inject.
#pragma once

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

struct ncclComm {
  std::string key;
  int rank = 0, nranks = 0;
  bool blocking = true;
  std::vector<long> pids;                // each rank's process, to tell a lost peer
  std::vector<uint64_t> sent, received;  // messages to and from each rank so far
  std::vector<uint64_t> readied, awaited;  // receives' readiness to and from each rank so far
  int splits = 0;

  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::function<ncclResult_t()>> queue;
  std::thread worker;
  bool busy = false, stop = false;
  bool must_poll = false;            // an ncclInProgress not yet polled to ncclSuccess
  int on_stream = 0;                 // transfers queued on a stream, not yet run
  ncclResult_t error = ncclSuccess;  // sticky
  std::atomic<bool> aborted{false};
};

namespace fake_nccl {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The live communicators and the last error. Never destroyed: a worker may
// still run as the process exits. Ended communicators stay allocated, so no
// later one takes the address of one a caller might still hold: a handle
// after its end is never live again.
struct Registry {
  std::mutex mutex;
  std::map<ncclComm*, std::shared_ptr<ncclComm>> live;
  std::vector<std::shared_ptr<ncclComm>> ended;
  std::string last_error;
};
Registry& reg();

// A line in $SHARDSCOPE_FAKE_NCCL_LOG, where it is set.
void log_line(const std::string& line);
// An error: NCCL's last error, a stderr line, and a misuse line in the log
// for an invalid usage or argument.
ncclResult_t fail(ncclResult_t rc, const std::string& why);
std::shared_ptr<ncclComm> live(ncclComm_t comm);
int world_rank();
void wait_for_abort(const ncclComm& c);

// What the injected fault leaves the operation's transfer to do.
enum class Transfer { Run, Stall, Break };
// The injected fault, at this process's Nth operation: a hang (waits here
// for an abort), an exit, or what the transfer does.
Transfer maybe_fault(ncclComm& c);
// A broken transfer: nothing sent or received, the communicator's error.
ncclResult_t broken(const ncclComm& c);

size_t type_size(ncclDataType_t t);

enum Kind : uint32_t { kSend = 1, kAllReduce, kAllGather, kReduceScatter, kBroadcast, kSplit, kFinalize, kJoin };

// What a message says of the call that sent it; a receive expects the same.
struct Header {
  uint32_t magic = 0x5353464e;  // "NFSS"
  uint32_t kind = 0;
  uint64_t count = 0;
  int32_t type = 0, extra = 0;  // extra: the operation or the root
  uint64_t bytes = 0;
  bool operator==(const Header&) const = default;
};

// Two channels between a pair of ranks: the operations' messages, and the
// readiness of receives. A send's transfer ends only once its receive's has
// begun, as NCCL's may (its buffers are the receiver's): so ranks that each
// send before they receive, outside a group, hang here as they would there.
enum Channel { kData, kReady };

// Publishes a message to `peer` (never waits).
ncclResult_t post(ncclComm& c, int peer, const Header& h, const void* data, Channel ch = kData);
// Waits for the next message from `peer` (until it comes, the peer is gone,
// or the communicator is aborted) and checks it is the call this rank made.
ncclResult_t take(ncclComm& c, int peer, const Header& want, void* data, Channel ch = kData);
// After an abort, messages to or from this rank that nobody will take.
void remove_messages(const ncclComm& c);

}  // namespace fake_nccl

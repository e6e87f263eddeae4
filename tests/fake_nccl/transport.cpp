// The NCCL stand-in's transport (transport.h).
#include "transport.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <tuple>

namespace fake_nccl {
namespace {

std::atomic<long> g_ops{0};  // this process's operations, for the fault

}  // namespace

Registry& reg() {
  static Registry* r = new Registry;
  return *r;
}

// A line in $SHARDSCOPE_FAKE_NCCL_LOG, where it is set: "misuse: ..." where
// the caller broke one of NCCL's rules (a run that fails anyway, as a fault
// test's, would otherwise hide it), "fault: ..." where one was injected.
void log_line(const std::string& line) {
  const char* log = std::getenv("SHARDSCOPE_FAKE_NCCL_LOG");
  if (!log || !*log) return;
  if (std::FILE* f = std::fopen(log, "a")) {
    std::fprintf(f, "%s (pid %ld)\n", line.c_str(), long(getpid()));
    std::fclose(f);
  }
}

// An error: NCCL's last error, a stderr line, and a misuse line in the log
// for an invalid usage or argument.
ncclResult_t fail(ncclResult_t rc, const std::string& why) {
  std::lock_guard lock(reg().mutex);
  reg().last_error = "fake nccl: " + why;
  std::fprintf(stderr, "%s\n", reg().last_error.c_str());
  if (rc == ncclInvalidUsage || rc == ncclInvalidArgument) log_line("misuse: " + why);
  return rc;
}

static fs::path root_dir() {
  static const fs::path dir = [] {
    fs::path base = "/tmp";
    if (const char* d = std::getenv("SHARDSCOPE_FAKE_NCCL_DIR"))
      base = d;
    else if (access("/dev/shm", W_OK) == 0)
      base = "/dev/shm";
    fs::path p = base / "shardscope-fake-nccl";
    std::error_code ec;
    fs::create_directories(p, ec);
    return p;
  }();
  return dir;
}

std::shared_ptr<ncclComm> live(ncclComm_t comm) {
  std::lock_guard lock(reg().mutex);
  auto it = reg().live.find(comm);
  return it == reg().live.end() ? nullptr : it->second;
}

int world_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(name)) return std::atoi(v);
  return 0;
}

void wait_for_abort(const ncclComm& c) {
  while (!c.aborted) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

// SHARDSCOPE_FAKE_NCCL_FAULT as (kind, world rank, operation); kind "" for none.
static const std::tuple<std::string, int, long>& injected_fault() {
  static const auto fault = []() -> std::tuple<std::string, int, long> {
    const char* v = std::getenv("SHARDSCOPE_FAKE_NCCL_FAULT");
    if (!v) return {"", -1, 0};
    char kind[16] = {};
    int rank = -1;
    long n = 0;
    if (std::sscanf(v, "%15[a-z]:%d:%ld", kind, &rank, &n) != 3) return {"", -1, 0};
    return {kind, rank, n};
  }();
  return fault;
}

// The injected fault, at this process's Nth operation: a stall (the caller
// makes the transfer wait for an abort) or a break (it fails at once).
Transfer maybe_fault(ncclComm& c) {
  const auto& [kind, rank, n] = injected_fault();
  if (kind.empty() || rank != world_rank() || ++g_ops != n) return Transfer::Run;
  log_line("fault: world rank " + std::to_string(rank) + " " + kind + " at operation " + std::to_string(n));
  std::fprintf(stderr, "fake nccl: SHARDSCOPE_FAKE_NCCL_FAULT: world rank %d %s at operation %ld\n", rank, kind.c_str(),
               n);
  if (kind == "exit" || kind == "vanish") _exit(17);
  if (kind == "stall") return Transfer::Stall;
  if (kind == "break") return Transfer::Break;
  wait_for_abort(c);
  return Transfer::Run;
}

// A broken transfer: nothing sent or received, the communicator's error.
ncclResult_t broken(const ncclComm& c) {
  return fail(ncclSystemError, c.key + " rank " + std::to_string(c.rank) + ": a transfer broke (injected fault)");
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

static const char* kind_name(uint32_t k) {
  static const char* names[] = {"?",
                                "ncclSend/ncclRecv",
                                "ncclAllReduce",
                                "ncclAllGather",
                                "ncclReduceScatter",
                                "ncclBroadcast",
                                "ncclCommSplit",
                                "ncclCommFinalize",
                                "ncclCommInitRank"};
  return k < sizeof names / sizeof *names ? names[k] : "?";
}

static std::string describe(const Header& h) {
  return std::string(kind_name(h.kind)) + " of " + std::to_string(h.count) + " x type " + std::to_string(h.type) +
         (h.kind == kAllReduce || h.kind == kReduceScatter ? ", op " + std::to_string(h.extra)
          : h.kind == kBroadcast                           ? ", root " + std::to_string(h.extra)
                                                           : "");
}

static fs::path message_path(const ncclComm& c, Channel ch, int src, int dst, uint64_t seq) {
  return root_dir() / (c.key + (ch == kReady ? ".ready." : ".") + std::to_string(src) + "-" + std::to_string(dst) +
                       "." + std::to_string(seq));
}

ncclResult_t post(ncclComm& c, int peer, const Header& h, const void* data, Channel ch) {
  const fs::path to = message_path(c, ch, c.rank, peer, (ch == kReady ? c.readied : c.sent)[size_t(peer)]++);
  const fs::path tmp = to.string() + ".part";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return fail(ncclSystemError, "cannot write " + tmp.string());
  const bool ok = std::fwrite(&h, sizeof h, 1, f) == 1 && (h.bytes == 0 || std::fwrite(data, h.bytes, 1, f) == 1);
  if (std::fclose(f) != 0 || !ok) return fail(ncclSystemError, "cannot write " + tmp.string());
  std::error_code ec;
  fs::rename(tmp, to, ec);
  return ec ? fail(ncclSystemError, "cannot publish " + to.string()) : ncclSuccess;
}

// A peer whose process is gone, as NCCL's network transports see a closed
// connection. Over shared memory and NVLink NCCL sees nothing (its kernels
// wait on): so where the injected fault is a "vanish", neither does this.
static bool peer_gone(const ncclComm& c, int peer) {
  if (std::get<0>(injected_fault()) == "vanish") return false;
  const long pid = c.pids.empty() ? 0 : c.pids[size_t(peer)];
  return pid > 0 && kill(pid_t(pid), 0) != 0 && errno == ESRCH;
}

// Waits for the next message from `peer` (until it comes, the peer is gone,
// or the communicator is aborted) and checks it is the call this rank made.
ncclResult_t take(ncclComm& c, int peer, const Header& want, void* data, Channel ch) {
  const fs::path from = message_path(c, ch, peer, c.rank, (ch == kReady ? c.awaited : c.received)[size_t(peer)]++);
  auto last_look = Clock::now();
  for (int spins = 0;; ++spins) {
    if (std::FILE* f = std::fopen(from.c_str(), "rb")) {
      Header got;
      const bool ok = std::fread(&got, sizeof got, 1, f) == 1;
      if (ok && got == want && (want.bytes == 0 || std::fread(data, want.bytes, 1, f) == 1)) {
        std::fclose(f);
        fs::remove(from);
        return ncclSuccess;
      }
      std::fclose(f);
      if (!ok || got.magic != want.magic) return fail(ncclInternalError, "unreadable message " + from.string());
      return fail(ncclInvalidUsage, c.key + " rank " + std::to_string(c.rank) + " is in " + describe(want) +
                                        " while rank " + std::to_string(peer) + " sent " + describe(got) +
                                        " (calls that do not match: NCCL would hang or corrupt memory)");
    }
    if (c.aborted) return ncclSystemError;
    if (Clock::now() - last_look > std::chrono::milliseconds(100)) {
      last_look = Clock::now();
      if (peer_gone(c, peer))
        return fail(ncclRemoteError, c.key + " rank " + std::to_string(c.rank) + ": rank " + std::to_string(peer) +
                                         " (pid " + std::to_string(c.pids[size_t(peer)]) + ") is gone");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(spins < 100 ? 20 : 500));
  }
}

void remove_messages(const ncclComm& c) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root_dir(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= c.key.size() + 1 || name.compare(0, c.key.size() + 1, c.key + ".") != 0) continue;
    int src = -1, dst = -1, used = 0;
    unsigned long long seq = 0;
    std::string rest = name.substr(c.key.size() + 1);  // "src-dst.seq", not a child's "NcM..."
    if (rest.rfind("ready.", 0) == 0) rest.erase(0, 6);  // a receive's readiness
    if (std::sscanf(rest.c_str(), "%d-%d.%llu%n", &src, &dst, &seq, &used) == 3 &&
        (size_t(used) == rest.size() || rest.compare(size_t(used), std::string::npos, ".part") == 0) &&
        (src == c.rank || dst == c.rank))
      fs::remove(e.path(), ec);
  }
}

}  // namespace fake_nccl

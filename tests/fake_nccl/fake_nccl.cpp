// libnccl.so.2 for machines without a GPU: the entry points
// engine/cuda/nccl_communicator.cpp loads, over the cuda emulator's device
// memory (host memory), between the processes of one host. The engine takes
// it instead of NCCL's own where SHARDSCOPE_NCCL_LIBRARY names it, and the
// emulated ranks (--backend cuda-emu) then run their collectives through the
// NCCL communicator: its grouping, splits, non-blocking polling, watchdog and
// teardown run in every CI leg, sanitizers included.
//
// What it keeps of NCCL (the user guide's rules, "Communicator Creation and
// Management", "Group Calls", "Point-to-point"):
// - a non-blocking communicator's calls return ncclInProgress; the call runs
//   on a thread of the communicator's own, and ncclCommGetAsyncError says
//   ncclInProgress until it is done. Calling anything else on a communicator
//   before that poll has said ncclSuccess is an error here (NCCL: "users must
//   query the communicator state until it becomes ncclSuccess before calling
//   another NCCL function");
// - a collective or a send or receive, once called, is queued on its stream
//   (where the engine hands this library the runtime's host functions,
//   shardscopeFakeNcclHostQueue: the emulator's, whose later work on that
//   stream, and whose events recorded behind it, wait for it), as NCCL
//   queues its kernels: the call returns before the transfer, which runs
//   once the stream reaches it. A transfer that fails there is the
//   communicator's asynchronous error; ncclCommFinalize waits for those
//   queued, and ncclCommDestroy refuses while any is;
// - calls between ncclGroupStart and ncclGroupEnd are queued and run at the
//   outermost ncclGroupEnd, what each sends (a send's bytes, a receive's
//   readiness) before what any waits for, so a ring's exchanges cannot
//   deadlock; outside a group a send ends only once its receive has begun
//   (NCCL's may wait so: its buffers are the receiver's), so ranks that each
//   send before they receive hang here too;
// - in-place all-gather and reduce-scatter only with NCCL's offsets; ranks
//   of a collective must agree on what it is, its count, type, operation and
//   root, and a send on the receive's count and type: a mismatch, which NCCL
//   would hang or corrupt memory on, is an ncclInvalidUsage naming both;
// - a handle after ncclCommDestroy or ncclCommAbort is not a communicator;
// - nothing times out by itself (NCCL waits on a hung peer for ever): only
//   ncclCommAbort ends a wait. A peer process that is gone is an
//   ncclRemoteError, as NCCL's transports report a closed connection.
//
// Bytes travel as files in $SHARDSCOPE_FAKE_NCCL_DIR (else /dev/shm or
// /tmp)/shardscope-fake-nccl: a message per (communicator, sender,
// receiver, sequence number), and a receive's readiness likewise in a
// channel of its own ("<key>.ready.<src>-<dst>.<seq>"), each published by
// rename and removed by its reader (an aborted communicator's, by the abort):
// transport.cpp holds this and the faults below.
//
// Faults, for the tests: SHARDSCOPE_FAKE_NCCL_FAULT=hang:R:N, stall:R:N or
// exit:R:N makes the process of MPI world rank R hang in its Nth operation
// (a call, init, split and finalize included; a group once per
// communicator) until aborted, queue that operation's transfer but never
// finish it (until aborted; as a kernel waiting on a peer that never
// comes), or exit at it; SHARDSCOPE_FAKE_NCCL_LOG collects the faults that
// fired and every broken rule, so a run that fails anyway still shows one.
// SHARDSCOPE_FAKE_NCCL_FAULT=noid:0:0 makes ncclGetUniqueId fail on world rank 0;
// vanish:R:N exits as exit:R:N does, with no rank noticing (peer_gone);
// break:R:N fails that operation's transfer on its stream at once, as a
// transfer NCCL finds broken: nothing is sent, the output is not written.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "transport.h"

using namespace fake_nccl;

namespace {

// The engine's runtime's cudaLaunchHostFunc, where it gave one.
using HostQueue = void (*)(void* stream, void (*fn)(void*), void* arg);
std::atomic<HostQueue> g_host_queue{nullptr};

// ----------------------------------------------------------- operations

// An operation as two halves: what it posts (never waits) and what it
// takes; a transfer's (not a communicator's own exchange) names its stream.
struct Op {
  std::shared_ptr<ncclComm> comm;
  std::function<ncclResult_t()> post, take;
  bool transfer = false;
  void* stream = nullptr;
};
Op on_stream(Op op, cudaStream_t stream) {
  op.transfer = true;
  op.stream = stream;
  return op;
}

template <class T>
void reduce_into(T* acc, const T* x, size_t n, ncclRedOp_t op) {
  for (size_t i = 0; i < n; ++i) {
    switch (op) {
      case ncclProd: acc[i] = T(acc[i] * x[i]); break;
      case ncclMax: acc[i] = std::max(acc[i], x[i]); break;
      case ncclMin: acc[i] = std::min(acc[i], x[i]); break;
      default: acc[i] = T(acc[i] + x[i]); break;
    }
  }
}

bool reduce_bytes(void* acc, const void* x, size_t count, ncclDataType_t t, ncclRedOp_t op) {
  switch (t) {
    case ncclInt8: reduce_into(static_cast<int8_t*>(acc), static_cast<const int8_t*>(x), count, op); return true;
    case ncclUint8: reduce_into(static_cast<uint8_t*>(acc), static_cast<const uint8_t*>(x), count, op); return true;
    case ncclInt32: reduce_into(static_cast<int32_t*>(acc), static_cast<const int32_t*>(x), count, op); return true;
    case ncclUint32: reduce_into(static_cast<uint32_t*>(acc), static_cast<const uint32_t*>(x), count, op); return true;
    case ncclInt64: reduce_into(static_cast<int64_t*>(acc), static_cast<const int64_t*>(x), count, op); return true;
    case ncclUint64: reduce_into(static_cast<uint64_t*>(acc), static_cast<const uint64_t*>(x), count, op); return true;
    case ncclFloat32: reduce_into(static_cast<float*>(acc), static_cast<const float*>(x), count, op); return true;
    case ncclFloat64: reduce_into(static_cast<double*>(acc), static_cast<const double*>(x), count, op); return true;
    default: return false;  // 16- and 8-bit floats: the engine sums those itself
  }
}

// The reductions emulated: sum, prod, max and min over integers, fp32 and fp64.
ncclResult_t check_reduction(const char* call, ncclDataType_t type, ncclRedOp_t op) {
  if (type_size(type) && int(op) >= 0 && op < ncclAvg && reduce_bytes(nullptr, nullptr, 0, type, op))
    return ncclSuccess;
  return fail(ncclInvalidArgument, std::string(call) + ": type " + std::to_string(type) + " / op " +
                                       std::to_string(op) + " is not emulated (sum, prod, max, min over integers, " +
                                       "fp32, fp64)");
}

// A call on a handle no live communicator has.
ncclResult_t not_a_communicator(const char* call) {
  return fail(ncclInvalidArgument, std::string(call) + " on a handle that is no communicator (never made, or after " +
                                       "ncclCommDestroy or ncclCommAbort)");
}

// Every rank's `bytes` from `in` to every other; `got(r, data)` for each rank's
// (this rank's own included), in rank order, so every rank combines alike.
Op exchange(std::shared_ptr<ncclComm> c, Header h, const void* in, std::function<ncclResult_t(int, const void*)> got) {
  Op op{c, nullptr, nullptr};
  auto own = std::make_shared<std::vector<char>>();
  op.post = [c, h, in, own] {
    own->assign(static_cast<const char*>(in), static_cast<const char*>(in) + h.bytes);
    for (int r = 0; r < c->nranks; ++r)
      if (r != c->rank)
        if (ncclResult_t rc = post(*c, r, h, own->data()); rc != ncclSuccess) return rc;
    return ncclSuccess;
  };
  op.take = [c, h, own, got] {
    std::vector<char> buf(h.bytes);
    for (int r = 0; r < c->nranks; ++r) {
      if (r == c->rank) {
        if (ncclResult_t rc = got(r, own->data()); rc != ncclSuccess) return rc;
        continue;
      }
      if (ncclResult_t rc = take(*c, r, h, buf.data()); rc != ncclSuccess) return rc;
      if (ncclResult_t rc = got(r, buf.data()); rc != ncclSuccess) return rc;
    }
    return ncclSuccess;
  };
  return op;
}

// Operations of one communicator, posts first.
ncclResult_t run_ops(const ncclComm& c, const std::vector<Op>& ops) {
  if (c.aborted) return ncclSystemError;
  for (const Op& o : ops)
    if (o.post)
      if (ncclResult_t rc = o.post(); rc != ncclSuccess) return rc;
  for (const Op& o : ops)
    if (o.take)
      if (ncclResult_t rc = o.take(); rc != ncclSuccess) return rc;
  return ncclSuccess;
}

// Transfers queued on a stream, run by the stream's host function.
struct Queued {
  std::shared_ptr<ncclComm> comm;
  std::vector<Op> ops;
  Transfer fault = Transfer::Run;
};
void run_queued(void* arg) {
  std::unique_ptr<Queued> q(static_cast<Queued*>(arg));
  ncclComm& c = *q->comm;
  if (q->fault == Transfer::Stall) wait_for_abort(c);
  const ncclResult_t rc = q->fault == Transfer::Break ? broken(c) : run_ops(c, q->ops);
  std::lock_guard lock(c.mutex);
  if (rc != ncclSuccess && c.error == ncclSuccess) c.error = rc;
  --c.on_stream;
  c.cv.notify_all();
}

// A communicator's own exchange (a split, finalize) after its transfers
// still queued on a stream: both count its messages.
Op after_queued(Op op) {
  op.post = [c = op.comm, inner = std::move(op.post)] {
    std::unique_lock lock(c->mutex);
    c->cv.wait(lock, [&] { return c->on_stream == 0 || c->aborted; });
    lock.unlock();
    return inner();
  };
  return op;
}

// Runs operations of one communicator: on its thread when it is
// non-blocking, here when not. Transfers are queued on their stream there.
ncclResult_t submit(const std::shared_ptr<ncclComm>& c, std::vector<Op> ops) {
  auto unit = [c, ops = std::move(ops)]() mutable -> ncclResult_t {
    const Transfer fault = maybe_fault(*c);
    const HostQueue queue = g_host_queue.load();
    const bool queued = queue && !ops.empty() && std::all_of(ops.begin(), ops.end(), [](const Op& o) {
      return o.transfer;
    });
    if (!queued) {
      if (fault == Transfer::Stall) wait_for_abort(*c);
      return fault == Transfer::Break ? broken(*c) : run_ops(*c, ops);
    }
    if (c->aborted) return ncclSystemError;
    void* stream = ops.front().stream;  // a group's on several streams runs on its first
    {
      std::lock_guard lock(c->mutex);
      ++c->on_stream;
    }
    queue(stream, run_queued, new Queued{c, std::move(ops), fault});
    return ncclSuccess;
  };
  std::unique_lock lock(c->mutex);
  if (c->error != ncclSuccess) return c->error;
  if (c->blocking) {
    lock.unlock();
    const ncclResult_t rc = unit();
    lock.lock();
    if (rc != ncclSuccess && c->error == ncclSuccess) c->error = rc;
    return rc;
  }
  c->queue.push_back(std::move(unit));
  c->must_poll = true;
  c->cv.notify_all();
  return ncclInProgress;
}

void start_worker(const std::shared_ptr<ncclComm>& c) {
  ncclComm* raw = c.get();  // the thread ends before the communicator does
  c->worker = std::thread([raw] {
    std::unique_lock lock(raw->mutex);
    while (true) {
      raw->cv.wait(lock, [&] { return raw->stop || !raw->queue.empty(); });
      if (raw->stop) return;
      auto unit = std::move(raw->queue.front());
      raw->queue.pop_front();
      raw->busy = true;
      const ncclResult_t before = raw->error;
      lock.unlock();
      const ncclResult_t rc = before == ncclSuccess ? unit() : before;
      lock.lock();
      raw->busy = false;
      if (rc != ncclSuccess && raw->error == ncclSuccess) raw->error = rc;
      raw->cv.notify_all();
    }
  });
}

// The group this thread is in: its depth and what it queued.
thread_local int t_depth = 0;
thread_local std::vector<Op> t_group;

// The checks every call on a communicator starts with.
ncclResult_t enter(ncclComm_t handle, const char* call, std::shared_ptr<ncclComm>& c) {
  c = live(handle);
  if (!c) return not_a_communicator(call);
  std::string why;  // reported after the communicator's lock (fail takes the global one)
  {
    std::lock_guard lock(c->mutex);
    if (c->error != ncclSuccess) return c->error;
    if (c->must_poll)
      why = " while an earlier call's ncclInProgress was not yet polled to ncclSuccess with ncclCommGetAsyncError";
  }
  return why.empty() ? ncclSuccess : fail(ncclInvalidUsage, std::string(call) + " on " + c->key + why);
}

// A call's operation: queued in a group, else run at once.
ncclResult_t issue(Op op) {
  if (t_depth > 0) {
    t_group.push_back(std::move(op));
    return ncclSuccess;
  }
  auto c = op.comm;
  return submit(c, {std::move(op)});
}

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  const char *pa = static_cast<const char*>(a), *pb = static_cast<const char*>(b);
  return an > 0 && bn > 0 && pa < pb + bn && pb < pa + an;
}

}  // namespace

// ------------------------------------------------------------------ API

extern "C" {

// The engine's runtime's host functions (runtime.h launch_host_func), on
// whose streams the transfers are then queued.
void shardscopeFakeNcclHostQueue(HostQueue queue) { g_host_queue = queue; }

const char* ncclGetErrorString(ncclResult_t rc) {
  switch (rc) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) {
  static thread_local std::string copy;
  std::lock_guard lock(reg().mutex);
  copy = reg().last_error;
  return copy.c_str();
}

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return ncclInvalidArgument;
  if (const char* v = std::getenv("SHARDSCOPE_FAKE_NCCL_FAULT"); v && std::string(v) == "noid:0:0" && world_rank() == 0) {
    log_line("fault: world rank 0 noid at operation 0");
    return ncclSystemError;
  }
  std::memset(id, 0, sizeof *id);
  std::random_device rd;
  std::snprintf(id->internal, sizeof id->internal, "ssfake-%ld-%08x%08x", long(getpid()), rd(), rd());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  if (!out) return ncclInvalidArgument;
  *out = nullptr;
  if (std::strncmp(id.internal, "ssfake-", 7) != 0)
    return fail(ncclInvalidArgument, "ncclCommInitRankConfig: the id is not one ncclGetUniqueId of this library made");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument,
                "ncclCommInitRankConfig: rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  auto c = std::make_shared<ncclComm>();
  c->key = std::string(id.internal, strnlen(id.internal, sizeof id.internal));
  c->rank = rank;
  c->nranks = nranks;
  c->blocking = !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
  c->sent.assign(size_t(nranks), 0);
  c->received.assign(size_t(nranks), 0);
  c->readied.assign(size_t(nranks), 0);
  c->awaited.assign(size_t(nranks), 0);
  c->pids.assign(size_t(nranks), 0);
  {
    std::lock_guard lock(reg().mutex);
    reg().live[c.get()] = c;
  }
  if (!c->blocking) start_worker(c);
  *out = c.get();
  // Joining: every rank's pid reaches every rank (which also tells when one is gone).
  Header h{.kind = kJoin, .count = 1, .type = ncclInt64, .bytes = sizeof(long)};
  auto mine = std::make_shared<long>(long(getpid()));
  return submit(c, {exchange(c, h, mine.get(), [c, mine](int r, const void* p) {
                  std::memcpy(&c->pids[size_t(r)], p, sizeof(long));
                  return ncclSuccess;
                })});
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t handle, ncclResult_t* state) {
  auto c = live(handle);
  if (!state) return ncclInvalidArgument;
  if (!c) return not_a_communicator("ncclCommGetAsyncError");
  std::lock_guard lock(c->mutex);
  if (c->error != ncclSuccess)
    *state = c->error;
  else if (c->busy || !c->queue.empty())
    *state = ncclInProgress;
  else {
    *state = ncclSuccess;
    c->must_poll = false;
  }
  return ncclSuccess;
}

// As NCCL's: the new communicator reaches *out only when the split is done
// (null until then, and for good if it fails), and the split is polled on
// the parent.
ncclResult_t ncclCommSplit(ncclComm_t handle, int color, int key, ncclComm_t* out, ncclConfig_t* config) {
  std::shared_ptr<ncclComm> p;
  if (!out) return ncclInvalidArgument;
  *out = nullptr;
  if (ncclResult_t rc = enter(handle, "ncclCommSplit", p); rc != ncclSuccess) return rc;
  std::shared_ptr<ncclComm> child;
  if (color != NCCL_SPLIT_NOCOLOR) {
    child = std::make_shared<ncclComm>();
    // A null config inherits the parent's mode; one that leaves it undefined is NCCL's default, blocking.
    child->blocking = !config ? p->blocking : config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
    child->key = p->key + "." + std::to_string(p->splits) + "c" + std::to_string(color);
  }
  ++p->splits;
  // Every rank's (color, key) to every rank; the child's ranks by (key, parent rank).
  Header h{.kind = kSplit, .count = 2, .type = ncclInt32, .bytes = 2 * sizeof(int32_t)};
  auto mine = std::make_shared<std::array<int32_t, 2>>(std::array<int32_t, 2>{color, key});
  auto all = std::make_shared<std::vector<std::array<int32_t, 2>>>(size_t(p->nranks));
  Op op = exchange(p, h, mine->data(), [all, mine](int r, const void* d) {
    std::memcpy((*all)[size_t(r)].data(), d, sizeof(int32_t) * 2);
    return ncclSuccess;
  });
  auto inner_take = op.take;
  op.take = [p, child, all, inner_take, color, out]() -> ncclResult_t {
    const ncclResult_t rc = inner_take();
    if (rc != ncclSuccess || !child) return rc;
    std::vector<std::pair<int, int>> members;  // (key, parent rank)
    for (int r = 0; r < p->nranks; ++r)
      if ((*all)[size_t(r)][0] == color) members.push_back({(*all)[size_t(r)][1], r});
    std::sort(members.begin(), members.end());
    child->nranks = int(members.size());
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i].second == p->rank) child->rank = int(i);
      child->pids.push_back(p->pids[size_t(members[i].second)]);
    }
    child->sent.assign(members.size(), 0);
    child->received.assign(members.size(), 0);
    child->readied.assign(members.size(), 0);
    child->awaited.assign(members.size(), 0);
    {
      std::lock_guard lock(reg().mutex);
      reg().live[child.get()] = child;
    }
    if (!child->blocking) start_worker(child);
    __atomic_store_n(out, child.get(), __ATOMIC_RELEASE);
    return rc;
  };
  return submit(p, {after_queued(std::move(op))});
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t redop,
                           ncclComm_t handle, cudaStream_t stream) {
  std::shared_ptr<ncclComm> c;
  if (ncclResult_t rc = enter(handle, "ncclAllReduce", c); rc != ncclSuccess) return rc;
  if (ncclResult_t rc = check_reduction("ncclAllReduce", type, redop); rc != ncclSuccess) return rc;
  const size_t es = type_size(type);
  Header h{.kind = kAllReduce, .count = count, .type = type, .extra = redop, .bytes = count * es};
  auto acc = std::make_shared<std::vector<char>>(h.bytes);
  return issue(on_stream(exchange(c, h, send,
                                  [=](int r, const void* d) {
                                    if (r == 0)
                                      std::memcpy(acc->data(), d, h.bytes);
                                    else
                                      reduce_bytes(acc->data(), d, count, type, redop);
                                    if (r == c->nranks - 1 && h.bytes) std::memcpy(recv, acc->data(), h.bytes);
                                    return ncclSuccess;
                                  }),
                         stream));
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t handle,
                           cudaStream_t stream) {
  std::shared_ptr<ncclComm> c;
  if (ncclResult_t rc = enter(handle, "ncclAllGather", c); rc != ncclSuccess) return rc;
  const size_t bytes = count * type_size(type);
  if (overlaps(send, bytes, recv, bytes * size_t(c->nranks)) &&
      send != static_cast<const char*>(recv) + bytes * size_t(c->rank))
    return fail(ncclInvalidUsage, "ncclAllGather in place needs sendbuff == recvbuff + rank * sendcount");
  Header h{.kind = kAllGather, .count = count, .type = type, .bytes = bytes};
  return issue(on_stream(exchange(c, h, send,
                                  [=](int r, const void* d) {
                                    char* dst = static_cast<char*>(recv) + bytes * size_t(r);
                                    if (dst != d && bytes) std::memmove(dst, d, bytes);
                                    return ncclSuccess;
                                  }),
                         stream));
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t redop,
                               ncclComm_t handle, cudaStream_t stream) {
  std::shared_ptr<ncclComm> c;
  if (ncclResult_t rc = enter(handle, "ncclReduceScatter", c); rc != ncclSuccess) return rc;
  if (ncclResult_t rc = check_reduction("ncclReduceScatter", type, redop); rc != ncclSuccess) return rc;
  const size_t es = type_size(type), bytes = count * es, all = bytes * size_t(c->nranks);
  if (overlaps(send, all, recv, bytes) && recv != static_cast<const char*>(send) + bytes * size_t(c->rank))
    return fail(ncclInvalidUsage, "ncclReduceScatter in place needs recvbuff == sendbuff + rank * recvcount");
  // Every rank's whole input to every rank, each keeping its own block's sum.
  Header h{.kind = kReduceScatter, .count = count, .type = type, .extra = redop, .bytes = all};
  auto acc = std::make_shared<std::vector<char>>(bytes);
  return issue(on_stream(exchange(c, h, send,
                                  [=](int r, const void* d) {
                                    const char* block = static_cast<const char*>(d) + bytes * size_t(c->rank);
                                    if (r == 0)
                                      std::memcpy(acc->data(), block, bytes);
                                    else
                                      reduce_bytes(acc->data(), block, count, type, redop);
                                    if (r == c->nranks - 1 && bytes) std::memcpy(recv, acc->data(), bytes);
                                    return ncclSuccess;
                                  }),
                         stream));
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t handle,
                           cudaStream_t stream) {
  std::shared_ptr<ncclComm> c;
  if (ncclResult_t rc = enter(handle, "ncclBroadcast", c); rc != ncclSuccess) return rc;
  if (root < 0 || root >= c->nranks) return fail(ncclInvalidArgument, "ncclBroadcast: root " + std::to_string(root));
  const size_t bytes = count * type_size(type);
  Header h{.kind = kBroadcast, .count = count, .type = type, .extra = root, .bytes = bytes};
  Op op{c, nullptr, nullptr};
  if (c->rank == root) {
    op.post = [=] {
      for (int r = 0; r < c->nranks; ++r)
        if (r != root)
          if (ncclResult_t rc = post(*c, r, h, send); rc != ncclSuccess) return rc;
      if (recv != send && bytes) std::memmove(recv, send, bytes);
      return ncclSuccess;
    };
  } else {
    op.take = [=] { return take(*c, root, h, recv); };
  }
  return issue(on_stream(std::move(op), stream));
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t handle,
                      cudaStream_t stream) {
  std::shared_ptr<ncclComm> c;
  if (ncclResult_t rc = enter(handle, "ncclSend", c); rc != ncclSuccess) return rc;
  if (peer < 0 || peer >= c->nranks) return fail(ncclInvalidArgument, "ncclSend: peer " + std::to_string(peer));
  Header h{.kind = kSend, .count = count, .type = type, .bytes = count * type_size(type)};
  Header ready = h;
  ready.bytes = 0;
  // The bytes, then the receive's readiness (kReady). To itself: the matching
  // receive is in the same group, whose posts all come before its takes.
  return issue(on_stream(Op{c, [=] { return post(*c, peer, h, send); },
                            [=] { return take(*c, peer, ready, nullptr, kReady); }},
                         stream));
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t handle,
                      cudaStream_t stream) {
  std::shared_ptr<ncclComm> c;
  if (ncclResult_t rc = enter(handle, "ncclRecv", c); rc != ncclSuccess) return rc;
  if (peer < 0 || peer >= c->nranks) return fail(ncclInvalidArgument, "ncclRecv: peer " + std::to_string(peer));
  Header h{.kind = kSend, .count = count, .type = type, .bytes = count * type_size(type)};
  Header ready = h;
  ready.bytes = 0;
  return issue(on_stream(Op{c, [=] { return post(*c, peer, ready, nullptr, kReady); },
                            [=] { return take(*c, peer, h, recv); }},
                         stream));
}

ncclResult_t ncclGroupStart() {
  ++t_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_depth > 0) return ncclSuccess;
  std::vector<Op> ops = std::move(t_group);
  t_group.clear();
  // Each communicator's operations, in the order they were called.
  std::vector<std::pair<std::shared_ptr<ncclComm>, std::vector<Op>>> by_comm;
  for (Op& o : ops) {
    auto it = std::find_if(by_comm.begin(), by_comm.end(), [&](auto& e) { return e.first == o.comm; });
    if (it == by_comm.end()) by_comm.push_back({o.comm, {}}), it = by_comm.end() - 1;
    it->second.push_back(std::move(o));
  }
  // Each communicator's part would be queued on the stream on its own, run
  // one after another where NCCL runs them together: not emulated.
  if (by_comm.size() > 1 && g_host_queue.load())
    return fail(ncclInternalError, "a group over " + std::to_string(by_comm.size()) +
                                       " communicators is not emulated (their transfers would run one communicator "
                                       "at a time)");
  ncclResult_t result = ncclSuccess;
  for (auto& [c, list] : by_comm) {
    const ncclResult_t rc = submit(c, std::move(list));
    if (rc != ncclSuccess && (result == ncclSuccess || result == ncclInProgress)) result = rc;
  }
  return result;
}

ncclResult_t ncclCommFinalize(ncclComm_t handle) {
  std::shared_ptr<ncclComm> c;
  if (ncclResult_t rc = enter(handle, "ncclCommFinalize", c); rc != ncclSuccess) return rc;
  // Its transfers still queued run first; then every rank's last message is
  // taken before any goes: an exchange of nothing.
  Header h{.kind = kFinalize};
  return submit(c, {after_queued(exchange(c, h, nullptr, [](int, const void*) { return ncclSuccess; }))});
}

namespace {

ncclResult_t end(ncclComm_t handle, const char* call, bool abort) {
  std::shared_ptr<ncclComm> c;
  bool ended = false;
  {
    std::lock_guard lock(reg().mutex);  // then the communicator's: one end of a handle, ever
    auto it = reg().live.find(handle);
    if (it != reg().live.end()) {
      c = it->second;
      std::lock_guard comm_lock(c->mutex);
      if (abort || (!c->busy && c->queue.empty() && c->on_stream == 0)) {
        reg().live.erase(it);
        reg().ended.push_back(c);
        ended = true;
      }
    }
  }
  if (!c)
    return not_a_communicator(call);
  if (!ended)  // a destroy with work in flight
    return fail(ncclInvalidUsage, std::string(call) + " on " + c->key + " with operations still in flight");
  c->aborted = abort;
  {
    std::lock_guard lock(c->mutex);
    c->stop = true;
  }
  c->cv.notify_all();
  if (c->worker.joinable()) c->worker.join();
  c->queue.clear();  // what was never run (an abort's), and the references it held
  if (abort) remove_messages(*c);
  return ncclSuccess;
}
}  // namespace

ncclResult_t ncclCommDestroy(ncclComm_t handle) {
  return end(handle, "ncclCommDestroy", false);
}
ncclResult_t ncclCommAbort(ncclComm_t handle) {
  return end(handle, "ncclCommAbort", true);
}

}  // extern "C"

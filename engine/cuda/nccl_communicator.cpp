#include "cuda/nccl_communicator.h"

#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include "cuda/kernels.h"
#include "cuda/runtime.h"

namespace ss::SS_CUDA_NS {
namespace {

// NCCL's entry points, from libnccl.so.2, loaded on first use.
struct NcclApi {
  void* lib = nullptr;
  std::string error;
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*init_rank_config)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) = nullptr;
  ncclResult_t (*split)(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*) = nullptr;
  ncclResult_t (*async_error)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*abort)(ncclComm_t) = nullptr;
  ncclResult_t (*finalize)(ncclComm_t) = nullptr;
  ncclResult_t (*destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cudaStream_t) = nullptr;
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*reduce_scatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                 cudaStream_t) = nullptr;
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*group_start)() = nullptr;
  ncclResult_t (*group_end)() = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
  const char* (*last_error)(ncclComm_t) = nullptr;
  ncclResult_t (*get_version)(int*) = nullptr;
};

const NcclApi& nccl() {
  static NcclApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    // SHARDSCOPE_NCCL_LIBRARY: another build of the library (or the tests'
    // stand-in, tests/fake_nccl, which the emulated ranks run on).
    const char* env = std::getenv("SHARDSCOPE_NCCL_LIBRARY");
    const std::string path = env && *env ? env : "libnccl.so.2";
    api.lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!api.lib) {
      api.error = path + " not found (" + dlerror() + ")";
      return;
    }
    auto sym = [](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(api.lib, name));
      if (!fn && api.error.empty()) api.error = std::string("NCCL lacks ") + name;
    };
    sym(api.get_unique_id, "ncclGetUniqueId");
    sym(api.init_rank_config, "ncclCommInitRankConfig");
    sym(api.split, "ncclCommSplit");
    sym(api.async_error, "ncclCommGetAsyncError");
    sym(api.abort, "ncclCommAbort");
    sym(api.finalize, "ncclCommFinalize");
    sym(api.destroy, "ncclCommDestroy");
    sym(api.all_reduce, "ncclAllReduce");
    sym(api.all_gather, "ncclAllGather");
    sym(api.reduce_scatter, "ncclReduceScatter");
    sym(api.broadcast, "ncclBroadcast");
    sym(api.send, "ncclSend");
    sym(api.recv, "ncclRecv");
    sym(api.group_start, "ncclGroupStart");
    sym(api.group_end, "ncclGroupEnd");
    sym(api.error_string, "ncclGetErrorString");
    sym(api.last_error, "ncclGetLastError");
    sym(api.get_version, "ncclGetVersion");
    // The tests' stand-in has no GPU to queue its transfers on: it queues
    // them on the runtime's streams as host functions, as NCCL's kernels go.
    using HostQueue = void (*)(void*, void (*)(void*), void*);
    if (auto take_queue = reinterpret_cast<void (*)(HostQueue)>(dlsym(api.lib, "shardscopeFakeNcclHostQueue")))
      take_queue(&launch_host_func);
  });
  return api;
}

const NcclApi& require_nccl() {
  const NcclApi& api = nccl();
  if (!api.error.empty()) throw std::runtime_error("nccl: " + api.error);
  return api;
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    default: return ncclFloat32;
  }
}

cudaStream_t nccl_st(Stream s) { return static_cast<cudaStream_t>(s); }

}  // namespace

std::string nccl_unavailable_reason() { return nccl().error; }

std::string nccl_version() {
  const NcclApi& api = nccl();
  int v = 0;
  if (!api.error.empty() || api.get_version(&v) != ncclSuccess) return "";
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

// ------------------------------------------------------------------ state

// One NCCL communicator and what watches it. The watchdog polls NCCL's
// asynchronous error and the oldest outstanding operation; either failing
// aborts the communicator, and every later call throws the reason. An
// operation's time counts from when its stream reached it: one queued behind
// a long backlog of the compute stream (a long prefill queued ahead of it),
// or behind the operations before it, is not late. Every NCCL
// call on `comm` (a group's calls together) holds `nccl_mutex`, and the abort
// takes it too and leaves `comm` null: an abort from the watchdog never meets
// a call of the compute thread, and the handle is never used after it.
struct NcclCommunicator::State {
  ncclComm_t comm = nullptr;  // guarded by nccl_mutex; null once aborted or destroyed
  std::string name;
  int device = 0;
  double timeout_s = 0;

  std::mutex nccl_mutex;
  std::mutex mutex;  // what follows; taken before nccl_mutex where both are held
  std::condition_variable cv;
  struct Outstanding {
    Event started, done;  // recorded on the stream before and after the operation
    std::optional<std::chrono::steady_clock::time_point> reached;  // when the watchdog first saw it started
    const char* op;
  };
  std::deque<Outstanding> outstanding;
  std::vector<Event> free_events;
  std::string failure;  // set once, by the watchdog or a failed call
  std::shared_ptr<DeviceFailure> device_failure;  // the device's (watch_device): told the failure before the abort
  bool stop = false;
  std::thread watchdog;

  ~State() {
    {
      std::lock_guard lock(mutex);
      stop = true;
    }
    cv.notify_all();
    if (watchdog.joinable()) watchdog.join();
    // Finalize, polled as any call, then destroy; a failed or timed-out one
    // is aborted by check(). A peer that never finishes its part must not
    // hang the exit: with no operation timeout, a minute.
    if (failure.empty()) {
      if (timeout_s <= 0) timeout_s = 60;
      try {
        call("ncclCommFinalize", [](ncclComm_t c) { return nccl().finalize(c); });
      } catch (const std::exception&) {
        // Aborted: the failure is recorded, and a destructor cannot report it.
      }
    }
    std::lock_guard lock(nccl_mutex);
    if (comm) {
      if (failure.empty()) nccl().destroy(comm);
      else nccl().abort(comm);
      comm = nullptr;
    }
    for (Event e : free_events) destroy_event(e);
    for (auto& o : outstanding) {
      destroy_event(o.started);
      destroy_event(o.done);
    }
  }

  bool past(std::chrono::steady_clock::time_point start) const {
    return timeout_s > 0 && std::chrono::steady_clock::now() - start > std::chrono::duration<double>(timeout_s);
  }
  void throw_if_failed() {
    std::lock_guard lock(mutex);
    if (!failure.empty()) throw std::runtime_error(failure);
  }
  void abort_comm() {
    std::lock_guard lock(nccl_mutex);
    if (comm) nccl().abort(comm);
    comm = nullptr;
  }
  // Under `mutex`: the first failure, the device told before the abort ends
  // what was queued (DeviceFailure).
  bool record_failure(const std::string& why) {
    if (!failure.empty()) return false;
    failure = why;
    if (device_failure) device_failure->set(why);
    return true;
  }
  void fail(const std::string& why) {
    {
      std::lock_guard lock(mutex);
      if (!record_failure(why)) return;
    }
    abort_comm();
  }
  // `calls(comm)` (NCCL calls on this communicator) under the NCCL lock;
  // throws the failure instead once the communicator is aborted.
  template <class F>
  ncclResult_t locked(F&& calls) {
    {
      std::lock_guard lock(nccl_mutex);
      if (comm) return calls(comm);
    }
    throw_if_failed();
    throw std::runtime_error("nccl: " + name + " was used after it was destroyed");
  }
  // One NCCL call `name`, `calls(comm)`, under the lock, then waited for.
  template <class F>
  void call(const char* name, F&& calls) {
    check(locked(calls), name);
  }
  // NCCL's state of the communicator (ncclSystemError once it is aborted).
  ncclResult_t state() {
    std::lock_guard lock(nccl_mutex);
    ncclResult_t st = ncclSystemError;
    if (comm && nccl().async_error(comm, &st) != ncclSuccess) st = ncclSystemError;
    return st;
  }
  // Why the communicator failed after its calls returned (a transfer queued
  // on the stream that failed there), or "" while it has not.
  std::string async_failure() {
    const ncclResult_t err = state();
    if (err == ncclSuccess || err == ncclInProgress) return "";
    const NcclApi& api = nccl();
    const char* detail = api.last_error ? api.last_error(nullptr) : "";
    return "nccl: " + name + " failed: " + api.error_string(err) +
           (detail && *detail ? std::string(" (") + detail + ")" : "") + " (a peer is gone or failed)";
  }
  // A transfer that failed on the stream becomes the communicator's (and the
  // device's) failure. The device asks before it hands out results
  // (DeviceFailure::check): a failed transfer's output is unwritten.
  void probe() {
    if (std::string why = async_failure(); !why.empty()) fail(why);
  }
  // Joins the device: its failures become the device's, and the device's
  // reads ask it first.
  static void watch_device(const std::shared_ptr<State>& self, std::shared_ptr<DeviceFailure> device) {
    {
      std::lock_guard lock(self->mutex);
      self->device_failure = std::move(device);
    }
    const std::weak_ptr<State> weak = self;
    self->device_failure->watch(weak, [weak] {
      if (const std::shared_ptr<State> st = weak.lock()) st->probe();
    });
  }
  // After waiting for a transfer: throws if it, or anything before it, failed.
  void check_async() {
    probe();
    throw_if_failed();
  }
  // After an NCCL call on a non-blocking communicator: wait until it is
  // enqueued (or has failed), then throw its error. Yields for the first
  // millisecond, then sleeps between polls (ranks sharing cores wait on
  // each other).
  void check(ncclResult_t rc, const char* call) {
    const auto start = std::chrono::steady_clock::now();
    while (rc == ncclInProgress) {
      rc = state();
      if (rc != ncclInProgress) break;
      if (past(start)) {
        fail("nccl: " + std::string(call) + " on " + name + " did not return in " + std::to_string(int(timeout_s)) +
             " s; the communicator was aborted");
        break;
      }
      const auto waited = std::chrono::steady_clock::now() - start;
      if (waited < std::chrono::milliseconds(1)) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(waited < std::chrono::milliseconds(20) ? 20 : 200));
    }
    if (rc != ncclSuccess && rc != ncclInProgress) {
      const NcclApi& api = nccl();
      const char* detail = api.last_error ? api.last_error(nullptr) : "";  // its communicator argument is unused
      fail("nccl: " + std::string(call) + " on " + name + " failed: " + api.error_string(rc) +
           (detail && *detail ? std::string(" (") + detail + ")" : ""));
    }
    throw_if_failed();
  }

  Event take_event() {
    std::lock_guard lock(mutex);
    if (free_events.empty()) return create_event();
    Event e = free_events.back();
    free_events.pop_back();
    return e;
  }
  void give_event(Event e) {
    std::lock_guard lock(mutex);
    free_events.push_back(e);
  }
  void track(Event started, Event done, const char* op) {
    std::lock_guard lock(mutex);
    outstanding.push_back({started, done, std::nullopt, op});
  }

  // Under `mutex`: drops the finished operations, and says why the
  // communicator failed or the oldest one is late ("" while neither). The
  // operations of one stream run in order, so only the oldest can be late.
  std::string overdue() {
    while (!outstanding.empty() && event_done(outstanding.front().done)) {
      free_events.push_back(outstanding.front().started);
      free_events.push_back(outstanding.front().done);
      outstanding.pop_front();
    }
    if (std::string why = async_failure(); !why.empty()) return why;
    if (timeout_s <= 0 || outstanding.empty()) return "";
    Outstanding& o = outstanding.front();
    if (!o.reached && event_done(o.started)) o.reached = std::chrono::steady_clock::now();
    if (!o.reached || !past(*o.reached)) return "";
    return "nccl: " + std::string(o.op) + " on " + name + " did not complete in " + std::to_string(int(timeout_s)) +
           " s (a peer is gone or hung); the communicator was aborted";
  }

  void start_watchdog() {
    watchdog = std::thread([this] {
      std::unique_lock lock(mutex);
      std::string why;
      try {
        set_device(device);
      } catch (const std::exception& e) {
        why = "nccl: the watchdog of " + name + " failed: " + e.what();
      }
      while (!stop && why.empty()) {
        cv.wait_for(lock, std::chrono::milliseconds(200));
        if (stop || !failure.empty()) continue;
        try {
          why = overdue();
        } catch (const std::exception& e) {  // the device failed (a CUDA error asking for an event)
          why = "nccl: the watchdog of " + name + " failed: " + e.what();
        }
      }
      if (why.empty() || !record_failure(why)) return;
      lock.unlock();
      abort_comm();
    });
  }
};

// The compute stream's side of an operation: waiting joins the streams.
namespace {
struct NcclRequest final : CommRequest {
  std::shared_ptr<NcclCommunicator::State> state;  // outlives the request's event
  Event done_event = nullptr;
  Stream compute = nullptr;
  std::vector<Tensor> keep;
  bool joined = false;

  void wait() override {
    if (!joined) {
      wait_event(compute, done_event);
      joined = true;
    }
    keep.clear();  // freed in the compute stream's order, after the transfer
    state->check_async();
  }
  bool done() override { return event_done(done_event); }
  ~NcclRequest() override {
    try {
      if (!joined) wait_event(compute, done_event);  // what `keep` frees comes after the transfer
    } catch (...) {
      // A destructor cannot report; the failure is the communicator's to throw.
    }
    keep.clear();
    state->give_event(done_event);  // the waits queued on it keep the state they saw
  }
};
// A group of point-to-point calls on one communicator: `queue` makes them
// between ncclGroupStart and ncclGroupEnd, under the NCCL lock; then the
// group is waited for as any call. The first call to fail is its result.
struct P2pGroup {
  ncclComm_t comm;
  cudaStream_t stream;
  ncclResult_t rc = ncclSuccess;
  void send(const void* p, int64_t bytes, int peer) {
    keep(nccl().send(p, size_t(bytes), ncclUint8, peer, comm, stream));
  }
  void recv(void* p, int64_t bytes, int peer) { keep(nccl().recv(p, size_t(bytes), ncclUint8, peer, comm, stream)); }
  void keep(ncclResult_t r) {
    if (rc == ncclSuccess && r != ncclSuccess) rc = r;
  }
};

template <class F>
void run_group(NcclCommunicator::State& s, Stream stream, const char* what, F&& queue) {
  s.check(s.locked([&](ncclComm_t comm) {
    const NcclApi& api = nccl();
    if (const ncclResult_t rc = api.group_start(); rc != ncclSuccess) return rc;
    P2pGroup g{comm, nccl_st(stream)};
    queue(g);
    const ncclResult_t end = api.group_end();
    return g.rc != ncclSuccess ? g.rc : end;
  }), what);
}
}  // namespace

// ----------------------------------------------------------- communicator

NcclCommunicator::NcclCommunicator(std::unique_ptr<MpiCommunicator> host, std::shared_ptr<DeviceContext> ctx,
                                   Recorder& rec, double timeout_s)
    : m_host(std::move(host)), m_ctx(std::move(ctx)), m_rec(rec), m_state(std::make_shared<State>()) {
  const NcclApi& api = require_nccl();
  set_device(m_ctx->device);
  // Rank 0's unique id reaches every rank over MPI, or, where rank 0 could
  // not make one, the news: every rank then fails alike, none waits.
  struct {
    ncclUniqueId id;
    int made;
  } boot{};
  if (m_host->rank() == 0) boot.made = api.get_unique_id(&boot.id) == ncclSuccess;
  m_host->stream()
      .enqueue([&] {
        check_mpi(MPI_Bcast(&boot, int(sizeof boot), MPI_BYTE, 0, m_host->handle()), "MPI_Bcast", m_host->name());
      })
      ->wait();
  if (!boot.made) throw std::runtime_error("nccl: ncclGetUniqueId failed on rank 0 of " + m_host->name());
  const ncclUniqueId& id = boot.id;
  State& s = *m_state;
  s.name = m_host->name();
  s.device = m_ctx->device;
  s.timeout_s = timeout_s;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // calls return at once; the watchdog can abort a hung one
  ncclResult_t rc;
  {
    std::lock_guard lock(s.nccl_mutex);
    rc = api.init_rank_config(&s.comm, m_host->size(), id, m_host->rank(), &config);
  }
  s.check(rc, "ncclCommInitRankConfig");
  State::watch_device(m_state, m_ctx->failure);
  s.start_watchdog();
}

NcclCommunicator::NcclCommunicator(Adopt, std::unique_ptr<MpiCommunicator> host, std::shared_ptr<DeviceContext> ctx,
                                   Recorder& rec, std::shared_ptr<State> state)
    : m_host(std::move(host)), m_ctx(std::move(ctx)), m_rec(rec), m_state(std::move(state)) {
  State::watch_device(m_state, m_ctx->failure);
  m_state->start_watchdog();
}

NcclCommunicator::~NcclCommunicator() {
  settle(m_ctx->comm);  // nothing of this communicator is still queued when it goes
}

std::vector<int> NcclCommunicator::others() const {
  std::vector<int> out;
  for (int r = 0; r < size(); ++r)
    if (r != rank()) out.push_back(members()[size_t(r)]);
  return out;
}

void NcclCommunicator::check_tensor(const Tensor& t, const char* op, const char* what) const {
  const std::string where = std::string(op) + " on " + name() + ": " + what;
  if (!t.defined()) throw std::logic_error(where + " is undefined");
  if (!t.is_contiguous()) throw std::logic_error(where + " must be contiguous, got a strided view " + t.shape_str());
  if (t.numel() > 0 && !t.has_data()) throw std::logic_error(where + " has no data (a meta tensor)");
}

void NcclCommunicator::check_peer(int peer, const char* op, const char* what) const {
  if (peer < 0 || peer >= size())
    throw std::logic_error(std::string(op) + " on " + name() + ": " + what + " " + std::to_string(peer) +
                           " is not a rank of a group of " + std::to_string(size()));
}

Request NcclCommunicator::issue(const char* op, double payload_bytes, std::vector<int64_t> dims,
                                std::vector<int> peers, std::vector<Tensor> keep, const std::function<void()>& call) {
  State& s = *m_state;
  s.throw_if_failed();
  // The transfer starts after the compute stream's work so far (its inputs).
  const Event ready = s.take_event();
  record_event(ready, m_ctx->compute);
  wait_event(m_ctx->comm, ready);
  s.give_event(ready);  // a stream's wait keeps the state it saw; the event may be recorded again
  SpanQueue& spans = *m_ctx->spans;
  const bool timed = m_rec.span_recording();
  SpanQueue::Pending p;
  if (timed) p.start = spans.mark(m_ctx->comm);
  // The watchdog times the operation from here (the stream has reached it).
  // Until it is tracked, the event goes back to the pool if anything throws.
  struct Started {
    State& s;
    Event e;
    bool tracked = false;
    ~Started() {
      if (!tracked) s.give_event(e);
    }
  } started{s, s.take_event()};
  record_event(started.e, m_ctx->comm);
  try {
    call();
  } catch (...) {
    // The failed call is aborted; what it queued on the stream may still
    // hold `keep`'s buffers until the abort has ended it.
    settle(m_ctx->comm);
    throw;
  }
  if (timed) {
    p.end = spans.mark(m_ctx->comm);
    p.tag = m_rec.tag();
    p.stream = StreamKind::Comm;
    p.op = op;
    p.bytes = wire_bytes(op, payload_bytes, size());
    p.dims = std::move(dims);
    p.peers = std::move(peers);
    spans.push(std::move(p));
  }
  auto req = std::make_shared<NcclRequest>();
  req->state = m_state;
  req->compute = m_ctx->compute;
  req->keep = std::move(keep);
  req->done_event = s.take_event();
  record_event(req->done_event, m_ctx->comm);
  // The watchdog times the operation; the request keeps its own event.
  const Event watched = s.take_event();
  record_event(watched, m_ctx->comm);
  s.track(started.e, watched, op);
  started.tracked = true;
  return req;
}

void NcclCommunicator::reduce_16bit(void* data, int64_t n, DType dt, void* out_block, bool gather_back) {
  State& s = *m_state;
  const int D = size(), me = rank();
  std::vector<int64_t> first(size_t(D) + 1);
  for (int r = 0; r <= D; ++r) first[size_t(r)] = n * r / D;
  const int64_t mine = first[size_t(me) + 1] - first[size_t(me)];
  // Staging for every rank's copy of this rank's block (the communicator's own, as NCCL's buffers are).
  void* staging = malloc_device(2 * mine * D, m_ctx->comm);
  if (!staging && mine > 0) throw std::runtime_error("nccl: no device memory to stage a 16-bit reduction");
  char* base = static_cast<char*>(data);
  run_group(s, m_ctx->comm, "ncclGroupEnd (16-bit reduce)", [&](P2pGroup& g) {
    for (int r = 0; r < D; ++r) {
      g.send(base + 2 * first[size_t(r)], 2 * (first[size_t(r) + 1] - first[size_t(r)]), r);
      g.recv(static_cast<char*>(staging) + 2 * mine * r, 2 * mine, r);
    }
  });
  void* dst = gather_back ? base + 2 * first[size_t(me)] : out_block;
  sum_rows(dst, staging, D, mine, dt, m_ctx->comm);
  free_device(staging, m_ctx->comm);
  if (!gather_back) return;
  run_group(s, m_ctx->comm, "ncclGroupEnd (16-bit gather)", [&](P2pGroup& g) {
    for (int r = 0; r < D; ++r) {
      if (r == me) continue;
      g.send(dst, 2 * mine, r);
      g.recv(base + 2 * first[size_t(r)], 2 * (first[size_t(r) + 1] - first[size_t(r)]), r);
    }
  });
}

Request NcclCommunicator::iall_reduce(const Tensor& buf) {
  check_tensor(buf, "all_reduce", "buf");
  const DType dt = buf.dtype();
  return issue("all_reduce", double(buf.nbytes()), {buf.numel()}, others(), {buf}, [this, buf, dt] {
    if (dt == DType::F32 || dt == DType::I32) {
      m_state->call("ncclAllReduce", [&](ncclComm_t c) {
        return nccl().all_reduce(buf.raw(), buf.raw(), size_t(buf.numel()), nccl_type(dt), ncclSum, c,
                                 nccl_st(m_ctx->comm));
      });
    } else {
      reduce_16bit(buf.raw(), buf.numel(), dt, nullptr, true);
    }
  });
}

void NcclCommunicator::all_reduce(const Tensor& buf) { iall_reduce(buf)->wait(); }

void NcclCommunicator::reduce_scatter(const Tensor& out, const Tensor& in) {
  check_tensor(out, "reduce_scatter", "out");
  check_tensor(in, "reduce_scatter", "in");
  if (in.numel() != int64_t(size()) * out.numel())
    throw std::logic_error("reduce_scatter on " + name() + ": in has " + std::to_string(in.numel()) +
                           " elements, expected size() * out = " + std::to_string(size()) + " * " +
                           std::to_string(out.numel()));
  if (buffers_overlap(out, in)) throw std::logic_error("reduce_scatter on " + name() + ": out and in overlap");
  if (in.dtype() != out.dtype()) throw std::logic_error("reduce_scatter on " + name() + ": in and out dtypes differ");
  const DType dt = in.dtype();
  issue("reduce_scatter", double(in.nbytes()), {in.numel()}, others(), {out, in}, [this, out, in, dt] {
    if (dt == DType::F32 || dt == DType::I32) {
      m_state->call("ncclReduceScatter", [&](ncclComm_t c) {
        return nccl().reduce_scatter(in.raw(), out.raw(), size_t(out.numel()), nccl_type(dt), ncclSum, c,
                                     nccl_st(m_ctx->comm));
      });
    } else {
      reduce_16bit(in.raw(), in.numel(), dt, out.raw(), false);
    }
  })->wait();
}

Request NcclCommunicator::iall_gather(const Tensor& out, const Tensor& in) {
  check_tensor(out, "all_gather", "out");
  check_tensor(in, "all_gather", "in");
  const int64_t n = in.numel();
  if (out.numel() != int64_t(size()) * n)
    throw std::logic_error("all_gather on " + name() + ": out has " + std::to_string(out.numel()) +
                           " elements, expected size() * in = " + std::to_string(size()) + " * " + std::to_string(n));
  if (in.dtype() != out.dtype()) throw std::logic_error("all_gather on " + name() + ": in and out dtypes differ");
  const bool in_place = gathers_in_place(out, in, rank());
  if (!in_place && buffers_overlap(out, in))
    throw std::logic_error("all_gather on " + name() + ": in overlaps out other than as this rank's block");
  return issue("all_gather", double(out.nbytes()), {out.numel()}, others(), {out, in}, [this, out, in] {
    m_state->call("ncclAllGather", [&](ncclComm_t c) {
      return nccl().all_gather(in.raw(), out.raw(), size_t(in.nbytes()), ncclUint8, c, nccl_st(m_ctx->comm));
    });
  });
}

void NcclCommunicator::all_gather(const Tensor& out, const Tensor& in) { iall_gather(out, in)->wait(); }

void NcclCommunicator::all_to_all(const Tensor& out, const Tensor& in) {
  check_tensor(out, "all_to_all", "out");
  check_tensor(in, "all_to_all", "in");
  if (in.numel() != out.numel() || in.numel() % size() != 0)
    throw std::logic_error("all_to_all on " + name() + ": in and out need the same number of elements, a multiple of "
                           "size() = " + std::to_string(size()));
  if (buffers_overlap(out, in)) throw std::logic_error("all_to_all on " + name() + ": out and in overlap");
  if (in.dtype() != out.dtype()) throw std::logic_error("all_to_all on " + name() + ": in and out dtypes differ");
  const int64_t block = in.nbytes() / size();
  issue("all_to_all", double(in.nbytes()), {in.numel()}, others(), {out, in}, [this, out, in, block] {
    run_group(*m_state, m_ctx->comm, "ncclGroupEnd (all_to_all)", [&](P2pGroup& g) {
      for (int r = 0; r < size(); ++r) {
        g.send(static_cast<char*>(in.raw()) + block * r, block, r);
        g.recv(static_cast<char*>(out.raw()) + block * r, block, r);
      }
    });
  })->wait();
}

Request NcclCommunicator::ibroadcast(const Tensor& buf, int root) {
  check_tensor(buf, "broadcast", "buf");
  check_peer(root, "broadcast", "root");
  return issue("broadcast", double(buf.nbytes()), {buf.numel()}, others(), {buf}, [this, buf, root] {
    m_state->call("ncclBroadcast", [&](ncclComm_t c) {
      return nccl().broadcast(buf.raw(), buf.raw(), size_t(buf.nbytes()), ncclUint8, root, c, nccl_st(m_ctx->comm));
    });
  });
}

void NcclCommunicator::broadcast(const Tensor& buf, int root) { ibroadcast(buf, root)->wait(); }

Request NcclCommunicator::isendrecv(const Tensor& send_t, int dst, const Tensor& recv_t, int src) {
  check_tensor(send_t, "sendrecv", "send");
  check_tensor(recv_t, "sendrecv", "recv");
  check_peer(dst, "sendrecv", "dst");
  check_peer(src, "sendrecv", "src");
  if (buffers_overlap(send_t, recv_t)) throw std::logic_error("sendrecv on " + name() + ": send and recv overlap");
  if (send_t.dtype() != recv_t.dtype())
    throw std::logic_error("sendrecv on " + name() + ": send and recv dtypes differ");
  return issue("sendrecv", double(send_t.nbytes()), {send_t.numel()},
               {members()[size_t(dst)], members()[size_t(src)]}, {send_t, recv_t}, [this, send_t, dst, recv_t, src] {
                 run_group(*m_state, m_ctx->comm, "ncclGroupEnd (sendrecv)", [&](P2pGroup& g) {
                   g.send(send_t.raw(), send_t.nbytes(), dst);
                   g.recv(recv_t.raw(), recv_t.nbytes(), src);
                 });
               });
}

void NcclCommunicator::sendrecv(const Tensor& send_t, int dst, const Tensor& recv_t, int src) {
  isendrecv(send_t, dst, recv_t, src)->wait();
}

void NcclCommunicator::send(const Tensor& buf, int dst) {
  check_tensor(buf, "send", "buf");
  check_peer(dst, "send", "dst");
  issue("send", double(buf.nbytes()), {buf.numel()}, {members()[size_t(dst)]}, {buf}, [this, buf, dst] {
    m_state->call("ncclSend", [&](ncclComm_t c) {
      return nccl().send(buf.raw(), size_t(buf.nbytes()), ncclUint8, dst, c, nccl_st(m_ctx->comm));
    });
  })->wait();
}

void NcclCommunicator::recv(const Tensor& buf, int src) {
  check_tensor(buf, "recv", "buf");
  check_peer(src, "recv", "src");
  // A receive puts nothing on the wire: its bytes are the sender's.
  issue("recv", 0, {buf.numel()}, {members()[size_t(src)]}, {buf}, [this, buf, src] {
    m_state->call("ncclRecv", [&](ncclComm_t c) {
      return nccl().recv(buf.raw(), size_t(buf.nbytes()), ncclUint8, src, c, nccl_st(m_ctx->comm));
    });
  })->wait();
}

// Every rank's queued work done, then the host barrier.
void NcclCommunicator::barrier() {
  m_state->throw_if_failed();
  sync_stream(m_ctx->comm);
  sync_stream(m_ctx->compute);
  m_state->check_async();
  m_host->barrier();
}

std::vector<std::string> NcclCommunicator::gather_blobs(const std::string& blob, int root) {
  return m_host->gather_blobs(blob, root);
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, const std::string& child) {
  m_state->throw_if_failed();
  // Both are collective over this group, in the same order on every rank.
  std::unique_ptr<Communicator> host_child = m_host->split(color, key, child);
  auto* mpi_child = dynamic_cast<MpiCommunicator*>(host_child.get());
  if (!mpi_child) throw std::logic_error("nccl: the host communicator did not split into an MPI one");
  host_child.release();
  std::unique_ptr<MpiCommunicator> host(mpi_child);
  auto state = std::make_shared<State>();
  state->name = child;
  state->device = m_ctx->device;
  state->timeout_s = m_state->timeout_s;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  // Non-blocking, NCCL writes the new communicator into `comm` only when the
  // split is done (NCCL_COMM_NULL until then), from a thread of its own. So
  // the split is polled on the parent (as NCCL's guide does) before `comm` is
  // read; one that fails is stopped by the parent's abort first ("a
  // ncclCommSplit operation may be stopped by calling ncclCommAbort on the
  // parent communicator, then on any new communicator returned"), and only
  // then is `comm` read, and aborted if NCCL made one: no write into it
  // comes after this function.
  ncclComm_t comm = nullptr;
  const ncclResult_t rc =
      m_state->locked([&](ncclComm_t parent) { return nccl().split(parent, color, key, &comm, &config); });
  std::string failed;
  try {
    m_state->check(rc, "ncclCommSplit");
  } catch (const std::exception& e) {
    failed = e.what();  // the parent is aborted
  }
  {
    std::lock_guard lock(state->nccl_mutex);
    state->comm = std::atomic_ref<ncclComm_t>(comm).load(std::memory_order_acquire);
  }
  if (failed.empty() && !state->comm) failed = "nccl: ncclCommSplit on " + name() + " made no communicator";
  if (!failed.empty()) {
    state->fail(failed);
    throw std::runtime_error(failed);
  }
  state->check(ncclInProgress, "ncclCommSplit (the new communicator)");
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(Adopt{}, std::move(host), m_ctx, m_rec, std::move(state)));
}

}  // namespace ss::SS_CUDA_NS

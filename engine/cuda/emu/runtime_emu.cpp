// The device runtime of the emulated build (runtime.h): "device" memory is
// host memory, events are host timestamps, and the GEMM is cuBLAS's
// column-major definition computed on the host in fp32 -- so the backend's
// row-major to column-major mapping is checked by the same tests that check
// the kernels.
//
// Each stream has a thread of its own, and what is queued on a stream runs
// there, in order, after the call that queued it has returned: kernels, the
// GEMM, copies on the device, memsets, frees, host functions (the tests' NCCL
// stand-in queues its transfers so, as NCCL's kernels are queued), and waits
// for events recorded on other streams. So two streams run at once, as on a
// GPU, and only the events between them order them: a transfer that does not
// wait for the kernel that writes its input, or a kernel that reads a
// collective's result without waiting for it, reads stale bytes here too.
// The host sees a stream's work only through what waits for it: a copy to
// the host, sync_stream, sync_event. Queued work that throws (a launch of a
// block too large, a barrier the threads of a block do not all reach) leaves
// its stream failed, as a failed kernel leaves a GPU's context: every later
// copy to the host and sync_stream on that stream throws it (the work queued
// after it still runs, so that nothing waiting on the stream hangs).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/runtime.h"

namespace ss::SS_CUDA_NS {
namespace {

// Every event's state, and every stream's queue, under one lock: the
// engine's watchdog asks of events from its own thread. Never destroyed: a
// stream's thread, or the NCCL stand-in's, may still use them as the
// process exits.
std::mutex& g_mutex = *new std::mutex;
std::condition_variable& g_changed = *new std::condition_variable;

struct EmuEvent {
  std::chrono::steady_clock::time_point t;  // when the last recording was reached
  uint64_t recorded = 0;                    // recordings so far, numbered from 1
  std::vector<uint64_t> pending;            // recordings queued behind a stream's work, not yet reached
  int waiters = 0;                          // streams' queued waits for it
  bool reached(uint64_t n) const { return std::find(pending.begin(), pending.end(), n) == pending.end(); }
  bool done() const { return reached(recorded); }
  void reach(uint64_t n) {  // under g_mutex
    pending.erase(std::remove(pending.begin(), pending.end(), n), pending.end());
    if (n == recorded) t = std::chrono::steady_clock::now();  // a later recording supersedes it
  }
};

// A stream's queued work and the thread that runs it (started by the first
// work queued).
struct EmuStream {
  std::deque<std::function<void()>> queued;
  uint64_t posted = 0, finished = 0;  // work queued so far, and run so far
  bool stop = false;
  std::exception_ptr error;  // the first queued work to throw
  std::thread worker;
  bool idle() const { return finished == posted; }
};

thread_local const EmuStream* tl_running = nullptr;  // the stream whose thread this is

void run_queue(EmuStream* s) {
  tl_running = s;
  std::unique_lock lock(g_mutex);
  while (true) {
    g_changed.wait(lock, [&] { return s->stop || !s->queued.empty(); });
    if (s->queued.empty()) return;  // stopped, and nothing left
    std::function<void()> work = std::move(s->queued.front());
    s->queued.pop_front();
    lock.unlock();
    std::exception_ptr failed;
    try {
      work();
    } catch (...) {
      failed = std::current_exception();
    }
    work = nullptr;  // what it held goes before the stream counts as idle
    lock.lock();
    if (failed && !s->error) s->error = failed;
    ++s->finished;
    g_changed.notify_all();
  }
}

void post_locked(EmuStream* st, std::function<void()> work) {
  st->queued.push_back(std::move(work));
  ++st->posted;
  if (!st->worker.joinable()) st->worker = std::thread(run_queue, st);
  g_changed.notify_all();
}

// Queues `work` on `s`; on the null stream (nothing is ever queued there) it
// runs at once.
void post(Stream s, std::function<void()> work) {
  if (!s) return work();
  std::lock_guard lock(g_mutex);
  post_locked(static_cast<EmuStream*>(s), std::move(work));
}

// Waits until `s` has run everything queued on it before this call (work
// other threads queue meanwhile is not waited for); throws the stream's failure.
void drain(Stream s) {
  if (!s) return;
  auto* st = static_cast<EmuStream*>(s);
  if (tl_running == st) throw std::logic_error("emulated stream: work queued on a stream waits for that stream");
  std::unique_lock lock(g_mutex);
  const uint64_t before = st->posted;
  g_changed.wait(lock, [&] { return st->finished >= before; });
  if (std::exception_ptr failed = st->error) {
    lock.unlock();
    std::rethrow_exception(failed);
  }
}

// A column of a column-major operand as fp32.
std::vector<float> widened(const void* p, DType dt, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> out(size_t(rows * cols));
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) out[size_t(c * rows + r)] = load(p, c * ld + r, dt);
  return out;
}

}  // namespace

void check_launch(const char*) {}

// Launches run in their stream's order; the flag only keeps the benchmark's
// two passes the same code.
namespace {
bool g_dependent = true;
}  // namespace
bool dependent_launch() { return g_dependent; }
void set_dependent_launch(bool on) { g_dependent = on; }
bool kernel_waits(const void*) { return true; }

std::string unavailable_reason() { return ""; }
int device_count() { return 1; }
DeviceProps device_props(int) {
  DeviceProps p;
  p.name = "emulated device (host CPU)";
  p.total_bytes = p.free_bytes = int64_t(16) << 30;
  p.cc_major = 9;
  p.sm_count = 1;
  return p;
}
void set_device(int) {}
std::string runtime_version() { return "emulated (no CUDA runtime)"; }

// Stream-ordered: the block is there at once for work queued after; it goes
// once the work queued before its free has run.
void* malloc_device(int64_t bytes, Stream) {
  const size_t rounded = (size_t(bytes) + 255) & ~size_t(255);
  return std::aligned_alloc(256, rounded ? rounded : 256);
}
void free_device(void* p, Stream s) {
  post(s, [p] { std::free(p); });
}
// Copies and memsets of nothing queue nothing, as on a GPU.
// The source is taken as the call returns (as CUDA stages pageable memory);
// the bytes land in stream order.
void copy_to_device(void* dst, const void* src, int64_t bytes, Stream s) {
  if (bytes <= 0) return;
  auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                    static_cast<const char*>(src) + bytes);
  post(s, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
}
void copy_to_host(void* dst, const void* src, int64_t bytes, Stream s) {
  drain(s);
  if (bytes > 0) std::memcpy(dst, src, size_t(bytes));
}
void copy_on_device(void* dst, const void* src, int64_t bytes, Stream s) {
  if (bytes <= 0) return;
  post(s, [=] { std::memmove(dst, src, size_t(bytes)); });
}
void copy_2d_on_device(void* dst, int64_t dpitch, const void* src, int64_t spitch, int64_t width, int64_t rows,
                       Stream s) {
  if (width <= 0 || rows <= 0) return;
  post(s, [=] {
    for (int64_t r = 0; r < rows; ++r)
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, size_t(width));
  });
}
void memset_device(void* p, int value, int64_t bytes, Stream s) {
  if (bytes <= 0) return;
  post(s, [=] { std::memset(p, value, size_t(bytes)); });
}

Stream create_stream() { return new EmuStream; }
void destroy_stream(Stream s) {
  if (!s) return;
  auto* st = static_cast<EmuStream*>(s);
  {
    std::lock_guard lock(g_mutex);
    st->stop = true;  // its thread runs what is queued, then ends
  }
  g_changed.notify_all();
  if (st->worker.joinable()) st->worker.join();
  delete st;
}
void sync_stream(Stream s) { drain(s); }
void launch_host_func(Stream s, void (*fn)(void*), void* arg) {
  post(s, [fn, arg] { fn(arg); });
}

Event create_event() { return new EmuEvent; }
void destroy_event(Event e) {
  auto* ev = static_cast<EmuEvent*>(e);
  {
    // A recording still queued would write into it, a queued wait read it.
    std::unique_lock lock(g_mutex);
    g_changed.wait(lock, [&] { return ev->pending.empty() && ev->waiters == 0; });
  }
  delete ev;
}
void record_event(Event e, Stream s) {
  auto* ev = static_cast<EmuEvent*>(e);
  auto* st = static_cast<EmuStream*>(s);
  std::lock_guard lock(g_mutex);
  const uint64_t n = ++ev->recorded;
  if (!st || st->idle()) {
    ev->reach(n);
    g_changed.notify_all();  // a wait for an earlier recording ends with this one
    return;
  }
  // Reached once the work queued before it has run.
  ev->pending.push_back(n);
  post_locked(st, [ev, n] {
    std::lock_guard inner(g_mutex);
    ev->reach(n);
  });
}
// The work queued on s after this waits for the recording of e made last
// before it (a later recording of e does not move the wait).
void wait_event(Stream s, Event e) {
  auto* ev = static_cast<EmuEvent*>(e);
  std::unique_lock lock(g_mutex);
  const uint64_t n = ev->recorded;
  if (ev->reached(n)) return;
  if (!s) {
    g_changed.wait(lock, [&] { return ev->reached(n); });
    return;
  }
  ++ev->waiters;
  post_locked(static_cast<EmuStream*>(s), [ev, n] {
    std::unique_lock inner(g_mutex);
    g_changed.wait(inner, [&] { return ev->reached(n); });
    --ev->waiters;
  });
}
// Waits for the recording made last before the call (not a later one).
void sync_event(Event e) {
  auto* ev = static_cast<EmuEvent*>(e);
  std::unique_lock lock(g_mutex);
  const uint64_t n = ev->recorded;
  g_changed.wait(lock, [&] { return ev->reached(n); });
}
bool event_done(Event e) {
  auto* ev = static_cast<EmuEvent*>(e);
  std::lock_guard lock(g_mutex);
  return ev->done();
}
double event_elapsed_ms(Event from, Event to) {
  std::lock_guard lock(g_mutex);
  return std::chrono::duration<double, std::milli>(static_cast<EmuEvent*>(to)->t - static_cast<EmuEvent*>(from)->t)
      .count();
}

namespace {
void column_major_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* A,
                       DType at, int64_t lda, const void* B, DType bt, int64_t ldb, float beta, void* C, DType ct,
                       int64_t ldc) {
  // Stored shapes: A is (trans_a ? k x m : m x k), B (trans_b ? n x k : k x n), column-major.
  const std::vector<float> a = widened(A, at, trans_a ? k : m, trans_a ? m : k, lda);
  const std::vector<float> b = widened(B, bt, trans_b ? n : k, trans_b ? k : n, ldb);
  std::vector<float> c = beta != 0 ? widened(C, ct, m, n, ldc) : std::vector<float>(size_t(m * n), 0.0f);
  if (m > 0 && n > 0)
    cblas_sgemm(CblasColMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(m),
                int(n), int(k), alpha, a.data(), std::max(1, int(trans_a ? k : m)), b.data(),
                std::max(1, int(trans_b ? n : k)), beta, c.data(), int(m));
  for (int64_t col = 0; col < n; ++col)
    for (int64_t r = 0; r < m; ++r) store(C, col * ldc + r, ct, c[size_t(col * m + r)]);
}
}  // namespace

Blas::Blas(Stream s) : m_stream(s) {}
Blas::~Blas() = default;

void Blas::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* A, DType at,
                int64_t lda, const void* B, DType bt, int64_t ldb, float beta, void* C, DType ct, int64_t ldc,
                bool) {
  expect(at == bt && (at == DType::F32 || ct == at || ct == DType::F32), "gemm", "unsupported dtype combination");
  post(m_stream, [=] { column_major_gemm(trans_a, trans_b, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc); });
}

}  // namespace ss::SS_CUDA_NS

void ss::emu::enqueue(void* stream, std::function<void()> work) { ss::SS_CUDA_NS::post(stream, std::move(work)); }

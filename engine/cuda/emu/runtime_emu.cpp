// The device runtime of the emulated build (runtime.h): "device" memory is
// host memory, kernels and copies run as they are queued, events are host
// timestamps, and the GEMM is cuBLAS's column-major definition computed on
// the host in fp32 -- so the backend's row-major to column-major mapping is
// checked by the same tests that check the kernels.
//
// Host functions (launch_host_func; the tests' NCCL stand-in queues its
// transfers so, as NCCL's kernels are queued) run later, on a thread of
// their stream, in order. Until they have run, every other call on that
// stream waits for them first, an event recorded behind them is not done,
// and a stream made to wait for that event waits (here: the caller does).
// So the engine's communicator finds its collectives' results late, as on
// a GPU, wherever it reads them without waiting for their event.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
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
  std::chrono::steady_clock::time_point t;
  uint64_t recorded = 0, reached = 0;  // done when the last recording is reached
  int queued = 0;                      // recordings queued behind host work, not yet run
  void reach(uint64_t n) {             // under g_mutex
    if (recorded != n) return;         // a later recording supersedes it
    t = std::chrono::steady_clock::now();
    reached = n;
  }
};

// A stream's queued host work and the thread that runs it (started by the
// first host function queued).
struct EmuStream {
  std::deque<std::function<void()>> queued;
  bool running = false, stop = false;
  std::thread worker;
  bool idle() const { return queued.empty() && !running; }
};

void run_queue(EmuStream* s) {
  std::unique_lock lock(g_mutex);
  while (true) {
    g_changed.wait(lock, [&] { return s->stop || !s->queued.empty(); });
    if (s->queued.empty()) return;  // stopped, and nothing left
    std::function<void()> work = std::move(s->queued.front());
    s->queued.pop_front();
    s->running = true;
    lock.unlock();
    work();
    lock.lock();
    s->running = false;
    g_changed.notify_all();
  }
}

// Waits until `s` has run every host function queued on it.
void drain(Stream s) {
  if (!s) return;
  auto* st = static_cast<EmuStream*>(s);
  std::unique_lock lock(g_mutex);
  g_changed.wait(lock, [&] { return st->idle(); });
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

// Launches run one after another here; the flag only keeps the benchmark's
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

void* malloc_device(int64_t bytes, Stream s) {
  drain(s);
  const size_t rounded = (size_t(bytes) + 255) & ~size_t(255);
  return std::aligned_alloc(256, rounded ? rounded : 256);
}
void free_device(void* p, Stream s) {
  drain(s);
  std::free(p);
}
void copy_to_device(void* dst, const void* src, int64_t bytes, Stream s) {
  drain(s);
  std::memcpy(dst, src, size_t(bytes));
}
void copy_to_host(void* dst, const void* src, int64_t bytes, Stream s) {
  drain(s);
  std::memcpy(dst, src, size_t(bytes));
}
void copy_on_device(void* dst, const void* src, int64_t bytes, Stream s) {
  drain(s);
  std::memmove(dst, src, size_t(bytes));
}
void copy_2d_on_device(void* dst, int64_t dpitch, const void* src, int64_t spitch, int64_t width, int64_t rows,
                       Stream s) {
  drain(s);
  for (int64_t r = 0; r < rows; ++r)
    std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, size_t(width));
}
void memset_device(void* p, int value, int64_t bytes, Stream s) {
  drain(s);
  std::memset(p, value, size_t(bytes));
}

Stream create_stream() { return new EmuStream; }
void destroy_stream(Stream s) {
  if (!s) return;
  auto* st = static_cast<EmuStream*>(s);
  {
    std::lock_guard lock(g_mutex);
    st->stop = true;  // its worker runs what is queued, then ends
  }
  g_changed.notify_all();
  if (st->worker.joinable()) st->worker.join();
  delete st;
}
void sync_stream(Stream s) { drain(s); }
void launch_host_func(Stream s, void (*fn)(void*), void* arg) {
  if (!s) return fn(arg);  // the null stream: nothing is ever queued on it here
  auto* st = static_cast<EmuStream*>(s);
  std::lock_guard lock(g_mutex);
  st->queued.push_back([fn, arg] { fn(arg); });
  if (!st->worker.joinable()) st->worker = std::thread(run_queue, st);
  g_changed.notify_all();
}

Event create_event() { return new EmuEvent; }
void destroy_event(Event e) {
  auto* ev = static_cast<EmuEvent*>(e);
  {
    std::unique_lock lock(g_mutex);  // a recording still queued would write into it
    g_changed.wait(lock, [&] { return ev->queued == 0; });
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
  // Reached once the host work before it has run.
  ++ev->queued;
  st->queued.push_back([ev, n] {
    std::lock_guard inner(g_mutex);
    --ev->queued;
    ev->reach(n);
  });
}
// The stream's later work runs on the caller's thread, so the caller waits.
void wait_event(Stream, Event e) { sync_event(e); }
void sync_event(Event e) {
  auto* ev = static_cast<EmuEvent*>(e);
  std::unique_lock lock(g_mutex);
  g_changed.wait(lock, [&] { return ev->reached == ev->recorded; });
}
bool event_done(Event e) {
  auto* ev = static_cast<EmuEvent*>(e);
  std::lock_guard lock(g_mutex);
  return ev->reached == ev->recorded;
}
double event_elapsed_ms(Event from, Event to) {
  std::lock_guard lock(g_mutex);
  return std::chrono::duration<double, std::milli>(static_cast<EmuEvent*>(to)->t - static_cast<EmuEvent*>(from)->t)
      .count();
}

Blas::Blas(Stream s) : m_stream(s) {}
Blas::~Blas() = default;

void Blas::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* A, DType at,
                int64_t lda, const void* B, DType bt, int64_t ldb, float beta, void* C, DType ct, int64_t ldc,
                bool) {
  drain(m_stream);
  expect(at == bt && (at == DType::F32 || ct == at || ct == DType::F32), "gemm", "unsupported dtype combination");
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

}  // namespace ss::SS_CUDA_NS

// A kernel launched on a stream starts after the stream's queued host work.
void ss::emu::drain_stream(void* stream) { ss::SS_CUDA_NS::drain(stream); }

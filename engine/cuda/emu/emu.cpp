// The emulator's scheduler: a block's threads as fibers on the launching
// thread (its stream's), switched only at barriers (emu.h says why).
#include "cuda/emu/emu.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define SS_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SS_EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define SS_EMU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SS_EMU_TSAN 1
#endif
#endif
#ifdef SS_EMU_TSAN
// ThreadSanitizer's fibers: each emulated thread keeps its own shadow call
// stack (on the launching thread's, the frames a fiber left at its end
// piled up over launches until TSan's stack overflowed). Every switch
// orders memory, as the barriers the switches stand for do.
extern "C" void* __tsan_get_current_fiber();
extern "C" void* __tsan_create_fiber(unsigned flags);
extern "C" void __tsan_switch_to_fiber(void* fiber, unsigned flags);
extern "C" void __tsan_destroy_fiber(void* fiber);
// A fiber's first and last frames (fiber_entry, and switch_to_main as it
// ends) never return: uninstrumented, they leave nothing on its shadow stack
// (GCC's no_sanitize leaves out the function's entry and exit hooks too,
// clang's does not).
#if defined(__clang__)
#define SS_EMU_NO_TSAN __attribute__((disable_sanitizer_instrumentation))
#else
#define SS_EMU_NO_TSAN __attribute__((no_sanitize("thread")))
#endif
#else
#define SS_EMU_NO_TSAN
#endif
#ifdef SS_EMU_ASAN
extern "C" void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old, size_t* size_old);
extern "C" void __asan_unpoison_memory_region(void const volatile* addr, size_t size);
#endif

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

// The context switch: the callee-saved registers pushed on the current
// stack, the stack pointer saved to *from and `to` loaded, the target's
// registers popped (x86-64 System V). ucontext's swapcontext would also save
// the signal mask, a system call at every switch.
extern "C" void ss_emu_switch(void** from, void* to);
asm(R"(
  .text
  .globl ss_emu_switch
  .type ss_emu_switch,@function
ss_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ss_emu_switch, .-ss_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");

namespace ss::emu {
namespace {

constexpr size_t kStackBytes = 256 * 1024;  // reserved, committed as touched
constexpr size_t kEntryFrames = 16 * 1024;  // above any frames fiber_entry and switch_to_main take
constexpr unsigned kMaxThreads = 1024;

enum class State { Ready, AtBlockBarrier, AtWarpBarrier, Done };
// Threads: each thread in turn to its next barrier; Reverse: the same from
// the last thread; Warps: a warp at a time as far as it can go (through its
// warp barriers, up to a __syncthreads) before the next starts, so a read of
// another warp's writes that no block barrier or cp.async wait orders shows.
enum class Order { Threads, Reverse, Warps };

struct Fiber {
  void* sp = nullptr;  // saved stack pointer while switched out
  void* stack = nullptr;
#ifdef SS_EMU_TSAN
  void* tsan = nullptr;
#endif
  dim3 tid;
  State state = State::Ready;
};

// One block in flight on this host thread.
struct Block {
  std::vector<Fiber>* fibers = nullptr;
  unsigned count = 0;
  unsigned current = 0;
  void* main_sp = nullptr;
  const std::function<void()>* body = nullptr;
  std::vector<uint64_t> exchange;  // a slot per thread, for shuffles
  // cp.async per thread: the copies issued since its last commit, and its
  // committed groups, oldest first; a copy lands only when a wait lets it.
  struct AsyncCopy {
    void* dst;
    unsigned char bytes[16];
  };
  std::vector<std::vector<AsyncCopy>> async_open;
  std::vector<std::vector<std::vector<AsyncCopy>>> async_groups;  // empty ones allocate nothing
  std::vector<unsigned char> smem_bytes;
  unsigned char* smem = nullptr;  // 128-byte aligned, as a GPU's shared memory window
#ifdef SS_EMU_ASAN
  const void* main_bottom = nullptr;
  size_t main_size = 0;
#endif
#ifdef SS_EMU_TSAN
  void* main_tsan = nullptr;
#endif
};

thread_local Block* tl_block = nullptr;

// A host thread's fibers, reused across its launches; their stacks go with
// the thread (a stream's thread ends with its stream).
struct Fibers : std::vector<Fiber> {
  ~Fibers() {
    for (Fiber& f : *this) {
#ifdef SS_EMU_TSAN
      __tsan_destroy_fiber(f.tsan);
#endif
#ifdef SS_EMU_ASAN
      // The frames a fiber ended in never returned, so their redzones are
      // still poisoned, and ASan does not see munmap: a later mapping at
      // this address (a new thread's stack and TLS, which glibc maps
      // without its interceptor) would inherit them, and a write to a
      // __shared__ array there read as a stack-buffer-underflow (seen once
      // in tst_cuda_ops_emu, on a stream thread's TLS).
      __asan_unpoison_memory_region(f.stack, kStackBytes);
#endif
      munmap(f.stack, kStackBytes);
    }
  }
};
thread_local Fibers tl_fibers;

SS_EMU_NO_TSAN void switch_to_main(Fiber& f, bool exiting) {
  Block& b = *tl_block;
#ifdef SS_EMU_TSAN
  __tsan_switch_to_fiber(b.main_tsan, 0);
#endif
#ifdef SS_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(exiting ? nullptr : &fake, b.main_bottom, b.main_size);
  ss_emu_switch(&f.sp, b.main_sp);
  // Resumed by the launching thread: the stack it left is its own.
  __sanitizer_finish_switch_fiber(fake, &b.main_bottom, &b.main_size);
#else
  (void)exiting;
  ss_emu_switch(&f.sp, b.main_sp);
#endif
}

SS_EMU_NO_TSAN void fiber_entry() {
  Block& b = *tl_block;
#ifdef SS_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &b.main_bottom, &b.main_size);
#endif
  Fiber& f = (*b.fibers)[b.current];
  (*b.body)();
  f.state = State::Done;
  switch_to_main(f, true);
}

void resume(Block& b, unsigned i) {
  Fiber& f = (*b.fibers)[i];
  b.current = i;
  threadIdx = f.tid;
#ifdef SS_EMU_TSAN
  __tsan_switch_to_fiber(f.tsan, 0);
#endif
#ifdef SS_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack, kStackBytes);
  ss_emu_switch(&b.main_sp, f.sp);
  // Back on the launching thread's stack. The stack left behind is the
  // fiber's: main_bottom/main_size keep the launching thread's, which a
  // fiber's next switch back names as its target (taking the fiber's here
  // had ASan treat the fiber's stack as this thread's after a barrier, and
  // report false stack-buffer underflows once an exception unwound).
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  ss_emu_switch(&b.main_sp, f.sp);
#endif
}

std::string where() {
  return "block (" + std::to_string(blockIdx.x) + "," + std::to_string(blockIdx.y) + "," +
         std::to_string(blockIdx.z) + ")";
}

// Opens the warp barrier of the warp starting at thread w0 if all its lanes
// wait there; throws if some lanes left without reaching it.
bool open_warp_barrier(Block& b, unsigned w0) {
  std::vector<Fiber>& fs = *b.fibers;
  const unsigned w1 = std::min(b.count, w0 + 32);
  unsigned waiting = 0, gone = 0;
  for (unsigned i = w0; i < w1; ++i) {
    waiting += fs[i].state == State::AtWarpBarrier;
    gone += fs[i].state == State::Done;
  }
  if (waiting == 0 || waiting + gone < w1 - w0) return false;
  if (gone > 0)
    throw std::runtime_error("emulated kernel: lanes of warp " + std::to_string(w0 / 32) + " in " + where() +
                             " wait at a warp barrier (__syncwarp or a shuffle) that " + std::to_string(gone) +
                             " lanes left without reaching it");
  for (unsigned i = w0; i < w1; ++i) fs[i].state = State::Ready;
  return true;
}

// Opens the barriers every thread they wait for has reached. Returns whether
// any thread can run again; throws for a barrier that can never open.
bool open_barriers(Block& b) {
  std::vector<Fiber>& fs = *b.fibers;
  unsigned at_block = 0, done = 0;
  for (unsigned i = 0; i < b.count; ++i) {
    at_block += fs[i].state == State::AtBlockBarrier;
    done += fs[i].state == State::Done;
  }
  bool opened = false;
  if (at_block > 0 && at_block + done == b.count) {
    if (done > 0)
      throw std::runtime_error("emulated kernel: " + std::to_string(at_block) + " threads of " + where() +
                               " wait at __syncthreads that " + std::to_string(done) +
                               " threads left without reaching it");
    for (unsigned i = 0; i < b.count; ++i) fs[i].state = State::Ready;
    return true;
  }
  for (unsigned w0 = 0; w0 < b.count; w0 += 32) opened = open_warp_barrier(b, w0) || opened;
  return opened;
}

void run_block(Block& b, Order order) {
  std::vector<Fiber>& fs = *b.fibers;
  for (unsigned i = 0; i < b.count; ++i) {
    // A fresh stack whose first switch "returns" into fiber_entry: six zero
    // registers, the entry's address, then a zero return address for it, so
    // that it starts with the stack aligned as after a call.
    Fiber& f = fs[i];
    f.state = State::Ready;
#ifdef SS_EMU_ASAN
    // The last fiber on this stack ended inside fiber_entry and
    // switch_to_main, whose frames never returned and so keep their redzones
    // poisoned, at the top of the stack where the new fiber's first frames
    // fall (clang's ASan reported a kernel's parameter copy there as an
    // overflow). Every deeper frame returned and unpoisoned itself.
    __asan_unpoison_memory_region(static_cast<char*>(f.stack) + kStackBytes - kEntryFrames, kEntryFrames);
#endif
    auto* top = reinterpret_cast<uintptr_t*>(static_cast<char*>(f.stack) + kStackBytes);
    top[-1] = 0;
    top[-2] = reinterpret_cast<uintptr_t>(&fiber_entry);
    for (int r = 3; r <= 8; ++r) top[-r] = 0;
    f.sp = top - 8;
  }
  for (;;) {
    bool ran = false;
    if (order == Order::Warps) {
      // A warp at a time, through its warp barriers, up to its next
      // __syncthreads (or its end) before the next warp starts.
      for (unsigned w0 = 0; w0 < b.count; w0 += 32)
        do {
          for (unsigned i = w0; i < std::min(b.count, w0 + 32); ++i)
            if (fs[i].state == State::Ready) {
              resume(b, i);
              ran = true;
            }
        } while (open_warp_barrier(b, w0));
    } else {
      for (unsigned k = 0; k < b.count; ++k) {
        const unsigned i = order == Order::Reverse ? b.count - 1 - k : k;
        if (fs[i].state != State::Ready) continue;
        resume(b, i);
        ran = true;
      }
    }
    bool all_done = true;
    for (unsigned i = 0; i < b.count; ++i) all_done = all_done && fs[i].state == State::Done;
    if (all_done) return;
    if (!open_barriers(b) && !ran)
      throw std::runtime_error("emulated kernel: the threads of " + where() +
                               " wait at different barriers (a __syncthreads inside a warp barrier's divergence)");
  }
}

Order run_order() {
  static const Order order = [] {
    const char* e = std::getenv("SHARDSCOPE_EMU_ORDER");
    const std::string v = e ? e : "";
    return v == "reverse" ? Order::Reverse : v == "warps" ? Order::Warps : Order::Threads;
  }();
  return order;
}

}  // namespace

void launch(dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
  const unsigned count = block.x * block.y * block.z;
  if (count == 0 || count > kMaxThreads)
    throw std::runtime_error("emulated launch: a block of " + std::to_string(count) + " threads (1 to 1024)");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;  // an empty grid is an error on a GPU; callers skip it
  if (tl_block) throw std::runtime_error("emulated launch from inside a kernel");
  while (tl_fibers.size() < count) {
    Fiber f;
    f.stack = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (f.stack == MAP_FAILED) throw std::runtime_error("emulated launch: no memory for a fiber stack");
#ifdef SS_EMU_TSAN
    f.tsan = __tsan_create_fiber(0);
#endif
    tl_fibers.push_back(f);
  }
  Block b;
  b.fibers = &tl_fibers;
  b.count = count;
  b.body = &body;
  b.exchange.assign(count, 0);
  unsigned i = 0;
  for (unsigned z = 0; z < block.z; ++z)
    for (unsigned y = 0; y < block.y; ++y)
      for (unsigned x = 0; x < block.x; ++x) tl_fibers[i++].tid = dim3(x, y, z);
  b.smem_bytes.assign(smem + 128, 0xff);
  b.smem = b.smem_bytes.data() + (128 - reinterpret_cast<uintptr_t>(b.smem_bytes.data()) % 128) % 128;
  gridDim = grid;
  blockDim = block;
#ifdef SS_EMU_TSAN
  b.main_tsan = __tsan_get_current_fiber();
#endif
  tl_block = &b;
  struct Reset {
    ~Reset() { tl_block = nullptr; }
  } reset;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        blockIdx = dim3(bx, by, bz);
        std::fill(b.smem, b.smem + smem, 0xff);
        b.async_open.assign(count, {});  // copies still in flight when a block ends land nowhere it reads
        b.async_groups.assign(count, {});
        run_block(b, run_order());
      }
}

void* dynamic_smem() { return tl_block ? tl_block->smem : nullptr; }

namespace {
// What each kernel opted in to, as cudaFuncSetAttribute keeps it (a process's
// launchers share it, as they share a GPU's kernels).
std::mutex& g_smem_mutex = *new std::mutex;
std::unordered_map<const void*, size_t>& g_smem_allowed = *new std::unordered_map<const void*, size_t>;
}  // namespace

void allow_smem(const char* name, const void* kernel, size_t bytes) {
  if (bytes > kSmemOptIn)
    throw std::runtime_error(std::string(name) + ": a block needs " + std::to_string((bytes + 1023) >> 10) +
                             " KiB of shared memory; the emulated GPU allows " + std::to_string(kSmemOptIn >> 10) +
                             " KiB (the least of the GPUs this build runs on)");
  std::lock_guard lock(g_smem_mutex);
  g_smem_allowed[kernel] = bytes;
}

void check_smem(const void* kernel, size_t bytes) {
  if (bytes <= kSmemDefault) return;
  std::lock_guard lock(g_smem_mutex);
  const auto it = g_smem_allowed.find(kernel);
  if (it == g_smem_allowed.end() || it->second < bytes)
    throw std::runtime_error("emulated launch: " + std::to_string(bytes) +
                             " bytes of dynamic shared memory, past the 48 KiB a block has, with " +
                             (it == g_smem_allowed.end() ? std::string("no opt-in")
                                                         : "an opt-in of " + std::to_string(it->second)) +
                             " (allow_smem)");
}

void sync_block() {
  Block& b = *tl_block;
  Fiber& f = (*b.fibers)[b.current];
  f.state = State::AtBlockBarrier;
  switch_to_main(f, false);
}

void sync_warp() {
  Block& b = *tl_block;
  Fiber& f = (*b.fibers)[b.current];
  f.state = State::AtWarpBarrier;
  switch_to_main(f, false);
}

uint64_t warp_exchange(uint64_t value, int src) {
  Block& b = *tl_block;
  const unsigned me = b.current, base = me - me % 32;
  b.exchange[me] = value;
  sync_warp();
  const unsigned from = base + unsigned(src);
  const uint64_t got = from < b.count ? b.exchange[from] : value;
  sync_warp();  // nobody overwrites a slot before every lane has read
  return got;
}

void async_copy16(void* dst, const void* src, bool fill) {
  Block& b = *tl_block;
  Block::AsyncCopy c{dst, {}};
  if (fill) std::memcpy(c.bytes, src, 16);  // the source is read as the copy is issued
  b.async_open[b.current].push_back(c);
}

void async_commit() {
  Block& b = *tl_block;
  b.async_groups[b.current].push_back(std::move(b.async_open[b.current]));
  b.async_open[b.current].clear();
}

void async_wait(int in_flight) {
  Block& b = *tl_block;
  auto& groups = b.async_groups[b.current];
  while (int(groups.size()) > in_flight) {
    for (const Block::AsyncCopy& c : groups.front()) std::memcpy(c.dst, c.bytes, 16);
    groups.erase(groups.begin());  // a few groups at most
  }
}

void warp_gather(const void* mine, size_t bytes, void* all) {
  Block& b = *tl_block;
  const unsigned me = b.current, base = me - me % 32;
  if (base + 32 > b.count) throw std::runtime_error("emulated warp-wide operation in a partial warp");
  b.exchange[me] = reinterpret_cast<uintptr_t>(mine);
  sync_warp();  // every lane's operand is in place (on its own fiber's stack, paused here)
  for (unsigned i = 0; i < 32; ++i)
    std::memcpy(static_cast<char*>(all) + i * bytes, reinterpret_cast<const void*>(b.exchange[base + i]), bytes);
  sync_warp();  // nobody changes its operand before every lane has read it
}

}  // namespace ss::emu

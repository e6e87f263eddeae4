#include "cpu/host_blocks.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <deque>
#include <list>
#include <mutex>
#include <new>
#include <unordered_map>

// Under AddressSanitizer a kept block is poisoned until it is handed out
// again, so a use after free of a tensor still fails there.
#if defined(__SANITIZE_ADDRESS__)
#define SS_HOST_BLOCKS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SS_HOST_BLOCKS_ASAN 1
#endif
#endif
#ifdef SS_HOST_BLOCKS_ASAN
#include <sanitizer/asan_interface.h>
#define SS_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define SS_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define SS_POISON(p, n) ((void)(p), (void)(n))
#define SS_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace ss::cpu {
namespace {

// Each block's data is preceded by a 64-byte header holding its rounded size
// and the address the block was allocated at, so the data stays 64-byte
// aligned and host_free knows what it frees.
constexpr size_t kHeader = 64;
struct Header {
  size_t size;
  void* base;
};

// Blocks of a huge page or more are mapped with their data on a huge-page
// boundary, and the whole huge pages inside are offered to the kernel as
// transparent huge pages. A first touch costs one fault per 2 MiB instead of
// one per 4 KiB: measured here, 10.5 us per 4 KiB fault against ~120 us per
// 2 MiB one (0.23 us per 4 KiB of it), which loading weights and a first
// prefill's activations otherwise pay hundreds of thousands of times. The
// tail of a block stays in 4 KiB pages, so no huge page is backed by memory
// the block does not use; the header sits alone in the 4 KiB page before
// the data.
constexpr size_t kHugePage = size_t(2) << 20;
// Under AddressSanitizer every block comes from its allocator, whose
// redzones catch an access past a tensor's end.
#ifdef SS_HOST_BLOCKS_ASAN
constexpr bool kMapHuge = false;
#else
constexpr bool kMapHuge = true;
#endif

size_t mapped_bytes(size_t size) {
  return (size + kHugePage - 1) / kHugePage * kHugePage + kHugePage;
}

Header& header_of(void* p) {
  return *reinterpret_cast<Header*>(static_cast<char*>(p) - kHeader);
}

void* fresh_block(size_t size) {
  if (!kMapHuge || size < kHugePage) {
    void* base = std::aligned_alloc(64, size + kHeader);
    if (!base) throw std::bad_alloc();
    void* p = static_cast<char*>(base) + kHeader;
    header_of(p) = {size, base};
    return p;
  }
  // Mapped fresh (a heap block could reuse pages already faulted in 4 KiB),
  // one huge page more than the data, so the data can start on one.
  void* base = mmap(nullptr, mapped_bytes(size), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t first = (reinterpret_cast<uintptr_t>(base) + kHeader + kHugePage - 1) & ~uintptr_t(kHugePage - 1);
  void* p = reinterpret_cast<void*>(first);
#ifdef MADV_HUGEPAGE
  // Advice only: where transparent huge pages are off, the pages stay 4 KiB.
  madvise(p, size / kHugePage * kHugePage, MADV_HUGEPAGE);
#endif
  header_of(p) = {size, base};
  return p;
}

void release(void* p) {
  const Header h = header_of(p);
  if (!kMapHuge || h.size < kHugePage)
    std::free(h.base);
  else
    munmap(h.base, mapped_bytes(h.size));
}

// The kept blocks in the order they were freed, and by size (each size's
// oldest first), so a request finds its block without a walk over all of
// them (up to kCacheBytes / kMinCachedBytes).
struct Cache {
  using Blocks = std::list<std::pair<size_t, void*>>;  // (size, data), most recently freed first
  std::mutex mutex;
  Blocks blocks;
  std::unordered_map<size_t, std::deque<Blocks::iterator>> by_size;
  size_t bytes = 0;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: tensors may outlive static destruction order
  return *c;
}

}  // namespace

void* host_alloc(int64_t bytes) {
  const size_t size = (size_t(bytes) + 63) & ~size_t(63);
  if (size >= kMinCachedBytes) {
    Cache& c = cache();
    std::lock_guard lock(c.mutex);
    if (auto found = c.by_size.find(size); found != c.by_size.end()) {
      const auto it = found->second.back();  // the most recently freed: its pages likeliest still cached
      found->second.pop_back();
      if (found->second.empty()) c.by_size.erase(found);
      void* p = it->second;
      c.bytes -= size;
      c.blocks.erase(it);
      SS_UNPOISON(p, size);
      return p;
    }
  }
  return fresh_block(size);
}

void host_free(void* p) {
  if (!p) return;
  const Header h = header_of(p);
  if (h.size >= kMinCachedBytes && h.size <= kCacheBytes) {
    Cache& c = cache();
    std::lock_guard lock(c.mutex);
    SS_POISON(p, h.size);
    c.blocks.emplace_front(h.size, p);
    c.by_size[h.size].push_back(c.blocks.begin());
    c.bytes += h.size;
    while (c.bytes > kCacheBytes) {
      const auto [size, last] = c.blocks.back();
      // The oldest block of all is the oldest of its size.
      auto same = c.by_size.find(size);
      same->second.pop_front();
      if (same->second.empty()) c.by_size.erase(same);
      c.bytes -= size;
      SS_UNPOISON(last, size);
      release(last);
      c.blocks.pop_back();
    }
    return;
  }
  release(p);
}

size_t host_cached_bytes() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  return c.bytes;
}

}  // namespace ss::cpu

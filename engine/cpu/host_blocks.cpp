#include "cpu/host_blocks.h"

#include <cstdlib>
#include <list>
#include <mutex>
#include <new>

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

// Each block starts with a 64-byte header holding its rounded size, so the
// data stays 64-byte aligned and host_free knows what it frees.
constexpr size_t kHeader = 64;

struct Cache {
  std::mutex mutex;
  std::list<std::pair<size_t, void*>> blocks;  // (size, block), most recently freed first
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
    for (auto it = c.blocks.begin(); it != c.blocks.end(); ++it)
      if (it->first == size) {
        void* block = it->second;
        c.bytes -= size;
        c.blocks.erase(it);
        SS_UNPOISON(static_cast<char*>(block) + kHeader, size);
        return static_cast<char*>(block) + kHeader;
      }
  }
  void* block = std::aligned_alloc(64, size + kHeader);
  if (!block) throw std::bad_alloc();
  *static_cast<size_t*>(block) = size;
  return static_cast<char*>(block) + kHeader;
}

void host_free(void* p) {
  if (!p) return;
  void* block = static_cast<char*>(p) - kHeader;
  const size_t size = *static_cast<size_t*>(block);
  if (size >= kMinCachedBytes && size <= kCacheBytes) {
    Cache& c = cache();
    std::lock_guard lock(c.mutex);
    SS_POISON(p, size);
    c.blocks.emplace_front(size, block);
    c.bytes += size;
    while (c.bytes > kCacheBytes) {
      c.bytes -= c.blocks.back().first;
      SS_UNPOISON(static_cast<char*>(c.blocks.back().second) + kHeader, c.blocks.back().first);
      std::free(c.blocks.back().second);
      c.blocks.pop_back();
    }
    return;
  }
  std::free(block);
}

size_t host_cached_bytes() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  return c.bytes;
}

}  // namespace ss::cpu

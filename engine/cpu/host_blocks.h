// Host memory for the cpu backend's tensors, 64-byte aligned.
//
// glibc maps every large block fresh (mmap) and unmaps it on free, so a
// buffer the model allocates again and again (a tsp ring's shard buffers each
// layer, a prefill's activations, a training step's gradients) starts from
// untouched pages each time: one page fault per 4 KiB on first touch, in the
// kernel, on the same cores as the GEMMs. On a virtual machine a fault costs
// tens of microseconds (measured here: a small-llama tsp run on 2 ranks took
// 425k faults against tp's 249k, and decoded at 400-600 ms a token instead of
// 60-90). Freed blocks of at least kMinCachedBytes are kept and handed out
// again to a request of the same rounded size; at most kCacheBytes wait in
// all, the least recently freed leave first. The floor is 64 KiB, not the
// 1 MiB it was: glibc hands blocks from 128 KiB up back to the system on
// free (and trims its heap's top), so tsp's K and V gathered each layer (512
// KiB at 4 ranks) came in fresh pages every time, and a transfer into fresh
// pages is slow: 4 ranks on 2 cores gathering 512 KiB took 3.7 ms after the
// last arrival into fresh buffers against 0.25 ms into reused ones, and in
// tsp launches the K gather's 3.4 ms came down to 0.2-1.4 ms. Like a GPU
// framework's caching allocator, it changes where bytes come from, never what is accounted: the
// Allocator charges every tensor as before; peak RSS may exceed the accounted
// peak by at most kCacheBytes. Blocks of 2 MiB and more are mapped on their
// own with their whole 2 MiB pages as transparent huge pages: one fault per
// 2 MiB instead of 512 (host_blocks.cpp; a small-llama tp launch on 2 ranks,
// loading included: 235k faults before, 39k after).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ss::cpu {

inline constexpr size_t kMinCachedBytes = size_t(64) << 10;
inline constexpr size_t kCacheBytes = size_t(64) << 20;

void* host_alloc(int64_t bytes);
void host_free(void* p);

// Bytes of freed blocks waiting for reuse (for tests and bench).
size_t host_cached_bytes();

}  // namespace ss::cpu

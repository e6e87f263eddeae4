// splitmix64's finaliser (Steele, Lea and Flood, "Fast splittable
// pseudorandom number generators", 2014): a counter hashed into 64 well-mixed
// bits. Synthetic weights, corpus shuffles and sampling draws are all
// counter-based on it, so any element or step can be drawn on its own.
#pragma once

#include <cstdint>

namespace ss {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace ss

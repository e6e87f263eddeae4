// Choosing the next token from a row of logits: greedy (the argmax), or a
// draw from softmax(logits / temperature) over the top_k largest (all when
// top_k is 0). The draw is a counter-based hash of (seed, sequence, step),
// so every strategy that computes the same logits picks the same token, and
// a run repeats exactly with the same seed.
#pragma once

#include <cstdint>
#include <span>

namespace ss {

struct Sampling {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: every token
  bool greedy() const { return temperature == 0.0f; }
};

// Refuses a temperature that is negative or not finite, a negative top_k,
// and top_k without a temperature (one line naming the option).
void validate_sampling(const Sampling& s);

// The token drawn from `logits` (fp32, one row) for decode step `step` of
// sequence `sequence`. Ties in the top_k cut go to the lower id.
int32_t sample_token(std::span<const float> logits, const Sampling& s, uint64_t seed, uint64_t sequence,
                     uint64_t step);

}  // namespace ss

// All-reduce with quantized hops (DESIGN.md, "Quantized collectives"): a
// reduce-scatter and an all-gather, each carrying block-quantized data. Each
// rank splits the buffer into D chunks and quantizes chunk j for rank j (its
// own chunk, which never leaves it, stays fp32); an all-to-all delivers them;
// each rank adds the others' dequantized contributions to its own chunk in
// fp32, requantizes the sum, and an all-gather (in place) returns every summed
// chunk, which every rank dequantizes, its own included. Built only on
// Communicator primitives, so it runs wherever they do (MPI, the simulated
// network).
#pragma once

#include "comm/communicator.h"
#include "comm/quantize.h"
#include "core/backend.h"

namespace ss {

struct WireBytes {
  double sent = 0;    // bytes this rank put on the wire (values + scales)
  double fp32 = 0;    // what an fp32 ring all-reduce of the same buffer sends
  double bf16 = 0;    // what a bf16 one sends
  double native = 0;  // what one in the buffer's own dtype (the run's) sends: the baseline
};

// Reduces `buf` (contiguous, in the run's dtype) in place over `comm`; the
// sums are fp32 whatever the dtype. `counter` seeds the
// stochastic rounding of this call (distinct per call). The plain cast of the
// buffer's dtype is the ordinary all_reduce; fp32 on a bf16/fp16 buffer
// reduces an fp32 copy.
WireBytes quantized_all_reduce(Communicator& comm, Backend& be, const Tensor& buf, const QuantSpec& spec,
                               uint64_t counter);

// The bytes quantized_all_reduce sends per rank for n values over d ranks:
// 2 (d-1) padded chunk payloads (all-to-all, then all-gather).
// The buffer's own precision sends a ring all-reduce in `dtype`, fp32 one in fp32.
double quantized_all_reduce_wire(int64_t n, int d, const QuantSpec& spec, DType dtype = DType::F32);

}  // namespace ss

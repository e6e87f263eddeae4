#include "comm/communicator.h"

namespace ss {

double wire_bytes(const std::string& op, double bytes, int ranks) {
  if (ranks <= 1) return 0;
  const double n = ranks;
  if (op == "all_reduce") return 2 * (n - 1) / n * bytes;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") return (n - 1) / n * bytes;
  return bytes;  // broadcast (from the root), send, sendrecv
}

bool gathers_in_place(const Tensor& out, const Tensor& in, int rank) {
  return in.numel() > 0 && static_cast<const char*>(in.raw()) == static_cast<const char*>(out.raw()) + rank * in.nbytes();
}

bool buffers_overlap(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const char* pa = static_cast<const char*>(a.raw());
  const char* pb = static_cast<const char*>(b.raw());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

}  // namespace ss

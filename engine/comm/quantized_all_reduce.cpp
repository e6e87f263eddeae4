#include "comm/quantized_all_reduce.h"

namespace ss {
namespace {

int64_t carrier_words(int64_t n, int d, const QuantSpec& s) {
  const int64_t chunk = (n + d - 1) / d;  // the largest chunk
  return (quantized_bytes(chunk, s) + 3) / 4;
}

}  // namespace

double quantized_all_reduce_wire(int64_t n, int d, const QuantSpec& s) {
  if (d <= 1) return 0;
  if (s.is_plain()) return wire_bytes("all_reduce", 4.0 * double(n), d);
  return 2.0 * (d - 1) * 4.0 * double(carrier_words(n, d, s));
}

WireBytes quantized_all_reduce(Communicator& comm, Backend& be, const Tensor& buf, const QuantSpec& s,
                               uint64_t counter) {
  const int64_t n = buf.numel();
  const int D = comm.size(), me = comm.rank();
  WireBytes w;
  w.fp32 = wire_bytes("all_reduce", 4.0 * double(n), D);
  w.bf16 = wire_bytes("all_reduce", 2.0 * double(n), D);
  if (D <= 1) return w;
  if (s.is_plain()) {
    comm.all_reduce(buf);
    w.sent = w.fp32;
    return w;
  }
  const Tensor flat = buf.reshape({n});
  auto begin = [&](int c) { return n * c / D; };
  auto length = [&](int c) { return begin(c + 1) - begin(c); };
  const int64_t words = carrier_words(n, D, s);
  Tensor send = be.alloc({int64_t(D), words}, Category::CommBuffers, "quant.send");
  Tensor recv = be.alloc({int64_t(D), words}, Category::CommBuffers, "quant.recv");
  // Hop 1 (reduce-scatter): chunk j, quantized, goes to rank j. Each rank
  // draws its own rounding noise, so the contributors' errors cancel (~sqrt D).
  const uint64_t rank_counter = counter + (uint64_t(me + 1) << 40);
  for (int c = 0; c < D; ++c)
    be.quantize(send.slice(0, c, 1).reshape({words}), flat.slice(0, begin(c), length(c)), s,
                rank_counter + uint64_t(begin(c)));
  comm.all_to_all(recv, send);
  Tensor mine = flat.slice(0, begin(me), length(me));
  be.dequantize(mine, recv.slice(0, 0, 1).reshape({words}), s, false);
  for (int r = 1; r < D; ++r) be.dequantize(mine, recv.slice(0, r, 1).reshape({words}), s, true);
  // Hop 2 (all-gather): the summed chunk, requantized.
  Tensor q = be.alloc({words}, Category::CommBuffers, "quant.chunk");
  be.quantize(q, mine, s, counter + uint64_t(n) + uint64_t(begin(me)));
  comm.all_gather(recv.reshape({int64_t(D) * words}), q);
  for (int c = 0; c < D; ++c)
    be.dequantize(flat.slice(0, begin(c), length(c)), recv.slice(0, c, 1).reshape({words}), s, false);
  w.sent = quantized_all_reduce_wire(n, D, s);
  return w;
}

}  // namespace ss

#include "comm/quantized_all_reduce.h"

namespace ss {
namespace {

int64_t carrier_words(int64_t n, int d, const QuantSpec& s) {
  const int64_t chunk = (n + d - 1) / d;  // the largest chunk
  return (quantized_bytes(chunk, s) + 3) / 4;
}

}  // namespace

double quantized_all_reduce_wire(int64_t n, int d, const QuantSpec& s, DType dtype) {
  if (d <= 1) return 0;
  if (s.precision == precision_of(dtype)) return wire_bytes("all_reduce", double(dtype_size(dtype)) * double(n), d);
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
  w.native = wire_bytes("all_reduce", double(buf.nbytes()), D);
  if (D <= 1) return w;
  // The buffer's own dtype: the ordinary all-reduce.
  if (s.precision == precision_of(buf.dtype())) {
    comm.all_reduce(buf);
    w.sent = w.native;
    return w;
  }
  // fp32 for a narrower buffer: the sum travels in fp32 (4 bytes a value) and
  // is rounded once into the buffer.
  if (s.is_plain()) {
    Tensor wide = be.alloc(buf.shape(), Category::CommBuffers, "allreduce.fp32", DType::F32);
    be.copy(wide, buf);
    comm.all_reduce(wide);
    be.copy(buf, wide);
    w.sent = w.fp32;
    return w;
  }
  const Tensor flat = buf.reshape({n});
  auto begin = [&](int c) { return n * c / D; };
  auto length = [&](int c) { return begin(c + 1) - begin(c); };
  auto chunk = [&](int c) { return flat.slice(0, begin(c), length(c)); };
  const int64_t words = carrier_words(n, D, s);
  Tensor send = be.alloc({int64_t(D), words}, Category::CommBuffers, "quant.send");
  Tensor recv = be.alloc({int64_t(D), words}, Category::CommBuffers, "quant.recv");
  auto row = [&](const Tensor& t, int c) { return t.slice(0, c, 1).reshape({words}); };
  // Hop 1 (reduce-scatter): chunk c, quantized, goes to rank c. Each rank
  // draws its own rounding noise, so the contributors' errors cancel (~sqrt D).
  // A rank's own chunk never travels: it stays exact in `buf` and its row of
  // the all-to-all is not read.
  const uint64_t rank_counter = counter + (uint64_t(me + 1) << 40);
  for (int c = 0; c < D; ++c)
    if (c != me) be.quantize(row(send, c), chunk(c), s, rank_counter + uint64_t(begin(c)));
  comm.all_to_all(recv, send);
  // The fp32 sum of the chunk: own values plus every other rank's
  // dequantized (in an fp32 accumulator when the run's dtype is narrower).
  const Tensor mine = chunk(me);
  Tensor sum = mine;
  if (buf.dtype() != DType::F32) {
    sum = be.alloc({length(me)}, Category::CommBuffers, "quant.sum", DType::F32);
    be.copy(sum, mine);
  }
  for (int r = 0; r < D; ++r)
    if (r != me) be.dequantize(sum, row(recv, r), s, true);
  // Hop 2 (all-gather, in place in `recv`): the summed chunk, requantized;
  // every rank, this one included, takes every chunk from the same bytes, so
  // all ranks end with the same values.
  be.quantize(row(recv, me), sum, s, counter + uint64_t(n) + uint64_t(begin(me)));
  comm.all_gather(recv.reshape({int64_t(D) * words}), row(recv, me));
  for (int c = 0; c < D; ++c) be.dequantize(chunk(c), row(recv, c), s, false);
  w.sent = quantized_all_reduce_wire(n, D, s, buf.dtype());
  return w;
}

}  // namespace ss

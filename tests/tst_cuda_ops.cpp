// Every kernel of the cuda backend against the cpu backend, in the style of
// ggml's test-backend-ops: the same random inputs on both, the op through the
// public Backend methods on each, the results compared. Shapes include odd
// sizes, lengths that are not a multiple of a tile or chunk, strided views
// whose padding holds NaN (a kernel that reads it poisons its result; one
// that writes it is caught directly), and every compute dtype (the suite
// runs three times: fp32, bf16, fp16). The training kernels' cases are in
// cuda_train_ops.cpp, run by this executable after these in each pass.
//
// Built twice (tests/CMakeLists.txt): tst_cuda_ops_emu runs the kernels'
// own source on the host under the thread-model emulator (engine/cuda/emu)
// on every machine; tst_cuda_ops runs the nvcc build on a GPU and, without
// one, says "skipped: no CUDA device".
//
// Tolerance: tst_kernels bounds the cpu backend's relative L2 error against
// float64 at u + 1e-5 for an output rounded once to the dtype (u = 2^-8 for
// bf16, 2^-11 for fp16) and 2u + 1e-5 for one rounded twice; the cuda
// kernels round their outputs the same way, so the two backends differ by at
// most twice that. fp32 is held to 1e-5. Quantized bytes must be equal.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "comm/quantize.h"
#include "cuda_twins.h"
#ifdef SHARDSCOPE_CUDA_EMULATED
#include "cuda/common.cuh"
namespace {
__global__ void emu_nothing() {}
// What `call` throws as a runtime_error ("" when it returns).
std::string thrown(const std::function<void()>& call) {
  try {
    call();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}
__global__ void emu_smem() {  // writes the first byte of its dynamic shared memory
  SS_DYNAMIC_SMEM(unsigned char, smem);
  if (threadIdx.x == 0) smem[0] = 1;
}
}  // namespace
#endif

int run_cuda_train_ops(int argc, char** argv);  // cuda_train_ops.cpp

class TestCudaOps : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() {
    if (const QString why = no_device(); !why.isEmpty()) QSKIP(qPrintable(why));
  }

  // A host function queued on a stream (how the tests' NCCL stand-in queues
  // its transfers under the emulator) holds back an event recorded behind
  // it until it has run; sync_event returns only after it.
  void hostFunctionHoldsTheStream() {
    struct Gate {
      std::atomic<bool> open{false}, ran{false};
    } gate;
    const dev::Stream s = dev::create_stream();
    const dev::Event e = dev::create_event();
    dev::launch_host_func(
        s,
        [](void* arg) {
          auto* g = static_cast<Gate*>(arg);
          while (!g->open) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          g->ran = true;
        },
        &gate);
    dev::record_event(e, s);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const bool done_before = dev::event_done(e);
    gate.open = true;
    dev::sync_event(e);
    const bool ran = gate.ran, done_after = dev::event_done(e);
    dev::destroy_event(e);
    dev::destroy_stream(s);
    QVERIFY2(!done_before, "an event recorded behind a host function that has not run is done");
    QVERIFY2(ran, "sync_event returned before the host function ran");
    QVERIFY(done_after);
  }

  // Two streams run at once; only an event orders one after the other. The
  // second stream's own work runs while a host function holds the first. A
  // copy on the second, made to wait for an event recorded on the first
  // behind that host function and a memset, starts after both, even once the
  // event is recorded again elsewhere (a wait takes the recording made before
  // it): it is not done while the first stream is held, and it copies the
  // memset's bytes, not the ones before.
  void waitEventOrdersStreams() {
    struct Gate {
      std::atomic<bool> open{false};
    } gate;
    constexpr int64_t kBytes = 4096;
    const dev::Stream first = dev::create_stream(), second = dev::create_stream(), third = dev::create_stream();
    const dev::Event written = dev::create_event(), early = dev::create_event(), copied = dev::create_event();
    void* src = dev::malloc_device(kBytes, first);
    void* dst = dev::malloc_device(kBytes, second);
    void* scratch = dev::malloc_device(kBytes, second);
    dev::memset_device(src, 0, kBytes, first);
    dev::memset_device(dst, 0, kBytes, second);
    dev::sync_stream(first);
    dev::sync_stream(second);
    dev::launch_host_func(
        first,
        [](void* arg) {
          auto* g = static_cast<Gate*>(arg);
          while (!g->open) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        },
        &gate);
    dev::memset_device(src, 0x5a, kBytes, first);
    dev::record_event(written, first);
    dev::memset_device(scratch, 1, kBytes, second);  // the second stream's own work, before its wait
    dev::record_event(early, second);
    dev::wait_event(second, written);
    dev::record_event(written, third);  // done at once: the wait above is for the first recording
    dev::copy_on_device(dst, src, kBytes, second);
    dev::record_event(copied, second);
    bool ran_alongside = false;
    for (int i = 0; i < 2000 && !ran_alongside; ++i) {
      ran_alongside = dev::event_done(early);
      if (!ran_alongside) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const bool done_early = dev::event_done(copied);
    gate.open = true;
    std::vector<unsigned char> back(kBytes);
    dev::copy_to_host(back.data(), dst, kBytes, second);
    dev::free_device(src, first);
    for (void* p : {dst, scratch}) dev::free_device(p, second);
    for (dev::Stream st : {first, second, third}) dev::sync_stream(st);
    for (dev::Event e : {written, early, copied}) dev::destroy_event(e);
    for (dev::Stream st : {first, second, third}) dev::destroy_stream(st);
    QVERIFY2(ran_alongside, "the second stream's work did not run while a host function held the first");
    QVERIFY2(!done_early, "a copy made to wait for an event on a held stream finished first");
    QVERIFY2(std::all_of(back.begin(), back.end(), [](unsigned char b) { return b == 0x5a; }),
             "the copy ran before the memset it waited for");
  }

  // The emulator runs a stream's work on the stream's thread: a launch that
  // fails there (a block of 2048 threads) returns, and fails its stream, as
  // a failed kernel fails a GPU's context: every later copy to the host and
  // sync on that stream throws the reason; the work queued after it still
  // runs; other streams go on. (moc sees no build's macros: the slot is in
  // both builds.)
  void emulatedFailureFailsTheStream() {
#ifndef SHARDSCOPE_CUDA_EMULATED
    QSKIP("the emulator's own check (on a GPU the launch itself fails)");
#else
    const dev::Stream s = dev::create_stream(), other = dev::create_stream();
    std::atomic<bool> after{false};
    bool launch_threw = false;
    try {
      SS_LAUNCH(emu_nothing, 1, 2048, 0, s)();
    } catch (const std::exception&) {
      launch_threw = true;
    }
    dev::launch_host_func(s, [](void* flag) { *static_cast<std::atomic<bool>*>(flag) = true; }, &after);
    int32_t word = 0;
    const std::string by_copy = thrown([&] { dev::copy_to_host(&word, &word, sizeof word, s); });
    const std::string by_sync = thrown([&] { dev::sync_stream(s); });
    const std::string by_other = thrown([&] { dev::sync_stream(other); });
    dev::destroy_stream(s);
    dev::destroy_stream(other);
    QVERIFY2(!launch_threw, "the failing launch threw where it was queued");
    QVERIFY2(by_copy.find("a block of 2048 threads") != std::string::npos, by_copy.c_str());
    QVERIFY2(by_sync == by_copy, "a later sync of the failed stream did not throw the failure again");
    QVERIFY2(after, "the work queued after the failure did not run");
    QVERIFY2(by_other.empty(), "another stream failed with it");
#endif
  }

  // Dynamic shared memory past 48 KiB needs the kernel's opt-in, up to the
  // least of the GPUs the build runs on: without it the launch is refused
  // where it is made (a GPU refuses it too), with it the launch runs, and an
  // opt-in past the limit is refused naming the launcher.
  void sharedMemoryPastTheDefaultNeedsOptIn() {
#ifndef SHARDSCOPE_CUDA_EMULATED
    QSKIP("the emulator's own check (on a GPU, allow_smem and the launch are the driver's)");
#else
    using ss::emu::kSmemDefault;
    using ss::emu::kSmemOptIn;
    const dev::Stream s = dev::create_stream();
    const size_t past = kSmemDefault + 16;
    dev::allow_smem("test", emu_smem, 0);  // as a process starts (the suite runs once a dtype)
    const std::string fits = thrown([&] { SS_LAUNCH(emu_smem, 1, 32, kSmemDefault, s)(); });
    const std::string unasked = thrown([&] { SS_LAUNCH(emu_smem, 1, 32, past, s)(); });
    dev::allow_smem("test", emu_smem, past);
    const std::string asked = thrown([&] { SS_LAUNCH(emu_smem, 1, 32, past, s)(); });
    const std::string beyond_ask = thrown([&] { SS_LAUNCH(emu_smem, 1, 32, past + 16, s)(); });
    const std::string too_much = thrown([&] { dev::allow_smem("test", emu_smem, kSmemOptIn + 1); });
    const std::string ran = thrown([&] { dev::sync_stream(s); });
    dev::destroy_stream(s);
    QVERIFY2(fits.empty(), fits.c_str());
    QVERIFY2(unasked.find("past the 48 KiB a block has, with an opt-in of 0") != std::string::npos, unasked.c_str());
    QVERIFY2(asked.empty(), asked.c_str());
    QVERIFY2(beyond_ask.find("an opt-in of") != std::string::npos, beyond_ask.c_str());
    QVERIFY2(too_much.find("test: a block needs 100 KiB") != std::string::npos, too_much.c_str());
    QVERIFY2(ran.empty(), ran.c_str());
#endif
  }

  void matmul_data() {
    QTest::addColumn<int>("M");
    QTest::addColumn<int>("N");
    QTest::addColumn<int>("K");
    QTest::addColumn<bool>("accumulate");
    QTest::addColumn<bool>("f32_out");
    QTest::addColumn<bool>("aligned");  // x's rows 16-byte aligned: a few rows take gemv.cu, not cuBLAS
    QTest::newRow("square") << 64 << 64 << 64 << false << false << false;
    QTest::newRow("odd") << 37 << 53 << 29 << false << false << false;
    QTest::newRow("decode row") << 1 << 300 << 96 << false << false << false;
    QTest::newRow("decode row, aligned") << 1 << 300 << 96 << false << false << true;
    QTest::newRow("3 rows, accumulate, aligned") << 3 << 257 << 136 << true << false << true;
    QTest::newRow("2 rows, long K, aligned") << 2 << 70 << 4104 << false << false << true;
    QTest::newRow("one output, aligned") << 1 << 1 << 64 << false << false << true;
    QTest::newRow("logits in fp32, aligned") << 1 << 130 << 48 << false << true << true;
    QTest::newRow("accumulate") << 17 << 40 << 24 << true << false << false;
    QTest::newRow("logits in fp32") << 9 << 130 << 48 << false << true << false;
  }
  void matmul() {
    QFETCH(int, M);
    QFETCH(int, N);
    QFETCH(int, K);
    QFETCH(bool, accumulate);
    QFETCH(bool, f32_out);
    QFETCH(bool, aligned);
    Rigs r;
    const Twin x = r.random_mat(M, K, aligned ? 8 : 3), w = r.random({N, K}, 0.2);
    Twin y = r.random_mat(M, N, 2, 1.0, f32_out ? DType::F32 : g_dtype);
    r.cpu.matmul(y.c, x.c, w.c, accumulate);
    r.gpu.matmul(y.d, x.d, w.d, accumulate);
    VERIFY_TWIN_TOL(r, y, "matmul", tolerance(accumulate ? 2 : 1));
  }

  void matmul_group_data() {
    QTest::addColumn<int>("M");
    QTest::addColumn<int>("groups");
    QTest::addColumn<bool>("aligned");  // aligned, 1 to 4 rows and up to 4 products: one gemv launch
    QTest::newRow("decode q, k, v, aligned") << 1 << 3 << true;
    QTest::newRow("4 rows, 4 products, aligned") << 4 << 4 << true;
    QTest::newRow("5 products, aligned") << 2 << 5 << true;
    QTest::newRow("decode, strided") << 1 << 3 << false;
    QTest::newRow("prefill") << 33 << 2 << true;
  }
  void matmul_group() {
    QFETCH(int, M);
    QFETCH(int, groups);
    QFETCH(bool, aligned);
    Rigs r;
    const int64_t K = 136, rows[] = {300, 70, 1, 130, 41};
    const Twin x = r.random_mat(M, K, aligned ? 8 : 3);
    std::vector<Twin> ws, ys;
    for (int i = 0; i < groups; ++i) {
      ws.push_back(r.random({rows[i], K}, 0.2));
      ys.push_back(r.random_mat(M, rows[i], 2, 1.0, i == 2 ? DType::F32 : g_dtype));
    }
    for (const bool cpu : {true, false}) {
      std::vector<Tensor> y, w;
      for (int i = 0; i < groups; ++i) {
        y.push_back(ys[size_t(i)].on(cpu));
        w.push_back(ws[size_t(i)].on(cpu));
      }
      (cpu ? static_cast<ss::Backend&>(r.cpu) : r.gpu).matmul_group(y, x.on(cpu), w);
    }
    for (int i = 0; i < groups; ++i) VERIFY_TWIN(r, ys[size_t(i)], "matmul_group");
  }

  void elementwise_data() {
    QTest::addColumn<bool>("aligned");  // 16-byte aligned rows of whole pieces: the vectorised kernels
    QTest::newRow("strided") << false;
    QTest::newRow("aligned") << true;
  }
  void elementwise() {
    QFETCH(bool, aligned);
    Rigs r;
    const int64_t T = 23, C = aligned ? 80 : 77;
    const Twin a = r.random_mat(T, C, aligned ? 8 : 1), b = r.random_mat(T, C, aligned ? 16 : 2);
    Twin y = r.mat(T, C, aligned ? 8 : 3, std::vector<float>(size_t(T * C), 0.0f));
    r.cpu.add(y.c, a.c, b.c);
    r.gpu.add(y.d, a.d, b.d);
    VERIFY_TWIN(r, y, "add");
    r.cpu.silu_mul(y.c, a.c, b.c);
    r.gpu.silu_mul(y.d, a.d, b.d);
    VERIFY_TWIN(r, y, "silu_mul");
    const Twin bias = r.random({C});
    r.cpu.add_bias(y.c, bias.c);
    r.gpu.add_bias(y.d, bias.d);
    VERIFY_TWIN_TOL(r, y, "add_bias", tolerance(2));
    // copy: strided within a dtype, and across dtypes (rounding once)
    Twin z = r.mat(T, C, aligned ? 8 : 2, std::vector<float>(size_t(T * C), 0.0f));
    r.cpu.copy(z.c, a.c);
    r.gpu.copy(z.d, a.d);
    VERIFY_TWIN(r, z, "copy");
    Twin wide = r.filled({T, C}, 0.0f, DType::F32);
    r.cpu.copy(wide.c, a.c);
    r.gpu.copy(wide.d, a.d);
    VERIFY_TWIN(r, wide, "copy to fp32");
    Twin narrow = r.filled({T, C}, 0.0f, DType::BF16);
    r.cpu.copy(narrow.c, wide.c);
    r.gpu.copy(narrow.d, wide.d);
    VERIFY_TWIN_TOL(r, narrow, "copy to bf16", 0.0);  // both round to nearest even: equal
    r.cpu.fill(z.c, 0.375f);
    r.gpu.fill(z.d, 0.375f);
    VERIFY_TWIN_TOL(r, z, "fill", 0.0);
    // embedding and argmax
    const int64_t V = 50;
    const Twin table = r.random({V, C});
    const std::vector<int32_t> tokens = {3, 0, 49, 3, 17, 22, 8};
    Twin e = r.filled({int64_t(tokens.size()), C}, 0.0f);
    r.cpu.embedding(e.c, table.c, tokens);
    r.gpu.embedding(e.d, table.d, tokens);
    VERIFY_TWIN_TOL(r, e, "embedding", 0.0);
    const Twin logits = r.random({3, 1000}, 1.0, DType::F32);
    for (int64_t row = 0; row < 3; ++row) QCOMPARE(r.gpu.argmax_row(logits.d, row), r.cpu.argmax_row(logits.c, row));
    // ties go to the lowest index, as the cpu's scan does
    std::vector<float> tie(1000, 0.0f);
    tie[911] = tie[12] = tie[500] = 4.0f;
    const Twin t = r.make({1, 1000}, tie, DType::F32);
    QCOMPARE(r.gpu.argmax_row(t.d, 0), 12);
  }

  void norms_data() {
    QTest::addColumn<int>("T");
    QTest::addColumn<int>("cols");
    QTest::addColumn<int>("group");
    QTest::addColumn<bool>("gated");
    QTest::addColumn<bool>("weight");
    QTest::addColumn<bool>("aligned");  // whole rows in 16-byte pieces: the vectorised kernel
    QTest::newRow("rmsnorm") << 19 << 96 << 96 << false << true << false;
    QTest::newRow("rmsnorm, aligned") << 19 << 96 << 96 << false << true << true;
    QTest::newRow("rmsnorm wide") << 3 << 1100 << 1100 << false << true << false;
    QTest::newRow("rmsnorm 4096, aligned") << 3 << 4096 << 4096 << false << true << true;
    QTest::newRow("rmsnorm 9000, aligned (too wide)") << 2 << 9000 << 9000 << false << true << true;
    QTest::newRow("no weight") << 5 << 64 << 64 << false << false << false;
    QTest::newRow("no weight, aligned") << 5 << 64 << 64 << false << false << true;
    QTest::newRow("groups") << 7 << 120 << 40 << false << true << false;
    QTest::newRow("gated") << 11 << 128 << 128 << true << true << false;
    QTest::newRow("gated, aligned") << 11 << 136 << 136 << true << true << true;
    QTest::newRow("gated groups") << 6 << 96 << 24 << true << true << false;
  }
  void norms() {
    QFETCH(int, T);
    QFETCH(int, cols);
    QFETCH(int, group);
    QFETCH(bool, gated);
    QFETCH(bool, weight);
    QFETCH(bool, aligned);
    Rigs r;
    const Twin x = r.random_mat(T, cols, aligned ? 8 : 2), z = r.random_mat(T, cols, aligned ? 16 : 1);
    const Twin w = r.make({cols}, r.randn(cols, 0.2, 1.0));
    Twin y = r.mat(T, cols, aligned ? 8 : 1, std::vector<float>(size_t(T * cols), 0.0f));
    if (gated) {
      r.cpu.gated_rmsnorm(y.c, x.c, z.c, w.c, 1e-5f, group);
      r.gpu.gated_rmsnorm(y.d, x.d, z.d, w.d, 1e-5f, group);
    } else {
      r.cpu.rmsnorm(y.c, x.c, weight ? w.c : Tensor{}, 1e-5f, group);
      r.gpu.rmsnorm(y.d, x.d, weight ? w.d : Tensor{}, 1e-5f, group);
    }
    VERIFY_TWIN(r, y, "rmsnorm");
  }

  // The gated norm whose groups span ranks: sums of squares, then apply.
  void gated_norm_spanning() {
    Rigs r;
    const int64_t T = 9, n = 48, local = 16, n_slots = 6, slot0 = 2;
    const Twin x = r.random_mat(T, n, 1), z = r.random_mat(T, n, 2), w = r.random({n}, 0.3);
    Twin ss = r.filled({T, n_slots}, kNaN, DType::F32);
    r.cpu.gated_norm_sumsq(ss.c, x.c, z.c, local, slot0);
    r.gpu.gated_norm_sumsq(ss.d, x.d, z.d, local, slot0);
    VERIFY_TWIN_TOL(r, ss, "gated_norm_sumsq", 1e-5);
    Twin y = r.filled({T, n}, 0.0f);
    r.cpu.gated_rmsnorm_apply(y.c, x.c, z.c, w.c, ss.c, 1e-5f, local, 2 * local, slot0);
    r.gpu.gated_rmsnorm_apply(y.d, x.d, z.d, w.d, ss.d, 1e-5f, local, 2 * local, slot0);
    VERIFY_TWIN(r, y, "gated_rmsnorm_apply");
  }

  void rope_data() {
    QTest::addColumn<int>("nh");
    QTest::addColumn<int>("hd");
    QTest::addColumn<int>("pad");  // 8: 16-byte aligned rows, the kernel that takes 8 pairs a thread
    QTest::newRow("width 12, strided") << 3 << 12 << 2;
    QTest::newRow("width 32, aligned") << 3 << 32 << 8;
    QTest::newRow("width 128, aligned") << 2 << 128 << 8;
  }
  void rope() {
    QFETCH(int, nh);
    QFETCH(int, hd);
    QFETCH(int, pad);
    Rigs r;
    const std::vector<int32_t> pos = {0, 5, 6, 7, 100, 4097, 65000};
    std::vector<double> inv_freq(size_t(hd / 2));
    for (int i = 0; i < hd / 2; ++i) inv_freq[size_t(i)] = std::pow(10000.0, -2.0 * i / hd);
    Twin x = r.random_mat(int64_t(pos.size()), nh * hd, pad);
    r.cpu.rope(x.c, nh, hd, pos, inv_freq);
    r.gpu.rope(x.d, nh, hd, pos, inv_freq);
    VERIFY_TWIN(r, x, "rope");
  }

  // A Mamba's fp32 residual normed into the block's dtype (the vectorised
  // kernel's mixed form).
  void rmsnormFp32Residual() {
    Rigs r;
    const int64_t T = 5, cols = 136;
    const Twin x = r.random_mat(T, cols, 8, 1.0, DType::F32);
    const Twin w = r.make({cols}, r.randn(cols, 0.2, 1.0));
    Twin y = r.mat(T, cols, 8, std::vector<float>(size_t(T * cols), 0.0f));
    r.cpu.rmsnorm(y.c, x.c, w.c, 1e-5f, cols);
    r.gpu.rmsnorm(y.d, x.d, w.d, 1e-5f, cols);
    VERIFY_TWIN(r, y, "rmsnorm fp32 -> dtype");
  }

  void attention_data() {
    QTest::addColumn<int>("Tq");
    QTest::addColumn<int>("Tk");
    QTest::addColumn<int>("heads");
    QTest::addColumn<int>("kv_heads");
    QTest::addColumn<int>("head_dim");
    // causal, zigzag, decode, all-visible; sharp: causal with scores 8x
    // larger, so a row's max keeps jumping and the prefill rescales O; late:
    // the keys start at position 40, so the first 40 queries see none
    QTest::addColumn<QString>("positions");
    // K and V views: 16-byte aligned rows (as the caches are) take the decode
    // and the vectorised prefill loads; the padded ones the scalar paths.
    QTest::addColumn<bool>("aligned");
    QTest::newRow("prefill 64") << 100 << 100 << 4 << 2 << 64 << "causal" << false;
    QTest::newRow("prefill 64, aligned") << 100 << 100 << 4 << 2 << 64 << "causal" << true;
    QTest::newRow("prefill 128") << 70 << 70 << 2 << 1 << 128 << "causal" << false;
    QTest::newRow("prefill 128, aligned") << 150 << 150 << 2 << 1 << 128 << "causal" << true;
    QTest::newRow("odd width 12") << 37 << 37 << 4 << 4 << 12 << "causal" << false;
    QTest::newRow("sharp, aligned") << 150 << 150 << 2 << 1 << 128 << "sharp" << true;
    QTest::newRow("sharp 64") << 130 << 130 << 2 << 2 << 64 << "sharp" << false;
    QTest::newRow("width 80") << 45 << 45 << 2 << 2 << 80 << "causal" << false;
    QTest::newRow("width 160") << 20 << 20 << 2 << 1 << 160 << "causal" << false;
    QTest::newRow("zigzag rank") << 64 << 128 << 4 << 2 << 64 << "zigzag" << false;
    QTest::newRow("zigzag rank, aligned") << 64 << 200 << 4 << 2 << 128 << "zigzag" << true;
    QTest::newRow("decode, keys split") << 1 << 700 << 4 << 2 << 64 << "decode" << false;
    QTest::newRow("decode, aligned, split") << 1 << 700 << 4 << 2 << 64 << "decode" << true;
    QTest::newRow("decode 3, width 128") << 3 << 520 << 2 << 2 << 128 << "decode" << false;
    QTest::newRow("decode 3, width 128, aligned") << 3 << 1500 << 4 << 2 << 128 << "decode" << true;
    QTest::newRow("decode, width 256, aligned") << 1 << 333 << 2 << 1 << 256 << "decode" << true;
    QTest::newRow("decode, a kv head a head, aligned") << 1 << 1001 << 3 << 3 << 128 << "decode" << true;
    QTest::newRow("decode, a kv head a head, width 64, aligned") << 1 << 130 << 2 << 2 << 64 << "decode" << true;
    QTest::newRow("decode, groups of 4, aligned") << 1 << 900 << 8 << 2 << 64 << "decode" << true;
    QTest::newRow("short cache") << 2 << 9 << 2 << 1 << 32 << "decode" << false;
    QTest::newRow("short cache, aligned") << 2 << 9 << 2 << 1 << 32 << "decode" << true;
    QTest::newRow("late keys, groups of 4, aligned") << 140 << 150 << 8 << 2 << 64 << "late" << true;
    QTest::newRow("late keys 128") << 90 << 70 << 4 << 1 << 128 << "late" << false;
    QTest::newRow("all visible") << 66 << 80 << 2 << 2 << 64 << "all" << false;
    QTest::newRow("all visible, aligned") << 5 << 80 << 2 << 2 << 64 << "all" << true;
  }
  void attention() {
    QFETCH(int, Tq);
    QFETCH(int, Tk);
    QFETCH(int, heads);
    QFETCH(int, kv_heads);
    QFETCH(int, head_dim);
    QFETCH(QString, positions);
    QFETCH(bool, aligned);
    Rigs r;
    std::vector<int32_t> qp, kp;
    if (positions == "causal" || positions == "sharp") {
      qp = kp = iota_pos(Tq);
    } else if (positions == "zigzag") {
      qp = zigzag_pos(2 * Tq, 2, 1);
      kp = iota_pos(Tk);
    } else if (positions == "late") {
      qp = iota_pos(Tq);
      kp = iota_pos(Tk, 40);
    } else if (positions == "decode") {
      kp = iota_pos(Tk);
      qp = iota_pos(Tq, Tk - Tq);
    } else {
      kp = iota_pos(Tk);
      qp = std::vector<int32_t>(size_t(Tq), Tk);
    }
    const Twin q = r.random_mat(Tq, heads * head_dim, aligned ? 8 : 4), k = r.random_mat(Tk, kv_heads * head_dim, aligned ? 8 : 2),
               v = r.random_mat(Tk, kv_heads * head_dim, aligned ? 8 : 1);
    Twin o = r.mat(Tq, heads * head_dim, 3, std::vector<float>(size_t(Tq * heads * head_dim), 0.0f));
    Twin lse = r.filled({Tq, heads}, 0.0f, DType::F32);
    ss::AttentionArgs a;
    a.n_heads = heads;
    a.n_kv_heads = kv_heads;
    a.head_dim = head_dim;
    a.scale = float((positions == "sharp" ? 8.0 : 1.0) / std::sqrt(double(head_dim)));
    a.q_pos = qp;
    a.k_pos = kp;
    r.cpu.attention(o.c, q.c, k.c, v.c, a, lse.c);
    // A launch before, of other queries into another output: the decode
    // kernel's tickets must be back at zero for the next launch, whose merge
    // must not read this one's partials.
    const Twin before = r.mat(Tq, heads * head_dim, 1, std::vector<float>(size_t(Tq * heads * head_dim), 0.0f)),
               q_before = r.random_mat(Tq, heads * head_dim, aligned ? 8 : 4);
    r.gpu.attention(before.d, q_before.d, k.d, v.d, a);
    r.gpu.attention(o.d, q.d, k.d, v.d, a, lse.d);
    VERIFY_TWIN(r, o, "attention");
    r.cpu.attention(before.c, q_before.c, k.c, v.c, a);
    VERIFY_TWIN(r, before, "attention (the launch before)");
    // A row that sees no key has lse -inf on both sides; those are compared
    // exactly, then set aside (-inf has no relative error).
    std::vector<float> lg = r.gpu_values(lse), lc = r.cpu_values(lse);
    for (size_t i = 0; i < lc.size(); ++i) {
      QVERIFY2((lc[i] == -INFINITY) == (lg[i] == -INFINITY),
               qPrintable(QStringLiteral("lse %1: %2 vs cpu %3").arg(i).arg(lg[i]).arg(lc[i])));
      if (lc[i] == -INFINITY) lg[i] = lc[i] = 0.0f;
    }
    const double lse_err = rel_l2(lg, lc), lse_tol = g_dtype == DType::F32 ? 1e-5 : 1e-3;
    QVERIFY2(lse_err <= lse_tol,
             qPrintable(QStringLiteral("lse: cuda vs cpu relative L2 %1 > %2").arg(lse_err).arg(lse_tol)));
    QVERIFY(r.padding_intact(lse));
  }

  void attention_merge() {
    Rigs r;
    const int64_t T = 13;
    const int nh = 3, hd = 20;
    Twin o = r.random_mat(T, nh * hd, 1);
    const Twin o2 = r.random_mat(T, nh * hd, 2);
    std::vector<float> l1 = r.randn(T * nh, 2.0, 0.0, DType::F32), l2 = r.randn(T * nh, 2.0, 0.0, DType::F32);
    l1[4] = -INFINITY;
    l1[5] = l2[5] = -INFINITY;  // nothing visible in either
    Twin lse = r.make({T, nh}, l1, DType::F32);
    const Twin lse2 = r.make({T, nh}, l2, DType::F32);
    r.cpu.attention_merge(o.c, lse.c, o2.c, lse2.c, nh, hd);
    r.gpu.attention_merge(o.d, lse.d, o2.d, lse2.d, nh, hd);
    VERIFY_TWIN_TOL(r, o, "attention_merge", tolerance(2));
    QCOMPARE(r.gpu_values(lse)[5], -INFINITY);
    std::vector<float> a = r.gpu_values(lse), b = r.cpu_values(lse);
    a[4] = a[5] = b[4] = b[5] = 0;
    QVERIFY(rel_l2(a, b) <= 1e-6);
  }

  void conv1d_data() {
    QTest::addColumn<int>("T");
    QTest::addColumn<int>("K");
    QTest::addColumn<bool>("state");
    QTest::addColumn<bool>("silu");
    QTest::addColumn<bool>("aligned");  // 16-byte aligned rows of 8-value pieces: the windowed kernel (K 2 to 4)
    QTest::newRow("prefill") << 33 << 4 << true << true << false;
    QTest::newRow("no state, no bias") << 20 << 4 << false << false << false;
    QTest::newRow("decode 1") << 1 << 4 << true << true << false;
    QTest::newRow("decode 2, width 3") << 2 << 3 << true << true << false;
    QTest::newRow("prefill, 3 tiles, aligned") << 37 << 4 << true << true << true;
    QTest::newRow("no state, no bias, aligned") << 20 << 4 << false << false << true;
    QTest::newRow("decode 1, aligned") << 1 << 4 << true << true << true;
    QTest::newRow("decode 2, width 3, aligned") << 2 << 3 << true << true << true;
    QTest::newRow("width 2, aligned") << 17 << 2 << true << false << true;
    QTest::newRow("width 5, aligned (too wide)") << 9 << 5 << true << true << true;
  }
  void conv1d() {
    QFETCH(int, T);
    QFETCH(int, K);
    QFETCH(bool, state);
    QFETCH(bool, silu);
    QFETCH(bool, aligned);
    Rigs r;
    const int64_t C = aligned ? 88 : 70;
    const Twin x = r.random_mat(T, C, aligned ? 8 : 2), w = r.random({C, K}, 0.4), b = r.random({C}, 0.1);
    Twin st = r.random({K - 1, C});
    Twin y = r.mat(T, C, aligned ? 16 : 1, std::vector<float>(size_t(T * C), 0.0f));
    r.cpu.conv1d_causal(y.c, x.c, w.c, silu ? b.c : Tensor{}, state ? st.c : Tensor{}, silu);
    r.gpu.conv1d_causal(y.d, x.d, w.d, silu ? b.d : Tensor{}, state ? st.d : Tensor{}, silu);
    VERIFY_TWIN(r, y, "conv1d");
    if (state) VERIFY_TWIN_TOL(r, st, "conv state", 0.0);
  }

  void ssd_scan_data() {
    QTest::addColumn<int>("T");
    QTest::addColumn<bool>("state");
    QTest::addColumn<int>("head_dim");
    QTest::addColumn<int>("d_state");
    QTest::newRow("decode") << 1 << true << 16 << 32;
    QTest::newRow("few tokens, no state") << 5 << false << 16 << 32;
    QTest::newRow("one chunk") << 64 << true << 16 << 32;
    QTest::newRow("chunks and a tail") << 150 << true << 24 << 40;
    QTest::newRow("wide state") << 70 << false << 8 << 96;
    // Past one tile of 64 state rows p and one piece of 64 state columns n,
    // each ending partway (a piece of 6: the sums' steps of 4 read zeros).
    QTest::newRow("wide heads, two pieces") << 130 << true << 80 << 70;
    QTest::newRow("mamba2's head and state") << 100 << true << 64 << 128;
  }
  void ssd_scan() {
    QFETCH(int, T);
    QFETCH(bool, state);
    QFETCH(int, head_dim);
    QFETCH(int, d_state);
    Rigs r;
    const SsdTwins in(r, T, 4, 2, head_dim, d_state);
    Twin st = r.random({in.H, in.P, in.N}, 0.5, DType::F32);
    Twin y = r.mat(T, in.H * in.P, 2, std::vector<float>(size_t(T * in.H * in.P), 0.0f));
    Twin log_decay = r.filled({in.H}, 0.0f, DType::F32);
    auto args = [&](bool cpu) {
      ss::SsdArgs a = in.args(cpu, 0.5f);
      a.y = y.on(cpu);
      if (state) a.state = st.on(cpu);
      a.log_decay = log_decay.on(cpu);
      return a;
    };
    r.cpu.ssd_scan(args(true));
    r.gpu.ssd_scan(args(false));
    VERIFY_TWIN(r, y, "ssd_scan y");
    if (state) VERIFY_TWIN_TOL(r, st, "ssd_scan state", g_dtype == DType::F32 ? 1e-5 : 4 * unit_roundoff(g_dtype));
    VERIFY_TWIN_TOL(r, log_decay, "log_decay", 1e-6);
  }

  // Sequence-parallel state passing: the correction for an incoming state and the advance.
  void ssd_state_passing() {
    Rigs r;
    const int64_t T = 90;
    const SsdTwins in(r, T, 2, 1, 8, 16);  // the correction reads dt, dt_bias, A_log and C
    const int H = in.H, P = in.P, N = in.N;
    Twin st = r.random({H, P, N}, 0.5, DType::F32);
    Twin y = r.random_mat(T, H * P, 1);
    auto args = [&](bool cpu) {
      ss::SsdArgs a = in.args(cpu, 1.0f);
      a.y = y.on(cpu);
      a.state = st.on(cpu);
      return a;
    };
    r.cpu.ssd_state_correction(args(true));
    r.gpu.ssd_state_correction(args(false));
    VERIFY_TWIN_TOL(r, y, "ssd_state_correction", tolerance(2));
    const Twin chunk = r.random({H, P, N}, 0.5, DType::F32);
    const Twin decay = r.make({H}, {-0.3f, -2.0f}, DType::F32);
    r.cpu.ssd_state_advance(st.c, chunk.c, decay.c);
    r.gpu.ssd_state_advance(st.d, chunk.d, decay.d);
    VERIFY_TWIN_TOL(r, st, "ssd_state_advance", 1e-6);
  }

  void selective_scan_data() {
    QTest::addColumn<int>("T");
    QTest::addColumn<bool>("gate");
    QTest::addColumn<bool>("state");
    QTest::addColumn<int>("d_state");  // 8 or less: 4 channels a warp; 16 or less: 2; else 1, ceil(N/32) states a lane
    QTest::addColumn<int>("channels");
    QTest::newRow("prefill") << 45 << true << true << 16 << 40;
    QTest::newRow("no gate, no state") << 30 << false << false << 16 << 40;
    QTest::newRow("decode") << 1 << true << true << 16 << 40;
    QTest::newRow("odd channels (a dead segment)") << 19 << true << true << 16 << 37;
    QTest::newRow("small state, 4 channels a warp") << 21 << true << true << 6 << 35;
    QTest::newRow("state 20, 1 a lane of 32") << 11 << true << true << 20 << 5;
    QTest::newRow("state 40, 2 a lane") << 13 << true << true << 40 << 9;
    QTest::newRow("state 100, 4 a lane") << 9 << true << true << 100 << 3;
    QTest::newRow("state 130, 8 a lane") << 5 << false << true << 130 << 2;
  }
  void selective_scan() {
    QFETCH(int, T);
    QFETCH(bool, gate);
    QFETCH(bool, state);
    QFETCH(int, d_state);
    QFETCH(int, channels);
    Rigs r;
    const int64_t Di = channels, N = d_state;
    const Twin x = r.random_mat(T, Di, 1), dt = r.random_mat(T, Di, 2), z = r.random_mat(T, Di, 1),
               B = r.random_mat(T, N, 2), C = r.random_mat(T, N, 1);
    const Twin dt_bias = r.random({Di}, 0.5), D = r.random({Di}), A_log = r.random({Di, N}, 0.5);
    Twin st = r.random({Di, N}, 0.5, DType::F32);
    Twin dt_sum = r.filled({Di}, 0.0f, DType::F32);
    Twin y = r.mat(T, Di, 3, std::vector<float>(size_t(T * Di), 0.0f));
    auto args = [&](bool cpu) {
      ss::SelectiveScanArgs a;
      a.y = y.on(cpu);
      a.x = x.on(cpu);
      a.dt = dt.on(cpu);
      if (gate) a.z = z.on(cpu);
      a.dt_bias = dt_bias.on(cpu);
      a.D = D.on(cpu);
      a.A_log = A_log.on(cpu);
      a.B = B.on(cpu);
      a.C = C.on(cpu);
      if (state) a.state = st.on(cpu);
      a.dt_sum = dt_sum.on(cpu);
      return a;
    };
    r.cpu.selective_scan(args(true));
    r.gpu.selective_scan(args(false));
    VERIFY_TWIN(r, y, "selective_scan y");
    if (state) VERIFY_TWIN_TOL(r, st, "selective_scan state", 1e-5);
    VERIFY_TWIN_TOL(r, dt_sum, "dt_sum", 1e-6);
    // the incoming-state correction and the advance
    Twin st_in = r.random({Di, N}, 0.5, DType::F32);
    auto corr = args(true);
    corr.state = st_in.c;
    r.cpu.selective_state_correction(corr);
    corr = args(false);
    corr.state = st_in.d;
    r.gpu.selective_state_correction(corr);
    VERIFY_TWIN_TOL(r, y, "selective_state_correction", tolerance(2));
    r.cpu.selective_state_advance(st_in.c, A_log.c, st.c, dt_sum.c);
    r.gpu.selective_state_advance(st_in.d, A_log.d, st.d, dt_sum.d);
    VERIFY_TWIN_TOL(r, st_in, "selective_state_advance", 1e-5);
  }

  // The quantized formats, byte for byte the cpu's (comm/quantize.cpp).
  void quantize_data() {
    QTest::addColumn<QString>("spec");
    QTest::addColumn<int>("n");
    for (const char* s : {"int8:128", "int8:32", "int8:tensor", "int8:2000", "int4:128", "int4:33", "int4:tensor",
                          "fp8:128", "fp8:tensor", "bf16", "fp16", "fp32", "int8:64:sr", "int4:64:sr", "fp8:32:sr"})
      for (int n : {1000, 4999}) QTest::newRow(qPrintable(QStringLiteral("%1 n=%2").arg(s).arg(n))) << s << n;
  }
  void quantize() {
    QFETCH(QString, spec);
    QFETCH(int, n);
    ss::QuantSpec q = ss::parse_quant_spec(spec.toStdString());
    q.seed = 7;
    Rigs r;
    std::vector<float> values = r.randn(n, 3.0);
    for (int i = 0; i < n; i += 97) values[size_t(i)] = 0.0f;  // zeros, and a zero block below
    if (n > 300)
      for (int i = 128; i < 256; ++i) values[size_t(i)] = 0.0f;
    const Twin in = r.make({n}, values);
    const int64_t bytes = ss::quantized_bytes(n, q);
    const int64_t carrier = (bytes + 3) / 4;
    Twin out = r.filled({carrier}, 0.0f, DType::F32);
    r.cpu.quantize(out.c, in.c, q, 12345);
    r.gpu.quantize(out.d, in.d, q, 12345);
    std::vector<float> gc(static_cast<size_t>(carrier)), cc(static_cast<size_t>(carrier));
    r.gpu.download(out.d, gc.data());
    r.cpu.download(out.c, cc.data());
    QVERIFY2(std::memcmp(gc.data(), cc.data(), size_t(bytes)) == 0, "quantized bytes differ from the cpu's");
    Twin back = r.random({n});
    r.cpu.dequantize(back.c, out.c, q, true);
    r.gpu.dequantize(back.d, out.d, q, true);
    VERIFY_TWIN_TOL(r, back, "dequantize (accumulate)", tolerance(1));
  }

  void transfers() {
    Rigs r;
    const std::vector<float> v = r.randn(333, 1.0, 0.0, DType::F32);  // not representable: rounded on upload
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      const Twin t = r.make({333}, v, dt);
      QCOMPARE(r.gpu_values(t), r.cpu_values(t));  // both round once to nearest even
    }
    std::vector<uint16_t> bits(333);
    ss::narrow(v.data(), 333, DType::BF16, bits.data());
    Tensor d = r.gpu.alloc({333}, Category::Weights, "w", DType::BF16);
    r.gpu.upload(d, bits.data(), DType::BF16);  // a bf16 checkpoint into a bf16 run: copied
    std::vector<float> back(333), want(333);
    r.gpu.download(d, back.data());
    ss::widen(bits.data(), DType::BF16, 333, want.data());
    QCOMPARE(back, want);
  }

  // Every kernel leaves one compute span, with the ops' names, in order.
  void spans() {
    Rigs r;
    const Twin a = r.random({8, 16}), b = r.random({8, 16});
    Twin y = r.filled({8, 16}, 0.0f);
    r.dr.take_spans();
    r.gpu.add(y.d, a.d, b.d);
    r.gpu.silu_mul(y.d, a.d, b.d);
    const auto spans = r.dr.take_spans();
    QCOMPARE(int(spans.size()), 2);
    QCOMPARE(QString::fromStdString(spans[0].op), QStringLiteral("add"));
    QCOMPARE(QString::fromStdString(spans[1].op), QStringLiteral("silu_mul"));
    QVERIFY(spans[0].t0 <= spans[0].t1 && spans[0].t1 <= spans[1].t0 && spans[1].t0 <= spans[1].t1);
    QCOMPARE(spans[0].stream, std::string("compute"));
  }
};

int main(int argc, char** argv) {
  QCoreApplication app(argc, argv);
  int failed = 0;
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    g_dtype = dt;
    std::printf("********* compute dtype %s *********\n", std::string(ss::compute_dtype_name(dt)).c_str());
    TestCudaOps t;
    const int ops = exec_own_functions(t, argc, argv), train = run_cuda_train_ops(argc, argv);
    if (ops == kNotItsFunctions && train == kNotItsFunctions) {
      std::fprintf(stderr, "no test function of that name here (-functions lists them)\n");
      return 1;
    }
    failed += std::max(ops, 0) + std::max(train, 0);
  }
  return failed ? 1 : 0;
}

#include "tst_cuda_ops.moc"

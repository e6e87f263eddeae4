#!/usr/bin/env bash
# The sanitizer leg of CI: builds the engine, the explorer and the tests with
# AddressSanitizer + UndefinedBehaviorSanitizer (any UB fails the test, no
# recovery) into build-asan/ (or $SHARDSCOPE_ASAN_BUILD_DIR) and runs every
# suite (sampled rows, see below) but the package check (it inspects the plain
# build's .deb) and the second passes listed below: parsers, the stream,
# sessions, the explorer, the strategies, the simulator. Leak
# detection is off: MPI and Qt keep process-lifetime allocations. Called by
# test.sh after the plain leg passes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/packaging/sanitized-build.sh"
build="${SHARDSCOPE_ASAN_BUILD_DIR:-$root/build-asan}"
jobs="${SHARDSCOPE_JOBS:-$(nproc)}"
# (-Wno-maybe-uninitialized: GCC 12 warns inside <regex> and <functional> at -O1.)
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g1 -Wno-maybe-uninitialized"
start=$(date +%s)
# The fuzz targets' corpus replays are not built here: packaging/fuzz.sh
# starts each target on the same corpus and kept inputs, under clang's
# ASan + UBSan. Nor are the explorer's benchmarks: nothing is timed here.
# The suites' own files are built without the sanitizers
# (-fno-sanitize=address,undefined: tests/CMakeLists.txt); the libraries and
# the engine they run keep both, and the suites link ASan's runtime, whose
# allocator guards every heap block, theirs included. The engine links
# without PIE, which spares every rank ASan's relocations as it starts
# (engine/CMakeLists.txt).
configure_sanitized "$build" "$flags" "-fsanitize=address,undefined" -DSHARDSCOPE_FUZZ_REPLAY=OFF \
  -DSHARDSCOPE_TEST_COMPILE_OPTIONS=-fno-sanitize=address,undefined -DSHARDSCOPE_ENGINE_NO_PIE=ON \
  -DSHARDSCOPE_BUILD_BENCHES=OFF
cmake --build "$build" -j "$jobs"
echo "sanitize: built in $(($(date +%s) - start)) s"
# SHARDSCOPE_SANITIZER_LEG: the oversubscribed calibration, the two long numeric cases (a 7B sweep, 200 training
# steps) and the kills of checkpoint saves skip here; the plain leg runs them. The strategy, simulator and
# training suites run their sample of rows (every strategy of every family on 2 and 4 ranks,
# a few bf16, optimizer and memory rows): the same code paths as every row,
# at a fraction of the time; the plain leg runs every row. Of the emulated
# cuda suites the kernels' own (tst_cuda_ops_emu) runs here, index arithmetic
# under ASan; the model, strategy and training passes over the same kernels
# run in the plain leg, and so does the kernels' second pass a warp at a time
# (tst_cuda_ops_emu_warps: the same indices, in another order). NCCL's
# communicator (on the tests' stand-in) runs here in tst_train_nccl_emu's
# gradients and tst_faults' peer hung or gone. The quantized all-reduce's
# suite runs here on 1, 2 and 3 ranks, on 4 (tst_quant_mpi_np4: the code of
# 2 ranks over more chunks) in the plain leg; tst_sweep still runs int8 and
# int4 all-reduces on 4 ranks here.
export QT_QPA_PLATFORM=offscreen SHARDSCOPE_FAULT_TRIALS=5 SHARDSCOPE_SANITIZER_LEG=asan
# QtTest's per-function limit (300 s for all of a function's rows) is for
# unsanitized speed; ctest's --timeout below bounds a hung suite.
export QTEST_FUNCTION_TIMEOUT=900000
# A sanitizer's report already holds the stacks; QtTest's own dump on the
# abort that follows attaches gdb to the ASan process, which took 9 minutes
# and turned a report into ctest's timeout.
export QTEST_DISABLE_STACK_DUMP=1
export SHARDSCOPE_STRATEGY_ROWS=sample SHARDSCOPE_TRAIN_ROWS=sample
# A freed block stays poisoned while the next 16 MB of frees pass (ASan's
# default keeps 256 MB): a use just after a free is still caught, and the
# ranks, which free and allocate activations all run long, reuse warm pages
# instead of faulting in fresh ones. tst_scale took 79 s of CPU with the
# default, 62 s with this. A report's allocation and free stacks keep 10
# frames (of 30): each allocation's stack is walked and stored, 5% of the
# CPU of the same suite.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_odr_violation=0:quarantine_size_mb=16"
ASAN_OPTIONS+=":malloc_context_size=10"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$root/packaging/ubsan.supp"
t0=$(date +%s)
ctest --test-dir "$build" --output-on-failure -j "${SHARDSCOPE_TEST_JOBS:-2}" --timeout 1800 \
  -E '^(tst_package|tst_cuda_models_emu|tst_cuda_ops_emu_warps|tst_strategies_cuda_emu|tst_strategies_nccl_emu|tst_train_cuda_emu|tst_quant_mpi_np4)$'
echo "sanitize: tests took $(($(date +%s) - t0)) s; leg $(($(date +%s) - start)) s"

#!/usr/bin/env bash
# The sanitizer leg of CI: builds the engine, the explorer and the tests with
# AddressSanitizer + UndefinedBehaviorSanitizer (any UB fails the test, no
# recovery) into build-asan/ (or $SHARDSCOPE_ASAN_BUILD_DIR) and runs every
# suite but the package check (it inspects the plain build's .deb): parsers,
# the stream, sessions, the explorer, the strategies, the simulator. Leak
# detection is off: MPI and Qt keep process-lifetime allocations. Called by
# test.sh after the plain leg passes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SHARDSCOPE_ASAN_BUILD_DIR:-$root/build-asan}"
jobs="${SHARDSCOPE_JOBS:-$(nproc)}"
# (-Wno-maybe-uninitialized: GCC 12 warns inside <regex> and <functional> at -O1.)
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g -Wno-maybe-uninitialized"
start=$(date +%s)
mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDSCOPE_WITH_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" > "$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j "$jobs"
echo "sanitize: built in $(($(date +%s) - start)) s"
export QT_QPA_PLATFORM=offscreen
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_odr_violation=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$root/packaging/ubsan.supp"
ctest --test-dir "$build" --output-on-failure -j "${SHARDSCOPE_TEST_JOBS:-2}" --timeout 1800 -E tst_package

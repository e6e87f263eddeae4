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
source "$root/packaging/sanitized-build.sh"
build="${SHARDSCOPE_ASAN_BUILD_DIR:-$root/build-asan}"
jobs="${SHARDSCOPE_JOBS:-$(nproc)}"
# (-Wno-maybe-uninitialized: GCC 12 warns inside <regex> and <functional> at -O1.)
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g1 -Wno-maybe-uninitialized"
start=$(date +%s)
configure_sanitized "$build" "$flags" "-fsanitize=address,undefined"
cmake --build "$build" -j "$jobs"
echo "sanitize: built in $(($(date +%s) - start)) s"
# SHARDSCOPE_SANITIZER_LEG: the two long numeric cases (a 7B sweep, 200 training
# steps) skip here; the plain leg runs them.
export QT_QPA_PLATFORM=offscreen SHARDSCOPE_FAULT_TRIALS=5 SHARDSCOPE_SANITIZER_LEG=asan
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_odr_violation=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$root/packaging/ubsan.supp"
t0=$(date +%s)
ctest --test-dir "$build" --output-on-failure -j "${SHARDSCOPE_TEST_JOBS:-2}" --timeout 1800 -E tst_package
echo "sanitize: tests took $(($(date +%s) - t0)) s; leg $(($(date +%s) - start)) s"

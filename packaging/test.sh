#!/usr/bin/env bash
# The one command that sets up a fresh Debian 12 machine, builds ShardScope and
# runs every test. Exits non-zero when anything fails.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SHARDSCOPE_BUILD_DIR:-$root/build}"

"$root/packaging/setup-deps.sh"
# The sanitizer legs (below): on CI, or when asked with SHARDSCOPE_SANITIZE=1;
# SHARDSCOPE_SANITIZE=0 skips them.
legs=0
if [[ "${SHARDSCOPE_SANITIZE:-}" == 1 || ( -z "${SHARDSCOPE_SANITIZE:-}" && "${CI:-}" == true ) ]]; then legs=1; fi
# Where the fuzz leg runs, it starts every fuzz target on its corpus and kept
# inputs under ASan + UBSan, so this build leaves out the plain replays of
# the same inputs (fuzz/CMakeLists.txt); without the legs it keeps them.
replay=ON
[[ $legs == 1 ]] && replay=OFF
SHARDSCOPE_CMAKE_ARGS="${SHARDSCOPE_CMAKE_ARGS:-} -DSHARDSCOPE_FUZZ_REPLAY=$replay" "$root/packaging/build.sh"

export QT_QPA_PLATFORM=offscreen
# QtTest stops a test function after 300 s, all its data rows together; on a
# loaded 2-core machine a long table can pass that with nothing wrong. ctest's
# --timeout and each suite's TIMEOUT bound a hung suite instead.
export QTEST_FUNCTION_TIMEOUT=${QTEST_FUNCTION_TIMEOUT:-600000}
# Two test processes at a time: several suites start MPI ranks of their own.
ctest --test-dir "$build" --output-on-failure -j "${SHARDSCOPE_TEST_JOBS:-2}" --timeout 900

# The sanitizer legs, each a build of its own: ASan + UBSan over the suites,
# the libFuzzer targets for a bounded number of inputs each, and TSan over
# the suites whose threads the project owns.
if [[ $legs == 1 ]]; then
  "$root/packaging/sanitize.sh"
  "$root/packaging/fuzz.sh"
  "$root/packaging/tsan.sh"
fi

#!/usr/bin/env bash
# The one command that sets up a fresh Debian 12 machine, builds ShardScope and
# runs every test. Exits non-zero when anything fails.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SHARDSCOPE_BUILD_DIR:-$root/build}"

"$root/packaging/setup-deps.sh"
"$root/packaging/build.sh"

export QT_QPA_PLATFORM=offscreen
# QtTest stops a test function after 300 s, all its data rows together; on a
# loaded 2-core machine a long table can pass that with nothing wrong. ctest's
# --timeout and each suite's TIMEOUT bound a hung suite instead.
export QTEST_FUNCTION_TIMEOUT=${QTEST_FUNCTION_TIMEOUT:-600000}
# Two test processes at a time: several suites start MPI ranks of their own.
ctest --test-dir "$build" --output-on-failure -j "${SHARDSCOPE_TEST_JOBS:-2}" --timeout 900

# The sanitizer legs, each a build of its own: ASan + UBSan over every suite,
# the libFuzzer targets for a bounded number of inputs each, and TSan over
# the suites whose threads the project owns. On CI, or when asked with
# SHARDSCOPE_SANITIZE=1; SHARDSCOPE_SANITIZE=0 skips them.
if [[ "${SHARDSCOPE_SANITIZE:-}" == 1 || ( -z "${SHARDSCOPE_SANITIZE:-}" && "${CI:-}" == true ) ]]; then
  "$root/packaging/sanitize.sh"
  "$root/packaging/fuzz.sh"
  "$root/packaging/tsan.sh"
fi

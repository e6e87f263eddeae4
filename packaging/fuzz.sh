#!/usr/bin/env bash
# The fuzz leg of CI: builds every fuzz target (fuzz/README.md) with clang,
# libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer (UB fatal) into
# build-fuzz/ (or $SHARDSCOPE_FUZZ_BUILD_DIR), then runs each one from its
# seed corpus for a bounded number of inputs ($SHARDSCOPE_FUZZ_RUNS, default
# 20000) and at most $SHARDSCOPE_FUZZ_SECONDS seconds (default 25), as many
# targets at a time as there are cores ($SHARDSCOPE_JOBS). A crash,
# leak, timeout or UB report fails the leg and leaves the input in
# build-fuzz/artifacts/: fix the reader, then keep the input as a
# regression test in fuzz/regressions/<target>/. The checked-in corpus is
# never written to (new inputs go to a scratch copy).
#   SHARDSCOPE_FUZZ_TARGETS="stream config"  runs only those targets.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/packaging/sanitized-build.sh"
build="${SHARDSCOPE_FUZZ_BUILD_DIR:-$root/build-fuzz}"
jobs="${SHARDSCOPE_JOBS:-$(nproc)}"
runs="${SHARDSCOPE_FUZZ_RUNS:-20000}"
seconds="${SHARDSCOPE_FUZZ_SECONDS:-25}"
targets="${SHARDSCOPE_FUZZ_TARGETS:-safetensors checkpoint config hardware options stream tokenizer views sessions}"
command -v clang++ >/dev/null || { echo "fuzz: clang++ not found; packaging/setup-deps.sh installs it" >&2; exit 1; }
# (-Wno-pass-failed: at -O1 clang does not vectorise the kernels' `omp simd`
# loops and says so for each; the plain build vectorises them.)
flags="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g1 -Wno-pass-failed"
start=$(date +%s)
export CC=clang CXX=clang++
configure_sanitized "$build" "$flags" "-fsanitize=address,undefined" \
  -DSHARDSCOPE_FUZZ=ON -DSHARDSCOPE_BUILD_TESTS=OFF
cmake --build "$build" -j "$jobs" --target fuzz_all
echo "fuzz: built in $(($(date +%s) - start)) s"

export QT_QPA_PLATFORM=offscreen SHARDSCOPE_RESOURCES="$root/resources" OMP_NUM_THREADS=1
export ASAN_OPTIONS="abort_on_error=1:detect_odr_violation=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$root/packaging/ubsan.supp"
export LSAN_OPTIONS="suppressions=$root/packaging/lsan.supp"
artifacts="$build/artifacts"
mkdir -p "$artifacts"
# One target: its log in $build/fuzz-T.log, its result line in $build/fuzz-T.result.
fuzz_one() {
  local t=$1 work t0 done_runs cov
  work=$(mktemp -d)
  if ! cp -r "$root/fuzz/corpus/$t/." "$work/"; then
    echo "failed" > "$build/fuzz-$t.result"
    rm -rf "$work"
    return
  fi
  local inputs=("$work") dict=()
  [[ -d "$root/fuzz/regressions/$t" ]] && inputs+=("$root/fuzz/regressions/$t")
  case "$t" in safetensors|config|hardware|stream|views) dict=(-dict="$root/fuzz/json.dict") ;; esac
  t0=$(date +%s)
  if "$build/fuzz/fuzz_$t" "${dict[@]}" -runs="$runs" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 \
       -artifact_prefix="$artifacts/$t-" -print_final_stats=1 "${inputs[@]}" > "$build/fuzz-$t.log" 2>&1; then
    done_runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/fuzz-$t.log" | grep -o '[0-9]*$' || echo "?")
    cov=$(grep -o 'cov: [0-9]*' "$build/fuzz-$t.log" | tail -1 || true)
    echo "ok $t: $done_runs inputs in $(($(date +%s) - t0)) s, ${cov:-cov: ?}, no report" > "$build/fuzz-$t.result"
  else
    echo "failed" > "$build/fuzz-$t.result"
  fi
  rm -rf "$work"
}
# Each libFuzzer run is one thread: as many at a time as the build used cores.
t_start=$(date +%s)
for t in $targets; do
  rm -f "$build/fuzz-$t.result"
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  fuzz_one "$t" &
done
wait
failed=()
for t in $targets; do
  result=$(cat "$build/fuzz-$t.result" 2>/dev/null || echo "failed")
  if [[ $result == ok* ]]; then
    echo "fuzz: ${result#ok }"
  else
    echo "fuzz: $t FAILED; the last lines of $build/fuzz-$t.log:" >&2
    tail -40 "$build/fuzz-$t.log" >&2 || true
    ls "$artifacts" | grep "^$t-" | sed "s|^|fuzz: kept input $artifacts/|" >&2 || true
    failed+=("$t")
  fi
done
echo "fuzz: the targets ran in $(($(date +%s) - t_start)) s, $jobs at a time"
echo "fuzz: leg took $(($(date +%s) - start)) s"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz: failed: ${failed[*]}" >&2
  exit 1
fi

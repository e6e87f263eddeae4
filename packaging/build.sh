#!/usr/bin/env bash
# Configures and builds ShardScope (Release) into build/ (or $SHARDSCOPE_BUILD_DIR).
# Used by run.sh and test.sh; safe to run repeatedly (incremental).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SHARDSCOPE_BUILD_DIR:-$root/build}"
jobs="${SHARDSCOPE_JOBS:-$(nproc)}"
# A new build folder uses Ninja (it keeps both cores busy across targets);
# an existing one keeps the generator it was configured with.
gen=()
[[ -f "$build/CMakeCache.txt" ]] || ! command -v ninja >/dev/null || gen=(-G Ninja)
# shellcheck disable=SC2086
cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release ${SHARDSCOPE_CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs"

#!/usr/bin/env bash
# Configures and builds ShardScope (Release) into build/ (or $SHARDSCOPE_BUILD_DIR).
# Used by run.sh and test.sh; safe to run repeatedly (incremental).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SHARDSCOPE_BUILD_DIR:-$root/build}"
jobs="${SHARDSCOPE_JOBS:-$(nproc)}"
source "$root/packaging/generator.sh"
# shellcheck disable=SC2086,SC2046
cmake -S "$root" -B "$build" $(generator_args "$build") -DCMAKE_BUILD_TYPE=Release ${SHARDSCOPE_CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs"

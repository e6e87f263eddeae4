#!/usr/bin/env bash
# The one command that sets up a fresh Debian 12 machine, builds ShardScope and
# opens the explorer. Without a display it says so and runs a headless demo:
# real engine runs on one device, the explorer itself (offscreen) running tp
# and tsp on four MPI ranks, saving both as sessions and comparing them, and
# a simulation; it prints every summary and keeps the explorer's pages as
# PNGs in build/demo/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SHARDSCOPE_BUILD_DIR:-$root/build}"

"$root/packaging/setup-deps.sh"
"$root/packaging/build.sh"

engine="$build/engine/shardscope-engine"
export SHARDSCOPE_ENGINE="$engine"
if [[ -n "${DISPLAY:-}" || -n "${WAYLAND_DISPLAY:-}" ]]; then
  exec "$build/app/shardscope" "$@"
fi

echo "run.sh: no display found (DISPLAY and WAYLAND_DISPLAY are unset): running a headless demo instead."
echo "run.sh: to open the explorer, run this from a desktop session (or: xvfb-run -a $0)."
demo="$(mktemp -d)"
trap 'rm -rf "$demo"' EXIT
step() {
  echo
  echo "=== $1 ==="
  shift
  "$engine" "$@" --events "$demo/run.jsonl"
  "$engine" summarize "$demo/run.jsonl"
}
step "brown-llama (trained by the engine on the Brown Corpus) answers a prompt, on one CPU device" \
  run --model brown-llama --prompt "The jury said that the city" --decode 24
step "small-llama on one CPU device: prefill 256 tokens, decode 16" \
  run --model small-llama --prompt-len 256 --decode 16
step "small-mamba2 on one CPU device: prefill 256 tokens, decode 16" \
  run --model small-mamba2 --prompt-len 256 --decode 16
# The explorer, offscreen: each run is saved as a session, then compared.
shots="$build/demo"
mkdir -p "$shots"
export QT_QPA_PLATFORM=offscreen
for strategy in tp tsp; do
  echo
  echo "=== the explorer: small-llama, $strategy on 4 CPU devices (4 MPI ranks), saved as a session ==="
  "$build/app/shardscope" --db "$demo/sessions.db" --run-once --screenshot "$shots/$strategy" \
    small-llama cpu "$strategy" 4 256 8 2>/dev/null
done
echo
echo "=== the explorer: the two sessions compared ==="
"$build/app/shardscope" --db "$demo/sessions.db" --compare 1,2 --screenshot "$shots/tp-vs-tsp" 2>/dev/null
echo "run.sh: the explorer's pages are in $shots/ (tp-*.png, tsp-*.png, tp-vs-tsp-compare.png)"
step "simulated: Llama-2-7B, 128K tokens, tsp on 8 x MI300X" \
  simulate --hardware mi300x --model llama2-7b --strategy tsp --devices 8 --prompt-len 131072 --decode 4

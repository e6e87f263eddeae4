#!/usr/bin/env bash
# The one command that sets up a fresh Debian 12 machine, builds ShardScope and
# opens the explorer. Without a display it says so and runs a headless demo:
# a real engine run whose summary it prints.
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
for model in small-llama small-mamba2; do
  echo
  echo "=== $model: prefill 256 tokens, decode 16, on this CPU ==="
  "$engine" run --model "$model" --prompt-len 256 --decode 16 --events "$demo/$model.jsonl"
  "$engine" summarize "$demo/$model.jsonl"
done

#!/usr/bin/env bash
# Every GPU check and the GPU benchmark in one go, on a machine with an NVIDIA
# GPU (tests/gpu/README.md):
#   tests/gpu/run.sh OUTDIR
# writes OUTDIR/log.txt (everything) and OUTDIR/summary.md (a row per check:
# passed, failed, skipped, seconds; then the benchmark's tables).
#
# The binaries: from .gpu-bundle/shardscope-gpu.tar.xz when it was carried
# here (tests/gpu/bundle.sh made it on a build machine), else built here into
# build-gpu/ (this machine then needs the project's dependencies:
# packaging/setup-deps.sh). cuBLAS and NCCL are this machine's: the CUDA
# toolkit's, or the ones Python's nvidia-* packages carry.
#
# Checks: shardscope-engine info; tst_cuda_ops (every kernel against the cpu
# backend, every dtype); tst_cuda_models (every family on one GPU against the
# cpu, decode against prefill); tst_strategies and tst_train with the cuda
# backend (ranks beyond the GPUs share them, collectives staged over MPI),
# side by side; calibrate --backend cuda (its profile
# lands in OUTDIR); bench --backend cuda (SHARDSCOPE_GPU_BENCH_RUNS times).
# A kernel suite or benchmark that fails runs once more with
# SHARDSCOPE_CUDA_PDL=0 (no programmatic dependent launches), to tell
# whether they are the cause.
# Limits: SHARDSCOPE_GPU_CHECK_LIMIT seconds a suite (300),
# SHARDSCOPE_GPU_BENCH_LIMIT a benchmark run (180).
set -uo pipefail
out="${1:?usage: tests/gpu/run.sh OUTDIR}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log="$out/log.txt"
summary="$out/summary.md"
: > "$log"
exec > >(tee -a "$log") 2>&1
start=$(date +%s)

# ---- the binaries
bundle="$root/.gpu-bundle/shardscope-gpu.tar.xz"
if [[ -f "$bundle" ]]; then
  prefix=/tmp/shardscope-gpu
  rm -rf "$prefix" && mkdir -p "$prefix"
  if command -v xz >/dev/null; then
    tar -C "$prefix" -xJf "$bundle" || { echo "run: cannot unpack $bundle"; exit 1; }
  else  # no xz here: Python's tarfile reads it
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$bundle" "$prefix" ||
      { echo "run: cannot unpack $bundle (no xz, and python3 could not either)"; exit 1; }
  fi
  bin="$prefix/bin"
  export LD_LIBRARY_PATH="$prefix/lib:$prefix/usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OPAL_PREFIX="$prefix/usr" PATH="$prefix/usr/bin:$PATH" SHARDSCOPE_MPIRUN="$prefix/usr/bin/mpirun"
  echo "run: the bundle's binaries, unpacked in $prefix"
else
  build="$root/build-gpu"
  echo "run: no bundle here; building into $build"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSHARDSCOPE_BUILD_GUI=OFF ||
    { echo "run: configure failed: install the dependencies (packaging/setup-deps.sh) or carry a bundle (tests/gpu/bundle.sh)"; exit 1; }
  cmake --build "$build" -j "$(nproc)" --target shardscope-engine tst_cuda_ops tst_cuda_models tst_strategies tst_train ||
    { echo "run: build failed"; exit 1; }
  bin="$root/build-gpu/bin-links"
  mkdir -p "$bin"
  ln -sf "$build/engine/shardscope-engine" "$bin/"
  for t in tst_cuda_ops tst_cuda_models tst_strategies tst_train; do ln -sf "$build/tests/$t" "$bin/"; done
fi
# cuBLAS and NCCL where this machine keeps them (the engine loads them by name).
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d "$d" ]] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
for lib in libcublas.so.13 libnccl.so.2; do
  found=$(find /usr/local /usr/lib /opt /usr/lib64 -name "$lib" 2>/dev/null | head -1)
  [[ -n "$found" ]] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$found")"
done
export LD_LIBRARY_PATH
export SHARDSCOPE_TEST_ENGINE="$bin/shardscope-engine" SHARDSCOPE_RESOURCES="$root/resources" QT_QPA_PLATFORM=offscreen
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_WAIT_POLICY=PASSIVE
command -v ssh >/dev/null || command -v rsh >/dev/null || export OMPI_MCA_plm_rsh_agent=false  # ranks are local

# ---- the checks: each with a time limit, counted from its own output. The
# correctness suites run side by side (the GPU has room, the host 16 cores, a
# lease is short); calibrate and the benchmark run alone after them.
mkdir -p "$out/rows"
rm -f "$out/rows/"*
check() {  # check NAME TIMEOUT_S COMMAND...  (writes its row to $out/rows/NAME)
  local name=$1 limit=$2
  shift 2
  local t0 status counts
  t0=$(date +%s)
  timeout "$limit" "$@" > "$out/$name.out" 2>&1
  status=$?
  local secs=$(( $(date +%s) - t0 ))
  # Qt Test prints "Totals: P passed, F failed, S skipped" per pass (the ops suite runs one a dtype).
  counts=$(grep -o 'Totals: [0-9]* passed, [0-9]* failed, [0-9]* skipped' "$out/$name.out" |
           awk '{p+=$2; f+=$4; s+=$6} END {if (NR) printf "%d | %d | %d", p, f, s; else printf "- | - | -"}')
  local result=ok
  [[ $status -eq 124 ]] && result="timed out (${limit} s)"
  [[ $status -ne 0 && $status -ne 124 ]] && result="FAILED (exit $status)"
  # A suite that passed nothing tested nothing ("skipped: no CUDA device" where CUDA is not usable).
  [[ $result == ok && $counts == 0\ \|* ]] && result="FAILED (nothing ran)"
  echo "| $name | $result | $counts | $secs |" > "$out/rows/$name"
  write_summary
}
write_summary() {  # the rows so far (a run cut short still leaves them), then the benchmark's tables
  local tmp
  tmp=$(mktemp "$out/.summary.XXXXXX")  # checks end side by side: each writes whole, then renames
  {
    echo "# GPU checks, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
    echo
    echo "| check | result | passed | failed | skipped | seconds |"
    echo "|---|---|---|---|---|---|"
    cat "$out/rows/"* 2>/dev/null
    echo
    echo "Total: $(( $(date +%s) - start )) s."
    if [[ -s "$out/bench.txt" ]]; then
      echo
      echo '```'
      cat "$out/bench.txt"
      echo '```'
    fi
  } > "$tmp"
  mv -f "$tmp" "$summary"
}
show() {  # show NAME: its output into the log, once it has ended
  echo "===== $1"
  cat "$out/$1.out"
  rm -f "$out/$1.out"
}

nvidia-smi -L || echo "run: nvidia-smi found no GPU"
check info 60 "$bin/shardscope-engine" info
# Every check below needs the cuda backend: where `info` does not find it
# (no driver new enough for this CUDA, no cuBLAS), they would all skip.
if ! grep -q "cuda  available" "$out/info.out"; then
  echo "| cuda backend | FAILED ($(grep -m1 "cuda  " "$out/info.out" | sed 's/^ *//; s/|/,/g')) | - | - | - | 0 |" > "$out/rows/cuda"
  write_summary
fi
show info
# `check` sets a run's simulated peak against what each rank's GPU has free (cuda_default_capacity).
check forecast 60 bash -c '"$0" check --backend cuda --model small-llama --strategy tp --devices 2 --dtype bf16 \
  --prompt-len 4096 | tee /dev/stderr | grep -q "less the CUDA context" && "$0" check --backend cuda \
  --model llama2-7b --prompt-len 16 --capacity 1GiB; test $? -eq 3' "$bin/shardscope-engine"
show forecast
# NCCL on one GPU: a one-rank communicator and the tp_sp mesh's two split
# from it (init, all-reduce, split, finalize, the watchdog), against one cpu
# device by verify; the run's own stream must say its collectives were NCCL's.
check nccl 120 bash -c '"$0" verify --backend cuda --model small-llama --strategy tp_sp --mesh 1x1 --devices 1 \
  --dtype bf16 --prompt-len 256 --decode 4 && "$0" launch --backend cuda --model small-llama --strategy tp \
  --devices 1 --prompt-len 64 --decode 2 --events /tmp/shardscope-nccl.jsonl &&
  grep -m1 "\"collectives\"" /tmp/shardscope-nccl.jsonl | tee /dev/stderr | grep -q "\"collectives\":\"nccl"' \
  "$bin/shardscope-engine"
show nccl
# Training on the GPU: a step of the cuda backend's forward and backward
# kernels, with NCCL's mesh reducing the gradient, against one cpu device's
# step, tensor by tensor (train --verify; bf16, so one cpu device's fp32
# gradient runs too).
check train-verify 180 "$bin/shardscope-engine" train --verify --backend cuda --model small-llama --strategy tp_sp \
  --mesh 1x1 --devices 1 --dtype bf16 --seq-len 256
show train-verify
limit=${SHARDSCOPE_GPU_CHECK_LIMIT:-300}
# The multi-rank suites launch their rows one after another (processes
# sharing the GPU where there are fewer GPUs than ranks), so each is split
# by test function to run side by side.
names=(tst_cuda_ops tst_cuda_models tst_strategies_cuda_1 tst_strategies_cuda_2 tst_strategies_cuda_3
       tst_train_cuda_1 tst_train_cuda_2)
pids=()
check tst_cuda_ops "$limit" "$bin/tst_cuda_ops" & pids+=($!)
check tst_cuda_models "$limit" "$bin/tst_cuda_models" & pids+=($!)
SHARDSCOPE_STRATEGIES_BACKEND=cuda check tst_strategies_cuda_1 "$limit" "$bin/tst_strategies" tinyLlama tinyMamba \
  & pids+=($!)
SHARDSCOPE_STRATEGIES_BACKEND=cuda check tst_strategies_cuda_2 "$limit" "$bin/tst_strategies" tinyFalconMamba \
  tinyMamba2 & pids+=($!)
SHARDSCOPE_STRATEGIES_BACKEND=cuda check tst_strategies_cuda_3 "$limit" "$bin/tst_strategies" tinyHybrid \
  memoryClosedForm spActivationsBelowTp quantizedAllReduceAsCpu & pids+=($!)
SHARDSCOPE_TRAIN_BACKEND=cuda check tst_train_cuda_1 "$limit" "$bin/tst_train" gradientsEqualSingle & pids+=($!)
SHARDSCOPE_TRAIN_BACKEND=cuda check tst_train_cuda_2 "$limit" "$bin/tst_train" adamwStepsEqualSingle \
  memoryMatchesClosedForm & pids+=($!)
wait "${pids[@]}"  # these alone: a bare wait would also wait for the log's tee
for n in "${names[@]}"; do show "$n"; done
# A kernel suite that failed runs again without programmatic dependent
# launches (sm_90+, engine/cuda/README.md): passing then names them the cause.
# Side by side, as the first pass.
reruns=() pids=()
for n in tst_cuda_ops tst_cuda_models; do
  grep -q "FAILED\|timed out" "$out/rows/$n" || continue
  SHARDSCOPE_CUDA_PDL=0 check "${n}_no_pdl" "$limit" "$bin/$n" & pids+=($!)
  reruns+=("${n}_no_pdl")
done
[[ ${#pids[@]} -gt 0 ]] && wait "${pids[@]}"
for n in "${reruns[@]}"; do show "$n"; done
check calibrate 90 "$bin/shardscope-engine" calibrate --backend cuda --out "$out/calibrated-gpu.json"
show calibrate
# The benchmark SHARDSCOPE_GPU_BENCH_RUNS times (default 1), each run's
# tables in full: the spread between runs is the figures' noise.
t0=$(date +%s)
runs=${SHARDSCOPE_GPU_BENCH_RUNS:-1}
bench_status=0
: > "$out/bench.txt"
for ((i = 1; i <= runs; i++)); do
  echo "===== bench --backend cuda ($i of $runs)"
  [[ $runs -gt 1 ]] && echo "--- run $i of $runs" >> "$out/bench.txt"
  timeout "${SHARDSCOPE_GPU_BENCH_LIMIT:-180}" "$bin/shardscope-engine" bench --backend cuda >> "$out/bench.txt" 2>&1 ||
    bench_status=$?
  write_summary
done
if [[ $bench_status -ne 0 ]]; then  # once more without dependent launches, to tell whether they are the cause
  echo "--- again with SHARDSCOPE_CUDA_PDL=0, after exit $bench_status" >> "$out/bench.txt"
  SHARDSCOPE_CUDA_PDL=0 timeout "${SHARDSCOPE_GPU_BENCH_LIMIT:-180}" "$bin/shardscope-engine" bench --backend cuda \
    >> "$out/bench.txt" 2>&1 && echo "--- passed without dependent launches" >> "$out/bench.txt"
fi
cat "$out/bench.txt"
echo "| bench --backend cuda | $([[ $bench_status -eq 0 ]] && echo ok || echo "FAILED (exit $bench_status)") | - | - | - | $(( $(date +%s) - t0 )) |" \
  > "$out/rows/zz-bench"

write_summary
rm -f "$out/bench.txt"
rm -rf "$out/rows"
cat "$summary"
grep -q "FAILED\|timed out" "$summary" && exit 1
exit 0

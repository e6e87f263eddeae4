#!/usr/bin/env bash
# The ThreadSanitizer leg of CI: the engine and the suites whose threads the
# project owns, built with -fsanitize=thread into build-tsan/ (or
# $SHARDSCOPE_TSAN_BUILD_DIR):
#   tst_comm (2-4 MPI ranks): each communicator's comm-stream thread and the
#     non-blocking collectives it runs;
#   tst_sim (its simulated-only functions): `simulate`, every simulated rank
#     a thread of one process, meeting in the simulated network;
#   tst_sessions: the session store (connections per thread);
#   tst_faults (stoppedRankEndsTheRunNamingIt, ncclFaultEndsTheRun): the
#     ranks' heartbeat threads and the launcher that reads them; NCCL's
#     communicator (emulated ranks, the stand-in library's worker threads,
#     the emulated streams' threads that run its queued transfers) with its
#     watchdog thread: a peer stalled in a transfer (the watchdog's timeout
#     and abort), gone (the peer's exit seen) and a transfer broken (the
#     stream's asynchronous error). The other rows (a hung init, no unique
#     id, the stall and the loss in other places) take the same threads'
#     paths, and each hung one waits out a timeout: the plain and ASan legs
#     run them. Its other function kills single-rank
#     saves to check the files left behind (no threads of ours in it); ten
#     training runs under TSan took it past QtTest's 300 s, so the plain leg
#     runs it;
#   tst_scale (two functions): `scale`, several simulations at once on
#     worker threads, each with its own rank threads;
#   three whole runs of emulated ranks: two on NCCL's communicator (the
#     stand-in), tsp inference on 2 (the ring's grouped sends and receives,
#     decode) and a bf16 training step of tp_sp on 4 (the splits, every
#     collective, the 16-bit sums), and tsp inference on 2 through the
#     host-staged communicator: the kernels on the compute stream's thread,
#     the transfers on the communication stream's or copied through the
#     host, the stand-in's worker threads and the watchdog, to the end of a
#     run that succeeds (checked: with the staged communicator's copies on
#     no stream, racing the kernels, TSan reports the race). (The emulator's
#     fibers are TSan fibers: each emulated thread keeps its own shadow
#     stack.)
# Not here: the explorer's session recorder thread (tst_session_views). It
# hands batches over through Qt's queued signals, and Debian's Qt is built
# without TSan, so its futex-based QMutex is invisible and every handoff reads
# as a race. The ASan leg runs that suite.
# Kernels run on one thread (OMP_NUM_THREADS=1): libgomp, OpenBLAS and
# oneDNN are not instrumented, so their pools' synchronisation is invisible
# to TSan. Reports inside OpenMPI and Qt's own libraries are suppressed by
# library name in packaging/tsan.supp; none in the project's code are.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/packaging/sanitized-build.sh"
build="${SHARDSCOPE_TSAN_BUILD_DIR:-$root/build-tsan}"
jobs="${SHARDSCOPE_JOBS:-$(nproc)}"
flags="-fsanitize=thread -fno-omit-frame-pointer -O1 -g1 -Wno-maybe-uninitialized -Wno-tsan"
start=$(date +%s)
configure_sanitized "$build" "$flags" "-fsanitize=thread"
suites="tst_comm tst_sim tst_sessions tst_faults tst_scale"
cmake --build "$build" -j "$jobs" --target shardscope-engine shardscope_fake_nccl $suites
echo "tsan: built in $(($(date +%s) - start)) s"
t0=$(date +%s)
export QT_QPA_PLATFORM=offscreen OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 SHARDSCOPE_FAULT_TRIALS=3
# Ranks waiting in MPI yield their core (tests/CMakeLists.txt says why).
export OMPI_MCA_mpi_yield_when_idle=1
# die_after_fork=0: QProcess forks the engine from a threaded process (and execs at once).
export TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1:die_after_fork=0:suppressions=$root/packaging/tsan.supp"
# QtTest's 300 s limit is for a whole test function, all its rows together;
# under TSan a function of many rows can pass it without anything being
# wrong (ctest's --timeout and the suites' own engine timeouts still bound
# every run).
export QTEST_FUNCTION_TIMEOUT=900000
# TSan's report holds the stacks; QtTest's gdb dump of a sanitized process is minutes long.
export QTEST_DISABLE_STACK_DUMP=1
# tst_sim's functions whose runs are simulated ranks as threads (the others
# compare with real MPI runs, or calibrate on one thread). The simulated
# network and rank threads are the same code for every model, so of
# recordsEqualButTimes' 77 rows (~300 s under TSan) the hybrid model's, which
# has attention and Mamba layers, cover every strategy, both dtypes and the
# ring; the plain and ASan legs run them all.
records=""
for tag in dp/D2 tp/D4 sp/D4 tsp/D4 tp_sp/D4/2x2 tsp/D4/bf16 sp/D2/ring; do
  records+=" recordsEqualButTimes:tiny-hybrid/$tag"
done
sim_threads="$records scale oomIsAResult capacityAtMeasuredPeak simulatedConfigNamesHardware measuredTablesDriveTimes"
scale_threads="ssmStateConstantInLength notApplicableSaysWhy"
( cd "$build/tests" && export SHARDSCOPE_RESOURCES="$root/resources" &&
  ./tst_sim $sim_threads > "$build/tst_sim-tsan.log" 2>&1 &&
  ./tst_scale $scale_threads > "$build/tst_scale-tsan.log" 2>&1 ) &
sim=$!
ctest --test-dir "$build" --output-on-failure -j "${SHARDSCOPE_TEST_JOBS:-2}" --timeout 1200 \
  -R '^(tst_comm|tst_comm_np[0-9]|tst_sessions)$' || { wait $sim || true; exit 1; }
fault_rows=(stoppedRankEndsTheRunNamingIt "ncclFaultEndsTheRun:stalled peer" "ncclFaultEndsTheRun:lost peer"
            "ncclFaultEndsTheRun:broken transfer, prompt only")
if ! (cd "$build/tests" && OMP_WAIT_POLICY=PASSIVE SHARDSCOPE_RESOURCES="$root/resources" ./tst_faults \
        "${fault_rows[@]}" > "$build/tst_faults-tsan.log" 2>&1); then
  echo "tsan: tst_faults failed; its log:" >&2
  tail -80 "$build/tst_faults-tsan.log" >&2
  wait $sim || true
  exit 1
fi
# Emulated ranks end to end: their kernels on the compute stream's thread,
# their transfers on the communication stream's (NCCL's communicator) or
# copied through the host on the compute stream (the staged one), so a
# missing wait between a stream and the host or another stream is a race
# here. A report ends its rank (halt_on_error) and so the run; the events
# must say which communicator the ranks took.
emu_run() {
  local name=$1 collectives=$2 library=$3
  shift 3
  local events="$build/emu-$name-tsan.jsonl" log="$build/emu-$name-tsan.log"
  if ! (cd "$build/tests" && OMP_WAIT_POLICY=PASSIVE SHARDSCOPE_RESOURCES="$root/resources" \
        SHARDSCOPE_NCCL_LIBRARY="$library" \
        ../engine/shardscope-engine "$@" --backend cuda-emu --events "$events" > "$log" 2>&1) ||
     ! grep -q "\"collectives\":\"$collectives" "$events"; then
    echo "tsan: the emulated run '$name' failed (or its collectives were not '$collectives'); its log:" >&2
    tail -60 "$log" >&2
    wait $sim || true
    exit 1
  fi
}
fake_nccl="$build/tests/libshardscope_fake_nccl.so"
emu_run nccl-tsp nccl "$fake_nccl" launch --model tiny-hybrid --strategy tsp --devices 2 --prompt-len 16 --decode 4 \
  --timeout 600
emu_run nccl-tp_sp-train nccl "$fake_nccl" train --model tiny-hybrid --strategy tp_sp --devices 4 --mesh 2x2 \
  --seq-len 16 --dtype bf16
emu_run staged-tsp "mpi through host" "" launch --model tiny-hybrid --strategy tsp --devices 2 --prompt-len 16 \
  --decode 4 --timeout 600
if ! wait $sim; then
  echo "tsan: tst_sim or tst_scale failed; their logs:" >&2
  grep -hv '^PASS' "$build/tst_sim-tsan.log" "$build/tst_scale-tsan.log" 2>/dev/null | tail -80 >&2
  exit 1
fi
echo "tsan: tests took $(($(date +%s) - t0)) s; leg $(($(date +%s) - start)) s"

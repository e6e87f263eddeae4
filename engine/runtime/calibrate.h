// `shardscope-engine calibrate`: measures this machine (GEMM rate by shape,
// vector rate, memory bandwidth, per-kernel overhead, MPI latency and
// bandwidth per collective) and writes a hardware profile the simulator reads,
// so simulated runs can be checked against cpu runs on the same machine.
//
// Besides the peak figures every profile has, it writes measured kernel times
// (see sim/hardware.h): the spans of the cpu backend's own kernels on grids of
// sizes (elementwise kernels, attention), one-row and few-row GEMMs by weight
// shape with the weights out of the caches (decode), and alpha-beta per
// collective fitted over message sizes.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ss {

struct CalibrateOptions {
  // GEMM shapes (M, N, K) to measure besides the grid of weight shapes, e.g.
  // the ones a model uses: each (N, K) at 1, 2 and every M given for it.
  std::vector<std::array<int64_t, 3>> gemm_shapes;
  // Message sizes per collective ("broadcast" -> bytes, keyed as the
  // collective tables are) to time besides the fixed sizes: a transfer's time
  // is not smooth in its size (a 1.5 MiB broadcast took 289 us here, 2 MiB
  // 115, 3 MiB 291, 4 MiB 228), so the simulator's interpolation between
  // the fixed sizes misses a run's own.
  std::map<std::string, std::set<int64_t>> message_sizes;
  // The model whose decode measure_host_gap runs (empty: small-llama, or
  // tiny-llama when quick); add_run_shapes sets it to its run's.
  std::string host_gap_model;
  // measure_device leaves out gemm_times: the caller measures them with
  // measure_gemm_times, every rank calling the same GEMM at once.
  bool gemms_in_step = false;
  // calibrate --quick, a smoke test: each grid measured once instead of the
  // median of 3 passes, the contention from 3 repetitions instead of 9, the
  // collectives at 4 sizes of 20 calls instead of 6 of 100. The same tables,
  // noisier figures; the profile's name says so.
  bool quick = false;
  int passes() const { return quick ? 1 : 3; }
};

// Measures and returns the profile (and prints what it measured to `log`).
// With several ranks the device figures come from every rank measuring at
// once (calibrate_rank.cpp), with the contention between a rank's kernels and
// its own collectives.
nlohmann::json calibrate_machine(std::ostream& log, int ranks, const CalibrateOptions& options = {});
int run_calibrate(const std::string& out_file, int ranks, std::ostream& log, const CalibrateOptions& options = {});
// The entry-wise median of several measurements of one table (calibrate
// measures its grids in passes): each time is the median of its passes; the
// rest (shapes, names) come from the first.
nlohmann::json median_of_passes(std::vector<nlohmann::json> passes);
// Writes a profile to `out_file` whole or not at all (a temporary file, then a rename).
void write_profile(const nlohmann::json& profile, const std::string& out_file, std::ostream& log);
// What a run asks of the machine, from a simulation of it: `run_args` are
// simulate's options without --hardware and --events (e.g. "--model
// llama2-7b --strategy tp --devices 8 --prompt-len 4096"); any profile gives
// the same shapes. Adds to `options` the run's GEMM shapes (M, N, K) and the
// message sizes of its collectives that span all its ranks (and of its ring
// steps), as the collective tables key them, and, when none is set yet, its
// model as host_gap_model. Throws UsageError when the simulator refuses the
// run.
void add_run_shapes(CalibrateOptions& options, const std::string& run_args, const std::string& hardware = "h100-sxm");
// device.host_gap: the engine's own time before each kernel on a rank's
// thread, which the kernel tables leave out, from a real single-device run's
// decode on `threads` threads, a rank's (null when that run fails).
nlohmann::json measure_host_gap(std::ostream& log, int threads, const CalibrateOptions& options);
// The profile as calibrate writes it without options: the GEMM shapes and
// row counts measured only because CalibrateOptions asked for them removed.
nlohmann::json grid_only(const nlohmann::json& profile);

// The profile's "device" object, measured in this process with the threads a
// run of `ranks` ranks gives each rank.
nlohmann::json measure_device(std::ostream& log, int ranks, const CalibrateOptions& options);
// The same measured on `ranks` MPI ranks at once (rank 0's figures), plus
// "contention" (see calibrate_rank.cpp).
nlohmann::json measure_device_on_ranks(std::ostream& log, int ranks, const CalibrateOptions& options);
// One rank of measure_device_on_ranks (calibrate-rank): rank 0 measures and
// prints the device object as one JSON line, the others load the host with
// the same measurements until rank 0 is done; then all measure the GEMM times
// in step (each rank on a core of its own) and the contention.
int calibrate_rank(const CalibrateOptions& options);
// The GEMM weight shapes [N, K] calibrate measures and the row counts of
// each: the grid every profile gets, and each of options.gemm_shapes at 1, 2
// and its own M.
std::map<std::pair<int64_t, int64_t>, std::set<int64_t>> gemm_shape_set(const CalibrateOptions& options);
// The "shapes" of device.gemm_times measured in this process (one thread when
// ranks > 1), with `before_each` called untimed before each timed GEMM (a
// barrier: every rank then streams the same weights' worth from memory at
// once, as the ranks of a tensor-parallel decode step do), and each call's
// time replaced by `each_call` of it (one over the ranks: calibrate_rank.cpp
// takes the slowest rank's where each rank has a core, else their mean).
nlohmann::json measure_gemm_times(std::ostream& log, int ranks, const CalibrateOptions& options,
                                  const std::function<void()>& before_each,
                                  const std::function<double(double)>& each_call);
// device.gemm_times: those shapes with their source and how they were measured.
nlohmann::json gemm_table(const nlohmann::json& shapes, const std::string& source, bool in_step, int passes);
// Called before every timed call of measure_device (nullptr: nothing).
void set_calibration_hook(std::function<void()> before_each);
// The calling thread's CPU time in seconds (CLOCK_THREAD_CPUTIME_ID).
double thread_cpu_seconds();
// "measured by shardscope-engine calibrate on <host>, <date>, N thread(s) per rank".
std::string calibration_source(int threads);

// One rank of the collective measurement (bench-collectives-rank --json):
// each of all_reduce, all_gather, reduce_scatter, broadcast, all_to_all and
// sendrecv at each size, through the engine's MpiCommunicator as a run calls
// them (comm stream, spans), each call after a barrier and a sweep of the
// core's private caches; timed from the last rank's start to the last rank's
// end on the host's clock. Rank 0 prints one JSON line per (op, size) with
// the median over iterations.
// `extra` adds sizes for one collective each ("broadcast:3145728").
int collective_timing_rank(const std::vector<int64_t>& sizes, int iterations,
                           const std::vector<std::string>& extra = {});

}  // namespace ss

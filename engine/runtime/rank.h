// What every rank path (inference and training, on cpu ranks or simulated
// ones) shares: the group of ranks and its communicators, how a rank joins it
// and makes its backend, step boundaries that gather every rank's records to
// the root, and the failure handling that turns an exception on any rank into
// one error event, one stderr line and an exit code.
#pragma once

#include <functional>
#include <ostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/mpi_communicator.h"
#include "core/allocator.h"
#include "core/backend.h"
#include "core/trace.h"
#include "cuda/bench_options.h"
#include "model/config.h"
#include "model/parallel.h"
#include "protocol/events.h"
#include "runtime/run.h"

namespace ss {

struct HardwareProfile;

// The ranks of a run and their communicators. A single-device run has no MPI
// at all; every other strategy runs one MPI process per device.
struct Group {
  std::unique_ptr<MpiWorld> mpi;
  std::shared_ptr<CommStream> stream;
  std::unique_ptr<MpiCommunicator> mpi_world;
  std::unique_ptr<Communicator> device_world;  // cuda: NCCL over mpi_world's ranks
  Communicator* world = nullptr;  // MPI, NCCL or simulated; null for a single device
  std::unique_ptr<Communicator> telemetry, tp, sp;
  int rank = 0, size = 1;
  std::vector<std::string> hosts = {host_name()};
  int64_t host_available = -1;  // measured as the ranks start (-1: not yet)
  nlohmann::json config;  // what the ranks agreed on as they joined (cuda: the collectives), merged into the run's
  bool root() const { return rank == 0; }
};

// How a rank joins its world and makes its backend: MPI + cpu, or the
// simulator's threads + sim. Everything else a rank does is the same code.
struct RankSetup {
  std::string backend = "cpu";
  std::function<void(Group&, Recorder&)> connect;  // multi-device: sets rank, size, hosts, world
  std::function<std::unique_ptr<Backend>(Allocator&, Recorder&)> make_backend;
  std::function<void(int)> abort;  // ends every rank after a failure
  // Shared failure record (simulator): claim returns false when another rank
  // failed first; first_failure gives that rank's error and exit code.
  std::function<bool(const proto::Error&, int)> claim_failure;
  std::function<std::pair<proto::Error, int>()> first_failure;
  int64_t default_capacity = 0;
  nlohmann::json config;  // extra config fields (the hardware profile)
};

// A cpu rank of an MPI job of `devices` ranks (or one process alone).
RankSetup mpi_rank_setup(int devices);
// Joins the MPI job of `devices` ranks: the world, its hosts, one clock, the comm stream.
void connect_mpi(Group& g, Recorder& rec, int devices);
// A cuda rank (runtime/cuda_rank.cpp): a process per rank on its local
// rank's GPU, NCCL between the GPUs, MPI for the host side. Where a host has
// more ranks than GPUs, they share them in turn and their collectives go
// through host memory over MPI (NCCL refuses two ranks of one communicator
// on a device). Refused with the reason where this engine has no CUDA or
// this machine no usable GPU.
RankSetup cuda_rank_setup(int devices);
// Refuses --backend cuda before launch where this host has no usable GPU.
void check_gpu_count(int devices);
// The memory each rank of a `devices`-rank cuda run started here would have
// by default (cuda_rank_setup's share, on the GPU that gives least), or 0
// with `why` where this host has no usable GPU.
int64_t cuda_default_capacity(int devices, std::string* why);
// The same kernels under the host emulator of engine/cuda/emu (`--backend
// cuda-emu`, for the tests: slow, no GPU involved), their collectives staged
// over MPI as ranks sharing a GPU have them. The executable that links the
// emulator registers how to make its backend and world.
struct EmulatedCuda {
  std::function<std::unique_ptr<Backend>(Allocator&, Recorder&)> make_backend;
  // The world the ranks' collectives use: the host communicator staged
  // through the emulated device memory (cuda/staged_communicator.h), its
  // copies on the compute stream of the device the run's backend then takes.
  std::function<std::unique_ptr<Communicator>(std::unique_ptr<Communicator> host, Recorder& rec)> stage;
  // The world over NCCL's communicator instead, where SHARDSCOPE_NCCL_LIBRARY
  // names a library for it (the tests' stand-in, tests/fake_nccl) and the
  // emulator was built with it (null otherwise): `timeout_s` as --backend cuda's.
  std::function<std::unique_ptr<Communicator>(std::unique_ptr<MpiCommunicator> host, Recorder& rec, double timeout_s)>
      nccl;
  std::function<int(const CudaBenchOptions&, std::ostream&)> bench;
  std::function<nlohmann::json(bool quick, std::ostream& log)> calibrate;
};
void register_emulated_cuda(EmulatedCuda emulated);
RankSetup emulated_cuda_rank_setup(int devices);
// The rank setup of --backend cpu, cuda or cuda-emu.
RankSetup rank_setup_for(const std::string& backend, int devices);
// bench --backend cuda (or cuda-emu), and the NCCL table's ranks (bench-nccl-rank).
int run_cuda_bench(const std::string& backend, const CudaBenchOptions& o, std::ostream& out);
// calibrate --backend cuda (or cuda-emu, with `quick` sizes): the GPU's profile for the simulator.
nlohmann::json calibrate_cuda(const std::string& backend, bool quick, std::ostream& log);
int run_nccl_bench_rank();
// What `info` says of the cuda backend: the GPUs, or why there are none.
void describe_cuda(std::ostream& out);

// Runs `rank_main(out, group, recorder, setup)` on `devices` simulated ranks
// (threads) of `hw` over `nodes` nodes; rank 0 writes to `out`. Returns rank
// 0's result, which reports the first failure of any rank. Untimed (not
// `timed`), the ranks' collectives do not meet (RunOptions::timeline).
using RankMain = std::function<RunResult(proto::Writer*, Group&, Recorder&, const RankSetup&)>;
RunResult simulate_ranks(int devices, bool single, const HardwareProfile& hw, int nodes, bool timed,
                         nlohmann::json config, proto::Writer& out, const RankMain& rank_main);

// Joins the world (multi-device strategies) and splits it: rank = sp_rank·T +
// tp_rank, so tensor-parallel groups are neighbours; tsp is one group.
void join_group(Group& g, Recorder& rec, const RankSetup& setup, Strategy s, int T);
// This rank's place in the strategy's mesh, with its communicators.
Parallel make_parallel(const Group& g, Strategy s, int T, int S, bool zigzag);
// Memory of this rank's device: --capacity, the profile's, or (cpu) its share
// of the host's, after refusing a setup whose weights cannot fit.
int64_t device_capacity(const Group& g, const RankSetup& setup, const ModelConfig& cfg, const RunOptions& o);

class Model;
// The resident placement of every weight on `rank`; under tsp also, for each
// ring or broadcast step, the shard each rank holds while it computes it.
std::vector<proto::Placement> placements(const Model& model, int rank);

// A rank's memory at the end of a run, as per-rank metrics: each category's
// own peak (`peak_<category>_bytes`), the highest total held at once
// (`peak_bytes`) and what each category held at that moment
// (`at_peak_<category>_bytes`, summing to peak_bytes).
struct MemState;
void push_peak_metrics(std::vector<std::string>& extra, const MemState& m, int rank);

// A step boundary: rank 0 writes its own records (and `extra` lines) and
// gathers every other rank's on the telemetry communicator.
void step_boundary(Group& g, Recorder& rec, std::vector<std::string>& extra, proto::Writer* out);

// Runs a rank's body and turns what it throws (usage, format, oom, host
// allocation, internal) into the error event, the exit code and the
// abort of the other ranks. `hello` writes the stream's first record once.
RunResult guarded_rank(proto::Writer* out, Group& g, Recorder& rec, const RankSetup& setup,
                       const std::function<RunResult(const std::function<void()>& hello)>& body);

}  // namespace ss

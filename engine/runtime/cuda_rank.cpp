// A rank of a cuda run: a process per rank on its local rank's GPU, MPI for
// the host side (start-up, telemetry), NCCL between the GPUs, or MPI through
// host memory where ranks share a GPU (engine/cuda).
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "runtime/rank.h"

#ifdef SHARDSCOPE_HAVE_CUDA
#include "cuda/bench.h"
#include "cuda/cuda_backend.h"
#include "cuda/nccl_communicator.h"
#include "cuda/staged_communicator.h"
#include "cuda/runtime.h"
#endif

namespace ss {

namespace {
EmulatedCuda& emulated() {
  static EmulatedCuda e;
  return e;
}

// Seconds an NCCL operation may stay outstanding before the run is ended
// (a peer that stopped answering); SHARDSCOPE_NCCL_TIMEOUT overrides.
double nccl_timeout_s() {
  if (const char* v = std::getenv("SHARDSCOPE_NCCL_TIMEOUT")) return std::atof(v);
  return 120.0;
}
}  // namespace

void register_emulated_cuda(EmulatedCuda e) { emulated() = std::move(e); }

RankSetup emulated_cuda_rank_setup(int devices) {
  if (!emulated().make_backend)
    throw UsageError("--backend cuda-emu: this program was built without the cuda emulator (it is the tests' "
                     "backend); use --backend cpu or cuda");
  RankSetup setup = mpi_rank_setup(devices);
  setup.backend = "cuda-emu";
  setup.make_backend = emulated().make_backend;
  setup.connect = [devices](Group& g, Recorder& rec) {
    connect_mpi(g, rec, devices);
    auto host = std::make_unique<MpiCommunicator>(g.stream, MPI_COMM_WORLD, rec, "world");
    const char* nccl = std::getenv("SHARDSCOPE_NCCL_LIBRARY");
    if (nccl && *nccl && emulated().nccl) {
      g.config = {{"gpu", {{"collectives", std::string("nccl (") + nccl + ")"}}}};
      g.device_world = emulated().nccl(std::move(host), rec, nccl_timeout_s());
    } else {
      g.config = {{"gpu", {{"collectives", "mpi through host memory (emulated devices)"}}}};
      g.device_world = emulated().stage(std::move(host), rec);
    }
    g.world = g.device_world.get();
  };
  return setup;
}

RankSetup rank_setup_for(const std::string& backend, int devices) {
  if (backend == "cuda") return cuda_rank_setup(devices);
  if (backend == "cuda-emu") return emulated_cuda_rank_setup(devices);
  return mpi_rank_setup(devices);
}

int run_cuda_bench(const std::string& backend, const CudaBenchOptions& o, std::ostream& out) {
  if (backend == "cuda-emu") {
    if (!emulated().bench) throw UsageError("--backend cuda-emu: this program was built without the cuda emulator");
    return emulated().bench(o, out);
  }
#ifdef SHARDSCOPE_HAVE_CUDA
  const std::string why = cuda::unavailable_reason();
  if (!why.empty()) throw UsageError("bench --backend cuda: " + why + " (`shardscope-engine info` says what was found)");
  return cuda::run_bench(o, out);
#else
  (void)o;
  (void)out;
  throw UsageError("bench --backend cuda: this engine was built without CUDA (nvcc and the NCCL header were not "
                   "found when it was configured)");
#endif
}

nlohmann::json calibrate_cuda(const std::string& backend, bool quick, std::ostream& log) {
  if (backend == "cuda-emu") {
    if (!emulated().calibrate) throw UsageError("--backend cuda-emu: this program was built without the cuda emulator");
    return emulated().calibrate(quick, log);
  }
  if (backend != "cuda") throw UsageError("calibrate --backend " + backend + ": use cpu (this machine) or cuda (its GPU)");
#ifdef SHARDSCOPE_HAVE_CUDA
  const std::string why = cuda::unavailable_reason();
  if (!why.empty()) throw UsageError("calibrate --backend cuda: " + why + " (`shardscope-engine info` says what was found)");
  return cuda::calibrate(quick, log);
#else
  (void)quick;
  (void)log;
  throw UsageError("calibrate --backend cuda: this engine was built without CUDA");
#endif
}

int run_nccl_bench_rank() {
#ifdef SHARDSCOPE_HAVE_CUDA
  return cuda::nccl_bench_rank();
#else
  throw UsageError("bench-nccl-rank: this engine was built without CUDA");
#endif
}

#ifndef SHARDSCOPE_HAVE_CUDA

void check_gpu_count(int) {}

int64_t cuda_default_capacity(int, std::string* why) {
  *why = "this engine was built without CUDA";
  return 0;
}

RankSetup cuda_rank_setup(int) {
  throw UsageError("--backend cuda: this engine was built without CUDA (nvcc and the NCCL header were not found when "
                   "it was configured); use --backend cpu, or simulate the GPU with `shardscope-engine simulate`");
}

void describe_cuda(std::ostream& out) {
  out << "  cuda  not available: this engine was built without CUDA (no nvcc or NCCL header at configure time)\n";
}

#else

namespace {

// This process's rank among those on its host, from the launcher's environment.
int local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(name)) return std::atoi(v);
  return 0;
}
int local_size() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* v = std::getenv(name)) return std::max(1, std::atoi(v));
  return 1;
}

// A rank's share of its GPU: the free memory, less room for what the
// allocator does not see (the CUDA context, cuBLAS's workspace, NCCL's
// buffers and the kernels' scratch), each sharing rank's own; the rest
// shared evenly.
int64_t share_of(const cuda::DeviceProps& props, int sharing) {
  const int64_t reserve = std::max<int64_t>(int64_t(768) << 20, props.total_bytes / 20);
  return std::max<int64_t>(0, (props.free_bytes - sharing * reserve) / sharing);
}

}  // namespace

int64_t cuda_default_capacity(int devices, std::string* why) {
  *why = cuda::unavailable_reason();
  if (!why->empty()) return 0;
  const int gpus = cuda::device_count();
  const int sharing = (devices + gpus - 1) / gpus;  // launch's ranks on this host, on the busiest GPU
  int64_t least = -1;
  for (int d = 0; d < std::min(devices, gpus); ++d) {
    const int64_t share = share_of(cuda::device_props(d), sharing);
    least = least < 0 ? share : std::min(least, share);
  }
  return std::max<int64_t>(least, 0);
}

void check_gpu_count(int devices) {
  const std::string why = cuda::unavailable_reason();
  if (!why.empty())
    throw UsageError("--backend cuda --devices " + std::to_string(devices) + ": " + why +
                     " (`shardscope-engine info` says what was found); use --backend cpu, or simulate the GPU with "
                     "`shardscope-engine simulate`");
}

RankSetup cuda_rank_setup(int devices) {
  const std::string why = cuda::unavailable_reason();
  if (!why.empty())
    throw UsageError("--backend cuda: " + why + " (`shardscope-engine info` says what was found); use --backend cpu, "
                     "or simulate the GPU with `shardscope-engine simulate`");
  const int gpus = cuda::device_count();
  // The host's local ranks take its GPUs in turn. NCCL refuses two ranks of
  // a communicator on one device, so where ranks share GPUs (or NCCL is
  // missing) collectives go through host memory over MPI; the ranks agree on
  // it as they join (another host may be the one whose ranks share).
  const int sharing = (local_size() + gpus - 1) / gpus;  // ranks on the busiest GPU
  const std::string no_nccl = cuda::nccl_unavailable_reason();
  const std::string stage_here = sharing > 1 && devices > 1 ? "ranks share a GPU"
                                 : !no_nccl.empty()          ? no_nccl
                                                             : "";
  const int device = local_rank() % gpus;
  auto ctx = std::make_shared<std::shared_ptr<cuda::DeviceContext>>();
  RankSetup setup;
  setup.backend = "cuda";
  // This rank's device first: device_props returns to the device that was
  // current, and returning to device 0 would give every rank a context there.
  cuda::set_device(device);
  const cuda::DeviceProps props = cuda::device_props(device);
  setup.default_capacity = share_of(props, sharing);
  setup.config = {{"gpu", {{"name", props.name},
                           {"device", device},
                           {"memory_bytes", props.total_bytes},
                           {"compute_capability", std::to_string(props.cc_major) + "." + std::to_string(props.cc_minor)},
                           {"runtime", cuda::runtime_version()},
                           {"ranks_per_gpu", sharing}}}};
  setup.abort = [](int code) { MPI_Abort(MPI_COMM_WORLD, code); };
  setup.connect = [devices, device, ctx, stage_here](Group& g, Recorder& rec) {
    connect_mpi(g, rec, devices);
    *ctx = std::make_shared<cuda::DeviceContext>(device, rec);
    auto host = std::make_unique<MpiCommunicator>(g.stream, MPI_COMM_WORLD, rec, "world");
    // Staged everywhere if any rank must be: NCCL and MPI worlds do not mix.
    int here = stage_here.empty() ? 0 : 1, anywhere = 0;
    host->stream()
        .enqueue([&] {
          check_mpi(MPI_Allreduce(&here, &anywhere, 1, MPI_INT, MPI_MAX, host->handle()), "MPI_Allreduce", "world");
        })
        ->wait();
    const bool staged = anywhere != 0;
    g.config = {{"gpu", {{"collectives", !staged ? "nccl"
                                         : here  ? "mpi through host memory (" + stage_here + ")"
                                                 : "mpi through host memory (another host's ranks share a GPU or lack NCCL)"}}}};
    if (staged)
      g.device_world = std::make_unique<cuda::StagedCommunicator>(std::move(host), (*ctx)->compute, *ctx);
    else
      g.device_world = std::make_unique<cuda::NcclCommunicator>(std::move(host), *ctx, rec, nccl_timeout_s());
    g.world = g.device_world.get();
  };
  setup.make_backend = [device, ctx](Allocator& a, Recorder& r) -> std::unique_ptr<Backend> {
    if (!*ctx) *ctx = std::make_shared<cuda::DeviceContext>(device, r);  // one device: no group
    return std::make_unique<cuda::CudaBackend>(a, r, *ctx);
  };
  return setup;
}

void describe_cuda(std::ostream& out) {
  const std::string why = cuda::unavailable_reason();
  if (!why.empty()) {
    out << "  cuda  not available: " << why << " (built for sm_80 and sm_90; " << cuda::runtime_version() << ")\n";
    return;
  }
  const std::string nccl = cuda::nccl_version();
  out << "  cuda  available: " << cuda::device_count() << " GPU(s), " << cuda::runtime_version() << ", NCCL "
      << (nccl.empty() ? "not found (" + cuda::nccl_unavailable_reason() + "): collectives over MPI through host memory"
                       : nccl + " (more ranks than GPUs share them, collectives over MPI through host memory)")
      << "\n";
  for (int d = 0; d < cuda::device_count(); ++d) {
    const cuda::DeviceProps p = cuda::device_props(d);
    char line[256];
    std::snprintf(line, sizeof line, "        %d: %s, %.1f GiB (%.1f GiB free), compute capability %d.%d, %d SMs\n", d,
                  p.name.c_str(), double(p.total_bytes) / double(1 << 30), double(p.free_bytes) / double(1 << 30),
                  p.cc_major, p.cc_minor, p.sm_count);
    out << line;
  }
}

#endif

}  // namespace ss

// The rank side of `bench --backend cuda` on several GPUs (hidden
// subcommand `bench-nccl-rank`): NCCL's all-reduce, all-gather and a ring
// send/recv through NcclCommunicator, timed with CUDA events, in nccl-tests'
// terms (doc/PERFORMANCE.md there: algbw = bytes / time; busbw = algbw
// 2(n-1)/n for all-reduce, (n-1)/n for all-gather, 1 for send/recv), with a
// count of wrong elements.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "comm/mpi_communicator.h"
#include "cuda/cuda_backend.h"
#include "cuda/nccl_communicator.h"
#include "cuda/runtime.h"

namespace ss::SS_CUDA_NS {

int nccl_bench_rank() {
  MpiWorld mpi;
  const int gpus = device_count();
  const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const int device = (lr ? std::atoi(lr) : mpi.rank()) % std::max(gpus, 1);
  Recorder rec(mpi.rank());
  rec.set_span_recording(false);
  auto stream = std::make_shared<CommStream>();
  auto ctx = std::make_shared<DeviceContext>(device, rec);
  {
    NcclCommunicator world(std::make_unique<MpiCommunicator>(stream, MPI_COMM_WORLD, rec, "world"), ctx, rec, 60.0);
    Allocator alloc;
    CudaBackend be(alloc, rec, ctx);
    const int n = world.size(), me = world.rank();
    if (me == 0)
      std::printf("%-10s %12s %10s %11s %11s %6s\n", "op", "bytes", "time us", "algbw GB/s", "busbw GB/s", "wrong");
    for (int64_t bytes : {int64_t(1) << 20, int64_t(16) << 20, int64_t(256) << 20, int64_t(1) << 30}) {
      const int64_t count = bytes / 4;
      for (const char* op : {"all_reduce", "all_gather", "sendrecv"}) {
        const std::string o = op;
        const int64_t in_count = o == "all_gather" ? count / n : count;
        Tensor in = be.alloc({in_count}, Category::CommBuffers, "in");
        Tensor out = be.alloc({o == "all_reduce" ? count : o == "all_gather" ? in_count * n : count},
                              Category::CommBuffers, "out");
        be.fill(in, float(me + 1));
        be.fill(out, float(me + 1));
        auto run = [&] {
          if (o == "all_reduce") world.all_reduce(out);
          else if (o == "all_gather") world.all_gather(out, in);
          else world.sendrecv(in, (me + 1) % n, out, (me + n - 1) % n);
        };
        run();
        std::vector<float> host(size_t(out.numel()));
        be.download(out, host.data());
        long long wrong = 0;
        for (int64_t i = 0; i < out.numel(); ++i) {
          const float want = o == "all_reduce"   ? float(n * (n + 1) / 2)
                             : o == "all_gather" ? float(i / in_count + 1)
                                                 : float((me + n - 1) % n + 1);
          wrong += host[size_t(i)] != want;
        }
        constexpr int kReps = 20;
        world.barrier();
        const Event a = create_event(), b = create_event();
        record_event(a, ctx->compute);
        for (int i = 0; i < kReps; ++i) run();
        record_event(b, ctx->compute);
        sync_event(b);
        const double us = event_elapsed_ms(a, b) * 1e3 / kReps;
        destroy_event(a);
        destroy_event(b);
        const double total = double(o == "all_reduce" ? bytes : o == "all_gather" ? in_count * n * 4 : bytes);
        const double algbw = total / (us * 1e-6);
        const double factor = o == "all_reduce" ? 2.0 * (n - 1) / n : o == "all_gather" ? double(n - 1) / n : 1.0;
        if (me == 0)
          std::printf("%-10s %12.0f %10.1f %11.2f %11.2f %6lld\n", op, total, us, algbw * 1e-9, algbw * factor * 1e-9,
                      wrong);
      }
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace ss::SS_CUDA_NS

#include "comm/mpi_bench.h"

#include <algorithm>
#include <chrono>
#include <functional>

#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "core/backend.h"

namespace ss {

namespace {

constexpr int kWarmup = 2;
const char* const kOps[] = {"all_reduce", "all_gather"};

// Small integers: every sum is exact in f32, so a result is right or wrong.
float contribution(int rank, int64_t i) {
  return float(rank + 1 + i % 7);
}

// Elements each rank contributes for a message of `bytes`.
int64_t elements_for(const std::string& op, int64_t bytes, int ranks) {
  const int64_t floats = bytes / int64_t(sizeof(float));
  return std::max<int64_t>(1, op == "all_gather" ? floats / ranks : floats);
}

std::vector<float> local_input(int rank, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = contribution(rank, i);
  return v;
}

int64_t count_wrong(const std::string& op, const std::vector<float>& got, int ranks, int64_t n) {
  int64_t wrong = 0;
  if (op == "all_reduce") {
    for (int64_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < ranks; ++r) want += contribution(r, i);
      wrong += got[size_t(i)] != want;
    }
  } else {
    for (int r = 0; r < ranks; ++r)
      for (int64_t i = 0; i < n; ++i) wrong += got[size_t(r * n + i)] != contribution(r, i);
  }
  return wrong;
}

// The slowest rank's time and the total of wrong elements, on every rank.
void reduce_over_ranks(MPI_Comm comm, double& time_s, int64_t& wrong) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &time_s, 1, MPI_DOUBLE, MPI_MAX, comm), "MPI_Allreduce",
            "bench");
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT64_T, MPI_SUM, comm), "MPI_Allreduce",
            "bench");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

CollectiveTiming make_timing(const std::string& op, const char* path, int ranks, int64_t n,
                             int iterations, double time_s, int64_t wrong) {
  CollectiveTiming t;
  t.op = op;
  t.path = path;
  t.ranks = ranks;
  t.bytes = (op == "all_gather" ? ranks * n : n) * int64_t(sizeof(float));
  t.iterations = iterations;
  t.time_s = time_s;
  t.algbw = time_s > 0 ? double(t.bytes) / time_s : 0;
  t.busbw = t.algbw * wire_bytes(op, 1.0, ranks);  // wire_bytes per payload byte: the bus factor
  t.wrong = wrong;
  return t;
}

}  // namespace

std::vector<CollectiveTiming> bench_bare_collectives(MPI_Comm comm,
                                                     const std::vector<int64_t>& sizes,
                                                     int iterations) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  iterations = std::max(iterations, 1);
  std::vector<CollectiveTiming> out;
  for (int64_t bytes : sizes) {
    for (const std::string op : kOps) {
      const int64_t n = elements_for(op, bytes, ranks);
      std::vector<float> in = local_input(rank, n);
      std::vector<float> buf(size_t(op == "all_gather" ? ranks * n : n));
      std::function<void()> run;
      if (op == "all_reduce") {
        run = [&] {
          check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf.data(), int(n), MPI_FLOAT, MPI_SUM, comm),
                    "MPI_Allreduce", "bench");
        };
        std::copy(in.begin(), in.end(), buf.begin());
      } else {
        run = [&] {
          check_mpi(
              MPI_Allgather(in.data(), int(n), MPI_FLOAT, buf.data(), int(n), MPI_FLOAT, comm),
              "MPI_Allgather", "bench");
        };
      }
      run();
      int64_t wrong = count_wrong(op, buf, ranks, n);
      std::fill(buf.begin(), buf.end(), 0.0f);  // repeated in-place sums of zeros stay finite
      for (int i = 0; i < kWarmup; ++i) run();
      check_mpi(MPI_Barrier(comm), "MPI_Barrier", "bench");
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iterations; ++i) run();
      double time_s = seconds_since(t0) / iterations;
      reduce_over_ranks(comm, time_s, wrong);
      out.push_back(make_timing(op, "mpi", ranks, n, iterations, time_s, wrong));
    }
  }
  return out;
}

std::vector<CollectiveTiming> bench_communicator_collectives(MpiCommunicator& comm, Backend& be,
                                                             const std::vector<int64_t>& sizes,
                                                             int iterations) {
  const int rank = comm.rank(), ranks = comm.size();
  iterations = std::max(iterations, 1);
  std::vector<CollectiveTiming> out;
  for (int64_t bytes : sizes) {
    for (const std::string op : kOps) {
      const int64_t n = elements_for(op, bytes, ranks);
      std::vector<float> host = local_input(rank, n);
      Tensor in = be.alloc({n}, Category::CommBuffers, "bench." + op + ".in");
      Tensor buf = be.alloc({op == "all_gather" ? ranks * n : n}, Category::CommBuffers,
                            "bench." + op + ".out");
      std::function<void()> run;
      if (op == "all_reduce") {
        run = [&] { comm.all_reduce(buf); };
        be.upload(buf, host.data(), DType::F32);
      } else {
        run = [&] { comm.all_gather(buf, in); };
        be.upload(in, host.data(), DType::F32);
      }
      run();
      host.resize(size_t(buf.numel()));
      be.download(buf, host.data());
      int64_t wrong = count_wrong(op, host, ranks, n);
      be.fill(buf, 0.0f);
      for (int i = 0; i < kWarmup; ++i) run();
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iterations; ++i) run();
      double time_s = seconds_since(t0) / iterations;
      comm.stream().enqueue([&] { reduce_over_ranks(comm.handle(), time_s, wrong); })->wait();
      out.push_back(make_timing(op, "communicator", ranks, n, iterations, time_s, wrong));
    }
  }
  return out;
}

std::vector<CollectiveTiming> bench_collectives(MpiCommunicator& comm, Backend& be,
                                                const std::vector<int64_t>& sizes, int iterations) {
  std::vector<CollectiveTiming> bare;
  comm.stream()
      .enqueue([&] { bare = bench_bare_collectives(comm.handle(), sizes, iterations); })
      ->wait();
  const std::vector<CollectiveTiming> layered =
      bench_communicator_collectives(comm, be, sizes, iterations);
  std::vector<CollectiveTiming> out;
  for (size_t i = 0; i < bare.size(); ++i) {
    out.push_back(bare[i]);
    out.push_back(layered[i]);
  }
  return out;
}

}  // namespace ss

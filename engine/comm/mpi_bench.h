// Collective benchmarks on the cpu backend's MPI: the bare MPI calls and the
// same collectives through MpiCommunicator (comm stream, checks, spans), so
// the cost of the engine's layer is the ratio of the two.
//
// Definitions follow nccl-tests (doc/PERFORMANCE.md): `bytes` is the whole
// buffer (for all_gather the gathered output), algbw = bytes / time, busbw =
// algbw * 2(n-1)/n for all_reduce and (n-1)/n for all_gather.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ss {

class Backend;
class MpiCommunicator;

struct CollectiveTiming {
  std::string op;    // all_reduce | all_gather
  std::string path;  // mpi (bare MPI calls) | communicator (through MpiCommunicator)
  int ranks = 0;
  int64_t bytes = 0;  // the whole buffer: the requested size in whole f32 elements per rank
  int iterations = 0;
  double time_s = 0;  // mean time of one operation on the slowest rank
  double algbw = 0;   // bytes per second
  double busbw = 0;   // bytes per second
  int64_t wrong = 0;  // elements that differ from the expected result, all ranks together
};

// Bare MPI_Allreduce (in place) and MPI_Allgather on `comm` for each size in
// bytes, `iterations` timed calls each after a checked call and a warm-up.
// Calls MPI on the calling thread: with a CommStream alive, run it as a task
// on that stream (bench_collectives does).
std::vector<CollectiveTiming> bench_bare_collectives(MPI_Comm comm,
                                                     const std::vector<int64_t>& sizes,
                                                     int iterations);

// The same through `comm` (all_reduce, all_gather) from the calling thread,
// on tensors allocated from `be` as comm buffers. Each call records its span
// on comm's recorder, as in a run.
std::vector<CollectiveTiming> bench_communicator_collectives(MpiCommunicator& comm, Backend& be,
                                                             const std::vector<int64_t>& sizes,
                                                             int iterations);

// Both, bare first (run on comm's stream): for every (op, size) the entry of
// path "mpi" and the entry of path "communicator", in that order.
std::vector<CollectiveTiming> bench_collectives(MpiCommunicator& comm, Backend& be,
                                                const std::vector<int64_t>& sizes, int iterations);

}  // namespace ss

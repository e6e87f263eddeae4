// calibrate for several ranks: the device figures measured while every rank
// of the run measures too, and the contention between a rank's kernels and
// its own collectives.
//
// A run of N ranks on one host computes on N ranks at once: they share the
// memory bandwidth and the last-level cache (a one-row GEMM measured here ran
// 1.6x slower beside a second rank doing the same than alone), and with more
// ranks than cores they share the cores. So rank 0 measures while ranks
// 1..N-1 run the same measurements as load, until rank 0 is done; the GEMM
// times, where every rank has a core, all ranks measure at once, one GEMM
// after a barrier, as the ranks of a tensor-parallel step run them.
//
// Contention: a rank's collectives run on its comm-stream thread (MPI polls
// while it waits), on the cores its kernels use; tsp's rings and sp's
// attention ring keep a transfer in flight beside the GEMMs, and both slow
// down. Every rank runs a GEMM alone, then the same GEMM while a chain of
// ring sendrecvs is in flight on its comm stream, then the chain alone and
// beside back-to-back GEMMs: compute = t(GEMM beside comm) / t(GEMM alone) - 1
// and comm = t(chain beside GEMMs) / t(chain alone) - 1, the slowdown of each
// stream while the other is busy, which the simulator applies to the part of
// a kernel (or a collective) that overlaps the other stream. With more ranks
// than cores, the core and overlap steps (measure_steps) stand for it.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>
#include <thread>

#include "comm/mpi_communicator.h"
#include "core/allocator.h"
#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"
#include "runtime/calibrate.h"
#include "runtime/calibrate_common.h"
#include "runtime/process.h"

namespace ss {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

struct LoadDone {};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// How long a collective posted beside running kernels waits for the core
// (device.contention.hold_us): the comm thread, busy just before with a chain
// of ring steps as in a tsp step, is woken by a post of a small all-reduce
// while a GEMM of about 12 ms runs; from the post to the start of the MPI
// call, the mean of 15. Measured here (2 ranks on 2 cores) the thread ran at
// once in about a third of the trials and otherwise after 2-5 ms, the
// scheduler's slice: whether the woken thread preempts depends on how much
// of the core it had lately, so the mean is the expected wait. (A thread
// idle for long before the post ran at once every time, but in a run the
// comm thread is seldom idle for long.)
double measure_hold(MpiCommunicator& world, CpuBackend& be, Recorder& rec, const std::function<double()>& gemm,
                    const std::function<void()>& chain, std::ostream& log) {
  Tensor tiny = be.alloc({16}, Category::CommBuffers, "hold");
  be.fill(tiny, 1.0f);
  std::vector<double> holds;
  for (int i = 0; i < 15; ++i) {
    world.barrier();
    chain();
    rec.clear();
    const int64_t posted = rec.now();
    Request r = world.iall_reduce(tiny);
    gemm();
    r->wait();
    for (auto& s : rec.take_spans())
      if (s.stream == "comm" && s.op == "all_reduce") holds.push_back(double(std::max<int64_t>(0, s.t0 - posted)) * 1e-9);
  }
  double hold = 0;
  for (double h : holds) hold += h / double(holds.size());
  const auto at_once = std::count_if(holds.begin(), holds.end(), [](double h) { return h < 100e-6; });
  log << "  hold: a collective posted beside a GEMM starts " << std::lround(hold * 1e6) << " us later (mean of "
      << holds.size() << "; " << at_once << " started within 0.1 ms)\n";
  return hold;
}

json measure_contention(MpiCommunicator& world, CpuBackend& be, Recorder& rec, int reps,
                        std::ostream& log) {
  const int n = world.size(), me = world.rank();
  // A prefill-sized GEMM (tens of ms on one thread) and ring steps of 4 MiB.
  Tensor x = be.alloc({256, 1024}, Category::Workspace, "x"), w = be.alloc({2048, 1024}, Category::Workspace, "w");
  Tensor y = be.alloc({256, 2048}, Category::Workspace, "y");
  Tensor send = be.alloc({1 << 20}, Category::CommBuffers, "send"), recv = be.alloc({1 << 20}, Category::CommBuffers, "recv");
  for (Tensor* t : {&x, &w, &send}) be.fill(*t, 0.01f);
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  auto gemm = [&] {
    const auto t0 = Clock::now();
    be.matmul(y, x, w);
    return seconds_since(t0);
  };
  auto post = [&](int steps) {
    std::vector<Request> reqs;
    for (int i = 0; i < steps; ++i) reqs.push_back(world.isendrecv(send, next, recv, prev));
    return reqs;
  };
  auto wait_all = [](std::vector<Request>& reqs) {
    for (auto& r : reqs) r->wait();
  };
  std::vector<double> alone, beside, chain_alone, chain_beside;
  double step = 0, probe = 0;  // one ring step alone; the GEMM alone
  {
    std::vector<double> s, g;
    for (int i = 0; i < 5; ++i) {
      world.barrier();
      g.push_back(gemm());
      world.barrier();
      const auto t0 = Clock::now();
      world.sendrecv(send, next, recv, prev);
      s.push_back(seconds_since(t0));
    }
    step = std::max(median(s), 1e-6);
    probe = median(g);
  }
  // The chain lasts about twice the GEMM alone, so the GEMM overlaps it throughout.
  // (Rank 0's count on every rank: each posts the same chain.)
  Tensor count = be.alloc({1}, Category::CommBuffers, "steps");
  be.fill(count, float(std::clamp(std::ceil(2 * probe / step), 4.0, 512.0)));
  world.broadcast(count, 0);
  float steps_f = 0;
  be.download(count, &steps_f);
  const int steps = int(steps_f);
  // The four measurements in turn, `reps` times, so that a burst of load from
  // elsewhere on the host falls on one repetition of each, not on all of one.
  for (int i = 0; i < reps; ++i) {
    world.barrier();
    alone.push_back(gemm());
    {
      world.barrier();
      const auto t0 = Clock::now();
      auto reqs = post(steps);
      wait_all(reqs);
      chain_alone.push_back(seconds_since(t0));
    }
    {
      world.barrier();
      auto reqs = post(steps);
      beside.push_back(gemm());
      wait_all(reqs);
    }
    world.barrier();
    rec.clear();
    const auto t0 = Clock::now();
    auto reqs = post(steps);
    while (!reqs.back()->done()) gemm();
    wait_all(reqs);
    // The chain's end: its last span's end (the GEMM that was running then
    // may end later).
    double end = 0;
    for (auto& s : rec.take_spans())
      if (s.stream == "comm") end = std::max(end, double(s.t1));
    const double start = double(std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count());
    chain_beside.push_back(std::max(0.0, end - start) * 1e-9);
  }
  // Each rank has cores of its own (with more ranks than cores the overlap
  // steps stand for all of this); its two threads share them as the hold
  // describes.
  const double hold = measure_hold(world, be, rec, gemm, [&] {
    auto reqs = post(8);
    wait_all(reqs);
  }, log);
  // The simulator slows the streams only past the hold (sim/sim_clock.h):
  // the GEMM ran alone for the first `hold` of it, and the chain waited that
  // long before it moved, so the slowdowns are of what came after.
  const double g = median(alone), gb = median(beside), c = median(chain_alone), cb = median(chain_beside);
  const double h = std::min(hold, 0.5 * g);
  const double compute = std::max(0.0, (gb - h) / (g - h) - 1);
  const double comm = std::max(0.0, (cb - h) / c - 1);
  char line[300];
  std::snprintf(line, sizeof line,
                "  contention: a 256x2048x1024 GEMM %.2f ms alone, %.2f ms beside %d ring steps of 4 MiB (+%.0f%%); "
                "the steps %.2f ms alone, %.2f ms beside GEMMs (+%.0f%%)\n",
                median(alone) * 1e3, median(beside) * 1e3, steps, 100 * compute, median(chain_alone) * 1e3,
                median(chain_beside) * 1e3, 100 * comm);
  log << line;
  json out = {{"compute", compute},
          {"comm", comm},
          {"source", calibration_source(1) + ", " + std::to_string(n) + " ranks"},
          {"note", "slowdown of a rank's kernels while its comm stream has a collective in flight (compute), and "
                   "of its collectives while its kernels run (comm): a 256x2048x1024 GEMM beside a chain of 4 MiB "
                   "ring sendrecvs on every rank at once, against each alone (medians of " + std::to_string(reps) +
                   "); with a hold, of the time after it; hold_us: from the post of a small all-reduce, the "
                   "comm thread just busy with 8 ring steps, to its start while a GEMM runs (mean of 15)"},
          {"hold_us", hold * 1e6}};
  return out;
}

// With more ranks than cores, how the ranks share the cores while they work
// as a run's do: a kernel, then a collective that waits for every rank, again
// and again. A rank that waits polls MPI on its share of a core, and the ranks
// reach each collective as the scheduler's slices let them. Every rank runs
// GEMMs of M rows, each followed by a 4 KiB all-reduce; per M, the median of
// five trials (see `quick` below) of the GEMM's thread CPU time and the whole
// step's wall time (means over ranks). calibrate_machine turns them into core
// shares once it knows what the simulator charges for the all-reduce.
//
// With `beside` ("broadcast" or "sendrecv"), the same GEMMs as tsp runs them
// instead, each beside a collective of 1 MiB posted just before it and waited
// for just after: a broadcast from the ranks in turn, or a ring step, each
// call on buffers of its own from a pool of twice the last-level cache. Per M
// also the GEMM's wall time and the wait's, which calibrate_machine turns
// into the overlap steps (sim/sim_clock.h).
//
// `quick` (calibrate --quick, a smoke test): three trials of about 0.1 s
// instead of five of 0.3 s.
json measure_steps(MpiCommunicator& world, CpuBackend& be, int cores, const std::string& beside, bool quick,
                   std::ostream& log) {
  const int trial_count = quick ? 3 : 5;
  const double trial_seconds = quick ? 0.1 : 0.3;
  const bool overlapped = !beside.empty();
  const int n = world.size();
  Tensor w = be.alloc({1024, 1024}, Category::Workspace, "w"), sync = be.alloc({1024}, Category::CommBuffers, "sync");
  be.fill(w, 0.01f);
  be.fill(sync, 1.0f);
  constexpr int64_t kCast = 1 << 18;  // floats: 1 MiB
  std::vector<Tensor> casts;  // blocks of their own, as a run's tensors (calibrate_collectives.cpp)
  if (overlapped)
    for (int64_t i = 0; i < std::clamp<int64_t>(2 * l3_bytes() / (4 * kCast), 2, 64) / 2 * 2; ++i) {
      casts.push_back(be.alloc({kCast}, Category::CommBuffers, "pool"));
      be.fill(casts.back(), 1.0f);
    }
  auto mean_over_ranks = [&](double v) {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce", "calibrate");
    return v / n;
  };
  const std::vector<int64_t> sizes = {4, 32, 256};  // GEMMs of about 0.15, 0.9 and 5.5 ms of CPU time here
  struct Trial {
    double kernel_us, step_us, kernel_wall_us, wait_us;  // per step, means over ranks
  };
  struct Size {
    Tensor x, y;
    int count = 0;
    std::vector<Trial> trials;
  };
  std::vector<Size> at;
  for (int64_t M : sizes) {
    at.emplace_back();
    at.back().x = be.alloc({M, 1024}, Category::Workspace, "x");
    at.back().y = be.alloc({M, 1024}, Category::Workspace, "y");
    be.fill(at.back().x, 0.01f);
  }
  int turn = 0;
  const int me = world.rank();
  auto post = [&] {
    const size_t at = size_t(turn % int(casts.size() / 2)) * 2;
    const int root = turn++ % n;
    if (beside == "sendrecv") return world.isendrecv(casts[at], (me + 1) % n, casts[at + 1], (me + n - 1) % n);
    return world.ibroadcast(casts[at], root);
  };
  // Seconds over `count` steps: CPU and wall time of the GEMMs, the waits
  // after them, all. Overlapped, as tsp's turns run: wait for turn i, post
  // turn i + 1, compute turn i; so each wait but the first follows a GEMM
  // the collective waited for ran beside (the first wait, with no GEMM
  // before it, is left out of the waits).
  auto steps = [&](Size& s, int count) {
    double cpu = 0, kernel = 0, wait = 0;
    world.barrier();
    const auto t0 = Clock::now();
    Request turn = overlapped ? post() : nullptr;
    for (int i = 0; i < count; ++i) {
      if (overlapped) {
        const auto w0 = Clock::now();
        turn->wait();
        if (i > 0) wait += seconds_since(w0);
        turn = post();
      }
      const auto k0 = Clock::now();
      const double c0 = thread_cpu_seconds();
      be.matmul(s.y, s.x, w);
      cpu += thread_cpu_seconds() - c0;
      const auto w0 = Clock::now();
      kernel += std::chrono::duration<double>(w0 - k0).count();
      if (!overlapped) {
        world.all_reduce(sync);
        wait += seconds_since(w0);
      }
    }
    if (overlapped) {  // the last turn's wait follows the last GEMM
      const auto w0 = Clock::now();
      turn->wait();
      wait += seconds_since(w0);
    }
    return Trial{cpu, seconds_since(t0), kernel, wait};
  };
  // One transfer on every buffer first: the first from or to a page is the
  // slow one (calibrate_collectives.cpp).
  for (size_t i = 0; overlapped && i < casts.size() / 2; ++i) post()->wait();
  // Every rank must make the same number of calls: the count comes from the
  // slowest rank's probe, for about trial_seconds a trial.
  for (Size& s : at) {
    double probe = steps(s, 5).step_us / 5;
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &probe, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce",
              "calibrate");
    s.count = int(std::clamp(trial_seconds / std::max(probe, 1e-9), 10.0, 4000.0));
  }
  // Five trials per size, the sizes in turn, so that a burst of load from
  // elsewhere falls on one trial of each rather than on every trial of one.
  for (int t = 0; t < trial_count; ++t)
    for (Size& s : at) {
      const Trial r = steps(s, s.count);
      auto per_step = [&](double seconds) { return mean_over_ranks(1e6 * seconds / s.count); };
      s.trials.push_back({per_step(r.kernel_us), per_step(r.step_us), per_step(r.kernel_wall_us), per_step(r.wait_us)});
    }
  json rows = json::array();
  std::string text;
  for (size_t i = 0; i < at.size(); ++i) {
    auto& trials = at[i].trials;
    std::sort(trials.begin(), trials.end(),
              [](const Trial& l, const Trial& r) { return l.kernel_us / l.step_us < r.kernel_us / r.step_us; });
    const Trial& m = trials[trials.size() / 2];
    rows.push_back({{"rows", sizes[i]}, {"kernel_us", m.kernel_us}, {"step_us", m.step_us},
                    {"kernel_wall_us", m.kernel_wall_us}, {"wait_us", m.wait_us}});
    char b[160];
    if (overlapped)
      std::snprintf(b, sizeof b, "%s%.0f us (%.0f us wall) then a %.0f us wait", text.empty() ? "" : ", ",
                    m.kernel_us, m.kernel_wall_us, m.wait_us);
    else
      std::snprintf(b, sizeof b, "%s%.0f us in steps of %.0f us", text.empty() ? "" : ", ", m.kernel_us, m.step_us);
    text += b;
  }
  log << "  " << (overlapped ? "overlap" : "core") << " steps: " << n << " ranks on " << cores << " cores, a GEMM's CPU time "
      << (overlapped ? "beside a 1 MiB " + beside + ": " : "then a 4 KiB all-reduce: ") << text << "\n";
  return {{"sync_bytes", overlapped ? 4 * kCast : sync.nbytes()}, {"steps", rows}, {"trials", trial_count}};
}

}  // namespace

int calibrate_rank(const CalibrateOptions& given) {
  MpiWorld mpi;
  const int ranks = mpi.size(), me = mpi.rank();
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  // The GEMM times are measured apart, every rank calling the same GEMM at
  // once, where each rank has a core of its own: the ranks of a tensor-
  // parallel step run the same GEMM at the same time (an all-reduce lines
  // them up every layer), and one-row GEMMs, bound by memory, slow each other
  // down most. Measured in the load phase instead, where the loading rank
  // is out of step and mostly inside the long prefill-sized GEMMs, the
  // one-row GEMMs of small-llama's tp decode on 2 ranks came out 5-27%
  // faster (gate_up 753 against 953 us, the means of three calibrations
  // each, alternating), and the measured run's own spans sided with the
  // latter. With more ranks than cores too, on the thread CPU clock there
  // (core_share says what part of a core a rank gets): timed on rank 0
  // beside the other ranks' load phase, the one-row GEMMs depended on what
  // that load was doing at the time (tp's 131 MB lm_head at 4 ranks on 2
  // cores: 10.3, 14.6 and 18.1 ms of CPU in three calibrations minutes
  // apart), while in a run every rank streams its weights at once.
  const bool gemms_in_step = ranks > 1;
  CalibrateOptions options = given;
  options.gemms_in_step = gemms_in_step;
  json device;
  // Rank 0 measures; the others repeat the same measurements as load until
  // rank 0 enters the barrier that ends the phase.
  MPI_Request done = MPI_REQUEST_NULL;
  if (me == 0) {
    std::ostringstream log;
    device = measure_device(log, ranks, options);
    std::printf("%s", log.str().c_str());
    check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &done), "MPI_Ibarrier", "calibrate");
  } else {
    check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &done), "MPI_Ibarrier", "calibrate");
    set_calibration_hook([&done] {
      int finished = 0;
      check_mpi(MPI_Test(&done, &finished, MPI_STATUS_IGNORE), "MPI_Test", "calibrate");
      if (finished) throw LoadDone{};
    });
    std::ostringstream sink;
    try {
      for (;;) measure_device(sink, ranks, options);
    } catch (const LoadDone&) {
    }
    set_calibration_hook(nullptr);
  }
  if (done != MPI_REQUEST_NULL) check_mpi(MPI_Wait(&done, MPI_STATUS_IGNORE), "MPI_Wait", "calibrate");
  std::ostringstream gemm_log;
  if (gemms_in_step) {
    // The ranks of a step wait for the slowest at their next collective, so
    // where each rank has a core, each call's time is the slowest rank's. On
    // this host one rank's core is often the slower by 10-20% for a whole run
    // (a tp decode's GEMMs: 155 ms on rank 1 against 135 on rank 0, the same
    // shapes), and the ranks also take turns being late by tens of
    // microseconds call by call (small-llama's tp decode on 2 ranks: the
    // ranks reached its all-reduces 50 us apart on average), which the
    // slowest of each rank's median missed. With more ranks than cores the
    // core share stands for that wait (its steps' wall time holds it, set
    // against the ranks' mean CPU time), so there each call's time is the
    // mean over the ranks: their slowest would count the wait twice.
    const bool slowest_rank = ranks <= cores;
    double own = 0, combined = 0;
    json shapes = measure_gemm_times(
        gemm_log, ranks, options, [] { check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier", "calibrate"); },
        [&](double t) {
          double all = t;
          check_mpi(MPI_Allreduce(&t, &all, 1, MPI_DOUBLE, slowest_rank ? MPI_MAX : MPI_SUM, MPI_COMM_WORLD),
                    "MPI_Allreduce", "calibrate");
          if (!slowest_rank) all /= ranks;
          own += t;
          combined += all;
          return all;
        });
    char b[160];
    std::snprintf(b, sizeof b, "  gemm times: each call the %s, %+.1f%% against rank 0's own in all\n",
                  slowest_rank ? "slowest rank's" : "mean over the ranks", 100 * (combined / std::max(own, 1e-12) - 1));
    gemm_log << b;
    if (me == 0) device["gemm_times"] = gemm_table(shapes, device["sources"].value("all", ""), true, options.passes());
  }

  Recorder rec(me);
  rec.set_origin(Clock::time_point{});
  rec.set_mem_sampling(false);
  auto stream = std::make_shared<CommStream>();
  {
    MpiCommunicator world(stream, MPI_COMM_WORLD, rec, "calibrate");
    Allocator alloc;
    CpuBackend be(alloc, rec);
    std::ostringstream log;
    // Where each rank has a core, how its two threads share it; with more
    // ranks than cores, how all of them share the cores (which the
    // contention figures would only blur: the simulator then uses these).
    json contention, steps, overlap;
    if (ranks <= cores) {
      contention = measure_contention(world, be, rec, options.quick ? 3 : 9, log);
    } else {
      steps = measure_steps(world, be, cores, "", options.quick, log);
      for (const char* op : {"broadcast", "sendrecv"})
        overlap[op] = measure_steps(world, be, cores, op, options.quick, log);
    }
    if (me == 0) {
      if (!contention.is_null()) device["contention"] = contention;
      if (!steps.is_null()) device["core_steps"] = steps;
      if (!overlap.is_null()) device["overlap_raw"] = overlap;
      std::printf("%s%s@device %s\n", gemm_log.str().c_str(), log.str().c_str(), device.dump().c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

json measure_device_on_ranks(std::ostream& log, int ranks, const CalibrateOptions& options) {
  std::string args = options.quick ? "calibrate-rank --quick" : "calibrate-rank";
  if (!options.gemm_shapes.empty()) {
    args += " --shapes ";
    for (size_t i = 0; i < options.gemm_shapes.size(); ++i) {
      const auto& s = options.gemm_shapes[i];
      args += (i ? "," : "") + std::to_string(s[0]) + ":" + std::to_string(s[1]) + ":" + std::to_string(s[2]);
    }
  }
  log << "  (every figure measured on rank 0 of " << ranks << " ranks measuring at once)\n" << std::flush;
  std::FILE* p = popen((mpirun_self_command(ranks, args) + " 2>&1").c_str(), "r");
  if (!p) throw std::runtime_error("calibrate: cannot start mpirun");
  std::string line, tail;
  json device;
  char buf[1 << 16];
  while (std::fgets(buf, sizeof buf, p)) {
    line += buf;
    if (line.empty() || line.back() != '\n') continue;
    if (line.rfind("@device ", 0) == 0) device = json::parse(line.substr(8), nullptr, false);
    else {
      log << line << std::flush;
      tail = line;
    }
    line.clear();
  }
  const int rc = pclose(p);
  if (rc != 0 || device.is_discarded() || !device.is_object())
    throw std::runtime_error("calibrate: the " + std::to_string(ranks) + " measuring ranks failed (" +
                             (tail.empty() ? "no output" : tail.substr(0, tail.size() - 1)) + ")");
  return device;
}

}  // namespace ss

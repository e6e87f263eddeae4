// calibrate's collectives: each collective of the engine's communicator timed
// over message sizes between the ranks of this host, and alpha-beta fitted to
// the times for the cost model's formulas.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

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

using json = nlohmann::json;

// Alpha and beta of one collective from its times over sizes, for the cost
// model's formula at `n` ranks (t = ca * alpha + cb * S / beta): least squares
// on the relative error, alpha and 1/beta kept positive.
std::pair<double, double> fit_alpha_beta(const std::string& op, int n,
                                         const std::vector<std::pair<double, double>>& pts) {
  const double steps = n - 1, lg = std::ceil(std::log2(double(n)));
  double ca = 1, cb = 1;
  if (op == "all_reduce")
    ca = 2 * steps, cb = 2 * steps / n;
  else if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all")
    ca = steps, cb = steps / n;
  else if (op == "broadcast")
    ca = lg, cb = lg;
  // Minimise sum ((ca a + cb S x - t) / t)^2 over a, x >= 0.
  double s_aa = 0, s_ax = 0, s_xx = 0, s_at = 0, s_xt = 0;
  for (auto [S, t] : pts) {
    const double u = ca / t, v = cb * S / t;
    s_aa += u * u, s_ax += u * v, s_xx += v * v, s_at += u, s_xt += v;
  }
  const double det = s_aa * s_xx - s_ax * s_ax;
  double a = det > 0 ? (s_at * s_xx - s_xt * s_ax) / det : 0,
         x = det > 0 ? (s_xt * s_aa - s_at * s_ax) / det : 0;
  if (!(a > 0)) a = 0, x = s_xt / s_xx;
  if (!(x > 0)) x = 0, a = s_at / s_aa;
  // A profile's figures are positive: a fit at zero becomes 1 ns, or 1 PB/s.
  a = std::max(a, 1e-9);
  x = std::max(x, 1e-15);
  return {a, 1.0 / x};
}

}  // namespace

int collective_timing_rank(const std::vector<int64_t>& sizes, int iterations, const std::vector<std::string>& extra) {
  MpiWorld mpi;
  const int n = mpi.size(), me = mpi.rank();
  cpu::set_threads(1);
  // The host's steady clock itself on every rank (one host), so the ranks'
  // span times compare directly.
  Recorder rec(me);
  rec.set_origin(std::chrono::steady_clock::time_point{});
  rec.set_mem_sampling(false);
  auto stream = std::make_shared<CommStream>();
  {
    MpiCommunicator world(stream, MPI_COMM_WORLD, rec, "calibrate");
    Allocator alloc;
    CpuBackend be(alloc, rec);
    CacheSweep sweep;
    // Each collective over `comm`, a group of `g` ranks; with groups of
    // fewer ranks than the world, every group at once.
    auto time_on = [&](Communicator& comm, int g) {
      const int at = comm.rank();
      for (const char* op : kTimedCollectives) {
        const std::string o = op;
        std::set<int64_t> op_sizes(sizes.begin(), sizes.end());
        for (const std::string& e : extra)
          if (e.size() > o.size() && e.compare(0, o.size() + 1, o + ":") == 0) {
            const std::string bytes = e.substr(o.size() + 1);
            if (bytes.empty() || bytes.find_first_not_of("0123456789") != std::string::npos)
              throw UsageError("--extra takes OP:BYTES with BYTES a whole number, got " + e);
            op_sizes.insert(std::stoll(bytes));
          }
        for (int64_t bytes : op_sizes) {
          // Whole f32 elements per rank; `bytes` is the whole buffer as in wire_bytes().
          const bool split = o == "all_gather" || o == "reduce_scatter" || o == "all_to_all";
          const int64_t per = std::max<int64_t>(1, bytes / 4 / (split ? g : 1));
          const int64_t total = split ? per * g : per;
          // Each call moves buffers of its own from a pool of twice the last-
          // level cache, so its data comes from memory, as a run's weights and
          // the activations of a whole layer ago do (a 4 MiB broadcast measured
          // over one buffer, warm in the cache, took half the time the same
          // broadcast of weights took in a tsp run). Each buffer is a block
          // of its own, as a run's tensors are: below 2 MiB in 4 KiB pages,
          // from 2 MiB on in huge pages (host_blocks.h). The single-copy
          // transfer between ranks pins every page it moves, and slices of
          // one huge-page block instead made a 1 MiB broadcast look twice as
          // fast as a run's weight shards move (4 ranks on 2 cores here:
          // 480-820 us against 1000-1570 us, waited for after a short GEMM).
          // Two buffers at least, so that no call moves the bytes the call
          // before it left in the cache: with one (the pool's rule for a
          // message past the last-level cache) a 17.3 MB sendrecv on 2 ranks
          // took 0.84-1.13 ms, with two or three (each send buffer read first,
          // below) 1.13-1.61 ms, and the same transfer in a tsp run (its MLP
          // ring at 2 ranks) 1.27-1.45 ms after the last arrival.
          const int64_t na = split && o != "all_gather" ? total : per,
                        nb = split && o != "reduce_scatter" ? total : per;
          const int pool = int(std::clamp<int64_t>(2 * l3_bytes() / (4 * (na + nb)), 2, 64));
          std::vector<Tensor> as, bs;
          for (int i = 0; i < pool; ++i) {
            as.push_back(be.alloc({na}, Category::CommBuffers, "send"));
            bs.push_back(be.alloc({nb}, Category::CommBuffers, "recv"));
            be.fill(as.back(), 1.0f);
            be.fill(bs.back(), 0.0f);
          }
          int turn = 0;
          auto call = [&] {
            const Tensor &a = as[size_t(turn % pool)], &b = bs[size_t(turn % pool)];
            ++turn;
            if (o == "all_reduce")
              comm.all_reduce(a);
            else if (o == "all_gather")
              comm.all_gather(b, a);
            else if (o == "reduce_scatter")
              comm.reduce_scatter(b, a);
            else if (o == "broadcast")
              comm.broadcast(a, 0);
            else if (o == "all_to_all")
              comm.all_to_all(b, a);
            else
              comm.sendrecv(a, (at + 1) % g, b, (at + g - 1) % g);
          };
          const int iters = int(std::clamp<int64_t>(
              int64_t(iterations) * 65536 / std::max<int64_t>(bytes, 1), 5, iterations));
          // Warm-up: one call on every buffer of the pool first. The first
          // transfer from or to a page is the slow one (2-7 ms for 1 MiB here,
          // against 0.3-1 ms after), and a run moves its weights and reuses
          // its buffers again and again.
          for (int i = 0; i < pool; ++i) call();
          std::vector<double> t0(static_cast<size_t>(iters)), t1(static_cast<size_t>(iters));
          for (int i = 0; i < iters; ++i) {
            sweep();  // before the barrier: the ranks then start together
            // Every ring in the engine sends what the rank's kernels have just
            // used (tsp's shard its GEMMs read, a K/V block just copied), and
            // a transfer of bytes warm in the sender's caches was the slower
            // here (the 17.3 MB sendrecv over two buffers, in alternating
            // rounds: 1.14-1.44 ms against 1.04-1.08 ms from memory).
            if (o == "sendrecv") {
              const Tensor& a = as[size_t(turn % pool)];
              sweep.read(a.data<float>(), size_t(a.numel()));
            }
            world.barrier();
            rec.clear();
            call();
            const auto spans = rec.take_spans();
            t0[size_t(i)] = spans.empty() ? 0 : double(spans.back().t0);
            t1[size_t(i)] = spans.empty() ? 0 : double(spans.back().t1);
          }
          // Per iteration: from the last rank's start to the last rank's end.
          stream
              ->enqueue([&] {
                check_mpi(MPI_Allreduce(MPI_IN_PLACE, t0.data(), iters, MPI_DOUBLE, MPI_MAX,
                                        MPI_COMM_WORLD),
                          "MPI_Allreduce", "calibrate");
                check_mpi(MPI_Allreduce(MPI_IN_PLACE, t1.data(), iters, MPI_DOUBLE, MPI_MAX,
                                        MPI_COMM_WORLD),
                          "MPI_Allreduce", "calibrate");
              })
              ->wait();
          std::vector<double> d(static_cast<size_t>(iters));
          for (int i = 0; i < iters; ++i)
            d[size_t(i)] = std::max(0.0, t1[size_t(i)] - t0[size_t(i)]) * 1e-9;
          if (me == 0)
            std::printf("%s\n", json{{"op", o},
                                     {"ranks", g},
                                     {"bytes", total * 4},
                                     {"iterations", iters},
                                     {"time_s", median(d)}}
                                    .dump()
                                    .c_str());
        }
      }
    };
    time_on(world, n);
    // Where the ranks can form a mesh (tp_sp's tensor- and sequence-parallel
    // groups), in groups of each size that divides them, consecutive ranks
    // together, every group at once. On a host with more ranks than cores
    // a group's collective costs what the scheduler takes to bring its
    // ranks together, as the world's does, which the formula fitted to the
    // world's times leaves out: 4 ranks on 2 cores here, a 4 KiB all-reduce
    // took 127 us in two groups of 2 and 125 us over all 4, where the fit
    // gave 31 us for 2 ranks (an all-gather: 85, 101 and 34 us). tp_sp's
    // decode at 2x2 waits for 4 such collectives a layer.
    for (int g = 2; g < n; ++g)
      if (n % g == 0) {
        const std::unique_ptr<Communicator> group = world.split(me / g, me % g, "calibrate-group");
        time_on(*group, g);
      }
    std::fflush(stdout);
  }
  return 0;
}

nlohmann::json measure_collectives(std::ostream& log, int ranks, const CalibrateOptions& options,
                                   LinkProfile& measured) {
  json colls = json::object();
  std::string extra;
  for (const auto& [op, sizes] : options.message_sizes)
    for (int64_t bytes : sizes) extra += (extra.empty() ? " --extra " : ",") + op + ":" + std::to_string(bytes);
  const std::string cmd = mpirun_self_command(
      ranks, (options.quick
                  ? "bench-collectives-rank --json --sizes 64,65536,1048576,4194304 --iterations 20"
                  : "bench-collectives-rank --json --sizes 64,4096,65536,1048576,4194304,16777216 "
                    "--iterations 100") +
                 extra);
  // Per collective and rank count (the world's, then the groups'), the times over sizes.
  std::map<std::string, std::map<int, std::vector<std::pair<double, double>>>> pts;
  if (std::FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    std::string outp;
    while (std::fgets(buf, sizeof buf, p)) outp += buf;
    pclose(p);
    for (size_t at = 0; (at = outp.find('{', at)) != std::string::npos;) {
      const size_t end = outp.find('\n', at);
      json row = json::parse(outp.substr(at, end - at), nullptr, false);
      at = end;
      if (row.is_discarded() || !row.contains("op") || !row.contains("time_s")) continue;
      if (row.value("time_s", 0.0) > 0)
        pts[row.value("op", "")][row.value("ranks", ranks)].emplace_back(row.value("bytes", 0.0),
                                                                         row.value("time_s", 0.0));
    }
  }
  for (auto& entry : pts) {
    // Plain names, not structured bindings: the lambdas below capture them (clang 14 can't).
    const std::string& op = entry.first;
    auto& by_ranks = entry.second;
    auto world = by_ranks.find(ranks);
    if (world == by_ranks.end()) continue;
    for (auto& [n, v] : by_ranks) std::sort(v.begin(), v.end());
    const std::pair<double, double> fit = fit_alpha_beta(op, ranks, world->second);
    const double a = fit.first, b = fit.second;
    colls[op] = {{"latency_us", a * 1e6}, {"bandwidth_gbps", b * 1e-9}};
    CollectiveFit& f = measured.collectives[op];
    f.latency = a;
    f.bandwidth = b;
    // The times themselves, for the simulator to interpolate: the world's, then the groups'.
    json groups = json::array();
    auto table = [&](int n, const std::vector<std::pair<double, double>>& v) {
      json sizes = json::array(), us = json::array();
      CollectiveTimes t;
      t.ranks = n;
      for (auto& [bytes, s] : v) {
        sizes.push_back(bytes);
        us.push_back(round_us(std::max(s, 1e-8)));
        t.bytes.push_back(bytes);
        t.seconds.push_back(std::max(s, 1e-8));
      }
      f.times.push_back(std::move(t));
      return json{{"ranks", n}, {"bytes", sizes}, {"us", us}};
    };
    if (world->second.size() >= 2) colls[op].update(table(ranks, world->second));
    for (auto& [n, v] : by_ranks)
      if (n != ranks && v.size() >= 2) groups.push_back(table(n, v));
    if (!groups.empty()) colls[op]["groups"] = groups;
    auto print = [&](int n, const std::vector<std::pair<double, double>>& v) {
      log << "  mpi " << op << " over " << n << " ranks";
      if (n == ranks)
        log << ": alpha " << a * 1e6 << " us, beta " << b * 1e-9 << " GB/s (";
      else
        log << ", " << ranks / n << " groups at once (";
      for (size_t i = 0; i < v.size(); ++i)
        log << (i ? ", " : "") << v[i].first << " B " << v[i].second * 1e6 << " us";
      log << ")\n";
    };
    print(ranks, world->second);
    for (auto& [n, v] : by_ranks)
      if (n != ranks) print(n, v);
  }
  if (!colls.empty()) {
    colls["note"] =
        "us: each collective's median time at `bytes` through the engine's communicator, from the "
        "last rank's start to the last rank's end, each call after a sweep of the private caches "
        "and on buffers of its own from a pool of twice the last-level cache, two at least (data from memory; each "
        "buffer a block of its own, as a run's tensors, and moved once before the timed calls; a sendrecv's "
        "send buffer read by the rank just before, as a ring's is); the "
        "simulator interpolates them at " +
        std::to_string(ranks) +
        " ranks; groups: the same in groups of fewer ranks (consecutive ranks, every group at once, as a mesh's "
        "groups run), interpolated for a collective over that many. alpha (latency_us, per "
        "step) and beta (bandwidth_gbps): fitted to them (least squares on the relative error) for "
        "the "
        "cost model's formula of that collective, for other rank counts";
  }
  return colls;
}

}  // namespace ss

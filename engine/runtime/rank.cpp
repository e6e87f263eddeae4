#include "runtime/rank.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>

#include "core/error.h"
#include "model/model.h"
#include "cpu/cpu_backend.h"
#include "runtime/host_memory.h"
#include "sim/hardware.h"
#include "sim/meta_backend.h"
#include "sim/sim_comm.h"

namespace ss {
namespace {

// Everything a rank records between two step boundaries, as JSON lines.
// The blob is sized once: grown line by line, it was copied at every
// doubling (a sixth of the page faults of a simulated llama2-7b tsp prefill
// on 8 ranks).
std::string take_records(Recorder& rec, std::vector<std::string>& extra) {
  std::vector<std::string> lines = std::move(extra);
  extra.clear();
  for (auto& m : rec.take_mem_samples()) lines.push_back(proto::to_line(m));
  for (auto& s : rec.take_spans()) lines.push_back(proto::to_line(s));
  size_t bytes = 0;
  for (auto& l : lines) bytes += l.size() + 1;
  std::string blob;
  blob.reserve(bytes);
  for (auto& l : lines) (blob += l) += '\n';
  return blob;
}


// What `w` places on `rank` (one record per range of a split), at `step`.
void add_placements(std::vector<proto::Placement>& out, const WeightSpec& w, int rank, int step,
                    int64_t bytes_per_value) {
  proto::Placement p;
  p.rank = rank;
  p.tensor = w.name;
  p.layer = w.layer;
  p.shape = w.shape;
  p.step = step;
  if (w.slice.mirrored()) {
    p.mode = "mirrored";
    p.bytes = numel(w.shape) * bytes_per_value;
    out.push_back(p);
    return;
  }
  const int64_t per_index = numel(w.shape) / w.shape[size_t(w.slice.axis)];
  for (auto& [a, b] : w.slice.ranges) {
    p.mode = "split";
    p.axis = w.slice.axis;
    p.start = a;
    p.end = b;
    p.bytes = (b - a) * per_index * bytes_per_value;
    out.push_back(p);
  }
}

// The resident placement of every weight; under tsp also, for each ring or
// broadcast step, the shard each rank holds while it computes that step.
}  // namespace

std::vector<proto::Placement> placements(const Model& model, int rank) {
  std::vector<proto::Placement> out;
  const int64_t bpv = dtype_size(model.config().dtype);
  for (const WeightSpec& w : model.weights()) add_placements(out, w, rank, -1, bpv);
  const Parallel& par = model.parallel();
  if (!par.folded()) return out;
  const int D = par.sp_size;
  Allocator none;
  Recorder quiet;
  MetaBackend meta(none, quiet);
  std::vector<std::vector<WeightSpec>> by_shard;
  for (int j = 0; j < D; ++j) {
    Parallel pj = par;
    pj.tp_rank = pj.sp_rank = j;
    by_shard.push_back(Model(model.config(), meta, pj).weights());
  }
  for (const WeightPack& p : model.packs())
    for (int t = 0; t < D; ++t) {
      const int shard = p.ring ? (rank - t + D) % D : t;
      for (size_t m : p.members) add_placements(out, by_shard[size_t(shard)][m], rank, t, bpv);
    }
  return out;
}

void push_peak_metrics(std::vector<std::string>& extra, const MemState& m, int rank) {
  for (int c = 0; c < kCategoryCount; ++c)
    extra.push_back(proto::to_line(proto::Metric{"peak_" + std::string(kCategoryNames[size_t(c)]) + "_bytes",
                                                 double(m.peak_bytes[size_t(c)]), "bytes", rank}));
  extra.push_back(proto::to_line(proto::Metric{"peak_bytes", double(m.peak_total), "bytes", rank}));
  for (int c = 0; c < kCategoryCount; ++c)
    extra.push_back(proto::to_line(proto::Metric{"at_peak_" + std::string(kCategoryNames[size_t(c)]) + "_bytes",
                                                 double(m.at_peak[size_t(c)]), "bytes", rank}));
}

void step_boundary(Group& g, Recorder& rec, std::vector<std::string>& extra, proto::Writer* out) {
  std::string mine = take_records(rec, extra);
  std::vector<std::string> all;
  if (g.telemetry) all = g.telemetry->gather_blobs(mine, 0);
  else all.push_back(std::move(mine));
  if (!g.root() || !out) return;
  for (auto& blob : all) out->write_raw(blob);
  out->flush();
}

void connect_mpi(Group& g, Recorder& rec, int devices) {
  g.mpi = std::make_unique<MpiWorld>();
  g.rank = g.mpi->rank();
  g.size = g.mpi->size();
  rec.set_rank(g.rank);
  if (g.size != devices)
    throw UsageError("this process is one of " + std::to_string(g.size) + " MPI ranks but --devices is " +
                     std::to_string(devices) + "; start runs with `shardscope-engine launch --devices N ...`");
  g.hosts = g.mpi->hostnames();
  // Host memory is read before the start barrier, so no rank reads it
  // after another has begun to load.
  g.host_available = host_available_bytes();
  // One clock per run: every rank starts counting when all have arrived,
  // so spans of different ranks line up on the timeline (to the barrier's
  // exit skew, microseconds on one host).
  MPI_Barrier(MPI_COMM_WORLD);
  rec.set_origin(std::chrono::steady_clock::now());
  g.stream = std::make_shared<CommStream>();
  g.mpi_world = std::make_unique<MpiCommunicator>(g.stream, MPI_COMM_WORLD, rec, "world");
  g.world = g.mpi_world.get();
}

RankSetup mpi_rank_setup(int devices) {
  RankSetup setup;
  setup.backend = "cpu";
  setup.make_backend = [](Allocator& a, Recorder& r) { return std::make_unique<CpuBackend>(a, r); };
  setup.abort = [](int code) { MPI_Abort(MPI_COMM_WORLD, code); };
  setup.connect = [devices](Group& g, Recorder& rec) { connect_mpi(g, rec, devices); };
  return setup;
}

RunResult simulate_ranks(int devices, bool single, const HardwareProfile& hw, int nodes, bool timed,
                         nlohmann::json config, proto::Writer& out, const RankMain& rank_body) {
  SimNetwork net(hw, devices, devices / nodes, timed);
  std::vector<RunResult> results(static_cast<size_t>(devices));
  std::mutex failure_mutex;
  std::optional<std::pair<proto::Error, int>> failure;
  auto rank_main = [&](int r) {
    Recorder rec(r);
    SimClock clock;
    if (!hw.overlap_seconds.empty()) {
      clock.oversubscribed = &hw;  // its overlap steps replace the contention figures
    } else {
      clock.compute_slowdown = hw.compute_contention;
      clock.comm_slowdown = hw.comm_contention;
      clock.hold_ns = hw.contention_hold * 1e9;
    }
    rec.set_clock([&clock] { return int64_t(clock.compute_ns); });
    std::vector<int> all(static_cast<size_t>(devices));
    std::iota(all.begin(), all.end(), 0);
    SimCommunicator world(net, 0, all, r, rec, clock, "world");
    Group g;
    g.rank = r;  // known before connect: only rank 0 ever writes the stream
    g.size = devices;
    RankSetup setup;
    setup.backend = "sim";
    setup.default_capacity = hw.memory_bytes;
    setup.config = config;
    setup.make_backend = [&](Allocator& a, Recorder& rr) { return std::make_unique<SimBackend>(a, rr, hw, clock); };
    setup.abort = [&](int) { net.abort(); };
    setup.claim_failure = [&](const proto::Error& e, int code) {
      std::lock_guard lock(failure_mutex);
      if (failure) return false;
      failure = std::make_pair(e, code);
      return true;
    };
    setup.first_failure = [&] {
      std::lock_guard lock(failure_mutex);
      return *failure;
    };
    setup.connect = [&](Group& gg, Recorder&) {
      gg.rank = r;
      gg.size = devices;
      gg.hosts.clear();
      for (int i = 0; i < devices; ++i) gg.hosts.push_back("node" + std::to_string(net.node_of(i)));
      gg.world = &world;
    };
    results[size_t(r)] = rank_body(r == 0 ? &out : nullptr, g, rec, setup);
  };
  if (devices == 1 || single) {
    rank_main(0);
  } else {
    std::vector<std::thread> threads;
    for (int r = 0; r < devices; ++r) threads.emplace_back(rank_main, r);
    for (auto& t : threads) t.join();
  }
  return results[0];
}

void join_group(Group& g, Recorder& rec, const RankSetup& setup, Strategy strategy, int T) {
  if (strategy == Strategy::Single) return;
  setup.connect(g, rec);
  // Telemetry is host bytes: over MPI itself where the world is a device's communicator.
  Communicator* host = g.mpi_world ? static_cast<Communicator*>(g.mpi_world.get()) : g.world;
  g.telemetry = host->split(0, g.rank, "telemetry");
  if (strategy == Strategy::TP || strategy == Strategy::SP || strategy == Strategy::TPSP) {
    g.tp = g.world->split(g.rank / T, g.rank % T, "tp");
    g.sp = g.world->split(g.rank % T, g.rank / T, "sp");
  } else if (strategy == Strategy::TSP) {
    g.sp = g.world->split(0, g.rank, "tsp");
  }
}

Parallel make_parallel(const Group& g, Strategy strategy, int T, int S, bool zigzag) {
  Parallel par;
  par.strategy = strategy;
  par.world_rank = g.rank;
  par.world_size = g.size;
  par.zigzag = zigzag;
  par.world = g.world;
  if (strategy == Strategy::TP || strategy == Strategy::SP || strategy == Strategy::TPSP) {
    par.tp_size = T;
    par.sp_size = S;
    par.tp_rank = g.rank % T;
    par.sp_rank = g.rank / T;
    par.tp = g.tp.get();
    par.sp = g.sp.get();
  } else if (strategy == Strategy::TSP) {
    // Folded: D weight shards and D token shards on the same D ranks.
    par.tp_size = par.sp_size = g.size;
    par.tp_rank = par.sp_rank = g.rank;
    par.sp = g.sp.get();
  }
  return par;
}

int64_t device_capacity(const Group& g, const RankSetup& setup, const ModelConfig& cfg, const RunOptions& o) {
  int64_t capacity = o.capacity > 0 ? o.capacity : setup.default_capacity;
  if (setup.backend == "cpu" || setup.backend == "cuda-emu") {  // host memory, host threads
    // A cpu device's memory is its share of the host's (measured as the
    // ranks start, before any has loaded): a setup whose weights cannot fit
    // is refused here, and an allocation past the share is an oom.
    const int ranks_here = int(std::count(g.hosts.begin(), g.hosts.end(), g.hosts[size_t(g.rank)]));
    const int64_t available = g.host_available >= 0 ? g.host_available : host_available_bytes();
    check_host_memory(cfg, o, ranks_here, available);
    if (o.capacity <= 0 && available > 0) capacity = available / std::max(ranks_here, 1);
  }
  return capacity;
}

RunResult guarded_rank(proto::Writer* out, Group& g, Recorder& rec, const RankSetup& setup,
                       const std::function<RunResult(const std::function<void()>& hello)>& body) {
  // Every stream opens with hello, also one that fails before the setup
  // records: a reader rejects records that come before it.
  bool said_hello = false;
  auto hello = [&] {
    if (said_hello || !out) return;
    out->write(proto::Hello{proto::kVersion, engine_version(), host_name()});
    said_hello = true;
  };
  auto report = [&](const char* code, const std::string& msg, int exit_code, nlohmann::json detail = {}) {
    RunResult res;
    proto::Error err{code, g.rank, msg, std::move(detail)};
    // The first rank to fail is the one reported; ranks woken by its abort
    // (simulator threads) report that failure rather than their own.
    const bool first = !setup.claim_failure || setup.claim_failure(err, exit_code);
    if (!first) std::tie(err, exit_code) = setup.first_failure();
    if (g.root() && out) {
      hello();
      for (auto& m : rec.take_mem_samples()) out->write(m);
      for (auto& s : rec.take_spans()) out->write(s);
      out->write(err);
      const char* status = exit_code == kExitOom ? "oom" : "failed";
      out->write(proto::Done{status, rec.now(), exit_code});
      out->flush();
    }
    res.exit_code = exit_code;
    res.status = exit_code == kExitOom ? "oom" : "failed";
    res.error = err.message;
    res.error_code = err.code;
    res.rank = err.rank;
    if (!first) return res;
    // One line a person (and the launcher) can read: which rank, what, why.
    if (g.size > 1) std::fprintf(stderr, "shardscope-engine: error [rank %d, %s]: %s\n", g.rank, code, msg.c_str());
    else std::fprintf(stderr, "shardscope-engine: error: %s\n", msg.c_str());
    std::fflush(stderr);
    // Other ranks may wait in a collective for this one: end them all.
    if (g.size > 1 && setup.abort) setup.abort(exit_code);
    return res;
  };
  try {
    return body(hello);
  } catch (const OomError& e) {
    return report("oom", e.what(), kExitOom,
                  {{"category", e.category}, {"requested", e.requested}, {"in_use", e.in_use}, {"capacity", e.capacity}});
  } catch (const std::bad_alloc&) {
    return report("oom", "the host ran out of memory outside the accounted tensors (an allocation of the runtime failed)",
                  kExitOom, {{"category", "host"}});
  } catch (const UsageError& e) {
    return report("usage", e.what(), kExitUsage);
  } catch (const FormatError& e) {
    return report("format", e.what(), kExitUsage);
  } catch (const std::exception& e) {
    return report("internal", e.what(), kExitFailure);
  }
}

}  // namespace ss

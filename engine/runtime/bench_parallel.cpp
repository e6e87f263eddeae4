#include "runtime/bench_parallel.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "comm/mpi_bench.h"
#include "comm/mpi_communicator.h"
#include "core/allocator.h"
#include "cpu/cpu_backend.h"
#include "protocol/analysis.h"
#include "runtime/run.h"

#ifndef SHARDSCOPE_MPIEXEC
#define SHARDSCOPE_MPIEXEC "mpirun"
#endif

namespace ss {
namespace {

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "shardscope-engine" : p.string();
}

std::string mib(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", b / (1 << 20));
  return buf;
}

std::vector<proto::Event> read_stream(const std::string& path) {
  std::vector<proto::Event> out;
  proto::Reader reader;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto r = reader.parse_line(line);
    if (r.event) out.push_back(std::move(*r.event));
  }
  return out;
}

// Hidden share of the comm spans whose op is in `ops`, over all ranks.
double hidden_fraction(const std::vector<proto::Event>& ev, const std::set<std::string>& ops) {
  std::map<int, std::vector<std::pair<int64_t, int64_t>>> comm, compute;
  for (auto& e : ev)
    if (auto* s = std::get_if<proto::Span>(&e)) {
      if (s->stream == "comm" && ops.count(s->op)) comm[s->rank].emplace_back(s->t0, s->t1);
      else if (s->stream == "compute") compute[s->rank].emplace_back(s->t0, s->t1);
    }
  double total = 0, hidden = 0;
  for (auto& [r, iv] : comm) {
    total += proto::union_ns(iv);
    hidden += proto::overlap_ns(iv, compute[r]);
  }
  return total > 0 ? hidden / total : 0;
}

int mesh_side(int d) {
  int t = int(std::sqrt(double(d)));
  while (t > 1 && d % t) --t;
  return t;
}

}  // namespace

int run_strategy_bench(const StrategyBenchOptions& o, std::ostream& out) {
  char line[512];
  out << "shardscope-engine bench --strategies  host " << host_name() << ", " << o.devices
      << " cpu devices (one MPI rank each, " << sysconf(_SC_NPROCESSORS_ONLN) << " cores), prompt " << o.prompt_len
      << ", decode " << o.decode << "\n";
  out << "bytes/token: wire bytes of all ranks per processed token; hidden: share of comm time overlapped by compute "
         "(ring/bcast: tsp's weight transfers only); peaks per rank in MiB (max over ranks)\n";
  for (const auto& model : o.models) {
    out << "\n" << model << "\n";
    std::snprintf(line, sizeof line, "%-7s %3s %10s %10s %12s %7s %10s %9s %9s %9s %9s %9s %9s\n", "strategy", "D",
                  "prefill/s", "decode/s", "bytes/token", "hidden", "ring/bcast", "weights", "activ.", "kv", "ssm",
                  "comm buf", "peak");
    out << line;
    for (const auto& s : o.strategies) {
      const bool single = s == "single";
      const int d = single ? 1 : o.devices;
      char tmpl[] = "/tmp/shardscope-bench-XXXXXX";
      const int fd = mkstemp(tmpl);
      if (fd >= 0) close(fd);
      std::string cmd = "'" + self_exe() + "' " + (single ? "run" : "launch") + " --model " + model + " --strategy " + s +
                        " --devices " + std::to_string(d) + " --prompt-len " + std::to_string(o.prompt_len) +
                        " --decode " + std::to_string(o.decode) + " --events " + tmpl;
      if (s == "tp_sp") {
        const int t = mesh_side(d);
        cmd += " --mesh " + std::to_string(t) + "x" + std::to_string(d / t);
      }
      const std::string err = std::string(tmpl) + ".err";
      cmd += " 2>'" + err + "'";
      const int rc = std::system(cmd.c_str());
      const auto ev = read_stream(tmpl);
      std::string first_err;
      {
        std::ifstream e(err);
        std::getline(e, first_err);
      }
      std::filesystem::remove(tmpl);
      std::filesystem::remove(err);
      const proto::RunStats st = proto::analyze(ev);
      if (st.status != "ok") {
        const std::string why = !st.errors.empty() ? st.errors.front().message
                                : !first_err.empty() ? first_err
                                                     : "exit " + std::to_string(rc);
        std::snprintf(line, sizeof line, "%-7s %3d  %s: %s\n", s.c_str(), d, st.status.empty() ? "failed" : st.status.c_str(),
                      why.substr(0, 160).c_str());
        out << line << std::flush;
        continue;
      }
      std::array<int64_t, proto::kCategoryCount> peak{};
      int64_t peak_total = 0;
      for (auto& [r, rs] : st.ranks) {
        for (int c = 0; c < proto::kCategoryCount; ++c) peak[size_t(c)] = std::max(peak[size_t(c)], rs.peak[size_t(c)]);
        peak_total = std::max(peak_total, rs.peak_total);
      }
      auto metric = [&](const char* n) { return st.metrics.count(n) ? st.metrics.at(n) : 0.0; };
      const double tokens = double(o.prompt_len + o.decode);
      const double ring = s == "tsp" ? hidden_fraction(ev, {"broadcast", "sendrecv"}) : NAN;
      char ringbuf[16];
      if (std::isnan(ring)) std::snprintf(ringbuf, sizeof ringbuf, "-");
      else std::snprintf(ringbuf, sizeof ringbuf, "%.0f%%", 100 * ring);
      std::snprintf(line, sizeof line, "%-7s %3d %10.1f %10.2f %12.0f %6.0f%% %10s %9s %9s %9s %9s %9s %9s\n", s.c_str(), d,
                    metric("prefill_tokens_per_s"), metric("decode_tokens_per_s"), st.comm_bytes / tokens,
                    100 * st.hidden_fraction(), ringbuf, mib(double(peak[0])).c_str(), mib(double(peak[1])).c_str(),
                    mib(double(peak[2])).c_str(), mib(double(peak[3])).c_str(), mib(double(peak[4])).c_str(),
                    mib(double(peak_total)).c_str());
      out << line << std::flush;
    }
  }
  return 0;
}

int run_collective_bench(const CollectiveBenchOptions& o, std::ostream& out) {
  out << "shardscope-engine bench --collectives  host " << host_name() << "  (nccl-tests conventions: algbw = "
         "bytes/time, busbw = algbw x 2(n-1)/n for all_reduce, (n-1)/n for all_gather)\n";
  out << "bare: the MPI call itself; engine: the same collective through MpiCommunicator (comm stream, spans), in "
         "the same run\n" << std::flush;
  std::string sizes;
  for (auto s : o.sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(s);
  for (int d : o.devices) {
    std::string cmd = std::string(SHARDSCOPE_MPIEXEC) + " -np " + std::to_string(d) +
                      (unsigned(d) > std::thread::hardware_concurrency() ? " --oversubscribe" : "") +
                      " '" + self_exe() + "' bench-collectives-rank --sizes " + sizes + " --iterations " +
                      std::to_string(o.iterations);
    if (geteuid() == 0) cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + cmd;
    std::FILE* p = popen(cmd.c_str(), "r");
    if (!p) return 1;
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) out << buf << std::flush;
    if (pclose(p) != 0) return 1;
  }
  return 0;
}

int collective_bench_rank(const std::vector<int64_t>& sizes, int iterations) {
  MpiWorld mpi;
  Recorder rec(mpi.rank());
  {
    auto stream = std::make_shared<CommStream>();
    MpiCommunicator world(stream, MPI_COMM_WORLD, rec, "world");
    Allocator alloc;
    CpuBackend be(alloc, rec);
    const auto rows = bench_collectives(world, be, sizes, iterations);
    if (mpi.rank() == 0) {
      std::printf("\n%d ranks\n%-11s %10s %11s %10s %10s %11s %10s %10s %8s %6s\n", mpi.size(), "op", "bytes",
                  "bare us", "algbw GB/s", "busbw GB/s", "engine us", "algbw GB/s", "busbw GB/s", "eng/bare", "wrong");
      for (size_t i = 0; i + 1 < rows.size(); i += 2) {
        const auto& b = rows[i];
        const auto& e = rows[i + 1];
        std::printf("%-11s %10lld %11.1f %10.3f %10.3f %11.1f %10.3f %10.3f %7.0f%% %6lld\n", b.op.c_str(),
                    static_cast<long long>(b.bytes), b.time_s * 1e6, b.algbw * 1e-9, b.busbw * 1e-9, e.time_s * 1e6,
                    e.algbw * 1e-9, e.busbw * 1e-9, 100 * e.busbw / std::max(b.busbw, 1e-30),
                    static_cast<long long>(b.wrong + e.wrong));
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace ss

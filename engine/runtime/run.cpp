#include "runtime/run.h"

#include "runtime/prompt.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "comm/mpi_communicator.h"
#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "cpu/kernels.h"
#include "io/checkpoint.h"
#include "io/npy.h"
#include "model/model.h"
#include "runtime/host_memory.h"
#include "runtime/prompt.h"
#include "runtime/rank.h"
#include "sim/meta_backend.h"
#include "sim/sim_comm.h"

#include <atomic>
#include <numeric>
#include <thread>

#ifndef SHARDSCOPE_VERSION
#define SHARDSCOPE_VERSION "0.0.0"
#endif

namespace ss {
namespace {

int64_t status_field(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key))) * 1024;
  return 0;
}



std::vector<Range> merge_ranges(std::vector<Range> r) {
  std::sort(r.begin(), r.end());
  std::vector<Range> out;
  for (auto& x : r) {
    if (!out.empty() && out.back().second == x.first) out.back().second = x.second;
    else out.push_back(x);
  }
  return out;
}

}  // namespace

std::string engine_version() { return SHARDSCOPE_VERSION; }

namespace {
nlohmann::json g_invocation = nlohmann::json::array();

// Whether `pid` started this process, or started what did (/proc's parents).
bool is_ancestor(long pid) {
  long p = long(getppid());
  for (int hops = 0; p > 1 && hops < 64; ++hops) {
    if (p == pid) return true;
    std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t name_end = line.rfind(')');  // "pid (name) state ppid ..."
    if (name_end == std::string::npos) return false;
    std::istringstream rest(line.substr(name_end + 1));
    char state = 0;
    if (!(rest >> state >> p)) return false;
  }
  return p == pid;
}
}  // namespace

void set_invocation(int argc, char** argv) {
  // The command of the engine process that started this one (launch's or
  // train's ranks, through mpirun); not one left in the environment by
  // another.
  const char* given = std::getenv("SHARDSCOPE_COMMAND");
  const char* by = std::getenv("SHARDSCOPE_COMMAND_PID");
  if (given && by && is_ancestor(std::atol(by))) {
    g_invocation = nlohmann::json::parse(given, nullptr, false);
    if (g_invocation.is_array()) return;
  }
  // Its own, where none is: a rank's (started on another host, where
  // mpirun passes no environment) named as the command it is a rank of.
  g_invocation = nlohmann::json::array();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--events" || a == "--heartbeat") ++i;
    else if (a.rfind("--events=", 0) != 0 && a.rfind("--heartbeat=", 0) != 0)
      g_invocation.push_back(i == 1 && a == "train-rank" ? "train" : a);
  }
  // (An environment string holds at most 128 KiB: a longer command, a long
  // --tokens list, is recorded by each process as it was started.)
  const std::string text = g_invocation.dump();
  if (text.size() < (64 << 10)) {
    setenv("SHARDSCOPE_COMMAND", text.c_str(), 1);
    setenv("SHARDSCOPE_COMMAND_PID", std::to_string(getpid()).c_str(), 1);
  }
}

const nlohmann::json& invocation() { return g_invocation; }

std::string host_name() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

int64_t peak_rss_bytes() { return status_field("VmHWM:"); }
int64_t current_rss_bytes() { return status_field("VmRSS:"); }

void check_token_ids(const std::vector<int32_t>& tokens, int64_t vocab) {
  for (int32_t t : tokens)
    if (t < 0 || t >= vocab)
      throw UsageError("--tokens: id " + std::to_string(t) + " is outside the vocabulary [0, " +
                       std::to_string(vocab) + ")");
}

std::vector<int32_t> make_prompt(const RunOptions& o, int64_t vocab) {
  if (!o.tokens.empty()) {
    check_token_ids(o.tokens, vocab);
    return o.tokens;
  }
  std::vector<int32_t> p(static_cast<size_t>(o.prompt_len));
  uint64_t x = o.seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  for (auto& t : p) {  // xorshift64*: a reproducible token stream
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    t = int32_t((x * 0x2545f4914f6cdd1dull >> 33) % uint64_t(vocab));
  }
  return p;
}

std::pair<int, int> mesh_of(const RunOptions& o) {
  const Strategy s = parse_strategy(o.strategy);
  switch (s) {
    case Strategy::TP: return {o.devices, 1};
    case Strategy::SP: return {1, o.devices};
    case Strategy::TSP: return {o.devices, o.devices};
    case Strategy::TPSP: {
      int t = 0, sp = 0;
      char x = 0;
      std::istringstream in(o.mesh);
      if (o.mesh.empty())
        throw UsageError("--strategy tp_sp needs --mesh TxS with T*S = --devices, e.g. --mesh 2x2 for 4 devices");
      if (!(in >> t >> x >> sp) || (x != 'x' && x != 'X') || t < 1 || sp < 1 || !in.eof())
        throw UsageError("--mesh '" + o.mesh + "' is not TxS (two counts of at least 1 joined by x); use e.g. --mesh 2x2");
      return {t, sp};
    }
    default: return {1, 1};
  }
}

bool has_tp_all_reduces(const RunOptions& o) {
  const Strategy s = parse_strategy(o.strategy);
  return s == Strategy::TP || (s == Strategy::TPSP && mesh_of(o).first > 1);
}

void validate(const RunOptions& o, const std::string& backend) {
  if (o.backend != backend)
    throw UsageError("--backend " + o.backend + " is not available in this command; use --backend " +
                     (backend == "sim" ? backend : "cpu or cuda") +
                     (backend != "sim" ? " (simulated hardware: `shardscope-engine simulate`)" : ""));
  const Strategy s = parse_strategy(o.strategy);
  if (o.devices < 1 || o.devices > 1024) throw UsageError("--devices must be between 1 and 1024");
  if (s == Strategy::Single && o.devices != 1)
    throw UsageError("--strategy single runs on one device; choose dp, tp, sp, tp_sp or tsp for --devices " +
                     std::to_string(o.devices));
  if (s != Strategy::TPSP && !o.mesh.empty()) throw UsageError("--mesh is for --strategy tp_sp only");
  if (s == Strategy::TPSP) {
    auto [t, sp] = mesh_of(o);
    if (t * sp != o.devices)
      throw UsageError("--mesh " + o.mesh + " has " + std::to_string(t * sp) + " ranks but --devices is " +
                       std::to_string(o.devices) + "; make T x S equal the device count");
  }
  if (o.split != "zigzag" && o.split != "contiguous") throw UsageError("--split must be zigzag or contiguous");
  if (o.attention != "gather" && o.attention != "ring") throw UsageError("--attention must be gather or ring");
  if (o.tokens.empty() && o.prompt_len <= 0) throw UsageError("give a prompt: --prompt-len N (N >= 1), --tokens 1,2,3, or --prompt \"text\" (a model with a tokenizer)");
  if (!o.tokens.empty() && o.prompt_len > 0) throw UsageError("give either --prompt-len or --tokens, not both");
  if (o.decode < 0) throw UsageError("--decode must be >= 0");
  validate_sampling(o.sampling);
  if (!o.sampling.greedy() && backend == "sim")
    throw UsageError("--temperature samples from computed logits, which a simulation has none of; sample with run or "
                     "launch, or leave it out (simulated decode is timed the same either way)");
  if (o.capacity < 0) throw UsageError("--capacity must be >= 0");
  if (o.batch < 1) throw UsageError("--batch must be >= 1");
  if (o.batch > 1 && s != Strategy::Single && s != Strategy::DP && o.window == 0)
    throw UsageError("--batch > 1 is for --strategy single or dp");
  if (o.window < 0) throw UsageError("--window must be >= 0");
  if (o.window > 0) {  // teacher-forced windows of a text, one after another
    if (o.tokens.empty() || int64_t(o.tokens.size()) % o.window)
      throw UsageError("--window " + std::to_string(o.window) + " cuts --tokens into sequences: give a multiple of " +
                       std::to_string(o.window) + " ids");
    if (o.decode > 0) throw UsageError("--window scores the given tokens; it takes no --decode");
    if (o.batch != int64_t(o.tokens.size()) / o.window)
      throw UsageError("--window sets the batch to the number of windows; leave --batch out");
  }
  if (o.prompt_len > 100'000'000) throw UsageError("--prompt-len is over 100M tokens");
  const CommPrecision cp = parse_comm_precision(o.comm_precision, "--comm-precision");
  if (cp.quantizes()) {
    if (!has_tp_all_reduces(o))
      throw UsageError("--comm-precision quantizes tensor-parallel all-reduces, and --strategy " + o.strategy +
                       " has none; use --strategy tp or tp_sp with T > 1");
  }
  if (o.no_cache && s != Strategy::Single) throw UsageError("--no-cache is for --strategy single");
  if (!o.force_decode.empty() && int(o.force_decode.size()) < o.decode)
    throw UsageError("--force-decode gives " + std::to_string(o.force_decode.size()) + " tokens for --decode " +
                     std::to_string(o.decode) + "; give one per decode step");
}


RunPlan plan_inference(const RunOptions& o, const std::string& backend) {
  validate(o, backend);
  RunPlan plan;
  plan.strategy = parse_strategy(o.strategy);
  plan.devices = o.devices;
  std::tie(plan.tp, plan.sp) = mesh_of(o);
  plan.zigzag = o.split == "zigzag";
  plan.cfg = resolve_model(o.model, &plan.dir, o.overrides);
  plan.cfg.dtype = o.dtype;
  plan.cfg.kv_dtype = cache_dtype(o);
  plan.tokens = o.window ? o.window : o.tokens.empty() ? o.prompt_len : int64_t(o.tokens.size());
  check_token_ids(o.tokens, plan.cfg.vocab);
  validate_parallel(plan.cfg, plan.strategy, o.devices, plan.tp, plan.sp, plan.tokens, plan.zigzag, o.batch,
                    o.shape_names.value_or(ShapeFlags{}));
  return plan;
}

static RunResult run_rank(const RunOptions& o, proto::Writer* out, Group& g, Recorder& rec,
                          const RankSetup& setup) {
  return guarded_rank(out, g, rec, setup, [&, out](const std::function<void()>& hello) mutable {
    RunResult res;
    const RunPlan plan = plan_inference(o, setup.backend);
    const Strategy strategy = plan.strategy;
    const bool distributed = strategy != Strategy::Single;
    const ModelConfig& cfg = plan.cfg;
    const std::filesystem::path& dir = plan.dir;
    const std::vector<int32_t> all_tokens = make_prompt(o, cfg.vocab);
    // --window: sequence k is the k-th window of the tokens; otherwise every
    // sequence but the first draws its own synthetic prompt.
    const auto window_of = [&](int seq) {
      return std::vector<int32_t>(all_tokens.begin() + seq * o.window, all_tokens.begin() + (seq + 1) * o.window);
    };
    const std::vector<int32_t> base_prompt = o.window ? window_of(0) : all_tokens;
    const int64_t P = int64_t(base_prompt.size()), total = P + o.decode;
    const std::optional<text::Tokenizer> tokenizer = g.root() ? optional_tokenizer(dir) : std::nullopt;
    const int T = plan.tp, S = plan.sp;
    const bool zigzag = plan.zigzag;
    join_group(g, rec, setup, strategy, T);
    if (!g.root()) out = nullptr;
    if (setup.backend == "cpu" || setup.backend == "cuda-emu") {  // host memory, host threads
      if (o.threads > 0) cpu::set_threads(o.threads);
      else if (distributed) cpu::set_threads(1);  // ranks share the host's cores
    }

    const int64_t capacity = device_capacity(g, setup, cfg, o);
    Allocator alloc(capacity);
    alloc.set_listener([&](const MemState& m) { rec.mem_sample(rec.now(), m); });
    if (!o.timeline) {
      rec.set_mem_sampling(false);
      rec.set_span_recording(false);
    }
    std::unique_ptr<Backend> backend = setup.make_backend(alloc, rec);
    Backend& be = *backend;
    Parallel par = make_parallel(g, strategy, T, S, zigzag);
    par.ring_attention = o.attention == "ring";
    par.comm_precision = parse_comm_precision(o.comm_precision);
    par.measure_sites = o.measure_sites;

    Model model(cfg, be, par);
    std::unique_ptr<TensorSource> src;
    if (dir.empty()) src = std::make_unique<SyntheticSource>(o.seed);
    else src = std::make_unique<CheckpointSource>(dir, model.weights());

    // This rank's sequences (dp) and tokens (sequence-parallel prefill).
    const int seq_begin = strategy == Strategy::DP ? o.batch * g.rank / g.size : 0;
    const int seq_end = strategy == Strategy::DP ? o.batch * (g.rank + 1) / g.size : o.batch;
    const bool seq_sharded = par.sp_size > 1;
    const std::vector<std::pair<Range, int>> chunks =
        seq_sharded ? chunk_owners(P, S, zigzag) : std::vector<std::pair<Range, int>>{{{0, P}, 0}};
    std::vector<Range> my_ranges;
    for (auto& [r, owner] : chunks)
      if (owner == par.sp_rank) my_ranges.push_back(r);
    // Decode token p keeps its K/V on sp rank p % S (balancing cache growth).
    std::vector<Range> kv_ranges = my_ranges;
    int64_t my_decode_kv = 0;
    for (int64_t p = P; p < total; ++p)
      if (!seq_sharded || p % S == par.sp_rank) {
        kv_ranges.push_back({p, p + 1});
        ++my_decode_kv;
      }
    int64_t my_prompt = 0;
    for (auto& r : my_ranges) my_prompt += r.second - r.first;

    std::vector<std::string> extra;  // records of this rank beyond spans and samples
    if (g.root()) {
      nlohmann::json conf = {
          {"model", cfg.to_json()},
          {"weights", src->describe()},
          {"parameters", model.parameter_count()},
          {"backend", o.backend},
          {"strategy", strategy_name(strategy)},
          {"devices", o.devices},
          {"mesh", {{"tp", T}, {"sp", S}}},
          {"split", o.split},
          {"attention", o.attention},
          {"dtype", std::string(compute_dtype_name(cfg.dtype))},
          {"kv_dtype", std::string(compute_dtype_name(cfg.kv_dtype))},
          {"comm_precision", par.comm_precision.str()},
          {"kv_cache", !o.no_cache},
          {"warm_start", o.warm_start},
          {"workload", {{"batch", o.batch}, {"prompt_len", P}, {"decode", o.decode}, {"seed", o.seed}}},
          {"sampling", o.sampling.greedy() ? nlohmann::json("greedy")
                                            : nlohmann::json{{"temperature", o.sampling.temperature},
                                                             {"top_k", o.sampling.top_k}}},
          {"capacity", o.capacity},
          {"threads", cpu::threads()},
          {"command", invocation()},
      };
      hello();
      if (setup.config.is_object()) conf.update(setup.config);  // the simulator's hardware profile and nodes
      if (g.config.is_object()) conf.update(g.config, true);  // merged: gpu's fields from both
      out->write(proto::Config{conf});
      if (tokenizer) {
        const std::vector<int64_t> ids(all_tokens.begin(), all_tokens.end());  // every window's
        out->write(proto::Prompt{o.prompt.value_or(tokenizer->decode(all_tokens)), ids});
      }
      out->flush();
    }
    // The answer so far, on the root, as each token is chosen (real runs only:
    // the simulator's tensors hold no values to choose from).
    const bool report_tokens = g.root() && setup.backend != "sim";
    const auto generation = [&](bool partial) {
      proto::Generation e;
      e.tokens.assign(res.generated.begin(), res.generated.end());
      e.partial = partial;
      if (tokenizer) describe_tokens(e, *tokenizer);
      extra.push_back(proto::to_line(e));
    };
    extra.push_back(proto::to_line(proto::Device{g.rank, std::string(be.kind()), be.device_name(), capacity, g.hosts[size_t(g.rank)]}));
    extra.push_back(proto::to_line(proto::Tokens{g.rank, merge_ranges(kv_ranges)}));
    if (g.root()) extra.push_back(proto::to_line(proto::Phase{"load", rec.now()}));

    rec.set_phase("load");
    model.load(*src);
    for (auto& p : placements(model, g.rank)) extra.push_back(proto::to_line(p));
    step_boundary(g, rec, extra, out);

    std::vector<float> logits_rows;  // root: [batch, total, vocab] in position order
    const bool write_logits = !o.logits_out.empty();
    const bool keep_logits = write_logits || o.keep_all_logits;  // every row's, not the last one's
    if (g.root() && write_logits) logits_rows.assign(size_t(o.batch * total * cfg.vocab), 0.0f);
    double prefill_s = 0, decode_s = 0;
    int64_t prefill_tokens = 0, decode_tokens = 0;

    // Gathers this step's logits rows (given positions) to the root.
    auto collect = [&](int seq, const Tensor& logits, const std::vector<int32_t>& pos) {
      if (!write_logits) return;
      std::vector<float> host(size_t(logits.numel()));
      be.download(logits, host.data());
      std::string blob(reinterpret_cast<const char*>(host.data()), host.size() * 4);
      std::string header;
      header.resize(sizeof(int32_t) * (2 + pos.size()));
      int32_t* h = reinterpret_cast<int32_t*>(header.data());
      h[0] = seq;
      h[1] = int32_t(pos.size());
      std::copy(pos.begin(), pos.end(), h + 2);
      // Only one rank of each tp group sends (they hold the same rows).
      const bool sender = par.folded() || par.tp_rank == 0;
      std::vector<std::string> all = g.telemetry ? g.telemetry->gather_blobs(sender ? header + blob : "", 0)
                                                 : std::vector<std::string>{header + blob};
      if (!g.root()) return;
      for (auto& b : all) {
        if (b.empty()) continue;
        const int32_t* hh = reinterpret_cast<const int32_t*>(b.data());
        const int32_t s = hh[0], n = hh[1];
        const float* rows = reinterpret_cast<const float*>(b.data() + sizeof(int32_t) * (2 + n));
        for (int32_t i = 0; i < n; ++i)
          std::memcpy(&logits_rows[size_t((int64_t(s) * total + hh[2 + i]) * cfg.vocab)], rows + int64_t(i) * cfg.vocab,
                      size_t(cfg.vocab) * 4);
      }
    };
    // The next token, chosen on the rank holding the last position and shared
    // with every rank (so all ranks feed the same token).
    Tensor token_buf;
    auto share_token = [&](int32_t token, int root_rank) -> int32_t {
      if (!g.world) return token;
      if (!token_buf.defined()) token_buf = be.alloc({1}, Category::CommBuffers, "next_token");
      float v = float(token);
      be.upload(token_buf, &v, DType::F32);
      {
        SiteScope s(rec, -1, "next_token");
        g.world->broadcast(token_buf, root_rank);
      }
      be.download(token_buf, &v);
      return int32_t(v);
    };

    // The next token from a row of logits: the argmax kernel, or a draw (runtime/sampling.h).
    auto choose = [&](const Tensor& logits, int64_t row, uint64_t seed, int seq, uint64_t step) -> int32_t {
      if (o.sampling.greedy() || !be.has_data()) return be.argmax_row(logits, row);
      std::vector<float> v(size_t(logits.cols()));
      be.download(logits.slice(0, row, 1), v.data());
      return sample_token(v, o.sampling, seed, uint64_t(seq), step);
    };

    // One cached decode step: `token` at position p1, whose K/V the rank
    // that owns p1 keeps under a sequence split.
    auto decode_step = [&](int32_t token, int32_t p1, Cache& c) {
      StepLayout dl;
      dl.kv_owner = seq_sharded ? int(p1 % S) : 0;
      return model.forward(std::span<const int32_t>(&token, 1), std::span<const int32_t>(&p1, 1), c, false, dl);
    };

    // Each sequence of this rank (one unless --batch): prefill, then decode.
    for (int seq = 0; seq < o.batch; ++seq) {
      const bool mine = seq >= seq_begin && seq < seq_end;
      RunOptions so = o;
      so.seed = o.seed + uint64_t(seq);
      const std::vector<int32_t> prompt = o.window                        ? window_of(seq)
                                          : seq == 0 || !o.tokens.empty() ? base_prompt
                                                                          : make_prompt(so, cfg.vocab);
      if (!mine) continue;
      std::vector<int32_t> tokens, pos;
      for (auto& [a, b] : my_ranges)
        for (int64_t p = a; p < b; ++p) {
          tokens.push_back(prompt[size_t(p)]);
          pos.push_back(int32_t(p));
        }
      StepLayout layout;
      layout.sequence_sharded = seq_sharded;
      layout.chunks = chunks;
      if (o.warm_start && seq == seq_begin) {
        // The same prefill and one decode step, untimed, on a cache of their
        // own that is gone before the real one is made. A first prefill
        // allocates its activations, received shards and caches fresh, and
        // each fresh page faults on first touch: on a 2-core VM that cost
        // 0.1 to 3.2 ms per MiB, so tsp's first layer took 100-400 ms
        // (its ring and broadcast buffers arrive in fresh pages) against
        // ~110 ms for each later one. After this the timed run reuses them.
        if (g.root()) extra.push_back(proto::to_line(proto::Phase{"warmup", rec.now()}));
        rec.set_phase("warmup");
        Cache warm = model.make_cache(my_prompt + my_decode_kv);
        model.forward(tokens, pos, warm, false, layout);
        // The last prompt token: the same on every rank, as a decoded token is.
        if (o.decode > 0 && !o.no_cache) decode_step(prompt.back(), int32_t(P), warm);
        step_boundary(g, rec, extra, out);
      }
      if (g.root() && seq == seq_begin) extra.push_back(proto::to_line(proto::Phase{"prefill", rec.now()}));
      Cache cache = model.make_cache(my_prompt + my_decode_kv);
      rec.set_phase("prefill");
      const int64_t t0 = rec.now();
      int32_t next = 0;
      {
        Tensor logits = model.forward(tokens, pos, cache, keep_logits, layout);
        // Who holds position P-1: the owner of the last chunk (zigzag: sp rank 0).
        const int last_owner_sp = chunks.back().second;
        const int root_rank = strategy == Strategy::DP ? g.rank : par.folded() ? last_owner_sp : last_owner_sp * T;
        if (par.sp_rank == last_owner_sp) next = choose(logits, logits.rows() - 1, o.seed, seq, 0);
        collect(seq, logits, pos);
        if (strategy != Strategy::DP) next = share_token(next, root_rank);
      }
      const int64_t t1 = rec.now();
      prefill_s += (t1 - t0) * 1e-9;
      prefill_tokens += P;
      if (seq == seq_begin) res.ttft_s = (t1 - t0) * 1e-9;
      step_boundary(g, rec, extra, out);

      if (o.decode > 0 && g.root() && seq == seq_begin) extra.push_back(proto::to_line(proto::Phase{"decode", rec.now()}));
      rec.set_phase("decode");
      std::vector<int32_t> history = prompt;  // --no-cache recomputes all of it every step
      if (o.no_cache) cache = Cache();  // the prefill's caches are not used
      for (int k = 0; k < o.decode; ++k) {
        // Teacher forcing (--force-decode): every run sees the same contexts,
        // so their logits compare position by position.
        if (size_t(k) < o.force_decode.size()) next = o.force_decode[size_t(k)];
        if (seq == seq_begin) res.generated.push_back(next);
        if (seq == seq_begin && report_tokens) generation(true);
        const int32_t p1 = int32_t(P + k);
        const int64_t d0 = rec.now();
        Tensor logits;
        if (o.no_cache) {
          history.push_back(next);
          std::vector<int32_t> all_pos(history.size());
          std::iota(all_pos.begin(), all_pos.end(), 0);
          Cache fresh = model.make_cache(int64_t(history.size()));
          logits = model.forward(history, all_pos, fresh, false);
        } else {
          logits = decode_step(next, p1, cache);
        }
        next = choose(logits, 0, o.seed, seq, uint64_t(k) + 1);
        if (strategy != Strategy::DP) next = share_token(next, 0);
        collect(seq, logits, {p1});
        decode_s += (rec.now() - d0) * 1e-9;
        ++decode_tokens;
        step_boundary(g, rec, extra, out);
      }
      if (seq == seq_begin) res.generated.push_back(next);
      if (seq == seq_begin && report_tokens) generation(false);
    }
    res.prefill_s = prefill_s;
    res.decode_s = decode_s;

    // Wire bytes of the tensor-parallel all-reduces per site, next to fp32 and bf16.
    for (auto& [site, w] : model.wire()) {
      extra.push_back(proto::to_line(proto::Metric{"wire_bytes." + site, w.sent, "bytes", g.rank}));
      extra.push_back(proto::to_line(proto::Metric{"wire_bytes_fp32." + site, w.fp32, "bytes", g.rank}));
      extra.push_back(proto::to_line(proto::Metric{"wire_bytes_bf16." + site, w.bf16, "bytes", g.rank}));
      extra.push_back(proto::to_line(proto::Metric{"wire_bytes_native." + site, w.native, "bytes", g.rank}));
    }
    if (g.root())
      for (auto& [key, e] : model.site_errors())
        extra.push_back(proto::to_line(
            proto::Accuracy{"rel_l2", key.first, key.second, e.second > 0 ? std::sqrt(e.first / e.second) : 0.0, ""}));
    // Per-rank peaks, then the run's metrics on the root.
    const MemState& m = alloc.state();
    push_peak_metrics(extra, m, g.rank);
    extra.push_back(proto::to_line(proto::Metric{"peak_rss_bytes", double(peak_rss_bytes()), "bytes", g.rank}));
    step_boundary(g, rec, extra, out);
    res.peak_bytes = m.peak_total;
    if (g.root()) {
      auto metric = [&](const char* name, double v, const char* unit) { out->write(proto::Metric{name, v, unit, -1}); };
      metric("ttft_ms", res.ttft_s * 1e3, "ms");
      metric("prefill_tokens_per_s", prefill_tokens / std::max(prefill_s, 1e-12), "tokens/s");
      if (o.decode > 0) {
        metric("decode_tokens_per_s", decode_tokens / std::max(decode_s, 1e-12), "tokens/s");
        metric("decode_ms_per_token", decode_s * 1e3 / double(std::max<int64_t>(decode_tokens, 1)), "ms");
      }
      metric("parameters", double(model.parameter_count()), "count");
      metric("peak_bytes", double(m.peak_total), "bytes");
      for (int c = 0; c < kCategoryCount; ++c)
        metric(("peak_" + std::string(kCategoryNames[size_t(c)]) + "_bytes").c_str(), double(m.peak_bytes[size_t(c)]),
               "bytes");
      metric("peak_rss_bytes", double(peak_rss_bytes()), "bytes");
      // Data-parallel replicas of the simulated group (simulate --replicas):
      // for inference they serve independent requests and exchange nothing,
      // so they scale throughput and add no traffic between replicas.
      if (setup.config.is_object() && setup.config.contains("replicas")) {
        const double r = setup.config["replicas"].get<double>();
        metric("replicas", r, "count");
        metric("total_devices", r * o.devices, "count");
        metric("aggregate_prefill_tokens_per_s", r * prefill_tokens / std::max(prefill_s, 1e-12), "tokens/s");
        if (o.decode > 0)
          metric("aggregate_decode_tokens_per_s", r * decode_tokens / std::max(decode_s, 1e-12), "tokens/s");
        metric("inter_replica_bytes", 0.0, "bytes");
      }
      if (write_logits) {
        std::vector<int64_t> shape = {total, cfg.vocab};
        if (o.batch > 1) shape.insert(shape.begin(), o.batch);
        write_npy(o.logits_out, shape, logits_rows.data());
      }
      out->write(proto::Done{"ok", rec.now(), kExitOk});
      out->flush();
    }
    if (g.world) g.world->barrier();
    res.status = "ok";
    return res;
  });
}

RunResult run_inference(const RunOptions& o, proto::Writer& out) {
  Recorder rec(0);  // outlives the communicators, which record into it
  rec.set_origin(std::chrono::steady_clock::now());
  Group g;
  return run_rank(o, &out, g, rec, rank_setup_for(o.backend, o.devices));
}

void check_nodes(int nodes, int devices) {
  if (nodes < 1) throw UsageError("--nodes must be at least 1");
  if (devices % nodes)
    throw UsageError("--nodes " + std::to_string(nodes) + " must divide --devices " + std::to_string(devices));
}

RunResult simulate(const RunOptions& o, const HardwareProfile& hw, int nodes, int replicas, proto::Writer& out) {
  if (replicas < 1 || replicas > 1000000) throw UsageError("--replicas must be between 1 and 1000000");
  if (!o.logits_out.empty()) throw UsageError("--logits-out needs real data; the simulator has none (use run or launch)");
  check_nodes(nodes, o.devices);
  const int per_node = o.devices / nodes;
  if (per_node > hw.max_devices_per_node)
    throw UsageError(std::to_string(per_node) + " devices per node exceed the profile's " +
                     std::to_string(hw.max_devices_per_node) + "; raise --nodes");
  // Refuse what cannot run before any rank starts (as launch does).
  const RunPlan plan = plan_inference(o, "sim");
  nlohmann::json config = {{"hardware", hw.source}, {"hardware_file", hw.file}, {"nodes", nodes}};
  if (replicas > 1) config["replicas"] = replicas;
  return simulate_ranks(o.devices, plan.strategy == Strategy::Single, hw, nodes, o.timeline, config, out,
                        [&](proto::Writer* w, Group& g, Recorder& rec, const RankSetup& setup) {
                          return run_rank(o, w, g, rec, setup);
                        });
}

}  // namespace ss

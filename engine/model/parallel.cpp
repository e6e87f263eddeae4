#include "model/parallel.h"

#include <algorithm>

#include "core/error.h"

namespace ss {

Strategy parse_strategy(const std::string& n) {
  if (n == "single") return Strategy::Single;
  if (n == "dp") return Strategy::DP;
  if (n == "tp") return Strategy::TP;
  if (n == "sp") return Strategy::SP;
  if (n == "tp_sp") return Strategy::TPSP;
  if (n == "tsp") return Strategy::TSP;
  throw UsageError("--strategy '" + n + "' is unknown; choose single, dp, tp, sp, tp_sp or tsp");
}

std::string strategy_name(Strategy s) {
  switch (s) {
    case Strategy::Single: return "single";
    case Strategy::DP: return "dp";
    case Strategy::TP: return "tp";
    case Strategy::SP: return "sp";
    case Strategy::TPSP: return "tp_sp";
    case Strategy::TSP: return "tsp";
  }
  return "?";
}

int64_t WeightSlice::extent() const {
  int64_t n = 0;
  for (auto& [a, b] : ranges) n += b - a;
  return n;
}

std::vector<std::pair<Range, int>> chunk_owners(int64_t len, int s, bool zigzag) {
  std::vector<std::pair<Range, int>> out;
  const int n = zigzag ? 2 * s : s;
  for (int k = 0; k < n; ++k) {
    const Range r{len * k / n, len * (k + 1) / n};
    const int owner = !zigzag ? k : (k < s ? k : 2 * s - 1 - k);
    out.emplace_back(r, owner);
  }
  return out;
}

std::vector<Range> token_ranges(int64_t len, int s, int r, bool zigzag) {
  std::vector<Range> out;
  for (auto& [range, owner] : chunk_owners(len, s, zigzag))
    if (owner == r) out.push_back(range);
  return out;
}

AttentionShard attention_shard(const ModelConfig& c, int index, int count) {
  AttentionShard s;
  s.heads = c.n_heads / count;
  s.kv_heads = c.n_kv_heads / count;
  s.head0 = int64_t(index) * s.heads;
  s.kv_head0 = int64_t(index) * s.kv_heads;
  s.ffn = c.ffn_dim / count;
  s.ffn0 = int64_t(index) * s.ffn;
  return s;
}

Mamba2Shard mamba2_shard(const ModelConfig& c, int index, int count) {
  Mamba2Shard s;
  const int hpg = c.ssm_heads / c.n_groups;
  s.heads = c.ssm_heads / count;
  s.head0 = int64_t(index) * s.heads;
  s.group0 = s.head0 / hpg;
  const int64_t group_end = (s.head0 + s.heads - 1) / hpg + 1;
  s.groups = int(group_end - s.group0);
  s.norm_spans_ranks = s.heads < hpg;
  return s;
}

MambaShard mamba_shard(const ModelConfig& c, int index, int count) {
  MambaShard s;
  s.channels = c.d_inner / count;
  s.channel0 = int64_t(index) * s.channels;
  return s;
}

namespace {
// Why the model's layers do not split over `shards` tensor-parallel ranks
// (heads, KV heads, FFN or SSM channels); empty where they do.
std::string split_problem(const ModelConfig& c, int shards) {
  const auto over = [&](const char* what, int64_t n) {
    return std::string(what) + " " + std::to_string(n) + " does not split over " + std::to_string(shards) + " ranks";
  };
  for (int i = 0; i < c.n_layers; ++i) {
    switch (c.layer_kind(i)) {
      case LayerKind::Attention:
        if (c.n_heads % shards) return over("num_attention_heads", c.n_heads);
        if (c.n_kv_heads % shards) return over("num_key_value_heads", c.n_kv_heads);
        if (c.ffn_dim % shards) return over("intermediate_size", c.ffn_dim);
        break;
      case LayerKind::Mamba2: {
        if (c.ssm_heads % shards) return over("Mamba2 num_heads", c.ssm_heads);
        const int hpg = c.ssm_heads / c.n_groups, local = c.ssm_heads / shards;
        if (local % hpg && hpg % local)
          return "Mamba2 heads per rank (" + std::to_string(local) + ") and heads per group (" + std::to_string(hpg) +
                 ") must divide one another over " + std::to_string(shards) + " ranks (or change n_groups)";
        break;
      }
      case LayerKind::Mamba:
        if (c.d_inner % shards) return over("Mamba intermediate size", c.d_inner);
        break;
    }
  }
  return {};
}
}  // namespace

std::string training_split_problem(const ModelConfig& c, int shards) {
  for (int i = 0; i < c.n_layers && shards > 1; ++i)
    if (c.layer_kind(i) == LayerKind::Mamba2 && c.n_groups % shards)
      return "training needs Mamba2's n_groups (" + std::to_string(c.n_groups) +
             ") to be a multiple of the weight shard count " + std::to_string(shards) +
             " (tp's, tp_sp's T or tsp's devices: a gated-norm group split over ranks has no backward yet, nor B and "
             "C rows shared by tsp shards)";
  return {};
}

void validate_parallel(const ModelConfig& c, Strategy s, int D, int T, int S, int64_t P, bool zigzag, int batch,
                       const ShapeFlags& flags) {
  auto refuse = [](const std::string& m) { throw UsageError(m); };
  if (D < 1) refuse("--devices must be at least 1");
  if (s == Strategy::Single && D != 1) refuse("--strategy single runs on 1 device; pick dp, tp, sp, tp_sp or tsp for --devices " + std::to_string(D));
  if (s == Strategy::TPSP) {
    if (T * S != D)
      refuse("--mesh " + std::to_string(T) + "x" + std::to_string(S) + " has " + std::to_string(T * S) +
             " ranks but --devices is " + std::to_string(D) + "; make T x S equal the device count");
  }
  if (s == Strategy::DP) {
    if (batch % D)
      refuse(std::string(flags.batch) + " " + std::to_string(batch) + " does not split over " + std::to_string(D) +
             " devices; use a multiple of " + std::to_string(D));
    return;
  }
  const int shards = s == Strategy::TSP ? D : T;
  const int seq = s == Strategy::TSP ? D : S;
  if (shards > 1)
    if (const std::string why = split_problem(c, shards); !why.empty()) {
      // "; use a device count that divides it (2, 4, 8)": the counts every
      // layer splits over (in training, by its rule too; under tsp, the
      // counts the length also splits over).
      const auto splits = [&](int k) {
        return split_problem(c, k).empty() && (!flags.training || training_split_problem(c, k).empty()) &&
               (s != Strategy::TSP || P <= 0 || P % (zigzag ? 2 * k : k) == 0);
      };
      std::string counts;
      int listed = 0;
      for (int k = 2; k <= 1024 && listed < 8; ++k)
        if (splits(k)) counts += (listed++ ? ", " : "") + std::to_string(k);
      refuse(why + "; use " + (s == Strategy::TPSP ? "a mesh T" : "a device count") + " that every layer splits over" +
             (counts.empty() ? " (none does: run it unsharded, under sp or dp)" : " (" + counts + ")"));
    }
  if (seq > 1 && P > 0) {
    const int chunks = zigzag ? 2 * seq : seq;
    if (P % chunks) {
      const int64_t up = (P / chunks + 1) * chunks;
      refuse(std::string(flags.length) + " " + std::to_string(P) + " does not split into " + std::to_string(chunks) + " equal " +
             (zigzag ? "zigzag " : "") + "chunks over " + std::to_string(seq) + " sequence ranks; use a multiple of " +
             std::to_string(chunks) + " (e.g. " + std::to_string(up) + ")");
    }
    for (int i = 0; i < c.n_layers; ++i)
      if (c.layer_kind(i) != LayerKind::Attention && P / chunks < c.d_conv - 1)
        refuse("each sequence chunk must hold at least d_conv-1 = " + std::to_string(c.d_conv - 1) +
               " tokens for the conv halo; make " + flags.length + " at least " + std::to_string(chunks * (c.d_conv - 1)));
  }
}

}  // namespace ss

#include "runtime/verify.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "comm/quantize.h"
#include "core/error.h"
#include "protocol/events.h"
#include "runtime/child_run.h"
#include "runtime/rank.h"

namespace ss {

double verify_bound(DType dtype, DType kv_dtype, int layers) {
  // Unit roundoff of the coarser format: bf16 keeps 8 significant bits, fp16 11.
  auto roundoff = [](DType t) { return t == DType::BF16 ? 0x1p-8 : t == DType::F16 ? 0x1p-11 : 0.0; };
  const double u = std::max(roundoff(dtype), roundoff(kv_dtype));
  // A strategy rounds at other points than one device does (a tensor-parallel
  // partial sum before it is reduced, a sequence shard's state or K/V after)
  // and sums in another order: a few independent roundings per layer and
  // site. Through up to four layers the strategy tests hold every strategy
  // to 1e-5 in fp32 and 8u in bf16; deeper, independent roundings add in
  // quadrature.
  return (u == 0 ? 1e-5 : 8 * u) * std::max(1.0, std::sqrt(layers / 4.0));
}

namespace {

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// "tsp on 4 cpu devices", "one cuda device".
std::string describe(const RunOptions& o) {
  const std::string where = o.devices == 1 ? "one " + o.backend + " device" : std::to_string(o.devices) + " " + o.backend + " devices";
  std::string s = o.strategy == "single" ? where : o.strategy + (o.mesh.empty() ? "" : " " + o.mesh) + " on " + where;
  if (parse_comm_precision(o.comm_precision, "--comm-precision").quantizes())
    s += " with --comm-precision " + o.comm_precision;
  return s;
}

// The worst row of one phase and the largest single difference.
struct PhaseStats {
  int64_t rows = 0, worst_row = -1;
  double worst = 0, largest = 0;
  void add(int64_t row, double rel, double diff) {
    ++rows;
    if (worst_row < 0 || rel > worst) worst = rel, worst_row = row;
    largest = std::max(largest, diff);
  }
};

// A run that did not finish: its exit code and why.
struct Failed {
  int code;
  std::string error_code;  // the run's own (usage, oom, stopped, ...)
  std::string why;
};

}  // namespace

int run_verify(const RunOptions& o, proto::Writer* stream, std::ostream& out) {
  if (o.backend == "sim")
    throw UsageError("verify compares computed logits, and simulated devices compute none; use --backend cpu or cuda");
  if (!o.sampling.greedy())
    throw UsageError("verify feeds both runs one device's greedy tokens; leave out --temperature and --top-k");
  if (!o.logits_out.empty()) throw UsageError("verify keeps both runs' logits itself; leave out --logits-out");
  if (o.strategy == "single" && o.backend == "cpu")
    throw UsageError("verify sets a strategy against one cpu device: choose --strategy dp, tp, sp, tp_sp or tsp "
                     "(or --backend cuda, to check one GPU against the cpu)");
  // The reference: the same run on one cpu device, its all-reduces (there
  // are none) exact.
  RunOptions ref = o;
  ref.strategy = "single";
  ref.devices = 1;
  ref.mesh.clear();
  ref.backend = "cpu";
  ref.comm_precision.clear();
  ref.measure_sites = false;
  ref.capacity = 0;  // the reference is not the run whose memory the capacity tests
  // Both refused here, with one line, before either starts: as launch
  // refuses them (a backend it has no devices of included).
  const bool gpu = o.backend == "cuda" || o.backend == "cuda-emu";
  const RunPlan plan = plan_inference(o, gpu ? o.backend : "cpu");
  if (o.backend == "cuda") check_gpu_count(o.devices);
  plan_inference(ref, "cpu");
  check_child_arguments(o);

  const int64_t P = plan.tokens, per_sequence = P + o.decode;  // rows of each sequence
  const double bound = verify_bound(o.dtype, cache_dtype(o), plan.cfg.n_layers);
  const bool quantized = parse_comm_precision(o.comm_precision, "--comm-precision").quantizes();
  out << "verify: " << describe(o) << " against one cpu device (" << plan.cfg.name << ", "
      << compute_dtype_name(o.dtype) << "; " << (o.batch > 1 ? std::to_string(o.batch) + " sequences of " : "")
      << P << " tokens" << (o.decode ? ", " + std::to_string(o.decode) + " decode steps" : "") << ")\n";
  out.flush();
  auto emit = [&](const proto::Event& e) {
    if (stream) stream->write(e);
  };
  emit(proto::Hello{proto::kVersion, engine_version(), host_name()});
  emit(proto::Config{{{"verify", {{"run", describe(o)}, {"reference", describe(ref)}, {"bound", bound},
                                  {"layers", plan.cfg.n_layers}}},
                      {"model", plan.cfg.to_json()},
                      {"backend", o.backend},
                      {"strategy", o.strategy},
                      {"devices", o.devices},
                      {"dtype", std::string(compute_dtype_name(o.dtype))},
                      {"kv_dtype", std::string(compute_dtype_name(cache_dtype(o)))},
                      {"comm_precision", o.comm_precision.empty() ? "fp32" : o.comm_precision},
                      {"workload", {{"prompt_len", P}, {"decode", o.decode}, {"batch", o.batch}, {"seed", o.seed}}}}});
  if (stream) stream->flush();
  // The verdict's last records: an error where there is one, and done.
  auto finish = [&](int code, const std::string& error_code, const std::string& message) {
    if (!error_code.empty()) emit(proto::Error{error_code, -1, message, {}});
    emit(proto::Done{code == kExitOk ? "ok" : code == kExitOom ? "oom" : "failed", 0, code});
    if (stream) stream->flush();
    return code;
  };

  const std::string base = "/tmp/shardscope-verify-" + std::to_string(getpid());
  auto run = [&](const RunOptions& r, const char* tag) {
    ChildRun c = run_child(r, base + "-" + tag);
    if (!c.ok) throw Failed{c.exit_code ? c.exit_code : kExitFailure, c.error_code, describe(r) + " failed: " + c.error};
    out << "  " << describe(r) << ": " << fmt("%.2f s", c.seconds) << "\n";
    out.flush();
    emit(proto::Metric{std::string("verify_seconds.") + tag, c.seconds, "s", -1});
    return std::move(c.logits);
  };
  // One device first: its greedy tokens feed both runs' decode. Where every
  // sequence of a batch decodes them, one device runs again fed them too.
  NpyArray want, got;
  try {
    want = run(ref, "reference");
    const int64_t V = want.shape.back();
    if (o.decode > 0 && o.force_decode.empty()) {
      for (int k = 0; k < o.decode; ++k)
        ref.force_decode.push_back(int32_t(argmax_row(&want.data[size_t((P - 1 + k) * V)], V)));
      if (o.batch > 1) want = run(ref, "reference");
    }
    RunOptions mine = o;
    mine.force_decode = ref.force_decode;
    got = run(mine, "run");
    if (got.shape != want.shape)
      throw Failed{kExitFailure, "internal", "the two runs' logits differ in shape; this is a defect of the engine"};
  } catch (const Failed& f) {
    out << "failed: " << f.why << "\n";
    return finish(f.code, f.error_code, f.why);
  }

  const int64_t V = want.shape.back();
  auto place = [&](int64_t row, bool phase = true) { return proto::row_place(row, P, o.decode, o.batch > 1, phase); };
  PhaseStats prefill, decode;
  int64_t same_top1 = 0;
  const int64_t rows = int64_t(want.data.size()) / V;
  for (int64_t r = 0; r < rows; ++r) {
    const float *a = &got.data[size_t(r * V)], *b = &want.data[size_t(r * V)];
    double diff2 = 0, ref2 = 0, largest = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double d = double(a[v]) - double(b[v]);
      diff2 += d * d;
      ref2 += double(b[v]) * double(b[v]);
      largest = std::max(largest, std::fabs(d));
    }
    // A row whose reference is all zero compares absolutely.
    const double rel = std::isnan(diff2) ? INFINITY : ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
    (r % per_sequence < P ? prefill : decode).add(r, rel, largest);
    same_top1 += argmax_row(a, V) == argmax_row(b, V);
  }
  for (const auto* phase : {&prefill, &decode}) {
    if (!phase->rows) continue;
    const std::string name = phase == &prefill ? "prefill" : "decode";
    emit(proto::Accuracy{"rel_l2", name, -1, phase->worst, ""});
    emit(proto::Accuracy{"max_abs_diff", name, -1, phase->largest, ""});
    emit(proto::Metric{"verify_rows." + name, double(phase->rows), "", -1});
    emit(proto::Metric{"verify_worst_row." + name, double(phase->worst_row), "", -1});
    out << "  " << (phase == &prefill ? "prefill" : "decode") << ", " << phase->rows
        << " rows: worst row relative L2 " << fmt("%.3g", phase->worst) << " at " << place(phase->worst_row, false)
        << ", largest difference " << fmt("%.3g", phase->largest) << "\n";
  }
  out << "  top-1 token: the same in " << same_top1 << " of " << rows << " rows\n";
  emit(proto::Accuracy{"top1", "", -1, double(same_top1) / double(std::max<int64_t>(rows, 1)), ""});
  const PhaseStats& worst = decode.rows && decode.worst > prefill.worst ? decode : prefill;
  const std::string bound_text = "the bound of " + fmt("%.3g", bound) + " for " + std::string(compute_dtype_name(o.dtype)) +
                                 (cache_dtype(o) != o.dtype ? " with a " + std::string(compute_dtype_name(cache_dtype(o))) + " KV cache" : "") +
                                 " over " + std::to_string(plan.cfg.n_layers) + " layers";
  if (worst.worst <= bound) {
    out << "ok: " << describe(o) << " computes what one device computes: its worst row is " << fmt("%.3g", worst.worst)
        << " from one device's, within " << bound_text << "\n";
    return finish(kExitOk, "", "");
  }
  const std::string differs = describe(o) + " is " + fmt("%.3g", worst.worst) + " from one device at " +
                              place(worst.worst_row) + ", past " + bound_text +
                              (quantized ? "; that is the quantized all-reduces' error (`sweep` measures it)" : "");
  out << "differs: " << differs << "\n";
  return finish(kExitFailure, "differs", differs);
}

}  // namespace ss

#include "runtime/verify.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>

#include "comm/quantize.h"
#include "core/error.h"
#include "protocol/analysis.h"
#include "protocol/events.h"
#include "runtime/child_run.h"
#include "io/safetensors.h"
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

// A figure as a record can carry it: JSON has no infinity (a NaN in a run
// makes a distance infinite), so that is the largest double.
double recordable(double v) { return std::isfinite(v) ? v : std::numeric_limits<double>::max(); }

// Squared norms of a - b and of b in float64, and the largest |a - b|: a
// row of logits or a gradient tensor against one device's (a missing or
// misshapen tensor is infinitely far).
struct Distance {
  double diff2 = 0, ref2 = 0, largest = 0;
  void add(const float* a, const float* b, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const double d = double(a[i]) - double(b[i]);
      diff2 += d * d;
      ref2 += double(b[i]) * double(b[i]);
      largest = std::max(largest, std::fabs(d));
    }
  }
  void add(const std::vector<float>* a, const std::vector<float>& b) {
    if (!a || a->size() != b.size()) diff2 = INFINITY;
    else add(a->data(), b.data(), int64_t(b.size()));
  }
  // Relative L2; absolute where the reference is all zero.
  double rel() const { return std::isnan(diff2) ? INFINITY : ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2); }
};

// A run that did not finish: its exit code and why.
struct Failed {
  int code;
  std::string error_code;  // the run's own (usage, oom, stopped, ...)
  std::string why;
};

// Where a verdict goes: the text to `out`, the records to `stream` where one
// was asked for.
struct Verdict {
  proto::Writer* stream;
  std::ostream& out;
  void emit(const proto::Event& e) {
    if (stream) stream->write(e);
  }
  void flush() {
    out.flush();
    if (stream) stream->flush();
  }
  // The last records: an error where there is one, and done.
  int finish(int code, const std::string& error_code, const std::string& message) {
    if (!error_code.empty()) emit(proto::Error{error_code, -1, message, {}});
    emit(proto::Done{code == kExitOk ? "ok" : code == kExitOom ? "oom" : "failed", 0, code});
    flush();
    return code;
  }
  // One of the runs compared, as a child of this process (files under
  // `base`-`tag`); its time printed and recorded. Throws Failed.
  template <class Options>
  ChildRun run(const Options& r, const std::string& base, const char* tag,
               const std::function<void(const proto::Event&)>& each = {}, const std::string& label = "") {
    const std::string name = label.empty() ? describe(run_options(r)) : label;
    ChildRun c = run_child(r, base + "-" + tag, each);
    if (!c.ok) throw Failed{c.exit_code ? c.exit_code : kExitFailure, c.error_code, name + " failed: " + c.error};
    out << "  " << name << ": " << fmt("%.2f s", c.seconds) << "\n";
    out.flush();
    emit(proto::Metric{std::string("verify_seconds.") + tag, c.seconds, "s", -1});
    return c;
  }
  static const RunOptions& run_options(const RunOptions& r) { return r; }
  static const RunOptions& run_options(const TrainOptions& t) { return t.run; }
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
  Verdict verdict{stream, out};
  auto emit = [&](const proto::Event& e) { verdict.emit(e); };
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
                      {"workload", {{"prompt_len", P}, {"decode", o.decode}, {"batch", o.batch}, {"seed", o.seed}}},
                      {"command", invocation()}}});
  verdict.flush();
  auto finish = [&](int code, const std::string& error_code, const std::string& message) {
    return verdict.finish(code, error_code, message);
  };
  const std::string base = scratch_base("verify");
  auto run = [&](const RunOptions& r, const char* tag) { return std::move(verdict.run(r, base, tag).logits); };
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
    Distance row;
    row.add(a, b, V);
    (r % per_sequence < P ? prefill : decode).add(r, row.rel(), row.largest);
    same_top1 += argmax_row(a, V) == argmax_row(b, V);
  }
  for (const auto* phase : {&prefill, &decode}) {
    if (!phase->rows) continue;
    const std::string name = phase == &prefill ? "prefill" : "decode";
    emit(proto::Accuracy{"rel_l2", name, -1, recordable(phase->worst), ""});
    emit(proto::Accuracy{"max_abs_diff", name, -1, recordable(phase->largest), ""});
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

namespace {

using Gradients = std::map<std::string, std::vector<float>>;

// What --dump-grads wrote: the first step's whole gradient, by tensor.
Gradients read_gradients(const std::string& dir) {
  Gradients g;
  const SafetensorsIndex idx = SafetensorsIndex::open_file(dir + "/gradients.safetensors");
  for (const auto& [name, e] : idx.entries()) {
    const std::vector<uint8_t> bytes = idx.read(name);
    std::vector<float>& v = g[name];
    v.resize(size_t(numel(e.shape)));
    widen(bytes.data(), e.dtype, int64_t(v.size()), v.data());
  }
  return g;
}

const std::vector<float>* find(const Gradients& g, const std::string& name) {
  const auto it = g.find(name);
  return it == g.end() ? nullptr : &it->second;
}

// "model.layers.3.mlp.up_proj.weight" -> 3; -1 for tensors outside the layers.
int layer_of(const std::string& name) {
  const size_t at = name.find("layers.");
  return at == std::string::npos ? -1 : std::atoi(name.c_str() + at + 7);
}

double relative(double got, double want) {
  const double d = std::fabs(got - want);
  return want != 0 ? d / std::fabs(want) : d;
}

}  // namespace

int run_train_verify(const TrainOptions& o, proto::Writer* stream, std::ostream& out) {
  const RunOptions& r = o.run;
  if (r.backend == "sim")
    throw UsageError("--verify compares computed gradients, and simulated devices compute none; use --backend cpu "
                     "or cuda");
  if (!o.dump_grads.empty()) throw UsageError("--verify keeps the runs' gradients itself; leave out --dump-grads");
  if (!o.save.empty()) throw UsageError("--verify compares runs and keeps none of them; leave out --save");
  if (o.check_only) throw UsageError("--verify runs the setup; leave out --check-only");
  if (r.strategy == "single" && r.backend == "cpu")
    throw UsageError("--verify sets a strategy against one cpu device: choose --strategy dp, tp, sp, tp_sp or tsp "
                     "(or --backend cuda, to check one GPU against the cpu)");
  // The reference: one cpu device, fed in one micro-batch what the replicas
  // are fed together, so that a step sums the gradient of the same sequences.
  const TrainPlan plan = plan_training(o);
  if (r.backend == "cuda") check_gpu_count(r.devices);
  TrainOptions one = o;
  one.run.strategy = "single";
  one.run.devices = 1;
  one.run.mesh.clear();
  one.run.backend = "cpu";
  one.run.capacity = 0;
  one.micro_batch = o.micro_batch * plan.replicas;
  one.global_batch = 0;
  one.grad_accum = plan.grad_accum;
  plan_training(one);
  // In bf16 a gradient that sums many terms which cancel (A_log's, D's) is
  // far from the exact one on any device: one device's fp32 gradient
  // measures how far one device's bf16 gradient is, and the run may be as
  // far, not much further.
  const bool rounded = r.dtype != DType::F32;
  TrainOptions exact = one;
  exact.run.dtype = DType::F32;
  const std::string exact_label = describe(exact.run) + " in fp32";
  const std::string dtype(compute_dtype_name(r.dtype));
  const std::string one_label = describe(one.run) + (rounded ? " in " + dtype : "");

  const int L = plan.cfg.n_layers;
  const double bound = verify_bound(DType::F32, DType::F32, L), loss_bound = verify_bound(r.dtype, r.dtype, L);
  // The run's distance from fp32 against one bf16 device's: two runs'
  // roundings differ by chance, most over tensors of a few values (measured:
  // at most 2.2 times, over dp, tp, sp, tsp and tp_sp of every tiny preset
  // at 2 and 8 layers and 64 tokens; A_log, D and dt_bias of 8 values each).
  const double factor = 4;
  const int64_t sequences = int64_t(one.micro_batch) * one.grad_accum;
  out << "verify: " << describe(r) << " trains against one cpu device (" << plan.cfg.name << ", " << dtype << "; "
      << sequences << (sequences > 1 ? " sequences" : " sequence") << " of " << plan.tokens << " tokens a step, "
      << o.steps << (o.steps > 1 ? " steps" : " step") << (rounded ? "; " + exact_label + " gives the exact gradient" : "")
      << ")\n";
  Verdict verdict{stream, out};
  nlohmann::json v = {{"run", describe(r)},         {"reference", describe(one.run)}, {"bound", bound},
                      {"loss_bound", loss_bound}, {"layers", L},                     {"train", true}};
  if (rounded) v["exact"] = exact_label, v["factor"] = factor;
  verdict.emit(proto::Hello{proto::kVersion, engine_version(), host_name()});
  verdict.emit(proto::Config{{{"verify", v},
                              {"model", plan.cfg.to_json()},
                              {"backend", r.backend},
                              {"strategy", r.strategy},
                              {"devices", r.devices},
                              {"dtype", dtype},
                              {"workload", {{"seq_len", plan.tokens}, {"sequences", sequences}, {"steps", o.steps},
                                            {"seed", r.seed}}},
                              {"command", invocation()}}});
  verdict.flush();

  // Each run's losses by step, and its first step's gradient.
  struct Ran {
    std::vector<proto::TrainStep> steps;
    Gradients grads;
  };
  const std::string base = scratch_base("verify");
  auto train = [&](TrainOptions t, const char* tag, const std::string& label = "") {
    Ran ran;
    t.dump_grads = base + "-" + tag + "-grads";
    struct Remove {
      std::string dir;
      ~Remove() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
      }
    } remove{t.dump_grads};
    verdict.run(t, base, tag, [&](const proto::Event& e) {
      if (const auto* s = std::get_if<proto::TrainStep>(&e)) ran.steps.push_back(*s);
    }, label);
    ran.grads = read_gradients(t.dump_grads);
    if (ran.steps.empty()) throw Failed{kExitFailure, "internal", describe(t.run) + " reported no step"};
    return ran;
  };
  Ran want, got, fp32;
  try {
    want = train(one, "reference", one_label);
    if (rounded) fp32 = train(exact, "exact", exact_label);
    got = train(o, "run");
  } catch (const Failed& f) {
    out << "failed: " << f.why << "\n";
    return verdict.finish(f.code, f.error_code, f.why);
  } catch (const std::exception& e) {  // the gradients a run wrote could not be read
    const std::string why = std::string("reading the runs' gradients: ") + e.what();
    out << "failed: " << why << "\n";
    return verdict.finish(kExitFailure, "internal", why);
  }

  // The first step's loss and gradient norm (step 1, or --resume's next),
  // against one device in the run's dtype.
  std::vector<std::string> past;
  const proto::TrainStep &a = got.steps.front(), &b = want.steps.front();
  const std::string first = "step " + std::to_string(a.step);
  const double loss_rel = relative(a.loss, b.loss), norm_rel = relative(a.grad_norm, b.grad_norm);
  verdict.emit(proto::Metric{"verify_first_step", double(a.step), "", -1});
  verdict.emit(proto::Accuracy{"rel_l2", "loss", -1, recordable(loss_rel), ""});
  verdict.emit(proto::Accuracy{"rel_l2", "grad_norm", -1, recordable(norm_rel), ""});
  out << "  " << first << " loss " << fmt("%.7g", a.loss) << " against one device's " << fmt("%.7g", b.loss)
      << ": relative " << fmt("%.3g", loss_rel) << "\n  " << first << " gradient norm " << fmt("%.7g", a.grad_norm)
      << " against one device's " << fmt("%.7g", b.grad_norm) << ": relative " << fmt("%.3g", norm_rel) << "\n";
  if (loss_rel > loss_bound) past.push_back("its " + first + " loss is " + fmt("%.3g", loss_rel) + " from one device's");
  if (norm_rel > loss_bound) past.push_back("its gradient norm is " + fmt("%.3g", norm_rel) + " from one device's");

  // Step 1's gradient, tensor by tensor: against one device's (fp32), or
  // beside one bf16 device's, both from one device's fp32 gradient.
  const Gradients& truth = rounded ? fp32.grads : want.grads;
  Distance whole_run, whole_one;
  std::string nearest;  // the tensor nearest its bound (or furthest past it)
  double nearest_share = -1, nearest_run = 0, nearest_allowed = 0;
  int over = 0;
  for (const auto& [name, t] : truth) {
    Distance d_run, d_one;
    d_run.add(find(got.grads, name), t);
    whole_run.add(find(got.grads, name), t);
    if (rounded) {
      d_one.add(find(want.grads, name), t);
      whole_one.add(find(want.grads, name), t);
    }
    const double e_run = d_run.rel(), allowed = proto::train_verify_tensor_bound(v, d_one.rel());
    verdict.emit(proto::Accuracy{"grad_rel_l2", name, layer_of(name), recordable(e_run), ""});
    if (rounded)
      verdict.emit(proto::Accuracy{"grad_rel_l2", name, layer_of(name), recordable(d_one.rel()), "reference"});
    over += e_run > allowed;
    if (e_run / allowed > nearest_share)
      nearest_share = e_run / allowed, nearest = name, nearest_run = e_run, nearest_allowed = allowed;
  }
  for (const auto& [name, g] : got.grads) over += !truth.count(name);  // a tensor one device has not
  verdict.emit(proto::Accuracy{"grad_rel_l2", "whole", -1, recordable(whole_run.rel()), ""});
  if (rounded) verdict.emit(proto::Accuracy{"grad_rel_l2", "whole", -1, recordable(whole_one.rel()), "reference"});
  verdict.emit(proto::Metric{"verify_tensors", double(truth.size()), "", -1});
  verdict.emit(proto::Metric{"verify_tensors_past", double(over), "", -1});
  if (rounded)
    out << "  " << first << " gradient, " << truth.size() << " tensors, from one device's in fp32: the run's "
        << fmt("%.3g", whole_run.rel()) << " (relative L2), one " << dtype << " device's " << fmt("%.3g", whole_one.rel())
        << "\n  the tensor nearest its bound (" << fmt("%.3g", factor) << " x one device's + " << fmt("%.3g", bound)
        << "): " << nearest << ", " << fmt("%.3g", nearest_run) << " against " << fmt("%.3g", nearest_allowed) << "\n";
  else
    out << "  " << first << " gradient, " << truth.size() << " tensors: relative L2 " << fmt("%.3g", whole_run.rel())
        << " over the whole; the worst tensor " << nearest << ", " << fmt("%.3g", nearest_run) << "\n";
  if (over)
    past.push_back(std::to_string(over) + " of its " + std::to_string(truth.size()) +
                   " gradient tensors are past their bound (" + nearest + ": " + fmt("%.3g", nearest_run) + ")");

  // Later steps: reported, not bounded. AdamW moves a weight by about the
  // learning rate whatever its gradient's size, so a gradient within
  // rounding of zero can move it either way: two runs' trajectories part by
  // chance, slowly at small learning rates.
  if (o.steps > 1) {
    double most = 0;
    for (size_t i = 0; i < std::min(got.steps.size(), want.steps.size()); ++i)
      most = std::max(most, std::fabs(got.steps[i].loss - want.steps[i].loss));
    verdict.emit(proto::Accuracy{"max_abs_diff", "loss_curve", -1, recordable(most), ""});
    out << "  steps " << a.step << " to " << got.steps.back().step << ": the losses differ by at most " << fmt("%.3g", most)
        << " nats (reported, not bounded: AdamW moves a weight by about the learning rate whatever its gradient's "
           "size, so two runs part by chance)\n";
  }
  if (past.empty()) {
    const std::string bounds = rounded ? fmt("%.3g", loss_bound) + " for the loss; for a tensor, " + fmt("%g", factor) +
                                             " times one " + dtype + " device's distance from fp32, plus " +
                                             fmt("%.3g", bound)
                                       : fmt("%.3g", bound);
    out << "ok: " << describe(r) << " trains as one device does: " << first
        << "'s loss, gradient norm and every gradient "
        << "tensor are within their bounds (" << bounds << ", over " << L << " layers)\n";
    return verdict.finish(kExitOk, "", "");
  }
  std::string why = describe(r) + " does not train as one device does: ";
  for (size_t i = 0; i < past.size(); ++i) why += (i ? "; " : "") + past[i];
  out << "differs: " << why << "\n";
  return verdict.finish(kExitFailure, "differs", why);
}

}  // namespace ss

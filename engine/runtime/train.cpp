// Training runs: the options' checks, one rank's step loop, and the ways to
// start ranks (in-process, mpirun of `train-rank`, simulated threads).
//
// A step: zero the gradients; for each of K micro-batches, forward, loss,
// backward (gradients added); the gradients of a layer start their sum over
// the data-parallel (dp) or sequence-parallel (sp, tp_sp) group as soon as
// the last micro-batch's backward has finished that layer, overlapping the
// rest of backward; then the loss and the global gradient norm are summed,
// the gradient is clipped by that norm, and AdamW updates every parameter
// (fp32 master weights and moments; a bf16 parameter receives the rounding).
#include "runtime/train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numbers>

#include "core/error.h"
#include "cpu/kernels.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "runtime/forecast.h"
#include "runtime/rank.h"
#include "sim/hardware.h"
#include "sim/meta_backend.h"
#include "train/checkpoint_io.h"
#include "train/data.h"
#include "train/memory.h"
#include "train/train_model.h"

namespace ss {
namespace fs = std::filesystem;
namespace {

int replicas_of(const TrainOptions& o) { return parse_strategy(o.run.strategy) == Strategy::DP ? o.run.devices : 1; }

// Micro-batches per step: --grad-accum, or what --global-batch asks for.
int grad_accum_of(const TrainOptions& o) {
  return o.global_batch > 0 ? o.global_batch / (o.micro_batch * replicas_of(o)) : o.grad_accum;
}

int64_t seq_len_of(const TrainOptions& o) {
  return o.tokens.empty() ? o.seq_len : int64_t(o.tokens.size()) - 1;
}

// The model of the run: --resume's folder (its config.json and weights), or --model.
ModelConfig train_config(const TrainOptions& o, fs::path* dir) {
  ModelConfig cfg = resolve_model(o.resume.empty() ? o.run.model : o.resume, dir, o.run.overrides);
  cfg.dtype = o.run.dtype;
  cfg.kv_dtype = o.run.dtype;
  return cfg;
}

// The learning rate of (absolute) step `step` of a schedule of `total` steps.
double lr_at(const TrainOptions& o, int step, int total) {
  if (o.warmup > 0 && step <= o.warmup) return o.lr * step / o.warmup;
  const int span = std::max(1, total - o.warmup - 1);
  const double progress = std::min(1.0, double(step - o.warmup - 1) / span);
  const double low = o.lr * o.min_lr_ratio;
  return low + 0.5 * (o.lr - low) * (1 + std::cos(std::numbers::pi * progress));
}

}  // namespace

TrainPlan plan_training(const TrainOptions& o) {
  const RunOptions& r = o.run;
  if (r.backend != "cpu" && r.backend != "sim" && r.backend != "cuda" && r.backend != "cuda-emu")
    throw UsageError("--backend " + r.backend + " cannot train; use cpu, cuda or sim (with --hardware)");
  if (r.backend == "sim" && o.hardware.empty()) throw UsageError("--backend sim needs --hardware PROFILE");
  const Strategy s = parse_strategy(r.strategy);
  if (r.devices < 1 || r.devices > 1024) throw UsageError("--devices must be between 1 and 1024");
  if (s == Strategy::Single && r.devices != 1)
    throw UsageError("--strategy single runs on one device; choose dp, tp, sp or tp_sp for --devices " +
                     std::to_string(r.devices));
  if (s != Strategy::TPSP && !r.mesh.empty()) throw UsageError("--mesh is for --strategy tp_sp only");
  const auto [T, S] = mesh_of(r);
  if (T * S != r.devices && s != Strategy::TSP && s != Strategy::DP && s != Strategy::Single)
    throw UsageError("--mesh " + r.mesh + " has " + std::to_string(T * S) + " ranks but --devices is " +
                     std::to_string(r.devices) + "; make T x S equal the device count");
  if (r.split != "zigzag" && r.split != "contiguous") throw UsageError("--split must be zigzag or contiguous");
  if (r.dtype == DType::F16)
    throw UsageError("--dtype fp16 training needs loss scaling, which is not built; use --dtype bf16 or fp32");
  parse_recompute(o.recompute);
  if (o.steps < 1) throw UsageError("--steps must be >= 1");
  if (o.micro_batch < 1) throw UsageError("--micro-batch must be >= 1");
  if (o.grad_accum < 1) throw UsageError("--grad-accum must be >= 1");
  if (o.global_batch < 0) throw UsageError("--global-batch must be >= 1");
  if (o.global_batch > 0) {
    const int per = o.micro_batch * replicas_of(o);
    if (o.global_batch % per)
      throw UsageError("--global-batch " + std::to_string(o.global_batch) + " does not split into micro-batches of " +
                       std::to_string(o.micro_batch) + " sequences on " + std::to_string(replicas_of(o)) +
                       " replica(s); make it a multiple of " + std::to_string(per) + " or change --micro-batch");
    if (o.grad_accum != 1) throw UsageError("give --global-batch or --grad-accum, not both");
  }
  if (!(o.lr >= 0) || !(o.weight_decay >= 0) || !(o.clip >= 0) || o.warmup < 0)
    throw UsageError("--lr, --weight-decay, --clip and --warmup must be >= 0");
  if (!(o.adam_eps > 0) || !(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1))
    throw UsageError("--adam-eps must be > 0 and --beta1, --beta2 in [0, 1)");
  if (!o.tokens.empty()) {
    if (o.tokens.size() < 2) throw UsageError("--tokens needs at least 2 ids (inputs are all but the last)");
    if (o.seq_len && o.seq_len != int64_t(o.tokens.size()) - 1)
      throw UsageError("--seq-len " + std::to_string(o.seq_len) + " disagrees with --tokens (" +
                       std::to_string(o.tokens.size() - 1) + " inputs); give one of them");
    if (o.micro_batch != 1 || replicas_of(o) != 1)
      throw UsageError("--tokens is one sequence: use --micro-batch 1 and a strategy other than dp");
  } else if (o.seq_len < 1) {
    throw UsageError("give a sequence length: --seq-len N, or one sequence with --tokens 1,2,3,...");
  }
  if (o.tokens.empty() && o.data != "synthetic" && !fs::exists(o.data))
    throw UsageError("--data " + o.data + " does not exist (give a file, or --data synthetic)");
  // --tokenizer none: the file's bytes are the ids, whatever the model folder holds.
  const bool bytes = o.tokenizer == "none";
  if (!o.tokenizer.empty() && !bytes && (o.data == "synthetic" || !o.tokens.empty()))
    throw UsageError("--tokenizer encodes the text of --data FILE; give the file");
  const fs::path given_tokenizer = o.tokenizer.empty() || bytes ? fs::path() : resolve_tokenizer(o.tokenizer);
  if (!o.save.empty() && fs::exists(o.save) && !fs::is_directory(o.save))
    throw UsageError("--save " + o.save + " is a file, not a folder; give a folder to write");
  if (o.schedule_steps < 0) throw UsageError("--schedule-steps must be >= 0");
  if (!o.resume.empty() && !fs::exists(fs::path(o.resume) / "trainer_state.json"))
    throw UsageError("--resume " + o.resume + " has no trainer_state.json: it is not a checkpoint `train --save` wrote");

  TrainPlan plan;
  plan.strategy = s;
  plan.devices = r.devices;
  plan.tp = T;
  plan.sp = S;
  plan.zigzag = r.split == "zigzag";
  plan.cfg = train_config(o, &plan.dir);
  if (!o.tokenizer.empty()) plan.tokenizer = given_tokenizer;  // (empty for none)
  else if (o.tokens.empty() && o.data != "synthetic" && !plan.dir.empty() && fs::exists(plan.dir / "tokenizer.json"))
    plan.tokenizer = plan.dir / "tokenizer.json";  // a text model trains on text through its own tokenizer
  plan.tokens = seq_len_of(o);
  plan.recompute = parse_recompute(o.recompute);
  plan.replicas = replicas_of(o);
  plan.grad_accum = grad_accum_of(o);
  const ModelConfig& cfg = plan.cfg;
  TrainModel::check_supported(cfg, s == Strategy::TP || s == Strategy::TSP ? r.devices : s == Strategy::TPSP ? T : 1);
  check_token_ids(o.tokens, cfg.vocab);
  ShapeFlags names = r.shape_names.value_or(ShapeFlags{"--seq-len", "--micro-batch"});
  names.training = true;
  validate_parallel(cfg, s, r.devices, T, S, plan.tokens, plan.zigzag, o.micro_batch * plan.replicas, names);
  if (!plan.dir.empty()) {
    // The folder's weights must be the model's, with its shapes (checked without loading them).
    Allocator none;
    Recorder quiet;
    MetaBackend meta(none, quiet);
    CheckpointSource check(plan.dir, Model(cfg, meta).weights());
  }
  return plan;
}

static RunResult train_rank(const TrainOptions& o, proto::Writer* out, Group& g, Recorder& rec,
                            const RankSetup& setup) {
  return guarded_rank(out, g, rec, setup, [&, out](const std::function<void()>& hello) mutable {
    RunResult res;
    const TrainPlan plan = plan_training(o);
    const RunOptions& r = o.run;
    const Strategy strategy = plan.strategy;
    const fs::path& dir = plan.dir;
    const ModelConfig& cfg = plan.cfg;
    const int T = plan.tp, S = plan.sp;
    const bool zigzag = plan.zigzag;
    const Recompute rc = plan.recompute;
    const int64_t L = plan.tokens;
    join_group(g, rec, setup, strategy, T);
    if (!g.root()) out = nullptr;
    if (setup.backend == "cpu" || setup.backend == "cuda-emu") {  // host memory, host threads
      if (r.threads > 0) cpu::set_threads(r.threads);
      else if (strategy != Strategy::Single) cpu::set_threads(1);
    }
    const int64_t capacity = device_capacity(g, setup, cfg, r);
    Allocator alloc(capacity);
    alloc.set_listener([&](const MemState& m) { rec.mem_sample(rec.now(), m); });
    if (!r.timeline) {
      rec.set_mem_sampling(false);
      rec.set_span_recording(false);
    }
    std::unique_ptr<Backend> backend = setup.make_backend(alloc, rec);
    Backend& be = *backend;
    const Parallel par = make_parallel(g, strategy, T, S, zigzag);
    Model model(cfg, be, par);
    std::unique_ptr<TensorSource> src;
    if (dir.empty()) src = std::make_unique<SyntheticSource>(r.seed);
    else src = std::make_unique<CheckpointSource>(dir, model.weights());
    std::unique_ptr<Corpus> corpus = !o.tokens.empty()         ? fixed_corpus(o.tokens)
                                     : o.data == "synthetic"   ? synthetic_corpus(r.seed, cfg.vocab)
                                     : !plan.tokenizer.empty() ? text_corpus(o.data, plan.tokenizer.string(), cfg.vocab)
                                                               : file_corpus(o.data, cfg.vocab);

    // This rank's rows of every sequence, and the groups its gradients and loss are summed over.
    const int replicas = plan.replicas, B = o.micro_batch, K = plan.grad_accum;
    const int64_t global_targets = L * B * replicas * K;
    StepLayout layout;
    layout.sequence_sharded = par.sp_size > 1;
    layout.chunks = par.sp_size > 1 ? chunk_owners(L, S, zigzag) : std::vector<std::pair<Range, int>>{{{0, L}, 0}};
    const std::vector<int32_t> local_pos = layout.positions(par.sp_rank);
    std::vector<Range> my_ranges;
    for (auto& [range, owner] : layout.chunks)
      if (owner == par.sp_rank) my_ranges.push_back(range);
    Communicator* grad_group = strategy == Strategy::DP ? par.world : par.sp_size > 1 ? par.sp : nullptr;

    std::vector<std::string> extra;
    if (g.root()) {
      nlohmann::json conf = {
          {"mode", "train"},
          {"model", cfg.to_json()},
          {"weights", src->describe()},
          {"parameters", model.parameter_count()},
          {"backend", setup.backend},
          {"strategy", strategy_name(strategy)},
          {"devices", r.devices},
          {"mesh", {{"tp", par.tp_size}, {"sp", par.sp_size}}},
          {"split", r.split},
          {"dtype", std::string(compute_dtype_name(cfg.dtype))},
          {"training",
           {{"seq_len", L}, {"micro_batch", B}, {"grad_accum", K}, {"replicas", replicas}, {"steps", o.steps},
            {"lr", o.lr}, {"warmup", o.warmup}, {"min_lr_ratio", o.min_lr_ratio}, {"weight_decay", o.weight_decay},
            {"clip", o.clip}, {"beta1", o.beta1}, {"beta2", o.beta2}, {"adam_eps", o.adam_eps}, {"recompute", recompute_name(rc)},
            {"data", corpus->describe()}, {"seed", r.seed}}},
          {"capacity", r.capacity},
          {"threads", cpu::threads()},
          {"command", invocation()},
      };
      hello();
      if (setup.config.is_object()) conf.update(setup.config);
      if (g.config.is_object()) conf.update(g.config, true);  // merged: gpu's fields from both
      out->write(proto::Config{conf});
      out->flush();
    }
    extra.push_back(proto::to_line(proto::Device{g.rank, std::string(be.kind()), be.device_name(), capacity,
                                                 g.hosts[size_t(g.rank)]}));
    extra.push_back(proto::to_line(proto::Tokens{g.rank, my_ranges}));
    if (g.root()) extra.push_back(proto::to_line(proto::Phase{"load", rec.now()}));
    rec.set_phase("load");
    model.load(*src);
    for (auto& p : placements(model, g.rank)) extra.push_back(proto::to_line(p));

    TrainModel tm(model, rc);
    tm.allocate_grads();
    tm.agree_over(strategy == Strategy::DP ? par.world : par.sp_size > 1 ? par.sp : nullptr);
    if (g.root()) tm.on_phase([&](const char* name, int64_t t) { extra.push_back(proto::to_line(proto::Phase{name, t})); });
    const std::vector<WeightSpec>& specs = model.weights();
    // Optimizer state: Adam's moments, and fp32 master weights for a 16-bit model.
    std::vector<Tensor> master(specs.size()), m1(specs.size()), m2(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      const Shape s = specs[i].local_shape();
      m1[i] = be.alloc(s, Category::OptimizerState, "adam.exp_avg." + specs[i].name, DType::F32);
      m2[i] = be.alloc(s, Category::OptimizerState, "adam.exp_avg_sq." + specs[i].name, DType::F32);
      be.fill(m1[i], 0.0f);
      be.fill(m2[i], 0.0f);
      if (cfg.dtype != DType::F32) {
        master[i] = be.alloc(s, Category::OptimizerState, "master." + specs[i].name, DType::F32);
        be.copy(master[i], *specs[i].slot);
      }
    }
    int step0 = 0;
    if (!o.resume.empty()) {
      // Moments (and master weights) in the folder's global layout, sliced for this rank.
      const nlohmann::json state = nlohmann::json::parse(std::ifstream(fs::path(o.resume) / "trainer_state.json"));
      step0 = state.value("step", 0);
      const SafetensorsIndex opt = SafetensorsIndex::open_file(fs::path(o.resume) / "optimizer.safetensors");
      for (size_t i = 0; i < specs.size(); ++i)
        for (auto& [suffix, t] : {std::pair<std::string, Tensor>{".exp_avg", m1[i]}, {".exp_avg_sq", m2[i]},
                                  {".master", master[i]}}) {
          if (!t.defined()) continue;
          const SafetensorsEntry* e = opt.find(specs[i].name + suffix);
          if (!e || e->shape != specs[i].shape || e->dtype != DType::F32)
            throw FormatError("--resume " + o.resume + ": optimizer.safetensors has no fp32 " + specs[i].name +
                              suffix + " of shape " + shape_str(specs[i].shape));
          if (!be.has_data()) continue;
          const std::vector<uint8_t> bytes = opt.read(specs[i].name + suffix);
          std::vector<float> local(size_t(t.numel()));
          const float* all = reinterpret_cast<const float*>(bytes.data());
          for_each_slice_element(specs[i].shape, specs[i].slice, [&](int64_t l, int64_t gi) { local[size_t(l)] = all[gi]; });
          be.upload(t, local.data(), DType::F32);
        }
    }
    step_boundary(g, rec, extra, out);

    // Which weights a layer's completion releases for their gradient sum.
    std::map<int, std::vector<size_t>> by_layer;
    for (size_t i = 0; i < specs.size(); ++i) by_layer[specs[i].layer].push_back(i);
    Tensor scalar = be.alloc({2}, Category::Workspace, "train.scalars", DType::F32);
    auto sum_over = [&](Communicator* c, double v) {
      if (!c) return v;
      float f[2] = {float(v), 0.0f};
      be.upload(scalar, f, DType::F32);
      c->all_reduce(scalar);
      be.download(scalar, f);
      return double(f[0]);
    };
    // Who sends a tensor when it is gathered: one rank per distinct copy.
    auto sender = [&](const WeightSpec& w) {
      return w.slice.mirrored() ? g.rank == 0 : par.folded() || par.sp_rank == 0;
    };
    double last_loss = 0, tokens_per_s_sum = 0;
    for (int step = step0 + 1; step <= step0 + o.steps; ++step) {
      const int64_t t0 = rec.now();
      tm.zero_grads();
      double loss_sum = 0;
      std::vector<Request> pending;
      for (int k = 0; k < K; ++k) {
        TrainBatch b;
        b.sequences = B;
        b.positions = local_pos;
        b.layout = layout;
        const int64_t first = (int64_t(step - 1) * K + k) * B * replicas + int64_t(B) * (replicas > 1 ? g.rank : 0);
        for (int j = 0; j < B; ++j) {
          const std::vector<int32_t> seq = corpus->sequence(first + j, L + 1);
          for (int32_t p : local_pos) {
            b.tokens.push_back(seq[size_t(p)]);
            b.targets.push_back(seq[size_t(p) + 1]);
          }
        }
        std::function<void(int)> done;
        if (grad_group && k == K - 1)
          done = [&](int layer) {
            SiteScope sc(rec, layer, "grad_sync");
            for (size_t i : by_layer[layer])
              // tsp: the shards' gradients reached their owners on the ring; the mirrored rest is summed.
              if (!par.folded() || specs[i].slice.mirrored()) pending.push_back(grad_group->iall_reduce(tm.grads()[i]));
          };
        loss_sum += tm.forward_backward(b, float(1.0 / double(global_targets)), done);
        if (tm.first_nonfinite_layer() != -2) {
          const int l = tm.first_nonfinite_layer();
          throw UsageError("step " + std::to_string(step) + ": the loss is not finite; the first non-finite output is " +
                           (l < 0 ? std::string("the embeddings'")
                            : l >= cfg.n_layers ? std::string("the final norm's or the LM head's")
                                                : "layer " + std::to_string(l) + "'s") +
                           "; lower --lr or clip the gradient with --clip (nothing was saved)");
        }
      }
      {
        SiteScope sc(rec, -1, "grad_sync.wait");
        for (auto& q : pending) q->wait();
      }
      rec.set_phase("optimizer");
      if (g.root()) extra.push_back(proto::to_line(proto::Phase{"optimizer", rec.now()}));
      const Communicator* loss_group = strategy == Strategy::DP ? par.world : par.sp_size > 1 ? par.sp : nullptr;
      const double loss = sum_over(const_cast<Communicator*>(loss_group), loss_sum) / double(global_targets);
      // Global gradient norm: sharded tensors summed over the tp group, mirrored ones counted once.
      Tensor ss_mirrored = be.alloc({1}, Category::Workspace, "grad_norm.mirrored", DType::F32);
      Tensor ss_sharded = be.alloc({1}, Category::Workspace, "grad_norm.sharded", DType::F32);
      be.fill(ss_mirrored, 0.0f);
      be.fill(ss_sharded, 0.0f);
      for (size_t i = 0; i < specs.size(); ++i)
        be.sum_squares(specs[i].slice.mirrored() ? ss_mirrored : ss_sharded, tm.grads()[i]);
      if (par.folded() && par.sp_size > 1) par.sp->all_reduce(ss_sharded);
      else if (par.tp_size > 1) par.tp->all_reduce(ss_sharded);
      float sq[2] = {0, 0};
      be.download(ss_mirrored, &sq[0]);
      be.download(ss_sharded, &sq[1]);
      const double norm = std::sqrt(double(sq[0]) + double(sq[1]));
      // Every rank holds the same norm: all refuse together, before anything is updated.
      if (!std::isfinite(norm))
        throw UsageError("step " + std::to_string(step) + ": the gradient's norm is not finite; lower --lr or clip "
                         "the gradient with --clip (nothing was saved)");
      if (step == step0 + 1 && !o.dump_grads.empty()) {
        std::vector<TensorBlob> blobs;
        for (size_t i = 0; i < specs.size(); ++i) {
          std::vector<float> whole = gather_whole(be, g.telemetry.get(), specs[i], tm.grads()[i], sender(specs[i]));
          if (g.root()) blobs.push_back(make_blob(specs[i].name, specs[i].shape, whole, DType::F32));
        }
        if (g.root()) {
          fs::create_directories(o.dump_grads);
          std::vector<const TensorBlob*> ptrs;
          for (auto& b : blobs) ptrs.push_back(&b);
          write_safetensors(fs::path(o.dump_grads) / "gradients.safetensors", ptrs);
          std::ofstream(fs::path(o.dump_grads) / "loss.json") << nlohmann::json{{"step", step}, {"loss", loss},
                                                                                  {"grad_norm", norm}}.dump(2) << "\n";
        }
      }
      AdamWArgs a;
      a.lr = float(lr_at(o, step, o.schedule_steps > 0 ? o.schedule_steps : step0 + o.steps));
      a.beta1 = float(o.beta1);
      a.beta2 = float(o.beta2);
      a.eps = float(o.adam_eps);
      a.step = step;
      a.grad_scale = o.clip > 0 && norm > o.clip ? float(o.clip / (norm + 1e-6)) : 1.0f;
      {
        SiteScope sc(rec, -1, "adamw");
        for (size_t i = 0; i < specs.size(); ++i) {
          // Decay on the matrices (projections, embeddings), not on norms, biases, conv kernels, A_log or D.
          const bool matrix = specs[i].shape.size() == 2 && specs[i].name.find("A_log") == std::string::npos;
          a.weight_decay = matrix ? float(o.weight_decay) : 0.0f;
          be.adamw(*specs[i].slot, master[i], tm.grads()[i], m1[i], m2[i], a);
        }
      }
      const double seconds = std::max(1e-12, (rec.now() - t0) * 1e-9);
      // The highest bytes any rank held per category so far.
      const MemState& mem = alloc.state();
      std::string mine(reinterpret_cast<const char*>(mem.peak_bytes.data()), sizeof(mem.peak_bytes));
      std::vector<std::string> peaks = g.telemetry ? g.telemetry->gather_blobs(mine, 0) : std::vector<std::string>{mine};
      if (g.root()) {
        proto::TrainStep ts;
        ts.step = step;
        ts.loss = loss;
        ts.grad_norm = norm;
        ts.lr = a.lr;
        ts.tokens = global_targets;
        ts.tokens_per_s = double(global_targets) / seconds;
        for (auto& p : peaks)
          for (int c = 0; c < kCategoryCount; ++c)
            ts.peak[size_t(c)] = std::max(ts.peak[size_t(c)], reinterpret_cast<const int64_t*>(p.data())[c]);
        extra.push_back(proto::to_line(ts));
        tokens_per_s_sum += ts.tokens_per_s;
      }
      last_loss = loss;
      step_boundary(g, rec, extra, out);
    }

    if (!o.save.empty()) {
      rec.set_phase("save");
      std::vector<TensorBlob> weights, opt;
      for (size_t i = 0; i < specs.size(); ++i) {
        const bool send = sender(specs[i]);
        std::vector<float> w = gather_whole(be, g.telemetry.get(), specs[i], *specs[i].slot, send);
        std::vector<float> e1 = gather_whole(be, g.telemetry.get(), specs[i], m1[i], send);
        std::vector<float> e2 = gather_whole(be, g.telemetry.get(), specs[i], m2[i], send);
        std::vector<float> mw;
        if (master[i].defined()) mw = gather_whole(be, g.telemetry.get(), specs[i], master[i], send);
        if (!g.root()) continue;
        weights.push_back(make_blob(specs[i].name, specs[i].shape, w, cfg.dtype));
        opt.push_back(make_blob(specs[i].name + ".exp_avg", specs[i].shape, e1, DType::F32));
        opt.push_back(make_blob(specs[i].name + ".exp_avg_sq", specs[i].shape, e2, DType::F32));
        if (!mw.empty()) opt.push_back(make_blob(specs[i].name + ".master", specs[i].shape, mw, DType::F32));
      }
      if (g.root()) {
        nlohmann::json c = cfg.source;
        c["torch_dtype"] = cfg.dtype == DType::F32 ? "float32" : "bfloat16";
        std::vector<std::pair<std::string, std::string>> files;
        // The folder is a model people can prompt: the tokenizer that encoded
        // its text, or the one its model folder came with.
        fs::path tokenizer = plan.tokenizer;
        if (tokenizer.empty() && !dir.empty() && fs::exists(dir / "tokenizer.json")) tokenizer = dir / "tokenizer.json";
        if (!tokenizer.empty()) {
          std::ifstream tin(tokenizer, std::ios::binary);
          files.emplace_back("tokenizer.json", std::string((std::istreambuf_iterator<char>(tin)), {}));
        }
        write_checkpoint_dir(o.save, c, weights, opt,
                             {{"step", step0 + o.steps}, {"loss", last_loss}, {"strategy", strategy_name(strategy)},
                              {"devices", r.devices}, {"dtype", std::string(compute_dtype_name(cfg.dtype))},
                              {"seed", r.seed}},
                             files);
      }
    }

    // Per-rank peaks and the closed-form expectation of each category.
    const MemState& m = alloc.state();
    const TrainMemory expect = expected_train_memory(model, rc, B, int64_t(local_pos.size()), int(my_ranges.size()));
    push_peak_metrics(extra, m, g.rank);
    extra.push_back(proto::to_line(proto::Metric{"expected_weights_bytes", double(expect.weights), "bytes", g.rank}));
    extra.push_back(proto::to_line(proto::Metric{"expected_grads_bytes", double(expect.grads), "bytes", g.rank}));
    extra.push_back(proto::to_line(
        proto::Metric{"expected_optimizer_state_bytes", double(expect.optimizer_state), "bytes", g.rank}));
    extra.push_back(
        proto::to_line(proto::Metric{"expected_activations_bytes", double(expect.activations), "bytes", g.rank}));
    extra.push_back(proto::to_line(
        proto::Metric{"korthikanti_activations_bytes", double(expect.korthikanti), "bytes", g.rank}));
    step_boundary(g, rec, extra, out);
    res.peak_bytes = m.peak_total;
    if (g.root()) {
      auto metric = [&](const char* name, double v, const char* unit) { out->write(proto::Metric{name, v, unit, -1}); };
      metric("final_loss", last_loss, "nats");
      metric("train_tokens_per_s", tokens_per_s_sum / o.steps, "tokens/s");
      metric("parameters", double(model.parameter_count()), "count");
      metric("peak_bytes", double(m.peak_total), "bytes");
      out->write(proto::Done{"ok", rec.now(), kExitOk});
      out->flush();
    }
    if (g.world) g.world->barrier();
    res.status = "ok";
    return res;
  });
}

RunResult run_training(const TrainOptions& o, proto::Writer& out) {
  Recorder rec(0);
  rec.set_origin(std::chrono::steady_clock::now());
  Group g;
  return train_rank(o, &out, g, rec, rank_setup_for(o.run.backend, o.run.devices));
}

RunResult simulate_training(const TrainOptions& o, proto::Writer& out) {
  const TrainPlan plan = plan_training(o);
  const HardwareProfile hw = load_hardware(o.hardware);
  check_nodes(o.nodes, o.run.devices);
  if (o.run.devices / o.nodes > hw.max_devices_per_node)
    throw UsageError(std::to_string(o.run.devices / o.nodes) + " devices per node exceed the profile's " +
                     std::to_string(hw.max_devices_per_node) + "; raise --nodes");
  const nlohmann::json config = {{"hardware", hw.source}, {"hardware_file", hw.file}, {"nodes", o.nodes}};
  return simulate_ranks(o.run.devices, plan.strategy == Strategy::Single, hw, o.nodes, o.run.timeline, config, out,
                        [&](proto::Writer* w, Group& g, Recorder& rec, const RankSetup& setup) {
                          return train_rank(o, w, g, rec, setup);
                        });
}

int train_command(const TrainOptions& o, const LaunchOptions& l) {
  plan_training(o);  // refuses what cannot run before anything starts
  if (o.check_only)  // its memory, simulated
    return forecast_and_report([&] { return forecast_training(o); }, o.run, &o, o.forecast_seconds);
  if (o.run.backend != "sim") rank_setup_for(o.run.backend, o.run.devices);  // refuses a backend this machine lacks
  if (o.run.backend != "sim" && o.run.devices > 1) return start_ranks(o.run.devices, l, "train-rank");
  std::FILE* f = stdout;
  if (!l.events.empty() && l.events != "-") {
    f = std::fopen(l.events.c_str(), "w");
    if (!f) throw UsageError("--events " + l.events + ": cannot create the file");
  }
  proto::Writer w(f);
  const RunResult r = o.run.backend == "sim" ? simulate_training(o, w) : run_training(o, w);
  if (f != stdout) std::fclose(f);
  return r.exit_code;
}

}  // namespace ss

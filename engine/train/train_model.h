// The training forward and backward of a Model, written against the Backend
// and the Communicator like inference: each layer's forward keeps what its
// backward needs (category activations), the backward walks the layers in
// reverse and adds every weight's gradient into its tensor (category grads),
// and the strategy's collectives are the conjugates of the forward's
// (engine/README.md, "Training").
//
// Families and strategies: Llama (attention + SwiGLU MLP) layers, Mamba2
// layers (Mamba2 and the hybrid, train/mamba2_train.cpp) and Mamba /
// Falcon-Mamba layers (train/mamba_train.cpp) under single, dp, tp, sp,
// tp_sp and tsp. Sequence-parallel SSM layers (sp, tp_sp, tsp) pass conv
// halos and states between ranks (train/ssm_sequence.cpp); under tsp the
// projections stream shard by shard (train/folded_train.cpp's ring).
#pragma once

#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"

namespace ss {

enum class Recompute { None, Selective, Full };
Recompute parse_recompute(const std::string& s);  // none | selective | full
const char* recompute_name(Recompute r);

// This rank's rows of one micro-batch: `sequences` sequences, each with this
// rank's tokens of it (all of them, or its chunks under sequence
// parallelism), in the same local order for every sequence.
struct TrainBatch {
  int sequences = 1;
  std::vector<int32_t> tokens, targets;  // [sequences * local], target < 0: not counted
  std::vector<int32_t> positions;        // [local]: the positions of one sequence's local rows
  StepLayout layout;                     // chunks and owners (sequence parallel)
  // Every sequence-parallel rank's positions in rank order (the rows of the
  // gathered K/V), built on first use by the attention layers of the batch.
  mutable std::vector<int32_t> gathered_positions;
};

class TrainModel {
 public:
  TrainModel(Model& model, Recompute recompute);

  // Refuses a model or strategy training cannot run yet (one line, before anything starts).
  static void check_supported(const ModelConfig& cfg, int tp_size);

  // Allocates the gradients (one per weight of the weight list, in its local
  // shape, fp32 whatever the compute dtype: micro-batches, LM-head blocks,
  // ring steps and reductions add into them without rounding).
  void allocate_grads();
  void zero_grads();
  const std::vector<Tensor>& grads() const { return m_grads; }

  // Forward, loss and backward of one micro-batch; gradients are added to
  // grads(). The loss of each target is multiplied by `scale` (1 / the step's
  // target tokens, so grads are those of the step's mean loss). Returns this
  // rank's unscaled loss sum. `layer_done(layer)` is called when a layer's
  // gradients are complete (-1: embeddings, final norm and head), so their
  // communication can start while backward goes on.
  double forward_backward(const TrainBatch& b, float scale, const std::function<void(int)>& layer_done = {});

  // After a forward whose loss was not finite: the first layer whose output
  // is not (-1: the embeddings); -2 when the loss was finite.
  int first_nonfinite_layer() const { return m_nonfinite_layer; }
  // The ranks that hold other tokens of the same step (dp, sp, tsp): they
  // agree on a non-finite loss before any enters backward.
  void agree_over(Communicator* group) { m_agree = group; }
  // Called with "forward" and "backward" and the recorder's time as each begins.
  void on_phase(std::function<void(const char*, int64_t)> fn) { m_on_phase = std::move(fn); }

 private:
  // Sequence parallel SSM layers: the states entering this rank's chunks of a sequence, and the chunks' decays.
  struct PassedStates {
    std::vector<Tensor> incoming;  // per local chunk, [1, state numel] fp32
    Tensor decays;                 // [chunks, decay numel] fp32
  };
  // What a layer's forward keeps for its backward (train_model.cpp lists the sizes).
  struct Saved {
    Tensor x_in, h1, q, k, v, o, lse, x_mid, h2, g, u, a;  // attention layers (h1: Mamba2's norm output too)
    Tensor zxbcdt, xbc, ys, yn;  // Mamba2: in_proj's output, conv's, the scan's, the gated norm's (Mamba: xz, xc, y)
    Tensor dbc, dbc_n, dt;       // Mamba: x_proj's output, its normalised copy (Falcon-Mamba), dt_proj's
    // Sequence parallel SSM layers, per sequence: conv halos, the states entering this rank's chunks, their decays.
    std::vector<Tensor> halos;
    std::vector<PassedStates> passed;
  };
  // A layer's weights and their gradients (attention or Mamba2).
  struct Layer {
    LayerKind kind = LayerKind::Attention;
    Tensor in_norm, q, k, v, o, post_norm, gate, up, down;
    Tensor g_in_norm, gq, gk, gv, go, g_post_norm, g_gate, g_up, g_down;
    Tensor q_b, k_b, v_b, o_b, gate_b, up_b, down_b;  // projection biases, where the config has them
    Tensor gq_b, gk_b, gv_b, go_b, g_gate_b, g_up_b, g_down_b;
    Tensor norm, in_proj, conv_w, conv_b, dt_bias, A_log, D, gated_norm, out_proj;
    Tensor g_norm, g_in_proj, g_conv_w, g_conv_b, g_dt_bias, g_A_log, g_D, g_gated_norm, g_out_proj;
    Tensor x_proj, dt_proj_w, dt_proj_b, g_x_proj, g_dt_proj_w, g_dt_proj_b;  // Mamba
  };
  void layer_forward(int i, const Tensor& x_in, const Tensor& x_out, const TrainBatch& b, Saved& s, bool keep);
  void layer_backward(int i, const Tensor& dx, const TrainBatch& b, Saved& s);
  void attention_forward(int i, const Tensor& x_in, const Tensor& x_out, const TrainBatch& b, Saved& s, bool keep);
  void attention_backward(int i, const Tensor& dx, const TrainBatch& b, Saved& s);
  void mamba2_forward(int i, const Tensor& x_in, const Tensor& x_out, const TrainBatch& b, Saved& s, bool keep);
  void mamba2_backward(int i, const Tensor& dx, const TrainBatch& b, Saved& s);
  SsdArgs ssd_args(const Layer& L, int H, int G) const;  // a Mamba2 layer's scan parameters
  std::vector<std::pair<int64_t, int64_t>> in_proj_columns(int shard) const;  // tsp: a Mamba2 in_proj shard's columns
  void mamba_forward(int i, const Tensor& x_in, const Tensor& x_out, const TrainBatch& b, Saved& s, bool keep);
  void mamba_backward(int i, const Tensor& dx, const TrainBatch& b, Saved& s);
  // tsp (train/folded_train.cpp): Llama layers with every projection streamed shard by shard.
  void folded_forward(int i, const Tensor& x_in, const Tensor& x_out, const TrainBatch& b, Saved& s, bool keep);
  void folded_backward(int i, const Tensor& dx, const TrainBatch& b, Saved& s);
  const WeightPack& pack_of(int layer, const std::string& name) const;
  // Streams a pack's shards on the ring with each shard's partial gradient
  // travelling behind it; step(shard, weights, gradient views) writes this
  // rank's contribution into the views (=, not +=). The complete gradient is
  // added to the owner's pack gradient.
  using GradStep = std::function<void(int, const std::vector<Tensor>&, const std::vector<Tensor>&)>;
  void ring_backward(const WeightPack& p, const GradStep& step);
  // Adds the last ring's arriving gradient into its owner's buffer (waits for it).
  void finish_ring();
  // Sequence-parallel SSM layers (train/ssm_sequence.cpp).
  std::vector<LocalChunk> local_chunks(const TrainBatch& b) const;
  // The conv halos of this rank's chunks of one sequence's conv input x: [chunks * (d_conv-1), C].
  Tensor conv_halos(int layer, const Tensor& x, const TrainBatch& b);
  // Adds the halos' gradients (all-gathered) into the rows of dx they came from.
  void conv_halo_backward(int layer, const Tensor& dx, const Tensor& dhalos, const TrainBatch& b);
  // One scan family's kernels for state passing; states and decays are [1, numel] fp32 views.
  struct StateOps {
    int64_t state_numel = 0, decay_numel = 0;
    std::function<void(const LocalChunk&, const Tensor& state_out, const Tensor& decay_out)> scan;  // from zero
    std::function<void(const LocalChunk&, const Tensor& incoming)> correct;
    std::function<void(const Tensor& state, const Tensor& chunk_state, const Tensor& decay)> advance;
    // The chunk's backward from its initial state; dstate_out (or none) in, dstate_in (or none) out;
    // scratch: parameter gradients go to a throwaway buffer.
    std::function<void(const LocalChunk&, const Tensor& incoming, const Tensor& dstate_out, const Tensor& dstate_in,
                       bool scratch)>
        backward;
  };
  PassedStates pass_states_forward(int layer, const TrainBatch& b, const StateOps& ops);
  void pass_states_backward(int layer, const TrainBatch& b, const StateOps& ops, const PassedStates& passed);
  // x_out += in · w^T for a row-parallel projection (all-reduced over tp).
  void project_out(int layer, const Tensor& out, const Tensor& in, const Tensor& w, const char* site);
  void attention(const Tensor& o, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                 const TrainBatch& b, int layer);
  void attention_grad(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                      const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse, const TrainBatch& b,
                      int layer);
  void tp_sum(const Tensor& t, int layer, const char* site);
  // Where the projection has a bias (b, db defined): y += b per row; db += the column sums of dy.
  void add_bias(const Tensor& y, const Tensor& b) {
    if (b.defined()) m_be.add_bias(y, b);
  }
  void bias_backward(const Tensor& db, const Tensor& dy) {
    if (db.defined()) m_be.bias_backward(db, dy);
  }
  AttentionArgs attention_args(const TrainBatch& b) const;
  static std::vector<int32_t> row_positions(const TrainBatch& b);  // positions of every row, sequence after sequence
  void recompute(int i, const TrainBatch& b, Saved& s);
  Tensor act(const Shape& s, const char* label, DType dt) const;
  Tensor work(const Shape& s, const char* label, DType dt) const;
  Tensor grad_of(const std::string& suffix, int layer) const;
  Tensor weight_of(const std::string& suffix, int layer) const;

  Model& m_model;
  Backend& m_be;
  const ModelConfig& m_cfg;
  const Parallel& m_par;
  Recompute m_rc;
  AttentionShard m_shard;
  Mamba2Shard m_m2;
  MambaShard m_m1;
  std::vector<Tensor> m_grads;  // by weight-list index
  std::map<const WeightPack*, Tensor> m_pack_grads;  // tsp: a pack's members' gradients in one flat buffer
  Tensor m_ring[5];  // tsp: the backward ring's shard buffers (category comm_buffers)
  struct PendingRing {
    Request req;
    Tensor grad, incoming;
    int slot = -1;  // which of the two partial buffers it is sending
  } m_ring_pending;
  std::vector<Layer> m_layers;
  Tensor m_embed, m_final_norm, m_head, m_gembed, m_gfinal_norm, m_ghead;
  int m_nonfinite_layer = -2;  // -2: finite
  std::function<void(const char*, int64_t)> m_on_phase;
  Communicator* m_agree = nullptr;
};

}  // namespace ss

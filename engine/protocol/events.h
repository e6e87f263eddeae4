// The event stream, protocol "shardscope-events" version 1: one JSON object
// per line. Plain value structs, a writer and an incremental reader shared by
// the engine, the GUI and the tests. Schema: engine/protocol/README.md.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace ss::proto {

inline constexpr std::string_view kProtocolName = "shardscope-events";
inline constexpr int kVersion = 1;
// Memory categories, in the engine's order (core/dtype.h's Category). Training
// adds grads and optimizer_state (fp32 master weights and Adam moments).
inline constexpr int kCategoryCount = 8;
inline constexpr const char* kCategoryNames[kCategoryCount] = {
    "weights", "activations", "kv_cache", "ssm_state", "comm_buffers", "workspace", "grads", "optimizer_state"};

struct Hello {
  int version = kVersion;
  std::string engine_version;
  std::string host;
};

// The whole run setup, free-form (model, strategy, backend, workload, ...).
struct Config {
  nlohmann::json config;
};

struct Device {
  int rank = 0;
  std::string kind;  // cpu, cuda, sim
  std::string name;
  int64_t capacity = 0;  // bytes; 0 = unlimited
  std::string host;
};

// Which part of a weight tensor a rank holds. `mode` is "split" (along `axis`,
// elements [start, end)), "mirrored" (a full copy) or "partial" (full shape,
// values that must be summed across ranks). `step` >= 0 marks a transient
// holding during a ring/broadcast step (tsp); -1 is the resident placement.
struct Placement {
  int rank = 0;
  std::string tensor;
  int layer = -1;
  std::vector<int64_t> shape;  // global shape
  std::string mode = "mirrored";
  int axis = -1;
  int64_t start = 0, end = 0;
  int64_t bytes = 0;
  int step = -1;
};

struct Tokens {
  int rank = 0;
  std::vector<std::pair<int64_t, int64_t>> ranges;  // [begin, end) positions
};

struct Span {
  int rank = 0;
  std::string stream = "compute";  // compute | comm
  std::string op;                  // kernel or collective kind: gemm, attention, all_reduce, ...
  std::string site;                // where in the model: q_proj, mlp.down, mixer.scan, ...
  int layer = -1;
  std::string phase;  // load | prefill | decode
  int64_t t0 = 0, t1 = 0;  // ns on the run's clock
  double flops = 0;
  double bytes = 0;  // bytes moved (memory traffic for compute, wire bytes for comm)
  std::vector<int> peers;
  std::vector<int64_t> dims;  // op shape, e.g. gemm [M, N, K], attention [Tq, Tk, heads, head_dim]
};

struct Mem {
  int rank = 0;
  int64_t t = 0;
  std::array<int64_t, kCategoryCount> bytes{};
  int64_t peak = 0;  // highest simultaneous total so far
};

struct Metric {
  std::string name;
  double value = 0;
  std::string unit;
  int rank = -1;  // -1: the whole run
};

struct Phase {
  std::string name;
  int64_t t = 0;
};

struct Accuracy {
  std::string metric;  // rel_l2, kl, top1, first_divergence, perplexity, wire_bytes, ...
  std::string site;
  int layer = -1;
  double value = 0;
  std::string config;  // the run it describes, e.g. "mlp=int8:128" in a sweep; empty: this run
};

// The greedy token ids a run chose at each decode step, in order. A sweep
// writes one per configuration (`config`: the reference's label, or the
// quantized point's), so a view can set them side by side. A run writes one
// as each token is chosen (`partial`: more follow), then the whole answer.
// `text`: the ids decoded by the model's tokenizer, where it has one, and
// `pieces` each token's own text (as many as `tokens`).
struct Generation {
  std::string config;
  std::vector<int64_t> tokens;
  std::optional<std::string> text;
  bool partial = false;
  std::vector<std::string> pieces;
};

// The prompt of a run whose model has a tokenizer: its text and the ids it
// encodes to (what --prompt gave, or what --tokens decode to).
struct Prompt {
  std::string text;
  std::vector<int64_t> ids;
};

// One training step (optimizer update): the mean loss over the step's
// tokens, the global gradient norm before clipping, the learning rate used,
// throughput, and the highest bytes any rank held per category so far.
struct TrainStep {
  int step = 0;
  double loss = 0, grad_norm = 0, lr = 0, tokens_per_s = 0;
  int64_t tokens = 0;
  std::array<int64_t, kCategoryCount> peak{};
};

// One point of a scaling sweep (`scale`): a strategy (and tp_sp mesh) at a
// sequence length and micro-batch, simulated without a capacity limit so the
// peak it needs is known even past the device; engine/protocol/README.md
// lists the fields.
struct ScalePoint {
  std::string strategy, mesh, mode;  // mesh: "TxS" for tp_sp; mode: train | infer
  int64_t seq_len = 0;
  int micro_batch = 1, devices = 1, nodes = 1;
  std::string reason;                           // non-empty: not applicable here, and why
  int64_t peak_bytes = 0;                       // the fullest device's peak
  int peak_rank = 0;
  std::array<int64_t, kCategoryCount> bytes{};  // that device's bytes per category at its peak
  int64_t capacity = 0;                         // bytes per device of the hardware
  bool fits = false;
  double step_s = 0, tokens_per_s = 0, mfu = 0;
  double comm_activation_bytes = 0, comm_weight_bytes = 0;  // the busiest device's, per step
  double hidden_fraction = 0;                   // of communication time, behind compute
  int max_micro_batch = -1;                     // train: the largest that fits (0: none; -1: not searched)
  nlohmann::json textbook;                      // the closed-form terms beside (sim/textbook.h)
  bool applicable() const { return reason.empty(); }
};

struct Error {
  std::string code;  // usage, format, oom, rank_died, internal
  int rank = -1;
  std::string message;
  nlohmann::json detail;  // e.g. {"category":"kv_cache","requested":...}
};

struct Done {
  std::string status;  // ok | failed | oom | stopped
  int64_t t = 0;
  int exit_code = 0;
};

using Event = std::variant<Hello, Config, Device, Placement, Tokens, Span, Mem, Metric, Phase, Accuracy, Generation,
                           Prompt, TrainStep, ScalePoint, Error, Done>;

std::string_view type_name(const Event& e);
nlohmann::json to_json(const Event& e);
std::string to_line(const Event& e);  // one line, no trailing newline

// Writes events as JSON Lines to a FILE* (stdout or a file), flushing at step
// boundaries so a reader sees whole steps live.
class Writer {
 public:
  explicit Writer(std::FILE* out) : m_out(out) {}
  void write(const Event& e);
  // Writes lines that are already JSON (another rank's records).
  void write_raw(const std::string& lines);
  void flush();

 private:
  std::FILE* m_out;
};

// Incremental reader: feed it lines (or raw chunks), it returns events. The
// first record must be a hello of this protocol with version <= kVersion; a
// newer version stops the reader with a message saying so. Bad lines are
// counted and described, never fatal.
class Reader {
 public:
  struct Result {
    std::optional<Event> event;
    std::string error;  // non-empty when the line was rejected
  };
  Result parse_line(std::string_view line);

  // Splits `chunk` into lines (keeping a partial last line for the next call)
  // and calls `on_event` / `on_error` for each.
  template <class OnEvent, class OnError>
  void feed(std::string_view chunk, OnEvent&& on_event, OnError&& on_error) {
    size_t start = 0;
    while (true) {
      size_t nl = chunk.find('\n', start);
      if (nl == std::string_view::npos) break;
      std::string_view line = chunk.substr(start, nl - start);
      if (m_dropping) {
        // The rest of a line already reported as too long: not a record of its own.
        m_dropping = false;
      } else if (!m_pending.empty()) {
        m_pending.append(line);
        consume(m_pending, on_event, on_error);
        m_pending.clear();
      } else {
        consume(line, on_event, on_error);
      }
      start = nl + 1;
    }
    if (m_dropping) return;
    m_pending.append(chunk.substr(start));
    if (m_pending.size() > kMaxLine) {
      ++m_rejected;
      on_error("line longer than " + std::to_string(kMaxLine) + " bytes dropped");
      m_pending.clear();
      m_dropping = true;
    }
  }
  // Parses what is left after the stream ended (a last line without newline).
  template <class OnEvent, class OnError>
  void finish(OnEvent&& on_event, OnError&& on_error) {
    if (!m_pending.empty()) consume(m_pending, on_event, on_error);
    m_pending.clear();
    m_dropping = false;
  }

  int64_t accepted() const { return m_accepted; }
  int64_t rejected() const { return m_rejected; }
  bool refused() const { return m_refused; }   // a newer version was seen
  int version() const { return m_version; }    // 0 until the hello

  static constexpr size_t kMaxLine = 16 << 20;
  static constexpr int kMaxDepth = 64;  // JSON nesting levels in one record

 private:
  template <class OnEvent, class OnError>
  void consume(std::string_view line, OnEvent& on_event, OnError& on_error) {
    if (line.empty() || line == "\r") return;
    Result r = parse_line(line);
    if (r.event) on_event(std::move(*r.event));
    else if (!r.error.empty()) on_error(r.error);
  }
  std::string m_pending;
  bool m_dropping = false;  // inside a line that went over kMaxLine
  int64_t m_accepted = 0, m_rejected = 0;
  bool m_refused = false;
  int m_version = 0;
};

// Converts one JSON object to an event; throws std::runtime_error describing
// the first bad field.
Event from_json(const nlohmann::json& j);

// Where row `row` of a run's logits lies (verify's `verify_worst_row.*`):
// "position 8 (prefill)" (`phase` adds the parenthesis) or "decode step 3",
// and "of sequence 1" in a batch; each sequence has `prompt` + `decode` rows.
std::string row_place(int64_t row, int64_t prompt, int64_t decode, bool batch, bool phase = true);

}  // namespace ss::proto

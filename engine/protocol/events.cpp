#include "protocol/events.h"

#include <algorithm>

#include <cmath>
#include <stdexcept>

namespace ss::proto {
namespace {

using json = nlohmann::json;


[[noreturn]] void bad(const std::string& field, const char* want) {
  throw std::runtime_error("field '" + field + "' " + want);
}

const json* find(const json& j, const char* key, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) bad(key, "is missing");
    return nullptr;
  }
  return &*it;
}

int64_t as_i64(const json& v, const char* key) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) bad(key, "is out of range");
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    // Writers in other languages may print whole numbers as 1e9 or 1024.0;
    // a fraction would be silently truncated, so it is refused.
    double d = v.get<double>();
    if (!std::isfinite(d) || std::fabs(d) > 9.2e18) bad(key, "is out of range");
    if (d != std::trunc(d)) bad(key, "must be an integer");
    return int64_t(d);
  }
  bad(key, "must be an integer");
}

int as_int(const json& v, const char* key) {
  int64_t i = as_i64(v, key);
  if (i < INT32_MIN || i > INT32_MAX) bad(key, "is out of range");
  return int(i);
}

int64_t get_i64(const json& j, const char* key, bool required = true, int64_t def = 0) {
  const json* v = find(j, key, required);
  return v ? as_i64(*v, key) : def;
}

int get_int(const json& j, const char* key, bool required = true, int def = 0) {
  const json* v = find(j, key, required);
  return v ? as_int(*v, key) : def;
}

// The rank a per-device record belongs to: a device of the run, never
// negative (the pages index colours and rows by it).
int get_rank(const json& j) {
  const int r = get_int(j, "rank");
  if (r < 0 || r >= (1 << 20)) bad("rank", "must be a device of the run, 0 to 1048575");
  return r;
}

double get_num(const json& j, const char* key, bool required = true, double def = 0) {
  const json* v = find(j, key, required);
  if (!v) return def;
  if (!v->is_number()) bad(key, "must be a number");
  return v->get<double>();
}

std::string get_str(const json& j, const char* key, bool required = true) {
  const json* v = find(j, key, required);
  if (!v) return {};
  if (!v->is_string()) bad(key, "must be a string");
  return v->get<std::string>();
}

struct ToJson {
  json operator()(const Hello& e) const {
    return {{"type", "hello"}, {"protocol", kProtocolName}, {"version", e.version},
            {"engine", e.engine_version}, {"host", e.host}};
  }
  json operator()(const Config& e) const { return {{"type", "config"}, {"config", e.config}}; }
  json operator()(const Device& e) const {
    return {{"type", "device"}, {"rank", e.rank}, {"kind", e.kind}, {"name", e.name},
            {"capacity", e.capacity}, {"host", e.host}};
  }
  json operator()(const Placement& e) const {
    json j = {{"type", "placement"}, {"rank", e.rank}, {"tensor", e.tensor}, {"layer", e.layer},
              {"shape", e.shape}, {"mode", e.mode}, {"bytes", e.bytes}};
    if (e.mode == "split") {
      j["axis"] = e.axis;
      j["start"] = e.start;
      j["end"] = e.end;
    }
    if (e.step >= 0) j["step"] = e.step;
    return j;
  }
  json operator()(const Tokens& e) const {
    json r = json::array();
    for (auto& [a, b] : e.ranges) r.push_back({a, b});
    return {{"type", "tokens"}, {"rank", e.rank}, {"ranges", r}};
  }
  json operator()(const Span& e) const {
    json j = {{"type", "span"}, {"rank", e.rank}, {"stream", e.stream}, {"op", e.op},
              {"site", e.site}, {"layer", e.layer}, {"phase", e.phase}, {"t0", e.t0},
              {"t1", e.t1}, {"flops", e.flops}, {"bytes", e.bytes}};
    if (!e.peers.empty()) j["peers"] = e.peers;
    if (!e.dims.empty()) j["dims"] = e.dims;
    return j;
  }
  json operator()(const Mem& e) const {
    json b = json::object();
    for (int c = 0; c < kCategoryCount; ++c) b[kCategoryNames[c]] = e.bytes[c];
    return {{"type", "mem"}, {"rank", e.rank}, {"t", e.t}, {"bytes", b}, {"peak", e.peak}};
  }
  json operator()(const Metric& e) const {
    json j = {{"type", "metric"}, {"name", e.name}, {"value", e.value}, {"unit", e.unit}};
    if (e.rank >= 0) j["rank"] = e.rank;
    return j;
  }
  json operator()(const Phase& e) const { return {{"type", "phase"}, {"name", e.name}, {"t", e.t}}; }
  json operator()(const Accuracy& e) const {
    json j = {{"type", "accuracy"}, {"metric", e.metric}, {"site", e.site}, {"layer", e.layer}, {"value", e.value}};
    if (!e.config.empty()) j["config"] = e.config;
    return j;
  }
  json operator()(const Generation& e) const {
    json j = {{"type", "generation"}, {"tokens", e.tokens}};
    if (!e.config.empty()) j["config"] = e.config;
    if (e.text) j["text"] = *e.text;
    if (e.partial) j["partial"] = true;
    if (!e.pieces.empty()) j["pieces"] = e.pieces;
    return j;
  }
  json operator()(const Prompt& e) const { return {{"type", "prompt"}, {"text", e.text}, {"ids", e.ids}}; }
  json operator()(const TrainStep& e) const {
    json peak = json::object();
    for (int c = 0; c < kCategoryCount; ++c) peak[kCategoryNames[c]] = e.peak[size_t(c)];
    return {{"type", "train_step"}, {"step", e.step}, {"loss", e.loss}, {"grad_norm", e.grad_norm}, {"lr", e.lr},
            {"tokens", e.tokens}, {"tokens_per_s", e.tokens_per_s}, {"peak", peak}};
  }
  json operator()(const ScalePoint& e) const {
    json j = {{"type", "scale_point"}, {"strategy", e.strategy}, {"mode", e.mode}, {"seq_len", e.seq_len},
              {"micro_batch", e.micro_batch}, {"devices", e.devices}, {"nodes", e.nodes},
              {"applicable", e.applicable()}};
    if (!e.mesh.empty()) j["mesh"] = e.mesh;
    if (!e.applicable()) {
      j["reason"] = e.reason;
      return j;
    }
    json b = json::object();
    for (int c = 0; c < kCategoryCount; ++c) b[kCategoryNames[c]] = e.bytes[size_t(c)];
    j.update({{"peak_bytes", e.peak_bytes}, {"peak_rank", e.peak_rank}, {"bytes", b}, {"capacity", e.capacity},
              {"fits", e.fits}, {"over_bytes", e.fits ? 0 : e.peak_bytes - e.capacity}, {"step_s", e.step_s},
              {"tokens_per_s", e.tokens_per_s}, {"mfu", e.mfu},
              {"comm_bytes", {{"activation", e.comm_activation_bytes}, {"weight", e.comm_weight_bytes}}},
              {"hidden_fraction", e.hidden_fraction}, {"max_micro_batch", e.max_micro_batch}});
    if (!e.textbook.is_null()) j["textbook"] = e.textbook;
    return j;
  }
  json operator()(const Error& e) const {
    json j = {{"type", "error"}, {"code", e.code}, {"rank", e.rank}, {"message", e.message}};
    if (!e.detail.is_null()) j["detail"] = e.detail;
    return j;
  }
  json operator()(const Done& e) const {
    return {{"type", "done"}, {"status", e.status}, {"t", e.t}, {"exit_code", e.exit_code}};
  }
};

struct TypeName {
  std::string_view operator()(const Hello&) const { return "hello"; }
  std::string_view operator()(const Config&) const { return "config"; }
  std::string_view operator()(const Device&) const { return "device"; }
  std::string_view operator()(const Placement&) const { return "placement"; }
  std::string_view operator()(const Tokens&) const { return "tokens"; }
  std::string_view operator()(const Span&) const { return "span"; }
  std::string_view operator()(const Mem&) const { return "mem"; }
  std::string_view operator()(const Metric&) const { return "metric"; }
  std::string_view operator()(const Phase&) const { return "phase"; }
  std::string_view operator()(const Accuracy&) const { return "accuracy"; }
  std::string_view operator()(const Generation&) const { return "generation"; }
  std::string_view operator()(const Prompt&) const { return "prompt"; }
  std::string_view operator()(const TrainStep&) const { return "train_step"; }
  std::string_view operator()(const ScalePoint&) const { return "scale_point"; }
  std::string_view operator()(const Error&) const { return "error"; }
  std::string_view operator()(const Done&) const { return "done"; }
};

}  // namespace

std::string_view type_name(const Event& e) { return std::visit(TypeName{}, e); }
json to_json(const Event& e) { return std::visit(ToJson{}, e); }
std::string to_line(const Event& e) {
  return to_json(e).dump(-1, ' ', false, json::error_handler_t::replace);
}

void Writer::write(const Event& e) {
  std::string line = to_line(e);
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), m_out);
}
void Writer::write_raw(const std::string& lines) { std::fwrite(lines.data(), 1, lines.size(), m_out); }
void Writer::flush() { std::fflush(m_out); }

Event from_json(const json& j) {
  if (!j.is_object()) throw std::runtime_error("record is not a JSON object");
  const std::string type = get_str(j, "type");
  if (type == "hello") {
    Hello e;
    e.version = get_int(j, "version");
    e.engine_version = get_str(j, "engine", false);
    e.host = get_str(j, "host", false);
    if (get_str(j, "protocol") != kProtocolName)
      throw std::runtime_error("not a " + std::string(kProtocolName) + " stream");
    return e;
  }
  if (type == "config") {
    Config e;
    const json* c = find(j, "config", true);
    if (!c->is_object()) bad("config", "must be an object");
    e.config = *c;
    return e;
  }
  if (type == "device") {
    Device e;
    e.rank = get_rank(j);
    e.kind = get_str(j, "kind");
    e.name = get_str(j, "name", false);
    e.capacity = get_i64(j, "capacity", false);
    e.host = get_str(j, "host", false);
    return e;
  }
  if (type == "placement") {
    Placement e;
    e.rank = get_rank(j);
    e.tensor = get_str(j, "tensor");
    e.layer = get_int(j, "layer", false, -1);
    const json* s = find(j, "shape", true);
    if (!s->is_array() || s->size() > 8) bad("shape", "must be an array of at most 8 integers");
    for (auto& d : *s) e.shape.push_back(as_i64(d, "shape"));
    e.mode = get_str(j, "mode");
    if (e.mode != "split" && e.mode != "mirrored" && e.mode != "partial")
      bad("mode", "must be split, mirrored or partial");
    if (e.mode == "split") {
      e.axis = get_int(j, "axis");
      e.start = get_i64(j, "start");
      e.end = get_i64(j, "end");
      if (e.axis < 0 || e.axis >= int(e.shape.size())) bad("axis", "is outside the shape");
      if (e.start < 0 || e.end < e.start || e.end > e.shape[e.axis]) bad("start", "and end must lie within the axis");
    }
    e.bytes = get_i64(j, "bytes", false);
    e.step = get_int(j, "step", false, -1);
    return e;
  }
  if (type == "tokens") {
    Tokens e;
    e.rank = get_rank(j);
    const json* r = find(j, "ranges", true);
    if (!r->is_array()) bad("ranges", "must be an array of [begin, end] pairs");
    for (auto& p : *r) {
      if (!p.is_array() || p.size() != 2) bad("ranges", "must be an array of [begin, end] pairs");
      e.ranges.emplace_back(as_i64(p[0], "ranges"), as_i64(p[1], "ranges"));
      if (e.ranges.back().second < e.ranges.back().first) bad("ranges", "need begin <= end");
    }
    return e;
  }
  if (type == "span") {
    Span e;
    e.rank = get_rank(j);
    e.stream = get_str(j, "stream");
    e.op = get_str(j, "op");
    e.site = get_str(j, "site", false);
    e.layer = get_int(j, "layer", false, -1);
    e.phase = get_str(j, "phase", false);
    e.t0 = get_i64(j, "t0");
    e.t1 = get_i64(j, "t1");
    if (e.t1 < e.t0) bad("t1", "is before t0");
    e.flops = get_num(j, "flops", false);
    e.bytes = get_num(j, "bytes", false);
    if (const json* p = find(j, "peers", false)) {
      if (!p->is_array()) bad("peers", "must be an array of ranks");
      for (auto& r : *p) e.peers.push_back(as_int(r, "peers"));
    }
    if (const json* d = find(j, "dims", false)) {
      if (!d->is_array() || d->size() > 8) bad("dims", "must be an array of at most 8 integers");
      for (auto& v : *d) e.dims.push_back(as_i64(v, "dims"));
    }
    return e;
  }
  if (type == "mem") {
    Mem e;
    e.rank = get_rank(j);
    e.t = get_i64(j, "t");
    const json* b = find(j, "bytes", true);
    if (!b->is_object()) bad("bytes", "must be an object of category: bytes");
    for (int c = 0; c < kCategoryCount; ++c)
      if (auto it = b->find(kCategoryNames[c]); it != b->end()) e.bytes[c] = as_i64(*it, kCategoryNames[c]);
    e.peak = get_i64(j, "peak", false);
    return e;
  }
  if (type == "metric") {
    Metric e;
    e.name = get_str(j, "name");
    e.value = get_num(j, "value");
    e.unit = get_str(j, "unit", false);
    e.rank = get_int(j, "rank", false, -1);
    return e;
  }
  if (type == "phase") {
    Phase e;
    e.name = get_str(j, "name");
    e.t = get_i64(j, "t");
    return e;
  }
  if (type == "train_step") {
    TrainStep e;
    e.step = get_int(j, "step");
    e.loss = get_num(j, "loss");
    e.grad_norm = get_num(j, "grad_norm", false);
    e.lr = get_num(j, "lr", false);
    e.tokens = get_i64(j, "tokens", false);
    e.tokens_per_s = get_num(j, "tokens_per_s", false);
    if (const json* p = find(j, "peak", false)) {
      if (!p->is_object()) bad("peak", "must be an object of category: bytes");
      for (int c = 0; c < kCategoryCount; ++c)
        if (auto it = p->find(kCategoryNames[c]); it != p->end()) e.peak[size_t(c)] = as_i64(*it, kCategoryNames[c]);
    }
    return e;
  }
  if (type == "scale_point") {
    ScalePoint e;
    e.strategy = get_str(j, "strategy");
    e.mode = get_str(j, "mode");
    if (e.mode != "train" && e.mode != "infer") bad("mode", "must be train or infer");
    e.seq_len = get_i64(j, "seq_len");
    if (e.seq_len < 1) bad("seq_len", "must be >= 1");
    e.mesh = get_str(j, "mesh", false);
    e.micro_batch = get_int(j, "micro_batch", false, 1);
    e.devices = get_int(j, "devices", false, 1);
    e.nodes = get_int(j, "nodes", false, 1);
    if (e.micro_batch < 1 || e.devices < 1 || e.nodes < 1) bad("micro_batch", "devices and nodes must be >= 1");
    const json* a = find(j, "applicable", false);
    if (a && !a->is_boolean()) bad("applicable", "must be true or false");
    if (a && !a->get<bool>()) {
      e.reason = get_str(j, "reason", false);
      if (e.reason.empty()) e.reason = "not applicable";
      return e;
    }
    e.peak_bytes = get_i64(j, "peak_bytes");
    if (e.peak_bytes < 0) bad("peak_bytes", "must be >= 0");
    e.peak_rank = get_int(j, "peak_rank", false);
    if (e.peak_rank < 0 || e.peak_rank >= e.devices) bad("peak_rank", "must be a device of the point, 0 to devices - 1");
    if (const json* b = find(j, "bytes", false)) {
      if (!b->is_object()) bad("bytes", "must be an object of category: bytes");
      for (int c = 0; c < kCategoryCount; ++c)
        if (auto it = b->find(kCategoryNames[c]); it != b->end()) {
          e.bytes[size_t(c)] = as_i64(*it, kCategoryNames[c]);
          if (e.bytes[size_t(c)] < 0) bad(kCategoryNames[c], "must be >= 0");
        }
    }
    e.capacity = get_i64(j, "capacity", false);
    if (e.capacity < 0) bad("capacity", "must be >= 0");
    if (const json* f = find(j, "fits", false)) {
      if (!f->is_boolean()) bad("fits", "must be true or false");
      e.fits = f->get<bool>();
    }
    e.step_s = get_num(j, "step_s", false);
    e.tokens_per_s = get_num(j, "tokens_per_s", false);
    e.mfu = get_num(j, "mfu", false);
    if (const json* c = find(j, "comm_bytes", false)) {
      if (!c->is_object()) bad("comm_bytes", "must be an object {activation, weight}");
      e.comm_activation_bytes = get_num(*c, "activation", false);
      e.comm_weight_bytes = get_num(*c, "weight", false);
    }
    e.hidden_fraction = get_num(j, "hidden_fraction", false);
    e.max_micro_batch = get_int(j, "max_micro_batch", false, -1);
    if (const json* t = find(j, "textbook", false)) {
      if (!t->is_object()) bad("textbook", "must be an object");
      e.textbook = *t;
    }
    return e;
  }
  if (type == "accuracy") {
    Accuracy e;
    e.metric = get_str(j, "metric");
    e.site = get_str(j, "site", false);
    e.layer = get_int(j, "layer", false, -1);
    e.value = get_num(j, "value");
    e.config = get_str(j, "config", false);
    return e;
  }
  if (type == "generation") {
    Generation e;
    e.config = get_str(j, "config", false);
    const json* t = find(j, "tokens", true);
    if (!t->is_array()) bad("tokens", "must be an array of token ids");
    for (auto& v : *t) e.tokens.push_back(as_i64(v, "tokens"));
    if (const json* text = find(j, "text", false)) {
      if (!text->is_string()) bad("text", "must be a string");
      e.text = text->get<std::string>();
    }
    if (const json* p = find(j, "partial", false)) {
      if (!p->is_boolean()) bad("partial", "must be true or false");
      e.partial = p->get<bool>();
    }
    if (const json* p = find(j, "pieces", false)) {
      if (!p->is_array() || p->size() != e.tokens.size()) bad("pieces", "must be an array of strings, one a token");
      for (auto& v : *p) {
        if (!v.is_string()) bad("pieces", "must be an array of strings, one a token");
        e.pieces.push_back(v.get<std::string>());
      }
    }
    return e;
  }
  if (type == "prompt") {
    Prompt e;
    e.text = get_str(j, "text");
    const json* ids = find(j, "ids", true);
    if (!ids->is_array()) bad("ids", "must be an array of token ids");
    for (auto& v : *ids) e.ids.push_back(as_i64(v, "ids"));
    return e;
  }
  if (type == "error") {
    Error e;
    e.code = get_str(j, "code");
    e.rank = get_int(j, "rank", false, -1);
    e.message = get_str(j, "message");
    if (auto it = j.find("detail"); it != j.end()) e.detail = *it;
    return e;
  }
  if (type == "done") {
    Done e;
    e.status = get_str(j, "status");
    e.t = get_i64(j, "t", false);
    e.exit_code = get_int(j, "exit_code", false);
    return e;
  }
  throw std::runtime_error("unknown record type '" + type.substr(0, 64) + "'");
}

Reader::Result Reader::parse_line(std::string_view line) {
  Result r;
  if (m_refused) return r;  // a newer stream: nothing after the hello is read
  // Copying or printing a JSON value recurses once per nesting level, so a
  // hostile line of a million '[' would overflow the stack; parsing itself
  // does not recurse, so the depth is measured while parsing.
  bool too_deep = false;
  json j = json::parse(
      line,
      [&](int depth, json::parse_event_t, json&) {
        if (depth > kMaxDepth) too_deep = true;
        return true;
      },
      /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    ++m_rejected;
    r.error = "not valid JSON";
    return r;
  }
  if (too_deep) {
    ++m_rejected;
    r.error = "nested deeper than " + std::to_string(kMaxDepth) + " levels";
    return r;
  }
  try {
    Event e = from_json(j);
    if (auto* h = std::get_if<Hello>(&e)) {
      if (h->version > kVersion) {
        m_refused = true;
        r.error = "this stream is protocol version " + std::to_string(h->version) +
                  ", newer than the version " + std::to_string(kVersion) +
                  " this program reads; update ShardScope to open it";
        return r;
      }
      if (h->version < 1) throw std::runtime_error("field 'version' must be >= 1");
      m_version = h->version;
    } else if (m_version == 0) {
      throw std::runtime_error("record before the stream's hello line");
    }
    ++m_accepted;
    r.event = std::move(e);
  } catch (const std::exception& ex) {
    ++m_rejected;
    r.error = ex.what();
  }
  return r;
}

std::string row_place(int64_t row, int64_t prompt, int64_t decode, bool batch, bool phase) {
  const int64_t per_sequence = std::max<int64_t>(prompt + decode, 1), seq = row / per_sequence,
                at = row % per_sequence;
  std::string s = at < prompt ? "position " + std::to_string(at) + (phase ? " (prefill)" : "")
                              : "decode step " + std::to_string(at - prompt + 1);
  return batch ? s + " of sequence " + std::to_string(seq) : s;
}

}  // namespace ss::proto

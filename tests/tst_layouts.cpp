// The checkpoints people download: model folders in the layouts of
// Llama-3.2-1B (rope_scaling "llama3", an explicit head_dim, tied
// embeddings; here also attention_bias and mlp_bias) and Qwen2.5-0.5B
// (model_type qwen2: q/k/v biases, no field for them), with config.json as
// transformers writes it, bf16 weights drawn here and the tokenizer.json
// layout each family carries. A run's logits must equal a float64 forward
// written here from the definitions (modeling_llama / modeling_qwen2 and
// modeling_rope_utils), under every strategy; a typed prompt is encoded by
// the folder's tokenizer and the answer comes back as text.
#include <QtTest>
#include <cmath>
#include <numbers>
#include <random>

#include "core/dtype.h"
#include "engine_process.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "reference.h"
#include "text/tokenizer.h"

using json = nlohmann::json;
using ref::Vec;
using ss::Shape;

namespace {

constexpr int kPrompt = 16, kDecode = 4;  // 16: zigzag chunks over 2 and 4 ranks
const std::vector<int32_t> kForced = {7, 44, 42, 3};

// A model folder and what the reference forward needs from it.
struct Layout {
  json config;
  QString tokenizer;  // fixture file name
  std::map<std::string, std::pair<Shape, Vec>> weights;  // bf16 values, widened
};

// The model of each layout, small: hidden 64, 2 layers, 8 heads in 4 kv groups.
Layout make_layout(const QString& name) {
  Layout L;
  if (name == "llama-3.2") {
    // Llama-3.2-1B's config.json, every field it has, with small numbers; its
    // rope_scaling keeps the form but an original context of 16, so that at
    // these positions every branch of the llama3 rule is taken.
    L.config = json::parse(R"({
      "architectures": ["LlamaForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
      "bos_token_id": 300, "eos_token_id": 301, "head_dim": 12, "hidden_act": "silu", "hidden_size": 64,
      "initializer_range": 0.02, "intermediate_size": 96, "max_position_embeddings": 131072, "mlp_bias": true,
      "model_type": "llama", "num_attention_heads": 8, "num_hidden_layers": 2, "num_key_value_heads": 4,
      "pretraining_tp": 1, "rms_norm_eps": 1e-05,
      "rope_scaling": {"factor": 4.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                       "original_max_position_embeddings": 16, "rope_type": "llama3"},
      "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
      "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 302})");
    L.tokenizer = "llama3-mini.json";
  } else {
    // Qwen2.5-0.5B's config.json, likewise (its head_dim is hidden / heads).
    L.config = json::parse(R"({
      "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 263,
      "eos_token_id": 263, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
      "intermediate_size": 96, "max_position_embeddings": 32768, "max_window_layers": 24,
      "model_type": "qwen2", "num_attention_heads": 8, "num_hidden_layers": 2, "num_key_value_heads": 4,
      "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0, "sliding_window": 32768,
      "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.43.1",
      "use_cache": true, "use_sliding_window": false, "vocab_size": 266})");
    L.tokenizer = "qwen2-mini.json";
  }
  const json& c = L.config;
  const int64_t d = c["hidden_size"], F = c["intermediate_size"], V = c["vocab_size"];
  const int64_t nh = c["num_attention_heads"], nkv = c["num_key_value_heads"];
  const int64_t hd = c.contains("head_dim") ? c["head_dim"].get<int64_t>() : d / nh;
  const bool qkv_bias = name != "llama-3.2" || c["attention_bias"].get<bool>();
  const bool o_bias = name == "llama-3.2" && c["attention_bias"].get<bool>();
  const bool mlp_bias = c.value("mlp_bias", false);
  std::mt19937 g(name == "llama-3.2" ? 11u : 12u);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  auto add = [&](const std::string& n, Shape shape, double scale, double offset = 0.0) {
    Vec v(size_t(ss::numel(shape)));
    for (double& x : v) x = double(ss::bf16_to_f32(ss::f32_to_bf16(float(offset + scale * u(g)))));
    L.weights[n] = {std::move(shape), std::move(v)};
  };
  add("model.embed_tokens.weight", {V, d}, 1.0);
  for (int i = 0; i < c["num_hidden_layers"].get<int>(); ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {d}, 0.1, 1.0);
    add(p + "self_attn.q_proj.weight", {nh * hd, d}, 1.7 / std::sqrt(double(d)));
    add(p + "self_attn.k_proj.weight", {nkv * hd, d}, 1.7 / std::sqrt(double(d)));
    add(p + "self_attn.v_proj.weight", {nkv * hd, d}, 1.7 / std::sqrt(double(d)));
    add(p + "self_attn.o_proj.weight", {d, nh * hd}, 1.0 / std::sqrt(double(nh * hd)));
    if (qkv_bias) {
      add(p + "self_attn.q_proj.bias", {nh * hd}, 0.5);
      add(p + "self_attn.k_proj.bias", {nkv * hd}, 0.5);
      add(p + "self_attn.v_proj.bias", {nkv * hd}, 0.5);
    }
    if (o_bias) add(p + "self_attn.o_proj.bias", {d}, 0.3);
    add(p + "post_attention_layernorm.weight", {d}, 0.1, 1.0);
    add(p + "mlp.gate_proj.weight", {F, d}, 1.7 / std::sqrt(double(d)));
    add(p + "mlp.up_proj.weight", {F, d}, 1.7 / std::sqrt(double(d)));
    add(p + "mlp.down_proj.weight", {d, F}, 1.0 / std::sqrt(double(F)));
    if (mlp_bias) {
      add(p + "mlp.gate_proj.bias", {F}, 0.5);
      add(p + "mlp.up_proj.bias", {F}, 0.5);
      add(p + "mlp.down_proj.bias", {d}, 0.3);
    }
  }
  add("model.norm.weight", {d}, 0.1, 1.0);
  return L;
}

void write_folder(const Layout& L, const QString& dir) {
  QDir().mkpath(dir);
  std::vector<ss::TensorBlob> blobs;
  for (const auto& [name, sv] : L.weights) {
    ss::TensorBlob b{name, ss::DType::BF16, sv.first, {}};
    b.bytes.resize(sv.second.size() * 2);
    for (size_t i = 0; i < sv.second.size(); ++i) {
      const uint16_t h = ss::f32_to_bf16(float(sv.second[i]));  // exact: the values are bf16 already
      std::memcpy(b.bytes.data() + 2 * i, &h, 2);
    }
    blobs.push_back(std::move(b));
  }
  ss::write_checkpoint_tensors(dir.toStdString(), blobs, 1);
  QFile cfg(dir + "/config.json");
  QVERIFY(cfg.open(QIODevice::WriteOnly));
  cfg.write(QByteArray::fromStdString(L.config.dump(2)));
  cfg.close();
  QVERIFY(QFile::copy(QString(SHARDSCOPE_TESTS_DIR) + "/fixtures/tokenizers/" + L.tokenizer, dir + "/tokenizer.json"));
}

// transformers' inverse frequencies (modeling_rope_utils), written from its
// definitions: theta^(-2i/d); llama3 divides those whose wavelength exceeds
// the original context / low_freq_factor by `factor`, keeps those below
// context / high_freq_factor, and between them mixes f/factor and f with the
// weight (context / wavelength - low) / (high - low) on f.
std::vector<double> reference_freqs(const json& c, int64_t hd) {
  std::vector<double> f = ref::rope_freqs(c["rope_theta"].get<double>(), int(hd));
  const json& s = c["rope_scaling"];
  if (s.is_null()) return f;
  const double factor = s["factor"];
  const std::string type = s.value("rope_type", s.value("type", ""));
  for (double& v : f) {
    if (type == "linear") {
      v /= factor;
      continue;
    }
    const double ctx = s["original_max_position_embeddings"], lo = s["low_freq_factor"], hi = s["high_freq_factor"];
    const double wavelength = 2 * std::numbers::pi / v;
    const double w = std::clamp((ctx / wavelength - lo) / (hi - lo), 0.0, 1.0);
    v = w * v + (1 - w) * v / factor;
  }
  return f;
}

// Logits [T, V] of every position of `tokens`, in float64.
Vec reference_logits(const Layout& L, const std::vector<int32_t>& tokens) {
  const json& c = L.config;
  const int64_t T = int64_t(tokens.size()), d = c["hidden_size"], F = c["intermediate_size"], V = c["vocab_size"];
  const int nh = c["num_attention_heads"], nkv = c["num_key_value_heads"];
  const int64_t hd = c.contains("head_dim") ? c["head_dim"].get<int64_t>() : d / nh;
  const double eps = c["rms_norm_eps"];
  const std::vector<double> freqs = reference_freqs(c, hd);
  auto W = [&](const std::string& n) -> const Vec& { return L.weights.at(n).second; };
  auto has = [&](const std::string& n) { return L.weights.count(n) > 0; };
  auto linear = [&](const Vec& x, const std::string& n, int64_t out, int64_t in) {
    Vec y = ref::matmul(x, W(n + ".weight"), T, out, in);
    if (has(n + ".bias"))
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < out; ++j) y[size_t(t * out + j)] += W(n + ".bias")[size_t(j)];
    return y;
  };
  Vec x(size_t(T * d));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < d; ++j) x[size_t(t * d + j)] = W("model.embed_tokens.weight")[size_t(tokens[size_t(t)] * d + j)];
  std::vector<int32_t> pos(static_cast<size_t>(T));
  std::iota(pos.begin(), pos.end(), 0);
  for (int i = 0; i < c["num_hidden_layers"].get<int>(); ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Vec h = ref::rmsnorm(x, nullptr, &W(p + "input_layernorm.weight"), T, d, d, eps);
    Vec q = ref::rope(linear(h, p + "self_attn.q_proj", nh * hd, d), T, nh, int(hd), pos, freqs);
    Vec k = ref::rope(linear(h, p + "self_attn.k_proj", nkv * hd, d), T, nkv, int(hd), pos, freqs);
    Vec v = linear(h, p + "self_attn.v_proj", nkv * hd, d);
    Vec o = ref::attention(q, k, v, T, T, nh, nkv, int(hd), 1.0 / std::sqrt(double(hd)), pos, pos);
    Vec a = linear(o, p + "self_attn.o_proj", d, nh * hd);
    for (size_t e = 0; e < x.size(); ++e) x[e] += a[e];
    h = ref::rmsnorm(x, nullptr, &W(p + "post_attention_layernorm.weight"), T, d, d, eps);
    Vec gate = linear(h, p + "mlp.gate_proj", F, d), up = linear(h, p + "mlp.up_proj", F, d);
    for (size_t e = 0; e < gate.size(); ++e) gate[e] = ref::silu(gate[e]) * up[e];
    Vec m = linear(gate, p + "mlp.down_proj", d, F);
    for (size_t e = 0; e < x.size(); ++e) x[e] += m[e];
  }
  x = ref::rmsnorm(x, nullptr, &W("model.norm.weight"), T, d, d, eps);
  return ref::matmul(x, W("model.embed_tokens.weight"), T, V, d);  // tied
}

std::vector<int32_t> prompt_ids(int64_t vocab) {
  std::vector<int32_t> p;
  for (int t = 0; t < kPrompt; ++t) p.push_back(int32_t((t * 37 + 5) % vocab));
  return p;
}
QString ids_arg(const std::vector<int32_t>& ids) {
  QStringList s;
  for (int32_t i : ids) s << QString::number(i);
  return s.join(',');
}

}  // namespace

class TestLayouts : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;

  QString folder(const QString& layout) { return m_dir.filePath(layout); }

 private slots:
  void initTestCase() {
    QVERIFY2(QFileInfo::exists(SHARDSCOPE_ENGINE_BIN), SHARDSCOPE_ENGINE_BIN);
    QVERIFY(m_dir.isValid());
    for (const QString l : {"llama-3.2", "qwen2.5"}) {
      write_folder(make_layout(l), folder(l));
      if (QTest::currentTestFailed()) return;
    }
  }

  // Llama-3.2-1B's own rope_scaling (theta 5e5, head_dim 64, factor 32, low 1,
  // high 4, context 8192): wavelengths 2 pi 5e5^(2i/64) are below 8192/4 =
  // 2048 for i <= 14 (kept), above 8192 for i >= 18 (divided by 32), and
  // i = 15, 16, 17 are mixed (by hand: the wavelengths of i = 14, 15, 17, 18
  // are 1957, 2949, 6695 and 10086).
  void ropeFrequencies() {
    json j = make_layout("llama-3.2").config;
    j["head_dim"] = 64;
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
    const std::vector<double> f = ss::parse_model_config(j, "config.json").rope_inv_freq();
    QCOMPARE(int(f.size()), 32);
    for (int i = 0; i < 32; ++i) {
      const double plain = std::pow(5e5, -2.0 * i / 64);
      if (i <= 14) QVERIFY2(std::abs(f[size_t(i)] / plain - 1) < 1e-12, qPrintable(QString("kept %1").arg(i)));
      else if (i >= 18) QVERIFY2(std::abs(f[size_t(i)] * 32 / plain - 1) < 1e-12, qPrintable(QString("divided %1").arg(i)));
      else QVERIFY2(f[size_t(i)] < plain * 0.99 && f[size_t(i)] > plain / 32 * 1.01, qPrintable(QString("mixed %1").arg(i)));
      if (i) QVERIFY(f[size_t(i)] < f[size_t(i - 1)]);
    }
    // i = 16: wavelength 2 pi 5e5^0.5 = 4442.9, weight (8192/4442.9 - 1) / 3 = 0.2813 on the unscaled.
    const double w16 = 0.28128;  // by hand, to five places
    QVERIFY(std::abs(f[16] / (std::pow(5e5, -0.5) * (w16 + (1 - w16) / 32)) - 1) < 1e-4);
    // Linear divides every frequency by the factor.
    j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
    const std::vector<double> lin = ss::parse_model_config(j, "config.json").rope_inv_freq();
    for (int i = 0; i < 32; ++i) QVERIFY(std::abs(lin[size_t(i)] * 4 / std::pow(5e5, -2.0 * i / 64) - 1) < 1e-12);
  }

  // What is not supported is refused with one line naming the field.
  void refusals_data() {
    QTest::addColumn<QString>("edit");
    QTest::addColumn<QString>("field");
    QTest::newRow("yarn") << R"({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})" << "rope_scaling.rope_type";
    QTest::newRow("no factor") << R"({"rope_scaling": {"rope_type": "linear"}})" << "rope_scaling.factor";
    QTest::newRow("high below low")
        << R"({"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1, "original_max_position_embeddings": 8192}})"
        << "rope_scaling.high_freq_factor";
    QTest::newRow("sliding window") << R"({"use_sliding_window": true})" << "use_sliding_window";
    QTest::newRow("mlp_bias not bool") << R"({"mlp_bias": "yes"})" << "mlp_bias";
  }
  void refusals() {
    QFETCH(QString, edit);
    QFETCH(QString, field);
    json j = make_layout("qwen2.5").config;
    j.merge_patch(json::parse(edit.toStdString()));
    try {
      ss::parse_model_config(j, "qwen/config.json");
      QFAIL("accepted");
    } catch (const std::exception& e) {
      const QString m = e.what();
      QVERIFY2(m.startsWith("qwen/config.json: field '" + field + "'"), qPrintable(m));
      QVERIFY(!m.contains('\n'));
    }
  }

  // Every strategy against the float64 forward: prefill rows and
  // teacher-forced decode rows.
  void equalsReference_data() {
    QTest::addColumn<QString>("layout");
    QTest::addColumn<QStringList>("launch");
    QTest::addColumn<QString>("dtype");
    for (const QString l : {"llama-3.2", "qwen2.5"}) {
      QTest::newRow(qPrintable(l + "/single")) << l << QStringList{} << "fp32";
      for (int D : {2, 4})
        for (const QString s : {"tp", "sp", "tsp"})
          QTest::newRow(qPrintable(QString("%1/%2/D%3").arg(l, s).arg(D)))
              << l << QStringList{"--strategy", s, "--devices", QString::number(D)} << "fp32";
      QTest::newRow(qPrintable(l + "/tp_sp/2x2"))
          << l << QStringList{"--strategy", "tp_sp", "--devices", "4", "--mesh", "2x2"} << "fp32";
      QTest::newRow(qPrintable(l + "/tp/D4/bf16"))
          << l << QStringList{"--strategy", "tp", "--devices", "4"} << "bf16";
      QTest::newRow(qPrintable(l + "/tsp/D4/bf16"))
          << l << QStringList{"--strategy", "tsp", "--devices", "4"} << "bf16";
    }
  }
  void equalsReference() {
    QFETCH(QString, layout);
    QFETCH(QStringList, launch);
    QFETCH(QString, dtype);
    const Layout L = make_layout(layout);
    const std::vector<int32_t> prompt = prompt_ids(L.config["vocab_size"]);
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), kForced.begin(), kForced.end());
    const Vec want = reference_logits(L, all);
    const QString out = m_dir.filePath(QString(QTest::currentDataTag()).replace('/', '_') + ".npy");
    const QStringList args = (launch.isEmpty() ? QStringList{"run"} : QStringList{"launch"} + launch) +
                             QStringList{"--model", folder(layout), "--tokens", ids_arg(prompt), "--decode",
                                         QString::number(kDecode), "--force-decode", ids_arg(kForced), "--dtype",
                                         dtype, "--logits-out", out};
    const Ran r = engine(args);
    QVERIFY2(!r.timed_out, "did not finish in 120 s");
    QVERIFY2(r.exit_code == 0, qPrintable(one_line(r.err)));
    const ss::NpyArray got = ss::read_npy(out.toStdString());
    const int64_t V = L.config["vocab_size"], T = int64_t(all.size());
    QCOMPARE(got.shape, (std::vector<int64_t>{T, V}));
    // fp32 against float64: rounding only (~1e-6). bf16: activations and
    // partial sums rounded to 8 bits through 2 layers; a wrong bias, shard or
    // frequency moves logits by O(1).
    const double bound = dtype == "fp32" ? 1e-4 : 0.05;
    double worst = 0;
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<float> row(got.data.begin() + t * V, got.data.begin() + (t + 1) * V);
      const Vec wrow(want.begin() + t * V, want.begin() + (t + 1) * V);
      const double e = ref::rel_l2(row, wrow);
      worst = std::max(worst, e);
      QVERIFY2(e <= bound, qPrintable(QString("row %1: relative L2 %2 over %3").arg(t).arg(e).arg(bound)));
    }
    qInfo("%s: worst row relative L2 %.3g", QTest::currentDataTag(), worst);
  }

  // The folder's tokenizer encodes a typed prompt (Llama 3's with its BOS),
  // and the answer comes back as text, under tp as on one device.
  void typedPrompt_data() {
    QTest::addColumn<QString>("layout");
    QTest::addColumn<QStringList>("launch");
    QTest::newRow("llama-3.2") << "llama-3.2" << QStringList{"run"};
    QTest::newRow("qwen2.5/tp2") << "qwen2.5" << QStringList{"launch", "--strategy", "tp", "--devices", "2"};
  }
  void typedPrompt() {
    QFETCH(QString, layout);
    QFETCH(QStringList, launch);
    const std::string text = "hello the world, 12345";
    const Ran r = engine(launch + QStringList{"--model", folder(layout), "--prompt", QString::fromStdString(text),
                                              "--decode", "6"});
    QVERIFY2(r.exit_code == 0, qPrintable(one_line(r.err)));
    const Stream s = read_stream(r.out);
    QCOMPARE(int(s.all<ss::proto::Prompt>().size()), 1);
    const ss::proto::Prompt& p = *s.all<ss::proto::Prompt>().front();
    const ss::text::Tokenizer tok =
        ss::text::Tokenizer::load((folder(layout) + "/tokenizer.json").toStdString());
    std::vector<int64_t> want;
    for (int32_t id : tok.encode(text)) want.push_back(id);
    QCOMPARE(p.ids, want);
    QCOMPARE(p.text, text);
    if (layout == "llama-3.2") QCOMPARE(p.ids.front(), int64_t(300));  // <|begin_of_text|>
    const auto gens = s.all<ss::proto::Generation>();
    QVERIFY(!gens.empty());
    const ss::proto::Generation& g = *gens.back();
    QCOMPARE(int(g.tokens.size()), 7);  // the prefill's token and six decoded
    QVERIFY(g.text.has_value());
    // Bytes that are not UTF-8 (random weights pick byte tokens) reach the stream as U+FFFD.
    const std::vector<int32_t> ids(g.tokens.begin(), g.tokens.end());
    const std::string as_written =
        json::parse(json(tok.decode(ids, true)).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
    QCOMPARE(*g.text, as_written);
  }
};

QTEST_GUILESS_MAIN(TestLayouts)
#include "tst_layouts.moc"

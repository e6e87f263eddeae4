// The models on one cpu device, for every family preset (tiny-*):
// - decoding with the caches (KV cache, conv and ssm state) gives the logits
//   of a fresh prefill of the longer sequence, and so does a prefill in two
//   pieces: the caches carry exactly what the recurrences and attention need;
// - the accounted weight bytes are the parameter count times four, with the
//   count checked against the Hugging Face layout and tied embeddings counted once;
// - a device too small fails with an OomError naming the category that did
//   not fit, and every byte charged before the failure is given back.
#include <QtTest>
#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "model/model.h"
#include "reference.h"

using ss::Category;
using ss::Tensor;

namespace {

constexpr double kTol = 1e-5;
constexpr uint64_t kSeed = 1234;

// One device: an allocator (unlimited unless set), a recorder and the cpu backend.
struct Rig {
  ss::Allocator alloc;
  ss::Recorder rec;
  ss::CpuBackend be{alloc, rec};

  int64_t bytes(Category c) const { return alloc.state().bytes[size_t(c)]; }
};

std::unique_ptr<ss::Model> load_model(Rig& r, const std::string& name,
                                      const std::vector<std::string>& overrides = {}) {
  auto m = std::make_unique<ss::Model>(ss::resolve_model(name, nullptr, overrides), r.be);
  ss::SyntheticSource src(kSeed);
  m->load(src);
  return m;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& v : t) v = d(g);
  return t;
}

std::vector<int32_t> positions(int64_t first, int64_t n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int32_t(first));
  return p;
}

// Row `row` of a contiguous 2-D tensor.
std::vector<float> row_of(const Tensor& t, int64_t row) {
  const float* p = t.data<float>() + row * t.ld();
  return std::vector<float>(p, p + t.cols());
}

// Logits row `got_row` of `got` must equal row `want_row` of `want`.
void verify_row(const Tensor& got, int64_t got_row, const Tensor& want, int64_t want_row) {
  const auto w = row_of(want, want_row);
  const double err = ref::rel_l2(row_of(got, got_row), ref::Vec(w.begin(), w.end()));
  QVERIFY2(err <= kTol,
           qPrintable(QStringLiteral("logits of position %1: relative L2 error %2 > %3")
                          .arg(want_row)
                          .arg(err)
                          .arg(kTol)));
}

// A fresh single prefill of `tokens` with every row's logits.
Tensor full_prefill(ss::Model& m, const std::vector<int32_t>& tokens) {
  ss::Cache c = m.make_cache(int64_t(tokens.size()));
  return m.forward(tokens, positions(0, int64_t(tokens.size())), c, /*all_logits=*/true);
}

// Parameter count from the checkpoint layout of each family (HF transformers'
// modeling_llama, modeling_mamba, modeling_mamba2), independent of the
// model's own weight list.
int64_t expected_parameters(const ss::ModelConfig& c) {
  const int64_t d = c.d_model, V = c.vocab, K = c.d_conv, Di = c.d_inner, N = c.d_state;
  int64_t n = V * d + d + (c.tie_embeddings ? 0 : V * d);  // embeddings, final norm, LM head
  for (int i = 0; i < c.n_layers; ++i) {
    switch (c.layer_kind(i)) {
      case ss::LayerKind::Attention: {
        const int64_t hq = int64_t(c.n_heads) * c.head_dim,
                      hkv = int64_t(c.n_kv_heads) * c.head_dim;
        n += 2 * d + d * hq + 2 * d * hkv + hq * d + 3 * d * c.ffn_dim;
        break;
      }
      case ss::LayerKind::Mamba: {
        const int64_t R = c.dt_rank;
        n += d + d * 2 * Di + Di * K + (c.conv_bias ? Di : 0) + Di * (R + 2 * N) + R * Di + Di +
             Di * N + Di + Di * d;
        break;
      }
      case ss::LayerKind::Mamba2: {
        const int64_t H = c.ssm_heads, GN = int64_t(c.n_groups) * N, conv = Di + 2 * GN;
        n += d + (2 * Di + 2 * GN + H) * d + conv * K + (c.conv_bias ? conv : 0) + 3 * H + Di +
             Di * d;
        break;
      }
    }
  }
  return n;
}

void add_model_column() {
  QTest::addColumn<QString>("model");
}

const char* const kModels[] = {"tiny-llama", "tiny-mamba", "tiny-falcon-mamba", "tiny-mamba2",
                               "tiny-hybrid"};

}  // namespace

class TestModels : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void decode_matches_prefill_data();
  void decode_matches_prefill();
  void prefill_in_pieces_data();
  void prefill_in_pieces();
  void weight_bytes_data();
  void weight_bytes();
  void tied_embeddings_counted_once();
  void oom_names_category_data();
  void oom_names_category();
};

void TestModels::initTestCase() {
  // The presets come from resources/models; ctest sets SHARDSCOPE_RESOURCES.
  for (const char* name : kModels) QVERIFY2(!ss::resolve_model(name, nullptr).name.empty(), name);
}

void TestModels::decode_matches_prefill_data() {
  add_model_column();
  QTest::addColumn<int>("prompt");
  QTest::addColumn<bool>("greedy");
  for (const char* name : kModels) {
    QTest::addRow("%s, prompt 21, fixed tokens", name) << QString(name) << 21 << false;
    QTest::addRow("%s, prompt 37, greedy", name) << QString(name) << 37 << true;
  }
}

// Prefill P tokens, decode 8 one at a time with the caches; every logits row
// equals the same row of one fresh prefill of all P + 8 tokens.
void TestModels::decode_matches_prefill() {
  QFETCH(QString, model);
  QFETCH(int, prompt);
  QFETCH(bool, greedy);
  const int steps = 8;
  Rig r;
  auto m = load_model(r, model.toStdString());
  const int64_t V = m->config().vocab;
  std::vector<int32_t> seq = random_tokens(prompt + steps, V, uint32_t(prompt));
  seq.resize(size_t(prompt));

  ss::Cache cache = m->make_cache(prompt + steps);
  std::vector<Tensor> logits;  // [1, V] each: the prompt's last token, then every decoded one
  logits.push_back(m->forward(seq, positions(0, prompt), cache, /*all_logits=*/false));
  QCOMPARE(logits.back().rows(), int64_t(1));
  const std::vector<int32_t> fixed = random_tokens(steps, V, uint32_t(prompt) + 1);
  for (int i = 0; i < steps; ++i) {
    const int32_t tok = greedy ? r.be.argmax_row(logits.back(), 0) : fixed[size_t(i)];
    seq.push_back(tok);
    const std::vector<int32_t> one{tok};
    logits.push_back(m->forward(one, positions(prompt + i, 1), cache, /*all_logits=*/false));
  }
  QCOMPARE(cache.length(), int64_t(prompt + steps));

  const Tensor full = full_prefill(*m, seq);
  QCOMPARE(full.rows(), int64_t(prompt + steps));
  for (int i = 0; i <= steps; ++i) verify_row(logits[size_t(i)], 0, full, prompt - 1 + i);
}

void TestModels::prefill_in_pieces_data() {
  add_model_column();
  QTest::addColumn<int>("prompt");
  QTest::addColumn<int>("split");
  for (const char* name : kModels) {
    QTest::addRow("%s, 37 = 5 + 32", name) << QString(name) << 37 << 5;
    QTest::addRow("%s, 37 = 17 + 20", name) << QString(name) << 37 << 17;
    QTest::addRow("%s, 21 = 20 + 1", name) << QString(name) << 21 << 20;
  }
}

// The prompt forwarded in two pieces through the same cache gives every row
// of one prefill.
void TestModels::prefill_in_pieces() {
  QFETCH(QString, model);
  QFETCH(int, prompt);
  QFETCH(int, split);
  Rig r;
  auto m = load_model(r, model.toStdString());
  const std::vector<int32_t> seq =
      random_tokens(prompt, m->config().vocab, uint32_t(prompt * 7 + split));
  const std::vector<int32_t> first(seq.begin(), seq.begin() + split),
      second(seq.begin() + split, seq.end());

  ss::Cache cache = m->make_cache(prompt);
  const Tensor a = m->forward(first, positions(0, split), cache, /*all_logits=*/true);
  const Tensor b = m->forward(second, positions(split, prompt - split), cache, /*all_logits=*/true);
  QCOMPARE(a.rows(), int64_t(split));
  QCOMPARE(b.rows(), int64_t(prompt - split));

  const Tensor full = full_prefill(*m, seq);
  for (int t = 0; t < split; ++t) verify_row(a, t, full, t);
  for (int t = split; t < prompt; ++t) verify_row(b, t - split, full, t);
}

void TestModels::weight_bytes_data() {
  add_model_column();
  for (const char* name : kModels) QTest::newRow(name) << QString(name);
}

// Every weight byte is accounted under `weights`, exactly four per parameter,
// and the parameters are those of the checkpoint layout.
void TestModels::weight_bytes() {
  QFETCH(QString, model);
  Rig r;
  {
    auto m = load_model(r, model.toStdString());
    QCOMPARE(m->parameter_count(), expected_parameters(m->config()));
    QCOMPARE(r.bytes(Category::Weights), m->parameter_count() * 4);
    QCOMPARE(r.alloc.state().total, r.bytes(Category::Weights));  // nothing else is held after load
  }
  QCOMPARE(r.alloc.state().total, int64_t(0));
}

// tiny-mamba ties the LM head to the embeddings: the shared matrix is counted
// and allocated once, and untying it adds exactly vocab x d_model parameters.
void TestModels::tied_embeddings_counted_once() {
  Rig tied_rig, untied_rig;
  auto tied = load_model(tied_rig, "tiny-mamba");
  auto untied = load_model(untied_rig, "tiny-mamba", {"tie_word_embeddings=false"});
  const ss::ModelConfig& c = tied->config();
  QVERIFY(c.tie_embeddings);
  QVERIFY(!untied->config().tie_embeddings);
  for (const ss::WeightSpec& w : tied->weights())
    QVERIFY2(w.name != "lm_head.weight", "a tied LM head has no weight");

  const int64_t head = c.vocab * c.d_model;
  QCOMPARE(untied->parameter_count() - tied->parameter_count(), head);
  QCOMPARE(tied_rig.bytes(Category::Weights), tied->parameter_count() * 4);
  QCOMPARE(untied_rig.bytes(Category::Weights) - tied_rig.bytes(Category::Weights), head * 4);

  // The tied model still runs: the LM head reads the embedding matrix.
  ss::Cache cache = tied->make_cache(4);
  const Tensor logits = tied->forward(std::vector<int32_t>{1, 2, 3}, positions(0, 3), cache, false);
  QCOMPARE(logits.cols(), c.vocab);
  QCOMPARE(tied_rig.bytes(Category::Weights), tied->parameter_count() * 4);
}

void TestModels::oom_names_category_data() {
  add_model_column();
  QTest::addColumn<QString>("stage");     // what the capacity leaves room for
  QTest::addColumn<QString>("category");  // the category that must not fit
  const QString load("load"), cache("cache"), entry("forward entry"), layer("forward layer");
  for (const char* name : kModels)
    QTest::addRow("%s, load", name) << QString(name) << load << QString("weights");
  // The hybrid (MAMA) allocates ssm_state first: both of its cache categories are tried.
  const char* const cache_rows[][2] = {
      {"tiny-llama", "kv_cache"},   {"tiny-mamba", "ssm_state"}, {"tiny-falcon-mamba", "ssm_state"},
      {"tiny-mamba2", "ssm_state"}, {"tiny-hybrid", "kv_cache"}, {"tiny-hybrid", "ssm_state"}};
  for (const auto& [name, cat] : cache_rows)
    QTest::addRow("%s, cache (%s)", name, cat) << QString(name) << cache << QString(cat);
  for (const char* name : kModels) {
    QTest::addRow("%s, forward entry", name) << QString(name) << entry << QString("activations");
    QTest::addRow("%s, forward inside layer 0", name)
        << QString(name) << layer << QString("activations");
  }
}

// A capacity just short of what a step needs: the step throws OomError
// naming the category, the allocator never goes over capacity, and once the
// exception has unwound every byte charged by the failed step is released.
void TestModels::oom_names_category() {
  QFETCH(QString, model);
  QFETCH(QString, stage);
  QFETCH(QString, category);
  const int64_t T = 21;
  Rig r;
  const ss::ModelConfig cfg = ss::resolve_model(model.toStdString(), nullptr);
  ss::Model m(cfg, r.be);
  const int64_t weights = m.parameter_count() * 4;

  auto expect_oom = [&](auto&& step, int64_t capacity) {
    r.alloc.set_capacity(capacity);
    const int64_t before = r.alloc.state().total;
    int64_t highest = before;  // the allocator's peak includes earlier, unlimited steps
    r.alloc.set_listener([&](const ss::MemState& now) { highest = std::max(highest, now.total); });
    bool thrown = false;
    try {
      step();
    } catch (const ss::OomError& e) {
      thrown = true;
      QCOMPARE(QString::fromStdString(e.category), category);
      QVERIFY2(QString(e.what()).contains(category), e.what());
      QCOMPARE(e.capacity, capacity);
      QVERIFY(e.requested > 0 && e.in_use + e.requested > capacity);
    }
    r.alloc.set_listener(nullptr);
    QVERIFY2(thrown, "no OomError");
    QVERIFY(highest <= capacity);
    QCOMPARE(r.alloc.state().total, before);
  };

  ss::SyntheticSource src(kSeed);
  if (stage == "load") {  // the model (holding the weights loaded so far) goes with the exception
    expect_oom(
        [&] {
          ss::Model partial(cfg, r.be);
          partial.load(src);
        },
        weights - 1);
    return;
  }
  m.load(src);
  QCOMPARE(r.alloc.state().total, weights);

  // What the caches take, measured on an unlimited device: per category, and
  // the bytes charged before the first buffer of the category under test.
  int64_t kv = 0, ssm = 0, before_first = -1, first = 0;
  {
    ss::MemState last = r.alloc.state();
    r.alloc.set_listener([&](const ss::MemState& now) {
      const int i = int(category == "kv_cache" ? Category::KvCache : Category::SsmState);
      const int64_t charged = now.bytes[size_t(i)] - last.bytes[size_t(i)];
      if (charged > 0 && before_first < 0) {
        before_first = last.total - weights;
        first = charged;
      }
      last = now;
    });
    ss::Cache probe = m.make_cache(T);
    r.alloc.set_listener(nullptr);
    kv = r.bytes(Category::KvCache);
    ssm = r.bytes(Category::SsmState);
  }
  QCOMPARE(r.alloc.state().total, weights);
  if (stage == "cache") {
    // Room for everything allocated before the category's first buffer, one byte short of that
    // buffer.
    QVERIFY2(before_first >= 0, "the model has no cache of this category");
    expect_oom([&] { ss::Cache c = m.make_cache(T); }, weights + before_first + first - 1);
    return;
  }
  ss::Cache cache = m.make_cache(T);
  const std::vector<int32_t> tokens = random_tokens(T, cfg.vocab, 5);
  const int64_t residual = T * cfg.d_model * 4;
  // "forward entry": not even the residual stream fits; "forward layer": it
  // does, and the first block's normalised input does not.
  const int64_t room = stage == "forward entry" ? residual - 1 : residual + 64;
  expect_oom([&] { m.forward(tokens, positions(0, T), cache, true); }, weights + kv + ssm + room);
  QCOMPARE(cache.length(), int64_t(0));  // the failed step holds no positions

  // With the capacity lifted the same cache serves a full run.
  r.alloc.set_capacity(0);
  const Tensor logits = m.forward(tokens, positions(0, T), cache, true);
  QCOMPARE(logits.rows(), T);
  QCOMPARE(cache.length(), T);
}

QTEST_GUILESS_MAIN(TestModels)
#include "tst_models.moc"

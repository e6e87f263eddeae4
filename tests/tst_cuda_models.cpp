// The models on one cuda device, every family (tiny-* presets), against the
// same models on the cpu backend:
// - a prefill's logits equal the cpu's (fp32 within 1e-5; bf16 within the
//   bf16 strategy bound of tst_strategies, 8u, since a whole model rounds
//   many times);
// - decoding with the caches gives the logits of a fresh prefill of the
//   longer sequence, on the device itself;
// - the accounted bytes per category equal the cpu's.
// Built twice like tst_cuda_ops: emulated on every machine (tst_cuda_models_emu),
// the nvcc build where there is a GPU (tst_cuda_models).
#include <QtTest>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "cuda/runtime.h"
#include "model/model.h"

namespace dev = ss::SS_CUDA_NS;
using ss::Tensor;

namespace {

constexpr uint64_t kSeed = 4321;
const char* const kModels[] = {"tiny-llama", "tiny-mamba", "tiny-falcon-mamba", "tiny-mamba2", "tiny-hybrid"};

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

std::vector<float> values(ss::Backend& be, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  be.download(t, out.data());
  return out;
}

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::isfinite(num) && got.size() == want.size() ? std::sqrt(num / std::max(den, 1e-300))
                                                         : std::numeric_limits<double>::infinity();
}

// Row r of a [rows, V] logits vector.
std::vector<float> row(const std::vector<float>& all, int64_t V, int64_t r) {
  return std::vector<float>(all.begin() + r * V, all.begin() + (r + 1) * V);
}

ss::ModelConfig config(const QString& name, ss::DType dt) {
  ss::ModelConfig c = ss::resolve_model(name.toStdString(), nullptr);
  c.dtype = c.kv_dtype = dt;
  return c;
}

}  // namespace

class TestCudaModels : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() {
    const std::string why = dev::unavailable_reason();
    if (!why.empty()) QSKIP(qPrintable(QStringLiteral("skipped: no CUDA device (%1)").arg(QString::fromStdString(why))));
  }

  void prefill_equals_cpu_data() {
    QTest::addColumn<QString>("model");
    QTest::addColumn<int>("dtype");
    for (const char* m : kModels) {
      QTest::addRow("%s fp32", m) << QString(m) << int(ss::DType::F32);
      QTest::addRow("%s bf16", m) << QString(m) << int(ss::DType::BF16);
    }
  }
  void prefill_equals_cpu() {
    QFETCH(QString, model);
    QFETCH(int, dtype);
    const ss::DType dt = ss::DType(dtype);
    ss::Allocator ca, da;
    ss::Recorder cr, dr;
    ss::CpuBackend cpu(ca, cr);
    dev::CudaBackend gpu(da, dr);
    ss::Model mc(config(model, dt), cpu), md(config(model, dt), gpu);
    ss::SyntheticSource src(kSeed);
    mc.load(src);
    md.load(src);
    const int64_t P = 70;  // past a 64-token tile and an SSD chunk
    const std::vector<int32_t> tokens = random_tokens(P, mc.config().vocab, 7);
    ss::Cache cc = mc.make_cache(P), dc = md.make_cache(P);
    const Tensor lc = mc.forward(tokens, positions(0, P), cc, true);
    const Tensor ld = md.forward(tokens, positions(0, P), dc, true);
    const double err = rel_l2(values(gpu, ld), values(cpu, lc));
    const double tol = dt == ss::DType::F32 ? 1e-5 : 8 * std::ldexp(1.0, -8);
    QVERIFY2(err <= tol, qPrintable(QStringLiteral("logits: cuda vs cpu relative L2 %1 > %2").arg(err).arg(tol)));
    for (int c = 0; c < ss::kCategoryCount; ++c)
      QCOMPARE(da.state().peak_bytes[size_t(c)], ca.state().peak_bytes[size_t(c)]);
  }

  void decode_matches_prefill_data() {
    QTest::addColumn<QString>("model");
    for (const char* m : kModels) QTest::newRow(m) << QString(m);
  }
  // Prefill 21 tokens, decode 6 one at a time with the caches; each row
  // equals the same row of one fresh prefill of all 27, on the device.
  void decode_matches_prefill() {
    QFETCH(QString, model);
    ss::Allocator da;
    ss::Recorder dr;
    dev::CudaBackend gpu(da, dr);
    ss::Model m(config(model, ss::DType::F32), gpu);
    ss::SyntheticSource src(kSeed);
    m.load(src);
    const int64_t P = 21, steps = 6, V = m.config().vocab;
    std::vector<int32_t> seq = random_tokens(P, V, 11);
    ss::Cache cache = m.make_cache(P + steps);
    std::vector<std::vector<float>> rows;
    Tensor last = m.forward(seq, positions(0, P), cache, false);
    rows.push_back(values(gpu, last));
    for (int i = 0; i < steps; ++i) {
      const int32_t tok = gpu.argmax_row(last, 0);
      seq.push_back(tok);
      const std::vector<int32_t> one{tok};
      last = m.forward(one, positions(P + i, 1), cache, false);
      rows.push_back(values(gpu, last));
    }
    ss::Cache fresh = m.make_cache(P + steps);
    const std::vector<float> full = values(gpu, m.forward(seq, positions(0, P + steps), fresh, true));
    for (int i = 0; i <= steps; ++i) {
      const double err = rel_l2(rows[size_t(i)], row(full, V, P - 1 + i));
      QVERIFY2(err <= 1e-5, qPrintable(QStringLiteral("position %1: decode vs prefill %2").arg(P - 1 + i).arg(err)));
    }
  }
};

QTEST_GUILESS_MAIN(TestCudaModels)
#include "tst_cuda_models.moc"

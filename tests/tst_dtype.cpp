// The compute dtype end to end through the command line: bf16 against fp32
// on the small presets (logits and greedy tokens), what each category holds
// in bf16 (weights exactly 2 bytes a parameter, the KV cache at --kv-dtype,
// SSM states in fp32 whatever the dtype), checkpoints that load in their own
// dtype, and a dtype the engine does not know refused in one line.
#include <QtTest>
#include <algorithm>
#include <cmath>

#include "engine_process.h"
#include "npy_compare.h"
#include "protocol/events.h"

namespace {

constexpr int kPrompt = 64;
constexpr int kDecode = 16;

// Expectations below are worked out from these dimensions (the presets'
// values, restated so a preset edit cannot move both sides).
struct Mamba2Dims {
  int64_t layers = 2, d = 64, d_inner = 128, heads = 8, head_dim = 16, groups = 2, state = 16,
          conv = 4;
  int64_t conv_dim() const { return d_inner + 2 * groups * state; }
};
struct LlamaDims {
  int64_t layers = 2, kv_heads = 2, head_dim = 16;
};

QStringList mamba2_sets() {
  return {"--set", "hidden_size=64",     "--set", "state_size=16", "--set", "expand=2",
          "--set", "head_dim=16",        "--set", "n_groups=2",    "--set", "conv_kernel=4",
          "--set", "num_hidden_layers=2"};
}
QStringList llama_sets() {
  return {"--set", "num_hidden_layers=2",   "--set", "hidden_size=64",
          "--set", "num_attention_heads=4", "--set", "num_key_value_heads=2"};
}

int64_t argmax_row(const ss::NpyArray& a, int64_t row) {
  const int64_t V = a.shape.back();
  const float* r = a.data.data() + row * V;
  return std::max_element(r, r + V) - r;
}

}  // namespace

class TestDtype : public QObject {
  Q_OBJECT

  QTemporaryDir m_dir;

  // A run to completion: its stream, or a failed check.
  Stream run_ok(const QStringList& args, int timeout_ms = 180000) {
    const Ran r = engine(args, timeout_ms);
    if (r.crashed || r.exit_code != 0) {
      QTest::qFail(qPrintable(QString("engine %1 exit %2: %3")
                                  .arg(args.join(' '))
                                  .arg(r.exit_code)
                                  .arg(one_line(r.err))),
                   __FILE__, __LINE__);
      return {};
    }
    return read_stream(r.out);
  }

 private slots:
  void initTestCase() {
    QVERIFY2(QFileInfo::exists(SHARDSCOPE_ENGINE_BIN), SHARDSCOPE_ENGINE_BIN);
    QVERIFY(m_dir.isValid());
  }

  // bf16 single against fp32 single, decode teacher-forced with fp32's own
  // greedy tokens so every run sees the same contexts.
  //  - The logits against fp32 on the same weights rounded to bf16 (a bf16
  //    checkpoint run in fp32): what the bf16 numerics themselves cost
  //    (activations, K/V and the residual stream in bf16, fp32
  //    accumulation): worst row relative L2 under 2e-2.
  //  - Against the fp32 model itself, which adds the weights' own rounding
  //    (2^-9 relative on average, through every GEMM): under 4e-2 on the
  //    random-weight presets (measured here: small-llama 0.021,
  //    small-mamba2 0.028), where the weights are drawn in fp32; the
  //    rounding of those weights alone, every op then run in fp32, moves the
  //    logits by 0.013 and 0.022, so no bf16 run of them reaches 2e-2 against
  //    the fp32 model (the info line prints that figure too). The trained
  //    text models (brown-*, prompted with a sentence of English) ship in
  //    bf16, as trained checkpoints are published, so their fp32 model has
  //    the bf16 weights and both checks are the one: under 2e-2
  //    (measured: brown-llama 0.0047, brown-mamba2 0.0042).
  //  - bf16's greedy choice equals fp32's at every decode step where fp32's
  //    top-2 margin is above what bf16 resolves there: the larger of the
  //    spacing of bf16 numbers at the top logit, 2^(floor(log2 |top|) - 7),
  //    and four standard deviations of the difference of two bf16 logits at
  //    that row (4 sqrt(2) sigma, sigma the RMS of bf16 - fp32 over the row:
  //    the logits' own error, measured in this run). Closer margins are
  //    coin flips for any bf16 implementation and are only counted.
  void bf16AgainstFp32_data() {
    QTest::addColumn<QString>("model");
    QTest::addColumn<QStringList>("prompt");
    QTest::addColumn<double>("model_bound");
    const QStringList synthetic = {"--prompt-len", QString::number(kPrompt), "--seed", "5"};
    const QStringList text = {"--prompt", "The jury said that the city of Atlanta had been given a report on the"};
    QTest::newRow("small-llama") << "small-llama" << synthetic << 4e-2;
    QTest::newRow("small-mamba2") << "small-mamba2" << synthetic << 4e-2;
    QTest::newRow("brown-llama") << "brown-llama" << text << 2e-2;
    QTest::newRow("brown-mamba2") << "brown-mamba2" << text << 2e-2;
  }
  void bf16AgainstFp32() {
    QFETCH(QString, model);
    QFETCH(QStringList, prompt);
    QFETCH(double, model_bound);
    // Under a sanitizer the two trained text models run the same kernels
    // (llama and mamba2, in fp32 and bf16) in a twentieth of the time.
    if (qEnvironmentVariableIsSet("SHARDSCOPE_SANITIZER_LEG") && !model.startsWith("brown-"))
      QSKIP("the random-weight presets run in the plain leg");
    const QString f32 = m_dir.filePath(model + "-fp32.npy"),
                  b16 = m_dir.filePath(model + "-bf16.npy"),
                  same = m_dir.filePath(model + "-fp32-bf16-weights.npy"),
                  ckpt = m_dir.filePath(model + "-bf16");
    run_ok(QStringList{"run", "--model", model, "--decode", QString::number(kDecode),
                       "--logits-out", f32} +
           prompt);
    const Ran ex =
        engine({"export", "--model", model, "--seed", "5", "--dtype", "bf16", "--out", ckpt});
    QVERIFY2(ex.exit_code == 0, ex.err.constData());
    if (QTest::currentTestFailed()) return;
    const ss::NpyArray a = ss::read_npy(f32.toStdString());
    QVERIFY(a.shape.size() == 2 && a.shape[0] > kDecode);
    const int64_t P = a.shape[0] - kDecode;  // the prompt's tokens (a text prompt's count is its encoding's)
    QStringList tokens;  // fp32's greedy tokens: rows P-1 .. P+kDecode-2 chose them
    for (int k = 0; k < kDecode; ++k) tokens << QString::number(argmax_row(a, P - 1 + k));
    const QStringList forced = {"--decode", QString::number(kDecode), "--force-decode",
                                tokens.join(',')};
    run_ok(QStringList{"run", "--model", model, "--dtype", "bf16", "--logits-out", b16} + prompt +
           forced);
    run_ok(QStringList{"run", "--model", ckpt, "--dtype", "fp32", "--logits-out", same} + prompt +
           forced);
    if (QTest::currentTestFailed()) return;
    const ss::NpyArray b = ss::read_npy(b16.toStdString()), c = ss::read_npy(same.toStdString());
    QCOMPARE(b.shape, a.shape);
    QCOMPARE(c.shape, a.shape);
    const double numerics = worst_row(b, c).first, overall = worst_row(b, a).first,
                 weights = worst_row(c, a).first;  // the weights' rounding alone, computed in fp32
    const int64_t V = a.shape.back();
    int qualified = 0, agreed = 0;
    for (int k = 0; k < kDecode; ++k) {
      const int64_t row = P - 1 + k;
      std::vector<float> r(a.data.begin() + row * V, a.data.begin() + (row + 1) * V);
      double sq = 0;
      for (int64_t c = 0; c < V; ++c) {
        const double d = double(b.data[size_t(row * V + c)]) - a.data[size_t(row * V + c)];
        sq += d * d;
      }
      const double sigma = std::sqrt(sq / double(V));
      std::partial_sort(r.begin(), r.begin() + 2, r.end(), std::greater<float>());
      int e = 0;
      std::frexp(std::fabs(r[0]), &e);  // |top| in [2^(e-1), 2^e)
      const double resolution = std::max(std::ldexp(1.0, e - 1 - 7), 4 * std::sqrt(2.0) * sigma);
      if (r[0] - r[1] <= resolution) continue;
      ++qualified;
      agreed += argmax_row(b, row) == argmax_row(a, row);
    }
    qInfo(
        "%s: bf16 vs fp32 on the same bf16 weights %.3g (bound 2e-2), vs the fp32 model %.3g "
        "(bound %.0e; the weights' rounding alone, run in fp32: %.3g); "
        "%d of %d decode steps have an fp32 top-2 margin above bf16's resolution, bf16 picks "
        "fp32's token at %d",
        qPrintable(model), numerics, overall, model_bound, weights, qualified, kDecode, agreed);
    QVERIFY2(numerics < 2e-2,
             qPrintable(QString("bf16 numerics: logits differ by %1").arg(numerics)));
    QVERIFY2(overall < model_bound,
             qPrintable(QString("bf16 against the fp32 model: logits differ by %1").arg(overall)));
    QVERIFY2(qualified > 0,
             "no decode step has a margin bf16 resolves: the check would say nothing");
    QCOMPARE(agreed, qualified);
  }

  // What a bf16 run keeps where: weights exactly 2 bytes a parameter; the KV
  // cache in --kv-dtype (default the compute dtype); a Mamba2 layer's
  // conv_state in bf16 and its ssm_state in fp32 (as mamba_ssm keeps it).
  void bytesPerCategory() {
    const LlamaDims L;
    const QStringList llama =
        QStringList{"run", "--model", "tiny-llama", "--prompt-len", "20", "--decode", "4"} +
        llama_sets() + QStringList{"--set", "head_dim=16"};
    for (const auto& [dtype, kv, bytes, kv_bytes] :
         {std::tuple{"bf16", "", 2, 2}, std::tuple{"bf16", "fp32", 2, 4},
          std::tuple{"fp16", "", 2, 2}, std::tuple{"fp32", "bf16", 4, 2}}) {
      QStringList args = llama + QStringList{"--dtype", dtype};
      if (*kv) args << "--kv-dtype" << kv;
      const Stream s = run_ok(args);
      if (QTest::currentTestFailed()) return;
      const auto m = s.metrics();
      QVERIFY(!s.all<ss::proto::Config>().empty());
      const auto& conf = s.all<ss::proto::Config>().front()->config;
      QCOMPARE(conf.value("dtype", std::string()), std::string(dtype));
      QCOMPARE(conf.value("kv_dtype", std::string()), std::string(*kv ? kv : dtype));
      const int64_t params = conf.value("parameters", int64_t(-1));
      QCOMPARE(int64_t(m.at("peak_weights_bytes")), params * bytes);
      QCOMPARE(int64_t(m.at("peak_kv_cache_bytes")),
               kv_bytes * 2 * L.layers * 24 * L.kv_heads * L.head_dim);
    }
    const Mamba2Dims M;
    for (const auto& [dtype, bytes] : {std::pair{"fp32", 4}, std::pair{"bf16", 2}}) {
      const Stream s = run_ok(QStringList{"run", "--model", "tiny-mamba2", "--prompt-len", "20",
                                          "--decode", "2", "--dtype", dtype} +
                              mamba2_sets());
      if (QTest::currentTestFailed()) return;
      const int64_t conv_state = (M.conv - 1) * M.conv_dim() * bytes;
      const int64_t ssm_state = M.heads * M.head_dim * M.state * 4;  // fp32 in every dtype
      QCOMPARE(int64_t(s.metrics().at("peak_ssm_state_bytes")),
               M.layers * (conv_state + ssm_state));
    }
  }

  // A checkpoint loads in its own dtype: bf16 safetensors into a bf16 run are
  // copied (on one rank and sliced over two), fp32 ones rounded once at load
  // to nearest even, so both give exactly the logits of the synthetic bf16
  // run, whose fp32 values are rounded the same way.
  void checkpointsLoadInTheirDtype() {
    const QString base = m_dir.filePath("ckpt");
    const QStringList model = {"--model", "tiny-llama"};
    for (const char* dt : {"bf16", "f32"}) {
      const Ran r = engine(
          {"export", "--model", "tiny-llama", "--seed", "9", "--dtype", dt, "--out", base + dt});
      QVERIFY2(r.exit_code == 0, r.err.constData());
    }
    auto logits = [&](const QStringList& head, const QString& m, const QString& name) {
      const QString file = m_dir.filePath(name + ".npy");
      run_ok(head + QStringList{"--model", m, "--prompt-len", "16", "--decode", "4", "--seed", "9",
                                "--dtype", "bf16", "--logits-out", file});
      return QTest::currentTestFailed() ? ss::NpyArray{} : ss::read_npy(file.toStdString());
    };
    const ss::NpyArray synthetic = logits({"run"}, "tiny-llama", "synthetic");
    const ss::NpyArray from_bf16 = logits({"run"}, base + "bf16", "from-bf16");
    const ss::NpyArray from_f32 = logits({"run"}, base + "f32", "from-f32");
    if (QTest::currentTestFailed()) return;
    QVERIFY(!synthetic.data.empty());
    QVERIFY2(from_bf16.data == synthetic.data,
             "a bf16 checkpoint in a bf16 run differs from the synthetic weights");
    QVERIFY2(from_f32.data == synthetic.data,
             "an fp32 checkpoint rounded at load differs from the synthetic weights");
    const QStringList tp = {"launch", "--strategy", "tp", "--devices", "2"};
    const ss::NpyArray tp_synthetic = logits(tp, "tiny-llama", "tp-synthetic");
    const ss::NpyArray tp_bf16 = logits(tp, base + "bf16", "tp-from-bf16");
    if (QTest::currentTestFailed()) return;
    QVERIFY2(tp_bf16.data == tp_synthetic.data,
             "sliced bf16 loading differs from the synthetic weights");
  }

  void unknownDtypeRefused_data() {
    QTest::addColumn<QStringList>("args");
    QTest::newRow("run --dtype fp8")
        << QStringList{"run", "--model", "tiny-llama", "--prompt-len", "4", "--dtype", "fp8"};
    QTest::newRow("simulate --kv-dtype int8") << QStringList{
        "simulate", "--model", "tiny-llama", "--prompt-len", "4", "--kv-dtype", "int8"};
  }
  void unknownDtypeRefused() {
    QFETCH(QStringList, args);
    const Ran r = engine(args);
    QCOMPARE(r.exit_code, 2);
    const QString err = one_line(r.err);
    QVERIFY2(!err.contains('\n'), qPrintable(err));
    QVERIFY2(err.contains("fp32, bf16 or fp16"), qPrintable(err));
    QVERIFY(r.out.isEmpty());
  }
};

QTEST_GUILESS_MAIN(TestDtype)
#include "tst_dtype.moc"

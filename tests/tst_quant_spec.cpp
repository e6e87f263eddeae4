// The communication formats' byte counts and the text that names them:
// quantized_bytes and value_bytes against the formats' layouts (scales
// first, int4 two values a byte), parse_quant_spec and parse_comm_precision
// (--comm-precision: specs, sites, layer ranges, the later rule winning),
// and the one-line refusals of what does not parse. The codec itself:
// tst_quant.
#include <QtTest>
#include <cstdint>
#include <exception>
#include <string>

#include "comm/quantize.h"
#include "core/error.h"
#include "quant_bounds.h"

using quant_bounds::spec_of;
using ss::Precision;
using ss::QuantSpec;
using ss::Rounding;

class TestQuantSpec : public QObject {
  Q_OBJECT

 private slots:
  void quantizedBytes() {
    const struct {
      Precision p;
      const char* name;
    } all[] = {{Precision::FP32, "fp32"}, {Precision::BF16, "bf16"}, {Precision::FP16, "fp16"},
               {Precision::INT8, "int8"}, {Precision::INT4, "int4"}, {Precision::FP8, "fp8"}};
    for (const auto& a : all) {
      for (int block : {1, 7, 32, 128, 4096, 1 << 20}) {
        for (int64_t n : {int64_t(0), int64_t(1), int64_t(2), int64_t(127), int64_t(128),
                          int64_t(129), int64_t(1000), int64_t(4097), int64_t(1 << 20),
                          int64_t((1 << 20) + 1), int64_t(3) << 30}) {
          const QuantSpec s = spec_of(a.p, block);
          const int64_t blocks = (n + block - 1) / block;
          int64_t want = 0;
          switch (a.p) {
            case Precision::FP32:
              want = 4 * n;
              break;
            case Precision::BF16:
            case Precision::FP16:
              want = 2 * n;
              break;
            case Precision::INT8:
            case Precision::FP8:
              want = n + 4 * blocks;
              break;
            case Precision::INT4:
              want = (n + 1) / 2 + 4 * blocks;
              break;
          }
          QVERIFY2(ss::quantized_bytes(n, s) == want,
                   qPrintable(QStringLiteral("%1:%2 n=%3: %4 bytes, expected %5")
                                  .arg(a.name)
                                  .arg(block)
                                  .arg(n)
                                  .arg(ss::quantized_bytes(n, s))
                                  .arg(want)));
        }
      }
    }
    QCOMPARE(ss::value_bytes(Precision::FP32), 4.0);
    QCOMPARE(ss::value_bytes(Precision::BF16), 2.0);
    QCOMPARE(ss::value_bytes(Precision::FP16), 2.0);
    QCOMPARE(ss::value_bytes(Precision::INT8), 1.0);
    QCOMPARE(ss::value_bytes(Precision::FP8), 1.0);
    QCOMPARE(ss::value_bytes(Precision::INT4), 0.5);
  }

  // --- parsing -------------------------------------------------------------

  void parseQuantSpec_data() {
    QTest::addColumn<QString>("text");
    QTest::addColumn<Precision>("precision");
    QTest::addColumn<int>("block");
    QTest::addColumn<Rounding>("rounding");
    const auto rn = Rounding::Nearest, sr = Rounding::Stochastic;
    QTest::newRow("int8") << "int8" << Precision::INT8 << 128 << rn;
    QTest::newRow("int8:128") << "int8:128" << Precision::INT8 << 128 << rn;
    QTest::newRow("int8:1") << "int8:1" << Precision::INT8 << 1 << rn;
    QTest::newRow("int8:1048576") << "int8:1048576" << Precision::INT8 << (1 << 20) << rn;
    QTest::newRow("int8:sr") << "int8:sr" << Precision::INT8 << 128 << sr;
    QTest::newRow("int4:64:sr") << "int4:64:sr" << Precision::INT4 << 64 << sr;
    QTest::newRow("int4:32:rn") << "int4:32:rn" << Precision::INT4 << 32 << rn;
    QTest::newRow("fp8") << "fp8" << Precision::FP8 << 128 << rn;
    QTest::newRow("fp8:256:sr") << "fp8:256:sr" << Precision::FP8 << 256 << sr;
    QTest::newRow("fp8e4m3:64") << "fp8e4m3:64" << Precision::FP8 << 64 << rn;
    QTest::newRow("e4m3") << "e4m3" << Precision::FP8 << 128 << rn;
    QTest::newRow("bf16") << "bf16" << Precision::BF16 << 128 << rn;
    QTest::newRow("fp16") << "fp16" << Precision::FP16 << 128 << rn;
    QTest::newRow("fp32") << "fp32" << Precision::FP32 << 128 << rn;
  }
  void parseQuantSpec() {
    QFETCH(QString, text);
    QFETCH(Precision, precision);
    QFETCH(int, block);
    QFETCH(Rounding, rounding);
    const QuantSpec s = ss::parse_quant_spec(text.toStdString());
    QCOMPARE(s.precision, precision);
    QCOMPARE(s.rounding, rounding);
    if (s.is_block()) QCOMPARE(s.block, block);
    // str() writes a spec that parses back to itself.
    const QuantSpec back = ss::parse_quant_spec(s.str());
    QCOMPARE(back.precision, s.precision);
    QCOMPARE(back.rounding, s.rounding);
    if (s.is_block()) QCOMPARE(back.block, s.block);
  }

  void parseRefuses_data() {
    QTest::addColumn<QString>("text");
    QTest::addColumn<bool>("comm");      // parse_comm_precision, else parse_quant_spec
    QTest::addColumn<QString>("names");  // what the message must name
    for (bool comm : {false, true}) {
      const char* f = comm ? "comm" : "spec";
      QTest::addRow("%s int3", f) << "int3" << comm << "int3";
      QTest::addRow("%s empty name", f) << ":128" << comm << "precision";
      QTest::addRow("%s block 0", f) << "int8:0" << comm << "0";
      QTest::addRow("%s block -4", f) << "int8:-4" << comm << "-4";
      QTest::addRow("%s block 1048577", f) << "int8:1048577" << comm << "1048577";
      QTest::addRow("%s bf16:128", f) << "bf16:128" << comm << "bf16";
      QTest::addRow("%s fp32:64", f) << "fp32:64" << comm << "fp32";
      QTest::addRow("%s int8:12x", f) << "int8:12x" << comm << "12x";
      QTest::addRow("%s int8:fast", f) << "int8:fast" << comm << "fast";
    }
    QTest::newRow("unknown site") << "ffn=int8" << true << "ffn";
    QTest::newRow("site of a bad spec") << "attn=int3" << true << "int3";
    QTest::newRow("range reversed") << "mlp@5-2=int8" << true << "5-2";
    QTest::newRow("range negative") << "mlp@-1-3=int8" << true << "-1-3";
    QTest::newRow("range one number") << "mlp@3=int8" << true << "3";
    QTest::newRow("range words") << "mlp@a-b=int8" << true << "a-b";
    QTest::newRow("range empty") << "attn@=int8" << true << "attn@";
    QTest::newRow("unknown site with range") << "ffn@0-3=int8" << true << "ffn";
    QTest::newRow("bad second rule") << "attn=bf16,mlp=int8:0" << true << "0";
  }
  void parseRefuses() {
    QFETCH(QString, text);
    QFETCH(bool, comm);
    QFETCH(QString, names);
    QString what = "nothing thrown";
    try {
      if (comm)
        ss::parse_comm_precision(text.toStdString());
      else
        ss::parse_quant_spec(text.toStdString());
    } catch (const ss::UsageError& e) {
      what = QString::fromStdString(e.what());
      QVERIFY2(what.contains(names), qPrintable("message does not name '" + names + "': " + what));
      return;
    } catch (const std::exception& e) {
      what = QStringLiteral("not a UsageError: ") + e.what();
    }
    QFAIL(qPrintable(text + ": " + what));
  }

  void commPrecisionRules() {
    // Empty: no rules, every site fp32.
    const ss::CommPrecision none = ss::parse_comm_precision("");
    QVERIFY(none.rules.empty());
    QVERIFY(!none.quantizes());
    QCOMPARE(none.at("attn", 0).precision, Precision::FP32);
    QCOMPARE(QString::fromStdString(none.str()), QStringLiteral("fp32"));

    // One spec for every site and layer.
    const ss::CommPrecision every = ss::parse_comm_precision("int8:64");
    QCOMPARE(every.rules.size(), size_t(1));
    for (const char* site : {"attn", "mlp", "mixer"}) {
      QCOMPARE(every.at(site, 0).precision, Precision::INT8);
      QCOMPARE(every.at(site, 1000).block, 64);
    }
    QVERIFY(every.quantizes());

    // Only one site: the others default to fp32.
    const ss::CommPrecision attn = ss::parse_comm_precision("attn=bf16");
    QCOMPARE(attn.at("attn", 3).precision, Precision::BF16);
    QCOMPARE(attn.at("mlp", 3).precision, Precision::FP32);
    QCOMPARE(attn.at("mixer", 3).precision, Precision::FP32);

    // Later rules win; ranges are inclusive.
    const ss::CommPrecision p = ss::parse_comm_precision(
        "int8:128,attn=bf16,mlp@0-3=int4:32:sr,mlp@2-2=fp8,all@10-11=fp32");
    QCOMPARE(p.rules.size(), size_t(5));
    const struct {
      const char* site;
      int layer;
      Precision precision;
    } chosen[] = {{"attn", 0, Precision::BF16},   {"mlp", 0, Precision::INT4},   {"mlp", 1, Precision::INT4},
                  {"mlp", 2, Precision::FP8},     {"mlp", 3, Precision::INT4},   {"mlp", 4, Precision::INT8},
                  {"mixer", 7, Precision::INT8},  {"attn", 10, Precision::FP32}, {"mlp", 11, Precision::FP32},
                  {"mlp", 12, Precision::INT8}};
    for (const auto& c : chosen)
      QVERIFY2(p.at(c.site, c.layer).precision == c.precision,
               qPrintable(QStringLiteral("%1 layer %2: %3").arg(c.site).arg(c.layer).arg(
                   QString::fromStdString(p.at(c.site, c.layer).str()))));
    QCOMPARE(p.at("mlp", 0).block, 32);
    QCOMPARE(p.at("mlp", 0).rounding, Rounding::Stochastic);
    QCOMPARE(p.at("mlp", 4).block, 128);
    QVERIFY(p.quantizes());
    // str() writes the rules back in a form that parses to the same choices.
    const ss::CommPrecision again = ss::parse_comm_precision(p.str());
    for (const char* site : {"attn", "mlp", "mixer"}) {
      for (int layer : {0, 1, 2, 3, 4, 10, 11, 12, 1000}) {
        QCOMPARE(QString::fromStdString(again.at(site, layer).str()),
                 QString::fromStdString(p.at(site, layer).str()));
      }
    }

    // The same site twice: the last rule wins.
    const ss::CommPrecision twice = ss::parse_comm_precision("attn=int8,attn=int4:16");
    QCOMPARE(twice.at("attn", 0).precision, Precision::INT4);
    QCOMPARE(twice.at("attn", 0).block, 16);

    // Only fp32 rules quantize nothing.
    QVERIFY(!ss::parse_comm_precision("fp32").quantizes());
    QVERIFY(!ss::parse_comm_precision("attn=fp32,mlp@0-3=fp32").quantizes());
    QVERIFY(ss::parse_comm_precision("attn=fp32,mlp=bf16").quantizes());
  }
};

QTEST_APPLESS_MAIN(TestQuantSpec)
#include "tst_quant_spec.moc"

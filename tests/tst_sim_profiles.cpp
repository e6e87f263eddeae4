// Hardware profiles `simulate` refuses: a malformed one (a field missing,
// negative, of the wrong type, a measured table of the wrong shape, a file
// that is not JSON) exits 2 before any rank runs, with one line that names
// the file, the field and what it must be.
#include <QtTest>
#include <string>

#include "engine_process.h"
#include "sim_profiles.h"

using json = nlohmann::json;

class TestSimProfiles : public QObject {
  Q_OBJECT

  QTemporaryDir m_dir;
  json m_h100;

 private slots:
  void initTestCase() {
    QVERIFY(m_dir.isValid());
    QVERIFY(sim_suite_ready(m_h100));
  }

  void malformedProfile_data() {
    QTest::addColumn<QString>("edit");
    QTest::addColumn<QString>("field");  // empty: a file that is not JSON names none
    QTest::addColumn<QString>("reason");
    QTest::newRow("missing") << "missing"
                             << "device.memory_bandwidth_gbps"
                             << "is missing";
    QTest::newRow("negative") << "negative"
                              << "node.link.bandwidth_gbps"
                              << "must be positive";
    QTest::newRow("string") << "string"
                            << "device.fp32_tflops"
                            << "must be a number";
    QTest::newRow("zero") << "zero"
                          << "network.latency_us"
                          << "must be positive";
    QTest::newRow("not-object") << "not-object"
                                << "node"
                                << "must be an object";
    QTest::newRow("not-json") << "not-json"
                              << ""
                              << "not valid JSON";
    // The measured tables calibrate writes (optional fields).
    QTest::newRow("grid-shape") << "grid-shape"
                                << "device.kernel_times.add.us"
                                << "must be 2 arrays (one per rows) of 3 positive numbers (one per cols)";
    QTest::newRow("grid-axis") << "grid-axis"
                               << "device.kernel_times.add.cols"
                               << "must be strictly increasing";
    QTest::newRow("table-source") << "table-source"
                                  << "device.gemm_times.source"
                                  << "is missing";
    QTest::newRow("gemm-times") << "gemm-times"
                                << "device.gemm_times.shapes[0].us"
                                << "must hold one time per entry";
    QTest::newRow("attention-heads") << "attention-heads"
                                     << "device.attention_times.heads"
                                     << "must be positive";
    QTest::newRow("collective") << "collective"
                                << "node.link.collectives.all_reduce.latency_us"
                                << "must be positive";
    QTest::newRow("contention") << "contention"
                                << "device.contention.comm"
                                << "must be a number >= 0";
    QTest::newRow("contention-hold") << "contention-hold"
                                     << "device.contention.hold_us"
                                     << "must be a number >= 0";
    QTest::newRow("contention-source") << "contention-source"
                                       << "device.contention.source"
                                       << "is missing";
    QTest::newRow("host-gap") << "host-gap"
                              << "device.host_gap.us"
                              << "must be positive";
    QTest::newRow("host-gap-source") << "host-gap-source"
                                     << "device.host_gap.source"
                                     << "is missing";
    QTest::newRow("core-share") << "core-share"
                                << "device.core_share.share"
                                << "at most 1";
    QTest::newRow("core-share-count") << "core-share-count"
                                      << "device.core_share.share"
                                      << "one share per kernel_us";
    QTest::newRow("overlap-share") << "overlap-share"
                                   << "device.overlap_steps.share"
                                   << "at most 1";
    QTest::newRow("overlap-wait") << "overlap-wait"
                                  << "device.overlap_steps.wait_us"
                                  << "an object of times per collective";
    QTest::newRow("overlap-wait-count") << "overlap-wait-count"
                                        << "device.overlap_steps.wait_us.sendrecv"
                                        << "one time per kernel_us";
    QTest::newRow("collective-groups") << "collective-groups"
                                       << "node.link.collectives.all_reduce.groups[0].us"
                                       << "must hold one time per entry";
    QTest::newRow("collective-missing") << "collective-missing"
                                        << "network.collectives.broadcast.bandwidth_gbps"
                                        << "is missing";
  }
  void malformedProfile() {
    QFETCH(QString, edit);
    QFETCH(QString, field);
    QFETCH(QString, reason);
    json j = m_h100;
    if (edit == "missing") j["device"].erase("memory_bandwidth_gbps");
    if (edit == "negative") j["node"]["link"]["bandwidth_gbps"] = -370;
    if (edit == "string") j["device"]["fp32_tflops"] = "67";
    if (edit == "zero") j["network"]["latency_us"] = 0;
    if (edit == "not-object") j["node"] = 8;
    if (edit.startsWith("grid")) {
      j["device"]["kernel_times"] = {{"source", "test"},
                                     {"add", {{"rows", {1, 8}}, {"cols", {64, 512, 4096}}, {"us", {{1, 2, 3}, {4, 5}}}}}};
      if (edit == "grid-axis") j["device"]["kernel_times"]["add"] = {{"rows", {1}}, {"cols", {64, 64}}, {"us", {{1, 2}}}};
    }
    if (edit == "table-source") j["device"]["gemm_times"] = {{"shapes", json::array()}};
    if (edit == "gemm-times")
      j["device"]["gemm_times"] = {{"source", "test"}, {"shapes", {{{"n", 64}, {"k", 64}, {"m", {1, 2}}, {"us", {3}}}}}};
    if (edit == "attention-heads")
      j["device"]["attention_times"] = {{"source", "test"}, {"heads", 0}, {"kv_heads", 1}, {"head_dim", 64},
                                        {"tq", {1}}, {"tk", {64}}, {"us", {{1}}}};
    if (edit == "collective") j["node"]["link"]["collectives"] = {{"all_reduce", {{"latency_us", -2}, {"bandwidth_gbps", 5}}}};
    if (edit == "collective-groups")
      j["node"]["link"]["collectives"] = {
          {"all_reduce",
           {{"latency_us", 2}, {"bandwidth_gbps", 5}, {"groups", {{{"ranks", 2}, {"bytes", {64, 4096}}, {"us", {9}}}}}}}};
    if (edit == "collective-missing") j["network"]["collectives"] = {{"broadcast", {{"latency_us", 2}}}};
    if (edit == "contention") j["device"]["contention"] = {{"source", "test"}, {"compute", 1}, {"comm", -0.5}};
    if (edit == "contention-source") j["device"]["contention"] = {{"compute", 1}, {"comm", 1}};
    if (edit == "contention-hold") j["device"]["contention"] = {{"source", "test"}, {"hold_us", -1}};
    if (edit == "host-gap") j["device"]["host_gap"] = {{"source", "test"}, {"us", -2}};
    if (edit == "host-gap-source") j["device"]["host_gap"] = {{"us", 6}};
    if (edit == "core-share")
      j["device"]["core_share"] = {{"source", "test"}, {"kernel_us", {100, 1000}}, {"share", {0.4, 1.5}}};
    if (edit == "core-share-count")
      j["device"]["core_share"] = {{"source", "test"}, {"kernel_us", {100, 1000}}, {"share", {0.4}}};
    if (edit.startsWith("overlap")) {
      j["device"]["overlap_steps"] = {{"source", "test"}, {"kernel_us", {100, 1000}}, {"share", {1, 0.5}},
                                      {"wait_us", {{"broadcast", {300, 900}}, {"sendrecv", {200, 600}}}}};
      if (edit == "overlap-share") j["device"]["overlap_steps"]["share"] = {1, 1.5};
      if (edit == "overlap-wait") j["device"]["overlap_steps"]["wait_us"] = {300, 900};
      if (edit == "overlap-wait-count") j["device"]["overlap_steps"]["wait_us"]["sendrecv"] = {200};
    }
    const QString file = m_dir.filePath(edit + ".json");
    {
      QFile f(file);
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write(edit == "not-json" ? QByteArray("name: h100\n[device]\nmemory_bytes = 80e9\n")
                                 : QByteArray::fromStdString(j.dump(2)));
    }
    const Ran r =
        engine({"simulate", "--hardware", file, "--model", "tiny-llama", "--prompt-len", "8"});
    QVERIFY(!r.crashed);
    QCOMPARE(r.exit_code, 2);
    QVERIFY2(r.out.isEmpty(), r.out.left(200).constData());  // refused before any rank ran
    const QString err = one_line(r.err);
    QVERIFY2(!err.isEmpty() && !err.contains('\n'), qPrintable(err));
    QVERIFY2(err.contains(file), qPrintable(err));
    if (!field.isEmpty()) QVERIFY2(err.contains("'" + field + "'"), qPrintable(err));
    QVERIFY2(err.contains(reason), qPrintable(err));
  }
};

QTEST_GUILESS_MAIN(TestSimProfiles)
#include "tst_sim_profiles.moc"

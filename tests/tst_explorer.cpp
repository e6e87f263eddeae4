// The explorer offscreen: EngineClient driving a real engine run end to end,
// the same stream replayed from a file giving the same data, the failures a
// person will hit, and the pages showing what the stream said.
#include <QCheckBox>
#include <QCommandLinkButton>
#include <qcustomplot.h>
#include <QJsonDocument>
#include <QJsonObject>
#include <QSignalSpy>
#include <QTabWidget>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QtTest>

#include <limits>

#include "engineclient.h"
#include "compare.h"
#include "mainwindow.h"
#include "pages.h"
#include "scaling_page.h"
#include "rundata.h"
#include "startpage.h"
#include "training.h"

namespace {

// Runs the engine through an EngineClient and collects everything it emits.
struct Collected {
  RunData data;
  RunOutcome outcome;
  QStringList rejected;
};

bool drive(EngineClient& client, Collected& c, const std::function<void()>& start) {
  QObject::connect(&client, &EngineClient::eventsReceived, [&](const EventBatch& b) { c.data.add(*b); });
  QObject::connect(&client, &EngineClient::lineRejected, [&](const QString& r) { c.rejected << r; });
  QSignalSpy done(&client, &EngineClient::finished);
  start();
  if (done.isEmpty() && !done.wait(120000)) return false;
  c.outcome = done.takeFirst().at(0).value<RunOutcome>();
  return true;
}

// Presses "Check against one device" once the setup's check is done and
// waits for the verdict: its exit code, shown on the Summary page (negative:
// it did not get that far).
int verdictOf(MainWindow& w) {
  if (!QTest::qWaitFor([&] { return !w.checking(); }, 20000)) return -1;
  QSignalSpy done(&w, &MainWindow::runFinished);
  w.verifySetup();
  if (!done.wait(120000)) return -2;
  if (w.pages()->tabText(w.pages()->currentIndex()) != QLatin1String("Summary")) return -3;
  return done.takeFirst().at(0).value<RunOutcome>().exitCode;
}

// A stream written by hand: its hello, the run's strategy on its devices,
// then `rest`.
std::vector<ss::proto::Event> handWritten(const char* strategy, int devices, std::vector<ss::proto::Event> rest) {
  std::vector<ss::proto::Event> out{ss::proto::Hello{1, "test", "here"},
                                    ss::proto::Config{{{"strategy", strategy}, {"devices", devices}}}};
  out.insert(out.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
  return out;
}

}  // namespace

class TestExplorer : public QObject {
  Q_OBJECT
  QTemporaryDir m_db;
 private slots:
  void initTestCase() {
    qputenv("SHARDSCOPE_ENGINE", SHARDSCOPE_ENGINE_BIN);
    qputenv("SHARDSCOPE_DB", m_db.filePath("sessions.db").toUtf8());  // never the user's own sessions
  }

  void liveRunThenReplayGiveTheSameData() {
    QTemporaryDir dir;
    const QString stream = dir.filePath("run.jsonl");
    EngineClient live;
    Collected a;
    QVERIFY(drive(live, a, [&] {
      live.start({"launch", "--model", "tiny-llama", "--strategy", "tp", "--devices", "2", "--prompt-len", "16",
                  "--decode", "4", "--events", "-"});
    }));
    QCOMPARE(a.outcome.exitCode, 0);
    QCOMPARE(a.outcome.status, QStringLiteral("ok"));
    QVERIFY(a.rejected.isEmpty());
    QCOMPARE(int(a.data.ranks().size()), 2);
    for (auto& [rank, d] : a.data.ranks()) {
      QVERIFY(!d.spans.empty());
      QVERIFY(!d.mem.empty());
      QVERIFY(!d.placements.empty());
      QCOMPARE(d.device.kind, std::string("cpu"));
    }
    QCOMPARE(QString::fromStdString(a.data.config().value("strategy", "")), QStringLiteral("tp"));

    // The same run recorded to a file and replayed: the same records.
    QProcess p;
    p.start(SHARDSCOPE_ENGINE_BIN, {"launch", "--model", "tiny-llama", "--strategy", "tp", "--devices", "2",
                                    "--prompt-len", "16", "--decode", "4", "--events", stream});
    QVERIFY(p.waitForFinished(120000));
    EngineClient replay;
    Collected b;
    QVERIFY(drive(replay, b, [&] { replay.openFile(stream); }));
    QCOMPARE(b.outcome.status, QStringLiteral("ok"));
    QCOMPARE(b.data.ranks().size(), a.data.ranks().size());
    for (auto& [rank, d] : a.data.ranks()) {
      const RankData& e = b.data.ranks().at(rank);
      QCOMPARE(e.spans.size(), d.spans.size());
      QCOMPARE(e.placements.size(), d.placements.size());
      for (size_t i = 0; i < d.spans.size(); ++i) {
        QCOMPARE(e.spans[i].op, d.spans[i].op);
        QCOMPARE(e.spans[i].site, d.spans[i].site);
      }
    }
  }

  void workerThatCannotStart() {
    qputenv("SHARDSCOPE_ENGINE", "/nonexistent/shardscope-engine");
    EngineClient client;
    Collected c;
    QVERIFY(drive(client, c, [&] { client.start({"run", "--model", "tiny-llama", "--prompt-len", "4"}); }));
    qputenv("SHARDSCOPE_ENGINE", SHARDSCOPE_ENGINE_BIN);
    QVERIFY(c.outcome.crashed);
    QVERIFY2(c.outcome.message.contains(QStringLiteral("could not start")), qPrintable(c.outcome.message));
  }

  void workerThatFailsKeepsWhatArrivedAndSaysWhy() {
    EngineClient client;
    Collected c;
    QVERIFY(drive(client, c, [&] {
      client.start({"run", "--model", "tiny-llama", "--prompt-len", "64", "--capacity", "150KiB"});
    }));
    QCOMPARE(c.outcome.exitCode, 3);
    QCOMPARE(c.outcome.status, QStringLiteral("oom"));
    QVERIFY(!c.outcome.stderrTail.isEmpty());
    QVERIFY(c.outcome.message.contains(QStringLiteral("out of memory")));
    QCOMPARE(int(c.data.errors().size()), 1);
    QCOMPARE(c.data.errors().front().code, std::string("oom"));
    QVERIFY(!c.data.ranks().empty());  // what arrived before the failure is kept
  }

  void killedWorkerIsReported() {
    EngineClient client;
    Collected c;
    QVERIFY(drive(client, c, [&] {
      // A seed no other suite uses, so the kill reaches only this worker.
      client.start({"run", "--model", "small-llama", "--prompt-len", "512", "--decode", "200", "--seed", "914207"});
      QTimer::singleShot(1500, [] { QProcess::execute("pkill", {"-KILL", "-f", "seed 914207"}); });
    }));
    QVERIFY(c.outcome.crashed);
    QCOMPARE(c.outcome.status, QStringLiteral("failed"));
  }

  void unreadableLinesAreCountedNotFatal() {
    QTemporaryDir dir;
    QFile f(dir.filePath("bad.jsonl"));
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("{\"type\":\"hello\",\"protocol\":\"shardscope-events\",\"version\":1}\n");
    f.write("not json\n{\"type\":\"span\"}\n\xff\xfe\n");
    f.write("{\"type\":\"metric\",\"name\":\"ttft_ms\",\"value\":1.5}\n");
    f.close();
    EngineClient client;
    Collected c;
    QVERIFY(drive(client, c, [&] { client.openFile(f.fileName()); }));
    QCOMPARE(c.outcome.rejected, qint64(3));
    QCOMPARE(c.data.metrics().at("ttft_ms"), 1.5);
  }

  // A training run on simulated devices carries no loss (its devices hold
  // shapes, not values): the Training page and the Summary say so rather
  // than draw its zeros as a loss curve.
  void simulatedTrainingClaimsNoLoss() {
    for (const char* backend : {"sim", "cpu"}) {
      RunData data;
      std::vector<ss::proto::Event> events;
      events.push_back(ss::proto::Config{{{"mode", "train"}, {"backend", backend}, {"training", {{"steps", 2}}}}});
      for (int step : {1, 2}) {
        ss::proto::TrainStep t;
        t.step = step;
        t.loss = std::string(backend) == "sim" ? 0.0 : 5.5 - step;
        t.lr = 1e-3;
        t.tokens_per_s = 1000;
        events.push_back(t);
      }
      data.add(events);
      TrainingPage page(data);
      page.refresh();
      const bool sim = std::string(backend) == "sim";
      QVERIFY2(page.caption().contains("simulated devices: no loss") == sim, qPrintable(page.caption()));
      QVERIFY2(page.caption().contains("loss 3.5000 (from 4.5000)") == !sim, qPrintable(page.caption()));
      QVERIFY2(trainingSummaryHtml(data).contains("not computed") == sim, qPrintable(trainingSummaryHtml(data)));
      const auto plots = page.findChildren<QCustomPlot*>();
      QCOMPARE(plots.size(), 2);
      QCOMPARE(plots[0]->isHidden(), sim);  // the loss curve
      QCOMPARE(plots[0]->graph(0)->dataCount(), sim ? 0 : 2);
    }
  }

  void setupIsCheckedAsTyped() {
    MainWindow w;
    w.setSetup("tiny-llama", "cpu", "tp", 4, 24, 4);  // 2 kv heads do not split over 4 devices
    QTRY_VERIFY_WITH_TIMEOUT(!w.checking(), 20000);
    QVERIFY(!w.setupValid());
    QVERIFY2(w.verdictText().contains(QStringLiteral("num_key_value_heads 2")), qPrintable(w.verdictText()));
    w.setSetup("tiny-llama", "cpu", "tp", 2, 24, 4);
    QTRY_VERIFY_WITH_TIMEOUT(!w.checking(), 20000);
    QVERIFY2(w.setupValid(), qPrintable(w.verdictText()));
    // A check that outlasts its budget still lets the run start, and says
    // that its memory was not forecast.
    w.setForecastBudget(0.01);
    w.setSetup("llama2-7b", "sim:mi300x", "tsp", 8, 131072, 3);
    QTRY_VERIFY_WITH_TIMEOUT(!w.checking(), 20000);
    QVERIFY2(w.setupValid(), qPrintable(w.verdictText()));
    QVERIFY2(w.verdictText().contains(QStringLiteral("its memory was not forecast, simulating this run takes over 0.01 s")),
             qPrintable(w.verdictText()));
    // Its forecast takes 0.4 s in the plain build and may pass the explorer's
    // 5 s under ASan on a busy machine; what is read here is the forecast.
    w.setForecastBudget(120);
    w.setSetup("llama2-7b", "sim:mi300x", "tsp", 8, 131072, 4);
    QTRY_VERIFY_WITH_TIMEOUT(!w.checking(), 150000);
    w.setForecastBudget(5);
    QVERIFY2(w.setupValid(), qPrintable(w.verdictText()));
    QVERIFY2(w.verdictText().contains(QStringLiteral("of its 192.00 GiB (profile mi300x)")), qPrintable(w.verdictText()));
    w.resize(1400, 820);
    w.grab().save(QDir::temp().filePath("shardscope-setup-ready.png"));
    w.setSetup("tiny-mamba2", "cpu", "sp", 4, 20, 4);  // 20 tokens do not split into 8 zigzag chunks
    QTRY_VERIFY_WITH_TIMEOUT(!w.checking(), 20000);
    QVERIFY(!w.setupValid());
    // Named as the form names it: the field that sets --prompt-len.
    QVERIFY2(w.verdictText().contains(QStringLiteral("<b>Prompt tokens</b> 20 does not split")), qPrintable(w.verdictText()));
    // A mistyped dimension is named with the field it most likely meant.
    w.setSetup("tiny-mamba2", "cpu", "sp", 2, 32, 4);
    w.setOptions(1, "hidden_size=128, headdim=32", "fp32", "");
    QTRY_VERIFY_WITH_TIMEOUT(!w.checking(), 20000);
    QVERIFY(!w.setupValid());
    QVERIFY2(w.verdictText().contains(QStringLiteral("<b>Dimensions</b> 'headdim=32'")) &&
                 w.verdictText().contains(QStringLiteral("did you mean 'head_dim'")),
             qPrintable(w.verdictText()));
    w.resize(1400, 820);
    w.grab().save(QDir::temp().filePath("shardscope-setup-mistyped.png"));
    w.setOptions(1, "hidden_size=128, head_dim=32", "fp32", "");
    QTRY_VERIFY_WITH_TIMEOUT(!w.checking(), 20000);
    QVERIFY2(w.setupValid(), qPrintable(w.verdictText()));
    // The check simulates the run's memory: the fullest device's peak against
    // its capacity. A run that would run out is said to, and may still be
    // started, to watch where.
    QVERIFY2(w.verdictText().contains(QStringLiteral("ready to run</span>: rank 0 peaks at")), qPrintable(w.verdictText()));
    w.setOptions(1, "hidden_size=128, head_dim=32", "fp32", "100KiB");
    QTRY_VERIFY_WITH_TIMEOUT(!w.checking(), 20000);
    QVERIFY2(w.setupValid(), qPrintable(w.verdictText()));
    QVERIFY2(w.verdictText().contains(QStringLiteral("would run out of memory")) &&
                 w.verdictText().contains(QStringLiteral("more than its 100.00 KiB (<b>Capacity per device</b>)")) &&
                 w.verdictText().contains(QStringLiteral("the Scaling sweep (on a simulated backend) shows which strategies fit")),
             qPrintable(w.verdictText()));
    w.grab().save(QDir::temp().filePath("shardscope-setup-oom.png"));
  }

  // Regression: a window closed while its setup check ran left the check's
  // QProcess running (Qt warned "Destroyed while process is still running")
  // and its finished handler could run on the half-destroyed window. The
  // window now stops and disconnects its processes first.
  void windowClosedWhileChecking() {
    static QStringList warnings;
    warnings.clear();
    const QtMessageHandler previous = qInstallMessageHandler([](QtMsgType, const QMessageLogContext&, const QString& m) {
      warnings << m;
    });
    // An engine whose check takes its time.
    QTemporaryDir dir;
    const QString slow = dir.filePath("slow-engine");
    {
      QFile f(slow);
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write("#!/bin/sh\nsleep 20\n");
    }
    QFile::setPermissions(slow, QFile::ReadOwner | QFile::WriteOwner | QFile::ExeOwner);
    const QByteArray engine = qgetenv("SHARDSCOPE_ENGINE");
    qputenv("SHARDSCOPE_ENGINE", slow.toUtf8());
    bool wasChecking = false;
    {
      MainWindow w;
      w.setSetup("tiny-llama", "cpu", "tp", 2, 24, 4);
      QTest::qWait(600);  // the check's delay has passed: its process runs
      wasChecking = w.checking();
    }
    QTest::qWait(200);
    if (engine.isEmpty()) qunsetenv("SHARDSCOPE_ENGINE");
    else qputenv("SHARDSCOPE_ENGINE", engine);
    qInstallMessageHandler(previous);
    QVERIFY(wasChecking);
    for (const QString& m : warnings)
      QVERIFY2(!m.contains(QStringLiteral("still running")), qPrintable(m));
  }

  // The first screen: the window opens on Start with its three examples;
  // every page says what it will show while it is empty; one click sets up
  // the form and runs the example, and the pages it fills drop their notice.
  void firstScreenTeaches() {
    MainWindow w;
    w.resize(1500, 950);
    w.show();
    QCOMPARE(w.pages()->tabText(w.pages()->currentIndex()), QStringLiteral("Start"));
    auto* start = w.findChild<StartPage*>();
    QVERIFY(start);
    const auto buttons = start->findChildren<QCommandLinkButton*>();
    QCOMPARE(buttons.size(), 3);
    auto notice = [](QWidget* page) { return page->findChild<PageNotice*>(QString(), Qt::FindDirectChildrenOnly); };
    auto shown = [&](QWidget* page) { return notice(page) && notice(page)->isVisibleTo(page); };
    QStringList explained;
    for (int i = 0; i < w.pages()->count(); ++i) {
      QWidget* page = w.pages()->widget(i);
      const QString name = w.pages()->tabText(i);
      if (name == QLatin1String("Start") || name == QLatin1String("Sessions")) continue;
      QVERIFY2(shown(page) && notice(page)->text().size() > 100,
               qPrintable(name + (notice(page) ? QString(" notice, %1 characters, shown %2").arg(notice(page)->text().size()).arg(shown(page)) : QString(" no notice"))));
      explained << name;
    }
    QCOMPARE(explained.size(), 7);
    w.pages()->setCurrentIndex(w.pages()->indexOf(w.findChild<MemoryPage*>()));
    QApplication::processEvents();
    w.grab().save(QDir::temp().filePath("shardscope-empty-memory.png"));

    // A run refused before it starts says why where "no run yet" was.
    QSignalSpy done(&w, &MainWindow::runFinished);
    w.setSetup("tiny-llama", "cpu", "tp", 4, 24, 4);  // 2 kv heads do not split over 4 devices
    w.runOnce();
    QVERIFY(done.wait(60000));
    QVERIFY(!shown(w.findChild<SummaryPage*>()));
    QVERIFY2(w.summaryText().contains(QStringLiteral("num_key_value_heads")), qPrintable(w.summaryText()));
    QCOMPARE(w.pages()->currentWidget(), static_cast<QWidget*>(w.findChild<SummaryPage*>()));
    done.clear();

    // An int8 all-reduce on the text model: a sweep against fp32, on the Quantization page.
    // The sanitizer legs check the two CPU examples' setups and stop their
    // runs at once: the engine runs they start are the plain leg's (and the
    // pages they fill are driven under ASan by the sweep and training tests).
    const bool sanitized = qEnvironmentVariableIsSet("SHARDSCOPE_SANITIZER_LEG");
    buttons[1]->click();
    const QStringList a = w.engineArguments();
    QVERIFY2(a.contains("brown-llama") && a.contains("The jury said that") && a.contains("tp"), qPrintable(a.join(' ')));
    if (sanitized) w.client()->stop();
    QVERIFY(done.wait(240000));
    if (!sanitized) {
      auto* quant = w.findChild<QuantizationPage*>();
      QCOMPARE(w.pages()->currentWidget(), static_cast<QWidget*>(quant));
      QVERIFY(quant->points() >= 3);
      QVERIFY(!shown(quant));
      w.grab().save(QDir::temp().filePath("shardscope-example-int8.png"));
    }

    // TP against TSP at 32K on a simulated node: two runs, then the comparison
    // (under a sanitizer, the setup; tpVersusTspSideBySide drives the
    // comparison there on a small run: these two stream 60 MB of spans).
    QSignalSpy compared(&w, &MainWindow::compareShown);
    buttons[0]->click();
    if (sanitized) {
      const QStringList c = w.engineArguments();
      QVERIFY2(c.contains("simulate") && c.contains("llama2-7b") && c.contains("32768") && c.contains("mi300x") &&
                   c.contains("tp") && c.contains("bf16"),
               qPrintable(c.join(' ')));
      done.clear();
      w.client()->stop();
      QVERIFY(done.wait(240000));
      QCOMPARE(compared.size(), 0);  // stopped: no second run, nothing to compare
    } else {
      QVERIFY(compared.wait(240000));
      QVERIFY2(w.data().status() == QLatin1String("ok"),
               qPrintable(w.data().status() + ": " +
                          (w.data().errors().empty() ? QString() : QString::fromStdString(w.data().errors().front().message))));
      QVERIFY(!shown(w.findChild<SummaryPage*>()));
      QVERIFY(!shown(w.findChild<MemoryPage*>()));
      QVERIFY(!shown(w.findChild<TimelineView*>()));
      QVERIFY(shown(w.findChild<TrainingPage*>()));  // an inference run leaves it empty
    }

    // Training steps under tsp: the Training page fills in.
    done.clear();
    buttons[2]->click();
    QVERIFY(w.training());
    const QStringList t = w.engineArguments();
    QVERIFY2(t.contains("train") && t.contains("tsp") && t.contains("brown-llama"), qPrintable(t.join(' ')));
    if (sanitized) {
      w.client()->stop();
      QVERIFY(done.wait(240000));
      return;
    }
    QVERIFY(done.wait(240000));
    QCOMPARE(done.takeFirst().at(0).value<RunOutcome>().exitCode, 0);
    QCOMPARE(int(w.data().trainSteps().size()), 8);
    QVERIFY(!shown(w.findChild<TrainingPage*>()));
    w.grab().save(QDir::temp().filePath("shardscope-example-train.png"));
  }

  // The window opens on the shipped text model with a typed prompt; a
  // preset of synthetic weights has no tokenizer, so its prompt is a length
  // and the text field is off. The engine's check accepts both.
  void promptAsTextWhereTheModelReadsText() {
    MainWindow w;
    QStringList a = w.engineArguments();
    QVERIFY2(a.contains("--prompt") && a.contains("The jury said that") && !a.contains("--prompt-len"),
             qPrintable(a.join(' ')));
    QVERIFY2(a.contains("brown-llama"), qPrintable(a.join(' ')));
    QTRY_VERIFY_WITH_TIMEOUT(!w.checking(), 20000);
    QVERIFY2(w.setupValid(), qPrintable(w.verdictText()));
    w.setSetup("tiny-llama", "cpu", "tp", 2, 24, 4);
    a = w.engineArguments();
    QVERIFY2(!a.contains("--prompt") && a.contains("--prompt-len"), qPrintable(a.join(' ')));
    QTRY_VERIFY_WITH_TIMEOUT(!w.checking(), 20000);
    QVERIFY2(w.setupValid(), qPrintable(w.verdictText()));
  }

  // The number format follows the backend (bf16 on simulated GPUs, fp32 on
  // CPU devices) until the person picks one; the Summary names it.
  void dtypeFollowsTheBackend() {
    MainWindow w;
    auto dtype = [&] {
      const QStringList a = w.engineArguments();
      const qsizetype i = a.indexOf("--dtype");
      return i >= 0 && i + 1 < a.size() ? a[i + 1] : QString();
    };
    QCOMPARE(dtype(), QStringLiteral("fp32"));
    w.setSetup("llama2-7b", "sim:h100-sxm", "tp", 8, 1024, 2);
    QCOMPARE(dtype(), QStringLiteral("bf16"));
    w.setSetup("tiny-llama", "cpu", "tp", 2, 24, 2);
    QCOMPARE(dtype(), QStringLiteral("fp32"));
    EngineClient client;
    Collected c;
    QVERIFY(drive(client, c, [&] {
      client.start({"simulate", "--hardware", "h100-sxm", "--model", "llama2-7b", "--prompt-len", "512", "--decode", "1",
                    "--dtype", "bf16", "--events", "-"});
    }));
    QCOMPARE(c.outcome.exitCode, 0);
    SummaryPage page(c.data);
    page.refresh();
    const QString text = page.text();
    QVERIFY2(text.contains(QStringLiteral("· bf16")), qPrintable(text.left(300)));
    QVERIFY2(text.contains(QStringLiteral("x 2 bytes")), qPrintable(text));
  }

  // A cuda run's summary names its GPU, and where its ranks shared one (their
  // collectives MPI's through host memory) says that its communication times
  // are not NCCL's; a run over NCCL says nothing of the kind.
  void summaryOfACudaRun() {
    for (const std::string collectives : {"mpi through host memory (ranks share a GPU)", "nccl"}) {
      RunData data;
      data.add(std::vector<ss::proto::Event>{
          ss::proto::Hello{},
          ss::proto::Config{{{"model", {{"name", "tiny-llama"}}},
                             {"strategy", "tp"},
                             {"devices", 2},
                             {"backend", "cuda"},
                             {"gpu", {{"name", "NVIDIA H200"}, {"ranks_per_gpu", 2}, {"collectives", collectives}}}}}});
      SummaryPage page(data);
      page.refresh();
      const QString text = page.text();
      QVERIFY2(text.contains(QStringLiteral("cuda (NVIDIA H200)")), qPrintable(text));
      QCOMPARE(text.contains(QStringLiteral("not NCCL's")), collectives != "nccl");
    }
  }

  // The summary's textbook expectation of bytes sent per attention layer
  // equals what the engine measured, for every strategy that communicates.
  void summaryExpectationMatchesMeasuredBytes_data() {
    QTest::addColumn<QStringList>("setup");
    QTest::newRow("tp") << QStringList{"--strategy", "tp", "--devices", "2"};
    QTest::newRow("sp") << QStringList{"--strategy", "sp", "--devices", "4"};
    QTest::newRow("tp_sp") << QStringList{"--strategy", "tp_sp", "--devices", "4", "--mesh", "2x2"};
    QTest::newRow("tsp") << QStringList{"--strategy", "tsp", "--devices", "2"};
    QTest::newRow("hybrid tp") << QStringList{"--strategy", "tp", "--devices", "2", "--model", "tiny-hybrid"};
    // In bf16 partial sums, K/V and weight shards travel at 2 bytes a value.
    QTest::newRow("tp bf16") << QStringList{"--strategy", "tp", "--devices", "2", "--dtype", "bf16"};
    QTest::newRow("sp bf16") << QStringList{"--strategy", "sp", "--devices", "4", "--dtype", "bf16"};
    QTest::newRow("tsp bf16") << QStringList{"--strategy", "tsp", "--devices", "2", "--dtype", "bf16"};
    QTest::newRow("tp_sp bf16, fp32 cache")
        << QStringList{"--strategy", "tp_sp", "--devices", "4", "--mesh", "2x2", "--dtype", "bf16", "--kv-dtype", "fp32"};
  }
  void summaryExpectationMatchesMeasuredBytes() {
    QFETCH(QStringList, setup);
    EngineClient client;
    Collected c;
    QStringList args = {"launch", "--prompt-len", "24", "--decode", "2", "--events", "-"};
    if (!setup.contains("--model")) args << "--model" << "tiny-llama";
    QVERIFY(drive(client, c, [&] { client.start(args + setup); }));
    QCOMPARE(c.outcome.exitCode, 0);
    SummaryPage page(c.data);
    page.refresh();
    const QString text = page.text();
    const QRegularExpression row(QStringLiteral("bytes sent, attention layer \\d+, prefill\\s+(\\S+ \\S+)\\s+(\\S+ \\S+)"));
    const auto m = row.match(text);
    QVERIFY2(m.hasMatch(), qPrintable(text));
    QVERIFY2(m.captured(1) != "0 B", qPrintable(text));
    QCOMPARE(m.captured(2), m.captured(1));  // measured == expected
  }

  void tpVersusTspSideBySide() {
    MainWindow w;
    w.setSetup("tiny-llama", "cpu", "tp", 2, 16, 4);
    QSignalSpy done(&w, &MainWindow::runFinished);
    w.compareTpTsp();
    QVERIFY(done.wait(180000));
    ComparePage* compare = nullptr;
    for (QWidget* top : QApplication::topLevelWidgets())
      if (auto* page = top->findChild<ComparePage*>()) compare = page;
    QVERIFY(compare);
    QCOMPARE(compare->runs(), 2);
    const QString table = compare->tableText();
    QVERIFY2(table.contains(QStringLiteral("A · tp")) && table.contains(QStringLiteral("B · tsp")), qPrintable(table));
    QVERIFY2(table.contains(QStringLiteral("(×")), qPrintable(table));  // ratios against tp
    compare->window()->close();
  }

  // A memory axis labels every tick in one unit, the unit of its step, and
  // each label reads back as its tick.
  void bytesAxisSpeaksOneUnit_data() {
    QTest::addColumn<double>("top");
    QTest::newRow("2.1 GiB") << 2.1 * (1 << 30);
    QTest::newRow("3.5 MiB") << 3.5 * (1 << 20);
    QTest::newRow("900 KiB") << 900.0 * 1024;
    QTest::newRow("5 KiB") << 5000.0;
  }
  void bytesAxisSpeaksOneUnit() {
    QFETCH(double, top);
    const QSharedPointer<QCPAxisTicker> ticker = bytesTicker();
    QVector<double> ticks, subTicks;
    QVector<QString> labels;
    ticker->generate(QCPRange(0, top), QLocale::c(), 'g', 3, ticks, &subTicks, &labels);
    QVERIFY(ticks.size() >= 3);
    const QString unit = labels.first().section(' ', 1);
    const std::map<QString, double> scale = {{"B", 1}, {"KiB", 1024}, {"MiB", 1 << 20}, {"GiB", 1 << 30}};
    QVERIFY2(scale.count(unit), qPrintable(labels.first()));
    for (int i = 0; i < ticks.size(); ++i) {
      QCOMPARE(labels[i].section(' ', 1), unit);
      QCOMPARE(labels[i].section(' ', 0, 0).toDouble() * scale.at(unit), ticks[i]);
    }
  }

  // Every op a training run records draws in a colour of its own on its
  // lane (backward kernels were hashed into 8 colours, several alike).
  void trainingOpsHaveTheirOwnColours() {
    std::map<std::pair<std::string, bool>, int> ops;
    for (const char* model : {"tiny-llama", "tiny-hybrid", "tiny-mamba"}) {
      QProcess p;
      p.start(SHARDSCOPE_ENGINE_BIN, {"train", "--model", model, "--strategy", "tsp", "--devices", "2", "--seq-len",
                                      "16", "--steps", "1", "--events", "-"});
      QVERIFY(p.waitForFinished(120000));
      QCOMPARE(p.exitCode(), 0);
      for (const QByteArray& line : p.readAllStandardOutput().split('\n')) {
        const QJsonObject o = QJsonDocument::fromJson(line).object();
        if (o.value("type").toString() == "span")
          ops[{o.value("op").toString().toStdString(), o.value("stream").toString() == "comm"}] = 0;
      }
    }
    QVERIFY(ops.size() > 20);
    std::map<std::pair<QRgb, bool>, std::string> seen;
    for (const auto& [op, n] : ops) {
      const auto [it, fresh] = seen.emplace(std::make_pair(opColor(op.first, op.second).rgb(), op.second), op.first);
      QVERIFY2(fresh, qPrintable(QString::fromStdString(op.first + " draws as " + it->second + " does")));
    }
  }

  // A stream without spans (a sweep, verify) paints its timeline once, not
  // forever: an empty range used to reset itself and ask for another paint.
  void timelineWithoutSpansIsPaintedOnce() {
    RunData data;
    data.add(handWritten("tp", 2, {ss::proto::Done{"ok", 5, 0}}));
    TimelineView view(data);
    view.resize(800, 300);
    view.show();
    QVERIFY(QTest::qWaitForWindowExposed(&view));
    struct Counter : QObject {
      int paints = 0;
      bool eventFilter(QObject*, QEvent* e) override {
        paints += e->type() == QEvent::Paint;
        return false;
      }
    } counter;
    view.installEventFilter(&counter);
    view.update();
    QTest::qWait(400);
    QVERIFY2(counter.paints >= 1 && counter.paints <= 3, qPrintable(QString::number(counter.paints)));
  }

  // A phase begins before its first span (the rank sets it, then issues the
  // kernels): at the default zoom its mark is in view at the lanes' left
  // edge, named, not cut off before it.
  void timelineShowsThePhaseBeforeItsFirstSpan() {
    RunData data;
    auto span = [](const char* op, int64_t t0, int64_t t1) {
      ss::proto::Span s;
      s.op = op;
      s.t0 = t0;
      s.t1 = t1;
      return s;
    };
    data.add(handWritten("single", 1,
                         {ss::proto::Phase{"load", 0}, ss::proto::Phase{"prefill", 1000}, span("gemm", 1500, 40000),
                          ss::proto::Phase{"decode", 50000}, span("gemm", 50500, 90000),
                          ss::proto::Done{"ok", 100000, 0}}));
    TimelineView view(data);
    view.resize(900, view.lanesHeight());
    view.resetZoom();
    const QFontMetrics fm(view.font());
    const auto marks = view.phaseMarks(fm);
    QCOMPARE(int(marks.size()), 2);
    QCOMPARE(marks[0].label, QStringLiteral("prefill"));
    QCOMPARE(marks[1].label, QStringLiteral("decode"));
    QVERIFY(marks[0].x < marks[1].x);
  }

  // The memory page's peak label stays inside the plot wherever the peak
  // falls (the first sample, near either edge, the last sample), in its long
  // form too (an out-of-memory run), on a window's width and a narrow one.
  void memoryPeakLabelStaysInsideThePlot() {
    for (const bool oom : {false, true})
      for (const int width : {900, 420})
        for (const int at : {0, 3, 10, 16, 19}) {
          RunData data;
          std::vector<ss::proto::Event> events = handWritten("single", 1, {ss::proto::Device{0, "cpu", "host", 0, "here"}});
          for (int i = 0; i < 20; ++i) {
            ss::proto::Mem m;
            m.t = 1000 * (i + 1);
            m.bytes[0] = int64_t(1) << 30;
            m.bytes[1] = (i == at ? 900 : 100 + 10 * i) * (int64_t(1) << 20);
            events.push_back(m);
          }
          if (oom) events.push_back(ss::proto::Error{"oom", 0, "out of memory", {}});
          events.push_back(ss::proto::Done{oom ? "oom" : "ok", 21000, 0});
          data.add(events);
          MemoryPage page(data);
          page.resize(width, 600);
          page.show();
          page.refresh();
          auto* plot = page.findChildren<QCustomPlot*>().first();
          plot->replot();
          QCPItemText* label = nullptr;
          for (int i = 0; i < plot->itemCount(); ++i)
            if (auto* t = qobject_cast<QCPItemText*>(plot->item(i)); t && t->text().startsWith("peak")) label = t;
          const QString row = QString("peak at sample %1, %2 px%3").arg(at).arg(width).arg(oom ? ", out of memory" : "");
          QVERIFY2(label, qPrintable(row));
          QVERIFY2(label->text().contains("out of memory") == oom, qPrintable(row + ": " + label->text()));
          const QRect inside = plot->axisRect()->rect();
          const QRectF drawn(label->topLeft->pixelPosition(), label->bottomRight->pixelPosition());
          QVERIFY2(inside.contains(drawn.toAlignedRect()),
                   qPrintable(QString("%1: the label spans x %2..%3, y %4..%5; the plot x %6..%7, y %8..%9")
                                  .arg(row)
                                  .arg(drawn.left())
                                  .arg(drawn.right())
                                  .arg(drawn.top())
                                  .arg(drawn.bottom())
                                  .arg(inside.left())
                                  .arg(inside.right())
                                  .arg(inside.top())
                                  .arg(inside.bottom())));
        }
  }

  // "Check against one device": verify's two runs, their logits row by row
  // on the Summary page, kept as a session; a quantized all-reduce differs.
  void checkAgainstOneDevice() {
    MainWindow w;
    w.resize(1400, 820);
    w.show();
    w.setSetup("tiny-llama", "sim:mi300x", "tp", 2, 24, 4);
    QVERIFY(!w.canVerify());  // simulated devices compute no values
    w.setSetup("tiny-llama", "cpu", "single", 1, 24, 4);
    QVERIFY(!w.canVerify());  // nothing to set against one device
    w.setSetup("tiny-llama", "cpu", "tsp", 2, 24, 4);
    QVERIFY(w.canVerify());
    QCOMPARE(verdictOf(w), 0);
    QString summary = w.summaryText();
    for (const char* said : {"tsp on 2 cpu devices against one cpu device", "It computes what one device computes",
                             "prefill", "decode", "Top-1 token: the same in 100.0% of rows"})
      QVERIFY2(summary.contains(QString::fromUtf8(said)), qPrintable(summary));
    w.pages()->currentWidget()->grab().save(QDir::temp().filePath("shardscope-verify.png"));
    // int4 all-reduces change what tp computes: past the bound, and said so.
    w.setSetup("tiny-llama", "cpu", "tp", 2, 24, 4);
    w.setOptions(1, QString(), QStringLiteral("int4:32"), QString());
    QCOMPARE(verdictOf(w), 1);
    summary = w.summaryText();
    QVERIFY2(summary.contains(QStringLiteral("with --comm-precision int4:32 is")) &&
                 summary.contains(QStringLiteral("past the bound")) && !summary.contains(QStringLiteral("It computes")),
             qPrintable(summary));
    w.pages()->currentWidget()->grab().save(QDir::temp().filePath("shardscope-verify-differs.png"));
  }

  // In Training mode the same button checks a training step: one step of the
  // setup against the same step on one cpu device, tensor by tensor.
  void checkATrainingStepAgainstOneDevice() {
    MainWindow w;
    w.resize(1400, 820);
    w.show();
    w.setSetup("tiny-mamba2", "cpu", "tsp", 2, 24, 4);
    w.setTraining(true, 32, 1, 20, "none");
    QVERIFY(w.canVerify());
    QCOMPARE(verdictOf(w), 0);
    const QString summary = w.summaryText();
    for (const char* said : {"tsp on 2 cpu devices trains against one cpu device", "1 step.",
                             "It trains as one device does", "Step 1: the loss is", "0 of 21 tensors past their bound",
                             "backbone.layers."})
      QVERIFY2(summary.contains(QString::fromUtf8(said)), qPrintable(summary));
    w.pages()->currentWidget()->grab().save(QDir::temp().filePath("shardscope-verify-train.png"));
    w.setSetup("tiny-mamba2", "sim:mi300x", "tsp", 2, 24, 4);
    QVERIFY(!w.canVerify());  // simulated devices compute no gradients
  }

  // A setup neither strategy can split opens no comparison: it stops at the
  // first run refused before it started, and says which and why.
  void tpVersusTspOfASetupThatCannotRun() {
    MainWindow w;
    w.setSetup("tiny-llama", "cpu", "tp", 2, 16, 2);
    w.setOptions(1, QStringLiteral("num_attention_heads=3"), QStringLiteral("fp32"), QString());
    QSignalSpy done(&w, &MainWindow::runFinished);
    w.compareTpTsp();
    QVERIFY(done.wait(60000));
    QCOMPARE(done.size(), 1);
    QVERIFY2(w.statusText().startsWith(QStringLiteral("TP vs TSP: tp cannot run this setup")) &&
                 w.statusText().contains(QStringLiteral("num_attention_heads")),
             qPrintable(w.statusText()));
    QTest::qWait(300);
    QCOMPARE(done.size(), 1);  // tsp was not started
    QVERIFY(!w.client()->isRunning());
    for (QWidget* top : QApplication::topLevelWidgets()) QVERIFY(!top->findChild<ComparePage*>());
  }

  // With a capacity between tsp's peak and tp's, tp runs out of memory and
  // tsp fits; the comparison says so instead of stopping at the first.
  void tpRunsOutOfMemoryTspFits() {
    auto peak = [](const char* strategy) {
      QProcess p;
      p.start(SHARDSCOPE_ENGINE_BIN, {"launch", "--model", "tiny-llama", "--strategy", strategy, "--devices", "2",
                                      "--prompt-len", "4096", "--events", "-"});
      p.waitForFinished(120000);
      double best = 0;
      for (const QByteArray& line : p.readAllStandardOutput().split('\n')) {
        const QJsonObject o = QJsonDocument::fromJson(line).object();
        if (o.value("type") == "metric" && o.value("name") == "peak_bytes" && o.value("rank").toInt(-1) >= 0)
          best = std::max(best, o.value("value").toDouble());
      }
      return best;
    };
    const double tp = peak("tp"), tsp = peak("tsp");
    QVERIFY2(tsp > 0 && tp > tsp * 1.2, qPrintable(QString("tp %1, tsp %2").arg(tp).arg(tsp)));
    MainWindow w;
    w.setSetup("tiny-llama", "cpu", "tp", 2, 4096, 0);
    w.setOptions(1, "", "fp32", QString::number(qint64((tp + tsp) / 2)));
    QSignalSpy done(&w, &MainWindow::runFinished);
    w.compareTpTsp();
    QVERIFY(done.wait(180000));  // once, when the second run (tsp) has finished
    QCOMPARE(done.takeFirst().at(0).value<RunOutcome>().status, QStringLiteral("ok"));
    ComparePage* compare = nullptr;
    for (QWidget* top : QApplication::topLevelWidgets())
      if (auto* page = top->findChild<ComparePage*>()) compare = page;
    QVERIFY(compare);
    const QString table = compare->tableText();
    const QString result = table.section('\n', 1, 1);
    QVERIFY2(result.startsWith("result\tout of memory: ") && result.endsWith("\tdone"), qPrintable(table));
    compare->window()->close();
  }

  void sweepStreamFillsTheQuantizationPage() {
    QTemporaryDir dir;
    const QString stream = dir.filePath("sweep.jsonl");
    // Under a sanitizer one block size: 13 configurations instead of 21
    // (tst_sweep drives the sweep itself there); the page draws either alike.
    const QStringList blocks =
        qEnvironmentVariableIsSet("SHARDSCOPE_SANITIZER_LEG") ? QStringList{"128"} : QStringList{"32", "128"};
    QProcess p;
    p.start(SHARDSCOPE_ENGINE_BIN, {"sweep", "--model", "tiny-hybrid", "--strategy", "tp", "--devices", "2",
                                    "--prompt-len", "16", "--decode", "4", "--precisions", "bf16,int8,int4",
                                    "--blocks", blocks.join(','), "--events", stream});
    QVERIFY(p.waitForFinished(180000));
    QCOMPARE(p.exitCode(), 0);
    MainWindow w;
    w.resize(1400, 820);
    QSignalSpy done(w.client(), &EngineClient::finished);
    QVERIFY(w.openStream(stream));
    QVERIFY(done.wait(60000));
    auto* page = w.findChild<QuantizationPage*>();
    QVERIFY(page);
    w.pages()->setCurrentWidget(page);
    page->refresh();
    QApplication::processEvents();
    // The reference, a point per spec over all sites (bf16, int8 and int4 at
    // each block size: 5, or 3 under a sanitizer) and 3 sites x the specs.
    const int specs = 1 + 2 * int(blocks.size());
    QCOMPARE(page->points(), 1 + specs + 3 * specs);
    // Greedy tokens: a row per configuration, the reference first, and each
    // row's marked divergence is the step the sweep reported.
    QCOMPARE(page->tokenRows(), 1 + specs + 3 * specs);
    auto* table = page->findChild<QTableWidget*>();
    QVERIFY(table);
    std::map<QString, int> reported;
    const RunData& data = w.data();
    for (const auto& a : data.accuracy())
      if (a.metric == "first_divergence") reported[QString::fromStdString(a.config)] = int(a.value);
    QVERIFY(table->verticalHeaderItem(0)->text().endsWith("(reference)"));
    QCOMPARE(page->firstDivergence(0), -1);
    int diverging = 0;
    for (int r = 1; r < table->rowCount(); ++r) {
      const QString config = table->verticalHeaderItem(r)->text();
      QVERIFY2(reported.count(config), qPrintable(config));
      QCOMPARE(page->firstDivergence(r), reported[config]);
      diverging += page->firstDivergence(r) >= 0;
    }
    QVERIFY(diverging > 0);  // int4 changes some greedy choice on this tiny model
    page->grab().save(QDir::temp().filePath("shardscope-quantization.png"));
    // The Summary points at the page, rather than reading the sweep as a run of no devices.
    const QString summary = w.summaryText();
    QVERIFY2(summary.startsWith(QStringLiteral("Quantization sweep · tiny-hybrid")) &&
                 !summary.contains(QStringLiteral("on the wire")),
             qPrintable(summary));
  }

  // The Scaling sweep button runs `scale` on the setup's simulated hardware;
  // the page draws a line per strategy with its points, crosses out what
  // does not fit, hovering names a point's memory, double-clicking it runs
  // that configuration in full (whose peak is the point's), and the page
  // exports its points as CSV.
  void scalingSweepFillsTheScalingPage() {
    MainWindow w;
    w.resize(1500, 950);
    QCOMPARE(w.setSetup("tiny-llama", "sim:h100-sxm", "tp", 2, 16, 2), QString());
    w.setOptions(1, "", "fp32", "");
    QSignalSpy done(w.client(), &EngineClient::finished);
    w.runScaling();
    QVERIFY(done.wait(120000));
    QCOMPARE(done.takeFirst().at(0).value<RunOutcome>().exitCode, 0);
    ScalingPage* page = w.scalingPage();
    QCOMPARE(w.pages()->currentWidget(), page);
    page->refresh();
    QApplication::processEvents();
    const auto& points = w.data().scalePoints();
    QCOMPARE(points.size(), size_t(5 * 9));  // single, dp, tp, sp, tsp at 4K ... 1M
    QCOMPARE(page->lines(), 5);
    QCOMPARE(page->points(), 45);
    // A dp device holds what single's does: dp's line lies on single's, and
    // is dashed so that single's shows beneath it.
    {
      QCPGraph *single = nullptr, *dp = nullptr;
      for (int g = 0; g < page->memoryPlot()->graphCount(); ++g) {
        QCPGraph* graph = page->memoryPlot()->graph(g);
        if (graph->name() == "single") single = graph;
        if (graph->name() == "dp") dp = graph;
      }
      QVERIFY(single && dp && single->dataCount() == 9 && dp->dataCount() == 9);
      for (int k = 0; k < 9; ++k) QCOMPARE(dp->data()->at(k)->value, single->data()->at(k)->value);
      QCOMPARE(single->pen().style(), Qt::SolidLine);
      QCOMPARE(dp->pen().style(), Qt::DashLine);
      QCPGraph* tspLine = nullptr;
      for (int g = 0; g < page->memoryPlot()->graphCount(); ++g)
        if (page->memoryPlot()->graph(g)->name() == "tsp") tspLine = page->memoryPlot()->graph(g);
      QVERIFY(tspLine && tspLine->pen().style() == Qt::SolidLine);
    }
    // Every drawn point is found where it is drawn, and says what it holds.
    QCustomPlot* plot = page->memoryPlot();
    const ss::proto::ScalePoint* tsp = nullptr;
    for (auto& p : points)
      if (p.strategy == "tsp" && p.seq_len == 65536) tsp = &p;
    QVERIFY(tsp);
    // Where the tsp line draws the point (a redraw makes new graphs).
    auto pixel = [plot, tsp] {
      for (int g = 0; g < plot->graphCount(); ++g)
        if (plot->graph(g)->name() == "tsp") return plot->graph(g)->coordsToPixels(double(tsp->seq_len), double(tsp->peak_bytes));
      return QPointF(-100, -100);
    };
    const QPointF at = pixel();
    QCOMPARE(page->pointAt(plot, at), tsp);
    QVERIFY(ScalingPage::describe(*tsp).contains("activations"));
    // The tokens/s axis (logarithmic): 1, 2 and 5 of each decade, labelled
    // with K, M or G; evenly spaced ticks within one digit of a decade.
    {
      QCustomPlot* speed = page->speedPlot();
      const QCPRange drawn = speed->yAxis->range();
      auto labels = [speed](double lower, double upper) {
        speed->yAxis->setRange(lower, upper);
        speed->replot();
        const QVector<QString> ticks = speed->yAxis->tickVectorLabels();
        return QStringList(ticks.begin(), ticks.end());
      };
      QCOMPARE(labels(3e3, 8e6), (QStringList{"5K", "10K", "20K", "50K", "100K", "200K", "500K", "1M", "2M", "5M"}));
      QCOMPARE(labels(1.5e3, 9e3), (QStringList{"2K", "3K", "4K", "5K", "6K", "7K", "8K", "9K"}));
      QCOMPARE(labels(50, 2e11), (QStringList{"100", "1K", "10K", "100K", "1M", "10M", "100M", "1G", "10G", "100G"}));
      const QStringList narrow = labels(1.3e5, 1.7e5);
      QVERIFY2(narrow.size() >= 2, qPrintable(narrow.join(' ')));
      for (const QString& l : narrow) QVERIFY2(QRegularExpression("^1[3-7][0-9.]*K$").match(l).hasMatch(), qPrintable(l));
      speed->yAxis->setRange(drawn);
      speed->replot();
    }
    // The closed form: one dashed line more per strategy.
    const int graphs = plot->graphCount();
    page->findChild<QCheckBox*>()->setChecked(true);
    QCOMPARE(plot->graphCount(), graphs + 5);
    page->grab().save(QDir::temp().filePath("shardscope-scaling-closed-form.png"));
    QLabel tip(ScalingPage::describe(*tsp));
    tip.grab().save(QDir::temp().filePath("shardscope-scaling-tip.png"));
    // Double-click: the point as a whole simulated run, with the point's peak.
    const QStringList args = ScalingPage::runArguments(w.data().config(), *tsp);
    QCOMPARE(args.value(0), QString("simulate"));
    QVERIFY(args.contains("--prompt-len") && args.contains("65536"));
    const int64_t pointPeak = tsp->peak_bytes;
    const QPointF now = pixel();  // the axes moved
    QCOMPARE(page->pointAt(plot, now), tsp);
    QMouseEvent dbl(QEvent::MouseButtonDblClick, now, plot->mapToGlobal(now), Qt::LeftButton, Qt::LeftButton,
                    Qt::NoModifier);
    QApplication::sendEvent(plot, &dbl);
    QVERIFY(done.wait(120000));
    int64_t runPeak = 0;
    for (auto& [rank, d] : w.data().ranks()) runPeak = std::max(runPeak, int64_t(d.metrics.at("peak_bytes")));
    QCOMPARE(runPeak, pointPeak);
    QCOMPARE(w.pages()->currentWidget(), static_cast<QWidget*>(w.findChild<SummaryPage*>()));
  }

  // A stream written on the command line carries the command that wrote it
  // (a launched run's ranks record the user's command, not their own, and
  // not --events): opened, it puts that setup in the form, as a reopened
  // session does.
  void openedStreamSetsTheForm() {
    QTemporaryDir dir;
    const QString stream = dir.filePath("train.jsonl");
    const QStringList command{"train",     "--model",        "tiny-mamba2", "--strategy", "tsp",     "--devices",
                              "2",         "--seq-len",      "32",          "--micro-batch", "2",    "--steps",
                              "3",         "--dtype",        "bf16"};
    QProcess p;
    p.start(SHARDSCOPE_ENGINE_BIN, command + QStringList{"--events", stream});
    QVERIFY(p.waitForFinished(120000));
    QCOMPARE(p.exitCode(), 0);
    MainWindow w;
    QSignalSpy done(w.client(), &EngineClient::finished);
    QVERIFY(w.openStream(stream));
    QVERIFY(done.wait(60000));
    QStringList recorded;
    for (const auto& a : w.data().config().at("command")) recorded << QString::fromStdString(a.get<std::string>());
    QCOMPARE(recorded, command);
    const auto holds = [](const QStringList& form, const QStringList& options) {
      for (qsizetype i = 0; i + 1 < options.size(); i += 2) {
        const qsizetype at = form.indexOf(options[i]);
        if (at <= 0 || form.value(at + 1) != options[i + 1]) return options[i] + ": " + form.join(' ');
      }
      return QString();
    };
    QCOMPARE(w.engineArguments().value(0), QString("train"));
    QString wrong = holds(w.engineArguments(), command.mid(1));
    QVERIFY2(wrong.isEmpty(), qPrintable(wrong));
    QCOMPARE(w.engineArguments(), w.lastArguments());  // Run again runs it
    // A command that leaves options to the engine (no strategy, hardware or
    // dtype; --decode=2): the form takes them as the run resolved them, not
    // as the form held them (tsp, bf16, training).
    const QString second = dir.filePath("simulate.jsonl");
    p.start(SHARDSCOPE_ENGINE_BIN, {"simulate", "--model", "tiny-llama", "--prompt-len", "16", "--decode=2", "--events",
                                    second});
    QVERIFY(p.waitForFinished(120000));
    QCOMPARE(p.exitCode(), 0);
    QVERIFY(w.openStream(second));
    QVERIFY(done.wait(60000));
    const QStringList form = w.engineArguments();
    QCOMPARE(form.value(0), QString("simulate"));
    wrong = holds(form, {"--hardware", "h100-sxm", "--strategy", "single", "--dtype",
                         QString::fromStdString(w.data().config().at("dtype").get<std::string>()), "--prompt-len", "16",
                         "--decode", "2"});
    QVERIFY2(wrong.isEmpty(), qPrintable(wrong));
  }

  void scalingStreamExportsCsv() {
    QTemporaryDir dir;
    const QString stream = dir.filePath("scale.jsonl");
    QProcess p;
    p.start(SHARDSCOPE_ENGINE_BIN, {"scale", "--model", "tiny-llama", "--hardware", "h100-sxm", "--devices", "4",
                                    "--strategies", "tp,sp,tsp", "--seq-lens", "64,256", "--events", stream});
    QVERIFY(p.waitForFinished(120000));
    QCOMPARE(p.exitCode(), 0);
    MainWindow w;
    w.resize(1500, 950);
    QSignalSpy done(w.client(), &EngineClient::finished);
    QVERIFY(w.openStream(stream));
    QVERIFY(done.wait(60000));
    QCOMPARE(w.pages()->currentWidget(), w.scalingPage());  // a sweep opens on its page
    w.scalingPage()->refresh();
    // The Summary page says what this sweep covered (not the explorer's own sweep's 4K to 1M).
    QVERIFY2(w.summaryText().contains("tp, sp, tsp training on 4 simulated devices, at 64 to 256 tokens"),
             qPrintable(w.summaryText()));
    // tp cannot split tiny-llama's 2 KV heads over 4 devices, nor can tsp: said, not drawn.
    QCOMPARE(w.scalingPage()->lines(), 1);
    bool said = false;
    for (QLabel* l : w.scalingPage()->findChildren<QLabel*>()) said = said || l->text().contains("num_key_value_heads");
    QVERIFY(said);
    const QString csv = dir.filePath("scale.csv");
    QCOMPARE(w.exportView(csv), QString());
    QFile f(csv);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QStringList rows = QString::fromUtf8(f.readAll()).split('\n', Qt::SkipEmptyParts);
    QCOMPARE(rows.size(), 1 + 6);  // header, 3 strategies x 2 lengths
    QVERIFY(rows[0].startsWith("strategy,mesh,mode,seq_len"));
    for (const char* ext : {"png", "svg", "pdf"}) QCOMPARE(w.exportView(dir.filePath(QString("scale.") + ext)), QString());
    w.scalingPage()->grab().save(QDir::temp().filePath("shardscope-scaling.png"));
  }

  // Two sweeps saved as sessions compare as their Scaling pages side by side:
  // 8 devices on one node against 16 on two (tsp keeps its weights' traffic
  // inside a node; tp_sp 8x2 spans the network).
  void scalingSweepsCompare() {
    MainWindow w;
    QSignalSpy done(w.client(), &EngineClient::finished);
    QSignalSpy saved(&w, &MainWindow::sessionSaved);
    QList<qint64> ids;
    // Under a sanitizer, 2K alone: simulating 128K on 16 ranks there is most
    // of a minute a point, and with 1K and 2K this case was still the
    // suite's longest there (96 s of 215).
    const bool sanitized = qEnvironmentVariableIsSet("SHARDSCOPE_SANITIZER_LEG");
    const QString longest = sanitized ? "2048" : "131072";
    const int lengths = sanitized ? 1 : 2;
    for (const QString& dn : {QStringLiteral("8:1"), QStringLiteral("16:2")}) {
      const QStringList parts = dn.split(':');
      w.runArguments({"scale", "--model", "small-llama", "--set", "num_key_value_heads=16", "--hardware", "mi300x",
                      "--devices", parts[0], "--nodes", parts[1], "--strategies", "tp,tp_sp,tsp", "--seq-lens",
                      (sanitized ? "" : "16384,") + longest, "--no-batch-search", "--events", "-"},
                     "scaling D=" + parts[0]);
      QVERIFY(done.wait(240000));
      QVERIFY(saved.wait(30000));  // the recorder has written the whole sweep
      ids << saved.takeFirst().at(0).toLongLong();
    }
    ComparePage* page = w.compareSessions(ids);
    QVERIFY(page);
    QCOMPARE(page->findChildren<ScalingPage*>().size(), 2);
    QList<int> drawn;
    for (ScalingPage* s : page->findChildren<ScalingPage*>()) drawn << s->points();
    std::sort(drawn.begin(), drawn.end());
    QCOMPARE(drawn, (QList<int>{4 * lengths, 5 * lengths}));  // tp, 2 tp_sp meshes, tsp; tp, 3 meshes, tsp
    const QString table = page->tableText();
    // small-llama fits the longest length under tsp on 8 devices and on 16; tp_sp 8x2 exists on 16 only.
    const QString fits = "longest that fits\t" + longest + " tokens";
    QVERIFY2(table.contains("tsp: " + fits + "\t" + longest + " tokens"), qPrintable(table));
    QVERIFY2(table.contains("tp_sp 8x2: longest that fits\t–\t" + longest + " tokens"), qPrintable(table));
    page->window()->resize(1600, 950);
    page->window()->grab().save(QDir::temp().filePath("shardscope-scaling-compare.png"));
    page->window()->close();
  }

  // Training mode: the setup becomes `train` (checked by train --check-only),
  // the run draws its loss curve, the Summary sets the measured training
  // memory beside its closed form, and the Memory page stacks grads and
  // optimizer state.
  void trainingModeRunsAndDrawsTheLossCurve() {
    MainWindow w;
    w.resize(1400, 820);
    w.setSetup("tiny-llama", "cpu", "tp", 2, 24, 2);
    w.setTraining(true, 32, 2, 6, "selective");
    QVERIFY(w.training());
    const QStringList args = w.engineArguments();
    QCOMPARE(args.first(), QStringLiteral("train"));
    for (const char* flag : {"--seq-len", "--micro-batch", "--steps", "--recompute", "--devices"})
      QVERIFY2(args.contains(flag), flag);
    QVERIFY(!args.contains("--prompt-len"));
    QTRY_VERIFY_WITH_TIMEOUT(!w.checking(), 20000);
    QVERIFY2(w.setupValid(), qPrintable(w.verdictText()));
    // What training does not run yet is refused by the check, with the engine's reason.
    w.setSetup("tiny-mamba2", "cpu", "tsp", 4, 24, 2);  // 2 groups do not split over 4 ranks
    QTRY_VERIFY_WITH_TIMEOUT(!w.checking(), 20000);
    QVERIFY(!w.setupValid());
    QVERIFY2(w.verdictText().contains(QStringLiteral("n_groups")), qPrintable(w.verdictText()));
    w.setSetup("tiny-llama", "cpu", "tp", 2, 24, 2);
    QTRY_VERIFY_WITH_TIMEOUT(!w.checking(), 20000);
    QSignalSpy done(&w, &MainWindow::runFinished);
    w.runOnce();
    QVERIFY(done.wait(120000));
    QCOMPARE(done.takeFirst().at(0).value<RunOutcome>().exitCode, 0);
    QCOMPARE(w.data().trainSteps().size(), size_t(6));
    // The timeline names each step at its first forward, in the longest
    // form that fits before the next phase begins: no name runs into the
    // next mark, and the steps' names number them in order. Zoomed into a
    // step, its name is there.
    {
      TimelineView* timeline = w.findChild<TimelineView*>();
      QVERIFY(timeline);
      timeline->resize(1200, timeline->lanesHeight());
      timeline->resetZoom();
      const QFontMetrics fm(timeline->font());
      const auto marks = timeline->phaseMarks(fm);
      QVERIFY2(marks.size() >= 6 * 3,  // forward, backward and optimizer of each step, the first one's too
               qPrintable(QString("%1 marks in view of %2 phases").arg(marks.size()).arg(w.data().phases().size())));
      const QRegularExpression stepName("^(step )?(\\d+)( forward)?$");
      QList<int> numbered;
      for (size_t i = 0; i < marks.size(); ++i) {
        const QString& label = marks[i].label;
        if (i + 1 < marks.size() && !label.isEmpty())
          QVERIFY2(marks[i].x + 3 + fm.horizontalAdvance(label) <= marks[i + 1].x, qPrintable(label));
        if (const auto m = stepName.match(label); m.hasMatch()) numbered << m.captured(2).toInt();
      }
      QVERIFY(!numbered.isEmpty());
      for (int k = 0; k < numbered.size(); ++k) QVERIFY(k == 0 ? numbered[k] >= 1 : numbered[k] > numbered[k - 1]);
      std::vector<int64_t> forwards;
      for (const auto& ph : w.data().phases())
        if (ph.name == "forward") forwards.push_back(ph.t);
      QCOMPARE(forwards.size(), size_t(6));
      int64_t origin = std::numeric_limits<int64_t>::max();
      for (const auto& [rank, d] : w.data().ranks())
        for (const auto& span : d.spans) origin = std::min(origin, span.t0);
      timeline->alignAtStart();  // times from the first span
      for (size_t k = 0; k < forwards.size(); ++k) {
        const int64_t until = k + 1 < forwards.size() ? forwards[k + 1] : w.data().end_time();
        timeline->setRange(double(forwards[k] - origin), double(until - origin));
        const auto inStep = timeline->phaseMarks(fm);
        QVERIFY(!inStep.empty());
        const QString n = QString::number(w.data().trainSteps()[k].step);
        QVERIFY2(QStringList({"step " + n + " forward", "step " + n, n}).contains(inStep.front().label),
                 qPrintable(inStep.front().label));
      }
    }
    auto* page = w.pages()->currentWidget();
    QCOMPARE(w.pages()->tabText(w.pages()->currentIndex()), QStringLiteral("Training"));
    page->grab().save(QDir::temp().filePath("shardscope-training.png"));
    w.grab().save(QDir::temp().filePath("shardscope-training-window.png"));
    const QString summary = w.summaryText();
    QVERIFY2(summary.contains(QStringLiteral("= formula")), qPrintable(summary));
    QVERIFY(summary.contains(QStringLiteral("Korthikanti")));
    QVERIFY(summary.contains(QStringLiteral("optimizer_state")));
    // TP vs TSP compares two training runs side by side.
    QSignalSpy compared(&w, &MainWindow::runFinished);
    w.compareTpTsp();
    QVERIFY(compared.wait(180000));
    ComparePage* compare = nullptr;
    for (QWidget* top : QApplication::topLevelWidgets())
      if (auto* page = top->findChild<ComparePage*>()) compare = page;
    QVERIFY(compare);
    QCOMPARE(compare->runs(), 2);
    compare->window()->resize(1400, 900);
    compare->window()->grab().save(QDir::temp().filePath("shardscope-training-compare.png"));
    compare->window()->close();
  }

  void pagesShowTheRun() {
    MainWindow w;
    w.resize(1400, 820);
    w.setSetup("tiny-mamba2", "cpu", "tsp", 2, 16, 4);
    QSignalSpy done(&w, &MainWindow::runFinished);
    w.runOnce();
    QVERIFY(done.wait(120000));
    QCOMPARE(done.takeFirst().at(0).value<RunOutcome>().exitCode, 0);
    const QString summary = w.summaryText();
    QVERIFY2(summary.contains(QStringLiteral("tiny-mamba2 · tsp · 2 device(s) · cpu")), qPrintable(summary));
    QVERIFY(summary.contains(QStringLiteral("Peak memory per device")));
    QVERIFY(summary.contains(QStringLiteral("on the wire")));
    for (int i = 0; i < w.pages()->count(); ++i) {
      w.pages()->setCurrentIndex(i);
      QApplication::processEvents();
      const QImage img = w.pages()->currentWidget()->grab().toImage();
      // Not blank: a page with data has many distinct colours.
      QSet<QRgb> colours;
      for (int y = 0; y < img.height(); y += 4)
        for (int x = 0; x < img.width(); x += 4) colours.insert(img.pixel(x, y));
      QVERIFY2(colours.size() > 8, qPrintable(w.pages()->tabText(i)));
      img.save(QDir::temp().filePath("shardscope-page-" + QString::number(i) + ".png"));
    }
    // The memory page stacks every category the run used; without weights,
    // the rest, with the peak relabelled.
    auto* memory = w.findChild<MemoryPage*>();
    QVERIFY(memory);
    w.pages()->setCurrentWidget(memory);
    auto* plot = memory->findChildren<QCustomPlot*>().first();
    auto names = [&] {
      QStringList n;
      for (int g = 0; g < plot->graphCount(); ++g) n << plot->graph(g)->name();
      return n;
    };
    QVERIFY2(names().contains("weights") && names().contains("activations"), qPrintable(names().join(',')));
    memory->findChild<QCheckBox*>()->setChecked(true);
    QApplication::processEvents();
    QVERIFY2(!names().contains("weights") && names().contains("activations"), qPrintable(names().join(',')));
    memory->grab().save(QDir::temp().filePath("shardscope-memory-without-weights.png"));
  }
};

QTEST_MAIN(TestExplorer)
#include "tst_explorer.moc"

// The explorer offscreen: EngineClient driving a real engine run end to end,
// the same stream replayed from a file giving the same data, the failures a
// person will hit, the setup checked as it is typed, comparisons and
// training mode. The pages drawn from a stream: tst_explorer_pages.
#include "explorer_suite.h"

namespace {

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

}  // namespace

class TestExplorer : public QObject {
  Q_OBJECT
  QTemporaryDir m_db;
 private slots:
  void initTestCase() { useBuiltEngineAndScratchSessions(m_db); }

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
    QString wrote = engineWrote(command, stream);
    QVERIFY2(wrote.isEmpty(), qPrintable(wrote));
    MainWindow w;
    QVERIFY(openedIn(w, stream));
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
    wrote = engineWrote({"simulate", "--model", "tiny-llama", "--prompt-len", "16", "--decode=2"}, second);
    QVERIFY2(wrote.isEmpty(), qPrintable(wrote));
    QVERIFY(openedIn(w, second));
    const QStringList form = w.engineArguments();
    QCOMPARE(form.value(0), QString("simulate"));
    wrong = holds(form, {"--hardware", "h100-sxm", "--strategy", "single", "--dtype",
                         QString::fromStdString(w.data().config().at("dtype").get<std::string>()), "--prompt-len", "16",
                         "--decode", "2"});
    QVERIFY2(wrong.isEmpty(), qPrintable(wrong));
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
};

QTEST_MAIN(TestExplorer)
#include "tst_explorer.moc"

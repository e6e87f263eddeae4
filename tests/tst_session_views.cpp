// Sessions in the window: a live run is saved while it streams and reopens,
// replays and compares equal to what arrived live, event for event; the
// browser filters, renames and deletes with undo; pages export as PNG, SVG
// and PDF; a second window on the same database is read-only and says so;
// an explorer killed mid-run leaves a readable session marked interrupted.
#include <QFile>

#include <csignal>
#include <QLabel>
#include <QProcess>
#include <QSignalSpy>
#include <QTabWidget>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QtTest>

#include "compare.h"
#include "mainwindow.h"
#include "pages.h"
#include "sessionspage.h"
#include "sessionstore.h"

using namespace ss::proto;

namespace {
// Everything a view can see of a run, as canonical lines per kind.
std::map<std::string, std::vector<std::string>> contents(const RunData& d) {
  std::map<std::string, std::vector<std::string>> out;
  for (auto& [rank, r] : d.ranks()) {
    const std::string k = std::to_string(rank);
    out["device" + k].push_back(to_line(r.device));
    for (auto& s : r.spans) out["span" + k].push_back(to_line(s));
    for (auto& m : r.mem) out["mem" + k].push_back(to_line(m));
    for (auto& p : r.placements) out["placement" + k].push_back(to_line(p));
    out["tokens" + k].push_back(to_line(Tokens{rank, r.tokens}));
    for (auto& [n, v] : r.metrics) out["metric" + k].push_back(n + "=" + std::to_string(v));
  }
  for (auto& [n, v] : d.metrics()) out["metric"].push_back(n + "=" + std::to_string(v));
  for (auto& a : d.accuracy()) out["accuracy"].push_back(to_line(a));
  for (auto& g : d.generations()) out["generation"].push_back(to_line(g));
  for (auto& e : d.errors()) out["error"].push_back(to_line(e));
  out["config"].push_back(d.config().dump());
  out["status"].push_back(d.status().toStdString());
  return out;
}

bool runAndSave(MainWindow& w, const QString& model, const QString& strategy, int devices, QByteArray* raw = nullptr) {
  w.setSetup(model, "cpu", strategy, devices, 16, 4);
  QSignalSpy saved(&w, &MainWindow::sessionSaved);
  QMetaObject::Connection c;
  if (raw)
    c = QObject::connect(w.client(), &EngineClient::streamReceived,
                         [raw](const QByteArray& bytes, EventBatch) { *raw += bytes; });
  w.runOnce();
  const bool ok = saved.wait(180000);
  QObject::disconnect(c);
  return ok;
}
}  // namespace

class TestSessionViews : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;
  QString m_db;

 private slots:
  void initTestCase() {
    qputenv("SHARDSCOPE_ENGINE", SHARDSCOPE_ENGINE_BIN);
    m_db = m_dir.filePath("sessions.db");
  }

  void liveRunIsSavedAndReopensEqual() {
    MainWindow w(nullptr, m_db);
    QVERIFY2(w.databaseNotice().isEmpty(), qPrintable(w.databaseNotice()));
    QByteArray raw;
    QVERIFY(runAndSave(w, "tiny-llama", "tp", 2, &raw));
    const auto live = contents(w.data());
    QVERIFY(live.at("span0").size() > 10);
    const qint64 id = w.lastSession();
    SessionStore store;
    QVERIFY(store.open(m_db, SessionStore::Mode::ReadOnly));
    const SessionInfo info = store.info(id);
    QCOMPARE(info.status, QStringLiteral("done"));
    QCOMPARE(info.strategy, QStringLiteral("tp"));
    QCOMPARE(store.rawStream(id), raw);  // byte for byte what the window received
    // Reopened in the window: the same data, event for event.
    QVERIFY(w.openSession(id));
    QVERIFY(contents(w.data()) == live);
    // Compared (against itself): the compare view holds the same data.
    ComparePage* page = w.compareSessions({id, id});
    QVERIFY(page);
    QVERIFY(contents(page->run(0)) == live);
    QVERIFY(contents(page->run(1)) == live);
    page->window()->close();
    // Replayed as fast as possible: the same again.
    QSignalSpy replayed(&w, &MainWindow::replayFinished);
    w.replaySession(id, 0);
    QVERIFY(replayed.wait(60000));
    QVERIFY(contents(w.data()) == live);
  }

  // A reopened session sets the setup to what it ran: the form gives the
  // same command again (training and inference, their options included),
  // and Run again runs it.
  void reopenedSessionSetsTheSetup() {
    MainWindow w(nullptr, m_dir.filePath("setups.db"));  // its own: the browser's counts below are the shared one's
    w.setSetup("tiny-mamba2", "cpu", "tsp", 2, 16, 4);
    w.setTraining(true, 32, 2, 2, "selective");
    w.setOptions(1, QStringLiteral("n_groups=2"), QStringLiteral("fp32"), QStringLiteral("1GiB"));
    QSignalSpy saved(&w, &MainWindow::sessionSaved);
    w.runOnce();
    QVERIFY(saved.wait(180000));
    const qint64 trained = w.lastSession();
    const QStringList trainArgs = w.engineArguments();
    QCOMPARE(w.sessionStore()->info(trained).command, trainArgs);
    w.setTraining(false);
    w.setOptions(1, QStringLiteral("num_hidden_layers=3"), QStringLiteral("int8:32"), QString());
    QVERIFY(runAndSave(w, "tiny-llama", "tp", 2));
    const qint64 inferred = w.lastSession();
    const QStringList inferArgs = w.engineArguments();
    QVERIFY(!w.training() && inferArgs.contains("int8:32") && inferArgs.contains("num_hidden_layers=3"));
    // Another setup in the form; each session reopened brings its own back.
    w.setTraining(false);
    w.setSetup("brown-llama", "sim:mi300x", "single", 1, 64, 1);
    w.setOptions(1, QString(), QStringLiteral("fp32"), QString());
    QVERIFY(w.openSession(trained));
    QVERIFY(w.training());
    QCOMPARE(w.engineArguments(), trainArgs);
    QVERIFY(w.openSession(inferred));
    QVERIFY(!w.training());
    QCOMPARE(w.engineArguments(), inferArgs);
    // A scaling point's run names its profile by file; a one-node run sets Nodes back to 1.
    w.setFormFrom({"simulate", "--hardware", "mi300x", "--nodes", "3", "--model", "tiny-llama", "--strategy", "tp",
                   "--devices", "4", "--prompt-len", "64", "--decode", "2"});
    QVERIFY2(w.engineArguments().join(' ').contains("--nodes 3"), qPrintable(w.engineArguments().join(' ')));
    w.setFormFrom({"simulate", "--hardware", qEnvironmentVariable("SHARDSCOPE_RESOURCES") + "/hardware/h100-sxm.json", "--model",
                   "tiny-llama", "--strategy", "tp", "--devices", "2", "--prompt-len", "64", "--decode", "2"});
    const QString simulated = w.engineArguments().join(' ');
    QVERIFY2(simulated.startsWith("simulate --hardware h100-sxm ") && !simulated.contains("--nodes"), qPrintable(simulated));
    // Run again runs the reopened session's command.
    QSignalSpy done(&w, &MainWindow::runFinished);
    QVERIFY(w.openSession(trained));
    w.runAgain();
    QVERIFY(done.wait(180000));
    QCOMPARE(w.sessionStore()->info(w.lastSession()).command, trainArgs);
  }

  void browserFiltersRenamesAndUndoesDelete() {
    MainWindow w(nullptr, m_db);
    QVERIFY(runAndSave(w, "tiny-mamba2", "tsp", 2));
    SessionsPage* page = w.sessionsPage();
    page->reload();
    QCOMPARE(page->visibleRows(), 2);
    page->setFilter("tsp");
    QCOMPARE(page->visibleRows(), 1);
    page->setFilter("");
    // Rename in place, with characters that must survive SQL.
    QTableWidget* t = page->table();
    const qint64 id = w.lastSession();
    for (int r = 0; r < t->rowCount(); ++r)
      if (t->item(r, 0)->data(Qt::UserRole).toLongLong() == id) t->item(r, 0)->setText("mamba's \"tsp\"; --");
    QCOMPARE(w.sessionStore()->info(id).name, QStringLiteral("mamba's \"tsp\"; --"));
    page->selectSessions({id});
    page->deleteSelected();
    QCOMPARE(page->visibleRows(), 1);
    page->undoDelete();
    QCOMPARE(page->visibleRows(), 2);
    QCOMPARE(w.sessionStore()->lines(id).isEmpty(), false);
  }

  // An empty database's page says what it will hold; one with sessions lists them instead.
  void emptySessionsPageSaysWhatItWillHold() {
    for (const QString& db : {m_dir.filePath("empty.db"), m_db}) {
      MainWindow w(nullptr, db);
      auto* page = w.findChild<SessionsPage*>();
      QVERIFY(page);
      const bool empty = w.sessionStore()->list().empty();
      QCOMPARE(empty, db != m_db);
      QLabel* said = nullptr;
      for (QLabel* l : page->findChildren<QLabel*>())
        if (l->text().startsWith(QStringLiteral("No sessions yet"))) said = l;
      QVERIFY(said);
      QCOMPARE(said->isVisibleTo(page), empty);
    }
  }

  void compareTwoSessionsOnOneAxis() {
    MainWindow w(nullptr, m_db);
    const auto sessions = w.sessionStore()->list();
    QVERIFY(sessions.size() >= 2);
    ComparePage* page = w.compareSessions({sessions[0].id, sessions[1].id});
    QVERIFY(page);
    QCOMPARE(page->runs(), 2);
    const QString table = page->tableText();
    QVERIFY2(table.contains("peak memory") && table.contains("(×"), qPrintable(table));
    page->window()->resize(1400, 900);
    QApplication::processEvents();
    const QImage shot = page->window()->grab().toImage();
    QVERIFY(shot.save(QDir::temp().filePath("shardscope-compare.png")));
    page->window()->close();
    QVERIFY(!w.compareSessions({sessions[0].id}));  // one is not a comparison
    QVERIFY(w.hasSession(sessions[0].id) && !w.hasSession(9999));
    // From the command line, a session that is not there is refused in one line, naming it.
    QProcess app;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("QT_QPA_PLATFORM", "offscreen");
    app.setProcessEnvironment(env);
    app.start(SHARDSCOPE_APP_BIN, {"--db", m_db, "--compare", QString("%1,9999").arg(sessions[0].id)});
    QVERIFY(app.waitForFinished(60000));
    QCOMPARE(app.exitCode(), 2);
    const QString err = QString::fromUtf8(app.readAllStandardError()).trimmed();  // Qt's own notes may come first
    QVERIFY2(err.section('\n', -1).startsWith("shardscope: --compare") && err.section('\n', -1).contains("no session 9999") &&
                 err.count("shardscope:") == 1,
             qPrintable(err));
    // --open-session likewise; one that is there opens, its pages saved as PNGs.
    app.start(SHARDSCOPE_APP_BIN, {"--db", m_db, "--open-session", "9999"});
    QVERIFY(app.waitForFinished(60000));
    QCOMPARE(app.exitCode(), 2);
    QVERIFY2(QString::fromUtf8(app.readAllStandardError()).contains("shardscope: no session 9999 in the database"),
             "--open-session 9999");
    QTemporaryDir shots;
    app.start(SHARDSCOPE_APP_BIN, {"--db", m_db, "--open-session", QString::number(sessions[0].id), "--screenshot",
                                   shots.filePath("s")});
    QVERIFY(app.waitForFinished(60000));
    QCOMPARE(app.exitCode(), 0);
    QVERIFY(QImage(shots.filePath("s-summary.png")).width() > 600);
    // Every page drawn, the hidden ones too, without a plot painting into no pixels.
    const QString said = QString::fromUtf8(app.readAllStandardError());
    QVERIFY2(!said.contains("QPainter") && !said.contains("paint buffer"), qPrintable(said.left(2000)));
  }

  void pagesExportAsPngSvgPdf() {
    MainWindow w(nullptr, m_db);
    w.resize(1400, 820);
    QVERIFY(w.openSession(w.sessionStore()->list().first().id));
    w.pages()->setCurrentIndex(w.pages()->indexOf(w.findChild<TimelineView*>()));
    QApplication::processEvents();
    QTemporaryDir out;
    const struct {
      const char* file;
      QByteArray magic;
    } kinds[] = {{"timeline.png", "\x89PNG"}, {"timeline.svg", "<?xml"}, {"timeline.pdf", "%PDF"}};
    for (auto& k : kinds) {
      const QString path = out.filePath(k.file);
      QCOMPARE(w.exportView(path), QString());
      QFile f(path);
      QVERIFY(f.open(QIODevice::ReadOnly));
      const QByteArray bytes = f.readAll();
      QVERIFY2(bytes.startsWith(k.magic), k.file);
      QVERIFY(bytes.size() > 2000);
      if (QByteArray(k.file).endsWith(".svg")) QVERIFY(bytes.contains("rank 0"));  // the lanes' labels as text
    }
    QVERIFY(w.exportView(out.filePath("x.bmp")).contains(".png, .svg or .pdf"));
  }

  void secondWindowIsReadOnly() {
    MainWindow first(nullptr, m_db);
    MainWindow second(nullptr, m_db);
    QVERIFY2(second.databaseNotice().contains("in use by another ShardScope"), qPrintable(second.databaseNotice()));
    QVERIFY(second.sessionStore() && second.sessionStore()->readOnly());
    QVERIFY(second.sessionStore()->list().size() >= 2);  // still browsable
    const int before = int(first.sessionStore()->list().size());
    second.setSetup("tiny-llama", "cpu", "single", 1, 8, 1);
    QSignalSpy done(&second, &MainWindow::runFinished);
    second.runOnce();
    QVERIFY(done.wait(120000));
    QCOMPARE(int(first.sessionStore()->list().size()), before);  // not saved by the reader
  }

  void killedEngineLeavesAnInterruptedSession() {
    MainWindow w(nullptr, m_dir.filePath("engine-killed.db"));
    w.setSetup("small-llama", "cpu", "single", 1, 64, 400);
    QSignalSpy saved(&w, &MainWindow::sessionSaved);
    QSignalSpy finished(&w, &MainWindow::runFinished);
    w.runOnce();
    QElapsedTimer clock;
    clock.start();
    while (clock.elapsed() < 120000 && w.data().events() < 300 && finished.isEmpty()) QTest::qWait(50);
    QVERIFY2(finished.isEmpty(), "the run ended before it could be killed");
    QVERIFY(w.client()->processId() > 0);
    ::kill(pid_t(w.client()->processId()), SIGKILL);
    QVERIFY(saved.wait(60000));
    const SessionInfo info = w.sessionStore()->info(w.lastSession());
    QCOMPARE(info.status, QStringLiteral("interrupted"));
    QVERIFY(info.events >= 300);
    QVERIFY(w.openSession(info.id));
    QVERIFY(!w.data().ranks().begin()->second.spans.empty());
  }

  void killedExplorerLeavesAnInterruptedSession() {
    const QString db = m_dir.filePath("killed.db");
    QProcess app;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("QT_QPA_PLATFORM", "offscreen");
    app.setProcessEnvironment(env);
    app.start(SHARDSCOPE_APP_BIN,
              {"--db", db, "--run-once", "small-llama", "cpu", "single", "1", "64", "400"});
    QVERIFY(app.waitForStarted());
    // Wait until batches are committed, then kill the window without warning.
    qint64 saved = 0;
    QElapsedTimer clock;
    clock.start();
    while (clock.elapsed() < 120000 && app.state() == QProcess::Running) {
      QTest::qWait(200);
      if (!QFile::exists(db)) continue;
      SessionStore peek;
      if (!peek.open(db, SessionStore::Mode::ReadOnly) || peek.list().isEmpty()) continue;
      saved = peek.list().first().events;
      if (saved > 200) break;
    }
    QVERIFY2(app.state() == QProcess::Running, "the run ended before it could be killed");
    QVERIFY(saved > 200);
    app.kill();
    app.waitForFinished();
    // The next window takes the stale lock, marks the session, and opens it.
    MainWindow w(nullptr, db);
    QVERIFY2(w.databaseNotice().contains("interrupted"), qPrintable(w.databaseNotice()));
    const auto list = w.sessionStore()->list();
    QCOMPARE(list.size(), 1);
    QCOMPARE(list[0].status, QStringLiteral("interrupted"));
    QVERIFY(list[0].events >= saved);
    QVERIFY(w.openSession(list[0].id));
    QVERIFY(!w.data().ranks().empty());
    QVERIFY(!w.data().ranks().begin()->second.spans.empty());
    // Every saved line is a whole record.
    Reader reader;
    int bad = 0;
    for (const QString& l : w.sessionStore()->lines(list[0].id))
      bad += !reader.parse_line(l.toStdString()).error.empty();
    QCOMPARE(bad, 0);
  }
};

QTEST_MAIN(TestSessionViews)
#include "tst_session_views.moc"

// The session store: a real run saved batch by batch and reopened equals the
// live stream line for line and event for event; a schema-1 database (a
// fixture made by the first store) opens after migration with nothing lost;
// names and notes with quotes, SQL or control characters round-trip; a newer,
// corrupt or truncated file, a read-only or missing location, a full disk and
// a second instance each give a clear message and lose nothing; imports and
// the Perfetto and CSV exports.
#include <QCryptographicHash>
#include <QDir>
#include <QProcess>
#include <QRandomGenerator>
#include <QSqlDatabase>
#include <QSqlQuery>
#include <QTemporaryDir>
#include <QtTest>

#include "engine_process.h"
#include "export.h"
#include "sessionstore.h"

using namespace ss::proto;

namespace {
QByteArray digest(const QString& path) {
  QFile f(path);
  f.open(QIODevice::ReadOnly);
  return QCryptographicHash::hash(f.readAll(), QCryptographicHash::Sha256);
}
QByteArray readAll(const QString& path) {
  QFile f(path);
  f.open(QIODevice::ReadOnly);
  return f.readAll();
}
QStringList linesOf(const QByteArray& bytes) { return QString::fromUtf8(bytes).split('\n', Qt::SkipEmptyParts); }

// The events of a stream, grouped by record type, each as its canonical line:
// what a view can see. Order within a type is kept.
std::map<std::string, std::vector<std::string>> byType(const std::vector<Event>& events) {
  std::map<std::string, std::vector<std::string>> out;
  for (const Event& e : events) out[std::string(type_name(e))].push_back(to_line(e));
  return out;
}

// Saves `raw` the way the app does: parsed incrementally, one batch per chunk.
qint64 saveInBatches(SessionStore& store, const QByteArray& raw, const QString& name, int chunk = 3000) {
  const qint64 id = store.create(name);
  Reader reader;
  QByteArray pending;
  for (qsizetype i = 0; i < raw.size(); i += chunk) {
    pending += raw.mid(i, chunk);
    const qsizetype nl = pending.lastIndexOf('\n');
    if (nl < 0) continue;
    const QByteArray whole = pending.left(nl + 1);
    pending.remove(0, nl + 1);
    std::vector<Event> events;
    reader.feed(std::string_view(whole.constData(), size_t(whole.size())),
                [&](Event&& e) { events.push_back(std::move(e)); }, [](const std::string&) {});
    if (!store.append(id, whole, events)) return 0;
  }
  return id;
}

const QString kFixtures = QStringLiteral(SHARDSCOPE_TESTS_DIR "/fixtures");
}  // namespace

class TestSessions : public QObject {
  Q_OBJECT
  QTemporaryDir m_runs;
  QByteArray m_tp;  // a real 2-rank tp run of tiny-mamba2, recorded once for the suite

 private slots:
  void initTestCase() {
    const QString stream = m_runs.filePath("tp.jsonl");
    const Ran r = engine({"launch", "--model", "tiny-mamba2", "--strategy", "tp", "--devices", "2", "--prompt-len",
                          "16", "--decode", "4", "--events", stream});
    QVERIFY2(r.exit_code == 0, r.err.constData());
    m_tp = readAll(stream);
    QVERIFY(linesOf(m_tp).size() > 100);
  }

  void realRunRoundTrips() {
    QTemporaryDir dir;
    const QString db = dir.filePath("sessions.db");
    qint64 id = 0;
    {
      SessionStore store;
      QVERIFY2(store.open(db), qPrintable(store.error()));
      id = saveInBatches(store, m_tp, "tp on 2");
      QVERIFY2(id > 0, qPrintable(store.error()));
      QVERIFY(store.finish(id, "ok"));
    }
    SessionStore reopened;
    QVERIFY2(reopened.open(db), qPrintable(reopened.error()));
    const auto list = reopened.list();
    QCOMPARE(list.size(), 1);
    QCOMPARE(list[0].model, QStringLiteral("tiny-mamba2"));
    QCOMPARE(list[0].strategy, QStringLiteral("tp"));
    QCOMPARE(list[0].devices, 2);
    QCOMPARE(list[0].status, QStringLiteral("done"));
    QCOMPARE(list[0].events, qint64(linesOf(m_tp).size()));
    QVERIFY2(list[0].headline.contains("peak_bytes"), qPrintable(list[0].headline));
    QCOMPARE(reopened.lines(id), linesOf(m_tp));  // the raw stream, byte for byte
    // The derived tables give back every event the live parse gave.
    const Stream live = read_stream(m_tp);
    const auto expected = byType(live.events), got = byType(reopened.events(id));
    QCOMPARE(got.size(), expected.size());
    for (auto& [type, lines] : expected) {
      QVERIFY2(got.count(type), type.c_str());
      QCOMPARE(got.at(type).size(), lines.size());
      QVERIFY2(got.at(type) == lines, type.c_str());
    }
    QVERIFY(reopened.remove(id));  // hidden at once, undoable until the next open
    QVERIFY(reopened.list().isEmpty());
    QVERIFY(reopened.restore(id));
    QCOMPARE(reopened.list().size(), 1);
    QVERIFY(reopened.remove(id));
    SessionStore again;
    QVERIFY(again.open(db));  // purged now
    QVERIFY(again.lines(id).isEmpty());
    QVERIFY(again.events(id).empty());  // derived rows go with their session
  }

  void schemaOneFixtureMigrates() {
    QTemporaryDir dir;
    const QString db = dir.filePath("v1.db");
    QVERIFY(QFile::copy(kFixtures + "/sessions-v1.db", db));
    QFile::setPermissions(db, QFile::ReadOwner | QFile::WriteOwner);
    SessionStore store;
    QVERIFY2(store.open(db), qPrintable(store.error()));
    {
      QSqlDatabase raw = QSqlDatabase::addDatabase("QSQLITE", "check-version");
      raw.setDatabaseName(db);
      QVERIFY(raw.open());
      QSqlQuery q(raw);
      QVERIFY(q.exec("PRAGMA user_version") && q.next());
      QCOMPARE(q.value(0).toInt(), SessionStore::kSchemaVersion);
    }
    QSqlDatabase::removeDatabase("check-version");
    const auto list = store.list();
    QCOMPARE(list.size(), 2);
    QCOMPARE(list[0].name, QStringLiteral("tp on two ranks"));
    QCOMPARE(list[0].note, QStringLiteral("it's a \"v1\" note; DROP TABLE sessions; --\ttab"));
    QCOMPARE(list[0].strategy, QStringLiteral("tp"));
    QCOMPARE(list[0].status, QStringLiteral("done"));
    QCOMPARE(list[1].name, QStringLiteral("mamba2 single"));
    QVERIFY(list[0].command.isEmpty());  // schema 3's column: no command was kept then
    for (int i = 0; i < 2; ++i) {
      const QByteArray original = readAll(kFixtures + QStringLiteral("/sessions-v1-run%1.jsonl").arg(i + 1));
      QCOMPARE(store.lines(list[i].id), linesOf(original));
      const auto expected = byType(read_stream(original).events), got = byType(store.events(list[i].id));
      QVERIFY(expected == got);
      QVERIFY(expected.at("span").size() > 10);
      QCOMPARE(list[i].events, qint64(linesOf(original).size()));
    }
  }

  void namesAndNotesRoundTrip_data() {
    QTest::addColumn<QString>("text");
    QTest::newRow("quotes") << QStringLiteral("it's \"quoted\" '' \"\"");
    QTest::newRow("sql") << QStringLiteral("x'); DROP TABLE sessions; --");
    QTest::newRow("control") << QString::fromUtf8("tab\there\nnew line\r\x01\x1f end");
    QTest::newRow("unicode") << QString::fromUtf8("模型 · ζ · 🚀");
    QTest::newRow("empty") << QString();
  }
  void namesAndNotesRoundTrip() {
    QFETCH(QString, text);
    QTemporaryDir dir;
    const QString db = dir.filePath("s.db");
    {
      SessionStore store;
      QVERIFY(store.open(db));
      const qint64 id = store.create(text);
      QVERIFY(id > 0);
      QVERIFY(store.setNote(id, text));
      QVERIFY(store.setTags(id, text));
      QVERIFY(store.rename(id, text + text));
      // A command's arguments, any text among them (a prompt).
      QVERIFY(store.setCommand(id, {"launch", "--prompt", text, "--set", "x=1"}));
    }
    SessionStore store;
    QVERIFY(store.open(db));
    const auto list = store.list();
    QCOMPARE(list.size(), 1);
    QCOMPARE(list[0].name, text + text);
    QCOMPARE(list[0].note, text);
    QCOMPARE(list[0].tags, text);
    QCOMPARE(list[0].command, (QStringList{"launch", "--prompt", text, "--set", "x=1"}));
  }

  void newerDatabaseIsRefusedAndKept() {
    QTemporaryDir dir;
    const QString path = dir.filePath("newer.db");
    {
      SessionStore store;
      QVERIFY(store.open(path));
      store.create("kept");
    }
    {
      auto raw = QSqlDatabase::addDatabase("QSQLITE", "raw");
      raw.setDatabaseName(path);
      QVERIFY(raw.open());
      QSqlQuery(raw).exec("PRAGMA user_version = 7");
      raw.close();
    }
    QSqlDatabase::removeDatabase("raw");
    const QByteArray before = digest(path);
    SessionStore store;
    QVERIFY(!store.open(path));
    QVERIFY2(store.error().contains("newer"), qPrintable(store.error()));
    QCOMPARE(digest(path), before);
  }

  void corruptOrTruncatedIsRefusedAndKept_data() {
    QTest::addColumn<QString>("kind");
    QTest::newRow("not sqlite") << "garbage";
    QTest::newRow("truncated") << "truncated";
    QTest::newRow("empty pages") << "zeroed";
  }
  void corruptOrTruncatedIsRefusedAndKept() {
    QFETCH(QString, kind);
    QTemporaryDir dir;
    const QString path = dir.filePath("bad.db");
    if (kind == "garbage") {
      QFile f(path);
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write(QByteArray(5000, 'x'));
    } else {
      {
        SessionStore store;
        QVERIFY(store.open(path));
        for (int i = 0; i < 4; ++i) QVERIFY(saveInBatches(store, m_tp, "run") > 0);
      }
      QFile f(path);
      QVERIFY(f.open(QIODevice::ReadWrite));
      if (kind == "truncated") QVERIFY(f.resize(f.size() / 2));
      else {
        f.seek(f.size() / 3);
        f.write(QByteArray(8192, '\0'));
      }
    }
    const QByteArray before = digest(path);
    SessionStore store;
    QVERIFY(!store.open(path));
    QVERIFY2(store.error().contains("untouched"), qPrintable(store.error()));
    QCOMPARE(digest(path), before);
  }

  void unwritableLocationSaysWhere() {
    QTemporaryDir dir;
    QFile file(dir.filePath("a-file"));
    QVERIFY(file.open(QIODevice::WriteOnly));
    file.close();
    SessionStore store;
    QVERIFY(!store.open(dir.filePath("a-file/sessions.db")));
    QVERIFY2(store.error().contains("does not exist") && store.error().contains("--db"), qPrintable(store.error()));
    // A database opened read-only (a shared or write-protected file) reads
    // everything and refuses writes with one line.
    const QString db = dir.filePath("s.db");
    {
      SessionStore w;
      QVERIFY(w.open(db));
      QVERIFY(w.finish(saveInBatches(w, m_tp, "kept"), "ok"));
    }
    const QByteArray before = digest(db);
    SessionStore ro;
    QVERIFY2(ro.open(db, SessionStore::Mode::ReadOnly), qPrintable(ro.error()));
    QCOMPARE(ro.list().size(), 1);
    QCOMPARE(ro.lines(ro.list()[0].id), linesOf(m_tp));
    QCOMPARE(ro.create("new"), qint64(0));
    QVERIFY2(ro.error().contains("read-only") || ro.error().contains("readonly"), qPrintable(ro.error()));
    QVERIFY(!ro.rename(ro.list()[0].id, "renamed"));
    QCOMPARE(ro.list()[0].name, QStringLiteral("kept"));
    QCOMPARE(digest(db), before);
  }

  void fullDiskKeepsWhatWasSaved() {
    QTemporaryDir dir;
    const QString db = dir.filePath("small.db");
    SessionStore store;
    QVERIFY(store.open(db));
    const qint64 first = saveInBatches(store, m_tp, "first");
    QVERIFY(store.finish(first, "ok"));
    QVERIFY(store.setSizeLimit(QFileInfo(db).size() + 256 * 1024));
    // Keep streaming copies of the run until the database is full.
    const qint64 id = store.create("filling");
    Reader reader;
    std::vector<Event> events;
    reader.feed(std::string_view(m_tp.constData(), size_t(m_tp.size())),
                [&](Event&& e) { events.push_back(std::move(e)); }, [](const std::string&) {});
    int saved = 0;
    for (int i = 0; i < 400; ++i) {
      // Incompressible padding, in a field readers ignore, grows the file fast.
      QByteArray pad(16384, '\0');
      QRandomGenerator gen(quint32(i + 1));
      gen.fillRange(reinterpret_cast<quint32*>(pad.data()), pad.size() / 4);
      const QByteArray batch = m_tp + "{\"type\":\"metric\",\"name\":\"pad\",\"value\":0,\"pad\":\"" + pad.toHex() + "\"}\n";
      if (!store.append(id, batch, events)) break;
      ++saved;
    }
    QVERIFY2(store.error().contains("full"), qPrintable(store.error()));
    QVERIFY(saved > 0);
    store.finish(id, "failed");  // a full database may refuse this too; what matters is below
    // Everything committed before the failure is there, and the first run is intact.
    QCOMPARE(store.lines(first), linesOf(m_tp));
    QCOMPARE(store.lines(id).size(), saved * (linesOf(m_tp).size() + 1));
    SessionStore reopened;
    QVERIFY2(reopened.open(db), qPrintable(reopened.error()));
    QCOMPARE(reopened.list().size(), 2);
  }

  // The database made read-only while a run streams into it (chattr +i on
  // the file and its WAL: even root cannot write then). Appends fail with
  // one line; everything committed before is there once it is writable.
  void readOnlyMidRunKeepsWhatWasSaved() {
    QTemporaryDir dir;
    const QString db = dir.filePath("frozen.db");
    auto immutable = [&](bool on) {
      bool ok = true;
      for (const QString& f : {db, db + "-wal"})
        if (QFile::exists(f)) ok = QProcess::execute("chattr", {on ? "+i" : "-i", f}) == 0 && ok;
      return ok;
    };
    {
      SessionStore store;
      QVERIFY(store.open(db));
      const qint64 first = saveInBatches(store, m_tp, "first");
      QVERIFY(store.finish(first, "ok"));
      const qint64 id = store.create("streaming");
      Reader reader;
      std::vector<Event> events;
      reader.feed(std::string_view(m_tp.constData(), size_t(m_tp.size())),
                  [&](Event&& e) { events.push_back(std::move(e)); }, [](const std::string&) {});
      QVERIFY(store.append(id, m_tp, events));
      if (!immutable(true)) {
        immutable(false);
        QSKIP("chattr +i is not available here (needs root on a filesystem with the immutable flag)");
      }
      const bool appended = store.append(id, m_tp, events);
      const QString error = store.error();
      immutable(false);
      QVERIFY2(!appended, "a write to an immutable database succeeded");
      QVERIFY2(!error.isEmpty() && !error.contains('\n'), qPrintable(error));
    }
    SessionStore reopened;
    QVERIFY2(reopened.open(db), qPrintable(reopened.error()));
    const auto list = reopened.list();
    QCOMPARE(list.size(), 2);
    QCOMPARE(reopened.lines(list[0].id), linesOf(m_tp));
    QCOMPARE(reopened.lines(list[1].id), linesOf(m_tp));
  }

  void secondInstanceGetsReadOnly() {
    QTemporaryDir dir;
    const QString db = dir.filePath("shared.db");
    DatabaseLock first(db);
    QVERIFY(first.tryLock());
    SessionStore writer;
    QVERIFY(writer.open(db));
    const qint64 running = writer.create("still running");
    QVERIFY(writer.appendLines(running, linesOf(m_tp).mid(0, 50)));
    // The second instance: the lock says who holds it; it can still read.
    DatabaseLock second(db);
    QVERIFY(!second.tryLock());
    QVERIFY2(second.holder().contains(QString::number(QCoreApplication::applicationPid())),
             qPrintable(second.holder()));
    SessionStore reader;
    QVERIFY(reader.open(db, SessionStore::Mode::ReadOnly));
    QCOMPARE(reader.list().size(), 1);
    QCOMPARE(reader.list()[0].status, QStringLiteral("running"));  // not taken for interrupted
    QCOMPARE(reader.lines(running).size(), 50);
  }

  void unfinishedSessionBecomesInterrupted() {
    QTemporaryDir dir;
    const QString db = dir.filePath("s.db");
    const QStringList lines = linesOf(m_tp);
    {
      // A writer that dies mid-run: batches committed, no finish.
      SessionStore store;
      QVERIFY(store.open(db));
      const qint64 id = store.create("killed");
      QVERIFY(store.appendLines(id, lines.mid(0, 40)));
      QVERIFY(store.appendLines(id, lines.mid(40, 40)));
    }
    DatabaseLock lock(db);
    QVERIFY(lock.tryLock());
    SessionStore store;
    QVERIFY(store.open(db));
    QCOMPARE(store.markInterrupted(), 1);
    const auto list = store.list();
    QCOMPARE(list[0].status, QStringLiteral("interrupted"));
    QCOMPARE(store.lines(list[0].id), lines.mid(0, 80));
    QVERIFY(!store.events(list[0].id).empty());
  }

  void importsRecordedStreams() {
    QTemporaryDir dir;
    SessionStore store;
    QVERIFY(store.open(dir.filePath("s.db")));
    const QString file = m_runs.filePath("tp.jsonl");
    const qint64 id = store.importStream(file);
    QVERIFY2(id > 0, qPrintable(store.error()));
    QCOMPARE(store.info(id).name, QStringLiteral("tp"));
    QCOMPARE(store.info(id).status, QStringLiteral("done"));
    QCOMPARE(store.lines(id), linesOf(m_tp));
    // Not a stream, and a newer protocol: refused, nothing added.
    QFile junk(dir.filePath("junk.jsonl"));
    QVERIFY(junk.open(QIODevice::WriteOnly));
    junk.write("hello\nworld\n");
    junk.close();
    QCOMPARE(store.importStream(junk.fileName()), qint64(0));
    QVERIFY2(store.error().contains("no ShardScope events"), qPrintable(store.error()));
    QFile newer(dir.filePath("newer.jsonl"));
    QVERIFY(newer.open(QIODevice::WriteOnly));
    newer.write("{\"type\":\"hello\",\"protocol\":\"shardscope-events\",\"version\":99}\n");
    newer.close();
    QCOMPARE(store.importStream(newer.fileName()), qint64(0));
    QVERIFY2(store.error().contains("newer"), qPrintable(store.error()));
    QCOMPARE(store.list().size(), 1);
  }

  void perfettoTraceIsWellFormed() {
    const Stream live = read_stream(m_tp);
    const QByteArray trace = perfettoTrace(live.events);
    QCOMPARE(checkTrace(trace), QString());
    const QJsonArray events = QJsonDocument::fromJson(trace).object().value("traceEvents").toArray();
    int complete = 0, counters = 0;
    for (const QJsonValue& v : events) {
      complete += v.toObject().value("ph") == "X";
      counters += v.toObject().value("ph") == "C";
    }
    QCOMPARE(complete, int(live.all<Span>().size()));
    QCOMPARE(counters, int(live.all<Mem>().size()));
    // The first span, in µs.
    const Span* s = live.all<Span>().front();
    for (const QJsonValue& v : events)
      if (v.toObject().value("ph") == "X") {
        QCOMPARE(v.toObject().value("ts").toDouble(), double(s->t0) / 1000.0);
        QCOMPARE(v.toObject().value("dur").toDouble(), double(s->t1 - s->t0) / 1000.0);
        break;
      }
    // The checker fails what it should.
    QString broken = QString::fromUtf8(trace);
    QVERIFY(!checkTrace(broken.replace("\"thread_name\"", "\"thread_nom\"").toUtf8()).isEmpty());
    QVERIFY(checkTrace(QByteArray(trace).replace("\"ts\":", "\"ts\":-")).contains("ts"));
    QVERIFY(checkTrace(QByteArray(trace).replace("\"dur\":", "\"duration\":")).contains("dur"));
    QVERIFY(!checkTrace(trace.left(trace.size() / 2)).isEmpty());
  }

  void csvExportHasEveryRow() {
    QTemporaryDir dir;
    const Stream live = read_stream(m_tp);
    QCOMPARE(exportCsv(live.events, dir.filePath("csv")), QString());
    auto rows = [&](const char* name) { return linesOf(readAll(dir.filePath("csv/") + name)).size() - 1; };
    QCOMPARE(rows("spans.csv"), qsizetype(live.all<Span>().size()));
    QCOMPARE(rows("memory.csv"), qsizetype(live.all<Mem>().size()));
    QCOMPARE(rows("metrics.csv"), qsizetype(live.all<Metric>().size()));
    QCOMPARE(rows("placement.csv"), qsizetype(live.all<Placement>().size()));
    QVERIFY(readAll(dir.filePath("csv/spans.csv")).startsWith("rank,stream,op,site,layer,phase,t0_ns"));
  }
};

QTEST_GUILESS_MAIN(TestSessions)
#include "tst_sessions.moc"

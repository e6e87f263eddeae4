// The session store: a real run saved and reopened equals the live stream
// line for line; names and notes with quotes, SQL or control characters
// round-trip unchanged; a newer, corrupt or truncated database is refused with
// a clear message and left untouched.
#include <QCryptographicHash>
#include <QProcess>
#include <QSqlDatabase>
#include <QSqlQuery>
#include <QTemporaryDir>
#include <QtTest>

#include "sessionstore.h"

namespace {
QByteArray digest(const QString& path) {
  QFile f(path);
  f.open(QIODevice::ReadOnly);
  return QCryptographicHash::hash(f.readAll(), QCryptographicHash::Sha256);
}
}  // namespace

class TestSessions : public QObject {
  Q_OBJECT
 private slots:
  void realRunRoundTrips() {
    QTemporaryDir dir;
    const QString stream = dir.filePath("run.jsonl"), db = dir.filePath("sessions.db");
    QProcess p;
    p.start(SHARDSCOPE_ENGINE_BIN, {"launch", "--model", "tiny-mamba2", "--strategy", "tp", "--devices", "2",
                                    "--prompt-len", "16", "--decode", "4", "--events", stream});
    QVERIFY(p.waitForFinished(120000));
    QCOMPARE(p.exitCode(), 0);
    QFile f(stream);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QStringList lines = QString::fromUtf8(f.readAll()).split('\n', Qt::SkipEmptyParts);
    QVERIFY(lines.size() > 100);
    const QString config = QJsonDocument::fromJson(lines[1].toUtf8()).object().value("config").toObject().isEmpty()
                               ? QString()
                               : QString::fromUtf8(QJsonDocument(QJsonDocument::fromJson(lines[1].toUtf8())
                                                                     .object()
                                                                     .value("config")
                                                                     .toObject())
                                                       .toJson(QJsonDocument::Compact));
    QVERIFY(!config.isEmpty());
    {
      SessionStore store;
      QVERIFY2(store.open(db), qPrintable(store.error()));
      const qint64 id = store.create("tp on 2", config);
      QVERIFY(id > 0);
      for (int i = 0; i < lines.size(); i += 64) QVERIFY(store.append(id, lines.mid(i, 64)));  // batches, as streamed
      QVERIFY(store.finish(id, "ok"));
    }
    SessionStore reopened;
    QVERIFY2(reopened.open(db), qPrintable(reopened.error()));
    const auto list = reopened.list();
    QCOMPARE(list.size(), 1);
    QCOMPARE(list[0].model, QStringLiteral("tiny-mamba2"));
    QCOMPARE(list[0].strategy, QStringLiteral("tp"));
    QCOMPARE(list[0].devices, 2);
    QCOMPARE(list[0].status, QStringLiteral("ok"));
    QCOMPARE(list[0].events, qint64(lines.size()));
    QCOMPARE(reopened.lines(list[0].id), lines);  // event for event, byte for byte
    QVERIFY(reopened.remove(list[0].id));
    QVERIFY(reopened.lines(list[0].id).isEmpty());  // events go with their session
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
    SessionStore store;
    QVERIFY(store.open(dir.filePath("s.db")));
    const qint64 id = store.create(text, "{}");
    QVERIFY(id > 0);
    QVERIFY(store.setNote(id, text));
    const auto list = store.list();
    QCOMPARE(list.size(), 1);
    QCOMPARE(list[0].name, text);
    QCOMPARE(list[0].note, text);
    QVERIFY(store.rename(id, text + text));
    QCOMPARE(store.list()[0].name, text + text);
  }

  void newerDatabaseIsRefusedAndKept() {
    QTemporaryDir dir;
    const QString path = dir.filePath("newer.db");
    {
      SessionStore store;
      QVERIFY(store.open(path));
      store.create("kept", "{}");
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
        const qint64 id = store.create("big", "{}");
        QStringList many;
        for (int i = 0; i < 5000; ++i) many << QString("{\"type\":\"span\",\"n\":%1}").arg(i);
        QVERIFY(store.append(id, many));
      }
      QFile f(path);
      QVERIFY(f.open(QIODevice::ReadWrite));
      QVERIFY(f.resize(f.size() / 2));
    }
    const QByteArray before = digest(path);
    SessionStore store;
    QVERIFY(!store.open(path));
    QVERIFY2(store.error().contains("untouched"), qPrintable(store.error()));
    QCOMPARE(digest(path), before);
  }
};

QTEST_GUILESS_MAIN(TestSessions)
#include "tst_sessions.moc"

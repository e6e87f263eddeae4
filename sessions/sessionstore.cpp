#include "sessionstore.h"

#include <QDateTime>
#include <QFileInfo>
#include <QJsonDocument>
#include <QJsonObject>
#include <QSqlError>
#include <QSqlQuery>
#include <QUuid>
#include <QVariant>

SessionStore::SessionStore() : m_connection(QUuid::createUuid().toString()) {}

SessionStore::~SessionStore() {
  m_db.close();
  m_db = QSqlDatabase();
  QSqlDatabase::removeDatabase(m_connection);
}

bool SessionStore::exec(const QString& sql) {
  QSqlQuery q(m_db);
  if (q.exec(sql)) return true;
  m_error = q.lastError().text();
  return false;
}

bool SessionStore::open(const QString& path) {
  // A file that exists must already be a SQLite database: never turn
  // something else into one.
  QFileInfo info(path);
  if (info.exists()) {
    QFile f(path);
    if (!f.open(QIODevice::ReadOnly)) {
      m_error = QStringLiteral("%1: cannot read (%2)").arg(path, f.errorString());
      return false;
    }
    const QByteArray head = f.read(16);
    if (info.size() > 0 && head != QByteArray("SQLite format 3\0", 16)) {
      m_error = QStringLiteral("%1 is not a ShardScope session database (not SQLite); it was left untouched").arg(path);
      return false;
    }
  }
  m_db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), m_connection);
  m_db.setDatabaseName(path);
  if (!m_db.open()) {
    m_error = QStringLiteral("%1: %2").arg(path, m_db.lastError().text());
    return false;
  }
  if (!exec(QStringLiteral("PRAGMA foreign_keys = ON")) || !exec(QStringLiteral("PRAGMA journal_mode = WAL")) ||
      !exec(QStringLiteral("PRAGMA busy_timeout = 2000"))) {
    m_error = QStringLiteral("%1 is damaged or unreadable (%2); it was left untouched").arg(path, m_error);
    return false;
  }
  if (info.exists() && info.size() > 0) {
    // A truncated or damaged file is reported, not repaired over.
    QSqlQuery check(m_db);
    if (!check.exec(QStringLiteral("PRAGMA quick_check")) || !check.next() ||
        check.value(0).toString() != QLatin1String("ok")) {
      m_error = QStringLiteral("%1 is damaged (%2); it was left untouched")
                    .arg(path, check.lastError().isValid() ? check.lastError().text() : check.value(0).toString());
      return false;
    }
  }
  return migrate();
}

bool SessionStore::migrate() {
  QSqlQuery q(m_db);
  if (!q.exec(QStringLiteral("PRAGMA user_version")) || !q.next()) {
    m_error = QStringLiteral("%1: corrupt or unreadable (%2); it was left untouched")
                  .arg(m_db.databaseName(), q.lastError().text());
    return false;
  }
  const int version = q.value(0).toInt();
  if (version > kSchemaVersion) {
    m_error = QStringLiteral("%1 was written by a newer ShardScope (schema %2, this one reads up to %3); update to "
                             "open it")
                  .arg(m_db.databaseName())
                  .arg(version)
                  .arg(kSchemaVersion);
    return false;
  }
  if (version == kSchemaVersion) return true;
  // Forward migrations, one step per version, each in a transaction.
  if (!m_db.transaction()) {
    m_error = m_db.lastError().text();
    return false;
  }
  const bool ok =
      exec(QStringLiteral("CREATE TABLE sessions (id INTEGER PRIMARY KEY, name TEXT NOT NULL, model TEXT, "
                          "strategy TEXT, backend TEXT, devices INTEGER, created TEXT NOT NULL, ended TEXT, "
                          "status TEXT NOT NULL, engine_version TEXT, config TEXT, note TEXT NOT NULL DEFAULT '')")) &&
      exec(QStringLiteral("CREATE TABLE events (session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE "
                          "CASCADE, seq INTEGER NOT NULL, line TEXT NOT NULL, PRIMARY KEY (session_id, seq))")) &&
      exec(QStringLiteral("PRAGMA user_version = 1"));
  if (!ok) {
    m_db.rollback();
    return false;
  }
  return m_db.commit();
}

qint64 SessionStore::create(const QString& name, const QString& configJson) {
  const QJsonObject c = QJsonDocument::fromJson(configJson.toUtf8()).object();
  QSqlQuery q(m_db);
  q.prepare(QStringLiteral("INSERT INTO sessions (name, model, strategy, backend, devices, created, status, config) "
                           "VALUES (?, ?, ?, ?, ?, ?, 'running', ?)"));
  q.addBindValue(name.isNull() ? QStringLiteral("") : name);  // NULL is not a name
  q.addBindValue(c.value("model").toObject().value("name").toString());
  q.addBindValue(c.value("strategy").toString());
  q.addBindValue(c.value("backend").toString());
  q.addBindValue(c.value("devices").toInt(1));
  q.addBindValue(QDateTime::currentDateTimeUtc().toString(Qt::ISODate));
  q.addBindValue(configJson);
  if (!q.exec()) {
    m_error = q.lastError().text();
    return 0;
  }
  return q.lastInsertId().toLongLong();
}

bool SessionStore::append(qint64 session, const QStringList& lines) {
  if (lines.isEmpty()) return true;
  QSqlQuery next(m_db);
  next.prepare(QStringLiteral("SELECT COALESCE(MAX(seq) + 1, 0) FROM events WHERE session_id = ?"));
  next.addBindValue(session);
  if (!next.exec() || !next.next()) {
    m_error = next.lastError().text();
    return false;
  }
  qint64 seq = next.value(0).toLongLong();
  if (!m_db.transaction()) {
    m_error = m_db.lastError().text();
    return false;
  }
  QSqlQuery q(m_db);
  q.prepare(QStringLiteral("INSERT INTO events (session_id, seq, line) VALUES (?, ?, ?)"));
  for (const QString& l : lines) {
    q.bindValue(0, session);
    q.bindValue(1, seq++);
    q.bindValue(2, l);
    if (!q.exec()) {
      m_error = q.lastError().text();
      m_db.rollback();
      return false;
    }
  }
  if (!m_db.commit()) {
    m_error = m_db.lastError().text();
    return false;
  }
  return true;
}

static bool update(QSqlDatabase& db, QString& error, const QString& sql, const QVariantList& values) {
  QSqlQuery q(db);
  q.prepare(sql);
  for (const QVariant& v : values) q.addBindValue(v);
  if (q.exec()) return true;
  error = q.lastError().text();
  return false;
}

bool SessionStore::finish(qint64 session, const QString& status) {
  return update(m_db, m_error, QStringLiteral("UPDATE sessions SET status = ?, ended = ? WHERE id = ?"),
                {status, QDateTime::currentDateTimeUtc().toString(Qt::ISODate), session});
}
bool SessionStore::rename(qint64 session, const QString& name) {
  return update(m_db, m_error, QStringLiteral("UPDATE sessions SET name = ? WHERE id = ?"),
                {name.isNull() ? QStringLiteral("") : name, session});
}
bool SessionStore::setNote(qint64 session, const QString& note) {
  return update(m_db, m_error, QStringLiteral("UPDATE sessions SET note = ? WHERE id = ?"),
                {note.isNull() ? QStringLiteral("") : note, session});
}
bool SessionStore::remove(qint64 session) {
  return update(m_db, m_error, QStringLiteral("DELETE FROM sessions WHERE id = ?"), {session});
}

QVector<SessionInfo> SessionStore::list() const {
  QVector<SessionInfo> out;
  QSqlQuery q(m_db);
  q.exec(QStringLiteral("SELECT s.id, s.name, s.model, s.strategy, s.backend, s.devices, s.status, s.created, "
                        "s.ended, s.note, (SELECT COUNT(*) FROM events e WHERE e.session_id = s.id) "
                        "FROM sessions s ORDER BY s.id"));
  while (q.next()) {
    SessionInfo s;
    s.id = q.value(0).toLongLong();
    s.name = q.value(1).toString();
    s.model = q.value(2).toString();
    s.strategy = q.value(3).toString();
    s.backend = q.value(4).toString();
    s.devices = q.value(5).toInt();
    s.status = q.value(6).toString();
    s.created = q.value(7).toString();
    s.ended = q.value(8).toString();
    s.note = q.value(9).toString();
    s.events = q.value(10).toLongLong();
    out << s;
  }
  return out;
}

QStringList SessionStore::lines(qint64 session) const {
  QStringList out;
  QSqlQuery q(m_db);
  q.prepare(QStringLiteral("SELECT line FROM events WHERE session_id = ? ORDER BY seq"));
  q.addBindValue(session);
  q.exec();
  while (q.next()) out << q.value(0).toString();
  return out;
}

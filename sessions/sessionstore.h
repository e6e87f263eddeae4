// The session store: every run's setup, status and raw event stream in one
// SQLite database (Qt Sql), so runs can be reopened, replayed and compared.
// WAL journal, foreign keys on, a schema version checked on open (a newer
// database is refused, never rewritten), all SQL parameterized.
#pragma once

#include <QSqlDatabase>
#include <QString>
#include <QStringList>
#include <QVector>

struct SessionInfo {
  qint64 id = 0;
  QString name, model, strategy, backend, status, created, ended, note;
  int devices = 1;
  qint64 events = 0;
};

class SessionStore {
 public:
  static constexpr int kSchemaVersion = 1;

  SessionStore();
  ~SessionStore();
  SessionStore(const SessionStore&) = delete;
  SessionStore& operator=(const SessionStore&) = delete;

  // Opens (creating if absent) the database at `path`. On failure returns
  // false and error() says why in one line; the file is left as it was.
  bool open(const QString& path);
  QString error() const { return m_error; }

  // A new session from a stream's config record (JSON text); status "running".
  qint64 create(const QString& name, const QString& configJson);
  // Appends raw stream lines in one transaction (a batch).
  bool append(qint64 session, const QStringList& lines);
  bool finish(qint64 session, const QString& status);
  bool rename(qint64 session, const QString& name);
  bool setNote(qint64 session, const QString& note);
  bool remove(qint64 session);

  QVector<SessionInfo> list() const;
  QStringList lines(qint64 session) const;

 private:
  bool exec(const QString& sql);
  bool migrate();
  QString m_connection;
  QSqlDatabase m_db;
  QString m_error;
};

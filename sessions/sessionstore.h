// The session store: every run's setup, status, raw event stream and the
// derived tables the views open from, in one SQLite database (Qt Sql).
//
// Layout (schema 2; see migrate() for the steps from 1):
//   sessions      one row per run: name, tags, note, setup columns, status,
//                 headline figures (JSON), the config record, event count
//   chunks        the raw stream as it arrived: batches of whole lines,
//                 zlib-compressed, in order (export and replay read these)
//   spans         derived: the batch's spans packed as binary records
//   mem_samples   derived: the batch's memory samples, packed likewise
//   names         the strings spans refer to (op, site, phase, stream)
//   records       derived: every other record (device, placement, tokens,
//                 errors, done, ...) as its JSON line
//   metrics       derived: name/value rows (headline figures, peaks)
//   accuracy      derived: accuracy rows (metric, site, layer, config)
// Packed chunks keep saving above 200k events/s and opening a million-event
// session within seconds; the plain tables stay queryable.
//
// WAL journal, foreign keys on, every statement parameterized. A file that is
// not SQLite, is damaged, or was written by a newer schema is refused with one
// line and left untouched.
#pragma once

#include <QByteArray>
#include <QLockFile>
#include <QSqlDatabase>
#include <QString>
#include <QStringList>
#include <QVector>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "protocol/events.h"

struct SessionInfo {
  qint64 id = 0;
  QString name, model, strategy, backend, status, created, ended, note, tags;
  int devices = 1;
  qint64 events = 0;
  QString headline;  // JSON object of headline figures (tokens/s, TTFT, peak bytes, comm bytes)
  qint64 prompt = 0, decode = 0;  // the workload, from the config
  QStringList command;  // the engine's arguments the explorer ran it with (empty: imported, or saved before schema 3)
};

class SessionStore {
 public:
  static constexpr int kSchemaVersion = 3;
  enum class Mode { ReadWrite, ReadOnly };
  // Whether open() verifies the file (SQLite quick_check); a second
  // connection to a database already verified by this process may skip it.
  enum class Check { Verify, Skip };

  SessionStore();
  ~SessionStore();
  SessionStore(const SessionStore&) = delete;
  SessionStore& operator=(const SessionStore&) = delete;

  // Opens (creating if absent, in ReadWrite) the database at `path`. On
  // failure returns false and error() says why in one line; the file is left
  // as it was. Sessions deleted earlier (and not undone) are purged here.
  bool open(const QString& path, Mode mode = Mode::ReadWrite, Check check = Check::Verify);
  QString error() const { return m_error; }
  QString path() const { return m_path; }
  bool readOnly() const { return m_mode == Mode::ReadOnly; }
  // Caps the database at about `bytes` (SQLite max_page_count); writes past it
  // fail with a "full" error and roll back, keeping everything saved before.
  bool setSizeLimit(qint64 bytes);
  // Sessions still marked running that no process is writing any more (the
  // caller holds the database's writer lock) become "interrupted".
  int markInterrupted();

  // A new session; status "running". configJson may be empty until the
  // stream's config record arrives (then setConfig fills the setup columns).
  qint64 create(const QString& name, const QString& configJson = {});
  bool setConfig(qint64 session, const QString& configJson);
  // The engine's arguments the run was started with (what reopening it sets the setup to).
  bool setCommand(qint64 session, const QStringList& args);
  // Appends one batch in one transaction: the raw bytes of whole lines as
  // they arrived, and the events parsed from them (for the derived tables).
  bool append(qint64 session, const QByteArray& rawLines, const std::vector<const ss::proto::Event*>& events);
  bool append(qint64 session, const QByteArray& rawLines, const std::vector<ss::proto::Event>& events);
  // Convenience for tests and import: raw lines, parsed here.
  bool appendLines(qint64 session, const QStringList& lines);
  bool finish(qint64 session, const QString& status);
  bool rename(qint64 session, const QString& name);
  bool setNote(qint64 session, const QString& note);
  bool setTags(qint64 session, const QString& tags);
  // Delete with undo: remove() hides the session, restore() brings it back;
  // hidden sessions are purged on the next open().
  bool remove(qint64 session);
  bool restore(qint64 session);
  bool purge(qint64 session);

  QVector<SessionInfo> list() const;
  SessionInfo info(qint64 session) const;
  // The raw stream, line by line as it arrived.
  QStringList lines(qint64 session) const;
  QByteArray rawStream(qint64 session) const;
  // The session's events from the derived tables, without re-parsing the
  // stream: spans and memory samples unpacked, the other records parsed.
  // Good enough to rebuild every view (order kept per rank and per type).
  std::vector<ss::proto::Event> events(qint64 session) const;
  // The same, handed over in batches of at most 65536 events (nothing of the
  // whole session is held twice).
  void readEvents(qint64 session, const std::function<void(std::vector<ss::proto::Event>&&)>& sink) const;

  // Imports a recorded stream file as a new session; returns its id or 0.
  qint64 importStream(const QString& file, const QString& name = {});

 private:
  bool exec(const QString& sql);
  bool migrate();
  bool migrateFrom1();
  bool fail(const QString& what);
  int nameId(qint64 session, const std::string& s);
  bool loadNames(qint64 session);
  QString computeHeadline(qint64 session);

  QString m_connection, m_path;
  QSqlDatabase m_db;
  QString m_error;
  Mode m_mode = Mode::ReadWrite;
  bool m_migrating = false;
  // Per session: string -> id of the names table, and the next chunk number.
  struct Writing {
    std::map<std::string, int> names;
    std::vector<std::pair<int, std::string>> fresh;  // names to insert with the batch
    qint64 nextChunk = 0, events = 0;
    double commBytes = 0;  // wire bytes of this writer's comm spans, for the headline
  };
  std::map<qint64, Writing> m_writing;
};

// Headline figures of a run from its whole-run metrics (what the browser and
// the compare table show), as a compact JSON object.
QString headlineJson(const std::map<std::string, double>& metrics);

// One writer per database: the app holds this lock while it may save. A
// second instance finds it held, says so, and opens the database read-only.
// A lock left by a process that died is taken over (QLockFile's stale check).
class DatabaseLock {
 public:
  explicit DatabaseLock(const QString& dbPath) : m_lock(dbPath + QStringLiteral(".lock")) { m_lock.setStaleLockTime(0); }
  bool tryLock() { return m_lock.tryLock(0); }
  // "pid N on HOST" of the holder, after a failed tryLock.
  QString holder() const {
    qint64 pid = 0;
    QString host, app;
    return m_lock.getLockInfo(&pid, &host, &app) ? QStringLiteral("pid %1 on %2").arg(pid).arg(host)
                                                 : QStringLiteral("another process");
  }

 private:
  QLockFile m_lock;
};

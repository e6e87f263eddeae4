#include "sessionstore.h"

#include <QDateTime>
#include <QFile>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QSqlError>
#include <QSqlQuery>
#include <QUuid>
#include <QVariant>

#include <cstring>
#include <functional>

namespace {
using namespace ss::proto;

// Packed binary records: little-endian PODs appended to a byte string. The
// layout is private to this file (schema 2); a change means a schema bump.
struct Packer {
  QByteArray out;
  template <class T>
  void put(T v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
};
struct Unpacker {
  const char* p;
  const char* end;
  bool ok = true;
  template <class T>
  T get() {
    T v{};
    if (end - p < ptrdiff_t(sizeof v)) {
      ok = false;
      return v;
    }
    std::memcpy(&v, p, sizeof v);
    p += sizeof v;
    return v;
  }
};

// Calls read(u) once per record packed in `table`'s chunks of `session`, in
// order, until the data runs out.
template <class Read>
void readPacked(const QSqlDatabase& db, const char* table, qint64 session, Read&& read) {
  QSqlQuery q(db);
  q.setForwardOnly(true);
  q.prepare(QStringLiteral("SELECT count, data FROM %1 WHERE session_id = ? ORDER BY seq").arg(QLatin1String(table)));
  q.addBindValue(session);
  q.exec();
  while (q.next()) {
    const QByteArray data = qUncompress(q.value(1).toByteArray());
    Unpacker u{data.constData(), data.constData() + data.size()};
    const int n = q.value(0).toInt();
    for (int i = 0; i < n && u.ok; ++i) read(u);
  }
}

constexpr int kCompression = 1;  // zlib level: fast enough to keep up with the stream

QByteArray pack(const QByteArray& raw) { return qCompress(raw, kCompression); }
}  // namespace

SessionStore::SessionStore() : m_connection(QUuid::createUuid().toString()) {}

SessionStore::~SessionStore() {
  m_db.close();
  m_db = QSqlDatabase();
  QSqlDatabase::removeDatabase(m_connection);
}

bool SessionStore::exec(const QString& sql) {
  QSqlQuery q(m_db);
  if (q.exec(sql)) return true;
  return fail(q.lastError().text());
}

bool SessionStore::fail(const QString& what) {
  if (what.contains(QLatin1String("full"), Qt::CaseInsensitive))
    m_error = QStringLiteral("%1 is full (%2): the last batch was not saved; everything before it is kept. Free "
                             "space or delete old sessions")
                  .arg(m_path, what);
  else if (what.contains(QLatin1String("locked"), Qt::CaseInsensitive) ||
           what.contains(QLatin1String("busy"), Qt::CaseInsensitive))
    m_error = QStringLiteral("%1 is busy: another ShardScope is writing it (%2)").arg(m_path, what);
  else if (what.contains(QLatin1String("readonly"), Qt::CaseInsensitive) ||
           what.contains(QLatin1String("read-only"), Qt::CaseInsensitive))
    m_error = QStringLiteral("%1 is read-only here (%2): sessions can be opened, not saved").arg(m_path, what);
  else
    m_error = QStringLiteral("%1: %2").arg(m_path, what);
  return false;
}

bool SessionStore::open(const QString& path, Mode mode, Check verify) {
  m_path = path;
  m_mode = mode;
  m_writing.clear();
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
  } else if (mode == Mode::ReadOnly) {
    m_error = QStringLiteral("%1 does not exist").arg(path);
    return false;
  } else {
    const QFileInfo dir(info.absolutePath());
    if (!dir.isDir() || !dir.isWritable()) {
      m_error = QStringLiteral("cannot create %1: the folder %2; choose another with --db")
                    .arg(path, dir.isDir() ? QStringLiteral("is read-only") : QStringLiteral("does not exist"));
      return false;
    }
  }
  m_db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), m_connection);
  m_db.setDatabaseName(path);
  if (mode == Mode::ReadOnly) m_db.setConnectOptions(QStringLiteral("QSQLITE_OPEN_READONLY"));
  if (!m_db.open()) {
    m_error = QStringLiteral("%1: %2").arg(path, m_db.lastError().text());
    return false;
  }
  if (!exec(QStringLiteral("PRAGMA foreign_keys = ON")) || !exec(QStringLiteral("PRAGMA busy_timeout = 3000"))) {
    m_error = QStringLiteral("%1 is damaged or unreadable (%2); it was left untouched").arg(path, m_error);
    return false;
  }
  if (info.exists() && info.size() > 0 && verify == Check::Verify) {
    // A truncated or damaged file is reported, not repaired over.
    QSqlQuery check(m_db);
    if (!check.exec(QStringLiteral("PRAGMA quick_check")) || !check.next() ||
        check.value(0).toString() != QLatin1String("ok")) {
      m_error = QStringLiteral("%1 is damaged (%2); it was left untouched")
                    .arg(path, check.lastError().isValid() ? check.lastError().text() : check.value(0).toString());
      return false;
    }
  }
  if (mode == Mode::ReadWrite && !exec(QStringLiteral("PRAGMA journal_mode = WAL"))) {
    m_error = QStringLiteral("%1 cannot be written (%2); it was left untouched").arg(path, m_error);
    return false;
  }
  if (!migrate()) return false;
  if (mode == Mode::ReadWrite) {
    // Deletions not undone before the last close are final now.
    QSqlQuery q(m_db);
    q.exec(QStringLiteral("SELECT id FROM sessions WHERE deleted = 1"));
    QVector<qint64> ids;
    while (q.next()) ids << q.value(0).toLongLong();
    for (qint64 id : ids) purge(id);
  }
  return true;
}

bool SessionStore::setSizeLimit(qint64 bytes) {
  QSqlQuery q(m_db);
  if (!q.exec(QStringLiteral("PRAGMA page_size")) || !q.next()) return fail(q.lastError().text());
  const qint64 pages = std::max<qint64>(1, bytes / q.value(0).toLongLong());
  return exec(QStringLiteral("PRAGMA max_page_count = %1").arg(pages));
}

bool SessionStore::migrate() {
  QSqlQuery q(m_db);
  if (!q.exec(QStringLiteral("PRAGMA user_version")) || !q.next()) {
    m_error = QStringLiteral("%1: corrupt or unreadable (%2); it was left untouched")
                  .arg(m_db.databaseName(), q.lastError().text());
    return false;
  }
  const int version = q.value(0).toInt();
  q.finish();  // no statement may stay open while tables are altered
  if (version > kSchemaVersion) {
    m_error = QStringLiteral("%1 was written by a newer ShardScope (schema %2, this one reads up to %3); update to "
                             "open it")
                  .arg(m_db.databaseName())
                  .arg(version)
                  .arg(kSchemaVersion);
    return false;
  }
  if (version == kSchemaVersion) return true;
  if (m_mode == Mode::ReadOnly) {
    m_error = QStringLiteral("%1 uses schema %2 and must be upgraded to %3, which needs write access; open it "
                             "read-write once")
                  .arg(m_db.databaseName())
                  .arg(version)
                  .arg(kSchemaVersion);
    return false;
  }
  // Forward migrations, one step per version, all in one transaction: a
  // failure leaves the file exactly as it was.
  if (!m_db.transaction()) return fail(m_db.lastError().text());
  bool ok = true;
  if (version < 1)
    ok = exec(QStringLiteral("CREATE TABLE sessions (id INTEGER PRIMARY KEY, name TEXT NOT NULL, model TEXT, "
                             "strategy TEXT, backend TEXT, devices INTEGER, created TEXT NOT NULL, ended TEXT, "
                             "status TEXT NOT NULL, engine_version TEXT, config TEXT, note TEXT NOT NULL DEFAULT '')")) &&
         exec(QStringLiteral("CREATE TABLE events (session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE "
                             "CASCADE, seq INTEGER NOT NULL, line TEXT NOT NULL, PRIMARY KEY (session_id, seq))"));
  m_migrating = true;
  if (ok && version < 2) ok = migrateFrom1();
  m_migrating = false;
  // Schema 3: the engine command a session was run with.
  if (ok && version < 3) ok = exec(QStringLiteral("ALTER TABLE sessions ADD COLUMN command TEXT NOT NULL DEFAULT '[]'"));
  m_writing.clear();
  if (ok) ok = exec(QStringLiteral("PRAGMA user_version = %1").arg(kSchemaVersion));
  if (!ok) {
    const QString why = m_error;
    m_db.rollback();
    m_error = QStringLiteral("upgrading %1 failed (%2); it was left as it was").arg(m_path, why);
    return false;
  }
  if (!m_db.commit()) return fail(m_db.lastError().text());
  return true;
}

// Schema 1 kept one row per raw line. Schema 2 keeps compressed chunks of the
// raw stream plus derived tables; every v1 session is rewritten through the
// same append path a live run uses, so nothing is lost and it opens fast.
bool SessionStore::migrateFrom1() {
  const char* ddl[] = {
      "ALTER TABLE sessions ADD COLUMN tags TEXT NOT NULL DEFAULT ''",
      "ALTER TABLE sessions ADD COLUMN deleted INTEGER NOT NULL DEFAULT 0",
      "ALTER TABLE sessions ADD COLUMN headline TEXT NOT NULL DEFAULT '{}'",
      "ALTER TABLE sessions ADD COLUMN events INTEGER NOT NULL DEFAULT 0",
      "CREATE TABLE chunks (session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE, seq INTEGER NOT "
      "NULL, lines INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (session_id, seq))",
      "CREATE TABLE spans (session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE, seq INTEGER NOT "
      "NULL, count INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (session_id, seq))",
      "CREATE TABLE mem_samples (session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE, seq INTEGER "
      "NOT NULL, count INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (session_id, seq))",
      "CREATE TABLE names (session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE, id INTEGER NOT "
      "NULL, text TEXT NOT NULL, PRIMARY KEY (session_id, id))",
      "CREATE TABLE records (session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE, seq INTEGER NOT "
      "NULL, type TEXT NOT NULL, line TEXT NOT NULL, PRIMARY KEY (session_id, seq))",
      "CREATE TABLE metrics (session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE, rank INTEGER NOT "
      "NULL, name TEXT NOT NULL, value REAL, unit TEXT)",
      "CREATE INDEX metrics_by_session ON metrics(session_id)",
      "CREATE TABLE accuracy (session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE, metric TEXT NOT "
      "NULL, site TEXT, layer INTEGER, value REAL, config TEXT)",
      "CREATE INDEX accuracy_by_session ON accuracy(session_id)",
  };
  for (const char* s : ddl)
    if (!exec(QString::fromLatin1(s))) return false;
  QSqlQuery ids(m_db);
  if (!ids.exec(QStringLiteral("SELECT id FROM sessions ORDER BY id"))) return fail(ids.lastError().text());
  QVector<qint64> sessions;
  while (ids.next()) sessions << ids.value(0).toLongLong();
  ids.finish();  // an open statement would lock the table against DROP
  for (qint64 id : sessions) {
    QSqlQuery q(m_db);
    q.setForwardOnly(true);
    q.prepare(QStringLiteral("SELECT line FROM events WHERE session_id = ? ORDER BY seq"));
    q.addBindValue(id);
    if (!q.exec()) return fail(q.lastError().text());
    QStringList lines;
    while (q.next()) lines << q.value(0).toString();
    // v1 appended in batches; one chunk per 4096 lines keeps chunks bounded.
    for (int i = 0; i < lines.size(); i += 4096)
      if (!appendLines(id, lines.mid(i, 4096))) return false;
    QSqlQuery u(m_db);
    u.prepare(QStringLiteral("UPDATE sessions SET headline = ? WHERE id = ?"));
    u.addBindValue(computeHeadline(id));
    u.addBindValue(id);
    if (!u.exec()) return fail(u.lastError().text());
    m_writing.erase(id);
  }
  return exec(QStringLiteral("DROP TABLE events"));
}

int SessionStore::markInterrupted() {
  QSqlQuery q(m_db);
  q.prepare(QStringLiteral("UPDATE sessions SET status = 'interrupted' WHERE status = 'running'"));
  if (!q.exec()) {
    fail(q.lastError().text());
    return 0;
  }
  return q.numRowsAffected();
}

static QString configColumnsSql() {
  return QStringLiteral("model = ?, strategy = ?, backend = ?, devices = ?, config = ?");
}
static void bindConfig(QSqlQuery& q, const QString& configJson) {
  const QJsonObject c = QJsonDocument::fromJson(configJson.toUtf8()).object();
  q.addBindValue(c.value("model").toObject().value("name").toString());
  q.addBindValue(c.value("strategy").toString());
  q.addBindValue(c.value("backend").toString());
  q.addBindValue(c.value("devices").toInt(1));
  q.addBindValue(configJson);
}

qint64 SessionStore::create(const QString& name, const QString& configJson) {
  QSqlQuery q(m_db);
  q.prepare(QStringLiteral("INSERT INTO sessions (name, model, strategy, backend, devices, config, created, status) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?, 'running')"));
  q.addBindValue(name.isNull() ? QStringLiteral("") : name);  // NULL is not a name
  bindConfig(q, configJson);
  q.addBindValue(QDateTime::currentDateTimeUtc().toString(Qt::ISODate));
  if (!q.exec()) {
    fail(q.lastError().text());
    return 0;
  }
  return q.lastInsertId().toLongLong();
}

bool SessionStore::setConfig(qint64 session, const QString& configJson) {
  QSqlQuery q(m_db);
  q.prepare(QStringLiteral("UPDATE sessions SET %1 WHERE id = ?").arg(configColumnsSql()));
  bindConfig(q, configJson);
  q.addBindValue(session);
  return q.exec() || fail(q.lastError().text());
}

bool SessionStore::loadNames(qint64 session) {
  if (m_writing.count(session)) return true;
  Writing& w = m_writing[session];
  QSqlQuery q(m_db);
  q.prepare(QStringLiteral("SELECT id, text FROM names WHERE session_id = ?"));
  q.addBindValue(session);
  if (!q.exec()) return fail(q.lastError().text());
  while (q.next()) w.names[q.value(1).toString().toStdString()] = q.value(0).toInt();
  QSqlQuery c(m_db);
  c.prepare(QStringLiteral("SELECT COALESCE(MAX(seq) + 1, 0), (SELECT events FROM sessions WHERE id = ?) FROM chunks "
                           "WHERE session_id = ?"));
  c.addBindValue(session);
  c.addBindValue(session);
  if (!c.exec() || !c.next()) return fail(c.lastError().text());
  w.nextChunk = c.value(0).toLongLong();
  w.events = c.value(1).toLongLong();
  return true;
}

int SessionStore::nameId(qint64 session, const std::string& s) {
  Writing& w = m_writing[session];
  auto it = w.names.find(s);
  if (it != w.names.end()) return it->second;
  const int id = int(w.names.size());
  w.names.emplace(s, id);
  w.fresh.emplace_back(id, s);
  return id;
}

bool SessionStore::append(qint64 session, const QByteArray& rawLines, const std::vector<Event>& events) {
  std::vector<const Event*> pointers;
  pointers.reserve(events.size());
  for (const Event& e : events) pointers.push_back(&e);
  return append(session, rawLines, pointers);
}

bool SessionStore::append(qint64 session, const QByteArray& rawLines, const std::vector<const Event*>& events) {
  if (rawLines.isEmpty() && events.empty()) return true;
  if (!loadNames(session)) return false;
  Writing& w = m_writing[session];
  const Writing saved = w;
  Packer spans, mem;
  int nSpans = 0, nMem = 0;
  struct Row {
    qint64 seq;
    std::string type, line;
  };
  std::vector<Row> records;
  std::vector<const Metric*> metrics;
  std::vector<const Accuracy*> accuracy;
  QString config;
  double commBytes = 0;
  qint64 seq = w.events;
  for (const Event* ep : events) {
    const Event& e = *ep;
    if (auto* s = std::get_if<Span>(&e)) {
      spans.put<int32_t>(s->rank);
      spans.put<int32_t>(nameId(session, s->stream));
      spans.put<int32_t>(nameId(session, s->op));
      spans.put<int32_t>(nameId(session, s->site));
      spans.put<int32_t>(nameId(session, s->phase));
      spans.put<int32_t>(s->layer);
      spans.put<int64_t>(s->t0);
      spans.put<int64_t>(s->t1);
      spans.put<double>(s->flops);
      spans.put<double>(s->bytes);
      spans.put<uint16_t>(uint16_t(std::min<size_t>(s->peers.size(), 65535)));
      for (size_t i = 0; i < s->peers.size() && i < 65535; ++i) spans.put<int32_t>(s->peers[i]);
      spans.put<uint16_t>(uint16_t(std::min<size_t>(s->dims.size(), 65535)));
      for (size_t i = 0; i < s->dims.size() && i < 65535; ++i) spans.put<int64_t>(s->dims[i]);
      if (s->stream == "comm") commBytes += s->bytes;
      ++nSpans;
    } else if (auto* m = std::get_if<Mem>(&e)) {
      mem.put<int32_t>(m->rank);
      mem.put<int64_t>(m->t);
      for (int64_t b : m->bytes) mem.put<int64_t>(b);
      mem.put<int64_t>(m->peak);
      ++nMem;
    } else {
      records.push_back({seq, std::string(type_name(e)), to_line(e)});
      if (auto* mt = std::get_if<Metric>(&e)) metrics.push_back(mt);
      if (auto* a = std::get_if<Accuracy>(&e)) accuracy.push_back(a);
      if (auto* c = std::get_if<Config>(&e)) config = QString::fromStdString(c->config.dump());
    }
    ++seq;
  }
  // Inside a migration the batch joins the migration's transaction.
  const bool own = !m_migrating;
  if (own && !m_db.transaction()) return fail(m_db.lastError().text());
  auto abort = [&](const QSqlQuery& q) {
    fail(q.lastError().text());
    if (own) m_db.rollback();
    w = saved;  // the names and counters this batch took are not in the file
    return false;
  };
  const qint64 chunk = w.nextChunk;
  QSqlQuery q(m_db);
  if (!rawLines.isEmpty()) {
    q.prepare(QStringLiteral("INSERT INTO chunks (session_id, seq, lines, data) VALUES (?, ?, ?, ?)"));
    q.addBindValue(session);
    q.addBindValue(chunk);
    q.addBindValue(qint64(rawLines.count('\n')));
    q.addBindValue(pack(rawLines));
    if (!q.exec()) return abort(q);
  }
  for (auto [table, packer, n] : {std::tuple{"spans", &spans, nSpans}, std::tuple{"mem_samples", &mem, nMem}}) {
    if (n == 0) continue;
    q.prepare(QStringLiteral("INSERT INTO %1 (session_id, seq, count, data) VALUES (?, ?, ?, ?)").arg(table));
    q.addBindValue(session);
    q.addBindValue(chunk);
    q.addBindValue(n);
    q.addBindValue(pack(packer->out));
    if (!q.exec()) return abort(q);
  }
  if (!w.fresh.empty()) {
    q.prepare(QStringLiteral("INSERT INTO names (session_id, id, text) VALUES (?, ?, ?)"));
    for (auto& [id, text] : w.fresh) {
      q.bindValue(0, session);
      q.bindValue(1, id);
      q.bindValue(2, QString::fromStdString(text));
      if (!q.exec()) return abort(q);
    }
  }
  if (!records.empty()) {
    q.prepare(QStringLiteral("INSERT INTO records (session_id, seq, type, line) VALUES (?, ?, ?, ?)"));
    for (const Row& r : records) {
      q.bindValue(0, session);
      q.bindValue(1, r.seq);
      q.bindValue(2, QString::fromStdString(r.type));
      q.bindValue(3, QString::fromStdString(r.line));
      if (!q.exec()) return abort(q);
    }
  }
  if (!metrics.empty()) {
    q.prepare(QStringLiteral("INSERT INTO metrics (session_id, rank, name, value, unit) VALUES (?, ?, ?, ?, ?)"));
    for (const Metric* m : metrics) {
      q.bindValue(0, session);
      q.bindValue(1, m->rank);
      q.bindValue(2, QString::fromStdString(m->name));
      q.bindValue(3, m->value);
      q.bindValue(4, QString::fromStdString(m->unit));
      if (!q.exec()) return abort(q);
    }
  }
  if (!accuracy.empty()) {
    q.prepare(QStringLiteral("INSERT INTO accuracy (session_id, metric, site, layer, value, config) VALUES (?, ?, ?, "
                             "?, ?, ?)"));
    for (const Accuracy* a : accuracy) {
      q.bindValue(0, session);
      q.bindValue(1, QString::fromStdString(a->metric));
      q.bindValue(2, QString::fromStdString(a->site));
      q.bindValue(3, a->layer);
      q.bindValue(4, a->value);
      q.bindValue(5, QString::fromStdString(a->config));
      if (!q.exec()) return abort(q);
    }
  }
  if (!config.isEmpty()) {
    q.prepare(QStringLiteral("UPDATE sessions SET %1 WHERE id = ?").arg(configColumnsSql()));
    bindConfig(q, config);
    q.addBindValue(session);
    if (!q.exec()) return abort(q);
  }
  q.prepare(QStringLiteral("UPDATE sessions SET events = ? WHERE id = ?"));
  q.addBindValue(seq);
  q.addBindValue(session);
  if (!q.exec()) return abort(q);
  if (own && !m_db.commit()) {
    fail(m_db.lastError().text());
    m_db.rollback();
    w = saved;
    return false;
  }
  w.fresh.clear();
  w.nextChunk = chunk + 1;
  w.events = seq;
  w.commBytes += commBytes;
  return true;
}

bool SessionStore::appendLines(qint64 session, const QStringList& lines) {
  if (lines.isEmpty()) return true;
  Reader reader;
  // The derived tables need the hello to accept later records; a batch that
  // is not the first is parsed after a synthetic one.
  if (!lines.first().contains(QLatin1String("\"hello\""))) reader.parse_line(to_line(Hello{}));
  std::vector<Event> events;
  QByteArray raw;
  for (const QString& l : lines) {
    const QByteArray utf8 = l.toUtf8();
    raw += utf8;
    raw += '\n';
    auto r = reader.parse_line(std::string_view(utf8.constData(), size_t(utf8.size())));
    if (r.event) events.push_back(std::move(*r.event));
  }
  return append(session, raw, events);
}

static bool update(QSqlDatabase& db, const std::function<bool(const QString&)>& fail, const QString& sql,
                   const QVariantList& values) {
  QSqlQuery q(db);
  q.prepare(sql);
  for (const QVariant& v : values) q.addBindValue(v);
  return q.exec() || fail(q.lastError().text());
}

QString headlineJson(const std::map<std::string, double>& metrics) {
  QJsonObject o;
  for (const char* k : {"prefill_tokens_per_s", "decode_tokens_per_s", "ttft_ms", "decode_ms_per_token",
                        "comm_bytes", "peak_bytes", "wall_s"}) {
    auto it = metrics.find(k);
    if (it != metrics.end()) o.insert(QString::fromLatin1(k), it->second);
  }
  return QString::fromUtf8(QJsonDocument(o).toJson(QJsonDocument::Compact));
}

QString SessionStore::computeHeadline(qint64 session) {
  std::map<std::string, double> metrics;
  QSqlQuery m(m_db);
  m.prepare(QStringLiteral("SELECT name, value, rank FROM metrics WHERE session_id = ?"));
  m.addBindValue(session);
  m.exec();
  double peak = 0;
  while (m.next()) {
    const std::string name = m.value(0).toString().toStdString();
    if (m.value(2).toInt() < 0) metrics[name] = m.value(1).toDouble();
    else if (name == "peak_bytes") peak = std::max(peak, m.value(1).toDouble());
  }
  if (peak > 0 && !metrics.count("peak_bytes")) metrics["peak_bytes"] = peak;  // the fullest device
  auto w = m_writing.find(session);
  if (w != m_writing.end() && w->second.commBytes > 0) metrics["comm_bytes"] = w->second.commBytes;
  return headlineJson(metrics);
}

bool SessionStore::finish(qint64 session, const QString& doneStatus) {
  // The stream says ok; a person reads "done".
  const QString status = doneStatus == QLatin1String("ok") ? QStringLiteral("done") : doneStatus;
  const QString headline = computeHeadline(session);
  m_writing.erase(session);
  return update(m_db, [this](const QString& e) { return fail(e); },
                QStringLiteral("UPDATE sessions SET status = ?, ended = ?, headline = ? WHERE id = ?"),
                {status, QDateTime::currentDateTimeUtc().toString(Qt::ISODate), headline, session});
}
bool SessionStore::rename(qint64 session, const QString& name) {
  return update(m_db, [this](const QString& e) { return fail(e); },
                QStringLiteral("UPDATE sessions SET name = ? WHERE id = ?"),
                {name.isNull() ? QStringLiteral("") : name, session});
}
bool SessionStore::setNote(qint64 session, const QString& note) {
  return update(m_db, [this](const QString& e) { return fail(e); },
                QStringLiteral("UPDATE sessions SET note = ? WHERE id = ?"),
                {note.isNull() ? QStringLiteral("") : note, session});
}
bool SessionStore::setTags(qint64 session, const QString& tags) {
  return update(m_db, [this](const QString& e) { return fail(e); },
                QStringLiteral("UPDATE sessions SET tags = ? WHERE id = ?"),
                {tags.isNull() ? QStringLiteral("") : tags, session});
}
bool SessionStore::setCommand(qint64 session, const QStringList& args) {
  const QString json = QString::fromUtf8(QJsonDocument(QJsonArray::fromStringList(args)).toJson(QJsonDocument::Compact));
  return update(m_db, [this](const QString& e) { return fail(e); },
                QStringLiteral("UPDATE sessions SET command = ? WHERE id = ?"), {json, session});
}

bool SessionStore::remove(qint64 session) {
  return update(m_db, [this](const QString& e) { return fail(e); },
                QStringLiteral("UPDATE sessions SET deleted = 1 WHERE id = ?"), {session});
}
bool SessionStore::restore(qint64 session) {
  return update(m_db, [this](const QString& e) { return fail(e); },
                QStringLiteral("UPDATE sessions SET deleted = 0 WHERE id = ?"), {session});
}
bool SessionStore::purge(qint64 session) {
  m_writing.erase(session);
  return update(m_db, [this](const QString& e) { return fail(e); },
                QStringLiteral("DELETE FROM sessions WHERE id = ?"), {session});
}

static SessionInfo readInfo(const QSqlQuery& q) {
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
  s.tags = q.value(10).toString();
  s.events = q.value(11).toLongLong();
  s.headline = q.value(12).toString();
  const QJsonObject work =
      QJsonDocument::fromJson(q.value(13).toString().toUtf8()).object().value("workload").toObject();
  s.prompt = work.value("prompt_len").toInteger();
  s.decode = work.value("decode").toInteger();
  for (const QJsonValue& a : QJsonDocument::fromJson(q.value(14).toString().toUtf8()).array()) s.command << a.toString();
  return s;
}
static const char* kInfoColumns =
    "SELECT id, name, model, strategy, backend, devices, status, created, ended, note, tags, events, headline, config, "
    "command FROM sessions ";

QVector<SessionInfo> SessionStore::list() const {
  QVector<SessionInfo> out;
  QSqlQuery q(m_db);
  q.exec(QString::fromLatin1(kInfoColumns) + QStringLiteral("WHERE deleted = 0 ORDER BY id"));
  while (q.next()) out << readInfo(q);
  return out;
}

SessionInfo SessionStore::info(qint64 session) const {
  QSqlQuery q(m_db);
  q.prepare(QString::fromLatin1(kInfoColumns) + QStringLiteral("WHERE id = ?"));
  q.addBindValue(session);
  if (q.exec() && q.next()) return readInfo(q);
  return {};
}

QByteArray SessionStore::rawStream(qint64 session) const {
  QByteArray out;
  QSqlQuery q(m_db);
  q.setForwardOnly(true);
  q.prepare(QStringLiteral("SELECT data FROM chunks WHERE session_id = ? ORDER BY seq"));
  q.addBindValue(session);
  q.exec();
  while (q.next()) out += qUncompress(q.value(0).toByteArray());
  return out;
}

QStringList SessionStore::lines(qint64 session) const {
  return QString::fromUtf8(rawStream(session)).split('\n', Qt::SkipEmptyParts);
}

void SessionStore::readEvents(qint64 session, const std::function<void(std::vector<Event>&&)>& sink) const {
  constexpr size_t kBatch = 1 << 16;
  std::vector<Event> out;
  out.reserve(kBatch);
  auto flush = [&](bool force) {
    if (out.empty() || (!force && out.size() < kBatch)) return;
    sink(std::move(out));
    out = {};
    out.reserve(kBatch);
  };
  QSqlQuery q(m_db);
  q.setForwardOnly(true);
  q.prepare(QStringLiteral("SELECT line FROM records WHERE session_id = ? ORDER BY seq"));
  q.addBindValue(session);
  q.exec();
  Reader reader;
  while (q.next()) {
    const QByteArray line = q.value(0).toString().toUtf8();
    auto r = reader.parse_line(std::string_view(line.constData(), size_t(line.size())));
    if (r.event) out.push_back(std::move(*r.event));
    flush(false);
  }
  std::vector<std::string> names;
  q.prepare(QStringLiteral("SELECT id, text FROM names WHERE session_id = ?"));
  q.addBindValue(session);
  q.exec();
  while (q.next()) {
    const size_t id = size_t(q.value(0).toInt());
    if (names.size() <= id) names.resize(id + 1);
    names[id] = q.value(1).toString().toStdString();
  }
  auto name = [&](int32_t id) { return id >= 0 && size_t(id) < names.size() ? names[size_t(id)] : std::string(); };
  readPacked(m_db, "spans", session, [&](Unpacker& u) {
    Span s;
    s.rank = u.get<int32_t>();
    s.stream = name(u.get<int32_t>());
    s.op = name(u.get<int32_t>());
    s.site = name(u.get<int32_t>());
    s.phase = name(u.get<int32_t>());
    s.layer = u.get<int32_t>();
    s.t0 = u.get<int64_t>();
    s.t1 = u.get<int64_t>();
    s.flops = u.get<double>();
    s.bytes = u.get<double>();
    s.peers.resize(u.get<uint16_t>());
    for (int& p : s.peers) p = u.get<int32_t>();
    s.dims.resize(u.get<uint16_t>());
    for (int64_t& d : s.dims) d = u.get<int64_t>();
    if (u.ok) out.push_back(std::move(s));
    flush(false);
  });
  readPacked(m_db, "mem_samples", session, [&](Unpacker& u) {
    Mem m;
    m.rank = u.get<int32_t>();
    m.t = u.get<int64_t>();
    for (int64_t& b : m.bytes) b = u.get<int64_t>();
    m.peak = u.get<int64_t>();
    if (u.ok) out.push_back(m);
    flush(false);
  });
  flush(true);
}

std::vector<Event> SessionStore::events(qint64 session) const {
  std::vector<Event> all;
  readEvents(session, [&](std::vector<Event>&& batch) {
    if (all.empty()) all = std::move(batch);
    else all.insert(all.end(), std::make_move_iterator(batch.begin()), std::make_move_iterator(batch.end()));
  });
  return all;
}

qint64 SessionStore::importStream(const QString& file, const QString& name) {
  QFile f(file);
  if (!f.open(QIODevice::ReadOnly)) {
    m_error = QStringLiteral("cannot import %1: %2").arg(file, f.errorString());
    return 0;
  }
  Reader reader;
  QByteArray pending;
  qint64 id = 0;
  int64_t rejected = 0;
  auto flush = [&](const QByteArray& raw) -> bool {
    std::vector<Event> events;
    reader.feed(
        std::string_view(raw.constData(), size_t(raw.size())), [&](Event&& e) { events.push_back(std::move(e)); },
        [&](const std::string&) { ++rejected; });
    if (reader.refused()) {
      m_error = QStringLiteral("%1 was recorded by a newer ShardScope (protocol %2); update to import it")
                    .arg(file)
                    .arg(reader.version());
      return false;
    }
    if (!id) {
      id = create(name.isEmpty() ? QFileInfo(file).completeBaseName() : name);
      if (!id) return false;
    }
    return append(id, raw, events);
  };
  while (!f.atEnd()) {
    pending += f.read(4 << 20);
    const int nl = int(pending.lastIndexOf('\n'));
    if (nl < 0) continue;
    if (!flush(pending.left(nl + 1))) return id ? (purge(id), 0) : 0;
    pending.remove(0, nl + 1);
  }
  if (!pending.isEmpty() && !flush(pending + '\n')) return id ? (purge(id), 0) : 0;
  if (!id || reader.accepted() == 0) {
    m_error = QStringLiteral("%1 holds no ShardScope events (%2 unreadable lines)").arg(file).arg(rejected);
    if (id) purge(id);
    return 0;
  }
  QString status = QStringLiteral("interrupted");
  QSqlQuery q(m_db);
  q.prepare(QStringLiteral("SELECT line FROM records WHERE session_id = ? AND type = 'done'"));
  q.addBindValue(id);
  if (q.exec() && q.next())
    status = QJsonDocument::fromJson(q.value(0).toString().toUtf8()).object().value("status").toString(status);
  finish(id, status);
  return id;
}

// SessionRecorder: saves a live run into the session store while it streams.
// It lives on its own thread with its own database connection, collects the
// batches EngineClient emits and commits them in transactions of at most a
// fraction of a second, so the window never waits on the disk and a crash
// loses at most the last batch.
#pragma once

#include <QByteArray>
#include <QElapsedTimer>
#include <QObject>
#include <QString>

#include <memory>
#include <vector>

#include "engineclient.h"

class SessionStore;
class QTimer;

class SessionRecorder : public QObject {
  Q_OBJECT
 public:
  explicit SessionRecorder(const QString& dbPath);
  ~SessionRecorder() override;

  static constexpr int kFlushMs = 200;           // the longest a batch waits
  static constexpr size_t kFlushEvents = 50000;  // or this many events

 public slots:
  // A session named `name`, run as `command` (the engine's arguments; empty: none to keep).
  void begin(const QString& name, const QStringList& command = {});
  void add(const QByteArray& rawLines, EventBatch events);
  void finish(const QString& status);

 signals:
  void started(qint64 session);
  void saved(qint64 session, qint64 events);
  // Saving stopped (disk full, database gone): one line; the run goes on.
  void failed(const QString& message);
  void finished(qint64 session, const QString& status);

 private:
  bool flush();
  QString m_path;
  std::unique_ptr<SessionStore> m_store;
  QTimer* m_timer = nullptr;
  qint64 m_session = 0, m_saved = 0;
  bool m_broken = false;
  QByteArray m_raw;
  std::vector<EventBatch> m_batches;
  size_t m_pending = 0;
  QElapsedTimer m_sinceFlush;
};

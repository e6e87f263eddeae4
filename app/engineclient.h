// EngineClient: the one object that talks to shardscope-engine. It owns the
// QProcess, parses the event stream incrementally on readyRead, and emits
// plain value structs in batches. A recorded stream file replays through the
// same parser, so every view works the same for live runs and recordings.
#pragma once

#include <QObject>
#include <QFile>
#include <QProcess>
#include <QStringList>

#include <memory>
#include <vector>

#include "protocol/events.h"

using EventBatch = std::shared_ptr<const std::vector<ss::proto::Event>>;
Q_DECLARE_METATYPE(EventBatch)

struct RunOutcome {
  int exitCode = 0;
  bool crashed = false;      // killed by a signal or failed to start
  QString status;            // the done record's status, or "failed"/"stopped" without one
  QString message;           // one line for a person
  QStringList stderrTail;    // the worker's last stderr lines
  qint64 accepted = 0, rejected = 0;
};
Q_DECLARE_METATYPE(RunOutcome)

class EngineClient : public QObject {
  Q_OBJECT
 public:
  explicit EngineClient(QObject* parent = nullptr);
  ~EngineClient() override;

  // $SHARDSCOPE_ENGINE, else next to the application, else the build tree, else PATH.
  static QString enginePath();
  // GPUs the engine's cuda backend can use here (its `info`), 0 when none or no cuda backend; asked once.
  static int gpuCount();

  // Starts `shardscope-engine <args>`; events arrive on eventsReceived.
  void start(const QStringList& args);
  // Replays a recorded stream file through the same parser, a chunk per turn
  // of the event loop (the window stays responsive); finished() when done.
  bool openFile(const QString& path);
  // Ends the worker cleanly (SIGTERM, then SIGKILL after a grace period); keeps what arrived.
  void stop();
  bool isRunning() const;
  // The worker's process id while it runs (0 otherwise).
  qint64 processId() const { return m_proc ? m_proc->processId() : 0; }

 signals:
  void eventsReceived(EventBatch events);
  // The same batch with the raw bytes of the whole lines it came from (what
  // the session store saves); emitted right after eventsReceived.
  void streamReceived(const QByteArray& rawLines, EventBatch events);
  void lineRejected(const QString& reason);
  void finished(const RunOutcome& outcome);

 private:
  void onReadyRead();
  void onStderr();
  void onFinished(int exitCode, QProcess::ExitStatus status);
  void onError(QProcess::ProcessError error);
  void consume(const QByteArray& chunk);
  void finishWith(RunOutcome outcome);
  void readFileChunk();
  void flushRawTail(const EventBatch& batch);

  QProcess* m_proc = nullptr;
  QFile* m_file = nullptr;
  ss::proto::Reader m_reader;
  QStringList m_stderr;
  QByteArray m_stderrPartial;
  QByteArray m_rawPending;  // the partial last line of the stream so far
  QString m_doneStatus;
  bool m_stopping = false;
  bool m_finished = false;
};

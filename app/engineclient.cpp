#include "engineclient.h"

#include <QCoreApplication>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QStandardPaths>
#include <QTimer>

namespace {
constexpr int kStderrLines = 20;
constexpr int kStopGraceMs = 3000;
}  // namespace

EngineClient::EngineClient(QObject* parent) : QObject(parent) {
  qRegisterMetaType<EventBatch>();
  qRegisterMetaType<RunOutcome>();
}

EngineClient::~EngineClient() {
  if (m_proc && m_proc->state() != QProcess::NotRunning) {
    m_proc->kill();
    m_proc->waitForFinished(2000);
  }
}

int EngineClient::gpuCount() {
  static const int count = [] {
    QProcess info;
    info.start(enginePath(), {QStringLiteral("info")});
    if (!info.waitForFinished(10000)) {
      info.kill();
      info.waitForFinished();
      return 0;
    }
    // "  cuda  available: N GPU(s), ..." (engine/runtime/cuda_rank.cpp)
    const QByteArray out = info.readAllStandardOutput();
    const qsizetype at = out.indexOf("cuda  available: ");
    return at < 0 ? 0 : out.mid(at + 17).split(' ').front().toInt();
  }();
  return count;
}

QString EngineClient::enginePath() {
  const QString env = qEnvironmentVariable("SHARDSCOPE_ENGINE");
  if (!env.isEmpty()) return env;
  const QString appDir = QCoreApplication::applicationDirPath();
  for (const QString& cand : {appDir + "/shardscope-engine", appDir + "/../engine/shardscope-engine"})
    if (QFileInfo(cand).isExecutable()) return QDir::cleanPath(cand);
  const QString onPath = QStandardPaths::findExecutable("shardscope-engine");
  return onPath.isEmpty() ? QStringLiteral("shardscope-engine") : onPath;
}

void EngineClient::start(const QStringList& args) {
  if (isRunning()) return;
  m_reader = ss::proto::Reader();
  m_rawPending.clear();
  m_stderr.clear();
  m_stderrPartial.clear();
  m_doneStatus.clear();
  m_stopping = false;
  m_finished = false;
  delete m_proc;
  m_proc = new QProcess(this);
  connect(m_proc, &QProcess::readyReadStandardOutput, this, &EngineClient::onReadyRead);
  connect(m_proc, &QProcess::readyReadStandardError, this, &EngineClient::onStderr);
  connect(m_proc, &QProcess::finished, this, &EngineClient::onFinished);
  connect(m_proc, &QProcess::errorOccurred, this, &EngineClient::onError);
  m_proc->start(enginePath(), args);
}

bool EngineClient::openFile(const QString& path) {
  m_reader = ss::proto::Reader();
  m_rawPending.clear();
  m_doneStatus.clear();
  m_finished = false;
  delete m_file;
  m_file = new QFile(path, this);
  if (!m_file->open(QIODevice::ReadOnly)) {
    RunOutcome o;
    o.crashed = true;
    o.status = QStringLiteral("failed");
    o.message = tr("cannot open %1: %2").arg(path, m_file->errorString());
    finishWith(o);
    return false;
  }
  QTimer::singleShot(0, this, &EngineClient::readFileChunk);
  return true;
}

void EngineClient::readFileChunk() {
  if (!m_file) return;
  consume(m_file->read(256 << 10));
  if (!m_file->atEnd() && !m_reader.refused()) {
    QTimer::singleShot(0, this, &EngineClient::readFileChunk);
    return;
  }
  auto batch = std::make_shared<std::vector<ss::proto::Event>>();
  m_reader.finish([&](ss::proto::Event&& e) { batch->push_back(std::move(e)); },
                  [&](const std::string& err) { emit lineRejected(QString::fromStdString(err)); });
  if (!batch->empty()) emit eventsReceived(batch);
  flushRawTail(batch);
  RunOutcome o;
  o.status = m_doneStatus.isEmpty() ? QStringLiteral("incomplete") : m_doneStatus;
  o.message = m_reader.refused() ? tr("this recording was written by a newer ShardScope; update to open it")
                                 : tr("replayed %1").arg(QFileInfo(m_file->fileName()).fileName());
  o.crashed = m_reader.refused();
  m_file->deleteLater();
  m_file = nullptr;
  finishWith(o);
}

void EngineClient::stop() {
  if (!isRunning()) return;
  m_stopping = true;
  m_proc->terminate();
  QTimer::singleShot(kStopGraceMs, m_proc, [p = m_proc] {
    if (p->state() != QProcess::NotRunning) p->kill();
  });
}

bool EngineClient::isRunning() const { return m_proc && m_proc->state() != QProcess::NotRunning; }

void EngineClient::consume(const QByteArray& chunk) {
  m_rawPending += chunk;
  const qsizetype nl = m_rawPending.lastIndexOf('\n');
  QByteArray whole;
  if (nl >= 0) {
    whole = m_rawPending.left(nl + 1);
    m_rawPending.remove(0, nl + 1);
  }
  auto batch = std::make_shared<std::vector<ss::proto::Event>>();
  m_reader.feed(
      std::string_view(chunk.constData(), size_t(chunk.size())),
      [&](ss::proto::Event&& e) {
        if (auto* d = std::get_if<ss::proto::Done>(&e)) m_doneStatus = QString::fromStdString(d->status);
        batch->push_back(std::move(e));
      },
      [&](const std::string& err) { emit lineRejected(QString::fromStdString(err)); });
  if (!batch->empty()) emit eventsReceived(batch);
  if (!whole.isEmpty() || !batch->empty()) emit streamReceived(whole, batch);
}

void EngineClient::flushRawTail(const EventBatch& batch) {
  QByteArray tail = m_rawPending;
  m_rawPending.clear();
  if (!tail.isEmpty()) tail += '\n';
  if (!tail.isEmpty() || !batch->empty()) emit streamReceived(tail, batch);
}

void EngineClient::onReadyRead() { consume(m_proc->readAllStandardOutput()); }

void EngineClient::onStderr() {
  m_stderrPartial += m_proc->readAllStandardError();
  int nl;
  while ((nl = m_stderrPartial.indexOf('\n')) >= 0) {
    m_stderr << QString::fromUtf8(m_stderrPartial.left(nl));
    m_stderrPartial.remove(0, nl + 1);
    while (m_stderr.size() > kStderrLines) m_stderr.removeFirst();
  }
}

void EngineClient::onFinished(int exitCode, QProcess::ExitStatus status) {
  consume(m_proc->readAllStandardOutput());
  {
    // A last line without its newline (a worker killed mid-write).
    auto batch = std::make_shared<std::vector<ss::proto::Event>>();
    m_reader.finish([&](ss::proto::Event&& e) { batch->push_back(std::move(e)); },
                    [&](const std::string& err) { emit lineRejected(QString::fromStdString(err)); });
    if (!batch->empty()) emit eventsReceived(batch);
    flushRawTail(batch);
  }
  onStderr();
  if (!m_stderrPartial.isEmpty()) m_stderr << QString::fromUtf8(m_stderrPartial);
  RunOutcome o;
  o.exitCode = exitCode;
  o.crashed = status == QProcess::CrashExit && !m_stopping;
  o.stderrTail = m_stderr;
  if (m_stopping) {
    o.status = QStringLiteral("stopped");
    o.message = tr("stopped; everything that arrived is kept");
  } else if (o.crashed) {
    o.status = QStringLiteral("failed");
    o.message = tr("the engine was killed or crashed");
  } else {
    o.status = m_doneStatus.isEmpty() ? QStringLiteral("failed") : m_doneStatus;
    if (exitCode == 0) o.message = tr("finished");
    else o.message = tr("the engine exited with code %1").arg(exitCode);
  }
  if (!m_stderr.isEmpty() && (exitCode != 0 || o.crashed)) o.message += QStringLiteral(": ") + m_stderr.last();
  finishWith(o);
}

void EngineClient::onError(QProcess::ProcessError error) {
  if (error != QProcess::FailedToStart) return;  // crashes arrive through finished()
  RunOutcome o;
  o.crashed = true;
  o.status = QStringLiteral("failed");
  o.message = tr("could not start %1: %2 (set SHARDSCOPE_ENGINE to the engine's path)")
                  .arg(enginePath(), m_proc->errorString());
  finishWith(o);
}

void EngineClient::finishWith(RunOutcome o) {
  if (m_finished) return;
  m_finished = true;
  o.accepted = m_reader.accepted();
  o.rejected = m_reader.rejected();
  emit finished(o);
}

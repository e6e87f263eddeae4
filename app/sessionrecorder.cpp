#include "sessionrecorder.h"

#include <QTimer>

#include "sessionstore.h"

SessionRecorder::SessionRecorder(const QString& dbPath) : m_path(dbPath) {}
SessionRecorder::~SessionRecorder() = default;

void SessionRecorder::begin(const QString& name, const QStringList& command) {
  if (!m_timer) {
    m_timer = new QTimer(this);
    m_timer->setInterval(kFlushMs);
    connect(m_timer, &QTimer::timeout, this, [this] { flush(); });
  }
  if (!m_store) {
    m_store = std::make_unique<SessionStore>();
    if (!m_store->open(m_path)) {
      emit failed(tr("runs are not saved: %1").arg(m_store->error()));
      m_store.reset();
      return;
    }
  }
  m_broken = false;
  m_saved = 0;
  m_raw.clear();
  m_batches.clear();
  m_pending = 0;
  m_session = m_store->create(name);
  if (m_session && !command.isEmpty()) m_store->setCommand(m_session, command);  // a failing disk shows at the first append
  if (!m_session) {
    m_broken = true;
    emit failed(tr("this run is not saved: %1").arg(m_store->error()));
    return;
  }
  m_sinceFlush.start();
  m_timer->start();
  emit started(m_session);
}

void SessionRecorder::add(const QByteArray& rawLines, EventBatch events) {
  if (!m_session || m_broken) return;
  m_raw += rawLines;
  m_pending += events->size();
  m_batches.push_back(std::move(events));
  if (m_pending >= kFlushEvents || m_sinceFlush.elapsed() >= kFlushMs) flush();
}

bool SessionRecorder::flush() {
  m_sinceFlush.restart();
  if (!m_session || m_broken || (m_raw.isEmpty() && m_pending == 0)) return !m_broken;
  std::vector<const ss::proto::Event*> events;
  events.reserve(m_pending);
  for (const EventBatch& b : m_batches)
    for (const ss::proto::Event& e : *b) events.push_back(&e);
  if (!m_store->append(m_session, m_raw, events)) {
    m_broken = true;
    emit failed(tr("saving stopped after %1 events: %2").arg(m_saved).arg(m_store->error()));
    return false;
  }
  m_saved += qint64(events.size());
  m_raw.clear();
  m_batches.clear();
  m_pending = 0;
  emit saved(m_session, m_saved);
  return true;
}

void SessionRecorder::finish(const QString& status) {
  if (!m_session) return;
  if (m_timer) m_timer->stop();
  flush();
  // A run whose saving failed keeps what was saved, marked as such.
  if (!m_store->finish(m_session, m_broken ? QStringLiteral("interrupted") : status) && !m_broken)
    emit failed(tr("could not close the session: %1").arg(m_store->error()));
  emit finished(m_session, status);
  m_session = 0;
}

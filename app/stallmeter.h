// StallMeter: a ticker on the window's thread; the longest gap between two
// ticks is the longest time the event loop was kept from running.
#pragma once

#include <QElapsedTimer>
#include <QTimer>

#include <algorithm>

class StallMeter {
 public:
  explicit StallMeter(int intervalMs) {
    m_tick.setInterval(intervalMs);
    QObject::connect(&m_tick, &QTimer::timeout, [this] {
      const qint64 now = m_since.nsecsElapsed();
      m_longest = std::max(m_longest, now - m_last);
      m_last = now;
    });
  }
  void start() {
    m_since.start();
    m_last = m_longest = 0;
    m_tick.start();
  }
  void stop() { m_tick.stop(); }
  double longestMs() const { return double(m_longest) * 1e-6; }

 private:
  QTimer m_tick;
  QElapsedTimer m_since;
  qint64 m_last = 0, m_longest = 0;
};

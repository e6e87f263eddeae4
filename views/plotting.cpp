// Helpers the pages share: byte labels and a byte-stepped axis ticker.
#include "pages.h"

#include <qcustomplot.h>

#include <algorithm>
#include <cmath>

#include "palette.h"

namespace {

// Byte tick labels on a plot axis.
class BytesTicker : public QCPAxisTicker {
 protected:
  // Every label of an axis in the unit its step is in ("500 MiB, 1000 MiB,
  // 1500 MiB", not "1000.0 MiB, 1.46 GiB"), as many decimals as the step has.
  QString getTickLabel(double tick, const QLocale&, QChar, int) override {
    static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    return QString::number(tick / std::pow(1024.0, m_unit), 'f', m_decimals) + " " + kUnits[m_unit];
  }
  // Steps of 1, 2 or 5 (x10) in the unit the labels use (KiB, MiB, GiB), so
  // ticks read 100 MiB, 200 MiB ... rather than decimal steps in binary units.
  double getTickStep(const QCPRange& range) override {
    const double raw = range.size() / std::max(1, tickCount());
    m_unit = 0;
    while (raw >= std::pow(1024.0, m_unit + 1) && m_unit < 4) ++m_unit;
    const double unit = std::pow(1024.0, m_unit);
    const double mag = std::pow(10.0, std::floor(std::log10(std::max(raw / unit, 1e-9))));
    double step = 10 * mag;
    for (double m : {1.0, 2.0, 5.0, 10.0})
      if (m * mag * unit >= raw) {
        step = m * mag;
        break;
      }
    m_decimals = step >= 1 ? 0 : int(std::ceil(-std::log10(step) - 1e-9));
    return step * unit;
  }

 private:
  int m_unit = 0, m_decimals = 0;  // of the last step
};

}  // namespace

QSharedPointer<QCPAxisTicker> bytesTicker() { return QSharedPointer<QCPAxisTicker>(new BytesTicker); }

namespace {
// Replots its plot the next time it is shown, once.
class ReplotOnShow : public QObject {
 public:
  using QObject::QObject;
  bool eventFilter(QObject* watched, QEvent* e) override {
    if (e->type() == QEvent::Show) {
      auto* plot = static_cast<QCustomPlot*>(watched);
      plot->removeEventFilter(this);
      plot->setProperty("shardscopeReplotPending", false);
      plot->replot(QCustomPlot::rpQueuedReplot);  // after the layout gives it its size
      deleteLater();
    }
    return false;
  }
};

// Swallows a plot's resizes to an empty size: QCustomPlot replots on every
// resize, and at no pixels its paint buffers cannot be painted. Its next
// resize to a real size replots it as usual.
class NoEmptyResize : public QObject {
 public:
  using QObject::QObject;
  bool eventFilter(QObject* watched, QEvent* e) override {
    return e->type() == QEvent::Resize && static_cast<QResizeEvent*>(e)->size().isEmpty() && watched->isWidgetType();
  }
};
}  // namespace

QString lengthText(double tokens) {
  if (tokens >= 1 << 20 && std::fmod(tokens, 1 << 20) == 0) return QString::number(tokens / (1 << 20)) + "M";
  if (tokens >= 1024 && std::fmod(tokens, 1024) == 0) return QString::number(tokens / 1024) + "K";
  return QString::number(tokens);
}

QCustomPlot* newPlot(QWidget* parent) {
  auto* plot = new QCustomPlot(parent);
  plot->installEventFilter(new NoEmptyResize(plot));
  return plot;
}

void replotWhenShown(QCustomPlot* plot) {
  if (plot->isVisible()) {
    // Laid out: now; shown but not yet laid out (no size, no paint buffer): once it is.
    plot->replot(plot->width() > 0 && plot->height() > 0 ? QCustomPlot::rpRefreshHint : QCustomPlot::rpQueuedReplot);
    return;
  }
  if (plot->property("shardscopeReplotPending").toBool()) return;
  plot->setProperty("shardscopeReplotPending", true);
  plot->installEventFilter(new ReplotOnShow(plot));
}

void legendBeside(QCustomPlot* plot) {
  // A column right of the axis rect: the legend at its top at its own
  // height, the rest empty (a legend given the whole height spreads its rows).
  auto* column = new QCPLayoutGrid;
  plot->plotLayout()->addElement(0, 1, column);
  plot->plotLayout()->setColumnStretchFactor(1, 0.001);
  column->addElement(0, 0, plot->legend);
  column->addElement(1, 0, new QCPLayoutElement(plot));
  column->setRowStretchFactor(0, 0.001);
  column->setRowStretchFactor(1, 1);
  column->setMargins(QMargins(0, 4, 6, 0));  // the frame clear of the widget's edge
  plot->legend->setVisible(true);
}

QString bytesText(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(b) >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return QString::number(b, 'f', u == 0 ? 0 : (b < 10 ? 2 : 1)) + " " + units[u];
}

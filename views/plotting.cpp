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
  QString getTickLabel(double tick, const QLocale&, QChar, int) override { return bytesText(tick); }
  // Steps of 1, 2 or 5 (x10) in the unit the labels use (KiB, MiB, GiB), so
  // ticks read 100 MiB, 200 MiB ... rather than decimal steps in binary units.
  double getTickStep(const QCPRange& range) override {
    const double raw = range.size() / std::max(1, tickCount());
    double unit = 1;
    while (raw >= unit * 1024 && unit < std::pow(1024.0, 4)) unit *= 1024;
    const double mag = std::pow(10.0, std::floor(std::log10(std::max(raw / unit, 1e-9))));
    for (double m : {1.0, 2.0, 5.0, 10.0})
      if (m * mag * unit >= raw) return m * mag * unit;
    return 10 * mag * unit;
  }
};

}  // namespace

QSharedPointer<QCPAxisTicker> bytesTicker() { return QSharedPointer<QCPAxisTicker>(new BytesTicker); }

QString bytesText(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(b) >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return QString::number(b, 'f', u == 0 ? 0 : (b < 10 ? 2 : 1)) + " " + units[u];
}

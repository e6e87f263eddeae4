#include "pages.h"

#include <QHelpEvent>
#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <qcustomplot.h>

#include <algorithm>
#include <map>
#include <cmath>

#include "palette.h"

// A colour per op kind: the engine's kernels in cool tones, collectives in
// warm ones, each distinct; an op not listed gets a stable hashed colour.
QColor opColor(const std::string& op, bool comm) {
  static const std::map<std::string, QColor> known = {
      {"gemm", QColor(66, 133, 244)},          {"attention", QColor(0, 150, 136)},
      {"attention_merge", QColor(0, 105, 92)}, {"rmsnorm", QColor(121, 134, 203)},
      {"gated_rmsnorm", QColor(92, 107, 192)}, {"gated_norm_sumsq", QColor(57, 73, 171)},
      {"rope", QColor(149, 117, 205)},         {"silu_mul", QColor(124, 179, 66)},
      {"add", QColor(174, 213, 129)},          {"copy", QColor(144, 164, 174)},
      {"embedding", QColor(96, 125, 139)},     {"argmax", QColor(38, 50, 56)},
      {"conv1d", QColor(41, 182, 246)},        {"ssd_scan", QColor(2, 119, 189)},
      {"selective_scan", QColor(1, 87, 155)},  {"ssd_state_correction", QColor(77, 182, 172)},
      {"selective_state_correction", QColor(38, 166, 154)}, {"state_advance", QColor(128, 203, 196)},
      {"quantize", QColor(186, 104, 200)},     {"dequantize", QColor(171, 71, 188)},
      {"all_reduce", QColor(229, 57, 53)},     {"all_gather", QColor(251, 140, 0)},
      {"reduce_scatter", QColor(244, 81, 30)}, {"broadcast", QColor(255, 193, 7)},
      {"sendrecv", QColor(216, 27, 96)},       {"send", QColor(240, 98, 146)},
      {"recv", QColor(194, 24, 91)},           {"all_to_all", QColor(141, 110, 99)},
      {"barrier", QColor(120, 120, 120)},      {"gather_blobs", QColor(161, 136, 127)}};
  if (auto it = known.find(op); it != known.end()) return it->second;
  // Training: a backward kernel in its forward's hue, darker; the optimizer's
  // and the loss's own colours.
  static const std::string kBackward = "_backward";
  if (op.size() > kBackward.size() && op.compare(op.size() - kBackward.size(), kBackward.size(), kBackward) == 0)
    return opColor(op.substr(0, op.size() - kBackward.size()), comm).darker(160);
  static const std::map<std::string, QColor> training = {
      {"adamw", QColor(130, 119, 23)}, {"sum_squares", QColor(175, 180, 43)}, {"cross_entropy", QColor(0, 77, 64)}};
  if (auto it = training.find(op); it != training.end()) return it->second;
  static const QColor compute[] = {QColor(66, 133, 244), QColor(52, 168, 83), QColor(0, 150, 136),
                                   QColor(121, 85, 200), QColor(96, 125, 139), QColor(3, 169, 244),
                                   QColor(139, 195, 74), QColor(63, 81, 181)};
  static const QColor wire[] = {QColor(234, 67, 53), QColor(251, 140, 0), QColor(233, 30, 99),
                                QColor(255, 193, 7)};
  const size_t h = std::hash<std::string>{}(op);
  return comm ? wire[h % 4] : compute[h % 8];
}

// -------------------------------------------------------------- Timeline ---

TimelineView::TimelineView(const RunData& data, QWidget* parent) : QWidget(parent), m_data(data) {
  setMouseTracking(true);
  setMinimumHeight(200);
}

int64_t TimelineView::firstSpan() const {
  int64_t first = m_data.end_time();
  for (auto& [r, d] : m_data.ranks())
    for (auto& s : d.spans) first = std::min(first, s.t0);
  return first;
}

void TimelineView::resetZoom() {
  // From the first span to the last: loading weights records no spans. A
  // phase after loading begins just before its first span, and its mark
  // (the first step's name) is in view too.
  // Redraws only where the range changes: paintEvent resets an empty range
  // (a stream without spans), and an update from there would paint forever.
  int64_t first = firstSpan();
  for (const auto& ph : m_data.phases())
    if (ph.name != "load") first = std::min(first, ph.t);
  const double t0 = double(first - m_origin);
  setRange(t0, std::max<double>(t0 + 1, double(m_data.end_time() - m_origin)));
}

void TimelineView::alignAtStart() {
  m_origin = firstSpan();
  resetZoom();
}

void TimelineView::setRange(double t0, double t1) {
  if (t0 == m_t0 && t1 == m_t1) return;
  m_t0 = t0;
  m_t1 = std::max(t1, t0 + 1);
  update();
}

const std::map<std::string, bool>& TimelineView::opKinds() const {
  if (m_opsRevision == m_data.revision()) return m_ops;
  m_opsRevision = m_data.revision();
  m_ops.clear();
  for (auto& [rank, d] : m_data.ranks())
    for (const auto& s : d.spans) m_ops.emplace(s.op, s.stream == "comm");
  return m_ops;
}

int TimelineView::lanesHeight() const {
  return 24 + int(m_data.ranks().size()) * 2 * kLane + 3 * kLane + 8;  // lanes, phase names, the op legend
}

double TimelineView::xOf(int64_t t) const {
  return kLabel + (double(t - m_origin) - m_t0) / (m_t1 - m_t0) * (width() - kLabel - 8);
}

std::vector<TimelineView::PhaseMark> TimelineView::phaseMarks(const QFontMetrics& fm) const {
  struct Mark {
    double x;
    QStringList names;  // longest first
  };
  std::vector<Mark> marks;
  int step = m_data.trainSteps().empty() ? 1 : m_data.trainSteps().front().step;
  bool stepNamed = false;
  for (const auto& ph : m_data.phases()) {
    if (ph.name == "load") continue;
    QStringList names{QString::fromStdString(ph.name)};
    if (ph.name == "forward" && !stepNamed) {
      names = QStringList{tr("step %1 forward").arg(step), tr("step %1").arg(step), QString::number(step)};
      stepNamed = true;
    } else if (ph.name == "optimizer") {
      names << QStringLiteral("opt");
      ++step;
      stepNamed = false;
    } else {
      static const std::map<std::string, QString> kShort = {
          {"forward", "fwd"}, {"backward", "bwd"}, {"prefill", "pre"}, {"decode", "dec"}};
      if (const auto it = kShort.find(ph.name); it != kShort.end()) names << it->second;
    }
    marks.push_back({xOf(ph.t), names});
  }
  std::vector<PhaseMark> out;
  for (size_t i = 0; i < marks.size(); ++i) {
    const double x = marks[i].x;
    if (x < kLabel || x > width()) continue;
    const double room = std::min<double>(i + 1 < marks.size() ? marks[i + 1].x : width(), width()) - x - 6;
    PhaseMark mark{x, {}};
    for (const QString& name : marks[i].names)
      if (fm.horizontalAdvance(name) + 3 <= room) {
        mark.label = name;
        break;
      }  // none fits: a name cut off is none
    out.push_back(mark);
  }
  return out;
}

void TimelineView::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.fillRect(rect(), Qt::white);
  if (m_t1 <= m_t0 + 1) resetZoom();
  const auto& hidden = m_data.commStats();
  int row = 0;
  for (auto& [rank, d] : m_data.ranks()) {
    for (int lane = 0; lane < 2; ++lane) {
      const int y = 24 + (row + lane) * kLane;
      p.setPen(QColor(90, 90, 90));
      QString label = tr("rank %1 %2").arg(rank).arg(lane == 0 ? tr("compute") : tr("comm"));
      if (lane == 1)
        if (auto it = hidden.find(rank); it != hidden.end() && it->second.commNs > 0)
          label += tr(" · %1% hidden").arg(100 * it->second.hiddenFraction(), 0, 'f', 0);
      p.drawText(QRect(4, y, kLabel - 8, kLane), Qt::AlignVCenter | Qt::AlignLeft, label);
      p.fillRect(QRectF(kLabel, y + kLane - 1, width() - kLabel, 1), QColor(230, 230, 230));
    }
    // One pass over the rank's spans. Zoomed out, thousands of spans share a
    // pixel column: a span that falls inside the columns its lane has just
    // filled is not drawn again, so a redraw costs at most a few rectangles
    // per pixel column whatever the number of spans.
    double filledFrom[2] = {-1, -1}, filledTo[2] = {-1, -1};
    for (const auto& s : d.spans) {
      const int lane = s.stream == "comm" ? 1 : 0;
      const double x0 = std::max<double>(xOf(s.t0), kLabel), x1 = std::max(xOf(s.t1), x0 + 1.0);
      if (x1 < kLabel || x0 > width()) continue;
      if (x0 >= filledFrom[lane] && x1 <= filledTo[lane] + 0.5) continue;
      p.fillRect(QRectF(x0, 24 + (row + lane) * kLane + 3, x1 - x0, kLane - 6), opColor(s.op, lane == 1));
      if (x0 <= filledTo[lane] + 1 && x0 >= filledFrom[lane]) filledTo[lane] = std::max(filledTo[lane], x1);
      else {
        filledFrom[lane] = x0;
        filledTo[lane] = x1;
      }
    }
    row += 2;
  }
  for (const PhaseMark& mark : phaseMarks(p.fontMetrics())) {
    p.setPen(QPen(QColor(60, 60, 60), 1, Qt::DashLine));
    p.drawLine(QPointF(mark.x, 22), QPointF(mark.x, 24 + row * kLane));
    p.setPen(QColor(60, 60, 60));
    if (!mark.label.isEmpty())
      p.drawText(QPointF(mark.x + 3, 24 + row * kLane + 2 + p.fontMetrics().ascent()), mark.label);
  }
  // The colour of every op kind, below the lanes.
  {
    int x = kLabel, y = 24 + (row + 1) * kLane + 4;  // below the phase names
    const QFontMetrics fm = p.fontMetrics();
    for (const auto& [op, comm] : opKinds()) {
      const QString name = QString::fromStdString(op);
      const int w = 16 + fm.horizontalAdvance(name) + 14;
      if (x + w > width()) {
        x = kLabel;
        y += kLane;
      }
      p.fillRect(QRect(x, y + 5, 12, 12), opColor(op, comm));
      p.setPen(QColor(60, 60, 60));
      p.drawText(QRect(x + 16, y, w, kLane), Qt::AlignVCenter | Qt::AlignLeft, name);
      x += w;
    }
  }
  // Time axis.
  p.setPen(Qt::black);
  const double span_ms = (m_t1 - m_t0) * 1e-6;
  // A 1-2-5 step that leaves room for each label (about 90 px).
  const double raw = std::max(span_ms, 1e-6) / std::max(2.0, (width() - kLabel) / 90.0);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * mag;
  for (double m : {1.0, 2.0, 5.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  for (double t = std::ceil(m_t0 * 1e-6 / step) * step; t <= m_t1 * 1e-6; t += step) {
    const double x = xOf(int64_t(t * 1e6) + m_origin);
    p.drawLine(QPointF(x, 16), QPointF(x, 22));
    p.drawText(QPointF(x + 2, 12), QString::number(t, 'g', 6) + " ms");
  }
}

void TimelineView::wheelEvent(QWheelEvent* e) {
  const double f = e->angleDelta().y() > 0 ? 0.8 : 1.25;
  const double at = m_t0 + (e->position().x() - kLabel) / std::max(1, width() - kLabel - 8) * (m_t1 - m_t0);
  m_t0 = at - (at - m_t0) * f;
  m_t1 = at + (m_t1 - at) * f;
  update();
  emit rangeChanged(m_t0, m_t1);
}

void TimelineView::mousePressEvent(QMouseEvent* e) { m_drag = e->pos(); }

void TimelineView::mouseMoveEvent(QMouseEvent* e) {
  if (e->buttons() & Qt::LeftButton) {
    const double dt = double(e->pos().x() - m_drag.x()) / std::max(1, width() - kLabel - 8) * (m_t1 - m_t0);
    m_t0 -= dt;
    m_t1 -= dt;
    m_drag = e->pos();
    update();
    emit rangeChanged(m_t0, m_t1);
  }
}

const ss::proto::Span* TimelineView::spanAt(QPoint pos) const {
  int row = 0;
  for (auto& [rank, d] : m_data.ranks())
    for (int lane = 0; lane < 2; ++lane, ++row) {
      const int y = 24 + row * kLane;
      if (pos.y() < y || pos.y() >= y + kLane) continue;
      for (const auto& s : d.spans)
        if ((s.stream == "comm") == (lane == 1) && pos.x() >= xOf(s.t0) - 1 && pos.x() <= xOf(s.t1) + 1) return &s;
    }
  return nullptr;
}

bool TimelineView::event(QEvent* e) {
  if (e->type() == QEvent::ToolTip) {
    auto* h = static_cast<QHelpEvent*>(e);
    if (const auto* s = spanAt(h->pos())) {
      const double us = (s->t1 - s->t0) * 1e-3;
      QString tip = tr("<b>%1</b> %2<br>layer %3, %4<br>%5 µs")
                        .arg(QString::fromStdString(s->op), QString::fromStdString(s->site))
                        .arg(s->layer)
                        .arg(QString::fromStdString(s->phase))
                        .arg(us, 0, 'f', 1);
      if (s->bytes > 0)
        tip += tr("<br>%1, %2 GB/s").arg(bytesText(s->bytes)).arg(s->bytes / std::max(us, 1e-3) * 1e-3, 0, 'f', 2);
      if (s->flops > 0) tip += tr("<br>%1 GFLOP").arg(s->flops * 1e-9, 0, 'f', 3);
      QToolTip::showText(h->globalPos(), tip, this);
    } else {
      QToolTip::hideText();
    }
    return true;
  }
  return QWidget::event(e);
}

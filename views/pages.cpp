#include "pages.h"

#include <QCheckBox>
#include <QComboBox>
#include <QHBoxLayout>
#include <QHelpEvent>
#include <QLabel>
#include <QMouseEvent>
#include <QPainter>
#include <QSpinBox>
#include <QHeaderView>
#include <QTableWidget>
#include <QSysInfo>
#include <QTextBrowser>
#include <QTextCursor>
#include <QTextFrame>
#include <QTextTable>
#include <QThread>
#include <QToolTip>
#include <QVBoxLayout>
#include <qcustomplot.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <cmath>

#include "palette.h"
#include "training.h"

namespace {


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
  static const QColor compute[] = {QColor(66, 133, 244), QColor(52, 168, 83), QColor(0, 150, 136),
                                   QColor(121, 85, 200), QColor(96, 125, 139), QColor(3, 169, 244),
                                   QColor(139, 195, 74), QColor(63, 81, 181)};
  static const QColor wire[] = {QColor(234, 67, 53), QColor(251, 140, 0), QColor(233, 30, 99),
                                QColor(255, 193, 7)};
  const size_t h = std::hash<std::string>{}(op);
  return comm ? wire[h % 4] : compute[h % 8];
}

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

// ---------------------------------------------------------------- Memory ---

MemoryPage::MemoryPage(const RunData& data, QWidget* parent) : QWidget(parent), m_data(data) {
  auto* layout = new QVBoxLayout(this);
  auto* top = new QHBoxLayout;
  top->addWidget(new QLabel(tr("Device"), this));
  m_rank = new QComboBox(this);
  top->addWidget(m_rank);
  m_hideWeights = new QCheckBox(tr("without weights"), this);
  m_hideWeights->setToolTip(tr("Weights dwarf everything else: hide them to see activations, caches and buffers"));
  top->addWidget(m_hideWeights);
  top->addStretch();
  layout->addLayout(top);
  m_plot = new QCustomPlot(this);
  m_plot->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
  m_plot->axisRect()->setRangeZoom(Qt::Horizontal);
  m_plot->axisRect()->setRangeDrag(Qt::Horizontal);
  m_plot->xAxis->setLabel(tr("time (ms)"));
  m_plot->yAxis->setTicker(QSharedPointer<QCPAxisTicker>(new BytesTicker));
  m_plot->legend->setVisible(true);
  m_plot->axisRect()->insetLayout()->setInsetAlignment(0, Qt::AlignTop | Qt::AlignLeft);
  layout->addWidget(m_plot, 3);
  m_bars = new QCustomPlot(this);
  m_bars->yAxis->setTicker(QSharedPointer<QCPAxisTicker>(new BytesTicker));
  m_bars->legend->setVisible(true);
  m_bars->axisRect()->insetLayout()->setInsetAlignment(0, Qt::AlignTop | Qt::AlignRight);
  layout->addWidget(m_bars, 2);
  connect(m_rank, &QComboBox::currentIndexChanged, this, [this] {
    m_seen = ~0ull;
    refresh();
  });
  connect(m_hideWeights, &QCheckBox::toggled, this, [this] {
    m_seen = ~0ull;
    refresh();
  });
}

void MemoryPage::refresh() {
  if (m_seen == m_data.revision()) return;
  m_seen = m_data.revision();
  if (m_rank->count() != int(m_data.ranks().size()) + 1) {
    const QSignalBlocker block(m_rank);
    const int keep = m_rank->currentIndex();
    m_rank->clear();
    m_rank->addItem(tr("all devices (total)"), -1);
    for (auto& [r, d] : m_data.ranks()) m_rank->addItem(tr("rank %1").arg(r), r);
    m_rank->setCurrentIndex(keep >= 0 && keep < m_rank->count() ? keep : (m_rank->count() > 1 ? 1 : 0));
  }
  drawOverTime(m_rank->currentData().toInt());
  drawAllDevices();
}

// Memory of one device over time (or the total of all devices), stacked by category.
void MemoryPage::drawOverTime(int rank) {
  m_plot->clearGraphs();
  m_plot->clearItems();
  // The samples to draw: one rank's, or every rank's summed on a common time axis.
  std::vector<ss::proto::Mem> mem;
  double capacity = 0;
  if (rank >= 0) {
    const auto it = m_data.ranks().find(rank);
    if (it != m_data.ranks().end()) {
      mem = it->second.mem;
      capacity = double(it->second.device.capacity);
    }
  } else {
    std::vector<std::pair<int64_t, std::pair<int, const ss::proto::Mem*>>> all;
    for (auto& [r, d] : m_data.ranks())
      for (auto& m : d.mem) all.push_back({m.t, {r, &m}});
    std::sort(all.begin(), all.end(), [](auto& a, auto& b) { return a.first < b.first; });
    std::map<int, ss::proto::Mem> latest;
    for (auto& [t, rm] : all) {
      latest[rm.first] = *rm.second;
      ss::proto::Mem sum;
      sum.t = t;
      for (auto& [r, m] : latest)
        for (int c = 0; c < ss::proto::kCategoryCount; ++c) sum.bytes[size_t(c)] += m.bytes[size_t(c)];
      mem.push_back(sum);
    }
  }
  if (mem.empty()) {
    m_plot->replot();
    return;
  }
  QCPGraph* below = nullptr;
  std::vector<double> base(mem.size(), 0.0);
  double peak = 0, peak_t = 0;
  // What a run holds throughout (weights, their gradients and optimizer
  // state, caches) at the bottom, what comes and goes on top.
  static constexpr int kStack[] = {0, 6, 7, 2, 3, 1, 4, 5};
  static_assert(std::size(kStack) == ss::proto::kCategoryCount);
  for (int c : kStack) {
    if (c == 0 && m_hideWeights->isChecked()) continue;
    QVector<double> x, y;
    bool any = false;
    for (size_t i = 0; i < mem.size(); ++i) {
      base[i] += double(mem[i].bytes[size_t(c)]);
      any |= mem[i].bytes[size_t(c)] != 0;
      x << mem[i].t * 1e-6;
      y << base[i];
      if (c == kStack[std::size(kStack) - 1] && base[i] > peak) {
        peak = base[i];
        peak_t = mem[i].t * 1e-6;
      }
    }
    if (!any) continue;
    QCPGraph* g = m_plot->addGraph();
    g->setName(kCategories[c]);
    g->setLineStyle(QCPGraph::lsStepLeft);
    g->setData(x, y, true);
    g->setPen(QPen(kCategoryColors[c].darker(120)));
    QColor fill = kCategoryColors[c];
    fill.setAlpha(170);
    g->setBrush(fill);
    if (below) g->setChannelFillGraph(below);
    below = g;
  }
  // A capacity far above the run (a CPU host's share, a large GPU) would
  // flatten every curve: it is named in a corner instead of drawn.
  const bool capacityOnScale = capacity > 0 && peak * 4 >= capacity;
  if (capacity > 0 && !capacityOnScale) {
    auto* note = new QCPItemText(m_plot);
    note->position->setType(QCPItemPosition::ptAxisRectRatio);
    note->position->setCoords(0.5, 0.02);  // top centre: clear of the legend and the peak label
    note->setPositionAlignment(Qt::AlignHCenter | Qt::AlignTop);
    note->setText(tr("capacity %1, above the scale").arg(bytesText(capacity)));
    note->setColor(Qt::red);
  }
  if (capacityOnScale) {
    auto* line = new QCPItemStraightLine(m_plot);
    line->point1->setCoords(0, capacity);
    line->point2->setCoords(1, capacity);
    line->setPen(QPen(Qt::red, 1.5, Qt::DashLine));
    auto* label = new QCPItemText(m_plot);
    label->position->setCoords(mem.front().t * 1e-6, capacity);
    label->setPositionAlignment(Qt::AlignLeft | Qt::AlignBottom);
    label->setText(tr("capacity %1").arg(bytesText(capacity)));
    label->setColor(Qt::red);
  }
  // Where load, prefill and decode begin.
  for (const auto& ph : m_data.phases()) {
    if (ph.name == "load") continue;  // the axis starts there
    if (isTraining(m_data)) break;    // every step repeats its phases: the timeline marks them
    auto* line = new QCPItemStraightLine(m_plot);
    line->point1->setCoords(ph.t * 1e-6, 0);
    line->point2->setCoords(ph.t * 1e-6, 1);
    line->setPen(QPen(QColor(90, 90, 90), 1, Qt::DashLine));
    auto* name = new QCPItemText(m_plot);
    name->setPositionAlignment(Qt::AlignLeft | Qt::AlignBottom);
    name->position->setTypeY(QCPItemPosition::ptAxisRectRatio);
    name->position->setCoords(ph.t * 1e-6, 1.0);
    name->setPadding(QMargins(3, 0, 0, 2));
    name->setText(QString::fromStdString(ph.name));
    name->setColor(QColor(90, 90, 90));
  }
  auto* mark = new QCPItemTracer(m_plot);
  mark->position->setCoords(peak_t, peak);
  mark->setStyle(QCPItemTracer::tsCircle);
  mark->setSize(8);
  mark->setPen(QPen(Qt::black));
  auto* text = new QCPItemText(m_plot);
  text->position->setCoords(peak_t, peak);
  text->setPositionAlignment(Qt::AlignHCenter | Qt::AlignBottom);
  text->setText(m_hideWeights->isChecked() ? tr("peak %1 without weights").arg(bytesText(peak)) : tr("peak %1").arg(bytesText(peak)));
  text->setPadding(QMargins(0, 0, 0, 6));
  for (const auto& e : m_data.errors())
    if (e.code == "oom" && (rank < 0 || e.rank == rank))
      text->setText(tr("peak %1 — out of memory here").arg(bytesText(peak)));
  m_plot->xAxis->setRange(mem.front().t * 1e-6, std::max(mem.back().t * 1e-6, mem.front().t * 1e-6 + 1e-3));
  m_plot->yAxis->setRange(0, std::max(peak, capacityOnScale ? capacity : 0.0) * 1.12 + 1);
  m_plot->replot();
}

// Peak bytes per category on every device, as grouped bars (exact peaks from
// the per-rank metrics when the run has finished, else from the samples).
void MemoryPage::drawAllDevices() {
  m_bars->clearPlottables();
  const auto& ranks = m_data.ranks();
  if (ranks.empty()) {
    m_bars->replot();
    return;
  }
  auto* group = new QCPBarsGroup(m_bars);
  QVector<double> ticks;
  QVector<QString> labels;
  int i = 0;
  for (auto& [r, d] : ranks) {
    ticks << i++;
    labels << tr("rank %1").arg(r);
  }
  double top = 1;
  for (int c = m_hideWeights->isChecked() ? 1 : 0; c < ss::proto::kCategoryCount; ++c) {
    QVector<double> values;
    bool any = false;
    for (auto& [r, d] : ranks) {
      const double v = peakBytes(d, c);
      any |= v > 0;
      top = std::max(top, v);
      values << v;
    }
    if (!any) continue;
    auto* bars = new QCPBars(m_bars->xAxis, m_bars->yAxis);
    bars->setName(kCategories[c]);
    bars->setBrush(kCategoryColors[c]);
    bars->setPen(Qt::NoPen);
    bars->setWidth(0.8 / 6);
    bars->setBarsGroup(group);
    bars->setData(ticks, values);
  }
  QSharedPointer<QCPAxisTickerText> ticker(new QCPAxisTickerText);
  ticker->addTicks(ticks, labels);
  m_bars->xAxis->setTicker(ticker);
  m_bars->xAxis->setRange(-0.6, ticks.size() - 0.4);
  m_bars->yAxis->setRange(0, top * 1.15);
  m_bars->yAxis->setLabel(tr("peak per category"));
  m_bars->replot();
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
  // From the first span to the last: loading weights records no spans.
  m_t0 = double(firstSpan() - m_origin);
  m_t1 = std::max<double>(m_t0 + 1, double(m_data.end_time() - m_origin));
  update();
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
  // Where prefill and decode (training: each step's forward, backward and
  // optimizer) begin: a dashed line across the lanes, named where there is
  // room (zoom in to name them all).
  double named_to = -1e9;
  for (const auto& ph : m_data.phases()) {
    if (ph.name == "load") continue;
    const double x = xOf(ph.t);
    if (x < kLabel || x > width()) continue;
    p.setPen(QPen(QColor(60, 60, 60), 1, Qt::DashLine));
    p.drawLine(QPointF(x, 22), QPointF(x, 24 + row * kLane));
    const QString name = QString::fromStdString(ph.name);
    if (x < named_to) continue;
    p.setPen(QColor(60, 60, 60));
    p.drawText(QPointF(x + 3, 24 + row * kLane + 2 + p.fontMetrics().ascent()), name);
    named_to = x + 3 + p.fontMetrics().horizontalAdvance(name) + 6;
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

// ------------------------------------------------------------- Placement ---

PlacementView::PlacementView(const RunData& data, QWidget* parent) : QWidget(parent), m_data(data) {
  setMinimumHeight(240);
}
void PlacementView::setLayer(int layer) {
  m_layer = layer;
  update();
}
void PlacementView::setStep(int step) {
  m_step = step;
  update();
}

void PlacementView::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.fillRect(rect(), Qt::white);
  const auto& ranks = m_data.ranks();
  if (ranks.empty()) return;
  // Tensors of the layer, in order of first appearance.
  std::vector<std::string> tensors;
  for (auto& [r, d] : ranks)
    for (auto& pl : d.placements)
      if (pl.layer == m_layer && std::find(tensors.begin(), tensors.end(), pl.tensor) == tensors.end())
        tensors.push_back(pl.tensor);
  const int label = 330, colw = std::max(60, (width() - label - 10) / int(ranks.size())), rowh = 22;
  // One colour per device, shared by the weight slices and the token strip.
  const QColor palette[] = {QColor(66, 133, 244), QColor(234, 67, 53), QColor(52, 168, 83), QColor(251, 188, 5),
                            QColor(121, 85, 200), QColor(0, 150, 136), QColor(233, 30, 99), QColor(96, 125, 139)};
  int col = 0;
  for (auto& [r, d] : ranks) p.drawText(QRect(label + col++ * colw, 2, colw, 18), Qt::AlignCenter, tr("rank %1").arg(r));
  for (size_t t = 0; t < tensors.size(); ++t) {
    const int y = 24 + int(t) * rowh;
    QString name = QString::fromStdString(tensors[t]);
    const int at = name.indexOf(QStringLiteral(".layers."));
    if (at >= 0) name = name.mid(name.indexOf('.', at + 8) + 1);
    // How the tensor is split: axis 0 of a [out, in] weight splits its
    // outputs (column parallel), axis 1 its inputs (row parallel).
    for (auto& [r, d] : ranks) {
      auto it = std::find_if(d.placements.begin(), d.placements.end(),
                             [&](const ss::proto::Placement& pl) { return pl.tensor == tensors[t] && pl.step < 0; });
      if (it == d.placements.end()) continue;
      QStringList dims;
      for (int64_t x : it->shape) dims << QString::number(x);
      name += QStringLiteral("  [%1]").arg(dims.join(QStringLiteral("×")));
      if (it->mode == "split") name += it->axis == 0 ? tr(" · out split") : tr(" · in split");
      break;
    }
    p.setPen(Qt::black);
    p.drawText(QRect(4, y, label - 8, rowh), Qt::AlignVCenter | Qt::AlignLeft, name);
    col = 0;
    for (auto& [r, d] : ranks) {
      const QRectF cell(label + col * colw + 4, y + 4, colw - 8, rowh - 8);
      p.fillRect(cell, QColor(238, 238, 238));
      for (auto& pl : d.placements) {
        if (pl.tensor != tensors[t] || pl.step != (m_step >= 0 && pl.step >= 0 ? m_step : -1)) continue;
        if (m_step >= 0 && pl.step < 0) continue;
        if (pl.mode == "mirrored") {
          p.fillRect(cell, QColor(150, 150, 150));
        } else if (pl.mode == "split" && pl.axis >= 0) {
          const double n = double(pl.shape[size_t(pl.axis)]);
          p.fillRect(QRectF(cell.left() + cell.width() * pl.start / n, cell.top(),
                            cell.width() * (pl.end - pl.start) / n, cell.height()),
                     palette[r % 8]);
        }
      }
      ++col;
    }
  }
  // Token strip: one band per device, so tokens every device sees (tp) and
  // tokens split between devices (sp, tsp; zigzag) both read at a glance.
  int64_t total = 1;
  for (auto& [r, d] : ranks)
    for (auto& [a, b] : d.tokens) total = std::max(total, b);
  const int y = 24 + int(tensors.size()) * rowh + 16;
  const int band = std::max(6, std::min(14, 64 / int(ranks.size())));
  p.setPen(Qt::black);
  p.drawText(QRect(4, y, label, band * int(ranks.size())), Qt::AlignVCenter,
             tr("tokens 0 … %1 (%2 in all)").arg(total - 1).arg(total));
  const double w = width() - label - 10;
  int i = 0;
  for (auto& [r, d] : ranks) {
    const int by = y + i++ * band;
    p.fillRect(QRectF(label, by + 1, w, band - 2), QColor(245, 245, 245));
    for (auto& [a, b] : d.tokens)
      p.fillRect(QRectF(label + w * a / total, by + 1, std::max(1.0, w * (b - a) / total), band - 2), palette[r % 8]);
  }
  int lx = label;
  const int ly = y + band * int(ranks.size()) + 4;
  for (auto& [r, d] : ranks) {
    p.fillRect(QRect(lx, ly, 10, 10), palette[r % 8]);
    p.drawText(QPoint(lx + 14, ly + 9), tr("rank %1").arg(r));
    lx += 70;
  }
}

PlacementPage::PlacementPage(const RunData& data, QWidget* parent) : QWidget(parent), m_data(data) {
  auto* layout = new QVBoxLayout(this);
  auto* top = new QHBoxLayout;
  top->addWidget(new QLabel(tr("Layer"), this));
  m_layer = new QComboBox(this);
  top->addWidget(m_layer);
  top->addWidget(new QLabel(tr("tsp step"), this));
  m_step = new QSpinBox(this);
  m_step->setRange(-1, 0);
  m_step->setSpecialValueText(tr("resident"));
  top->addWidget(m_step);
  top->addStretch();
  layout->addLayout(top);
  m_view = new PlacementView(data, this);
  layout->addWidget(m_view, 1);
  connect(m_layer, &QComboBox::currentIndexChanged, this, [this] { m_view->setLayer(m_layer->currentData().toInt()); });
  connect(m_step, &QSpinBox::valueChanged, m_view, &PlacementView::setStep);
}

void PlacementPage::refresh() {
  if (m_seen == m_data.revision()) return;
  m_seen = m_data.revision();
  const auto layers = m_data.layers();
  if (m_layer->count() != int(layers.size())) {
    const QSignalBlocker block(m_layer);
    m_layer->clear();
    for (int l : layers) m_layer->addItem(l < 0 ? tr("embeddings and head") : tr("layer %1").arg(l), l);
    m_layer->setCurrentIndex(layers.size() > 1 ? 1 : 0);
    m_view->setLayer(m_layer->currentData().toInt());
  }
  int steps = -1;
  for (auto& [r, d] : m_data.ranks())
    for (auto& pl : d.placements) steps = std::max(steps, pl.step);
  m_step->setMaximum(steps);
  m_view->update();
}

// --------------------------------------------------------------- Summary ---

SummaryPage::SummaryPage(const RunData& data, QWidget* parent) : QWidget(parent), m_data(data) {
  auto* layout = new QVBoxLayout(this);
  m_text = new QTextBrowser(this);
  layout->addWidget(m_text);
}

// The page as plain text: paragraphs as lines, tables as aligned columns
// (for --run-once and the headless demo; QTextDocument would put each cell
// on a line of its own).
QString SummaryPage::text() const {
  QString out;
  QTextFrame* root = m_text->document()->rootFrame();
  for (auto it = root->begin(); !it.atEnd(); ++it) {
    if (auto* table = qobject_cast<QTextTable*>(it.currentFrame())) {
      std::vector<QStringList> rows;
      std::vector<int> width(size_t(table->columns()), 0);
      for (int r = 0; r < table->rows(); ++r) {
        QStringList row;
        for (int c = 0; c < table->columns(); ++c) {
          const QTextTableCell cell = table->cellAt(r, c);
          QTextCursor cur = cell.firstCursorPosition();
          cur.setPosition(cell.lastCursorPosition().position(), QTextCursor::KeepAnchor);
          row << cur.selectedText().replace(QChar::ParagraphSeparator, ' ').simplified();
          width[size_t(c)] = std::max(width[size_t(c)], int(row.back().size()));
        }
        rows.push_back(row);
      }
      for (const QStringList& row : rows) {
        QString line;
        for (int c = 0; c < row.size(); ++c) line += row[c].leftJustified(width[size_t(c)] + 2);
        while (line.endsWith(' ')) line.chop(1);
        out += QStringLiteral("  ") + line + '\n';
      }
    } else if (it.currentBlock().isValid() && !it.currentBlock().text().trimmed().isEmpty()) {
      out += it.currentBlock().text() + '\n';
    }
  }
  return out;
}

void SummaryPage::setNotice(const QString& notice) {
  m_notice = notice;
  m_seen = ~0ull;  // redraw with it
  refresh();
}

void SummaryPage::refresh() {
  if (m_seen == m_data.revision()) return;
  m_seen = m_data.revision();
  const auto& c = m_data.config();
  const auto model = c.value("model", nlohmann::json::object());
  QString h;
  if (!m_notice.isEmpty())
    h += QStringLiteral("<p style='color:#b00'><b>%1</b></p>").arg(m_notice.toHtmlEscaped().replace('\n', "<br>"));
  if (c.empty()) {  // nothing arrived from the engine (refused, or failed before its config)
    m_text->setHtml(h);
    return;
  }
  // The run's number formats (streams from before they existed are fp32).
  const QString dtype = QString::fromStdString(c.value("dtype", std::string("fp32")));
  const QString kvDtype = QString::fromStdString(c.value("kv_dtype", dtype.toStdString()));
  auto bytesPer = [](const QString& d) { return d == QLatin1String("fp32") ? 4.0 : 2.0; };
  const double bpv = bytesPer(dtype), kvBytes = bytesPer(kvDtype);
  const double residualBytes = model.value("residual_in_fp32", false) ? 4.0 : bpv;
  h += tr("<h3>%1 · %2 · %3 device(s) · %4 · %5</h3>")
                  .arg(QString::fromStdString(model.value("name", "?")),
                       QString::fromStdString(c.value("strategy", "?")))
                  .arg(c.value("devices", 1))
                  .arg(QString::fromStdString(c.value("backend", c.contains("sweep") ? "cpu, quantization sweep" : "?")))
                  .arg(kvDtype == dtype ? dtype : tr("%1, KV cache %2").arg(dtype, kvDtype));
  // More CPU ranks than this machine's cores: every rank waits for a core,
  // so times (not memory, not bytes) say little about the strategy.
  if (c.value("backend", std::string()) == "cpu" && !m_data.ranks().empty()) {
    const int cores = QThread::idealThreadCount();
    const int ranksHere = int(m_data.ranks().size());
    const std::string host = m_data.ranks().begin()->second.device.host;
    if (ranksHere > cores && (host.empty() || QString::fromStdString(host) == QSysInfo::machineHostName()))
      h += tr("<p style='color:#8a5a00'>%1 ranks shared %2 cores here, so times are stretched and speed comparisons "
              "between strategies are unreliable; memory and bytes are exact. For times on real hardware, use a "
              "simulated backend.</p>")
               .arg(ranksHere)
               .arg(cores);
  }
  auto metric = [&](const char* name, const QString& label, const QString& unit, double scale = 1) {
    auto it = m_data.metrics().find(name);
    if (it != m_data.metrics().end())
      h += QStringLiteral("<tr><td>%1</td><td align=right>%2 %3</td></tr>").arg(label).arg(it->second * scale, 0, 'f', 2).arg(unit);
  };
  h += QStringLiteral("<table cellpadding=3>");
  metric("ttft_ms", tr("time to first token"), tr("ms"));
  metric("prefill_tokens_per_s", tr("prefill"), tr("tokens/s"));
  metric("decode_tokens_per_s", tr("decode"), tr("tokens/s"));
  metric("decode_ms_per_token", tr("per decoded token"), tr("ms"));
  h += QStringLiteral("</table><h4>%1</h4><table cellpadding=3><tr><th>rank</th>").arg(tr("Peak memory per device"));
  for (const char* cat : kCategories) h += QStringLiteral("<th>%1</th>").arg(cat);
  h += QStringLiteral("<th>total</th></tr>");
  for (auto& [r, d] : m_data.ranks()) {
    h += QStringLiteral("<tr><td>%1</td>").arg(r);
    for (const char* cat : kCategories) {
      auto it = d.metrics.find(std::string("peak_") + cat + "_bytes");
      h += QStringLiteral("<td align=right>%1</td>").arg(it == d.metrics.end() ? QStringLiteral("–") : bytesText(it->second));
    }
    auto it = d.metrics.find("peak_bytes");
    h += QStringLiteral("<td align=right><b>%1</b></td></tr>").arg(it == d.metrics.end() ? QStringLiteral("–") : bytesText(it->second));
  }
  h += tr("</table><p><small>Each category's column is its own peak; the total is the highest the categories "
          "reached together, so it can be less than their sum.</small></p>");
  if (isTraining(m_data)) h += trainingSummaryHtml(m_data);
  // For teaching: what the strategy does, and the textbook expectation beside
  // what rank 0 measured.
  const QString strategy = QString::fromStdString(c.value("strategy", "single"));
  static const std::map<QString, QString> kExplain = {
      {"single", QObject::tr("One device holds every weight and every token: the reference every strategy must equal.")},
      {"dp", QObject::tr("Every device holds all weights and runs its own sequences; devices never talk during inference.")},
      {"tp", QObject::tr("Tensor parallelism: each device holds 1/T of every attention head group, MLP column block or "
                         "Mamba channel block and sees every token; one all-reduce after attention and one after the "
                         "MLP (Mamba: after out_proj, plus the small x_proj one).")},
      {"sp", QObject::tr("Sequence parallelism: every device holds all weights and 1/S of the tokens (zigzag chunks "
                         "balance causal work); attention all-gathers K/V, Mamba layers pass a conv halo and scan "
                         "states between devices.")},
      {"tp_sp", QObject::tr("A T x S mesh: tensor parallelism along T, sequence parallelism along S.")},
      {"tsp", QObject::tr("Folded tensor and sequence parallelism: each device holds 1/D of every projection AND 1/D of "
                          "the tokens; weight shards are broadcast in turns (attention) or passed around a ring (MLP, "
                          "Mamba) while each device computes its own tokens, so no all-reduce is needed.")}};
  if (auto it = kExplain.find(strategy); it != kExplain.end()) h += QStringLiteral("<p><i>%1</i></p>").arg(it->second);
  const auto mesh = c.value("mesh", nlohmann::json::object());
  const double D = c.value("devices", 1), T = mesh.value("tp", 1), S = mesh.value("sp", 1);
  const double shards = strategy == "tsp" ? D : (strategy == "tp" || strategy == "tp_sp") ? T : 1;
  const double params = c.value("parameters", 0.0);
  if (params > 0 && !m_data.ranks().empty() && !isTraining(m_data)) {  // inference's textbook terms
    const auto& r0 = m_data.ranks().begin()->second.metrics;
    auto measured = [&](const char* k) { auto it = r0.find(k); return it == r0.end() ? 0.0 : it->second; };
    h += tr("<h4>Expected (textbook) against measured, rank 0</h4><table cellpadding=3>"
            "<tr><th></th><th>expected</th><th>measured</th><th>note</th></tr>");
    // Embeddings and the LM head stay whole on every device.
    const double embed = model.value("vocab_size", 0.0) * model.value("hidden_size", 0.0) *
                         (model.value("tie_word_embeddings", false) ? 1 : 2);
    h += tr("<tr><td>weights</td><td align=right>%1</td><td align=right>%2</td><td>(parameters - embeddings and "
            "head) x %4 bytes / (shards = %3) + embeddings and head x %4 bytes (norms, also whole, are left "
            "out)</td></tr>")
             .arg(bytesText((params - embed) * bpv / shards + embed * bpv))
             .arg(bytesText(measured("peak_weights_bytes")))
             .arg(shards)
             .arg(bpv);
    const auto work = c.value("workload", nlohmann::json::object());
    const double tokens = work.value("prompt_len", 0.0) + work.value("decode", 0.0);
    const double layers = model.value("num_hidden_layers", 0.0);
    const double kv = model.value("num_key_value_heads", 0.0) * model.value("head_dim", 0.0);
    int attn_layers = 0;
    for (char l : model.value("layer_pattern", std::string())) attn_layers += l == 'A';
    if (kv > 0 && layers > 0) {
      const double seq = strategy == "tsp" ? D : S, heads_split = (strategy == "tsp") ? 1 : shards;
      h += tr("<tr><td>KV cache</td><td align=right>%1</td><td align=right>%2</td><td>2 (K, V) x %3 attention "
              "layers x tokens / (sequence shards = %4) x kv width / (head shards = %5) x %6 bytes</td></tr>")
               .arg(bytesText(2 * attn_layers * tokens / seq * kv / heads_split * kvBytes))
               .arg(bytesText(measured("peak_kv_cache_bytes")))
               .arg(attn_layers)
               .arg(seq)
               .arg(heads_split)
               .arg(kvBytes);
    }
    // Activations: the residual stream of the tokens this device works on is
    // the least any layer keeps live; the measured peak adds the layer's own
    // intermediates (projections, the MLP's hidden width, attention tiles).
    {
      const double tokensHere = strategy == "tsp" ? work.value("prompt_len", 0.0) / D
                                : (strategy == "sp" || strategy == "tp_sp") ? work.value("prompt_len", 0.0) / S
                                                                             : work.value("prompt_len", 0.0);
      const double dm = model.value("hidden_size", 0.0);
      if (tokensHere > 0 && dm > 0)
        h += tr("<tr><td>activations</td><td align=right>&ge; %1</td><td align=right>%2</td><td>the residual "
                "stream: tokens on this device (%3) x d x %4 bytes; the peak adds one layer's intermediates</td></tr>")
                 .arg(bytesText(tokensHere * dm * residualBytes))
                 .arg(bytesText(measured("peak_activations_bytes")))
                 .arg(tokensHere)
                 .arg(residualBytes);
    }
    // Bytes one device puts on the wire for one attention layer's prefill,
    // counted as the engine counts them: an all-reduce of N bytes moves
    // 2(n-1)/n N (ring), an all-gather (n-1)/n N, a ring step or broadcast
    // turn the shard itself.
    const double d = model.value("hidden_size", 0.0), inter = model.value("intermediate_size", 0.0);
    const double batch = strategy == "dp" ? 1 : work.value("batch", 1.0);
    const double P = work.value("prompt_len", 0.0) * batch;
    const std::string precision = c.value("comm_precision", std::string("fp32"));
    int first_attn = -1;
    {
      const std::string pattern = model.value("layer_pattern", std::string());
      for (size_t i = 0; i < pattern.size(); ++i)
        if (pattern[i] == 'A') {
          first_attn = int(i);
          break;
        }
    }
    if (first_attn >= 0 && kv > 0 && d > 0 && P > 0 && precision == "fp32") {
      double expected = 0;
      QString how;
      // Partial sums and weight shards travel in the compute dtype, K/V in the cache's.
      if (strategy == "tp") {
        expected = 2 * 2 * (T - 1) / T * P * d * bpv;
        how = tr("2 all-reduces (attention, MLP) x 2(T-1)/T x tokens x d x %1 bytes").arg(bpv);
      } else if (strategy == "sp") {
        expected = 2 * (S - 1) / S * P * kv * kvBytes;
        how = tr("K and V all-gathered: 2 x (S-1)/S x tokens x kv width x %1 bytes").arg(kvBytes);
      } else if (strategy == "tp_sp") {
        expected = 2 * 2 * (T - 1) / T * (P / S) * d * bpv + 2 * (S - 1) / S * P * (kv / T) * kvBytes;
        how = tr("2 all-reduces of tokens/S rows along T, plus K and V (kv width/T) all-gathered along S");
      } else if (strategy == "tsp") {
        const double qkv = d * (d + 2 * kv), o = d * d, mlp = 3 * d * inter;
        expected = (qkv + o) * bpv + 2 * (D - 1) / D * P * kv * kvBytes + (D - 1) / D * mlp * bpv;
        how = tr("attention weights broadcast in D turns of 1/D each, K and V all-gathered, MLP weights passed "
                 "D-1 steps around the ring");
      } else {
        how = tr("nothing: every device works alone");
      }
      double measuredBytes = 0;
      for (const auto& sp : m_data.ranks().begin()->second.spans)
        if (sp.stream == "comm" && sp.layer == first_attn && sp.phase == "prefill") measuredBytes += sp.bytes;
      h += tr("<tr><td>bytes sent, attention layer %1, prefill</td><td align=right>%2</td><td "
              "align=right>%3</td><td>%4</td></tr>")
               .arg(first_attn)
               .arg(bytesText(expected))
               .arg(bytesText(measuredBytes))
               .arg(how);
    }
    h += QStringLiteral("</table>");
  }
  // Communication, once the run has ended.
  if (!m_data.status().isEmpty()) {
    double bytes = 0, commNs = 0, hiddenNs = 0;
    for (auto& [rank, st] : m_data.commStats()) {
      bytes += st.bytes;
      commNs += st.commNs;
      hiddenNs += st.hiddenNs;
    }
    h += tr("<h4>Communication</h4><p>%1 on the wire in all; %2% of communication time hidden behind compute.</p>")
             .arg(bytesText(bytes))
             .arg(commNs > 0 ? 100 * hiddenNs / commNs : 0.0, 0, 'f', 0);
  }
  for (const auto& e : m_data.errors())
    h += tr("<p style='color:#b00'><b>%1</b> (rank %2): %3</p>")
             .arg(QString::fromStdString(e.code))
             .arg(e.rank)
             .arg(QString::fromStdString(e.message).toHtmlEscaped());
  m_text->setHtml(h);
}

// ---------------------------------------------------------- Quantization ---

QuantizationPage::QuantizationPage(const RunData& data, QWidget* parent) : QWidget(parent), m_data(data) {
  auto* layout = new QVBoxLayout(this);
  m_hint = new QLabel(tr("Press <b>Quantization sweep</b> (or open a sweep stream) to see what quantized all-reduces "
                         "save on the wire and cost in accuracy."),
                      this);
  m_hint->setWordWrap(true);
  layout->addWidget(m_hint);
  auto* row = new QHBoxLayout;
  m_tradeoff = new QCustomPlot(this);
  m_tradeoff->xAxis->setLabel(tr("bytes on the wire per rank"));
  m_tradeoff->xAxis->setTicker(QSharedPointer<QCPAxisTicker>(new BytesTicker));
  m_tradeoff->yAxis->setLabel(tr("logits KL against the unquantized run"));
  m_tradeoff->yAxis->setScaleType(QCPAxis::stLogarithmic);
  m_tradeoff->yAxis->setTicker(QSharedPointer<QCPAxisTickerLog>(new QCPAxisTickerLog));
  m_sites = new QCustomPlot(this);
  m_sites->yAxis->setLabel(tr("KL with only this site quantized"));
  m_sites->yAxis->setScaleType(QCPAxis::stLogarithmic);
  m_sites->yAxis->setTicker(QSharedPointer<QCPAxisTickerLog>(new QCPAxisTickerLog));
  m_sites->legend->setVisible(true);
  m_sites->xAxis->setTickLabelRotation(60);
  row->addWidget(m_tradeoff, 3);
  row->addWidget(m_sites, 2);
  layout->addLayout(row, 3);
  m_tokens = new QTableWidget(this);
  m_tokens->setEditTriggers(QAbstractItemView::NoEditTriggers);
  m_tokens->horizontalHeader()->setDefaultSectionSize(44);
  m_tokens->verticalHeader()->setDefaultSectionSize(fontMetrics().height() + 6);
  m_tokens->setToolTip(tr("The greedy token each configuration would choose at every decode step (all decoded with "
                          "the reference's tokens); red: it differs from the reference; boxed: the first divergence"));
  m_tokensTitle = new QLabel(tr("<b>Greedy tokens</b> against the unquantized reference (red: differs; ▶ first "
                                "divergence)"),
                             this);
  layout->addWidget(m_tokensTitle);
  layout->addWidget(m_tokens, 1);
}

int QuantizationPage::tokenRows() const { return m_tokens->rowCount(); }

int QuantizationPage::firstDivergence(int row) const {
  for (int c = 0; c < m_tokens->columnCount(); ++c)
    if (auto* item = m_tokens->item(row, c); item && item->data(Qt::UserRole).toBool()) return c;
  return -1;
}

// One row per configuration that wrote its greedy tokens, the reference
// first; cells that differ from the reference in red, the first one marked.
void QuantizationPage::fillTokens() {
  const auto& gens = m_data.generations();
  m_tokens->clear();
  m_tokens->setRowCount(0);
  if (gens.empty()) return;
  std::string refLabel;
  for (const auto& a : m_data.accuracy())
    if (a.metric == "positions") refLabel = a.config;
  const ss::proto::Generation* ref = &gens.front();
  for (const auto& g : gens)
    if (g.config == refLabel) ref = &g;
  // The reference first, then the configurations that diverge, earliest
  // first, then the ones that never do.
  auto divergence = [&](const ss::proto::Generation* g) {
    for (size_t k = 0; k < g->tokens.size(); ++k)
      if (k >= ref->tokens.size() || g->tokens[k] != ref->tokens[k]) return int(k);
    return std::numeric_limits<int>::max();
  };
  std::vector<const ss::proto::Generation*> rows;
  for (const auto& g : gens)
    if (&g != ref) rows.push_back(&g);
  std::stable_sort(rows.begin(), rows.end(), [&](auto* a, auto* b) { return divergence(a) < divergence(b); });
  rows.insert(rows.begin(), ref);
  size_t steps = 0;
  for (auto* g : rows) steps = std::max(steps, g->tokens.size());
  m_tokens->setRowCount(int(rows.size()));
  m_tokens->setColumnCount(int(steps));
  QStringList header, labels;
  for (size_t k = 0; k < steps; ++k) header << QString::number(k);
  m_tokens->setHorizontalHeaderLabels(header);
  for (size_t r = 0; r < rows.size(); ++r) {
    labels << QString::fromStdString(rows[r]->config) + (r == 0 ? tr(" (reference)") : QString());
    bool diverged = false;
    for (size_t k = 0; k < rows[r]->tokens.size(); ++k) {
      const bool differs = k >= ref->tokens.size() || rows[r]->tokens[k] != ref->tokens[k];
      const bool first = differs && !diverged;
      diverged = diverged || differs;
      auto* item = new QTableWidgetItem((first ? QStringLiteral("▶") : QString()) + QString::number(rows[r]->tokens[k]));
      item->setTextAlignment(Qt::AlignCenter);
      if (differs) item->setForeground(QColor(176, 0, 0));
      if (first) {
        item->setBackground(QColor(255, 228, 225));
        item->setData(Qt::UserRole, true);
        item->setToolTip(tr("first divergence from the reference: decode step %1").arg(k));
      }
      m_tokens->setItem(int(r), int(k), item);
    }
  }
  m_tokens->setVerticalHeaderLabels(labels);
}

void QuantizationPage::refresh() {
  if (m_seen == m_data.revision()) return;
  m_seen = m_data.revision();
  // Points: config -> metric -> value, from the sweep's accuracy records.
  std::map<std::string, std::map<std::string, double>> pts;
  for (const auto& a : m_data.accuracy())
    if (!a.config.empty()) pts[a.config][a.metric] = a.value;
  m_points = int(pts.size());
  m_hint->setVisible(pts.empty());
  for (QWidget* w : std::initializer_list<QWidget*>{m_tradeoff, m_sites, m_tokens, m_tokensTitle})
    w->setVisible(!pts.empty());
  fillTokens();
  m_tradeoff->clearPlottables();
  m_tradeoff->clearItems();
  m_sites->clearPlottables();
  if (pts.empty()) {
    m_tradeoff->replot();
    m_sites->replot();
    return;
  }
  // All-sites points (labels without "site="), the reference excluded (KL 0).
  struct P {
    std::string label;
    double wire, kl;
  };
  std::vector<P> all;
  for (auto& [label, m] : pts)
    if (label.find('=') == std::string::npos && m.count("kl") && m.at("kl") > 0)
      all.push_back({label, m.count("wire_bytes") ? m.at("wire_bytes") : 0.0, m.at("kl")});
  QVector<double> x, y, fx, fy;
  double xmax = 1, ymin = 1e30, ymax = 1e-30;
  for (const P& p : all) {
    bool dominated = false;
    for (const P& q : all)
      if (q.wire <= p.wire && q.kl <= p.kl && (q.wire < p.wire || q.kl < p.kl)) dominated = true;
    (dominated ? x : fx) << p.wire;
    (dominated ? y : fy) << p.kl;
    xmax = std::max(xmax, p.wire);
    ymin = std::min(ymin, p.kl);
    ymax = std::max(ymax, p.kl);
    auto* label = new QCPItemText(m_tradeoff);
    label->position->setCoords(p.wire, p.kl);
    label->setPositionAlignment(Qt::AlignLeft | Qt::AlignBottom);
    label->setText(QString::fromStdString(p.label));
    label->setFont(QFont(font().family(), 8));
  }
  auto* g = m_tradeoff->addGraph();
  g->setLineStyle(QCPGraph::lsNone);
  g->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssCircle, QColor(120, 120, 120), 7));
  g->setData(x, y);
  auto* front = m_tradeoff->addGraph();
  front->setLineStyle(QCPGraph::lsNone);
  front->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssDisc, QColor(234, 67, 53), 9));
  front->setData(fx, fy);
  front->setName(tr("Pareto front"));
  m_tradeoff->xAxis->setRange(0, xmax * 1.25);
  m_tradeoff->yAxis->setRange(std::max(ymin / 3, 1e-12), ymax * 3);
  m_tradeoff->replot();

  // Sensitivity: one bar group per spec, one bar per site.
  std::map<std::string, std::map<std::string, double>> by_spec;  // spec -> site -> KL
  for (auto& [label, m] : pts) {
    const auto eq = label.find('=');
    if (eq == std::string::npos || !m.count("kl")) continue;
    by_spec[label.substr(eq + 1)][label.substr(0, eq)] = std::max(m.at("kl"), 1e-12);
  }
  QVector<double> ticks;
  QVector<QString> names;
  std::set<std::string> sites;
  for (auto& [spec, m] : by_spec) {
    ticks << ticks.size();
    names << QString::fromStdString(spec);
    for (auto& [site, v] : m) sites.insert(site);
  }
  auto* group = new QCPBarsGroup(m_sites);
  const QColor colors[] = {QColor(66, 133, 244), QColor(52, 168, 83), QColor(251, 140, 0)};
  int si = 0;
  double smin = 1e30, smax = 1e-30;
  for (const std::string& site : sites) {
    QVector<double> v;
    for (auto& [spec, m] : by_spec) {
      const double kl = m.count(site) ? m.at(site) : 1e-12;
      v << kl;
      smin = std::min(smin, kl);
      smax = std::max(smax, kl);
    }
    auto* bars = new QCPBars(m_sites->xAxis, m_sites->yAxis);
    bars->setName(QString::fromStdString(site));
    bars->setBrush(colors[si++ % 3]);
    bars->setPen(Qt::NoPen);
    bars->setBaseValue(1e-12);
    bars->setWidth(0.8 / std::max<size_t>(1, sites.size()));
    bars->setBarsGroup(group);
    bars->setData(ticks, v);
  }
  QSharedPointer<QCPAxisTickerText> ticker(new QCPAxisTickerText);
  ticker->addTicks(ticks, names);
  m_sites->xAxis->setTicker(ticker);
  m_sites->xAxis->setRange(-0.6, std::max(1.0, double(ticks.size())) - 0.4);
  if (!sites.empty()) m_sites->yAxis->setRange(std::max(smin / 3, 1e-12), smax * 3);
  m_sites->replot();
}

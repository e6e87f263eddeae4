#include "pages.h"

#include <QCheckBox>
#include <QComboBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QVBoxLayout>
#include <qcustomplot.h>

#include <algorithm>
#include <map>
#include <cmath>

#include "palette.h"
#include "training.h"

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
  m_plot = newPlot(this);
  m_plot->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
  m_plot->axisRect()->setRangeZoom(Qt::Horizontal);
  m_plot->axisRect()->setRangeDrag(Qt::Horizontal);
  m_plot->xAxis->setLabel(tr("time (ms)"));
  m_plot->yAxis->setTicker(bytesTicker());
  legendBeside(m_plot);  // clear of the peak's marker and label
  connect(m_plot, &QCustomPlot::afterLayout, this, &MemoryPage::placePeakLabel);
  layout->addWidget(m_plot, 3);
  m_bars = newPlot(this);
  m_bars->yAxis->setTicker(bytesTicker());
  legendBeside(m_bars);  // clear of the last rank's bars
  m_bars->xAxis->grid()->setZeroLinePen(Qt::NoPen);  // rank 0 sits at x = 0: no line through its bars
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
    replotWhenShown(m_plot);
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
  text->position->setType(QCPItemPosition::ptAbsolute);  // placed in pixels at each layout (placePeakLabel)
  text->setTextAlignment(Qt::AlignHCenter);
  text->setText(m_hideWeights->isChecked() ? tr("peak %1 without weights").arg(bytesText(peak)) : tr("peak %1").arg(bytesText(peak)));
  for (const auto& e : m_data.errors())
    if (e.code == "oom" && (rank < 0 || e.rank == rank))
      text->setText(tr("peak %1\nout of memory here").arg(bytesText(peak)));
  m_peakLabel = text;
  m_peakAt = QPointF(peak_t, peak);
  const double t0 = mem.front().t * 1e-6, t1 = std::max(mem.back().t * 1e-6, t0 + 1e-3);
  m_plot->xAxis->setRange(t0, t1);
  m_plot->yAxis->setRange(0, std::max(peak, capacityOnScale ? capacity : 0.0) * 1.12 + 1);
  replotWhenShown(m_plot);
}

// The peak's label, placed in pixels once the plot's layout is known (at
// every replot: a resize, a zoom): centred over the peak where it fits, slid
// sideways to stay inside the plot near its left or right edge, below the
// peak where the plot's top leaves no room above it, and hidden while the
// peak is zoomed or dragged out of view.
void MemoryPage::placePeakLabel() {
  if (!m_peakLabel) return;
  const QRect area = m_plot->axisRect()->rect();
  const double x = m_plot->xAxis->coordToPixel(m_peakAt.x()), y = m_plot->yAxis->coordToPixel(m_peakAt.y());
  m_peakLabel->setVisible(x >= area.left() && x <= area.right());
  const QSize size = QFontMetrics(m_peakLabel->font()).size(0, m_peakLabel->text());
  const double half = size.width() / 2.0 + 2, gap = 6;
  const double cx = std::clamp(x, area.left() + half, std::max(area.left() + half, area.right() - half));
  const bool above = y - gap - size.height() >= area.top();
  m_peakLabel->setPositionAlignment(Qt::AlignHCenter | (above ? Qt::AlignBottom : Qt::AlignTop));
  m_peakLabel->position->setCoords(cx, above ? y - gap : y + gap);
}

// Peak bytes per category on every device, as grouped bars (exact peaks from
// the per-rank metrics when the run has finished, else from the samples).
void MemoryPage::drawAllDevices() {
  m_bars->clearPlottables();
  const auto& ranks = m_data.ranks();
  if (ranks.empty()) {
    replotWhenShown(m_bars);
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
  replotWhenShown(m_bars);
}

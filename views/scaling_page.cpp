#include "scaling_page.h"

#include <QCheckBox>
#include <QComboBox>
#include <QHBoxLayout>
#include <QHelpEvent>
#include <QLabel>
#include <QMouseEvent>
#include <QToolTip>
#include <QVBoxLayout>
#include <qcustomplot.h>

#include <algorithm>
#include <map>
#include <cmath>
#include <set>
#include <vector>

#include "pages.h"
#include "palette.h"

using ss::proto::ScalePoint;
using json = nlohmann::json;

namespace {

// Fields of the free-form config and textbook objects, read without
// trusting their types (a hand-edited stream may carry anything there).
const json& field(const json& j, const char* key) {
  static const json none;
  if (!j.is_object()) return none;
  auto it = j.find(key);
  return it == j.end() ? none : *it;
}
double number(const json& j, const char* key, double def = 0) {
  const json& v = field(j, key);
  return v.is_number() ? v.get<double>() : def;
}
std::string text(const json& j, const char* key, const std::string& def = {}) {
  const json& v = field(j, key);
  return v.is_string() ? v.get<std::string>() : def;
}
size_t entries(const json& j, const char* key) {
  const json& v = field(j, key);
  return v.is_array() ? v.size() : 0;
}

// Sequence lengths on a log-2 axis, labelled 4K, 8K, ... 1M.
class LengthTicker : public QCPAxisTickerLog {
 public:
  LengthTicker() { setLogBase(2); setSubTickCount(0); }

 protected:
  QString getTickLabel(double tick, const QLocale&, QChar, int) override { return lengthText(tick); }
};

// Rates on a log axis: 1, 2 and 5 times the powers of ten in range (every
// digit where the range spans less; the powers alone where it spans many),
// labelled 50K, 2M (evenly spaced where fewer than two fall in range).
// QCustomPlot's log ticker crowds its labels into the top of a range
// narrower than a decade.
class RateTicker : public QCPAxisTicker {
 protected:
  QVector<double> createTickVector(double tickStep, const QCPRange& range) override {
    QVector<double> ticks;
    if (!(range.lower > 0) || !(range.upper > range.lower)) return ticks;
    const double first = std::pow(10.0, std::floor(std::log10(range.lower)));
    for (const std::vector<double>& mantissas : {std::vector<double>{1, 2, 5}, std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9},
                                                 std::vector<double>{1}}) {
      ticks.clear();
      for (double decade = first; decade <= range.upper && ticks.size() < 200; decade *= 10)
        for (double m : mantissas)
          if (m * decade >= range.lower && m * decade <= range.upper) ticks << m * decade;
      if (mantissas.size() == 3 && ticks.size() < 3) continue;  // too few: every digit
      if (mantissas.size() != 1 && ticks.size() > 10) continue;  // too many: the powers alone
      break;
    }
    // Within one digit of a decade (say 130K to 170K): evenly spaced ticks.
    return ticks.size() >= 2 ? ticks : QCPAxisTicker::createTickVector(tickStep, range);
  }
  QVector<double> createSubTickVector(int, const QVector<double>&) override { return {}; }
  QString getTickLabel(double tick, const QLocale&, QChar, int) override {
    if (tick >= 1e9) return QString::number(tick / 1e9, 'g', 3) + "G";
    if (tick >= 1e6) return QString::number(tick / 1e6, 'g', 3) + "M";
    if (tick >= 1e3) return QString::number(tick / 1e3, 'g', 3) + "K";
    return QString::number(tick, 'g', 3);
  }
};

QString lineName(const ScalePoint& p) {
  return QString::fromStdString(p.mesh.empty() ? p.strategy : p.strategy + " " + p.mesh);
}

// One colour per strategy, the same on every plot and in every sweep.
QColor strategyColor(const ScalePoint& p) {
  static const std::map<std::string, QColor> known = {
      {"single", QColor(120, 120, 120)}, {"dp", QColor(160, 120, 80)}, {"tp", QColor(66, 133, 244)},
      {"sp", QColor(52, 168, 83)},       {"tsp", QColor(234, 67, 53)}};
  if (auto it = known.find(p.strategy); it != known.end()) return it->second;
  static const QColor meshes[] = {QColor(171, 71, 188), QColor(255, 152, 0), QColor(0, 150, 136),
                                  QColor(121, 85, 72)};
  return meshes[std::hash<std::string>{}(p.mesh) % 4];
}

double commBytes(const ScalePoint& p) { return p.comm_activation_bytes + p.comm_weight_bytes; }

// A CSV field: quoted, with quotes doubled, when it holds a comma, a quote or a line break.
QString csvField(const std::string& text) {
  QString f = QString::fromStdString(text);
  if (!f.contains(',') && !f.contains('"') && !f.contains('\n') && !f.contains('\r')) return f;
  return '"' + f.replace('"', QStringLiteral("\"\"")) + '"';
}

}  // namespace

struct ScalingPage::Line {
  QString name;
  QColor color;
  std::vector<size_t> index;  // of its applicable points in RunData::scalePoints(), in length order
};

ScalingPage::ScalingPage(const RunData& data, QWidget* parent) : QWidget(parent), m_data(data) {
  auto* layout = new QVBoxLayout(this);
  auto* top = new QHBoxLayout;
  m_title = new QLabel(tr("Press <b>Scaling sweep</b> (or open a scale stream) to see where each strategy runs "
                          "out of memory as the sequence grows."),
                       this);
  m_title->setWordWrap(true);
  top->addWidget(m_title, 1);
  m_batch = new QComboBox(this);
  m_batch->setToolTip(tr("Micro-batch of the points drawn"));
  top->addWidget(m_batch);
  m_textbook = new QCheckBox(tr("closed form"), this);
  m_textbook->setToolTip(tr("Draw each strategy's closed-form estimate (parameters, kept activations, caches) "
                            "dashed beside the simulated peak"));
  top->addWidget(m_textbook);
  layout->addLayout(top);

  auto makePlot = [this](const QString& ylabel) {
    auto* p = newPlot(this);
    p->xAxis->setLabel(tr("sequence length (tokens)"));
    p->xAxis->setScaleType(QCPAxis::stLogarithmic);
    p->xAxis->setTicker(QSharedPointer<QCPAxisTicker>(new LengthTicker));
    p->yAxis->setLabel(ylabel);
    p->setMouseTracking(true);
    p->installEventFilter(this);
    return p;
  };
  m_memory = makePlot(tr("peak memory per device"));
  m_memory->yAxis->setTicker(bytesTicker());
  legendBeside(m_memory);  // clear of the longest sequences' points
  m_speed = makePlot(tr("tokens/s"));
  m_speed->setToolTip(tr("Tokens per second of the whole group: a training step's, or an inference prefill's"));
  m_speed->yAxis->setScaleType(QCPAxis::stLogarithmic);
  m_speed->yAxis->setTicker(QSharedPointer<QCPAxisTicker>(new RateTicker));
  m_comm = makePlot(tr("bytes communicated per device"));
  m_comm->yAxis->setTicker(bytesTicker());
  layout->addWidget(m_memory, 3);
  auto* row = new QHBoxLayout;
  row->addWidget(m_speed, 1);
  row->addWidget(m_comm, 1);
  layout->addLayout(row, 2);
  m_notes = new QLabel(this);
  m_notes->setWordWrap(true);
  m_notes->setTextInteractionFlags(Qt::TextSelectableByMouse);
  layout->addWidget(m_notes);
  connect(m_batch, &QComboBox::currentIndexChanged, this, [this] { draw(); });
  connect(m_textbook, &QCheckBox::toggled, this, [this] { draw(); });
}

void ScalingPage::refresh() {
  if (m_seen == m_data.revision()) return;
  m_seen = m_data.revision();
  std::set<int> batches;
  for (auto& p : m_data.scalePoints()) batches.insert(p.micro_batch);
  const QString current = m_batch->currentText();
  m_batch->blockSignals(true);
  m_batch->clear();
  for (int b : batches) m_batch->addItem(tr("micro-batch %1").arg(b), b);
  const int at = m_batch->findText(current);
  m_batch->setCurrentIndex(at >= 0 ? at : 0);
  m_batch->blockSignals(false);
  m_batch->setVisible(batches.size() > 1);
  draw();
}

void ScalingPage::draw() {
  const int batch = m_batch->currentData().isValid() ? m_batch->currentData().toInt() : 1;
  std::map<QString, Line> lines;
  std::vector<QString> order;  // strategies in the order the sweep lists them
  QStringList notApplicable;
  std::set<QString> refused;
  int64_t capacity = 0;
  const auto& all = m_data.scalePoints();
  for (size_t i = 0; i < all.size(); ++i) {
    const ScalePoint& p = all[i];
    if (p.micro_batch != batch) continue;
    const QString name = lineName(p);
    if (!p.applicable()) {
      if (refused.insert(name).second && refused.size() <= 20)
        notApplicable << tr("<b>%1</b> does not apply: %2")
                             .arg(name.toHtmlEscaped(), QString::fromStdString(p.reason).toHtmlEscaped());
      continue;
    }
    capacity = std::max(capacity, p.capacity);
    auto [it, fresh] = lines.try_emplace(name, Line{name, strategyColor(p), {}});
    if (fresh) order.push_back(name);
    it->second.index.push_back(i);
  }
  if (refused.size() > 20) notApplicable << tr("... and %1 more strategies that do not apply").arg(refused.size() - 20);
  // The config lists the sweep's strategies; draw in that order where it can.
  std::vector<QString> sorted;
  std::set<QString> placed;
  const json& listed = field(field(m_data.config(), "scale"), "strategies");
  for (auto& s : listed.is_array() ? listed : json::array())
    if (s.is_string()) {
      QString n = QString::fromStdString(s.get<std::string>()).replace(':', ' ');
      if (lines.count(n) && placed.insert(n).second) sorted.push_back(n);
    }
  for (auto& n : order)
    if (placed.insert(n).second) sorted.push_back(n);
  // A sweep draws a handful of strategies; a hand-written stream may name thousands.
  constexpr size_t kMaxLines = 32;
  const size_t hidden = sorted.size() > kMaxLines ? sorted.size() - kMaxLines : 0;
  if (hidden) {
    sorted.resize(kMaxLines);
    notApplicable << tr("%1 more strategies are not drawn").arg(hidden);
  }

  m_drawn.clear();
  m_drawnRevision = m_data.revision();
  m_points = 0;
  m_lines = int(sorted.size());
  for (QCustomPlot* plot : {m_memory, m_speed, m_comm}) {
    plot->clearGraphs();
    plot->clearItems();
  }
  QVector<double> oomX, oomY;
  double lo = 0, hi = 0, top = 0;
  for (const QString& name : sorted) {
    Line& line = lines[name];
    std::sort(line.index.begin(), line.index.end(),
              [&](size_t a, size_t b) { return all[a].seq_len < all[b].seq_len; });
    QVector<double> x, mem, speed, comm, book;
    for (size_t i : line.index) {
      const ScalePoint* p = &all[i];
      x << double(p->seq_len);
      mem << double(p->peak_bytes);
      speed << std::max(p->tokens_per_s, 1e-9);
      comm << commBytes(*p);
      book << number(p->textbook, "total_bytes");
      if (!p->fits) {
        oomX << double(p->seq_len);
        oomY << double(p->peak_bytes);
      }
      lo = lo == 0 ? x.back() : std::min(lo, x.back());
      hi = std::max(hi, x.back());
      top = std::max(top, mem.back());
      ++m_points;
    }
    auto add = [&](QCustomPlot* plot, const QVector<double>& y, bool legend) {
      // A line on top of one already drawn (dp's memory is single's) is
      // dashed, so that the one beneath shows through.
      bool covers = false;
      for (int i = 0; i < plot->graphCount() && !covers; ++i) {
        const QCPGraph* under = plot->graph(i);
        covers = under->dataCount() == x.size();
        for (int k = 0; covers && k < x.size(); ++k)
          covers = under->data()->at(k)->key == x[k] && std::abs(under->data()->at(k)->value - y[k]) <=
                                                            1e-6 * std::max(std::abs(y[k]), 1.0);
      }
      QCPGraph* g = plot->addGraph();
      g->setName(name);
      g->setPen(QPen(line.color, 2, covers ? Qt::DashLine : Qt::SolidLine));
      g->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssCircle, line.color, Qt::white, 6));
      g->setData(x, y, true);
      if (!legend) g->removeFromLegend();
      m_drawn[plot][plot->graphCount() - 1] = line.index;
    };
    add(m_memory, mem, true);
    add(m_speed, speed, false);
    add(m_comm, comm, false);
    if (m_textbook->isChecked()) {
      QCPGraph* g = m_memory->addGraph();
      g->setName(name + tr(" (closed form)"));
      g->setPen(QPen(line.color.lighter(130), 1.5, Qt::DashLine));
      g->setData(x, book, true);
      g->removeFromLegend();
    }
  }
  if (!oomX.isEmpty()) {
    QCPGraph* g = m_memory->addGraph();
    g->setName(tr("does not fit"));
    g->setLineStyle(QCPGraph::lsNone);
    g->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssCross, QPen(QColor(200, 30, 30), 2.5), QBrush(), 11));
    g->setData(oomX, oomY);
  }
  // The memory axis from 0 over the points, and over the capacity line when
  // the points come within reach of it; points far past it leave through
  // the top, crossed out where they would be.
  double fitting = 0;
  for (auto& [name, line] : lines)
    for (size_t i : line.index)
      if (all[i].fits) fitting = std::max(fitting, double(all[i].peak_bytes));
  const bool capacityShown = capacity > 0 && top >= 0.25 * double(capacity);
  if (capacity > 0) {
    auto* label = new QCPItemText(m_memory);
    label->setColor(QColor(200, 30, 30));
    if (capacityShown) {
      auto* cap = new QCPItemStraightLine(m_memory);
      cap->point1->setCoords(1, double(capacity));
      cap->point2->setCoords(2, double(capacity));
      cap->setPen(QPen(QColor(200, 30, 30), 1.5, Qt::DashLine));
      label->position->setCoords(lo > 0 ? lo / 1.25 : 1, double(capacity));  // at the left end, above the line
      label->setPositionAlignment(Qt::AlignLeft | Qt::AlignBottom);
      label->setText(tr("device capacity %1").arg(bytesText(double(capacity))));
    } else {
      label->position->setType(QCPItemPosition::ptAxisRectRatio);
      label->position->setCoords(0.01, 0.01);
      label->setPositionAlignment(Qt::AlignLeft | Qt::AlignTop);
      label->setText(tr("device capacity %1, far above every point").arg(bytesText(double(capacity))));
    }
  }
  for (QCustomPlot* plot : {m_memory, m_speed, m_comm}) {
    plot->rescaleAxes();
    if (hi > 0) plot->xAxis->setRange(lo / 1.3, hi * 1.3);
  }
  const double yTop = capacityShown ? std::max(double(capacity), std::min(top, std::max(double(capacity), fitting) * 2.2))
                                    : top;
  m_memory->yAxis->setRange(0, std::max(yTop, 1.0) * 1.08);
  // Points that do not fit and leave through the top: an arrow at the top
  // edge at their length, with how many and how high.
  std::map<double, std::pair<int, double>> above;  // length -> (points, highest)
  for (int i = 0; i < oomX.size(); ++i)
    if (oomY[i] > m_memory->yAxis->range().upper) {
      auto& [n, highest] = above[oomX[i]];
      ++n;
      highest = std::max(highest, oomY[i]);
    }
  for (const auto& [x, nh] : above) {
    auto* arrow = new QCPItemText(m_memory);
    arrow->position->setTypeY(QCPItemPosition::ptAxisRectRatio);
    arrow->position->setCoords(x, 0.0);
    arrow->setPositionAlignment(Qt::AlignHCenter | Qt::AlignTop);
    arrow->setColor(QColor(200, 30, 30));
    arrow->setText(nh.first == 1 ? tr("✕ ↑ %1").arg(bytesText(nh.second))
                                 : tr("%1 ✕ ↑ to %2").arg(nh.first).arg(bytesText(nh.second)));
  }
  m_speed->yAxis->setRange(m_speed->yAxis->range().lower / 1.25, m_speed->yAxis->range().upper * 1.25);
  m_comm->yAxis->setRange(0, std::max(m_comm->yAxis->range().upper, 1.0) * 1.08);

  const nlohmann::json& c = m_data.config();
  if (m_points > 0) {
    const json& sc = field(c, "scale");
    const std::string model = text(field(c, "model"), "name"), hw = text(field(c, "hardware"), "name");
    // Progress: the sweep's points arrive as they finish, out of strategies x lengths x micro-batches.
    const size_t total = entries(sc, "strategies") * entries(sc, "seq_lens") * entries(sc, "micro_batches");
    const size_t arrived = m_data.scalePoints().size();
    const QString progress = total > arrived ? tr(" (%1 of %2 simulated)").arg(arrived).arg(total) : QString();
    m_title->setText(tr("<b>%1</b> · %2 · %3 devices on %4 node(s) · %5 · %6%7 — %8 points, %9 fit%10")
                         .arg(QString::fromStdString(model), QString::fromStdString(hw))
                         .arg(number(c, "devices"))
                         .arg(number(c, "nodes", 1))
                         .arg(text(sc, "mode") == "train" ? tr("training (peak over two steps)") : tr("inference"),
                              QString::fromStdString(text(c, "dtype")),
                              text(sc, "mode") == "train"
                                  ? tr(", recomputation %1").arg(QString::fromStdString(text(sc, "recompute", "none")))
                                  : QString())
                         .arg(m_points)
                         .arg(oomX.isEmpty() ? m_points : m_points - int(oomX.size()))
                         .arg(progress));
  }
  const QString hint = m_runnable ? tr("Hover a point for its memory by category; double-click it to run that "
                                       "configuration in full.")
                                    : tr("Hover a point for its memory by category.");
  m_notes->setText(notApplicable.join(QStringLiteral("<br>")) +
                   (m_points > 0 ? (notApplicable.isEmpty() ? QString() : QStringLiteral("<br>")) + hint : QString()));
  for (QCustomPlot* plot : {m_memory, m_speed, m_comm}) replotWhenShown(plot);
}

const ScalePoint* ScalingPage::pointAt(const QCustomPlot* plot, QPointF pos) const {
  auto it = m_drawn.find(plot);
  if (it == m_drawn.end() || m_drawnRevision != m_data.revision()) return nullptr;
  const auto& all = m_data.scalePoints();
  const ScalePoint* best = nullptr;
  double bestD = 12;  // pixels
  for (auto& [graph, indices] : it->second) {
    QCPGraph* g = plot->graph(graph);
    if (!g) continue;
    size_t i = 0;
    for (auto d = g->data()->constBegin(); d != g->data()->constEnd() && i < indices.size(); ++d, ++i) {
      const QPointF at = g->coordsToPixels(d->key, d->value);
      const double dist = std::hypot(at.x() - pos.x(), at.y() - pos.y());
      if (dist < bestD && indices[i] < all.size()) {
        bestD = dist;
        best = &all[indices[i]];
      }
    }
  }
  return best;
}

QString ScalingPage::describe(const ScalePoint& p) {
  QString s = tr("<b>%1</b> at %2 tokens, micro-batch %3<br>").arg(lineName(p).toHtmlEscaped(), lengthText(double(p.seq_len))).arg(p.micro_batch);
  s += tr("peak %1 on device %2 of %3 — %4<br>")
           .arg(bytesText(double(p.peak_bytes)))
           .arg(p.peak_rank)
           .arg(p.devices)
           .arg(p.fits ? tr("fits %1").arg(bytesText(double(p.capacity)))
                       : tr("<span style='color:#c81e1e'>misses %1 by %2</span>")
                             .arg(bytesText(double(p.capacity)), bytesText(double(p.peak_bytes - p.capacity))));
  s += QStringLiteral("<table>");
  const json& book = field(p.textbook, "bytes");
  for (int c = 0; c < ss::proto::kCategoryCount; ++c) {
    const std::string name(kCategories[size_t(c)]);
    const double formula = number(book, name.c_str());
    if (p.bytes[size_t(c)] == 0 && formula == 0) continue;
    s += QStringLiteral("<tr><td><span style='color:%1'>&#9632;</span> %2</td><td align=right>%3</td>"
                        "<td align=right style='color:gray'>&nbsp;%4</td></tr>")
             .arg(kCategoryColors[c].name(), QString::fromStdString(name), bytesText(double(p.bytes[size_t(c)])),
                  formula > 0 ? tr("formula %1").arg(bytesText(formula)) : QString());
  }
  s += QStringLiteral("</table>");
  s += tr("step %1 s · %2 tokens/s · MFU %3%<br>")
           .arg(p.step_s, 0, 'g', 3)
           .arg(p.tokens_per_s, 0, 'f', 0)
           .arg(p.mfu * 100, 0, 'f', 1);
  s += tr("sent per device: %1 activations, %2 weights · %3% hidden behind compute")
           .arg(bytesText(p.comm_activation_bytes), bytesText(p.comm_weight_bytes))
           .arg(p.hidden_fraction * 100, 0, 'f', 0);
  if (p.max_micro_batch >= 0)
    s += tr("<br>largest micro-batch that fits: %1").arg(p.max_micro_batch > 0 ? QString::number(p.max_micro_batch) : tr("none"));
  return s;
}

QString ScalingPage::csv() const {
  QString out = QStringLiteral("strategy,mesh,mode,seq_len,micro_batch,devices,nodes,applicable,peak_bytes,capacity,fits");
  for (const char* c : kCategories) out += QStringLiteral(",%1_bytes").arg(QString::fromLatin1(c));
  out += QStringLiteral(",step_s,tokens_per_s,mfu,comm_activation_bytes,comm_weight_bytes,hidden_fraction,"
                        "max_micro_batch,textbook_total_bytes,reason\n");
  for (auto& p : m_data.scalePoints()) {
    QStringList f = {csvField(p.strategy), csvField(p.mesh), csvField(p.mode),
                     QString::number(p.seq_len), QString::number(p.micro_batch), QString::number(p.devices),
                     QString::number(p.nodes), p.applicable() ? "1" : "0", QString::number(p.peak_bytes),
                     QString::number(p.capacity), p.fits ? "1" : "0"};
    for (int c = 0; c < ss::proto::kCategoryCount; ++c) f << QString::number(p.bytes[size_t(c)]);
    f << QString::number(p.step_s, 'g', 9) << QString::number(p.tokens_per_s, 'g', 9) << QString::number(p.mfu, 'g', 6)
      << QString::number(p.comm_activation_bytes, 'g', 15) << QString::number(p.comm_weight_bytes, 'g', 15)
      << QString::number(p.hidden_fraction, 'g', 6) << QString::number(p.max_micro_batch)
      << QString::number(number(p.textbook, "total_bytes"), 'g', 15);
    f << csvField(p.reason);
    out += f.join(',') + '\n';
  }
  return out;
}

QStringList ScalingPage::runArguments(const nlohmann::json& config, const ScalePoint& p) {
  const json& sc = field(config, "scale");
  const bool train = text(sc, "mode") == "train";
  // The model as the sweep was given it (a preset or a folder), else its name.
  std::string model = text(sc, "model");
  if (model.empty()) model = text(field(config, "model"), "name");
  std::string hw = text(config, "hardware_file");
  if (hw.empty()) hw = text(field(config, "hardware"), "name");
  QStringList args;
  if (train) args << "train" << "--backend" << "sim";
  else args << "simulate";
  args << "--hardware" << QString::fromStdString(hw) << "--model" << QString::fromStdString(model) << "--strategy"
       << QString::fromStdString(p.strategy) << "--dtype" << QString::fromStdString(text(config, "dtype", "bf16"));
  if (p.strategy != "single") args << "--devices" << QString::number(p.devices);
  if (!p.mesh.empty()) args << "--mesh" << QString::fromStdString(p.mesh);
  if (p.nodes > 1) args << "--nodes" << QString::number(p.nodes);
  // The point needed more than the device has: run it with room to finish, so its memory can be seen.
  if (!p.fits) args << "--capacity" << QString::number(std::min<int64_t>(p.peak_bytes, INT64_MAX / 2) + (int64_t(1) << 20));
  if (train) {
    // Two steps, as the point ran: tsp's peak is its second step's.
    args << "--seq-len" << QString::number(p.seq_len) << "--micro-batch" << QString::number(p.micro_batch)
         << "--steps" << "2" << "--recompute" << QString::fromStdString(text(sc, "recompute", "none"));
  } else {
    const int64_t batch = int64_t(p.micro_batch) * (p.strategy == "dp" ? p.devices : 1);
    args << "--prompt-len" << QString::number(p.seq_len) << "--decode" << QString::number(int(std::clamp(number(sc, "decode", 1), 0.0, 1e6)));
    if (batch > 1) args << "--batch" << QString::number(batch);
  }
  const json& overrides = field(sc, "overrides");
  for (auto& kv : overrides.is_array() ? overrides : json::array())
    if (kv.is_string()) args << "--set" << QString::fromStdString(kv.get<std::string>());
  return args;
}

bool ScalingPage::eventFilter(QObject* watched, QEvent* event) {
  auto* plot = qobject_cast<QCustomPlot*>(watched);
  if (!plot) return QWidget::eventFilter(watched, event);
  if (event->type() == QEvent::ToolTip) {
    auto* help = static_cast<QHelpEvent*>(event);
    if (const ScalePoint* p = pointAt(plot, help->pos())) QToolTip::showText(help->globalPos(), describe(*p), plot);
    else QToolTip::hideText();
    return true;
  }
  if (event->type() == QEvent::MouseButtonDblClick && m_runnable) {
    auto* mouse = static_cast<QMouseEvent*>(event);
    if (const ScalePoint* p = pointAt(plot, mouse->position())) {
      emit openPoint(runArguments(m_data.config(), *p),
                     tr("%1 at %2 tokens (from a scaling sweep)").arg(lineName(*p), lengthText(double(p->seq_len))));
      return true;
    }
  }
  return QWidget::eventFilter(watched, event);
}

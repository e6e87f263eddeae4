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
#include <cmath>
#include <set>

#include "pages.h"
#include "palette.h"

using ss::proto::ScalePoint;

namespace {

QString lengthText(double tokens) {
  if (tokens >= 1 << 20 && std::fmod(tokens, 1 << 20) == 0) return QString::number(tokens / (1 << 20)) + "M";
  if (tokens >= 1024 && std::fmod(tokens, 1024) == 0) return QString::number(tokens / 1024) + "K";
  return QString::number(tokens);
}

// Sequence lengths on a log-2 axis, labelled 4K, 8K, ... 1M.
class LengthTicker : public QCPAxisTickerLog {
 public:
  LengthTicker() { setLogBase(2); setSubTickCount(0); }

 protected:
  QString getTickLabel(double tick, const QLocale&, QChar, int) override { return lengthText(tick); }
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

}  // namespace

struct ScalingPage::Line {
  QString name;
  QColor color;
  std::vector<const ScalePoint*> points;  // applicable, in length order
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
    auto* p = new QCustomPlot(this);
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
  m_memory->legend->setVisible(true);
  // Short sequences need little memory and long ones a lot: the bottom right stays clear.
  m_memory->axisRect()->insetLayout()->setInsetAlignment(0, Qt::AlignBottom | Qt::AlignRight);
  m_speed = makePlot(tr("tokens/s"));
  m_speed->setToolTip(tr("Tokens per second of the whole group: a training step's, or an inference prefill's"));
  m_speed->yAxis->setScaleType(QCPAxis::stLogarithmic);
  m_speed->yAxis->setTicker(QSharedPointer<QCPAxisTickerLog>(new QCPAxisTickerLog));
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
  for (auto& p : m_data.scalePoints()) {
    if (p.micro_batch != batch) continue;
    const QString name = lineName(p);
    if (!p.applicable()) {
      if (refused.insert(name).second)
        notApplicable << tr("<b>%1</b> does not apply: %2").arg(name, QString::fromStdString(p.reason).toHtmlEscaped());
      continue;
    }
    capacity = std::max(capacity, p.capacity);
    auto [it, fresh] = lines.try_emplace(name, Line{name, strategyColor(p), {}});
    if (fresh) order.push_back(name);
    it->second.points.push_back(&p);
  }
  // The config lists the sweep's strategies; draw in that order where it can.
  std::vector<QString> sorted;
  for (auto& s : m_data.config().value("scale", nlohmann::json::object()).value("strategies", nlohmann::json::array()))
    if (s.is_string()) {
      QString n = QString::fromStdString(s.get<std::string>()).replace(':', ' ');
      if (lines.count(n)) sorted.push_back(n);
    }
  for (auto& n : order)
    if (std::find(sorted.begin(), sorted.end(), n) == sorted.end()) sorted.push_back(n);

  m_drawn.clear();
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
    std::sort(line.points.begin(), line.points.end(),
              [](const ScalePoint* a, const ScalePoint* b) { return a->seq_len < b->seq_len; });
    QVector<double> x, mem, speed, comm, book;
    for (const ScalePoint* p : line.points) {
      x << double(p->seq_len);
      mem << double(p->peak_bytes);
      speed << std::max(p->tokens_per_s, 1e-9);
      comm << commBytes(*p);
      book << (p->textbook.is_object() ? p->textbook.value("total_bytes", 0.0) : 0.0);
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
      QCPGraph* g = plot->addGraph();
      g->setName(name);
      g->setPen(QPen(line.color, 2));
      g->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssCircle, line.color, Qt::white, 6));
      g->setData(x, y, true);
      if (!legend) g->removeFromLegend();
      m_drawn[plot][plot->graphCount() - 1] = line.points;
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
    for (auto* p : line.points)
      if (p->fits) fitting = std::max(fitting, double(p->peak_bytes));
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
  m_speed->yAxis->setRange(m_speed->yAxis->range().lower / 1.25, m_speed->yAxis->range().upper * 1.25);
  m_comm->yAxis->setRange(0, std::max(m_comm->yAxis->range().upper, 1.0) * 1.08);

  const nlohmann::json& c = m_data.config();
  if (m_points > 0) {
    const nlohmann::json sc = c.value("scale", nlohmann::json::object());
    const std::string model = c.contains("model") && c["model"].is_object() ? c["model"].value("name", "") : "";
    const std::string hw = c.contains("hardware") && c["hardware"].is_object() ? c["hardware"].value("name", "") : "";
    // Progress: the sweep's points arrive as they finish, out of strategies x lengths x micro-batches.
    const size_t total = sc.value("strategies", nlohmann::json::array()).size() *
                         sc.value("seq_lens", nlohmann::json::array()).size() *
                         sc.value("micro_batches", nlohmann::json::array()).size();
    const size_t arrived = m_data.scalePoints().size();
    const QString progress = total > arrived ? tr(" (%1 of %2 simulated)").arg(arrived).arg(total) : QString();
    m_title->setText(tr("<b>%1</b> · %2 · %3 devices on %4 node(s) · %5 · %6%7 — %8 points, %9 fit%10")
                         .arg(QString::fromStdString(model), QString::fromStdString(hw))
                         .arg(c.value("devices", 0))
                         .arg(c.value("nodes", 1))
                         .arg(QString::fromStdString(sc.value("mode", "")) == "train" ? tr("training, one step")
                                                                                       : tr("inference"),
                              QString::fromStdString(c.value("dtype", "")),
                              sc.value("mode", "") == "train"
                                  ? tr(", recomputation %1").arg(QString::fromStdString(sc.value("recompute", "none")))
                                  : QString())
                         .arg(m_points)
                         .arg(oomX.isEmpty() ? m_points : m_points - int(oomX.size()))
                         .arg(progress));
  }
  m_notes->setText(notApplicable.join(QStringLiteral("<br>")) +
                   (m_points > 0 ? tr("%1Hover a point for its memory by category; double-click it to run that "
                                      "configuration in full.")
                                       .arg(notApplicable.isEmpty() ? QString() : QStringLiteral("<br>"))
                                 : QString()));
  for (QCustomPlot* plot : {m_memory, m_speed, m_comm}) plot->replot();
}

const ScalePoint* ScalingPage::pointAt(const QCustomPlot* plot, QPointF pos) const {
  auto it = m_drawn.find(plot);
  if (it == m_drawn.end()) return nullptr;
  const ScalePoint* best = nullptr;
  double bestD = 12;  // pixels
  for (auto& [graph, points] : it->second) {
    QCPGraph* g = plot->graph(graph);
    if (!g) continue;
    int i = 0;
    for (auto d = g->data()->constBegin(); d != g->data()->constEnd() && i < int(points.size()); ++d, ++i) {
      const QPointF at = g->coordsToPixels(d->key, d->value);
      const double dist = std::hypot(at.x() - pos.x(), at.y() - pos.y());
      if (dist < bestD) {
        bestD = dist;
        best = points[size_t(i)];
      }
    }
  }
  return best;
}

QString ScalingPage::describe(const ScalePoint& p) {
  QString s = tr("<b>%1</b> at %2 tokens, micro-batch %3<br>").arg(lineName(p), lengthText(double(p.seq_len))).arg(p.micro_batch);
  s += tr("peak %1 on device %2 of %3 — %4<br>")
           .arg(bytesText(double(p.peak_bytes)))
           .arg(p.peak_rank)
           .arg(p.devices)
           .arg(p.fits ? tr("fits %1").arg(bytesText(double(p.capacity)))
                       : tr("<span style='color:#c81e1e'>misses %1 by %2</span>")
                             .arg(bytesText(double(p.capacity)), bytesText(double(p.peak_bytes - p.capacity))));
  s += QStringLiteral("<table>");
  const nlohmann::json book = p.textbook.is_object() ? p.textbook.value("bytes", nlohmann::json::object())
                                                     : nlohmann::json::object();
  for (int c = 0; c < ss::proto::kCategoryCount; ++c) {
    const std::string name(kCategories[size_t(c)]);
    const double formula = book.value(name, 0.0);
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
    QStringList f = {QString::fromStdString(p.strategy), QString::fromStdString(p.mesh), QString::fromStdString(p.mode),
                     QString::number(p.seq_len), QString::number(p.micro_batch), QString::number(p.devices),
                     QString::number(p.nodes), p.applicable() ? "1" : "0", QString::number(p.peak_bytes),
                     QString::number(p.capacity), p.fits ? "1" : "0"};
    for (int c = 0; c < ss::proto::kCategoryCount; ++c) f << QString::number(p.bytes[size_t(c)]);
    f << QString::number(p.step_s, 'g', 9) << QString::number(p.tokens_per_s, 'g', 9) << QString::number(p.mfu, 'g', 6)
      << QString::number(p.comm_activation_bytes, 'g', 15) << QString::number(p.comm_weight_bytes, 'g', 15)
      << QString::number(p.hidden_fraction, 'g', 6) << QString::number(p.max_micro_batch)
      << QString::number(p.textbook.is_object() ? p.textbook.value("total_bytes", 0.0) : 0.0, 'g', 15);
    QString reason = QString::fromStdString(p.reason);
    f << (reason.contains(',') || reason.contains('"') ? '"' + reason.replace('"', "\"\"") + '"' : reason);
    out += f.join(',') + '\n';
  }
  return out;
}

QStringList ScalingPage::runArguments(const nlohmann::json& config, const ScalePoint& p) {
  const nlohmann::json sc = config.value("scale", nlohmann::json::object());
  const bool train = sc.value("mode", "") == "train";
  // The model as the sweep was given it (a preset or a folder), else its name.
  std::string model = sc.value("model", "");
  if (model.empty() && config.contains("model") && config["model"].is_object()) model = config["model"].value("name", "");
  std::string hw = config.value("hardware_file", "");
  if (hw.empty() && config.contains("hardware") && config["hardware"].is_object()) hw = config["hardware"].value("name", "");
  QStringList args;
  if (train) args << "train" << "--backend" << "sim";
  else args << "simulate";
  args << "--hardware" << QString::fromStdString(hw) << "--model" << QString::fromStdString(model) << "--strategy"
       << QString::fromStdString(p.strategy) << "--dtype" << QString::fromStdString(config.value("dtype", "bf16"));
  if (p.strategy != "single") args << "--devices" << QString::number(p.devices);
  if (!p.mesh.empty()) args << "--mesh" << QString::fromStdString(p.mesh);
  if (p.nodes > 1) args << "--nodes" << QString::number(p.nodes);
  // The point needed more than the device has: run it with room to finish, so its memory can be seen.
  if (!p.fits) args << "--capacity" << QString::number(p.peak_bytes + (int64_t(1) << 20));
  if (train) {
    args << "--seq-len" << QString::number(p.seq_len) << "--micro-batch" << QString::number(p.micro_batch)
         << "--steps" << "1" << "--recompute" << QString::fromStdString(sc.value("recompute", "none"));
  } else {
    const int64_t batch = p.micro_batch * (p.strategy == "dp" ? p.devices : 1);
    args << "--prompt-len" << QString::number(p.seq_len) << "--decode" << QString::number(sc.value("decode", 1));
    if (batch > 1) args << "--batch" << QString::number(batch);
  }
  for (auto& kv : sc.value("overrides", nlohmann::json::array()))
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
  if (event->type() == QEvent::MouseButtonDblClick) {
    auto* mouse = static_cast<QMouseEvent*>(event);
    if (const ScalePoint* p = pointAt(plot, mouse->position())) {
      emit openPoint(runArguments(m_data.config(), *p),
                     tr("%1 at %2 tokens (from a scaling sweep)").arg(lineName(*p), lengthText(double(p->seq_len))));
      return true;
    }
  }
  return QWidget::eventFilter(watched, event);
}

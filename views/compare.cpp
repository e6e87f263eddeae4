#include "compare.h"

#include "scaling_page.h"

#include <QHeaderView>
#include <QLabel>
#include <QScrollArea>
#include <QSplitter>
#include <QTableWidget>
#include <QVBoxLayout>
#include <qcustomplot.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "pages.h"
#include "palette.h"

Headline headlineOf(const RunData& data) {
  Headline h;
  auto metric = [&](const char* name) {
    auto it = data.metrics().find(name);
    return it == data.metrics().end() ? 0.0 : it->second;
  };
  h.prefillTokensPerS = metric("prefill_tokens_per_s");
  h.decodeTokensPerS = metric("decode_tokens_per_s");
  h.ttftMs = metric("ttft_ms");
  h.msPerToken = metric("decode_ms_per_token");
  h.finalLoss = metric("final_loss");
  h.trainTokensPerS = metric("train_tokens_per_s");
  h.devices = int(data.ranks().size());
  h.result = data.status().isEmpty() ? QObject::tr("unfinished") : data.status() == QLatin1String("ok") ? QObject::tr("done") : data.status();
  for (const auto& e : data.errors())
    if (e.code == "oom") {
      h.result = QObject::tr("out of memory: %1").arg(QString::fromStdString(e.message));
      break;
    }
  for (auto& [rank, d] : data.ranks()) {
    auto peak = d.metrics.find("peak_bytes");
    double p = peak != d.metrics.end() ? peak->second : 0;
    if (peak == d.metrics.end())
      for (auto& m : d.mem) p = std::max(p, double(m.peak));
    h.peakBytes = std::max(h.peakBytes, p);
    auto w = d.metrics.find("peak_weights_bytes");
    if (w != d.metrics.end()) h.weightBytes = std::max(h.weightBytes, w->second);
  }
  double commNs = 0, hiddenNs = 0;
  for (auto& [rank, st] : data.commStats()) {
    h.commBytes += st.bytes;
    commNs += st.commNs;
    hiddenNs += st.hiddenNs;
  }
  h.hiddenFraction = commNs > 0 ? hiddenNs / commNs : 0;
  return h;
}

ComparePage::ComparePage(std::vector<ComparedRun> runs, QWidget* parent) : QWidget(parent), m_runs(std::move(runs)) {
  auto* layout = new QVBoxLayout(this);
  auto* split = new QSplitter(Qt::Vertical, this);
  layout->addWidget(split);

  // Headline figures, each with its ratio to the first run.
  m_table = new QTableWidget(split);
  struct Row {
    QString label;
    double Headline::*field;
    bool bytes;
    bool lowerIsBetter;
  };
  const Row rows[] = {
      {tr("prefill tokens/s"), &Headline::prefillTokensPerS, false, false},
      {tr("decode tokens/s"), &Headline::decodeTokensPerS, false, false},
      {tr("time to first token (ms)"), &Headline::ttftMs, false, true},
      {tr("decode ms per token"), &Headline::msPerToken, false, true},
      {tr("training tokens/s"), &Headline::trainTokensPerS, false, false},
      {tr("final training loss"), &Headline::finalLoss, false, true},
      {tr("peak memory, fullest device"), &Headline::peakBytes, true, true},
      {tr("weights per device"), &Headline::weightBytes, true, true},
      {tr("bytes communicated"), &Headline::commBytes, true, true},
      {tr("communication hidden behind compute"), &Headline::hiddenFraction, false, false},
  };
  std::vector<Headline> heads;
  for (auto& r : m_runs) heads.push_back(headlineOf(*r.data));
  m_table->setRowCount(int(std::size(rows)) + 1);
  m_table->setColumnCount(int(m_runs.size()));
  QStringList headers;
  for (size_t i = 0; i < m_runs.size(); ++i) {
    const auto& conf = m_runs[i].data->config();
    const auto work = conf.value("workload", nlohmann::json::object());
    const auto train = conf.value("training", nlohmann::json::object());
    const QString dtype = QString::fromStdString(conf.value("dtype", std::string("fp32")));
    if (!train.empty())
      headers << QStringLiteral("%1 · %2\ntraining: %3 tokens x %4, %5 steps, %6")
                     .arg(QChar('A' + int(i)))
                     .arg(m_runs[i].name)
                     .arg(train.value("seq_len", 0))
                     .arg(train.value("micro_batch", 1))
                     .arg(train.value("steps", 0))
                     .arg(dtype);
    else
      headers << QStringLiteral("%1 · %2\nprompt %3, decode %4, %5")
                     .arg(QChar('A' + int(i)))
                     .arg(m_runs[i].name)
                     .arg(work.value("prompt_len", 0))
                     .arg(work.value("decode", 0))
                     .arg(dtype);
  }
  m_table->setHorizontalHeaderLabels(headers);
  QStringList labels;
  for (auto& row : rows) labels << row.label;
  labels << tr("devices");
  m_table->setVerticalHeaderLabels(labels);
  for (int r = 0; r < int(std::size(rows)); ++r) {
    const double base = heads[0].*rows[r].field;
    for (size_t c = 0; c < heads.size(); ++c) {
      const double v = heads[c].*rows[r].field;
      QString text = rows[r].field == &Headline::hiddenFraction ? QStringLiteral("%1%").arg(v * 100, 0, 'f', 1)
                     : rows[r].bytes                            ? bytesText(v)
                                                                : QString::number(v, 'f', v < 10 ? 2 : 1);
      if (v == 0 && rows[r].field != &Headline::hiddenFraction) text = QStringLiteral("–");
      else if (c > 0 && base > 0) text += QStringLiteral("  (×%1)").arg(v / base, 0, 'f', 2);
      auto* item = new QTableWidgetItem(text);
      item->setFlags(Qt::ItemIsEnabled | Qt::ItemIsSelectable);
      if (c > 0 && base > 0 && v > 0 && std::fabs(v / base - 1) > 0.02) {
        const bool better = rows[r].lowerIsBetter ? v < base : v > base;
        item->setForeground(better ? QColor(26, 127, 55) : QColor(176, 0, 0));
      }
      m_table->setItem(r, int(c), item);
    }
  }
  for (size_t c = 0; c < heads.size(); ++c)
    m_table->setItem(int(std::size(rows)), int(c), new QTableWidgetItem(QString::number(heads[c].devices)));
  // First row: how each run ended ("tp runs out of memory; tsp fits").
  m_table->insertRow(0);
  m_table->setVerticalHeaderItem(0, new QTableWidgetItem(tr("result")));
  for (size_t c = 0; c < heads.size(); ++c) {
    auto* result = new QTableWidgetItem(heads[c].result);
    result->setForeground(heads[c].result == tr("done") ? QColor(26, 127, 55) : QColor(176, 0, 0));
    result->setToolTip(heads[c].result);
    m_table->setItem(0, int(c), result);
  }
  m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
  m_table->setFocusPolicy(Qt::NoFocus);  // no current-cell frame on a read-only table
  m_table->verticalHeader()->setSectionResizeMode(QHeaderView::Fixed);
  m_table->verticalHeader()->setDefaultSectionSize(fontMetrics().height() + 10);
  m_table->setMinimumHeight(m_table->horizontalHeader()->sizeHint().height() + m_table->verticalHeader()->length() + 6);

  // Accuracy figures of the runs that have them (quantized runs, sweeps).
  m_accuracy = new QTableWidget(split);
  std::map<QString, std::vector<QString>> acc;
  for (size_t c = 0; c < m_runs.size(); ++c)
    for (auto& a : m_runs[c].data->accuracy()) {
      QString key = QString::fromStdString(a.metric);
      if (!a.site.empty()) key += QStringLiteral(" · ") + QString::fromStdString(a.site);
      if (!a.config.empty()) key += QStringLiteral(" [%1]").arg(QString::fromStdString(a.config));
      auto& row = acc[key];
      row.resize(m_runs.size());
      row[c] = QString::number(a.value, 'g', 5);
    }
  m_accuracy->setColumnCount(int(m_runs.size()));
  m_accuracy->setHorizontalHeaderLabels(headers);
  m_accuracy->setRowCount(int(acc.size()));
  int r = 0;
  QStringList accLabels;
  for (auto& [key, values] : acc) {
    accLabels << key;
    for (size_t c = 0; c < values.size(); ++c) m_accuracy->setItem(r, int(c), new QTableWidgetItem(values[c]));
    ++r;
  }
  m_accuracy->setVerticalHeaderLabels(accLabels);
  m_accuracy->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
  m_accuracy->setVisible(!acc.empty());

  // Scaling sweeps: each sweep's page side by side (e.g. D = 8 on one node
  // against D = 16 on two), and the table says how far each strategy fits.
  const bool sweeps = std::all_of(m_runs.begin(), m_runs.end(),
                                  [](const ComparedRun& r) { return !r.data->scalePoints().empty(); });
  if (sweeps) {
    fillSweepTable();
    auto* pages = new QSplitter(Qt::Horizontal, split);
    for (size_t i = 0; i < m_runs.size(); ++i) {
      auto* box = new QWidget(pages);
      auto* boxLayout = new QVBoxLayout(box);
      boxLayout->setContentsMargins(0, 0, 0, 0);
      boxLayout->addWidget(new QLabel(QStringLiteral("<b>%1</b> · %2").arg(QChar('A' + int(i))).arg(m_runs[i].name.toHtmlEscaped()), box));
      auto* page = new ScalingPage(*m_runs[i].data, box);
      page->setRunnable(false);  // a comparison window starts no runs
      page->refresh();
      boxLayout->addWidget(page, 1);
      m_scaling.push_back(page);
    }
    split->setStretchFactor(split->indexOf(pages), 4);
    return;
  }

  m_memory = newPlot(split);
  m_memory->setMinimumHeight(220);
  drawMemory();

  // Timelines on one axis: each aligned at its own start, zoomed together.
  auto* scroll = new QScrollArea(split);
  auto* lanes = new QWidget(scroll);
  auto* lanesLayout = new QVBoxLayout(lanes);
  double end = 1;
  for (size_t i = 0; i < m_runs.size(); ++i) {
    lanesLayout->addWidget(new QLabel(QStringLiteral("<b>%1</b> · %2").arg(QChar('A' + int(i))).arg(m_runs[i].name.toHtmlEscaped()), lanes));
    auto* t = new TimelineView(*m_runs[i].data, lanes);
    t->alignAtStart();
    t->setMinimumHeight(t->lanesHeight());
    end = std::max(end, t->rangeEnd());
    lanesLayout->addWidget(t);
    m_timelines.push_back(t);
  }
  for (TimelineView* t : m_timelines) {
    t->setRange(0, end);
    connect(t, &TimelineView::rangeChanged, this, [this, t](double a, double b) {
      for (TimelineView* other : m_timelines)
        if (other != t) other->setRange(a, b);
    });
  }
  scroll->setWidget(lanes);
  scroll->setWidgetResizable(true);
  split->setStretchFactor(3, 2);
}

// Sweeps: per run its setup, points and fitting points, then per strategy
// the longest sequence that fits the device.
void ComparePage::fillSweepTable() {
  // Per run, its smallest micro-batch: sweeps compare at the same one.
  std::vector<QString> strategies;
  std::map<QString, size_t> row;
  enum class Cell { Absent, NotApplicable, NoneFits };
  struct Longest {
    Cell state = Cell::Absent;
    int64_t tokens = 0;
  };
  std::vector<std::map<QString, Longest>> longest(m_runs.size());
  QStringList headers;
  std::vector<std::pair<int, int>> counts;
  for (size_t i = 0; i < m_runs.size(); ++i) {
    const auto& pts = m_runs[i].data->scalePoints();
    int batch = std::numeric_limits<int>::max();
    for (auto& p : pts) batch = std::min(batch, p.micro_batch);
    int fit = 0, total = 0;
    for (auto& p : pts) {
      ++total;
      fit += p.applicable() && p.fits;
      if (p.micro_batch != batch) continue;
      const QString name = QString::fromStdString(p.mesh.empty() ? p.strategy : p.strategy + " " + p.mesh);
      if (row.try_emplace(name, strategies.size()).second) strategies.push_back(name);
      Longest& l = longest[i][name];
      if (!p.applicable()) {
        if (l.state == Cell::Absent) l.state = Cell::NotApplicable;
      } else if (p.fits) {
        l.tokens = std::max(l.tokens, p.seq_len);
      } else {
        l.state = Cell::NoneFits;  // shown only while no length fits
      }
    }
    counts.push_back({total, fit});
    const auto& conf = m_runs[i].data->config();
    const double devices = conf.contains("devices") && conf["devices"].is_number() ? conf["devices"].get<double>() : 0;
    const double nodes = conf.contains("nodes") && conf["nodes"].is_number() ? conf["nodes"].get<double>() : 1;
    headers << tr("%1 · %2\n%3 devices on %4 node(s), micro-batch %5")
                   .arg(QChar('A' + int(i)))
                   .arg(m_runs[i].name)
                   .arg(devices)
                   .arg(nodes)
                   .arg(batch);
  }
  constexpr size_t kMaxRows = 64;  // a sweep has a handful of strategies; a hand-written stream any number
  if (strategies.size() > kMaxRows) strategies.resize(kMaxRows);
  m_table->clear();
  m_table->setColumnCount(int(m_runs.size()));
  m_table->setRowCount(2 + int(strategies.size()));
  m_table->setHorizontalHeaderLabels(headers);
  QStringList labels = {tr("points simulated"), tr("points that fit")};
  for (auto& s : strategies) labels << tr("%1: longest that fits").arg(s);
  m_table->setVerticalHeaderLabels(labels);
  for (size_t c = 0; c < m_runs.size(); ++c) {
    m_table->setItem(0, int(c), new QTableWidgetItem(QString::number(counts[c].first)));
    m_table->setItem(1, int(c), new QTableWidgetItem(QString::number(counts[c].second)));
    for (size_t r = 0; r < strategies.size(); ++r) {
      auto it = longest[c].find(strategies[r]);
      QString text = QStringLiteral("–");  // not in this sweep
      if (it != longest[c].end()) {
        const Longest& l = it->second;
        text = l.tokens > 0                ? tr("%1 tokens").arg(l.tokens)
               : l.state == Cell::NoneFits ? tr("none fits")
                                           : tr("not applicable");
      }
      m_table->setItem(2 + int(r), int(c), new QTableWidgetItem(text));
    }
  }
  m_table->setMinimumHeight(m_table->horizontalHeader()->sizeHint().height() + m_table->verticalHeader()->length() + 6);
}

// Per device, one stacked bar per run (A, B, ...), categories stacked.
void ComparePage::drawMemory() {
  int devices = 0;
  for (auto& r : m_runs) devices = std::max(devices, int(r.data->ranks().size()));
  const int n = int(m_runs.size());
  const double width = 0.8 / n;
  QSharedPointer<QCPAxisTickerText> ticker(new QCPAxisTickerText);
  double top = 1;
  for (int run = 0; run < n; ++run) {
    std::vector<double> keys;
    for (int d = 0; d < devices; ++d) {
      keys.push_back(d + (run - (n - 1) / 2.0) * width);
      ticker->addTick(keys.back(), QStringLiteral("%1\nrank %2").arg(QChar('A' + run)).arg(d));
    }
    QCPBars* below = nullptr;
    std::vector<double> stacked(size_t(devices), 0.0);
    for (int c = 0; c < ss::proto::kCategoryCount; ++c) {
      QVector<double> k, v;
      bool any = false;
      int d = 0;
      for (auto& [rank, data] : m_runs[size_t(run)].data->ranks()) {
        const double peak = peakBytes(data, c);
        any |= peak > 0;
        stacked[size_t(d)] += peak;
        top = std::max(top, stacked[size_t(d)]);
        k << keys[size_t(d)];
        v << peak;
        ++d;
      }
      if (!any) continue;
      auto* bars = new QCPBars(m_memory->xAxis, m_memory->yAxis);
      bars->setWidth(width * 0.9);
      bars->setBrush(kCategoryColors[c]);
      bars->setPen(Qt::NoPen);
      bars->setData(k, v);
      if (run == 0) bars->setName(kCategories[c]);
      else bars->removeFromLegend();
      if (below) bars->moveAbove(below);
      below = bars;
    }
  }
  m_memory->xAxis->setTicker(ticker);
  m_memory->xAxis->setRange(-0.6, devices - 0.4);
  m_memory->yAxis->setRange(0, top * 1.15);
  m_memory->yAxis->setLabel(tr("peak memory per category"));
  m_memory->yAxis->setTicker(bytesTicker());
  m_memory->legend->setFont(font());
  legendBeside(m_memory);
  m_memory->xAxis->grid()->setZeroLinePen(Qt::NoPen);
  replotWhenShown(m_memory);
}

QString ComparePage::tableText() const {
  QString out;
  for (int c = 0; c < m_table->columnCount(); ++c)
    out += QStringLiteral("\t") + m_table->horizontalHeaderItem(c)->text().replace('\n', QStringLiteral(" · "));
  out += '\n';
  for (int r = 0; r < m_table->rowCount(); ++r) {
    out += m_table->verticalHeaderItem(r)->text();
    for (int c = 0; c < m_table->columnCount(); ++c)
      out += QStringLiteral("\t") + (m_table->item(r, c) ? m_table->item(r, c)->text() : QString());
    out += '\n';
  }
  return out;
}

#include "pages.h"

#include <QHBoxLayout>
#include <QLabel>
#include <QTableWidget>
#include <QVBoxLayout>
#include <qcustomplot.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <cmath>

#include "palette.h"

// ---------------------------------------------------------- Quantization ---

QuantizationPage::QuantizationPage(const RunData& data, QWidget* parent) : QWidget(parent), m_data(data) {
  auto* layout = new QVBoxLayout(this);
  m_hint = new QLabel(tr("Press <b>Quantization sweep</b> (or open a sweep stream) to see what quantized all-reduces "
                         "save on the wire and cost in accuracy."),
                      this);
  m_hint->setWordWrap(true);
  layout->addWidget(m_hint);
  auto* row = new QHBoxLayout;
  m_tradeoff = newPlot(this);
  m_tradeoff->xAxis->setLabel(tr("bytes on the wire per rank"));
  m_tradeoff->xAxis->setTicker(bytesTicker());
  m_tradeoff->yAxis->setLabel(tr("logits KL against the unquantized run"));
  m_tradeoff->yAxis->setScaleType(QCPAxis::stLogarithmic);
  m_tradeoff->yAxis->setTicker(QSharedPointer<QCPAxisTickerLog>(new QCPAxisTickerLog));
  m_sites = newPlot(this);
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
  m_tokensTitle = new QLabel(this);  // fillTokens writes it
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
      // The token's text where the model has a tokenizer (spaces and line
      // breaks made visible), else its id.
      const bool text = rows[r]->pieces.size() == rows[r]->tokens.size();
      const QString shown = text ? QString::fromStdString(rows[r]->pieces[k])
                                       .replace(' ', QChar(0x2423))
                                       .replace('\n', QChar(0x23CE))
                                 : QString::number(rows[r]->tokens[k]);
      auto* item = new QTableWidgetItem((first ? QStringLiteral("▶") : QString()) + shown);
      item->setTextAlignment(Qt::AlignCenter);
      if (text) item->setToolTip(tr("token %1").arg(rows[r]->tokens[k]));
      if (differs) item->setForeground(QColor(176, 0, 0));
      if (first) {
        item->setBackground(QColor(255, 228, 225));
        item->setData(Qt::UserRole, true);
        item->setToolTip(tr("first divergence from the reference: decode step %1 (token %2)")
                             .arg(k)
                             .arg(rows[r]->tokens[k]));
      }
      m_tokens->setItem(int(r), int(k), item);
    }
  }
  m_tokens->setVerticalHeaderLabels(labels);
  m_tokens->resizeColumnsToContents();
  // The prompt the answers continue, where the model reads text.
  QString title = tr("<b>Greedy tokens</b> against the unquantized reference (red: differs; ▶ first divergence)");
  if (const auto& p = m_data.prompt())
    title += tr("<br>continuing the prompt “%1”").arg(QString::fromStdString(p->text).toHtmlEscaped());
  m_tokensTitle->setText(title);
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
    replotWhenShown(m_tradeoff);
    replotWhenShown(m_sites);
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
  replotWhenShown(m_tradeoff);

  // Sensitivity: one bar group per spec, one bar per site.
  std::map<std::string, std::map<std::string, double>> by_spec;  // spec -> site -> KL
  for (auto& [label, m] : pts) {
    const auto eq = label.find('=');
    // (Layer ranges, all@L-L=SPEC from --per-layer, are the table's, not sites.)
    if (eq == std::string::npos || !m.count("kl") || label.find('@') < eq) continue;
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
  replotWhenShown(m_sites);
}

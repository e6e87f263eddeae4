#include "training.h"

#include <algorithm>

#include <QLabel>
#include <QVBoxLayout>
#include <qcustomplot.h>

#include "pages.h"

bool isTraining(const RunData& data) { return data.config().value("mode", std::string()) == "train"; }

TrainingPage::TrainingPage(const RunData& data, QWidget* parent) : QWidget(parent), m_data(data) {
  auto* layout = new QVBoxLayout(this);
  m_caption = new QLabel(tr("No training run yet: choose Training in the setup and press Run."), this);
  m_caption->setWordWrap(true);
  m_loss = newPlot(this);
  m_loss->xAxis->setLabel(tr("step"));
  m_loss->yAxis->setLabel(tr("loss (mean cross-entropy, nats)"));
  m_loss->yAxis2->setLabel(tr("gradient norm (before clipping)"));
  m_loss->yAxis2->setVisible(true);
  m_loss->legend->setVisible(true);
  m_loss->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
  auto* loss = m_loss->addGraph();
  loss->setName(tr("loss"));
  loss->setPen(QPen(QColor(40, 90, 170), 2));
  auto* norm = m_loss->addGraph(m_loss->xAxis, m_loss->yAxis2);
  norm->setName(tr("gradient norm"));
  norm->setPen(QPen(QColor(200, 120, 40), 1));
  m_lr = newPlot(this);
  m_lr->xAxis->setLabel(tr("step"));
  m_lr->yAxis->setLabel(tr("learning rate"));
  m_lr->yAxis2->setLabel(tr("tokens/s"));
  m_lr->yAxis2->setVisible(true);
  legendBeside(m_lr);  // clear of the tokens/s line
  auto* lr = m_lr->addGraph();
  lr->setName(tr("learning rate"));
  lr->setPen(QPen(QColor(90, 150, 90), 2));
  auto* tps = m_lr->addGraph(m_lr->xAxis, m_lr->yAxis2);
  tps->setName(tr("tokens/s"));
  tps->setPen(QPen(QColor(140, 140, 140), 1));
  // Steps are whole: ticks at whole steps (multiples of 1, 2, 5, 10 ...), none at 1.5.
  for (QCustomPlot* plot : {m_loss, m_lr}) {
    QSharedPointer<QCPAxisTickerFixed> steps(new QCPAxisTickerFixed);
    steps->setTickStep(1);
    steps->setScaleStrategy(QCPAxisTickerFixed::ssMultiples);
    plot->xAxis->setTicker(steps);
  }
  layout->addWidget(m_caption);
  layout->addWidget(m_loss, 3);
  layout->addWidget(m_lr, 1);
}

QString TrainingPage::caption() const { return m_caption->text(); }

void TrainingPage::refresh() {
  if (m_seen == m_data.revision()) return;
  m_seen = m_data.revision();
  const auto& steps = m_data.trainSteps();
  // Simulated devices hold shapes, not values: no loss or gradient to plot.
  const bool simulated = m_data.config().value("backend", std::string()) == "sim";
  QVector<double> x, loss, norm, lr, tps;
  for (const auto& s : steps) {
    x << s.step;
    lr << s.lr;
    tps << s.tokens_per_s;
    if (simulated) continue;
    loss << s.loss;
    norm << s.grad_norm;
  }
  m_points = int(steps.size());
  m_loss->graph(0)->setData(simulated ? QVector<double>() : x, loss, true);
  m_loss->graph(1)->setData(simulated ? QVector<double>() : x, norm, true);
  m_lr->graph(0)->setData(x, lr, true);
  m_lr->graph(1)->setData(x, tps, true);
  for (QCustomPlot* p : {m_loss, m_lr}) {
    p->rescaleAxes();
    for (QCPAxis* a : {p->yAxis, p->yAxis2}) a->scaleRange(1.1, a->range().center());  // clear of the frame
    if (!x.isEmpty()) p->xAxis->setRange(x.front() - 0.5, x.back() + 0.5);
    replotWhenShown(p);
  }
  // Throughput from zero: a steady rate is a flat line, not noise blown up to the axis.
  const double top = tps.isEmpty() ? 1.0 : *std::max_element(tps.begin(), tps.end());
  m_lr->yAxis2->setRange(0, 1.1 * std::max(top, 1.0));
  replotWhenShown(m_lr);
  m_loss->setVisible(!simulated);
  if (!steps.empty()) {
    const auto& last = steps.back();
    const auto t = m_data.config().value("training", nlohmann::json::object());
    const QString values = simulated ? tr("simulated devices: no loss or gradient (they hold shapes, not values)")
                                     : tr("loss %1 (from %2), gradient norm %3")
                                           .arg(last.loss, 0, 'f', 4)
                                           .arg(steps.front().loss, 0, 'f', 4)
                                           .arg(last.grad_norm, 0, 'g', 3);
    m_caption->setText(tr("step %1 of %2: %3, learning rate %4, %5 tokens/s · %6")
                           .arg(last.step)
                           .arg(t.value("steps", 0) + (steps.front().step - 1))
                           .arg(values)
                           .arg(last.lr, 0, 'g', 3)
                           .arg(last.tokens_per_s, 0, 'f', 0)
                           .arg(QString::fromStdString(t.value("data", std::string()))));
  }
}

QString trainingSummaryHtml(const RunData& data) {
  const auto& c = data.config();
  const auto t = c.value("training", nlohmann::json::object());
  QString h = QObject::tr("<h4>Training</h4><table cellpadding=3>");
  auto row = [&](const QString& k, const QString& v) { h += QStringLiteral("<tr><td>%1</td><td>%2</td></tr>").arg(k, v); };
  row(QObject::tr("sequence length"), QString::number(t.value("seq_len", 0)));
  row(QObject::tr("batch per step"),
      QObject::tr("%1 sequences = micro-batch %2 x %3 micro-batch(es) x %4 replica(s)")
          .arg(t.value("micro_batch", 1) * t.value("grad_accum", 1) * t.value("replicas", 1))
          .arg(t.value("micro_batch", 1))
          .arg(t.value("grad_accum", 1))
          .arg(t.value("replicas", 1)));
  row(QObject::tr("optimizer"), QObject::tr("AdamW, lr %1 (warmup %2, cosine to %3 x), betas %4/%5, weight decay %6, "
                                            "clip %7")
                                    .arg(t.value("lr", 0.0))
                                    .arg(t.value("warmup", 0))
                                    .arg(t.value("min_lr_ratio", 0.0))
                                    .arg(t.value("beta1", 0.0))
                                    .arg(t.value("beta2", 0.0))
                                    .arg(t.value("weight_decay", 0.0))
                                    .arg(t.value("clip", 0.0)));
  row(QObject::tr("recomputation"), QString::fromStdString(t.value("recompute", std::string("none"))));
  row(QObject::tr("data"), QString::fromStdString(t.value("data", std::string())).toHtmlEscaped());
  const auto& steps = data.trainSteps();
  if (!steps.empty()) {
    // The steady rate: the first step, which warms up, left out where there are more.
    const size_t from = steps.size() > 1 ? 1 : 0;
    double tps = 0;
    for (size_t i = from; i < steps.size(); ++i) tps += steps[i].tokens_per_s;
    row(QObject::tr("loss"), c.value("backend", std::string()) == "sim"
                                 ? QObject::tr("not computed (simulated devices hold shapes, not values)")
                                 : QObject::tr("%1 at step %2 → %3 at step %4")
                                       .arg(steps.front().loss, 0, 'f', 4)
                                       .arg(steps.front().step)
                                       .arg(steps.back().loss, 0, 'f', 4)
                                       .arg(steps.back().step));
    row(QObject::tr("throughput"), QObject::tr("%1 tokens/s (mean over steps%2)")
                                       .arg(tps / double(steps.size() - from), 0, 'f', 0)
                                       .arg(from ? QObject::tr(" after the first") : QString()));
  }
  h += QStringLiteral("</table>");
  // Measured peaks per category beside the closed forms the engine computed
  // from the shapes alone (train/memory.cpp), per device.
  if (!data.ranks().empty()) {
    h += QObject::tr("<h4>Training memory per device: measured against its closed form</h4><table cellpadding=3>"
                     "<tr><th>rank</th><th>weights</th><th>grads</th><th>optimizer state</th><th>activations</th>"
                     "<th>Korthikanti et al. 2022</th></tr>");
    for (auto& [r, rank_data] : data.ranks()) {
      const auto& d = rank_data;  // (a plain reference: the lambda captures it)
      auto cell = [&](const char* cat) {
        auto m = d.metrics.find(std::string("peak_") + cat + "_bytes");
        auto e = d.metrics.find(std::string("expected_") + cat + "_bytes");
        if (m == d.metrics.end()) return QStringLiteral("<td>–</td>");
        const bool same = e != d.metrics.end() && e->second == m->second;
        return QStringLiteral("<td align=right>%1%2</td>")
            .arg(bytesText(m->second))
            .arg(e == d.metrics.end() ? QString()
                                      : same ? QStringLiteral(" <span style='color:#1a7f37'>= formula</span>")
                                             : QObject::tr(" (formula %1)").arg(bytesText(e->second)));
      };
      auto k = d.metrics.find("korthikanti_activations_bytes");
      h += QStringLiteral("<tr><td>%1</td>%2%3%4%5<td align=right>%6</td></tr>")
               .arg(r)
               .arg(cell("weights"), cell("grads"), cell("optimizer_state"), cell("activations"))
               .arg(k == d.metrics.end() ? QStringLiteral("–") : bytesText(k->second));
    }
    h += QObject::tr("</table><p><small>Activations: what the forward keeps for backward (per layer: the two "
                     "residuals, the two norm outputs, q, k, v, attention's output and fp32 log-sum-exp, the MLP's "
                     "gate, up and activation; selective recomputation drops the norm outputs and the activation, "
                     "full keeps only each layer's input). Korthikanti et al.'s GPT form, s·b·h·(10 + 24/t + "
                     "5as/(ht)) bytes at 2 bytes a value, counts dropout masks and GELU's 4h input, which this "
                     "model does not have.</small></p>");
  }
  return h;
}

#include "pages.h"

#include <QComboBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QPainter>
#include <QSpinBox>
#include <QVBoxLayout>
#include <qcustomplot.h>

#include <algorithm>
#include <cmath>

#include "palette.h"

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

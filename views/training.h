// Training runs: the loss curve (with the gradient norm and the learning
// rate), and the Summary's training section (setup, throughput, memory per
// category against its closed form and Korthikanti et al.'s).
#pragma once

#include <QWidget>

#include "rundata.h"

class QCustomPlot;
class QLabel;

class TrainingPage : public QWidget {
  Q_OBJECT
 public:
  explicit TrainingPage(const RunData& data, QWidget* parent = nullptr);
  void refresh();
  int points() const { return m_points; }
  QString caption() const;

 private:
  const RunData& m_data;
  QCustomPlot* m_loss;   // loss and gradient norm against the step
  QCustomPlot* m_lr;     // the learning rate schedule and tokens/s
  QLabel* m_caption;
  int m_points = 0;
  uint64_t m_seen = ~0ull;
};

// Whether the run's config says it is a training run.
bool isTraining(const RunData& data);
// The Summary's training section (HTML).
QString trainingSummaryHtml(const RunData& data);

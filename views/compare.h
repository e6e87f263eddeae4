// Two to four runs side by side: a table of headline figures with ratios
// against the first run, peak memory per category per device as grouped
// stacked bars, the timelines stacked on one time axis (aligned at each run's
// start, zoomed and panned together), and accuracy figures when present.
// Scaling sweeps compare as their Scaling pages side by side, under a table
// of how long a sequence each strategy fits.
#pragma once

#include <QString>
#include <QWidget>

#include <memory>
#include <vector>

#include "rundata.h"

class QCustomPlot;
class QTableWidget;
class TimelineView;
class ScalingPage;

struct ComparedRun {
  QString name;
  std::shared_ptr<const RunData> data;
};

// Headline figures of one run, shared by the compare table and the session list.
struct Headline {
  double prefillTokensPerS = 0, decodeTokensPerS = 0, ttftMs = 0, msPerToken = 0;
  double peakBytes = 0, weightBytes = 0, commBytes = 0, hiddenFraction = 0;
  double finalLoss = 0, trainTokensPerS = 0;  // training runs
  int devices = 0;
  QString result;  // "done", or what ended the run ("out of memory: ...")
};
Headline headlineOf(const RunData& data);

class ComparePage : public QWidget {
  Q_OBJECT
 public:
  explicit ComparePage(std::vector<ComparedRun> runs, QWidget* parent = nullptr);
  int runs() const { return int(m_runs.size()); }
  const RunData& run(int i) const { return *m_runs[size_t(i)].data; }
  // The table as plain text (tests, the headless demo).
  QString tableText() const;

 private:
  void drawMemory();
  void fillSweepTable();
  std::vector<ComparedRun> m_runs;
  QTableWidget* m_table;
  QTableWidget* m_accuracy;
  QCustomPlot* m_memory = nullptr;
  std::vector<TimelineView*> m_timelines;
  std::vector<ScalingPage*> m_scaling;  // comparing scaling sweeps: one page per run
};

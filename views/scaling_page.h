// The scaling page: a `scale` sweep drawn as the TSP paper draws it. Peak
// memory per device against sequence length (log x), one line per strategy,
// the device's capacity across and the points past it crossed out; tokens/s
// and bytes communicated per device against length below. The closed-form
// estimate of each strategy can be drawn dashed beside its line. Hovering a
// point shows its memory by category; double-clicking one asks for that
// configuration as a full simulated run.
#pragma once

#include <QStringList>
#include <QWidget>

#include "rundata.h"

class QCheckBox;
class QComboBox;
class QCustomPlot;
class QLabel;

class ScalingPage : public QWidget {
  Q_OBJECT
 public:
  explicit ScalingPage(const RunData& data, QWidget* parent = nullptr);
  void refresh();
  int points() const { return m_points; }   // applicable points drawn
  int lines() const { return m_lines; }     // strategies drawn
  // The point drawn nearest to `pos` (pixels of `plot`, one of this page's
  // three), within a few pixels; nullptr when none is, or when the data has
  // changed since the page last drew (the pointer is good until it next does).
  const ss::proto::ScalePoint* pointAt(const QCustomPlot* plot, QPointF pos) const;
  QCustomPlot* memoryPlot() const { return m_memory; }
  QCustomPlot* speedPlot() const { return m_speed; }
  // What hovering a point shows.
  static QString describe(const ss::proto::ScalePoint& p);
  // Every point as CSV, one row per point (what the page's export writes).
  QString csv() const;
  // The engine arguments of a full simulated run of `p`, from the sweep's
  // config: `simulate` (inference) or `train --backend sim` (training).
  static QStringList runArguments(const nlohmann::json& config, const ss::proto::ScalePoint& p);
  // Whether double-clicking a point asks for its run (not where nobody listens, as in a comparison).
  void setRunnable(bool on) {
    m_runnable = on;
    m_seen = ~0ull;
  }

 signals:
  void openPoint(const QStringList& engineArguments, const QString& name);

 protected:
  bool eventFilter(QObject* watched, QEvent* event) override;

 private:
  struct Line;
  void draw();
  const RunData& m_data;
  QLabel* m_title;
  QLabel* m_notes;  // strategies that do not apply, and why
  QComboBox* m_batch;
  QCheckBox* m_textbook;
  QCustomPlot* m_memory;
  QCustomPlot* m_speed;
  QCustomPlot* m_comm;
  // The points behind each plot's graphs: graph index -> indices into
  // RunData::scalePoints() in x order, valid while the drawn revision is the data's.
  std::map<const QCustomPlot*, std::map<int, std::vector<size_t>>> m_drawn;
  uint64_t m_drawnRevision = ~0ull;
  int m_points = 0, m_lines = 0;
  bool m_runnable = true;
  uint64_t m_seen = ~0ull;
};

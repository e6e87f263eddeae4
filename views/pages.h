// The explorer's pages. Each draws from a RunData and redraws when its
// revision changes (the main window polls at a bounded rate).
#pragma once

#include <QPointF>
#include <QPointer>
#include <QWidget>

#include <map>
#include <vector>

#include "rundata.h"

class QCheckBox;
class QComboBox;
class QCPItemText;
class QCustomPlot;
class QSpinBox;
class QTextBrowser;
class QLabel;
class QTableWidget;

// Memory of one device over time, stacked by category, with capacity and peak.
class MemoryPage : public QWidget {
  Q_OBJECT
 public:
  explicit MemoryPage(const RunData& data, QWidget* parent = nullptr);
  void refresh();

 private:
  void drawOverTime(int rank);
  void placePeakLabel();
  void drawAllDevices();
  const RunData& m_data;
  QComboBox* m_rank;
  QCheckBox* m_hideWeights;  // weights dwarf the rest: hide them to see activations, caches, buffers
  QCustomPlot* m_plot;
  QPointer<QCPItemText> m_peakLabel;  // on m_plot, over the peak at m_peakAt (ms, bytes)
  QPointF m_peakAt;
  QCustomPlot* m_bars;  // peak per category per device
  uint64_t m_seen = ~0ull;
};

// Gantt chart: a compute and a comm lane per device, spans coloured by op;
// wheel zooms, drag pans, hover shows the span.
// A span's colour on the timeline: the engine's kernels in cool tones,
// collectives in warm ones, a backward kernel in its forward's hue, darker.
QColor opColor(const std::string& op, bool comm);

class TimelineView : public QWidget {
  Q_OBJECT
 public:
  explicit TimelineView(const RunData& data, QWidget* parent = nullptr);
  void resetZoom();
  // Times relative to the first span (comparisons align runs at their start).
  void alignAtStart();
  // The visible range in ns (relative to the origin); rangeChanged follows the mouse.
  void setRange(double t0, double t1);
  double rangeEnd() const { return m_t1; }
  int lanesHeight() const;
  // Where prefill and decode (training: each step's forward, backward and
  // optimizer) begin in view, at x pixels: a dashed line across the lanes,
  // named where the name fits before the next phase begins, or a shorter
  // form does (empty where none does: zoom in to name them all), so that a
  // short optimizer phase never takes the room of the forward after it. A
  // step's first forward carries the step's number ("step 3 forward",
  // "step 3", "3").
  struct PhaseMark {
    double x;
    QString label;
  };
  std::vector<PhaseMark> phaseMarks(const QFontMetrics& fm) const;

 signals:
  void rangeChanged(double t0, double t1);

 protected:
  void paintEvent(QPaintEvent*) override;
  void wheelEvent(QWheelEvent* e) override;
  void mousePressEvent(QMouseEvent* e) override;
  void mouseMoveEvent(QMouseEvent* e) override;
  bool event(QEvent* e) override;

 private:
  const ss::proto::Span* spanAt(QPoint p) const;
  double xOf(int64_t t) const;
  const RunData& m_data;
  int64_t firstSpan() const;
  // The op kinds of the run (-> on the comm stream), for the legend;
  // recomputed when the data changes.
  const std::map<std::string, bool>& opKinds() const;
  mutable std::map<std::string, bool> m_ops;
  mutable uint64_t m_opsRevision = ~0ull;
  double m_t0 = 0, m_t1 = 1;  // visible range, ns after m_origin
  int64_t m_origin = 0;
  QPoint m_drag;
  static constexpr int kLabel = 170, kLane = 22;
};

// Which slice of each weight every device holds, and which tokens it owns.
class PlacementView : public QWidget {
  Q_OBJECT
 public:
  explicit PlacementView(const RunData& data, QWidget* parent = nullptr);
  void setLayer(int layer);
  void setStep(int step);

 protected:
  void paintEvent(QPaintEvent*) override;

 private:
  const RunData& m_data;
  int m_layer = 0, m_step = -1;
};

class PlacementPage : public QWidget {
  Q_OBJECT
 public:
  explicit PlacementPage(const RunData& data, QWidget* parent = nullptr);
  void refresh();

 private:
  const RunData& m_data;
  QComboBox* m_layer;
  QSpinBox* m_step;
  PlacementView* m_view;
  uint64_t m_seen = ~0ull;
};

class SummaryPage : public QWidget {
  Q_OBJECT
 public:
  explicit SummaryPage(const RunData& data, QWidget* parent = nullptr);
  void refresh();
  QString text() const;
  // A line above everything else, e.g. why the run ended (plain text).
  void setNotice(const QString& notice);
  const QString& notice() const { return m_notice; }

 private:
  const RunData& m_data;
  QTextBrowser* m_text;
  QString m_notice;
  uint64_t m_seen = ~0ull;
};

// The quantization trade-off from a sweep stream: wire bytes against logits
// KL (one point per precision x block size, the Pareto front marked), and the
// per-site sensitivity (KL when only that site is quantized).
class QuantizationPage : public QWidget {
  Q_OBJECT
 public:
  explicit QuantizationPage(const RunData& data, QWidget* parent = nullptr);
  void refresh();
  int points() const { return m_points; }
  // Rows of the greedy-token table, and the columns (decode steps) marked as
  // a row's first divergence from the reference (-1: none).
  int tokenRows() const;
  int firstDivergence(int row) const;

 private:
  const RunData& m_data;
  void fillTokens();
  QCustomPlot* m_tradeoff;
  QCustomPlot* m_sites;
  QTableWidget* m_tokens;  // greedy tokens per configuration, reference first
  QLabel* m_tokensTitle;
  QLabel* m_hint;
  int m_points = 0;
  uint64_t m_seen = ~0ull;
};

// Human-readable bytes (KiB, MiB, GiB).
QString bytesText(double bytes);
// A plot axis ticker that labels ticks with bytesText.
class QCPAxisTicker;
QSharedPointer<QCPAxisTicker> bytesTicker();
// Shows the plot's legend beside it, at the top right, never over its data.
class QCustomPlot;
void legendBeside(QCustomPlot* plot);
// Replots now where the plot is on screen, else when it is next shown: a
// hidden plot (a tab not in view) has no paint buffer to draw into.
void replotWhenShown(QCustomPlot* plot);
// A plot for a page: one that does not redraw itself at an empty size (a
// page not yet laid out, or grabbed while hidden), which QCustomPlot would
// try, into a paint buffer of no pixels, warning each time.
class QWidget;
QCustomPlot* newPlot(QWidget* parent);
// A token count as the axes and text name it: 4096 as 4K, 1048576 as 1M,
// others as they are.
QString lengthText(double tokens);

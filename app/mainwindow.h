// The explorer's main window. At this stage: pick a preset and a workload,
// run the engine on one CPU device, and read the run's summary.
#pragma once

#include <QMainWindow>

#include "engineclient.h"

class QComboBox;
class QSpinBox;
class QPushButton;
class QPlainTextEdit;
class QLabel;

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  explicit MainWindow(QWidget* parent = nullptr);

  // Starts a run with the current setup (also used by --run-once).
  void runOnce();
  EngineClient* client() { return m_client; }
  QString summaryText() const;

 signals:
  void runFinished(const RunOutcome& outcome);

 private:
  void onEvents(const EventBatch& events);
  void onFinished(const RunOutcome& outcome);

  EngineClient* m_client;
  QComboBox* m_model;
  QSpinBox* m_prompt;
  QSpinBox* m_decode;
  QPushButton* m_run;
  QPushButton* m_stop;
  QPlainTextEdit* m_summary;
  QLabel* m_status;
  QStringList m_lines;
  qint64 m_spans = 0, m_memSamples = 0;
};

// $SHARDSCOPE_RESOURCES, ../share/shardscope next to the app, or the source tree.
QString resourcesDir();

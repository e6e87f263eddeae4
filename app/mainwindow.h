// The explorer's main window: the run setup on the left, the pages (memory,
// timeline, placement, summary) on the right, fed live by EngineClient or by
// a recorded stream, redrawn at a bounded rate.
#pragma once

#include <QMainWindow>

#include "engineclient.h"
#include "rundata.h"

#include <vector>

class QComboBox;
class QLineEdit;
class QSpinBox;
class QPushButton;
class QLabel;
class QTabWidget;
class QTimer;
class QProcess;
class MemoryPage;
class TimelineView;
class PlacementPage;
class SummaryPage;
class QuantizationPage;

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  explicit MainWindow(QWidget* parent = nullptr);

  // Starts a run with the current setup (also used by --run-once).
  void runOnce();
  // Runs the setup under tp, then under tsp, and shows the two side by side.
  void compareTpTsp();
  // Runs a quantization sweep of the setup (tp) and shows the Quantization page.
  void runSweep();
  bool openStream(const QString& path);
  EngineClient* client() { return m_client; }
  QString summaryText() const;
  QTabWidget* pages() { return m_tabs; }
  // The engine arguments the setup describes.
  QStringList engineArguments() const;
  // The last check's verdict: whether Run is allowed, and the reason shown.
  bool setupValid() const { return m_valid; }
  QString verdictText() const;
  bool checking() const;
  // Selects a setup programmatically (screenshots, tests).
  void setSetup(const QString& model, const QString& backend, const QString& strategy, int devices, int prompt,
                int decode);

 signals:
  void runFinished(const RunOutcome& outcome);

 private:
  void onEvents(const EventBatch& events);
  void onFinished(const RunOutcome& outcome);
  void refreshPages();
  void updateSetupState();
  // Checks the setup with the engine's own rules (`shardscope-engine check`),
  // shows the reason next to the form and enables Run only when it can run.
  void checkSetup();

  EngineClient* m_client;
  RunData m_data;
  QComboBox* m_model;
  QComboBox* m_backend;
  QComboBox* m_strategy;
  QSpinBox* m_devices;
  QLineEdit* m_mesh;
  QSpinBox* m_prompt;
  QSpinBox* m_decode;
  QPushButton* m_run;
  QPushButton* m_stop;
  QLabel* m_status;
  QTabWidget* m_tabs;
  MemoryPage* m_memory;
  TimelineView* m_timeline;
  PlacementPage* m_placement;
  SummaryPage* m_summary;
  QuantizationPage* m_quant;
  QPushButton* m_sweep;
  QTimer* m_redraw;
  QTimer* m_checkDelay;
  QProcess* m_check = nullptr;
  QLabel* m_verdict;
  bool m_valid = false;
  QPushButton* m_compare;
  QStringList m_queue;          // strategies still to run for a comparison
  std::vector<std::pair<QString, RunData>> m_compared;
};

// $SHARDSCOPE_RESOURCES, ../share/shardscope next to the app, or the source tree.
QString resourcesDir();

// The explorer's main window: the run setup on the left, the pages (memory,
// timeline, placement, summary) on the right, fed live by EngineClient or by
// a recorded stream, redrawn at a bounded rate.
#pragma once

#include <QElapsedTimer>
#include <QMainWindow>
#include <QThread>

#include "engineclient.h"
#include "rundata.h"
#include "startpage.h"

#include <memory>
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
class ScalingPage;
class TrainingPage;
class QFormLayout;
class SessionStore;
class SessionsPage;
class SessionRecorder;
class DatabaseLock;
class ComparePage;
class PageNotice;
class StartPage;
struct ComparedRun;

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  // dbPath: the session database (empty: $SHARDSCOPE_DB, else the platform's app-data folder).
  explicit MainWindow(QWidget* parent = nullptr, const QString& dbPath = {});
  ~MainWindow() override;
  static QString defaultDatabasePath();

  // Starts a run with the current setup (also used by --run-once).
  void runOnce();
  // Runs the setup under tp, then under tsp, and shows the two side by side.
  void compareTpTsp();
  // Runs a quantization sweep of the setup (tp) and shows the Quantization page.
  void runSweep();
  // Runs the setup under its strategy and on one cpu device (`verify`) and
  // shows, on the Summary page, how far their logits are apart.
  void verifySetup();
  // The same with these precisions and block sizes (comma-separated).
  void runSweepOf(const QString& precisions, const QString& blocks);
  // Sets up one of the Start page's examples and runs it (app/firstscreen.cpp).
  void runExample(Example e);
  // Simulates every strategy of the setup (its simulated hardware, devices,
  // nodes, mode, dtype, recomputation) from 4K to 1M tokens: the Scaling page.
  void runScaling();
  // Starts an engine run with these arguments, recorded under `name` (a
  // scaling point opened as a full run).
  void runArguments(const QStringList& args, const QString& name);
  ScalingPage* scalingPage() { return m_scaling; }
  bool openStream(const QString& path);
  EngineClient* client() { return m_client; }
  // Sessions: open one into the pages, replay it (speed 0: as fast as
  // possible), compare 2-4 side by side, export the current page as PNG,
  // SVG or PDF (by the file's extension; the Scaling page also as CSV).
  bool openSession(qint64 id);
  void replaySession(qint64 id, double speed);
  ComparePage* compareSessions(const QList<qint64>& ids);
  QString exportView(const QString& path);
  SessionsPage* sessionsPage() { return m_sessions; }
  SessionStore* sessionStore() { return m_store.get(); }
  QString databaseNotice() const { return m_dbNotice; }
  qint64 lastSession() const { return m_lastSession; }
  const RunData& data() const { return m_data; }
  QString summaryText() const;
  QTabWidget* pages() { return m_tabs; }
  // The engine arguments the setup describes.
  QStringList engineArguments() const;
  QStringList promptArguments() const;
  bool modelHasTokenizer() const;
  // Whether the setup is in Training mode (the engine's `train`) rather than Inference.
  bool training() const;
  // Selects Inference or Training and the training fields (screenshots, tests).
  void setTraining(bool on, int seqLen = 256, int microBatch = 1, int steps = 20, const QString& recompute = "none");
  // The last check's verdict: whether Run is allowed, and the reason shown.
  bool setupValid() const { return m_valid; }
  QString statusText() const;
  // Whether the session database holds session `id`.
  bool hasSession(qint64 id) const;
  // Whether "Check against one device" can run this setup (values to compare, a strategy to set against one).
  bool canVerify() const;
  QString verdictText() const;
  bool checking() const;
  // How long a setup check may simulate the run's memory before it says it
  // was not forecast (5 s: Run is not kept waiting). Tests that read the
  // forecast itself raise it, so that a slow (sanitized) build still gets one.
  void setForecastBudget(double seconds) { m_forecastSeconds = seconds; }
  // Selects a setup programmatically (screenshots, tests).
  // Returns what could not be applied (an unknown backend or strategy), or empty.
  QString setSetup(const QString& model, const QString& backend, const QString& strategy, int devices, int prompt,
                   int decode);
  // The optional setup fields: batch, --set overrides, comm precision, capacity.
  void setOptions(int batch, const QString& overrides, const QString& precision, const QString& capacity);
  // Runs the last run's arguments again, whatever the form says now.
  void runAgain();
  const QStringList& lastArguments() const { return m_lastArgs; }
  // Sets the form to what an engine command (engineArguments' or another
  // button's) ran: a reopened session's setup. What the command does not
  // name keeps its value.
  void setFormFrom(const QStringList& args);
  // The command that wrote a stream, from its config (empty where it records
  // none), with every setup option it left to the engine's default named as
  // the config resolved it: what setFormFrom needs to set the whole form.
  static QStringList streamCommand(const nlohmann::json& config);
  // An engine message in the form's terms, as HTML: each option it names
  // (--prompt-len) as the field that sets it (Prompt tokens), in bold.
  QString inFormTerms(const QString& message) const;

 signals:
  void runFinished(const RunOutcome& outcome);
  // The recorder closed the session of the last run (saved or not).
  void sessionSaved(qint64 id);
  void replayFinished();
  void compareShown(ComparePage* page);

 private:
  void onEvents(const EventBatch& events);
  void onFinished(const RunOutcome& outcome);
  void refreshPages();
  void showBestPage();
  void updateSetupState();
  // Checks the setup with the engine's own rules (`shardscope-engine check`),
  // shows the reason next to the form and enables Run only when it can run.
  void checkSetup();
  void openDatabase(const QString& path);
  void startRecording(const QString& name);
  void replayTick();
  void addPageNotices();  // app/firstscreen.cpp
  ComparePage* showComparison(std::vector<ComparedRun> runs);

  EngineClient* m_client;
  RunData m_data;
  QFormLayout* m_form;
  QComboBox* m_mode;            // Inference or Training
  QComboBox* m_model;
  QComboBox* m_backend;
  QComboBox* m_strategy;
  QComboBox* m_dtype;           // --dtype
  bool m_dtypeChosen = false;   // picked by the person: the backend no longer sets it
  QSpinBox* m_devices;
  QLineEdit* m_mesh;
  QSpinBox* m_prompt;
  QLineEdit* m_promptText;  // the prompt as text (empty: m_prompt synthetic tokens)
  QSpinBox* m_decode;
  QSpinBox* m_batch;
  QSpinBox* m_nodes;        // simulated runs: devices spread over this many nodes
  QLineEdit* m_overrides;   // --set key=value, ...
  QComboBox* m_precision;   // --comm-precision
  QLineEdit* m_capacity;    // --capacity
  // Training: --seq-len, --micro-batch, --steps, --lr, --recompute.
  QSpinBox* m_seqLen;
  QSpinBox* m_microBatch;
  QSpinBox* m_steps;
  QLineEdit* m_lr;
  QComboBox* m_recompute;
  QPushButton* m_run;
  QPushButton* m_again;
  QStringList m_lastArgs;   // what Run again repeats
  QString m_lastName;
  QString m_openedStream;  // the file whose stream finishes next (openStream), else empty
  QPushButton* m_stop;
  QLabel* m_status;
  QTabWidget* m_tabs;
  StartPage* m_start;
  std::vector<PageNotice*> m_notices;  // each page's explanation while it is empty
  MemoryPage* m_memory;
  TimelineView* m_timeline;
  PlacementPage* m_placement;
  SummaryPage* m_summary;
  QuantizationPage* m_quant;
  ScalingPage* m_scaling;
  TrainingPage* m_training;
  QPushButton* m_sweep;
  QPushButton* m_scale;
  QPushButton* m_verify;
  void clearPages();
  QTimer* m_redraw;
  QTimer* m_checkDelay;
  QProcess* m_check = nullptr;
  double m_forecastSeconds = 5;
  QLabel* m_verdict;
  bool m_valid = false;
  QPushButton* m_compare;
  QStringList m_queue;          // strategies still to run for a comparison
  std::vector<std::pair<QString, RunData>> m_compared;

  // Sessions: a UI-thread store for browsing, a recorder thread for saving.
  std::unique_ptr<DatabaseLock> m_lock;
  std::unique_ptr<SessionStore> m_store;
  QThread m_recorderThread;
  SessionRecorder* m_recorder = nullptr;
  SessionsPage* m_sessions = nullptr;
  QString m_dbNotice;
  bool m_recording = false;
  qint64 m_lastSession = 0;
  // Replay of a saved session at a chosen speed.
  QTimer* m_replayTimer;
  std::vector<ss::proto::Event> m_replay;
  std::vector<int64_t> m_replayAt;  // ns after the first event, per event
  size_t m_replayNext = 0;
  double m_replaySpeed = 1;
  QElapsedTimer m_replayClock;
};

// $SHARDSCOPE_RESOURCES, ../share/shardscope next to the app, or the source tree.
QString resourcesDir();

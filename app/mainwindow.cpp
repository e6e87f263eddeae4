#include "mainwindow.h"
#include "exportview.h"
#include "scaling_page.h"

#include <QAction>
#include <QComboBox>
#include <QCoreApplication>
#include <QDir>
#include <QFileDialog>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QMenuBar>
#include <QProcess>
#include <QPushButton>
#include <QSpinBox>
#include <QStatusBar>
#include <QTabWidget>
#include <QTimer>
#include <QSaveFile>
#include <QVBoxLayout>

#include <QMetaObject>
#include <QPainter>
#include <QPdfWriter>
#include <QStandardPaths>
#include <QSvgGenerator>

#include <algorithm>
#include <utility>
#include <thread>

#include "compare.h"
#include "pages.h"
#include "training.h"
#include "sessionrecorder.h"
#include "sessionspage.h"
#include "sessionstore.h"

QString resourcesDir() {
  const QString env = qEnvironmentVariable("SHARDSCOPE_RESOURCES");
  if (!env.isEmpty()) return env;
  const QString app = QCoreApplication::applicationDirPath();
  for (const QString& cand : {app + "/../share/shardscope", app + "/resources"})
    if (QDir(cand + "/models").exists()) return QDir::cleanPath(cand);
  return QStringLiteral(SHARDSCOPE_SOURCE_RESOURCES);
}

QString MainWindow::defaultDatabasePath() {
  const QString env = qEnvironmentVariable("SHARDSCOPE_DB");
  if (!env.isEmpty()) return env;
  const QString dir = QStandardPaths::writableLocation(QStandardPaths::AppDataLocation);
  QDir().mkpath(dir);
  return dir + QStringLiteral("/sessions.db");
}

MainWindow::~MainWindow() {
  // Nothing may call back into this window while it is destroyed: the setup
  // check and a run still in flight are disconnected, then stopped.
  m_checkDelay->stop();
  if (m_check) {
    m_check->disconnect(this);
    m_check->kill();
    m_check->waitForFinished(2000);
  }
  m_client->disconnect(this);
  if (m_client->isRunning()) m_client->stop();
  if (m_recorder) {
    // Whatever the recorder still holds is committed before the thread ends.
    if (m_recording)
      QMetaObject::invokeMethod(m_recorder, "finish", Qt::BlockingQueuedConnection,
                                Q_ARG(QString, QStringLiteral("interrupted")));
    else
      QMetaObject::invokeMethod(m_recorder, [] {}, Qt::BlockingQueuedConnection);  // drain queued batches
    m_recorderThread.quit();
    m_recorderThread.wait();
  }
}

void MainWindow::openDatabase(const QString& path) {
  m_lock = std::make_unique<DatabaseLock>(path);
  m_store = std::make_unique<SessionStore>();
  if (!m_lock->tryLock()) {
    // Another window writes this database: browse it, do not save into it.
    m_dbNotice = tr("%1 is in use by another ShardScope (%2): sessions are read-only here and this window's runs "
                    "are not saved. Start with --db FILE to save elsewhere.")
                     .arg(path, m_lock->holder());
    if (!m_store->open(path, SessionStore::Mode::ReadOnly)) {
      m_dbNotice += QStringLiteral(" ") + m_store->error();
      m_store.reset();
    }
    return;
  }
  if (!m_store->open(path)) {
    m_dbNotice = tr("Sessions are off: %1. Runs still work; start with --db FILE to use another database.")
                     .arg(m_store->error());
    m_store.reset();
    return;
  }
  const int interrupted = m_store->markInterrupted();
  if (interrupted > 0)
    m_dbNotice = tr("%1 session(s) were still running when ShardScope last stopped; they are kept, marked "
                    "interrupted, with everything saved up to their last batch.")
                     .arg(interrupted);
  m_recorder = new SessionRecorder(path);
  m_recorder->moveToThread(&m_recorderThread);
  connect(&m_recorderThread, &QThread::finished, m_recorder, &QObject::deleteLater);
  connect(m_recorder, &SessionRecorder::failed, this, [this](const QString& message) {
    m_status->setText(message);
    if (m_sessions) m_sessions->setNotice(message);
  });
  connect(m_recorder, &SessionRecorder::started, this, [this](qint64 id) {
    m_lastSession = id;
    if (m_sessions) m_sessions->reload();
  });
  connect(m_recorder, &SessionRecorder::finished, this, [this](qint64 id, const QString&) {
    if (m_sessions) m_sessions->reload();
    emit sessionSaved(id);
  });
  m_recorderThread.setObjectName(QStringLiteral("session recorder"));
  m_recorderThread.start();
}

void MainWindow::startRecording(const QString& name) {
  m_recording = m_recorder != nullptr;
  if (m_recording)
    QMetaObject::invokeMethod(m_recorder, "begin", Qt::QueuedConnection, Q_ARG(QString, name),
                              Q_ARG(QStringList, m_lastArgs));
}

MainWindow::MainWindow(QWidget* parent, const QString& dbPath)
    : QMainWindow(parent), m_client(new EngineClient(this)) {
  setWindowTitle(tr("ShardScope"));
  auto* central = new QWidget(this);
  auto* layout = new QHBoxLayout(central);

  auto* setup = new QWidget(central);
  auto* form = new QFormLayout(setup);
  m_form = form;
  m_mode = new QComboBox(setup);
  m_mode->addItem(tr("Inference"), QStringLiteral("inference"));
  m_mode->addItem(tr("Training"), QStringLiteral("train"));
  m_mode->setToolTip(tr("Inference: prefill a prompt, then decode greedily. Training: forward, loss, backward, "
                        "gradient communication and AdamW steps on a synthetic corpus, for every family and strategy"));
  m_model = new QComboBox(setup);
  // The shipped trained models (folders) first, then the presets of synthetic weights.
  const QDir models(resourcesDir() + "/models");
  for (const QFileInfo& f : models.entryInfoList(QDir::Dirs | QDir::NoDotAndDotDot, QDir::Name))
    if (QFileInfo::exists(f.filePath() + "/config.json")) m_model->addItem(f.fileName());
  for (const QFileInfo& f : models.entryInfoList({"*.json"}, QDir::Files, QDir::Name))
    m_model->addItem(f.completeBaseName());
  m_model->setCurrentText(QStringLiteral("brown-llama"));
  m_model->setEditable(true);  // a preset, or a Hugging Face model folder
  m_model->setToolTip(tr("A preset, or the path of a Hugging Face model folder (config.json + safetensors)"));
  m_backend = new QComboBox(setup);
  m_backend->addItem(tr("CPU devices (MPI ranks)"), QStringLiteral("cpu"));
  // GPUs only where the engine finds some (its `info`); a process per rank, NCCL between GPUs.
  if (const int gpus = EngineClient::gpuCount(); gpus > 0)
    m_backend->addItem(tr("GPUs (CUDA, %n found)", nullptr, gpus), QStringLiteral("cuda"));
  for (const QFileInfo& f : QDir(resourcesDir() + "/hardware").entryInfoList({"*.json"}, QDir::Files, QDir::Name))
    m_backend->addItem(tr("simulated %1").arg(f.completeBaseName()), QStringLiteral("sim:") + f.completeBaseName());
  m_strategy = new QComboBox(setup);
  m_strategy->addItems({"single", "dp", "tp", "sp", "tp_sp", "tsp"});
  m_strategy->setCurrentText(QStringLiteral("tp"));
  m_dtype = new QComboBox(setup);
  m_dtype->addItem(tr("fp32"), QStringLiteral("fp32"));
  m_dtype->addItem(tr("bf16"), QStringLiteral("bf16"));
  m_dtype->addItem(tr("fp16"), QStringLiteral("fp16"));
  m_dtype->setToolTip(tr("Compute dtype of weights, activations, the KV cache and communication; GEMMs accumulate "
                         "and softmax, norm statistics and SSM states stay in fp32. Simulated GPUs default to bf16, "
                         "CPU devices to fp32."));
  m_devices = new QSpinBox(setup);
  m_devices->setRange(1, 64);
  m_devices->setValue(4);
  m_mesh = new QLineEdit(QStringLiteral("2x2"), setup);
  m_prompt = new QSpinBox(setup);
  m_prompt->setRange(1, 1 << 20);
  m_prompt->setValue(256);
  m_promptText = new QLineEdit(QStringLiteral("The jury said that"), setup);
  m_promptText->setPlaceholderText(tr("empty: a synthetic prompt of the tokens below"));
  m_promptText->setToolTip(tr("The prompt as text, for a model folder with a tokenizer.json; the Summary shows the "
                              "answer as it is decoded"));
  m_decode = new QSpinBox(setup);
  m_decode->setRange(0, 4096);
  m_decode->setValue(8);
  m_nodes = new QSpinBox(setup);
  m_nodes->setRange(1, 4096);
  m_nodes->setToolTip(tr("Simulated runs: the devices are spread over this many nodes, joined by the profile's "
                         "network"));
  m_batch = new QSpinBox(setup);
  m_batch->setRange(1, 256);
  m_batch->setToolTip(tr("Sequences per run (dp: per device)"));
  m_overrides = new QLineEdit(setup);
  m_overrides->setPlaceholderText(tr("e.g. hidden_size=512, num_hidden_layers=4"));
  m_overrides->setToolTip(tr("Edit a preset's dimensions: config.json fields, comma separated"));
  m_precision = new QComboBox(setup);
  m_precision->setEditable(true);
  m_precision->addItems({"fp32", "bf16", "int8:128", "int4:128", "fp8:128", "attn=fp32,mlp=int8:128"});
  m_precision->setToolTip(tr("All-reduce precision: one SPEC for every site, or site[@layers]=SPEC,... "
                             "(sites attn, mlp, mixer; SPEC fp32, bf16, fp16, int8[:B][:sr], int4[:B][:sr], fp8[:B][:sr])"));
  m_capacity = new QLineEdit(setup);
  m_capacity->setPlaceholderText(tr("unlimited, or e.g. 512MiB"));
  m_capacity->setToolTip(tr("Memory per device: going over it ends the run with an out-of-memory result"));
  m_seqLen = new QSpinBox(setup);
  m_seqLen->setRange(2, 1 << 20);
  m_seqLen->setValue(256);
  m_seqLen->setToolTip(tr("Input tokens of each training sequence"));
  m_microBatch = new QSpinBox(setup);
  m_microBatch->setRange(1, 256);
  m_microBatch->setToolTip(tr("Sequences per micro-batch (dp: per device)"));
  m_steps = new QSpinBox(setup);
  m_steps->setRange(1, 100000);
  m_steps->setValue(20);
  m_lr = new QLineEdit(QStringLiteral("3e-3"), setup);
  m_lr->setToolTip(tr("Peak learning rate of AdamW (linear warmup, then cosine decay)"));
  m_recompute = new QComboBox(setup);
  m_recompute->addItems({"none", "selective", "full"});
  m_recompute->setToolTip(tr("Activation recomputation: selective recomputes the norm outputs and the MLP "
                             "activation, full keeps only each layer's input and reruns its forward in backward"));
  auto* folder = new QPushButton(tr("Folder..."), setup);
  folder->setToolTip(tr("Use a Hugging Face model folder"));
  auto* modelRow = new QHBoxLayout;
  modelRow->addWidget(m_model, 1);
  modelRow->addWidget(folder);
  connect(folder, &QPushButton::clicked, this, [this] {
    const QString dir = QFileDialog::getExistingDirectory(this, tr("A Hugging Face model folder"));
    if (!dir.isEmpty()) m_model->setCurrentText(dir);
  });
  form->addRow(tr("Mode"), m_mode);
  form->addRow(tr("Model"), modelRow);
  form->addRow(tr("Dimensions"), m_overrides);
  form->addRow(tr("Backend"), m_backend);
  form->addRow(tr("Strategy"), m_strategy);
  form->addRow(tr("Number format"), m_dtype);
  form->addRow(tr("Devices"), m_devices);
  form->addRow(tr("Nodes (simulated)"), m_nodes);
  form->addRow(tr("Mesh (tp_sp)"), m_mesh);
  form->addRow(tr("Prompt"), m_promptText);
  form->addRow(tr("Prompt tokens"), m_prompt);
  form->addRow(tr("Decode steps"), m_decode);
  m_decode->setToolTip(tr("Steps after the prefill, one token each: the answer is the prefill's token and these"));
  form->addRow(tr("Batch"), m_batch);
  form->addRow(tr("Sequence length"), m_seqLen);
  form->addRow(tr("Micro-batch"), m_microBatch);
  form->addRow(tr("Steps"), m_steps);
  form->addRow(tr("Learning rate"), m_lr);
  form->addRow(tr("Recomputation"), m_recompute);
  form->addRow(tr("All-reduce precision"), m_precision);
  form->addRow(tr("Capacity per device"), m_capacity);
  m_run = new QPushButton(tr("Run"), setup);
  m_stop = new QPushButton(tr("Stop"), setup);
  m_stop->setEnabled(false);
  auto* buttons = new QHBoxLayout;
  m_again = new QPushButton(tr("Run again"), setup);
  m_again->setEnabled(false);
  m_again->setToolTip(tr("Repeat the last run exactly"));
  buttons->addWidget(m_run);
  buttons->addWidget(m_stop);
  buttons->addWidget(m_again);
  form->addRow(buttons);
  auto action = [&](const QString& text, const QString& tip, QHBoxLayout* row = nullptr) {
    auto* b = new QPushButton(text, setup);
    b->setToolTip(tip);
    if (row) row->addWidget(b);
    else form->addRow(b);
    return b;
  };
  auto* checks = new QHBoxLayout;  // two to a row: the form fits the window's height
  m_compare = action(tr("TP vs TSP"), tr("Run this setup under tp and under tsp and compare them side by side"), checks);
  m_verify = action(tr("Check against one device"), QString(), checks);  // its tooltip follows the setup (updateSetupState)
  form->addRow(checks);
  m_sweep = action(tr("Quantization sweep"), tr("Run this setup under tp with bf16, int8, int4 and fp8 all-reduces "
                                                "against fp32"));
  m_scale = action(tr("Scaling sweep"), tr("Simulate every strategy on this setup's simulated hardware and devices "
                                           "from 4K to 1M tokens: where each one stops fitting"));
  m_verdict = new QLabel(setup);
  m_verdict->setWordWrap(true);
  form->addRow(m_verdict);
  setup->setFixedWidth(370);

  m_tabs = new QTabWidget(central);
  m_memory = new MemoryPage(m_data, m_tabs);
  m_timeline = new TimelineView(m_data, m_tabs);
  m_placement = new PlacementPage(m_data, m_tabs);
  m_summary = new SummaryPage(m_data, m_tabs);
  m_start = new StartPage(m_tabs);
  m_tabs->addTab(m_start, tr("Start"));
  connect(m_start, &StartPage::exampleChosen, this, &MainWindow::runExample);
  m_tabs->addTab(m_summary, tr("Summary"));
  m_tabs->addTab(m_memory, tr("Memory"));
  m_tabs->addTab(m_placement, tr("Shard placement"));
  m_tabs->addTab(m_timeline, tr("Timeline"));
  m_training = new TrainingPage(m_data, m_tabs);
  m_tabs->addTab(m_training, tr("Training"));
  m_quant = new QuantizationPage(m_data, m_tabs);
  m_tabs->addTab(m_quant, tr("Quantization"));
  m_scaling = new ScalingPage(m_data, m_tabs);
  m_tabs->addTab(m_scaling, tr("Scaling"));
  connect(m_scaling, &ScalingPage::openPoint, this, &MainWindow::runArguments);
  addPageNotices();
  openDatabase(dbPath.isEmpty() ? defaultDatabasePath() : dbPath);
  m_sessions = new SessionsPage(m_store.get(), m_tabs);
  m_sessions->setNotice(m_dbNotice);
  m_sessions->setEnabled(m_store != nullptr);
  m_tabs->addTab(m_sessions, tr("Sessions"));
  connect(m_sessions, &SessionsPage::openRequested, this, &MainWindow::openSession);
  connect(m_sessions, &SessionsPage::replayRequested, this, &MainWindow::replaySession);
  connect(m_sessions, &SessionsPage::compareRequested, this, &MainWindow::compareSessions);
  connect(m_sessions, &SessionsPage::message, this, [this](const QString& text) { m_status->setText(text); });
  m_replayTimer = new QTimer(this);
  m_replayTimer->setInterval(33);
  connect(m_replayTimer, &QTimer::timeout, this, &MainWindow::replayTick);
  layout->addWidget(setup);
  layout->addWidget(m_tabs, 1);
  setCentralWidget(central);
  m_status = new QLabel(tr("ready"), this);
  statusBar()->addWidget(m_status, 1);
  resize(1400, 820);

  auto* file = menuBar()->addMenu(tr("&File"));
  file->addAction(tr("&Open recorded stream..."), this, [this] {
    const QString path = QFileDialog::getOpenFileName(this, tr("Open a recorded stream"), QString(),
                                                      tr("Event streams (*.jsonl);;All files (*)"));
    if (!path.isEmpty()) openStream(path);
  });
  file->addAction(tr("&Export this page (PNG, SVG, PDF, CSV)..."), this, [this] {
    const QString page = m_tabs->tabText(m_tabs->currentIndex()).toLower().replace(' ', '-');
    QString filters = tr("PNG image (*.png);;SVG drawing (*.svg);;PDF (*.pdf)");
    if (m_tabs->currentWidget() == m_scaling) filters += tr(";;CSV table of the points (*.csv)");
    const QString path = QFileDialog::getSaveFileName(this, tr("Export this page"), page + QStringLiteral(".png"),
                                                      filters);
    if (!path.isEmpty()) {
      const QString error = exportView(path);
      m_status->setText(error.isEmpty() ? tr("saved %1").arg(path) : error);
    }
  });
  file->addAction(tr("&Quit"), this, &QWidget::close);

  m_redraw = new QTimer(this);
  m_redraw->setInterval(100);  // at most 10 redraws a second, whatever the event rate
  connect(m_redraw, &QTimer::timeout, this, &MainWindow::refreshPages);
  connect(m_run, &QPushButton::clicked, this, &MainWindow::runOnce);
  connect(m_again, &QPushButton::clicked, this, &MainWindow::runAgain);
  connect(m_compare, &QPushButton::clicked, this, &MainWindow::compareTpTsp);
  connect(m_sweep, &QPushButton::clicked, this, &MainWindow::runSweep);
  connect(m_verify, &QPushButton::clicked, this, &MainWindow::verifySetup);
  connect(m_scale, &QPushButton::clicked, this, &MainWindow::runScaling);
  connect(m_stop, &QPushButton::clicked, m_client, &EngineClient::stop);
  connect(m_client, &EngineClient::eventsReceived, this, &MainWindow::onEvents);
  connect(m_client, &EngineClient::finished, this, &MainWindow::onFinished);
  connect(m_client, &EngineClient::streamReceived, this, [this](const QByteArray& raw, EventBatch events) {
    if (m_recording)
      QMetaObject::invokeMethod(m_recorder, "add", Qt::QueuedConnection, Q_ARG(QByteArray, raw),
                                Q_ARG(EventBatch, events));
  });
  connect(m_strategy, &QComboBox::currentTextChanged, this, &MainWindow::updateSetupState);
  connect(m_promptText, &QLineEdit::textChanged, this, &MainWindow::updateSetupState);
  connect(m_model, &QComboBox::currentTextChanged, this, &MainWindow::updateSetupState);
  // Every edit re-checks the setup, once typing pauses.
  m_checkDelay = new QTimer(this);
  m_checkDelay->setSingleShot(true);
  m_checkDelay->setInterval(250);
  connect(m_checkDelay, &QTimer::timeout, this, &MainWindow::checkSetup);
  auto changed = [this] {
    m_valid = false;
    m_run->setEnabled(false);
    m_checkDelay->start();
  };
  for (QComboBox* c : {m_model, m_backend, m_strategy, m_precision, m_dtype, m_mode, m_recompute})
    connect(c, &QComboBox::currentTextChanged, this, changed);
  connect(m_mode, &QComboBox::currentIndexChanged, this, &MainWindow::updateSetupState);
  // The default number format follows the backend (bf16 on simulated GPUs,
  // fp32 on CPU devices) until the person picks one.
  connect(m_dtype, &QComboBox::activated, this, [this] { m_dtypeChosen = true; });
  connect(m_backend, &QComboBox::currentIndexChanged, this, [this] {
    if (m_dtypeChosen) return;
    const QString b = m_backend->currentData().toString();
    const bool gpu = b.startsWith(QLatin1String("sim:")) || b == QLatin1String("cuda");
    m_dtype->setCurrentIndex(m_dtype->findData(gpu ? QStringLiteral("bf16") : QStringLiteral("fp32")));
  });
  for (QSpinBox* b : {m_devices, m_prompt, m_decode, m_batch, m_nodes, m_seqLen, m_microBatch, m_steps})
    connect(b, &QSpinBox::valueChanged, this, changed);
  connect(m_backend, &QComboBox::currentIndexChanged, this, &MainWindow::updateSetupState);
  for (QLineEdit* e : {m_mesh, m_overrides, m_capacity, m_lr, m_promptText})
    connect(e, &QLineEdit::textChanged, this, changed);
  updateSetupState();
  changed();
}

QString MainWindow::verdictText() const { return m_verdict->text(); }
QString MainWindow::statusText() const { return m_status->text(); }
bool MainWindow::checking() const {
  return m_checkDelay->isActive() || (m_check && m_check->state() != QProcess::NotRunning);
}

void MainWindow::checkSetup() {
  if (m_check) {
    m_check->disconnect(this);
    m_check->kill();
    m_check->deleteLater();
  }
  QStringList args = engineArguments();
  // The check simulates the run's memory; past a few seconds (thousands of
  // decode steps on many devices) it says so rather than keep Run waiting.
  args << QStringLiteral("--forecast-seconds") << QString::number(m_forecastSeconds);
  if (training()) {
    args << QStringLiteral("--check-only");  // train checks its own options
  } else {
    args.removeFirst();  // run, launch or simulate: check takes the same options
    args.prepend(QStringLiteral("check"));
  }
  m_check = new QProcess(this);
  connect(m_check, &QProcess::finished, this, [this, p = m_check](int code, QProcess::ExitStatus status) {
    if (p != m_check) return;
    // The check simulates the run's memory: ok with the fullest device's
    // peak, or exit 3 when it would run out. That run may still be started,
    // to watch where it runs out.
    const bool fits = status == QProcess::NormalExit && code == 0;
    const bool oom = status == QProcess::NormalExit && code == 3;
    m_valid = fits || oom;
    QString reason = QString::fromUtf8(p->readAllStandardError()).trimmed();
    reason.remove(QStringLiteral("shardscope-engine: error: "));
    const QString said = QString::fromUtf8(p->readAllStandardOutput()).trimmed();
    const QString peak = said.startsWith(QLatin1String("ok: ")) ? said.mid(4) : QString();
    if (fits)
      m_verdict->setText(tr("<span style='color:#1a7f37'>ready to run</span>") +
                         (peak.isEmpty() ? QString() : QStringLiteral(": ") + peak.toHtmlEscaped()));
    else
      m_verdict->setText(QStringLiteral("<span style='color:%1'>%2</span>")
                             .arg(oom ? QStringLiteral("#9a6700") : QStringLiteral("#b00"),
                                  reason.isEmpty() ? tr("the engine could not check this setup") : inFormTerms(reason)));
    m_run->setEnabled(m_valid && !m_client->isRunning());
  });
  m_check->start(EngineClient::enginePath(), args);
}

bool MainWindow::training() const { return m_mode->currentData().toString() == QLatin1String("train"); }

void MainWindow::setTraining(bool on, int seqLen, int microBatch, int steps, const QString& recompute) {
  m_mode->setCurrentIndex(on ? 1 : 0);
  m_seqLen->setValue(seqLen);
  m_microBatch->setValue(microBatch);
  m_steps->setValue(steps);
  m_recompute->setCurrentText(recompute);
}

void MainWindow::updateSetupState() {
  // Inference and training ask for different workloads.
  const bool train = training();
  for (QWidget* w : {static_cast<QWidget*>(m_prompt), static_cast<QWidget*>(m_promptText), static_cast<QWidget*>(m_decode),
                     static_cast<QWidget*>(m_batch), static_cast<QWidget*>(m_precision)})
    m_form->setRowVisible(w, !train);
  const bool text = modelHasTokenizer();
  m_promptText->setEnabled(text);
  m_promptText->setToolTip(text ? tr("The prompt as text; the Summary shows the answer as it is decoded")
                                : tr("This model has no tokenizer.json (a preset of synthetic weights): its prompt "
                                     "is synthetic tokens"));
  m_prompt->setEnabled(!text || m_promptText->text().isEmpty());
  for (QWidget* w : {static_cast<QWidget*>(m_seqLen), static_cast<QWidget*>(m_microBatch),
                     static_cast<QWidget*>(m_steps), static_cast<QWidget*>(m_lr), static_cast<QWidget*>(m_recompute)})
    m_form->setRowVisible(w, train);
  m_sweep->setVisible(!train);  // quantized all-reduces are inference's; TP vs TSP compares training runs too
  const bool single = m_strategy->currentText() == QLatin1String("single");
  m_devices->setEnabled(!single);
  m_mesh->setEnabled(m_strategy->currentText() == QLatin1String("tp_sp"));
  const bool simulated = m_backend->currentData().toString().startsWith(QLatin1String("sim:"));
  m_nodes->setEnabled(simulated);
  m_scale->setEnabled(simulated);
  // verify compares values: devices that compute some, a strategy to set against one cpu device (or a GPU's own).
  const bool cuda = m_backend->currentData().toString() == QLatin1String("cuda");
  m_verify->setEnabled(!simulated && (!single || cuda));
  m_verify->setToolTip(simulated ? tr("Choose CPU or CUDA devices: simulated devices compute no values to compare")
                       : single && !cuda ? tr("Choose a strategy to set against one device")
                       : train ? tr("Train one step of this setup and the same step on one CPU device, from the same "
                                    "weights on the same sequences, and compare the loss and the gradient tensor by "
                                    "tensor: does the strategy train as one device does?")
                               : tr("Run this setup and the same run on one CPU device, on the same weights "
                                    "and tokens, and compare their logits row by row: does the strategy "
                                    "compute what one device computes?"));
  m_scale->setToolTip(simulated ? tr("Simulate every strategy on this setup's simulated hardware and devices from "
                                     "4K to 1M tokens: where each one stops fitting")
                                : tr("Choose a simulated backend: the sweep runs on simulated hardware"));
}

QString MainWindow::setSetup(const QString& model, const QString& backend, const QString& strategy, int devices,
                             int prompt, int decode) {
  QString problem;
  m_model->setCurrentText(model);
  const int b = m_backend->findData(backend);
  if (b >= 0) m_backend->setCurrentIndex(b);
  else problem = tr("unknown backend '%1' (cpu, cuda where there are GPUs, or sim:PROFILE with a profile from "
                    "resources/hardware)").arg(backend);
  const int st = m_strategy->findText(strategy);
  if (st >= 0) m_strategy->setCurrentIndex(st);
  else if (problem.isEmpty()) problem = tr("unknown strategy '%1' (single, dp, tp, sp, tp_sp, tsp)").arg(strategy);
  m_devices->setValue(devices);
  m_prompt->setValue(prompt);
  m_promptText->clear();  // the setup gives the prompt as a length
  m_decode->setValue(decode);
  return problem;
}

void MainWindow::setOptions(int batch, const QString& overrides, const QString& precision, const QString& capacity) {
  m_batch->setValue(batch);
  m_overrides->setText(overrides);
  m_precision->setCurrentText(precision);
  m_capacity->setText(capacity);
}

void MainWindow::runAgain() {
  if (m_lastArgs.isEmpty()) return;
  const QStringList args = m_lastArgs;  // runArguments replaces them
  runArguments(args, m_lastName + tr(" (again)"));
}

void MainWindow::runOnce() {
  QString name = QStringLiteral("%1 · %2 · %3")
                     .arg(QFileInfo(m_model->currentText()).fileName(), m_strategy->currentText(),
                          m_strategy->currentText() == QLatin1String("single") ? QStringLiteral("1")
                                                                               : QString::number(m_devices->value()));
  if (training()) name += tr(" · training %1 steps").arg(m_steps->value());
  if (m_precision->currentText().trimmed() != QLatin1String("fp32") && !m_precision->currentText().trimmed().isEmpty())
    name += QStringLiteral(" · ") + m_precision->currentText().trimmed();
  runArguments(engineArguments(), name);
}

// A new run, stream or session: nothing of the last one stays (its data, a failed run's reason).
void MainWindow::clearPages() {
  m_data.clear();
  m_summary->setNotice({});
}

bool MainWindow::openStream(const QString& path) {
  clearPages();
  m_openedStream = path;
  m_status->setText(tr("opening %1 ...").arg(path));
  m_redraw->start();
  return m_client->openFile(path);
}

void MainWindow::onEvents(const EventBatch& events) { m_data.add(*events); }

void MainWindow::runArguments(const QStringList& args, const QString& name) {
  if (m_client->isRunning()) {
    m_status->setText(tr("a run is in progress: stop it before starting another"));
    return;
  }
  clearPages();
  m_openedStream.clear();
  m_lastArgs = args;
  m_lastName = name;
  m_run->setEnabled(false);
  m_again->setEnabled(false);
  m_stop->setEnabled(true);
  m_status->setText(tr("running: shardscope-engine %1").arg(args.join(' ')));
  // The page that shows what this command writes.
  const QString command = args.value(0);
  m_tabs->setCurrentWidget(command == QLatin1String("scale")   ? static_cast<QWidget*>(m_scaling)
                           : command == QLatin1String("sweep") ? static_cast<QWidget*>(m_quant)
                           : command == QLatin1String("train") && !args.contains(QLatin1String("--verify"))
                               ? static_cast<QWidget*>(m_training)
                                                               : static_cast<QWidget*>(m_summary));
  m_redraw->start();
  startRecording(name);
  m_client->start(args);
}

void MainWindow::refreshPages() {
  m_quant->refresh();
  m_scaling->refresh();
  m_memory->refresh();
  m_placement->refresh();
  m_summary->refresh();
  m_training->refresh();
  m_timeline->resetZoom();
  for (PageNotice* n : m_notices) n->refresh(m_data);
}

QString MainWindow::summaryText() const { return m_summary->text(); }

void MainWindow::onFinished(const RunOutcome& o) {
  if (m_recording) {
    m_recording = false;
    // A worker killed mid-run (or a stream without its end) leaves an interrupted session.
    const QString status = o.crashed || o.status == QLatin1String("incomplete") ? QStringLiteral("interrupted") : o.status;
    QMetaObject::invokeMethod(m_recorder, "finish", Qt::QueuedConnection, Q_ARG(QString, status));
  }
  m_redraw->stop();
  refreshPages();
  showBestPage();
  m_run->setEnabled(m_valid);
  m_again->setEnabled(!m_lastArgs.isEmpty());
  m_stop->setEnabled(false);
  QString text = tr("%1 (status %2)").arg(o.message, o.status);
  if (o.rejected) text += tr("; %1 unreadable lines").arg(o.rejected);
  m_status->setText(text);
  // A stream read from a file puts the command it was written by (its
  // config's, where the engine recorded one) in the form, as a reopened
  // session does; Run again runs a run's setup as the form now holds it.
  const QString opened = std::exchange(m_openedStream, QString());
  if (!opened.isEmpty() && m_queue.isEmpty() && m_compared.empty() && !m_client->isRunning())
    if (const QStringList command = streamCommand(m_data.config()); !command.isEmpty()) {
      setFormFrom(command);
      const bool run = QStringList{"run", "launch", "simulate", "train"}.contains(command[0]) &&
                       !command.contains(QLatin1String("--verify"));
      if (run) {
        m_lastArgs = engineArguments();
        m_lastName = QFileInfo(opened).completeBaseName();
        m_again->setEnabled(true);
      }
    }
  // A failed run says why on the Summary, with the worker's last stderr lines
  // (verify's verdict, a difference included, is its stream's own: the page shows it).
  const bool verdict = m_data.config().contains("verify") && o.status != QLatin1String("incomplete") && !o.crashed;
  if ((o.exitCode != 0 || o.crashed) && !verdict) {
    QStringList tail;
    for (const QString& l : o.stderrTail)
      if (!o.message.endsWith(l)) tail << l;
    m_summary->setNotice(o.message + (tail.isEmpty() ? QString() : QStringLiteral("\n") + tail.join('\n')));
    for (PageNotice* n : m_notices) n->refresh(m_data);  // the reason, not "no run yet"
  }
  // A comparison's run refused before it started (a shape its strategy
  // cannot split) leaves nothing to compare: say which, and stop there.
  if ((!m_queue.isEmpty() || !m_compared.empty()) && m_data.config().empty() && !o.crashed &&
      o.status != QLatin1String("stopped")) {
    m_status->setText(tr("TP vs TSP: %1 cannot run this setup: %2").arg(m_strategy->currentText(), o.message));
    m_queue.clear();
    m_compared.clear();
  }
  if (!m_queue.isEmpty() || !m_compared.empty()) {
    m_compared.emplace_back(m_strategy->currentText(), m_data);
    // An out-of-memory run is a result worth comparing: go on unless stopped.
    if (!m_queue.isEmpty() && o.status != QLatin1String("stopped") && !o.crashed) {
      m_strategy->setCurrentText(m_queue.takeFirst());
      QTimer::singleShot(0, this, &MainWindow::runOnce);
      return;
    }
    m_queue.clear();
    if (m_compared.size() == 2) {
      std::vector<ComparedRun> runs;
      for (auto& [name, data] : m_compared) runs.push_back({name, std::make_shared<RunData>(data)});
      showComparison(std::move(runs));
    }
    m_compared.clear();
  }
  emit runFinished(o);
}


// A sweep has no devices to draw but a trade-off to show: open on the
// Quantization page; anything else opens on the Summary.
void MainWindow::showBestPage() {
  const bool sweep = m_data.ranks().empty() && m_quant->points() > 0;
  if (!m_data.scalePoints().empty()) m_tabs->setCurrentWidget(m_scaling);
  else if (sweep) m_tabs->setCurrentWidget(m_quant);
  else if (isTraining(m_data) && m_tabs->currentWidget() != m_summary) m_tabs->setCurrentWidget(m_training);
  else if (m_tabs->currentWidget() == m_start || m_tabs->currentWidget() == m_sessions ||
           m_tabs->currentWidget() == m_quant || m_tabs->currentWidget() == m_scaling)
    m_tabs->setCurrentWidget(m_summary);
}

bool MainWindow::openSession(qint64 id) {
  if (!m_store) return false;
  m_replayTimer->stop();
  const SessionInfo info = m_store->info(id);
  if (!info.id) return false;
  clearPages();
  m_store->readEvents(id, [this](std::vector<ss::proto::Event>&& batch) { m_data.add(std::move(batch)); });
  refreshPages();
  m_status->setText(tr("session '%1' (%2, %3 events)").arg(info.name, info.status).arg(info.events));
  // The setup it was run with (sessions saved since schema 3): the form, and
  // Run again; not while a run, or TP vs TSP's second, still needs the form's.
  if (!info.command.isEmpty() && !m_client->isRunning() && m_queue.isEmpty()) {
    setFormFrom(info.command);
    m_lastArgs = info.command;
    m_lastName = info.name;
    m_again->setEnabled(true);
  }
  showBestPage();
  return true;
}

// Replays a session's events at `speed` times their recorded pace (0: as
// fast as the window can draw), through the same pages as a live run.
void MainWindow::replaySession(qint64 id, double speed) {
  if (!m_store) return;
  m_replay = m_store->events(id);
  // Setup records first, then every timed record by its time; results last.
  auto at = [](const ss::proto::Event& e) -> int64_t {
    using namespace ss::proto;
    if (auto* s = std::get_if<Span>(&e)) return s->t1;
    if (auto* m = std::get_if<Mem>(&e)) return m->t;
    if (auto* p = std::get_if<Phase>(&e)) return p->t;
    if (std::holds_alternative<Metric>(e) || std::holds_alternative<Accuracy>(e) || std::holds_alternative<Done>(e) ||
        std::holds_alternative<Error>(e) || std::holds_alternative<Generation>(e))
      return std::numeric_limits<int64_t>::max();
    return std::numeric_limits<int64_t>::min();
  };
  std::vector<size_t> order(m_replay.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::vector<int64_t> keys(m_replay.size());
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = at(m_replay[i]);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return keys[a] < keys[b]; });
  std::vector<ss::proto::Event> sorted;
  sorted.reserve(order.size());
  int64_t first = std::numeric_limits<int64_t>::max();
  for (int64_t k : keys)
    if (k != std::numeric_limits<int64_t>::min() && k != std::numeric_limits<int64_t>::max()) first = std::min(first, k);
  m_replayAt.clear();
  for (size_t i : order) {
    sorted.push_back(std::move(m_replay[i]));
    const int64_t k = keys[i];
    m_replayAt.push_back(k == std::numeric_limits<int64_t>::min() ? 0 : k == std::numeric_limits<int64_t>::max() ? -1 : k - first);
  }
  m_replay = std::move(sorted);
  m_replayNext = 0;
  m_replaySpeed = speed;
  clearPages();
  m_status->setText(speed > 0 ? tr("replaying at %1×").arg(speed) : tr("replaying as fast as possible"));
  m_tabs->setCurrentWidget(m_timeline);
  m_replayClock.start();
  m_replayTimer->start();
}

void MainWindow::replayTick() {
  std::vector<ss::proto::Event> batch;
  const double now = m_replaySpeed > 0 ? double(m_replayClock.nsecsElapsed()) * m_replaySpeed : 0;
  const size_t maxBatch = m_replaySpeed > 0 ? m_replay.size() : 200000;  // max: a slice per frame
  while (m_replayNext < m_replay.size() && batch.size() < maxBatch) {
    const int64_t at = m_replayAt[m_replayNext];
    if (m_replaySpeed > 0 && at >= 0 && double(at) > now) break;
    batch.push_back(std::move(m_replay[m_replayNext++]));
  }
  if (!batch.empty()) m_data.add(batch);
  refreshPages();
  if (m_replayNext >= m_replay.size()) {
    m_replayTimer->stop();
    m_replay.clear();
    m_replayAt.clear();
    m_status->setText(tr("replay finished"));
    emit replayFinished();
  }
}

ComparePage* MainWindow::showComparison(std::vector<ComparedRun> runs) {
  auto* w = new QWidget(this, Qt::Window);
  w->setAttribute(Qt::WA_DeleteOnClose);
  QStringList names;
  for (auto& r : runs) names << r.name;
  w->setWindowTitle(tr("ShardScope: compare %1").arg(names.join(QStringLiteral(" · "))));
  auto* layout = new QVBoxLayout(w);
  auto* page = new ComparePage(std::move(runs), w);
  layout->addWidget(page);
  auto* save = new QPushButton(tr("Export as PNG, SVG or PDF..."), w);
  connect(save, &QPushButton::clicked, w, [this, page, w] {
    const QString path = QFileDialog::getSaveFileName(w, tr("Export the comparison"), QStringLiteral("compare.png"),
                                                      tr("PNG image (*.png);;SVG drawing (*.svg);;PDF (*.pdf)"));
    if (path.isEmpty()) return;
    const QString error = exportWidget(page, path, w->windowTitle());
    m_status->setText(error.isEmpty() ? tr("saved %1").arg(path) : error);
  });
  auto* row = new QHBoxLayout;
  row->addStretch(1);
  row->addWidget(save);
  layout->addLayout(row);
  w->resize(1400, 900);
  w->show();
  emit compareShown(page);
  return page;
}

bool MainWindow::hasSession(qint64 id) const { return id > 0 && m_store && m_store->info(id).id == id; }

ComparePage* MainWindow::compareSessions(const QList<qint64>& ids) {
  if (!m_store || ids.size() < 2 || ids.size() > 4) return nullptr;
  // Each session loads on its own thread, through its own read-only
  // connection (a connection belongs to one thread).
  std::vector<ComparedRun> runs(size_t(ids.size()));
  std::vector<std::thread> loaders;
  const QString path = m_store->path();
  for (int i = 0; i < ids.size(); ++i) {
    const SessionInfo info = m_store->info(ids[i]);
    runs[size_t(i)].name = info.name.isEmpty() ? tr("session %1").arg(ids[i]) : info.name;
    loaders.emplace_back([&runs, i, id = ids[i], path] {
      auto data = std::make_shared<RunData>();
      SessionStore reader;
      if (reader.open(path, SessionStore::Mode::ReadOnly, SessionStore::Check::Skip))
        reader.readEvents(id, [&](std::vector<ss::proto::Event>&& batch) { data->add(std::move(batch)); });
      runs[size_t(i)].data = std::move(data);
    });
  }
  for (std::thread& t : loaders) t.join();
  return showComparison(std::move(runs));
}

QString MainWindow::exportView(const QString& path) {
  return exportWidget(m_tabs->currentWidget(), path, m_tabs->tabText(m_tabs->currentIndex()));
}

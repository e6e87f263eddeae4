#include "mainwindow.h"

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
#include <QVBoxLayout>

#include "pages.h"

QString resourcesDir() {
  const QString env = qEnvironmentVariable("SHARDSCOPE_RESOURCES");
  if (!env.isEmpty()) return env;
  const QString app = QCoreApplication::applicationDirPath();
  for (const QString& cand : {app + "/../share/shardscope", app + "/resources"})
    if (QDir(cand + "/models").exists()) return QDir::cleanPath(cand);
  return QStringLiteral(SHARDSCOPE_SOURCE_RESOURCES);
}

MainWindow::MainWindow(QWidget* parent) : QMainWindow(parent), m_client(new EngineClient(this)) {
  setWindowTitle(tr("ShardScope"));
  auto* central = new QWidget(this);
  auto* layout = new QHBoxLayout(central);

  auto* setup = new QWidget(central);
  auto* form = new QFormLayout(setup);
  m_model = new QComboBox(setup);
  for (const QFileInfo& f : QDir(resourcesDir() + "/models").entryInfoList({"*.json"}, QDir::Files, QDir::Name))
    m_model->addItem(f.completeBaseName());
  m_model->setCurrentText(QStringLiteral("small-llama"));
  m_backend = new QComboBox(setup);
  m_backend->addItem(tr("CPU devices (MPI ranks)"), QStringLiteral("cpu"));
  for (const QFileInfo& f : QDir(resourcesDir() + "/hardware").entryInfoList({"*.json"}, QDir::Files, QDir::Name))
    m_backend->addItem(tr("simulated %1").arg(f.completeBaseName()), QStringLiteral("sim:") + f.completeBaseName());
  m_strategy = new QComboBox(setup);
  m_strategy->addItems({"single", "dp", "tp", "sp", "tp_sp", "tsp"});
  m_strategy->setCurrentText(QStringLiteral("tp"));
  m_devices = new QSpinBox(setup);
  m_devices->setRange(1, 64);
  m_devices->setValue(4);
  m_mesh = new QLineEdit(QStringLiteral("2x2"), setup);
  m_prompt = new QSpinBox(setup);
  m_prompt->setRange(1, 1 << 20);
  m_prompt->setValue(256);
  m_decode = new QSpinBox(setup);
  m_decode->setRange(0, 4096);
  m_decode->setValue(8);
  form->addRow(tr("Model"), m_model);
  form->addRow(tr("Backend"), m_backend);
  form->addRow(tr("Strategy"), m_strategy);
  form->addRow(tr("Devices"), m_devices);
  form->addRow(tr("Mesh (tp_sp)"), m_mesh);
  form->addRow(tr("Prompt tokens"), m_prompt);
  form->addRow(tr("Decode tokens"), m_decode);
  m_run = new QPushButton(tr("Run"), setup);
  m_stop = new QPushButton(tr("Stop"), setup);
  m_stop->setEnabled(false);
  auto* buttons = new QHBoxLayout;
  buttons->addWidget(m_run);
  buttons->addWidget(m_stop);
  form->addRow(buttons);
  m_compare = new QPushButton(tr("TP vs TSP"), setup);
  m_compare->setToolTip(tr("Run this setup under tp and under tsp and compare them side by side"));
  form->addRow(m_compare);
  m_sweep = new QPushButton(tr("Quantization sweep"), setup);
  m_sweep->setToolTip(tr("Run this setup under tp with bf16, int8, int4 and fp8 all-reduces against fp32"));
  form->addRow(m_sweep);
  m_verdict = new QLabel(setup);
  m_verdict->setWordWrap(true);
  form->addRow(m_verdict);
  setup->setFixedWidth(330);

  m_tabs = new QTabWidget(central);
  m_memory = new MemoryPage(m_data, m_tabs);
  m_timeline = new TimelineView(m_data, m_tabs);
  m_placement = new PlacementPage(m_data, m_tabs);
  m_summary = new SummaryPage(m_data, m_tabs);
  m_tabs->addTab(m_summary, tr("Summary"));
  m_tabs->addTab(m_memory, tr("Memory"));
  m_tabs->addTab(m_placement, tr("Shard placement"));
  m_tabs->addTab(m_timeline, tr("Timeline"));
  m_quant = new QuantizationPage(m_data, m_tabs);
  m_tabs->addTab(m_quant, tr("Quantization"));
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
  file->addAction(tr("&Quit"), this, &QWidget::close);

  m_redraw = new QTimer(this);
  m_redraw->setInterval(100);  // at most 10 redraws a second, whatever the event rate
  connect(m_redraw, &QTimer::timeout, this, &MainWindow::refreshPages);
  connect(m_run, &QPushButton::clicked, this, &MainWindow::runOnce);
  connect(m_compare, &QPushButton::clicked, this, &MainWindow::compareTpTsp);
  connect(m_sweep, &QPushButton::clicked, this, &MainWindow::runSweep);
  connect(m_stop, &QPushButton::clicked, m_client, &EngineClient::stop);
  connect(m_client, &EngineClient::eventsReceived, this, &MainWindow::onEvents);
  connect(m_client, &EngineClient::finished, this, &MainWindow::onFinished);
  connect(m_strategy, &QComboBox::currentTextChanged, this, &MainWindow::updateSetupState);
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
  for (QComboBox* c : {m_model, m_backend, m_strategy}) connect(c, &QComboBox::currentIndexChanged, this, changed);
  for (QSpinBox* b : {m_devices, m_prompt, m_decode}) connect(b, &QSpinBox::valueChanged, this, changed);
  connect(m_mesh, &QLineEdit::textChanged, this, changed);
  updateSetupState();
  changed();
}

QString MainWindow::verdictText() const { return m_verdict->text(); }
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
  args.removeFirst();  // run, launch or simulate: check takes the same options
  args.prepend(QStringLiteral("check"));
  m_check = new QProcess(this);
  connect(m_check, &QProcess::finished, this, [this, p = m_check](int code, QProcess::ExitStatus status) {
    if (p != m_check) return;
    m_valid = status == QProcess::NormalExit && code == 0;
    QString reason = QString::fromUtf8(p->readAllStandardError()).trimmed();
    reason.remove(QStringLiteral("shardscope-engine: error: "));
    m_verdict->setText(m_valid ? tr("<span style='color:#1a7f37'>ready to run</span>")
                               : QStringLiteral("<span style='color:#b00'>%1</span>")
                                     .arg((reason.isEmpty() ? tr("the engine could not check this setup") : reason)
                                              .toHtmlEscaped()));
    m_run->setEnabled(m_valid && !m_client->isRunning());
  });
  m_check->start(EngineClient::enginePath(), args);
}

void MainWindow::updateSetupState() {
  const bool single = m_strategy->currentText() == QLatin1String("single");
  m_devices->setEnabled(!single);
  m_mesh->setEnabled(m_strategy->currentText() == QLatin1String("tp_sp"));
}

void MainWindow::setSetup(const QString& model, const QString& backend, const QString& strategy, int devices,
                          int prompt, int decode) {
  m_model->setCurrentText(model);
  const int b = m_backend->findData(backend);
  if (b >= 0) m_backend->setCurrentIndex(b);
  m_strategy->setCurrentText(strategy);
  m_devices->setValue(devices);
  m_prompt->setValue(prompt);
  m_decode->setValue(decode);
}

QStringList MainWindow::engineArguments() const {
  const QString backend = m_backend->currentData().toString(), strategy = m_strategy->currentText();
  QStringList args;
  if (backend.startsWith(QLatin1String("sim:"))) args << "simulate" << "--hardware" << backend.mid(4);
  else args << (strategy == QLatin1String("single") ? "run" : "launch");
  args << "--model" << m_model->currentText() << "--strategy" << strategy << "--prompt-len"
       << QString::number(m_prompt->value()) << "--decode" << QString::number(m_decode->value());
  if (strategy != QLatin1String("single")) args << "--devices" << QString::number(m_devices->value());
  if (strategy == QLatin1String("tp_sp")) args << "--mesh" << m_mesh->text();
  if (strategy == QLatin1String("dp")) args << "--batch" << QString::number(m_devices->value());
  return args;
}

void MainWindow::runOnce() {
  m_data.clear();
  m_run->setEnabled(false);
  m_stop->setEnabled(true);
  const QStringList args = engineArguments();
  m_status->setText(tr("running: shardscope-engine %1").arg(args.join(' ')));
  m_redraw->start();
  m_client->start(args);
}

bool MainWindow::openStream(const QString& path) {
  m_data.clear();
  m_status->setText(tr("opening %1 ...").arg(path));
  m_redraw->start();
  return m_client->openFile(path);
}

void MainWindow::onEvents(const EventBatch& events) { m_data.add(*events); }

void MainWindow::runSweep() {
  m_data.clear();
  QStringList args = {"sweep", "--model", m_model->currentText(), "--strategy", "tp", "--devices",
                      QString::number(std::max(2, m_devices->value())), "--prompt-len",
                      QString::number(m_prompt->value()), "--decode", QString::number(m_decode->value()),
                      "--precisions", "bf16,int8,int4,fp8", "--blocks", "32,128,1024", "--events", "-"};
  m_status->setText(tr("sweeping: shardscope-engine %1").arg(args.join(' ')));
  m_run->setEnabled(false);
  m_stop->setEnabled(true);
  m_tabs->setCurrentWidget(m_quant);
  m_redraw->start();
  m_client->start(args);
}

void MainWindow::refreshPages() {
  m_quant->refresh();
  m_memory->refresh();
  m_placement->refresh();
  m_summary->refresh();
  m_timeline->resetZoom();
}

QString MainWindow::summaryText() const { return m_summary->text(); }

void MainWindow::compareTpTsp() {
  m_compared.clear();
  m_queue = {QStringLiteral("tp"), QStringLiteral("tsp")};
  m_strategy->setCurrentText(m_queue.takeFirst());
  runOnce();
}

// Two finished runs side by side: their summaries, and peak memory per
// device and category as grouped bars.
namespace {
// A finished run's data, owned by the comparison window that shows it.
struct ComparedRun : QObject {
  RunData data;
};
}  // namespace

static QWidget* comparisonWindow(const std::vector<std::pair<QString, RunData>>& runs, QWidget* parent) {
  auto* w = new QWidget(parent, Qt::Window);
  w->setAttribute(Qt::WA_DeleteOnClose);
  w->setWindowTitle(QObject::tr("ShardScope: %1 vs %2").arg(runs[0].first, runs[1].first));
  auto* layout = new QHBoxLayout(w);
  for (const auto& [name, data] : runs) {
    auto* kept = new ComparedRun;
    kept->setParent(w);
    kept->data = data;
    auto* page = new SummaryPage(kept->data, w);
    page->refresh();
    layout->addWidget(page);
  }
  w->resize(1400, 600);
  return w;
}

void MainWindow::onFinished(const RunOutcome& o) {
  m_redraw->stop();
  refreshPages();
  m_run->setEnabled(m_valid);
  m_stop->setEnabled(false);
  QString text = tr("%1 (status %2)").arg(o.message, o.status);
  if (o.rejected) text += tr("; %1 unreadable lines").arg(o.rejected);
  for (const QString& l : o.stderrTail)
    if (o.exitCode != 0 || o.crashed) text += QStringLiteral(" | ") + l;
  m_status->setText(text);
  if (!m_queue.isEmpty() || !m_compared.empty()) {
    m_compared.emplace_back(m_strategy->currentText(), m_data);
    if (!m_queue.isEmpty() && o.exitCode == 0) {
      m_strategy->setCurrentText(m_queue.takeFirst());
      QTimer::singleShot(0, this, &MainWindow::runOnce);
      return;
    }
    m_queue.clear();
    if (m_compared.size() == 2) comparisonWindow(m_compared, this)->show();
    m_compared.clear();
  }
  emit runFinished(o);
}

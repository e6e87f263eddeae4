#include "mainwindow.h"

#include <QComboBox>
#include <QCoreApplication>
#include <QDir>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLocale>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QSpinBox>
#include <QStatusBar>
#include <QVBoxLayout>

namespace {
QString bytesText(double b) { return QLocale().formattedDataSize(qint64(b), 2, QLocale::DataSizeIecFormat); }
}  // namespace

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
  m_prompt = new QSpinBox(setup);
  m_prompt->setRange(1, 1 << 20);
  m_prompt->setValue(256);
  m_decode = new QSpinBox(setup);
  m_decode->setRange(0, 4096);
  m_decode->setValue(16);
  form->addRow(tr("Model"), m_model);
  form->addRow(tr("Prompt tokens"), m_prompt);
  form->addRow(tr("Decode tokens"), m_decode);
  m_run = new QPushButton(tr("Run"), setup);
  m_stop = new QPushButton(tr("Stop"), setup);
  m_stop->setEnabled(false);
  auto* buttons = new QHBoxLayout;
  buttons->addWidget(m_run);
  buttons->addWidget(m_stop);
  form->addRow(buttons);
  setup->setMaximumWidth(340);

  m_summary = new QPlainTextEdit(central);
  m_summary->setReadOnly(true);
  m_summary->setFont(QFont(QStringLiteral("DejaVu Sans Mono"), 10));
  m_summary->setPlaceholderText(tr("Pick a model and press Run: the engine runs on this CPU and its summary appears here."));
  layout->addWidget(setup);
  layout->addWidget(m_summary, 1);
  setCentralWidget(central);
  m_status = new QLabel(tr("ready"), this);
  statusBar()->addWidget(m_status, 1);
  resize(1100, 640);

  connect(m_run, &QPushButton::clicked, this, &MainWindow::runOnce);
  connect(m_stop, &QPushButton::clicked, m_client, &EngineClient::stop);
  connect(m_client, &EngineClient::eventsReceived, this, &MainWindow::onEvents);
  connect(m_client, &EngineClient::finished, this, &MainWindow::onFinished);
}

void MainWindow::runOnce() {
  m_lines.clear();
  m_spans = m_memSamples = 0;
  m_summary->clear();
  m_run->setEnabled(false);
  m_stop->setEnabled(true);
  m_status->setText(tr("running %1 on the cpu backend ...").arg(m_model->currentText()));
  m_client->start({"run", "--model", m_model->currentText(), "--prompt-len", QString::number(m_prompt->value()),
                   "--decode", QString::number(m_decode->value())});
}

void MainWindow::onEvents(const EventBatch& events) {
  using namespace ss::proto;
  for (const Event& e : *events) {
    if (auto* c = std::get_if<Config>(&e)) {
      const auto& m = c->config.value("model", nlohmann::json::object());
      m_lines << tr("model %1 (%2), %3 M parameters, weights %4")
                     .arg(QString::fromStdString(m.value("name", "?")), QString::fromStdString(m.value("family", "?")))
                     .arg(c->config.value("parameters", 0.0) / 1e6, 0, 'f', 1)
                     .arg(QString::fromStdString(c->config.value("weights", "?")));
    } else if (auto* d = std::get_if<Device>(&e)) {
      m_lines << tr("device %1: %2 (%3)").arg(d->rank).arg(QString::fromStdString(d->kind), QString::fromStdString(d->name));
    } else if (auto* m = std::get_if<Metric>(&e)) {
      const QString name = QString::fromStdString(m->name);
      const QString value = m->unit == "bytes" ? bytesText(m->value) : QString::number(m->value, 'f', 2) + " " + QString::fromStdString(m->unit);
      m_lines << QStringLiteral("  %1  %2").arg(name, -28).arg(value);
    } else if (auto* er = std::get_if<Error>(&e)) {
      m_lines << tr("error (%1): %2").arg(QString::fromStdString(er->code), QString::fromStdString(er->message));
    } else if (std::holds_alternative<Span>(e)) {
      ++m_spans;
    } else if (std::holds_alternative<Mem>(e)) {
      ++m_memSamples;
    }
  }
  m_summary->setPlainText(summaryText());
}

QString MainWindow::summaryText() const {
  return m_lines.join('\n') + tr("\n\n%1 spans and %2 memory samples received").arg(m_spans).arg(m_memSamples);
}

void MainWindow::onFinished(const RunOutcome& o) {
  m_run->setEnabled(true);
  m_stop->setEnabled(false);
  QString text = tr("%1 (status %2)").arg(o.message, o.status);
  if (o.rejected) text += tr("; %1 unreadable lines").arg(o.rejected);
  m_status->setText(text);
  if (o.exitCode != 0 || o.crashed) {
    m_lines << QString() << tr("The engine did not finish: %1").arg(o.message);
    for (const QString& l : o.stderrTail) m_lines << QStringLiteral("  stderr: ") + l;
    m_summary->setPlainText(summaryText());
  }
  emit runFinished(o);
}

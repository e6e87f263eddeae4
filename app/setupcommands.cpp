// The setup as engine commands: the arguments of a run, and the commands
// beside Run (a quantization sweep, a scaling sweep, verify, TP vs TSP).
#include <QComboBox>
#include <QFileInfo>
#include <QFormLayout>
#include <QLabel>
#include <QRegularExpression>
#include <QLineEdit>
#include <QPushButton>
#include <QSpinBox>

#include <algorithm>

#include "mainwindow.h"

QStringList MainWindow::engineArguments() const {
  const QString backend = m_backend->currentData().toString(), strategy = m_strategy->currentText();
  QStringList args;
  if (training()) {
    args << "train" << "--model" << m_model->currentText() << "--strategy" << strategy << "--dtype"
         << m_dtype->currentData().toString() << "--seq-len" << QString::number(m_seqLen->value()) << "--micro-batch"
         << QString::number(m_microBatch->value()) << "--steps" << QString::number(m_steps->value()) << "--lr"
         << m_lr->text().trimmed() << "--warmup" << QString::number(std::min(10, m_steps->value() / 10))
         << "--recompute" << m_recompute->currentText();
    if (backend.startsWith(QLatin1String("sim:"))) {
      args << "--backend" << "sim" << "--hardware" << backend.mid(4);
      if (m_nodes->value() > 1) args << "--nodes" << QString::number(m_nodes->value());
    } else if (backend == QLatin1String("cuda")) {
      args << "--backend" << "cuda";
    }
    if (strategy != QLatin1String("single")) args << "--devices" << QString::number(m_devices->value());
    if (strategy == QLatin1String("tp_sp")) args << "--mesh" << m_mesh->text();
    for (const QString& kv : m_overrides->text().split(',', Qt::SkipEmptyParts)) args << "--set" << kv.trimmed();
    if (!m_capacity->text().trimmed().isEmpty()) args << "--capacity" << m_capacity->text().trimmed();
    return args;
  }
  if (backend.startsWith(QLatin1String("sim:"))) args << "simulate" << "--hardware" << backend.mid(4);
  else args << (strategy == QLatin1String("single") ? "run" : "launch");
  args << "--model" << m_model->currentText() << "--strategy" << strategy << promptArguments() << "--decode"
       << QString::number(m_decode->value()) << "--dtype" << m_dtype->currentData().toString();
  if (backend == QLatin1String("cuda")) args << "--backend" << "cuda";
  if (strategy != QLatin1String("single")) args << "--devices" << QString::number(m_devices->value());
  if (strategy == QLatin1String("tp_sp")) args << "--mesh" << m_mesh->text();
  if (backend.startsWith(QLatin1String("sim:")) && m_nodes->value() > 1) args << "--nodes" << QString::number(m_nodes->value());
  if (strategy == QLatin1String("dp")) args << "--batch" << QString::number(m_devices->value() * m_batch->value());
  else if (m_batch->value() > 1) args << "--batch" << QString::number(m_batch->value());
  for (const QString& kv : m_overrides->text().split(',', Qt::SkipEmptyParts)) args << "--set" << kv.trimmed();
  const QString precision = m_precision->currentText().trimmed();
  if (!precision.isEmpty() && precision != QLatin1String("fp32")) args << "--comm-precision" << precision;
  if (!m_capacity->text().trimmed().isEmpty()) args << "--capacity" << m_capacity->text().trimmed();
  return args;
}

QStringList MainWindow::streamCommand(const nlohmann::json& config) {
  QStringList args;
  if (!config.contains("command") || !config["command"].is_array()) return args;
  for (const auto& a : config["command"]) {
    if (!a.is_string()) return {};
    const QString arg = QString::fromStdString(a.get<std::string>());
    const qsizetype eq = arg.indexOf('=');
    if (arg.startsWith(QLatin1String("--")) && eq > 2) args << arg.left(eq) << arg.mid(eq + 1);  // --opt=value
    else args << arg;
  }
  if (args.isEmpty()) return args;
  const auto text = [&](const nlohmann::json& j, const char* key) {
    if (!j.is_object() || !j.contains(key)) return QString();
    const nlohmann::json& v = j[key];
    return v.is_string() ? QString::fromStdString(v.get<std::string>())
           : v.is_number_integer() ? QString::number(v.get<int64_t>())
           : v.is_number() ? QString::number(v.get<double>())
                            : QString();
  };
  // An option the command left out, as the run resolved it.
  const auto name = [&](const char* option, const QString& value) {
    if (!value.isEmpty() && !args.contains(QLatin1String(option))) args << option << value;
  };
  const QString command = args[0];
  const bool simulated = command == QLatin1String("simulate") || command == QLatin1String("scale") ||
                         text(config, "backend") == QLatin1String("sim");
  if (simulated) {
    const QString file = text(config, "hardware_file");
    name("--hardware", file.isEmpty() ? text(config, "hardware") : QFileInfo(file).completeBaseName());
    name("--nodes", text(config, "nodes"));
  } else if (command != QLatin1String("scale")) {
    name("--backend", text(config, "backend"));
  }
  if (command == QLatin1String("scale")) {
    const nlohmann::json sc = config.contains("scale") ? config["scale"] : nlohmann::json::object();
    name("--mode", text(sc, "mode"));
    name("--recompute", text(sc, "recompute"));
  } else {
    name("--strategy", text(config, "strategy"));
    if (text(config, "strategy") == QLatin1String("tp_sp") && config.contains("mesh") && config["mesh"].is_object())
      name("--mesh", text(config["mesh"], "tp") + "x" + text(config["mesh"], "sp"));
  }
  name("--devices", text(config, "devices"));
  name("--dtype", text(config, "dtype"));
  const nlohmann::json training = config.contains("training") ? config["training"] : nlohmann::json::object();
  const nlohmann::json work = config.contains("workload") ? config["workload"] : nlohmann::json::object();
  if (command == QLatin1String("train")) {
    name("--seq-len", text(training, "seq_len"));
    name("--seq-len", text(work, "seq_len"));  // train --verify's config names it here
    name("--micro-batch", text(training, "micro_batch"));
    name("--steps", text(training, "steps"));
    name("--lr", text(training, "lr"));
    name("--recompute", text(training, "recompute"));
  } else {
    if (!args.contains(QLatin1String("--prompt")))  // (the form has no field for --tokens' ids: their count)
      name("--prompt-len", text(work, "prompt_len"));
    name("--decode", text(work, "decode"));
    name("--batch", text(work, "batch"));
  }
  name("--comm-precision", text(config, "comm_precision"));
  return args;
}

void MainWindow::setFormFrom(const QStringList& args) {
  const auto value = [&](const char* option) {
    const qsizetype at = args.indexOf(QLatin1String(option));
    return at > 0 && at + 1 < args.size() ? args[at + 1] : QString();
  };
  const auto setNumber = [&](QSpinBox* box, const char* option, int absent) {
    bool ok = false;
    const int n = value(option).toInt(&ok);
    if (ok) box->setValue(n);
    else if (absent > 0) box->setValue(absent);
  };
  const QString command = args.value(0);
  // A run's command names its whole setup: what it leaves out is the form's
  // default. A sweep's names part of one: the rest keeps its value.
  const bool whole = QStringList{"run", "launch", "simulate", "verify", "train"}.contains(command);
  const bool train = command == QLatin1String("train") ||
                     (command == QLatin1String("scale") && value("--mode") == QLatin1String("train"));
  m_mode->setCurrentIndex(train ? 1 : 0);
  if (!value("--model").isEmpty()) m_model->setCurrentText(value("--model"));
  QString backend = value("--backend");
  if (command == QLatin1String("simulate") || command == QLatin1String("scale") || backend == QLatin1String("sim"))
    backend = QStringLiteral("sim:") + QFileInfo(value("--hardware")).completeBaseName();  // a profile's name or file
  if (backend.isEmpty()) backend = QStringLiteral("cpu");
  if (const int b = m_backend->findData(backend); b >= 0) m_backend->setCurrentIndex(b);
  else m_status->setText(tr("this session ran on %1, which this machine does not offer: the form keeps %2")
                             .arg(backend, m_backend->currentText()));
  if (const int s = m_strategy->findText(value("--strategy")); s >= 0) m_strategy->setCurrentIndex(s);
  setNumber(m_devices, "--devices", 0);
  setNumber(m_nodes, "--nodes", whole || command == QLatin1String("scale") ? 1 : 0);
  if (!value("--mesh").isEmpty()) m_mesh->setText(value("--mesh"));
  if (const int d = m_dtype->findData(value("--dtype")); d >= 0) m_dtype->setCurrentIndex(d);
  QStringList overrides;
  for (qsizetype i = 1; i + 1 < args.size(); ++i)
    if (args[i] == QLatin1String("--set")) overrides << args[i + 1];
  m_overrides->setText(overrides.join(QStringLiteral(", ")));
  if (whole) m_capacity->setText(value("--capacity"));
  if (train) {
    setNumber(m_seqLen, "--seq-len", 0);
    setNumber(m_microBatch, "--micro-batch", 0);
    if (!args.contains(QLatin1String("--verify"))) setNumber(m_steps, "--steps", 0);  // verify's one step is not the setup's
    if (!value("--lr").isEmpty()) m_lr->setText(value("--lr"));
    if (!value("--recompute").isEmpty()) m_recompute->setCurrentText(value("--recompute"));
    return;
  }
  if (!value("--prompt").isEmpty()) {
    m_promptText->setText(value("--prompt"));
  } else if (!value("--prompt-len").isEmpty()) {
    m_promptText->clear();
    setNumber(m_prompt, "--prompt-len", 0);
  }
  if (command == QLatin1String("scale")) return;  // its --decode is capped for the sweep, not the setup's
  setNumber(m_decode, "--decode", 0);
  if (!whole) return;
  // dp's --batch is every replica's sequences: the form asks for one replica's.
  bool ok = false;
  const int batch = value("--batch").toInt(&ok);
  const bool dp = value("--strategy") == QLatin1String("dp");
  m_batch->setValue(!ok ? 1 : dp ? std::max(1, batch / std::max(1, m_devices->value())) : batch);
  m_precision->setCurrentText(value("--comm-precision").isEmpty() ? QStringLiteral("fp32") : value("--comm-precision"));
}

QString MainWindow::inFormTerms(const QString& message) const {
  // "--decode steps" before "--decode": "fewer Decode steps", not "fewer Decode steps steps".
  const std::pair<const char*, QWidget*> fields[] = {
      {"--decode steps", m_decode}, {"--prompt-len", m_prompt},      {"--prompt", m_promptText},
      {"--decode", m_decode},       {"--batch", m_batch},            {"--seq-len", m_seqLen},
      {"--micro-batch", m_microBatch}, {"--steps", m_steps},         {"--lr", m_lr},
      {"--recompute", m_recompute}, {"--set", m_overrides},          {"--backend", m_backend},
      {"--strategy", m_strategy},   {"--dtype", m_dtype},            {"--devices", m_devices},
      {"--nodes", m_nodes},         {"--mesh", m_mesh},              {"--comm-precision", m_precision},
      {"--capacity", m_capacity}};
  QString html = message.toHtmlEscaped();
  for (const auto& [option, field] : fields)
    if (const auto* label = qobject_cast<const QLabel*>(m_form->labelForField(field)))
      html.replace(QRegularExpression(QRegularExpression::escape(QLatin1String(option)) + QStringLiteral("(?![\\w-])")),
                   QStringLiteral("<b>%1</b>").arg(label->text().toHtmlEscaped()));
  const bool simulated = m_backend->currentData().toString().startsWith(QLatin1String("sim:"));
  return html.replace(QStringLiteral("`scale`"),
                      simulated ? tr("the Scaling sweep") : tr("the Scaling sweep (on a simulated backend)"));
}

// Whether the chosen model reads text: a folder (given, or shipped by name) with a tokenizer.json.
bool MainWindow::modelHasTokenizer() const {
  const QString m = m_model->currentText();
  if (QFileInfo(m).isDir()) return QFileInfo::exists(m + "/tokenizer.json");
  return !m.contains('/') && QFileInfo::exists(resourcesDir() + "/models/" + m + "/tokenizer.json");
}

// The prompt as the setup gives it: typed text, or a synthetic one of N tokens.
QStringList MainWindow::promptArguments() const {
  const QString text = m_promptText->text();
  if (!text.isEmpty() && modelHasTokenizer()) return {"--prompt", text};
  return {"--prompt-len", QString::number(m_prompt->value())};
}

void MainWindow::runSweep() { runSweepOf(QStringLiteral("bf16,int8,int4,fp8"), QStringLiteral("32,128,1024")); }

void MainWindow::runSweepOf(const QString& precisions, const QString& blocks) {
  const QStringList args = QStringList{"sweep", "--model", m_model->currentText(), "--strategy", "tp", "--devices",
                                       QString::number(std::max(2, m_devices->value()))} +
                           promptArguments() +
                           QStringList{"--decode", QString::number(m_decode->value()), "--precisions", precisions,
                                       "--blocks", blocks, "--events", "-"};
  runArguments(args, tr("sweep · %1").arg(QFileInfo(m_model->currentText()).fileName()));
}

bool MainWindow::canVerify() const { return m_verify->isVisible() && m_verify->isEnabled(); }

void MainWindow::verifySetup() {
  QStringList args = engineArguments();
  if (training()) {  // one step is what it compares: the gradient of step 1
    args[args.indexOf(QStringLiteral("--steps")) + 1] = QStringLiteral("1");
    args << QStringLiteral("--verify");
  } else {
    args.first() = QStringLiteral("verify");
  }
  args << QStringLiteral("--events") << QStringLiteral("-");
  runArguments(args, tr("verify · %1 · %2 on %3 devices")
                         .arg(QFileInfo(m_model->currentText()).fileName(), m_strategy->currentText())
                         .arg(m_strategy->currentText() == QLatin1String("single") ? 1 : m_devices->value()));
}

void MainWindow::runScaling() {
  const QString backend = m_backend->currentData().toString();
  if (!backend.startsWith(QLatin1String("sim:"))) return;
  QStringList args = {"scale", "--model", m_model->currentText(), "--hardware", backend.mid(4), "--devices",
                      QString::number(m_devices->value()), "--nodes", QString::number(m_nodes->value()), "--dtype",
                      m_dtype->currentData().toString(), "--events", "-"};
  if (training()) args << "--mode" << "train" << "--recompute" << m_recompute->currentText();
  else args << "--mode" << "infer" << "--decode" << QString::number(std::min(m_decode->value(), 8));
  for (const QString& kv : m_overrides->text().split(',', Qt::SkipEmptyParts)) args << "--set" << kv.trimmed();
  runArguments(args, tr("scaling · %1 · %2 devices · %3")
                         .arg(QFileInfo(m_model->currentText()).fileName())
                         .arg(m_devices->value())
                         .arg(training() ? tr("training") : tr("inference")));
}

void MainWindow::compareTpTsp() {
  m_compared.clear();
  m_queue = {QStringLiteral("tp"), QStringLiteral("tsp")};
  m_strategy->setCurrentText(m_queue.takeFirst());
  runOnce();
}

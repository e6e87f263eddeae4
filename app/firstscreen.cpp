// The first screen: the Start page's examples, each setting up the form as a
// person would and starting it (so the setup on the left shows what the
// example ran), and what each page says while it has nothing to show.
#include <QComboBox>
#include <QDir>
#include <QFileInfo>
#include <QLabel>
#include <QLineEdit>
#include <QSpinBox>

#include "engineclient.h"
#include "mainwindow.h"
#include "pages.h"
#include "scaling_page.h"
#include "training.h"

void MainWindow::runExample(Example e) {
  if (m_client->isRunning()) {
    m_status->setText(tr("a run is in progress: stop it before starting an example"));
    return;
  }
  // The form as the example needs it: nothing left over from earlier runs
  // (overrides, capacity, nodes), and the dtype set without counting as the
  // person's own choice.
  auto setup = [this](const char* model, const char* backend, const char* strategy, int devices, int prompt,
                      int decode, const char* dtype) {
    const QString problem = setSetup(QString::fromLatin1(model), QString::fromLatin1(backend),
                                     QString::fromLatin1(strategy), devices, prompt, decode);
    setOptions(1, {}, QStringLiteral("fp32"), {});
    m_nodes->setValue(1);
    const bool chosen = m_dtypeChosen;
    m_dtype->setCurrentIndex(m_dtype->findData(QString::fromLatin1(dtype)));
    m_dtypeChosen = chosen;
    if (!problem.isEmpty()) m_status->setText(problem);
    return problem.isEmpty();
  };
  switch (e) {
    case Example::TpVsTspLongContext:
      setTraining(false);
      if (setup("llama2-7b", "sim:mi300x", "tp", 8, 32768, 8, "bf16")) compareTpTsp();
      break;
    case Example::Int8TextModel:
      setTraining(false);
      if (!setup("brown-llama", "cpu", "tp", 4, 16, 24, "fp32")) break;
      m_promptText->setText(QStringLiteral("The jury said that"));
      runSweepOf(QStringLiteral("int8,int4"), QStringLiteral("128"));
      break;
    case Example::TrainTsp: {
      if (!setup("brown-llama", "cpu", "tsp", 4, 256, 8, "fp32")) break;
      setTraining(true, 128, 1, 8, QStringLiteral("none"));
      m_lr->setText(QStringLiteral("3e-4"));  // a trained model: a small step
      // On the training text of the Brown Corpus where setup-deps.sh put it
      // (the engine's cache rule); without it, the engine's synthetic corpus.
      const QString cache = qEnvironmentVariableIsEmpty("SHARDSCOPE_CACHE")
                                ? QDir::homePath() + QStringLiteral("/.cache/shardscope")
                                : qEnvironmentVariable("SHARDSCOPE_CACHE");
      const QString text = cache + QStringLiteral("/brown/brown-train.txt");
      if (!QFileInfo::exists(text)) {
        runOnce();
        m_status->setText(tr("the Brown Corpus is not in %1 (packaging/setup-deps.sh fetches it): training on the "
                             "synthetic corpus").arg(cache));
        break;
      }
      runArguments(engineArguments() + QStringList{"--data", text, "--tokenizer",
                                                   resourcesDir() + QStringLiteral("/models/brown-llama/tokenizer.json")},
                   tr("brown-llama · tsp · 4 · training 8 steps on Brown Corpus text"));
      break;
    }
  }
}

void MainWindow::addPageNotices() {
  auto any = [](const RunData& d, auto has) {
    for (const auto& [rank, r] : d.ranks())
      if (has(r)) return true;
    return false;
  };
  auto add = [this](QWidget* page, const QString& text, std::function<bool(const RunData&)> empty) {
    m_notices.push_back(new PageNotice(page, text, std::move(empty)));
  };
  add(m_summary,
      tr("No run yet. The Summary describes a run as it streams: the model and how it is split, each device's peak "
         "memory by category against the textbook figure, time to first token and decode rate, bytes on the wire "
         "and how much of it is hidden behind compute, and for a text model the prompt and its answer.\n\nSet up a "
         "run on the left and press Run, or pick an example on the Start page."),
      [this](const RunData& d) { return d.events() == 0 && m_summary->notice().isEmpty() && !m_client->isRunning(); });
  add(m_memory,
      tr("Each device's memory over the run, stacked by category (weights, activations, KV cache, SSM state, "
         "communication buffers, workspace; gradients and optimizer state in training), with the capacity drawn "
         "across. It fills in as a run streams its memory samples."),
      [any](const RunData& d) { return !any(d, [](const RankData& r) { return !r.mem.empty(); }); });
  add(m_placement,
      tr("Where every weight shard and every token lives: for each weight, the slice each device holds, and for "
         "each device its share of the sequence (sp, tp_sp and tsp split the tokens, zigzag or contiguous). It "
         "appears when a run loads its weights."),
      [any](const RunData& d) { return !any(d, [](const RankData& r) { return !r.placements.empty(); }); });
  add(m_timeline,
      tr("Compute and communication of every device over time, a lane each: GEMMs, attention and scans beside "
         "all-reduces, gathers, broadcasts and ring transfers, so what overlaps and what waits is plain to see. "
         "Drag to zoom; hover a span for its op, shape, FLOPs and bytes."),
      [any](const RunData& d) { return !any(d, [](const RankData& r) { return !r.spans.empty(); }); });
  add(m_training,
      tr("A training run's loss, gradient norm and learning rate per step, its tokens per second, and each "
         "device's gradients and optimizer state. Choose Mode: Training on the left and press Run."),
      [](const RunData& d) { return d.trainSteps().empty(); });
  add(m_quant,
      tr("What a quantized all-reduce saves on the wire and costs in accuracy: for each precision and block size, "
         "bytes per rank, logits KL and top-1 agreement against the unquantized run, and each configuration's "
         "answer under the reference's with the first token that differs marked. Press Quantization sweep."),
      [this](const RunData&) { return m_quant->points() == 0; });
  add(m_scaling,
      tr("Peak memory per device, throughput and traffic against sequence length for every strategy, the device's "
         "capacity drawn across: where each strategy stops fitting. Choose a simulated backend on the left and "
         "press Scaling sweep."),
      [](const RunData& d) { return d.scalePoints().empty(); });
  for (PageNotice* n : m_notices) n->refresh(m_data);
}

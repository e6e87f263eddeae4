#include "startpage.h"

#include <QCommandLinkButton>
#include <QEvent>
#include <QVBoxLayout>

#include "rundata.h"

StartPage::StartPage(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(40, 30, 40, 30);
  auto* title = new QLabel(tr("<h2>ShardScope</h2>"), this);
  auto* intro = new QLabel(
      tr("<p>ShardScope runs a model split over several devices — tensor parallelism (tp), sequence parallelism (sp), "
         "both on a mesh (tp_sp), or folded tensor-and-sequence parallelism (tsp) — and shows, live, what each device "
         "holds and does: its memory by category, where every weight shard and every token lives, and a timeline of "
         "its compute and communication.</p>"
         "<p>CPU runs are real: one MPI process per device, real kernels, real collectives, real bytes. Simulated runs "
         "put the same engine code on virtual devices (8 × MI300X, an H100 node) to see what a deployment you do not "
         "have would hold and how fast it would go. Every run is saved as a session you can reopen and compare.</p>"
         "<p>Pick an example, or set up a run on the left and press <b>Run</b>.</p>"),
      this);
  intro->setWordWrap(true);
  intro->setMaximumWidth(820);
  layout->addWidget(title);
  layout->addWidget(intro);
  layout->addSpacing(12);
  auto example = [&](Example e, const QString& name, const QString& what) {
    auto* b = new QCommandLinkButton(name, what, this);
    b->setMaximumWidth(820);
    connect(b, &QCommandLinkButton::clicked, this, [this, e] { emit exampleChosen(e); });
    layout->addWidget(b);
  };
  example(Example::TpVsTspLongContext, tr("TP against TSP at long context"),
          tr("llama2-7b in bf16 prefilling 32K tokens on a simulated node of 8 MI300X GPUs, under tp and under tsp, "
             "side by side: tsp splits the tokens as well as the weights, so each device holds a fraction of tp's "
             "activations, and streams the weight shards past its compute."));
  example(Example::Int8TextModel, tr("An int8 all-reduce on a model that writes English"),
          tr("brown-llama (trained on the Brown Corpus) answers \"The jury said that\" on 4 CPU ranks with its "
             "tensor-parallel all-reduces in fp32, int8 and int4: the wire bytes saved, and where each answer "
             "leaves fp32's."));
  example(Example::TrainTsp, tr("Training steps under tsp"),
          tr("brown-llama goes on training on Brown Corpus text, on 4 CPU ranks with folded tensor-and-sequence "
             "parallelism: the loss per step, gradients and optimizer state per device, and the weight shards "
             "circulating on the ring, forward and backward."));
  layout->addStretch(1);
}

PageNotice::PageNotice(QWidget* page, const QString& text, std::function<bool(const RunData&)> empty)
    : QLabel(page), m_empty(std::move(empty)) {
  setText(text);
  setWordWrap(true);
  setAlignment(Qt::AlignCenter);
  setAutoFillBackground(true);
  setMargin(80);
  setStyleSheet(QStringLiteral("color: palette(mid); font-size: 11pt;"));
  setGeometry(page->rect());
  page->installEventFilter(this);
  raise();
}

void PageNotice::refresh(const RunData& data) {
  const bool show = m_empty(data);
  if (show == isHidden()) setVisible(show);  // isHidden: hidden itself, not because its tab is
  if (show) raise();
}

bool PageNotice::eventFilter(QObject* watched, QEvent* event) {
  if (watched == parent() && event->type() == QEvent::Resize) setGeometry(parentWidget()->rect());
  return QLabel::eventFilter(watched, event);
}

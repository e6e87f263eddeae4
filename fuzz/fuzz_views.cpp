// The explorer's side of the stream: records that passed the Reader go into
// RunData, and every page of a run draws them offscreen -- memory, timeline,
// placement, summary, quantization, training, scaling, and the comparison of the run
// with itself -- as they would after a
// recorded run is opened. The pages must cope with whatever the Reader lets
// through: ranks, times and sizes anywhere in their types' ranges.
#include <QApplication>
#include <QImage>
#include <QPainter>

#include "fuzz_support.h"
#include "compare.h"
#include "pages.h"
#include "rundata.h"
#include "scaling_page.h"
#include "training.h"

namespace {

struct Pages {
  RunData data;
  std::vector<QWidget*> widgets;
  MemoryPage* memory;
  TimelineView* timeline;
  PlacementPage* placement;
  SummaryPage* summary;
  QuantizationPage* quantization;
  TrainingPage* training;
  ScalingPage* scaling;
  Pages() {
    widgets = {memory = new MemoryPage(data), timeline = new TimelineView(data), placement = new PlacementPage(data),
               summary = new SummaryPage(data), quantization = new QuantizationPage(data),
               training = new TrainingPage(data), scaling = new ScalingPage(data)};
    for (QWidget* w : widgets) w->resize(480, 320);
  }
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  qputenv("QT_QPA_PLATFORM", "offscreen");
  static QApplication app(*argc, *argv);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Pages pages;
  ss::proto::Reader reader;
  std::vector<ss::proto::Event> events;
  reader.feed(std::string_view(reinterpret_cast<const char*>(data), size),
              [&](ss::proto::Event&& e) { events.push_back(std::move(e)); }, [](const std::string&) {});
  reader.finish([&](ss::proto::Event&& e) { events.push_back(std::move(e)); }, [](const std::string&) {});
  pages.data.clear();
  pages.data.add(std::move(events));
  pages.memory->refresh();
  pages.timeline->resetZoom();
  pages.placement->refresh();
  pages.summary->refresh();
  pages.quantization->refresh();
  pages.training->refresh();
  pages.scaling->refresh();
  (void)pages.scaling->csv();
  for (auto& p : pages.data.scalePoints()) (void)ScalingPage::runArguments(pages.data.config(), p);
  QImage image(480, 320, QImage::Format_ARGB32);
  auto shared = std::make_shared<const RunData>(pages.data);
  ComparePage compare({{QStringLiteral("a"), shared}, {QStringLiteral("b"), shared}});
  compare.resize(480, 320);
  std::vector<QWidget*> all = pages.widgets;
  all.push_back(&compare);
  for (QWidget* w : all) {
    QPainter p(&image);
    w->render(&p);
  }
  return 0;
}

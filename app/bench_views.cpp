// shardscope-bench-views STREAM: feeds a recorded stream through EngineClient
// into RunData and the pages, as the window does, and prints events ingested
// per second, the longest event-loop stall, and the timeline's redraw time
// with every span of the run in view.
#include <QApplication>
#include <QElapsedTimer>
#include <QImage>
#include <QTimer>

#include <cstdio>

#include "engineclient.h"
#include "pages.h"
#include "rundata.h"
#include "stallmeter.h"

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: shardscope-bench-views STREAM.jsonl  (record one with shardscope-engine --events)\n");
    return 2;
  }
  RunData data;
  EngineClient client;
  MemoryPage memory(data);
  PlacementPage placement(data);
  SummaryPage summary(data);
  TimelineView timeline(data);
  for (QWidget* w : std::initializer_list<QWidget*>{&memory, &placement, &summary, &timeline}) w->resize(1400, 800);
  QObject::connect(&client, &EngineClient::eventsReceived, [&](const EventBatch& b) { data.add(*b); });

  // The window's redraw policy: at most 10 refreshes a second.
  QTimer redraw;
  redraw.setInterval(100);
  QObject::connect(&redraw, &QTimer::timeout, [&] {
    memory.refresh();
    placement.refresh();
    summary.refresh();
  });
  StallMeter stalls(1);
  RunOutcome outcome;
  QObject::connect(&client, &EngineClient::finished, [&](const RunOutcome& o) {
    outcome = o;
    app.quit();
  });
  QElapsedTimer wall;
  wall.start();
  redraw.start();
  stalls.start();
  client.openFile(QString::fromLocal8Bit(argv[1]));
  app.exec();
  const double secs = wall.nsecsElapsed() * 1e-9;
  stalls.stop();
  redraw.stop();
  memory.refresh();
  placement.refresh();
  summary.refresh();

  int64_t spans = 0;
  for (auto& [r, d] : data.ranks()) spans += int64_t(d.spans.size());
  timeline.resetZoom();
  QImage canvas(timeline.size(), QImage::Format_ARGB32_Premultiplied);
  timeline.render(&canvas);  // warm up
  QElapsedTimer draw;
  draw.start();
  constexpr int kDraws = 5;
  for (int i = 0; i < kDraws; ++i) timeline.render(&canvas);
  const double draw_ms = draw.nsecsElapsed() * 1e-6 / kDraws;

  std::printf("stream: %s (%s)\n", argv[1], qPrintable(outcome.status));
  std::printf("events ingested: %lld in %.2f s = %.0f events/s (rejected lines: %lld)\n",
              static_cast<long long>(data.events()), secs, data.events() / secs, static_cast<long long>(outcome.rejected));
  std::printf("longest event-loop stall while ingesting: %.1f ms\n", stalls.longestMs());
  std::printf("timeline redraw with all %lld spans in view: %.1f ms (%d x %d)\n", static_cast<long long>(spans),
              draw_ms, timeline.width(), timeline.height());
  std::printf("goals: >= 200000 events/s, no stall over 50 ms, timeline redraw under 30 ms\n");
  return outcome.crashed ? 1 : 0;
}

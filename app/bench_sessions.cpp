// shardscope-bench-sessions [STREAM]: the session store's speed on a real
// engine stream of about a million events (by default a simulated 8-device
// llama2-7b run, made here with shardscope-engine simulate). Prints, from one
// run on this machine:
//   - events saved per second by the recorder thread, and the longest stall
//     of the window's event loop while it saves;
//   - the time to open one such session into the window's pages;
//   - the time to build the compare view of four such sessions;
//   - the database size per million events.
#include <QApplication>
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QMetaObject>
#include <QProcess>
#include <QTemporaryDir>
#include <QThread>
#include <QTimer>

#include "pages.h"

#include <cstdio>

#include "compare.h"
#include "engineclient.h"
#include "mainwindow.h"
#include "sessionrecorder.h"
#include "sessionstore.h"
#include "stallmeter.h"

namespace {
struct Parsed {
  std::vector<QByteArray> raw;  // whole lines, one chunk per batch
  std::vector<EventBatch> batches;
  qint64 events = 0;
};

// Splits the stream into the batches EngineClient would emit (64 KiB reads).
Parsed parse(const QByteArray& stream) {
  Parsed p;
  ss::proto::Reader reader;
  for (qsizetype i = 0; i < stream.size();) {
    qsizetype end = std::min(stream.size(), i + (64 << 10));
    const qsizetype nl = stream.lastIndexOf('\n', end - 1);
    if (nl >= i) end = nl + 1;
    const QByteArray chunk = stream.mid(i, end - i);
    auto batch = std::make_shared<std::vector<ss::proto::Event>>();
    reader.feed(std::string_view(chunk.constData(), size_t(chunk.size())),
                [&](ss::proto::Event&& e) { batch->push_back(std::move(e)); }, [](const std::string&) {});
    p.events += qint64(batch->size());
    p.raw.push_back(chunk);
    p.batches.push_back(batch);
    i = end;
  }
  return p;
}
}  // namespace

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  QTemporaryDir dir;
  QString streamPath = argc > 1 ? QString::fromLocal8Bit(argv[1]) : QString();
  if (streamPath.isEmpty()) {
    streamPath = dir.filePath("sim.jsonl");
    const QStringList args = {"simulate", "--hardware", "h100-sxm", "--model", "llama2-7b", "--strategy", "tp",
                              "--devices", "8", "--prompt-len", "1024", "--decode", "150", "--events", streamPath};
    std::printf("stream: shardscope-engine %s\n", qPrintable(args.join(' ')));
    QProcess engine;
    engine.start(EngineClient::enginePath(), args);
    if (!engine.waitForFinished(600000) || engine.exitCode() != 0) {
      std::fprintf(stderr, "bench-sessions: the engine failed: %s\n", engine.readAllStandardError().constData());
      return 1;
    }
  }
  QFile f(streamPath);
  if (!f.open(QIODevice::ReadOnly)) {
    std::fprintf(stderr, "bench-sessions: cannot read %s\n", qPrintable(streamPath));
    return 2;
  }
  const QByteArray stream = f.readAll();
  const Parsed parsed = parse(stream);
  std::printf("stream: %lld events, %.1f MiB, %zu batches\n", (long long)parsed.events, stream.size() / 1048576.0,
              parsed.raw.size());
  const QString db = dir.filePath("bench.db");

  // 1. Saving: the window hands batches to the recorder thread as fast as
  // they come; a 2 ms ticker on the window's thread measures its stalls.
  QThread thread;
  auto* recorder = new SessionRecorder(db);
  recorder->moveToThread(&thread);
  thread.start();
  QElapsedTimer clock;
  StallMeter stalls(2);
  bool done = false;
  QObject::connect(recorder, &SessionRecorder::finished, &app, [&] { done = true; });
  QObject::connect(recorder, &SessionRecorder::failed, &app,
                   [&](const QString& m) { std::fprintf(stderr, "bench-sessions: %s\n", qPrintable(m)); });
  QMetaObject::invokeMethod(recorder, "begin", Qt::QueuedConnection, Q_ARG(QString, QStringLiteral("bench")),
                            Q_ARG(QStringList, QStringList()));
  clock.start();
  stalls.start();
  // The batches go out a few per turn of the event loop, as readyRead would.
  size_t next = 0;
  QTimer feed;
  feed.setInterval(0);
  QObject::connect(&feed, &QTimer::timeout, [&] {
    for (int k = 0; k < 8 && next < parsed.raw.size(); ++k, ++next)
      QMetaObject::invokeMethod(recorder, "add", Qt::QueuedConnection, Q_ARG(QByteArray, parsed.raw[next]),
                                Q_ARG(EventBatch, parsed.batches[next]));
    if (next == parsed.raw.size()) {
      feed.stop();
      QMetaObject::invokeMethod(recorder, "finish", Qt::QueuedConnection, Q_ARG(QString, QStringLiteral("ok")));
    }
  });
  feed.start();
  while (!done) app.processEvents(QEventLoop::WaitForMoreEvents, 50);
  const double saveS = clock.nsecsElapsed() * 1e-9;
  stalls.stop();
  thread.quit();
  thread.wait();
  std::printf("save:    %.2f s for %lld events = %.0f events/s (goal >= 200000); longest window stall %.1f ms\n", saveS,
              (long long)parsed.events, parsed.events / saveS, stalls.longestMs());
  // Three more copies for the comparison (saved directly, not timed).
  {
    SessionStore store;
    store.open(db);
    for (int c = 0; c < 3; ++c) {
      const qint64 id = store.create(QStringLiteral("copy %1").arg(c + 1));
      for (size_t i = 0; i < parsed.raw.size(); ++i) {
        std::vector<const ss::proto::Event*> events;
        for (auto& e : *parsed.batches[i]) events.push_back(&e);
        store.append(id, parsed.raw[i], events);
      }
      store.finish(id, "ok");
    }
  }
  const double mib = QFileInfo(db).size() / 1048576.0 + QFileInfo(db + "-wal").size() / 1048576.0;
  std::printf("size:    %.1f MiB for 4 sessions = %.1f MiB per million events (goal <= 100 MB); stream %.1f MiB "
              "per million\n",
              mib, mib / (4.0 * parsed.events) * 1e6, stream.size() / 1048576.0 / parsed.events * 1e6);

  {
    clock.restart();
    SessionStore check;
    check.open(db, SessionStore::Mode::ReadOnly);
    std::printf("db open: %.2f s to open and check the %.0f MiB database\n", clock.nsecsElapsed() * 1e-9, mib);
  }
  // 2. Opening one session into the window's pages (drawn once).
  MainWindow window(nullptr, dir.filePath("bench.db"));
  window.resize(1400, 820);
  window.show();
  const auto sessions = window.sessionStore()->list();
  app.processEvents();
  clock.restart();
  window.openSession(sessions[0].id);
  window.pages()->setCurrentWidget(window.findChild<TimelineView*>());  // the heaviest page
  window.repaint();
  const double openS = clock.nsecsElapsed() * 1e-9;
  std::printf("open:    %.2f s to open %lld events into the pages (goal <= 2 s)\n", openS, (long long)parsed.events);

  // 3. Comparing four such sessions, the window built and drawn once.
  clock.restart();
  ComparePage* page = window.compareSessions({sessions[0].id, sessions[1].id, sessions[2].id, sessions[3].id});
  page->window()->repaint();
  const double compareS = clock.nsecsElapsed() * 1e-9;
  std::printf("compare: %.2f s to compare 4 sessions of %lld events each (goal <= 3 s)\n", compareS,
              (long long)parsed.events);
  return 0;
}

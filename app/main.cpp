// shardscope: the explorer.
#include <QApplication>
#include <QCommandLineParser>
#include <QTextDocumentFragment>
#include <QTimer>

#include <cstdio>

#include "compare.h"
#include "mainwindow.h"

// Without a display, Qt cannot open a window and aborts. Help, version and
// the batch modes (--run-once, --screenshot) need none: they draw offscreen.
// Anything else says what to do instead, in one line.
static bool prepareDisplay(int argc, char** argv) {
  if (qEnvironmentVariableIsSet("QT_QPA_PLATFORM") || qEnvironmentVariableIsSet("DISPLAY") ||
      qEnvironmentVariableIsSet("WAYLAND_DISPLAY"))
    return true;
  for (int i = 1; i < argc; ++i) {
    const QByteArray a = argv[i];
    if (a == "-h" || a == "--help" || a == "-v" || a == "--version" || a == "--run-once" || a == "--screenshot" ||
        a.startsWith("--screenshot=")) {
      qputenv("QT_QPA_PLATFORM", "offscreen");
      return true;
    }
  }
  std::fprintf(stderr,
               "shardscope: no display (DISPLAY and WAYLAND_DISPLAY are unset): run it from a desktop session, under "
               "xvfb-run, or use --run-once/--screenshot for a headless run\n");
  return false;
}

int main(int argc, char** argv) {
  if (!prepareDisplay(argc, argv)) return 2;
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("ShardScope"));
  QApplication::setApplicationVersion(QStringLiteral(SHARDSCOPE_APP_VERSION));
  QCommandLineParser cli;
  cli.setApplicationDescription(QStringLiteral("Explorer and simulator for model parallelism"));
  cli.addHelpOption();
  cli.addVersionOption();
  QCommandLineOption runOnce(QStringLiteral("run-once"), QStringLiteral("run the default setup once, print the summary and quit"));
  QCommandLineOption screenshot(QStringLiteral("screenshot"),
                                QStringLiteral("with --run-once, --open or --open-session: save a PNG of each page as FILE-<page>.png "
                                               "and quit; with --compare: FILE-compare.png"),
                                QStringLiteral("file"));
  QCommandLineOption replay(QStringLiteral("open"), QStringLiteral("open a recorded stream"), QStringLiteral("file"));
  QCommandLineOption db(QStringLiteral("db"),
                        QStringLiteral("the session database (default: $SHARDSCOPE_DB, else the app-data folder)"),
                        QStringLiteral("file"));
  cli.addOption(db);
  // Not --session: QGuiApplication takes -session and --session for itself
  // (the desktop's session manager) before this parser sees them.
  QCommandLineOption session(QStringLiteral("open-session"),
                             QStringLiteral("open a saved session by its id (its setup fills the form)"),
                             QStringLiteral("id"));
  QCommandLineOption compare(QStringLiteral("compare"),
                             QStringLiteral("compare 2-4 saved sessions, e.g. --compare 1,2 (with --screenshot: save "
                                            "FILE-compare.png and quit)"),
                             QStringLiteral("ids"));
  cli.addOption(session);
  cli.addOption(compare);
  cli.addOption(runOnce);
  cli.addOption(screenshot);
  cli.addOption(replay);
  cli.addPositionalArgument(QStringLiteral("setup"),
                            QStringLiteral("with --run-once: six values, model backend strategy devices prompt "
                                           "decode, e.g. small-llama cpu tsp 4 256 8 (backend: cpu or sim:PROFILE)"),
                            QStringLiteral("[model backend strategy devices prompt decode]"));
  cli.process(app);

  MainWindow w(nullptr, cli.value(db));
  w.show();
  // Every page as FILE-<page>.png (after a run, a replay or a comparison).
  auto savePages = [&] {
    for (int i = 0; i < w.pages()->count(); ++i) {
      w.pages()->setCurrentIndex(i);
      QApplication::processEvents();
      const QString page = w.pages()->tabText(i).toLower().replace(' ', '-');
      w.grab().save(cli.value(screenshot) + "-" + page + ".png");
    }
  };
  if (cli.isSet(replay)) {
    if (cli.isSet(screenshot) && !cli.isSet(runOnce) && !cli.isSet(compare))
      QObject::connect(w.client(), &EngineClient::finished, &app, [&](const RunOutcome& o) {
        savePages();
        QApplication::exit(o.crashed ? 1 : 0);
      });
    w.openStream(cli.value(replay));
  }
  if (cli.isSet(session)) {
    if (!w.openSession(cli.value(session).toLongLong())) {
      std::fprintf(stderr, "shardscope: no session %s in the database\n", qPrintable(cli.value(session)));
      return 2;
    }
    if (cli.isSet(screenshot) && !cli.isSet(compare) && !cli.isSet(runOnce)) {
      savePages();
      return 0;
    }
  }
  if (cli.isSet(compare)) {
    QList<qint64> ids;
    for (const QString& id : cli.value(compare).split(',', Qt::SkipEmptyParts)) {
      bool number = false;
      ids << id.trimmed().toLongLong(&number);
      if (!number || !w.hasSession(ids.back())) {
        std::fprintf(stderr, "shardscope: --compare %s: no session %s in the database (the Sessions page lists them)\n",
                     qPrintable(cli.value(compare)), qPrintable(id.trimmed()));
        return 2;
      }
    }
    ComparePage* page = w.compareSessions(ids);
    if (!page) {
      std::fprintf(stderr, "shardscope: --compare takes 2 to 4 saved session ids, e.g. --compare 1,2\n");
      return 2;
    }
    std::printf("%s", qPrintable(page->tableText()));
    if (cli.isSet(screenshot)) {
      page->window()->resize(1500, 950);
      QApplication::processEvents();
      page->window()->grab().save(cli.value(screenshot) + "-compare.png");
      return 0;
    }
  }
  if (cli.isSet(runOnce)) {
    const QStringList p = cli.positionalArguments();
    if (!p.isEmpty() && p.size() != 6) {
      std::fprintf(stderr, "shardscope: --run-once takes six values (model backend strategy devices prompt decode, "
                           "e.g. small-llama cpu tsp 4 256 8), or none for the default setup; got %d\n",
                   int(p.size()));
      return 2;
    }
    if (p.size() == 6) {
      const QString problem = w.setSetup(p[0], p[1], p[2], p[3].toInt(), p[4].toInt(), p[5].toInt());
      if (!problem.isEmpty()) {
        std::fprintf(stderr, "shardscope: %s\n", qPrintable(problem));
        return 2;
      }
    }
    QObject::connect(&w, &MainWindow::runFinished, &app, [&](const RunOutcome& o) {
      std::printf("%s\n", qPrintable(w.summaryText()));
      if (cli.isSet(screenshot)) savePages();
      QApplication::exit(o.exitCode == 0 && !o.crashed ? 0 : 1);
    });
    // Run once the engine has checked the setup; an invalid one is refused
    // before anything starts, with the engine's reason.
    auto* start = new QTimer(&w);
    start->setInterval(50);
    QObject::connect(start, &QTimer::timeout, &w, [&w, start] {
      if (w.checking()) return;
      start->stop();
      if (!w.setupValid()) {
        std::fprintf(stderr, "shardscope: %s\n", qPrintable(QTextDocumentFragment::fromHtml(w.verdictText()).toPlainText()));
        QApplication::exit(2);
        return;
      }
      w.runOnce();
    });
    start->start();
  }
  return QApplication::exec();
}

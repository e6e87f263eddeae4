// shardscope: the explorer.
#include <QApplication>
#include <QCommandLineParser>
#include <QTimer>

#include <cstdio>

#include "compare.h"
#include "mainwindow.h"

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("ShardScope"));
  QApplication::setApplicationVersion(QStringLiteral(SHARDSCOPE_APP_VERSION));
  QCommandLineParser cli;
  cli.setApplicationDescription(QStringLiteral("Explorer and simulator for model parallelism"));
  cli.addHelpOption();
  cli.addVersionOption();
  QCommandLineOption runOnce(QStringLiteral("run-once"), QStringLiteral("run the default setup once, print the summary and quit"));
  QCommandLineOption screenshot(QStringLiteral("screenshot"),
                                QStringLiteral("with --run-once: save a PNG of each page as FILE-<page>.png"),
                                QStringLiteral("file"));
  QCommandLineOption replay(QStringLiteral("open"), QStringLiteral("open a recorded stream"), QStringLiteral("file"));
  QCommandLineOption db(QStringLiteral("db"),
                        QStringLiteral("the session database (default: $SHARDSCOPE_DB, else the app-data folder)"),
                        QStringLiteral("file"));
  cli.addOption(db);
  QCommandLineOption session(QStringLiteral("session"), QStringLiteral("open a saved session by its id"),
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
  cli.addPositionalArgument(QStringLiteral("engine-args"),
                            QStringLiteral("with --run-once: the setup as engine arguments (model backend strategy "
                                           "devices prompt decode), e.g. small-llama cpu tsp 4 256 8"));
  cli.process(app);

  MainWindow w(nullptr, cli.value(db));
  w.show();
  if (cli.isSet(replay)) w.openStream(cli.value(replay));
  if (cli.isSet(session) && !w.openSession(cli.value(session).toLongLong())) {
    std::fprintf(stderr, "shardscope: no session %s in the database\n", qPrintable(cli.value(session)));
    return 2;
  }
  if (cli.isSet(compare)) {
    QList<qint64> ids;
    for (const QString& id : cli.value(compare).split(',', Qt::SkipEmptyParts)) ids << id.toLongLong();
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
    if (p.size() == 6) w.setSetup(p[0], p[1], p[2], p[3].toInt(), p[4].toInt(), p[5].toInt());
    QObject::connect(&w, &MainWindow::runFinished, &app, [&](const RunOutcome& o) {
      std::printf("%s\n", qPrintable(w.summaryText()));
      if (cli.isSet(screenshot)) {
        for (int i = 0; i < w.pages()->count(); ++i) {
          w.pages()->setCurrentIndex(i);
          QApplication::processEvents();
          const QString page = w.pages()->tabText(i).toLower().replace(' ', '-');
          w.grab().save(cli.value(screenshot) + "-" + page + ".png");
        }
      }
      QApplication::exit(o.exitCode == 0 && !o.crashed ? 0 : 1);
    });
    QTimer::singleShot(0, &w, &MainWindow::runOnce);
  }
  return QApplication::exec();
}

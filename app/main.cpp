// shardscope: the explorer.
#include <QApplication>
#include <QCommandLineParser>
#include <QTimer>

#include <cstdio>

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
  QCommandLineOption screenshot(QStringLiteral("screenshot"), QStringLiteral("with --run-once: save a PNG of the window"), QStringLiteral("file"));
  cli.addOption(runOnce);
  cli.addOption(screenshot);
  cli.process(app);

  MainWindow w;
  w.show();
  if (cli.isSet(runOnce)) {
    QObject::connect(&w, &MainWindow::runFinished, &app, [&](const RunOutcome& o) {
      std::printf("%s\n", qPrintable(w.summaryText()));
      if (cli.isSet(screenshot)) w.grab().save(cli.value(screenshot));
      QApplication::exit(o.exitCode == 0 && !o.crashed ? 0 : 1);
    });
    QTimer::singleShot(0, &w, &MainWindow::runOnce);
  }
  return QApplication::exec();
}

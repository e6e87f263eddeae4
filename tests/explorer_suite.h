// What the explorer's two suites share: tst_explorer (the window, its setup
// check, runs and their failures, comparisons, training mode) and
// tst_explorer_pages (each page drawn from a stream: one the engine wrote or
// one written by hand).
#pragma once
#include <QCheckBox>
#include <QCommandLinkButton>
#include <qcustomplot.h>
#include <QJsonDocument>
#include <QJsonObject>
#include <QSignalSpy>
#include <QTabWidget>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QtTest>

#include <functional>
#include <limits>
#include <vector>

#include "engineclient.h"
#include "compare.h"
#include "mainwindow.h"
#include "pages.h"
#include "scaling_page.h"
#include "rundata.h"
#include "startpage.h"
#include "training.h"

// Runs the engine through an EngineClient and collects everything it emits.
struct Collected {
  RunData data;
  RunOutcome outcome;
  QStringList rejected;
};

inline bool drive(EngineClient& client, Collected& c, const std::function<void()>& start) {
  QObject::connect(&client, &EngineClient::eventsReceived, [&](const EventBatch& b) { c.data.add(*b); });
  QObject::connect(&client, &EngineClient::lineRejected, [&](const QString& r) { c.rejected << r; });
  QSignalSpy done(&client, &EngineClient::finished);
  start();
  if (done.isEmpty() && !done.wait(120000)) return false;
  c.outcome = done.takeFirst().at(0).value<RunOutcome>();
  return true;
}

// A stream written by hand: its hello, the run's strategy on its devices,
// then `rest`.
inline std::vector<ss::proto::Event> handWritten(const char* strategy, int devices, std::vector<ss::proto::Event> rest) {
  std::vector<ss::proto::Event> out{ss::proto::Hello{1, "test", "here"},
                                    ss::proto::Config{{{"strategy", strategy}, {"devices", devices}}}};
  out.insert(out.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
  return out;
}

// The engine the suites built, and a session database of their own (never
// the user's sessions): each suite's initTestCase.
inline void useBuiltEngineAndScratchSessions(const QTemporaryDir& db) {
  qputenv("SHARDSCOPE_ENGINE", SHARDSCOPE_ENGINE_BIN);
  qputenv("SHARDSCOPE_DB", db.filePath("sessions.db").toUtf8());
}

// Runs the engine with `args` to its end, its events written to `stream`:
// empty, or why it did not end well.
inline QString engineWrote(const QStringList& args, const QString& stream, int ms = 120000) {
  QProcess p;
  p.start(SHARDSCOPE_ENGINE_BIN, args + QStringList{"--events", stream});
  if (!p.waitForFinished(ms)) return "the engine did not end within " + QString::number(ms / 1000) + " s";
  const QString err = QString::fromUtf8(p.readAllStandardError());
  if (p.exitStatus() != QProcess::NormalExit) return "the engine crashed: " + err;  // (its exit code means nothing)
  if (p.exitCode() != 0) return "the engine ended with " + QString::number(p.exitCode()) + ": " + err;
  return QString();
}

// Opens a stream in the window and waits until it has been read.
inline bool openedIn(MainWindow& w, const QString& stream) {
  QSignalSpy done(w.client(), &EngineClient::finished);
  return w.openStream(stream) && done.wait(60000);
}

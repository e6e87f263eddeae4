// Running shardscope-engine from a test and reading its event stream, shared
// by the suites that drive the command line.
#pragma once

#include <QByteArray>
#include <QFile>
#include <QProcess>
#include <QStandardPaths>
#include <QString>
#include <QStringList>

#include <map>
#include <string>
#include <vector>

#include "protocol/events.h"

// QSKIP returns only from the function it is written in, so a helper that
// decides a row cannot run returns why (empty: it runs) and the test function
// itself skips: SKIP_IF(why_not_here(...)).
#define SKIP_IF(why)                                 \
  do {                                               \
    const QString skip_why_ = (why);                 \
    if (!skip_why_.isEmpty()) QSKIP(qPrintable(skip_why_)); \
  } while (0)

struct Ran {
  int exit_code = -1;
  bool crashed = false;    // killed, crashed, or timed out
  bool timed_out = false;  // killed after timeout_ms
  QByteArray out, err;
};

// Runs the engine binary with `args` (and `env` added to this process's
// environment); a run past `timeout_ms` is killed.
inline Ran engine(const QStringList& args, int timeout_ms = 120000,
                  const QList<std::pair<QString, QString>>& env = {}) {
  QProcess p;
  if (!env.isEmpty()) {
    QProcessEnvironment e = QProcessEnvironment::systemEnvironment();
    for (auto& [name, value] : env) e.insert(name, value);
    p.setProcessEnvironment(e);
  }
  p.start(SHARDSCOPE_ENGINE_BIN, args);
  Ran r;
  if (!p.waitForFinished(timeout_ms)) {
    p.kill();
    p.waitForFinished();
    r.timed_out = r.crashed = true;
  }
  r.crashed = r.crashed || p.exitStatus() != QProcess::NormalExit;
  r.exit_code = p.exitCode();
  r.out = p.readAllStandardOutput();
  r.err = p.readAllStandardError();
  return r;
}

struct Stream {
  std::vector<ss::proto::Event> events;
  std::vector<std::string> errors;  // the reader's reasons for rejected lines
  int64_t rejected = 0;

  template <class T>
  std::vector<const T*> all() const {
    std::vector<const T*> out;
    for (auto& e : events)
      if (auto* x = std::get_if<T>(&e)) out.push_back(x);
    return out;
  }
  const ss::proto::Done* done() const {
    return events.empty() ? nullptr : std::get_if<ss::proto::Done>(&events.back());
  }
  // Every metric by name (a later record of the same name wins).
  std::map<std::string, double> metrics() const {
    std::map<std::string, double> m;
    for (auto* x : all<ss::proto::Metric>()) m[x->name] = x->value;
    return m;
  }
  // Per-rank metrics (records with a rank field), by rank then name.
  std::map<int, std::map<std::string, double>> rank_metrics() const {
    std::map<int, std::map<std::string, double>> m;
    for (auto* x : all<ss::proto::Metric>())
      if (x->rank >= 0) m[x->rank][x->name] = x->value;
    return m;
  }
};

// Reads a stream the way the GUI does: in chunks, as they arrive.
inline Stream read_stream(const QByteArray& bytes, qsizetype chunk = 4096) {
  Stream s;
  ss::proto::Reader reader;
  auto on_event = [&](ss::proto::Event e) { s.events.push_back(std::move(e)); };
  auto on_error = [&](const std::string& m) { s.errors.push_back(m); };
  for (qsizetype at = 0; at < bytes.size(); at += chunk)
    reader.feed(std::string_view(bytes.constData() + at, size_t(std::min<qsizetype>(chunk, bytes.size() - at))),
                on_event, on_error);
  reader.finish(on_event, on_error);
  s.rejected = reader.rejected();
  return s;
}

// A stand-in for mpirun (for SHARDSCOPE_MPIRUN): a shell script in `dir`
// running `body`, where "$MPIRUN" is the real one. Empty where there is no
// mpirun or the script cannot be written.
inline QString stand_in_mpirun(const QString& dir, const QString& body) {
  const QString mpirun = QStandardPaths::findExecutable("mpirun");
  const QString script = dir + "/mpirun";
  QFile f(script);
  if (mpirun.isEmpty() || !f.open(QIODevice::WriteOnly)) return {};
  f.write(QString("#!/bin/sh\nMPIRUN='%1'\n%2").arg(mpirun, body).toUtf8());
  f.close();
  return f.setPermissions(f.permissions() | QFileDevice::ExeOwner) ? script : QString();
}

// An engine's stderr as one trimmed string (the one line bad input gets).
inline QString one_line(const QByteArray& err) { return QString::fromUtf8(err).trimmed(); }

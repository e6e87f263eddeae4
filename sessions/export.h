// Exports of a session's events: a Chrome/Perfetto trace (Trace Event
// Format, JSON object form), CSV of the derived tables, and a checker of the
// trace format used by the tests and before writing.
//
// Trace Event Format facts used here (the format's public specification,
// "Trace Event Format" document by the Chromium project): timestamps and
// durations are microseconds; complete events have ph "X" with name, ts,
// dur, pid, tid; counters have ph "C" with name, ts, pid and numeric args
// (one track per arg); metadata events ph "M" named process_name or
// thread_name carry args.name for a pid (and tid).
#pragma once

#include <QByteArray>
#include <QString>

#include <vector>

#include "protocol/events.h"

// The trace: one process per rank ("device N · name"), a compute and a comm
// thread each, complete events for spans, counter tracks for memory per
// category.
QByteArray perfettoTrace(const std::vector<ss::proto::Event>& events);
// Empty if `json` is a well-formed trace as above; otherwise the first
// problem found, in one line.
QString checkTrace(const QByteArray& json);

// Writes spans.csv, memory.csv, metrics.csv, accuracy.csv and placement.csv
// into `dir` (created if needed). Returns an empty string or the error.
QString exportCsv(const std::vector<ss::proto::Event>& events, const QString& dir);

// Writes `data` to `path` through a temporary file renamed over it at the
// end, so a failed write never leaves half a file. Empty string or the error.
QString writeFileAtomically(const QString& path, const QByteArray& data);

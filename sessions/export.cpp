#include "export.h"

#include <QDir>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QSaveFile>
#include <QSet>

#include <map>
#include <set>

using namespace ss::proto;

namespace {
int tidOf(const std::string& stream) { return stream == "comm" ? 2 : 1; }

// CSV field: quoted when it holds a separator, quote or line break.
QByteArray csv(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return QByteArray::fromStdString(s);
  QByteArray q = QByteArray::fromStdString(s);
  q.replace("\"", "\"\"");
  return "\"" + q + "\"";
}
QByteArray num(double v) { return QByteArray::number(v, 'g', 17); }
QByteArray num(int64_t v) { return QByteArray::number(qint64(v)); }
}  // namespace

QByteArray perfettoTrace(const std::vector<Event>& events) {
  // Written by hand, not through QJsonDocument: a million spans would build
  // a million QJsonObjects.
  QByteArray out;
  out.reserve(int(std::min<size_t>(events.size() * 160, size_t(1) << 30)));
  out += "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  bool first = true;
  auto add = [&](const QByteArray& e) {
    if (!first) out += ",\n";
    first = false;
    out += e;
  };
  auto us = [](int64_t ns) { return QByteArray::number(double(ns) / 1000.0, 'f', 3); };
  auto str = [](const std::string& s) { return QByteArray::fromStdString(nlohmann::json(s).dump()); };
  std::map<int, std::string> devices;
  std::set<std::pair<int, int>> threads;
  for (const Event& e : events) {
    if (auto* d = std::get_if<Device>(&e)) devices[d->rank] = d->name;
    else if (auto* s = std::get_if<Span>(&e)) {
      const int tid = tidOf(s->stream);
      threads.insert({s->rank, tid});
      QByteArray args = "{\"site\":" + str(s->site) + ",\"layer\":" + num(int64_t(s->layer)) +
                        ",\"phase\":" + str(s->phase) + ",\"bytes\":" + num(s->bytes) + ",\"flops\":" + num(s->flops);
      if (!s->peers.empty()) {
        args += ",\"peers\":[";
        for (size_t i = 0; i < s->peers.size(); ++i) args += (i ? "," : "") + num(int64_t(s->peers[i]));
        args += "]";
      }
      args += "}";
      add("{\"name\":" + str(s->op) + ",\"cat\":" + str(s->stream) + ",\"ph\":\"X\",\"ts\":" + us(s->t0) +
          ",\"dur\":" + us(std::max<int64_t>(0, s->t1 - s->t0)) + ",\"pid\":" + num(int64_t(s->rank)) +
          ",\"tid\":" + num(int64_t(tid)) + ",\"args\":" + args + "}");
    } else if (auto* m = std::get_if<Mem>(&e)) {
      devices.emplace(m->rank, std::string());
      QByteArray args = "{";
      for (int c = 0; c < kCategoryCount; ++c)
        args += (c ? ",\"" : "\"") + QByteArray(kCategoryNames[c]) + "\":" + num(m->bytes[size_t(c)]);
      args += "}";
      add("{\"name\":\"memory (bytes)\",\"ph\":\"C\",\"ts\":" + us(m->t) + ",\"pid\":" + num(int64_t(m->rank)) +
          ",\"args\":" + args + "}");
    }
  }
  for (auto& [rank, tid] : threads) devices.emplace(rank, std::string());
  for (auto& [rank, name] : devices) {
    const std::string label = "device " + std::to_string(rank) + (name.empty() ? "" : " · " + name);
    add("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + num(int64_t(rank)) + ",\"args\":{\"name\":" +
        str(label) + "}}");
    add("{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + num(int64_t(rank)) +
        ",\"args\":{\"sort_index\":" + num(int64_t(rank)) + "}}");
  }
  for (auto& [rank, tid] : threads)
    add("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + num(int64_t(rank)) + ",\"tid\":" + num(int64_t(tid)) +
        ",\"args\":{\"name\":\"" + (tid == 2 ? "comm" : "compute") + "\"}}");
  out += "\n]}\n";
  return out;
}

QString checkTrace(const QByteArray& json) {
  QJsonParseError err;
  const QJsonDocument doc = QJsonDocument::fromJson(json, &err);
  if (err.error != QJsonParseError::NoError)
    return QStringLiteral("not JSON: %1 at offset %2").arg(err.errorString()).arg(err.offset);
  if (!doc.isObject() || !doc.object().value("traceEvents").isArray())
    return QStringLiteral("the top level must be an object with a traceEvents array");
  const QJsonArray events = doc.object().value("traceEvents").toArray();
  QSet<qint64> pids, namedPids;
  QSet<QPair<qint64, qint64>> tids, namedTids;
  auto isInt = [](const QJsonValue& v) { return v.isDouble() && v.toDouble() == double(qint64(v.toDouble())); };
  for (qsizetype i = 0; i < events.size(); ++i) {
    if (!events[i].isObject()) return QStringLiteral("event %1 is not an object").arg(i);
    const QJsonObject e = events[i].toObject();
    const QString ph = e.value("ph").toString();
    auto need = [&](const char* field) { return e.contains(QLatin1String(field)); };
    auto where = [&](const QString& what) { return QStringLiteral("event %1 (ph %2): %3").arg(i).arg(ph, what); };
    if (!e.value("name").isString() || e.value("name").toString().isEmpty()) return where("no name");
    if (!isInt(e.value("pid"))) return where("pid must be an integer");
    const qint64 pid = qint64(e.value("pid").toDouble());
    if (ph == QLatin1String("X")) {
      for (const char* f : {"ts", "dur", "tid"})
        if (!need(f)) return where(QStringLiteral("missing %1").arg(QLatin1String(f)));
      if (!e.value("ts").isDouble() || e.value("ts").toDouble() < 0) return where("ts must be a number >= 0 (µs)");
      if (!e.value("dur").isDouble() || e.value("dur").toDouble() < 0) return where("dur must be a number >= 0 (µs)");
      if (!isInt(e.value("tid"))) return where("tid must be an integer");
      if (e.contains("args") && !e.value("args").isObject()) return where("args must be an object");
      pids.insert(pid);
      tids.insert({pid, qint64(e.value("tid").toDouble())});
    } else if (ph == QLatin1String("C")) {
      if (!e.value("ts").isDouble() || e.value("ts").toDouble() < 0) return where("ts must be a number >= 0 (µs)");
      if (!e.value("args").isObject() || e.value("args").toObject().isEmpty())
        return where("a counter needs args with at least one value");
      for (const QJsonValue& v : e.value("args").toObject())
        if (!v.isDouble()) return where("counter values must be numbers");
      pids.insert(pid);
    } else if (ph == QLatin1String("M")) {
      const QString name = e.value("name").toString();
      const QJsonObject args = e.value("args").toObject();
      if (name == QLatin1String("process_name") || name == QLatin1String("thread_name")) {
        if (!args.value("name").isString() || args.value("name").toString().isEmpty())
          return where(QStringLiteral("%1 needs args.name").arg(name));
        if (name == QLatin1String("process_name")) namedPids.insert(pid);
        else {
          if (!isInt(e.value("tid"))) return where("thread_name needs an integer tid");
          namedTids.insert({pid, qint64(e.value("tid").toDouble())});
        }
      }
    } else {
      return where(QStringLiteral("unexpected phase '%1'").arg(ph));
    }
  }
  for (qint64 pid : pids)
    if (!namedPids.contains(pid)) return QStringLiteral("pid %1 has events but no process_name metadata").arg(pid);
  for (const auto& t : tids)
    if (!namedTids.contains(t))
      return QStringLiteral("pid %1 tid %2 has events but no thread_name metadata").arg(t.first).arg(t.second);
  return {};
}

QString writeFileAtomically(const QString& path, const QByteArray& data) {
  QSaveFile f(path);
  if (!f.open(QIODevice::WriteOnly)) return QStringLiteral("cannot write %1: %2").arg(path, f.errorString());
  if (f.write(data) != data.size() || !f.commit())
    return QStringLiteral("writing %1 failed: %2 (nothing was replaced)").arg(path, f.errorString());
  return {};
}

QString exportCsv(const std::vector<Event>& events, const QString& dir) {
  if (!QDir().mkpath(dir)) return QStringLiteral("cannot create the folder %1").arg(dir);
  QByteArray spans = "rank,stream,op,site,layer,phase,t0_ns,t1_ns,flops,bytes,peers,dims\n";
  QByteArray mem = "rank,t_ns";
  for (const char* c : kCategoryNames) mem += QByteArray(",") + c + "_bytes";
  mem += ",peak_bytes\n";
  QByteArray metrics = "rank,name,value,unit\n";
  QByteArray accuracy = "metric,site,layer,value,config\n";
  QByteArray placement = "rank,tensor,layer,shape,mode,axis,start,end,bytes,step\n";
  auto joined = [](const auto& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(v[i]);
    return s;
  };
  for (const Event& e : events) {
    if (auto* s = std::get_if<Span>(&e))
      spans += num(int64_t(s->rank)) + "," + csv(s->stream) + "," + csv(s->op) + "," + csv(s->site) + "," +
               num(int64_t(s->layer)) + "," + csv(s->phase) + "," + num(s->t0) + "," + num(s->t1) + "," +
               num(s->flops) + "," + num(s->bytes) + "," + csv(joined(s->peers)) + "," + csv(joined(s->dims)) + "\n";
    else if (auto* m = std::get_if<Mem>(&e)) {
      mem += num(int64_t(m->rank)) + "," + num(m->t);
      for (int64_t b : m->bytes) mem += "," + num(b);
      mem += "," + num(m->peak) + "\n";
    } else if (auto* mt = std::get_if<Metric>(&e))
      metrics += num(int64_t(mt->rank)) + "," + csv(mt->name) + "," + num(mt->value) + "," + csv(mt->unit) + "\n";
    else if (auto* a = std::get_if<Accuracy>(&e))
      accuracy += csv(a->metric) + "," + csv(a->site) + "," + num(int64_t(a->layer)) + "," + num(a->value) + "," +
                  csv(a->config) + "\n";
    else if (auto* p = std::get_if<Placement>(&e))
      placement += num(int64_t(p->rank)) + "," + csv(p->tensor) + "," + num(int64_t(p->layer)) + "," +
                   csv(joined(p->shape)) + "," + csv(p->mode) + "," + num(int64_t(p->axis)) + "," + num(p->start) +
                   "," + num(p->end) + "," + num(p->bytes) + "," + num(int64_t(p->step)) + "\n";
  }
  for (auto& [name, data] : {std::pair{"spans.csv", &spans}, std::pair{"memory.csv", &mem},
                             std::pair{"metrics.csv", &metrics}, std::pair{"accuracy.csv", &accuracy},
                             std::pair{"placement.csv", &placement}}) {
    const QString err = writeFileAtomically(QDir(dir).filePath(QLatin1String(name)), *data);
    if (!err.isEmpty()) return err;
  }
  return {};
}

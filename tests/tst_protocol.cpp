// The event stream v1 (engine/protocol): every record survives the writer and
// the reader unchanged, a newer stream is refused with a message that says to
// update, and bad lines are rejected, described and counted, never fatal.
#include <QtTest>
#include <cstdio>
#include <tuple>

#include "protocol/events.h"

using namespace ss::proto;

namespace {

// Every field of every record, so a field the writer drops or the reader
// ignores makes a round trip differ.
auto fields(const Hello& e) {
  return std::tie(e.version, e.engine_version, e.host);
}
auto fields(const Config& e) {
  return std::tie(e.config);
}
auto fields(const Device& e) {
  return std::tie(e.rank, e.kind, e.name, e.capacity, e.host);
}
auto fields(const Placement& e) {
  return std::tie(e.rank, e.tensor, e.layer, e.shape, e.mode, e.axis, e.start, e.end, e.bytes,
                  e.step);
}
auto fields(const Tokens& e) {
  return std::tie(e.rank, e.ranges);
}
auto fields(const Span& e) {
  return std::tie(e.rank, e.stream, e.op, e.site, e.layer, e.phase, e.t0, e.t1, e.flops, e.bytes,
                  e.peers, e.dims);
}
auto fields(const Mem& e) {
  return std::tie(e.rank, e.t, e.bytes, e.peak);
}
auto fields(const Metric& e) {
  return std::tie(e.name, e.value, e.unit, e.rank);
}
auto fields(const Phase& e) {
  return std::tie(e.name, e.t);
}
auto fields(const Accuracy& e) {
  return std::tie(e.metric, e.site, e.layer, e.value);
}
auto fields(const Error& e) {
  return std::tie(e.code, e.rank, e.message, e.detail);
}
auto fields(const Generation& e) { return std::tie(e.config, e.tokens, e.text, e.partial, e.pieces); }
auto fields(const Prompt& e) { return std::tie(e.text, e.ids); }
auto fields(const TrainStep& e) {
  return std::tie(e.step, e.loss, e.grad_norm, e.lr, e.tokens, e.tokens_per_s, e.peak);
}
auto fields(const ScalePoint& e) {
  return std::tie(e.strategy, e.mesh, e.mode, e.seq_len, e.micro_batch, e.devices, e.nodes, e.reason, e.peak_bytes,
                  e.peak_rank, e.bytes, e.capacity, e.fits, e.step_s, e.tokens_per_s, e.mfu, e.comm_activation_bytes,
                  e.comm_weight_bytes, e.hidden_fraction, e.max_micro_batch, e.textbook);
}
auto fields(const Done& e) {
  return std::tie(e.status, e.t, e.exit_code);
}

bool same(const Event& a, const Event& b) {
  if (a.index() != b.index()) return false;
  return std::visit(
      [&](const auto& x) { return fields(x) == fields(std::get<std::decay_t<decltype(x)>>(b)); },
      a);
}

const char* kHelloLine = R"({"type":"hello","protocol":"shardscope-events","version":1})";

// One sample of each record type and variant, every field away from its default.
std::vector<std::pair<const char*, Event>> samples() {
  Placement split;
  split.rank = 3;
  split.tensor = "model.layers.7.self_attn.q_proj.weight";
  split.layer = 7;
  split.shape = {4096, 4096};
  split.mode = "split";
  split.axis = 0;
  split.start = 1024;
  split.end = 2048;
  split.bytes = 1024LL * 4096 * 2;
  split.step = 2;
  Placement mirrored;
  mirrored.rank = 1;
  mirrored.tensor = "model.norm.weight";
  mirrored.layer = -1;
  mirrored.shape = {4096};
  mirrored.mode = "mirrored";
  mirrored.bytes = 16384;
  Placement partial = mirrored;
  partial.tensor = "backbone.layers.0.mixer.x_proj.out";
  partial.layer = 0;
  partial.shape = {128, 48};
  partial.mode = "partial";
  partial.bytes = 128 * 48 * 4;
  partial.step = 0;

  Span comm;
  comm.rank = 2;
  comm.stream = "comm";
  comm.op = "all_reduce";
  comm.site = "mlp.down";
  comm.layer = 11;
  comm.phase = "decode";
  comm.t0 = 1'700'000'000'000'000'000;  // far from 0: ns timestamps can be large
  comm.t1 = comm.t0 + 12345;
  comm.flops = 0.5;
  comm.bytes = 3.25e9;
  comm.peers = {0, 1, 3};
  comm.dims = {1, 4096};
  Span compute;
  compute.rank = 0;
  compute.stream = "compute";
  compute.op = "gemm";
  compute.site = "q_proj";
  compute.layer = 0;
  compute.phase = "prefill";
  compute.t0 = 10;
  compute.t1 = 10;  // zero-length spans are allowed
  compute.flops = 2.0 * 128 * 4096 * 4096;
  compute.bytes = 1.0 / 3.0;  // a double that needs all 17 digits

  Mem mem;
  mem.rank = 5;
  mem.t = 987654321;
  mem.bytes = {1, 2, 3, 4, 5, int64_t(1) << 50, 7, 8};
  mem.peak = (int64_t(1) << 50) + 15;

  TrainStep step;
  step.step = 200;
  step.loss = 1.0 / 3.0;
  step.grad_norm = 0.75;
  step.lr = 3e-4;
  step.tokens = 8192;
  step.tokens_per_s = 12345.5;
  step.peak = {10, 20, 0, 0, 30, 40, 50, int64_t(1) << 40};

  ScalePoint point;
  point.strategy = "tp_sp";
  point.mesh = "2x4";
  point.mode = "train";
  point.seq_len = 131072;
  point.micro_batch = 2;
  point.devices = 8;
  point.nodes = 2;
  point.peak_bytes = (int64_t(1) << 38) + 36;
  point.peak_rank = 5;
  point.bytes = {1, 2, 3, 4, 5, 6, 7, (int64_t(1) << 38)};
  point.capacity = int64_t(192) << 30;
  point.step_s = 4.25;
  point.tokens_per_s = 1.0 / 3.0;
  point.mfu = 0.41;
  point.comm_activation_bytes = 1.5e11;
  point.comm_weight_bytes = 2.5e10;
  point.hidden_fraction = 0.25;
  point.max_micro_batch = 0;
  point.textbook = {{"parameters", 6738415616LL}, {"bytes", {{"weights", 12}}}};
  ScalePoint refused;
  refused.strategy = "tp";
  refused.mode = "infer";
  refused.seq_len = 4096;
  refused.devices = 4;
  refused.reason = "num_key_value_heads 2 does not split over 4 ranks";

  Error oom{
      "oom", 2, "out of memory: kv cache needs 2.00 GiB",
      nlohmann::json{
          {"category", "kv_cache"}, {"requested", 2147483648LL}, {"in_use", 7}, {"capacity", 8}}};
  Error plain{"format", -1, "model.safetensors: tensor 'x' is missing", nullptr};

  return {
      {"hello", Hello{1, "0.1.0", "node-01"}},
      {"config", Config{nlohmann::json{{"model", {{"name", "tiny-llama"}, {"hidden_size", 64}}},
                                       {"strategy", "tp"},
                                       {"devices", 4},
                                       {"ratios", {0.25, 1e-300, -3.5}}}}},
      {"device", Device{3, "cuda", "NVIDIA H200", 150'000'000'000, "gpu-host-2"}},
      {"placement split, transient step", split},
      {"placement mirrored", mirrored},
      {"placement partial", partial},
      {"tokens", Tokens{1, {{0, 16}, {48, 64}}}},
      {"tokens empty", Tokens{4, {}}},
      {"span comm", comm},
      {"span compute", compute},
      {"mem", mem},
      {"metric whole run", Metric{"ttft_ms", 12.625, "ms", -1}},
      {"metric per rank", Metric{"peak_bytes", 123456789.0, "bytes", 6}},
      {"phase", Phase{"prefill", 42}},
      {"accuracy", Accuracy{"rel_l2", "mlp.down", 3, 1.5e-4, "mlp=int8:128"}},
      {"generation", Generation{"mlp=int8:128", {17, 4, 255, 0}, std::nullopt, false, {}}},
      {"generation empty", Generation{"", {}, std::nullopt, false, {}}},
      {"generation with text, partial", Generation{"", {464, 3290}, " the cat", true, {" the", " cat"}}},
      {"generation, text of no tokens", Generation{"", {}, "", false, {}}},
      {"prompt", Prompt{"Caf\xC3\xA9 \"quoted\"\n", {0, 12, 9999}}},
      {"train_step", step},
      {"scale_point", point},
      {"scale_point not applicable", refused},
      {"error with detail", oom},
      {"error without detail", plain},
      {"done ok", Done{"ok", 99999, 0}},
      {"done oom", Done{"oom", 5, 3}},
      {"strings need escaping",
       Device{0, "cpu", "quote \" backslash \\ newline \n tab \t caf\xc3\xa9 \xe2\x88\x91", 0, ""}},
  };
}

// A reader that has seen a v1 hello, so it accepts records.
Reader opened_reader() {
  Reader r;
  r.parse_line(kHelloLine);
  return r;
}

}  // namespace

class TestProtocol : public QObject {
  Q_OBJECT

 private slots:
  void roundTrip_data() {
    QTest::addColumn<int>("index");
    auto all = samples();
    for (size_t i = 0; i < all.size(); ++i) QTest::newRow(all[i].first) << int(i);
  }
  void roundTrip() {
    QFETCH(int, index);
    const Event original = samples()[size_t(index)].second;
    const std::string line = to_line(original);
    QVERIFY2(line.find('\n') == std::string::npos, line.c_str());
    QCOMPARE(nlohmann::json::parse(line).at("type").get<std::string>(),
             std::string(type_name(original)));

    Reader reader = opened_reader();
    Reader::Result r = reader.parse_line(line);
    QVERIFY2(r.error.empty(), (r.error + ": " + line).c_str());
    QVERIFY(r.event.has_value());
    QVERIFY2(same(original, *r.event), (line + "\nread back as\n" + to_line(*r.event)).c_str());
    QCOMPARE(to_line(*r.event), line);
    QCOMPARE(reader.rejected(), int64_t(0));
    QCOMPARE(reader.accepted(), int64_t(2));
  }

  // What the Writer puts in a file, fed back in chunks of any size, gives the
  // same records in the same order.
  void writerThroughFeed_data() {
    QTest::addColumn<int>("chunk");
    for (int c : {1, 2, 7, 64, 4096, 1 << 20}) QTest::newRow(QByteArray::number(c)) << c;
  }
  void writerThroughFeed() {
    QFETCH(int, chunk);
    auto all = samples();
    std::FILE* f = std::tmpfile();
    QVERIFY(f);
    Writer w(f);
    for (auto& [name, e] : all) w.write(e);
    w.flush();
    std::string text(size_t(std::ftell(f)), '\0');
    std::rewind(f);
    QCOMPARE(std::fread(text.data(), 1, text.size(), f), text.size());
    std::fclose(f);

    Reader reader;
    std::vector<Event> got;
    std::vector<std::string> errors;
    auto on_event = [&](Event e) { got.push_back(std::move(e)); };
    auto on_error = [&](const std::string& m) { errors.push_back(m); };
    for (size_t at = 0; at < text.size(); at += size_t(chunk))
      reader.feed(std::string_view(text).substr(at, size_t(chunk)), on_event, on_error);
    reader.finish(on_event, on_error);
    QVERIFY2(errors.empty(), errors.empty() ? "" : errors.front().c_str());
    QCOMPARE(got.size(), all.size());
    for (size_t i = 0; i < all.size(); ++i) QVERIFY2(same(all[i].second, got[i]), all[i].first);
    QCOMPARE(reader.accepted(), int64_t(all.size()));
    QCOMPARE(reader.version(), 1);
  }

  void refusesNewerVersion_data() {
    QTest::addColumn<int>("version");
    QTest::newRow("2") << 2;
    QTest::newRow("17") << 17;
  }
  void refusesNewerVersion() {
    QFETCH(int, version);
    Reader reader;
    Reader::Result r = reader.parse_line(to_line(Hello{version, "9.0.0", "h"}));
    QVERIFY(!r.event);
    QVERIFY2(r.error.find("newer") != std::string::npos, r.error.c_str());
    QVERIFY2(r.error.find("update") != std::string::npos, r.error.c_str());
    QVERIFY2(r.error.find(std::to_string(version)) != std::string::npos, r.error.c_str());
    QVERIFY(reader.refused());
    QCOMPARE(reader.version(), 0);
    QCOMPARE(reader.accepted(), int64_t(0));

    // Nothing after the refused hello is read, even records that look like v1.
    int events = 0, errors = 0;
    reader.feed(
        std::string(kHelloLine) + "\n" + to_line(Phase{"load", 1}) + "\n", [&](Event) { ++events; },
        [&](const std::string&) { ++errors; });
    QCOMPARE(events, 0);
    QCOMPARE(errors, 0);
    QCOMPARE(reader.accepted(), int64_t(0));
  }

  void refusesNewerVersionThroughFeed() {
    Reader reader;
    std::vector<std::string> errors;
    int events = 0;
    reader.feed(
        to_line(Hello{2, "", ""}) + "\r\n" + to_line(Done{"ok", 1, 0}) + "\r\n",
        [&](Event) { ++events; }, [&](const std::string& m) { errors.push_back(m); });
    QCOMPARE(events, 0);
    QCOMPARE(errors.size(), size_t(1));
    QVERIFY2(errors[0].find("newer") != std::string::npos, errors[0].c_str());
    QVERIFY(reader.refused());
  }

  void acceptsOlderOrEqualVersion() {
    Reader reader;
    Reader::Result r = reader.parse_line(kHelloLine);
    QVERIFY2(r.event, r.error.c_str());
    QCOMPARE(reader.version(), 1);
    QVERIFY(!reader.refused());
    Reader zero;
    r = zero.parse_line(R"({"type":"hello","protocol":"shardscope-events","version":0})");
    QVERIFY(!r.event);
    QVERIFY(!r.error.empty());
    QCOMPARE(zero.rejected(), int64_t(1));
  }

  void rejectsRecordsBeforeHello_data() {
    QTest::addColumn<int>("index");
    auto all = samples();
    for (size_t i = 0; i < all.size(); ++i)
      if (!std::holds_alternative<Hello>(all[i].second)) QTest::newRow(all[i].first) << int(i);
  }
  void rejectsRecordsBeforeHello() {
    QFETCH(int, index);
    const std::string line = to_line(samples()[size_t(index)].second);
    Reader reader;
    Reader::Result r = reader.parse_line(line);
    QVERIFY(!r.event);
    QVERIFY2(
        r.error.find("before") != std::string::npos && r.error.find("hello") != std::string::npos,
        r.error.c_str());
    QCOMPARE(reader.rejected(), int64_t(1));
    QCOMPARE(reader.accepted(), int64_t(0));
    // The same record is fine once the stream has said hello.
    QVERIFY(reader.parse_line(kHelloLine).event);
    r = reader.parse_line(line);
    QVERIFY2(r.event, r.error.c_str());
    QCOMPARE(reader.accepted(), int64_t(2));
  }

  // Each row: a line, and a word the rejection message must contain (the
  // field it names, or what is wrong).
  void rejectsBadLines_data() {
    QTest::addColumn<QByteArray>("line");
    QTest::addColumn<QString>("says");
    QTest::newRow("not JSON") << QByteArray("hello world") << "JSON";
    QTest::newRow("truncated JSON") << QByteArray(R"({"type":"phase","name":"x","t":)") << "JSON";
    QTest::newRow("NaN literal") << QByteArray(R"({"type":"metric","name":"x","value":NaN})")
                                 << "JSON";
    QTest::newRow("array, not object") << QByteArray(R"([1,2,3])") << "object";
    QTest::newRow("bare number") << QByteArray("42") << "object";
    QTest::newRow("no type") << QByteArray(R"({"rank":0})") << "type";
    QTest::newRow("type not a string") << QByteArray(R"({"type":5})") << "type";
    QTest::newRow("type null") << QByteArray(R"({"type":null})") << "type";
    QTest::newRow("unknown type") << QByteArray(R"({"type":"teleport","rank":0})") << "teleport";
    QTest::newRow("missing rank") << QByteArray(R"({"type":"device","kind":"cpu"})") << "rank";
    QTest::newRow("rank as string")
        << QByteArray(R"({"type":"device","rank":"0","kind":"cpu"})") << "rank";
    QTest::newRow("rank fractional")
        << QByteArray(R"({"type":"device","rank":0.5,"kind":"cpu"})") << "rank";
    QTest::newRow("rank 1e300") << QByteArray(R"({"type":"device","rank":1e300,"kind":"cpu"})")
                                << "range";
    QTest::newRow("rank over int32")
        << QByteArray(R"({"type":"device","rank":3000000000,"kind":"cpu"})") << "range";
    QTest::newRow("capacity 1e300")
        << QByteArray(R"({"type":"device","rank":0,"kind":"cpu","capacity":1e300})") << "capacity";
    QTest::newRow("t over int64") << QByteArray(
                                         R"({"type":"phase","name":"x","t":18446744073709551615})")
                                  << "range";
    QTest::newRow("t -1e19") << QByteArray(R"({"type":"phase","name":"x","t":-1e19})") << "range";
    QTest::newRow("kind as number")
        << QByteArray(R"({"type":"device","rank":0,"kind":7})") << "kind";
    QTest::newRow("config not object")
        << QByteArray(R"({"type":"config","config":[1]})") << "config";
    QTest::newRow("config missing") << QByteArray(R"({"type":"config"})") << "config";
    QTest::newRow("placement bad mode")
        << QByteArray(R"({"type":"placement","rank":0,"tensor":"w","shape":[4],"mode":"sharded"})")
        << "mode";
    QTest::newRow("placement split without axis")
        << QByteArray(
               R"({"type":"placement","rank":0,"tensor":"w","shape":[4],"mode":"split","start":0,"end":2})")
        << "axis";
    QTest::newRow("placement axis outside shape")
        << QByteArray(
               R"({"type":"placement","rank":0,"tensor":"w","shape":[4],"mode":"split","axis":1,"start":0,"end":2})")
        << "axis";
    QTest::newRow("placement end past axis")
        << QByteArray(
               R"({"type":"placement","rank":0,"tensor":"w","shape":[4],"mode":"split","axis":0,"start":2,"end":5})")
        << "end";
    QTest::newRow("placement start after end")
        << QByteArray(
               R"({"type":"placement","rank":0,"tensor":"w","shape":[4],"mode":"split","axis":0,"start":3,"end":2})")
        << "start";
    QTest::newRow("placement shape of strings")
        << QByteArray(
               R"({"type":"placement","rank":0,"tensor":"w","shape":["4"],"mode":"mirrored"})")
        << "shape";
    QTest::newRow("placement shape of 9 dims")
        << QByteArray(
               R"({"type":"placement","rank":0,"tensor":"w","shape":[1,1,1,1,1,1,1,1,1],"mode":"mirrored"})")
        << "shape";
    QTest::newRow("tokens not pairs")
        << QByteArray(R"({"type":"tokens","rank":0,"ranges":[[0,1,2]]})") << "ranges";
    QTest::newRow("tokens not array")
        << QByteArray(R"({"type":"tokens","rank":0,"ranges":{"a":1}})") << "ranges";
    QTest::newRow("tokens end before begin")
        << QByteArray(R"({"type":"tokens","rank":0,"ranges":[[8,4]]})") << "ranges";
    QTest::newRow("span t1 before t0")
        << QByteArray(R"({"type":"span","rank":0,"stream":"compute","op":"gemm","t0":5,"t1":3})")
        << "t1";
    QTest::newRow("span missing op")
        << QByteArray(R"({"type":"span","rank":0,"stream":"compute","t0":5,"t1":6})") << "op";
    QTest::newRow("span flops as string")
        << QByteArray(
               R"({"type":"span","rank":0,"stream":"comm","op":"x","t0":5,"t1":6,"flops":"1"})")
        << "flops";
    QTest::newRow("span peer over int32")
        << QByteArray(
               R"({"type":"span","rank":0,"stream":"comm","op":"x","t0":5,"t1":6,"peers":[1e10]})")
        << "peers";
    QTest::newRow("span peers not array")
        << QByteArray(
               R"({"type":"span","rank":0,"stream":"comm","op":"x","t0":5,"t1":6,"peers":3})")
        << "peers";
    QTest::newRow("mem bytes not object")
        << QByteArray(R"({"type":"mem","rank":0,"t":1,"bytes":[1,2]})") << "bytes";
    QTest::newRow("mem category as string")
        << QByteArray(R"({"type":"mem","rank":0,"t":1,"bytes":{"weights":"lots"}})") << "weights";
    QTest::newRow("mem category 1e300")
        << QByteArray(R"({"type":"mem","rank":0,"t":1,"bytes":{"kv_cache":1e300}})") << "kv_cache";
    QTest::newRow("metric value as string")
        << QByteArray(R"({"type":"metric","name":"x","value":"1"})") << "value";
    QTest::newRow("metric missing value")
        << QByteArray(R"({"type":"metric","name":"x"})") << "value";
    QTest::newRow("error missing message")
        << QByteArray(R"({"type":"error","code":"oom"})") << "message";
    QTest::newRow("done missing status") << QByteArray(R"({"type":"done","t":1})") << "status";
    QTest::newRow("prompt missing text") << QByteArray(R"({"type":"prompt","ids":[1]})") << "text";
    QTest::newRow("prompt ids not numbers") << QByteArray(R"({"type":"prompt","text":"a","ids":["1"]})") << "ids";
    QTest::newRow("generation text not a string")
        << QByteArray(R"({"type":"generation","tokens":[1],"text":5})") << "text";
    QTest::newRow("generation pieces not one a token")
        << QByteArray(R"({"type":"generation","tokens":[1,2],"pieces":["a"]})") << "pieces";
    QTest::newRow("generation partial not a bool")
        << QByteArray(R"({"type":"generation","tokens":[1],"partial":1})") << "partial";
    // Regression: a negative rank reached the pages, which index by it.
    QTest::newRow("negative rank, span")
        << QByteArray(R"({"type":"span","rank":-1,"stream":"compute","op":"gemm","t0":0,"t1":1})") << "rank";
    QTest::newRow("negative rank, mem") << QByteArray(R"({"type":"mem","rank":-3,"t":0,"bytes":{}})") << "rank";
    QTest::newRow("rank beyond any run")
        << QByteArray(R"({"type":"device","rank":2000000000,"kind":"cpu"})") << "rank";
    QTest::newRow("scale_point without seq_len")
        << QByteArray(R"({"type":"scale_point","strategy":"tp","mode":"train","peak_bytes":1})") << "seq_len";
    QTest::newRow("scale_point of another mode")
        << QByteArray(R"({"type":"scale_point","strategy":"tp","mode":"serve","seq_len":8})") << "mode";
    QTest::newRow("scale_point peak on no device")
        << QByteArray(R"({"type":"scale_point","strategy":"tp","mode":"train","seq_len":8,"devices":2,)"
                      R"("peak_bytes":1,"peak_rank":2})")
        << "peak_rank";
    QTest::newRow("scale_point negative peak")
        << QByteArray(R"({"type":"scale_point","strategy":"tp","mode":"train","seq_len":8,"peak_bytes":-1})")
        << "peak_bytes";
    QTest::newRow("scale_point negative capacity")
        << QByteArray(R"({"type":"scale_point","strategy":"tp","mode":"train","seq_len":8,"peak_bytes":1,"capacity":-9})")
        << "capacity";
    QTest::newRow("scale_point fits not a bool")
        << QByteArray(R"({"type":"scale_point","strategy":"tp","mode":"train","seq_len":8,"peak_bytes":1,"fits":1})")
        << "fits";
    QTest::newRow("hello of another protocol")
        << QByteArray(R"({"type":"hello","protocol":"perfparser","version":1})")
        << "shardscope-events";
    QTest::newRow("nested too deep")
        << (QByteArray(R"({"type":"error","code":"x","message":"m","detail":)") +
            QByteArray(100000, '[') + QByteArray(100000, ']') + "}")
        << "nested";
  }
  void rejectsBadLines() {
    QFETCH(QByteArray, line);
    QFETCH(QString, says);
    Reader reader = opened_reader();
    Reader::Result r = reader.parse_line(std::string_view(line.constData(), size_t(line.size())));
    QVERIFY2(!r.event, line.left(200).constData());
    QVERIFY(!r.error.empty());
    QVERIFY2(QString::fromStdString(r.error).contains(says), r.error.c_str());
    QCOMPARE(reader.rejected(), int64_t(1));
    QCOMPARE(reader.accepted(), int64_t(1));
    // A bad line does not stop the reader.
    r = reader.parse_line(to_line(Phase{"decode", 7}));
    QVERIFY2(r.event, r.error.c_str());
    QCOMPARE(reader.rejected(), int64_t(1));
  }

  // Integers may be written the way other JSON writers print whole numbers.
  void acceptsWholeNumbersWrittenAsFloats() {
    Reader reader = opened_reader();
    Reader::Result r = reader.parse_line(R"({"type":"phase","name":"x","t":1e9})");
    QVERIFY2(r.event, r.error.c_str());
    QCOMPARE(std::get<Phase>(*r.event).t, int64_t(1'000'000'000));
    r = reader.parse_line(R"({"type":"device","rank":2.0,"kind":"cpu"})");
    QVERIFY2(r.event, r.error.c_str());
    QCOMPARE(std::get<Device>(*r.event).rank, 2);
  }

  // Text that is not UTF-8 (a tensor name from a broken file) is written as
  // U+FFFD instead of throwing in the writer.
  void writerReplacesInvalidUtf8() {
    std::string line;
    try {
      line = to_line(Placement{0, "bad\xff\xfename", 0, {2}, "mirrored", -1, 0, 0, 8, -1});
    } catch (const std::exception& e) {
      QFAIL(e.what());
    }
    Reader reader = opened_reader();
    Reader::Result r = reader.parse_line(line);
    QVERIFY2(r.event, r.error.c_str());
    QCOMPARE(std::get<Placement>(*r.event).tensor, std::string("bad\xef\xbf\xbd\xef\xbf\xbdname"));
  }

  // Each row: a stream cut into chunks at the given byte offsets.
  void feedSplitsChunks_data() {
    QTest::addColumn<QByteArray>("stream");
    QTest::addColumn<QList<int>>("cuts");
    QTest::addColumn<int>("events");
    const QByteArray hello = QByteArray(kHelloLine);
    const QByteArray phase = QByteArray::fromStdString(to_line(Phase{"prefill", 5}));
    const QByteArray done = QByteArray::fromStdString(to_line(Done{"ok", 9, 0}));
    const QByteArray lf = hello + "\n" + phase + "\n" + done + "\n";
    const QByteArray crlf = hello + "\r\n" + phase + "\r\n" + done + "\r\n";
    QTest::newRow("one chunk") << lf << QList<int>{} << 3;
    QTest::newRow("cut inside a line") << lf << QList<int>{10, int(hello.size()) + 5} << 3;
    QTest::newRow("cut right before newline") << lf << QList<int>{int(hello.size())} << 3;
    QTest::newRow("cut right after newline") << lf << QList<int>{int(hello.size()) + 1} << 3;
    QTest::newRow("CRLF one chunk") << crlf << QList<int>{} << 3;
    QTest::newRow("CRLF cut between CR and LF") << crlf << QList<int>{int(hello.size()) + 1} << 3;
    QTest::newRow("CRLF cut inside a line") << crlf << QList<int>{3, 60, 61, 62} << 3;
    QTest::newRow("blank lines") << (hello + "\n\n\r\n" + phase + "\n\n" + done + "\n")
                                 << QList<int>{} << 3;
    QTest::newRow("no final newline")
        << (hello + "\n" + phase + "\n" + done) << QList<int>{20} << 3;
    QTest::newRow("no final newline, CR") << (hello + "\r\n" + done + "\r") << QList<int>{} << 2;
    QList<int> every;
    for (int i = 1; i < lf.size(); ++i) every << i;
    QTest::newRow("one byte at a time") << lf << every << 3;
  }
  void feedSplitsChunks() {
    QFETCH(QByteArray, stream);
    QFETCH(QList<int>, cuts);
    QFETCH(int, events);
    Reader reader;
    std::vector<std::string> types;
    std::vector<std::string> errors;
    auto on_event = [&](Event e) { types.emplace_back(type_name(e)); };
    auto on_error = [&](const std::string& m) { errors.push_back(m); };
    int at = 0;
    cuts << int(stream.size());
    for (int cut : cuts) {
      reader.feed(std::string_view(stream.constData() + at, size_t(cut - at)), on_event, on_error);
      at = cut;
    }
    reader.finish(on_event, on_error);
    QVERIFY2(errors.empty(), errors.empty() ? "" : errors.front().c_str());
    QCOMPARE(int(types.size()), events);
    QCOMPARE(types.front(), std::string("hello"));
    QCOMPARE(types.back(), std::string("done"));
    QCOMPARE(reader.rejected(), int64_t(0));
    QCOMPARE(reader.accepted(), int64_t(events));
  }

  void feedCountsBadLines() {
    Reader reader;
    std::vector<std::string> errors;
    int events = 0;
    const std::string text = std::string(kHelloLine) + "\n{oops\n" + to_line(Phase{"load", 0}) +
                             "\n{\"type\":\"phase\"}\n" + to_line(Done{"ok", 1, 0}) + "\n";
    reader.feed(
        text, [&](Event) { ++events; }, [&](const std::string& m) { errors.push_back(m); });
    reader.finish([&](Event) { ++events; }, [&](const std::string& m) { errors.push_back(m); });
    QCOMPARE(events, 3);
    QCOMPARE(errors.size(), size_t(2));
    QCOMPARE(reader.rejected(), int64_t(2));
    QCOMPARE(reader.accepted(), int64_t(3));
  }

  // A line over the limit is dropped once, as one rejection; its tail, which
  // arrives in later chunks, is not read as a record of its own.
  void feedDropsOverlongLine() {
    Reader reader;
    std::vector<std::string> errors;
    std::vector<Event> got;
    auto on_event = [&](Event e) { got.push_back(std::move(e)); };
    auto on_error = [&](const std::string& m) { errors.push_back(m); };
    reader.feed(std::string(kHelloLine) + "\n", on_event, on_error);
    std::string big = "{\"type\":\"error\",\"code\":\"x\",\"message\":\"";
    big.append(Reader::kMaxLine, 'a');
    reader.feed(big, on_event, on_error);
    QCOMPARE(errors.size(), size_t(1));
    QVERIFY2(errors[0].find("longer") != std::string::npos, errors[0].c_str());
    // Without the drop state the tail below would count as a second bad line.
    reader.feed(std::string("aaaa\"}\n") + to_line(Phase{"decode", 3}) + "\n", on_event, on_error);
    reader.finish(on_event, on_error);
    QCOMPARE(errors.size(), size_t(1));
    QCOMPARE(reader.rejected(), int64_t(1));
    QCOMPARE(got.size(), size_t(2));
    QVERIFY(std::holds_alternative<Phase>(got[1]));
  }
};

QTEST_GUILESS_MAIN(TestProtocol)
#include "tst_protocol.moc"

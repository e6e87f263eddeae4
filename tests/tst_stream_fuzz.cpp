// The stream parser under malformed input: 100,000 seeded mutations of real
// records (truncations, flipped and inserted bytes, bad UTF-8, wrong types,
// huge numbers, unknown record types, deep nesting) fed through the Reader in
// random chunk sizes. No crash, no hang, and every line is either accepted or
// counted as rejected with a reason.
#include <QtTest>

#include <random>

#include "protocol/events.h"

using namespace ss::proto;

namespace {

std::vector<std::string> seeds() {
  Span s;
  s.rank = 1;
  s.op = "gemm";
  s.site = "mlp.down";
  s.layer = 3;
  s.phase = "prefill";
  s.t0 = 100;
  s.t1 = 250;
  s.flops = 1e9;
  s.bytes = 4096;
  s.peers = {0, 2};
  s.dims = {512, 1024, 2816};
  Mem m;
  m.rank = 2;
  m.t = 77;
  m.bytes = {1, 2, 3, 4, 5, 6};
  m.peak = 21;
  Placement p;
  p.rank = 0;
  p.tensor = "model.layers.0.self_attn.q_proj.weight";
  p.layer = 0;
  p.shape = {64, 64};
  p.mode = "split";
  p.axis = 0;
  p.start = 16;
  p.end = 32;
  p.bytes = 4096;
  p.step = 1;
  return {to_line(Config{{{"model", {{"name", "tiny"}}}, {"devices", 4}}}),
          to_line(Device{3, "cpu", "host cpu", 1 << 30, "node0"}),
          to_line(p),
          to_line(Tokens{1, {{0, 8}, {24, 32}}}),
          to_line(s),
          to_line(m),
          to_line(Metric{"ttft_ms", 12.5, "ms", -1}),
          to_line(Phase{"decode", 99}),
          to_line(Accuracy{"kl", "mlp", 2, 1e-4, "mlp=int8:128"}),
          to_line(Error{"oom", 1, "out of memory", {{"category", "kv_cache"}}}),
          to_line(Done{"ok", 1000, 0})};
}

std::string mutate(const std::string& line, std::mt19937_64& rng) {
  std::string s = line;
  auto pick = [&](size_t n) { return n ? size_t(rng() % n) : size_t(0); };
  static const char* const kValues[] = {"1e308", "-1e308", "1e999", "18446744073709551616", "-9223372036854775809",
                                        "\"text\"", "[]", "{}", "null", "true", "0.5", "-1", "NaN", "\"\\ud800\""};
  static const char* const kTypes[] = {"spam", "", "SPAN", "hello", "config", "done", "mem"};
  switch (rng() % 9) {
    case 0: s.resize(pick(s.size() + 1)); break;  // truncated
    case 1:                                        // flipped bytes
      for (int i = 0; i < 1 + int(rng() % 4) && !s.empty(); ++i) s[pick(s.size())] = char(rng() & 0xff);
      break;
    case 2: s.insert(pick(s.size() + 1), 1, char(0x80 | (rng() & 0x3f))); break;  // bad UTF-8
    case 3: {  // a value replaced by one of the wrong type or out of range
      const size_t colon = s.find(':', pick(s.size()));
      if (colon != std::string::npos) {
        size_t end = s.find_first_of(",}", colon);
        if (end == std::string::npos) end = s.size();
        s.replace(colon + 1, end - colon - 1, kValues[rng() % std::size(kValues)]);
      }
      break;
    }
    case 4: {  // unknown or wrong record type
      const size_t at = s.find("\"type\":\"");
      if (at != std::string::npos) {
        const size_t end = s.find('"', at + 8);
        s.replace(at + 8, end - at - 8, kTypes[rng() % std::size(kTypes)]);
      }
      break;
    }
    case 5: s = std::string(1 + pick(2000), '[') + s; break;   // deep nesting
    case 6: s += std::string(pick(3), '}'); break;              // trailing garbage
    case 7: s.erase(pick(s.size() + 1), 1 + pick(8)); break;    // deleted span
    default: s.insert(pick(s.size() + 1), std::string(1 + pick(6), ',')); break;
  }
  return s;
}

}  // namespace

class TestStreamFuzz : public QObject {
  Q_OBJECT
 private slots:
  void survivesMutations() {
    const std::vector<std::string> base = seeds();
    std::mt19937_64 rng(20261129);
    constexpr int kCases = 100000;
    int64_t accepted = 0, rejected = 0, reasons = 0;
    // Several streams, each opening with a valid hello, fed in random chunks.
    for (int stream = 0; stream < 20; ++stream) {
      Reader reader;
      std::string text = to_line(Hello{kVersion, "0.1.0", "host"}) + "\n";
      for (int i = 0; i < kCases / 20; ++i) {
        const std::string& line = base[rng() % base.size()];
        text += (rng() % 4 == 0 ? line : mutate(line, rng));
        text += rng() % 50 == 0 ? "\r\n" : "\n";
      }
      size_t at = 0;
      while (at < text.size()) {
        const size_t n = std::min(text.size() - at, size_t(1 + rng() % 9000));
        reader.feed(std::string_view(text.data() + at, n), [&](Event&&) { ++accepted; },
                    [&](const std::string& why) { reasons += !why.empty(); });
        at += n;
      }
      reader.finish([&](Event&&) { ++accepted; }, [&](const std::string& why) { reasons += !why.empty(); });
      QVERIFY(!reader.refused());
      rejected += reader.rejected();
      // Every non-empty line (mutations may add or remove newlines) is accounted for.
      int64_t lines = 0;
      for (size_t b = 0, e; b < text.size(); b = e + 1) {
        e = text.find('\n', b);
        if (e == std::string::npos) e = text.size();
        const std::string_view l(text.data() + b, e - b);
        lines += !(l.empty() || l == "\r");
      }
      QCOMPARE(reader.accepted() + reader.rejected(), lines);
    }
    qInfo("%lld accepted, %lld rejected (every rejection with a reason: %lld)", static_cast<long long>(accepted),
          static_cast<long long>(rejected), static_cast<long long>(reasons));
    QVERIFY(accepted + rejected >= kCases * 9 / 10);  // few mutations leave an empty line
    QVERIFY(rejected > kCases / 4);          // the mutations do break lines
    QCOMPARE(reasons, rejected);             // and each rejection says why
  }
};

QTEST_APPLESS_MAIN(TestStreamFuzz)
#include "tst_stream_fuzz.moc"

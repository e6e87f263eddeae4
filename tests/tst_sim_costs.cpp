// The simulator's cost model in closed form and in whole runs: how a rank's
// comm thread and kernels share its core (contention, the hold), the core
// share of ranks that outnumber the cores, a collective's calibrated times,
// and attention costed run by run. Each case states the time the model must
// give, worked out by hand, or compares two simulated runs that differ in one
// profile figure.
#include <QtTest>
#include <cmath>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "engine_process.h"
#include "protocol/events.h"
#include "runtime/calibrate.h"
#include "sim/cost_model.h"
#include "sim/sim_backend.h"
#include "sim_profiles.h"

using namespace ss::proto;
using json = nlohmann::json;

class TestSimCosts : public QObject {
  Q_OBJECT

  QTemporaryDir m_dir;
  json m_h100;

  Ran simulate_with(const QString& name, const json& profile, const QStringList& args) {
    return ::simulate_with(m_dir, name, profile, args);
  }

  // (stream:op, start, duration) of rank 0's spans in a simulated run of
  // tiny-llama on 2 devices, in order, with device.<field> set to `value`
  // (none when null); empty if the run failed.
  using Spans = std::vector<std::tuple<std::string, int64_t, int64_t>>;
  Spans rank0_spans(const char* name, const char* field, const json& value, const char* strategy) {
    json j = m_h100;
    if (!value.is_null()) j["device"][field] = value;
    const Ran r = simulate_with(name, j,
                                {"--model", "tiny-llama", "--strategy", strategy, "--devices", "2", "--prompt-len",
                                 "32", "--decode", "2"});
    Spans out;
    if (r.crashed || r.exit_code != 0) return out;
    const Stream st = read_stream(r.out);
    for (auto* sp : st.all<Span>())
      if (sp->rank == 0) out.emplace_back(sp->stream + ":" + sp->op, sp->t0, sp->t1 - sp->t0);
    std::stable_sort(out.begin(), out.end(), [](auto& a, auto& b) { return std::get<1>(a) < std::get<1>(b); });
    return out;
  }

 private slots:
  void initTestCase() {
    QVERIFY(m_dir.isValid());
    QVERIFY(sim_suite_ready(m_h100));
  }

  // Contention (device.contention, measured by calibrate for ranks sharing a
  // host): work on one stream runs 1 + c times slower where the other stream
  // is busy. The stretch in closed form; then whole runs: tp's collectives
  // block (no kernel runs beside them), so its times do not move; tsp keeps a
  // ring transfer in flight beside its GEMMs, so it slows down, by at most
  // 1 + c overall.
  void contentionSlowsOverlapOnly() {
    using ss::SimClock;
    // 10 ns of work from 0, the other stream busy over [2, 6): 2 ns free, 2 ns
    // of progress in the 4 busy ns, the 6 left after 6: ends at 12.
    QCOMPARE(SimClock::stretched_end(0, 10, {{2, 6}}, 1.0), 12.0);
    QCOMPARE(SimClock::stretched_end(0, 10, {{2, 6}}, 0.0), 10.0);
    QCOMPARE(SimClock::stretched_end(3, 0.5, {{2, 6}}, 3.0), 5.0);  // at a quarter speed
    QCOMPARE(SimClock::stretched_end(3, 1, {{2, 6}}, 3.0), 6.25);   // 0.75 by 6, the rest free
    QCOMPARE(SimClock::stretched_end(0, 4, {{1, 2}, {3, 4}}, 1.0), 5.0);  // 1 + 0.5 + 1 + 0.5 by 4
    SimClock::Intervals busy;
    for (auto [a, b] : {std::pair{5.0, 7.0}, {1.0, 2.0}, {6.0, 9.0}, {2.0, 3.0}, {4.0, 4.0}})
      SimClock::add_busy(busy, a, b);
    QCOMPARE(busy, (SimClock::Intervals{{1, 3}, {5, 9}}));

    auto end_ns = [&](const QString& strategy, double c) -> int64_t {
      json j = m_h100;
      if (c > 0) j["device"]["contention"] = {{"compute", c}, {"comm", c}, {"source", "test"}};
      const Ran r = simulate_with(QString("contention-%1.json").arg(c), j,
                                  {"--model", "tiny-llama", "--strategy", strategy, "--devices", "2", "--prompt-len",
                                   "64", "--decode", "4"});
      if (r.crashed || r.exit_code != 0) return -1;
      const Stream st = read_stream(r.out);
      int64_t end = 0;
      for (auto* sp : st.all<Span>()) end = std::max(end, sp->t1);
      return end;
    };
    const int64_t tp0 = end_ns("tp", 0), tp1 = end_ns("tp", 1), tsp0 = end_ns("tsp", 0), tsp1 = end_ns("tsp", 1);
    QVERIFY(tp0 > 0 && tp1 > 0 && tsp0 > 0 && tsp1 > 0);
    QCOMPARE(tp1, tp0);
    QVERIFY2(tsp1 > tsp0 && tsp1 <= 2 * tsp0 + 2, qPrintable(QString("tsp: %1 ns without, %2 with").arg(tsp0).arg(tsp1)));
  }

  // The hold (device.contention.hold_us): a collective posted beside kernels
  // waits for the core until they stop to wait or the hold passes, making no
  // progress and slowing nothing meanwhile. In closed form on one rank's
  // clock (ns; slowdowns 1: a stream at half speed beside the other), then
  // whole runs.
  void holdKeepsTheCoreForOneStream() {
    using ss::SimClock;
    auto clock = [](double hold) {
      SimClock c;
      c.compute_slowdown = c.comm_slowdown = 1;
      c.hold_ns = hold;
      return c;
    };
    {  // Two short kernels after the post, then the wait: in turn, not beside.
      SimClock c = clock(100);
      auto op = c.post(0, 50);
      QCOMPARE(c.kernel(30), 30.0);
      QCOMPARE(c.kernel(30), 60.0);
      QVERIFY(!c.done(op));
      c.wait(op);
      QCOMPARE(c.compute_ns, 110.0);
    }
    {  // The same without a hold: both at half speed while they overlap.
      // Kernel 1: 25 of its 30 by 50 (beside the post's estimate), the rest
      // by 55; kernel 2 alone to 85; the collective, beside both kernels,
      // makes 42.5 of its 50 by 85 and ends at 92.5.
      SimClock c = clock(0);
      auto op = c.post(0, 50);
      QCOMPARE(c.kernel(30), 55.0);
      QCOMPARE(c.kernel(30), 85.0);
      c.wait(op);
      QCOMPARE(c.compute_ns, 92.5);
    }
    {  // A kernel longer than the hold: alone to 100, then both at half speed.
      // The collective makes its 50 in [100, 200); the kernel, 25 of its
      // work in [100, 150) (the collective's estimate), ends 25 late.
      SimClock c = clock(100);
      auto op = c.post(0, 50);
      QCOMPARE(c.kernel(300), 325.0);
      QVERIFY(c.done(op));
      c.wait(op);
      QCOMPARE(c.compute_ns, 325.0);
    }
    {  // Woken while the comm thread has a second collective: kernels resume
       // when it is done (at 90), or a hold after the first ends (150).
      SimClock c = clock(100);
      auto a = c.post(0, 50), b = c.post(50, 40);
      c.wait(a);
      QCOMPARE(c.compute_ns, 90.0);
      SimClock l = clock(100);
      auto a2 = l.post(0, 50), b2 = l.post(50, 400);
      l.wait(a2);
      QCOMPARE(l.compute_ns, 150.0);
      l.wait(b2);
      QCOMPARE(l.compute_ns, 450.0);
      c.wait(b);
      QCOMPARE(c.compute_ns, 90.0);
    }
    {  // Waited out of order, or one dropped unwaited: the comm thread still
       // runs them in the order they were posted.
      SimClock c = clock(100);
      auto a = c.post(0, 50), b = c.post(0, 40);
      c.wait(b);
      QCOMPARE(c.compute_ns, 90.0);
      c.wait(a);
      QCOMPARE(c.compute_ns, 90.0);
      SimClock d = clock(100);
      d.drop(d.post(0, 50));
      auto e = d.post(0, 40);
      QVERIFY(!d.done(e));
      d.wait(e);
      QCOMPARE(d.compute_ns, 90.0);
    }

    // Whole runs. With a hold longer than any stretch of kernels, no kernel
    // ever has the comm thread beside it: every kernel span keeps its length
    // from the run without contention, and tsp, whose transfers then wait
    // for the kernels, ends later. tp blocks on every collective: unchanged.
    auto run = [&](const QString& strategy, const json& contention) {
      json j = m_h100;
      if (!contention.is_null()) j["device"]["contention"] = contention;
      const Ran r = simulate_with(QString("hold-%1-%2.json").arg(strategy).arg(contention.is_null()), j,
                                  {"--model", "tiny-llama", "--strategy", strategy, "--devices", "2", "--prompt-len",
                                   "64", "--decode", "4"});
      std::vector<int64_t> kernels;
      int64_t end = -1;
      if (r.crashed || r.exit_code != 0) return std::make_pair(kernels, end);
      const Stream st = read_stream(r.out);
      for (auto* sp : st.all<Span>()) {
        end = std::max(end, sp->t1);
        if (sp->rank == 0 && sp->stream == "compute") kernels.push_back(sp->t1 - sp->t0);
      }
      return std::make_pair(kernels, end);
    };
    const json held = {{"source", "test"}, {"compute", 1}, {"comm", 1}, {"hold_us", 1e6}};
    const auto [tsp0, tsp_end0] = run("tsp", json());
    const auto [tsp1, tsp_end1] = run("tsp", held);
    QVERIFY(!tsp0.empty() && tsp_end0 > 0);
    QCOMPARE(tsp1.size(), tsp0.size());
    for (size_t i = 0; i < tsp0.size(); ++i)  // to the ns the span ends are rounded to
      QVERIFY2(std::abs(tsp1[i] - tsp0[i]) <= 2, qPrintable(QString("kernel %1: %2 ns, %3 without").arg(i).arg(tsp1[i]).arg(tsp0[i])));
    QVERIFY2(tsp_end1 > tsp_end0, qPrintable(QString("tsp: %1 ns without, %2 with").arg(tsp_end0).arg(tsp_end1)));
    const int64_t tp_held = run("tp", held).second, tp_free = run("tp", json()).second;
    QVERIFY(tp_free > 0);
    QCOMPARE(tp_held, tp_free);
  }

  // A calibrated collective's own times (collectives.<op>.us at `ranks`,
  // and groups[].us at fewer): for those rank counts the cost model
  // interpolates them, log-log between the measured sizes and linear past
  // the last; other counts take the fit.
  void measuredCollectiveTimes() {
    ss::LinkProfile l;
    l.latency = 1e-6;
    l.bandwidth = 1e9;
    ss::CollectiveFit& f = l.collectives["broadcast"];
    f.latency = 2e-6;
    f.bandwidth = 4e9;
    f.times.push_back({4, {1e3, 1e6, 4e6}, {10e-6, 250e-6, 1000e-6}});
    auto at = [&](double bytes, int n) { return ss::collective_seconds(l, "broadcast", bytes, n).seconds; };
    QCOMPARE(at(1e6, 4), 250e-6);
    QCOMPARE(at(10, 4), 10e-6);                                  // below the smallest: its time
    QVERIFY(std::abs(at(2e6, 4) - 500e-6) < 1e-12);              // 250 us * 2^(log 4 / log 4)
    QVERIFY(std::abs(at(std::pow(10, 4.5), 4) - 50e-6) < 1e-12);  // halfway on a log scale: 10 us * 25^(1/2)
    QVERIFY(std::abs(at(6e6, 4) - 1500e-6) < 1e-12);             // the last segment's 250 us per MB
    // 2 ranks: the fitted ring, alpha + S / beta.
    QVERIFY(std::abs(at(1e6, 2) - (2e-6 + 1e6 / 4e9)) < 1e-15);
    // Times measured in groups of 2 (calibrate on a host whose ranks form a
    // mesh) serve a collective over 2; 3 ranks still take the fit.
    f.times.push_back({2, {1e3, 1e6}, {8e-6, 120e-6}});
    QCOMPARE(at(1e6, 2), 120e-6);
    QCOMPARE(at(1e6, 4), 250e-6);
    QVERIFY(std::abs(at(1e6, 3) - (2 * 2e-6 + 1e6 / 4e9)) < 1e-15);  // a ring of 2 steps, cheaper than the tree
  }

  // The simulator costs an attention call run by run (AttentionRun): from a
  // measured grid of contiguous causal blocks, zigzag's two chunks take the
  // time of their two blocks, not that of one block of all their queries.
  void attentionCostedByRuns() {
    ss::HardwareProfile hw;
    auto& a = hw.attention_times;
    a.heads = 4;
    a.kv_heads = 4;
    a.head_dim = 64;
    a.grid.x = {128, 256};
    a.grid.y = {128, 512};
    a.grid.seconds = {{100e-6, 300e-6}, {250e-6, 900e-6}};
    const double per_pair = 4 * 4.0 * 64;  // the call's heads and head_dim: FLOPs per visible pair
    const std::vector<ss::AttentionRun> runs = {{128, 128, 128.0 * 129 / 2}, {128, 512, 128.0 * 384 + 128.0 * 129 / 2}};
    const double pairs = runs[0].pairs + runs[1].pairs;
    const double t = ss::kernel_seconds(hw, "attention", pairs * per_pair, 0, {256, 512, 4, 64}, ss::DType::F32, runs);
    QVERIFY2(std::abs(t - 400e-6) < 1e-12, qPrintable(QString::number(t)));
    // Costed whole (no runs): the 256-query block's time scaled by its pairs.
    const double whole = ss::kernel_seconds(hw, "attention", pairs * per_pair, 0, {256, 512, 4, 64});
    const double block_pairs = 256.0 * 512 - 256.0 * 255 / 2;
    QVERIFY2(std::abs(whole - 900e-6 * pairs / block_pairs) < 1e-12, qPrintable(QString::number(whole)));
  }

  // Core share (device.core_share, measured by calibrate for more ranks than
  // cores): a kernel's time is divided by the share at its length, log-linear
  // between the measured lengths. In closed form, then a whole run: at a flat
  // share of 1/2 every kernel span is twice as long, and comm spans keep their
  // lengths.
  void coreShareDividesKernelTimes() {
    ss::HardwareProfile hw;
    QCOMPARE(ss::core_share_at(hw, 1e-3), 1.0);
    hw.core_share_seconds = {1e-4, 1e-2};
    hw.core_share = {0.3, 0.5};
    QCOMPARE(ss::core_share_at(hw, 1e-5), 0.3);
    QCOMPARE(ss::core_share_at(hw, 1.0), 0.5);
    QVERIFY(std::abs(ss::core_share_at(hw, 1e-3) - 0.4) < 1e-12);  // halfway on a log scale
    QVERIFY(std::abs(ss::segment_wall(hw, 1e-3) - 1e-3 / 0.4) < 1e-15);

    auto spans = [&](const char* name, const json& share) { return rank0_spans(name, "core_share", share, "tp"); };
    auto flat = [](double v) { return json{{"source", "test"}, {"kernel_us", {1}}, {"share", {v}}}; };
    const Spans whole = spans("share-none.json", json()), half = spans("share-half.json", flat(0.5));
    QVERIFY(!whole.empty());
    QCOMPARE(half.size(), whole.size());
    int kernels = 0;
    for (size_t i = 0; i < whole.size(); ++i) {
      const auto& [op, t0, d] = whole[i];
      QCOMPARE(std::get<0>(half[i]), op);
      const bool compute = op.rfind("compute:", 0) == 0;
      kernels += compute;
      const int64_t want = compute ? 2 * d : d;
      QVERIFY2(std::abs(std::get<2>(half[i]) - want) <= 2,
               qPrintable(QString("%1: %2 ns at share 1/2, %3 at 1").arg(QString::fromStdString(op))
                              .arg(std::get<2>(half[i])).arg(d)));
    }
    QVERIFY(kernels > 10);

    // A share that grows with the segment: between two collectives (tp's
    // block on every one), the kernels take segment_wall of their summed
    // CPU time, each the part its own CPU time adds.
    const json rising = {{"source", "test"}, {"kernel_us", {1, 1000}}, {"share", {0.25, 0.75}}};
    ss::HardwareProfile hw2;
    hw2.core_share_seconds = {1e-6, 1e-3};
    hw2.core_share = {0.25, 0.75};
    const Spans grown = spans("share-rising.json", rising);
    QCOMPARE(grown.size(), whole.size());
    int segments = 0;
    double cpu = 0, wall = 0;
    int64_t n = 0;
    auto close_segment = [&] {
      if (n == 0) return true;
      ++segments;
      const double want = ss::segment_wall(hw2, cpu);
      const bool ok = std::abs(wall - want) <= 2e-9 * double(n) + 1e-9 * want;
      if (!ok) qWarning("segment of %lld kernels, %.9f s CPU: %.9f s, want %.9f", (long long)n, cpu, wall, want);
      cpu = wall = 0;
      n = 0;
      return ok;
    };
    for (size_t i = 0; i < whole.size(); ++i) {
      if (std::get<0>(whole[i]).rfind("comm:", 0) == 0) {
        QVERIFY(close_segment());
        continue;
      }
      cpu += double(std::get<2>(whole[i])) * 1e-9;
      wall += double(std::get<2>(grown[i])) * 1e-9;
      ++n;
    }
    QVERIFY(close_segment());
    QVERIFY(segments > 4);
  }

  // The engine's own time before each kernel (device.host_gap, measured by
  // calibrate on a cpu host): every kernel starts that much later and lasts
  // as long; tp's ranks run the same kernels, so each collective starts
  // later by the gaps of the kernels before it.
  void hostGapComesBeforeEachKernel() {
    const Spans whole = rank0_spans("gap-none.json", "host_gap", json(), "tp"),
                gapped = rank0_spans("gap-7us.json", "host_gap", json{{"source", "test"}, {"us", 7}}, "tp");
    QVERIFY(!whole.empty());
    QCOMPARE(gapped.size(), whole.size());
    int64_t kernels = 0;
    for (size_t i = 0; i < whole.size(); ++i) {
      const auto& [op, t0, d] = whole[i];
      QCOMPARE(std::get<0>(gapped[i]), op);
      kernels += op.rfind("compute:", 0) == 0;
      const int64_t shift = std::get<1>(gapped[i]) - t0;
      QVERIFY2(std::abs(shift - 7000 * kernels) <= 2 * kernels + 2 && std::abs(std::get<2>(gapped[i]) - d) <= 2,
               qPrintable(QString("%1 (after %2 kernels): starts %3 ns later, lasts %4 ns against %5")
                              .arg(QString::fromStdString(op)).arg(kernels).arg(shift)
                              .arg(std::get<2>(gapped[i])).arg(d)));
    }
    QVERIFY(kernels > 10);
  }

  // Overlap steps (device.overlap_steps, measured by calibrate for more ranks
  // than cores): a collective posted before kernels begins when the rank
  // waits for it, and ends its time alone plus the measured extra wait at
  // those kernels' CPU time later; kernels with one in flight take the
  // overlap share. In closed form on one rank's clock (ns), then whole runs.
  void overlapStepsOnAnOversubscribedHost() {
    ss::HardwareProfile hw;
    hw.overlap_seconds = {1e-4, 1e-2};
    hw.overlap_share = {1.0, 0.5};
    hw.overlap_wait = {{"broadcast", {100e-6, 300e-6}}, {"sendrecv", {50e-6, 150e-6}}};
    QVERIFY(std::abs(ss::overlap_wait_at(hw, "broadcast", 1e-3) - 200e-6) < 1e-12);   // halfway on a log scale
    QVERIFY(std::abs(ss::overlap_wait_at(hw, "all_gather", 1e-3) - 200e-6) < 1e-12);  // not measured: the broadcast's
    QVERIFY(std::abs(ss::overlap_wait_at(hw, "sendrecv", 1.0) - 150e-6) < 1e-12);
    QVERIFY(std::abs(ss::overlap_segment_wall(hw, 1e-3) - 1e-3 / 0.75) < 1e-15);
    using ss::SimClock;
    auto kernel = [](SimClock& c, double us) {  // as the sim backend charges one, at a share of 1
      c.cpu_total += us * 1e-6;
      return c.kernel(us * 1e3);
    };
    SimClock c;
    c.oversubscribed = &hw;
    auto a = c.post(0, 50e3, "broadcast"), b = c.post(0, 20e3, "sendrecv");
    QCOMPARE(c.in_flight(), 2);
    kernel(c, 100);
    QVERIFY(!c.done(a));  // no progress beside the kernels
    c.wait(a);            // from now (100 us): its 50 us, then 100 us more
    QCOMPARE(c.compute_ns, 250e3);
    c.wait(b);  // beside the same kernels, already waited past: its 20 us after a
    QCOMPARE(c.compute_ns, 270e3);
    QCOMPARE(c.in_flight(), 0);
    auto d = c.post(300e3, 10e3, "sendrecv");  // its last participant arrives at 300 us
    c.wait(d);                                 // no kernels since its post: its time alone from there
    QCOMPARE(c.compute_ns, 310e3);
    auto e = c.post(0, 10e3, "sendrecv");
    kernel(c, 1e4);  // 10 ms of kernels: 150 us more
    c.wait(e);
    QVERIFY(std::abs(c.compute_ns - (310e3 + 1e7 + 10e3 + 150e3)) < 1);

    // Whole runs at a flat share of 1/2: tp computes with no collective in
    // flight and keeps every span; tsp's kernels beside its transfers take
    // twice as long, the others keep their lengths.
    const json flat = {{"source", "test"}, {"kernel_us", {1}}, {"share", {0.5}}, {"wait_us", {{"broadcast", {1}}}}};
    for (const char* strategy : {"tp", "tsp"}) {
      const std::string name = std::string("overlap-") + strategy;
      const Spans plain = rank0_spans((name + "-none.json").c_str(), "overlap_steps", json(), strategy);
      const Spans over = rank0_spans((name + ".json").c_str(), "overlap_steps", flat, strategy);
      QVERIFY(!plain.empty());
      QCOMPARE(over.size(), plain.size());
      int doubled = 0, kept = 0;
      for (size_t i = 0; i < plain.size(); ++i) {
        const auto& [op, t0, dur] = plain[i];
        QCOMPARE(std::get<0>(over[i]), op);
        const int64_t got = std::get<2>(over[i]);
        if (op.rfind("compute:", 0) != 0 || std::abs(got - dur) <= 2) ++kept;
        else if (std::abs(got - 2 * dur) <= 2) ++doubled;
        else QFAIL(qPrintable(QString("%1 %2: %3 ns, %4 without").arg(strategy, QString::fromStdString(op)).arg(got).arg(dur)));
      }
      if (std::string_view(strategy) == "tp") QCOMPARE(doubled, 0);
      else QVERIFY2(doubled > 4 && kept > 4, qPrintable(QString("%1 doubled, %2 kept").arg(doubled).arg(kept)));
    }
  }

  // calibrate measures its grids in passes and keeps each entry's median, so
  // a pass slowed by a burst of load from elsewhere moves no entry, and the
  // shapes stay the integers they were.
  void medianOfPasses() {
    const json a = {{"rows", {1, 8}}, {"us", {{10.0, 20.0}, {30.0, 40.0}}}, {"source", "pass a"}};
    json b = a, c = a;
    b["us"][0][1] = 29.0;  // slowed
    c["us"][0][1] = 21.0;
    b["us"][1][0] = 60.0;
    c["us"][1][0] = 31.0;
    b["source"] = "pass b";
    const json m = ss::median_of_passes({a, b, c});
    QCOMPARE(m["us"][0][0].get<double>(), 10.0);
    QCOMPARE(m["us"][0][1].get<double>(), 21.0);
    QCOMPARE(m["us"][1][0].get<double>(), 31.0);
    QCOMPARE(m["us"][1][1].get<double>(), 40.0);
    QVERIFY(m["rows"][1].is_number_integer());
    QCOMPARE(m["rows"][1].get<int>(), 8);
    QCOMPARE(m["source"].get<std::string>(), std::string("pass a"));
    // gemm_times' layout: a list of shapes, each with its times.
    const json g1 = json::array({{{"n", 1024}, {"k", 1024}, {"m", {1, 2}}, {"us", {200.0, 210.0}}}});
    json g2 = g1, g3 = g1;
    g2[0]["us"] = {270.0, 280.0};
    g3[0]["us"] = {205.0, 190.0};
    const json gm = ss::median_of_passes({g1, g2, g3});
    QCOMPARE(gm[0]["us"][0].get<double>(), 205.0);
    QCOMPARE(gm[0]["us"][1].get<double>(), 210.0);
    QCOMPARE(gm[0]["m"], g1[0]["m"]);
  }
};

QTEST_GUILESS_MAIN(TestSimCosts)
#include "tst_sim_costs.moc"

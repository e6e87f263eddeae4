// The MPI communicator of the cpu backend, run under mpiexec with 2, 3 and 4
// ranks (and alone, as a singleton world of one). Every rank can compute what
// every other rank contributed (value(rank, i)), so each result is checked
// against an expectation built independently of MPI. Checks are local
// verdicts combined across ranks (mpi_harness.h).
#include <mpi.h>

#include <QtTest>
#include <algorithm>
#include <future>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/mpi_bench.h"
#include "comm/mpi_communicator.h"
#include "cpu/cpu_backend.h"
#include "mpi_harness.h"
#include "sim/meta_backend.h"

using mpi_harness::Verdict;
using ss::Category;
using ss::Tensor;

namespace {

// What rank `rank` contributes at index `i`: small integers, so every sum is
// exact in f32 and a result is either right or wrong.
float value(int rank, int64_t i) {
  return float((rank * 37 + i * 11) % 101 - 50);
}

std::vector<ss::proto::Span> comm_spans(std::vector<ss::proto::Span> spans) {
  std::erase_if(spans, [](const ss::proto::Span& s) { return s.stream != "comm"; });
  return spans;
}

QString ints(const std::vector<int>& v) {
  QStringList parts;
  for (int x : v) parts << QString::number(x);
  return "{" + parts.join(",") + "}";
}

}  // namespace

class TestComm : public QObject, private mpi_harness::World {
  Q_OBJECT

 private:
  Tensor filled(int64_t n, float v) { return tensor(std::vector<float>(size_t(n), v)); }
  // value(rank, offset + i) for i < n
  static std::vector<float> values_of(int rank, int64_t n, int64_t offset = 0) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = value(rank, offset + i);
    return v;
  }
  std::vector<int> others(const ss::Communicator& c) const {
    std::vector<int> out;
    for (int r = 0; r < c.size(); ++r)
      if (r != c.rank()) out.push_back(c.members()[size_t(r)]);
    return out;
  }
  // Some compute on the calling thread while a transfer is in flight.
  void compute_something() {
    Tensor x = filled(64 * 64, 0.5f).reshape({64, 64});
    Tensor y = filled(64 * 64, 0.0f).reshape({64, 64});
    for (int i = 0; i < 4; ++i) m_be->matmul(y, x, x);
  }

 private slots:
  void initTestCase() { set_up(); }
  void cleanupTestCase() { tear_down(); }

  void init() { m_rec->clear(); }

  void worldLayout() {
    Verdict v;
    v.expect(m_world->thread_level() >= MPI_THREAD_SERIALIZED, "thread level below SERIALIZED");
    v.expect(m_comm->rank() == m_rank && m_comm->size() == m_size,
             QStringLiteral("world comm is rank %1 of %2").arg(m_comm->rank()).arg(m_comm->size()));
    std::vector<int> all(static_cast<size_t>(m_size));
    std::iota(all.begin(), all.end(), 0);
    v.expect(m_comm->members() == all, "world members " + ints(m_comm->members()));
    v.expect(m_comm->name() == "world", "name");
    v.expect(int(m_world->hostnames().size()) == m_size && !m_world->hostname().empty(),
             "hostnames");
    VERIFY_EVERYWHERE(v);
  }

  void streamRunsInOrderAndRethrows() {
    // Local to each rank: no MPI involved.
    ss::CommStream stream;
    std::vector<int> seen;
    std::vector<ss::Request> reqs;
    for (int i = 0; i < 50; ++i) {
      reqs.push_back(stream.enqueue([&seen, i] {
        seen.push_back(i);
        if (i == 20) throw std::runtime_error("task 20 fails");
      }));
    }
    Verdict v;
    for (int i = 0; i < 50; ++i) {
      bool threw = false;
      try {
        reqs[size_t(i)]->wait();
      } catch (const std::runtime_error& e) {
        threw = std::string(e.what()) == "task 20 fails";
      }
      v.expect(threw == (i == 20), QStringLiteral("task %1 threw: %2").arg(i).arg(threw));
      v.expect(reqs[size_t(i)]->done(), QStringLiteral("task %1 not done after wait").arg(i));
    }
    std::vector<int> want(50);
    std::iota(want.begin(), want.end(), 0);
    v.expect(seen == want, "tasks ran out of order or not at all");
    VERIFY_EVERYWHERE(v);
  }

  void allReduce_data() {
    QTest::addColumn<int>("n");
    QTest::addColumn<bool>("nonblocking");
    for (int n : {0, 1, 7, 1000, 4099}) {
      QTest::addRow("n=%d", n) << n << false;
      QTest::addRow("n=%d async", n) << n << true;
    }
  }
  void allReduce() {
    QFETCH(int, n);
    QFETCH(bool, nonblocking);
    Tensor buf = tensor(values_of(m_rank, n));
    if (nonblocking) {
      ss::Request req = m_comm->iall_reduce(buf);
      compute_something();
      req->wait();
    } else {
      m_comm->all_reduce(buf);
    }
    std::vector<float> want(size_t(n), 0.0f);
    for (int r = 0; r < m_size; ++r)
      for (int i = 0; i < n; ++i) want[size_t(i)] += value(r, i);
    Verdict v;
    v.expect_equal(host(buf), want, "all_reduce");
    VERIFY_EVERYWHERE(v);
  }

  // 16-bit sums accumulate in fp32 and round once. Rank 0 contributes a
  // value whose spacing in the dtype is 2 (256 in bf16, 2048 in fp16) and
  // every other rank 1: summed pairwise in 16 bits the ones would vanish
  // (256 + 1 rounds back to 256), in fp32 they add up before the one rounding
  // (256 + 3 = 259 rounds to 260). Odd elements hold small integers, exact in
  // either dtype. The spans carry 2 bytes a value.
  void sixteenBitSums_data() {
    QTest::addColumn<int>("dtype");
    QTest::addColumn<int>("n");
    for (ss::DType d : {ss::DType::BF16, ss::DType::F16})
      for (int n : {1, 7, 1000, 4099})
        QTest::addRow("%s n=%d", ss::dtype_name(d).data(), n) << int(d) << n;
  }
  void sixteenBitSums() {
    QFETCH(int, dtype);
    QFETCH(int, n);
    const ss::DType dt = ss::DType(dtype);
    const float big = dt == ss::DType::BF16 ? 256.0f : 2048.0f;
    auto contribution = [&](int rank, int64_t i) { return i % 2 ? value(rank, i) : rank == 0 ? big : 1.0f; };
    auto round_once = [&](double sum) {
      const float f = float(sum);
      uint16_t h;
      ss::narrow(&f, 1, dt, &h);
      float back;
      ss::widen(&h, dt, 1, &back);
      return back;
    };
    std::vector<float> mine(static_cast<size_t>(n)), want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      mine[size_t(i)] = contribution(m_rank, i);
      double sum = 0;
      for (int r = 0; r < m_size; ++r) sum += contribution(r, i);
      want[size_t(i)] = round_once(sum);
    }
    Verdict v;
    Tensor buf = tensor(mine, dt);
    m_rec->take_spans();
    m_comm->all_reduce(buf);
    v.expect_equal(host(buf), want, "all_reduce");
    const auto spans = comm_spans(m_rec->take_spans());
    const double bytes = m_size > 1 ? 2.0 * (m_size - 1) / m_size * 2.0 * n : 0.0;
    v.expect(spans.size() == 1 && spans[0].bytes == bytes,
             QStringLiteral("all_reduce span bytes %1, want %2").arg(spans.empty() ? -1 : spans[0].bytes).arg(bytes));
    // reduce_scatter: this rank keeps block m_rank of the same sums.
    std::vector<float> in, want_rs;
    for (int r = 0; r < m_size; ++r)
      for (int64_t i = 0; i < n; ++i) in.push_back(contribution(m_rank, int64_t(r) * n + i));
    for (int64_t i = 0; i < n; ++i) {
      double sum = 0;
      for (int r = 0; r < m_size; ++r) sum += contribution(r, int64_t(m_rank) * n + i);
      want_rs.push_back(round_once(sum));
    }
    Tensor out = tensor(std::vector<float>(size_t(n), -1.0f), dt);
    m_comm->reduce_scatter(out, tensor(in, dt));
    v.expect_equal(host(out), want_rs, "reduce_scatter");
    VERIFY_EVERYWHERE(v);
  }

  void reduceScatter_data() {
    QTest::addColumn<int>("n");
    for (int n : {1, 5, 333}) QTest::addRow("n=%d", n) << n;
  }
  void reduceScatter() {
    QFETCH(int, n);
    Tensor in = tensor(values_of(m_rank, int64_t(m_size) * n));
    Tensor out = filled(n, -1.0f);
    m_comm->reduce_scatter(out, in);
    std::vector<float> want(size_t(n), 0.0f);
    for (int r = 0; r < m_size; ++r)
      for (int i = 0; i < n; ++i) want[size_t(i)] += value(r, int64_t(m_rank) * n + i);
    Verdict v;
    v.expect_equal(host(out), want, "reduce_scatter");
    VERIFY_EVERYWHERE(v);
  }

  void allGather_data() {
    QTest::addColumn<int>("n");
    QTest::addColumn<bool>("in_place");
    QTest::addColumn<bool>("nonblocking");
    for (int n : {1, 3, 257}) {
      QTest::addRow("n=%d", n) << n << false << false;
      QTest::addRow("n=%d in place", n) << n << true << false;
      QTest::addRow("n=%d async", n) << n << false << true;
    }
  }
  void allGather() {
    QFETCH(int, n);
    QFETCH(bool, in_place);
    QFETCH(bool, nonblocking);
    Tensor out = filled(int64_t(m_size) * n, -1.0f);
    Tensor in = tensor(values_of(m_rank, n));
    if (in_place) {
      // This rank's block of `out` is the input: MPI_IN_PLACE.
      Tensor mine = out.slice(0, int64_t(m_rank) * n, n);
      m_be->copy(mine, in);
      in = mine;
    }
    if (nonblocking) {
      ss::Request req = m_comm->iall_gather(out, in);
      compute_something();
      req->wait();
    } else {
      m_comm->all_gather(out, in);
    }
    std::vector<float> want;
    for (int r = 0; r < m_size; ++r) {
      const auto block = values_of(r, n);
      want.insert(want.end(), block.begin(), block.end());
    }
    Verdict v;
    v.expect_equal(host(out), want, "all_gather");
    VERIFY_EVERYWHERE(v);
  }

  void allToAll_data() {
    QTest::addColumn<int>("n");
    for (int n : {1, 4, 129}) QTest::addRow("n=%d", n) << n;
  }
  void allToAll() {
    QFETCH(int, n);
    // Block j of this rank's input is meant for rank j: value(7 * sender + receiver, i).
    std::vector<float> in_values;
    for (int j = 0; j < m_size; ++j) {
      const auto block = values_of(7 * m_rank + j, n);
      in_values.insert(in_values.end(), block.begin(), block.end());
    }
    Tensor in = tensor(in_values);
    Tensor out = filled(int64_t(m_size) * n, -1.0f);
    m_comm->all_to_all(out, in);
    std::vector<float> want;
    for (int i = 0; i < m_size; ++i) {
      const auto block = values_of(7 * i + m_rank, n);
      want.insert(want.end(), block.begin(), block.end());
    }
    Verdict v;
    v.expect_equal(host(out), want, "all_to_all");
    VERIFY_EVERYWHERE(v);
  }

  void broadcastFromEveryRoot() {
    Verdict v;
    for (int root = 0; root < m_size; ++root) {
      Tensor buf = m_rank == root ? tensor(values_of(root, 1001)) : filled(1001, -99.0f);
      if (root % 2) {
        ss::Request req = m_comm->ibroadcast(buf, root);
        compute_something();
        req->wait();
      } else {
        m_comm->broadcast(buf, root);
      }
      v.expect_equal(host(buf), values_of(root, 1001), QStringLiteral("root %1").arg(root));
    }
    VERIFY_EVERYWHERE(v);
  }

  void sendRecvPairs() {
    // Ranks pair up (0,1), (2,3), ...; the even one sends 17 elements first,
    // then receives 33; a rank without a partner sits out.
    const int partner = m_rank ^ 1;
    Verdict v;
    if (partner < m_size) {
      const bool even = m_rank % 2 == 0;
      Tensor out = tensor(values_of(m_rank, even ? 17 : 33));
      Tensor in = filled(even ? 33 : 17, -1.0f);
      if (even) {
        m_comm->send(out, partner);
        m_comm->recv(in, partner);
      } else {
        m_comm->recv(in, partner);
        m_comm->send(out, partner);
      }
      v.expect_equal(host(in), values_of(partner, even ? 33 : 17), "received");
      const auto spans = comm_spans(m_rec->take_spans());
      v.expect(spans.size() == 2, QStringLiteral("%1 spans").arg(spans.size()));
      if (spans.size() == 2) {
        const auto& s = even ? spans[0] : spans[1];
        const auto& r = even ? spans[1] : spans[0];
        v.expect(s.op == "send" && r.op == "recv", "span ops");
        v.expect(s.bytes == ss::wire_bytes("send", double(out.nbytes()), m_size) &&
                     s.bytes == double(out.nbytes()),
                 QStringLiteral("send bytes %1").arg(s.bytes));
        v.expect(r.bytes == 0, QStringLiteral("recv bytes %1").arg(r.bytes));
        v.expect(s.peers == std::vector<int>{partner} && r.peers == std::vector<int>{partner},
                 "peers " + ints(s.peers) + " " + ints(r.peers));
        v.expect(s.dims == std::vector<int64_t>{out.numel()} &&
                     r.dims == std::vector<int64_t>{in.numel()},
                 "dims");
      }
    }
    VERIFY_EVERYWHERE(v);
  }

  void recvOfWrongLengthFails() {
    // Rank 0 sends 5 elements to rank 1, which expects 6: an error, not a
    // silently short result.
    Verdict v;
    if (m_size >= 2 && m_rank < 2) {
      if (m_rank == 0) {
        m_comm->send(tensor(values_of(0, 5)), 1);
      } else {
        bool threw = false;
        try {
          m_comm->recv(filled(6, 0.0f), 0);
        } catch (const std::runtime_error& e) {
          threw = QString(e.what()).contains("received 5 elements");
        }
        v.expect(threw, "a short message was accepted");
      }
    }
    VERIFY_EVERYWHERE(v);
  }

  void ringSendrecv_data() {
    QTest::addColumn<int>("m");
    QTest::addColumn<bool>("nonblocking");
    for (int m : {1, 5, 1000}) {
      QTest::addRow("m=%d", m) << m << false;
      QTest::addRow("m=%d async", m) << m << true;
    }
  }
  void ringSendrecv() {
    // Each rank starts with its own chunk in a buffer of size() chunks and
    // passes chunks to the right; after size()-1 steps it has them all.
    QFETCH(int, m);
    QFETCH(bool, nonblocking);
    const int n = m_size, right = (m_rank + 1) % n, left = (m_rank + n - 1) % n;
    Tensor full = filled(int64_t(n) * m, -1.0f);
    m_be->copy(full.slice(0, int64_t(m_rank) * m, m), tensor(values_of(m_rank, m)));
    m_rec->clear();
    for (int step = 0; step < n - 1; ++step) {
      const int send_chunk = (m_rank - step + n) % n;
      const int recv_chunk = (m_rank - step - 1 + n) % n;
      Tensor send = full.slice(0, int64_t(send_chunk) * m, m);
      Tensor recv = full.slice(0, int64_t(recv_chunk) * m, m);
      if (nonblocking) {
        ss::Request req = m_comm->isendrecv(send, right, recv, left);
        compute_something();
        req->wait();
      } else {
        m_comm->sendrecv(send, right, recv, left);
      }
    }
    std::vector<float> want;
    for (int r = 0; r < n; ++r) {
      const auto block = values_of(r, m);
      want.insert(want.end(), block.begin(), block.end());
    }
    Verdict v;
    v.expect_equal(host(full), want, "ring");
    const auto spans = comm_spans(m_rec->take_spans());
    v.expect(int(spans.size()) == n - 1, QStringLiteral("%1 spans").arg(spans.size()));
    for (const auto& s : spans) {
      v.expect(s.op == "sendrecv", QString::fromStdString(s.op));
      v.expect(s.peers == std::vector<int>{right, left}, "peers " + ints(s.peers));
      v.expect(s.bytes == ss::wire_bytes("sendrecv", 4.0 * m, n) && s.bytes == 4.0 * m,
               QStringLiteral("bytes %1").arg(s.bytes));
    }
    VERIFY_EVERYWHERE(v);
  }

  void overlappedRequestsCompleteInOrder() {
    // Three transfers in flight at once, waited in reverse: the stream runs
    // them in issue order on every rank.
    const int n = 1 << 16;
    Tensor a = tensor(values_of(m_rank, n));
    Tensor gathered = filled(int64_t(m_size) * 9, -1.0f);
    Tensor piece = tensor(values_of(m_rank, 9, 3));
    Tensor b = m_rank == m_size - 1 ? tensor(values_of(100, 11)) : filled(11, 0.0f);
    ss::Request ra = m_comm->iall_reduce(a);
    ss::Request rg = m_comm->iall_gather(gathered, piece);
    ss::Request rb = m_comm->ibroadcast(b, m_size - 1);
    compute_something();
    rb->wait();
    rg->wait();
    ra->wait();
    Verdict v;
    v.expect(ra->done() && rg->done() && rb->done(), "requests not done after wait");
    std::vector<float> want_a(size_t(n), 0.0f), want_g;
    for (int r = 0; r < m_size; ++r) {
      for (int i = 0; i < n; ++i) want_a[size_t(i)] += value(r, i);
      const auto block = values_of(r, 9, 3);
      want_g.insert(want_g.end(), block.begin(), block.end());
    }
    v.expect_equal(host(a), want_a, "all_reduce");
    v.expect_equal(host(gathered), want_g, "all_gather");
    v.expect_equal(host(b), values_of(100, 11), "broadcast");
    const auto spans = comm_spans(m_rec->take_spans());
    v.expect(spans.size() == 3, QStringLiteral("%1 spans").arg(spans.size()));
    if (spans.size() == 3) {
      v.expect(
          spans[0].op == "all_reduce" && spans[1].op == "all_gather" && spans[2].op == "broadcast",
          "spans out of issue order");
      v.expect(spans[0].t1 <= spans[1].t0 && spans[1].t1 <= spans[2].t0,
               "ops of one stream overlap in time");
    }
    VERIFY_EVERYWHERE(v);
  }

  void spansDescribeEachOp() {
    const int n = m_size;
    m_rec->set_phase("prefill");
    ss::SiteScope scope(*m_rec, 2, "attn.o");
    Tensor ar = tensor(values_of(m_rank, 10));
    Tensor rs_in = tensor(values_of(m_rank, 3 * n)), rs_out = filled(3, 0.0f);
    Tensor ag_in = tensor(values_of(m_rank, 4)), ag_out = filled(4 * n, 0.0f);
    Tensor a2a_in = tensor(values_of(m_rank, 2 * n)), a2a_out = filled(2 * n, 0.0f);
    Tensor bc = filled(6, 1.0f);
    Tensor sr_send = tensor(values_of(m_rank, 7)), sr_recv = filled(7, 0.0f);
    m_rec->clear();  // only the comm ops below
    m_comm->all_reduce(ar);
    m_comm->reduce_scatter(rs_out, rs_in);
    m_comm->all_gather(ag_out, ag_in);
    m_comm->all_to_all(a2a_out, a2a_in);
    m_comm->broadcast(bc, 0);
    m_comm->sendrecv(sr_send, (m_rank + 1) % n, sr_recv, (m_rank + n - 1) % n);
    m_comm->barrier();
    m_rec->set_phase("load");

    struct Want {
      const char* op;
      double payload;
      std::vector<int64_t> dims;
    };
    const std::vector<Want> wants = {
        {"all_reduce", 40, {10}},
        {"reduce_scatter", 12.0 * n, {3 * n}},
        {"all_gather", 16.0 * n, {4 * n}},
        {"all_to_all", 8.0 * n, {2 * n}},
        {"broadcast", 24, {6}},
        {"sendrecv", 28, {7}},
        {"barrier", 0, {}},
    };
    std::vector<int> everyone_else;
    for (int r = 0; r < n; ++r)
      if (r != m_rank) everyone_else.push_back(r);
    const auto spans = m_rec->take_spans();
    Verdict v;
    v.expect(spans.size() == wants.size(), QStringLiteral("%1 spans").arg(spans.size()));
    for (size_t k = 0; k < std::min(spans.size(), wants.size()); ++k) {
      const auto& s = spans[k];
      const Want& w = wants[k];
      const QString at = QStringLiteral("span %1 (%2)").arg(k).arg(w.op);
      v.expect(s.op == w.op, at + ": op " + QString::fromStdString(s.op));
      v.expect(s.stream == "comm" && s.rank == m_rank && s.flops == 0, at + ": stream/rank/flops");
      v.expect(s.bytes == ss::wire_bytes(w.op, w.payload, n),
               at + QStringLiteral(": bytes %1, expected %2")
                        .arg(s.bytes)
                        .arg(ss::wire_bytes(w.op, w.payload, n)));
      v.expect(s.dims == w.dims, at + ": dims");
      const std::vector<int> peers = w.op == std::string("sendrecv")
                                         ? std::vector<int>{(m_rank + 1) % n, (m_rank + n - 1) % n}
                                         : everyone_else;
      v.expect(s.peers == peers, at + ": peers " + ints(s.peers));
      v.expect(s.layer == 2 && s.site == "attn.o" && s.phase == "prefill", at + ": tag");
      v.expect(s.t0 <= s.t1 && (k == 0 || spans[k - 1].t1 <= s.t0), at + ": times");
    }
    // The bus factors themselves (nccl-tests doc/PERFORMANCE.md).
    v.expect(ss::wire_bytes("all_reduce", 100, 4) == 150 &&
                 ss::wire_bytes("all_gather", 100, 4) == 75 &&
                 ss::wire_bytes("all_reduce", 100, 1) == 0,
             "wire_bytes factors");
    VERIFY_EVERYWHERE(v);
  }

  void tagIsTakenAtIssue() {
    // Hold the stream until the compute thread has moved to another layer:
    // the span must still name the layer, site and phase of the issue.
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    ss::Request hold = m_stream->enqueue([released] { released.wait(); });
    Tensor buf = tensor(values_of(m_rank, 8));
    m_rec->clear();
    m_rec->set_phase("decode");
    ss::Request req;
    {
      ss::SiteScope scope(*m_rec, 3, "mlp.down");
      req = m_comm->iall_reduce(buf);
    }
    m_rec->set_phase("load");
    ss::SiteScope elsewhere(*m_rec, 4, "lm_head");
    release.set_value();
    hold->wait();
    req->wait();
    const auto spans = comm_spans(m_rec->take_spans());
    Verdict v;
    v.expect(spans.size() == 1, QStringLiteral("%1 spans").arg(spans.size()));
    if (spans.size() == 1)
      v.expect(spans[0].layer == 3 && spans[0].site == "mlp.down" && spans[0].phase == "decode",
               QStringLiteral("span tagged layer %1 site %2 phase %3")
                   .arg(spans[0].layer)
                   .arg(QString::fromStdString(spans[0].site))
                   .arg(QString::fromStdString(spans[0].phase)));
    VERIFY_EVERYWHERE(v);
  }

  void splitIntoMesh() {
    // tp groups: consecutive pairs (rank / 2); sp groups: same parity (rank % 2).
    // With 4 ranks this is the 2 x 2 mesh; with 3, one group of each has one rank.
    auto tp = m_comm->split(m_rank / 2, m_rank, "tp");
    auto sp = m_comm->split(m_rank % 2, m_rank, "sp");
    auto rev = m_comm->split(0, m_size - m_rank, "reversed");
    std::vector<int> tp_members, sp_members, rev_members;
    for (int r = 0; r < m_size; ++r) {
      if (r / 2 == m_rank / 2) tp_members.push_back(r);
      if (r % 2 == m_rank % 2) sp_members.push_back(r);
      rev_members.insert(rev_members.begin(), r);
    }
    Verdict v;
    v.expect(tp->members() == tp_members && sp->members() == sp_members,
             "members tp " + ints(tp->members()) + " sp " + ints(sp->members()));
    v.expect(tp->size() == int(tp_members.size()) && sp->size() == int(sp_members.size()), "sizes");
    v.expect(tp_members[size_t(tp->rank())] == m_rank && sp_members[size_t(sp->rank())] == m_rank,
             "ranks");
    v.expect(tp->name() == "tp" && sp->name() == "sp", "names");
    v.expect(rev->members() == rev_members && rev->rank() == m_size - 1 - m_rank,
             "reversed members " + ints(rev->members()));

    // Collectives on both groups, the tp one in flight while sp runs.
    const int n = 301;
    Tensor tp_buf = tensor(values_of(m_rank, n));
    Tensor sp_in = tensor(values_of(m_rank, 5));
    Tensor sp_out = filled(5 * int64_t(sp->size()), -1.0f);
    Tensor rev_buf = rev->rank() == 0 ? tensor(values_of(m_rank, 4)) : filled(4, 0.0f);
    m_rec->clear();
    ss::Request tp_req = tp->iall_reduce(tp_buf);
    sp->all_gather(sp_out, sp_in);
    tp_req->wait();
    rev->broadcast(rev_buf, 0);

    std::vector<float> want_tp(size_t(n), 0.0f), want_sp;
    for (int r : tp_members)
      for (int i = 0; i < n; ++i) want_tp[size_t(i)] += value(r, i);
    for (int r : sp_members) {
      const auto block = values_of(r, 5);
      want_sp.insert(want_sp.end(), block.begin(), block.end());
    }
    v.expect_equal(host(tp_buf), want_tp, "tp all_reduce");
    v.expect_equal(host(sp_out), want_sp, "sp all_gather");
    v.expect_equal(host(rev_buf), values_of(m_size - 1, 4), "reversed broadcast from world's last");

    const auto spans = comm_spans(m_rec->take_spans());
    v.expect(spans.size() == 3, QStringLiteral("%1 spans").arg(spans.size()));
    if (spans.size() == 3) {
      v.expect(spans[0].op == "all_reduce" && spans[0].peers == others(*tp) &&
                   spans[0].bytes == ss::wire_bytes("all_reduce", 4.0 * n, tp->size()),
               "tp span: peers " + ints(spans[0].peers));
      v.expect(spans[1].op == "all_gather" && spans[1].peers == others(*sp) &&
                   spans[1].bytes == ss::wire_bytes("all_gather", 20.0 * sp->size(), sp->size()),
               "sp span: peers " + ints(spans[1].peers));
    }
    // A group of one: every op is a local no-op or copy that puts nothing on the wire.
    auto solo = m_comm->split(m_rank, 0, "solo");
    Tensor s_buf = tensor(values_of(m_rank, 6)), s_out = filled(6, 0.0f);
    solo->all_reduce(s_buf);
    solo->all_gather(s_out, s_buf);
    v.expect(solo->size() == 1 && solo->rank() == 0 && solo->members() == std::vector<int>{m_rank},
             "solo layout");
    v.expect_equal(host(s_buf), values_of(m_rank, 6), "solo all_reduce");
    v.expect_equal(host(s_out), values_of(m_rank, 6), "solo all_gather");
    for (const auto& s : comm_spans(m_rec->take_spans()))
      v.expect(s.bytes == 0 && s.peers.empty(), "solo span with bytes or peers");
    VERIFY_EVERYWHERE(v);
  }

  void gatherBlobs() {
    // Different lengths, one empty, bytes that are not text.
    auto blob_of = [](int r) {
      std::string b = r == 1 ? std::string() : std::string(size_t(3 * r + 2), char('a' + r));
      if (r == 2) b += std::string("\0\xff", 2);
      return b;
    };
    Verdict v;
    for (int root : {0, m_size - 1}) {
      const auto got = m_comm->gather_blobs(blob_of(m_rank), root);
      if (m_rank == root) {
        v.expect(int(got.size()) == m_size, QStringLiteral("root got %1 blobs").arg(got.size()));
        for (int r = 0; r < std::min<int>(m_size, int(got.size())); ++r)
          v.expect(got[size_t(r)] == blob_of(r), QStringLiteral("blob of rank %1").arg(r));
      } else {
        v.expect(got.empty(), "a rank other than the root got blobs");
      }
    }
    v.expect(comm_spans(m_rec->take_spans()).empty(), "gather_blobs recorded a span");
    VERIFY_EVERYWHERE(v);
  }

  void badArgumentsThrowBeforeIssue() {
    // Each check throws on the calling thread before anything reaches MPI, so
    // no rank is left waiting in a collective.
    Verdict v;
    auto throws = [&](const char* what, auto&& call) {
      bool threw = false;
      try {
        call();
      } catch (const std::logic_error&) {
        threw = true;
      }
      v.expect(threw, QStringLiteral("no logic_error for %1").arg(what));
    };
    const int n = m_size;
    Tensor t4 = filled(4, 0.0f);
    Tensor wide = filled(24, 0.0f).reshape({4, 6});
    ss::Allocator meta_alloc;
    ss::MetaBackend meta(meta_alloc, *m_rec);
    throws("all_gather out too small", [&] { m_comm->all_gather(filled(4 * n - 1, 0), t4); });
    throws("reduce_scatter in of the wrong size",
           [&] { m_comm->reduce_scatter(t4, filled(4 * n + 1, 0)); });
    throws("all_to_all of different sizes",
           [&] { m_comm->all_to_all(filled(n, 0), filled(2 * n, 0)); });
    throws("a strided view", [&] { m_comm->all_reduce(wide.slice(1, 0, 3)); });
    throws("an i32 sum", [&] {
      m_comm->all_reduce(m_be->alloc({4}, Category::Workspace, "h", ss::DType::I32));
    });
    throws("all_gather of two dtypes", [&] {
      m_comm->all_gather(m_be->alloc({4 * n}, Category::Workspace, "h", ss::DType::BF16), t4);
    });
    throws("an undefined tensor", [&] { m_comm->all_reduce(Tensor()); });
    throws("a meta tensor", [&] { m_comm->all_reduce(meta.alloc({4}, Category::Workspace, "m")); });
    throws("root out of range", [&] { m_comm->broadcast(t4, n); });
    throws("dst out of range", [&] { m_comm->send(t4, -1); });
    throws("overlapping sendrecv", [&] {
      m_comm->sendrecv(wide.reshape({24}).slice(0, 0, 8), 0, wide.reshape({24}).slice(0, 4, 8), 0);
    });
    throws("negative split color", [&] { m_comm->split(-1, 0, "bad"); });
    v.expect(comm_spans(m_rec->take_spans()).empty(), "a refused op recorded a span");
    m_comm->barrier();  // the communicator still works
    VERIFY_EVERYWHERE(v);
  }

  void benchReportsBothPaths() {
    const std::vector<int64_t> sizes = {4096, (1 << 16) + 12};
    const auto rows = ss::bench_collectives(*m_comm, *m_be, sizes, 3);
    const int n = m_size;
    Verdict v;
    v.expect(rows.size() == 8, QStringLiteral("%1 rows").arg(rows.size()));
    size_t k = 0;
    for (int64_t size : sizes) {
      for (std::string op : {"all_reduce", "all_gather"}) {
        for (const char* path : {"mpi", "communicator"}) {
          if (k >= rows.size()) break;
          const auto& r = rows[k++];
          const QString at =
              QStringLiteral("%1 %2 %3").arg(QString::fromStdString(op), path).arg(size);
          const int64_t per_rank = op == "all_gather" ? size / 4 / n : size / 4;
          const int64_t bytes = (op == "all_gather" ? n * per_rank : per_rank) * 4;
          const double factor = op == "all_reduce" ? 2.0 * (n - 1) / n : double(n - 1) / n;
          v.expect(r.op == op && r.path == path && r.ranks == n && r.iterations == 3, at + ": row");
          v.expect(r.bytes == bytes,
                   at + QStringLiteral(": bytes %1, expected %2").arg(r.bytes).arg(bytes));
          v.expect(r.wrong == 0, at + QStringLiteral(": %1 wrong elements").arg(r.wrong));
          v.expect(r.time_s > 0 && std::abs(r.algbw - bytes / r.time_s) <= 1e-9 * r.algbw,
                   at + ": algbw");
          v.expect(std::abs(r.busbw - r.algbw * factor) <= 1e-9 * r.algbw, at + ": busbw");
        }
      }
    }
    VERIFY_EVERYWHERE(v);
  }
};

QTEST_GUILESS_MAIN(TestComm)
#include "tst_comm.moc"

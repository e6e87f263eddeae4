// The MPI world of the suites that run inside MPI ranks (tst_comm,
// tst_quant_mpi): one cpu backend and one world communicator per rank, with
// the helpers their tests share.
//
// Under MPI a rank that leaves a test function early while the others enter a
// collective hangs the run. So each check only records a local verdict; the
// verdicts are combined across ranks (everyone()) after the last collective,
// and only then does the test pass or fail, on every rank alike.
#pragma once

#include <mpi.h>

#include <QString>
#include <QtTest>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/mpi_communicator.h"
#include "cpu/cpu_backend.h"

namespace mpi_harness {

// A local verdict with the first reason it went wrong.
struct Verdict {
  bool ok = true;
  QString why;

  void expect(bool cond, const QString& what) {
    if (cond || !ok) {
      ok = ok && cond;
      return;
    }
    ok = false;
    why = what;
  }
  void expect_equal(const std::vector<float>& got, const std::vector<float>& want,
                    const QString& what) {
    if (got.size() != want.size()) {
      expect(false, QStringLiteral("%1: %2 elements, expected %3")
                        .arg(what)
                        .arg(got.size())
                        .arg(want.size()));
      return;
    }
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != want[i]) {
        expect(false, QStringLiteral("%1: element %2 is %3, expected %4")
                          .arg(what)
                          .arg(i)
                          .arg(got[i])
                          .arg(want[i]));
        return;
      }
    }
  }
};

// This rank's world: a test class derives from it, calls set_up() in
// initTestCase() and tear_down() in cleanupTestCase().
class World {
 protected:
  std::unique_ptr<ss::MpiWorld> m_world;
  std::shared_ptr<ss::CommStream> m_stream;
  ss::Allocator m_alloc;
  std::unique_ptr<ss::Recorder> m_rec;
  std::unique_ptr<ss::CpuBackend> m_be;
  std::unique_ptr<ss::MpiCommunicator> m_comm;
  int m_rank = 0;
  int m_size = 1;

  void set_up() {
    m_world = std::make_unique<ss::MpiWorld>();
    m_rank = m_world->rank();
    m_size = m_world->size();
    m_stream = std::make_shared<ss::CommStream>();
    m_rec = std::make_unique<ss::Recorder>(m_rank);
    m_be = std::make_unique<ss::CpuBackend>(m_alloc, *m_rec);
    m_comm = std::make_unique<ss::MpiCommunicator>(m_stream, MPI_COMM_WORLD, *m_rec, "world");
  }

  void tear_down() {
    // Communicators free on the stream, the stream joins, then MPI finalizes.
    m_comm.reset();
    m_stream.reset();
    m_be.reset();
    m_rec.reset();
    m_world.reset();
  }

  // True on every rank iff `ok` on every rank (on the stream, like all MPI).
  bool everyone(bool ok) {
    int all = ok ? 1 : 0;
    m_stream
        ->enqueue([&] {
          ss::check_mpi(MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD),
                        "MPI_Allreduce", "world");
        })
        ->wait();
    return all == 1;
  }

  ss::Tensor tensor(const std::vector<float>& values, ss::DType dtype = ss::DType::F32) {
    ss::Tensor t = m_be->alloc({int64_t(values.size())}, ss::Category::CommBuffers, "test", dtype);
    if (!values.empty()) m_be->upload(t, values.data(), ss::DType::F32);
    return t;
  }
  std::vector<float> host(const ss::Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    if (!v.empty()) m_be->download(t, v.data());
    return v;
  }
};

}  // namespace mpi_harness

// Passes on every rank or fails on every rank: combines the ranks' verdicts.
// For use in the test functions of a class derived from mpi_harness::World.
#define VERIFY_EVERYWHERE(verdict)                                                       \
  do {                                                                                   \
    const bool all_ok_ = everyone((verdict).ok);                                         \
    QVERIFY2(all_ok_, qPrintable((verdict).ok ? QStringLiteral("failed on another rank") \
                                              : QStringLiteral("rank %1 of %2: %3")      \
                                                    .arg(m_rank)                         \
                                                    .arg(m_size)                         \
                                                    .arg((verdict).why)));               \
  } while (0)

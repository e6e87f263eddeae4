// The accounting allocator: every byte charged to a category, the peak kept,
// the capacity enforced with an OomError naming the category and request,
// and sizes parsed from what people type.
#include <QtTest>

#include "core/allocator.h"
#include "core/error.h"
#include "cpu/cpu_backend.h"
#include "cpu/host_blocks.h"

class TestAllocator : public QObject {
  Q_OBJECT
 private slots:
  void accountsPerCategoryAndPeak() {
    ss::Allocator a;
    a.charge(ss::Category::Weights, 1000, "w");
    a.charge(ss::Category::Activations, 300, "x");
    a.release(ss::Category::Activations, 300);
    a.charge(ss::Category::KvCache, 200, "k");
    const ss::MemState& m = a.state();
    QCOMPARE(m.bytes[int(ss::Category::Weights)], int64_t(1000));
    QCOMPARE(m.bytes[int(ss::Category::Activations)], int64_t(0));
    QCOMPARE(m.peak_bytes[int(ss::Category::Activations)], int64_t(300));
    QCOMPARE(m.total, int64_t(1200));
    QCOMPARE(m.peak_total, int64_t(1300));
  }

  void overCapacityIsAnOomNamingTheCategory() {
    ss::Allocator a(1024);
    a.charge(ss::Category::Weights, 1000, "w");
    try {
      a.charge(ss::Category::KvCache, 100, "layers.3.k_cache");
      QFAIL("expected an OomError");
    } catch (const ss::OomError& e) {
      QCOMPARE(QString::fromStdString(e.category), QStringLiteral("kv_cache"));
      QCOMPARE(e.requested, int64_t(100));
      QCOMPARE(e.in_use, int64_t(1000));
      QCOMPARE(e.capacity, int64_t(1024));
      QVERIFY(QString::fromUtf8(e.what()).contains("layers.3.k_cache"));
    }
    // Nothing was charged by the refused request.
    QCOMPARE(a.state().total, int64_t(1000));
    QCOMPARE(a.state().bytes[int(ss::Category::KvCache)], int64_t(0));
  }

  void tensorsReturnTheirBytes() {
    ss::Allocator a;
    ss::Recorder rec;
    ss::CpuBackend be(a, rec);
    {
      ss::Tensor t = be.alloc({16, 8}, ss::Category::Workspace, "t");
      ss::Tensor view = t.slice(0, 4, 4);  // views share the buffer
      QCOMPARE(a.state().bytes[int(ss::Category::Workspace)], int64_t(16 * 8 * 4));
      t = ss::Tensor();
      QCOMPARE(a.state().total, int64_t(16 * 8 * 4));  // the view keeps it alive
    }
    QCOMPARE(a.state().total, int64_t(0));
    QCOMPARE(a.state().peak_total, int64_t(16 * 8 * 4));
  }

  // The cpu backend's host memory keeps freed blocks of 64 KiB and more for a
  // request of the same size (fresh pages fault on first touch), never more
  // than kCacheBytes in all, and the accounting does not see it.
  void hostBlocksAreReusedBySize() {
    ss::Allocator a;
    ss::Recorder rec;
    ss::CpuBackend be(a, rec);
    const int64_t n = (int64_t(3) << 20) / 4 + 5;  // just over 3 MiB of floats
    const void* first = nullptr;
    {
      ss::Tensor t = be.alloc({n}, ss::Category::CommBuffers, "a");
      first = t.raw();
      QCOMPARE(reinterpret_cast<uintptr_t>(first) % 64, uintptr_t(0));
    }
    QCOMPARE(a.state().total, int64_t(0));
    QVERIFY(ss::cpu::host_cached_bytes() >= size_t(n) * 4);
    {
      ss::Tensor other = be.alloc({n + 1024}, ss::Category::CommBuffers, "other size");
      QVERIFY(other.raw() != first);
      ss::Tensor again = be.alloc({n}, ss::Category::CommBuffers, "b");
      QCOMPARE(static_cast<const void*>(again.raw()), first);  // the same block, already mapped
      ss::Tensor small = be.alloc({16}, ss::Category::Workspace, "small");  // below 64 KiB: not kept
      QCOMPARE(a.state().total, int64_t(n * 4 + (n + 1024) * 4 + 64));
    }
    // Freeing far more than the cap keeps at most the cap, the least recently
    // freed leaving first.
    std::vector<const void*> freed;
    auto elems = [](int i) { return (int64_t(4) << 20) / 4 + i * 16; };  // 64-byte multiples
    {
      std::vector<ss::Tensor> many;
      for (int i = 0; i < 40; ++i) many.push_back(be.alloc({elems(i)}, ss::Category::Workspace, "m"));
      for (auto& t : many) freed.push_back(t.raw());
    }
    const size_t kept = ss::cpu::host_cached_bytes();
    QVERIFY(kept <= ss::cpu::kCacheBytes);
    QVERIFY(kept >= ss::cpu::kCacheBytes - (size_t(5) << 20));
    // Asked for again, the sizes still kept come back as the same blocks (the
    // last ones freed), the others fresh, and the count of kept bytes follows.
    {
      std::vector<ss::Tensor> again;
      size_t reused = 0;
      for (int i = 0; i < 40; ++i) {
        again.push_back(be.alloc({elems(i)}, ss::Category::Workspace, "m"));
        if (again.back().raw() == freed[size_t(i)]) {
          reused += size_t(elems(i)) * 4;
          QVERIFY2(i >= 20, "an early-freed block outlived a later one");
        }
      }
      QVERIFY(reused > 0);
      QCOMPARE(ss::cpu::host_cached_bytes(), kept - reused);
    }
  }

  // Blocks from 64 KiB up are kept too (a tsp layer's gathered K and V, 512
  // KiB at 4 ranks, came in fresh pages every layer when only 1 MiB and more
  // were), several of one size hand out the last one freed first, and a
  // block below the floor is not kept.
  void hostBlocksKeepSmallOnesLastFreedFirst() {
    ss::Allocator a;
    ss::Recorder rec;
    ss::CpuBackend be(a, rec);
    const int64_t n = (int64_t(128) << 10) / 4 + 16 * 3;  // a size no other case uses
    const void *x = nullptr, *y = nullptr;
    const size_t cached = ss::cpu::host_cached_bytes();
    {
      ss::Tensor tx = be.alloc({n}, ss::Category::CommBuffers, "x");
      ss::Tensor ty = be.alloc({n}, ss::Category::CommBuffers, "y");
      x = tx.raw();
      y = ty.raw();
      tx = ss::Tensor();  // x freed first, then y
    }
    QCOMPARE(ss::cpu::host_cached_bytes(), cached + 2 * size_t(n) * 4);  // both kept (n * 4: a 64-byte multiple)
    ss::Tensor first = be.alloc({n}, ss::Category::CommBuffers, "a");
    ss::Tensor second = be.alloc({n}, ss::Category::CommBuffers, "b");
    QCOMPARE(static_cast<const void*>(first.raw()), y);
    QCOMPARE(static_cast<const void*>(second.raw()), x);
    const size_t before = ss::cpu::host_cached_bytes();
    { ss::Tensor below = be.alloc({(int64_t(60) << 10) / 4}, ss::Category::Workspace, "60 KiB"); }
    QCOMPARE(ss::cpu::host_cached_bytes(), before);
  }

  void listenerSeesEveryChange() {
    ss::Allocator a;
    int calls = 0;
    int64_t last = -1;
    a.set_listener([&](const ss::MemState& m) {
      ++calls;
      last = m.total;
    });
    a.charge(ss::Category::Weights, 10, "w");
    a.release(ss::Category::Weights, 10);
    QCOMPARE(calls, 2);
    QCOMPARE(last, int64_t(0));
  }

  void parsesSizes_data() {
    QTest::addColumn<QString>("text");
    QTest::addColumn<qint64>("bytes");
    QTest::newRow("plain") << "1000000" << qint64(1000000);
    QTest::newRow("GiB") << "2GiB" << qint64(2LL << 30);
    QTest::newRow("MiB") << "512MiB" << qint64(512LL << 20);
    QTest::newRow("GB decimal") << "1.5GB" << qint64(1500000000LL);
    QTest::newRow("spaces and case") << "4 kib" << qint64(4096);
    QTest::newRow("bytes") << "12B" << qint64(12);
  }
  void parsesSizes() {
    QFETCH(QString, text);
    QFETCH(qint64, bytes);
    QCOMPARE(ss::parse_bytes(text.toStdString()), int64_t(bytes));
  }

  void refusesBadSizes_data() {
    QTest::addColumn<QString>("text");
    QTest::newRow("unit") << "12XB";
    QTest::newRow("not a number") << "lots";
    QTest::newRow("negative") << "-5MiB";
  }
  void refusesBadSizes() {
    QFETCH(QString, text);
    QVERIFY_THROWS_EXCEPTION(ss::UsageError, ss::parse_bytes(text.toStdString()));
  }
};

QTEST_APPLESS_MAIN(TestAllocator)
#include "tst_allocator.moc"

// The session store's open path on a database file of fuzzed bytes (seeded
// with real databases of both schema versions): the SQLite check, the
// migration, the purge of deleted sessions, then every listing and every
// session's events and stream, as the Sessions page reads them.
#include <QCoreApplication>
#include <QFile>

#include "fuzz_support.h"
#include "sessionstore.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  static QCoreApplication app(*argc, *argv);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = ss::fuzz::scratch_dir() / "sessions.db";
  for (const char* extra : {"-wal", "-shm", "-journal"}) std::filesystem::remove(path.string() + extra);
  ss::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  ss::fuzz::expect_clean("sessions", [&] {
    SessionStore store;
    if (!store.open(QString::fromStdString(path.string()))) {
      if (store.error().isEmpty()) std::abort();  // a refusal always says why
      return;
    }
    for (const SessionInfo& s : store.list()) {
      (void)store.info(s.id);
      (void)store.lines(s.id);
      (void)store.events(s.id);
    }
  });
  return 0;
}

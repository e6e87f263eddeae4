// The event stream Reader: bytes cut into chunks at sizes the input picks
// (a record may arrive in pieces, as it does from a pipe). Every line is
// accepted or rejected with a reason, never both and never neither, and an
// accepted record written back out is accepted again as the same record.
#include "fuzz_support.h"
#include "protocol/events.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t chunk = 1 + data[0] % 64;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  ss::proto::Reader reader;
  int64_t events = 0, errors = 0;
  std::vector<ss::proto::Event> accepted;
  auto on_event = [&](ss::proto::Event&& e) {
    ++events;
    accepted.push_back(std::move(e));
  };
  auto on_error = [&](const std::string& why) {
    ++errors;
    if (why.empty()) std::abort();  // a rejection always says why
  };
  ss::fuzz::expect_clean("stream", [&] {
    for (size_t at = 0; at < text.size(); at += chunk) reader.feed(text.substr(at, chunk), on_event, on_error);
    reader.finish(on_event, on_error);
  });
  if (events != reader.accepted()) std::abort();
  for (const ss::proto::Event& e : accepted) {
    const std::string line = ss::proto::to_line(e);
    ss::proto::Reader again;  // a fresh reader past the hello, as the record's own was
    static const std::string hello = ss::proto::to_line(ss::proto::Hello{ss::proto::kVersion, "fuzz", "host"});
    if (!std::holds_alternative<ss::proto::Hello>(e)) (void)again.parse_line(hello);
    ss::proto::Reader::Result r = again.parse_line(line);
    if (!r.event || ss::proto::to_line(*r.event) != line) {
      std::fprintf(stderr, "stream: an accepted record does not read back as itself:\n%s\n%s\n", line.c_str(),
                   r.error.c_str());
      std::abort();
    }
  }
  return 0;
}

// The safetensors reader: a file's 8-byte header length, its JSON header
// (dtype, shape, data_offsets of every tensor) checked against the file's
// size, and the sharded form's model.safetensors.index.json. The first byte
// picks which one the rest of the input is; every tensor an accepted file
// lists is then read back.
#include "fuzz_support.h"
#include "io/safetensors.h"

namespace {

// One small valid shard for index inputs to point at.
void write_shard(const std::filesystem::path& dir) {
  ss::TensorBlob a{"a", ss::DType::F32, {2, 3}, std::vector<uint8_t>(24, 1)};
  ss::TensorBlob b{"b", ss::DType::BF16, {4}, std::vector<uint8_t>(8, 2)};
  ss::write_safetensors(dir / "model-00001-of-00001.safetensors", {&a, &b});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool index = data[0] & 1;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  const auto dir = ss::fuzz::scratch_dir() / (index ? "sharded" : "single");
  static const bool once = [] {
    std::filesystem::create_directories(ss::fuzz::scratch_dir() / "sharded");
    std::filesystem::create_directories(ss::fuzz::scratch_dir() / "single");
    write_shard(ss::fuzz::scratch_dir() / "sharded");
    return true;
  }();
  (void)once;
  ss::fuzz::expect_clean("safetensors", [&] {
    ss::SafetensorsIndex idx;
    if (index) {
      ss::fuzz::write_file(dir / "model.safetensors.index.json", body);
      idx = ss::SafetensorsIndex::open_dir(dir);
    } else {
      ss::fuzz::write_file(dir / "model.safetensors", body);
      idx = ss::SafetensorsIndex::open_file(dir / "model.safetensors");
    }
    for (auto& [name, e] : idx.entries()) {
      const std::vector<uint8_t> bytes = idx.read(name);
      if (int64_t(bytes.size()) != e.end - e.begin) std::abort();
    }
  });
  return 0;
}

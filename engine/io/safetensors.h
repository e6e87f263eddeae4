// safetensors: an 8-byte little-endian header length, a JSON header mapping
// tensor names to {dtype, shape, data_offsets}, then the raw bytes. Reader for
// single files and for sharded checkpoints (model.safetensors.index.json),
// and a writer (tests and `shardscope-engine export`).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace ss {

struct SafetensorsEntry {
  std::filesystem::path file;
  DType dtype = DType::F32;
  Shape shape;
  int64_t begin = 0, end = 0;  // absolute byte offsets in the file
};

class SafetensorsIndex {
 public:
  // Opens `dir`/model.safetensors, or the shards listed by
  // `dir`/model.safetensors.index.json. Validates every header against the
  // file sizes; throws FormatError naming the file (and tensor).
  static SafetensorsIndex open_dir(const std::filesystem::path& dir);
  static SafetensorsIndex open_file(const std::filesystem::path& file);

  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, SafetensorsEntry>& entries() const { return m_entries; }
  // Reads the raw bytes of a tensor.
  std::vector<uint8_t> read(const std::string& name) const;

 private:
  void add_file(const std::filesystem::path& file, const std::vector<std::string>* only);
  std::map<std::string, SafetensorsEntry> m_entries;
};

struct TensorBlob {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::vector<uint8_t> bytes;
};

// Writes tensors to `file` atomically (a temporary file renamed into place).
void write_safetensors(const std::filesystem::path& file, const std::vector<const TensorBlob*>& tensors);
// Writes `dir`/model.safetensors, or `shards` files plus the index when shards > 1.
void write_checkpoint_tensors(const std::filesystem::path& dir, const std::vector<TensorBlob>& tensors, int shards);

}  // namespace ss

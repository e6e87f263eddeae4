// NumPy .npy (format 1.0) for float32 matrices: the --logits-out file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

namespace ss {

// Writes a C-order float32 array of `shape` atomically (temporary + rename).
void write_npy(const std::filesystem::path& file, const std::vector<int64_t>& shape, const float* data);

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
// Reads a little-endian float32 C-order .npy; throws FormatError.
NpyArray read_npy(const std::filesystem::path& file);

}  // namespace ss

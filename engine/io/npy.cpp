#include "io/npy.h"

#include <fstream>
#include <regex>
#include <string>

#include "core/error.h"

namespace ss {
namespace fs = std::filesystem;

void write_npy(const fs::path& file, const std::vector<int64_t>& shape, const float* data) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? ", " : "");
    n *= shape[i];
  }
  dict += "), }";
  // magic (6) + version (2) + header length (2) + dict, padded with spaces and
  // a newline to a multiple of 64 bytes.
  size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  const fs::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw FormatError(file.string() + ": cannot create (check the folder exists and is writable)");
    out.write("\x93NUMPY\x01\x00", 8);
    const uint16_t hl = uint16_t(dict.size());
    out.put(char(hl & 0xff));
    out.put(char(hl >> 8));
    out.write(dict.data(), std::streamsize(dict.size()));
    out.write(reinterpret_cast<const char*>(data), std::streamsize(n * 4));
    if (!out.flush()) {
      out.close();
      fs::remove(tmp);
      throw FormatError(file.string() + ": write failed (disk full?)");
    }
  }
  fs::rename(tmp, file);
}

NpyArray read_npy(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw FormatError(file.string() + ": cannot open");
  char magic[10];
  if (!in.read(magic, 10) || std::string(magic, 6) != "\x93NUMPY" || magic[6] != 1)
    throw FormatError(file.string() + ": not a version 1 .npy file");
  const uint16_t hl = uint16_t(uint8_t(magic[8]) | (uint8_t(magic[9]) << 8));
  std::string header(hl, '\0');
  if (!in.read(header.data(), hl)) throw FormatError(file.string() + ": truncated header");
  if (header.find("'<f4'") == std::string::npos || header.find("'fortran_order': False") == std::string::npos)
    throw FormatError(file.string() + ": only little-endian float32 C-order arrays are read");
  std::smatch m;
  if (!std::regex_search(header, m, std::regex(R"('shape': \(([^)]*)\))")))
    throw FormatError(file.string() + ": no shape in header");
  NpyArray a;
  std::string dims = m[1];
  std::regex num(R"(\d+)");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it)
    a.shape.push_back(std::stoll(it->str()));
  int64_t n = 1;
  for (auto d : a.shape) n *= d;
  a.data.resize(size_t(n));
  if (!in.read(reinterpret_cast<char*>(a.data.data()), std::streamsize(n * 4)))
    throw FormatError(file.string() + ": truncated data");
  return a;
}

}  // namespace ss

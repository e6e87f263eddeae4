#include "io/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ss {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

DType parse_dtype(const std::string& s, const std::string& where) {
  if (s == "F32") return DType::F32;
  if (s == "BF16") return DType::BF16;
  if (s == "F16") return DType::F16;
  throw FormatError(where + ": dtype " + s + " is not supported (use F32, BF16 or F16)");
}
const char* dtype_tag(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
  }
  return "?";
}

}  // namespace

void SafetensorsIndex::add_file(const fs::path& file, const std::vector<std::string>* only) {
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  if (ec) throw FormatError(file.string() + ": cannot open (" + ec.message() + ")");
  std::ifstream in(file, std::ios::binary);
  if (!in) throw FormatError(file.string() + ": cannot open");
  uint8_t lenbuf[8];
  if (size < 8 || !in.read(reinterpret_cast<char*>(lenbuf), 8))
    throw FormatError(file.string() + ": truncated: shorter than the 8-byte header length");
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | lenbuf[i];
  if (hlen > 100'000'000 || 8 + hlen > size)
    throw FormatError(file.string() + ": truncated or corrupt: header of " + std::to_string(hlen) +
                      " bytes does not fit in a file of " + std::to_string(size) + " bytes");
  std::string header(hlen, '\0');
  in.read(header.data(), std::streamsize(hlen));
  json j = json::parse(header, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw FormatError(file.string() + ": corrupt header (not a JSON object)");
  const int64_t data_start = int64_t(8 + hlen);
  for (auto& [name, v] : j.items()) {
    if (name == "__metadata__") continue;
    if (only && std::find(only->begin(), only->end(), name) == only->end()) continue;
    const std::string where = file.string() + ": tensor '" + name + "'";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets") ||
        !v["dtype"].is_string() || !v["shape"].is_array() || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      throw FormatError(where + ": header entry needs dtype, shape and data_offsets");
    SafetensorsEntry e;
    e.file = file;
    e.dtype = parse_dtype(v["dtype"].get<std::string>(), where);
    for (auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) throw FormatError(where + ": shape must hold non-negative integers");
      e.shape.push_back(d.get<int64_t>());
    }
    // Every size below is checked before it is used: a header can claim
    // anything, and an overflowing product must be a refusal, not a wrap.
    for (auto& o : v["data_offsets"])
      if (!o.is_number_unsigned() || o.get<uint64_t>() > uint64_t(size))
        throw FormatError(where + ": data_offsets must be non-negative integers within the file's " +
                          std::to_string(size) + " bytes");
    int64_t count = 0, bytes = 0;
    if (!checked_numel(e.shape, &count) || __builtin_mul_overflow(count, dtype_size(e.dtype), &bytes))
      throw FormatError(where + ": shape " + shape_str(e.shape) + " is too large (more than 2^63 bytes)");
    e.begin = data_start + v["data_offsets"][0].get<int64_t>();
    e.end = data_start + v["data_offsets"][1].get<int64_t>();
    if (e.end < e.begin || e.end - e.begin != bytes)
      throw FormatError(where + ": data_offsets span " + std::to_string(e.end - e.begin) + " bytes but shape " +
                        shape_str(e.shape) + " needs " + std::to_string(bytes));
    if (uint64_t(e.end) > size)
      throw FormatError(file.string() + ": truncated: tensor '" + name + "' needs bytes up to " +
                        std::to_string(e.end) + " but the file has " + std::to_string(size));
    m_entries[name] = std::move(e);
  }
}

SafetensorsIndex SafetensorsIndex::open_file(const fs::path& file) {
  SafetensorsIndex idx;
  idx.add_file(file, nullptr);
  return idx;
}

SafetensorsIndex SafetensorsIndex::open_dir(const fs::path& dir) {
  std::error_code ec;
  const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    std::ifstream in(index);
    json j = json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw FormatError(index.string() + ": corrupt index (needs a weight_map object)");
    std::map<std::string, std::vector<std::string>> by_file;
    for (auto& [name, f] : j["weight_map"].items()) {
      if (!f.is_string()) throw FormatError(index.string() + ": weight_map entry '" + name + "' is not a file name");
      by_file[f.get<std::string>()].push_back(name);
    }
    SafetensorsIndex idx;
    for (auto& [f, names] : by_file) {
      if (fs::path(f).has_parent_path()) throw FormatError(index.string() + ": shard '" + f + "' must be a plain file name");
      idx.add_file(dir / f, &names);
      for (auto& n : names)
        if (!idx.m_entries.count(n))
          throw FormatError((dir / f).string() + ": tensor '" + n + "' is listed in the index but missing from the shard");
    }
    return idx;
  }
  if (fs::exists(single, ec)) return open_file(single);
  throw FormatError(dir.string() + ": no model.safetensors or model.safetensors.index.json");
}

const SafetensorsEntry* SafetensorsIndex::find(const std::string& name) const {
  auto it = m_entries.find(name);
  return it == m_entries.end() ? nullptr : &it->second;
}

std::vector<uint8_t> SafetensorsIndex::read(const std::string& name) const {
  const SafetensorsEntry& e = m_entries.at(name);
  std::vector<uint8_t> out(static_cast<size_t>(e.end - e.begin));
  int fd = ::open(e.file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw FormatError(e.file.string() + ": cannot open");
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd, out.data() + done, out.size() - done, off_t(e.begin + int64_t(done)));
    if (n <= 0) {
      ::close(fd);
      throw FormatError(e.file.string() + ": truncated while reading tensor '" + name + "'");
    }
    done += size_t(n);
  }
  ::close(fd);
  return out;
}

void write_safetensors(const fs::path& file, const std::vector<const TensorBlob*>& tensors) {
  json header = json::object();
  int64_t off = 0;
  for (const TensorBlob* t : tensors) {
    if (int64_t(t->bytes.size()) != numel(t->shape) * dtype_size(t->dtype))
      throw std::logic_error("write_safetensors: byte size of " + t->name);
    header[t->name] = {{"dtype", dtype_tag(t->dtype)}, {"shape", t->shape}, {"data_offsets", {off, off + int64_t(t->bytes.size())}}};
    off += int64_t(t->bytes.size());
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8) h += ' ';  // keep the data 8-byte aligned, as the format recommends
  const fs::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw FormatError(tmp.string() + ": cannot create");
    uint64_t n = h.size();
    for (int i = 0; i < 8; ++i) out.put(char((n >> (8 * i)) & 0xff));
    out.write(h.data(), std::streamsize(h.size()));
    for (const TensorBlob* t : tensors) out.write(reinterpret_cast<const char*>(t->bytes.data()), std::streamsize(t->bytes.size()));
    if (!out.flush()) {
      out.close();
      fs::remove(tmp);
      throw FormatError(file.string() + ": write failed (disk full?)");
    }
  }
  fs::rename(tmp, file);
}

void write_checkpoint_tensors(const fs::path& dir, const std::vector<TensorBlob>& tensors, int shards) {
  fs::create_directories(dir);
  if (shards <= 1) {
    std::vector<const TensorBlob*> all;
    for (auto& t : tensors) all.push_back(&t);
    write_safetensors(dir / "model.safetensors", all);
    return;
  }
  // Deal tensors to shards in order, balancing bytes.
  int64_t total = 0;
  for (auto& t : tensors) total += int64_t(t.bytes.size());
  const int64_t per = (total + shards - 1) / shards;
  std::vector<std::vector<const TensorBlob*>> parts(static_cast<size_t>(shards));
  int64_t acc = 0;
  for (auto& t : tensors) {
    size_t s = std::min<size_t>(size_t(acc / std::max<int64_t>(per, 1)), size_t(shards - 1));
    parts[s].push_back(&t);
    acc += int64_t(t.bytes.size());
  }
  json map = json::object();
  for (int s = 0; s < shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
    write_safetensors(dir / name, parts[size_t(s)]);
    for (auto* t : parts[size_t(s)]) map[t->name] = name;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
  std::ofstream(dir / "model.safetensors.index.json") << index.dump(2) << "\n";
}

}  // namespace ss

#include "train/checkpoint_io.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>

#include <cstring>
#include <fstream>

#include "core/error.h"

namespace ss {
namespace fs = std::filesystem;

std::vector<float> gather_whole(Backend& be, Communicator* telemetry, const WeightSpec& w, const Tensor& local,
                                bool sender) {
  // Blob: axis, range count, the ranges (int64), then the slice's fp32 values.
  std::string blob;
  if (sender) {
    std::vector<int64_t> head = {int64_t(w.slice.axis), int64_t(w.slice.ranges.size())};
    for (auto& [a, b] : w.slice.ranges) head.insert(head.end(), {a, b});
    std::vector<float> values(size_t(local.numel()), 0.0f);
    be.download(local, values.data());
    blob.assign(reinterpret_cast<const char*>(head.data()), head.size() * 8);
    blob.append(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  }
  std::vector<std::string> all = telemetry ? telemetry->gather_blobs(blob, 0) : std::vector<std::string>{blob};
  if (telemetry && telemetry->rank() != 0) return {};
  std::vector<float> whole(size_t(numel(w.shape)), 0.0f);
  for (const std::string& b : all) {
    if (b.empty()) continue;
    const int64_t* h = reinterpret_cast<const int64_t*>(b.data());
    WeightSlice slice;
    slice.axis = int(h[0]);
    for (int64_t r = 0; r < h[1]; ++r) slice.ranges.push_back({h[2 + 2 * r], h[3 + 2 * r]});
    const float* v = reinterpret_cast<const float*>(b.data() + 8 * (2 + 2 * h[1]));
    for_each_slice_element(w.shape, slice, [&](int64_t li, int64_t gi) { whole[size_t(gi)] = v[li]; });
  }
  return whole;
}

TensorBlob make_blob(const std::string& name, const Shape& shape, const std::vector<float>& values, DType dtype) {
  TensorBlob b;
  b.name = name;
  b.dtype = dtype;
  b.shape = shape;
  b.bytes.resize(values.size() * size_t(dtype_size(dtype)));
  if (dtype == DType::F32) std::memcpy(b.bytes.data(), values.data(), values.size() * 4);
  else narrow(values.data(), int64_t(values.size()), dtype, b.bytes.data());
  return b;
}

// Flushes a file or folder to the disk (a swap must never expose files a power loss could truncate).
static void sync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void write_checkpoint_dir(const fs::path& given, const nlohmann::json& config, const std::vector<TensorBlob>& weights,
                          const std::vector<TensorBlob>& optimizer, const nlohmann::json& state,
                          const std::vector<std::pair<std::string, std::string>>& files) {
  fs::path dir = given.lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // "out/" is the folder "out"
  if (fs::exists(dir) && !fs::is_directory(dir))
    throw UsageError("--save " + dir.string() + " is a file, not a folder; give a folder to write");
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  fs::create_directories(parent);
  // The temporary folder names its host and process, so a save killed part-way
  // is recognised (and cleared) by the next save on that host.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string prefix = "." + dir.filename().string() + ".saving-" + host + "-";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const long pid = std::atol(name.c_str() + prefix.size());
    std::error_code gone;
    if (pid > 0 && ::kill(pid_t(pid), 0) != 0 && errno == ESRCH) fs::remove_all(e.path(), gone);  // best effort
  }
  const fs::path tmp = parent / (prefix + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  {
    std::ofstream cf(tmp / "config.json");
    cf << config.dump(2) << "\n";
    if (!cf) throw std::runtime_error("cannot write " + (tmp / "config.json").string());
  }
  for (const auto& [name, contents] : files) {
    std::ofstream f(tmp / name, std::ios::binary);
    f << contents;
    if (!f) throw std::runtime_error("cannot write " + (tmp / name).string());
  }
  write_checkpoint_tensors(tmp, weights, 1);
  std::vector<const TensorBlob*> opt;
  for (auto& b : optimizer) opt.push_back(&b);
  if (!opt.empty()) write_safetensors(tmp / "optimizer.safetensors", opt);
  {
    std::ofstream st(tmp / "trainer_state.json");
    st << state.dump(2) << "\n";
    if (!st) throw std::runtime_error("cannot write " + (tmp / "trainer_state.json").string());
  }
  for (const auto& e : fs::directory_iterator(tmp)) sync_path(e.path());
  sync_path(tmp);
  // The swap: one atomic exchange of the two folders (Linux renameat2), so
  // `dir` is at every instant either the old checkpoint or the new one; then
  // the old one, now under the temporary name, goes.
  if (fs::exists(dir)) {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0)
      throw std::runtime_error("cannot replace " + dir.string() + ": " + std::strerror(errno) +
                               "; the new checkpoint is in " + tmp.string());
    fs::remove_all(tmp);
  } else {
    fs::rename(tmp, dir);
  }
  sync_path(parent);
}

}  // namespace ss

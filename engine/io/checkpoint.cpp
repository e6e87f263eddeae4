#include "io/checkpoint.h"

#include <fstream>
#include <optional>

#include "core/allocator.h"
#include "core/error.h"
#include "sim/meta_backend.h"
#include <cstring>

namespace ss {
namespace fs = std::filesystem;

namespace {

// Every weight the model needs is in the folder with the shape config.json
// implies; one FormatError naming the file and tensor otherwise.
void check_present(const fs::path& dir, const SafetensorsIndex& index, const std::vector<WeightSpec>& needed) {
  const std::string where = fs::exists(dir / "model.safetensors.index.json") ? (dir / "model.safetensors.index.json").string()
                                                                              : (dir / "model.safetensors").string();
  for (const WeightSpec& w : needed) {
    const SafetensorsEntry* e = index.find(w.name);
    if (!e) throw FormatError(where + ": tensor '" + w.name + "' is missing (config.json asks for it)");
    if (e->shape != w.shape)
      throw FormatError(e->file.string() + ": tensor '" + w.name + "' has shape " + shape_str(e->shape) +
                        " but config.json implies " + shape_str(w.shape));
  }
}

}  // namespace

CheckpointSource::CheckpointSource(const fs::path& dir, const std::vector<WeightSpec>& needed)
    : m_dir(dir), m_index(SafetensorsIndex::open_dir(dir)) {
  check_present(dir, m_index, needed);
}

void CheckpointSource::fill(Backend& be, const WeightSpec& w, const Tensor& dst) {
  if (!be.has_data()) return;
  const SafetensorsEntry& e = *m_index.find(w.name);
  std::vector<uint8_t> bytes = m_index.read(w.name);
  if (w.slice.mirrored()) {
    be.upload(dst, bytes.data(), e.dtype);
    return;
  }
  // This rank's slice in the file's dtype (bytes, never widened): upload
  // copies it when the run's dtype matches and rounds it once otherwise.
  const size_t es = size_t(dtype_size(e.dtype));
  std::vector<uint8_t> local(size_t(dst.numel()) * es);
  const uint8_t* src = bytes.data();
  for_each_slice_element(w.shape, w.slice,
                         [&](int64_t l, int64_t g) { std::memcpy(&local[size_t(l) * es], src + size_t(g) * es, es); });
  be.upload(dst, local.data(), e.dtype);
}

void export_checkpoint(const ModelConfig& cfg, uint64_t seed, const fs::path& dir, DType dtype, int shards,
                       const fs::path& from) {
  // Describe the weights on a meta backend: nothing is allocated.
  Allocator acc;
  Recorder rec;
  std::vector<TensorBlob> blobs;
  std::optional<SafetensorsIndex> src;
  if (!from.empty()) src = SafetensorsIndex::open_dir(from);
  {
    MetaBackend be(acc, rec);
    Model model(cfg, be);
    if (src) check_present(from, *src, model.weights());
    std::vector<float> values;
    for (const WeightSpec& w : model.weights()) {
      TensorBlob b;
      b.name = w.name;
      b.dtype = dtype;
      b.shape = w.shape;
      const int64_t n = numel(w.shape);
      values.resize(size_t(n));
      if (src) {  // the folder's own values, widened from its dtype and rounded once into `dtype`
        // (the index holds float tensors only: parse_dtype refuses any other dtype by name)
        const std::vector<uint8_t> bytes = src->read(w.name);
        widen(bytes.data(), src->find(w.name)->dtype, n, values.data());
      } else {
        const SyntheticDraw draw(w, seed);
        for (int64_t i = 0; i < n; ++i) values[size_t(i)] = draw(i);
      }
      b.bytes.resize(size_t(n * dtype_size(dtype)));
      narrow(values.data(), n, dtype, b.bytes.data());
      blobs.push_back(std::move(b));
    }
  }
  fs::create_directories(dir);
  nlohmann::json j = cfg.source;
  j["torch_dtype"] = dtype == DType::F32 ? "float32" : dtype == DType::BF16 ? "bfloat16" : "float16";
  std::ofstream(dir / "config.json") << j.dump(2) << "\n";
  write_checkpoint_tensors(dir, blobs, shards);
  // A text model stays one: its tokenizer goes with its weights.
  if (!from.empty() && fs::exists(from / "tokenizer.json"))
    fs::copy_file(from / "tokenizer.json", dir / "tokenizer.json", fs::copy_options::overwrite_existing);
}

}  // namespace ss

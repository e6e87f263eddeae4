// Hugging Face model folders: config.json + safetensors (single or sharded),
// loaded by the HF tensor names of the model's weight list.
#pragma once

#include <filesystem>

#include "io/safetensors.h"
#include "model/model.h"

namespace ss {

class CheckpointSource final : public TensorSource {
 public:
  // Opens the folder and checks, before anything is allocated, that every
  // weight the model needs is present with the expected shape. Throws one
  // FormatError naming the file and tensor otherwise.
  CheckpointSource(const std::filesystem::path& dir, const std::vector<WeightSpec>& needed);
  void fill(Backend& be, const WeightSpec& w, const Tensor& dst) override;
  std::string describe() const override { return m_dir.string(); }

 private:
  std::filesystem::path m_dir;
  SafetensorsIndex m_index;
};

// Writes a model folder (config.json + safetensors in `dtype`, in `shards`
// files) with the synthetic weights of `seed`: what tests and demos load.
// With `from` (a model folder's checkpoint), its weights instead, rounded
// once into `dtype` (to nearest even), and its tokenizer.json beside them.
void export_checkpoint(const ModelConfig& cfg, uint64_t seed, const std::filesystem::path& dir, DType dtype,
                       int shards, const std::filesystem::path& from = {});

}  // namespace ss

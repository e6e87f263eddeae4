// Training's files: whole tensors gathered from every rank's slice to the
// root, and checkpoint folders (HF layout: config.json, model.safetensors,
// plus optimizer.safetensors and trainer_state.json) written so that a crash
// or a kill mid-save never leaves a half-written folder where a good one was.
#pragma once

#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "core/backend.h"
#include "io/safetensors.h"
#include "model/weights.h"

namespace ss {

// The global tensor of `w` as fp32 on the root (empty vector elsewhere):
// every sender rank passes its slice `local`; `telemetry` null means one rank.
std::vector<float> gather_whole(Backend& be, Communicator* telemetry, const WeightSpec& w, const Tensor& local,
                                bool sender);

// fp32 host values as a blob of `dtype` (rounded to nearest even).
TensorBlob make_blob(const std::string& name, const Shape& shape, const std::vector<float>& values, DType dtype);

// Writes `dir` as a whole: everything goes into a fresh sibling folder that
// is renamed over `dir` only once complete (the previous folder, if any, is
// kept until then and removed after). `files`: more files of the folder
// (name, contents), e.g. its tokenizer.json.
void write_checkpoint_dir(const std::filesystem::path& dir, const nlohmann::json& config,
                          const std::vector<TensorBlob>& weights, const std::vector<TensorBlob>& optimizer,
                          const nlohmann::json& state,
                          const std::vector<std::pair<std::string, std::string>>& files = {});

}  // namespace ss

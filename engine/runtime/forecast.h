// What a run will need before it starts. `check` and `train --check-only`
// simulate the same run on virtual devices, with no capacity limit and no
// timeline, and read the fullest device's peak from the stream: the sim
// backend allocates what the cpu and cuda backends allocate, in the same
// order, to the byte (tst_sim, tst_cuda_models), so the forecast is the
// run's own peak, not an estimate. It is then set against the memory the
// run would have: --capacity, the profile's, or this host's share.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "protocol/events.h"

namespace ss {

struct RunOptions;
struct TrainOptions;
struct HardwareProfile;
struct RunResult;

// A simulated run's capacity when it has no limit: meta tensors cost
// nothing, so the peak is known even where it would not fit.
inline constexpr int64_t kUnlimitedCapacity = int64_t(1) << 61;

// A run's options for an untimed simulation of its memory (the forecast's,
// scale's points): the same model, shapes and strategy on the sim backend; no
// capacity limit, no spans, no files written, no draws, one thread per rank.
void for_simulation(RunOptions& r);

struct MemoryForecast {
  int rank = 0;                                   // the fullest device
  int64_t peak = 0;                               // its peak, bytes
  std::array<int64_t, kCategoryCount> at_peak{};  // by category as it peaked
  int64_t capacity = 0;                           // what each device would have; 0: not known here
  std::string capacity_source;                    // where that figure comes from (or why none), for the line
  bool fits() const { return capacity <= 0 || peak <= capacity; }
  // "rank 0 peaks at 2.33 GiB (weights 2.00 GiB, kv_cache 257.00 MiB, ...)", largest category first.
  std::string peak_line() const;
};

// The forecast of an inference run (check): `hw` is the profile of a
// simulated run on `nodes` nodes, or null for cpu and cuda ones.
MemoryForecast forecast_inference(const RunOptions& o, const HardwareProfile* hw, int nodes = 1);
// The forecast of a training run (train --check-only): one step, whose
// shapes every later step repeats.
MemoryForecast forecast_training(const TrainOptions& o);

// `check`'s ending: "ok: <peak line> of its <capacity> (<source>)" on stdout
// and 0, or one line on stderr saying what runs out and what to change
// (`training` names training's options in it), and kExitOom.
int report_forecast(const MemoryForecast& f, const RunOptions& o, const TrainOptions* training = nullptr);

// `forecast` then report_forecast, within `seconds` (0: no limit; at most a
// day): a simulation that outlasts them ends the process with "ok" (the
// options and shapes were checked before) and a line saying the memory was
// not forecast. The explorer checks as the setup is typed.
int forecast_and_report(const std::function<MemoryForecast()>& forecast, const RunOptions& o,
                        const TrainOptions* training, double seconds);

// The stream a body writes, captured in memory and read back as events (a
// line its reader refuses is a bug of the engine's, thrown).
std::vector<proto::Event> capture_stream(const std::function<RunResult(proto::Writer&)>& body);

}  // namespace ss

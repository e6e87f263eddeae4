#include "runtime/forecast.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "core/allocator.h"
#include "core/error.h"
#include "protocol/analysis.h"
#include "runtime/host_memory.h"
#include "runtime/rank.h"
#include "runtime/run.h"
#include "runtime/train.h"
#include "sim/hardware.h"

namespace ss {
namespace {

MemoryForecast fullest(const std::vector<proto::Event>& events) {
  const proto::RunStats st = proto::analyze(events);
  if (st.status != "ok") {
    // The plan accepted what a rank then refused: report the rank's reason as the run would.
    const std::string why = st.errors.empty() ? "the simulated run ended " + st.status : st.errors.front().message;
    if (!st.errors.empty() && st.errors.front().code == "usage") throw UsageError(why);
    throw std::runtime_error("check: simulating the run's memory failed: " + why);
  }
  MemoryForecast f;
  for (auto& [rank, r] : st.ranks)
    if (r.peak_total > f.peak) {
      f.rank = rank;
      f.peak = r.peak_total;
      f.at_peak = r.at_peak;
    }
  return f;
}

// What each device of a cpu or cuda run would have, where it is known here.
void set_capacity(MemoryForecast& f, const RunOptions& o) {
  if (o.capacity > 0) {
    f.capacity = o.capacity;
    f.capacity_source = "--capacity";
  } else if (o.backend == "cpu" || o.backend == "cuda-emu") {
    // The ranks `launch` starts on this host share what it has available (runtime/host_memory.h).
    const int64_t available = host_available_bytes();
    if (available <= 0) return;
    f.capacity = available / std::max(o.devices, 1);
    f.capacity_source = "this host's available " + format_bytes(available) +
                        (o.devices > 1 ? " shared by " + std::to_string(o.devices) + " ranks" : std::string());
  } else if (o.backend == "cuda") {
    std::string why;
    f.capacity = cuda_default_capacity(o.devices, &why);
    f.capacity_source = f.capacity > 0 ? "its GPU's free memory, less the CUDA context's reserve" : why;
  }
}

std::string profile_label(const HardwareProfile& hw) {
  return "profile " + (hw.file.empty() ? hw.name : std::filesystem::path(hw.file).stem().string());
}

// What to change, for the part that peaked largest: the options that shrink it.
std::string advice(const MemoryForecast& f, const RunOptions& o, const TrainOptions* training) {
  int largest = 0;
  for (int c = 1; c < proto::kCategoryCount; ++c)
    if (f.at_peak[size_t(c)] > f.at_peak[size_t(largest)]) largest = c;
  const std::string part = proto::kCategoryNames[largest];
  std::vector<std::string> ways;
  const bool sequence_split = o.strategy == "sp" || o.strategy == "tp_sp" || o.strategy == "tsp";
  const char* shorter = training ? "a shorter --seq-len" : "a shorter prompt";
  if (part == "weights" || part == "grads" || part == "optimizer_state") {
    if (o.strategy == "tp" || o.strategy == "tsp")
      ways.push_back("more --devices (" + o.strategy + " shards the weights over all of them)");
    else if (o.strategy == "tp_sp")
      ways.push_back("a larger T in --mesh (T x S = --devices; the weights shard over T)");
    else
      ways.push_back("a strategy that shards the weights (tp or tsp)");
    // Training in bf16 keeps an fp32 master copy: 16 bytes a parameter either way.
    if (o.dtype == DType::F32 && !training) ways.push_back("--dtype bf16");
  } else if (part == "activations" || part == "kv_cache") {
    // (A --batch's sequences run one after another: it does not move the peak.)
    if (training && training->recompute == "none") ways.push_back("--recompute selective or full");
    if (training && training->recompute == "selective") ways.push_back("--recompute full");
    if (training && training->micro_batch > 1) ways.push_back("a smaller --micro-batch");
    ways.push_back(shorter);
    if (part == "kv_cache") {
      if (o.decode > 0) ways.push_back("fewer --decode steps");
      if (cache_dtype(o) == DType::F32) ways.push_back("--kv-dtype bf16");
      ways.push_back("more devices (tp splits the cache by head; sp, tp_sp and tsp by token)");
    } else {
      ways.push_back("more devices under sp, tp_sp or tsp");
    }
  } else if (part == "comm_buffers") {
    if (o.measure_sites) ways.push_back("leaving out --measure-sites (it holds an exact copy of each partial sum)");
    if (!training && sequence_split && o.attention == "gather")
      ways.push_back("--attention ring (K/V pass around the ring instead of being gathered whole)");
    ways.push_back(shorter);
  } else if (part == "ssm_state") {
    ways.push_back("more devices under tp (the states split by head)");
  } else {
    ways.push_back(shorter);
  }
  std::string s;
  for (size_t i = 0; i < ways.size(); ++i)  // a, b, or c
    s += (i == 0 ? "" : i + 1 < ways.size() ? ", " : ways.size() > 2 ? ", or " : " or ") + ways[i];
  return "its largest part is " + part + ": try " + s + "; `scale` shows which strategies fit";
}

}  // namespace

void for_simulation(RunOptions& r) {
  r.backend = "sim";
  r.capacity = kUnlimitedCapacity;
  r.timeline = false;
  r.threads = 1;
  r.keep_all_logits = !r.logits_out.empty();  // what --logits-out keeps, with no file
  r.logits_out.clear();
  r.sampling = Sampling{};  // a draw reads a row on the host: no device memory (and a simulation has no values)
}

std::vector<proto::Event> capture_stream(const std::function<RunResult(proto::Writer&)>& body) {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  if (!f) throw std::runtime_error("cannot open a memory stream");
  try {
    proto::Writer w(f);
    body(w);
  } catch (...) {
    std::fclose(f);
    std::free(buf);
    throw;
  }
  std::fclose(f);
  std::vector<proto::Event> events;
  proto::Reader reader;
  auto keep = [&](proto::Event&& e) { events.push_back(std::move(e)); };
  auto drop = [](const std::string&) {};  // counted by the reader
  reader.feed(std::string_view(buf, len), keep, drop);
  reader.finish(keep, drop);
  std::free(buf);
  // The engine's own stream: a line its reader refuses is a bug, not data to skip.
  if (reader.rejected() > 0)
    throw std::runtime_error(std::to_string(reader.rejected()) + " line(s) of a simulated run were unreadable");
  return events;
}

std::string MemoryForecast::peak_line() const {
  std::vector<int> order;
  for (int c = 0; c < proto::kCategoryCount; ++c)
    if (at_peak[size_t(c)] > 0) order.push_back(c);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return at_peak[size_t(a)] > at_peak[size_t(b)]; });
  std::string s = "rank " + std::to_string(rank) + " peaks at " + format_bytes(peak);
  for (size_t i = 0; i < order.size(); ++i)
    s += (i ? ", " : " (") + std::string(proto::kCategoryNames[order[i]]) + " " + format_bytes(at_peak[size_t(order[i])]);
  return s + (order.empty() ? "" : ")");
}

MemoryForecast forecast_inference(const RunOptions& o, const HardwareProfile* hw, int nodes) {
  RunOptions r = o;
  for_simulation(r);
  HardwareProfile profile = hw ? *hw : load_hardware("h100-sxm");
  if (!hw) {  // a stand-in whose clock is not read (no timeline): one node of the run's devices
    profile.max_devices_per_node = std::max(profile.max_devices_per_node, o.devices);
    nodes = 1;
  }
  MemoryForecast f = fullest(capture_stream([&](proto::Writer& w) { return simulate(r, profile, nodes, 1, w); }));
  if (hw && o.capacity <= 0) {
    f.capacity = hw->memory_bytes;
    f.capacity_source = profile_label(*hw);
  } else {
    set_capacity(f, o);
  }
  return f;
}

MemoryForecast forecast_training(const TrainOptions& o) {
  TrainOptions t = o;
  for_simulation(t.run);
  // Two steps (where the run has them): the optimizer's state is allocated
  // before the first, and the second can hold more than the first (tsp's
  // communication buffers, kept from the first step's backward, beside the
  // second's forward); every later step repeats the second's shapes. The
  // data's values do not change them.
  t.steps = std::min(o.steps, 2);
  t.data = "synthetic";
  t.tokenizer.clear();
  t.save.clear();  // --save and --dump-grads write from the host; --resume's model and state stay
  t.dump_grads.clear();
  t.check_only = false;
  if (o.run.backend != "sim") {
    // A stand-in profile whose clock is not read (no timeline), on as few
    // nodes as hold the run's devices: their count moves no bytes.
    t.hardware = "h100-sxm";
    const int per_node = load_hardware(t.hardware).max_devices_per_node, d = t.run.devices;
    t.nodes = 1;
    while (d / t.nodes > per_node || d % t.nodes) ++t.nodes;
  }
  MemoryForecast f = fullest(capture_stream([&](proto::Writer& w) { return simulate_training(t, w); }));
  if (o.run.backend == "sim" && o.run.capacity <= 0) {
    const HardwareProfile hw = load_hardware(t.hardware);
    f.capacity = hw.memory_bytes;
    f.capacity_source = profile_label(hw);
  } else {
    set_capacity(f, o.run);
  }
  return f;
}

int forecast_and_report(const std::function<MemoryForecast()>& forecast, const RunOptions& o,
                        const TrainOptions* training, double seconds) {
  if (seconds <= 0) return report_forecast(forecast(), o, training);
  // A watchdog ends the process with the options' verdict where the
  // simulation outlasts the budget: nothing is written, and the rank threads
  // need no way to be stopped.
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::thread dog([&] {
    std::unique_lock lock(m);
    const auto budget = std::chrono::milliseconds(int64_t(seconds * 1000));  // (a double duration overflows)
    if (cv.wait_for(lock, budget, [&] { return done; })) return;
    std::printf("ok: options and shapes; its memory was not forecast, simulating this run takes over %g s\n", seconds);
    std::fflush(stdout);
    std::_Exit(kExitOk);
  });
  auto finish = [&] {
    {
      std::lock_guard lock(m);
      done = true;
    }
    cv.notify_all();
    dog.join();
  };
  MemoryForecast f;
  try {
    f = forecast();
  } catch (...) {
    finish();
    throw;
  }
  finish();
  return report_forecast(f, o, training);
}

int report_forecast(const MemoryForecast& f, const RunOptions& o, const TrainOptions* training) {
  if (f.fits()) {
    std::printf("ok: %s", f.peak_line().c_str());
    if (f.capacity > 0) std::printf(" of its %s (%s)", format_bytes(f.capacity).c_str(), f.capacity_source.c_str());
    else if (!f.capacity_source.empty()) std::printf("; no GPU here to set it against (%s)", f.capacity_source.c_str());
    std::printf("\n");
    return kExitOk;
  }
  std::fprintf(stderr, "shardscope-engine: error: would run out of memory: %s, more than its %s (%s); %s\n",
               f.peak_line().c_str(), format_bytes(f.capacity).c_str(), f.capacity_source.c_str(),
               advice(f, o, training).c_str());
  return kExitOom;
}

}  // namespace ss

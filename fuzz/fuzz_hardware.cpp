// The simulator's hardware profiles (resources/hardware/*.json and what
// `calibrate` writes): the device's rates and memory, its links, measured
// GEMM tables. An accepted profile is then asked what the cost model asks.
#include "fuzz_support.h"
#include "sim/cost_model.h"
#include "sim/hardware.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;  // load_hardware refuses non-JSON before this point
  ss::fuzz::expect_clean("hardware", [&] {
    const ss::HardwareProfile h = ss::parse_hardware(j, "profile.json");
    for (ss::DType t : {ss::DType::F32, ss::DType::BF16, ss::DType::F16}) (void)h.matmul_rate(t);
    for (const int64_t m : {1, 512, 65536}) (void)ss::kernel_seconds(h, "gemm", 2.0 * m * 1024 * 1024, 4e6, {m, 1024, 1024});
    for (auto& [op, grid] : h.kernel_times) (void)ss::kernel_seconds(h, op, 1e9, 1e6, {256, 4096}, ss::DType::BF16);
    for (const char* op : {"attention", "rmsnorm", "ssd_scan"}) (void)ss::kernel_seconds(h, op, 1e9, 1e6, {256, 4096});
    for (const char* op : {"all_reduce", "all_gather", "send"}) (void)ss::collective_seconds(h.intra, op, 1 << 20, 4);
  });
  return 0;
}

// The device runtime on a GPU (runtime.h): the CUDA runtime (linked
// statically; it finds the driver when first called), stream-ordered memory
// from the device's pool, and cuBLAS loaded when the first GEMM handle is
// made, so the engine runs -- and says why there is no GPU -- on machines
// without the CUDA libraries.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "cuda/runtime.h"

namespace ss::SS_CUDA_NS {
namespace {

void check(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess)
    throw std::runtime_error(std::string("cuda: ") + call + " failed: " + cudaGetErrorString(rc));
}

cudaStream_t st(Stream s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t ev(Event e) { return static_cast<cudaEvent_t>(e); }

// cuBLAS's entry points, from libcublas.so.<major> of the toolkit built against.
struct CublasApi {
  void* lib = nullptr;
  std::string error;
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t) = nullptr;
  cublasStatus_t (*set_workspace)(cublasHandle_t, void*, size_t) = nullptr;
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t) = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  const char* (*status_string)(cublasStatus_t) = nullptr;
};

const CublasApi& cublas() {
  static CublasApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    api.lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!api.lib) {
      api.error = soname + " not found (" + dlerror() + ")";
      return;
    }
    auto sym = [](const char* name) {
      void* p = dlsym(api.lib, name);
      if (!p && api.error.empty()) api.error = std::string("cuBLAS lacks ") + name;
      return p;
    };
    api.create = reinterpret_cast<decltype(api.create)>(sym("cublasCreate_v2"));
    api.destroy = reinterpret_cast<decltype(api.destroy)>(sym("cublasDestroy_v2"));
    api.set_stream = reinterpret_cast<decltype(api.set_stream)>(sym("cublasSetStream_v2"));
    api.set_workspace = reinterpret_cast<decltype(api.set_workspace)>(sym("cublasSetWorkspace_v2"));
    api.set_math_mode = reinterpret_cast<decltype(api.set_math_mode)>(sym("cublasSetMathMode"));
    api.gemm_ex = reinterpret_cast<decltype(api.gemm_ex)>(sym("cublasGemmEx"));
    api.status_string = reinterpret_cast<decltype(api.status_string)>(sym("cublasGetStatusString"));
  });
  return api;
}

void check_blas(cublasStatus_t rc, const char* call) {
  if (rc == CUBLAS_STATUS_SUCCESS) return;
  const auto& api = cublas();
  throw std::runtime_error(std::string("cuda: ") + call + " failed: " +
                           (api.status_string ? api.status_string(rc) : std::to_string(int(rc))));
}

cudaDataType blas_type(DType t) {
  switch (t) {
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

}  // namespace

void check_launch(const char* kernel) {
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess)
    throw std::runtime_error(std::string("cuda: kernel ") + kernel + " did not launch: " + cudaGetErrorString(rc));
}

namespace {
std::atomic<int> g_dependent_wanted{-1};  // -1: SHARDSCOPE_CUDA_PDL not read yet
}  // namespace

// Decided once, for the device current at the first launch: a process
// drives one GPU (its local rank's), chosen before its first kernel.
bool dependent_launch() {
  static const bool supported = [] {
    int device = 0, major = 0;
    return cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9;
  }();
  if (g_dependent_wanted.load() < 0) {
    const char* env = std::getenv("SHARDSCOPE_CUDA_PDL");
    g_dependent_wanted = env && std::string(env) == "0" ? 0 : 1;
  }
  return supported && g_dependent_wanted.load() == 1;
}

void set_dependent_launch(bool on) { g_dependent_wanted = on ? 1 : 0; }

bool kernel_waits(const void* kernel) {
  static std::mutex mu;
  static std::unordered_map<const void*, bool> known;
  const std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(kernel);
  if (it != known.end()) return it->second;
  cudaFuncAttributes attr{};
  const bool waits = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && attr.ptxVersion >= 90;
  known.emplace(kernel, waits);
  return waits;
}

std::string unavailable_reason() {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc == cudaErrorInsufficientDriver || rc == cudaErrorNoDevice || rc == cudaErrorInitializationError ||
      rc == cudaErrorCompatNotSupportedOnDevice) {
    cudaGetLastError();  // clear the sticky state for the next call
    if (rc == cudaErrorNoDevice) return "no CUDA device";
    return std::string("CUDA driver not found or not usable (") + cudaGetErrorString(rc) + ")";
  }
  if (rc != cudaSuccess) {
    cudaGetLastError();
    return std::string("CUDA device query failed: ") + cudaGetErrorString(rc);
  }
  if (n == 0) return "no CUDA device";
  if (!cublas().error.empty()) return cublas().error;
  return "";
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

DeviceProps device_props(int device) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  DeviceProps d;
  d.name = p.name;
  d.total_bytes = int64_t(p.totalGlobalMem);
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.sm_count = p.multiProcessorCount;
  int current = 0;
  check(cudaGetDevice(&current), "cudaGetDevice");
  check(cudaSetDevice(device), "cudaSetDevice");
  size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  d.free_bytes = int64_t(free_b);
  check(cudaSetDevice(current), "cudaSetDevice");
  int clock_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess)
    d.memory_bandwidth = 2.0 * double(clock_khz) * 1e3 * double(bus_bits) / 8.0;  // double data rate
  cudaGetLastError();
  return d;
}

void set_device(int device) { check(cudaSetDevice(device), "cudaSetDevice"); }

std::string runtime_version() {
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  auto v = [](int x) { return std::to_string(x / 1000) + "." + std::to_string(x % 1000 / 10); };
  return "CUDA runtime " + v(rt) + ", driver " + (drv ? v(drv) : std::string("none"));
}

void* malloc_device(int64_t bytes, Stream s) {
  static std::once_flag pool_once;
  std::call_once(pool_once, [] {
    // Keep freed blocks in the pool instead of returning them to the driver.
    int dev = 0;
    cudaMemPool_t pool;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
      uint64_t keep = UINT64_MAX;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    cudaGetLastError();
  });
  void* p = nullptr;
  const cudaError_t rc = cudaMallocAsync(&p, size_t(bytes > 0 ? bytes : 1), st(s));
  if (rc == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return nullptr;
  }
  check(rc, "cudaMallocAsync");
  return p;
}

void free_device(void* p, Stream s) {
  if (p) check(cudaFreeAsync(p, st(s)), "cudaFreeAsync");
}

void copy_to_device(void* dst, const void* src, int64_t bytes, Stream s) {
  if (bytes > 0) check(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyHostToDevice, st(s)), "cudaMemcpyAsync");
}
void copy_to_host(void* dst, const void* src, int64_t bytes, Stream s) {
  if (bytes > 0) check(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToHost, st(s)), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(st(s)), "cudaStreamSynchronize");
}
void copy_on_device(void* dst, const void* src, int64_t bytes, Stream s) {
  if (bytes > 0)
    check(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToDevice, st(s)), "cudaMemcpyAsync");
}
void copy_2d_on_device(void* dst, int64_t dpitch, const void* src, int64_t spitch, int64_t width, int64_t rows,
                       Stream s) {
  if (width > 0 && rows > 0)
    check(cudaMemcpy2DAsync(dst, size_t(dpitch), src, size_t(spitch), size_t(width), size_t(rows),
                            cudaMemcpyDeviceToDevice, st(s)),
          "cudaMemcpy2DAsync");
}
void memset_device(void* p, int value, int64_t bytes, Stream s) {
  if (bytes > 0) check(cudaMemsetAsync(p, value, size_t(bytes), st(s)), "cudaMemsetAsync");
}

Stream create_stream() {
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}
void destroy_stream(Stream s) { cudaStreamDestroy(st(s)); }
void sync_stream(Stream s) { check(cudaStreamSynchronize(st(s)), "cudaStreamSynchronize"); }
void launch_host_func(Stream s, void (*fn)(void*), void* arg) {
  check(cudaLaunchHostFunc(st(s), fn, arg), "cudaLaunchHostFunc");
}
Event create_event() {
  cudaEvent_t e;
  check(cudaEventCreate(&e), "cudaEventCreate");
  return e;
}
void destroy_event(Event e) { cudaEventDestroy(ev(e)); }
void record_event(Event e, Stream s) { check(cudaEventRecord(ev(e), st(s)), "cudaEventRecord"); }
void wait_event(Stream s, Event e) { check(cudaStreamWaitEvent(st(s), ev(e), 0), "cudaStreamWaitEvent"); }
void sync_event(Event e) { check(cudaEventSynchronize(ev(e)), "cudaEventSynchronize"); }
bool event_done(Event e) {
  const cudaError_t rc = cudaEventQuery(ev(e));
  if (rc == cudaErrorNotReady) return false;
  check(rc, "cudaEventQuery");
  return true;
}
double event_elapsed_ms(Event from, Event to) {
  float ms = 0;
  check(cudaEventElapsedTime(&ms, ev(from), ev(to)), "cudaEventElapsedTime");
  return double(ms);
}

Blas::Blas(Stream s) : m_stream(s) {
  const auto& api = cublas();
  if (!api.error.empty()) throw std::runtime_error("cuda: " + api.error);
  cublasHandle_t h = nullptr;
  check_blas(api.create(&h), "cublasCreate");
  m_handle = h;
  check_blas(api.set_stream(h, st(s)), "cublasSetStream");
  // bf16/fp16 outputs: a split-K GEMM adds its partial sums in fp32, the
  // compute type, and rounds once (cuBLAS may otherwise add them in the
  // output's type, rounding each).
  check_blas(api.set_math_mode(h, cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
             "cublasSetMathMode");
  // A workspace of its own, so cuBLAS never allocates during a captured or timed region.
  constexpr size_t kWorkspace = size_t(32) << 20;
  check(cudaMalloc(&m_workspace, kWorkspace), "cudaMalloc (cuBLAS workspace)");
  check_blas(api.set_workspace(h, m_workspace, kWorkspace), "cublasSetWorkspace");
}

Blas::~Blas() {
  if (m_handle) cublas().destroy(static_cast<cublasHandle_t>(m_handle));
  if (m_workspace) cudaFree(m_workspace);
}

void Blas::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* A, DType at,
                int64_t lda, const void* B, DType bt, int64_t ldb, float beta, void* C, DType ct, int64_t ldc,
                bool tf32) {
  if (m == 0 || n == 0) return;
  const auto& api = cublas();
  const bool f32 = at == DType::F32;
  // fp32 operands: full fp32 (no TF32 down-conversion) unless asked.
  const cublasComputeType_t compute =
      f32 ? (tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F) : CUBLAS_COMPUTE_32F;
  check_blas(api.gemm_ex(static_cast<cublasHandle_t>(m_handle), trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                         trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, int(m), int(n), int(k), &alpha, A, blas_type(at),
                         int(lda), B, blas_type(bt), int(ldb), &beta, C, blas_type(ct), int(ldc), compute,
                         CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx");
}

}  // namespace ss::SS_CUDA_NS

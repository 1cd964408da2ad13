// Helpers of the CUDA kernel tests: skip without a GPU (reported as skipped, never passed), device
// buffers, fresh random inputs (never zeros), poisoned outputs (every element must be written), and
// the relative error ||a - ref|| / ||ref|| in double against a CPU oracle.
//
// Tolerances: a bf16 value carries a relative rounding error of at most u = 2^-8 (8 significant
// bits, 7 stored and the implicit one; round to nearest even: half of the spacing 2^-7 at 1). An
// earlier version used 2^-9, a bound random rounding meets in the norm over many elements but a
// handful of elements need not (swiglu_fwd's 8-element row measured 0.0020 on an H200). An output rounded once to bf16 is within u of its exact value;
// a sum of K products of bf16-rounded inputs accumulated in fp32 has an error of about
// 2u * sqrt(K)-ish in the relative norm for random inputs (each product's inputs carry u each, the
// errors are independent, and the fp32 accumulation adds K * 2^-24 at most). Each test writes its
// bound beside it from these two facts.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/Error.h"
#include "kernels/cuda/Cuda.h"
#include "kernels/cuda/SmPartition.h"
#include "tensor/Tensor.h"

namespace dhelix::cuda::test {

constexpr double kBf16U = 1.0 / 256;  // unit roundoff of bf16: 2^-8

// Keeps stream `s` busy for at least `spin_us` microseconds (one block spinning on the SM clock:
// sm_ids_of_blocks; the clock runs at most at its rated rate, so never shorter), so that work
// queued behind it on `s` is that late: the ordering tests' delay, far longer than any host
// thread's wake-up (a copy of a few hundred MiB is only a tenth of a millisecond at HBM rates).
inline void hold_stream(cudaStream_t s, int spin_us) {
  int32_t* d = nullptr;
  DHX_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&d), sizeof(int32_t), s));
  sm_ids_of_blocks(d, 1, 32, spin_us, s);
  DHX_CUDA(cudaFreeAsync(d, s));
}

// Skips a test without a GPU -- unless DHELIX_REQUIRE_GPU=1 (scripts/gpu-device run sets it: there a
// missing GPU is the device machine's fault, and a section of skips must not read as a pass).
inline bool gpu_required() {
  const char* v = std::getenv("DHELIX_REQUIRE_GPU");
  return v && std::string(v) == "1";
}
#define DHX_REQUIRE_GPU()                                                               \
  do {                                                                                  \
    const ::dhelix::cuda::Probe dhx_p_ = ::dhelix::cuda::probe();                       \
    if (dhx_p_.devices == 0 && ::dhelix::cuda::test::gpu_required())                    \
      GTEST_FAIL() << "no GPU, and DHELIX_REQUIRE_GPU=1 asks for one: " << dhx_p_.why_none; \
    if (dhx_p_.devices == 0) GTEST_SKIP() << "no GPU: " << dhx_p_.why_none;             \
  } while (0)

template <typename T>
class DevBuf {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t n) : n_(n) { DHX_CUDA(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(T))); }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { upload(h); }
  ~DevBuf() { if (p_) cudaFree(p_); }
  DevBuf(DevBuf&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; }
  DevBuf& operator=(DevBuf&& o) noexcept { std::swap(p_, o.p_); std::swap(n_, o.n_); return *this; }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& h) {
    EXPECT_EQ(h.size(), n_);
    DHX_CUDA(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    DHX_CUDA(cudaDeviceSynchronize());
    DHX_CUDA(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  // 0xFF bytes: NaN as float and as bf16, -1 as an int; an element a kernel fails to write stays so.
  void poison() { DHX_CUDA(cudaMemset(p_, 0xFF, n_ * sizeof(T))); }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}
inline std::vector<int32_t> randint(size_t n, uint64_t seed, int32_t hi) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int32_t> d(0, hi - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = d(g);
  return v;
}

// bf16 bits <-> float on the host (round to nearest even, as the device's __float2bfloat16).
inline std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    __nv_bfloat16_raw r;
    r.x = f32_to_bf16(v[i]);
    out[i] = r;
  }
  return out;
}
inline std::vector<float> to_f32(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const __nv_bfloat16_raw r = v[i];
    out[i] = bf16_to_f32(r.x);
  }
  return out;
}
// The values a bf16 tensor holds: v rounded to bf16 (the CPU oracle's inputs, so that the test
// measures the kernel's error and not the inputs' rounding).
inline std::vector<float> round_bf16(const std::vector<float>& v) { return to_f32(to_bf16(v)); }

// ||a - ref|| / ||ref|| in double; infinity when a holds a NaN or an infinity (never passes).
inline double rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  EXPECT_EQ(a.size(), ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& ref) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    m = std::max(m, std::abs(static_cast<double>(a[i]) - ref[i]));
  }
  return m;
}

}  // namespace dhelix::cuda::test

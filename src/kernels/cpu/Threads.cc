// The run's kernel settings (Kernels.h: KernelConfig) and the thread count of the CPU kernels'
// OpenMP loops, GEMMs included. What this relies on: OpenMP's thread count is a per-thread ICV
// (omp_set_num_threads sets nthreads-var for the calling thread only; libgomp gives a thread that
// never set it OMP_NUM_THREADS, else the core count), so ranks run as threads keep their own; and
// OpenBLAS stays single-threaded (gemm() slabs C over OpenMP; Gemm.cc). No state of our own.
#include <omp.h>
#include <cblas.h>

#include <mutex>

#include "base/Error.h"
#include "kernels/cpu/Bf16.h"
#include "kernels/cpu/Kernels.h"

namespace dhelix::cpu {
namespace {

// OpenBLAS's own thread count is process-wide; it is made 1 once, before the first OpenMP setting
// (an OpenMP build of OpenBLAS would reset the caller's ICV here), and never changed again.
void make_blas_serial() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

}  // namespace

KernelConfig kernel_config(int threads, GemmPrecision precision) {
  DHX_CHECK(threads >= 1, ConfigError, "kernel threads={}: need threads >= 1", threads);
  if (precision == GemmPrecision::kBf16) require_bf16();
  return KernelConfig{threads, precision};
}

void set_num_threads(int n) {
  DHX_CHECK(n >= 1, ConfigError, "set_num_threads(n={}): need n >= 1", n);
  make_blas_serial();
  omp_set_num_threads(n);
}

int num_threads() {
  make_blas_serial();
  return omp_get_max_threads();
}

}  // namespace dhelix::cpu

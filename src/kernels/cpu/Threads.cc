// Thread count of the OpenMP loops of the CPU kernels (GEMMs included: gemm() slabs C over the
// OpenMP threads and OpenBLAS itself stays single-threaded, so there is one thread pool). It is
// one process-wide setting by nature (both libraries keep it globally); default from
// DHELIX_THREADS, else 1 (one rank per core). Not here: pinning, the comm threads.
#include <omp.h>
#include <cblas.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "base/Error.h"
#include "kernels/cpu/Kernels.h"
#include "kernels/cpu/Parallel.h"

namespace dhelix::cpu {
namespace {

int default_threads() {
  const char* env = std::getenv("DHELIX_THREADS");
  if (env == nullptr || *env == '\0') return 1;
  char* end = nullptr;
  long n = std::strtol(env, &end, 10);
  DHX_CHECK(end != env && *end == '\0' && n >= 1 && n <= 4096, ConfigError,
            "DHELIX_THREADS='{}' is not a thread count in [1, 4096]", env);
  return static_cast<int>(n);
}

void apply(int n) {
  openblas_set_num_threads(1);  // gemm() threads over OpenMP; see Gemm.cc
  omp_set_num_threads(n);
}

// 0 = not yet initialised; the first num_threads() applies the default to both libraries.
std::atomic<int> g_threads{0};

}  // namespace

void set_num_threads(int n) {
  DHX_CHECK(n >= 1, ConfigError, "set_num_threads(n={}): need n >= 1", n);
  apply(n);
  g_threads.store(n);
}

int num_threads() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n > 0) [[likely]] return n;
  static const int init = [] {
    int d = default_threads();
    apply(d);
    int expected = 0;
    g_threads.compare_exchange_strong(expected, d);
    return d;
  }();
  (void)init;
  return g_threads.load();
}

}  // namespace dhelix::cpu

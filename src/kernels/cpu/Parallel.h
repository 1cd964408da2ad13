// OpenMP helpers shared by the CPU kernels (internal, not part of Kernels.h): how many threads a
// loop of a given size should use, and a scope that makes BLAS single-threaded while our own
// OpenMP threads call it on small tiles (attention), so the two pools do not oversubscribe.
#pragma once
#include <cstdint>

#include "kernels/cpu/Kernels.h"

namespace dhelix::cpu::detail {

// Below this many elements a parallel region costs more than it saves.
inline constexpr int64_t kMinParallelWork = 1 << 15;

// Threads for a loop touching `work` elements: num_threads(), or 1 for small loops.
inline int threads_for(int64_t work) { return work < kMinParallelWork ? 1 : num_threads(); }

// While alive, BLAS runs single-threaded; restores num_threads() on exit. Only used around
// OpenMP regions whose threads each call gemm on small tiles.
class BlasSerialScope {
 public:
  explicit BlasSerialScope(int omp_threads);
  ~BlasSerialScope();
  BlasSerialScope(const BlasSerialScope&) = delete;
  BlasSerialScope& operator=(const BlasSerialScope&) = delete;

 private:
  bool active_;
};

}  // namespace dhelix::cpu::detail

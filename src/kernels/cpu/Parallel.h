// OpenMP helpers shared by the CPU kernels (internal, not part of Kernels.h): how many threads a
// loop of a given size should use. BLAS is always single-threaded (Threads.cc), so OpenMP
// threads may call gemm() on small tiles (attention) without oversubscribing.
#pragma once
#include <cstdint>

#include "kernels/cpu/Kernels.h"

namespace dhelix::cpu::detail {

// Below this many elements a parallel region costs more than it saves.
inline constexpr int64_t kMinParallelWork = 1 << 15;

// Threads for a loop touching `work` elements: num_threads(), or 1 for small loops.
inline int threads_for(int64_t work) { return work < kMinParallelWork ? 1 : num_threads(); }

}  // namespace dhelix::cpu::detail

// Order statistics of timing samples, shared by the benchmarks and the profiler.
#pragma once
#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "base/Error.h"

namespace dhelix {

// The q-quantile (0 <= q <= 1) of v, interpolating linearly between order statistics (the
// "linear" method): q = 0 is the minimum, q = 1 the maximum, q = 0.5 the median.
inline double quantile(std::vector<double> v, double q) {
  DHX_ASSERT(!v.empty(), "quantile of no samples");
  DHX_ASSERT(q >= 0 && q <= 1, "quantile q={} outside [0, 1]", q);
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

// The middle value; the mean of the two middle values for an even count.
inline double median(std::vector<double> v) { return quantile(std::move(v), 0.5); }

}  // namespace dhelix

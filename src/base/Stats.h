// Order statistics of timing samples, shared by the benchmarks and the profiler.
#pragma once
#include <algorithm>
#include <cmath>
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

// A distribution-free confidence interval for the median: the order statistics x_(k) and
// x_(n+1-k) of n samples bracket the true median with probability 1 - 2 P(Bin(n, 1/2) < k),
// whatever the distribution (continuous, samples independent). k is the largest whose coverage
// still reaches `level`; with too few samples for that, k = 1 (min and max) and `coverage` says
// how far short it falls (n = 4: 0.875).
struct MedianInterval {
  double lo = 0, hi = 0;
  double coverage = 0;  // the exact probability that [lo, hi] holds the median
};

inline MedianInterval median_interval(std::vector<double> v, double level) {
  DHX_ASSERT(!v.empty(), "median interval of no samples");
  DHX_ASSERT(level > 0 && level < 1, "confidence level {} outside (0, 1)", level);
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  // One pass over k: below = P(Bin(n, 1/2) < k) and term = C(n, k) / 2^n, in double (finite for
  // any n a benchmark reaches). Start at k = 1: below = C(n, 0) / 2^n.
  double below = std::pow(0.5, static_cast<double>(n)), term = below * static_cast<double>(n);
  size_t k = 1;
  while (2 * (k + 1) <= n + 1 && 1 - 2 * (below + term) >= level) {
    below += term;
    term = term * static_cast<double>(n - k) / static_cast<double>(k + 1);
    ++k;
  }
  return {v[k - 1], v[n - k], 1 - 2 * below};
}

// Kendall's tau-b between two paired samples: (concordant - discordant) pairs over
// sqrt((n0 - ties in a) (n0 - ties in b)), n0 = n (n - 1) / 2; 1 for the same order, -1 for the
// reverse, 0 when either sample is constant (no order to compare).
inline double kendall_tau_b(const std::vector<double>& a, const std::vector<double>& b) {
  DHX_ASSERT(a.size() == b.size(), "kendall tau of {} and {} samples", a.size(), b.size());
  double concordant = 0, discordant = 0, ties_a = 0, ties_b = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = i + 1; j < a.size(); ++j) {
      const double da = a[i] - a[j], db = b[i] - b[j];
      if (da == 0 && db == 0) continue;  // tied in both: in neither n0 - n1 nor n0 - n2
      if (da == 0) ties_a += 1;
      else if (db == 0) ties_b += 1;
      else if ((da > 0) == (db > 0)) concordant += 1;
      else discordant += 1;
    }
  const double denom = std::sqrt((concordant + discordant + ties_b) * (concordant + discordant + ties_a));
  return denom > 0 ? (concordant - discordant) / denom : 0.0;
}

}  // namespace dhelix

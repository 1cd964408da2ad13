// The price of one SI block, as the plan search sees it: a forward window alone, a backward
// window alone, or the two co-executed. Implemented by the measured Profile (plan/Profile.h)
// and the analytical CostModel (sim/CostModel.h). +inf means "unknown or not allowed".
#pragma once
#include <limits>

#include "plan/SIPlan.h"

namespace dhelix {

inline constexpr double kNoCost = std::numeric_limits<double>::infinity();

class BlockCost {
 public:
  virtual ~BlockCost() = default;
  // Seconds for forward ops [a, b) alone.
  virtual double solo_fwd(int a, int b) const = 0;
  // Seconds for backward ops [c, d) alone.
  virtual double solo_bwd(int c, int d) const = 0;
  // Seconds for forward [a, b) co-executed with backward [c, d) (both non-empty).
  virtual double pair(int a, int b, int c, int d) const = 0;

  // Cost of one block, dispatching on which windows are non-empty (kNoCost for an empty block).
  double block(const Block& k) const {
    if (k.has_fwd() && k.has_bwd()) return pair(k.fwd_begin, k.fwd_end, k.bwd_begin, k.bwd_end);
    if (k.has_fwd()) return solo_fwd(k.fwd_begin, k.fwd_end);
    if (k.has_bwd()) return solo_bwd(k.bwd_begin, k.bwd_end);
    return kNoCost;
  }
  // Sum of block costs: the additive model of §5.1 (kNoCost if any block is unpriced).
  double plan(const SIPlan& p) const {
    double t = 0;
    for (const Block& k : p.blocks) t += block(k);
    return t;
  }
};

}  // namespace dhelix

// The SI plan search (§5): dynamic programming over (i, j) = ops consumed from the forward and
// backward strands. A step is one block: a window [a, i) of fwd ops alone, [c, j) of bwd ops
// alone, or both; windows follow a WindowRule and a block never holds two collectives of one
// process group. Cost = sum of BlockCost prices (additive because blocks are barrier-separated),
// so the DP is optimal under that model. It keeps the k best paths per cell, giving the top-k
// distinct plans for real-time validation. brute_force_search enumerates every plan (tests).
#pragma once
#include <cstdint>
#include <vector>

#include "plan/BlockCost.h"
#include "plan/Program.h"
#include "plan/SIPlan.h"
#include "plan/Windows.h"

namespace dhelix {

struct SearchOptions {
  int top_k = 1;                                   // how many distinct plans to return
  WindowRule windows = WindowRule::kWithinSegments;
  int max_window = 0;                              // longest window in ops; 0 = no limit
};

struct SearchResult {
  // best first, pairwise distinct, at most top_k; predicted_s set; carry as carry_trailing_wgrads
  // (BasicPlans.h) sets it, which the cost model does not price
  std::vector<SIPlan> plans;
  int64_t blocks_priced = 0;  // BlockCost calls made (a measure of work)
  int64_t paths = 0;          // brute force only: complete plans enumerated
};

// Throws PlanError when no complete plan has a finite cost (e.g. a profile lacking the
// single-op solo entries), or when top_k < 1.
SearchResult search_plans(const LayerProgram& prog, const BlockCost& cost,
                          const SearchOptions& opts = {});

// Convenience: the single best plan (source "search").
SIPlan best_plan(const LayerProgram& prog, const BlockCost& cost, const SearchOptions& opts = {});

// Exhaustive enumeration of every legal block sequence: the oracle for the DP. Exponential;
// for programs of a handful of ops only.
SearchResult brute_force_search(const LayerProgram& prog, const BlockCost& cost,
                                const SearchOptions& opts = {});

}  // namespace dhelix

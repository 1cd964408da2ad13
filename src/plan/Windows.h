// Op windows of one strand and the legality rules shared by the checker, the profiler (which
// windows to time) and the plan search (which blocks to consider). Pure functions over a
// LayerProgram; nothing here prices or runs a window (that is BlockCost / the executor).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "plan/Program.h"

namespace dhelix {

// Half-open window [begin, end) of one strand's ops; empty when begin == end.
struct Window {
  int begin = 0, end = 0;
  bool empty() const { return end <= begin; }
  int size() const { return end - begin; }
  friend bool operator==(const Window&, const Window&) = default;
};

// Which windows a planner may cut. kWithinSegments is the rule of §3.4 (a window never crosses
// a collective/compute boundary); kAnyContiguous also allows "collective + its consumers".
enum class WindowRule { kWithinSegments, kAnyContiguous };

// Every non-empty window of `ops` allowed by `rule`, ordered by (begin, end). With
// max_len > 0 windows longer than max_len ops are left out.
std::vector<Window> strand_windows(const std::vector<Op>& ops, WindowRule rule, int max_len = 0);

// For each op index i, the largest e such that [i, e) lies inside i's segment.
std::vector<int> segment_ends(const std::vector<Op>& ops);

// Process-group roles of the collectives in `w`, in op order (a role may repeat).
std::vector<std::string> window_groups(const std::vector<Op>& ops, Window w);

// True when no process group has two collectives among the ops of both windows together
// (the block rule: "never two collectives on the same process group").
bool block_groups_legal(const LayerProgram& prog, Window f, Window b);

// "[a,b) op1 op2" style readable name of a window, for messages.
std::string window_label(const std::vector<Op>& ops, Window w);

}  // namespace dhelix

namespace dhelix {

// Every (fwd window, bwd window) pair the planner may co-execute under `rule`: both non-empty
// and block_groups_legal. This is the list the profiler times (plus the solo windows).
std::vector<std::pair<Window, Window>> legal_pairs(const LayerProgram& prog, WindowRule rule,
                                                   int max_len = 0);

}  // namespace dhelix

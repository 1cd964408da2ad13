// An SI plan for one folded layer pair: an ordered list of blocks, each holding a contiguous
// window of forward-strand ops, of backward-strand ops, or both, with at most one collective
// per process group. Pure data; the checker and JSON format live beside it (PlanIO).
#pragma once
#include <string>
#include <vector>

namespace dhelix {

// Half-open op windows [begin, end) into the pair's forward and backward programs.
// An empty window (begin == end) means the strand has nothing in this block.
struct Block {
  int fwd_begin = 0, fwd_end = 0;
  int bwd_begin = 0, bwd_end = 0;
  bool has_fwd() const { return fwd_end > fwd_begin; }
  bool has_bwd() const { return bwd_end > bwd_begin; }
  friend bool operator==(const Block&, const Block&) = default;
};

struct SIPlan {
  static constexpr int kVersion = 2;  // 2 added `carry`; version 1 files read as carry = 0
  std::string pair;       // which layer pair program it is for: "block" (transformer layers)
  std::string source;     // "default", "search", "file:<path>", ...
  std::vector<Block> blocks;
  // The last `carry` backward ops (trailing weight-gradient GEMMs, which write no buffer) do not
  // run in their own pair: the executor runs them in the next layer pair of the slot, right after
  // that pair's first collective is issued, so they hide it. Both strands start a layer with a
  // collective after only tiny compute (norm / residual), so without carry the first collective
  // of every pair has nothing of the other strand to hide under.
  int carry = 0;
  double predicted_s = 0;  // the planner's predicted time for the pair (0 if unknown)
};

}  // namespace dhelix

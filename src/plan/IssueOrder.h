// IssueOrder: the one rule for issuing a co-executed layer pair's ops under an SI plan (DESIGN.md,
// Strand Interleaving), as a pure sequence of steps. The executor (runtime/Executor.cc, run_pair)
// and the pair simulator (sim/PairSim.cc) both walk it; the plan search's additive cost model
// (sim/CostModel.cc) approximates it (its comment says how). Per block:
//   1. each strand's leading collectives are issued, the forward strand's first;
//   2. ops carried in from the previous pair (SIPlan::carry: its trailing weight-gradient GEMMs)
//      run right after the leading collectives of the first block that has any, so they hide that
//      collective; after the last block when no block has one;
//   3. the strand that does not wait on a collective of this block runs its remaining ops first;
//      ties go to the backward strand (the activations it frees are reused by the forward strand's
//      new ones); a strand waits when a collective follows its first compute op in the window, or
//      when its leading collectives are followed by compute that reads them;
//   4. the block ends: what it issued completes before the next block starts.
// Not here: what "issue", "run" and "complete" mean (threads and joins, simulated time, streams and
// events), nor which collectives a consumer waits for at once or leaves in the background.
#pragma once
#include <cstddef>
#include <vector>

#include "plan/Program.h"
#include "plan/SIPlan.h"

namespace dhelix {

struct IssueStep {
  enum class Kind {
    kOp,        // issue (collective) or run (compute) op `op` of `strand`'s program
    kCarried,   // run the `op`-th op carried in from the previous pair (backward strand)
    kBlockEnd,  // every op block `block` issued completes here
  };
  Kind kind = Kind::kOp;
  StrandKind strand = StrandKind::kForward;
  int op = 0;     // kOp: index into the strand's ops; kCarried: 0 .. carried_in - 1
  int block = 0;  // the block the step belongs to; kCarried after the last block: blocks.size()
  friend bool operator==(const IssueStep&, const IssueStep&) = default;
};

// The two strands of one pair as the plan's windows index them.
struct PairStrands {
  const std::vector<Op>* fwd = nullptr;  // null: no forward strand in this pair
  const std::vector<Op>* bwd = nullptr;  // null: no backward strand in this pair
  int carry_out = 0;   // the last carry_out backward ops do not run here (the next pair runs them)
  int carried_in = 0;  // ops an earlier pair carried out, run here by rule 2
};

class IssueOrder {
 public:
  // ConfigError when a block has ops of an idle strand or carry_out is outside [0, |bwd|].
  IssueOrder(const PairStrands& strands, const std::vector<Block>& blocks);

  using const_iterator = std::vector<IssueStep>::const_iterator;
  const_iterator begin() const { return steps_.begin(); }
  const_iterator end() const { return steps_.end(); }
  std::size_t size() const { return steps_.size(); }
  const std::vector<IssueStep>& steps() const { return steps_; }

 private:
  std::vector<IssueStep> steps_;
};

}  // namespace dhelix

// Discrete-event simulation of one layer pair under a Strand-Interleaving plan: the forward strand
// of one micro-batch beside the backward strand of another, op by op, walking the executor's issue
// order (plan/IssueOrder.h, which runtime/Executor.cc's run_pair walks too) with no backend. One
// compute engine per rank; one FIFO channel per process group (its comm thread). Per block:
//   1. each strand's leading collectives are issued (forward's first), each once its inputs are
//      ready (the engine waits for a collective input, as the compute thread does);
//   2. carried-in backward ops (SIPlan::carry, the previous pair's trailing weight-gradient GEMMs)
//      run right after the first block that issued a leading collective;
//   3. the strand that does not wait on a collective of the block runs its remaining ops first
//      (ties: the backward strand): a compute op when the engine is free and its inputs are ready,
//      a later collective when reached (inputs ready);
//   4. the block ends when its ops ran and every collective issued in it completed (a
//      "background" collective excepted: only the op that reads it waits for it).
// A "blocking" collective is waited for where it is issued. Buffers of the pair's inputs (x, dy,
// saved activations) are ready at time 0. Steady state: the carried ops of the previous pair are
// modelled as this pair's own (the same program in every layer); so is a 3D weight gather a
// prefetch op issues for the next layer (OAG, Grid3D.h prefetch_block): the layer's own gather of
// that buffer is there already, and the prefetch op takes the gather's time on the channel.
// Costs come from an OpTimer (seconds of a compute op on the engine, or of a collective on its
// channel): the analytical rates (op_time, StepModel.h) or a profile of this machine. Interference
// (PairSimOptions): a compute op slows while a collective of its rank is in flight, and the
// collective while the rank computes.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "plan/Program.h"
#include "plan/SIPlan.h"

namespace dhelix {

using OpTimer = std::function<double(const Op&)>;

struct SimOp {
  StrandKind strand = StrandKind::kForward;
  int index = 0;          // into its strand's ops
  std::string lane;       // "compute" or the collective's group
  double begin_s = 0, end_s = 0;
};

struct PairSimResult {
  double span_s = 0;     // the pair, first issue to the end of the last block
  double compute_s = 0;  // engine busy time (both strands)
  double idle_s = 0;     // span - compute: time the engine waited on collectives
  // The engine's waits charged to the collective (by op name) that ended each: the one whose output
  // a compute op or a collective's issue waited for, a blocking one, the latest of a block's end,
  // the last on the busiest channel past the engine's end. They sum to idle_s.
  std::map<std::string, double> exposed_s;
  std::map<std::string, double> channel_busy_s;  // per group
  std::vector<double> block_end_s;               // end of each block
  std::vector<SimOp> ops;                        // in the order they ran / were issued
};

// Co-execution interference: a compute op that runs while a collective of this rank is in flight
// progresses `compute_slowdown` times slower for that part (the comm thread's CPU work, NCCL's
// SMs); a collective in flight while the rank computes progresses `comm_slowdown` times slower for
// that part (its comm threads wait behind the compute thread for the core: a CPU rank's TCP work,
// a GPU's SMs shared with NCCL); 1 = none. With both, each slows the other: the pair is simulated
// again with the previous pass's compute intervals stretching the collectives until the span
// settles (a fixed point; the closed forms are in the tests).
struct PairSimOptions {
  double compute_slowdown = 1.0;
  double comm_slowdown = 1.0;
};

// The two rules above for one op, which the step model's strand pricer (price_strand) shares:
// when a compute op of `t` seconds begun at `begin` ends, progressing 1/k as fast until
// `comm_busy_until` (the latest end of the collectives in flight when it begins: they keep the
// rank's channels busy without a gap till then); and when a collective of `t` seconds issued at
// `begin` ends, progressing 1/k as fast inside the compute intervals `computing` (sorted, disjoint).
double compute_end_beside_comm(double begin, double t, double k, double comm_busy_until);
double comm_end_beside_compute(double begin, double t, double k,
                               const std::vector<std::pair<double, double>>& computing);

// A strand's prefetch ops (OAG across layers, Grid3D.h prefetch_block: attr "prefetch_unit",
// output "<buffer>.next", no bytes of their own): each with the buffer it fills for the next layer
// and the strand's own gather of that buffer, which it stands for in a stack of such layers (null
// when the strand has none). The pair simulator and the step model's strand pricer read them alike.
struct Prefetch3D {
  const Op* op = nullptr;
  std::string buffer;
  const Op* gather = nullptr;
};
std::vector<Prefetch3D> prefetches_of(const std::vector<Op>& ops);

// One block of all of `f`'s and `b`'s ops (either may be null): a strand alone, or two run side by
// side with no barrier between their ops.
SIPlan one_block_plan(const std::vector<Op>* f, const std::vector<Op>* b);

// `fwd` / `bwd` may be null (a strand idle in this pair); `plan.blocks` index into them. The timer
// is called with references into `*fwd` / `*bwd` (so it may look an op up by address).
PairSimResult simulate_pair(const std::vector<Op>* fwd, const std::vector<Op>* bwd, const SIPlan& plan,
                            const OpTimer& time, const PairSimOptions& opt = {});

}  // namespace dhelix

// The step schedule: for every pipeline rank, the ordered slots of one optimizer step — which
// micro-batch's forward and which one's backward run on which of the rank's chunks, and which
// point-to-point transfers go with them. Pure data with its checker, which proves a schedule for
// all ranks at once by simulating their slot lists together, and a timeline that prices it.
// Made by the generators in schedule/Pipelines.h; run by runtime/StepRunner; drawn by ScheduleSvg.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace dhelix {

// A virtual stage: a contiguous range [unit_begin, unit_end) of the model's units in forward
// order (unit 0 the embedding, 1..L the transformer layers, L+1 the head), held by one pp rank.
// chunks[i + 1] continues where chunks[i] ends.
struct Chunk {
  int rank = 0;
  int unit_begin = 0, unit_end = 0;
  int size() const { return unit_end - unit_begin; }
};

// One micro-batch's forward (or backward) through one chunk; mb < 0: none.
struct Pass {
  int mb = -1;
  int chunk = -1;
  bool active() const { return mb >= 0; }
  friend bool operator==(const Pass&, const Pass&) = default;
};

enum class TransferKind { kActivation, kGradient };
const char* transfer_kind_name(TransferKind k);  // "act", "grad"

// A tensor crossing the boundary between chunk `boundary - 1` and chunk `boundary` (1 <= boundary
// < #chunks) on different ranks: an activation goes up the chunk order (boundary-1 -> boundary),
// a gradient down (boundary -> boundary-1). (kind, mb, boundary) names one message of the step.
struct Transfer {
  TransferKind kind = TransferKind::kActivation;
  int mb = 0;
  int boundary = 0;
  int peer = 0;  // the other pp rank
  friend bool operator==(const Transfer&, const Transfer&) = default;
};

// One slot of a rank: its forward pass, its backward pass, or both. With both, the two are
// co-executed (Strand Interleaving): forward unit fwd_begin+i runs beside backward unit
// bwd_end-1-i, the plan of that pair deciding the op order, and the longer pass's remaining units
// run alone after. `recvs` are the inputs the passes take from other ranks (each posted
// StepSchedule::recv_lookahead slots ahead); `sends` the outputs they hand on, posted as produced.
struct Slot {
  Pass fwd, bwd;
  std::vector<Transfer> recvs, sends;
  std::string phase;  // "warm-up", "steady", "cool-down" (the generator's named phase)
  bool co_executed() const { return fwd.active() && bwd.active(); }
};

struct StepSchedule {
  std::string name;  // "1f1b", "interleaved", "w"
  int pp = 1;
  int micro_batches = 0;
  int num_units = 0;          // units of the whole model (L + 2)
  int recv_lookahead = 1;     // a slot's receives are posted when the slot this many before it begins
  std::vector<Chunk> chunks;  // forward order
  std::vector<std::vector<Slot>> ranks;  // [pp rank] -> slots in execution order

  // Indices of the chunks rank r holds, in forward order.
  std::vector<int> chunks_of(int rank) const;
};

// Fills every slot's recvs and sends from the chunk placement: a pass whose neighbouring chunk (the
// producer of its input, the consumer of its output) lives on another rank gets a transfer.
// Generators call it last; the checker verifies the result against the same rule.
void attach_transfers(StepSchedule& s);

// Rule names used in messages, so tests and tools can match on them.
inline constexpr const char* kRuleChunks = "chunks partition the units";
inline constexpr const char* kRulePlacement = "pass on its chunk's rank";
inline constexpr const char* kRuleOnce = "each pass exactly once";
inline constexpr const char* kRuleDependency = "inputs before use";
inline constexpr const char* kRuleTransfer = "every transfer matched";
inline constexpr const char* kRuleDeadlock = "no deadlock";

struct ScheduleViolation {
  int rank = -1;  // pp rank, or -1 for the schedule as a whole
  int slot = -1;  // slot index on that rank, or -1
  std::string rule;
  std::string detail;
  std::string message() const;  // "rank 1 slot 4: rule 'no deadlock': ..."
};

// Every violation (empty when the schedule is legal):
//   chunks:      chunks are non-empty, contiguous, cover [0, num_units), ranks in [0, pp);
//   placement:   mb in [0, micro_batches), chunk index valid, held by the slot's rank;
//   once:        every (mb, chunk) forward and backward appears exactly once (missing ones are
//                reported on the owning rank with slot -1, repeats at the repeat);
//   dependency:  on one rank, a pass whose input comes from a pass of the same rank (the forward
//                of the chunk before, the backward of the chunk after, a backward's own forward)
//                runs in an earlier slot — co-executed passes do not feed each other;
//   transfer:    each slot's recvs and sends are exactly those the placement requires, with the
//                right peer, so every send is matched by one receive;
//   deadlock:    simulating all ranks together (receives posted recv_lookahead slots ahead,
//                sends non-blocking, a slot starts once its inputs arrived), every rank finishes;
//                otherwise each stuck rank is named with its slot and the message it waits for.
// The dependency and deadlock rules run only when the earlier rules pass.
std::vector<ScheduleViolation> find_schedule_violations(const StepSchedule& s);

// The first slot of every rank that cannot start when all ranks run together (the deadlock rule's
// simulation); empty when every rank finishes. Meaningful for schedules that pass the other rules.
struct StuckSlot {
  int rank = 0, slot = 0;
  bool waits_on_backward_input = false;  // the slot's backward pass lacks an input
};
std::vector<StuckSlot> find_deadlock(const StepSchedule& s);

// Throws PlanError listing every violation (the first one leads the message).
void check_schedule(const StepSchedule& s);

// Seconds (or any unit) of a pass: `units` of the chunk, forward or backward.
using PassCost = std::function<double(const Chunk& chunk, bool backward)>;

// The uniform-layer cost of the bubble formulas (schedule/Pipelines.h): a chunk's forward costs
// its transformer layers (the embedding, unit 0, and the head, unit num_units - 1, are free), its
// backward bwd_over_fwd times that.
PassCost uniform_layer_cost(int num_units, double bwd_over_fwd = 2.0);

struct SlotTime {
  double start = 0, end = 0;
};

// Seconds (or the unit of PassCost) a transfer occupies its link; empty: transfers are free.
using TransferCost = std::function<double(const Transfer& t)>;

// The timeline of a legal schedule: a slot starts when its rank is free and its inputs are there,
// and lasts the sum of its passes' costs (no overlap credit). Without a TransferCost an input is
// there when its pass ends. With one, a slot's sends leave when the slot ends, in the slot's send
// order, one after another on the link from its rank to the peer (a link carries one message at
// a time, a later slot's sends queue behind an earlier slot's), and an input from another rank
// is there when its message has crossed.
struct ScheduleTimeline {
  std::vector<std::vector<SlotTime>> ranks;  // [rank][slot]
  double makespan = 0;
  std::vector<double> busy;  // [rank] summed slot durations
  // Idle fraction of rank r: 1 - busy / makespan; and the largest over ranks.
  double bubble(int rank) const;
  double max_bubble() const;
};
ScheduleTimeline simulate_timeline(const StepSchedule& s, const PassCost& cost, const TransferCost& transfer = {});

// The same timeline with each slot's duration given whole (a co-executed slot's passes overlap:
// the step simulator prices it as one): cost(rank, slot index, slot).
using SlotCost = std::function<double(int rank, int slot, const Slot& sl)>;
ScheduleTimeline simulate_slots(const StepSchedule& s, const SlotCost& cost, const TransferCost& transfer = {});

// A readable table: one line per slot of each rank ("F3/c1 | B0/c6  recv act mb3 <-r0 ...").
std::string render_schedule(const StepSchedule& s);

}  // namespace dhelix

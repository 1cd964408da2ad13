// The step model's memory rule (StepModel.h memory_per_stage, memory_per_rank) and the activation
// sizes it and the closed-form pricer share: internal to sim/ (StepModel.cc, StepMemory.cc).
#pragma once
#include <string>
#include <vector>

#include "model/UnitDesc.h"
#include "plan/StepSchedule.h"
#include "schedule/Pipelines.h"
#include "sharding/ModelPrograms.h"
#include "sim/StepModel.h"

namespace dhelix::sim_detail {

// Extents of the activation buffers one rank holds for one micro-batch of b x T tokens.
struct ActDims {
  double N = 0;     // tokens of the micro-batch on this rank's GEMMs
  double Nres = 0;  // rows of the residual stream (N / tp under sequence parallelism)
  double Cres = 0;  // columns of the residual stream (C / Gx under 3D)
  double qkv = 0, att = 0, heads = 0, fc = 0, act = 0, vocab = 0;  // local widths
  double experts = 0, top_k = 0, expert_ffn = 0;                    // MoE: E, k, each expert's F (whole)
  double ep = 1;                                                    // MoE: expert-parallel ranks
};

ActDims act_dims(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch);
// Bytes of the buffers one micro-batch saves for its backward (unknown names noted, counted as
// residual-stream rows), and of what a layer's recompute ops make again for its backward.
double saved_bytes(const LayerProgram& p, const ActDims& d, double elem, std::vector<std::string>& notes);
double recompute_bytes(const LayerProgram& p, const ActDims& d, double elem, std::vector<std::string>& notes);
double unit_elems(const UnitSpec& u);          // parameter elements of a unit's shards
double tied_copy_elems(const UnitSpec& embed);  // the tied head's copy of the token table (p > 1)
// States of one rank holding `elems` parameter elements.
void add_states(MemoryUse& mem, double elems, double elem, int dp, Zero zero);
// The peak of saved buffers pp rank `rank` holds over its slots of `sch` (saved: bytes per unit
// and micro-batch).
double walk_peak(const StepSchedule& sch, int rank, const std::vector<double>& saved);
// memory_per_stage of a legal layout whose programs and units are built already, its activations
// walked over `sch` (the layout's pipeline schedule: its chunks select the per-layer blocks, its
// co-executed slots are Strand Interleaving).
std::vector<MemoryUse> stage_memory_of(const ModelConfig& m, const LayoutConfig& lay, const ModelPrograms& progs,
                                       const std::vector<UnitSpec>& units, const BatchSpec& batch, Precision precision,
                                       Zero zero, const StepSchedule& sch, std::vector<std::string>* notes);
// The micro-batches a walk of spec's schedule needs for its peak: M, or 4pv + p + (M mod p) when
// fewer (the slots repeat after the warm-up), so a step of many micro-batches walks few slots.
int walk_micro_batches(const PipelineSpec& spec);
StepSchedule walk_schedule(PipelineSpec spec);  // make_schedule of spec with walk_micro_batches
// The 1F1B schedule of lay's pipeline (one stage at pp = 1), co-executed with Strand Interleaving,
// as walk_schedule shortens it.
StepSchedule one_f_one_b(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch, StrandInterleaving si);
MemoryUse worst_of(const std::vector<MemoryUse>& stages);  // the largest any stage needs: the limit

}  // namespace dhelix::sim_detail

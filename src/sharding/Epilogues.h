// GEMM epilogue fusion: a rewrite of built layer programs that gives a GEMM the elementwise op that
// follows it, as cuBLASLt's epilogues run it on a GPU (llm.c's fused GPT-2 step does the same):
//
//   linear {x} -> {pre};  gelu {pre} -> {act}              => linear_gelu {x} -> {act, pre}
//   linear_dgrad {dy} -> {da};  gelu_bwd {da, pre} -> {dpre} => linear_dgrad_gelu {dy, pre} -> {dpre}
//   linear {x} -> {b} (no bias);  residual_add {skip, b} (+ bias) -> {y}
//                                                           => linear_residual {x, skip} -> {y}
//
// The fused op takes the GEMM's place, name, attributes (so the simulator prices it as that GEMM)
// and parameters (linear_residual: then the residual's bias). Its forward pass writes what the pair
// wrote but the intermediate: `pre` stays (the backward's GELU derivative reads it: cuBLASLt's
// GELU_AUX output), `da` and `b` are never made, so a GPU step writes and reads 2-3 fewer
// activation-sized tensors per layer and launches 3-4 fewer kernels. A pair is fused only where the
// rewrite cannot change what any op reads: the two ops' buffers untouched by the ops between them,
// and a dropped intermediate read by no other op of the program. So a residual after a row linear
// whose partial sums a collective reduces first (tp > 1) stays unfused, as does every GEMM of the 3D
// grid (its own op codes) and SwiGLU (no cuBLASLt epilogue computes it).
//
// On the CPU the fused codes run the pair's two kernels (the same bits as the unfused program); the
// GPU runs them in cuBLASLt's epilogues (one rounding to bf16 where the pair rounded twice).
// build_programs fuses when LayoutConfig::fuse_epilogues is set (training.fuse_epilogues: auto, on
// a GPU), so the trainer, the profiler, plan and simulate all see the same programs.
#pragma once
#include <string>

#include "plan/Program.h"
#include "sharding/ModelPrograms.h"

namespace dhelix {

// Fuses every eligible pair of `prog` (its forward, and its backward with any recompute ops). The
// ops' `frees` are stale afterwards: annotate_lifetimes again.
EpilogueFusions fuse_epilogues(LayerProgram& prog);

// Every program of `progs` (progs.fusions: the sum); their lifetimes need annotating again.
EpilogueFusions fuse_epilogues(ModelPrograms& progs);

}  // namespace dhelix

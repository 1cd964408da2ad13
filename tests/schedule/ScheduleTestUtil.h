// Shared by the schedule tests: a PipelineSpec from its fields, and slots spelled as passes.
#pragma once
#include "plan/StepSchedule.h"
#include "schedule/Pipelines.h"

namespace dhelix::test {

inline PipelineSpec spec(PipelineKind k, int p, int N, int L, int v = 1, CoExecute co = CoExecute::kOff) {
  PipelineSpec s;
  s.kind = k;
  s.pp = p;
  s.micro_batches = N;
  s.n_layers = L;
  s.virtual_stages = v;
  s.co_execute = co;
  return s;
}
inline PipelineSpec spec(PipelineKind k, int p, int N, int L, CoExecute co) { return spec(k, p, N, L, 1, co); }

// A slot with a forward pass, a backward pass, or both (co-executed).
inline Slot F(int mb, int c) {
  Slot s;
  s.fwd = {mb, c};
  return s;
}
inline Slot B(int mb, int c) {
  Slot s;
  s.bwd = {mb, c};
  return s;
}
inline Slot FB(Pass f, Pass b) {
  Slot s;
  s.fwd = f;
  s.bwd = b;
  return s;
}

}  // namespace dhelix::test

// Step-schedule generators: 1F1B, interleaved 1F1B (virtual stages) and the folded W, each with
// or without co-execution (Strand Interleaving). Each is written as named phases with computed
// counts (warm-up, steady, cool-down); the result always passes check_schedule. pp = 1 gives the
// single-stage schedules: 1F1B with co-execution off is forward-then-backward per micro-batch;
// with it on, fwd(mb i) beside bwd(mb i-1), slot 0 forward only and the last slot backward only.
// Generators never run anything (runtime/StepRunner does); they only write the slot lists.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "plan/StepSchedule.h"

namespace dhelix {

enum class PipelineKind { k1F1B, kInterleaved, kW };
const char* pipeline_kind_name(PipelineKind k);  // "1f1b", "interleaved", "w"
std::optional<PipelineKind> parse_pipeline_kind(const std::string& s);

enum class CoExecute { kOff, kOn };

struct PipelineSpec {
  PipelineKind kind = PipelineKind::k1F1B;
  int pp = 1;
  int virtual_stages = 1;  // interleaved: chunks per rank (v)
  int n_layers = 1;        // transformer layers L (the model has L + 2 units)
  int micro_batches = 1;   // N
  CoExecute co_execute = CoExecute::kOff;
};

// The single-stage schedule (1F1B at pp = 1): co-execution off, each micro-batch forward then
// backward; on, Strand Interleaving over the whole model as one folded chunk.
PipelineSpec single_stage(CoExecute co);

// Every impossible combination, one message each (config key names, values, a hint); empty when
// the spec can be generated.
std::vector<std::string> pipeline_spec_errors(const PipelineSpec& spec);

// The chunk placement:
//   1f1b:        p chunks of L/p layers, chunk s on rank s;
//   interleaved: p*v chunks of L/(p*v) layers, chunk i on rank i mod p (Megatron's virtual stages);
//   w:           2p chunks of k = L/(2p) layers, chunk i on rank i for i < p and 2p-1-i after: rank s
//                holds layers s*k+1..(s+1)*k and their mirror L-(s+1)*k+1..L-s*k.
// The embedding joins the first chunk, the head the last (with w both are on rank 0).
std::vector<Chunk> pipeline_chunks(const PipelineSpec& spec);

// The schedule (throws ConfigError listing pipeline_spec_errors). Phases per rank s:
//   1f1b:        warm-up w = min(p-s-1, N) forwards; steady N-w x (F, B); cool-down w backwards.
//                Co-executed: w' = min(2(p-s-1) + 1, N) warm-up forwards (twice the warm-up, so a
//                slot waiting on both inputs has a slot of slack, and one more), steady
//                {F(w'+i) || B(i)}, cool-down w' -- so stage s holds up to 2(p-s)-1 micro-batches'
//                activations, where the plain 1F1B holds p-s.
//   interleaved: the same over the rank's N*v (micro-batch, chunk) passes in Megatron's order
//                (micro-batches in groups of p; a group runs all its chunks forward 0..v-1, backward
//                v-1..0), warm-up min(2(p-s-1) + (v-1)p, N*v).
//   w:           M = N + p "passes" j, each a down-pass D(j) = {F(j) on the down chunk, B(j-p) on the
//                up chunk} and an up-pass U(j) = {F(j) on the up chunk, B(j-p) on the down chunk}
//                (absent halves dropped: F for j >= N, B for j < p), ordered as 1F1B over M with
//                D as forward and U as backward: warm-up min(p-s-1, M) D's, steady (D, U), cool-down
//                U's. Co-executed: each D and U is one slot, layer l beside layer L+1-l; otherwise its
//                F then its B.
StepSchedule make_schedule(const PipelineSpec& spec);

// The idle fraction (bubble) of the most idle stage by formula, with uniform layers, a stage's
// forward work f and backward work b = bwd_over_fwd * f per micro-batch, no communication time (so
// no credit for what co-execution hides), and the embedding and head free. Idle time per stage,
// then the fraction over N(f + b) of work:
//   1f1b:        (p-1)(f+b)         -> (p-1) / (N + p - 1)            (co-executed too)
//   interleaved: (p-1)(f+b)/v       -> (p-1) / (v*N + p - 1)          (N a multiple of p; co-executed too)
//   w:           (p-1) b            -> (p-1) b / (N(f+b) + (p-1) b)   (b = 2f: 2(p-1) / (3N + 2(p-1)))
//   w, co-executed, N > p: (p-1)(f+b) -> (p-1) / (N + p - 1)
// The plain W idles less than 1F1B because its fill and drain slots are half-stage passes: the
// warm-up down-passes and cool-down up-passes carry only a forward or only a backward, so stage 0
// keeps working while micro-batch 0 travels down and up. Co-executed, a slot waits for both of its
// inputs, and the fill and drain lose that slack: the count returns to 1F1B's, and what
// co-execution gains is the overlap inside each of the N - p paired slots (none when N = p, which
// then idles as the plain W). The two W lines were found on simulate_timeline of the generated
// schedules and hold exactly there for p in {2, 3, 4, 8}, N in {p, 2p, 4p}, b/f in {2, 3}
// (tests/schedule), as do the 1F1B and interleaved lines.
double bubble_formula(const PipelineSpec& spec, double bwd_over_fwd = 2.0);

}  // namespace dhelix

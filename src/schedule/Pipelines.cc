// Step-schedule generators: placement, then per rank the named phases, then the transfers.
#include "schedule/Pipelines.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/Error.h"

namespace dhelix {

const char* pipeline_kind_name(PipelineKind k) {
  switch (k) {
    case PipelineKind::k1F1B: return "1f1b";
    case PipelineKind::kInterleaved: return "interleaved";
    case PipelineKind::kW: return "w";
  }
  return "?";
}

std::optional<PipelineKind> parse_pipeline_kind(const std::string& s) {
  for (PipelineKind k : {PipelineKind::k1F1B, PipelineKind::kInterleaved, PipelineKind::kW})
    if (s == pipeline_kind_name(k)) return k;
  return std::nullopt;
}

namespace {

// Chunks per rank of the placement.
int chunks_per_rank(const PipelineSpec& s) {
  switch (s.kind) {
    case PipelineKind::k1F1B: return 1;
    case PipelineKind::kInterleaved: return s.virtual_stages;
    case PipelineKind::kW: return 2;
  }
  return 1;
}

// One rank's slot list, built phase by phase.
struct RankSlots {
  std::vector<Slot>& out;
  std::string phase;
  // Both passes: one co-executed slot, or without co-execution the forward's slot first.
  void add(Pass f, Pass b, CoExecute co) {
    if (!f.active() && !b.active()) return;
    if (co == CoExecute::kOn || !f.active() || !b.active()) {
      out.push_back(Slot{f, b, {}, {}, phase});
    } else {
      out.push_back(Slot{f, {}, {}, {}, phase});
      out.push_back(Slot{{}, b, {}, {}, phase});
    }
  }
};

// 1F1B over a rank's forward passes `fs` and backward passes `bs` (same count, each in its order)
// with `warm` warm-up forwards. Co-executed: one more warm-up forward, then each backward beside
// the next forward.
void one_f_one_b(std::vector<Slot>& out, const std::vector<Pass>& fs, const std::vector<Pass>& bs, int warm,
                 CoExecute co) {
  const int n = static_cast<int>(fs.size());
  if (co == CoExecute::kOn) warm = std::min(warm + 1, n);
  warm = std::min(warm, n);
  RankSlots rs{out, "warm-up"};
  for (int i = 0; i < warm; ++i) rs.add(fs[i], {}, co);
  rs.phase = "steady";
  for (int i = 0; i + warm < n; ++i) rs.add(fs[warm + i], bs[i], co);
  rs.phase = "cool-down";
  for (int i = n - warm; i < n; ++i) rs.add({}, bs[i], co);
}

void gen_1f1b(const PipelineSpec& spec, StepSchedule& sch) {
  const int p = spec.pp, N = spec.micro_batches;
  for (int s = 0; s < p; ++s) {
    std::vector<Pass> fs, bs;
    for (int m = 0; m < N; ++m) fs.push_back({m, s}), bs.push_back({m, s});
    // Co-executed, a slot waits for both its inputs, the activation from s-1 and the gradient from
    // s+1; with 1F1B's p-s-1 warm-up the gradient of B(i) would need s+1 to finish the slot that
    // waits for this stage's previous slot, and neighbours would alternate. Twice the warm-up
    // (as interleaved 1F1B has) gives each gradient a slot of slack: all stages run at once.
    const int warm = spec.co_execute == CoExecute::kOn ? 2 * (p - s - 1) : p - s - 1;
    one_f_one_b(sch.ranks[s], fs, bs, warm, spec.co_execute);
  }
}

// Megatron's warm-up, 2(p-s-1) + (v-1)p forwards on rank s, deadlocks when the last group of
// micro-batches is smaller than p (a rank starts a backward whose gradient waits on a forward that
// rank still owes). The warm-up is then grown, one forward at a time, on each rank whose first
// blocked slot waits for a backward's input, until all ranks run through (the checker's simulation).
void gen_interleaved(const PipelineSpec& spec, StepSchedule& sch) {
  const int p = spec.pp, v = spec.virtual_stages, N = spec.micro_batches;
  std::vector<std::vector<Pass>> fs(p), bs(p);
  std::vector<int> warm(p);
  for (int s = 0; s < p; ++s) {
    for (int g = 0; g < N; g += p) {
      const int g_end = std::min(N, g + p);
      for (int lc = 0; lc < v; ++lc)
        for (int m = g; m < g_end; ++m) fs[s].push_back({m, lc * p + s});
      for (int lc = v - 1; lc >= 0; --lc)
        for (int m = g; m < g_end; ++m) bs[s].push_back({m, lc * p + s});
    }
    warm[s] = 2 * (p - s - 1) + (v - 1) * p;
  }
  for (int round = 0;; ++round) {
    for (int s = 0; s < p; ++s) {
      sch.ranks[s].clear();
      one_f_one_b(sch.ranks[s], fs[s], bs[s], warm[s], spec.co_execute);
    }
    bool grew = false;
    for (const StuckSlot& st : find_deadlock(sch))
      if (st.waits_on_backward_input && warm[st.rank] < N * v) ++warm[st.rank], grew = true;
    if (!grew) return;  // no deadlock left (or none a warm-up can fix: the checker reports it)
    DHX_ASSERT(round < p * N * v, "interleaved warm-up did not converge (p={} v={} N={})", p, v, N);
  }
}

void gen_w(const PipelineSpec& spec, StepSchedule& sch) {
  const int p = spec.pp, N = spec.micro_batches, M = N + p;
  for (int s = 0; s < p; ++s) {
    const int down = s, up = 2 * p - 1 - s;
    auto fwd = [&](int j, int c) { return j < N ? Pass{j, c} : Pass{}; };
    auto bwd = [&](int j, int c) { return j >= p ? Pass{j - p, c} : Pass{}; };
    // D(j): forward down the first half beside backward of the mirrored second half; U(j) the
    // reverse. Without co-execution each runs its forward first (the backward's input arrives
    // from the same neighbour, no later).
    RankSlots rs{sch.ranks[s], "warm-up"};
    const int warm = std::min(p - s - 1, M);
    auto D = [&](int j) { rs.add(fwd(j, down), bwd(j, up), spec.co_execute); };
    auto U = [&](int j) { rs.add(fwd(j, up), bwd(j, down), spec.co_execute); };
    for (int j = 0; j < warm; ++j) D(j);
    rs.phase = "steady";
    for (int i = 0; i + warm < M; ++i) D(warm + i), U(i);
    rs.phase = "cool-down";
    for (int j = M - warm; j < M; ++j) U(j);
  }
}

}  // namespace

PipelineSpec single_stage(CoExecute co) {
  PipelineSpec s;
  s.co_execute = co;
  return s;
}

std::vector<std::string> pipeline_spec_errors(const PipelineSpec& s) {
  std::vector<std::string> e;
  const std::string kind = fmt::format("schedule.pipeline={}", pipeline_kind_name(s.kind));
  if (s.pp < 1) e.push_back(fmt::format("parallel.pp={} must be >= 1", s.pp));
  if (s.n_layers < 1) e.push_back(fmt::format("model.n_layers={} must be >= 1", s.n_layers));
  if (s.micro_batches < 1) e.push_back(fmt::format("training.micro_batches={} must be >= 1", s.micro_batches));
  if (s.virtual_stages < 1) e.push_back(fmt::format("schedule.virtual_stages={} must be >= 1", s.virtual_stages));
  if (!e.empty()) return e;
  if (s.kind != PipelineKind::kInterleaved && s.virtual_stages != 1)
    e.push_back(fmt::format("schedule.virtual_stages={} applies to schedule.pipeline=interleaved only ({}); set it to 1",
                            s.virtual_stages, kind));
  const int64_t chunks = int64_t{s.pp} * chunks_per_rank(s);  // int64: pp 1e6 x virtual_stages 1e6 overflows int
  if (s.n_layers % chunks != 0) {
    std::string why = s.kind == PipelineKind::kW ? fmt::format("2 x parallel.pp = {}", chunks)
                      : s.kind == PipelineKind::kInterleaved
                          ? fmt::format("parallel.pp x schedule.virtual_stages = {} x {} = {}", s.pp, s.virtual_stages, chunks)
                          : fmt::format("parallel.pp = {}", chunks);
    e.push_back(fmt::format("model.n_layers={} is not divisible by {} ({}: every chunk holds the same number of layers)",
                            s.n_layers, why, kind));
  }
  if (s.pp > 1 && s.micro_batches < s.pp)
    e.push_back(fmt::format("training.micro_batches={} is below parallel.pp={}: the pipeline would never fill; use at "
                            "least {} micro-batches",
                            s.micro_batches, s.pp, s.pp));
  return e;
}

std::vector<Chunk> pipeline_chunks(const PipelineSpec& spec) {
  const int p = spec.pp, S = p * chunks_per_rank(spec), L = spec.n_layers, k = L / S;
  std::vector<Chunk> chunks;
  for (int i = 0; i < S; ++i) {
    Chunk c;
    c.rank = spec.kind == PipelineKind::kW ? (i < p ? i : 2 * p - 1 - i) : i % p;
    c.unit_begin = i == 0 ? 0 : 1 + i * k;      // unit 0 is the embedding, layer l (1-based) unit l
    c.unit_end = i == S - 1 ? L + 2 : 1 + (i + 1) * k;
    chunks.push_back(c);
  }
  return chunks;
}

StepSchedule make_schedule(const PipelineSpec& spec) {
  std::vector<std::string> errs = pipeline_spec_errors(spec);
  if (!errs.empty()) {
    std::string msg = fmt::format("{} configuration error{}:", errs.size(), errs.size() == 1 ? "" : "s");
    for (const auto& m : errs) msg += "\n  - " + m;
    throw ConfigError(msg);
  }
  StepSchedule sch;
  sch.name = pipeline_kind_name(spec.kind);
  if (spec.co_execute == CoExecute::kOn) sch.name += "+si";
  sch.pp = spec.pp;
  sch.micro_batches = spec.micro_batches;
  sch.num_units = spec.n_layers + 2;
  sch.chunks = pipeline_chunks(spec);
  sch.ranks.resize(spec.pp);
  switch (spec.kind) {
    case PipelineKind::k1F1B: gen_1f1b(spec, sch); break;
    case PipelineKind::kInterleaved: gen_interleaved(spec, sch); break;
    case PipelineKind::kW: gen_w(spec, sch); break;
  }
  attach_transfers(sch);
  return sch;
}

double bubble_formula(const PipelineSpec& s, double bwd_over_fwd) {
  const double p = s.pp, N = s.micro_batches, f = 1.0, b = bwd_over_fwd;
  switch (s.kind) {
    case PipelineKind::k1F1B: return (p - 1) / (N + p - 1);
    case PipelineKind::kInterleaved: return (p - 1) / (s.virtual_stages * N + p - 1);
    case PipelineKind::kW:
      if (s.co_execute == CoExecute::kOn && N > p) return (p - 1) / (N + p - 1);
      return (p - 1) * b / (N * (f + b) + (p - 1) * b);
  }
  return 0;
}

}  // namespace dhelix

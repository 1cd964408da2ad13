// The step model's memory rule: each stage's model states, saved activations (the layer programs'
// saved buffers by their names' size rules), kept and in-flight weight blocks (StepMemory.h).
#include "sim/StepMemory.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "base/Error.h"
#include "model/Params.h"
#include "schedule/Pipelines.h"
#include "sharding/ParamSharding.h"

namespace dhelix {

namespace sim_detail {

ActDims act_dims(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch) {
  const bool gpt = m.family == ModelFamily::kGPT;
  const double wide = lay.tp * lay.tp_y;
  const double Hl = m.n_heads / wide, Hkvl = m.n_kv_heads / wide, D = double(m.head_dim());
  const double Fl = m.ffn_hidden / wide;
  ActDims d;
  d.N = double(batch.micro_batch * (batch.seq / lay.cp));  // this rank's rows (its chunks under cp)
  d.Nres = d.N / lay.tp;
  d.Cres = double(m.d_model) / lay.tp_x;
  d.qkv = (Hl + 2 * Hkvl) * D;
  d.att = Hl * D;
  d.heads = Hl;
  d.fc = gpt ? Fl : 2 * Fl;
  d.act = Fl;
  const int vshards = lay.is_3d() ? lay.tp_y : lay.tp;  // the vocabulary rows: over tp, or y under 3D
  d.vocab = double(padded_vocab(m, vshards) / vshards);
  if (m.is_moe()) d.experts = double(m.n_experts), d.top_k = double(m.top_k), d.expert_ffn = double(m.ffn_hidden);
  d.ep = double(lay.ep);
  return d;
}

namespace {

// Elements of a saved buffer, by the name the programs give it (sharding/Lowering1D.cc, Lowering3D.cc); nullopt when
// no rule knows the name.
std::optional<double> saved_elems(const std::string& b, const ActDims& d) {
  auto ends = [&](const char* s) { return b.size() > std::strlen(s) && b.ends_with(s); };
  if (ends(".mean") || ends(".rstd")) return d.Nres;
  if (ends("_g")) return d.N * d.Cres;
  static const std::set<std::string> stream = {"x", "x2", "y", "e", "h1", "h2", "hf"};
  if (stream.count(b)) return d.Nres * d.Cres;
  if (b == "qkv" || b == "qkv_r") return d.N * d.qkv;
  if (b == "att") return d.N * d.att;
  if (b == "att.lse") return d.N * d.heads;
  if (b == "fc") return d.N * d.fc;
  if (b == "act") return d.N * d.act;
  if (b == "logits" || b == "dlogits") return d.N * d.vocab;
  if (b == "xent.m" || b == "tokens" || b == "targets") return d.N;
  if (b == "xent.s") return 2 * d.N;
  // MoE (sharding/ExpertDispatch.cc moe_fwd): this rank's Nres tokens, P = Nres k assignments.
  const double P = d.Nres * d.top_k;
  if (b == "moe.probs") return d.Nres * d.experts;
  if (b == "moe.expert" || b == "moe.gate") return P;
  if (b == "moe.slot") return P;
  if (b == "moe.counts" || b == "moe.rcounts") return d.experts;
  if (b == "moe.lcounts") return d.experts / d.ep;
  if (b == "moe.stats") return 2 * d.experts;
  // Under ep the rows received for this rank's experts: P with balanced routing.
  if (b == "moe.xs" || b == "moe.eo" || b == "moe.xg") return P * d.Cres;
  if (b == "moe.fc") return P * 2 * d.expert_ffn;
  if (b == "moe.act") return P * d.expert_ffn;
  return std::nullopt;
}

// Elements of `b` by saved_elems, noting (and counting as residual-stream rows) a name no rule knows.
double buffer_elems(const LayerProgram& p, const std::string& b, const ActDims& d, std::vector<std::string>& notes) {
  // A weight block the forward gathered over z and the backward reads (LayoutConfig::keep_gathered):
  // the whole block, its all-gather's fp32 bytes over 4.
  for (const Op& op : p.fwd)
    if (op.is_collective() && op.coll == CollOp::kAllGather && op.group == "z" && op.outputs == std::vector{b})
      return op.cost.comm_bytes / 4.0;
  std::optional<double> n = saved_elems(b, d);
  if (!n) notes.push_back(fmt::format("{}: saved buffer '{}' has no size rule; counted as [{:g}, {:g}]", p.name, b,
                                      d.Nres, d.Cres));
  return n.value_or(d.Nres * d.Cres);
}

}  // namespace

// Bytes of the buffers the backward strand reads that the forward made or received and the backward
// does not make again (saved for backward: plan/Program.h saved_for_backward), for one micro-batch;
// unknown names are counted as residual-stream rows and noted.
double saved_bytes(const LayerProgram& p, const ActDims& d, double elem, std::vector<std::string>& notes) {
  double bytes = 0;
  for (const std::string& b : saved_for_backward(p)) bytes += buffer_elems(p, b, d, notes) * elem;
  return bytes;
}

// Under activation recomputation, what a layer's recompute ops make again for its backward (their
// outputs some other backward op reads), all held at once at the backward's start: one layer's worth
// on top of the saved buffers while that layer's backward runs. 0 without recompute ops.
double recompute_bytes(const LayerProgram& p, const ActDims& d, double elem, std::vector<std::string>& notes) {
  std::set<std::string> made, read;
  for (const Op& op : p.bwd) {
    if (op.flag("recompute")) made.insert(op.outputs.begin(), op.outputs.end());
    else read.insert(op.inputs.begin(), op.inputs.end());
  }
  double bytes = 0;
  for (const std::string& b : made)
    if (read.count(b)) bytes += buffer_elems(p, b, d, notes) * elem;
  return bytes;
}

double unit_elems(const UnitSpec& u) {
  double n = 0;
  for (const ParamSpec& p : u.params) n += double(shape_numel(p.shard));
  return n;
}

// The tied head's copy on the last stage (p > 1): the token table alone (the embedding unit's
// vocabulary-sharded parameter; GPT's learned positions stay on the first stage), as the trainer's
// ParamStore::tied_copy holds it.
double tied_copy_elems(const UnitSpec& embed) {
  double n = 0;
  for (const ParamSpec& p : embed.params)
    if (p.role == ShardRole::kVocab) n += double(shape_numel(p.shard));
  return n;
}

// States of one rank holding `elems` parameter elements.
void add_states(MemoryUse& mem, double elems, double elem, int dp, Zero zero) {
  mem.params += elems * elem;
  mem.grads += elems * 4;
  const double opt = elems * (8 + (elem < 4 ? 4 : 0));
  mem.optimizer += zero == Zero::kZero1 ? opt / dp : opt;
}


// The peak of saved buffers one pp rank holds while it runs its slots of `sch` in order (`saved`:
// bytes one micro-batch's pass through each unit keeps for its backward). A forward pass keeps its
// units' buffers one after another, a backward frees them from the last unit down, so a forward-only
// slot peaks at its end. A co-executed slot runs forward unit begin+i beside backward unit end-1-i
// (Slot), the longer pass's rest alone after: the pair's forward keeps its unit as its backward frees
// the mirror unit's, so the walk counts what is held at each pair's end (at the unit boundaries:
// the working buffers of the units running are not counted).
double walk_peak(const StepSchedule& sch, int rank, const std::vector<double>& saved) {
  double live = 0, peak = 0;
  for (const Slot& sl : sch.ranks[static_cast<size_t>(rank)]) {
    const Chunk* f = sl.fwd.active() ? &sch.chunks[static_cast<size_t>(sl.fwd.chunk)] : nullptr;
    const Chunk* b = sl.bwd.active() ? &sch.chunks[static_cast<size_t>(sl.bwd.chunk)] : nullptr;
    const int nf = f ? f->size() : 0, nb = b ? b->size() : 0;
    for (int i = 0; i < std::max(nf, nb); ++i) {
      if (i < nf) live += saved[static_cast<size_t>(f->unit_begin + i)];
      if (i < nb) live -= saved[static_cast<size_t>(b->unit_end - 1 - i)];
      peak = std::max(peak, live);
    }
  }
  return peak;
}

// memory_per_stage of a legal layout `lay` (as the engine runs it: tp with sequence parallelism)
// whose programs and units are built already; predict() passes its own.
std::vector<MemoryUse> stage_memory_of(const ModelConfig& m, const LayoutConfig& lay, const ModelPrograms& built,
                                       const std::vector<UnitSpec>& units, const BatchSpec& batch, Precision precision,
                                       Zero zero, const StepSchedule& sch, std::vector<std::string>* notes) {
  const int64_t M = batch.global_batch / (int64_t{lay.data_replicas()} * batch.micro_batch);
  const int L = static_cast<int>(m.n_layers), U = L + 2, p = lay.pp;
  // The schedule's own micro-batches, or walk_schedule's fewer with the same peak.
  DHX_CHECK(sch.pp == p && sch.micro_batches <= M && sch.num_units == U, InternalError,
            "the memory rule's schedule ({}: pp={}, {} micro-batches, {} units) is not the layout's (pp={}, {} "
            "micro-batches, {} units)",
            sch.name, sch.pp, sch.micro_batches, sch.num_units, p, M, U);
  // The per-layer options (recompute_layers, keep_gathered): each chunk's first layers run the block
  // the options name (select_block_variants on the schedule's chunks, as the executor runs them).
  ModelPrograms progs = built;
  select_block_variants(progs, lay, sch.chunks);
  const double elem = element_bytes(precision);
  const ActDims dims = act_dims(m, lay, batch);
  std::vector<std::string> unknown;
  // Per unit, for one micro-batch: saved buffers; remade buffers (a recomputing layer's, held one
  // layer at a time: the most any of the rank's layers makes); kept weight blocks (held once for the
  // step, from the first micro-batch's forward to the step's end, however many micro-batches are in
  // flight: the executor's kept_blocks_); two weight blocks gathered for a GEMM in flight (the 3D
  // prefetch; not kept ones).
  struct Act {
    double saved = 0, remade = 0, kept = 0, gathered = 0;
  };
  std::map<std::string, Act> act_of;  // by program name
  auto kind = [&](int u) { return u == 0 ? "embed" : u == U - 1 ? "head" : "block"; };
  std::vector<Act> per_unit;
  for (int u = 0; u < U; ++u) {
    const LayerProgram& pr = progs.program(u, kind(u));
    auto it = act_of.find(pr.name);
    if (it == act_of.end()) {
      Act a{saved_bytes(pr, dims, elem, unknown), recompute_bytes(pr, dims, elem, unknown), 0, 0};
      for (const Op& op : pr.fwd)
        if (op.is_collective() && op.flag("kept")) a.kept += op.cost.comm_bytes / 4.0 * elem;
      for (const std::vector<Op>* ops : {&pr.fwd, &pr.bwd})
        for (const Op& op : *ops)
          if (op.is_collective() && op.group == "z" && op.coll == CollOp::kAllGather && !op.flag("kept"))
            a.gathered = std::max(a.gathered, 2 * op.cost.comm_bytes * elem / 4.0);
      a.saved -= a.kept;
      it = act_of.emplace(pr.name, a).first;
    }
    per_unit.push_back(it->second);
  }
  if (notes) notes->insert(notes->end(), unknown.begin(), unknown.end());
  std::vector<double> saved;
  for (const Act& a : per_unit) saved.push_back(a.saved);
  std::vector<MemoryUse> out;
  for (int s = 0; s < p; ++s) {
    std::vector<int> mine;
    for (int c : sch.chunks_of(s))
      for (int u = sch.chunks[static_cast<size_t>(c)].unit_begin; u < sch.chunks[static_cast<size_t>(c)].unit_end; ++u)
        mine.push_back(u);
    const bool has_embed = std::find(mine.begin(), mine.end(), 0) != mine.end();
    const bool has_head = std::find(mine.begin(), mine.end(), U - 1) != mine.end();
    double elems = 0, experts = 0;
    for (int u : mine) {
      elems += unit_elems(units[u]);
      if (lay.ep > 1)
        for (const ParamSpec& q : units[u].params)
          if (q.role == ShardRole::kExpert) experts += double(shape_numel(q.shard));
    }
    if (has_head && !has_embed && m.tie_embeddings) elems += tied_copy_elems(units[0]);
    MemoryUse mem;
    // ZeRO-1 shards over the weights' replicas: dp x cp, and the experts' over edp x cp = dp / ep x cp.
    add_states(mem, elems - experts, elem, lay.dp * lay.cp, zero);
    add_states(mem, experts, elem, lay.dp / lay.ep * lay.cp, zero);
    // Block sums of the z-reduce-scattered weight gradients (fp32, one per weight) while the step's
    // micro-batches accumulate (M > 1).
    for (int u : mine)
      for (const Op& op : progs.program(u, kind(u)).bwd)
        if (M > 1 && op.is_collective() && op.flag("last_micro_batch")) mem.grads += op.cost.comm_bytes;
    double remade = 0, kept = 0, gathered = 0;
    for (int u : mine) {
      const Act& a = per_unit[static_cast<size_t>(u)];
      remade = std::max(remade, a.remade);
      kept += a.kept;
      gathered = std::max(gathered, a.gathered);
    }
    mem.gathered = gathered;
    mem.activations = walk_peak(sch, s, saved) + remade + kept;
    out.push_back(mem);
  }
  return out;
}

// The micro-batches a memory walk needs: every schedule's warm-up is at most 2(p-1) + (v-1)p forwards
// (interleaved, grown by at most a group where the last group would deadlock), after which the slots
// repeat, so M' = 4pv + p + (M mod p) reaches the same peak as M (the same shape of last group).
int walk_micro_batches(const PipelineSpec& spec) {
  const int64_t p = spec.pp, v = spec.kind == PipelineKind::kInterleaved ? spec.virtual_stages : 1;
  const int64_t cap = 4 * p * v + p + spec.micro_batches % p;
  return static_cast<int>(std::min<int64_t>(spec.micro_batches, cap));
}

StepSchedule walk_schedule(PipelineSpec spec) {
  spec.micro_batches = walk_micro_batches(spec);
  return make_schedule(spec);
}

// The 1F1B schedule of `lay`'s pipeline (one stage at pp = 1), co-executed with Strand
// Interleaving, shortened for the walk: what memory_per_stage walks when given no schedule.
StepSchedule one_f_one_b(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch, StrandInterleaving si) {
  PredictOptions opt;  // pipeline 1F1B
  opt.si = si;
  return walk_schedule(pipeline_spec_of(m, lay, batch, opt));
}

// The largest any stage needs: the limit.
MemoryUse worst_of(const std::vector<MemoryUse>& stages) {
  MemoryUse worst;
  for (const MemoryUse& mem : stages)
    if (mem.total() > worst.total()) worst = mem;
  return worst;
}

}  // namespace sim_detail

std::vector<MemoryUse> memory_per_stage(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch,
                                        Precision precision, Zero zero, StrandInterleaving si,
                                        std::vector<std::string>* notes, const StepSchedule* schedule) {
  const std::vector<std::string> errs = layout_errors(m, lay, batch);
  DHX_CHECK(errs.empty(), ConfigError, "layout cannot run: {}", fmt::join(errs, "; "));
  LayoutConfig plain = lay;
  plain.sequence_parallel = lay.tp > 1;  // the engine always runs tp with sequence parallelism
  const StepSchedule own = schedule ? StepSchedule{} : sim_detail::one_f_one_b(m, lay, batch, si);
  return sim_detail::stage_memory_of(m, plain, build_programs(m, plain, {batch.micro_batch, batch.seq / lay.cp}),
                                     model_units(m, plain, 0), batch, precision, zero, schedule ? *schedule : own,
                                     notes);
}

MemoryUse memory_per_rank(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch, Precision precision,
                          Zero zero, StrandInterleaving si, std::vector<std::string>* notes,
                          const StepSchedule* schedule) {
  return sim_detail::worst_of(memory_per_stage(m, lay, batch, precision, zero, si, notes, schedule));
}

}  // namespace dhelix

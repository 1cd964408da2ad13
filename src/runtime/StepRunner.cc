// StepRunner: runs a step schedule's slots, single passes alone and co-executed ones pair by pair.
#include "runtime/StepRunner.h"

#include <algorithm>
#include <map>

#include "base/Error.h"
#include "plan/StepSchedule.h"
#include "schedule/BasicPlans.h"

namespace dhelix {

StepRunner::StepRunner(RunContext& ctx, const std::vector<UnitSpec>& units, const ModelPrograms& progs,
                       const SIPlan* block_plan, const PipelineSpec& pipeline)
    : ctx_(ctx), exec_(ctx, units, progs), pipeline_(pipeline) {
  block_plan_ = block_plan ? *block_plan : pair_default_plan(progs.block.fwd, progs.block.bwd);
  pipeline_.n_layers = static_cast<int>(units.size()) - 2;
}

const SIPlan& StepRunner::pair_plan(int fu, int bu) {
  const std::string& fk = exec_.unit(fu).kind;
  const std::string& bk = exec_.unit(bu).kind;
  if (fk == "block" && bk == "block") return block_plan_;
  auto key = std::make_pair(fk, bk);
  for (size_t i = 0; i < edge_keys_.size(); ++i)
    if (edge_keys_[i] == key) return edge_cache_[i];
  edge_keys_.push_back(key);
  edge_cache_.push_back(pair_default_plan(exec_.program(fu).fwd, exec_.program(bu).bwd));
  return edge_cache_.back();
}

void StepRunner::link_forward(Inflight& f, int unit, const MicroBatch& data) {
  auto& env = f.envs[unit];
  DHX_ASSERT(!env, "micro-batch {} runs its forward through unit {} twice", f.mb, unit);
  env = std::make_unique<UnitEnv>();
  if (unit == 0) env->bufs["tokens"] = data.tokens;
  if (unit == exec_.num_units() - 1) env->bufs["targets"] = data.targets;
  if (unit == 0) return;
  // The output moves to the next unit: backward never reads a unit's own "y".
  auto& prev = f.envs[unit - 1]->bufs;
  env->bufs["x"] = prev.at("y");
  prev.erase("y");
}

void StepRunner::link_backward(Inflight& b, int unit, bool release_above) {
  if (unit == exec_.num_units() - 1) return;
  b.envs[unit]->bufs["dy"] = b.envs[unit + 1]->at("dx");
  // Unit+1 finished its backward; its "dx" lives on as our "dy", the rest is dead. Releasing it
  // before this pair runs lets the forward strand reuse the memory.
  if (release_above) b.envs[unit + 1].reset();
}

void StepRunner::finish_bwd_unit(Inflight& b, int unit, StepStats& st) {
  UnitEnv& env = *b.envs[unit];
  DHX_ASSERT(env.pending.empty(), "unit {} finished backward with collectives in flight", unit);
  if (unit == exec_.num_units() - 1) {
    Tensor& loss = env.at("loss");
    const float* l = loss.f32();
    for (int64_t i = 0; i < loss.numel(); ++i) st.loss_sum += l[i];
    st.tokens += loss.numel();
  }
  // The unit above was released when our dy was linked; the first unit has no consumer.
  if (unit == 0) b.envs[0].reset();
  if (bwd_hook_) bwd_hook_(b.mb, unit);
}

// Co-executed slot: forward unit fc.begin+i beside backward unit bc.end-1-i for i < the shorter
// chunk's length, then the longer chunk's remaining units alone. A pair's plan may carry the
// backward unit's trailing weight-gradient ops into the next pair (SIPlan::carry); their unit
// finishes (DP hook, loss, release) as soon as they ran.
void StepRunner::run_slot(Inflight* f, const Chunk* fc, Inflight* b, const Chunk* bc, const MicroBatch* fdata,
                          StepStats& st) {
  const int nf = f ? fc->size() : 0, nb = b ? bc->size() : 0, n = std::min(nf, nb);
  auto fwd_unit = [&](int i) { return fc->unit_begin + i; };
  auto bwd_unit = [&](int i) { return bc->unit_end - 1 - i; };
  CarriedOps carry;
  // A carried unit's env is released once its carried ops ran inside the next pair, whose backward
  // unit has taken its "dx"; carried out of the slot's last pair, its "dx" may still be owed to a
  // later slot (the next chunk's backward), and the link that takes it releases the env.
  bool release_carried = true;
  for (int i = 0; i < n; ++i) {
    const int fu = fwd_unit(i), bu = bwd_unit(i);
    link_forward(*f, fu, *fdata);
    link_backward(*b, bu, /*release_above=*/carry.empty());
    StrandSlot fs{f->mb, fu, f->envs[fu].get()};
    StrandSlot bs{b->mb, bu, b->envs[bu].get()};
    const SIPlan& plan = pair_plan(fu, bu);
    exec_.run_pair(&fs, &bs, plan.blocks, plan.carry, &carry);
    DHX_ASSERT(carry.empty(), "pair ({}, {}) left carried ops unrun", fu, bu);
    if (plan.carry > 0) {
      const int nops = static_cast<int>(exec_.program(bu).bwd.size());
      carry = CarriedOps{bs, nops - plan.carry, nops, [this, b, &st, bu, &release_carried] {
                           finish_bwd_unit(*b, bu, st);
                           // finish_bwd_unit releases unit 0 itself
                           if (bu > 0 && release_carried) b->envs[bu].reset();
                         }};
    } else {
      finish_bwd_unit(*b, bu, st);
    }
  }
  release_carried = false;
  exec_.run_carried(carry);  // the last pair carried ops out: nothing of this slot follows to hide
  for (int i = n; i < nf; ++i) {
    const int fu = fwd_unit(i);
    link_forward(*f, fu, *fdata);
    StrandSlot s{f->mb, fu, f->envs[fu].get()};
    exec_.run_alone(s, StrandKind::kForward);
  }
  for (int i = n; i < nb; ++i) {
    const int bu = bwd_unit(i);
    link_backward(*b, bu);
    StrandSlot s{b->mb, bu, b->envs[bu].get()};
    exec_.run_alone(s, StrandKind::kBackward);
    finish_bwd_unit(*b, bu, st);
  }
}

StepStats StepRunner::run(const std::vector<MicroBatch>& mbs) {
  PipelineSpec spec = pipeline_;
  spec.micro_batches = static_cast<int>(mbs.size());
  return run_schedule(make_schedule(spec), mbs);
}

StepStats StepRunner::run_schedule(const StepSchedule& sch, const std::vector<MicroBatch>& mbs) {
  StepStats st;
  const int M = static_cast<int>(mbs.size());
  const int U = exec_.num_units();
  DHX_CHECK(M >= 1, ConfigError, "a step needs at least one micro-batch, got {}", M);
  DHX_CHECK(sch.micro_batches == M && sch.num_units == U, InternalError,
            "schedule '{}' is for {} micro-batches over {} units; this step has {} over {}", sch.name,
            sch.micro_batches, sch.num_units, M, U);
  DHX_CHECK(sch.pp == 1, ConfigError,
            "schedule '{}' has pp={}: this build runs single-stage schedules only (pipeline stages and their "
            "point-to-point transfers are not wired yet); use parallel.pp=1",
            sch.name, sch.pp);
  check_schedule(sch);
  if (ctx_.act_mem) ctx_.act_mem->reset_peak();

  std::map<int, Inflight> live;  // micro-batches with a unit between its forward and backward
  auto inflight = [&](int mb) -> Inflight& {
    Inflight& f = live[mb];
    if (f.envs.empty()) f.mb = mb, f.envs.resize(U);
    return f;
  };
  const std::vector<Slot>& slots = sch.ranks.at(0);
  for (int k = 0; k < static_cast<int>(slots.size()); ++k) {
    const Slot& sl = slots[k];
    if (slot_hook_) slot_hook_(k, true);
    Inflight* f = sl.fwd.active() ? &inflight(sl.fwd.mb) : nullptr;
    Inflight* b = sl.bwd.active() ? &inflight(sl.bwd.mb) : nullptr;
    run_slot(f, f ? &sch.chunks[sl.fwd.chunk] : nullptr, b, b ? &sch.chunks[sl.bwd.chunk] : nullptr,
             f ? &mbs[sl.fwd.mb] : nullptr, st);
    if (b && std::all_of(b->envs.begin(), b->envs.end(), [](const auto& e) { return !e; })) live.erase(sl.bwd.mb);
    if (slot_hook_) slot_hook_(k, false);
  }
  DHX_ASSERT(live.empty(), "{} micro-batches still hold activations after the step", live.size());
  if (ctx_.act_mem) st.peak_activation_bytes = ctx_.act_mem->peak();
  return st;
}

StepStats StepRunner::forward_only(const std::vector<MicroBatch>& mbs) {
  StepStats st;
  const int U = exec_.num_units();
  for (int m = 0; m < static_cast<int>(mbs.size()); ++m) {
    Inflight f{m, {}};
    f.envs.resize(U);
    for (int u = 0; u < U; ++u) {
      link_forward(f, u, mbs[m]);
      StrandSlot s{m, u, f.envs[u].get()};
      exec_.run_alone(s, StrandKind::kForward);
      if (u > 0) f.envs[u - 1].reset();
    }
    Tensor& loss = f.envs[U - 1]->at("loss");
    for (int64_t i = 0; i < loss.numel(); ++i) st.loss_sum += loss.f32()[i];
    st.tokens += loss.numel();
  }
  return st;
}

}  // namespace dhelix

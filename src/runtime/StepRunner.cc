// StepRunner: sequential and Strand-Interleaved micro-batch schedules over folded units.
#include "runtime/StepRunner.h"

#include <algorithm>

#include "base/Error.h"
#include "schedule/BasicPlans.h"

namespace dhelix {

SIPlan pair_default_plan(const std::vector<Op>& fwd, const std::vector<Op>& bwd) {
  bool any_coll = std::any_of(fwd.begin(), fwd.end(), [](const Op& o) { return o.is_collective(); }) ||
                  std::any_of(bwd.begin(), bwd.end(), [](const Op& o) { return o.is_collective(); });
  LayerProgram p;
  p.name = "pair";
  p.fwd = fwd;
  p.bwd = bwd;
  if (any_coll) return cover_plan(p);
  SIPlan plan;
  plan.pair = "pair";
  plan.source = "default";
  Block b;
  b.bwd_end = static_cast<int>(bwd.size());
  if (b.has_bwd()) plan.blocks.push_back(b);
  Block f;
  f.fwd_end = static_cast<int>(fwd.size());
  if (f.has_fwd()) plan.blocks.push_back(f);
  return plan;
}

StepRunner::StepRunner(RunContext& ctx, const std::vector<UnitSpec>& units, const ModelPrograms& progs,
                       const SIPlan* block_plan, Interleave mode)
    : ctx_(ctx), exec_(ctx, units, progs), mode_(mode) {
  block_plan_ = block_plan ? *block_plan : pair_default_plan(progs.block.fwd, progs.block.bwd);
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

void StepRunner::start_mb(Inflight& f, int mb, const MicroBatch& data) {
  f.mb = mb;
  f.envs.clear();
  for (int u = 0; u < exec_.num_units(); ++u) f.envs.push_back(std::make_unique<UnitEnv>());
  f.envs.front()->bufs["tokens"] = data.tokens;
  f.envs.back()->bufs["targets"] = data.targets;
}

void StepRunner::link_forward(Inflight& f, int unit) {
  if (unit == 0) return;
  // The output moves to the next unit: backward never reads a unit's own "y".
  auto& prev = f.envs[unit - 1]->bufs;
  f.envs[unit]->bufs["x"] = prev.at("y");
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

StepStats StepRunner::run(const std::vector<MicroBatch>& mbs) {
  StepStats st;
  const int M = static_cast<int>(mbs.size());
  const int U = exec_.num_units();
  DHX_CHECK(M >= 1, ConfigError, "a step needs at least one micro-batch, got {}", M);
  if (ctx_.act_mem) ctx_.act_mem->reset_peak();

  if (mode_ == Interleave::kOff || M < 2) {
    for (int m = 0; m < M; ++m) {
      if (slot_hook_) slot_hook_(m, true);
      Inflight f;
      start_mb(f, m, mbs[m]);
      for (int u = 0; u < U; ++u) {
        link_forward(f, u);
        StrandSlot s{m, u, f.envs[u].get()};
        exec_.run_alone(s, StrandKind::kForward);
      }
      for (int u = U - 1; u >= 0; --u) {
        link_backward(f, u);
        StrandSlot s{m, u, f.envs[u].get()};
        exec_.run_alone(s, StrandKind::kBackward);
        finish_bwd_unit(f, u, st);
      }
      if (slot_hook_) slot_hook_(m, false);
    }
  } else {
    Inflight cur, prev;  // cur: forward strand, prev: backward strand
    for (int slot = 0; slot <= M; ++slot) {
      const bool has_f = slot < M, has_b = slot >= 1;
      if (slot_hook_) slot_hook_(slot, true);
      if (has_f) start_mb(cur, slot, mbs[slot]);
      // Backward ops the previous pair's plan carried out (SIPlan::carry); their unit finishes
      // (DP hook, loss, release) as soon as they ran, inside the next pair.
      CarriedOps carry;
      for (int k = 0; k < U; ++k) {
        const int fu = k, bu = U - 1 - k;
        StrandSlot fs{cur.mb, fu, has_f ? cur.envs[fu].get() : nullptr};
        StrandSlot bs{prev.mb, bu, has_b ? prev.envs[bu].get() : nullptr};
        if (has_f) link_forward(cur, fu);
        if (has_b) link_backward(prev, bu, /*release_above=*/carry.empty());
        if (has_f && has_b) {
          const SIPlan& plan = pair_plan(fu, bu);
          exec_.run_pair(&fs, &bs, plan.blocks, plan.carry, &carry);
          DHX_ASSERT(carry.empty(), "pair ({}, {}) left carried ops unrun", fu, bu);
          if (plan.carry > 0) {
            const int n = static_cast<int>(exec_.program(bu).bwd.size());
            carry = CarriedOps{bs, n - plan.carry, n, [this, &prev, &st, bu] {
                                 finish_bwd_unit(prev, bu, st);
                                 if (bu > 0) prev.envs[bu].reset();  // finish_bwd_unit releases unit 0 itself
                               }};
          } else {
            finish_bwd_unit(prev, bu, st);
          }
        } else if (has_f) {
          exec_.run_alone(fs, StrandKind::kForward);
        } else {
          exec_.run_alone(bs, StrandKind::kBackward);
          finish_bwd_unit(prev, bu, st);
        }
      }
      exec_.run_carried(carry);  // the slot's last pair carried ops out: nothing follows to hide
      if (slot_hook_) slot_hook_(slot, false);
      prev = std::move(cur);
      cur = Inflight{};
    }
  }
  if (ctx_.act_mem) st.peak_activation_bytes = ctx_.act_mem->peak();
  return st;
}

StepStats StepRunner::forward_only(const std::vector<MicroBatch>& mbs) {
  StepStats st;
  const int U = exec_.num_units();
  for (int m = 0; m < static_cast<int>(mbs.size()); ++m) {
    Inflight f;
    start_mb(f, m, mbs[m]);
    for (int u = 0; u < U; ++u) {
      link_forward(f, u);
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

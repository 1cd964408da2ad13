// StepRunner: runs a step schedule's slots, single passes alone and co-executed ones pair by pair.
#include "runtime/StepRunner.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "base/Clock.h"
#include "base/Error.h"
#include "kernels/cpu/Bf16.h"
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
  // By program: a layer past the first recompute_layers or keep_gathered of its chunk runs another
  // block ("block_plain", "block_gathering"), whose ops the block plan's windows do not index (the
  // default plan pairs it).
  const std::string& fk = exec_.program(fu).name;
  const std::string& bk = exec_.program(bu).name;
  if (fk == "block" && bk == "block") return block_plan_;
  auto key = std::make_pair(fk, bk);
  for (size_t i = 0; i < edge_keys_.size(); ++i)
    if (edge_keys_[i] == key) return edge_cache_[i];
  edge_keys_.push_back(key);
  edge_cache_.push_back(pair_default_plan(exec_.program(fu).fwd, exec_.program(bu).bwd));
  return edge_cache_.back();
}

void StepRunner::link_forward(Inflight& f, int unit, const MicroBatch& data, Tensor received) {
  auto& env = f.envs[unit];
  DHX_ASSERT(!env, "micro-batch {} runs its forward through unit {} twice", f.mb, unit);
  env = std::make_unique<UnitEnv>();
  // On a GPU the micro-batch's tokens and targets are copied to it (a few KB per micro-batch),
  // without waiting for the stream (device_upload: a wait here stopped both strands' issue until
  // the forward strand's queue ran dry, twice a micro-batch).
  auto to_device = [&](const Tensor& h) {
    if (ctx_.device.is_host()) return h;
    Tensor t = Tensor::empty(h.shape(), h.dtype(), nullptr, ctx_.device, exec_.compute_stream());
    device_upload(t.raw(), ctx_.device, h.raw(), h.nbytes(), exec_.compute_stream());
    return t;
  };
  if (unit == 0) env->bufs["tokens"] = to_device(data.tokens);
  if (unit == exec_.num_units() - 1) env->bufs["targets"] = to_device(data.targets);
  if (unit == 0) return;
  if (received.defined()) {  // from the previous stage
    env->bufs["x"] = received;
    return;
  }
  // The output moves to the next unit: backward never reads a unit's own "y".
  auto& prev = f.envs[unit - 1]->bufs;
  env->bufs["x"] = prev.at("y");
  prev.erase("y");
}

void StepRunner::link_backward(Inflight& b, int unit, bool release_above, Tensor received) {
  if (unit == exec_.num_units() - 1) return;
  if (received.defined()) {  // from the next stage
    b.envs[unit]->bufs["dy"] = received;
    return;
  }
  b.envs[unit]->bufs["dy"] = b.envs[unit + 1]->at("dx");
  // Unit+1 finished its backward; its "dx" lives on as our "dy", the rest is dead. Releasing it
  // before this pair runs lets the forward strand reuse the memory.
  if (release_above) b.envs[unit + 1].reset();
}

void StepRunner::finish_bwd_unit(Inflight& b, int unit, StepStats& st) {
  UnitEnv& env = *b.envs[unit];
  DHX_ASSERT(env.pending.empty(), "unit {} finished backward with collectives in flight", unit);
  if (unit == exec_.num_units() - 1) losses_.push_back(env.at("loss"));
  // The host's are summed at once (a GPU's at the step's end: reading one back now would hold the
  // host until both strands' queued kernels ran).
  if (ctx_.device.is_host()) add_losses(st);
  // The unit above was released when our dy was linked; the first unit has no consumer.
  if (unit == 0) b.envs[0].reset();
  for (StepObserver* o : exec_.observers()) o->on_unit_backward_done(b.mb, unit);
}

void StepRunner::add_losses(StepStats& st) {
  // In the order their micro-batches finished, each token's in order.
  for (const Tensor& t : losses_) {
    const Tensor loss = t.to(Device::host());
    const float* l = loss.f32();
    for (int64_t i = 0; i < loss.numel(); ++i) st.loss_sum += l[i];
    st.tokens += loss.numel();
  }
  losses_.clear();
}

// Co-executed slot: forward unit fc.begin+i beside backward unit bc.end-1-i for i < the shorter
// chunk's length, then the longer chunk's remaining units alone. A pair's plan may carry the
// backward unit's trailing weight-gradient ops into the next pair (SIPlan::carry); their unit
// finishes (DP hook, loss, release) as soon as they ran.
void StepRunner::run_slot(Inflight* f, const Chunk* fc, Tensor f_in, Inflight* b, const Chunk* bc, Tensor b_in,
                          const MicroBatch* fdata, StepStats& st) {
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
    link_forward(*f, fu, *fdata, i == 0 ? f_in : Tensor());
    link_backward(*b, bu, /*release_above=*/carry.empty(), i == 0 ? b_in : Tensor());
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
    link_forward(*f, fu, *fdata, i == 0 ? f_in : Tensor());
    StrandSlot s{f->mb, fu, f->envs[fu].get()};
    exec_.run_alone(s, StrandKind::kForward);
  }
  for (int i = n; i < nb; ++i) {
    const int bu = bwd_unit(i);
    link_backward(*b, bu, true, i == 0 ? b_in : Tensor());
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

// The residual stream between units: [N / tp, C] under Megatron's layouts (the sequence shard),
// [N, C / Gx] on the 3D grid (the features over x; this rank's micro-batch is already its z share).
Shape StepRunner::boundary_shape() const {
  const int64_t tp = std::max(1, ctx_.layout.tp), gx = std::max(1, ctx_.layout.tp_x);
  return {ctx_.mb.tokens() / tp, ctx_.model->d_model / gx};
}

// The strand whose stream writes (sends) or reads (receives) a pipeline message of `kind`.
StreamHandle StepRunner::message_stream(TransferKind kind) const {
  return exec_.strand_stream(kind == TransferKind::kActivation ? StrandKind::kForward : StrandKind::kBackward);
}

Tensor StepRunner::boundary_buffer(TransferKind kind, ProcessGroup& pp) {
  if (ctx_.device.is_host()) return Tensor::empty(boundary_shape(), DType::kF32, ctx_.act_mem);
  const StreamHandle s = message_stream(kind);
  pp.set_producer_stream(s);
  return Tensor::empty(boundary_shape(), DType::kBF16, ctx_.act_mem, ctx_.device, s);
}

void StepRunner::sent_from(TransferKind kind, ProcessGroup& pp) {
  if (!ctx_.device.is_host()) pp.set_producer_stream(message_stream(kind));
}

namespace {
// A message's tag on the pp group: unique per (kind, micro-batch, boundary) within a step.
int transfer_tag(const Transfer& t, int num_chunks) {
  return (t.mb * num_chunks + t.boundary) * 2 + (t.kind == TransferKind::kGradient ? 1 : 0);
}
}  // namespace

StepStats StepRunner::run_schedule(const StepSchedule& sch, const std::vector<MicroBatch>& mbs) {
  StepStats st;
  exec_.after_default_stream();  // the gradients' zeroing (ParamStore::zero_grads) first
  ctx_.router.clear();
  losses_.clear();  // (a step that threw left its own)
  const int M = static_cast<int>(mbs.size());
  const int U = exec_.num_units();
  const int S = static_cast<int>(sch.chunks.size());
  DHX_CHECK(M >= 1, ConfigError, "a step needs at least one micro-batch, got {}", M);
  for (StepObserver* o : exec_.observers()) o->on_step_begin(M);
  DHX_CHECK(sch.micro_batches == M && sch.num_units == U, InternalError,
            "schedule '{}' is for {} micro-batches over {} units; this step has {} over {}", sch.name,
            sch.micro_batches, sch.num_units, M, U);
  const int rank = ctx_.pp_rank;
  DHX_CHECK(rank >= 0 && rank < sch.pp, InternalError, "pp rank {} outside schedule '{}' of pp={}", rank, sch.name,
            sch.pp);
  ProcessGroup* pp = ctx_.groups.get(GroupRole::kPP);
  DHX_CHECK(sch.pp == 1 || (pp && pp->size() == sch.pp), InternalError,
            "schedule '{}' has pp={} but this run's pp group has {} ranks", sch.name, sch.pp, pp ? pp->size() : 1);
  DHX_CHECK(int64_t{M} * S * 2 < ProcessGroup::kMaxP2PTag, ConfigError,
            "training.micro_batches={} x {} chunks is too many pipeline messages for the P2P tags (< {})", M, S,
            ProcessGroup::kMaxP2PTag / 2);
  check_schedule(sch);
  if (ctx_.act_mem) ctx_.act_mem->reset_peak();
  cpu::set_num_threads(ctx_.kernels.threads);  // this thread's OpenMP count: the run's, not a process-wide one
  // bf16: the step's weight copies (Bf16Weights), made on first use and dropped when the step ends
  // however it ends (the weights change only between steps).
  std::optional<Bf16Weights> weights16;
  // (The CPU's: a GPU store keeps its own bf16 copy, ParamStore::flat_bf16, which its GEMMs read.)
  if (ctx_.kernels.precision == cpu::GemmPrecision::kBf16 && ctx_.device.is_host()) weights16.emplace(ctx_.state_mem);
  struct Unset {
    Bf16Weights*& slot;
    ~Unset() { slot = nullptr; }
  } unset{ctx_.bf16_weights};
  ctx_.bf16_weights = weights16 ? &*weights16 : nullptr;

  std::map<int, Inflight> live;  // micro-batches with a unit between its forward and backward
  auto inflight = [&](int mb) -> Inflight& {
    Inflight& f = live[mb];
    if (f.envs.empty()) f.mb = mb, f.envs.resize(U);
    return f;
  };
  struct Posted {
    Tensor buf;
    Work work;
  };
  std::map<int, Posted> recvs;      // tag -> posted receive
  std::vector<Posted> sends;        // in flight until the step ends
  std::vector<std::string> send_names;
  auto trace_p2p = [&](const Work& w, const std::string& name) {
    if (ctx_.trace && pp)
      ctx_.trace->add("comm " + pp->name(), name, w.start_time(), w.end_time(),
                      fmt::format(R"({{"queued_us":{:.3f}}})", (w.start_time() - w.issue_time()) * 1e6));
  };
  // Drops the sends that completed (all of them, waiting, with `wait`), in issue order.
  auto reap_sends = [&](bool wait) {
    size_t i = 0;
    for (; i < sends.size(); ++i) {
      if (wait) sends[i].work.wait();
      else if (!sends[i].work.is_completed()) break;
      trace_p2p(sends[i].work, send_names[i]);
    }
    sends.erase(sends.begin(), sends.begin() + static_cast<std::ptrdiff_t>(i));
    send_names.erase(send_names.begin(), send_names.begin() + static_cast<std::ptrdiff_t>(i));
  };
  const std::vector<Slot>& slots = sch.ranks.at(rank);
  int posted_upto = 0;              // slots whose receives are posted: [0, posted_upto)
  auto post_until = [&](int k) {
    for (; posted_upto < std::min(k, static_cast<int>(slots.size())); ++posted_upto)
      for (const Transfer& t : slots[posted_upto].recvs) {
        Tensor buf = boundary_buffer(t.kind, *pp);
        Work w = pp->recv(buf, t.peer, transfer_tag(t, S));
        recvs[transfer_tag(t, S)] = Posted{buf, std::move(w)};
      }
  };
  auto take = [&](const Transfer& t) {
    auto it = recvs.find(transfer_tag(t, S));
    DHX_ASSERT(it != recvs.end(), "receive of the {} of micro-batch {} across boundary {} was not posted",
               transfer_kind_name(t.kind), t.mb, t.boundary);
    const double w0 = now_seconds();
    exec_.stream_wait(it->second.work);
    st.p2p_wait_s += now_seconds() - w0;
    trace_p2p(it->second.work, fmt::format("recv {} mb{} b{} <-r{}", transfer_kind_name(t.kind), t.mb, t.boundary,
                                           t.peer));
    Tensor buf = it->second.buf;
    recvs.erase(it);
    return buf;
  };
  for (int k = 0; k < static_cast<int>(slots.size()); ++k) {
    const Slot& sl = slots[k];
    if (slot_hook_) slot_hook_(k, true);
    const double slot_t0 = ctx_.trace ? now_seconds() : 0;
    reap_sends(/*wait=*/false);  // sent activations and gradients free their memory once delivered
    post_until(k + 1 + sch.recv_lookahead);
    Tensor f_in, b_in;
    for (const Transfer& t : sl.recvs) (t.kind == TransferKind::kActivation ? f_in : b_in) = take(t);
    Inflight* f = sl.fwd.active() ? &inflight(sl.fwd.mb) : nullptr;
    Inflight* b = sl.bwd.active() ? &inflight(sl.bwd.mb) : nullptr;
    const Chunk* fc = f ? &sch.chunks[sl.fwd.chunk] : nullptr;
    const Chunk* bc = b ? &sch.chunks[sl.bwd.chunk] : nullptr;
    run_slot(f, fc, f_in, b, bc, b_in, f ? &mbs[sl.fwd.mb] : nullptr, st);
    for (const Transfer& t : sl.sends) {
      // An activation leaves as the chunk's last forward output ("y", which no backward reads);
      // a gradient as its first unit's "dx", after which that unit's env is dead.
      Tensor out;
      if (t.kind == TransferKind::kActivation) {
        auto& env = f->envs[fc->unit_end - 1];
        out = env->at("y");
        env->bufs.erase("y");
      } else {
        auto& env = b->envs[bc->unit_begin];
        out = env->at("dx");
        env.reset();
      }
      sent_from(t.kind, *pp);
      sends.push_back(Posted{out, pp->send(out, t.peer, transfer_tag(t, S))});
      send_names.push_back(fmt::format("send {} mb{} b{} ->r{}", transfer_kind_name(t.kind), t.mb, t.boundary, t.peer));
    }
    if (ctx_.trace) {
      // The schedule lane: one box per slot, named by its passes, so the pipeline's shape (the W's
      // down- and up-passes) and the co-executed pairs read off the trace.
      auto pass = [](const char* k, const Pass& p) { return fmt::format("{}{} c{}", k, p.mb, p.chunk); };
      std::string name = sl.co_executed() ? pass("F", sl.fwd) + " || " + pass("B", sl.bwd)
                         : sl.fwd.active() ? pass("F", sl.fwd)
                                           : pass("B", sl.bwd);
      ctx_.trace->add(fmt::format("schedule stage {}", rank), name, slot_t0, now_seconds(),
                      fmt::format(R"({{"slot":{},"phase":"{}"}})", k, sl.phase));
    }
    if (b && std::all_of(b->envs.begin(), b->envs.end(), [](const auto& e) { return !e; })) live.erase(sl.bwd.mb);
    if (slot_hook_) slot_hook_(k, false);
  }
  const double w0 = now_seconds();
  reap_sends(/*wait=*/true);
  st.p2p_wait_s += now_seconds() - w0;
  DHX_ASSERT(recvs.empty(), "{} posted receives were never used", recvs.size());
  DHX_ASSERT(live.empty(), "{} micro-batches still hold activations after the step", live.size());
  add_losses(st);  // a GPU's, copied back now that the step's kernels ran
  exec_.finish_device_waits();  // collectives the GPU waited for (NCCL): their failures, if any
  exec_.end_kept_blocks();      // the optimizer updates the weights next
  exec_.flush_trace();  // a GPU's compute lanes, from its events
  if (ctx_.act_mem) st.peak_activation_bytes = ctx_.act_mem->peak();
  ctx_.router.settle();  // a GPU's statistics, copied back as the step ran
  st.aux_weighted = ctx_.router.aux_weighted;
  st.expert_tokens = ctx_.router.tokens;
  return st;
}

StepStats StepRunner::forward_only(const std::vector<MicroBatch>& mbs) {
  StepStats st;
  exec_.after_default_stream();
  ctx_.router.clear();
  const int U = exec_.num_units();
  const std::vector<Chunk> chunks = pipeline_chunks(pipeline_);
  const int S = static_cast<int>(chunks.size());
  ProcessGroup* pp = ctx_.groups.get(GroupRole::kPP);
  std::vector<Work> sends;
  std::vector<Tensor> keep;
  for (int m = 0; m < static_cast<int>(mbs.size()); ++m) {
    Inflight f{m, {}};
    f.envs.resize(U);
    // Each micro-batch walks the chunks in forward order; a rank runs its own and takes the input
    // of each from the previous chunk's rank (a blocking receive: producers never wait on it).
    for (int c = 0; c < S; ++c) {
      const Chunk& ch = chunks[c];
      if (ch.rank != ctx_.pp_rank) continue;
      Tensor in;
      if (c > 0 && chunks[c - 1].rank != ch.rank) {
        in = boundary_buffer(TransferKind::kActivation, *pp);
        exec_.stream_wait(pp->recv(in, chunks[c - 1].rank, transfer_tag({TransferKind::kActivation, m, c, 0}, S)));
      }
      for (int u = ch.unit_begin; u < ch.unit_end; ++u) {
        link_forward(f, u, mbs[m], u == ch.unit_begin ? in : Tensor());
        StrandSlot s{m, u, f.envs[u].get()};
        exec_.run_alone(s, StrandKind::kForward);
        if (u > 0) f.envs[u - 1].reset();  // its "y" moved on; a forward-only pass keeps nothing
      }
      if (c + 1 < S && chunks[c + 1].rank != ch.rank) {
        Tensor y = f.envs[ch.unit_end - 1]->at("y");
        keep.push_back(y);
        sent_from(TransferKind::kActivation, *pp);
        sends.push_back(pp->send(y, chunks[c + 1].rank, transfer_tag({TransferKind::kActivation, m, c + 1, 0}, S)));
      }
      if (ch.unit_end == U) {
        const Tensor loss = f.envs[U - 1]->at("loss").to(Device::host());
        for (int64_t i = 0; i < loss.numel(); ++i) st.loss_sum += loss.f32()[i];
        st.tokens += loss.numel();
      }
      if (c + 1 == S || chunks[c + 1].rank != ch.rank) f.envs[ch.unit_end - 1].reset();
    }
  }
  for (Work& w : sends) w.wait();
  exec_.finish_device_waits();
  exec_.end_kept_blocks();
  exec_.flush_trace();
  ctx_.router.settle();  // a GPU's statistics, copied back as the step ran
  st.aux_weighted = ctx_.router.aux_weighted;
  st.expert_tokens = ctx_.router.tokens;
  return st;
}

}  // namespace dhelix

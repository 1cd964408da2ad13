// Executor: op dispatch, collective issue/wait, block ordering and trace events.
#include "runtime/Executor.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/Clock.h"
#include "base/Error.h"
#include "kernels/cpu/Bf16.h"
#include "kernels/cpu/Kernels.h"
#include "plan/IssueOrder.h"
#if DHELIX_HAVE_CUDA
#include "kernels/cuda/Ops.h"
#endif

namespace dhelix {

Executor::Executor(RunContext& ctx, const std::vector<UnitSpec>& units, const ModelPrograms& progs)
    : ctx_(ctx),
      units_(units),
      progs_(progs),
      kernels_(kernel_registry(ctx.device)),
      on_gpu_(!ctx.device.is_host()),
      streams_{make_stream(ctx.device), make_stream(ctx.device)} {}

void Executor::join_streams() {
  if (!on_gpu_) return;
  const std::unique_ptr<Event> f = streams_[0]->record(), b = streams_[1]->record();
  streams_[0]->wait(*b);
  streams_[1]->wait(*f);
}

void Executor::after_default_stream() {
  if (!on_gpu_) return;
  for (auto& s : streams_) stream_after_default(ctx_.device, s->handle());
}

void Executor::synchronize() {
  if (!on_gpu_) return;
  for (auto& s : streams_) s->record()->host_wait();
}

void Executor::finish_device_waits() {
  std::vector<DeviceWaited> waited;
  waited.swap(device_waited_);
  for (DeviceWaited& d : waited) {
    d.work.wait();
    if (ctx_.trace) {
      const double begin = d.work.start_time();
      ctx_.trace->add("comm " + d.group, d.name, begin, d.work.end_time(),
                      fmt::format(R"({{"queued_us":{:.3f},"wait_us":{:.3f},"device_wait":true}})",
                                  (begin - d.work.issue_time()) * 1e6, (d.wait_called - begin) * 1e6));
    }
  }
}

void Executor::flush_trace() {
  if (gpu_marks_.empty()) return;
  std::vector<GpuMark> marks;
  marks.swap(gpu_marks_);
  const std::unique_ptr<Event> base = std::move(trace_base_);
  for (GpuMark& m : marks) {
    m.end->host_wait();
    if (ctx_.trace)
      ctx_.trace->add(m.lane, m.name, trace_base_s_ + m.begin->seconds_since(*base),
                      trace_base_s_ + m.end->seconds_since(*base), R"({"clock":"gpu"})");
  }
}

// A pair's bracket on a GPU: the strands' streams joined before the pair's first launch and after
// its last, the device memory the pair frees held until the second join (Executor.h). end() on the
// normal path lets a failure there surface; the destructor (a pair that threw) only cleans up.
class Executor::PairScope {
 public:
  explicit PairScope(Executor& e) : e_(e) {
    if (!e_.on_gpu_) return;
    e_.join_streams();
    hold_device_frees();
    held_ = true;
  }
  void end() {
    if (!held_) return;
    e_.join_streams();  // where this throws, the destructor still releases the held frees
    held_ = false;
    release_device_frees();
  }
  ~PairScope() {
    if (!held_) return;
    try {
      e_.join_streams();
    } catch (const std::exception&) {  // the pair failed already; its error is the one reported
    }
    try {
      release_device_frees();
    } catch (const std::exception&) {
    }
  }
  PairScope(const PairScope&) = delete;
  PairScope& operator=(const PairScope&) = delete;

 private:
  Executor& e_;
  bool held_ = false;
};

const LayerProgram& Executor::program(int u) const { return progs_.program(u, units_.at(u).kind); }

Executor::~Executor() {
  for (auto& [key, p] : prefetched_) {
    try {
      p.coll.work.wait();
    } catch (...) {  // the run failed already; the buffer must still outlive the transfer
    }
  }
  // (A transfer that did not finish holds its own reference: its group's task keeps the buffer.)
  // Their device memory is ordered on streams_, which go next: given back while they exist (a step
  // that threw leaves unadopted prefetches and 3D block sums behind).
  prefetched_.clear();
  block_sums_.clear();
  kept_blocks_.clear();
}

// Cross-layer prefetch (AxoNN's OAG across layers): the op names, in attrs, the neighbouring unit
// ("prefetch_unit": +1 for the forward strand, -1 for the backward); its output is the buffer name
// that unit's own all-gather op writes with ".next" appended (the name stays out of this unit's
// lifetimes). Nothing is issued when the neighbour is
// not a transformer block whose parameters this rank holds (the head, the embedding, a unit of a
// layer-pair bench): every rank of the group decides alike, so the issue order stays the same.
void Executor::issue_prefetch(StrandKind kind, StrandSlot& s, const Op& op) {
  const int dir = static_cast<int>(op.attrs.at("prefetch_unit")), target = s.unit + dir;
  if (target < 0 || target >= num_units() || units_.at(target).kind != "block" || !ctx_.params->owns_unit(target))
    return;
  std::string adopter = op.outputs.at(0);
  DHX_ASSERT(adopter.size() > 5 && adopter.ends_with(".next"), "prefetch op {} writes '{}', not '<buffer>.next'",
             op.name, adopter);
  adopter.resize(adopter.size() - 5);
  // Nor when the neighbour's program gathers no such block in that direction (a layer that keeps its
  // forward's blocks gathers none in its backward: LayoutConfig::keep_gathered). Every rank of the
  // group runs the same program there, so all decide alike.
  const std::vector<Op>& there = dir > 0 ? program(target).fwd : program(target).bwd;
  const auto gather = std::find_if(there.begin(), there.end(), [&](const Op& o) {
    return o.is_collective() && o.coll == CollOp::kAllGather && o.inputs.empty() && o.outputs.at(0) == adopter;
  });
  if (gather == there.end()) return;
  // Nor when that block is kept from this step's micro-batch 0 (reuse_kept_block will bind it).
  if (gather->flag("kept") && s.mb > 0 && ctx_.micro_batches > 1) {
    DHX_CHECK(kept_blocks_.count({target, adopter}), InternalError,
              "{} (micro-batch {}): unit {}'s kept block '{}' was not gathered by micro-batch 0 of this step", op.name,
              s.mb, target, adopter);
    return;
  }
  ProcessGroup& pg = group_of(op);
  if (on_gpu_) pg.set_producer_stream(stream_of(kind).handle());
  Tensor in = weight_shard(ctx_.params->resolve(units_.at(target), op.params.at(0)));
  Tensor out = Tensor::empty({in.numel() * pg.size()}, in.dtype(), ctx_.act_mem, in.device(),
                             on_gpu_ ? stream_of(kind).handle() : nullptr);
  Prefetched p{out, {}};
  p.coll.work = pg.all_gather(in, out);
  p.coll.group = pg.name();
  p.coll.name = fmt::format("{} mb{} u{}", op.name, s.mb, target);
  p.coll.issue_s = now_seconds();
  // A prefetch for the same (strand, micro-batch, unit, buffer) that nobody adopted (a layer pair
  // run again by a bench): its transfer must end before its buffer goes.
  const auto key = std::make_tuple(static_cast<int>(kind), s.mb, target, adopter);
  if (auto old = prefetched_.find(key); old != prefetched_.end()) old->second.coll.work.wait();
  prefetched_[key] = std::move(p);
}

Tensor Executor::weight_shard(const ParamEntry& w) const {
  const Tensor& v = on_gpu_ ? w.value_bf16 : w.value;
  DHX_ASSERT(v.defined(), "weight {} has no {} values to gather", w.spec.name, on_gpu_ ? "bf16" : "fp32");
  return v.view({v.numel()});
}

bool Executor::adopt_prefetch(StrandKind kind, StrandSlot& s, const Op& op) {
  auto it = prefetched_.find({static_cast<int>(kind), s.mb, s.unit, op.outputs.at(0)});
  if (it == prefetched_.end()) return false;
  s.env->bufs[op.outputs.at(0)] = it->second.buf;
  s.env->pending[op.outputs.at(0)] = std::move(it->second.coll);
  prefetched_.erase(it);
  return true;
}

void Executor::drain(UnitEnv& env) {
  while (!env.pending.empty()) wait_pending(env, env.pending.begin()->first);
  finish_device_waits();  // "waits for every collective": those the GPU waited for too
}

void Executor::drain_prefetches() {
  for (auto& [key, p] : prefetched_) p.coll.work.wait();
  prefetched_.clear();
  kept_blocks_.clear();  // a step that failed part-way left some (a full step takes each out)
}

bool Executor::reuse_kept_block(StrandSlot& s, const Op& op) {
  if (s.mb == 0 || ctx_.micro_batches <= 1) return false;
  auto it = kept_blocks_.find({s.unit, op.outputs.at(0)});
  DHX_CHECK(it != kept_blocks_.end(), InternalError,
            "{} of unit {}, micro-batch {}: no block kept from micro-batch 0 of this step", op.name, s.unit, s.mb);
  // Micro-batch 0's forward through this unit ran before this one's, and its GEMM waited for the
  // gather (on a GPU: its strand's stream, on which this forward runs too), so the block is complete.
  s.env->bufs[op.outputs.at(0)] = it->second;
  return true;
}

void Executor::keep_block(StrandSlot& s, const Op& op) {
  if (s.mb == 0 && ctx_.micro_batches > 1) kept_blocks_[{s.unit, op.outputs.at(0)}] = s.env->at(op.outputs.at(0));
}

ProcessGroup& Executor::group_of(const Op& op) const {
  ProcessGroup* g = ctx_.groups.by_name(op.group);
  DHX_CHECK(g != nullptr, InternalError, "op {} needs process group '{}' which this run does not have", op.name,
            op.group);
  return *g;
}

std::string Executor::lane(StrandKind k) const { return k == StrandKind::kForward ? "compute fwd" : "compute bwd"; }

void Executor::wait_pending(UnitEnv& env, const std::string& buf, Stream* on) {
  auto it = env.pending.find(buf);
  if (it == env.pending.end()) return;
  const double wait_called = ctx_.trace ? now_seconds() : 0;
  WorkEvent done(it->second.work);
  if (on) on->wait(done);  // host: a join with the group's comm thread; a GPU: Work::wait_on
  else
    for (auto& s : streams_) s->wait(done);
  if (!it->second.work.is_completed()) {
    // Ordered on the GPU after an op still running (an NCCL op's end event): the host goes on; the
    // op is waited for, and traced, at the step's end.
    PendingColl& p = it->second;
    device_waited_.push_back(DeviceWaited{std::move(p.work), p.group, p.name, wait_called});
    env.pending.erase(it);
    return;
  }
  // Completed -- or failed (the NCCL watchdog) between the device wait and the check above: a
  // failure is thrown here, not lost with the op (a review, 2026-11-29).
  it->second.work.wait();
  if (it->second.widen_to.defined()) {  // arrived in bf16: widened into the fp32 buffer its readers use
    const Tensor& w = it->second.wire_out;
    cpu::widen_bf16(w.data<uint16_t>(), it->second.widen_to.f32(), w.numel());
  }
  if (ctx_.trace) {
    // Besides when the comm thread ran it: when the compute thread issued it (queued_us before the
    // begin) and began to wait for it (wait_us after the begin; negative if before), so the
    // window the schedule gave it, issue to wait, can be read off the trace too.
    auto& p = it->second;
    const double begin = p.work.start_time();
    ctx_.trace->add("comm " + p.group, p.name, begin, p.work.end_time(),
                    fmt::format(R"({{"queued_us":{:.3f},"wait_us":{:.3f}}})", (begin - p.work.issue_time()) * 1e6,
                                (wait_called - begin) * 1e6));
  }
  env.pending.erase(it);
}

void Executor::issue_collective(StrandKind kind, StrandSlot& s, const Op& op) {
  UnitEnv& env = *s.env;
  for (auto& in : op.inputs) wait_pending(env, in, &stream_of(kind));
  for (auto& out : op.outputs) env.drop_mirror(out);  // the collective writes it
  if (op.coll == CollOp::kAllReduce)  // in place: its input's storage too, whatever the output's name
    for (auto& in : op.inputs) env.drop_mirror(in);
  ProcessGroup& pg = group_of(op);
  // A GPU group's op (NCCL, staged) waits, on the GPU, for the kernels the issuing strand launched
  // before it.
  if (on_gpu_) pg.set_producer_stream(stream_of(kind).handle());
  // A weight all-gather (3D tensor parallelism) reads this rank's flat shard of the parameter.
  Tensor in = op.inputs.empty() ? weight_shard(ctx_.params->resolve(units_.at(s.unit), op.params.at(0)))
                                : env.at(op.inputs.at(0));
  // An activation collective in bf16: it moves a rounded copy; the fp32 result buffer is filled when
  // it is waited for (wait_pending).
  const Tensor in32 = in;
  // (A GPU step's activations are bf16 already, and its fp32 tensors -- loss statistics -- move as
  // they are.)
  const bool wire16 = !on_gpu_ && ctx_.activation_wire == WirePrecision::kBf16 && op.flag("activation") &&
                      in.dtype() == DType::kF32;
  // A collective's new output lives where its input does (a GPU's: ordered on the issuing strand's
  // stream, as the op's kernels' outputs are).
  auto new_out = [&](const Shape& sh) {
    return Tensor::empty(sh, in.dtype(), ctx_.act_mem, in.device(), on_gpu_ ? stream_of(kind).handle() : nullptr);
  };
  if (wire16) {
    in = Tensor::empty(in32.shape(), DType::kBF16, ctx_.act_mem);
    cpu::round_to_bf16(in32.f32(), in.data<uint16_t>(), in32.numel());
  }
  const int n = pg.size();
  Work w;
  switch (op.coll) {
    case CollOp::kAllGather: {
      Shape sh = in.shape();
      sh[0] *= n;
      Tensor out = new_out(sh);
      env.bufs[op.outputs.at(0)] = out;
      w = pg.all_gather(in, out);
      break;
    }
    case CollOp::kReduceScatter: {
      Shape sh = in.shape();
      DHX_ASSERT(sh[0] % n == 0, "{}: {} rows not divisible by {}", op.name, sh[0], n);
      sh[0] /= n;
      Tensor out = new_out(sh);
      env.bufs[op.outputs.at(0)] = out;
      w = pg.reduce_scatter(in, out);
      break;
    }
    case CollOp::kAllReduce: {
      auto it = op.attrs.find("reduce_max");
      bool mx = it != op.attrs.end() && it->second;
      env.bufs[op.outputs.at(0)] = in;  // in place
      w = pg.all_reduce(in, mx ? ReduceOp::kMax : ReduceOp::kSum);
      break;
    }
    case CollOp::kAllToAll: {
      if (op.inputs.size() == 1) {  // even: chunk j of dim 0 to rank j (the MoE token counts)
        DHX_ASSERT(in.dim(0) % n == 0, "{}: {} rows not divisible by {}", op.name, in.dim(0), n);
        Tensor out = new_out(in.shape());
        env.bufs[op.outputs.at(0)] = out;
        w = pg.all_to_all(in, out);
        break;
      }
      // Uneven over rows (expert parallelism's token exchange): inputs[1] and inputs[2] are int32
      // count arrays of n equal chunks; chunk j's sum is the rows sent to (inputs[1]) and received
      // from (inputs[2]) group rank j. The counts were exchanged by an earlier op (waited above).
      DHX_ASSERT(op.inputs.size() == 3, "{}: an uneven all-to-all reads data, send and receive counts", op.name);
      // (A GPU's counts come back to the host, as Megatron's token dispatcher does: once per
      // micro-batch, UnitEnv::host_view's mirror, which the later exchanges and the expert GEMMs
      // read too. A copy made here is ordered on the issuing strand's stream: the backward's
      // exchanges read counts its forward wrote, which that stream is already ordered after, and
      // must not wait behind the other strand's queue, as a copy on the counts' allocation stream would.)
      auto rows_per_peer = [&](const std::string& name) {
        const Tensor& counts = env.host_view(name, on_gpu_ ? stream_of(kind).handle() : nullptr);
        DHX_ASSERT(counts.numel() % n == 0, "{}: {} counts for {} ranks", op.name, counts.numel(), n);
        const int64_t per = counts.numel() / n;
        std::vector<int64_t> rows(static_cast<size_t>(n), 0);
        for (int64_t i = 0; i < counts.numel(); ++i) rows[static_cast<size_t>(i / per)] += counts.data<int32_t>()[i];
        return rows;
      };
      std::vector<int64_t> send = rows_per_peer(op.inputs[1]), recv = rows_per_peer(op.inputs[2]);
      int64_t total = 0;
      for (int64_t r : recv) total += r;
      Shape sh = in.shape();
      sh[0] = total;
      Tensor out = new_out(sh);
      env.bufs[op.outputs.at(0)] = out;
      w = pg.all_to_all_v(in, std::move(send), out, std::move(recv));
      break;
    }
    case CollOp::kSendRecv: {  // one step of a ring (context parallelism's keys and values)
      Tensor out = new_out(in.shape());
      env.bufs[op.outputs.at(0)] = out;
      w = pg.ring_shift(in, out);
      break;
    }
    default:
      throw InternalError(fmt::format("op {}: collective {} is not supported by the executor yet", op.name,
                                      coll_op_name(op.coll)));
  }
  PendingColl pc;
  pc.work = std::move(w);
  pc.group = pg.name();
  pc.name = fmt::format("{} mb{} u{}", op.name, s.mb, s.unit);
  pc.issue_s = now_seconds();
  if (wire16) {
    Tensor& out = env.bufs[op.outputs.at(0)];
    pc.wire_in = in, pc.wire_out = out;
    // In place (all-reduce): the result lands back in the input's fp32 buffer.
    pc.widen_to = op.coll == CollOp::kAllReduce ? in32 : Tensor::empty(out.shape(), DType::kF32, ctx_.act_mem);
    out = pc.widen_to;
  }
  env.pending[op.outputs.at(0)] = std::move(pc);
}

namespace {
// acc += x in fp32: on the host, or on a GPU on `stream` (the strand's that wrote x).
void add_f32(const Tensor& acc, const Tensor& x, StreamHandle stream) {
  DHX_ASSERT(acc.numel() == x.numel() && acc.device() == x.device(), "block sum {} += {}", acc.describe(), x.describe());
#if DHELIX_HAVE_CUDA
  if (!acc.device().is_host()) {
    cuda::add_inplace(static_cast<float*>(acc.raw()), static_cast<const float*>(x.raw()), acc.numel(),
                      static_cast<cudaStream_t>(stream));
    return;
  }
#endif
  cpu::add_inplace<float>(acc.f32(), x.f32(), acc.numel());
}
}  // namespace

bool Executor::fold_into_block_sum(StrandKind kind, StrandSlot& s, const Op& op) {
  if (ctx_.micro_batches <= 1 || !op.flag("last_micro_batch")) return false;
  Tensor& in = s.env->at(op.inputs.at(0));
  const auto key = std::make_pair(s.unit, op.name);
  auto it = block_sums_.find(key);
  if (s.mb < ctx_.micro_batches - 1) {
    if (s.mb == 0 || it == block_sums_.end()) {
      block_sums_[key] = in.clone();  // micro-batch 0 starts the step's sum (nothing stale survives)
    } else {
      DHX_ASSERT(it->second.numel() == in.numel(), "{}: block sum {} vs {}", op.name, it->second.describe(), in.describe());
      add_f32(it->second, in, on_gpu_ ? stream_of(kind).handle() : nullptr);
    }
    s.env->deferred.insert(op.outputs.at(0));
    return true;
  }
  DHX_CHECK(it != block_sums_.end(), InternalError,
            "{} of unit {}: the last micro-batch ({}) found no block sum of the earlier ones", op.name, s.unit, s.mb);
  add_f32(in, it->second, on_gpu_ ? stream_of(kind).handle() : nullptr);
  block_sums_.erase(it);
  return false;
}

void Executor::run_op(StrandKind kind, StrandSlot& s, const Op& op,
                      std::vector<std::pair<UnitEnv*, std::string>>& issued) {
  UnitEnv& env = *s.env;
  if (!observers_.empty()) {
    const std::vector<Op>& ops = kind == StrandKind::kForward ? program(s.unit).fwd : program(s.unit).bwd;
    const IssuedOp io{kind, s.mb, s.unit, static_cast<int>(&op - ops.data()), &op};
    for (StepObserver* o : observers_) o->on_issue(io);
  }
  const bool skipped = std::any_of(op.inputs.begin(), op.inputs.end(),
                                   [&](const std::string& b) { return env.deferred.count(b) > 0; });
  if (skipped) {
    // Reads the output of a collective this micro-batch deferred to the last one (its input went
    // into the block sum): nothing to do now.
  } else if (op.is_collective() && fold_into_block_sum(kind, s, op)) {
    // folded: the last micro-batch reduce-scatters the sum
  } else if (op.is_collective() && op.attrs.count("prefetch_unit")) {
    issue_prefetch(kind, s, op);  // waited for by the neighbouring unit that adopts it
  } else if (op.is_collective() && op.flag("kept") && reuse_kept_block(s, op)) {
    // kept from micro-batch 0 of this step: nothing moves
  } else if (op.is_collective() && op.coll == CollOp::kAllGather && op.inputs.empty() && adopt_prefetch(kind, s, op)) {
    if (op.flag("kept")) keep_block(s, op);
    issued.push_back({&env, op.outputs.at(0)});  // gathered already (or in flight): completes with the block
  } else if (op.is_collective()) {
    issue_collective(kind, s, op);
    if (op.flag("kept")) keep_block(s, op);
    if (ctx_.expose_collectives || op.flag("blocking"))  // an overlap switched off: waited for where issued
      wait_pending(env, op.outputs.at(0));
    else if (!op.flag("background"))
      issued.push_back({&env, op.outputs.at(0)});
    // A background collective (3D TP's weight-gradient reduce-scatter with ORS) does not hold up the
    // end of its block: it stays pending until the op that reads it (grad_accum, the unit's last
    // backward ops, perhaps carried into the next pair) waits for it.
  } else {
    Stream& stream = stream_of(kind);
    for (auto& in : op.inputs) wait_pending(env, in, &stream);
    double t0 = ctx_.trace ? now_seconds() : 0;
    OpCall call{op, env, units_.at(s.unit), *ctx_.params, *ctx_.model, ctx_.mb, ctx_.tp_rank, ctx_.layout.tp,
                ctx_.act_mem, ctx_.dloss, ctx_.shard, &ctx_.router, ctx_.cp_rank, ctx_.layout.cp, ctx_.bf16_weights,
                ctx_.kernels.precision};
    call.device = ctx_.device;
    call.stream = stream.handle();
    call.blas = ctx_.blas;
    const bool diverted = !op.grads.empty() && std::any_of(observers_.begin(), observers_.end(), [&](StepObserver* o) {
                            return o->divert_grad_op(s.mb, s.unit, op);
                          });
    // A GPU trace times the op's kernels with events on its stream (the host's launch times say
    // nothing of when they ran); the first since the last flush first sets the base (Executor.h).
    std::unique_ptr<Event> gpu_begin;
    if (ctx_.trace && on_gpu_ && !diverted) {
      if (!trace_base_) {
        synchronize();
        trace_base_s_ = now_seconds();
        trace_base_ = streams_[0]->record(/*timed=*/true);
      }
      gpu_begin = stream.record(/*timed=*/true);
    }
    if (!diverted) {
      const OpFn& kernel = kernels_.find(op.code);
      stream.launch([&] { kernel(call); });
      if (gpu_begin)
        gpu_marks_.push_back(
            {lane(kind), fmt::format("{} mb{} u{}", op.name, s.mb, s.unit), std::move(gpu_begin), stream.record(true)});
      for (StepObserver* o : observers_) {
        if (!op.grads.empty()) o->on_grad_op(s.mb, s.unit, op);
        o->on_op_done(s.mb, s.unit, op, env.bufs);
      }
    }
    if (ctx_.trace && !on_gpu_)
      ctx_.trace->add(lane(kind), fmt::format("{} mb{} u{}", op.name, s.mb, s.unit), t0, now_seconds());
    if (kind == StrandKind::kForward && ctx_.bf16_saved_activations) keep_saved_in_bf16(s, op);
  }
  for (auto& f : op.frees) {
    if (env.pending.count(f)) continue;  // a collective still owns it; freed with the env
    env.bufs.erase(f);
    env.drop_mirror(f);
  }
}

void Executor::keep_saved_in_bf16(StrandSlot& s, const Op& op) {
  const LayerProgram& prog = program(s.unit);
  auto it = bf16_saves_.find(&prog);
  if (it == bf16_saves_.end()) it = bf16_saves_.emplace(&prog, bf16_saved_buffers(prog)).first;
  const std::ptrdiff_t i = &op - prog.fwd.data();
  DHX_ASSERT(i >= 0 && i < static_cast<std::ptrdiff_t>(prog.fwd.size()), "{} is not a forward op of unit {}", op.name,
             s.unit);
  UnitEnv& env = *s.env;
  for (const std::string& b : it->second[static_cast<size_t>(i)]) {
    auto buf = env.bufs.find(b);
    if (buf == env.bufs.end() || buf->second.dtype() != DType::kF32 || env.pending.count(b)) continue;
    const Tensor& x = buf->second;
    Tensor h = Tensor::empty(x.shape(), DType::kBF16, ctx_.act_mem);
    cpu::round_to_bf16(x.f32(), h.data<uint16_t>(), x.numel());
    buf->second = h;
  }
}

void Executor::run_pair(StrandSlot* f, StrandSlot* b, const std::vector<Block>& blocks, int carry_out,
                        CarriedOps* carry_in) {
  DHX_CHECK(carry_out == 0 || b, InternalError, "carry {} without a backward strand", carry_out);
  PairStrands strands;
  strands.fwd = f ? &program(f->unit).fwd : nullptr;
  strands.bwd = b ? &program(b->unit).bwd : nullptr;
  strands.carry_out = carry_out;
  strands.carried_in = carry_in && !carry_in->empty() ? carry_in->end - carry_in->begin : 0;
  const std::vector<Op>* carried_ops = strands.carried_in > 0 ? &program(carry_in->slot.unit).bwd : nullptr;
  std::vector<std::pair<UnitEnv*, std::string>> issued, carried_issued;
  PairScope scope(*this);
  for (StepObserver* o : observers_) o->on_pair_begin(f ? f->unit : -1, b ? b->unit : -1);
  for (const IssueStep& st : IssueOrder(strands, blocks)) {
    switch (st.kind) {
      case IssueStep::Kind::kOp: {
        StrandSlot& slot = st.strand == StrandKind::kForward ? *f : *b;
        const std::vector<Op>& ops = st.strand == StrandKind::kForward ? *strands.fwd : *strands.bwd;
        run_op(st.strand, slot, ops[static_cast<size_t>(st.op)], issued);
        break;
      }
      case IssueStep::Kind::kCarried:
        // Ops carried in from the previous pair wait on nothing here: they hide its first collective.
        run_op(StrandKind::kBackward, carry_in->slot, (*carried_ops)[static_cast<size_t>(carry_in->begin + st.op)],
               carried_issued);
        if (st.op + 1 == strands.carried_in) finish_carried(*carry_in, carried_issued);
        break;
      case IssueStep::Kind::kBlockEnd:  // the block completes before the next starts
        for (auto& [env, buf] : issued) wait_pending(*env, buf);
        issued.clear();
        break;
    }
  }
  scope.end();
}

void Executor::run_carried(CarriedOps& c) { run_pair(nullptr, nullptr, {}, 0, &c); }

void Executor::finish_carried(CarriedOps& c, const std::vector<std::pair<UnitEnv*, std::string>>& issued) {
  DHX_ASSERT(issued.empty(), "carried backward ops of unit {} issued a collective", c.slot.unit);
  c.begin = c.end;
  if (auto done = std::move(c.on_done)) done();
}

void Executor::run_alone(StrandSlot& s, StrandKind kind) {
  const auto& ops = kind == StrandKind::kForward ? program(s.unit).fwd : program(s.unit).bwd;
  Block blk;
  if (kind == StrandKind::kForward) {
    blk.fwd_end = static_cast<int>(ops.size());
    run_pair(&s, nullptr, {blk});
  } else {
    blk.bwd_end = static_cast<int>(ops.size());
    run_pair(nullptr, &s, {blk});
  }
}

}  // namespace dhelix

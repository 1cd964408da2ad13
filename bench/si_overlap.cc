// si_overlap: how much tensor-parallel communication Strand Interleaving hides. Run it on two
// ranks (tp = 2), one per emulated host (bench/si-overlap.sh: scripts/cluster, 1 Gbit/s), so the
// collectives are wire-bound. With --group ep (bench/moe-si.sh) the same figures for a MoE model's
// expert parallelism instead: dp = ep = 2, each rank half the experts, its own tokens (seeded by
// rank), and the step's collectives are the token all-to-alls (the dp gradient reduction, the same
// with SI on or off, is left out of every variant). With --group cp (bench/cp-si.sh) context
// parallelism: cp = 2, each rank two of the four chunks of every sequence (--seq is the whole
// sequence), and the step's collectives are the ring attention's key/value exchanges (forward, and
// backward with the travelling dK/dV); the gradient reduction over cp is left out likewise. One process measures, round-robin in every timed round (so drift
// and noise hit all alike; T_base and T_si swap order every round; medians over the rounds, each
// the max over ranks):
//
//   T_base  a step with SI off: fwd then bwd of each micro-batch, collectives exposed
//   T_si    the same step with SI on (default plan, or --plan): collectives of one strand
//           issued beside compute of the other
//   C       compute only: the SI-off step with the tp group replaced by a local stand-in of the
//           same rank/size whose collectives are local copies of the same shapes (all-gather
//           writes our rows into every slot, reduce-scatter keeps our slice, all-reduce nothing)
//   C_si    compute only in SI's op order (the SI step with the same stand-in): what
//           interleaving the strands costs or saves the compute itself (working set, caches)
//   T_exposed  the SI-off step with every collective waited for as soon as it is issued: no
//           overlap at all. T_base is already below it, because within one strand a reduce-
//           scatter of input gradients runs under the weight-gradient GEMM that follows it
//           (as in Megatron-LM); (T_exposed - T_si) / min(C, M) is the share SI and that
//           intra-strand overlap hide together.
//   M       comm only: the collectives that stand-in recorded during C (same ops, shapes and
//           order, including GradSync's tp all-reduces) replayed on the real tp group back to
//           back: issued together on its comm thread, waited for at the end
//
// overlap efficiency = (T_base - T_si) / min(C, M); speedup T_base / T_si beside the ideal
// (C + M) / max(C, M). The ceiling (T_base - C) / min(C, M) is the efficiency of a schedule that
// hides all communication (T_si = C): what T_base already hides (T_exposed - T_base) is not
// there for SI to gain, so with M < C the efficiency cannot exceed 1 - (T_exposed - T_base) / M.
// A step = zero grads + forward/backward of all micro-batches + gradient reductions; the AdamW
// update (the same either way, no comm at dp = 1) is not timed. Peak activation bytes (StepStats)
// are reported with SI off and on for this shape and, from one extra step each, the "demo"
// preset. Diagnostics per round: the process CPU time of the replay (comm_cpu_s: kernel TCP
// copies and reductions, which under SI come out of the compute core's time), the irq/softirq
// time on the rank's cores during it (comm_irq_s: packet processing the kernel charges to no
// process, which also comes out of compute under SI), and the CPU time the hypervisor stole from
// the rank's cores (/proc/stat). On a shared virtual machine steal comes in bursts (up to 86 s of
// a 120 s round was measured) on top of a background of a few percent; a burst makes the timing
// it hits meaningless, and it hits one variant, not all alike. So a round in which any rank lost
// more than --max-steal (default 5%, above that background) of any of its six timings to steal is
// repeated, up to 3N attempts for N rounds; the figures are over the rounds kept (with the
// quartiles of the per-round efficiencies), and overlap_efficiency_all_rounds gives the same
// figure over every timed round.
//
// Precision. Timings of the same work differ by up to 20% within a round on this shared machine
// (core speed drifts with other tenants; steal accounting does not see it), which moves T_base
// and T_si by more than the comm they differ in. Two things make that visible and work round it:
//   - a distribution-free interval for the median per-round efficiency (order statistics,
//     base/Stats.h median_interval), at the narrowest coverage >= 90% the round count allows;
//   - the same efficiency from compute-thread idle time, I = the step's wall time minus the CPU
//     time of the thread that runs every compute op (least over the ranks, since a rank also
//     idles while a slower peer catches up): (I_base - I_si) / min(C, M). I holds what a step
//     spent waiting on collectives, preempted by the comm thread, or stolen -- everything SI is
//     to remove -- and not the speed of the compute itself. One caveat: a kernel without
//     CONFIG_IRQ_TIME_ACCOUNTING charges an interrupt's softirq work (packet processing, tbf
//     timers) to the thread it interrupted, so under SI the part of comm_irq_s that lands during
//     compute counts as compute. overlap_efficiency_idle_low therefore also subtracts all of
//     comm_irq_s / min(C, M): a lower bound (the true value lies between the two).
// What bounds it: no plan takes I_si below a floor measured in the same SI step (IdleFloor,
// through StepRunner's slot hook): the idle time of the two unpaired slots (0 and M, where one
// strand runs alone), plus, on a rank with one core (the emulated cluster's), the CPU time of the
// process's other threads -- the comm thread and the kernel's TCP work in its system calls --
// during the paired slots, which the compute thread cannot run beside. So
// overlap_efficiency_idle_bound = (I_base - floor) / min(C, M) is about the most any plan could
// reach on these ranks, and the gap between it and overlap_efficiency_idle about what a better
// plan could win. About: a rank's idle in slot M can also hold the other rank's lag carried in
// from the paired slots, which a plan does shape; the floor's other terms are hard.
// Prints a table, then one JSON line.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <sched.h>
#include <unistd.h>

#include "base/Clock.h"
#include "BenchFlags.h"
#include "BenchMain.h"
#include "base/Error.h"
#include "base/Stats.h"
#include "comm/CommContext.h"
#include "comm/MpiBackend.h"
#include "kernels/cpu/Kernels.h"
#include "parallel/GradSync.h"
#include "parallel/ParamStore.h"
#include "plan/PlanCheck.h"
#include "plan/PlanIO.h"
#include "plan/PlanRender.h"
#include "runtime/StepParts.h"
#include "runtime/StepRunner.h"

namespace dhelix {
namespace {

struct Args {
  std::string preset = "gpt2-124m";
  int64_t B = 1, T = 256, micro_batches = 4, steps = 5, warmup = 1;
  double max_steal = 0.05;  // a round is repeated when a rank lost more than this share of a timing to steal
  std::string plan;   // SI plan JSON for the block pair; empty = default plan
  std::string trace;  // writes a trace of one SI step and one SI-off step: PATH.rank<r>
  std::string group = "tp";  // tp: Megatron tp = 2; ep: MoE expert parallelism, dp = ep = 2; cp: cp = 2
  std::string wire = "fp32";  // the activation collectives' element type on the wire (comm.precision)
  Recompute recompute = Recompute::kNone;  // training.recompute: the layers' activation recomputation
  bool preset_given = false;
};

void usage() {
  std::puts(
      "usage: dhelix_bench_si_overlap [--preset gpt2-124m] [--batch B=1] [--seq T=256] [--micro-batches M=4]\n"
      "         [--steps N=5] [--warmup N=1] [--max-steal F=0.05] [--plan PLAN.json] [--trace PATH]\n"
      "         [--recompute none|selective|full]\n"
      "         [--group tp|ep|cp] [--wire fp32|bf16]   (ep: expert parallelism of a MoE preset, default moe-demo; cp: context\n"
      "                               parallelism, --seq the whole sequence, cut over the 2 ranks)\n"
      "       --max-steal: repeat a round (at most 3N attempts) in which the hypervisor stole more than F\n"
      "         of a rank's time during any of its timings; F >= 1 keeps every round\n"
      "       run on 2 ranks (tp = 2): scripts/bench si-overlap [ARGS]");
}

Args parse(int argc, char** argv) {
  Args a;
  BenchFlags fl(argc, argv);
  while (fl.next()) {
    const std::string& k = fl.key();
    if (k == "--preset") a.preset = fl.value(), a.preset_given = true;
    else if (k == "--group") a.group = fl.value();
    else if (k == "--wire") a.wire = fl.value();
    else if (k == "--recompute") {
      const std::string v = fl.value();
      DHX_CHECK(parse_recompute(v, a.recompute), ConfigError, "--recompute '{}' must be none, selective or full", v);
    }
    else if (k == "--batch") a.B = fl.count();
    else if (k == "--seq") a.T = fl.count();
    else if (k == "--micro-batches") a.micro_batches = fl.count();
    else if (k == "--steps") a.steps = fl.count();
    else if (k == "--warmup") a.warmup = fl.count();
    else if (k == "--max-steal") a.max_steal = fl.number();
    else if (k == "--plan") a.plan = fl.value();
    else if (k == "--trace") a.trace = fl.value();
    else if (k == "-h" || k == "--help") { usage(); std::exit(0); }
    else throw ConfigError(fmt::format("unknown argument '{}'", k));
  }
  DHX_CHECK(a.B >= 1 && a.T >= 1 && a.steps >= 1 && a.micro_batches >= 2, ConfigError,
            "--batch={} --seq={} --steps={} must be >= 1 and --micro-batches={} >= 2 (SI pairs two)", a.B, a.T,
            a.steps, a.micro_batches);
  if (!a.trace.empty()) {  // checked now, not after the timed rounds
    const std::filesystem::path dir = std::filesystem::absolute(a.trace).parent_path();
    DHX_CHECK(std::filesystem::is_directory(dir), ConfigError,
              "--trace={}: directory '{}' does not exist (create it first)", a.trace, dir.string());
  }
  DHX_CHECK(a.wire == "fp32" || a.wire == "bf16", ConfigError, "--wire={}: expected fp32 or bf16", a.wire);
  DHX_CHECK(a.group == "tp" || a.group == "ep" || a.group == "cp", ConfigError, "--group={}: expected tp, ep or cp",
            a.group);
  if (a.group == "ep" && !a.preset_given) a.preset = "moe-demo";
  DHX_CHECK(a.max_steal > 0, ConfigError, "--max-steal={} must be > 0 (a share of a timing; >= 1 keeps every round)",
            a.max_steal);
  return a;
}

// Cores this process may run on (its affinity mask); 0 where unknown.
int cores_allowed() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
}

// What no SI plan can take out of a step's compute-thread idle time, measured per SI step on this
// rank through StepRunner's slot hook:
//   edge   the idle time of the unpaired slots (slot 0 forward only, slot M backward only),
//          where there is no other strand to put beside a collective;
//   other  the CPU time of the process's other threads (the comm thread, and the kernel's TCP
//          work its system calls do) during the paired slots. On a rank that has one core, the
//          compute thread is off the core whenever they run, so that much of the paired slots'
//          time is idle whatever the plan; with more cores it need not be, and is not counted.
struct IdleFloor {
  double edge = 0, other = 0;
  double w0 = 0, t0 = 0, p0 = 0;
  int M = 0;
  bool metering = false;
  void mark(int slot, bool begin) {
    if (!metering) return;
    const double w = now_seconds(), t = thread_cpu_seconds(), p = process_cpu_seconds();
    if (begin) {
      w0 = w, t0 = t, p0 = p;
    } else if (slot == 0 || slot == M) {
      edge += (w - w0) - (t - t0);
    } else {
      other += (p - p0) - (t - t0);
    }
  }
};

// Time so far (s) in /proc/stat's fields [first, last] (0 user ... 5 irq, 6 softirq, 7 steal),
// summed over the CPUs this process may run on. -1 where unknown.
double cpu_stat_seconds(int first, int last) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return -1;
  std::ifstream f("/proc/stat");
  if (!f) return -1;
  const double hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
  double sum = 0;
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || !std::isdigit(static_cast<unsigned char>(line[3]))) continue;
    std::istringstream in(line.substr(3));
    int cpu = -1;
    double v[8] = {};
    in >> cpu;
    for (double& x : v) in >> x;
    if (in && cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(cpu, &set))
      for (int i = first; i <= last; ++i) sum += v[i] / hz;
  }
  return sum;
}
// Steal: time the hypervisor ran something else while these virtual CPUs had work.
double steal_seconds() { return cpu_stat_seconds(7, 7); }
// Interrupt and softirq time: the kernel's packet processing (veth, bridge, tbf, TCP receive),
// charged to whatever the CPU was running, not to the process whose packets they are.
double irq_seconds() { return cpu_stat_seconds(5, 6); }

// A tp (or ep) group of the real group's rank and size whose collectives are local copies of the
// same shapes (no bytes leave the rank); it records every op so that M can replay them for real.
// An all-to-all keeps its input (every peer "sends" what this rank sends), so under expert
// parallelism the token counts come back as this rank's own and each exchange returns its rows.
class LocalStandInGroup final : public ProcessGroup {
 public:
  enum class Kind { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kAllToAllV, kRingShift };
  struct Call {
    Kind kind;
    Shape in, out;
    DType dtype;
    ReduceOp op;
  };

  LocalStandInGroup(const std::string& role, const ProcessGroup& real)
      : ProcessGroup(role, real.rank(), real.size(), real.world_rank(), real.timeout_s()) {
    start_stream();
  }
  ~LocalStandInGroup() override { stop_stream(); }
  std::string transport() const override { return "none (local copies)"; }

  void start_recording() {
    std::lock_guard lk(mu_);
    calls_.clear();
    recording_ = true;
  }
  std::vector<Call> stop_recording() {
    std::lock_guard lk(mu_);
    recording_ = false;
    return calls_;
  }

 protected:
  Task all_reduce_task(Tensor t, ReduceOp op) override {
    record({Kind::kAllReduce, t.shape(), t.shape(), t.dtype(), op});
    return [](const std::shared_ptr<WorkState>&) { return true; };
  }
  Task all_gather_task(Tensor in, Tensor out) override {
    record({Kind::kAllGather, in.shape(), out.shape(), in.dtype(), ReduceOp::kSum});
    return [in, out, n = size()](const std::shared_ptr<WorkState>&) {
      for (int r = 0; r < n; ++r) std::memcpy(static_cast<char*>(out.raw()) + r * in.nbytes(), in.raw(), in.nbytes());
      return true;
    };
  }
  Task reduce_scatter_task(Tensor in, Tensor out, ReduceOp op) override {
    record({Kind::kReduceScatter, in.shape(), out.shape(), in.dtype(), op});
    return [in, out, r = rank()](const std::shared_ptr<WorkState>&) {
      std::memcpy(out.raw(), static_cast<const char*>(in.raw()) + r * out.nbytes(), out.nbytes());
      return true;
    };
  }
  Task all_to_all_task(Tensor in, Tensor out) override {
    record({Kind::kAllToAll, in.shape(), out.shape(), in.dtype(), ReduceOp::kSum});
    return copy_task(in, out);
  }
  Task all_to_all_v_task(Tensor in, std::vector<int64_t>, Tensor out, std::vector<int64_t>) override {
    record({Kind::kAllToAllV, in.shape(), out.shape(), in.dtype(), ReduceOp::kSum});
    return copy_task(in, out);
  }
  Task ring_shift_task(Tensor in, Tensor out) override {  // cp's ring: this rank's own keys come back
    record({Kind::kRingShift, in.shape(), out.shape(), in.dtype(), ReduceOp::kSum});
    return copy_task(in, out);
  }
  Task broadcast_task(Tensor, int) override { return unsupported("broadcast"); }
  Task send_task(Tensor, int, int) override { return unsupported("send"); }
  Task recv_task(Tensor, int, int) override { return unsupported("recv"); }
  Task barrier_task() override {
    return [](const std::shared_ptr<WorkState>&) { return true; };
  }

 private:
  static Task copy_task(Tensor in, Tensor out) {
    return [in, out](const std::shared_ptr<WorkState>&) {
      DHX_ASSERT(in.nbytes() == out.nbytes(), "stand-in all-to-all: {} vs {}", in.describe(), out.describe());
      std::memcpy(out.raw(), in.raw(), in.nbytes());
      return true;
    };
  }
  static Task unsupported(const char* op) {
    return [op](const std::shared_ptr<WorkState>&) -> bool {
      throw InternalError(fmt::format("si_overlap: the local stand-in group has no {}", op));
    };
  }
  void record(Call c) {
    std::lock_guard lk(mu_);
    if (recording_) calls_.push_back(std::move(c));
  }
  std::mutex mu_;
  bool recording_ = false;
  std::vector<Call> calls_;
};

// The recorded collectives on the real group, with buffers allocated once.
class CommReplay {
 public:
  CommReplay(ProcessGroup& pg, const std::vector<LocalStandInGroup::Call>& calls) : pg_(pg), calls_(calls) {
    for (const auto& c : calls_) {
      ins_.push_back(Tensor::zeros(c.in, c.dtype));
      outs_.push_back(c.kind == LocalStandInGroup::Kind::kAllReduce ? ins_.back() : Tensor::zeros(c.out, c.dtype));
      if (c.kind == LocalStandInGroup::Kind::kAllToAllV) outs_.back() = Tensor::zeros(c.in, c.dtype);
      bytes_ += static_cast<int64_t>(std::max(ins_.back().nbytes(), outs_.back().nbytes()));
    }
  }
  // Issues every op (the comm thread runs them back to back), then waits for all.
  void run() {
    std::vector<Work> ws;
    for (size_t i = 0; i < calls_.size(); ++i) {
      switch (calls_[i].kind) {
        case LocalStandInGroup::Kind::kAllReduce: ws.push_back(pg_.all_reduce(ins_[i], calls_[i].op)); break;
        case LocalStandInGroup::Kind::kAllGather: ws.push_back(pg_.all_gather(ins_[i], outs_[i])); break;
        case LocalStandInGroup::Kind::kReduceScatter:
          ws.push_back(pg_.reduce_scatter(ins_[i], outs_[i], calls_[i].op));
          break;
        case LocalStandInGroup::Kind::kAllToAll: ws.push_back(pg_.all_to_all(ins_[i], outs_[i])); break;
        case LocalStandInGroup::Kind::kRingShift: ws.push_back(pg_.ring_shift(ins_[i], outs_[i])); break;
        case LocalStandInGroup::Kind::kAllToAllV: {
          // The rows spread evenly over the peers, the same on every rank (each routes N k rows):
          // the exchange's bytes with balanced routing, the real one's imbalance aside.
          const int n = pg_.size();
          const int64_t rows = ins_[i].dim(0);
          std::vector<int64_t> per(static_cast<size_t>(n), rows / n);
          per.back() += rows - rows / n * n;
          ws.push_back(pg_.all_to_all_v(ins_[i], per, outs_[i], per));
          break;
        }
      }
    }
    for (auto& w : ws) w.wait();
  }
  size_t count() const { return calls_.size(); }
  int64_t bytes() const { return bytes_; }  // full (gathered / unscattered) bytes over all ops

 private:
  ProcessGroup& pg_;
  std::vector<LocalStandInGroup::Call> calls_;
  std::vector<Tensor> ins_, outs_;
  int64_t bytes_ = 0;
};

enum class Variant { kBase, kSi, kCompute, kComputeSi, kExposed };

// One model on this rank's tp shard: parameters, programs, both schedules and two GradSyncs
// (real tp group, stand-in group), so the variants differ only in schedule and group.
class Rig {
 public:
  Rig(const ModelConfig& model, MicroBatchShape mb, int M, ProcessGroup& tp, LocalStandInGroup& standin,
      const std::string& plan_path, const std::string& role, Recompute recompute)
      : model_(model), tp_(tp), standin_(standin), M_(M), role_(role) {
    const bool ep = role == "ep", cp = role == "cp";
    StepPartsSpec ps;
    ps.model = model_;
    ps.layout.recompute = recompute;
    if (ep) {  // dp = ep = the group: this rank's half of the experts and its own tokens
      ps.layout.dp = ps.layout.ep = tp.size();
      ps.coord.dp = ps.coord.ep = tp.rank();
    } else if (cp) {  // this rank's two chunks of each sequence: mb is already the local rows
      ps.layout.cp = tp.size();
      ps.coord.cp = tp.rank();
    } else {
      ps.layout.tp = tp.size();
      ps.tp_rank = tp.rank();
    }
    ps.mb = mb;
    ps.tokens_per_step = static_cast<double>(mb.tokens() * M * (ep || cp ? tp.size() : 1));
    parts_ = std::make_unique<StepParts>(ps);
    StepParts& p = *parts_;
    // tp: GradSync's tp all-reduces of partial gradients are part of the step. ep, cp: no gradient
    // collective (the dp / cp reduction would be the same with SI on and off).
    sync_real_ = std::make_unique<GradSync>(*p.params, p.units, p.progs, ep || cp ? nullptr : &tp_, nullptr,
                                            ZeroStage::kNone, &p.state_mem);
    sync_local_ = std::make_unique<GradSync>(*p.params, p.units, p.progs, ep || cp ? nullptr : &standin_, nullptr,
                                             ZeroStage::kNone, &p.state_mem);
    if (!plan_path.empty()) {
      plan_ = load_plan(plan_path, parts_->progs.block);
      check_plan(*plan_, parts_->progs.block);
    }
    const SIPlan* plan = plan_ ? &*plan_ : nullptr;
    off_ = std::make_unique<StepRunner>(p.ctx, p.units, p.progs, plan, single_stage(CoExecute::kOff));
    on_ = std::make_unique<StepRunner>(p.ctx, p.units, p.progs, plan, single_stage(CoExecute::kOn));
    for (StepRunner* r : {off_.get(), on_.get()}) r->add_observer(&active_);
    // Random tokens, the same on both tp ranks (one seed; ep, cp: each rank its own); next-token
    // targets within a sequence.
    std::mt19937_64 rng(42 + (ep || cp ? static_cast<uint64_t>(tp.rank()) : 0));
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(model_.vocab_size - 1));
    for (int m = 0; m < M; ++m) {
      MicroBatch x{Tensor::empty({mb.tokens()}, DType::kI32), Tensor::empty({mb.tokens()}, DType::kI32)};
      int32_t* t = x.tokens.data<int32_t>();
      int32_t* y = x.targets.data<int32_t>();
      for (int64_t i = 0; i < mb.tokens(); ++i) t[i] = tok(rng);
      for (int64_t i = 0; i < mb.tokens(); ++i) y[i] = (i + 1) % mb.T == 0 ? tok(rng) : t[i + 1];
      mbs_.push_back(std::move(x));
    }
  }

  // One timed step of `v` on this rank; returns seconds and the step's stats.
  std::pair<double, StepStats> step(Variant v) {
    const bool local = v == Variant::kCompute || v == Variant::kComputeSi;
    parts_->ctx.groups.set(group_role_of(role_), local ? static_cast<ProcessGroup*>(&standin_) : &tp_);
    active_sync_ = local ? sync_local_.get() : sync_real_.get();
    StepRunner& r = v == Variant::kSi || v == Variant::kComputeSi ? *on_ : *off_;
    parts_->ctx.expose_collectives = v == Variant::kExposed;
    double t0 = now_seconds();
    parts_->params->zero_grads();
    StepStats st = r.run(mbs_);
    active_sync_->finish();
    return {now_seconds() - t0, st};
  }
  void set_trace(Trace* t) { parts_->ctx.trace = t; }
  void set_wire(WirePrecision w) { parts_->ctx.activation_wire = w; }
  // The SI runner's slot hook (Variant::kSi and kComputeSi steps).
  void set_si_slot_hook(std::function<void(int, bool)> hook) { on_->set_slot_hook(std::move(hook)); }
  const SIPlan& plan() const { return on_->block_plan(); }
  const LayerProgram& block_program() const { return parts_->progs.block; }

 private:
  ModelConfig model_;
  ProcessGroup& tp_;
  LocalStandInGroup& standin_;
  int M_;
  std::string role_;
  std::unique_ptr<StepParts> parts_;
  std::unique_ptr<GradSync> sync_real_, sync_local_;
  GradSync* active_sync_ = nullptr;
  // Hands the step to whichever GradSync the variant uses (the real tp group or the stand-in).
  struct ActiveSync final : StepObserver {
    GradSync** active;
    explicit ActiveSync(GradSync** a) : active(a) {}
    void on_step_begin(int m) override { (*active)->on_step_begin(m); }
    void on_grad_op(int mb, int unit, const Op& op) override { (*active)->on_grad_op(mb, unit, op); }
    void on_unit_backward_done(int mb, int unit) override { (*active)->on_unit_backward_done(mb, unit); }
  } active_{&active_sync_};
  std::optional<SIPlan> plan_;
  std::unique_ptr<StepRunner> off_, on_;
  std::vector<MicroBatch> mbs_;
};

// The slowest rank's value (steps end when every rank's step ended).
double max_over(ProcessGroup& tp, double x) {
  Tensor t = Tensor::empty({1}, DType::kF64);
  t.data<double>()[0] = x;
  tp.all_reduce(t, ReduceOp::kMax).wait();
  return t.data<double>()[0];
}

struct Peaks {
  int64_t off = 0, on = 0;
};

// Peak activation bytes of one step with SI off and one with SI on (after one warm-up step each).
Peaks peak_activations(Rig& rig) {
  Peaks p;
  for (int i = 0; i < 2; ++i) {
    p.off = rig.step(Variant::kBase).second.peak_activation_bytes;
    p.on = rig.step(Variant::kSi).second.peak_activation_bytes;
  }
  return p;
}

std::string mib(int64_t b) { return fmt::format("{:.1f}", static_cast<double>(b) / 1048576.0); }

int run(int argc, char** argv) {
  Args a = parse(argc, argv);
  cpu::set_num_threads(1);  // one BLAS thread per rank: two ranks share this machine's cores
  const bool ep = a.group == "ep", cp = a.group == "cp";
  LayoutConfig layout;
  if (ep) {
    layout.dp = layout.ep = 2;
  } else if (cp) {
    layout.cp = 2;
  } else {
    layout.tp = 2;
    layout.sequence_parallel = true;
  }
  std::unique_ptr<CommContext> comm = make_mpi_world(layout);
  ProcessGroup& tp = comm->group(ep ? GroupRole::kEP : cp ? GroupRole::kCP : GroupRole::kTP);  // the measured group
  const bool root = comm->rank() == 0;
  LocalStandInGroup standin(a.group, tp);

  ModelConfig model = model_preset(a.preset);
  // cp measures long sequences: a RoPE model's context is raised to --seq (learned positions are not).
  if (cp && model.family != ModelFamily::kGPT) model.seq_len = std::max(model.seq_len, a.T);
  DHX_CHECK(a.T <= model.seq_len, ConfigError, "--seq={} exceeds the {} context {}", a.T, a.preset, model.seq_len);
  // cp: --seq is the whole sequence; each rank holds T / cp rows of it (two chunks).
  DHX_CHECK(!cp || a.T % (2 * layout.cp) == 0, ConfigError, "--seq={} is not divisible by 2*cp={}", a.T, 2 * layout.cp);
  const MicroBatchShape mb{a.B, cp ? a.T / layout.cp : a.T};
  const int M = static_cast<int>(a.micro_batches);
  DHX_CHECK(!ep || model.is_moe(), ConfigError, "--group ep needs a moe preset (moe-demo, phi-3.5-moe), got {}",
            a.preset);
  Rig rig(model, mb, M, tp, standin, a.plan, a.group, a.recompute);
  rig.set_wire(a.wire == "bf16" ? WirePrecision::kBf16 : WirePrecision::kFp32);
  if (root) {
    fmt::print("si-overlap: activations on the wire in {}\n", a.wire);
    fmt::print("si-overlap: {} ({:.1f}M params), {}={} (one rank per host), B={} T={} x {} micro-batches, "
               "{} timed rounds after {} warm-up, plan '{}' ({} blocks per layer pair)\n",
               a.preset, model.num_params() / 1e6, a.group, tp.size(), a.B, a.T, M, a.steps, a.warmup, rig.plan().source,
               rig.plan().blocks.size());
    fmt::print("{}", render_plan(rig.plan(), rig.block_program()));
    std::fflush(stdout);
  }

  // Record the step's collectives once (a compute-only step), then build their replay.
  standin.start_recording();
  rig.step(Variant::kCompute);
  CommReplay replay(tp, standin.stop_recording());

  std::vector<double> base, si, comp, comp_si, comm_only, exposed, comm_cpu, comm_irq;
  std::vector<double> round_eff;  // efficiency within one round: robust to load drifting between rounds
  // Compute-thread idle time of a step: its wall time minus the CPU time of the thread that runs
  // every compute op (this one). It is what the step spent waiting on collectives, preempted by
  // the comm thread or the kernel's packet work, or stolen -- and not what the core's speed was:
  // the same-work timings here drift by up to 20% within a round (other tenants, clocks), which
  // moves T_base and T_si by more than the comm they differ in. The least over the ranks: a rank
  // also idles while a slower peer catches up, and that measures the peer's speed, not the comm.
  std::vector<double> idle_base, idle_si, round_eff_idle;
  std::vector<double> all_base, all_si, all_comm;  // every timed round, disturbed ones included
  // The floor under I_si (IdleFloor), least over the ranks like I itself.
  IdleFloor floor;
  const bool one_core = cores_allowed() == 1;
  rig.set_si_slot_hook([&floor](int slot, bool begin) { floor.mark(slot, begin); });
  std::vector<double> idle_edge, idle_floor;
  double worst_steal = 0;  // the largest share of a timing stolen, over all timed rounds
  int64_t discarded = 0;
  Peaks peaks;
  // Each timing with the hypervisor's steal on this rank's cores during it, as a share of it.
  auto timed = [&](auto&& fn) {
    const double s0 = steal_seconds(), t0 = now_seconds();
    fn();
    const double dt = now_seconds() - t0, s1 = steal_seconds();
    return std::pair{dt, s0 < 0 || s1 < 0 ? 0.0 : (s1 - s0) / dt};
  };
  for (int64_t s = 0, kept = 0; kept < a.steps && s < a.warmup + 3 * a.steps; ++s) {
    double t[6], share[6], idle[2], edge = 0, other = 0;
    StepStats st_base, st_si;
    // Odd rounds run SI first: a drift in machine speed then favours neither side.
    for (int k = 0; k < 2; ++k) {
      tp.barrier();
      const int i = (k == 0) == (s % 2 == 0) ? 0 : 1;  // 0: SI off, 1: SI on
      const double c0 = thread_cpu_seconds();
      floor = IdleFloor{.M = M, .metering = i == 1};
      std::tie(t[i], share[i]) = timed([&] {
        (i == 0 ? st_base : st_si) = rig.step(i == 0 ? Variant::kBase : Variant::kSi).second;
      });
      idle[i] = t[i] - (thread_cpu_seconds() - c0);
      if (i == 1) edge = floor.edge, other = one_core ? floor.other : 0.0;
      floor.metering = false;
    }
    tp.barrier();
    std::tie(t[2], share[2]) = timed([&] { rig.step(Variant::kCompute); });
    tp.barrier();
    const double c0 = process_cpu_seconds(), q0 = irq_seconds();
    std::tie(t[3], share[3]) = timed([&] { replay.run(); });
    const double cpu = max_over(tp, process_cpu_seconds() - c0);
    const double irq = max_over(tp, q0 < 0 ? 0.0 : irq_seconds() - q0);  // every rank joins the collective
    tp.barrier();
    std::tie(t[4], share[4]) = timed([&] { rig.step(Variant::kExposed); });
    tp.barrier();
    std::tie(t[5], share[5]) = timed([&] { rig.step(Variant::kComputeSi); });
    double stolen = 0;
    for (int i = 0; i < 6; ++i) t[i] = max_over(tp, t[i]), stolen = std::max(stolen, max_over(tp, share[i]));
    for (double& x : idle) x = -max_over(tp, -x);
    const double floor_all = -max_over(tp, -(edge + other));
    edge = -max_over(tp, -edge);
    DHX_CHECK(st_base.loss_sum == st_si.loss_sum, InternalError,
              "SI changed the loss: {} (off) vs {} (on)", st_base.loss_sum, st_si.loss_sum);
    peaks.off = std::max(peaks.off, st_base.peak_activation_bytes);
    peaks.on = std::max(peaks.on, st_si.peak_activation_bytes);
    const bool warm = s < a.warmup, disturbed = !warm && stolen > a.max_steal;
    if (root) {
      fmt::print("  round {:>2}: T_base {:.3f}  T_si {:.3f}  C {:.3f} (SI order {:.3f})  "
                 "M {:.3f} (CPU {:.3f} + irq {:.2f})  T_exposed {:.3f}  idle off/on {:.3f}/{:.3f} s  stolen <= {:.1f}%{}\n",
                 s + 1, t[0], t[1], t[2], t[5], t[3], cpu, irq, t[4], idle[0], idle[1], 100 * stolen,
                 warm ? "  (warm-up)" : disturbed ? "  (repeated: steal)" : "");
      std::fflush(stdout);
    }
    if (warm) continue;
    worst_steal = std::max(worst_steal, stolen);
    all_base.push_back(t[0]), all_si.push_back(t[1]), all_comm.push_back(t[3]);
    if (disturbed) {
      ++discarded;
      continue;
    }
    ++kept;
    base.push_back(t[0]), si.push_back(t[1]), comp.push_back(t[2]), comm_only.push_back(t[3]), exposed.push_back(t[4]);
    comp_si.push_back(t[5]);
    comm_cpu.push_back(cpu), comm_irq.push_back(irq);
    round_eff.push_back((t[0] - t[1]) / std::min(t[2], t[3]));
    idle_base.push_back(idle[0]), idle_si.push_back(idle[1]);
    idle_edge.push_back(edge), idle_floor.push_back(floor_all);
    round_eff_idle.push_back((idle[0] - idle[1]) / std::min(t[2], t[3]));
  }
  DHX_CHECK(!base.empty(), InternalError,
            "si_overlap: every one of {} timed rounds lost more than {:.1f}% of a timing to hypervisor steal; "
            "retry on a quieter machine or raise --max-steal", all_base.size(), 100 * a.max_steal);
  if (!a.trace.empty()) {  // one traced SI step and one SI-off step, for looking at what is exposed
    Trace trace(comm->rank());
    trace.set_origin(now_seconds());
    rig.set_trace(&trace);
    tp.barrier();
    rig.step(Variant::kSi);
    tp.barrier();
    rig.step(Variant::kBase);
    rig.set_trace(nullptr);
    const std::string path = fmt::format("{}.rank{}", a.trace, comm->rank());
    trace.write(path);
    if (root) fmt::print("  trace of one SI step then one SI-off step: {}\n", path);
  }

  // The demo preset's activation peaks (same layout, one rank's shard), T <= its context.
  ModelConfig demo = model_preset(ep ? "moe-demo" : "demo");
  const int64_t demo_T = std::min(a.T, demo.seq_len);
  Rig demo_rig(demo, MicroBatchShape{a.B, cp ? demo_T / layout.cp : demo_T}, M, tp, standin, "", a.group, a.recompute);
  Peaks demo_peaks = peak_activations(demo_rig);

  const double T_base = median(base), T_si = median(si), C = median(comp), Mc = median(comm_only);
  const double T_exp = median(exposed), C_si = median(comp_si);
  const double eff = (T_base - T_si) / std::min(C, Mc);
  const double eff_vs_exposed = (T_exp - T_si) / std::min(C, Mc);
  const double speedup = T_base / T_si, ideal = (C + Mc) / std::max(C, Mc);
  const double ceiling = (T_base - C) / std::min(C, Mc);
  const double eff_all = (median(all_base) - median(all_si)) / std::min(C, median(all_comm));
  // How precisely the rounds pin the median down: rounds differ by up to ~0.3 here, so a target
  // can only be judged against this interval, not against one figure.
  const MedianInterval ci = median_interval(round_eff, 0.9);
  // The same efficiency from compute-thread idle time, which a drift in core speed leaves alone.
  const double I_base = median(idle_base), I_si = median(idle_si);
  const double eff_idle = (I_base - I_si) / std::min(C, Mc);
  const double eff_idle_low = eff_idle - median(comm_irq) / std::min(C, Mc);
  const MedianInterval ci_idle = median_interval(round_eff_idle, 0.9);
  // About the most any plan could reach on these ranks: I_si no lower than its floor (IdleFloor).
  const double I_floor = median(idle_floor);
  const double eff_idle_bound = (I_base - I_floor) / std::min(C, Mc);
  if (root) {
    fmt::print("\nsi-overlap, medians over {} rounds (each the slowest rank's time); {} rounds repeated for steal\n",
               base.size(), discarded);
    fmt::print("  {:<56} {:>10}\n", "quantity", "value");
    fmt::print("  {:<56} {:>10.3f}\n", "T_base: step, SI off (s)", T_base);
    fmt::print("  {:<56} {:>10.3f}\n", "T_si:   step, SI on (s)", T_si);
    fmt::print("  {:<56} {:>10.3f}\n", fmt::format("C: compute only, {} collectives -> local copies (s)", a.group), C);
    fmt::print("  {:<56} {:>10.3f}\n", "   the same in SI's op order (s)", C_si);
    fmt::print("  {:<56} {:>10.3f}\n",
               fmt::format("M: comm only, the step's {} collectives replayed (s)", replay.count()), Mc);
    fmt::print("  {:<56} {:>10.1f}\n", "   collective payload per step, full tensors (MiB)", replay.bytes() / 1048576.0);
    fmt::print("  {:<56} {:>10.3f}\n", "   CPU the replay costs a rank (all threads; s)", median(comm_cpu));
    fmt::print("  {:<56} {:>10.2f}\n", "   + irq/softirq time on its cores (packet processing; s)", median(comm_irq));
    fmt::print("  {:<56} {:>10.3f}\n", "T_base - (C + M): unexplained by C + M (s)", T_base - C - Mc);
    fmt::print("  {:<56} {:>10.3f}\n", "overlap efficiency (T_base - T_si) / min(C, M)", eff);
    fmt::print("  {:<56} {:>10.3f}\n", "   median of the per-round efficiencies", median(round_eff));
    fmt::print("  {:<56} {:>10}\n", "   their quartiles (the spread between rounds)",
               fmt::format("{:.3f} {:.3f}", quantile(round_eff, 0.25), quantile(round_eff, 0.75)));
    fmt::print("  {:<56} {:>10}\n", fmt::format("   {:.0f}% interval for that median (order statistics)", 100 * ci.coverage),
               fmt::format("{:.3f} {:.3f}", ci.lo, ci.hi));
    fmt::print("  {:<56} {:>10.3f}\n", "   over every timed round, repeated ones included", eff_all);
    fmt::print("  {:<56} {:>10.3f}\n", "   ceiling, all comm hidden (T_base - C) / min(C, M)", ceiling);
    fmt::print("  {:<56} {:>10}\n", "compute thread idle (wall - its CPU), SI off / on (s)",
               fmt::format("{:.3f} / {:.3f}", I_base, I_si));
    fmt::print("  {:<56} {:>10.3f}\n", "   efficiency from idle time (I_off - I_on) / min(C, M)", eff_idle);
    fmt::print("  {:<56} {:>10.3f}\n", "   lower bound, every irq second counted against SI", eff_idle_low);
    fmt::print("  {:<56} {:>10.3f}\n", "   median of the per-round ones", median(round_eff_idle));
    fmt::print("  {:<56} {:>10}\n", fmt::format("   {:.0f}% interval for that median", 100 * ci_idle.coverage),
               fmt::format("{:.3f} {:.3f}", ci_idle.lo, ci_idle.hi));
    fmt::print("  {:<56} {:>10.3f}\n", "   SI on: idle in the unpaired slots 0 and M (s)", median(idle_edge));
    fmt::print("  {:<56} {:>10.3f}\n",
               one_core ? "   floor: that + other threads' CPU in paired slots (s)"
                        : "   floor: that alone (more than one core per rank; s)",
               I_floor);
    fmt::print("  {:<56} {:>10.3f}\n", "   about the best any plan (I_off - floor) / min(C, M)", eff_idle_bound);
    fmt::print("  {:<56} {:>10.3f}\n", "T_exposed: SI off, every collective waited at issue (s)", T_exp);
    fmt::print("  {:<56} {:>10.3f}\n", "   comm SI off already hides (T_exposed - T_base) / M", (T_exp - T_base) / Mc);
    fmt::print("  {:<56} {:>10.3f}\n", "   comm SI hides (T_exposed - T_si) / min(C, M)", eff_vs_exposed);
    fmt::print("  {:<56} {:>10.3f}\n", "speedup T_base / T_si", speedup);
    fmt::print("  {:<56} {:>10.3f}\n", "ideal speedup (C + M) / max(C, M)", ideal);
    fmt::print("  {:<56} {:>9.1f}%\n", "largest share of a timing stolen by the hypervisor", 100 * worst_steal);
    fmt::print("  {:<56} {:>10}\n", fmt::format("peak activations {} B={} T={}, off / on (MiB)", a.preset, a.B, a.T),
               fmt::format("{} / {}", mib(peaks.off), mib(peaks.on)));
    fmt::print("  {:<56} {:>10.3f}\n", "   on / off", static_cast<double>(peaks.on) / static_cast<double>(peaks.off));
    fmt::print("  {:<56} {:>10}\n",
               fmt::format("peak activations {} B={} T={}, off / on (MiB)", demo.name, a.B, std::min(a.T, demo.seq_len)),
               fmt::format("{} / {}", mib(demo_peaks.off), mib(demo_peaks.on)));
    fmt::print("  {:<56} {:>10.3f}\n", "   on / off",
               static_cast<double>(demo_peaks.on) / static_cast<double>(demo_peaks.off));
    nlohmann::json j = {{"wire", a.wire},
                        {"recompute", recompute_name(a.recompute)},
                        {"t_base_s", T_base},
                        {"t_si_s", T_si},
                        {"compute_s", C},
                        {"comm_s", Mc},
                        {"overlap_efficiency", eff},
                        {"speedup", speedup},
                        {"ideal_speedup", ideal},
                        {"overlap_efficiency_round_median", median(round_eff)},
                        {"overlap_efficiency_round_q1", quantile(round_eff, 0.25)},
                        {"overlap_efficiency_round_q3", quantile(round_eff, 0.75)},
                        {"overlap_efficiency_round_median_lo", ci.lo},
                        {"overlap_efficiency_round_median_hi", ci.hi},
                        {"overlap_efficiency_round_median_coverage", ci.coverage},
                        {"idle_base_s", I_base},
                        {"idle_si_s", I_si},
                        {"overlap_efficiency_idle", eff_idle},
                        {"overlap_efficiency_idle_low", eff_idle_low},
                        {"overlap_efficiency_idle_round_median", median(round_eff_idle)},
                        {"overlap_efficiency_idle_round_median_lo", ci_idle.lo},
                        {"overlap_efficiency_idle_round_median_hi", ci_idle.hi},
                        {"overlap_efficiency_ceiling", ceiling},
                        {"idle_si_edge_s", median(idle_edge)},
                        {"idle_si_floor_s", I_floor},
                        {"overlap_efficiency_idle_bound", eff_idle_bound},
                        {"t_exposed_s", T_exp},
                        {"comm_cpu_s", median(comm_cpu)},
                        {"compute_si_order_s", C_si},
                        {"comm_irq_s", median(comm_irq)},
                        {"rounds", base.size()},
                        {"rounds_repeated_for_steal", discarded},
                        {"overlap_efficiency_all_rounds", eff_all},
                        {"overlap_efficiency_vs_exposed", eff_vs_exposed},
                        {"peak_activation_bytes_off", peaks.off},
                        {"peak_activation_bytes_on", peaks.on},
                        {"demo_peak_activation_bytes_off", demo_peaks.off},
                        {"demo_peak_activation_bytes_on", demo_peaks.on}};
    if (ep) {  // the MoE issue's names for the same figures (the comm is the token all-to-alls)
      j["t_off_s"] = T_base;
      j["a2a_s"] = Mc;
      j["hidden_fraction"] = eff;
      j["group"] = "ep";
    }
    if (cp) {  // the same for context parallelism (the comm is the ring's key/value exchanges)
      j["t_off_s"] = T_base;
      j["ring_s"] = Mc;
      j["hidden_fraction"] = eff;
      j["group"] = "cp";
    }
    fmt::print("{}\n", j.dump());
  }
  return 0;
}

}  // namespace
}  // namespace dhelix

int main(int argc, char** argv) {
  return dhelix::bench_main("si_overlap", [&] { return dhelix::run(argc, argv); }, dhelix::OnFailure::kAbortWorld);
}

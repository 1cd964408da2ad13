// gpu_si: Strand Interleaving's gain on a GPU (issue 39, `scripts/bench gpu-si` there), where the
// SMs compute while the copy engines and the host move the bytes. Megatron's tensor parallelism
// (tp ranks, sequence parallelism) for the dense models, expert parallelism (dp = ep ranks, each
// with its own data and E / ep of the experts, tokens moved to them and back by all-to-alls) for
// the MoE model, and context parallelism at a long sequence ("NAME/cp": cp ranks, each with two
// chunks of every sequence, the keys and values going round the ring), on the one lent GPU: the
// ranks are threads of this process sharing it, each with its own strand streams and cuBLASLt
// handle (by default each in its own SM partition of the GPU, cuda::SmPartition: the SMs split
// evenly between the ranks, so that a rank waiting for a collective cannot lend its SMs to the
// other and each rank is a smaller GPU of its own; --sm-split off lets them share the whole GPU),
// their collectives staged through host memory (comm/StagedGroup.h) over the threads' CPU
// groups, with the link of the measured axis (tp, ep or cp) emulated: each collective is held until
// its bytes at the link's rate have passed (an emulation, like the CPU cluster's `tc`; the rate is
// chosen per model so that communication is a set share of the step without SI). Under ep and cp
// the step leaves out the gradients' dp (dp x cp) all-reduce (the trainer's; SI does not move it,
// and it would only add the same time to every variant): the figures are the all-to-alls' or the
// ring's against the compute.
//
// Per model: first a calibration. C0 is the compute-only step (below); S0 the communication the
// staging itself costs (the exposed step with no link emulated, less C0); B the bytes each rank's
// tp (or ep) group moves per step (ProcessGroup::traffic). For the target share f of the SI-off step
// (--comm-fraction, default 0.45), communication should take M* = C0 f / (1 - f): the link's rate is
// R = B / M* when the staging alone takes less (S0 < M*), else no link is emulated (the staging is
// the link; the achieved share is reported). Then rounds, the variants in an order rotated every
// round, each `--steps` timed steps (median in the round), the figures the medians over rounds:
//   C          compute only: the SI-off step with the executor's tp (ep) group replaced by a
//              stand-in whose collectives are device copies of the same shapes on the issuing
//              strand's stream (all-gather: our rows into every slot; reduce-scatter: our slice;
//              all-reduce: nothing; all-to-all: our own buffer back, as if every peer mirrored us,
//              so the token counts and the experts' row totals stay this rank's), as
//              bench/si_overlap.cc's CPU stand-in
//   T_exposed  SI off, every collective waited for where it is issued: no overlap at all, so
//              M = T_exposed - C is the step's communication, serialised
//   T_off      SI off: fwd then bwd of each micro-batch (within a strand a reduce-scatter of input
//              gradients may already run under the next weight-gradient GEMM, as in Megatron)
//   T_on       SI on (the default plan): one strand's collectives beside the other's kernels
// All against the SI-off step, the baseline: speedup T_off / T_on; ideal T_off / max(C, M)
// (the SI-off step, compute plus its exposed communication, over the step with all of it hidden);
// overlap efficiency (T_off - T_on) / (T_off - max(C, M)), the share of what SI could save that it
// saved (1 exactly when speedup = ideal; null where T_off is within 2% of max(C, M): nothing left to
// hide). Against the fully exposed step too: ideal_speedup_vs_exposed T_exposed / max(C, M) and
// overlap_efficiency_vs_exposed (T_exposed - T_on) / min(C, M) (bench/si_overlap.cc's
// eff_vs_exposed). Memory: extra_memory_fraction the step's peak device bytes (the model states
// plus the activation tracker's peak) SI on over off, less 1, the largest of the ranks'
// (DHeLlam's < 3% claim is of the whole); extra_activation_fraction the activations' alone.
// A step = zero grads + forward/backward of the micro-batches + the tp
// partial-gradient all-reduces, timed on the host from a
// barrier to the device's idle, the slower rank's time; the AdamW update (the same either way) is
// not run.
//   dhelix_bench_gpu_si [--models gpt2-124m,llama-1b,moe-0.6b,llama-1b/cp] [--tp 2] [--ep 2] [--cp 2]
//                       [--batch gpt2-124m=4,llama-1b=2,moe-0.6b=4,llama-1b/cp=1] [--seq 1024]
//                       [--cp-seq 8192] [--micro-batches 4] [--comm-fraction 0.45] [--rounds 4] [--steps 3]
//                       [--sm-split ranks|off]
// Prints a line per round, a line {"model_result":{...}} as each model is done (speedup,
// ideal_speedup, overlap_efficiency, extra_memory_fraction, ...; a model that failed: its error, and the
// others still run: exit 1), and last one JSON object {"device":...,"models":[...]} of them all.
// (sim_abs_error is null here: bench/gpu-si-sim.sh prices these runs with the simulator.) Where SM
// partitions cannot be made, a model runs without them and says so (sm_split off, sm_split_error).
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "BenchMain.h"
#include "GpuModels.h"
#include "base/Clock.h"
#include "base/Error.h"
#include "comm/LocalBackend.h"
#include "comm/StagedGroup.h"
#include "kernels/cuda/Cuda.h"
#include "kernels/cuda/SmPartition.h"
#include "runtime/StepBuilder.h"
#include "schedule/Pipelines.h"

namespace dhelix {
namespace {

struct Options {
  std::string models = "gpt2-124m,llama-1b,moe-0.6b,llama-1b/cp";
  std::string batch = "gpt2-124m=4,llama-1b=2,moe-0.6b=4,llama-1b/cp=1";
  int tp = 2, ep = 2, cp = 2, micro_batches = 4, rounds = 4, steps = 3;
  int64_t T = 1024, cp_T = 8192;  // the sequence of the tp and ep runs; of the cp runs
  double comm_fraction = 0.45;
  bool sm_split = true;  // --sm-split ranks (default): each rank thread in its own SM partition; off: the whole GPU
};

enum Variant { kCompute, kExposed, kOff, kOn, kVariants };

// The compute-only variant's tp (ep, cp) group: each collective a device copy of its shape, enqueued at
// issue on the issuing strand's stream (set_producer_stream), so the step's kernels see the same
// sizes and order and nothing waits on a peer. Host tensors (none in these steps) are refused.
class DeviceStandIn final : public ProcessGroup {
 public:
  DeviceStandIn(const ProcessGroup& real, const char* role)
      : ProcessGroup(role, real.rank(), real.size(), real.world_rank(), real.timeout_s()) {
    start_stream();
  }
  ~DeviceStandIn() override { stop_stream(); }
  std::string transport() const override { return "none (device copies)"; }
  void set_producer_stream(void* s) override { stream_ = static_cast<cudaStream_t>(s); }

 protected:
  Task all_reduce_task(Tensor t, ReduceOp) override {
    on_device(t, "all_reduce");
    return done();
  }
  Task all_gather_task(Tensor in, Tensor out) override {
    on_device(in, "all_gather");
    for (int r = 0; r < size(); ++r)
      copy(static_cast<char*>(out.raw()) + static_cast<size_t>(r) * in.nbytes(), in.raw(), in.nbytes());
    return done();
  }
  Task reduce_scatter_task(Tensor in, Tensor out, ReduceOp) override {
    on_device(in, "reduce_scatter");
    copy(out.raw(), static_cast<const char*>(in.raw()) + static_cast<size_t>(rank()) * out.nbytes(), out.nbytes());
    return done();
  }
  // Every peer taken to mirror this rank: the token counts come back as sent, so the rows received
  // are the rows sent (the same bytes), each block of them this rank's own.
  Task all_to_all_task(Tensor in, Tensor out) override { return mirror(in, out, "all_to_all"); }
  Task all_to_all_v_task(Tensor in, std::vector<int64_t>, Tensor out, std::vector<int64_t>) override {
    return mirror(in, out, "all_to_all_v");
  }
  Task broadcast_task(Tensor, int) override { return unsupported("broadcast"); }
  Task send_task(Tensor, int, int) override { return unsupported("send"); }
  Task recv_task(Tensor, int, int) override { return unsupported("recv"); }
  Task barrier_task() override { return done(); }

 private:
  static Task done() {
    return [](const std::shared_ptr<WorkState>&) { return true; };
  }
  static Task unsupported(const char* op) {
    throw InternalError(fmt::format("gpu_si: the device stand-in group has no {}", op));
  }
  Task mirror(const Tensor& in, const Tensor& out, const char* op) {
    on_device(in, op);
    DHX_CHECK(in.nbytes() == out.nbytes(), InternalError, "gpu_si: the stand-in's {} of {} into {}", op,
              in.describe(), out.describe());
    copy(out.raw(), in.raw(), in.nbytes());
    return done();
  }
  static void on_device(const Tensor& t, const char* op) {
    DHX_CHECK(!t.device().is_host(), InternalError, "gpu_si: the stand-in's {} got host tensor {}", op, t.describe());
  }
  void copy(void* dst, const void* src, size_t n) const {
    DHX_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream_));
  }
  cudaStream_t stream_ = nullptr;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One rank's step on the shared GPU: the Step (SI off) and a second runner over the same parts
// (SI on), the micro-batches (random tokens, the same on every tp rank, a data shard's own on each
// dp rank), and the link switch of the measured axis (tp or ep).
class Rank {
 public:
  Rank(const ModelConfig& model, MicroBatchShape mb, int M, CommContext& comm, GroupRole axis)
      : comm_(comm), axis_(axis) {
    StepSpec spec;
    StepPartsSpec& ps = spec.parts;
    ps.model = model;
    ps.layout = comm.layout().config();
    ps.tp_rank = comm.layout().coord().tp;
    ps.coord = comm.layout().coord();
    ps.mb = mb;
    ps.tokens_per_step = static_cast<double>(mb.tokens() * M);
    ps.pipeline = single_stage(CoExecute::kOff);
    spec.groups = StepGroups::of(&comm);
    if (axis == GroupRole::kEP) spec.groups.set(GroupRole::kDP, nullptr);  // no dp reduction (above)
    if (axis == GroupRole::kCP) spec.groups.set(GroupRole::kDPCP, nullptr);  // no dp x cp reduction (above)
    spec.device = Device::cuda(0);
    spec.micro_batches = M;
    step_ = std::make_unique<Step>(spec);
    step_->runner->add_observer(step_->sync.get());
    StepParts& p = *step_->parts;
    on_ = std::make_unique<StepRunner>(p.ctx, p.units, p.progs, nullptr, single_stage(CoExecute::kOn));
    on_->add_observer(step_->sync.get());
    real_ = p.ctx.groups.get(axis);
    standin_ = std::make_unique<DeviceStandIn>(*real_, group_role_name(axis));
    std::mt19937_64 rng(42 + static_cast<uint64_t>(comm.layout().coord().dp));
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(model.vocab_size - 1));
    for (int m = 0; m < M; ++m) {
      MicroBatch x{Tensor::empty({mb.tokens()}, DType::kI32), Tensor::empty({mb.tokens()}, DType::kI32)};
      for (int64_t i = 0; i < mb.tokens(); ++i) x.tokens.data<int32_t>()[i] = tok(rng);
      for (int64_t i = 0; i < mb.tokens(); ++i)
        x.targets.data<int32_t>()[i] = (i + 1) % mb.T == 0 ? tok(rng) : x.tokens.data<int32_t>()[i + 1];
      mbs_.push_back(std::move(x));
    }
  }

  void set_link(double bytes_per_s) { staged_set_link_rate(*real_, bytes_per_s); }

  // One step of `v`, timed from a barrier of the axis' ranks to this GPU's idle; the slower rank's
  // seconds (every rank returns the same).
  double timed(Variant v, StepStats* stats = nullptr) {
    ProcessGroup& host = comm_.group(axis_);
    Tensor t = Tensor::zeros({1}, DType::kF64);
    host.all_reduce(t).wait();  // a barrier
    StepRunner& r = v == kOn ? *on_ : *step_->runner;
    step_->sync->set_producer_stream(r.executor().strand_stream(StrandKind::kBackward));
    RunContext& ctx = step_->ctx();
    ctx.groups.set(axis_, v == kCompute ? static_cast<ProcessGroup*>(standin_.get()) : real_);
    ctx.expose_collectives = v == kExposed;
    const double t0 = now_seconds();
    step_->params().zero_grads();
    const StepStats st = r.run(mbs_);
    step_->sync->finish();
    DHX_CUDA(cudaDeviceSynchronize());
    t.data<double>()[0] = now_seconds() - t0;
    host.all_reduce(t, ReduceOp::kMax).wait();
    if (stats) *stats = st;
    return t.data<double>()[0];
  }

  double axis_bytes() const { return comm_.group(axis_).traffic().bytes; }
  // The model states' device bytes (parameters, gradients, optimizer state: the Step's state tracker).
  double state_bytes() const { return static_cast<double>(step_->parts->state_mem.current()); }

  // A step that threw may leave ops queued in the Step's staged groups whose tensors are ordered on
  // the SI-on runner's strand streams: the groups go (~Step's drain, then the groups) before that
  // runner does, as ~Step orders its own runner's.
  ~Rank() {
    if (!step_) return;
    try {
      on_->executor().drain_prefetches();
    } catch (const std::exception&) {  // the run failed already; its error is the one reported
    }
    step_.reset();
    on_.reset();
  }
  Rank(const Rank&) = delete;
  Rank& operator=(const Rank&) = delete;

 private:
  CommContext& comm_;
  GroupRole axis_;
  std::unique_ptr<Step> step_;
  std::unique_ptr<StepRunner> on_;
  ProcessGroup* real_ = nullptr;  // the step's staged group of the axis
  std::unique_ptr<DeviceStandIn> standin_;
  std::vector<MicroBatch> mbs_;
};

// A JSON string of `v` (bytes that are not UTF-8 replaced, never a throw: an error's text).
std::string json_text(const std::string& v) {
  return nlohmann::json(v).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// "NAME/cp": NAME under context parallelism, at --cp-seq.
bool is_cp_run(const std::string& name) { return name.size() > 3 && name.compare(name.size() - 3, 3, "/cp") == 0; }

// The model a --models entry names, at its sequence length; a ConfigError for an unknown name, a cp
// sequence that does not cut into 2 x cp chunks, or MoE under cp (run() asks before anything runs).
ModelConfig model_of_run(const Options& o, const std::string& name) {
  const bool cp = is_cp_run(name);
  const ModelConfig m = bench::gpu_model_named(cp ? name.substr(0, name.size() - 3) : name, cp ? o.cp_T : o.T);
  DHX_CHECK(!cp || o.cp_T % (2 * o.cp) == 0, ConfigError,
            "--cp-seq {}: context parallelism cuts each sequence into 2 x --cp {} chunks", o.cp_T, o.cp);
  DHX_CHECK(!(cp && m.is_moe()), ConfigError, "model '{}': MoE runs on the GPU at cp = 1", name);
  return m;
}

std::string run_model(const Options& o, const std::string& name, int64_t B) {
  const bool cp = is_cp_run(name);
  const int64_t T = cp ? o.cp_T : o.T;
  const ModelConfig model = model_of_run(o, name);
  const MicroBatchShape mb{B, cp ? T / o.cp : T};  // a cp rank's local rows: its two chunks of each sequence
  LayoutConfig lay;
  const bool moe = model.is_moe();
  const GroupRole axis = moe ? GroupRole::kEP : cp ? GroupRole::kCP : GroupRole::kTP;
  if (moe) {
    lay.dp = o.ep;
    lay.ep = o.ep;
  } else if (cp) {
    lay.cp = o.cp;
  } else {
    lay.tp = o.tp;
    lay.sequence_parallel = o.tp > 1;
  }
  const std::string layout = moe  ? fmt::format("dp={} ep={}", o.ep, o.ep)
                             : cp ? fmt::format("cp={}", o.cp)
                                  : fmt::format("tp={} (sp)", o.tp);
  std::string json;
  std::mutex mu;
  std::vector<std::unique_ptr<cuda::SmPartition>> parts;
  std::string split_error;  // why the asked-for partitions could not be made (the model then runs without)
  if (o.sm_split) {
    try {
      parts = cuda::SmPartition::split(0, lay.world());
    } catch (const DeviceError& e) {
      split_error = e.what();
      std::printf("%s: no SM partitions (%s): its ranks share the whole GPU\n", name.c_str(), e.what());
    }
  }
  const int sms_per_rank = parts.empty() ? cuda::device_info(0).sms : parts[0]->sms();
  // A failure while the ranks run on partitions names them (the device script then runs the model
  // again without: its fallback reads the error), whatever failed (a stream, a cuBLASLt handle, a
  // kernel inside a green context).
  auto on_partitions = [&](const std::exception& e) {
    return DeviceError(fmt::format("on SM partitions ({} x {} SMs): {}", parts.size(), sms_per_rank, e.what()));
  };
  try {
    run_local_ranks(lay, [&](CommContext& comm) {
      cuda::SmPartitionScope own(parts.empty() ? nullptr : parts[static_cast<size_t>(comm.rank())].get());
      Rank rank(model, mb, o.micro_batches, comm, axis);
      const bool lead = comm.rank() == 0;
      // Calibration (no link emulated): warm-up, then C0, S0 and the bytes per step.
      rank.set_link(0);
      for (Variant v : {kCompute, kExposed, kOff, kOn}) rank.timed(v);
      std::vector<double> c0, e0;
      double bytes = 0;
      for (int i = 0; i < o.steps; ++i) {
        c0.push_back(rank.timed(kCompute));
        const double b0 = rank.axis_bytes();
        e0.push_back(rank.timed(kExposed));
        bytes += (rank.axis_bytes() - b0) / o.steps;
      }
      // The busiest rank's bytes set the link for all (an expert-parallel rank's all-to-all traffic
      // follows its routing), so every rank emulates the same link.
      {
        Tensor b = Tensor::zeros({1}, DType::kF64);
        b.data<double>()[0] = bytes;
        comm.world().all_reduce(b, ReduceOp::kMax).wait();
        bytes = b.data<double>()[0];
      }
      const double C0 = median(c0), S0 = median(e0) - C0, M_target = C0 * o.comm_fraction / (1 - o.comm_fraction);
      const double rate = S0 < M_target ? bytes / M_target : 0;  // 0: the staging alone is slower than the target
      if (lead)
        std::printf("%s %s (%s) B=%ld T=%ld x%d micro-batches: compute %.2f ms, staging alone %.2f ms, %.1f MiB per rank "
                    "per step -> %s (target comm %.2f ms, %.0f%% of the SI-off step)\n",
                    name.c_str(), layout.c_str(),
                    parts.empty() ? "ranks share the whole GPU" : fmt::format("{} SMs per rank", sms_per_rank).c_str(),
                    static_cast<long>(B), static_cast<long>(T), o.micro_batches, C0 * 1e3, S0 * 1e3,
                    bytes / 1048576.0,
                    rate > 0 ? fmt::format("link {:.2f} Gbit/s", rate * 8 / 1e9).c_str() : "no link emulated",
                    M_target * 1e3, o.comm_fraction * 100);
      rank.set_link(rate);
      std::array<std::vector<double>, kVariants> per_round;
      StepStats st_off, st_on;
      for (int r = 0; r < o.rounds; ++r) {
        std::array<double, kVariants> round{};
        for (int k = 0; k < kVariants; ++k) {
          const auto v = static_cast<Variant>((k + r) % kVariants);
          std::vector<double> t;
          for (int i = 0; i < o.steps; ++i) t.push_back(rank.timed(v, v == kOff ? &st_off : v == kOn ? &st_on : nullptr));
          round[v] = median(t);
          per_round[v].push_back(round[v]);
        }
        if (lead)
          std::printf("  round %d: compute %.2f ms, exposed %.2f ms, SI off %.2f ms, SI on %.2f ms\n", r + 1,
                      round[kCompute] * 1e3, round[kExposed] * 1e3, round[kOff] * 1e3, round[kOn] * 1e3);
      }
      // Peak memory SI on over off: each rank's (its states plus its activations' peak), the largest.
      double extra = 0, extra_act = 0;
      {
        const double states = rank.state_bytes(), off = static_cast<double>(st_off.peak_activation_bytes),
                     on = static_cast<double>(st_on.peak_activation_bytes);
        Tensor e = Tensor::zeros({2}, DType::kF64);
        e.data<double>()[0] = (states + on) / std::max(states + off, 1.0) - 1;
        e.data<double>()[1] = on / std::max(off, 1.0) - 1;
        comm.world().all_reduce(e, ReduceOp::kMax).wait();
        extra = e.data<double>()[0], extra_act = e.data<double>()[1];
      }
      if (!lead) return;
      const double C = median(per_round[kCompute]), Texp = median(per_round[kExposed]);
      const double Toff = median(per_round[kOff]), Ton = median(per_round[kOn]);
      const double M = std::max(Texp - C, 0.0), best = std::max(C, M);
      const double ideal = Toff / best, ideal_exposed = Texp / best;
      // null where the SI-off step leaves under 2% of itself to hide (or M ~ 0 for the exposed form)
      const bool room = Toff - best > 0.02 * Toff, room_exposed = std::min(C, M) > 0.02 * Texp;
      const double eff = room ? (Toff - Ton) / (Toff - best) : 0;
      const double eff_exposed = room_exposed ? (Texp - Ton) / std::min(C, M) : 0;
      auto num_or_null = [](bool ok, double v) { return ok ? fmt::format("{:.4g}", v) : std::string("null"); };
      auto spread = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return fmt::format("[{:.6g},{:.6g}]", v.front(), v.back());
      };
      std::printf("%s: compute %.2f ms, comm %.2f ms (%.0f%% of the exposed step); SI off %.2f ms, on %.2f ms: speedup "
                  "%.3f (ideal %.3f), overlap efficiency %s (against the exposed step: ideal %.3f, efficiency %s); "
                  "peak memory SI on over off %+.2f%% (activations %.1f -> %.1f MiB, %+.1f%%; the largest of the "
                  "ranks')\n",
                  name.c_str(), C * 1e3, M * 1e3, 100 * M / std::max(Texp, 1e-12), Toff * 1e3, Ton * 1e3, Toff / Ton,
                  ideal, num_or_null(room, eff).c_str(), ideal_exposed, num_or_null(room_exposed, eff_exposed).c_str(),
                  extra * 100, static_cast<double>(st_off.peak_activation_bytes) / 1048576.0,
                  static_cast<double>(st_on.peak_activation_bytes) / 1048576.0, extra_act * 100);
      std::lock_guard lk(mu);
      json = fmt::format(
          "{{\"model\":\"{}\",\"layout\":\"{}, ranks as threads on one GPU\",\"sm_split\":\"{}\",\"sms_per_rank\":{},"
          "\"axis\":\"{}\",\"batch\":{},\"seq\":{},"
          "\"micro_batches\":{},\"link_gbit\":{:.4g},\"comm_fraction_target\":{},\"staging_only_s\":{:.6g},"
          "\"bytes_per_step\":{:.6g},\"compute_s\":{:.6g},\"compute_spread\":{},\"exposed_s\":{:.6g},"
          "\"comm_s\":{:.6g},\"comm_fraction\":{:.4g},\"si_off_s\":{:.6g},\"si_off_spread\":{},\"si_on_s\":{:.6g},"
          "\"si_on_spread\":{},\"rounds\":{},\"speedup\":{:.4g},\"ideal_speedup\":{:.4g},"
          "\"overlap_efficiency\":{},\"ideal_speedup_vs_exposed\":{:.4g},\"overlap_efficiency_vs_exposed\":{},"
          "\"peak_activation_bytes_si_off\":{},\"peak_activation_bytes_si_on\":{},\"extra_memory_fraction\":{:.4g},"
          "\"extra_activation_fraction\":{:.4g},\"sim_abs_error\":null{}}}",
          name, layout, parts.empty() ? "off" : "ranks", sms_per_rank, group_role_name(axis), B, T, o.micro_batches, rate * 8 / 1e9, o.comm_fraction, S0, bytes, C, spread(per_round[kCompute]),
          Texp, M, M / std::max(Texp, 1e-12), Toff, spread(per_round[kOff]), Ton, spread(per_round[kOn]), o.rounds,
          Toff / Ton, ideal, num_or_null(room, eff), ideal_exposed, num_or_null(room_exposed, eff_exposed),
          st_off.peak_activation_bytes, st_on.peak_activation_bytes, extra, extra_act,
          split_error.empty() ? std::string() : fmt::format(",\"sm_split_error\":{}", json_text(split_error)));
    });
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    if (parts.empty()) throw;
    throw on_partitions(e);
  }
  return json;
}

int run(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    DHX_CHECK(i + 1 < argc, ConfigError, "flag '{}' needs a value", k);
    const std::string v = argv[i + 1];
    if (k == "--models") o.models = v;
    else if (k == "--batch") o.batch = v;
    else if (k == "--tp") o.tp = std::stoi(v);
    else if (k == "--ep") o.ep = std::stoi(v);
    else if (k == "--cp") o.cp = std::stoi(v);
    else if (k == "--cp-seq") o.cp_T = std::stoll(v);
    else if (k == "--seq") o.T = std::stoll(v);
    else if (k == "--micro-batches") o.micro_batches = std::stoi(v);
    else if (k == "--comm-fraction") o.comm_fraction = std::stod(v);
    else if (k == "--rounds") o.rounds = std::stoi(v);
    else if (k == "--steps") o.steps = std::stoi(v);
    else if (k == "--sm-split") {
      DHX_CHECK(v == "ranks" || v == "off", ConfigError,
                "--sm-split {}: expected ranks (each rank its own SM partition) or off (ranks share the whole GPU)", v);
      o.sm_split = v == "ranks";
    } else
      throw ConfigError(fmt::format("unknown flag '{}' (expected --models, --batch, --tp, --ep, --cp, --seq, "
                                    "--cp-seq, --micro-batches, --comm-fraction, --rounds, --steps, --sm-split)",
                                    k));
  }
  DHX_CHECK(o.tp >= 2 && o.ep >= 2 && o.cp >= 2 && o.micro_batches >= 2 && o.rounds >= 1 && o.steps >= 1,
            ConfigError,
            "--tp {} --ep {} --cp {} --micro-batches {} --rounds {} --steps {}: need tp, ep and cp >= 2 (something "
            "to hide), micro-batches >= 2 (two strands), rounds and steps >= 1",
            o.tp, o.ep, o.cp, o.micro_batches, o.rounds, o.steps);
  DHX_CHECK(o.comm_fraction > 0 && o.comm_fraction < 1, ConfigError,
            "--comm-fraction {}: the share of the SI-off step the link takes must be in (0, 1)", o.comm_fraction);
  // The named models, in --models' order (comma-separated; "NAME/cp" is NAME under context parallelism).
  auto items = [](const std::string& list) {
    std::vector<std::string> v;
    for (size_t a = 0; a <= list.size();) {
      const size_t b = std::min(list.find(',', a), list.size());
      if (b > a) v.push_back(list.substr(a, b - a));
      a = b + 1;
    }
    return v;
  };
  std::vector<std::pair<std::string, int64_t>> runs;
  for (const std::string& name : items(o.models)) {
    int64_t B = 2;
    for (const std::string& kv : items(o.batch))
      if (kv.rfind(name + "=", 0) == 0) B = std::stoll(kv.substr(name.size() + 1));
    (void)model_of_run(o, name);  // bad input is a ConfigError before anything runs
    runs.emplace_back(name, B);
  }
  cuda::require_device(0);
  const cuda::DeviceInfo info = cuda::device_info(0);
  // Each model's JSON is printed as soon as it is done (a later model's failure or a timeout keeps
  // it); a model that fails is an error object, and the others still run.
  std::string out;
  int failed = 0;
  for (const auto& [name, B] : runs) {
    std::string one;
    try {
      one = json_finite(run_model(o, name, B));
    } catch (const std::exception& e) {
      ++failed;
      std::fprintf(stderr, "dhelix_bench_gpu_si: model %s failed: %s\n", name.c_str(), e.what());
      one = fmt::format("{{\"model\":{},\"error\":{}}}", json_text(name), json_text(e.what()));
    }
    std::printf("{\"model_result\":%s}\n", one.c_str());
    out += (out.empty() ? "" : ",") + one;
  }
  std::printf("{\"device\":%s,\"device_sms\":%d,\"sm_split\":\"%s\",\"tp\":%d,\"ep\":%d,\"cp\":%d,\"comm_fraction_target\":%g,\"models\":[%s]}\n",
              json_text(info.name).c_str(), info.sms, o.sm_split ? "ranks" : "off", o.tp, o.ep, o.cp,
              o.comm_fraction, out.c_str());
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace dhelix

int main(int argc, char** argv) {
  return dhelix::bench_main("dhelix_bench_gpu_si", [&] { return dhelix::run(argc, argv); }, dhelix::OnFailure::kReturn);
}

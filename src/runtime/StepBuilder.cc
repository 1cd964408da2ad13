// StepBuilder: the wiring the trainer and the benchmarks share (StepBuilder.h).
#include "runtime/StepBuilder.h"

#include <filesystem>
#include <map>

#include "base/Error.h"
#include "base/Files.h"
#include "comm/NcclGroup.h"
#include "comm/StagedGroup.h"
#include "plan/PlanCheck.h"
#include "plan/PlanIO.h"
#include "tensor/DeviceMemory.h"
#if DHELIX_HAVE_CUDA
#include "kernels/cuda/Gemm.h"
#endif

namespace dhelix {

std::shared_ptr<cuda::Blas> place_on_device(StepParts& parts, Device d, const GemmOptions& gemms) {
  if (d.is_host()) return nullptr;
  const std::string why = device_unavailable(d);
  DHX_CHECK(why.empty(), DeviceError, "a step on {}: {}", d.str(), why);
#if DHELIX_HAVE_CUDA
  // The step's GPU current on this thread before anything touches one: the cuBLASLt handle is made
  // in the current device's context and the parameters' upload runs there (with a GPU per rank under
  // NCCL, a rank other than local rank 0 still has GPU 0 current here; use_device keeps an SM
  // partition's context).
  use_device(d);
  auto blas = std::make_shared<cuda::Blas>(d.index);
  if (gemms.timed) blas->set_choice(cuda::Blas::Choice::kTimed);
  if (gemms.wgrad_partials) blas->set_wgrad(cuda::Blas::Wgrad::kPartials);
  const std::string& gemm_choices = gemms.choices;
  if (!gemm_choices.empty() && !file_exists(gemm_choices)) {
    // Written after the first step: a directory that is not there is named now, not then.
    const std::filesystem::path dir = std::filesystem::path(gemm_choices).parent_path();
    DHX_CHECK(dir.empty() || std::filesystem::is_directory(dir), ConfigError,
              "training.gemm_choices: '{}' cannot be written: its directory '{}' does not exist; create it or name "
              "another file",
              gemm_choices, dir.string());
  }
  if (!gemm_choices.empty() && file_exists(gemm_choices)) {
    const cuda::GemmChoices file = cuda::load_gemm_choices(gemm_choices);
    const std::string differs = cuda::gemm_choices_mismatch(file, blas->choices());
    DHX_CHECK(differs.empty(), ConfigError,
              "training.gemm_choices: '{}' was {}: its algorithms are another machine's; remove the file (it is "
              "written anew) or name another one",
              gemm_choices, differs);
    blas->preset(file);
  }
  parts.ctx.device = d;
  parts.ctx.blas = blas.get();
  parts.params->move_to(d, &parts.state_mem);
  return blas;
#else
  (void)gemms;
  throw DeviceError(fmt::format("a step on {}: {}", d.str(), why));  // (why is never empty here)
#endif
}

StepGroups place_groups_on_device(const StepGroups& host, Device d, const DeviceGroupOptions& options,
                                  std::vector<std::unique_ptr<ProcessGroup>>& owned) {
  if (d.is_host()) return host;
  StepGroups g = host;
  std::map<ProcessGroup*, ProcessGroup*> wrapped;
  for (GroupRole r : all_group_roles()) {
    ProcessGroup* cpu = g.get(r);
    if (!cpu) continue;
    auto it = wrapped.find(cpu);
    if (it == wrapped.end()) {
      // (NCCL's bootstrap is a collective over `cpu`: every member reaches it in this same role order.)
      if (options.nccl && r != GroupRole::kPP)
        owned.push_back(make_nccl_group_over(*cpu, d.index, options.nccl_max_ctas));
      else
        owned.push_back(make_staged_group(*cpu, d.index, StagedOptions{options.emulated_link_bytes_per_s}));
      it = wrapped.emplace(cpu, owned.back().get()).first;
    }
    g.set(r, it->second);
  }
  return g;
}

Step::Step(const StepSpec& spec) {
  parts = std::make_unique<StepParts>(spec.parts);
  const LayoutConfig& layout = parts->layout;
  RunContext& c = parts->ctx;
  // A GPU step: the model states move there before the optimizer allocates its moments beside them.
  blas = place_on_device(*parts, spec.device, spec.gemms);
  gemm_choices_ = spec.gemms.choices;
  // A GPU step's groups move device tensors: each CPU group is wrapped once in a staged group, the
  // only issuer on it while a step runs (the trainer's own host-tensor reductions on the CPU groups
  // come after a step's staged ops completed, so every member sees the same op order).
  const StepGroups g = place_groups_on_device(
      spec.groups, spec.device, DeviceGroupOptions{spec.nccl, spec.nccl_max_ctas, spec.emulated_link_bytes_per_s},
      staged);
  // Weight gradients are reduced over every replica of the weights: dp, times cp under context
  // parallelism (each cp rank's gradient covers its chunks of the sequences). Partial gradients
  // (ParamSpec::partial_grad) are summed over tp (sequence parallelism) or z (3D: the batch is
  // split over z); the gradient norm over the whole tensor-parallel block.
  ProcessGroup* dp = g.get(layout.cp > 1 ? GroupRole::kDPCP : GroupRole::kDP);
  ProcessGroup* pp = g.get(GroupRole::kPP);
  sync = std::make_unique<GradSync>(*parts->params, parts->units, parts->progs,
                                    layout.is_3d() ? g.get(GroupRole::kZ) : g.get(GroupRole::kTP), dp, spec.zero,
                                    &parts->state_mem);
  if (layout.is_3d()) sync->set_block_group(g.get(GroupRole::kTPBlock));  // the MoE MLP's gradients
  // A tied embedding whose head sits on another stage (1F1B, interleaved): the two copies' gradients
  // are summed between the first and the last stage (Megatron's embedding group).
  const std::vector<Chunk> chunks = pipeline_chunks(spec.parts.pipeline);
  const int embed_rank = chunks.front().rank, head_rank = chunks.back().rank, me = spec.parts.pp_rank;
  if (pp && parts->model.tie_embeddings && embed_rank != head_rank && (me == embed_rank || me == head_rank))
    sync->set_tied_peer(pp, me == embed_rank ? head_rank : embed_rank);
  opt = std::make_unique<Optimizer>(*parts->params, *sync, g.get(GroupRole::kTPBlock), dp, spec.adamw,
                                    &parts->state_mem);
  opt->set_pipeline_group(pp);
  if (layout.ep > 1) {  // expert parallelism: tokens move over ep, expert gradients reduce over edp
    // (edp x cp under context parallelism: each cp rank's gradient covers its chunks)
    ProcessGroup* edp = g.get(layout.cp > 1 ? GroupRole::kEDPCP : GroupRole::kEDP);
    sync->set_expert_group(edp);
    opt->set_expert_group(g.get(GroupRole::kEP), edp);
  }
  sync->set_wire(spec.grad_wire);
  c.groups = g;
  c.micro_batches = spec.micro_batches;  // 3D: z reduce-scatters by the last
  c.kernels = spec.kernels;
  c.expose_collectives = spec.expose_collectives;
  c.activation_wire = spec.activation_wire;
  // (A GPU step's ops write their activations in bf16 already: nothing to round after the fact.)
  c.bf16_saved_activations = spec.bf16_saved_activations && spec.device.is_host();
  if (!spec.plan_path.empty()) {
    plan = load_plan(spec.plan_path, parts->progs.block);
    check_plan(*plan, parts->progs.block);
  }
  runner = std::make_unique<StepRunner>(c, parts->units, parts->progs, plan ? &*plan : nullptr, spec.parts.pipeline);
  opt->set_stream(runner->executor().compute_stream());  // a GPU's update follows the step's kernels
  // The gradients' reductions (tp's partial sums, the dp buckets) read what the backward strand's
  // kernels wrote.
  if (!spec.device.is_host()) {
    sync->set_producer_stream(runner->executor().strand_stream(StrandKind::kBackward));
    sync->set_update_stream(runner->executor().compute_stream());  // the optimizer's
  }
}

// Not the members' reverse order alone: a step that threw leaves ops in its groups (a staged pp
// group's receive posted a slot ahead, a queued collective) holding device tensors charged to
// parts->act_mem and ordered on the runner's strand streams, and GradSync's bf16 buckets are
// ordered on the backward strand's stream. The groups go first (their comm threads joined, what they
// hold given back while the tracker and streams exist), after the executor's prefetches were waited
// for on them; then what allocates on the runner's streams; then the runner.
Step::GemmChoiceCounts Step::save_gemm_choices() {
  GemmChoiceCounts n;
#if DHELIX_HAVE_CUDA
  if (!blas || gemm_choices_.empty()) return n;
  n.from_file = blas->preset_used();
  n.unusable = blas->preset_unusable();
  const size_t fresh = blas->chosen_here();
  if (fresh <= gemm_choices_written_) return n;
  cuda::save_gemm_choices(gemm_choices_, blas->choices());
  n.written = fresh - gemm_choices_written_;
  gemm_choices_written_ = fresh;
#endif
  return n;
}

size_t Step::partial_wgrads() const {
#if DHELIX_HAVE_CUDA
  if (blas) return blas->partial_wgrads();
#endif
  return 0;
}

std::string gemm_choices_for_rank(const std::string& path, int rank, int world) {
  if (world <= 1) return path;
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  const bool ext = dot != std::string::npos && (slash == std::string::npos || dot > slash + 1);
  const std::string tag = fmt::format(".rank{}", rank);
  return ext ? path.substr(0, dot) + tag + path.substr(dot) : path + tag;
}

Step::~Step() {
  if (runner) {
    try {
      runner->executor().drain_prefetches();
    } catch (const std::exception&) {  // the run failed already; its error is the one reported
    }
  }
  staged.clear();
  opt.reset();
  sync.reset();
}

}  // namespace dhelix

// Trainer I/O: layout-free checkpoints (gather shards over tp/dp and pipeline stages, HF names,
// atomic save by world rank 0; every rank re-shards on load, taking its own stage's parameters) and
// text sampling from the current weights.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "base/Error.h"
#include "base/Signals.h"
#include "kernels/cpu/Kernels.h"
#include "model/HfNames.h"
#include "train/CheckpointStore.h"
#include "train/Tokenizer.h"
#include "train/Trainer.h"

namespace dhelix {
namespace {

// Full tensor of a parameter-shaped shard: all-gather the flat shards over the tensor-parallel
// block (tp, or the 3D x-y-z block), then place each member's piece with insert_shard at that
// member's ShardIndex (`members`, in group-rank order). Pieces held by several members (replicas)
// are written once per holder, with the same values.
Tensor gather_over_block(const ParamSpec& spec, const Tensor& shard, ProcessGroup* block,
                         const std::vector<ShardIndex>& members, ProcessGroup* ep) {
  Tensor full = Tensor::zeros(spec.full);
  if (spec.role == ShardRole::kExpert) {  // whole experts, split over ep (replicated over tp)
    if (!ep || ep->size() == 1) {
      full.copy_from(shard.view(spec.full));
      return full;
    }
    // ep rank r's shard is experts [r E/ep, (r+1) E/ep): rows [r n, (r+1) n) of the stacked tensor.
    ep->all_gather(shard.view({shard.numel()}).clone(), full.view({full.numel()})).wait();
    return full;
  }
  const int n = block ? block->size() : 1;
  if (spec.role == ShardRole::kReplicated || n == 1) {
    if (spec.role == ShardRole::kReplicated) full.copy_from(shard.view(spec.full));
    else insert_shard(spec, shard, full, members.at(0));
    return full;
  }
  Tensor flat = shard.view({shard.numel()}).clone();
  Tensor all = Tensor::empty({n * shard.numel()});
  block->all_gather(flat, all).wait();
  for (int r = 0; r < n; ++r)
    insert_shard(spec, all.narrow0(r * shard.numel(), shard.numel()).view(spec.shard), full, members.at(r));
  return full;
}

// `t`, or its copy in host memory when it lives on a GPU (checkpoints hold host tensors).
Tensor on_host(const Tensor& t) { return t.device().is_host() ? t : t.to(Device::host()); }

// Writes this rank's shard of `full` into `e`'s value, wherever the value lives (a GPU store's
// through a host shard).
void put_shard(ParamEntry& e, const Tensor& full, const ShardIndex& at) {
  if (e.value.device().is_host()) {
    extract_shard(e.spec, full, e.value, at);
    return;
  }
  Tensor host = Tensor::empty(e.spec.shard);
  extract_shard(e.spec, full, host, at);
  e.value.copy_from(host);
}

// The first of `tensors` (f32) holding a NaN or an infinity, or "".
std::string first_nonfinite(const std::map<std::string, Tensor>& tensors) {
  for (const auto& [name, t] : tensors) {
    const float* p = t.f32();
    for (int64_t i = 0, n = t.numel(); i < n; ++i)
      if (!std::isfinite(p[i])) return name;
  }
  return "";
}

// "model.n_layers = 4 in the checkpoint, 2 in this run; ..." for the [model] keys whose resolved
// values differ between two to_toml texts; "" when none do (or the checkpoint kept no config).
std::string model_key_diffs(const std::string& saved_toml, const std::string& current_toml) {
  const auto current = toml_entries(current_toml);
  const std::map<std::string, std::string> now(current.begin(), current.end());
  std::string out;
  for (const auto& [k, v] : toml_entries(saved_toml)) {
    auto it = now.find(k);
    if (k.rfind("model.", 0) == 0 && it != now.end() && it->second != v)
      out += fmt::format("{}{} = {} in the checkpoint, {} in this run", out.empty() ? "" : "; ", k, v, it->second);
  }
  return out;
}

// Every parameter of the model, in the global order (ParamStore), with the pp rank that owns it:
// the rank of the chunk holding its unit (a tied "wte": the embedding's).
struct OwnedSpec {
  ParamSpec spec;
  int pp_rank;
};
std::vector<OwnedSpec> model_param_owners(const std::vector<UnitSpec>& units, const std::vector<Chunk>& chunks) {
  std::vector<OwnedSpec> out;
  for (int u = static_cast<int>(units.size()) - 1; u >= 0; --u) {
    int owner = 0;
    for (const Chunk& c : chunks)
      if (u >= c.unit_begin && u < c.unit_end) owner = c.rank;
    for (auto it = units[u].params.rbegin(); it != units[u].params.rend(); ++it) out.push_back({*it, owner});
  }
  return out;
}

}  // namespace

// Full tensors of every parameter-shaped value `get` gives (its name + suffix), gathered over tp and,
// with pp > 1, broadcast over the pipeline group from the stage that owns each (collective over
// tp and pp, every rank gets all).
std::map<std::string, Tensor> Trainer::gather_full(const std::function<Tensor(const ParamEntry&)>& get,
                                                  const std::string& suffix) {
  ProcessGroup* block = (comm_ && layout_.tp_block() > 1) ? &comm_->group(GroupRole::kTPBlock) : nullptr;
  ProcessGroup* ep = (comm_ && layout_.ep > 1) ? &comm_->group(GroupRole::kEP) : nullptr;
  std::vector<ShardIndex> members = {parts_->ctx.shard};
  if (block) {
    members.clear();
    const Layout& l = comm_->layout();
    for (int r : l.group_ranks(GroupRole::kTPBlock, l.rank())) members.push_back(ShardIndex::of(layout_, l.coord_of(r)));
  }
  std::map<std::string, Tensor> out;
  const ParamEntry* copy = parts_->params->tied_copy();
  for (auto& e : parts_->params->entries())
    if (&e != copy) out[e.spec.name + suffix] = gather_over_block(e.spec, on_host(get(e)), block, members, ep);
  if (!pp_) return out;
  for (const OwnedSpec& o : model_param_owners(parts_->units, pipeline_chunks(pipeline_spec(cfg_)))) {
    const std::string name = o.spec.name + suffix;
    Tensor t = o.pp_rank == pp_rank_ ? out.at(name) : Tensor::zeros(o.spec.full);
    pp_->broadcast(t, o.pp_rank).wait();
    out[name] = t;
  }
  return out;
}

std::map<std::string, Tensor> Trainer::gather_full_params() {
  return gather_full([](const ParamEntry& e) { return e.value; }, "");
}

std::map<std::string, Tensor> Trainer::gather_full_grads() {
  DHX_CHECK(sync_->zero() == ZeroStage::kNone, InternalError, "gather_full_grads needs plain data parallelism");
  return gather_full([](const ParamEntry& e) { return e.grad; }, "");
}

std::string Trainer::save_checkpoint() {
  if (fault_ && fault_->sigterm_at("save")) raise(SIGTERM);  // honoured once the save is written
  std::map<std::string, Tensor> full = gather_full_params();
  // Every rank holds every full tensor here, so every rank refuses alike.
  const std::string bad = first_nonfinite(full);
  DHX_CHECK(bad.empty(), DivergedError,
            "refusing to write a checkpoint at step {}: parameter '{}' holds a NaN or an infinity; the last "
            "checkpoint written stays `latest`",
            step_, bad);
  NamedTensors optim;
  auto shard_state = opt_->shard_state();  // collective over dp
  std::map<std::string, Tensor> state;     // "<param>.exp_avg" -> this rank's tp shard
  for (auto& [name, t] : shard_state) state[name] = t;
  for (const char* suffix : {".exp_avg", ".exp_avg_sq"}) {
    std::map<std::string, Tensor> s =
        gather_full([&](const ParamEntry& e) { return state.at(e.spec.name + suffix); }, suffix);
    const std::string bad_state = first_nonfinite(s);
    DHX_CHECK(bad_state.empty(), DivergedError,
              "refusing to write a checkpoint at step {}: optimizer state '{}' holds a NaN or an infinity; the last "
              "checkpoint written stays `latest`",
              step_, bad_state);
    for (auto& [name, t] : s) optim.push_back({name, t});
  }
  std::string dir = cfg_.checkpoint.dir.empty() ? cfg_.output.dir + "/checkpoints" : cfg_.checkpoint.dir;
  CheckpointStore store(dir, cfg_.checkpoint.keep);
  std::string path = dir + "/" + CheckpointStore::step_name(step_);
  if (!comm_ || comm_->rank() == 0) {
    TrainState st;
    st.step = step_;
    st.data_loader = train_loader_->state();
    st.config_toml = to_toml(cfg_);
    st.extra = {{"model", cfg_.model.name},
                {"family", family_name(cfg_.model.family)},
                {"optimizer_updates", opt_->steps_taken()},
                {"skipped_steps", skipped_total_}};
    path = store.save(st, to_hf(cfg_.model, full), optim);
  }
  if (comm_) comm_->world().barrier();
  return path;
}

std::map<std::string, Tensor> Trainer::load_full_params(const Checkpoint& ck) {
  std::vector<ParamSpec> specs;
  for (auto& e : parts_->params->entries()) specs.push_back(e.spec);
  std::map<std::string, Tensor> full;
  try {
    full = from_hf(cfg_.model, specs, ck.model.tensors);
  } catch (const IoError& e) {
    const std::string diffs = ck.state.config_toml.empty() ? "" : model_key_diffs(ck.state.config_toml, to_toml(cfg_));
    throw IoError(fmt::format("checkpoint {} does not fit this run's model: {}{}", ck.path, e.what(),
                              diffs.empty() ? "" : "\nhint: the model keys differ: " + diffs +
                                                       " (set them as the checkpoint has them)"));
  }
  const std::string bad = first_nonfinite(full);
  DHX_CHECK(bad.empty(), IoError, "checkpoint {}: parameter '{}' holds a NaN or an infinity; train from an earlier one",
            ck.path, bad);
  return full;
}

void Trainer::load_model(const std::string& step_dir) {
  Checkpoint ck = CheckpointStore::load(step_dir, /*with_optimizer=*/false);
  std::map<std::string, Tensor> full = load_full_params(ck);
  for (auto& e : parts_->params->entries()) put_shard(e, full.at(e.spec.name), parts_->ctx.shard);
  parts_->params->refresh_bf16(runner_->executor().compute_stream());  // a GPU store's GEMM weights
}

std::string Trainer::load_resume(const std::string& resume, bool whole_state, std::string* note) {
  const std::string dir = cfg_.checkpoint.dir.empty() ? cfg_.output.dir + "/checkpoints" : cfg_.checkpoint.dir;
  const CheckpointStore::ResumePlan plan = CheckpointStore(dir, cfg_.checkpoint.keep).resume_plan(resume);
  DHX_CHECK(!plan.candidates.empty(), IoError, "checkpoint.resume='{}': no checkpoint found in '{}'{}", resume, dir,
            plan.note.empty() ? "" : " (" + plan.note + ")");
  std::vector<std::string> skipped;
  if (!plan.note.empty()) skipped.push_back(plan.note);
  std::string failures;
  for (const std::string& path : plan.candidates) {
    try {
      if (whole_state)
        load_checkpoint(path);
      else
        load_model(path);
      if (note) {
        std::string n;
        for (const std::string& s : skipped) n += (n.empty() ? "" : "; ") + s;
        *note = n;
      }
      return path;
    } catch (const IoError& e) {
      if (resume != "latest") throw;
      skipped.push_back(fmt::format("'{}' does not load ({})", path, e.what()));
      failures += fmt::format("\n  {}: {}", path, e.what());
    }
  }
  throw IoError(fmt::format("checkpoint.resume=latest: no checkpoint in '{}' loads:{}\nhint: start over with "
                            "--output.overwrite true (deletes them), or pick another --output.dir",
                            dir, failures));
}

void Trainer::load_checkpoint(const std::string& step_dir) {
  DHX_CHECK(train_loader_ != nullptr, InternalError, "load_checkpoint on a trainer without data; use load_model");
  Checkpoint ck = CheckpointStore::load(step_dir);
  std::map<std::string, Tensor> full = load_full_params(ck);
  std::vector<std::pair<std::string, Tensor>> optim;
  for (auto& e : parts_->params->entries()) {
    put_shard(e, full.at(e.spec.name), parts_->ctx.shard);
    for (const char* suffix : {".exp_avg", ".exp_avg_sq"}) {
      std::string name = e.spec.name + suffix;
      const Tensor* t = ck.optimizer.find(name);
      DHX_CHECK(t != nullptr, IoError, "checkpoint {} lacks optimizer tensor '{}'", step_dir, name);
      DHX_CHECK(t->shape() == e.spec.full, IoError, "optimizer tensor '{}' has shape {} in {} but the model needs {}",
                name, shape_str(t->shape()), step_dir, shape_str(e.spec.full));
      Tensor shard = Tensor::empty(e.spec.shard);
      extract_shard(e.spec, *t, shard, parts_->ctx.shard);
      optim.push_back({name, shard});
    }
  }
  // Updates taken: fewer than the steps when some were skipped (checkpoints before the count was
  // kept took one per step).
  const int64_t updates = ck.state.extra.is_object() ? ck.state.extra.value("optimizer_updates", ck.state.step) : ck.state.step;
  skipped_total_ = ck.state.extra.is_object() ? ck.state.extra.value("skipped_steps", int64_t{0}) : 0;
  opt_->load_shard_state(optim, updates);
  parts_->params->refresh_bf16(runner_->executor().compute_stream());  // a GPU store's GEMM weights
  step_ = ck.state.step;
  DHX_CHECK(!ck.state.data_loader.is_null(), IoError, "checkpoint {} has no data-loader state", step_dir);
  train_loader_->set_state(ck.state.data_loader);
}

std::string Trainer::sample(const std::string& prompt, int64_t n_tokens, double temperature, int64_t top_k,
                            uint64_t seed, const std::function<void(const std::string&)>& stream) {
  if (fault_ && fault_->sigterm_at("sample")) raise(SIGTERM);
  const int world_rank = comm_ ? comm_->rank() : 0;
  const int64_t T = cfg_.model.seq_len, C = cfg_.model.d_model, V = cfg_.model.vocab_size;
  MicroBatchShape one{1, T};
  // The whole model on one rank: this rank's parts when nothing is split; otherwise the full
  // tensors gathered over tp and pp (collective) into single-process parts on world rank 0.
  std::unique_ptr<StepParts> whole;
  // A GPU run samples on the CPU from its weights read back (one sequence, token by token: the
  // host's kernels serve it).
  if (layout_.tp_block() > 1 || layout_.pp > 1 || !parts_->params->device().is_host()) {
    std::map<std::string, Tensor> full = gather_full_params();
    if (world_rank != 0) return "";
    StepPartsSpec ps;
    ps.model = cfg_.model;
    ps.mb = one;
    ps.pipeline = single_stage(CoExecute::kOff);
    ps.seed = static_cast<uint64_t>(cfg_.training.seed);
    whole = std::make_unique<StepParts>(ps);
    for (auto& e : whole->params->entries()) e.value.copy_from(full.at(e.spec.name).view(e.value.shape()));
  } else if (world_rank != 0) {
    return "";
  }
  StepParts& parts = whole ? *whole : *parts_;
  Tokenizer tok(cfg_.data.tokenizer);
  std::vector<int32_t> ids = tok.encode(prompt);
  const size_t prompt_len = ids.size();
  if (ids.empty()) ids.push_back(std::max<int32_t>(0, tok.bos_id()));
  // Prompt and continuation decoded together so word boundaries between them survive.
  auto text_of = [&](const std::vector<int32_t>& v) {
    return prompt_len > 0 ? tok.decode(v) : prompt + tok.decode(std::span<const int32_t>(v).subspan(1));
  };
  // Streams what `text` adds to what was streamed (nothing when an earlier piece decoded otherwise).
  std::string streamed;
  auto emit = [&](const std::string& text) {
    if (!stream || text.size() <= streamed.size() || !text.starts_with(streamed)) return;
    stream(text.substr(streamed.size()));
    streamed = text;
  };
  // A one-sequence forward over a fixed window; causal attention makes the padding invisible to
  // the positions we read.
  // Whole sequences here: no context parallelism (the weights are replicated over cp).
  LayoutConfig lay = parts.layout;
  lay.cp = 1;
  ModelPrograms progs = build_programs(cfg_.model, lay, one);
  RunContext ctx = parts.ctx;
  ctx.kernels = parts_->ctx.kernels;  // the run's precision (a gathered `whole` has the default)
  ctx.layout = lay;
  ctx.cp_rank = 0;
  ctx.mb = one;
  ctx.trace = nullptr;
  MemoryTracker mem("sample");
  ctx.act_mem = &mem;
  Executor exec(ctx, parts.units, progs);
  std::mt19937_64 rng(seed);
  std::vector<float> logits(static_cast<size_t>(V));
  const ParamEntry& w = parts.params->get(cfg_.model.tie_embeddings ? "wte" : "lm_head");
  const ParamEntry& g = parts.params->get("final_norm.weight");
  for (int64_t step = 0; step < n_tokens; ++step) {
    if (stop_signal() != 0) break;  // a first stop signal: the text so far (the caller says it was cut)
    std::vector<int32_t> window(ids.end() - std::min<int64_t>(T, static_cast<int64_t>(ids.size())), ids.end());
    const int64_t cur = static_cast<int64_t>(window.size());
    Tensor tokens = Tensor::zeros({T}, DType::kI32);
    std::copy(window.begin(), window.end(), tokens.data<int32_t>());
    std::vector<std::unique_ptr<UnitEnv>> envs;
    for (int u = 0; u + 1 < exec.num_units(); ++u) {
      envs.push_back(std::make_unique<UnitEnv>());
      if (u == 0) envs[0]->bufs["tokens"] = tokens;
      else envs[u]->bufs["x"] = envs[u - 1]->at("y");
      StrandSlot s{0, u, envs[u].get()};
      exec.run_alone(s, StrandKind::kForward);
    }
    const float* h = envs.back()->at("y").f32() + (cur - 1) * C;
    std::vector<float> hn(static_cast<size_t>(C)), mean(1), rstd(1);
    if (cfg_.model.family == ModelFamily::kGPT)
      cpu::layernorm_fwd<float>(h, g.value.f32(), parts.params->get("final_norm.bias").value.f32(), hn.data(), mean.data(),
                                rstd.data(), 1, C, static_cast<float>(cfg_.model.norm_eps));
    else
      cpu::rmsnorm_fwd<float>(h, g.value.f32(), hn.data(), rstd.data(), 1, C, static_cast<float>(cfg_.model.norm_eps));
    cpu::linear_fwd<float>(hn.data(), w.value.f32(), nullptr, logits.data(), 1, C, V, ctx.kernels.precision);
    // top-k over temperature-scaled logits
    std::vector<int32_t> idx(static_cast<size_t>(V));
    for (int32_t i = 0; i < V; ++i) idx[i] = i;
    int64_t k = std::clamp<int64_t>(top_k <= 0 ? V : top_k, 1, V);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    int32_t next = idx[0];
    if (temperature > 0) {
      std::vector<double> p(static_cast<size_t>(k));
      double mx = logits[idx[0]], sum = 0;
      for (int64_t i = 0; i < k; ++i) sum += p[i] = std::exp((logits[idx[i]] - mx) / temperature);
      std::uniform_real_distribution<double> U(0.0, sum);
      double r = U(rng);
      for (int64_t i = 0; i < k; ++i) {
        if ((r -= p[i]) <= 0) {
          next = idx[i];
          break;
        }
      }
    }
    ids.push_back(next);
    // A piece's leading space depends on the pieces around it, so the whole is decoded each time
    // (a few thousand tokens at most).
    if (stream) emit(text_of(ids));
  }
  const std::string text = text_of(ids);
  emit(text);
  return text;
}

}  // namespace dhelix

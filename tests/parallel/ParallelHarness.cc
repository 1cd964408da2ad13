// Parallel test harness: dataset, tiny configs, and loss/gradient collection over any layout.
#include "ParallelHarness.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>

#include "base/Error.h"
#include "comm/LocalBackend.h"
#include "train/IndexedDataset.h"
#include "train/Trainer.h"

namespace dhelix::testing {

std::string write_walk_dataset(const std::string& dir, uint64_t seed) {
  const std::string prefix = dir + "/walk";
  IndexedDatasetWriter w(prefix, IndexDType::kU16);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> step(0, 7), start(0, 255);
  std::vector<int32_t> doc(200);
  for (int d = 0; d < 120; ++d) {
    doc[0] = start(rng);
    for (size_t i = 1; i < doc.size(); ++i) doc[i] = (doc[i - 1] + step(rng)) % 256;
    w.add_document(doc);
  }
  w.finish();
  return prefix;
}

RunConfig tiny_config(ModelFamily family, int dp, int tp, int zero, const std::string& data_prefix,
                      const std::string& out_dir, int64_t kv_heads, int64_t global_B) {
  DHX_CHECK(global_B % dp == 0, ConfigError, "global_B={} is not divisible by dp={}", global_B, dp);
  const bool llama = family != ModelFamily::kGPT;  // llama attention (llama, moe)
  const int64_t heads = llama ? 2 * kv_heads : 4;
  ConfigOverrides ov = {
      {"model.family", family_name(family)},
      {"model.vocab_size", "256"},
      {"model.seq_len", "32"},
      {"model.d_model", "64"},
      {"model.n_layers", "2"},
      {"model.n_heads", std::to_string(heads)},
      {"model.n_kv_heads", std::to_string(llama ? kv_heads : heads)},
      {"model.ffn_hidden", llama ? "176" : "256"},
      {"training.steps", "20"},
      {"training.micro_batch_size", std::to_string(global_B / dp)},
      {"training.micro_batches", "2"},
      {"training.lr", "3e-3"},
      {"training.min_lr", "3e-4"},
      {"training.warmup_steps", "5"},
      {"training.threads", "1"},
      {"training.eval_interval", "0"},
      {"training.sample_tokens", "0"},
      {"data.prefix", data_prefix},
      {"parallel.dp", std::to_string(dp)},
      {"parallel.tp", std::to_string(tp)},
      {"parallel.zero", std::to_string(zero)},
      {"output.dir", out_dir},
  };
  if (family == ModelFamily::kMoE) {  // 4 experts of hidden 88, top-2 (half the llama MLP each)
    ov.push_back({"model.n_experts", "4"});
    ov.push_back({"model.top_k", "2"});
    ov.push_back({"model.ffn_hidden", "88"});
  }
  return load_config_text("", "tiny_config", ov);
}

RunConfig tiny_config_3d(ModelFamily family, int dp, int gx, int gy, int gz, const std::string& data_prefix,
                         const std::string& out_dir, int64_t kv_heads, int64_t global_B) {
  RunConfig c = tiny_config(family, dp * gz, 1, 0, data_prefix, out_dir, kv_heads, global_B);
  c.parallel.dp = dp;
  c.parallel.tp_x = gx, c.parallel.tp_y = gy, c.parallel.tp_z = gz;
  return c;
}

RunResult run_on(const RunConfig& cfg, CommContext* comm, Grads grads, const Prepare& prepare) {
  RunResult r;
  if (grads == Grads::kCollect) {
    Trainer t(cfg, comm, Quiet::kYes);
    if (prepare) prepare(t);
    t.compute_gradients();
    r.first_grads = t.gather_full_grads();
  }
  Trainer t(cfg, comm, Quiet::kYes);
  if (prepare) prepare(t);
  for (int64_t s = 0; s < cfg.training.steps; ++s) r.losses.push_back(t.train_step().loss);
  return r;
}

RunResult run_serial(const RunConfig& cfg, Grads grads, const Prepare& prepare) {
  DHX_CHECK(layout_config(cfg).world() == 1, ConfigError, "run_serial needs dp = tp = 1 (got dp={} tp={})",
            cfg.parallel.dp, cfg.parallel.tp);
  return run_on(cfg, nullptr, grads, prepare);
}

void on_local_ranks(const RunConfig& cfg, const std::function<void(CommContext*)>& fn) {
  const LayoutConfig layout = layout_config(cfg);
  if (layout.world() == 1) return fn(nullptr);
  run_local_ranks(layout, [&](CommContext& comm) { fn(&comm); });
}

RunResult run_local(const RunConfig& cfg, Grads grads, const Prepare& prepare) {
  RunResult out;
  std::mutex mu;
  on_local_ranks(cfg, [&](CommContext* comm) {
    RunResult r = run_on(cfg, comm, grads, prepare);
    if (!comm || comm->rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out = std::move(r);
    }
  });
  return out;
}

std::map<std::string, double> counted_step_bytes(const RunConfig& cfg) {
  std::map<std::string, double> out;
  std::mutex mu;
  on_local_ranks(cfg, [&](CommContext* comm) {
    Trainer t(cfg, comm, Quiet::kYes);
    const std::vector<GroupRole> roles = {GroupRole::kX,  GroupRole::kY,  GroupRole::kZ,    GroupRole::kXY,
                                          GroupRole::kTPBlock, GroupRole::kTP, GroupRole::kDP, GroupRole::kCP,
                                          GroupRole::kDPCP};
    for (GroupRole r : roles) comm->group(r).reset_traffic();
    t.compute_gradients();
    comm->world().barrier();
    if (comm->rank() != 0) return;
    std::lock_guard lk(mu);
    for (GroupRole r : roles)
      if (comm->group(r).size() > 1) out[group_role_name(r)] = comm->group(r).traffic().bytes;
  });
  return out;
}

std::string si_on_off_difference(const RunConfig& on, const std::string& off_dir) {
  RunConfig off = on;
  off.schedule.strand_interleaving = false;
  off.output.dir = off_dir;
  const RunResult a = run_local(on), b = run_local(off);
  if (a.losses.size() != b.losses.size())
    return fmt::format("{} steps with SI, {} without", a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i)
    if (std::memcmp(&a.losses[i], &b.losses[i], sizeof(double)) != 0)
      return fmt::format("step {}: {:.17g} (SI) vs {:.17g}", i + 1, a.losses[i], b.losses[i]);
  return "";
}

CheckpointedRun run_with_checkpoint(const RunConfig& cfg, int before, int after) {
  CheckpointedRun out;
  std::mutex mu;
  on_local_ranks(cfg, [&](CommContext* comm) {
    Trainer t(cfg, comm, Quiet::kYes);
    for (int s = 0; s < before; ++s) t.train_step();
    CheckpointedRun r;
    r.checkpoint = t.save_checkpoint();
    for (int s = 0; s < after; ++s) r.after.push_back(t.train_step().loss);
    if (!comm || comm->rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out = std::move(r);
    }
  });
  return out;
}

std::vector<double> resume_losses(const RunConfig& cfg, const std::string& checkpoint, int after, int64_t expect_step) {
  std::vector<double> got;
  std::mutex mu;
  on_local_ranks(cfg, [&](CommContext* comm) {
    Trainer t(cfg, comm, Quiet::kYes);
    t.load_checkpoint(checkpoint);
    DHX_CHECK(t.step() == expect_step, InternalError, "checkpoint {} resumed at step {}, expected {}", checkpoint,
              t.step(), expect_step);
    std::vector<double> losses;
    for (int s = 0; s < after; ++s) losses.push_back(t.train_step().loss);
    if (!comm || comm->rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      got = std::move(losses);
    }
  });
  return got;
}

double max_rel_deviation(const std::vector<double>& a, const std::vector<double>& b) {
  DHX_CHECK(a.size() == b.size(), InternalError, "loss curves of {} and {} steps", a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), 1e-30));
  return worst;
}

double max_grad_deviation(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b,
                          std::string* worst_name) {
  DHX_CHECK(a.size() == b.size(), InternalError, "{} vs {} gradient tensors", a.size(), b.size());
  double worst = 0;
  for (const auto& [name, tb] : b) {
    auto it = a.find(name);
    DHX_CHECK(it != a.end(), InternalError, "gradient '{}' missing", name);
    const Tensor& ta = it->second;
    // Vocabulary rows are padded to a multiple of 128 * tp (model/Params.h), so a tp run's
    // embedding may have more rows than the serial one: compare the real rows; the padding rows
    // must have exactly zero gradient.
    Shape sa = ta.shape(), sb = tb.shape();
    const bool padded_rows = sa.size() == sb.size() && !sa.empty() && sa[0] > sb[0] &&
                             std::equal(sa.begin() + 1, sa.end(), sb.begin() + 1);
    DHX_CHECK(sa == sb || padded_rows, InternalError, "gradient '{}': shape {} vs {}", name, shape_str(sa),
              shape_str(sb));
    double diff = 0, ref = 0;
    const float* pa = ta.f32();
    const float* pb = tb.f32();
    for (int64_t i = 0; i < tb.numel(); ++i) {
      diff = std::max(diff, std::abs(double(pa[i]) - double(pb[i])));
      ref = std::max(ref, std::abs(double(pb[i])));
    }
    for (int64_t i = tb.numel(); i < ta.numel(); ++i)
      if (pa[i] != 0.0f) diff = std::numeric_limits<double>::infinity();
    double rel = diff / std::max(ref, 1e-30);
    if (rel > worst) {
      worst = rel;
      if (worst_name) *worst_name = name;
    }
  }
  return worst;
}

}  // namespace dhelix::testing

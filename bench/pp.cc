// pp: pipeline schedules against each other on the emulated cluster (bench/pp.sh: two hosts at
// 1 Gbit/s, one pipeline stage per host, tp ranks inside a host). Four trainers of the same model
// live side by side on every rank -- 1F1B, interleaved 1F1B (2 chunks per stage), the folded W, and
// the W with Strand Interleaving -- and every timed round runs one step of each, in an order that
// rotates every round, so drift and noise hit all alike. A step here = zero gradients + every
// micro-batch's forward and backward through the schedule + gradient reductions, then a barrier
// of the world (the AdamW update, the same for all, is not timed). Per variant, medians over the
// rounds of:
//   t      the step's wall time, from a barrier to the barrier after it (the same on every rank)
//   bubble the idle fraction of the most idle stage: (time blocked on pipeline receives and on the
//          last sends + the wait in the closing barrier) / t, beside bubble_formula (Pipelines.h:
//          uniform stages, backward = 2 x forward, no transfer time); the measured figure also
//          holds the stages' imbalance (stage 0 has the embedding, the head sits on the last stage
//          or, with the W, on stage 0) and whatever transfer time the schedule did not hide; so
//          beside it also bubble_timeline: the schedule's own timeline (simulate_timeline) with
//          every chunk priced by its layer programs' FLOPs (embedding, layers and head as they
//          are), no transfer time -- the bubble the schedule itself leaves on these stages
//   peak   per-stage peak activation bytes (StepStats), the largest stage's
// The model's data: a synthetic token stream written by each rank (no corpus needed).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "BenchFlags.h"
#include "BenchMain.h"
#include "base/Clock.h"
#include "base/Stats.h"
#include "comm/MpiBackend.h"
#include "kernels/cpu/Kernels.h"
#include "train/IndexedDataset.h"
#include "train/Trainer.h"

namespace dhelix {
namespace {

struct Args {
  std::string preset = "gpt2-124m";
  int64_t B = 1, T = 256, micro_batches = 8, rounds = 3, vocab = 8192;
};

Args parse(int argc, char** argv) {
  Args a;
  BenchFlags fl(argc, argv);
  while (fl.next()) {
    const std::string& k = fl.key();
    if (k == "--preset") a.preset = fl.value();
    else if (k == "--batch") a.B = fl.count();
    else if (k == "--seq") a.T = fl.count();
    else if (k == "--micro-batches") a.micro_batches = fl.count();
    else if (k == "--rounds") a.rounds = fl.count();
    else if (k == "--vocab") a.vocab = fl.count();
    else
      throw ConfigError(fmt::format(
          "unknown flag '{}'; usage: pp [--preset P] [--batch B] [--seq T] [--micro-batches N] [--rounds R] [--vocab V]",
          k));
  }
  DHX_CHECK(a.rounds >= 1 && a.micro_batches >= 2, ConfigError, "--rounds={} --micro-batches={}: need >= 1 and >= 2",
            a.rounds, a.micro_batches);
  return a;
}

struct Variant {
  const char* name;
  PipelineKind kind;
  CoExecute si;
};
constexpr std::array<Variant, 4> kVariants = {{{"1f1b", PipelineKind::k1F1B, CoExecute::kOff},
                                               {"interleaved", PipelineKind::kInterleaved, CoExecute::kOff},
                                               {"w", PipelineKind::kW, CoExecute::kOff},
                                               {"w_si", PipelineKind::kW, CoExecute::kOn}}};

// A learnable synthetic stream (a noisy arithmetic walk over the vocabulary), enough documents for
// every step of the benchmark.
std::string write_data(const std::string& dir, int64_t vocab) {
  std::filesystem::create_directories(dir);
  const std::string prefix = dir + "/walk";
  IndexedDatasetWriter w(prefix, IndexDType::kU16);
  std::mt19937_64 rng(7);
  for (int d = 0; d < 400; ++d) {
    std::vector<int32_t> toks(2048);
    int32_t cur = static_cast<int32_t>(rng() % vocab);
    for (auto& t : toks) t = cur = static_cast<int32_t>((cur + 1 + rng() % 7) % vocab);
    w.add_document(toks);
  }
  w.finish();
  return prefix;
}

RunConfig variant_config(const Args& a, const Variant& v, int tp, const std::string& data, const std::string& out) {
  ConfigOverrides ov = {{"model.preset", a.preset},
                        {"model.vocab_size", std::to_string(a.vocab)},
                        {"model.seq_len", std::to_string(a.T)},
                        {"training.micro_batch_size", std::to_string(a.B)},
                        {"training.micro_batches", std::to_string(a.micro_batches)},
                        {"training.threads", "1"},
                        {"training.eval_interval", "0"},
                        {"training.sample_tokens", "0"},
                        {"data.prefix", data},
                        {"parallel.pp", "2"},
                        {"parallel.tp", std::to_string(tp)},
                        {"schedule.pipeline", pipeline_kind_name(v.kind)},
                        {"schedule.virtual_stages", v.kind == PipelineKind::kInterleaved ? "2" : "1"},
                        {"schedule.strand_interleaving", v.si == CoExecute::kOn ? "on" : "off"},
                        {"output.dir", out}};
  return load_config_text("", "pp bench", ov);
}

// Every rank's value of x, in world-rank order (an all-reduce of one slot per rank).
std::vector<double> all_ranks(CommContext& comm, double x) {
  Tensor t = Tensor::zeros({comm.world_size()}, DType::kF64);
  t.data<double>()[comm.rank()] = x;
  comm.world().all_reduce(t).wait();
  return std::vector<double>(t.data<double>(), t.data<double>() + comm.world_size());
}

int run(int argc, char** argv) {
  Args a = parse(argc, argv);
  cpu::set_num_threads(1);
  std::unique_ptr<CommContext> comm;
  {
    // The world's size fixes tp: pp = 2 stages of world / 2 tp ranks each.
    LayoutConfig probe;
    const char* ws = std::getenv("OMPI_COMM_WORLD_SIZE");
    const int world = ws ? std::atoi(ws) : 2;
    DHX_CHECK(world == 2 || world == 4, ConfigError, "run on 2 ranks (pp = 2) or 4 (pp = 2 x tp = 2), not {}", world);
    probe.pp = 2;
    probe.tp = world / 2;
    probe.sequence_parallel = probe.tp > 1;
    comm = make_mpi_world(probe);
  }
  const int tp = comm->layout().config().tp;
  const bool root = comm->rank() == 0;
  const std::string dir = fmt::format("/tmp/dhelix_bench_pp.{}.r{}", getpid(), comm->rank());
  const std::string data = write_data(dir, a.vocab);

  std::vector<std::unique_ptr<Trainer>> trainers;
  for (const Variant& v : kVariants)
    trainers.push_back(std::make_unique<Trainer>(variant_config(a, v, tp, data, dir + "/" + v.name), comm.get(),
                                                 Quiet::kYes));
  const RunConfig& c0 = trainers[0]->config();
  if (root)
    fmt::print("pp: {} ({:.1f}M params, vocab {}), pp=2 x tp={} (one stage per host), B={} T={} x {} micro-batches, "
               "{} timed rounds after 1 warm-up; variants rotate each round\n",
               a.preset, c0.model.num_params() / 1e6, a.vocab, tp, a.B, a.T, a.micro_batches, a.rounds);

  const size_t nv = kVariants.size();
  std::vector<std::vector<double>> t(nv), bubble(nv);
  std::vector<int64_t> peak(nv, 0);
  std::vector<std::vector<double>> peaks_stage(nv);
  for (int64_t round = -1; round < a.rounds; ++round) {
    for (size_t j = 0; j < nv; ++j) {
      const size_t v = (j + static_cast<size_t>(std::max<int64_t>(round, 0))) % nv;
      comm->world().barrier();
      const double t0 = now_seconds();
      StepStats st = trainers[v]->compute_gradients();
      const double t1 = now_seconds();
      comm->world().barrier();
      const double t2 = now_seconds();
      const std::vector<double> idle = all_ranks(*comm, st.p2p_wait_s + (t2 - t1));
      const std::vector<double> wall = all_ranks(*comm, t2 - t0);
      const std::vector<double> pk = all_ranks(*comm, static_cast<double>(st.peak_activation_bytes));
      if (round < 0) continue;  // warm-up
      const double step = *std::max_element(wall.begin(), wall.end());
      double worst = 0;
      for (int r = 0; r < comm->world_size(); ++r) worst = std::max(worst, idle[r] / wall[r]);
      t[v].push_back(step);
      bubble[v].push_back(worst);
      peaks_stage[v] = pk;
      peak[v] = std::max<int64_t>(peak[v], static_cast<int64_t>(*std::max_element(pk.begin(), pk.end())));
      if (root)
        fmt::print("round {} {:<12} step {:.3f} s, bubble (most idle stage) {:.3f}\n", round, kVariants[v].name, step,
                   worst);
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!root) return 0;

  PipelineSpec spec = pipeline_spec(c0);
  const double formula = bubble_formula(spec);
  // A chunk's price: the FLOPs of its units' forward (or backward) programs.
  const ModelPrograms& progs = trainers[0]->programs();
  const int U = static_cast<int>(c0.model.n_layers) + 2;
  auto chunk_flops = [&](const Chunk& ch, bool bwd) {
    double f = 0;
    for (int u = ch.unit_begin; u < ch.unit_end; ++u) {
      const LayerProgram& p = u == 0 ? progs.embed : u == U - 1 ? progs.head : progs.block;
      f += total_cost(bwd ? p.bwd : p.fwd).flops;
    }
    return f;
  };
  fmt::print("\n{:<12} {:>10} {:>8} {:>8} {:>8} {:>8} {:>9}   per-stage peak activations (MiB)\n", "schedule",
             "step (s)", "q1", "q3", "bubble", "formula", "timeline");
  std::vector<double> timeline(nv);
  for (size_t v = 0; v < nv; ++v) {
    PipelineSpec s = spec;
    s.kind = kVariants[v].kind;
    s.virtual_stages = s.kind == PipelineKind::kInterleaved ? 2 : 1;
    s.co_execute = kVariants[v].si;
    std::string stages;
    for (double b : peaks_stage[v]) stages += fmt::format(" {:.1f}", b / 1048576.0);
    timeline[v] = simulate_timeline(make_schedule(s), chunk_flops).max_bubble();
    fmt::print("{:<12} {:>10.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>9.3f}  {}\n", kVariants[v].name, median(t[v]),
               quantile(t[v], 0.25), quantile(t[v], 0.75), median(bubble[v]), bubble_formula(s), timeline[v], stages);
  }
  const double t1f1b = median(t[0]), tw_si = median(t[3]);
  fmt::print("W+SI over 1F1B: {:.3f}x step time (target: <= 1 at pp = 2, < 1 at pp = 2 x tp = 2)\n", tw_si / t1f1b);
  fmt::print(
      "{{\"pp\":2,\"tp\":{},\"micro_batches\":{},\"rounds\":{},\"t_1f1b_s\":{},\"t_interleaved_s\":{},\"t_w_s\":{},"
      "\"t_w_si_s\":{},\"t_w_si_over_1f1b\":{},\"bubble_measured\":{},\"bubble_formula\":{},\"bubble_measured_w\":{},"
      "\"bubble_measured_w_si\":{},\"bubble_measured_interleaved\":{},\"bubble_timeline\":{},"
      "\"bubble_timeline_w_si\":{},\"peak_bytes_w\":{},\"peak_bytes_w_si\":{},"
      "\"peak_bytes_1f1b_max\":{},\"peak_bytes_interleaved_max\":{}}}\n",
      tp, a.micro_batches, a.rounds, t1f1b, median(t[1]), median(t[2]), tw_si, tw_si / t1f1b, median(bubble[0]),
      formula, median(bubble[2]), median(bubble[3]), median(bubble[1]), timeline[0], timeline[3], peak[2], peak[3],
      peak[0], peak[1]);
  return 0;
}

}  // namespace
}  // namespace dhelix

int main(int argc, char** argv) {
  return dhelix::bench_main("pp", [&] { return dhelix::run(argc, argv); }, dhelix::OnFailure::kAbortWorld);
}

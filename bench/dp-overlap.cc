// dp-overlap: how much communication one training step of the demo model hides, on 2 ranks
// (run by bench/dp-overlap.sh on the emulated cluster: 2 hosts x 1 rank, 1 Gbit/s link).
//   dhelix_bench_dp-overlap dp|dp16|tp DIR [STEPS]   (under mpirun -np 2; DIR is shared scratch)
// Every figure is a median over STEPS rounds measured in the same run, one round =
//   dp: (a) a dp=2 step with bucketed overlap (T_step; GradSync's dp_comm_seconds = the bucket
//       reductions' busy time on the comm thread), (b) the same step without overlap (every bucket
//       issued after backward), (c) the same per-rank step in a comm-free single-rank trainer
//       (same micro-batch per rank, same model: T_compute), (d) the step's dp collectives alone,
//       issued back to back as GradSync does (T_comm_dp): every bucket all-reduce and, with the
//       sparse embedding exchange on (parallel.sparse_embed_grad), its two all-gathers.
//       dp_comm_hidden_fraction = (T_compute + T_comm_dp - T_step) / T_comm_dp: the share of the
//       bucket traffic that did not lengthen the step (1 = all hidden, 0 = fully exposed),
//       computed per round from that round's timings; the median over rounds is reported.
//   tp: tp=2 steps with Strand Interleaving (T_step) and a trace of the same steps: the compute
//       thread's busy time in layer ops (T_compute) and the tp collectives' busy time (T_comm_tp).
//       T_step - T_compute bounds the exposed tp time from above (it also holds the optimizer and
//       bookkeeping), so tp_comm_hidden_fraction_lb = 1 - (T_step - T_compute) / T_comm_tp is a
//       lower bound. With tp the collectives are on the critical path of each layer; only the
//       other strand's compute can cover them.
//   dp16: the dp layout with the gradient buckets in bf16 on the wire (comm.grad_precision = bf16):
//       the same four timings, T_comm_dp over bf16 buffers (half the bytes).
// Last line: one JSON object with the figures of this layout.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "base/Clock.h"
#include "base/Error.h"
#include "base/Stats.h"
#include "comm/MpiBackend.h"
#include "base/Trace.h"
#include "train/IndexedDataset.h"
#include "train/Trainer.h"

namespace dhelix {
namespace {

// 200 documents x 600 random tokens over the demo vocabulary (timing does not need text).
void write_random_dataset(const std::string& prefix, int64_t vocab) {
  IndexedDatasetWriter w(prefix, IndexDType::kU16);
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> doc(600);
  for (int d = 0; d < 200; ++d) {
    for (auto& t : doc) t = tok(rng);
    w.add_document(doc);
  }
  w.finish();
}

RunConfig demo_config(int dp, int tp, const std::string& dir) {
  ConfigOverrides ov = {{"model.preset", "demo"},          {"training.micro_batch_size", "8"},
                        {"training.micro_batches", "2"},   {"training.threads", "1"},
                        {"training.eval_interval", "0"},   {"training.sample_tokens", "0"},
                        {"data.prefix", dir + "/random"},  {"parallel.dp", std::to_string(dp)},
                        {"parallel.tp", std::to_string(tp)}, {"output.dir", dir + "/run"}};
  return load_config_text("", "dp-overlap", ov);
}

std::string row(const char* what, double s, const char* note) {
  return fmt::format("  {:<44} {:>9.1f} ms   {}\n", what, s * 1e3, note);
}

int bench_dp(CommContext& comm, const std::string& dir, int steps, bool bf16) {
  RunConfig cfg = demo_config(2, 1, dir);
  cfg.comm.grad_precision = bf16 ? "bf16" : "fp32";
  const DType wire = bf16 ? DType::kBF16 : DType::kF32;
  const int64_t wire_bytes = bf16 ? 2 : 4;
  RunConfig solo_cfg = cfg;
  solo_cfg.parallel.dp = 1;
  Trainer overlap(cfg, &comm, Quiet::kYes), serial_sync(cfg, &comm, Quiet::kYes), solo(solo_cfg, nullptr, Quiet::kYes);
  serial_sync.grad_sync().set_overlap(GradOverlap::kOff);  // GradSync::finish then issues every bucket
  ProcessGroup& dp = comm.group(GroupRole::kDP);
  const auto& buckets = overlap.params().buckets();
  Tensor scratch = Tensor::zeros({overlap.params().flat_grads().numel()}, wire);
  // With the sparse embedding exchange on, GradSync also all-gathers N token ids and N x C rows.
  const bool sparse = overlap.grad_sync().sparse_embedding();
  const int64_t N = cfg.training.micro_batch_size * cfg.model.seq_len, C = cfg.model.d_model;
  Tensor tok_in = Tensor::zeros({N}, DType::kI32), tok_out = Tensor::zeros({2 * N}, DType::kI32);
  Tensor rows_in = Tensor::zeros({N, C}), rows_out = Tensor::zeros({2 * N, C});
  std::vector<double> t_step, t_busy, t_noovl, t_comp, t_comm, round_hidden;
  const int warm = 2;
  for (int i = 0; i < warm + steps; ++i) {
    comm.world().barrier();
    double step_s = overlap.train_step().seconds, busy_s = overlap.grad_sync().dp_comm_seconds();
    comm.world().barrier();
    double noovl_s = serial_sync.train_step().seconds;
    comm.world().barrier();
    double comp_s = solo.train_step().seconds;
    comm.world().barrier();
    double t0 = now_seconds();
    std::vector<Work> works;
    for (const GradBucket& b : buckets) works.push_back(dp.all_reduce(scratch.narrow0(b.begin, b.end - b.begin)));
    if (sparse) {  // GradSync's all-gathers of the last micro-batch's embedding rows and token ids
      works.push_back(dp.all_gather(tok_in, tok_out));
      works.push_back(dp.all_gather(rows_in, rows_out));
    }
    for (auto& w : works) w.wait();
    double comm_s = now_seconds() - t0;
    // A synchronous job's step lasts as long as its slowest rank: every figure is the max over
    // ranks (the comm-free solo steps would otherwise be one rank's time against the others').
    Tensor t = Tensor::empty({5}, DType::kF64);
    double* tv = t.data<double>();
    tv[0] = step_s, tv[1] = busy_s, tv[2] = noovl_s, tv[3] = comp_s, tv[4] = comm_s;
    comm.world().all_reduce(t, ReduceOp::kMax).wait();
    step_s = tv[0], busy_s = tv[1], noovl_s = tv[2], comp_s = tv[3], comm_s = tv[4];
    if (i < warm) continue;
    t_step.push_back(step_s), t_busy.push_back(busy_s), t_noovl.push_back(noovl_s), t_comp.push_back(comp_s);
    t_comm.push_back(comm_s);
    round_hidden.push_back((comp_s + comm_s - step_s) / comm_s);
  }
  const double step = median(t_step), busy = median(t_busy), noovl = median(t_noovl), comp = median(t_comp),
               cm = median(t_comm);
  // Each round's four timings are taken back to back, so a round's own fraction is not skewed by
  // load drifting between rounds (this machine's timings swing by up to 3x); its median is the
  // reported figure, the fraction of the medians is printed beside it.
  const double hidden_of_medians = (comp + cm - step) / cm, hidden = median(round_hidden);
  const double q1 = quantile(round_hidden, 0.25), q3 = quantile(round_hidden, 0.75);
  if (comm.rank() != 0) return 0;
  int64_t grad_bytes = overlap.params().flat_grads().numel() * wire_bytes;
  std::string b_sizes;
  for (const GradBucket& b : buckets)
    b_sizes += fmt::format("{}{:.2f}", b_sizes.empty() ? "" : " ", double((b.end - b.begin) * wire_bytes) / 1048576.0);
  std::string out = fmt::format("dp-overlap: demo model ({:.2f}M params), dp=2, B=8 x T=128 x 2 micro-batches per rank, "
                                "{} gradient buckets [{}] MiB in {}, medians of {} rounds (each the slowest rank's time)\n",
                                cfg.model.num_params() / 1e6, buckets.size(), b_sizes, bf16 ? "bf16" : "fp32", steps);
  out += row("T_step (bucketed dp overlap)", step, "train_step()");
  out += row("T_step without overlap (buckets after bwd)", noovl, "same step, buckets issued in finish()");
  out += row("T_compute (comm-free, same per-rank work)", comp, "single-rank trainer, B=8 per rank");
  out += row("T_comm_dp (GradSync's collectives alone)", cm,
             (fmt::format("{:.1f} MiB all-reduced", grad_bytes / 1048576.0) +
              (sparse ? fmt::format(" + {:.2f} MiB of embedding rows all-gathered", (N * C + N) * 4 / 1048576.0) : ""))
                 .c_str());
  out += row("dp comm busy during the overlapped step", busy, "GradSync::dp_comm_seconds()");
  out += fmt::format("  dp_comm_hidden_fraction = (T_compute + T_comm_dp - T_step) / T_comm_dp = {:.3f} "
                     "(median over rounds, quartiles {:.3f} .. {:.3f}; from the medians above: {:.3f})\n",
                     hidden, q1, q3, hidden_of_medians);
  out += fmt::format("  without overlap:          (T_compute + T_comm_dp - T_step_noovl) / T_comm_dp = {:.3f}\n",
                     (comp + cm - noovl) / cm);
  out += fmt::format(R"({{"layout":"{}","dp_comm_hidden_fraction":{:.4f},"dp_comm_hidden_fraction_q1":{:.4f},"dp_comm_hidden_fraction_q3":{:.4f},"dp_comm_hidden_fraction_of_medians":{:.4f},"step_s":{:.5f},"step_no_overlap_s":{:.5f},)"
                     R"("compute_s":{:.5f},"comm_dp_s":{:.5f},"comm_dp_busy_in_step_s":{:.5f},"buckets":{},"grad_mib":{:.2f},)"
                     R"("sparse_embed_grad":{}}})"
                     "\n",
                     bf16 ? "dp2 bf16 gradients" : "dp2", hidden, q1, q3, hidden_of_medians, step, noovl, comp, cm, busy, buckets.size(), grad_bytes / 1048576.0,
                     sparse ? "true" : "false");
  std::fputs(out.c_str(), stdout);
  return 0;
}

int bench_tp(CommContext& comm, const std::string& dir, int steps) {
  RunConfig cfg = demo_config(1, 2, dir);
  cfg.output.trace = dir + "/unused-trace.json";  // turns on the Trace; we write it ourselves below
  Trainer t(cfg, &comm, Quiet::kYes);
  const int warm = 2;
  std::vector<double> t_step;
  double t_start = 0;
  for (int i = 0; i < warm + steps; ++i) {
    comm.world().barrier();
    if (i == warm) t_start = now_seconds();
    double s = t.train_step().seconds;
    if (i >= warm) t_step.push_back(s);
  }
  std::string path = fmt::format("{}/tp-trace.rank{}.json", dir, comm.rank());
  t.trace()->write(path);
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in);
  std::map<int, std::string> lanes;
  for (auto& e : j["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") lanes[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
  double compute = 0, comm_tp = 0;
  for (auto& e : j["traceEvents"]) {
    if (e["ph"] != "X" || e["ts"].get<double>() < t_start * 1e6) continue;
    const std::string& lane = lanes[e["tid"].get<int>()];
    double dur = e["dur"].get<double>() * 1e-6;
    if (lane.rfind("compute", 0) == 0) compute += dur;
    else if (lane.rfind("comm", 0) == 0) comm_tp += dur;
  }
  compute /= steps, comm_tp /= steps;
  const double step = median(t_step), hidden_lb = 1 - (step - compute) / comm_tp;
  if (comm.rank() != 0) return 0;
  std::string out = fmt::format("dp-overlap: demo model, tp=2 (sequence parallel, Strand Interleaving {}), "
                                "B=8 x T=128 x 2 micro-batches, {} steps (rank 0; busy times are per-step means)\n",
                                cfg.schedule.strand_interleaving ? "on" : "off", steps);
  out += row("T_step", step, "train_step(), median");
  out += row("T_compute (compute thread busy in layer ops)", compute, "trace: compute lanes");
  out += row("T_comm_tp (tp collectives busy)", comm_tp, "trace: comm tp lane");
  out += row("T_step - T_compute (exposed comm + optimizer)", step - compute, "upper bound on exposed tp comm");
  out += fmt::format("  tp_comm_hidden_fraction_lb = 1 - (T_step - T_compute) / T_comm_tp = {:.3f}\n", hidden_lb);
  out += fmt::format(R"({{"layout":"tp2","tp_comm_hidden_fraction_lb":{:.4f},"step_s":{:.5f},"compute_s":{:.5f},)"
                     R"("comm_tp_s":{:.5f}}})"
                     "\n",
                     hidden_lb, step, compute, comm_tp);
  std::fputs(out.c_str(), stdout);
  return 0;
}

int run(const std::string& layout, const std::string& dir, int steps) {
  DHX_CHECK(layout == "dp" || layout == "dp16" || layout == "tp", ConfigError, "layout '{}' must be dp, dp16 or tp",
            layout);
  DHX_CHECK(mpi_world_size() == 2, ConfigError, "run under mpirun -np 2 (got {} ranks)", mpi_world_size());
  LayoutConfig l;
  (layout == "tp" ? l.tp : l.dp) = 2;
  l.sequence_parallel = l.tp > 1;
  auto comm = make_mpi_world(l);
  if (comm->rank() == 0) {
    std::filesystem::create_directories(dir);
    write_random_dataset(dir + "/random", demo_config(1, 1, dir).model.vocab_size);
  }
  comm->world().barrier();
  return layout == "tp" ? bench_tp(*comm, dir, steps) : bench_dp(*comm, dir, steps, layout == "dp16");
}

}  // namespace
}  // namespace dhelix

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fputs("usage: mpirun -np 2 dhelix_bench_dp-overlap dp|dp16|tp DIR [STEPS]\n", stderr);
    return 2;
  }
  try {
    return dhelix::run(argv[1], argv[2], argc == 4 ? std::atoi(argv[3]) : 6);
  } catch (const std::exception& e) {
    dhelix::abort_world(e.what());
  }
}

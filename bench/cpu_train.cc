// cpu_train: single-process CPU training speed of the GPT-2 124M shape (preset "gpt2-124m":
// 12 layers, d=768, 12 heads, V=50257, tied embeddings) at B x T tokens per step, random tokens.
// One run measures, on this machine and right now: our step time (median of the timed steps),
// the sgemm FLOP/s (1024^3 sampled before every step and after the last, both through our gemm()
// and through OpenBLAS's own threading; the larger median is the denominator, so the fraction is
// conservative), and PyTorch's CPU eager training of the same model and batch
// (bench/cpu_train_torch.py under /usr/bin/python3, same thread count, its steps alternating with
// ours so both see the same load; the median of its timed steps). Prints a table, then one
// JSON line: tokens_per_s, model_flops_per_s, sgemm_flops_per_s, sgemm_fraction, torch_tokens_per_s.
// Model FLOPs/token = 6*N_matmul + 6*L*T*d (ModelConfig::flops_per_token). --profile adds a
// per-op time table (from a Trace of the timed steps). Not here: data loading, checkpoints.
#include <cblas.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "base/Clock.h"
#include "BenchFlags.h"
#include "BenchMain.h"
#include "base/Error.h"
#include "base/Files.h"
#include "base/Stats.h"
#include "kernels/cpu/Kernels.h"
#include "parallel/GradSync.h"
#include "parallel/Optimizer.h"
#include "parallel/ParamStore.h"
#include "runtime/StepParts.h"
#include "runtime/StepRunner.h"
#include "train/Trainer.h"

namespace dhelix {
namespace {

struct Args {
  int64_t B = 4, T = 256, steps = 3, warmup = 1, micro_batches = 1;
  int threads = 2;
  CoExecute interleave = CoExecute::kOff;
  bool torch = true, profile = false;
  std::string torch_script = "bench/cpu_train_torch.py";
  std::string python = "/usr/bin/python3";
};

void usage() {
  std::puts(
      "usage: dhelix_bench_cpu_train [--batch B=4] [--seq T=256] [--steps N=3] [--warmup N=1]\n"
      "         [--micro-batches M=1] [--interleave on|off] [--threads N=2] [--profile]\n"
      "         [--no-torch] [--torch-script PATH] [--python PATH]");
}

Args parse(int argc, char** argv) {
  Args a;
  BenchFlags fl(argc, argv);
  while (fl.next()) {
    const std::string& k = fl.key();
    if (k == "--batch") a.B = fl.count();
    else if (k == "--seq") a.T = fl.count();
    else if (k == "--steps") a.steps = fl.count();
    else if (k == "--warmup") a.warmup = fl.count();
    else if (k == "--micro-batches") a.micro_batches = fl.count();
    else if (k == "--threads") a.threads = static_cast<int>(fl.count());
    else if (k == "--interleave") a.interleave = fl.value() == "on" ? CoExecute::kOn : CoExecute::kOff;
    else if (k == "--profile") a.profile = true;
    else if (k == "--no-torch") a.torch = false;
    else if (k == "--torch-script") a.torch_script = fl.value();
    else if (k == "--python") a.python = fl.value();
    else if (k == "-h" || k == "--help") { usage(); std::exit(0); }
    else throw ConfigError(fmt::format("unknown argument '{}'", k));
  }
  DHX_CHECK(a.B >= 1 && a.T >= 1 && a.steps >= 1 && a.micro_batches >= 1 && a.threads >= 1, ConfigError,
            "--batch={} --seq={} --steps={} --micro-batches={} --threads={} must all be >= 1", a.B, a.T, a.steps,
            a.micro_batches, a.threads);
  return a;
}

// Per op name ("attn.qkv.dgrad"), total seconds over the traced steps, from the Chrome trace.
std::map<std::string, double> op_seconds(const std::string& trace_path) {
  auto doc = nlohmann::json::parse(read_file(trace_path));
  std::map<std::string, double> out;
  for (auto& e : doc["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    std::string name = e["name"].get<std::string>();
    name = name.substr(0, name.find(" mb"));
    out[name] += e["dur"].get<double>() * 1e-6;
  }
  return out;
}

// sgemm samples of this machine: through cpu::gemm (OpenMP slabs over serial OpenBLAS) and through
// OpenBLAS's own thread pool, 1024^3 each (measure_sgemm_flops: median of 4 after a warm-up).
struct SgemmSamples {
  std::vector<double> ours, openblas;
  void take(int threads) {
    ours.push_back(measure_sgemm_flops());
    const int64_t n = 1024;
    std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
    std::vector<double> rates;
    openblas_set_num_threads(threads);
    for (int rep = 0; rep < 5; ++rep) {
      double t0 = now_seconds();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
      if (rep > 0) rates.push_back(2.0 * n * n * n / (now_seconds() - t0));
    }
    cpu::set_num_threads(threads);  // back to serial OpenBLAS under OpenMP slabs
    std::sort(rates.begin(), rates.end());
    openblas.push_back(rates[rates.size() / 2]);
  }
};

// PyTorch eager peer: bench/cpu_train_torch.py --serve under `python`, one training step per
// request, so its steps alternate with ours and both see the same machine load. When it cannot
// run, `why()` says why (no torch under that python, script missing, the process failed).
class TorchPeer {
 public:
  explicit TorchPeer(const Args& a) {
    if (!a.torch) { fail("skipped (--no-torch)"); return; }
    if (!std::filesystem::exists(a.torch_script))
      { fail(fmt::format("{} not found (run from the repository root)", a.torch_script)); return; }
    if (std::system(fmt::format("{} -c 'import torch' >/dev/null 2>&1", a.python).c_str()) != 0)
      { fail(fmt::format("no torch under {} (scripts/setup --torch)", a.python)); return; }
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) { fail("pipe failed"); return; }
    std::vector<std::string> argv = {a.python, a.torch_script, "--serve", "--batch", std::to_string(a.B), "--seq",
                                     std::to_string(a.T), "--micro-batches", std::to_string(a.micro_batches),
                                     "--threads", std::to_string(a.threads)};
    std::fflush(stdout);
    pid_ = fork();
    if (pid_ == 0) {  // child: stdin <- in[0], stdout and stderr -> out[1]
      dup2(in[0], 0);
      dup2(out[1], 1);
      dup2(out[1], 2);
      close(in[1]);
      close(out[0]);
      std::vector<char*> args;
      for (auto& x : argv) args.push_back(x.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
    for (std::string line; read_line(line);) {
      if (line == "ready") return;
      fmt::print("  torch: {}\n", line);
    }
    fail(fmt::format("the torch process exited before it was ready"));
  }
  ~TorchPeer() {
    if (to_) std::fclose(to_);  // EOF ends the serve loop
    if (from_) std::fclose(from_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  TorchPeer(const TorchPeer&) = delete;
  TorchPeer& operator=(const TorchPeer&) = delete;

  bool ok() const { return why_.empty(); }
  const std::string& why() const { return why_; }
  // One torch training step; its seconds, or nullopt (and why()) when the process failed.
  std::optional<double> step() {
    if (!ok()) return std::nullopt;
    std::fputs("step\n", to_);
    std::fflush(to_);
    for (std::string line; read_line(line);) {
      if (line.empty() || line[0] != '{') {
        fmt::print("  torch: {}\n", line);
        continue;
      }
      auto j = nlohmann::json::parse(line);
      fmt::print("  torch step {:>8.3f} s  loss {:.4f}\n", j["step_s"].get<double>(), j["loss"].get<double>());
      return j["step_s"].get<double>();
    }
    fail("the torch process failed mid-run");
    return std::nullopt;
  }

 private:
  void fail(std::string reason) { why_ = std::move(reason); }
  bool read_line(std::string& line) {
    char buf[4096];
    if (!from_ || !std::fgets(buf, sizeof buf, from_)) return false;
    line = buf;
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    return true;
  }
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  std::string why_;
};

struct OursResult {
  double step_s = 0, loss_first = 0, loss_last = 0;
  int64_t peak_act = 0;
  std::map<std::string, double> op_s;  // per step, when profiled
  double opt_s = 0;                    // optimizer seconds per step
  std::optional<double> torch_step_s;  // median of the peer's timed steps
};

// Builds the model like Trainer does (single process) and trains warmup + steps steps; after each
// of ours, the torch peer (when it runs) trains one step of its own.
OursResult run_ours(const Args& a, const ModelConfig& model, SgemmSamples& sgemm, TorchPeer& torch) {
  MicroBatchShape mb{a.B, a.T};
  StepPartsSpec ps;
  ps.model = model;
  ps.mb = mb;
  ps.tokens_per_step = static_cast<double>(a.B * a.T * a.micro_batches);
  StepParts parts(ps);
  auto& units = parts.units;
  ModelPrograms& progs = parts.progs;
  ParamStore& params = *parts.params;
  MemoryTracker& state_mem = parts.state_mem;
  RunContext& ctx = parts.ctx;
  GradSync sync(params, units, progs, nullptr, nullptr, ZeroStage::kNone, &state_mem);
  Optimizer opt(params, sync, nullptr, nullptr, AdamWConfig{}, &state_mem);
  const int M = static_cast<int>(a.micro_batches);
  ctx.on_grad_op = [&sync, M](int m, int unit, const Op& op) {
    if (m == M - 1) sync.on_grad_op(unit, op);
  };
  std::unique_ptr<Trace> trace;
  StepRunner runner(ctx, units, progs, nullptr, single_stage(a.interleave));
  runner.set_bwd_unit_hook([&sync, M](int m, int unit) {
    if (m == M - 1) sync.on_unit_done(unit);
  });

  std::mt19937_64 rng(42);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(model.vocab_size - 1));
  std::vector<MicroBatch> mbs;
  for (int m = 0; m < M; ++m) {
    MicroBatch x{Tensor::empty({a.B * a.T}, DType::kI32), Tensor::empty({a.B * a.T}, DType::kI32)};
    for (int64_t i = 0; i < a.B * a.T; ++i) x.tokens.data<int32_t>()[i] = tok(rng);
    for (int64_t i = 0; i < a.B * a.T; ++i)  // next-token targets within each sequence
      x.targets.data<int32_t>()[i] = (i + 1) % a.T == 0 ? tok(rng) : x.tokens.data<int32_t>()[i + 1];
    mbs.push_back(std::move(x));
  }

  OursResult r;
  std::vector<double> times, torch_times;
  for (int64_t s = 0; s < a.warmup + a.steps; ++s) {
    if (a.profile && s == a.warmup) {
      trace = std::make_unique<Trace>(0);
      ctx.trace = trace.get();
    }
    sgemm.take(a.threads);
    double t0 = now_seconds();
    params.zero_grads();
    StepStats st = runner.run(mbs);
    sync.finish();
    double t1 = now_seconds();
    opt.step(6e-4, s + 1);
    double t2 = now_seconds();
    if (s >= a.warmup) {
      times.push_back(t2 - t0);
      r.opt_s += (t2 - t1) / static_cast<double>(a.steps);
    }
    double loss = st.loss_sum / static_cast<double>(st.tokens);
    if (s == 0) r.loss_first = loss;
    r.loss_last = loss;
    r.peak_act = std::max(r.peak_act, st.peak_activation_bytes);
    fmt::print("  ours step {:>2} {:>8.3f} s  loss {:.4f}{}\n", s + 1, t2 - t0, loss, s < a.warmup ? "  (warmup)" : "");
    std::fflush(stdout);
    if (std::optional<double> ts = torch.step(); ts && s >= a.warmup) torch_times.push_back(*ts);
  }
  r.step_s = median(times);
  if (torch.ok() && !torch_times.empty()) r.torch_step_s = median(torch_times);
  if (trace) {
    auto path = (std::filesystem::temp_directory_path() / fmt::format("dhelix_cpu_train_{}.json", getpid())).string();
    trace->write(path);
    for (auto& [k, v] : op_seconds(path)) r.op_s[k] = v / static_cast<double>(a.steps);
    std::filesystem::remove(path);
  }
  return r;
}

std::string gflops(double f) { return fmt::format("{:.1f} GFLOP/s", f / 1e9); }

int run(int argc, char** argv) {
  Args a = parse(argc, argv);
  cpu::set_num_threads(a.threads);
  ModelConfig model = model_preset("gpt2-124m");  // wpe keeps GPT-2's 1024 rows; steps use T <= 1024
  DHX_CHECK(a.T <= model.seq_len, ConfigError, "--seq={} exceeds the gpt2-124m context {}", a.T, model.seq_len);
  const double tokens = static_cast<double>(a.B * a.T * a.micro_batches);
  const double flops_tok = model.flops_per_token(a.T);
  fmt::print("cpu-train: gpt2-124m ({:.1f}M params), B={} T={} x {} micro-batch(es) = {} tokens/step, {} threads, "
             "{} timed steps after {} warmup\n",
             model.num_params() / 1e6, a.B, a.T, a.micro_batches, static_cast<int64_t>(tokens), a.threads, a.steps,
             a.warmup);
  fmt::print("model FLOPs/token = 6*N_matmul + 6*L*T*d = {:.4g}\n", flops_tok);

  SgemmSamples samples;
  TorchPeer torch(a);
  OursResult ours = run_ours(a, model, samples, torch);
  samples.take(a.threads);
  const double sgemm_ours = median(samples.ours), sgemm_blas = median(samples.openblas);
  const double sgemm = std::max(sgemm_ours, sgemm_blas);
  std::optional<double> torch_tps;
  if (ours.torch_step_s) torch_tps = tokens / *ours.torch_step_s;

  const double tps = tokens / ours.step_s, mflops = tps * flops_tok, frac = mflops / sgemm;
  if (a.profile) {
    std::vector<std::pair<double, std::string>> rows;
    double traced = 0;
    for (auto& [k, v] : ours.op_s) rows.push_back({v, k}), traced += v;
    std::sort(rows.rbegin(), rows.rend());
    fmt::print("\nper-op time per step (summed over layers and micro-batches)\n");
    fmt::print("  {:<26} {:>9} {:>7}\n", "op", "seconds", "share");
    for (auto& [v, k] : rows) fmt::print("  {:<26} {:>9.4f} {:>6.1f}%\n", k, v, 100 * v / ours.step_s);
    fmt::print("  {:<26} {:>9.4f} {:>6.1f}%\n", "optimizer (clip+AdamW)", ours.opt_s, 100 * ours.opt_s / ours.step_s);
    double other = ours.step_s - traced - ours.opt_s;
    fmt::print("  {:<26} {:>9.4f} {:>6.1f}%\n", "untraced (alloc, glue)", other, 100 * other / ours.step_s);
  }
  fmt::print("\n{:<30} {:>18}\n", "metric", "value");
  fmt::print("{:<30} {:>18.3f}\n", "step time, median (s)", ours.step_s);
  fmt::print("{:<30} {:>18.1f}\n", "tokens/s", tps);
  fmt::print("{:<30} {:>18}\n", "model FLOP/s", gflops(mflops));
  fmt::print("{:<30} {:>18}\n", "sgemm gemm() / OpenBLAS", fmt::format("{:.1f} / {:.1f}", sgemm_ours / 1e9,
                                                                       sgemm_blas / 1e9));
  fmt::print("{:<30} {:>18.3f}\n", "fraction of sgemm (larger)", frac);
  fmt::print("{:<30} {:>18.1f}\n", "peak activations (MiB)", ours.peak_act / 1048576.0);
  fmt::print("{:<30} {:>18}\n", "loss first / last step", fmt::format("{:.4f} / {:.4f}", ours.loss_first,
                                                                      ours.loss_last));
  if (torch_tps) {
    fmt::print("{:<30} {:>18.1f}\n", "torch eager tokens/s", *torch_tps);
    fmt::print("{:<30} {:>18.2f}\n", "ours / torch", tps / *torch_tps);
  } else {
    fmt::print("{:<30} {:>18}  {}\n", "torch eager tokens/s", "null", torch.why());
  }
  nlohmann::json j = {{"tokens_per_s", tps},
                      {"model_flops_per_s", mflops},
                      {"sgemm_flops_per_s", sgemm},
                      {"sgemm_fraction", frac},
                      {"torch_tokens_per_s", torch_tps ? nlohmann::json(*torch_tps) : nlohmann::json(nullptr)}};
  fmt::print("{}\n", j.dump());
  return 0;
}

}  // namespace
}  // namespace dhelix

int main(int argc, char** argv) {
  return dhelix::bench_main("cpu_train", [&] { return dhelix::run(argc, argv); }, dhelix::OnFailure::kReturn);
}

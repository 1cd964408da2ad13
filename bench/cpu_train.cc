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
// --precision bf16 (issue 22) adds, alternating step by step with the others: our run with the
// linear layers' GEMMs in bf16 (kernels/cpu/Bf16.h), PyTorch under bf16 autocast, and each torch
// peer also with glibc's allocator tuned (GLIBC_TUNABLES mmap_max=0, trim_threshold 64 GiB; the
// faster of the two is the peer), plus oneDNN's bf16 matmul rate on the model's own GEMM shapes;
// JSON adds tokens_per_s_bf16, tokens_per_s_fp32, torch_tokens_per_s_fp32, torch_tokens_per_s_bf16,
// bf16_matmul_flops_per_s, bf16_fraction (our bf16 model FLOP/s over that rate), bf16_isa and
// each run's peak activation MiB (the bf16 run keeps its saved GEMM inputs in bf16, as the trainer).
#include <cblas.h>
#include <fmt/format.h>
#include <fcntl.h>
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
#include "kernels/cpu/Bf16.h"
#include "kernels/cpu/Kernels.h"
#include "parallel/GradSync.h"
#include "parallel/Optimizer.h"
#include "parallel/ParamStore.h"
#include "runtime/StepBuilder.h"
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
  std::string precision = "fp32";  // bf16: dhelix bf16 and fp32, torch fp32 and bf16 autocast, alternating
  Recompute recompute = Recompute::kNone;  // training.recompute: the layers' activation recomputation
  std::string torch_script = "bench/cpu_train_torch.py";
  std::string python = "/usr/bin/python3";
};

void usage() {
  std::puts(
      "usage: dhelix_bench_cpu_train [--batch B=4] [--seq T=256] [--steps N=3] [--warmup N=1]\n"
      "         [--micro-batches M=1] [--interleave on|off] [--threads N=2] [--profile]\n"
      "         [--precision fp32|bf16] [--recompute none|selective|full]\n"
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
    else if (k == "--precision") a.precision = fl.value();
    else if (k == "--recompute") {
      const std::string v = fl.value();
      DHX_CHECK(parse_recompute(v, a.recompute), ConfigError, "--recompute '{}' must be none, selective or full", v);
    }
    else if (k == "--no-torch") a.torch = false;
    else if (k == "--torch-script") a.torch_script = fl.value();
    else if (k == "--python") a.python = fl.value();
    else if (k == "-h" || k == "--help") { usage(); std::exit(0); }
    else throw ConfigError(fmt::format("unknown argument '{}'", k));
  }
  DHX_CHECK(a.B >= 1 && a.T >= 1 && a.steps >= 1 && a.micro_batches >= 1 && a.threads >= 1, ConfigError,
            "--batch={} --seq={} --steps={} --micro-batches={} --threads={} must all be >= 1", a.B, a.T, a.steps,
            a.micro_batches, a.threads);
  DHX_CHECK(a.precision == "fp32" || a.precision == "bf16", ConfigError, "--precision '{}' must be fp32 or bf16",
            a.precision);
  return a;
}

// Per op name ("attn.qkv.dgrad"), total seconds over the traced steps, from the Chrome trace.
std::map<std::string, double> op_seconds(const std::string& trace_path) {
  auto doc = nlohmann::json::parse(read_file(trace_path));
  std::map<int, std::string> lanes;  // tid -> lane name
  for (auto& e : doc["traceEvents"])
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name")
      lanes[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
  std::map<std::string, double> out;
  for (auto& e : doc["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    // The step runner's pass spans enclose the ops: counted once, through the ops.
    if (lanes[e["tid"].get<int>()].rfind("schedule", 0) == 0) continue;
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
    openblas_set_num_threads(1);  // back to serial OpenBLAS under OpenMP slabs
    cpu::set_num_threads(threads);
    std::sort(rates.begin(), rates.end());
    openblas.push_back(rates[rates.size() / 2]);
  }
};

// PyTorch eager peer: bench/cpu_train_torch.py --serve under `python`, one training step per
// request, so its steps alternate with ours and both see the same machine load. When it cannot
// run, `why()` says why (no torch under that python, script missing, the process failed).
class TorchPeer {
 public:
  // `autocast`: bf16 autocast; `tuned`: glibc's allocator tuned so that it stops returning memory
  // (GLIBC_TUNABLES mmap_max=0, trim_threshold 64 GiB), which removes the per-step page faults.
  TorchPeer(const Args& a, bool autocast, bool tuned) {
    if (!a.torch) { fail("skipped (--no-torch)"); return; }
    if (!std::filesystem::exists(a.torch_script))
      { fail(fmt::format("{} not found (run from the repository root)", a.torch_script)); return; }
    if (std::system(fmt::format("{} -c 'import torch' >/dev/null 2>&1", a.python).c_str()) != 0)
      { fail(fmt::format("no torch under {} (scripts/setup --torch)", a.python)); return; }
    int in[2], out[2];
    // Close-on-exec: a later peer's process must not inherit this one's pipe ends (this peer
    // would never see EOF on its stdin and the destructor's waitpid would hang).
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) { fail("pipe failed"); return; }
    std::vector<std::string> argv = {a.python, a.torch_script, "--serve", "--batch", std::to_string(a.B), "--seq",
                                     std::to_string(a.T), "--micro-batches", std::to_string(a.micro_batches),
                                     "--threads", std::to_string(a.threads)};
    if (autocast) argv.push_back("--autocast");
    std::fflush(stdout);
    pid_ = fork();
    if (pid_ == 0) {  // child: stdin <- in[0], stdout and stderr -> out[1]
      if (tuned) setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736", 1);
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
    label_ = fmt::format("{}{}", autocast ? " bf16" : " fp32", tuned ? " tuned" : "");
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
      fmt::print("  torch{} step {:>8.3f} s  loss {:.4f}\n", label_, j["step_s"].get<double>(), j["loss"].get<double>());
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
  std::string why_, label_;
};

struct OursResult {
  double step_s = 0, loss_first = 0, loss_last = 0;
  int64_t peak_act = 0;
  std::map<std::string, double> op_s;  // per step, when profiled
  double opt_s = 0;                    // optimizer seconds per step
  std::vector<double> times;           // the timed steps
};

// The per-op table of a profiled run: each op's seconds per step (its traced spans summed over
// layers and micro-batches), the optimizer, and what no span covers.
void print_profile(const char* label, const OursResult& r) {
  std::vector<std::pair<double, std::string>> rows;
  double traced = 0;
  for (auto& [k, v] : r.op_s) rows.push_back({v, k}), traced += v;
  std::sort(rows.rbegin(), rows.rend());
  fmt::print("\nper-op time per step, {} (summed over layers and micro-batches)\n", label);
  fmt::print("  {:<26} {:>9} {:>7}\n", "op", "seconds", "share");
  for (auto& [v, k] : rows) fmt::print("  {:<26} {:>9.4f} {:>6.1f}%\n", k, v, 100 * v / r.step_s);
  fmt::print("  {:<26} {:>9.4f} {:>6.1f}%\n", "optimizer (clip+AdamW)", r.opt_s, 100 * r.opt_s / r.step_s);
  const double other = r.step_s - traced - r.opt_s;
  fmt::print("  {:<26} {:>9.4f} {:>6.1f}%\n", "untraced (alloc, glue)", other, 100 * other / r.step_s);
}

// The model built like Trainer does (single process), trained one step at a time with its GEMMs in
// `precision` (in its run context, so two of these alternate without a process-wide switch).
class OursRun {
 public:
  OursRun(const Args& a, const ModelConfig& model, cpu::GemmPrecision precision)
      : a_(a), precision_(precision), M_(static_cast<int>(a.micro_batches)) {
    StepSpec spec;
    spec.parts.model = model;
    spec.parts.mb = MicroBatchShape{a.B, a.T};
    spec.parts.tokens_per_step = static_cast<double>(a.B * a.T * a.micro_batches);
    spec.parts.pipeline = single_stage(a.interleave);
    spec.parts.layout.recompute = a.recompute;
    // As the trainer runs bf16 (training.bf16_activations on): saved GEMM inputs kept in bf16.
    spec.bf16_saved_activations = precision == cpu::GemmPrecision::kBf16;
    spec.kernels = cpu::kernel_config(static_cast<int>(a.threads), precision);
    step_ = std::make_unique<Step>(spec);
    parts_ = step_->parts.get();
    sync_ = step_->sync.get();
    opt_ = step_->opt.get();
    runner_ = step_->runner.get();
    runner_->add_observer(sync_);
    std::mt19937_64 rng(42);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(model.vocab_size - 1));
    for (int m = 0; m < M_; ++m) {
      MicroBatch x{Tensor::empty({a.B * a.T}, DType::kI32), Tensor::empty({a.B * a.T}, DType::kI32)};
      for (int64_t i = 0; i < a.B * a.T; ++i) x.tokens.data<int32_t>()[i] = tok(rng);
      for (int64_t i = 0; i < a.B * a.T; ++i)  // next-token targets within each sequence
        x.targets.data<int32_t>()[i] = (i + 1) % a.T == 0 ? tok(rng) : x.tokens.data<int32_t>()[i + 1];
      mbs_.push_back(std::move(x));
    }
  }

  // Step s (0-based; the first a.warmup are not timed).
  void step(int64_t s) {
    if (a_.profile && s == a_.warmup) {
      trace_ = std::make_unique<Trace>(0);
      parts_->ctx.trace = trace_.get();
    }
    ParamStore& params = *parts_->params;
    double t0 = now_seconds();
    params.zero_grads();
    StepStats st = runner_->run(mbs_);
    sync_->finish();
    double t1 = now_seconds();
    opt_->step(6e-4, s + 1);
    double t2 = now_seconds();
    if (s >= a_.warmup) {
      r_.times.push_back(t2 - t0);
      r_.opt_s += (t2 - t1) / static_cast<double>(a_.steps);
    }
    double loss = st.loss_sum / static_cast<double>(st.tokens);
    if (s == 0) r_.loss_first = loss;
    r_.loss_last = loss;
    r_.peak_act = std::max(r_.peak_act, st.peak_activation_bytes);
    fmt::print("  ours {} step {:>2} {:>8.3f} s  loss {:.4f}{}\n",
               precision_ == cpu::GemmPrecision::kBf16 ? "bf16" : "fp32", s + 1, t2 - t0, loss,
               s < a_.warmup ? "  (warmup)" : "");
    std::fflush(stdout);
  }

  OursResult result() {
    r_.step_s = median(r_.times);
    if (trace_) {
      auto path = (std::filesystem::temp_directory_path() / fmt::format("dhelix_cpu_train_{}.json", getpid())).string();
      trace_->write(path);
      for (auto& [k, v] : op_seconds(path)) r_.op_s[k] = v / static_cast<double>(a_.steps);
      std::filesystem::remove(path);
    }
    return r_;
  }

 private:
  const Args& a_;
  cpu::GemmPrecision precision_;
  int M_;
  std::unique_ptr<Step> step_;  // wired as the trainer wires it (runtime/StepBuilder.h)
  StepParts* parts_ = nullptr;
  GradSync* sync_ = nullptr;
  Optimizer* opt_ = nullptr;
  StepRunner* runner_ = nullptr;
  std::vector<MicroBatch> mbs_;
  std::unique_ptr<Trace> trace_;
  OursResult r_;
};

// oneDNN's bf16 matmul rate on the model's own GEMM shapes (B*T rows: qkv, attention out, MLP fc and
// proj, the tied head), forward orientation, operands already in bf16 (matmul_bf16: no rounding
// pass): the FLOP-weighted rate of one pass over them (median of 3 passes after a warm-up).
double measure_bf16_matmul(const Args& a, const ModelConfig& m) {
  const int64_t N = a.B * a.T, d = m.d_model;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{d, 3 * d}, {d, d}, {d, 4 * d}, {4 * d, d}, {d, m.vocab_size}};
  // Operands and outputs allocated and touched once, outside the timing (a fresh 206 MB output
  // would time the kernel's page faults, not the matmul).
  std::vector<std::vector<uint16_t>> xs, ws;
  std::vector<std::vector<float>> ys;
  for (auto [in, out] : shapes) {
    xs.emplace_back(static_cast<size_t>(N * in), cpu::to_bf16(0.5f));
    ws.emplace_back(static_cast<size_t>(out * in), cpu::to_bf16(0.25f));
    ys.emplace_back(static_cast<size_t>(N * out), 0.0f);
  }
  std::vector<double> rates;
  for (int rep = 0; rep < 4; ++rep) {
    double flops = 0, secs = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto [in, out] = shapes[i];
      const double t0 = now_seconds();
      cpu::matmul_bf16(false, true, N, out, in, 1.0f, xs[i].data(), ws[i].data(), 0.0f, ys[i].data(), out);
      secs += now_seconds() - t0;
      flops += 2.0 * double(N) * double(in) * double(out);
    }
    if (rep > 0) rates.push_back(flops / secs);
  }
  return median(rates);
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

  const bool bf16 = a.precision == "bf16";
  // The contestants, one step each in turn (so a slow spell of the machine hits all alike): ours
  // fp32 (and bf16), then the torch peers -- fp32 (and bf16 autocast), each as is and with the
  // allocator tuned.
  SgemmSamples samples;
  OursRun ours32(a, model, cpu::GemmPrecision::kFp32);
  std::unique_ptr<OursRun> ours16;
  if (bf16) ours16 = std::make_unique<OursRun>(a, model, cpu::GemmPrecision::kBf16);
  struct Peer {
    std::unique_ptr<TorchPeer> p;
    bool autocast, tuned;
    std::vector<double> times;
  };
  std::vector<Peer> peers;
  for (bool autocast : bf16 ? std::vector<bool>{false, true} : std::vector<bool>{false})
    for (bool tuned : {false, true}) peers.push_back({std::make_unique<TorchPeer>(a, autocast, tuned), autocast, tuned, {}});
  for (int64_t s = 0; s < a.warmup + a.steps; ++s) {
    samples.take(a.threads);
    ours32.step(s);
    if (ours16) ours16->step(s);
    for (Peer& q : peers)
      if (std::optional<double> t = q.p->step(); t && s >= a.warmup) q.times.push_back(*t);
  }
  samples.take(a.threads);
  const OursResult ours = ours32.result();
  const std::optional<OursResult> ours_bf16 = ours16 ? std::optional<OursResult>(ours16->result()) : std::nullopt;
  const double sgemm_ours = median(samples.ours), sgemm_blas = median(samples.openblas);
  const double sgemm = std::max(sgemm_ours, sgemm_blas);
  // The faster of each torch pair (as is / tuned allocator), tokens/s; null when neither ran.
  auto torch_best = [&](bool autocast) -> std::optional<double> {
    std::optional<double> best;
    for (const Peer& q : peers)
      if (q.autocast == autocast && q.p->ok() && !q.times.empty()) {
        const double tps = tokens / median(q.times);
        fmt::print("torch {}{}: {:.1f} tokens/s\n", autocast ? "bf16 autocast" : "fp32", q.tuned ? " (tuned allocator)" : "",
                   tps);
        best = std::max(best.value_or(0.0), tps);
      } else if (q.autocast == autocast) {
        fmt::print("torch {}{}: not run ({})\n", autocast ? "bf16 autocast" : "fp32", q.tuned ? " (tuned allocator)" : "",
                   q.p->why());
      }
    return best;
  };
  const std::optional<double> torch_tps = torch_best(false);
  const std::optional<double> torch16_tps = bf16 ? torch_best(true) : std::nullopt;
  const double bf16_mm = bf16 ? measure_bf16_matmul(a, model) : 0.0;

  const double tps = tokens / ours.step_s, mflops = tps * flops_tok, frac = mflops / sgemm;
  if (a.profile) {
    print_profile("fp32", ours);
    if (ours_bf16) print_profile("bf16", *ours_bf16);
  }
  auto jnum = [](const std::optional<double>& v) {
    const double x = v.value_or(-1.0);  // (value_or: gcc 12 sees *v as maybe-uninitialized)
    return x >= 0 ? nlohmann::json(x) : nlohmann::json(nullptr);
  };
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
    fmt::print("{:<30} {:>18.1f}\n", "torch fp32 tokens/s (faster)", *torch_tps);
    fmt::print("{:<30} {:>18.2f}\n", "ours / torch", tps / *torch_tps);
  }
  std::optional<double> tps16;
  if (ours_bf16) {
    tps16 = tokens / ours_bf16->step_s;
    fmt::print("{:<30} {:>18.3f}\n", "bf16 step time, median (s)", ours_bf16->step_s);
    fmt::print("{:<30} {:>18.1f}\n", "bf16 tokens/s", *tps16);
    fmt::print("{:<30} {:>18}\n", "bf16 loss first / last step",
               fmt::format("{:.4f} / {:.4f}", ours_bf16->loss_first, ours_bf16->loss_last));
    fmt::print("{:<30} {:>18.1f}\n", "bf16 peak activations (MiB)", ours_bf16->peak_act / 1048576.0);
    fmt::print("{:<30} {:>18} ({})\n", "bf16 matmul, model's shapes", gflops(bf16_mm), cpu::bf16_support().describe());
    fmt::print("{:<30} {:>18.3f}\n", "bf16 model FLOP/s / matmul", *tps16 * flops_tok / bf16_mm);
    if (torch16_tps) fmt::print("{:<30} {:>18.2f}\n", "ours bf16 / torch autocast", *tps16 / *torch16_tps);
  }
  nlohmann::json j = {{"recompute", recompute_name(a.recompute)},
                      {"peak_activation_mib", ours.peak_act / 1048576.0},
                      {"tokens_per_s", tps},
                      {"model_flops_per_s", mflops},
                      {"sgemm_flops_per_s", sgemm},
                      {"sgemm_fraction", frac},
                      {"torch_tokens_per_s", jnum(torch_tps)}};
  if (bf16) {
    j["tokens_per_s_fp32"] = tps;
    j["tokens_per_s_bf16"] = jnum(tps16);
    j["peak_activation_mib_fp32"] = ours.peak_act / 1048576.0;
    j["peak_activation_mib_bf16"] = ours_bf16 ? nlohmann::json(ours_bf16->peak_act / 1048576.0) : nlohmann::json(nullptr);
    j["torch_tokens_per_s_fp32"] = jnum(torch_tps);
    j["torch_tokens_per_s_bf16"] = jnum(torch16_tps);
    j["bf16_matmul_flops_per_s"] = bf16_mm;
    j["bf16_fraction"] = tps16 ? nlohmann::json(*tps16 * flops_tok / bf16_mm) : nlohmann::json(nullptr);
    j["bf16_isa"] = cpu::bf16_support().describe();
  }
  fmt::print("{}\n", j.dump());
  return 0;
}

}  // namespace
}  // namespace dhelix

int main(int argc, char** argv) {
  return dhelix::bench_main("cpu_train", [&] { return dhelix::run(argc, argv); }, dhelix::OnFailure::kReturn);
}

// tune --confirm: child `dhelix train` runs per layout, their metrics, and the rank agreement.
#include "TuneConfirm.h"

#include <fcntl.h>
#include <sched.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "base/Error.h"
#include "base/Files.h"
#include "base/Signals.h"
#include "base/Clock.h"
#include "base/Stats.h"
#include "kernels/cpu/Kernels.h"
#include "sim/LayoutSearch.h"

extern char** environ;

namespace dhelix {
namespace {

std::string self_exe() {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  DHX_CHECK(!ec, IoError, "tune --confirm: cannot find this program's path (/proc/self/exe): {}", ec.message());
  return p.string();
}

std::vector<std::string> split_words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// The `dhelix train` words of one layout: the model and batch the prediction priced.
std::vector<std::string> train_words(const ModelConfig& m, const BatchSpec& batch, const PredictOptions& opt,
                                     const Confirmed& c, const ConfirmOptions& o, const std::string& out_dir) {
  const LayoutConfig& lay = c.layout;
  const int64_t M = batch.global_batch / (int64_t{lay.data_replicas()} * batch.micro_batch);
  auto kv = [](const std::string& k, auto v) { return std::vector<std::string>{"--" + k, fmt::format("{}", v)}; };
  std::vector<std::vector<std::string>> pairs = {
      kv("model.family", family_name(m.family)),   kv("model.vocab_size", m.vocab_size),
      kv("model.seq_len", batch.seq),              kv("model.d_model", m.d_model),
      kv("model.n_layers", m.n_layers),            kv("model.n_heads", m.n_heads),
      kv("model.n_kv_heads", m.n_kv_heads),        kv("model.ffn_hidden", m.ffn_hidden),
      kv("model.tie_embeddings", m.tie_embeddings ? "true" : "false"),
      kv("training.steps", o.steps),               kv("training.micro_batch_size", batch.micro_batch),
      kv("training.micro_batches", M),             kv("training.eval_interval", 0),
      kv("training.sample_tokens", 0),             kv("training.log_interval", 1),
      kv("training.threads", 1),                   kv("checkpoint.interval", 0),
      kv("checkpoint.keep", 1),                    kv("parallel.dp", lay.dp),
      kv("parallel.tp", lay.tp),                   kv("parallel.pp", lay.pp),
      kv("parallel.tp_x", lay.tp_x),               kv("parallel.tp_y", lay.tp_y),
      kv("parallel.tp_z", lay.tp_z),               kv("parallel.zero", opt.zero == Zero::kZero1 ? 1 : 0),
      kv("parallel.ep", lay.ep),                   kv("parallel.cp", lay.cp),
      kv("training.recompute", recompute_name(lay.recompute)),
      kv("training.recompute_layers", lay.recompute_layers),
      kv("parallel.keep_gathered", lay.keep_gathered),
      kv("schedule.strand_interleaving", opt.si == StrandInterleaving::kOn ? "on" : "off"),
      kv("schedule.pipeline", pipeline_kind_name(c.pipeline)),
      kv("schedule.virtual_stages", c.virtual_stages),
      kv("training.fuse_epilogues", opt.fuse_epilogues ? "on" : "off"),
      kv("comm.grad_precision", opt.grad_wire_bytes == 2 ? "bf16" : "fp32"),
      kv("parallel.sparse_embed_grad", opt.sparse_embed == SparseEmbedGrad::kOn ? "on" : "off"),
      kv("output.dir", out_dir),                   kv("output.overwrite", "true"),
  };
  if (o.trace) pairs.push_back(kv("output.trace", out_dir + "/trace.json"));
  std::vector<std::string> w = {self_exe(), "train", "--config", o.config_path};
  for (auto& p : pairs) w.insert(w.end(), p.begin(), p.end());
  return w;
}

// Runs argv with stdout and stderr to `log`; returns the exit status (128 + signal when killed).
int run_logged(const std::vector<std::string>& argv, const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  DHX_CHECK(err == 0, IoError, "tune --confirm: cannot start '{}': {}", argv[0], std::strerror(err));
  // A first stop signal to tune is passed on to the run (which saves and stops at its step's end);
  // tune waits for it, then stops (the caller's stop point). A second one ends tune at once.
  int status = 0;
  bool passed_on = false;
  for (;;) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) break;
    if (!passed_on && stop_signal() != 0) {
      ::kill(pid, stop_signal());
      passed_on = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string tail_lines(const std::string& path, int n) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::string out;
  for (size_t i = lines.size() > size_t(n) ? lines.size() - n : 0; i < lines.size(); ++i) out += lines[i] + "\n";
  return out;
}

// Step seconds of steps 2.. from a run's metrics (step 1 warms caches, buffers and connections).
std::vector<double> step_times(const std::string& metrics) {
  std::ifstream in(metrics);
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("step_s") || !j.contains("step")) continue;
    if (j["step"].get<int64_t>() >= 2) out.push_back(j["step_s"].get<double>());
  }
  return out;
}

}  // namespace

std::vector<Confirmed> confirm_layouts(const ModelConfig& m, const BatchSpec& batch, const PredictOptions& opt,
                                       const std::vector<StepPrediction>& layouts, const ConfirmOptions& o) {
  DHX_CHECK(o.steps >= 2, ConfigError, "--confirm {} must be >= 2 (the first step is a warm-up)", o.steps);
  DHX_CHECK(!o.config_path.empty() && file_exists(o.config_path), ConfigError,
            "tune --confirm needs --config FILE for the runs' data and training settings (got '{}')", o.config_path);
  std::vector<Confirmed> out;
  for (const StepPrediction& p : layouts)
    out.push_back(Confirmed{p.layout, p.pipeline, p.virtual_stages, p.step_s, {}, 0, true, ""});
  const size_t n = out.size();
  std::filesystem::create_directories(o.workdir);
  for (int r = 0; r < o.rounds; ++r)
    for (size_t k = 0; k < n; ++k) {
      Confirmed& c = out[(k + size_t(r)) % n];  // round r starts r layouts later
      if (!c.ok) continue;
      const std::string label = row_label(c.layout, c.pipeline, c.virtual_stages);
      std::string slug = label;
      for (char& ch : slug)
        if (ch == ' ' || ch == '=') ch = '_';
      const std::string dir = o.workdir + "/" + slug;
      std::vector<std::string> argv;
      for (std::string w : split_words(o.launch)) {
        if (const size_t at = w.find("{np}"); at != std::string::npos) w.replace(at, 4, std::to_string(c.layout.world()));
        argv.push_back(w);
      }
      const std::vector<std::string> train = train_words(m, batch, opt, c, o, dir);
      argv.insert(argv.end(), train.begin(), train.end());
      const std::string log = o.workdir + "/" + slug + ".log";
      const int rc = run_logged(argv, log);
      stop_point(fmt::format("tune --confirm (round {} of {}, layout {}: its run was passed the signal; log {})", r + 1,
                             o.rounds, label, log));
      const std::vector<double> t = rc == 0 ? step_times(dir + "/metrics.jsonl") : std::vector<double>{};
      if (rc != 0 || t.empty()) {
        c.ok = false;
        c.error = fmt::format("exit {}; {}:\n{}", rc, log, tail_lines(log, 6));
        fmt::print("  round {} {:<22} FAILED (exit {}, log {})\n", r + 1, label, rc, log);
        continue;
      }
      c.step_s.insert(c.step_s.end(), t.begin(), t.end());
      fmt::print("  round {} {:<22} median step {:.3f} s over {} steps (predicted {:.3f} s)\n", r + 1, label, median(t),
                 t.size(), c.predicted_s);
      std::fflush(stdout);
    }
  for (Confirmed& c : out)
    if (c.ok) c.measured_s = median(c.step_s);
  return out;
}

namespace {

// One GEMM of `kind` (0 forward Y = X W^T, 1 input gradient dX = dY W, 2 weight gradient
// dW = dY^T X) in the engine's row-major operand layouts, on its own buffers.
struct GemmCase {
  int kind;
  int64_t M, N, K;
  std::vector<float> a, b, c;
  GemmCase(int kind_, int64_t rows, int64_t in, int64_t out)
      : kind(kind_), M(kind_ == 2 ? in : rows), N(out), K(kind_ == 2 ? rows : in),
        a(static_cast<size_t>(M * K), 0.5f), b(static_cast<size_t>(K * N), 0.25f), c(static_cast<size_t>(M * N)) {}
  void run() {
    if (kind == 0)
      cpu::gemm<float>(false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c.data(), N);
    else if (kind == 1)
      cpu::gemm<float>(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c.data(), N);
    else
      cpu::gemm<float>(true, false, M, N, K, 1.0f, a.data(), M, b.data(), N, 0.0f, c.data(), N);
  }
};

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  (void)sched_setaffinity(0, sizeof set, &set);  // best effort: unpinned, the timing is only noisier
}

}  // namespace

GemmTimer measured_gemm_timer(double core_share) {
  DHX_CHECK(core_share > 0 && core_share <= 1, ConfigError,
            "--measure-gemm needs the cluster preset's device.core_share (each rank's share of a core, in (0, 1]); "
            "this preset has {}", core_share);
  const int partners = static_cast<int>(std::lround(1.0 / core_share)) - 1;
  auto cache = std::make_shared<std::map<std::tuple<int, int64_t, int64_t, int64_t>, double>>();
  return [cache, partners](const Op& op) -> double {
    const int kind = op.code.ends_with("dgrad") ? 1 : op.code.ends_with("wgrad") ? 2 : 0;
    const int64_t rows = op.attrs.at("gemm_rows"), in = op.attrs.at("gemm_in"), out = op.attrs.at("gemm_out");
    const auto key = std::make_tuple(kind, rows, in, out);
    if (auto it = cache->find(key); it != cache->end()) return it->second;
    cpu::set_num_threads(1);
    // The ranks that share a core run their GEMMs side by side: `partners` threads on this CPU run
    // the same shape on their own buffers while this one is timed (measured on the emulated
    // cluster's 2 ranks per core: 14.8-17.1 GFLOP/s per rank paired against 31-32 alone, and the
    // paired rate, not the solo one, differs by shape the way the training traces do).
    cpu_set_t saved;
    const bool have_saved = sched_getaffinity(0, sizeof saved, &saved) == 0;
    const int cpu = std::max(0, sched_getcpu());
    pin_to(cpu);
    std::atomic<bool> stop{false};
    std::vector<std::thread> others;
    for (int i = 0; i < partners; ++i)
      others.emplace_back([&, kind, rows, in, out] {
        cpu::set_num_threads(1);  // a thread's own OpenMP count (Kernels.h), as the timed one's
        pin_to(cpu);
        GemmCase g(kind, rows, in, out);
        while (!stop.load(std::memory_order_relaxed)) g.run();
      });
    GemmCase g(kind, rows, in, out);
    g.run();  // warms the BLAS buffers
    double sec = 0;
    if (partners > 0) {
      // Paired: the mean over at least 0.2 s of back-to-back runs, so that it spans many of the
      // scheduler's time slices between this thread and its partners.
      int runs = 0;
      const double t0 = now_seconds();
      do g.run(), ++runs;
      while (runs < 3 || now_seconds() - t0 < 0.2);
      sec = (now_seconds() - t0) / runs;
    } else {
      // Alone: the best of three (the machine's noise only slows).
      sec = 1e30;
      for (int rep = 0; rep < 3; ++rep) {
        const double t0 = now_seconds();
        g.run();
        sec = std::min(sec, now_seconds() - t0);
      }
    }
    stop = true;
    for (std::thread& th : others) th.join();
    if (have_saved) (void)sched_setaffinity(0, sizeof saved, &saved);
    (*cache)[key] = sec;
    return sec;
  };
}

RankAgreement agreement(const std::vector<Confirmed>& c) {
  RankAgreement a;
  std::vector<double> pred, meas, err;
  const Confirmed* best_pred = nullptr;
  double best_meas = 0;
  for (const Confirmed& x : c) {
    if (!x.ok) continue;
    pred.push_back(x.predicted_s), meas.push_back(x.measured_s);
    err.push_back(std::abs(x.predicted_s - x.measured_s) / x.measured_s);
    if (!best_pred || x.predicted_s < best_pred->predicted_s) best_pred = &x;
    if (best_meas == 0 || x.measured_s < best_meas) best_meas = x.measured_s;
  }
  a.layouts = static_cast<int>(pred.size());
  if (a.layouts == 0) return a;
  a.kendall_tau = kendall_tau_b(pred, meas);
  a.top1_regret = best_pred->measured_s / best_meas - 1;
  a.median_abs_error = median(err);
  return a;
}

}  // namespace dhelix

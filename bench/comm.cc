// comm: collective bandwidth of one transport (bench/comm.sh runs it for gloo and mpi in turn on
// the emulated cluster: two hosts at 1 Gbit/s, one rank each). For all-reduce, reduce-scatter and
// all-gather of f32 buffers from 64 KiB to 64 MiB on the world group, per size: the median time
// of --iters timed runs after one warm-up, each started by a barrier, and the bus bandwidth
// (NCCL's convention: all-reduce moves 2(n-1)/n of the buffer per rank, the others (n-1)/n, so
// busbw is comparable with the link rate), plus the CPU time the process spent (all threads:
// the comm thread's work, its polling if any) per GB of bus traffic. One JSON line per run:
//   {"transport", "ranks", "busbw_gbps": {"all_reduce": {"65536": ...}, ...}, "cpu_s_per_gb"}
// Buffer size = the all-reduce tensor, the reduce-scatter input and the all-gather output.
// --tp K --group tp|dp times the groups of a tp = K x dp = world/K layout instead: every group of
// that role times its own collectives at once (ranks 0..K-1 form tp group 0; dp groups stride K),
// as a layout's groups run side by side in training; the slowest group's median is reported.
// --after-gemm N: each timed collective follows one GEMM ([128 x 768] x [768 x N], every rank) as a
// blocking collective follows compute in training, and the table reports the collective's cost in
// that regime: per iteration, (GEMM + collective) minus GEMM alone, each the mean over --iters
// back-to-back iterations (the baseline runs the GEMMs with no collective; ranks sharing a core
// time-slice in both).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "BenchFlags.h"
#include "BenchMain.h"
#include "base/Clock.h"
#include "base/Stats.h"
#include "comm/MpiBackend.h"
#include "kernels/cpu/Kernels.h"

namespace dhelix {
namespace {

struct Args {
  std::string transport = "gloo";
  int64_t iters = 5;
  int64_t max_mib = 64;
  int64_t tp = 1;             // layout tp = K, dp = world / K
  std::string group = "world";  // world, tp or dp
  int64_t after_gemm = 0;       // N of the GEMM before each collective; 0: none (barrier, then the op)
};

Args parse(int argc, char** argv) {
  Args a;
  BenchFlags fl(argc, argv);
  while (fl.next()) {
    const std::string& k = fl.key();
    if (k == "--transport") a.transport = fl.value();
    else if (k == "--iters") a.iters = fl.count();
    else if (k == "--max-mib") a.max_mib = fl.count();
    else if (k == "--tp") a.tp = fl.count();
    else if (k == "--group") a.group = fl.value();
    else if (k == "--after-gemm") a.after_gemm = fl.count();
    else
      throw ConfigError(fmt::format("unknown flag '{}'; usage: comm [--transport gloo|mpi] [--iters N] [--max-mib M] "
                                    "[--tp K --group world|tp|dp] [--after-gemm N]", k));
  }
  DHX_CHECK(a.iters >= 1 && a.max_mib >= 1 && a.tp >= 1, ConfigError, "--iters={} --max-mib={} --tp={}: need >= 1",
            a.iters, a.max_mib, a.tp);
  DHX_CHECK(a.group == "world" || a.group == "tp" || a.group == "dp", ConfigError,
            "--group '{}' must be world, tp or dp", a.group);
  return a;
}

int run(int argc, char** argv) {
  const Args a = parse(argc, argv);
  CommOptions opts;
  opts.transport = parse_comm_transport(a.transport);
  LayoutConfig layout;
  const int world = mpi_world_size();
  DHX_CHECK(world % a.tp == 0, ConfigError, "--tp {} does not divide the {} ranks", a.tp, world);
  layout.tp = static_cast<int>(a.tp);
  layout.dp = world / layout.tp;
  auto ctx = make_mpi_world(layout, opts);
  ProcessGroup& g = a.group == "tp" ? ctx->group(GroupRole::kTP) : a.group == "dp" ? ctx->group(GroupRole::kDP)
                                                                                    : ctx->world();
  const int n = g.size();
  const bool root = ctx->rank() == 0;
  std::map<std::string, std::map<int64_t, double>> busbw;
  double cpu_total = 0, bus_bytes_total = 0;
  if (root)
    fmt::print("comm: {}, {} group of {} ranks ({}), f32, median of {} after a warm-up\n{:<16} {:>10} {:>10} {:>12}\n",
               a.transport, a.group, n, g.transport(), a.iters, "op", "bytes", "ms", "busbw GB/s");
  // --after-gemm: the GEMM each iteration runs, and its mean time with no collective after it.
  const int64_t gm = 128, gk = 768, gn = std::max<int64_t>(a.after_gemm, 1);
  std::vector<float> ga(static_cast<size_t>(gm * gk), 0.5f), gb(static_cast<size_t>(gn * gk), 0.25f),
      gc(static_cast<size_t>(gm * gn));
  auto gemm = [&] { cpu::gemm<float>(false, true, gm, gn, gk, 1.0f, ga.data(), gk, gb.data(), gk, 0.0f, gc.data(), gn); };
  auto gemm_alone = [&] {
    ctx->world().barrier();
    gemm();
    const double t0 = now_seconds();
    for (int64_t i = 0; i < a.iters; ++i) gemm();
    return (now_seconds() - t0) / static_cast<double>(a.iters);
  };
  if (a.after_gemm > 0) cpu::set_num_threads(1);
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"}) {
    for (int64_t bytes = 64 << 10; bytes <= (a.max_mib << 20); bytes *= 4) {
      const int64_t elems = bytes / 4;
      Tensor big = Tensor::zeros({elems}), part = Tensor::zeros({elems / n});
      auto coll = [&] {
        if (std::string(op) == "all_reduce") g.all_reduce(big).wait();
        else if (std::string(op) == "reduce_scatter") g.reduce_scatter(big, part).wait();
        else g.all_gather(part, big).wait();
      };
      std::vector<double> t;
      double cpu = 0;
      if (a.after_gemm > 0) {
        const double alone = gemm_alone();
        ctx->world().barrier();
        gemm(), coll();
        const double c0 = process_cpu_seconds(), t0 = now_seconds();
        for (int64_t i = 0; i < a.iters; ++i) gemm(), coll();
        const double with = (now_seconds() - t0) / static_cast<double>(a.iters);
        cpu += process_cpu_seconds() - c0;
        t.push_back(std::max(1e-9, with - (alone + gemm_alone()) / 2));
      }
      for (int64_t i = 0; a.after_gemm == 0 && i <= a.iters; ++i) {
        ctx->world().barrier();
        const double c0 = process_cpu_seconds(), t0 = now_seconds();
        coll();
        const double dt = now_seconds() - t0;
        if (i > 0) t.push_back(dt), cpu += process_cpu_seconds() - c0;
      }
      // The slowest rank's median decides (every rank waits for it).
      Tensor m = Tensor::empty({1}, DType::kF64);
      m.data<double>()[0] = median(t);
      ctx->world().all_reduce(m, ReduceOp::kMax).wait();
      const double sec = m.data<double>()[0];
      const double factor = std::string(op) == "all_reduce" ? 2.0 * (n - 1) / n : 1.0 * (n - 1) / n;
      const double bw = static_cast<double>(bytes) * factor / sec;
      busbw[op][bytes] = bw / 1e9;
      cpu_total += cpu;
      bus_bytes_total += static_cast<double>(bytes) * factor * static_cast<double>(a.iters);
      if (root) fmt::print("{:<16} {:>10} {:>10.3f} {:>12.4f}\n", op, bytes, sec * 1e3, bw / 1e9);
    }
  }
  if (root) {
    std::string j = fmt::format("{{\"transport\":\"{}\",\"ranks\":{},\"busbw_gbps\":{{", a.transport, n);
    bool first_op = true;
    for (const auto& [op, m] : busbw) {
      j += fmt::format("{}\"{}\":{{", first_op ? "" : ",", op);
      first_op = false;
      bool first = true;
      for (const auto& [b, v] : m) j += fmt::format("{}\"{}\":{}", first ? "" : ",", b, v), first = false;
      j += "}";
    }
    j += fmt::format("}},\"cpu_s_per_gb\":{}}}", cpu_total / (bus_bytes_total / 1e9));
    fmt::print("{}\n", j);
  }
  return 0;
}

}  // namespace
}  // namespace dhelix

int main(int argc, char** argv) {
  return dhelix::bench_main("comm", [&] { return dhelix::run(argc, argv); }, dhelix::OnFailure::kAbortWorld);
}

// `dhelix profile` on a GPU: the operator-overlap profiler's layer pair (profile/LayerPairBench.h)
// with its weights and buffers on the GPU, each strand's kernels on its own stream. Oracles: the
// profile's shape (every strand window and legal window pair of the program priced, as on the CPU:
// profile_entry_count), each price a positive finite time, the profile's JSON round trip, and the
// plan flow on it (the search's candidates pass check_plan's rules and each validated one was timed
// on the GPU bench). No assertion on which is faster: the co-executed-vs-alone figures are printed
// (the papers' profiling claim, measured on the lent GPU by scripts/gpu-device, not asserted).
#include <cmath>
#include <string>

#include "CudaTest.h"
#include "ModelHarness.h"
#include "comm/LocalBackend.h"
#include "plan/PlanCheck.h"
#include "profile/PlanValidation.h"
#include "profile/Profiler.h"

namespace dhelix::cuda::test {
namespace {

// The profile's prices are times its windows' kernels took, not the host's issue time: a price is
// clamped at 1e-9 s once the timing bracket is taken off (Profiler.cc), so "positive" alone cannot
// fail. Oracle: no GPU runs above 1e15 FLOP/s (an H200's dense bf16 peak is 989e12), so the
// single-op windows of each strand together take at least the strand's FLOPs / 1e15 s; a bench that
// did not wait for its kernels would price them at the clamp (a review, 2026-11-29).
void expect_windows_took_the_kernels(const nlohmann::json& j, const LayerProgram& prog, const std::string& who) {
  for (const auto& [kind, ops] : {std::pair{"solo_fwd", &prog.fwd}, std::pair{"solo_bwd", &prog.bwd}}) {
    double flops = 0, single = 0;
    for (const Op& o : *ops) flops += o.cost.flops;
    for (const auto& e : j.at(kind))
      if (e[1].get<int>() - e[0].get<int>() == 1) single += e.back().get<double>();
    std::printf("[ info ] %s %s: single-op windows %.3e s for %.3e FLOP (%.0f TFLOP/s)\n", who.c_str(), kind, single,
                flops, single > 0 ? flops / single / 1e12 : 0.0);
    EXPECT_GE(single, flops / 1e15) << who << " " << kind << ": the windows' prices are under what the kernels take";
  }
}

// The bench on GPU 0 from seed `seed`.
LayerPairRun on_gpu(uint64_t seed) {
  LayerPairRun r;
  r.seed = seed;
  r.device = Device::cuda(0);
  return r;
}

TEST(CudaProfile, LayerPairProfileOnTheGpuPricesEveryEntryAndFeedsThePlanSearch) {
  DHX_REQUIRE_GPU();
  ModelConfig m = dhelix::test::reference_config(ModelFamily::kLlama);
  m.vocab_size = 512;
  m.seq_len = 256;
  m.d_model = 512;
  m.n_heads = 8;  // head size 64: a size the GPU attention runs
  m.n_kv_heads = 2;
  m.ffn_hidden = 1408;
  m.n_layers = 2;
  const LayoutConfig lay;  // one GPU
  const MicroBatchShape mb{4, 256};
  LayerPairBench bench(m, lay, mb, nullptr, on_gpu(7));
  ASSERT_EQ(bench.device(), Device::cuda(0));
  ProfileOptions po;
  po.timing = {1, 3};
  po.max_window = 4;
  const Profile p = profile_layer_pair(bench, m, lay, nullptr, po);
  const LayerProgram& prog = bench.program();
  EXPECT_EQ(static_cast<int64_t>(p.num_solo_fwd() + p.num_solo_bwd() + p.num_pairs()),
            profile_entry_count(prog, po.windows, po.max_window));
  EXPECT_NE(p.meta.machine.find("ops on cuda:0"), std::string::npos) << p.meta.machine;
  const nlohmann::json j = p.to_json();
  EXPECT_EQ(Profile::from_json(j).to_json(), j);
  for (const auto& kind : {"solo_fwd", "solo_bwd", "pairs"})
    for (const auto& e : j.at(kind)) {
      const double s = e.back().get<double>();
      EXPECT_TRUE(std::isfinite(s) && s > 0) << kind << " " << e.dump();
    }
  expect_windows_took_the_kernels(j, prog, "one rank");
  // What co-execution bought on this GPU: each legal pair against its two windows alone.
  double pair_sum = 0, solo_sum = 0;
  for (const auto& e : j.at("pairs")) {
    const int a = e[0], b = e[1], c = e[2], d = e[3];
    pair_sum += e[4].get<double>();
    solo_sum += p.solo_fwd(a, b) + p.solo_bwd(c, d);
  }
  std::printf("%zu pairs: co-executed %.3f ms, the same windows alone %.3f ms (ratio %.3f)\n", p.num_pairs(),
              pair_sum * 1e3, solo_sum * 1e3, pair_sum / solo_sum);

  SearchOptions so;
  so.top_k = 3;
  so.max_window = po.max_window;
  const PlanChoice choice = search_and_validate(prog, p, so, &bench, {0, 2});
  ASSERT_GE(choice.candidates.size(), 1u);
  for (const PlanCandidate& k : choice.candidates) {
    for (const auto& v : find_violations(k.plan, prog)) ADD_FAILURE() << k.plan.source << ": " << v.message();
    EXPECT_GT(k.measured_s, 0) << k.plan.source;
    std::printf("  candidate %-20s measured %.3f ms\n", k.plan.source.c_str(), k.measured_s * 1e3);
  }
  std::printf("kept: %s\n", choice.plan().source.c_str());
}

// Tensor parallelism on the GPU bench: two ranks as threads sharing the one GPU, tp = 2 with
// sequence parallelism, so the pair's windows issue all-gathers and reduce-scatters of device
// tensors. The bench's groups must be staged (LayerPairBench: place_groups_on_device): a CPU group
// given a device tensor reads device memory on the host (a crash). Oracle: every entry of the
// program priced (profile_entry_count), each a positive finite time, and the two ranks' profiles
// equal (agree_max: the slowest rank's median, the same on both).
TEST(CudaProfile, TensorParallelBenchOnTheGpuMovesItsCollectivesThroughStagedGroups) {
  DHX_REQUIRE_GPU();
  ModelConfig m = dhelix::test::reference_config(ModelFamily::kLlama);
  m.vocab_size = 512;
  m.seq_len = 128;
  m.d_model = 256;
  m.n_heads = 4;  // head size 64; two heads and one kv head per rank
  m.n_kv_heads = 2;
  m.ffn_hidden = 704;
  m.n_layers = 2;
  LayoutConfig lay;
  lay.tp = 2;
  lay.sequence_parallel = true;
  const MicroBatchShape mb{2, 128};
  ProfileOptions po;
  po.timing = {0, 1};
  po.max_window = 2;
  nlohmann::json got[2];
  int64_t want[2] = {0, 0};
  run_local_ranks(lay, [&](CommContext& comm) {
    LayerPairBench bench(m, lay, mb, &comm, on_gpu(7));
    const Profile p = profile_layer_pair(bench, m, lay, &comm, po);
    want[comm.rank()] = profile_entry_count(bench.program(), po.windows, po.max_window);
    got[comm.rank()] = p.to_json();
    expect_windows_took_the_kernels(got[comm.rank()], bench.program(), "tp rank " + std::to_string(comm.rank()));
  });
  for (int r = 0; r < 2; ++r) {
    const nlohmann::json& j = got[r];
    EXPECT_EQ(static_cast<int64_t>(j.at("solo_fwd").size() + j.at("solo_bwd").size() + j.at("pairs").size()), want[r]);
    for (const auto& kind : {"solo_fwd", "solo_bwd", "pairs"})
      for (const auto& e : j.at(kind)) {
        const double s = e.back().get<double>();
        EXPECT_TRUE(std::isfinite(s) && s > 0) << "rank " << r << " " << kind << " " << e.dump();
      }
  }
  // (Equal by construction -- the ranks agree on each price, taking the larger -- so this checks the
  // agreement ran, not the times.)
  for (const auto& kind : {"solo_fwd", "solo_bwd", "pairs"}) EXPECT_EQ(got[0].at(kind), got[1].at(kind)) << kind;
}

}  // namespace
}  // namespace dhelix::cuda::test

// The executor and the pair simulator issue a co-executed layer pair's ops in one order
// (plan/IssueOrder.h). Oracle: the simulator's order (PairSimResult::ops, recorded where it runs
// or issues an op) against the executor's (StepObserver::on_issue, recorded where run_op issues
// it), pair by pair, in real training steps on threads-as-ranks. Plans: what the plan search can
// produce for the test models -- the DP under random block prices (so every legal block shape is
// reachable), top 3 each, under both window rules -- plus the default (cover) plan, each run with
// its trailing weight-gradient GEMMs carried into the next pair and not. Compared: the steady-state
// pairs (both units transformer layers, the carried-in ops from a transformer layer too), which is
// what the simulator models; edge pairs (embedding, head) run the default plan of their own.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "SiRun.h"
#include "plan/IssueOrder.h"
#include "plan/PlanCheck.h"
#include "plan/PlanIO.h"
#include "schedule/BasicPlans.h"
#include "schedule/PlanSearch.h"
#include "sim/PairSim.h"
#include "train/Trainer.h"

namespace dhelix {
namespace {

using testing::TempDir;

struct Issued {
  StrandKind strand;
  int index;
  friend bool operator==(const Issued&, const Issued&) = default;
};
std::string show(const std::vector<Issued>& v) {
  std::string s;
  for (const Issued& i : v) s += fmt::format("{}{} ", i.strand == StrandKind::kForward ? 'F' : 'B', i.index);
  return s;
}

// Each pair the executor ran on rank 0: its units and the ops it issued, in order.
struct PairLog {
  int fwd_unit = -1, bwd_unit = -1;
  std::vector<Issued> ops;
};
class Recorder : public StepObserver {
 public:
  void on_pair_begin(int f, int b) override { pairs.push_back({f, b, {}}); }
  void on_issue(const IssuedOp& op) override {
    ASSERT_FALSE(pairs.empty()) << "an op issued outside any pair";
    pairs.back().ops.push_back({op.strand, op.index});
  }
  std::vector<PairLog> pairs;
};

// Random prices for every block: the DP then returns plans of every legal shape over enough draws.
class RandomCost : public BlockCost {
 public:
  explicit RandomCost(uint64_t seed) : seed_(seed) {}
  double solo_fwd(int a, int b) const override { return price(0, a, b, 0, 0); }
  double solo_bwd(int c, int d) const override { return price(1, 0, 0, c, d); }
  double pair(int a, int b, int c, int d) const override { return price(2, a, b, c, d); }

 private:
  double price(int kind, int a, int b, int c, int d) const {
    std::seed_seq s{seed_, static_cast<uint64_t>(kind), static_cast<uint64_t>(a), static_cast<uint64_t>(b),
                    static_cast<uint64_t>(c), static_cast<uint64_t>(d)};
    std::mt19937_64 g(s);
    return 1.0 + std::uniform_real_distribution<double>(0.0, 1.0)(g) * (b - a + d - c);
  }
  uint64_t seed_;
};

// The backward program's trailing ops the checker lets a plan carry (no collective, no buffer
// written, gradients accumulated).
int max_carry(const LayerProgram& p) {
  int n = 0;
  for (int i = static_cast<int>(p.bwd.size()) - 1; i >= 0; --i, ++n) {
    const Op& op = p.bwd[static_cast<size_t>(i)];
    if (op.is_collective() || !op.outputs.empty() || op.grads.empty()) break;
  }
  return n;
}

std::vector<SIPlan> search_plans_for(const LayerProgram& block) {
  std::vector<SIPlan> plans = {pair_default_plan(block.fwd, block.bwd)};
  for (WindowRule rule : {WindowRule::kWithinSegments, WindowRule::kAnyContiguous})
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      SearchOptions o;
      o.top_k = 3;
      o.windows = rule;
      for (SIPlan& p : search_plans(block, RandomCost(seed * 7919 + static_cast<uint64_t>(rule)), o).plans)
        plans.push_back(p);
    }
  std::vector<SIPlan> out;
  for (const SIPlan& p : plans)
    for (int carry : {0, max_carry(block)}) {
      SIPlan q = p;
      q.carry = carry;
      q.source = "test";
      q.pair = block.name;
      bool seen = false;
      for (const SIPlan& o : out) seen = seen || (o.blocks == q.blocks && o.carry == q.carry);
      if (!seen) out.push_back(q);
    }
  return out;
}

// Runs one step of `cfg` under `plan` on threads-as-ranks; rank 0's pairs and its block program.
std::vector<PairLog> executor_pairs(RunConfig cfg, const SIPlan& plan, const LayerProgram& block,
                                    const std::string& plan_path, std::vector<std::string>* kinds) {
  save_plan(plan_path, plan, block);
  cfg.schedule.plan = plan_path;
  std::vector<PairLog> out;
  std::mutex mu;
  run_local_ranks(layout_config(cfg), [&](CommContext& comm) {
    Trainer t(cfg, &comm, Quiet::kYes);
    Recorder rec;
    t.runner().executor().add_observer(&rec);
    t.compute_gradients();
    t.runner().executor().remove_observer(&rec);
    if (comm.rank() == 0) {
      std::lock_guard lk(mu);
      out = std::move(rec.pairs);
      kinds->clear();
      for (int u = 0; u < t.runner().executor().num_units(); ++u) kinds->push_back(t.runner().executor().unit(u).kind);
    }
  });
  return out;
}

struct Case {
  std::string name, family;
  int tp = 1, tp_x = 1, tp_y = 1, tp_z = 1;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class IssueOrderAgreement : public ::testing::TestWithParam<Case> {};

// combination: tp si
// combination: 3d si
TEST_P(IssueOrderAgreement, ExecutorIssuesAsTheSimulatorWalks) {
  const Case& c = GetParam();
  TempDir dir;
  testing::write_synthetic_dataset(dir.path() + "/data", 200, 64, 7);
  RunConfig cfg = testing::si_config(dir.path(), c.family, 1, c.tp, true);
  cfg.model.n_layers = 3;  // units: embed, 3 layers, head: two steady-state pairs per paired slot
  cfg.parallel.tp_x = c.tp_x;
  cfg.parallel.tp_y = c.tp_y;
  cfg.parallel.tp_z = c.tp_z;
  // The block program as the trainer builds it (rank 0's), for the search and the simulator.
  LayerProgram block;
  {
    std::mutex mu;
    run_local_ranks(layout_config(cfg), [&](CommContext& comm) {
      Trainer t(cfg, &comm, Quiet::kYes);
      std::lock_guard lk(mu);
      if (comm.rank() == 0) block = t.programs().block;
    });
  }
  ASSERT_GT(max_carry(block), 0) << "the block program has no trailing weight-gradient GEMMs to carry";
  const std::vector<SIPlan> plans = search_plans_for(block);
  ASSERT_GE(plans.size(), 8u) << "the search gave too few distinct plans to test";
  int compared = 0, with_carry = 0, paired_blocks = 0;
  for (size_t k = 0; k < plans.size(); ++k) {
    const SIPlan& plan = plans[k];
    SCOPED_TRACE(fmt::format("plan {} of {}: {}", k, plans.size(), plan_to_json(plan, block).dump()));
    ASSERT_NO_THROW(check_plan(plan, block));
    for (const Block& b : plan.blocks) paired_blocks += b.has_fwd() && b.has_bwd();
    const auto time = [](const Op& op) { return op.is_collective() ? 2e-3 : 1e-3; };
    const PairSimResult sim = simulate_pair(&block.fwd, &block.bwd, plan, time);
    std::vector<Issued> expected;
    for (const SimOp& o : sim.ops) expected.push_back({o.strand, o.index});
    std::vector<std::string> kinds;
    const std::vector<PairLog> pairs = executor_pairs(cfg, plan, block, dir.path() + "/plan.json", &kinds);
    for (const PairLog& p : pairs) {
      const auto is_block = [&](int u) { return u >= 0 && u < static_cast<int>(kinds.size()) && kinds[u] == "block"; };
      // Steady state: both strands in layers, and the ops carried in came from a layer too.
      if (!is_block(p.fwd_unit) || !is_block(p.bwd_unit) || !is_block(p.bwd_unit + 1)) continue;
      EXPECT_EQ(show(p.ops), show(expected)) << "pair (fwd unit " << p.fwd_unit << ", bwd unit " << p.bwd_unit << ")";
      ++compared;
      with_carry += plan.carry > 0;
    }
  }
  // The comparison ran: every plan had steady-state pairs, some carried ops, some paired blocks.
  EXPECT_GE(compared, static_cast<int>(2 * plans.size()));
  EXPECT_GT(with_carry, 0);
  EXPECT_GT(paired_blocks, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, IssueOrderAgreement,
                         ::testing::Values(Case{"gpt_tp2", "gpt", 2}, Case{"llama_tp2", "llama", 2},
                                           Case{"moe_tp2", "moe", 2}, Case{"gpt_3d_x2_z2", "gpt", 1, 2, 1, 2}),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace dhelix

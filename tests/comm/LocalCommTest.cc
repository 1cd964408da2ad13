// The local (threads-as-ranks) backend: every collective × dtype against closed forms
// (CollectiveChecks.h) for 1, 2, 4 ranks and a 2x2 dp×tp grid; plus failure behaviour: a
// throwing rank stops all ranks promptly, mismatched ops are named, abort names the last op.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "base/Clock.h"
#include "base/Error.h"
#include "comm/Work.h"
#include "comm/LocalBackend.h"
#include "comm/NcclGroup.h"
#include "comm/StagedGroup.h"
#include "CollectiveChecks.h"

namespace dhelix {
namespace {

using testing::CheckLog;

void run_checks(const LayoutConfig& cfg) {
  std::mutex mu;
  std::vector<std::string> failures;
  int checks = 0;
  run_local_ranks(cfg, [&](CommContext& ctx) {
    CheckLog log;
    testing::run_all_checks(log, ctx);
    std::lock_guard lk(mu);
    checks += log.checks;
    failures.insert(failures.end(), log.failures.begin(), log.failures.end());
  });
  EXPECT_GT(checks, 0);
  for (const auto& f : failures) ADD_FAILURE() << f;
}

// Work::wait_on's contract (Work.h), on WorkStates driven by this test (oracle: the contract):
// without a published device end it blocks until the op finished; with one it calls the published
// function with the stream it was given and returns, the op still pending; a failed op throws
// naming its error; neither within the timeout throws naming the op.
TEST(WorkWaitOn, BlocksUnlessTheGroupPublishedADeviceEnd) {
  auto state = [](double timeout_s) { return std::make_shared<WorkState>("all_reduce f32[4]", "dp", 3, 0, timeout_s); };
  {  // an op that ends on the host: wait_on returns once it completed
    auto st = state(10.0);
    Work w(st);
    std::thread t([st] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      st->complete();
    });
    w.wait_on(reinterpret_cast<void*>(0x1234));
    EXPECT_TRUE(w.is_completed());
    t.join();
  }
  {  // a device end published while the op runs: the stream is handed to it, the op still pending
    auto st = state(10.0);
    Work w(st);
    void* seen = nullptr;
    std::thread t([st, &seen] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      st->set_device_wait([&seen](void* s) { seen = s; });
    });
    w.wait_on(reinterpret_cast<void*>(0x1234));
    t.join();
    EXPECT_EQ(seen, reinterpret_cast<void*>(0x1234));
    EXPECT_FALSE(w.is_completed());
    st->complete();
    w.wait();
  }
  {  // a failure is thrown, naming it
    auto st = state(10.0);
    Work w(st);
    st->fail("peer 1 left");
    try {
      w.wait_on(nullptr);
      ADD_FAILURE() << "wait_on of a failed op returned";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("peer 1 left"), std::string::npos) << e.what();
    }
  }
  {  // neither: the timeout, naming the op
    auto st = state(0.05);
    Work w(st);
    try {
      w.wait_on(nullptr);
      ADD_FAILURE() << "wait_on of an op that never ended returned";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("all_reduce f32[4] on dp seq=3 did not complete"), std::string::npos)
          << e.what();
    }
  }
}

TEST(LocalComm, OneRank) { run_checks(LayoutConfig{}); }
TEST(LocalComm, TwoRanks) { run_checks(LayoutConfig{2, 1, 1, 1, 1}); }
TEST(LocalComm, FourRanksDpTp) { run_checks(LayoutConfig{2, 1, 1, 1, 2}); }
TEST(LocalComm, FourRanksTp) { run_checks(LayoutConfig{1, 1, 1, 1, 4}); }
TEST(LocalComm, EightRanksDpPpTp) { run_checks(LayoutConfig{2, 2, 1, 1, 2}); }

TEST(LocalComm, GroupNamesAndMembers) {
  run_local_ranks(LayoutConfig{2, 1, 1, 1, 2}, [](CommContext& ctx) {
    ProcessGroup& tp = ctx.group(GroupRole::kTP);
    ProcessGroup& dp = ctx.group(GroupRole::kDP);
    EXPECT_EQ(tp.name(), fmt::format("tp[{}/2]", ctx.rank() % 2));
    EXPECT_EQ(dp.name(), fmt::format("dp[{}/2]", ctx.rank() / 2));
    EXPECT_EQ(ctx.world().name(), fmt::format("world[{}/4]", ctx.rank()));
    // Closed form: the tp sum of world ranks is 2*base + 1 where base = rank - rank % 2.
    Tensor t = Tensor::empty({1}, DType::kI64);
    t.data<int64_t>()[0] = ctx.rank();
    tp.all_reduce(t).wait();
    EXPECT_EQ(t.data<int64_t>()[0], 2 * (ctx.rank() - ctx.rank() % 2) + 1);
  });
}

TEST(LocalComm, ThrowingRankStopsEveryRankAndPropagates) {
  double t0 = now_seconds();
  try {
    run_local_ranks(3, [](CommContext& ctx) {
      if (ctx.rank() == 1) throw ConfigError("boom on rank 1");
      Tensor t = Tensor::zeros({8});
      ctx.world().all_reduce(t).wait();  // never completes: rank 1 is gone
    });
    FAIL() << "run_local_ranks returned normally";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "boom on rank 1");  // the original exception, type preserved
  }
  EXPECT_LT(now_seconds() - t0, 10.0) << "peers were not woken by the failing rank";
}

TEST(LocalComm, MismatchedOpsAreNamed) {
  CommOptions opt;
  opt.timeout_s = 5;
  try {
    run_local_ranks(
        2,
        [](CommContext& ctx) {
          Tensor t = Tensor::zeros({ctx.rank() == 0 ? 4 : 8});
          ctx.world().all_reduce(t).wait();
        },
        opt);
    FAIL() << "mismatch not detected";
  } catch (const CommError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("ranks disagree"), std::string::npos) << msg;
    EXPECT_NE(msg.find("all_reduce f32[4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("all_reduce f32[8]"), std::string::npos) << msg;
  }
}

TEST(LocalComm, TimeoutNamesTheStuckOp) {
  CommOptions opt;
  opt.timeout_s = 0.3;
  try {
    run_local_ranks(
        2,
        [](CommContext& ctx) {
          if (ctx.rank() == 1) return;  // never joins
          Tensor t = Tensor::zeros({16}, DType::kBF16);
          ctx.world().all_reduce(t).wait();
        },
        opt);
    FAIL() << "no timeout";
  } catch (const CommError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("rank 0: all_reduce bf16[16] on world[0/2] seq=0"), std::string::npos) << msg;
  }
}

TEST(LocalComm, AbortNamesRankAndLastCollective) {
  try {
    run_local_ranks(2, [](CommContext& ctx) {
      Tensor t = Tensor::zeros({4});
      ctx.group(GroupRole::kDP).all_reduce(t).wait();
      if (ctx.rank() == 1) ctx.abort("loss is NaN");
    });
    FAIL() << "abort returned";
  } catch (const CommError& e) {
    EXPECT_STREQ(e.what(), "rank 1: loss is NaN; last collective: all_reduce f32[4] on dp[1/2] seq=0");
  }
}

TEST(LocalComm, ShapeErrorsAreCaughtAtIssue) {
  run_local_ranks(2, [](CommContext& ctx) {
    Tensor in = Tensor::zeros({3, 2}), bad = Tensor::zeros({5, 2});
    EXPECT_THROW((void)ctx.world().all_gather(in, bad), CommError);
    EXPECT_THROW((void)ctx.world().reduce_scatter(bad, in), CommError);
    EXPECT_THROW((void)ctx.world().all_to_all(in, in), CommError);
    EXPECT_THROW((void)ctx.world().send(in, ctx.rank()), CommError);
    EXPECT_EQ(ctx.world().next_seq(), 0);  // rejected ops take no sequence number
  });
}

}  // namespace
}  // namespace dhelix

#if !DHELIX_HAVE_CUDA
namespace dhelix {
namespace {
// A build without CUDA has no NCCL groups: asking for one is a DeviceError that says what to build
// (the GPU build's own tests are tests/kernels_cuda/test_nccl.cc).
TEST(NcclGroup, ABuildWithoutCudaSaysSo) {
  EXPECT_FALSE(nccl_available());
  try {
    (void)make_nccl_group("tp", 0, 1, 0, 10.0, NcclId{}, 0);
    ADD_FAILURE() << "make_nccl_group returned in a build without CUDA";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("DHELIX_ENABLE_CUDA=ON"), std::string::npos) << e.what();
  }
  // The bootstrap over a CPU group says the same, from rank 0 (which makes the id) before any
  // broadcast starts.
  run_local_ranks(1, [](CommContext& ctx) {
    try {
      (void)make_nccl_group_over(ctx.world(), 0);
      ADD_FAILURE() << "make_nccl_group_over returned in a build without CUDA";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("DHELIX_ENABLE_CUDA=ON"), std::string::npos) << e.what();
    }
    EXPECT_EQ(ctx.world().next_seq(), 0);
  });
}

// Staged groups (GPU tensors over a CPU group) likewise need a CUDA build; the message says so.
TEST(StagedGroup, ABuildWithoutCudaSaysSo) {
  run_local_ranks(1, [](CommContext& ctx) {
    try {
      (void)make_staged_group(ctx.world(), 0);
      ADD_FAILURE() << "make_staged_group returned in a build without CUDA";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find("DHELIX_ENABLE_CUDA=ON"), std::string::npos) << e.what();
    }
  });
}
}  // namespace
}  // namespace dhelix
#endif

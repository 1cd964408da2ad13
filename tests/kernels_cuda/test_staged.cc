// Staged process groups (comm/StagedGroup.h): several ranks as threads sharing the one GPU, their
// device tensors moved through host memory by a CPU group (the local backend). Oracles: the same
// collective run by the ranks' CPU group on the same values in host memory -- the staged group
// only copies the bytes to and from the GPU, so the results must be equal bit for bit; a send and
// a receive issued in either order meet; the emulated link's pacing as a lower bound (a sleep:
// never shorter); the producer-stream ordering; a peer that never arrives is the CPU group's
// timeout, naming the staged op; host tensors passed through. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstring>
#include <random>
#include <vector>

#include "CudaTest.h"
#include "base/Clock.h"
#include "comm/LocalBackend.h"
#include "comm/StagedGroup.h"
#include "tensor/Tensor.h"

namespace dhelix {
namespace {

Tensor host_values(const Shape& shape, DType dt, uint32_t seed) {
  Tensor h = Tensor::empty(shape, DType::kF32);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (int64_t i = 0; i < h.numel(); ++i) h.f32()[i] = u(rng);
  if (dt == DType::kF32) return h;
  Tensor b = Tensor::empty(shape, DType::kBF16);
  for (int64_t i = 0; i < h.numel(); ++i) b.data<uint16_t>()[i] = f32_to_bf16(h.f32()[i]);
  return b;
}

bool same_bytes(const Tensor& dev, const Tensor& host) {
  const Tensor h = dev.to(Device::host());
  return h.nbytes() == host.nbytes() && std::memcmp(h.raw(), host.raw(), h.nbytes()) == 0;
}

LayoutConfig dp_layout(int n) {
  LayoutConfig l;
  l.dp = n;
  return l;
}

// Every collective, fp32 and bf16, three ranks: the staged group (over the dp group) against the
// world group (the same three members) on host copies of the same values.
TEST(StagedGroup, EveryCollectiveEqualsTheCpuGroupsBitwise) {
  DHX_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  run_local_ranks(dp_layout(3), [&](CommContext& comm) {
    auto g = make_staged_group(comm.group(GroupRole::kDP), 0);
    EXPECT_EQ(g->transport(), "staged over threads");
    ProcessGroup& ref = comm.world();
    const int r = comm.rank(), n = 3;
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const Tensor x = host_values({6, 5}, dt, 100 + static_cast<uint32_t>(r));
      {  // all-reduce, in place
        Tensor d = x.to(gpu), h = x.clone();
        g->all_reduce(d).wait();
        ref.all_reduce(h).wait();
        EXPECT_TRUE(same_bytes(d, h)) << "all_reduce " << dtype_name(dt);
      }
      {
        Tensor d = Tensor::empty({6 * n, 5}, dt, nullptr, gpu), h = Tensor::empty({6 * n, 5}, dt);
        g->all_gather(x.to(gpu), d).wait();
        ref.all_gather(x, h).wait();
        EXPECT_TRUE(same_bytes(d, h)) << "all_gather " << dtype_name(dt);
      }
      {
        const Tensor y = host_values({6 * n, 5}, dt, 200 + static_cast<uint32_t>(r));
        Tensor d = Tensor::empty({6, 5}, dt, nullptr, gpu), h = Tensor::empty({6, 5}, dt);
        g->reduce_scatter(y.to(gpu), d).wait();
        ref.reduce_scatter(y, h).wait();
        EXPECT_TRUE(same_bytes(d, h)) << "reduce_scatter " << dtype_name(dt);
        d = Tensor::empty({6 * n, 5}, dt, nullptr, gpu), h = Tensor::empty({6 * n, 5}, dt);
        g->all_to_all(y.to(gpu), d).wait();
        ref.all_to_all(y, h).wait();
        EXPECT_TRUE(same_bytes(d, h)) << "all_to_all " << dtype_name(dt);
      }
      {  // uneven rows: rank r sends j + r + 1 rows to rank j
        std::vector<int64_t> send(3), recv(3);
        int64_t rows_in = 0, rows_out = 0;
        for (int j = 0; j < n; ++j) send[size_t(j)] = j + r + 1, rows_in += j + r + 1;
        for (int j = 0; j < n; ++j) recv[size_t(j)] = r + j + 1, rows_out += r + j + 1;
        const Tensor y = host_values({rows_in, 5}, dt, 300 + static_cast<uint32_t>(r));
        Tensor d = Tensor::empty({rows_out, 5}, dt, nullptr, gpu), h = Tensor::empty({rows_out, 5}, dt);
        g->all_to_all_v(y.to(gpu), send, d, recv).wait();
        ref.all_to_all_v(y, send, h, recv).wait();
        EXPECT_TRUE(same_bytes(d, h)) << "all_to_all_v " << dtype_name(dt);
      }
      {
        Tensor d = Tensor::empty({6, 5}, dt, nullptr, gpu), h = Tensor::empty({6, 5}, dt);
        g->ring_shift(x.to(gpu), d).wait();
        ref.ring_shift(x, h).wait();
        EXPECT_TRUE(same_bytes(d, h)) << "ring_shift " << dtype_name(dt);
        d = x.to(gpu), h = x.clone();
        g->broadcast(d, 1).wait();
        ref.broadcast(h, 1).wait();
        EXPECT_TRUE(same_bytes(d, h)) << "broadcast " << dtype_name(dt);
      }
    }
    g->barrier();
  });
}

// Ranks 0 and 1 exchange tensors, rank 0 issuing its receive first and rank 1 its send first: posted
// point-to-point ops meet in either order. Oracle: the peer's values.
TEST(StagedGroup, SendsAndReceivesMeetInEitherOrder) {
  DHX_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  run_local_ranks(dp_layout(2), [&](CommContext& comm) {
    auto g = make_staged_group(comm.group(GroupRole::kDP), 0);
    const int r = comm.rank(), peer = 1 - r;
    const Tensor mine = host_values({1000}, DType::kF32, 7 + static_cast<uint32_t>(r));
    const Tensor theirs = host_values({1000}, DType::kF32, 7 + static_cast<uint32_t>(peer));
    Tensor in = Tensor::empty({1000}, DType::kF32, nullptr, gpu), out = mine.to(gpu);
    Work a, b;
    if (r == 0) a = g->recv(in, peer, 3), b = g->send(out, peer, 3);
    else b = g->send(out, peer, 3), a = g->recv(in, peer, 3);
    a.wait();
    b.wait();
    EXPECT_TRUE(same_bytes(in, theirs));
  });
}

// An all-gather of 4 MiB per rank over 2 ranks sends (n - 1) x 4 MiB per rank: at 100 MB/s at
// least 4 MiB / 1e8 s = 41.9 ms on the emulated link (a lower bound: the op sleeps out the rest).
constexpr double kLinkBytesPerS = 1e8;
constexpr double kAllGatherLinkS = double(4 << 20) / kLinkBytesPerS;
// A staged group of the dp ranks with that link, and the all-gather's input and output.
struct PacedAllGather {
  std::unique_ptr<ProcessGroup> g;
  Tensor in, out;
  explicit PacedAllGather(CommContext& comm) {
    StagedOptions o;
    o.link_bytes_per_s = kLinkBytesPerS;
    g = make_staged_group(comm.group(GroupRole::kDP), 0, o);
    in = host_values({1 << 20}, DType::kF32, 1).to(Device::cuda(0));
    out = Tensor::empty({2 << 20}, DType::kF32, nullptr, Device::cuda(0));
  }
};

TEST(StagedGroup, TheEmulatedLinkPacesEachOp) {
  DHX_REQUIRE_GPU();
  run_local_ranks(dp_layout(2), [&](CommContext& comm) {
    PacedAllGather op(comm);
    const double t0 = now_seconds();
    op.g->all_gather(op.in, op.out).wait();
    EXPECT_GE(now_seconds() - t0, kAllGatherLinkS);
  });
}

// The emulated link carries an op's bytes only once its input exists: the input written on the
// producer stream behind a 60 ms spin, then the all-gather above. Oracle: the spin and the link in
// sequence, at least 60 + 41.9 ms from the issue; a link timed from the op's issue would have run
// under the spin (about 60 ms in all).
TEST(StagedGroup, TheLinkStartsWhenTheInputExists) {
  DHX_REQUIRE_GPU();
  run_local_ranks(dp_layout(2), [&](CommContext& comm) {
    PacedAllGather op(comm);
    cudaStream_t producer = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
    staged_set_producer_stream(*op.g, producer);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const double t0 = now_seconds();
    cuda::test::hold_stream(producer, 60000);
    ASSERT_EQ(cudaMemsetAsync(op.in.raw(), 0, op.in.nbytes(), producer), cudaSuccess);
    op.g->all_gather(op.in, op.out).wait();
    EXPECT_GE(now_seconds() - t0, 0.060 + kAllGatherLinkS);
    staged_set_producer_stream(*op.g, nullptr);
    cudaStreamDestroy(producer);
  });
}

// The producer stream: a memset of zeros queued behind a 50 ms spin on the producer stream must be
// what the all-reduce reads (without the event the copy stream would stage the old values).
TEST(StagedGroup, OpsFollowTheProducerStream) {
  DHX_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  run_local_ranks(dp_layout(2), [&](CommContext& comm) {
    auto g = make_staged_group(comm.group(GroupRole::kDP), 0);
    cudaStream_t producer = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
    staged_set_producer_stream(*g, producer);
    Tensor t = host_values({1 << 20}, DType::kF32, 3).to(gpu);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cuda::test::hold_stream(producer, 50000);
    ASSERT_EQ(cudaMemsetAsync(t.raw(), 0, t.nbytes(), producer), cudaSuccess);
    g->all_reduce(t).wait();
    const Tensor h = t.to(Device::host());
    double sum = 0;
    for (int64_t i = 0; i < h.numel(); ++i) sum += std::abs(h.f32()[i]);
    EXPECT_EQ(sum, 0.0) << "the all-reduce staged its input before the producer's memset";
    staged_set_producer_stream(*g, nullptr);
    cudaStreamDestroy(producer);
  });
}

// A receive into device memory the producer stream still writes: rank 1's destination is zeroed
// behind a 200 ms spin on its producer stream when it posts the receive, and the copy of the
// arrived bytes into it must follow that memset (the receive's producer point, waited for on the
// copy stream before the copy-in). Oracle: the destination holds rank 0's values; copied in before
// the memset, it would hold zeros. Rank 0 sends at once, so the bytes arrive during the spin.
TEST(StagedGroup, AReceiveLandsAfterTheProducersWrites) {
  DHX_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  run_local_ranks(dp_layout(2), [&](CommContext& comm) {
    auto g = make_staged_group(comm.group(GroupRole::kDP), 0);
    const Tensor sent = host_values({1 << 18}, DType::kF32, 11);
    if (comm.rank() == 0) {
      g->send(sent.to(gpu), 1, 5).wait();
      return;
    }
    cudaStream_t producer = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
    staged_set_producer_stream(*g, producer);
    Tensor t = host_values({1 << 18}, DType::kF32, 12).to(gpu);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cuda::test::hold_stream(producer, 200000);
    ASSERT_EQ(cudaMemsetAsync(t.raw(), 0, t.nbytes(), producer), cudaSuccess);
    g->recv(t, 0, 5).wait();
    ASSERT_EQ(cudaStreamSynchronize(producer), cudaSuccess);
    EXPECT_TRUE(same_bytes(t, sent)) << "the received bytes were copied in before the producer's memset";
    staged_set_producer_stream(*g, nullptr);
    cudaStreamDestroy(producer);
  });
}

// A peer that never issues its half: the op fails within the groups' timeout (1 s here), naming
// the staged op's group and sequence number and that it did not complete (the CPU group's timeout,
// or the staged op's own wait: both bound it by comm.timeout_s). Both ranks first pass a barrier
// on the CPU group, so its next op is seq=1 and "seq=0" can only be the staged op's (the two
// groups share the name dp[0/2]; a review, 2026-11-29).
TEST(StagedGroup, APeerThatNeverArrivesTimesOutNamingTheOp) {
  DHX_REQUIRE_GPU();
  CommOptions o;
  o.timeout_s = 1.0;
  run_local_ranks(
      dp_layout(2),
      [&](CommContext& comm) {
        comm.group(GroupRole::kDP).barrier();
        if (comm.rank() == 1) return;  // never issues
        auto g = make_staged_group(comm.group(GroupRole::kDP), 0);
        Tensor d = host_values({16}, DType::kF32, 1).to(Device::cuda(0));
        try {
          g->all_reduce(d).wait();
          ADD_FAILURE() << "the all-reduce completed without its peer";
        } catch (const CommError& e) {
          const std::string m = e.what();
          EXPECT_NE(m.find("dp[0/2] seq=0"), std::string::npos) << m;
          EXPECT_NE(m.find("did not complete within"), std::string::npos) << m;
        }
      },
      o);
}

// Host tensors pass to the CPU group as they are, in the group's order with the staged ops. Oracle:
// the world group's all-reduce of the same host values. A tensor of another GPU is refused at
// issue, naming the group (nothing numbered).
TEST(StagedGroup, HostTensorsPassThrough) {
  DHX_REQUIRE_GPU();
  run_local_ranks(dp_layout(2), [&](CommContext& comm) {
    auto g = make_staged_group(comm.group(GroupRole::kDP), 0);
    const Tensor x = host_values({64}, DType::kF32, 9 + static_cast<uint32_t>(comm.rank()));
    Tensor h = x.clone(), ref = x.clone(), d = x.to(Device::cuda(0));
    Work a = g->all_reduce(d);  // staged, then the host one behind it
    g->all_reduce(h).wait();
    a.wait();
    comm.world().all_reduce(ref).wait();
    EXPECT_EQ(0, std::memcmp(h.raw(), ref.raw(), h.nbytes()));
    EXPECT_TRUE(same_bytes(d, ref));
    Tensor out = Tensor::empty({128}, DType::kF32, nullptr, Device::cuda(0));
    try {
      g->all_gather(h, out).wait();
      ADD_FAILURE() << "an all-gather from the host into the GPU was issued";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("input on cpu but output on cuda:0"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace dhelix

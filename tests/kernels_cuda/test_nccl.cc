// NCCL process groups (comm/NcclGroup.h) at world size 1 -- what one GPU can run (NCCL refuses
// two ranks on one device): the API path, the group's own stream, the ordering after a producer
// stream, and the refusal of host tensors. Oracle: at one rank every collective is the identity
// (an all-reduce, broadcast, all-gather, reduce-scatter, all-to-all and ring step each leave the
// data as it was, bitwise: nothing is added to it), as the local backend gives at world size 1;
// every output that is not the input is filled with 0xFF bytes first, so an op that wrote nothing
// fails (at one rank NCCL leaves an in-place op's data untouched: those checks show only that the
// call completes). Not here: several ranks (issue 39's multi-rank runs on one GPU use a transport of
// their own).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CudaTest.h"
#include "comm/LocalBackend.h"
#include "comm/NcclGroup.h"
#include "runtime/StepBuilder.h"
#include "tensor/Tensor.h"

namespace dhelix {
namespace {

Tensor host_random(const Shape& shape, DType dt, uint32_t seed) {
  Tensor h = Tensor::empty(shape, DType::kF32);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (int64_t i = 0; i < h.numel(); ++i) h.f32()[i] = u(rng);
  if (dt == DType::kF32) return h;
  Tensor b = Tensor::empty(shape, DType::kBF16);
  for (int64_t i = 0; i < h.numel(); ++i) {  // truncate to bf16 (any bit pattern will do)
    uint32_t bits;
    std::memcpy(&bits, &h.f32()[i], 4);
    b.data<uint16_t>()[i] = static_cast<uint16_t>(bits >> 16);
  }
  return b;
}

// An output on the GPU filled with 0xFF bytes (a NaN in both float types): an op that does not write
// it leaves them.
Tensor sentinel(const Shape& shape, DType dt) {
  Tensor o = Tensor::empty(shape, dt, nullptr, Device::cuda(0));
  EXPECT_EQ(cudaMemset(o.raw(), 0xFF, o.nbytes()), cudaSuccess);
  return o;
}

// The producer tests' setting: a one-rank "dp" NCCL group whose ops follow a producer stream of the
// test's own, and 2^20 random fp32 values on the GPU, all settled before the test queues work behind
// the producer (hold_stream, then a write); the zeros that write leaves, summed from the host.
struct HeldProducer {
  std::unique_ptr<ProcessGroup> g;
  cudaStream_t producer = nullptr;
  Tensor t;
  HeldProducer(double timeout_s, uint32_t seed) : g(make_nccl_group("dp", 0, 1, 0, timeout_s, nccl_unique_id(), 0)) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
    nccl_set_producer_stream(*g, producer);
    t = host_random({1 << 20}, DType::kF32, seed).to(Device::cuda(0));
  }
  // The producer held `spin_us`, then t zeroed on it: what an op issued now must wait for.
  void hold_then_zero(int spin_us) {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cuda::test::hold_stream(producer, spin_us);
    EXPECT_EQ(cudaMemsetAsync(t.raw(), 0, t.nbytes(), producer), cudaSuccess);
  }
  ~HeldProducer() {
    if (g) nccl_set_producer_stream(*g, nullptr);
    cudaStreamSynchronize(producer);
    cudaStreamDestroy(producer);
  }
  HeldProducer(const HeldProducer&) = delete;
  HeldProducer& operator=(const HeldProducer&) = delete;
};

double abs_sum(const Tensor& d) {
  const Tensor h = d.to(Device::host());
  double sum = 0;
  for (int64_t i = 0; i < h.numel(); ++i) sum += std::abs(h.f32()[i]);
  return sum;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::host()), hb = b.to(Device::host());
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

// comm.nccl_max_ctas: a communicator configured with a cap of one CTA forms and still moves the
// bytes. Oracle: at world size 1 an all-reduce and an all-gather are the identity, bit for bit. What
// this covers is only that NCCL accepts the configuration: at world size 1 NCCL takes its one-rank
// path, where the cap never applies, so neither the capped kernels' results nor whether the cap
// frees SMs for the other strand is tested here (both need two GPUs). A negative cap is a
// ConfigError naming it.
TEST(NcclGroup, ACappedCommunicatorStillMovesTheBytes) {
  DHX_REQUIRE_GPU();
  ASSERT_TRUE(nccl_available());
  const Device gpu = Device::cuda(0);
  EXPECT_THROW(make_nccl_group("tp", 0, 1, 0, 60.0, nccl_unique_id(), 0, -1), ConfigError);
  auto g = make_nccl_group("tp", 0, 1, 0, 60.0, nccl_unique_id(), 0, 1);
  const Tensor x = host_random({1024, 8}, DType::kBF16, 9);
  Tensor t = x.to(gpu);
  g->all_reduce(t).wait();
  EXPECT_TRUE(same_bytes(t, x));
  Tensor out = Tensor::empty({1024, 8}, DType::kBF16, nullptr, gpu);
  g->all_gather(t, out).wait();
  EXPECT_TRUE(same_bytes(out, x));
}

TEST(NcclGroup, EveryCollectiveAtWorldSizeOneIsTheIdentity) {
  DHX_REQUIRE_GPU();
  ASSERT_TRUE(nccl_available());
  const Device gpu = Device::cuda(0);
  auto g = make_nccl_group("tp", 0, 1, 0, 60.0, nccl_unique_id(), 0);
  EXPECT_EQ(g->transport(), "nccl");
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Tensor x = host_random({64, 8}, dt, 7);
    Tensor t = x.to(gpu);
    g->all_reduce(t).wait();
    EXPECT_TRUE(same_bytes(t, x)) << "all_reduce " << dtype_name(dt);
    g->broadcast(t, 0).wait();
    EXPECT_TRUE(same_bytes(t, x)) << "broadcast " << dtype_name(dt);
    Tensor out = sentinel({64, 8}, dt);
    g->all_gather(t, out).wait();
    EXPECT_TRUE(same_bytes(out, x)) << "all_gather " << dtype_name(dt);
    out = sentinel({64, 8}, dt);
    g->reduce_scatter(t, out).wait();
    EXPECT_TRUE(same_bytes(out, x)) << "reduce_scatter " << dtype_name(dt);
    out = sentinel({64, 8}, dt);
    g->all_to_all(t, out).wait();
    EXPECT_TRUE(same_bytes(out, x)) << "all_to_all " << dtype_name(dt);
    out = sentinel({64, 8}, dt);
    g->all_to_all_v(t, {64}, out, {64}).wait();
    EXPECT_TRUE(same_bytes(out, x)) << "all_to_all_v " << dtype_name(dt);
    out = sentinel({64, 8}, dt);
    g->ring_shift(t, out).wait();
    EXPECT_TRUE(same_bytes(out, x)) << "ring_shift " << dtype_name(dt);
  }
  g->barrier();
  EXPECT_EQ(g->next_seq(), 2 * 7 + 1);
  // Host tensors are refused where the op is issued, naming the group.
  Tensor host = Tensor::zeros({4});
  EXPECT_THROW(g->all_reduce(host).wait(), CommError);
}

// The group's stream runs at the device's highest priority (NcclGroup.cc: a collective's blocks are
// scheduled before queued compute blocks). Oracle: cudaDeviceGetStreamPriorityRange's greatest.
TEST(NcclGroup, ItsStreamHasTheHighestPriority) {
  DHX_REQUIRE_GPU();
  ASSERT_TRUE(nccl_available());
  auto g = make_nccl_group("tp", 0, 1, 0, 60.0, nccl_unique_id(), 0);
  int least = 0, greatest = 0, got = 1;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  ASSERT_EQ(cudaStreamGetPriority(static_cast<cudaStream_t>(nccl_stream(*g)), &got), cudaSuccess);
  EXPECT_EQ(got, greatest) << "priorities run from " << least << " (least) to " << greatest;
}

// The producer stream: an op issued after a kernel on the compute stream sees that kernel's write.
// A memset of zeros is queued behind a 50 ms spin on the producer stream; the all-gather (which,
// unlike an in-place op at one rank, copies its input into an output filled with 0xFF bytes) must
// deliver the zeros: without the event the group's stream would copy the old values.
TEST(NcclGroup, OpsFollowTheProducerStream) {
  DHX_REQUIRE_GPU();
  ASSERT_TRUE(nccl_available());
  HeldProducer c(60.0, 3);
  Tensor out = sentinel(c.t.shape(), DType::kF32);
  c.hold_then_zero(50000);
  c.g->all_gather(c.t, out).wait();
  EXPECT_EQ(abs_sum(out), 0.0) << "the all-gather copied t before the producer's memset (or wrote nothing)";
}

// Work::wait_on: a consumer stream ordered after an NCCL op on the GPU, the host not waiting. The
// producer stream is held by a 200 ms spin (hold_stream), then writes zeros into t; the all-reduce
// follows it (the producer point), and the consumer stream waits on the op's end event (wait_on)
// and copies t out. Oracles: wait_on returned while the op was still pending (the host was not
// held; the comm thread enqueues and publishes in tens of microseconds, the spin takes 200 ms), and
// the consumer's copy holds the zeros (without the device wait it would copy t's random values
// from before the memset).
TEST(NcclGroup, WaitOnOrdersAStreamAfterTheOpWithoutTheHost) {
  DHX_REQUIRE_GPU();
  ASSERT_TRUE(nccl_available());
  HeldProducer c(60.0, 5);
  Tensor& t = c.t;
  cudaStream_t consumer = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking), cudaSuccess);
  c.hold_then_zero(200000);  // 200 ms: longer than a first launch in a fresh process takes
  Work w = c.g->all_reduce(t);
  w.wait_on(consumer);
  EXPECT_FALSE(w.is_completed()) << "wait_on returned only after the op finished: the host was held";
  std::vector<float> out(static_cast<size_t>(t.numel()));
  ASSERT_EQ(cudaMemcpyAsync(out.data(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, consumer), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
  double sum = 0;
  for (float v : out) sum += std::abs(v);
  EXPECT_EQ(sum, 0.0) << "the consumer stream read t before the all-reduce (after the producer's memset) ended";
  w.wait();
  cudaStreamDestroy(consumer);
}

// A group destroyed with an op still posted (issued behind a 200 ms spin on the producer stream,
// never waited for) settles it first: the op completes with its result, instead of the
// communicator being aborted under its kernel and its Work left pending (a later wait() would block
// for the group's whole timeout). Oracle: the Work is complete when the destructor returns, its
// wait() does not throw, and t holds the all-reduce's result at world size 1 (the producer's zeros).
TEST(NcclGroup, DestroyingAGroupSettlesItsPostedOps) {
  DHX_REQUIRE_GPU();
  ASSERT_TRUE(nccl_available());
  HeldProducer c(60.0, 6);
  c.hold_then_zero(200000);
  Work w = c.g->all_reduce(c.t);
  EXPECT_FALSE(w.is_completed()) << "the op finished before the producer's 200 ms spin";
  c.g.reset();
  EXPECT_TRUE(w.is_completed()) << "the group was destroyed and its posted op left pending";
  EXPECT_NO_THROW(w.wait());
  ASSERT_EQ(cudaStreamSynchronize(c.producer), cudaSuccess);
  EXPECT_EQ(abs_sum(c.t), 0.0) << "t does not hold the all-reduce of the producer's zeros";
}

// The bootstrap: rank 0 of a CPU group makes the id and broadcasts it. Oracle: the 128 bytes rank 0
// made, which every member must hold after the call (three ranks as threads over the local
// backend: no GPU is needed to exchange an id, but NCCL's library is, found where the device
// script puts it).
TEST(NcclGroup, TheIdReachesEveryMemberOverTheHostGroup) {
  DHX_REQUIRE_GPU();
  ASSERT_TRUE(nccl_available());
  std::vector<NcclId> ids(3);
  run_local_ranks(3, [&](CommContext& comm) { ids[static_cast<size_t>(comm.rank())] = nccl_id_over(comm.world()); });
  EXPECT_NE(ids[0].bytes, NcclId{}.bytes) << "rank 0's id is all zeros";
  EXPECT_EQ(ids[1].bytes, ids[0].bytes);
  EXPECT_EQ(ids[2].bytes, ids[0].bytes);
}

// make_nccl_group_over at world size 1 (the most one GPU allows): the group takes the host group's
// role, rank and size, and its all-reduce is the identity (the oracle of the first test).
TEST(NcclGroup, AGroupBootstrappedOverTheHostGroupWorks) {
  DHX_REQUIRE_GPU();
  ASSERT_TRUE(nccl_available());
  run_local_ranks(1, [&](CommContext& comm) {
    auto g = make_nccl_group_over(comm.world(), 0);
    EXPECT_EQ(g->name(), "world[0/1]");
    EXPECT_EQ(g->transport(), "nccl");
    const Tensor x = host_random({128}, DType::kF32, 5);
    Tensor t = x.to(Device::cuda(0));
    g->all_reduce(t).wait();
    EXPECT_TRUE(same_bytes(t, x));
    Tensor out = sentinel({128}, DType::kF32);
    g->all_gather(t, out).wait();
    EXPECT_TRUE(same_bytes(out, x)) << "the all-gather wrote nothing, or other bytes";
  });
}

// place_groups_on_device with comm.gpu_transport = nccl (DeviceGroupOptions::nccl): a step's CPU
// group is wrapped in an NCCL group bootstrapped over it. (At world size 1 a step has no group to
// wrap -- StepGroups keeps the roles of more than one rank -- so a trainer run cannot get here: a
// one-rank group is set by hand.) Oracles: the group placed is an NCCL one, made once and
// owned by the caller, with the host group's name; an all-gather through it into an output of 0xFF
// bytes returns the input's bytes.
TEST(NcclGroup, PlacingAStepsGroupsWrapsThemInNccl) {
  DHX_REQUIRE_GPU();
  ASSERT_TRUE(nccl_available());
  run_local_ranks(1, [&](CommContext& comm) {
    StepGroups host;
    host.set(GroupRole::kDP, &comm.world());
    std::vector<std::unique_ptr<ProcessGroup>> owned;
    const StepGroups g = place_groups_on_device(host, Device::cuda(0), DeviceGroupOptions{true, 0, 0}, owned);
    ProcessGroup* dp = g.get(GroupRole::kDP);
    ASSERT_NE(dp, nullptr);
    EXPECT_EQ(dp->transport(), "nccl");
    EXPECT_EQ(dp->name(), comm.world().name());
    EXPECT_EQ(owned.size(), 1u);
    const Tensor x = host_random({256, 4}, DType::kBF16, 12);
    Tensor out = sentinel({256, 4}, DType::kBF16);
    dp->all_gather(x.to(Device::cuda(0)), out).wait();
    EXPECT_TRUE(same_bytes(out, x));
  });
}

// The watchdog (NcclGroup.cc, poll): an op not finished within the group's timeout aborts the
// communicator and fails, naming the op (group and sequence number); every later op fails at once,
// naming the abort. One rank cannot stall NCCL itself, so the op is held by its producer: a 3 s
// spin on the producer stream, the group's timeout 0.5 s. Oracles: the first wait throws naming
// "dp[0/1] seq=0" (the watchdog's failure or the wait's own timeout, whichever comes first: both
// name the op); once the abort has had time to run (it may wait for NCCL's stream, behind the spin),
// a new op fails naming it; the group is then destroyed without hanging.
TEST(NcclGroup, TheWatchdogAbortsAStalledOpAndLaterOpsFail) {
  DHX_REQUIRE_GPU();
  ASSERT_TRUE(nccl_available());
  HeldProducer c(0.5, 8);
  c.hold_then_zero(3000000);
  Work w = c.g->all_reduce(c.t);
  nccl_set_producer_stream(*c.g, nullptr);
  try {
    w.wait();
    ADD_FAILURE() << "an op held 3 s behind its producer finished within the group's 0.5 s timeout";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("dp[0/1] seq=0"), std::string::npos) << e.what();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(4000));
  try {
    c.g->all_reduce(c.t).wait();
    ADD_FAILURE() << "an op after the watchdog's abort ran";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
  }
  ASSERT_EQ(cudaStreamSynchronize(c.producer), cudaSuccess);
  c.g.reset();  // (without hanging)
}

}  // namespace
}  // namespace dhelix

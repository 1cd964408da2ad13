// SM partitions (kernels/cuda/SmPartition.h): the GPU split into green contexts, one per rank thread.
// Oracles: the hardware's own record of where each block ran (%smid, sm_ids_of_blocks) -- a
// partition's kernels reach at most its SM count, two partitions' kernels run on disjoint SMs, and
// the same kernel without a partition reaches more SMs than one partition has (so the first two
// checks can fail); the CPU group's collective on the same values for staged collectives between
// ranks in different partitions (the staging only copies bytes, so bitwise); bad input by value.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "CudaTest.h"
#include "comm/LocalBackend.h"
#include "comm/StagedGroup.h"
#include "kernels/cuda/Gemm.h"
#include "kernels/cuda/SmPartition.h"
#include "tensor/Tensor.h"

namespace dhelix {
namespace {

using cuda::SmPartition;
using cuda::SmPartitionScope;

// The distinct SMs that `blocks` spinning blocks reached, launched on a new stream of the calling
// thread's current context (its partition, if it entered one). 128 threads a block, 200 us of spin:
// the blocks are resident together, so an unconstrained launch spreads over the whole device.
std::set<int32_t> sms_reached(int blocks) {
  cudaStream_t s = nullptr;
  DHX_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int32_t* d = nullptr;
  DHX_CUDA(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(int32_t) * static_cast<size_t>(blocks)));
  DHX_CUDA(cudaMemsetAsync(d, 0xFF, sizeof(int32_t) * static_cast<size_t>(blocks), s));
  cuda::sm_ids_of_blocks(d, blocks, 128, 200, s);
  std::vector<int32_t> h(static_cast<size_t>(blocks));
  DHX_CUDA(cudaMemcpyAsync(h.data(), d, sizeof(int32_t) * h.size(), cudaMemcpyDeviceToHost, s));
  DHX_CUDA(cudaStreamSynchronize(s));
  DHX_CUDA(cudaFree(d));
  DHX_CUDA(cudaStreamDestroy(s));
  for (int32_t id : h) EXPECT_GE(id, 0) << "a block did not record its SM";
  return {h.begin(), h.end()};
}

TEST(CudaSmPartition, KernelsOfAPartitionStayOnItsSms) {
  DHX_REQUIRE_GPU();
  const int total = cuda::device_info(0).sms;
  const int blocks = 8 * total;
  const std::set<int32_t> whole = sms_reached(blocks);
  auto parts = SmPartition::split(0, 2);
  ASSERT_EQ(parts.size(), 2u);
  std::printf("[ info ] %d SMs; partitions of %d and %d; the whole device's launch reached %zu\n", total,
              parts[0]->sms(), parts[1]->sms(), whole.size());
  EXPECT_LE(parts[0]->sms() + parts[1]->sms(), total);
  // Without the partition the same launch reaches more SMs than a partition has: the bounds below
  // are not met by every launch anyway.
  EXPECT_GT(static_cast<int>(whole.size()), parts[0]->sms());
  std::set<int32_t> reached[2];
  std::thread t[2];
  for (int k = 0; k < 2; ++k)
    t[k] = std::thread([&, k] {
      try {  // an exception leaving a std::thread would end the whole test binary
        SmPartitionScope in(parts[static_cast<size_t>(k)].get());
        reached[k] = sms_reached(blocks);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "partition " << k << ": " << e.what();
      }
    });
  for (auto& th : t) th.join();
  for (int k = 0; k < 2; ++k) {
    std::printf("[ info ] partition %d (%d SMs): its launch reached %zu\n", k, parts[static_cast<size_t>(k)]->sms(),
                reached[k].size());
    EXPECT_LE(static_cast<int>(reached[k].size()), parts[static_cast<size_t>(k)]->sms()) << "partition " << k;
    EXPECT_GE(reached[k].size(), 1u);
  }
  for (int32_t id : reached[0]) EXPECT_EQ(reached[1].count(id), 0u) << "SM " << id << " in both partitions";
}

// The bench's path (bench/gpu_si.cc --sm-split ranks): ranks as threads, each in its own partition,
// device tensors allocated and staged there, the staged group's comm thread copying on the ranks'
// streams. Oracle: the CPU group's all-reduce and all-gather of the same values, bitwise.
TEST(CudaSmPartition, StagedCollectivesBetweenPartitionsEqualTheCpuGroupsBitwise) {
  DHX_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  LayoutConfig lay;
  lay.dp = 2;
  auto parts = SmPartition::split(0, 2);
  run_local_ranks(lay, [&](CommContext& comm) {
    SmPartitionScope in(parts[static_cast<size_t>(comm.rank())].get());
    auto g = make_staged_group(comm.group(GroupRole::kDP), 0);
    ProcessGroup& ref = comm.world();
    Tensor x = Tensor::empty({257, 3}, DType::kF32);
    for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = 0.25f * static_cast<float>(i % 97) - 3.f + comm.rank();
    Tensor d = x.to(gpu), h = x.clone();
    g->all_reduce(d).wait();
    ref.all_reduce(h).wait();
    const Tensor back = d.to(Device::host());
    EXPECT_EQ(std::memcmp(back.raw(), h.raw(), h.nbytes()), 0) << "all_reduce";
    Tensor dg = Tensor::empty({514, 3}, DType::kF32, nullptr, gpu), hg = Tensor::empty({514, 3}, DType::kF32);
    EXPECT_EQ(cudaMemset(dg.raw(), 0xFF, dg.nbytes()), cudaSuccess);  // (an all-gather that writes nothing fails)
    g->all_gather(x.to(gpu), dg).wait();
    ref.all_gather(x, hg).wait();
    const Tensor bg = dg.to(Device::host());
    EXPECT_EQ(std::memcmp(bg.raw(), hg.raw(), hg.nbytes()), 0) << "all_gather";
    g->barrier();
  });
}

// cuBLASLt inside a partition plans for the partition's SMs (Blas::sm_count_target), outside for
// the device's (0), and its GEMM is still exact. Oracle: small integer operands (|x|, |w| <= 2, K =
// 64), whose products and sums (|sum| <= 256) are exact in fp32 and in bf16 (integers up to 256
// have 8 significant bits), so any algorithm must give exactly the CPU's integer product.
TEST(CudaSmPartition, BlasInsideAPartitionPlansForItsSmsAndStaysExact) {
  DHX_REQUIRE_GPU();
  const int64_t N = 48, I = 64, O = 40;
  std::vector<float> x(N * I), w(O * I);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i * 7 % 5) - 2);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(static_cast<int>(i * 3 % 5) - 2);
  std::vector<float> want(N * O, 0.f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < I; ++i) want[n * O + o] += x[n * I + i] * w[o * I + i];
  {
    cuda::Blas whole(0);
    EXPECT_EQ(whole.sm_count_target(), 0);
  }
  auto parts = SmPartition::split(0, 2);
  std::thread t([&] {
    try {  // an exception leaving a std::thread would end the whole test binary
      SmPartitionScope in(parts[0].get());
      cuda::Blas blas(0);
      EXPECT_EQ(blas.sm_count_target(), parts[0]->sms());
      EXPECT_EQ(cuda::current_sm_count(0), parts[0]->sms());
      cudaStream_t s = nullptr;
      DHX_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      {
        cuda::test::DevBuf<cuda::bf16> dx(cuda::test::to_bf16(x)), dw(cuda::test::to_bf16(w)), dy(N * O);
        dy.poison();
        blas.linear_fwd(dx.get(), dw.get(), nullptr, dy.get(), N, I, O, s);
        DHX_CUDA(cudaStreamSynchronize(s));
        const std::vector<float> got = cuda::test::to_f32(dy.download());
        for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
      }
      DHX_CUDA(cudaStreamDestroy(s));
    } catch (const std::exception& e) {
      ADD_FAILURE() << "in the partition: " << e.what();
    }
  });
  t.join();
  EXPECT_EQ(cuda::current_sm_count(0), cuda::device_info(0).sms);
}

// Bad input: no parts, or more parts than the device has SM groups -- DeviceError / ConfigError naming
// the counts (never a partition smaller than the driver allows).
TEST(CudaSmPartition, ImpossibleSplitsAreRefusedByValue) {
  DHX_REQUIRE_GPU();
  EXPECT_THROW(SmPartition::split(0, 0), ConfigError);
  const int total = cuda::device_info(0).sms;
  try {
    SmPartition::split(0, total);
    FAIL() << "a split into " << total << " parts of one SM each was accepted";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(total) + " SMs"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dhelix

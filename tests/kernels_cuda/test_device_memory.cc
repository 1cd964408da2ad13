// Tensors on the GPU through the caching device allocator (tensor/DeviceMemory.h). Oracles: a
// host -> device -> host round trip returns the same bits; the trackers count exactly the bytes
// asked for; a freed block is reused (the pool's reserved bytes do not grow when the same sizes are
// allocated again); without a GPU, asking for one is a DeviceError that says so; pinned host
// tensors (below).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "CudaTest.h"
#include "tensor/DeviceMemory.h"

namespace dhelix::cuda::test {
namespace {

TEST(DeviceMemory, WithoutAGpuAskingForOneSaysSo) {
  if (probe().devices > 0) GTEST_SKIP() << "this machine has a GPU";
  try {
    Tensor::empty({4}, DType::kF32, nullptr, Device::cuda(0));
    FAIL() << "a cuda tensor was allocated on a machine without a GPU";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("no GPU"), std::string::npos) << e.what();
  }
}

// Tensor::empty_pinned, the staged groups' host buffers. Without a GPU: an ordinary host tensor
// (is_pinned() false) that holds its values. With one: page-locked (the runtime's own record,
// cudaPointerGetAttributes, says host memory it registered), a device round trip through it is
// bitwise, and a block freed is the next one of that size (the cache: pinned_stats' hit). The size,
// 9.5 MB, is one no other test stages: the cache hands out the smallest free block of at least the
// request and at most 8/7 of it, so an earlier test's free block in [9.5, 10.9] MB would come first.
TEST(DeviceMemory, PinnedHostTensorsArePageLockedAndReused) {
  Tensor h = Tensor::empty_pinned({791667, 3}, DType::kF32);
  for (int64_t i = 0; i < h.numel(); ++i) h.f32()[i] = 0.5f * static_cast<float>(i) - 7.f;
  for (int64_t i = 0; i < h.numel(); ++i) ASSERT_EQ(h.f32()[i], 0.5f * static_cast<float>(i) - 7.f);
  if (probe().devices == 0) {
    EXPECT_FALSE(h.is_pinned());
    return;
  }
  ASSERT_TRUE(h.is_pinned());
  cudaPointerAttributes a{};
  ASSERT_EQ(cudaPointerGetAttributes(&a, h.raw()), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  const Tensor d = h.to(Device::cuda(0));
  Tensor back = Tensor::empty_pinned({791667, 3}, DType::kF32);
  back.copy_from(d);
  EXPECT_EQ(std::memcmp(back.raw(), h.raw(), h.nbytes()), 0);
  const void* first = h.raw();
  h = Tensor();
  const int64_t hits = pinned_stats().hits;
  Tensor again = Tensor::empty_pinned({791667, 3}, DType::kF32);
  EXPECT_EQ(again.raw(), first);
  EXPECT_EQ(pinned_stats().hits, hits + 1);
}

// The kernels' scratch (cudaMallocAsync on the device's default pool) stays reserved across a
// synchronisation once the device's tensors are in use: the default pool's release threshold is
// kept at its maximum. Oracle: CUDA's documented pool semantics (a pool holds reserved memory up to
// its threshold across synchronisations): 48 MB freed, the stream synchronised, the pool still
// reserves at least that much, and the same allocation again reserves nothing more.
TEST(DeviceMemory, KernelScratchStaysReservedAcrossASync) {
  DHX_REQUIRE_GPU();
  const Tensor t = Tensor::empty({16}, DType::kF32, nullptr, Device::cuda(0));  // the device's pools set up
  cudaMemPool_t pool = nullptr;
  ASSERT_EQ(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
  uint64_t threshold = 0;
  ASSERT_EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold), cudaSuccess);
  EXPECT_EQ(threshold, UINT64_MAX);
  constexpr size_t kBytes = 48u << 20;
  void* p = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, kBytes, nullptr), cudaSuccess);
  ASSERT_EQ(cudaFreeAsync(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  uint64_t reserved = 0, again = 0;
  ASSERT_EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved), cudaSuccess);
  EXPECT_GE(reserved, kBytes) << "the pool gave its blocks back at the synchronisation";
  ASSERT_EQ(cudaMallocAsync(&p, kBytes, nullptr), cudaSuccess);
  ASSERT_EQ(cudaFreeAsync(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &again), cudaSuccess);
  EXPECT_EQ(again, reserved);
}

// An allocation that only fits once the kernels' scratch pool gives back what it caches: 55% of the
// device's free memory reserved by the default pool (allocated, freed, kept: the threshold above),
// then a tensor of 50% from the tensor pool. Oracle: cudaMemGetInfo -- with that reserve held, the
// driver has less free than the tensor asks, so it is allocated only if device_alloc trims the pools
// and tries again; the default pool then reserves less than it did. (The tensor pool keeps the 50%
// cached for the binary's later tests, which need far less.)
TEST(DeviceMemory, AnAllocationThatFitsOnlyAfterTheScratchPoolTrimsSucceeds) {
  DHX_REQUIRE_GPU();
  const Tensor warm = Tensor::empty({16}, DType::kF32, nullptr, Device::cuda(0));  // the pools set up
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  const size_t big = free0 / 100 * 55, ask = free0 / 2;
  cudaMemPool_t pool = nullptr;
  ASSERT_EQ(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
  void* p = nullptr;
  ASSERT_EQ(cudaMallocAsync(&p, big, nullptr), cudaSuccess);
  ASSERT_EQ(cudaFreeAsync(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  size_t free1 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  uint64_t reserved = 0;
  ASSERT_EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved), cudaSuccess);
  ASSERT_GE(reserved, big) << "the scratch pool did not keep its block (the premise)";
  ASSERT_LT(free1, ask) << "the driver has room without a trim (the premise)";
  {
    const Tensor t = Tensor::empty({static_cast<int64_t>(ask / 4)}, DType::kF32, nullptr, Device::cuda(0));
    EXPECT_TRUE(t.defined());
    uint64_t after = 0;
    ASSERT_EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &after), cudaSuccess);
    EXPECT_LT(after, reserved) << "the scratch pool still holds its block";
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// The other way round (cuda::scratch_malloc, Cuda.h): a kernel's scratch that only fits once the
// tensors' pool gives back what it caches. After both pools are trimmed (what earlier tests left),
// a tensor of 55% of the free memory is allocated and dropped (cached: the pool's threshold keeps
// it), then 50% of scratch is asked of the default pool. Oracle: cudaMemGetInfo, as above -- with
// that block cached the driver has less free than the scratch asks, so it is had only if
// scratch_malloc trims and tries again; the tensors' pool then reserves less than it did.
TEST(DeviceMemory, KernelScratchThatFitsOnlyAfterTheTensorPoolTrimsSucceeds) {
  DHX_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  { const Tensor warm = Tensor::empty({16}, DType::kF32, nullptr, gpu); }  // the pools set up
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  trim_device_pools(0);
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  const size_t big = free0 / 100 * 55, ask = free0 / 2;
  { const Tensor t = Tensor::empty({static_cast<int64_t>(big / 4)}, DType::kF32, nullptr, gpu); }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const int64_t reserved = device_memory_stats(gpu).reserved;
  ASSERT_GE(reserved, static_cast<int64_t>(big)) << "the tensors' pool did not keep its block (the premise)";
  size_t free1 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  ASSERT_LT(free1, ask) << "the driver has room without a trim (the premise)";
  void* p = nullptr;
  scratch_malloc(&p, ask, nullptr);  // DeviceError (the test fails) when it could not be had
  EXPECT_NE(p, nullptr);
  EXPECT_LT(device_memory_stats(gpu).reserved, reserved) << "the tensors' pool still holds its block";
  ASSERT_EQ(cudaFreeAsync(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  trim_device_pools(0);  // the scratch's half back to the driver for the binary's later tests
}

// device_upload (DeviceMemory.h): the copy is ordered on the stream but the call does not wait for
// it, and the source may be reused at once. The stream is held by a 200 ms spin, the upload issued
// behind it, the source then overwritten. Oracles: the stream has not reached the copy when the call
// returns (cudaStreamQuery: not ready -- a device_copy would have waited), and the device holds the
// bytes the source had at the call, not the ones written after.
TEST(DeviceMemory, AnUploadDoesNotWaitForItsStreamAndTakesTheBytesAtTheCall) {
  DHX_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  std::vector<int32_t> src(100000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<int32_t>(i * 7 + 3);
  const std::vector<int32_t> want = src;
  Tensor d = Tensor::empty({static_cast<int64_t>(src.size())}, DType::kI32, nullptr, gpu, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  hold_stream(s, 200000);
  device_upload(d.raw(), gpu, src.data(), src.size() * sizeof(int32_t), s);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady) << "device_upload returned only once its stream got there";
  (void)cudaGetLastError();
  std::fill(src.begin(), src.end(), -1);
  std::vector<int32_t> got(src.size());
  ASSERT_EQ(cudaMemcpyAsync(got.data(), d.raw(), got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(got, want);
  d = Tensor();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaStreamDestroy(s);
}

TEST(DeviceMemory, RoundTripIsBitwiseAndTrackersCountDeviceBytes) {
  DHX_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  MemoryTracker act("act");
  const std::vector<float> v = randn(1000003, 11);  // odd size: no multiple of any block
  Tensor h = Tensor::empty({static_cast<int64_t>(v.size())});
  std::memcpy(h.raw(), v.data(), h.nbytes());
  const int64_t before = device_memory_stats(gpu).in_use;
  {
    Tensor d = h.to(gpu, &act);
    EXPECT_EQ(d.device(), gpu);
    EXPECT_EQ(act.current(), static_cast<int64_t>(h.nbytes()));
    EXPECT_GE(device_memory_stats(gpu).in_use - before, static_cast<int64_t>(h.nbytes()));
    Tensor d2 = d.clone(&act);  // device -> device
    EXPECT_EQ(act.current(), 2 * static_cast<int64_t>(h.nbytes()));
    Tensor back = d2.to(Device::host());
    EXPECT_EQ(0, std::memcmp(back.raw(), v.data(), h.nbytes()));
    d2.zero_();
    Tensor z = d2.to(Device::host());
    for (int64_t i = 0; i < z.numel(); ++i) ASSERT_EQ(z.data<float>()[i], 0.0f) << i;
  }
  EXPECT_EQ(act.current(), 0);
  EXPECT_EQ(act.peak(), 2 * static_cast<int64_t>(h.nbytes()));
  EXPECT_EQ(device_memory_stats(gpu).in_use, before);
}

TEST(DeviceMemory, FreedBlocksAreCachedAndReused) {
  DHX_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  auto round = [&] {
    std::vector<Tensor> ts;
    for (int i = 0; i < 8; ++i) ts.push_back(Tensor::empty({(i + 1) << 20}, DType::kBF16, nullptr, gpu));
  };
  round();
  DHX_CUDA(cudaDeviceSynchronize());
  const int64_t reserved = device_memory_stats(gpu).reserved;
  for (int r = 0; r < 5; ++r) round();
  DHX_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(device_memory_stats(gpu).reserved, reserved) << "the pool asked the driver for more memory";
  EXPECT_GT(reserved, 0);
}

// Held frees (hold_device_frees: the executor holds a pair's frees until its two strand streams
// join). A tensor made and filled on stream A is read by stream B only after a 50 ms host callback
// holds B up; meanwhile the tensor is dropped under a hold, and stream A allocates a tensor of the
// same size and fills it with another pattern. Oracle: the values written. B's copy must read the
// first tensor's values: its block was not given back (in_use still counts it, held_device_frees
// names it) until the release, which comes after A has waited for B.
TEST(DeviceMemory, HeldFreesAreGivenBackOnlyAtTheRelease) {
  DHX_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  cudaStream_t a = nullptr, b = nullptr;
  DHX_CUDA(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  DHX_CUDA(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  const int64_t n = 1 << 22;  // 16 MiB of fp32
  const std::vector<float> v = randn(static_cast<size_t>(n), 5);
  Tensor host = Tensor::empty({n});
  std::memcpy(host.raw(), v.data(), host.nbytes());
  Tensor copy = Tensor::empty({n}, DType::kF32, nullptr, gpu, b);
  const int64_t base = device_memory_stats(gpu).in_use;
  hold_device_frees();
  {
    Tensor t = host.to(gpu, nullptr, a);  // filled on a (the copy from the host has returned)
    DHX_CUDA(cudaLaunchHostFunc(b, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }, nullptr));
    DHX_CUDA(cudaMemcpyAsync(copy.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToDevice, b));
  }  // t dropped: held
  EXPECT_EQ(held_device_frees(), 1u);
  EXPECT_EQ(device_memory_stats(gpu).in_use, base + static_cast<int64_t>(n) * 4);
  {
    Tensor u = Tensor::empty({n}, DType::kF32, nullptr, gpu, a);
    DHX_CUDA(cudaMemsetAsync(u.raw(), 0x7f, u.nbytes(), a));
  }  // u dropped too (held)
  cudaEvent_t done = nullptr;
  DHX_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  DHX_CUDA(cudaEventRecord(done, b));
  DHX_CUDA(cudaStreamWaitEvent(a, done, 0));  // the join, as the executor's pair end
  release_device_frees();
  EXPECT_EQ(held_device_frees(), 0u);
  EXPECT_EQ(device_memory_stats(gpu).in_use, base);
  const Tensor back = copy.to(Device::host(), nullptr, b);
  EXPECT_EQ(0, std::memcmp(back.raw(), v.data(), back.nbytes())) << "B read a block given back under it";
  DHX_CUDA(cudaStreamSynchronize(a));
  DHX_CUDA(cudaEventDestroy(done));
  DHX_CUDA(cudaStreamDestroy(a));
  DHX_CUDA(cudaStreamDestroy(b));
}

// Holds nest per thread: only the outermost release gives the blocks back; a release without a hold
// is an InternalError (a bracketing bug, never silently ignored).
TEST(DeviceMemory, HoldsNestAndAnUnmatchedReleaseIsAnError) {
  DHX_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  hold_device_frees();
  hold_device_frees();
  { Tensor t = Tensor::empty({1024}, DType::kF32, nullptr, gpu); }
  release_device_frees();
  EXPECT_EQ(held_device_frees(), 1u);
  release_device_frees();
  EXPECT_EQ(held_device_frees(), 0u);
  EXPECT_THROW(release_device_frees(), InternalError);
}

}  // namespace
}  // namespace dhelix::cuda::test

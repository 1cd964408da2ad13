// Tensors on the GPU through the caching device allocator (tensor/DeviceMemory.h). Oracles: a
// host -> device -> host round trip returns the same bits; the trackers count exactly the bytes
// asked for; a freed block is reused (the pool's reserved bytes do not grow when the same sizes are
// allocated again); without a GPU, asking for one is a DeviceError that says so.
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

}  // namespace
}  // namespace dhelix::cuda::test

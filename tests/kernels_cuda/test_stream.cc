// The executor's device seam on a GPU (runtime/Stream.h): a CUDA event recorded on one stream and
// waited on by another orders the second stream's work after the first's, without a host sync.
// Oracle: stream A fills a 256 MB buffer with a byte value, B waits on A's event and copies the
// buffer to the host: every byte must be the value A wrote (five rounds, a new value each; without
// the wait B's copy would race A's fill).
#include <vector>

#include "CudaTest.h"
#include "runtime/Stream.h"

namespace dhelix::cuda::test {
namespace {

TEST(CudaStream, AnEventOrdersOneStreamAfterAnother) {
  DHX_REQUIRE_GPU();
  auto a = make_stream(Device::cuda(0)), b = make_stream(Device::cuda(0));
  ASSERT_NE(a->handle(), nullptr);
  ASSERT_NE(a->handle(), b->handle());
  const size_t bytes = size_t{256} << 20;
  Tensor x = Tensor::empty({static_cast<int64_t>(bytes / 2)}, DType::kU16, nullptr, Device::cuda(0), a->handle());
  void* host = nullptr;
  DHX_CUDA(cudaMallocHost(&host, bytes));
  for (int round = 0; round < 5; ++round) {
    const int value = 0x11 * (round + 1);
    DHX_CUDA(cudaMemsetAsync(x.raw(), value, bytes, static_cast<cudaStream_t>(a->handle())));
    std::unique_ptr<Event> filled = a->record();
    b->wait(*filled);
    DHX_CUDA(cudaMemcpyAsync(host, x.raw(), bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(b->handle())));
    std::unique_ptr<Event> copied = b->record();
    copied->host_wait();
    EXPECT_TRUE(copied->ready());
    EXPECT_TRUE(filled->ready());
    const unsigned char* h = static_cast<const unsigned char*>(host);
    size_t wrong = 0;
    for (size_t i = 0; i < bytes; i += 4093) wrong += h[i] != value;
    wrong += h[bytes - 1] != value;
    EXPECT_EQ(wrong, 0u) << "round " << round;
  }
  DHX_CUDA(cudaFreeHost(host));
}

}  // namespace
}  // namespace dhelix::cuda::test

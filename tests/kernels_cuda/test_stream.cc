// The executor's device seam on a GPU (runtime/Stream.h): a CUDA event recorded on one stream and
// waited on by another orders the second stream's work after the first's, without a host sync.
// Oracle: stream A fills a 256 MB buffer with a byte value, B waits on A's event and copies the
// buffer to the host: every byte must be the value A wrote (five rounds, a new value each; without
// the wait B's copy would race A's fill). And UnitEnv::host_view, the host's copy of a device
// buffer (runtime/Env.h), against the values written on the device.
#include <vector>

#include "CudaTest.h"
#include "runtime/Env.h"
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

// UnitEnv::host_view: the copy is ordered on the reader's stream (the value a fill queued behind a
// 50 ms spin wrote, not the one before it: a copy that did not wait would read the zeros), it is
// made once (read again after the device buffer was rewritten, it is the same copy with the old
// values: what the MoE ops rely on, the counts being written once per micro-batch), and once
// dropped -- as the executor drops it when an op writes or frees the buffer (Executor.cc,
// OpCall::out_new) -- the next read copies again and sees the new values.
TEST(CudaHostView, CopiesOnceOnTheReadersStreamUntilDropped) {
  DHX_REQUIRE_GPU();
  auto s = make_stream(Device::cuda(0));
  const auto cs = static_cast<cudaStream_t>(s->handle());
  const int64_t n = 1000;
  const size_t bytes = static_cast<size_t>(n) * sizeof(int32_t);
  Tensor t = Tensor::empty({n}, DType::kI32, nullptr, Device::cuda(0), s->handle());
  DHX_CUDA(cudaMemsetAsync(t.raw(), 0, bytes, cs));
  DHX_CUDA(cudaStreamSynchronize(cs));
  hold_stream(cs, 50000);
  DHX_CUDA(cudaMemsetAsync(t.raw(), 0x01, bytes, cs));  // every int32 0x01010101
  UnitEnv env;
  env.bufs["moe.counts"] = t;
  auto all_equal = [&](const Tensor& h, int32_t v) {
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += h.data<int32_t>()[i] != v;
    return wrong;
  };
  const Tensor& h = env.host_view("moe.counts", s->handle());
  ASSERT_TRUE(h.device().is_host());
  ASSERT_EQ(h.numel(), n);
  EXPECT_EQ(all_equal(h, 0x01010101), 0);
  DHX_CUDA(cudaMemsetAsync(t.raw(), 0x02, bytes, cs));
  DHX_CUDA(cudaStreamSynchronize(cs));
  const Tensor& again = env.host_view("moe.counts", s->handle());
  EXPECT_EQ(&again, &h);
  EXPECT_EQ(all_equal(again, 0x01010101), 0);
  env.drop_mirror("moe.counts");
  EXPECT_EQ(all_equal(env.host_view("moe.counts", s->handle()), 0x02020202), 0);
}

}  // namespace
}  // namespace dhelix::cuda::test

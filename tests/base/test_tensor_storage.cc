// Tensor storage's host block cache (tensor/Tensor.cc). Oracles: the cache's own counters and
// pointer identity (a freed large block comes back for the next request of about its size; small
// blocks and far smaller requests never do), the memory tracker's closed-form byte counts, and the
// data written through a recycled block. Under AddressSanitizer the cache is off (every block
// freed, so the sanitizer sees each use after free): the recycling checks are skipped there.
#include <gtest/gtest.h>

#include <algorithm>

#include "tensor/Tensor.h"

namespace dhelix {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCacheOn = false;
#else
constexpr bool kCacheOn = true;
#endif

TEST(TensorStorage, LargeBlocksAreRecycledSmallOnesAreNot) {
  if (!kCacheOn) GTEST_SKIP() << "the host block cache is off under AddressSanitizer";
  const int64_t n = (4 << 20) / 4;  // 4 MiB of f32
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({n}, DType::kF32);
    first = t.raw();
  }
  const HostCacheStats before = host_cache_stats();
  EXPECT_GE(before.cached_bytes, size_t(4) << 20);
  {
    Tensor again = Tensor::empty({n - 1000}, DType::kF32);  // a little smaller: same block
    EXPECT_EQ(again.raw(), first);
    std::fill(again.f32(), again.f32() + again.numel(), 3.0f);
    EXPECT_EQ(again.f32()[n - 1001], 3.0f);
    const HostCacheStats during = host_cache_stats();
    EXPECT_EQ(during.hits, before.hits + 1);
    EXPECT_EQ(during.cached_bytes, before.cached_bytes - (size_t(4) << 20));
    Tensor half = Tensor::empty({n / 2}, DType::kF32);  // half the size: would waste half, so not served
    EXPECT_NE(half.raw(), first);
    EXPECT_EQ(host_cache_stats().misses, during.misses + 1);
  }
  const HostCacheStats after_small = host_cache_stats();
  { Tensor small = Tensor::empty({1000}, DType::kF32); }  // 4 KB: malloc's, never cached
  EXPECT_EQ(host_cache_stats().cached_bytes, after_small.cached_bytes);
  EXPECT_EQ(host_cache_stats().hits + host_cache_stats().misses, after_small.hits + after_small.misses);
}

TEST(TensorStorage, TrackerCountsTheBytesAskedForWithOrWithoutTheCache) {
  MemoryTracker tr("test");
  const int64_t n = (3 << 20) / 4 + 7;
  {
    Tensor a = Tensor::empty({n}, DType::kF32, &tr);
    EXPECT_EQ(tr.current(), 4 * n);
    { Tensor b = Tensor::empty({n}, DType::kF32, &tr); }
    EXPECT_EQ(tr.current(), 4 * n);
    EXPECT_EQ(tr.peak(), 8 * n);
  }
  EXPECT_EQ(tr.current(), 0);
}

}  // namespace
}  // namespace dhelix

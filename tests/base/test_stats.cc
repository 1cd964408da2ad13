// quantile/median (base/Stats.h). Oracle: closed forms of the linear-interpolation quantile on
// small hand-checked samples; exact in double (every value is a short binary fraction).
#include <gtest/gtest.h>

#include <vector>

#include "base/Stats.h"

namespace dhelix {
namespace {

TEST(Stats, MedianOfOddAndEvenCountsInAnyOrder) {
  EXPECT_EQ(median({3, 1, 2}), 2.0);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);  // mean of the two middle values
  EXPECT_EQ(median({7}), 7.0);
}

TEST(Stats, QuantileInterpolatesBetweenOrderStatistics) {
  const std::vector<double> v = {5, 1, 4, 2, 3};  // sorted 1..5: position q * 4
  EXPECT_EQ(quantile(v, 0.0), 1.0);
  EXPECT_EQ(quantile(v, 0.25), 2.0);
  EXPECT_EQ(quantile(v, 0.75), 4.0);
  EXPECT_EQ(quantile(v, 1.0), 5.0);
  EXPECT_EQ(quantile({0, 1}, 0.25), 0.25);  // a quarter of the way from 0 to 1
  EXPECT_EQ(quantile({10, 20, 30, 40}, 0.5), 25.0);
}

TEST(Stats, NoSamplesOrAQuantileOutsideZeroOneIsAnError) {
  EXPECT_ANY_THROW(median({}));
  EXPECT_ANY_THROW(quantile({1, 2}, 1.5));
  EXPECT_ANY_THROW(quantile({1, 2}, -0.1));
}

// Oracle: the binomial closed form 1 - 2 P(Bin(n, 1/2) < k), worked by hand for n = 4, 7, 11.
TEST(Stats, MedianIntervalPicksTheNarrowestOrderStatisticsThatReachTheLevel) {
  // n = 7: k = 2 covers 1 - 2 * 8/128 = 0.875 < 0.9, so k = 1 (min, max): 1 - 2/128.
  MedianInterval a = median_interval({7, 3, 5, 1, 6, 2, 4}, 0.9);
  EXPECT_EQ(a.lo, 1.0);
  EXPECT_EQ(a.hi, 7.0);
  EXPECT_DOUBLE_EQ(a.coverage, 1 - 2.0 / 128);
  // The same samples at 0.85: k = 2 (0.875) reaches it, k = 3 (1 - 2 * 29/128 = 0.547) does not.
  MedianInterval b = median_interval({7, 3, 5, 1, 6, 2, 4}, 0.85);
  EXPECT_EQ(b.lo, 2.0);
  EXPECT_EQ(b.hi, 6.0);
  EXPECT_DOUBLE_EQ(b.coverage, 0.875);
  // n = 11: P(Bin < 3) = (1 + 11 + 55) / 2048, so k = 3 covers 1 - 134/2048 = 0.9346;
  // k = 4 adds C(11, 3) = 165: 1 - 464/2048 = 0.773 < 0.9.
  std::vector<double> v;
  for (int i = 11; i >= 1; --i) v.push_back(i * 0.5);
  MedianInterval c = median_interval(v, 0.9);
  EXPECT_EQ(c.lo, 1.5);  // x_(3)
  EXPECT_EQ(c.hi, 4.5);  // x_(9)
  EXPECT_DOUBLE_EQ(c.coverage, 1 - 134.0 / 2048);
}

TEST(Stats, MedianIntervalSaysWhenTooFewSamplesReachTheLevel) {
  // n = 4: even (min, max) covers only 1 - 2/16 = 0.875; the interval says so.
  MedianInterval a = median_interval({4, 1, 3, 2}, 0.9);
  EXPECT_EQ(a.lo, 1.0);
  EXPECT_EQ(a.hi, 4.0);
  EXPECT_DOUBLE_EQ(a.coverage, 0.875);
  MedianInterval one = median_interval({5}, 0.9);  // one sample: coverage 0
  EXPECT_EQ(one.lo, 5.0);
  EXPECT_EQ(one.hi, 5.0);
  EXPECT_DOUBLE_EQ(one.coverage, 0.0);
  EXPECT_ANY_THROW(median_interval({}, 0.9));
  EXPECT_ANY_THROW(median_interval({1, 2}, 1.0));
}

}  // namespace
}  // namespace dhelix

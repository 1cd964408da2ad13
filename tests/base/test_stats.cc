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

}  // namespace
}  // namespace dhelix

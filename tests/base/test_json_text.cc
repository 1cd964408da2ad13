// json_finite (base/JsonText.h): the benchmarks' result lines with non-finite numbers made null.
// Oracle: a JSON parser (nlohmann) reads the result, and the values are what the text said (the
// finite ones unchanged, every inf / -inf / nan / infinity a null), strings untouched.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "base/JsonText.h"

namespace dhelix {
namespace {

TEST(JsonFinite, NonFiniteNumbersBecomeNullAndTheRestIsKept) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  // fmt's spellings of the non-finite values, as the benchmarks' fmt::format calls write them.
  const std::string text = fmt::format(R"({{"a":{:.5g},"b":[{:.5g},{},{:.4g}],"c":"inf nan \"-inf\"","d":{},"e":-2.5e-3,)"
                                       R"("f":true,"g":null,"h":[infinity,-nan]}})",
                                       inf, -inf, nan, 1.25, 0);
  ASSERT_THROW(
      {
        const nlohmann::json raw = nlohmann::json::parse(text);
        (void)raw;
      },
      nlohmann::json::parse_error)
      << text;  // the premise: fmt's text does not parse as it is
  const nlohmann::json j = nlohmann::json::parse(json_finite(text));
  EXPECT_TRUE(j["a"].is_null());
  EXPECT_TRUE(j["b"][0].is_null());
  EXPECT_TRUE(j["b"][1].is_null());
  EXPECT_EQ(j["b"][2].get<double>(), 1.25);
  EXPECT_EQ(j["c"].get<std::string>(), "inf nan \"-inf\"");
  EXPECT_EQ(j["d"].get<int>(), 0);
  EXPECT_EQ(j["e"].get<double>(), -2.5e-3);
  EXPECT_TRUE(j["f"].get<bool>());
  EXPECT_TRUE(j["g"].is_null());
  EXPECT_TRUE(j["h"][0].is_null());
  EXPECT_TRUE(j["h"][1].is_null());
  EXPECT_EQ(json_finite(R"({"x":1})"), R"({"x":1})");
}

}  // namespace
}  // namespace dhelix

// LR schedule, metrics and progress-bar tests. Oracles: the closed form of warm-up + cosine;
// JSONL lines parsed back; a rendered progress frame compared with hand-written text.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <numbers>

#include "base/Error.h"
#include "base/Files.h"
#include "train/LrSchedule.h"
#include "train/Metrics.h"
#include "train/ProgressBar.h"
#include "TempDir.h"

namespace dhelix {
namespace {

TEST(LrSchedule, MatchesTheClosedForm) {
  LrSchedule s(1.0, 0.1, 10, 110);
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);   // lr * 1/10
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);   // warm-up ends at peak
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);  // cosine starts at peak
  EXPECT_DOUBLE_EQ(s.at(60), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 50.0 / 99.0)));
  EXPECT_NEAR(s.at(109), 0.1, 1e-15);  // last step at min_lr
  EXPECT_DOUBLE_EQ(s.at(500), 0.1);    // clamped past the end
  for (int64_t t = 10; t < 109; ++t) EXPECT_GE(s.at(t), s.at(t + 1)) << "monotone decay at " << t;
  LrSchedule no_warmup(2.0, 0.0, 0, 1);
  EXPECT_DOUBLE_EQ(no_warmup.at(0), 2.0);
  EXPECT_THROW(LrSchedule(1.0, 2.0, 0, 10), ConfigError);
}

TEST(Metrics, WritesOneFlushedJsonObjectPerLine) {
  testing::TempDir tmp;
  const std::string p = tmp / "run/metrics.jsonl";
  {
    MetricsWriter w(p);
    StepMetrics m;
    m.step = 3, m.loss = 2.5, m.lr = 1e-3, m.grad_norm = NAN, m.peak_bytes = 1 << 20;
    m.extras["val_loss"] = 2.75;
    w.write(m);
    // Flushed per line: visible before the writer closes.
    auto first = nlohmann::json::parse(read_file(p));
    EXPECT_EQ(first["step"], 3);
    EXPECT_EQ(first["loss"], 2.5);
    EXPECT_TRUE(first["grad_norm"].is_null());
    EXPECT_FALSE(first.contains("tokens_per_s"));
    EXPECT_EQ(first["peak_bytes"], 1 << 20);
    EXPECT_EQ(first["val_loss"], 2.75);
    w.write_json({{"step", 4}, {"loss", 2.0}});
  }
  MetricsWriter again(p, MetricsMode::kAppend);
  again.write_json({{"step", 5}});
  std::ifstream in(p);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) EXPECT_EQ(nlohmann::json::parse(line)["step"], 3 + n++);
  EXPECT_EQ(n, 3);
  EXPECT_THROW(MetricsWriter("/proc/definitely/not/here.jsonl"), IoError);
}

TEST(ProgressBar, RendersAFrame) {
  EXPECT_EQ(ProgressBar::render("train", 5, 10, "loss 3.10", 10), "train [#####.....] 5/10  loss 3.10");
  EXPECT_EQ(ProgressBar::render("x", 20, 10, "", 4), "x [####] 10/10  ");
}

}  // namespace
}  // namespace dhelix

// Linear warm-up + cosine decay (see LrSchedule.h for the closed form).
#include "train/LrSchedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/Error.h"

namespace dhelix {

LrSchedule::LrSchedule(double lr, double min_lr, int64_t warmup_steps, int64_t total_steps)
    : lr_(lr), min_lr_(min_lr), warmup_(warmup_steps), total_(total_steps) {
  DHX_CHECK(total_steps >= 1 && warmup_steps >= 0, ConfigError,
            "LR schedule needs steps >= 1 and warmup_steps >= 0 (got steps={}, warmup_steps={})", total_steps,
            warmup_steps);
  DHX_CHECK(min_lr >= 0 && min_lr <= lr, ConfigError, "LR schedule needs 0 <= min_lr <= lr (got min_lr={}, lr={})",
            min_lr, lr);
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_) return lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
  double span = static_cast<double>(std::max<int64_t>(1, total_ - 1 - warmup_));
  double p = std::clamp(static_cast<double>(step - warmup_) / span, 0.0, 1.0);
  return min_lr_ + (lr_ - min_lr_) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
}

}  // namespace dhelix

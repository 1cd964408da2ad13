// Learning-rate schedule: linear warm-up to `lr`, then half a cosine down to `min_lr` at the last
// step. Steps are 0-based (step 0 is the first optimizer step). Pure arithmetic; no state.
#pragma once
#include <cstdint>

namespace dhelix {

class LrSchedule {
 public:
  // total_steps >= 1, 0 <= warmup_steps, 0 <= min_lr <= lr (checked: ConfigError).
  LrSchedule(double lr, double min_lr, int64_t warmup_steps, int64_t total_steps);

  // step < warmup:  lr * (step + 1) / warmup            (never 0, reaches lr at step warmup-1)
  // otherwise:      min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2,
  //                 p = (step - warmup) / max(1, total - 1 - warmup), clamped to [0, 1]
  // so the last step (total-1) runs at exactly min_lr.
  double at(int64_t step) const;

 private:
  double lr_, min_lr_;
  int64_t warmup_, total_;
};

}  // namespace dhelix

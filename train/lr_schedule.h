// Learning rate: linear warmup, then cosine or linear decay to min_lr (or constant).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "config/config.h"

namespace tripod {

struct LrSchedule {
  double lr = 0, min_lr = 0;
  int64_t warmup_steps = 0, total_steps = 1;
  Decay decay = Decay::Cosine;

  // Learning rate of step `step` (0-based: the first update uses at(0)).
  double at(int64_t step) const {
    if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    if (decay == Decay::Constant || total_steps <= warmup_steps) return lr;
    double ratio = static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
    ratio = std::min(1.0, std::max(0.0, ratio));
    double coeff = decay == Decay::Linear ? 1.0 - ratio : 0.5 * (1.0 + std::cos(M_PI * ratio));
    return min_lr + coeff * (lr - min_lr);
  }
};

// A run's schedule. It spans train.steps even when train.exit_interval stops the run sooner, so
// a run stopped and resumed follows the uninterrupted run's rates.
inline LrSchedule lr_schedule_of(const TrainConfig& tc) {
  return {.lr = tc.lr, .min_lr = tc.min_lr, .warmup_steps = tc.warmup_steps, .total_steps = tc.steps,
          .decay = tc.decay};
}

}  // namespace tripod

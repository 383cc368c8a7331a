// LrSchedule::at, step by step: warmup, cosine, linear and constant decay, the last step, and a
// schedule that train.exit_interval does not shorten.
#include <gtest/gtest.h>

#include <cmath>

#include "train/lr_schedule.h"

namespace tripod {
namespace {

// lr 1e-3 -> min_lr 1e-4 over 10 steps, the first 2 warming up: decay covers steps 2..9 with
// ratio (step - 2) / 8.
LrSchedule schedule(const char* decay) {
  return {.lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 2, .total_steps = 10, .decay = *parse_enum<Decay>(decay)};
}

TEST(LrSchedule, WarmupRisesLinearlyToLrAtItsLastStep) {
  const LrSchedule s = schedule("cosine");
  EXPECT_DOUBLE_EQ(s.at(0), 0.5e-3);  // (0 + 1) / 2 of lr: the first update is not at lr 0
  EXPECT_DOUBLE_EQ(s.at(1), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(2), 1e-3);    // decay starts at ratio 0
}

TEST(LrSchedule, CosineFollowsHalfACosineFromLrToMinLr) {
  const LrSchedule s = schedule("cosine");
  for (int64_t step = 2; step < 10; ++step) {
    const double ratio = (step - 2) / 8.0;
    EXPECT_DOUBLE_EQ(s.at(step), 1e-4 + 0.5 * (1 + std::cos(M_PI * ratio)) * 9e-4) << "step " << step;
  }
  EXPECT_DOUBLE_EQ(s.at(6), 1e-4 + 0.5 * 9e-4);  // half way: the mean of lr and min_lr
  // The last step (9) is one step short of the end: 7/8 of the way, above min_lr.
  EXPECT_NEAR(s.at(9), 1e-4 + 0.5 * (1 + std::cos(M_PI * 7 / 8)) * 9e-4, 1e-18);
  EXPECT_GT(s.at(9), 1e-4);
  // Past the end it holds at min_lr.
  EXPECT_DOUBLE_EQ(s.at(10), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(1000), 1e-4);
}

TEST(LrSchedule, LinearDecaysByEqualStepsToMinLr) {
  const LrSchedule s = schedule("linear");
  EXPECT_DOUBLE_EQ(s.at(2), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(6), 5.5e-4);
  EXPECT_DOUBLE_EQ(s.at(9), 1e-4 + (1 - 7 / 8.0) * 9e-4);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-4);
  for (int64_t step = 3; step < 10; ++step)
    EXPECT_NEAR(s.at(step - 1) - s.at(step), 9e-4 / 8, 1e-15) << "step " << step;
}

TEST(LrSchedule, ConstantKeepsLrAfterWarmup) {
  const LrSchedule s = schedule("constant");
  EXPECT_DOUBLE_EQ(s.at(0), 0.5e-3);
  for (int64_t step : {2, 5, 9, 10, 50}) EXPECT_DOUBLE_EQ(s.at(step), 1e-3) << "step " << step;
}

TEST(LrSchedule, NoWarmupStartsAtLrAndWarmupToTheEndNeverDecays) {
  const LrSchedule none{.lr = 1e-3, .min_lr = 0, .warmup_steps = 0, .total_steps = 4, .decay = Decay::Linear};
  EXPECT_DOUBLE_EQ(none.at(0), 1e-3);
  EXPECT_DOUBLE_EQ(none.at(3), 0.25e-3);
  const LrSchedule all{.lr = 1e-3, .min_lr = 0, .warmup_steps = 4, .total_steps = 4, .decay = Decay::Cosine};
  EXPECT_DOUBLE_EQ(all.at(3), 1e-3);
  EXPECT_DOUBLE_EQ(all.at(4), 1e-3);  // total_steps <= warmup_steps: nothing left to decay over
}

TEST(LrSchedule, ExitIntervalDoesNotShortenTheSchedule) {
  TrainConfig tc;
  tc.lr = 1e-3;
  tc.min_lr = 1e-4;
  tc.warmup_steps = 2;
  tc.steps = 10;
  tc.decay = Decay::Cosine;
  const LrSchedule full = lr_schedule_of(tc);
  tc.exit_interval = 4;  // the run stops after step 4 and resumes later
  const LrSchedule stopped = lr_schedule_of(tc);
  EXPECT_EQ(stopped.total_steps, 10);
  for (int64_t step = 0; step < 10; ++step) EXPECT_DOUBLE_EQ(stopped.at(step), full.at(step)) << "step " << step;
  EXPECT_DOUBLE_EQ(full.at(9), schedule("cosine").at(9));
}

}  // namespace
}  // namespace tripod

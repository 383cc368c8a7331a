// Token sampling (model/inference's sample_token): greedy, temperature, top-k and top-p against
// the distributions they should draw from.
#include <gtest/gtest.h>

#include <cmath>

#include "model/inference.h"

namespace tripod {
namespace {

// Frequencies of each id over `n` draws.
std::vector<double> frequencies(const std::vector<float>& logits, const SamplingOptions& o, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> f(logits.size(), 0);
  for (int i = 0; i < n; ++i) f[sample_token(logits, o, rng)] += 1.0 / n;
  return f;
}

const std::vector<float> kLogits = {std::log(0.1f), std::log(0.5f), std::log(0.15f), std::log(0.25f)};

TEST(Sampling, GreedyPicksTheLargestLogitLowestIdOnTies) {
  std::mt19937_64 rng(1);
  EXPECT_EQ(sample_token(kLogits, {.temperature = 0}, rng), 1);
  EXPECT_EQ(sample_token(std::vector<float>{1, 3, 3, 2}, {.temperature = 0}, rng), 1);
  EXPECT_EQ(sample_token(kLogits, {.temperature = 1, .top_k = 1}, rng), 1);
  EXPECT_EQ(sample_token(kLogits, {.temperature = 1, .top_p = 0.01}, rng), 1);
}

TEST(Sampling, DrawsFromTheTemperedTruncatedDistribution) {
  const int n = 40000;
  // Temperature 1: the softmax itself.
  auto f = frequencies(kLogits, {.temperature = 1}, n, 3);
  const double want[] = {0.1, 0.5, 0.15, 0.25};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(f[i], want[i], 0.01) << "id " << i;
  // Temperature 0.5 squares the probabilities (renormalised).
  f = frequencies(kLogits, {.temperature = 0.5}, n, 4);
  const double z = 0.01 + 0.25 + 0.0225 + 0.0625;
  EXPECT_NEAR(f[1], 0.25 / z, 0.01);
  EXPECT_NEAR(f[0], 0.01 / z, 0.01);
  // top-k 2: ids 1 and 3 only, as 0.5 : 0.25.
  f = frequencies(kLogits, {.temperature = 1, .top_k = 2}, n, 5);
  EXPECT_EQ(f[0] + f[2], 0.0);
  EXPECT_NEAR(f[1], 2.0 / 3, 0.01);
  // top-p 0.8: 0.5 + 0.25 = 0.75 < 0.8, so 0.15 joins: ids 1, 3, 2 as 0.5 : 0.25 : 0.15.
  f = frequencies(kLogits, {.temperature = 1, .top_p = 0.8}, n, 6);
  EXPECT_EQ(f[0], 0.0);
  EXPECT_NEAR(f[2], 0.15 / 0.9, 0.01);
  // The same seed draws the same sequence.
  EXPECT_EQ(frequencies(kLogits, {.temperature = 1}, 100, 9), frequencies(kLogits, {.temperature = 1}, 100, 9));
}

}  // namespace
}  // namespace tripod

// The straggler rule (train/straggler.h) on given times, and the TFRecord framing of
// train/tensorboard.h against published check values.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "train/straggler.h"
#include "train/tensorboard.h"

namespace tripod {
namespace {

std::vector<RankTimes> compute_ms(std::vector<double> ms) {
  std::vector<RankTimes> t;
  for (double v : ms) t.push_back({.step_s = 0.05, .compute_s = v / 1e3});
  return t;
}

// One work class (every rank does the same work: data parallelism alone).
std::vector<int> one_class(int n) { return std::vector<int>(n, 0); }

TEST(Straggler, NamedAfterThreeIntervalsInARowAndClearedWhenBackUnderTheBar) {
  StragglerMonitor m(1.3, one_class(4));
  StragglerSummary s = m.update(10, compute_ms({10, 11, 10, 21}));
  EXPECT_DOUBLE_EQ(s.median_compute_s, 10.5e-3);
  EXPECT_EQ(s.max_rank, 3);
  EXPECT_DOUBLE_EQ(s.max_compute_s, 21e-3);
  EXPECT_DOUBLE_EQ(s.median_step_s, 0.05);
  EXPECT_TRUE(s.stragglers.empty());
  s = m.update(20, compute_ms({10, 10, 11, 20}));
  EXPECT_TRUE(s.stragglers.empty());
  s = m.update(30, compute_ms({11, 10, 10, 22}));
  ASSERT_EQ(s.stragglers.size(), 1u);
  EXPECT_EQ(s.stragglers[0].rank, 3);
  EXPECT_EQ(s.stragglers[0].intervals, 3);
  EXPECT_DOUBLE_EQ(s.stragglers[0].ratio, 22.0 / 10);  // over the median of the others, 10
  EXPECT_EQ(s.named, std::vector<int>{3});
  s = m.update(40, compute_ms({10, 10, 10, 30}));
  ASSERT_EQ(s.stragglers.size(), 1u);
  EXPECT_EQ(s.stragglers[0].intervals, 4);
  EXPECT_TRUE(s.named.empty());  // named once, listed while it lasts
  s = m.update(50, compute_ms({10, 10, 10, 12}));
  EXPECT_TRUE(s.stragglers.empty());
  EXPECT_EQ(s.cleared, std::vector<int>{3});
}

TEST(Straggler, AnIntervalUnderTheBarRestartsTheCount) {
  StragglerMonitor m(1.3, one_class(3));
  m.update(1, compute_ms({10, 10, 20}));
  m.update(2, compute_ms({10, 10, 20}));
  m.update(3, compute_ms({10, 10, 12}));  // 1.2x: under
  m.update(4, compute_ms({10, 10, 20}));
  EXPECT_TRUE(m.update(5, compute_ms({10, 10, 20})).stragglers.empty());
  EXPECT_EQ(m.update(6, compute_ms({10, 10, 20})).named, std::vector<int>{2});
}

TEST(Straggler, NothingTimedNamesNobody) {
  StragglerMonitor m(1.3, one_class(2));
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(m.update(i, compute_ms({0, 0})).stragglers.empty());
  // Two ranks: each is compared with the other, so one rank 2x the other is 2x its equals.
  for (int i = 0; i < 2; ++i) m.update(i, compute_ms({10, 20}));
  const StragglerSummary s = m.update(9, compute_ms({10, 20}));
  EXPECT_EQ(s.named, std::vector<int>{1});
  EXPECT_DOUBLE_EQ(s.stragglers[0].ratio, 2.0);
}

TEST(Straggler, RanksAreComparedWithTheirEqualsOnly) {
  // The header's example: two pipeline stages of two ranks; the second holds the head (1.4x the
  // first's work) and is not slow; rank 1 is.
  StragglerMonitor m(1.3, {0, 0, 1, 1});
  EXPECT_TRUE(m.update(1, compute_ms({10, 21, 14, 14})).stragglers.empty());
  EXPECT_TRUE(m.update(2, compute_ms({10, 20, 15, 14})).stragglers.empty());
  StragglerSummary s = m.update(3, compute_ms({11, 22, 14, 14}));
  EXPECT_EQ(s.named, std::vector<int>{1});
  ASSERT_EQ(s.stragglers.size(), 1u);
  EXPECT_DOUBLE_EQ(s.stragglers[0].ratio, 2.0);
  // A heavier stage is never named, however long it lasts (against the median of all six ranks,
  // 10, ranks 4 and 5 would be 1.6x).
  StragglerMonitor stages(1.3, {0, 0, 0, 0, 1, 1});
  for (int i = 0; i < 6; ++i)
    EXPECT_TRUE(stages.update(i, compute_ms({10, 10, 10, 10, 16, 16})).stragglers.empty());
  // A rank alone in its class has nobody to be compared with.
  StragglerMonitor alone(1.3, {0, 1});
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(alone.update(i, compute_ms({10, 30})).stragglers.empty());
}

TEST(TfRecord, MaskedCrcMatchesPublishedValues) {
  // crc32c("123456789") = 0xE3069283 (the CRC32C check value), masked: rotr 15, + 0xa282ead8.
  const char* check = "123456789";
  const uint32_t crc = 0xE3069283u;
  EXPECT_EQ(masked_crc32c(check, 9), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  // The length 164865 as TFRecord's u64: its masked checksum is 3944318725 (the value the npm
  // package @roboflow/tfrecords's own tests expect).
  const unsigned char len[8] = {1, 132, 2, 0, 0, 0, 0, 0};
  EXPECT_EQ(masked_crc32c(len, 8), 3944318725u);
}

TEST(TfRecord, FrameIsLengthCrcDataCrc) {
  const std::string data = "abc";
  const std::string f = tfrecord_frame(data);
  ASSERT_EQ(f.size(), 8u + 4u + 3u + 4u);
  uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);  // little-endian host
  EXPECT_EQ(n, 3u);
  uint32_t c1 = 0, c2 = 0;
  std::memcpy(&c1, f.data() + 8, 4);
  std::memcpy(&c2, f.data() + 15, 4);
  EXPECT_EQ(c1, masked_crc32c(f.data(), 8));
  EXPECT_EQ(f.substr(12, 3), "abc");
  EXPECT_EQ(c2, masked_crc32c("abc", 3));
  EXPECT_EQ(tfrecord_frame("").size(), 16u);
}

}  // namespace
}  // namespace tripod

// make_buckets: which parameters share a bucket, filled from the last parameter
// back (the order the backward finishes them), and where the forced boundaries fall.
#include <gtest/gtest.h>

#include <vector>

#include "parallel/data_parallel/grad_reducer.h"

namespace tripod {
namespace {

// Parameters of `sizes` elements laid out back to back from offset 0, `gap` elements apart
// (alignment padding).
std::vector<FlatSpan> layout(const std::vector<int64_t>& sizes, int64_t gap = 0) {
  std::vector<FlatSpan> out;
  int64_t at = 0;
  for (int64_t n : sizes) {
    out.push_back({at, at + n});
    at += n + gap;
  }
  return out;
}

struct Expect {
  int64_t begin, end, params;
};

void expect_buckets(const std::vector<GradBucket>& got, const std::vector<Expect>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].span.begin, want[i].begin) << "bucket " << i;
    EXPECT_EQ(got[i].span.end, want[i].end) << "bucket " << i;
    EXPECT_EQ(got[i].param_elements, want[i].params) << "bucket " << i;
  }
}

TEST(GradBuckets, FillFromTheLastParameterAndCloseOnceFull) {
  // Sizes 10 20 30 40 50, buckets of >= 60 elements: from the back, {50, 40} = 90 closes, then
  // {30, 20, 10} = 60 closes. In flat order: [0, 60) then [60, 150).
  expect_buckets(make_buckets(layout({10, 20, 30, 40, 50}), 60), {{0, 60, 60}, {60, 150, 90}});
  // 100 elements: {50, 40, 30} = 120, then what is left, {20, 10}, in a smaller first bucket.
  expect_buckets(make_buckets(layout({10, 20, 30, 40, 50}), 100), {{0, 30, 30}, {30, 150, 120}});
}

TEST(GradBuckets, OneBucketWhenTheyAllFitAndOnePerParameterWhenTiny) {
  expect_buckets(make_buckets(layout({10, 20, 30}), 1000), {{0, 60, 60}});
  expect_buckets(make_buckets(layout({10, 20, 30}), 1), {{0, 10, 10}, {10, 30, 20}, {30, 60, 30}});
  // A parameter larger than a bucket is never split: it closes the bucket it joins.
  expect_buckets(make_buckets(layout({5, 500, 5}), 50), {{0, 5, 5}, {5, 510, 505}});
  EXPECT_TRUE(make_buckets({}, 10).empty());
}

TEST(GradBuckets, SpansCoverAlignmentGapsButCountOnlyParameterElements) {
  // 4-element gaps: parameters at [0,10) [14,34) [38,68); the last two share a bucket that spans
  // the gap between them, [14, 68), holding 50 parameter elements.
  expect_buckets(make_buckets(layout({10, 20, 30}, 4), 45), {{0, 10, 10}, {14, 68, 50}});
}

TEST(GradBuckets, ForcedBoundariesSplitBucketsThatWouldOtherwiseJoin) {
  // boundaries_after = {1}: parameters 1 and 2 never share a bucket, even with room to spare.
  expect_buckets(make_buckets(layout({10, 20, 30, 40}), 1000, {1}), {{0, 30, 30}, {30, 100, 70}});
  // Boundaries after 0 and after 2: {3} closes at the boundary after 2, {2, 1} at the one
  // after 0, and {0} is left.
  expect_buckets(make_buckets(layout({10, 20, 30, 40}), 1000, {0, 2}),
                 {{0, 10, 10}, {10, 60, 50}, {60, 100, 40}});
  // A boundary where a bucket is full anyway closes one bucket, not an empty second one.
  expect_buckets(make_buckets(layout({10, 20, 30, 40}), 40, {2}),
                 {{0, 10, 10}, {10, 60, 50}, {60, 100, 40}});
}

}  // namespace
}  // namespace tripod

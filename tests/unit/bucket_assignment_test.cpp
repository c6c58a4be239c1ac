// Bucket assignment: sizes, limits, dtype grouping and order.
#include "reducer/bucket_assignment.h"

#include <gtest/gtest.h>

using ddp::detail::assign_buckets;
using ddp::detail::TensorSpec;

namespace {

TensorSpec floats(size_t bytes) { return {c10::kFloat, c10::Device(c10::kCPU), bytes}; }

}  // namespace

TEST(BucketAssignment, SmallFirstBucketThenTheCapAndTheRestInTheLastBucket) {
  std::vector<TensorSpec> tensors(6, floats(400));
  auto buckets = assign_buckets(tensors, {5, 4, 3, 2, 1, 0}, {500, 1000});
  // 400+400 >= 500 closes the first; then 400*3 >= 1000; the rest is left open.
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0], (std::vector<size_t>{5, 4}));
  EXPECT_EQ(buckets[1], (std::vector<size_t>{3, 2, 1}));
  EXPECT_EQ(buckets[2], (std::vector<size_t>{0}));
}

TEST(BucketAssignment, ATensorLargerThanTheCapGetsABucketOfItsOwn) {
  std::vector<TensorSpec> tensors{floats(10), floats(5000), floats(10)};
  auto buckets = assign_buckets(tensors, {0, 1, 2}, {100});
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0], (std::vector<size_t>{0, 1}));
  EXPECT_EQ(buckets[1], (std::vector<size_t>{2}));
}

TEST(BucketAssignment, DtypesNeverShareABucket) {
  std::vector<TensorSpec> tensors{floats(10),
                                  {c10::kDouble, c10::Device(c10::kCPU), 10},
                                  floats(10),
                                  {c10::kDouble, c10::Device(c10::kCPU), 10}};
  auto buckets = assign_buckets(tensors, {0, 1, 2, 3}, {1000});
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0], (std::vector<size_t>{0, 2}));
  EXPECT_EQ(buckets[1], (std::vector<size_t>{1, 3}));
}

TEST(BucketAssignment, OneBucketWhenEverythingFitsTheFirstLimit) {
  std::vector<TensorSpec> tensors(4, floats(4));
  auto buckets = assign_buckets(tensors, {3, 1, 2, 0}, {1u << 20, 25u << 20});
  ASSERT_EQ(buckets.size(), 1u);
  EXPECT_EQ(buckets[0], (std::vector<size_t>{3, 1, 2, 0}));
}

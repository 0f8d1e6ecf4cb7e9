// Tests for FreeSet (Note [Binned free blocks], allocator/free_set.h): best fit across bins, the
// bitmap's word and summary boundaries and the B-tree above them, streams kept apart, the most
// recently freed block of a size first, and a random sequence checked against a brute-force
// best fit with CheckInvariants after every step.
#include "allocator/free_set.h"

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dtr::alloc {
namespace {

struct TestBlock {
  uintptr_t ptr = 0;
  size_t size = 0;
  Stream stream;
  TestBlock* free_prev = nullptr;
  TestBlock* free_next = nullptr;
};

constexpr size_t kGranule = 512;
constexpr size_t kMaxBinned = kGranule * FreeSet<TestBlock>::kBins;

class FreeSetTest : public ::testing::Test {
 protected:
  TestBlock* Make(size_t size, uint64_t stream = 0) {
    auto b = std::make_unique<TestBlock>();
    b->ptr = next_ptr_;
    next_ptr_ += size;
    b->size = size;
    b->stream = Stream{stream};
    blocks_.push_back(std::move(b));
    return blocks_.back().get();
  }
  FreeSet<TestBlock> set_{kGranule};
  std::vector<std::unique_ptr<TestBlock>> blocks_;
  uintptr_t next_ptr_ = 0x10000;
};

TEST_F(FreeSetTest, FindsTheSmallestFittingSizeAcrossWordsAndTheBTree) {
  // One block in the first bin, one past a bitmap word boundary, the last bin, and the B-tree.
  TestBlock* tiny = Make(kGranule);
  TestBlock* mid = Make(65 * kGranule);  // bin 64: the second bitmap word's first bit
  TestBlock* last = Make(kMaxBinned);
  TestBlock* huge = Make(kMaxBinned + kGranule);
  for (TestBlock* b : {tiny, mid, last, huge}) set_.insert(b);
  ASSERT_TRUE(set_.CheckInvariants().ok()) << set_.CheckInvariants();
  EXPECT_EQ(set_.size(), 4u);
  EXPECT_EQ(set_.SmallestFitting(Stream{0}, kGranule), tiny);
  EXPECT_EQ(set_.SmallestFitting(Stream{0}, 2 * kGranule), mid);  // skips empty words
  EXPECT_EQ(set_.SmallestFitting(Stream{0}, mid->size), mid);
  EXPECT_EQ(set_.SmallestFitting(Stream{0}, mid->size + kGranule), last);
  EXPECT_EQ(set_.SmallestFitting(Stream{0}, kMaxBinned), last);
  EXPECT_EQ(set_.SmallestFitting(Stream{0}, kMaxBinned + kGranule), huge);  // the B-tree
  EXPECT_EQ(set_.SmallestFitting(Stream{0}, kMaxBinned + 2 * kGranule), nullptr);
  set_.erase(last);
  EXPECT_EQ(set_.SmallestFitting(Stream{0}, mid->size + kGranule), huge);  // bins empty: the B-tree
  EXPECT_FALSE(set_.Contains(last));
  EXPECT_TRUE(set_.Contains(huge));
  ASSERT_TRUE(set_.CheckInvariants().ok()) << set_.CheckInvariants();
}

TEST_F(FreeSetTest, StreamsAreKeptApart) {
  TestBlock* on0 = Make(4 * kGranule, 0);
  TestBlock* on7 = Make(2 * kGranule, 7);
  TestBlock* big7 = Make(kMaxBinned * 2, 7);
  for (TestBlock* b : {on0, on7, big7}) set_.insert(b);
  EXPECT_EQ(set_.SmallestFitting(Stream{0}, kGranule), on0);
  EXPECT_EQ(set_.SmallestFitting(Stream{7}, kGranule), on7);
  EXPECT_EQ(set_.SmallestFitting(Stream{7}, 3 * kGranule), big7);
  EXPECT_EQ(set_.SmallestFitting(Stream{0}, 5 * kGranule), nullptr);
  EXPECT_EQ(set_.SmallestFitting(Stream{3}, kGranule), nullptr);
  ASSERT_TRUE(set_.CheckInvariants().ok()) << set_.CheckInvariants();
}

TEST_F(FreeSetTest, TheMostRecentlyFreedBlockOfASizeComesFirst) {
  TestBlock* a = Make(8 * kGranule);
  TestBlock* b = Make(8 * kGranule);
  TestBlock* c = Make(8 * kGranule);
  for (TestBlock* x : {a, b, c}) set_.insert(x);
  EXPECT_EQ(set_.SmallestFitting(Stream{0}, 8 * kGranule), c);
  set_.erase(b);  // from the middle of the list
  ASSERT_TRUE(set_.CheckInvariants().ok()) << set_.CheckInvariants();
  set_.erase(c);
  EXPECT_EQ(set_.SmallestFitting(Stream{0}, 8 * kGranule), a);
  set_.erase(a);
  EXPECT_EQ(set_.SmallestFitting(Stream{0}, kGranule), nullptr);
  EXPECT_EQ(set_.size(), 0u);
  ASSERT_TRUE(set_.CheckInvariants().ok()) << set_.CheckInvariants();
}

TEST_F(FreeSetTest, RandomSequenceMatchesBruteForceBestFit) {
  std::mt19937_64 rng(7);
  std::vector<TestBlock*> in_set;
  auto random_size = [&] {
    switch (rng() % 4) {
      case 0: return kGranule * (1 + rng() % 8);  // a few small sizes: bins with several blocks
      case 1: return kGranule * (1 + rng() % FreeSet<TestBlock>::kBins);
      case 2: return kMaxBinned + kGranule * (rng() % 64);
      default: return kGranule * (60 + rng() % 140);  // around the first word boundaries
    }
  };
  for (int step = 0; step < 20000; ++step) {
    const uint64_t stream = rng() % 3 == 0 ? 1 : 0;
    if (in_set.empty() || rng() % 2 == 0) {
      TestBlock* b = Make(random_size(), stream);
      set_.insert(b);
      in_set.push_back(b);
    } else if (rng() % 2 == 0) {
      const size_t i = rng() % in_set.size();
      set_.erase(in_set[i]);
      in_set.erase(in_set.begin() + static_cast<long>(i));
    } else {
      const size_t want = random_size();
      // Reference: the smallest fitting size on the stream; among the binned ones of that size the
      // last inserted, above the bins the lowest address.
      TestBlock* expected = nullptr;
      for (TestBlock* b : in_set) {
        if (b->stream.id != stream || b->size < want) continue;
        if (expected == nullptr || b->size < expected->size) expected = b;
      }
      TestBlock* got = set_.SmallestFitting(Stream{stream}, want);
      if (expected == nullptr) {
        ASSERT_EQ(got, nullptr) << "step " << step;
        continue;
      }
      ASSERT_NE(got, nullptr) << "step " << step;
      ASSERT_EQ(got->size, expected->size) << "step " << step;
      ASSERT_EQ(got->stream.id, stream);
      if (got->size > kMaxBinned) {
        uintptr_t lowest = UINTPTR_MAX;
        for (TestBlock* b : in_set)
          if (b->stream.id == stream && b->size == got->size) lowest = std::min(lowest, b->ptr);
        ASSERT_EQ(got->ptr, lowest) << "step " << step;
      } else {
        TestBlock* last = nullptr;  // in_set keeps insertion order
        for (TestBlock* b : in_set)
          if (b->stream.id == stream && b->size == got->size) last = b;
        ASSERT_EQ(got, last) << "step " << step;
      }
    }
    ASSERT_EQ(set_.size(), in_set.size());
    if (step % 97 == 0) {
      ASSERT_TRUE(set_.CheckInvariants().ok()) << set_.CheckInvariants();
    }
  }
  for (TestBlock* b : in_set) {
    ASSERT_TRUE(set_.Contains(b));
  }
  ASSERT_TRUE(set_.CheckInvariants().ok()) << set_.CheckInvariants();
}

// As with the ordered set it replaced: a second insert and an erase of a block not in the set
// change nothing.
TEST_F(FreeSetTest, InsertingTwiceOrErasingAnAbsentBlockChangesNothing) {
  TestBlock* a = Make(2 * kGranule);
  TestBlock* b = Make(2 * kGranule);
  TestBlock* huge = Make(kMaxBinned + kGranule);
  TestBlock* absent = Make(2 * kGranule);
  TestBlock* absent_huge = Make(kMaxBinned + kGranule);
  for (TestBlock* x : {a, b, huge}) set_.insert(x);
  for (TestBlock* x : {a, b, huge}) set_.insert(x);  // b heads its bin, a follows it
  set_.erase(absent);
  set_.erase(absent_huge);
  EXPECT_EQ(set_.size(), 3u);
  ASSERT_TRUE(set_.CheckInvariants().ok()) << set_.CheckInvariants();
  EXPECT_EQ(set_.SmallestFitting(Stream{0}, kGranule), b);
  set_.erase(b);
  set_.erase(b);
  EXPECT_EQ(set_.SmallestFitting(Stream{0}, kGranule), a);
  EXPECT_EQ(set_.size(), 2u);
  ASSERT_TRUE(set_.CheckInvariants().ok()) << set_.CheckInvariants();
}

TEST_F(FreeSetTest, CheckInvariantsCatchesABrokenLink) {
  TestBlock* a = Make(3 * kGranule);
  TestBlock* b = Make(3 * kGranule);
  set_.insert(a);
  set_.insert(b);
  a->free_prev = nullptr;  // b -> a, a's back link lost
  EXPECT_FALSE(set_.CheckInvariants().ok());
  a->free_prev = b;
  a->size = 4 * kGranule;  // a key changed while in the set
  EXPECT_FALSE(set_.CheckInvariants().ok());
  a->size = 3 * kGranule;
  EXPECT_TRUE(set_.CheckInvariants().ok()) << set_.CheckInvariants();
}

}  // namespace
}  // namespace dtr::alloc

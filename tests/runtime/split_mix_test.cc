// Tests for SplitMix64 (runtime/split_mix.h), the victim search's sample generator.
#include "runtime/split_mix.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace dtr {
namespace {

// The published sequence for seed 1234567 (Rosetta Code, "Pseudo-random numbers/Splitmix64").
TEST(SplitMix64Test, MatchesTheReferenceSequence) {
  SplitMix64 rng(1234567);
  const uint64_t expected[] = {6457827717110365317ULL, 3203168211198807973ULL, 9817491932198370423ULL,
                               4593380528125082431ULL, 16408922859458223821ULL};
  for (uint64_t value : expected) EXPECT_EQ(rng(), value);
}

TEST(SplitMix64Test, SameSeedSameDraws) {
  SplitMix64 a(7), b(7), c(8);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.Below(1000);
    EXPECT_EQ(x, b.Below(1000));
    differs |= x != c.Below(1000);
  }
  EXPECT_TRUE(differs);
}

// Below(n) stays in [0, n) and spreads evenly: a chi-square test over 16 equal ranges of a
// range that is not a power of two, and every value of a small range drawn.
TEST(SplitMix64Test, BelowIsUniformInItsRange) {
  SplitMix64 rng(42);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(rng.Below(1), 0u);
  const uint64_t n = 100003 * 16;
  const int draws = 160000;
  std::vector<int> counts(16, 0);
  for (int i = 0; i < draws; ++i) {
    const uint64_t x = rng.Below(n);
    ASSERT_LT(x, n);
    ++counts[x / 100003];
  }
  double chi2 = 0;
  const double expected = draws / 16.0;
  for (int c : counts) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_LT(chi2, 37.7);  // the 0.999 quantile of chi-square with 15 degrees of freedom
  std::vector<bool> seen(5, false);
  for (int i = 0; i < 200; ++i) seen[rng.Below(5)] = true;
  for (bool s : seen) EXPECT_TRUE(s);
}

}  // namespace
}  // namespace dtr

// Tests for byte quantity parsing.
#include "runtime/bytes.h"

#include "gtest/gtest.h"

namespace dtr {
namespace {

TEST(ParseBytes, RejectsQuantitiesNoMachineHas) {
  // An int64 max once rounded to 2^63 through a double and wrapped to a negative budget.
  EXPECT_FALSE(ParseBytes("9223372036854775807").ok());
  EXPECT_FALSE(ParseBytes("99999999999999999999").ok());
  EXPECT_FALSE(ParseBytes("2000000TiB").ok());
  EXPECT_EQ(*ParseBytes("1152921504606846976"), kMaxByteQuantity);
  EXPECT_EQ(*ParseBytes("9007199254740993"), 9007199254740993u);  // exact beyond 2^53
}

TEST(ParseBytes, AcceptsPlainAndSuffixedForms) {
  EXPECT_EQ(*ParseBytes("123"), 123u);
  EXPECT_EQ(*ParseBytes("0"), 0u);
  EXPECT_EQ(*ParseBytes("1K"), 1000u);
  EXPECT_EQ(*ParseBytes("1kb"), 1000u);
  EXPECT_EQ(*ParseBytes("2M"), 2000000u);
  EXPECT_EQ(*ParseBytes("1.5G"), 1500000000u);
  EXPECT_EQ(*ParseBytes("1KiB"), 1024u);
  EXPECT_EQ(*ParseBytes("6GiB"), 6ull << 30);
  EXPECT_EQ(*ParseBytes(" 512 MiB "), 512ull << 20);
  EXPECT_EQ(*ParseBytes("1TiB"), 1ull << 40);
  EXPECT_EQ(*ParseBytes("7B"), 7u);
}

TEST(ParseBytes, RejectsMalformedInputWithTheAcceptedForms) {
  for (const char* bad : {"", "G", "-1", "1.5", "12 apples", "1e3", "1GiBB", "0x10", "99999999999999999999T"}) {
    auto r = ParseBytes(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("expected"), std::string::npos) << r.status();
  }
}

TEST(FormatBytes, IsHumanReadable) {
  EXPECT_EQ(FormatBytes(12), "12 B");
  EXPECT_EQ(FormatBytes(3ull << 30), "3.00 GiB (3221225472 bytes)");
}

}  // namespace
}  // namespace dtr

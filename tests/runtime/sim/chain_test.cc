// Tests for the chain model and its text format (Note [Chain format v1]).
#include "runtime/sim/chain.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/runtime/sim/rotor_toy_chain.h"

namespace dtr::sim {
namespace {

using ::testing::HasSubstr;

constexpr const char* kTwoStages = R"(# a comment before the header
dtr-chain v1

input 800   # trailing comment
stage conv1 1.5 3 100 250 10 20
stage fc    0.25 0.5 40 40 0 7 kind=linear source=trace.txt
)";

TEST(Chain, ParsesFieldsAndAnnotations) {
  auto chain = ParseChain(kTwoStages);
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(chain->input_bytes, 800u);
  ASSERT_EQ(chain->length(), 2);
  const ChainStage& conv = chain->stages[0];
  EXPECT_EQ(conv.name, "conv1");
  EXPECT_EQ(conv.forward_cost, 1.5);
  EXPECT_EQ(conv.backward_cost, 3);
  EXPECT_EQ(conv.activation_bytes, 100u);
  EXPECT_EQ(conv.saved_for_backward_bytes, 250u);
  EXPECT_EQ(conv.forward_overhead_bytes, 10u);
  EXPECT_EQ(conv.backward_overhead_bytes, 20u);
  EXPECT_TRUE(conv.annotations.empty());
  const ChainStage& fc = chain->stages[1];
  ASSERT_EQ(fc.annotations.size(), 2u);
  EXPECT_EQ(fc.annotations[0].first, "kind");
  EXPECT_EQ(fc.annotations[0].second, "linear");
  EXPECT_EQ(fc.annotations[1].second, "trace.txt");
  EXPECT_DOUBLE_EQ(chain->base_cost(), 1.5 + 3 + 0.25 + 0.5);
}

TEST(Chain, AccessorsCoverInputAndImplicitLossStage) {
  auto chain = ParseChain(kTwoStages);
  ASSERT_TRUE(chain.ok());
  EXPECT_EQ(chain->loss_stage(), 3);
  EXPECT_EQ(chain->activation_bytes(0), 800u);
  EXPECT_EQ(chain->activation_bytes(1), 100u);
  EXPECT_EQ(chain->gradient_bytes(2), 40u);
  EXPECT_EQ(chain->saved_for_backward_bytes(1), 250u);
  EXPECT_EQ(chain->forward_overhead_bytes(1), 10u);
  EXPECT_EQ(chain->backward_overhead_bytes(2), 7u);
  EXPECT_EQ(chain->forward_cost(2), 0.25);
  EXPECT_EQ(chain->backward_cost(1), 3);
  // Note [Loss stage]: stage L+1 is free and empty.
  EXPECT_EQ(chain->activation_bytes(3), 0u);
  EXPECT_EQ(chain->saved_for_backward_bytes(3), 0u);
  EXPECT_EQ(chain->backward_overhead_bytes(3), 0u);
  EXPECT_EQ(chain->forward_cost(3), 0);
  EXPECT_EQ(chain->backward_cost(3), 0);
}

TEST(Chain, PrintThenParseRoundTrips) {
  auto chain = ParseChain(kTwoStages);
  ASSERT_TRUE(chain.ok());
  chain->stages[0].forward_cost = 0.1 + 0.2;  // needs 17 digits
  chain->input_annotations.emplace_back("batch", "32");
  const std::string text = ChainToString(*chain);
  EXPECT_THAT(text, HasSubstr("stage fc 0.25 0.5 40 40 0 7 kind=linear source=trace.txt\n"));
  EXPECT_THAT(text, HasSubstr("input 800 batch=32\n"));
  auto again = ParseChain(text);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->stages[0].forward_cost, 0.1 + 0.2);
  EXPECT_EQ(ChainToString(*again), text);
}

TEST(Chain, ReadsTheToyChainFile) {
  auto chain = ReadChainFile(std::string(DTR_TESTDATA_DIR) + "/rotor_toy_chain.chain");
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(chain->length(), 6);
  EXPECT_EQ(chain->input_bytes, 8000635u);  // 7.63 * 2^20, rounded
  EXPECT_NEAR(chain->base_cost(), 37.38, 1e-9);
  // The file and the test fixture are the same transcription of the paper's Table 2.
  EXPECT_EQ(ChainToString(*chain), ChainToString(testing::RotorToyChain()));
}

TEST(Chain, MissingFileIsNotFound) {
  auto chain = ReadChainFile("/nonexistent/dir/x.chain");
  EXPECT_TRUE(absl::IsNotFound(chain.status())) << chain.status();
}

struct BadChain {
  const char* text;
  const char* message;  // expected substring
};

TEST(Chain, RejectsMalformedInputWithLineNumbers) {
  const BadChain cases[] = {
      {"", "no 'dtr-chain v1' header"},
      {"# only a comment\n", "no 'dtr-chain v1' header"},
      {"input 5\n", "chain line 1: the first line must be 'dtr-chain v1'"},
      {"dtr-chain v2\ninput 5\n", "chain line 1: unsupported chain format version 'v2'"},
      {"dtr-chain 1\n", "chain line 1: the first line must be 'dtr-chain v1'"},
      {"dtr-chain v1\nstage a 1 1 1 1 1 1\n", "no 'input"},
      {"dtr-chain v1\ninput 5\n", "no 'stage' lines"},
      {"dtr-chain v1\ninput 5\ninput 6\nstage a 1 1 1 1 1 1\n", "chain line 3: a second 'input' line"},
      {"dtr-chain v1\ninput\n", "chain line 2: expected 'input <a0_bytes>'"},
      {"dtr-chain v1\ninput -5\n", "chain line 2: a0_bytes: expected a non-negative integer"},
      {"dtr-chain v1\ninput 5\nstage a 1 1 1 1 1\n", "chain line 3: expected 'stage <name>"},
      {"dtr-chain v1\ninput 5\nstage a 1 1 1.5 1 1 1\n", "chain line 3: a_bytes: expected a non-negative integer"},
      {"dtr-chain v1\ninput 5\n\nstage a 1 1 1 1 1 -1\n", "chain line 4: o_b_bytes"},
      {"dtr-chain v1\ninput 5\nstage a -1 1 1 1 1 1\n", "chain line 3: u_f: expected a non-negative finite cost"},
      {"dtr-chain v1\ninput 5\nstage a 1 nan 1 1 1 1\n", "chain line 3: u_b"},
      {"dtr-chain v1\ninput 5\nstage a 1 inf 1 1 1 1\n", "chain line 3: u_b"},
      {"dtr-chain v1\ninput 5\nstage a 1 1 x 1 1 1\n", "a_bytes"},
      {"dtr-chain v1\ninput 5\nstage a 1 1 1 1 1 1 extra\n", "chain line 3: unexpected extra field 'extra'"},
      {"dtr-chain v1\ninput 5\nstage a 1 1 1 1 1 1 =v\n", "unexpected extra field '=v'"},
      {"dtr-chain v1\ninput 5\nlayer a 1 1 1 1 1 1\n", "chain line 3: unknown line kind 'layer'"},
      {"dtr-chain v1\ninput 99999999999999999999999\n", "a0_bytes"},
  };
  for (const BadChain& c : cases) {
    auto chain = ParseChain(c.text);
    ASSERT_FALSE(chain.ok()) << "accepted: " << c.text;
    EXPECT_TRUE(absl::IsInvalidArgument(chain.status())) << chain.status();
    EXPECT_THAT(std::string(chain.status().message()), HasSubstr(c.message)) << "for: " << c.text;
  }
}

}  // namespace
}  // namespace dtr::sim

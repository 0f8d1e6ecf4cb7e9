// Tests for the trace format parser and writer.
#include "runtime/sim/trace.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/sim/generators.h"

namespace dtr::sim {
namespace {

using ::testing::HasSubstr;

constexpr const char* kExample = R"(# a tiny training step
dtr-trace 1
const w 64
const x 32
call mm 10 x w -> y:16
call split 3 y -> a:8 b=y
opaque dropout 2 a -> d:8
mutate relu_ 1 d -> d
copy y2 y
release y
release a
)";

TEST(Trace, ParsesEveryEventKind) {
  auto trace = ParseTrace(kExample);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->events.size(), 9u);
  const auto& call = trace->events[2];
  EXPECT_EQ(call.kind, EventKind::kCall);
  EXPECT_EQ(call.name, "mm");
  EXPECT_EQ(call.cost, 10);
  ASSERT_EQ(call.inputs.size(), 2u);
  EXPECT_EQ(trace->tensor_names[call.inputs[0]], "x");
  EXPECT_EQ(call.outputs[0].size, 16u);
  const auto& split = trace->events[3];
  ASSERT_EQ(split.outputs.size(), 2u);
  EXPECT_EQ(trace->tensor_names[split.outputs[1].alias_of], "y");
  EXPECT_EQ(trace->events[4].kind, EventKind::kOpaque);
  EXPECT_EQ(trace->events[5].kind, EventKind::kMutate);
  EXPECT_EQ(trace->events[5].mutated.size(), 1u);
  EXPECT_EQ(trace->events[6].kind, EventKind::kCopy);
  EXPECT_EQ(trace->events[8].kind, EventKind::kRelease);
}

TEST(Trace, MutationsSayHowTheyReplay) {
  auto trace = ParseTrace(R"(dtr-trace 1
const x 8
opaque empty 0 -> e:8
overwrite bernoulli_ 2 e -> e
mutate-opaque copy_ 1 e x -> e
mutate div_ 1 e -> e
)");
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->events.size(), 5u);
  EXPECT_TRUE(trace->events[2].overwrites);
  EXPECT_TRUE(trace->events[2].replayable);
  EXPECT_FALSE(trace->events[3].replayable);
  EXPECT_FALSE(trace->events[3].overwrites);
  EXPECT_TRUE(trace->events[4].replayable);
  EXPECT_FALSE(trace->events[4].overwrites);
  auto again = ParseTrace(TraceToString(*trace));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(TraceToString(*again), TraceToString(*trace));
  EXPECT_FALSE(ParseTrace("dtr-trace 1\nconst x 8\nconst y 8\noverwrite f 1 x y -> x y\n").ok());
}

// Note [Trace format]: an op's workspace, right after its cost; absent means none.
TEST(Trace, OpsMayGiveTheirScratchMemory) {
  auto trace = ParseTrace(R"(dtr-trace 2
const x 8
call conv 5 scratch=4096 x -> y:8
call relu 1 y -> z:8
opaque empty 0 scratch=16 -> e:8
overwrite bernoulli_ 2 scratch=32 e -> e
mutate add_ 1 scratch=64 e x -> e
)");
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->events.size(), 6u);
  EXPECT_EQ(trace->events[1].scratch, 4096u);
  EXPECT_EQ(trace->events[1].inputs.size(), 1u);
  EXPECT_EQ(trace->events[2].scratch, 0u);
  EXPECT_EQ(trace->events[3].scratch, 16u);
  EXPECT_EQ(trace->events[4].scratch, 32u);
  EXPECT_EQ(trace->events[5].scratch, 64u);
  EXPECT_EQ(trace->events[5].inputs.size(), 2u);
  const std::string text = TraceToString(*trace);
  EXPECT_THAT(text, HasSubstr("call conv 5 scratch=4096 x -> y:8\n"));
  EXPECT_THAT(text, HasSubstr("call relu 1 y -> z:8\n"));
  auto again = ParseTrace(text);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(TraceToString(*again), text);
}

// Note [Copies of overwritten contents]: a call that copies its input says so, after pass=backward.
TEST(Trace, AWholeCopyRoundTrips) {
  auto trace = ParseTrace(R"(dtr-trace 6
const x 8
call clone 2 pass=backward copy=whole x -> y:8
call f 2 y -> z:8
)");
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_TRUE(trace->events[1].copies_input);
  EXPECT_TRUE(trace->events[1].backward);
  EXPECT_FALSE(trace->events[2].copies_input);
  const std::string text = TraceToString(*trace);
  EXPECT_THAT(text, HasSubstr("\ncall clone 2 pass=backward copy=whole x -> y:8\ncall f 2 y -> z:8\n"));
}

// Note [Steady-state steps]: a mark is an event of its own, kept in order with its label.
TEST(Trace, MarksNameAPointAndRoundTrip) {
  auto trace = ParseTrace(R"(dtr-trace 3
const x 8
mark step-1
call f 2 x -> y:8
mark step-2
)");
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->events.size(), 4u);
  EXPECT_EQ(trace->events[1].kind, EventKind::kMark);
  EXPECT_EQ(trace->events[1].name, "step-1");
  EXPECT_EQ(trace->events[3].kind, EventKind::kMark);
  EXPECT_EQ(trace->events[3].name, "step-2");
  const std::string text = TraceToString(*trace);
  EXPECT_THAT(text, HasSubstr("dtr-trace 6\n"));
  EXPECT_THAT(text, HasSubstr("\nmark step-1\ncall f 2 x -> y:8\nmark step-2\n"));
  auto again = ParseTrace(text);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(TraceToString(*again), text);
}

// Note [Results of the backward pass]: `pass=backward` marks an op of a backward pass, after
// `scratch=` if both are given.
TEST(Trace, PassBackwardMarksAnOpAndRoundTrips) {
  auto trace = ParseTrace(R"(dtr-trace 4
const x 8
call f 2 x -> y:8
call g 3 scratch=16 pass=backward y -> z:8
mutate h 1 pass=backward z -> z
)");
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->events.size(), 4u);
  EXPECT_FALSE(trace->events[1].backward);
  EXPECT_TRUE(trace->events[2].backward);
  EXPECT_EQ(trace->events[2].scratch, 16u);
  EXPECT_EQ(trace->events[2].inputs.size(), 1u);  // pass=backward is not read as a tensor
  EXPECT_TRUE(trace->events[3].backward);
  const std::string text = TraceToString(*trace);
  EXPECT_THAT(text, HasSubstr("\ncall f 2 x -> y:8\ncall g 3 scratch=16 pass=backward y -> z:8\nmutate h 1 pass=backward z -> z\n"));
  auto again = ParseTrace(text);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(TraceToString(*again), text);
}

// Note [Program time between ops]: `wait` gives the program's own time before the next op.
TEST(Trace, WaitsGiveTheProgramsTimeAndRoundTrip) {
  auto trace = ParseTrace(R"(dtr-trace 5
const x 8
wait 1500
call f 2 x -> y:8
wait 0.5
)");
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->events.size(), 4u);
  EXPECT_EQ(trace->events[1].kind, EventKind::kWait);
  EXPECT_EQ(trace->events[1].cost, 1500);
  EXPECT_EQ(trace->events[3].kind, EventKind::kWait);
  EXPECT_EQ(trace->events[3].cost, 0.5);
  const std::string text = TraceToString(*trace);
  EXPECT_THAT(text, HasSubstr("\nwait 1500\ncall f 2 x -> y:8\nwait 0.5\n"));
  auto again = ParseTrace(text);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(TraceToString(*again), text);
}

TEST(Trace, WriteThenParseRoundTrips) {
  auto trace = ParseTrace(kExample);
  ASSERT_TRUE(trace.ok());
  std::string text = TraceToString(*trace);
  auto again = ParseTrace(text);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(TraceToString(*again), text);
  for (const std::string& kind : GeneratorKinds()) {
    GeneratorOptions options;
    options.n = kind == "adversarial" ? 40 : 0;
    auto generated = GenerateTrace(kind, options);
    ASSERT_TRUE(generated.ok()) << kind << ": " << generated.status();
    std::string g = TraceToString(*generated);
    auto parsed = ParseTrace(g);
    ASSERT_TRUE(parsed.ok()) << kind << ": " << parsed.status();
    EXPECT_EQ(TraceToString(*parsed), g) << kind;
  }
}

TEST(Trace, RejectsMalformedLinesWithTheirLineNumber) {
  struct Case {
    const char* text;
    const char* message;
  } cases[] = {
      {"call f 1 -> y:1\n", "first line"},
      {"dtr-trace 7\n", "unsupported trace version 7"},
      {"dtr-trace 4\nwait 10\n", "'wait' needs trace version 5"},
      {"dtr-trace 5\nwait\n", "expected 'wait TIME'"},
      {"dtr-trace 5\nwait -1\n", "bad cost '-1'"},
      {"dtr-trace 3\nconst x 1\ncall f 1 pass=backward x -> y:1\n", "'pass=backward' needs trace version 4"},
      {"dtr-trace 5\nconst x 1\ncall clone 1 copy=whole x -> y:1\n", "'copy=whole' needs trace version 6"},
      {"dtr-trace 6\nconst x 1\nmutate f 1 copy=whole x -> x\n", "'copy=whole' is for call lines"},
      {"dtr-trace 4\nconst x 1\ncall f 1 x pass=backward -> y:1\n", "'pass=backward' is used before it is defined"},
      {"dtr-trace 2\nmark step\n", "'mark' needs trace version 3"},
      {"dtr-trace 3\nmark\n", "expected 'mark LABEL'"},
      {"dtr-trace 0\n", "unsupported trace version 0"},
      {"dtr-trace 1\nconst x 1\ncall f 1 scratch=8 x -> y:1\n", "'scratch=' needs trace version 2"},
      {"dtr-trace 2\nconst x 1\ncall f 1 scratch=-8 x -> y:1\n", "bad byte size '-8'"},
      {"dtr-trace 2\nconst x 1\ncall f 1 x scratch=8 -> y:1\n", "'scratch=8' is used before it is defined"},
      {"dtr-trace 1\nconst x\n", "line 2: expected 'const T BYTES'"},
      {"dtr-trace 1\ncall f 1 x -> y:1\n", "'x' is used before it is defined"},
      {"dtr-trace 1\nconst x 1\nconst x 1\n", "defined twice"},
      {"dtr-trace 1\nconst x 1\ncall f -1 x -> y:1\n", "bad cost"},
      {"dtr-trace 1\nconst x 1\ncall f 1 x\n", "missing '->'"},
      {"dtr-trace 1\nconst x 1\ncall f 1 x -> y\n", "must be T:BYTES or T=BASE"},
      {"dtr-trace 1\nconst x 1\nconst z 1\nmutate f 1 x -> z\n", "not an input"},
      {"dtr-trace 1\nfrobnicate\n", "unknown event 'frobnicate'"},
      {"dtr-trace 3\nmark a b\n", "line 2: expected 'mark LABEL'"},
      {"", "empty trace"},
  };
  for (const Case& c : cases) {
    auto trace = ParseTrace(c.text);
    ASSERT_FALSE(trace.ok()) << c.text;
    EXPECT_THAT(std::string(trace.status().message()), HasSubstr(c.message)) << c.text;
  }
}

}  // namespace
}  // namespace dtr::sim

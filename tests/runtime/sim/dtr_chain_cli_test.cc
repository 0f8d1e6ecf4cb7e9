// Tests for the dtr-chain command line: runs the built binary on the toy chain's file and checks
// its JSON lines and exit codes.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

struct Output {
  int exit_code = -1;
  std::string out;
};

Output RunDtrChain(const std::string& arguments) {
  const std::string command = std::string(DTR_CHAIN_BINARY) + " " + arguments + " 2>/dev/null";
  Output result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) result.out.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::vector<std::string> Lines(const std::string& text) { return absl::StrSplit(text, '\n', absl::SkipEmpty()); }

const std::string kToy = std::string(DTR_TESTDATA_DIR) + "/rotor_toy_chain.chain";

TEST(DtrChainCli, AllPlannersOneLineEachPerBudget) {
  Output run = RunDtrChain("--chain " + kToy + " --budget 100MiB,80MiB");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const std::vector<std::string> lines = Lines(run.out);
  ASSERT_THAT(lines, SizeIs(6));
  EXPECT_THAT(lines[0], HasSubstr(R"("planner":"rotor","budget_bytes":104857600,"status":"ok","makespan":41.17)"));
  EXPECT_THAT(lines[0], HasSubstr(R"("slots":500)"));
  EXPECT_THAT(lines[1], HasSubstr(R"("planner":"sqrt","budget_bytes":104857600,"status":"ok","makespan":46.1)"));
  EXPECT_THAT(lines[1], HasSubstr(R"("segments":3)"));
  EXPECT_THAT(lines[2], HasSubstr(R"("planner":"best-sequential")"));
  EXPECT_THAT(lines[2], HasSubstr(R"("segments":2)"));
  EXPECT_THAT(lines[3],
              HasSubstr(R"("planner":"rotor","budget_bytes":83886080,"status":"infeasible","makespan":null)"));
  EXPECT_THAT(lines[3], HasSubstr(R"("min_budget_bytes":86109062)"));
  for (const std::string& line : lines) {
    EXPECT_EQ(line.front(), '{');
    EXPECT_EQ(line.back(), '}');
    EXPECT_THAT(line, HasSubstr(R"("base_cost":37.37)"));
  }
}

TEST(DtrChainCli, RatioSequentialAndSchedule) {
  Output run = RunDtrChain("--chain " + kToy +
                           " --ratio 1 --planner sequential --segments 2 --segmentation balanced --schedule");
  ASSERT_EQ(run.exit_code, 0);
  ASSERT_THAT(Lines(run.out), SizeIs(1));
  EXPECT_THAT(run.out, HasSubstr(R"("ratio":1,"status":"ok","makespan":46.1)"));
  EXPECT_THAT(run.out, HasSubstr(R"("schedule":"F_ck^1 F_none^2 F_none^3 F_none^4 F_all^5)"));
  Output exact = RunDtrChain("--chain " + kToy + " --ratio 1 --planner rotor --slots 0");
  ASSERT_EQ(exact.exit_code, 0);
  EXPECT_THAT(exact.out, HasSubstr(R"("overhead":0,)"));
}

TEST(DtrChainCli, ReadsTheChainFromStdin) {
  Output run = RunDtrChain("--chain - --budget 1G --planner rotor < " + kToy);
  ASSERT_EQ(run.exit_code, 0);
  EXPECT_THAT(run.out, HasSubstr(R"("status":"ok")"));
}

TEST(DtrChainCli, BadUsageExitsWithTwo) {
  const std::string bad_chain = ::testing::TempDir() + "/bad.chain";
  std::ofstream(bad_chain) << "dtr-chain v1\ninput 5\nstage a 1 1 1 1 1\n";
  for (const std::string& arguments : std::vector<std::string>{
           std::string("--budget 1G"),
           "--chain " + kToy,
           "--chain " + kToy + " --budget 1G --ratio 0.5",
           "--chain " + kToy + " --budget 12XB",
           "--chain " + kToy + " --ratio -1",
           "--chain " + kToy + " --budget 1G --planner fastest",
           "--chain " + kToy + " --budget 1G --planner sequential",
           "--chain " + kToy + " --budget 1G --planner sequential --segments 7",
           "--chain " + kToy + " --budget 1G --slots x",
           "--chain " + kToy + " --budget 1G --segmentation even",
           "--chain " + kToy + " --budget 1G --frobnicate",
           std::string("--chain /nonexistent.chain --budget 1G"),
           "--chain " + bad_chain + " --budget 1G",
       }) {
    EXPECT_EQ(RunDtrChain(arguments).exit_code, 2) << arguments;
  }
}

}  // namespace

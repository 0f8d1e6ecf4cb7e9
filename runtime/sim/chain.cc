// Chain parsing and printing; see Note [Chain format v1] in chain.h.
#include "runtime/sim/chain.h"

#include <cmath>
#include <cstdlib>
#include <ostream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "runtime/sim/text_input.h"

namespace dtr::sim {
namespace {

// The shortest decimal form that reads back to exactly `value`.
std::string FormatCost(double value) {
  for (int digits = 1; digits <= 17; ++digits) {
    std::string text = absl::StrFormat("%.*g", digits, value);
    if (std::strtod(text.c_str(), nullptr) == value) return text;
  }
  return absl::StrFormat("%.17g", value);
}

void WriteAnnotations(const ChainAnnotations& annotations, std::ostream& out) {
  for (const auto& [key, value] : annotations) out << ' ' << key << '=' << value;
}

class ChainParser {
 public:
  absl::StatusOr<Chain> Parse(absl::string_view text) {
    bool seen_header = false, seen_input = false;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      ++line_no_;
      std::vector<absl::string_view> tokens = absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
      for (size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i][0] == '#') {  // the rest of the line is a comment
          tokens.resize(i);
          break;
        }
      }
      if (tokens.empty()) continue;
      if (!seen_header) {
        if (tokens.size() != 2 || tokens[0] != "dtr-chain" || !absl::StartsWith(tokens[1], "v"))
          return Error("the first line must be 'dtr-chain v1'");
        int version = 0;
        if (!absl::SimpleAtoi(tokens[1].substr(1), &version) || version != kChainFormatVersion)
          return Error(absl::StrCat("unsupported chain format version '", tokens[1], "'; this build reads v",
                                    kChainFormatVersion));
        seen_header = true;
      } else if (tokens[0] == "input") {
        if (seen_input) return Error("a second 'input' line (the chain has one input)");
        if (tokens.size() < 2) return Error("expected 'input <a0_bytes>'");
        auto bytes = Bytes(tokens[1], "a0_bytes");
        if (!bytes.ok()) return bytes.status();
        chain_.input_bytes = *bytes;
        auto annotations = Annotations(tokens, 2);
        if (!annotations.ok()) return annotations.status();
        chain_.input_annotations = *std::move(annotations);
        seen_input = true;
      } else if (tokens[0] == "stage") {
        if (absl::Status s = ParseStage(tokens); !s.ok()) return s;
      } else {
        return Error(absl::StrCat("unknown line kind '", tokens[0], "' (expected 'input' or 'stage')"));
      }
    }
    if (!seen_header) return absl::InvalidArgumentError("empty chain: no 'dtr-chain v1' header");
    if (!seen_input) return absl::InvalidArgumentError("chain has no 'input <a0_bytes>' line");
    if (chain_.stages.empty()) return absl::InvalidArgumentError("chain has no 'stage' lines");
    return std::move(chain_);
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("chain line ", line_no_, ": ", what));
  }

  absl::StatusOr<uint64_t> Bytes(absl::string_view text, absl::string_view field) const {
    uint64_t value;
    if (text.empty() || text[0] == '-' || text[0] == '+' || !absl::SimpleAtoi(text, &value))
      return Error(absl::StrCat(field, ": expected a non-negative integer byte count, got '", text, "'"));
    return value;
  }

  absl::StatusOr<double> Cost(absl::string_view text, absl::string_view field) const {
    double value;
    if (!absl::SimpleAtod(text, &value) || !std::isfinite(value) || !(value >= 0))
      return Error(absl::StrCat(field, ": expected a non-negative finite cost, got '", text, "'"));
    return value;
  }

  absl::StatusOr<ChainAnnotations> Annotations(const std::vector<absl::string_view>& tokens, size_t first) const {
    ChainAnnotations annotations;
    for (size_t i = first; i < tokens.size(); ++i) {
      size_t eq = tokens[i].find('=');
      if (eq == absl::string_view::npos || eq == 0)
        return Error(absl::StrCat("unexpected extra field '", tokens[i], "' (extra fields must be key=value)"));
      annotations.emplace_back(std::string(tokens[i].substr(0, eq)), std::string(tokens[i].substr(eq + 1)));
    }
    return annotations;
  }

  absl::Status ParseStage(const std::vector<absl::string_view>& tokens) {
    constexpr size_t kFields = 8;  // "stage" and seven values
    if (tokens.size() < kFields)
      return Error(
          absl::StrCat("expected 'stage <name> <u_f> <u_b> <a_bytes> <abar_bytes> <o_f_bytes> <o_b_bytes>', "
                       "got ",
                       tokens.size() - 1, " of its 7 fields"));
    ChainStage stage;
    stage.name = std::string(tokens[1]);
    auto u_f = Cost(tokens[2], "u_f");
    auto u_b = Cost(tokens[3], "u_b");
    auto a = Bytes(tokens[4], "a_bytes");
    auto abar = Bytes(tokens[5], "abar_bytes");
    auto o_f = Bytes(tokens[6], "o_f_bytes");
    auto o_b = Bytes(tokens[7], "o_b_bytes");
    for (const absl::Status& s : {u_f.status(), u_b.status(), a.status(), abar.status(), o_f.status(), o_b.status()})
      if (!s.ok()) return s;
    stage.forward_cost = *u_f;
    stage.backward_cost = *u_b;
    stage.activation_bytes = *a;
    stage.saved_for_backward_bytes = *abar;
    stage.forward_overhead_bytes = *o_f;
    stage.backward_overhead_bytes = *o_b;
    auto annotations = Annotations(tokens, kFields);
    if (!annotations.ok()) return annotations.status();
    stage.annotations = *std::move(annotations);
    chain_.stages.push_back(std::move(stage));
    return absl::OkStatus();
  }

  Chain chain_;
  int line_no_ = 0;
};

}  // namespace

double Chain::forward_cost(int l) const { return l >= 1 && l <= length() ? stages[l - 1].forward_cost : 0; }
double Chain::backward_cost(int l) const { return l >= 1 && l <= length() ? stages[l - 1].backward_cost : 0; }
uint64_t Chain::activation_bytes(int l) const {
  if (l == 0) return input_bytes;
  return l >= 1 && l <= length() ? stages[l - 1].activation_bytes : 0;
}
uint64_t Chain::saved_for_backward_bytes(int l) const {
  return l >= 1 && l <= length() ? stages[l - 1].saved_for_backward_bytes : 0;
}
uint64_t Chain::forward_overhead_bytes(int l) const {
  return l >= 1 && l <= length() ? stages[l - 1].forward_overhead_bytes : 0;
}
uint64_t Chain::backward_overhead_bytes(int l) const {
  return l >= 1 && l <= length() ? stages[l - 1].backward_overhead_bytes : 0;
}

double Chain::base_cost() const {
  double total = 0;
  for (const ChainStage& stage : stages) total += stage.forward_cost + stage.backward_cost;
  return total;
}

absl::StatusOr<Chain> ParseChain(absl::string_view text) { return ChainParser().Parse(text); }

absl::StatusOr<Chain> ReadChainFile(const std::string& path) { return ParseTextInput(path, "chain", ParseChain); }

void WriteChain(const Chain& chain, std::ostream& out) {
  out << "dtr-chain v" << kChainFormatVersion << "\n";
  out << "input " << chain.input_bytes;
  WriteAnnotations(chain.input_annotations, out);
  out << "\n";
  for (const ChainStage& s : chain.stages) {
    out << "stage " << s.name << ' ' << FormatCost(s.forward_cost) << ' ' << FormatCost(s.backward_cost) << ' '
        << s.activation_bytes << ' ' << s.saved_for_backward_bytes << ' ' << s.forward_overhead_bytes << ' '
        << s.backward_overhead_bytes;
    WriteAnnotations(s.annotations, out);
    out << "\n";
  }
}

std::string ChainToString(const Chain& chain) {
  std::ostringstream out;
  WriteChain(chain, out);
  return out.str();
}

}  // namespace dtr::sim

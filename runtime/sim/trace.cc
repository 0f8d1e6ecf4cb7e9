// Trace parsing and writing; see Note [Trace format] in trace.h.
#include "runtime/sim/trace.h"

#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "runtime/sim/text_input.h"

namespace dtr::sim {
namespace {

class Parser {
 public:
  absl::StatusOr<Trace> Parse(absl::string_view text) {
    bool seen_header = false;
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      ++line_no_;
      line = absl::StripAsciiWhitespace(line);
      if (line.empty() || line[0] == '#') continue;
      std::vector<absl::string_view> tok = absl::StrSplit(line, ' ', absl::SkipWhitespace());
      if (!seen_header) {
        if (tok.size() != 2 || tok[0] != "dtr-trace" || !absl::SimpleAtoi(tok[1], &version_))
          return Error("the first line must be 'dtr-trace <version>'");
        if (version_ < kOldestTraceVersion || version_ > kTraceVersion)
          return Error(absl::StrCat("unsupported trace version ", version_, "; this build reads versions ",
                                    kOldestTraceVersion, " to ", kTraceVersion));
        seen_header = true;
        continue;
      }
      if (absl::Status s = ParseEvent(tok); !s.ok()) return s;
    }
    if (!seen_header) return absl::InvalidArgumentError("empty trace: no 'dtr-trace <version>' header");
    return std::move(trace_);
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("trace line ", line_no_, ": ", what));
  }

  absl::StatusOr<int> Define(absl::string_view name) {
    if (name.empty() || name.find_first_of(":=") != absl::string_view::npos)
      return Error(absl::StrCat("bad tensor name '", name, "'"));
    auto [it, inserted] = ids_.try_emplace(std::string(name), int(trace_.tensor_names.size()));
    if (!inserted) return Error(absl::StrCat("tensor '", name, "' is defined twice"));
    trace_.tensor_names.emplace_back(name);
    return it->second;
  }

  absl::StatusOr<int> Use(absl::string_view name) const {
    auto it = ids_.find(std::string(name));
    if (it == ids_.end()) return Error(absl::StrCat("tensor '", name, "' is used before it is defined"));
    return it->second;
  }

  absl::StatusOr<uint64_t> Size(absl::string_view text) const {
    uint64_t v;
    if (!absl::SimpleAtoi(text, &v)) return Error(absl::StrCat("bad byte size '", text, "'"));
    return v;
  }

  absl::StatusOr<double> Cost(absl::string_view text) const {
    double v;
    if (!absl::SimpleAtod(text, &v) || !(v >= 0)) return Error(absl::StrCat("bad cost '", text, "'"));
    return v;
  }

  absl::Status ParseEvent(std::vector<absl::string_view>& tok) {
    TraceEvent e;
    absl::string_view kind = tok[0];
    if (kind == "const") {
      if (tok.size() != 3) return Error("expected 'const T BYTES'");
      e.kind = EventKind::kConst;
      TraceOutput out;
      auto size = Size(tok[2]);
      if (!size.ok()) return size.status();
      out.size = *size;
      auto t = Define(tok[1]);
      if (!t.ok()) return t.status();
      out.tensor = *t;
      e.outputs.push_back(out);
    } else if (kind == "call" || kind == "opaque" || kind == "mutate" || kind == "mutate-opaque" ||
               kind == "overwrite") {
      e.kind = kind == "call" ? EventKind::kCall : kind == "opaque" ? EventKind::kOpaque : EventKind::kMutate;
      e.replayable = kind != "mutate-opaque";
      e.overwrites = kind == "overwrite";
      if (tok.size() < 4) return Error(absl::StrCat("expected '", kind, " NAME COST IN... -> OUT...'"));
      e.name = std::string(tok[1]);
      auto cost = Cost(tok[2]);
      if (!cost.ok()) return cost.status();
      e.cost = *cost;
      size_t i = 3;
      // Note [Trace format]: tensor names never hold '=', so the optional field is unambiguous.
      if (i < tok.size() && absl::ConsumePrefix(&tok[i], "scratch=")) {
        if (version_ < 2) return Error("'scratch=' needs trace version 2");
        auto scratch = Size(tok[i]);
        if (!scratch.ok()) return scratch.status();
        e.scratch = *scratch;
        ++i;
      }
      if (i < tok.size() && tok[i] == "pass=backward") {
        if (version_ < 4) return Error("'pass=backward' needs trace version 4");
        e.backward = true;
        ++i;
      }
      if (i < tok.size() && tok[i] == "copy=whole") {
        if (version_ < 6) return Error("'copy=whole' needs trace version 6");
        if (e.kind != EventKind::kCall) return Error("'copy=whole' is for call lines");
        e.copies_input = true;
        ++i;
      }
      for (; i < tok.size() && tok[i] != "->"; ++i) {
        auto t = Use(tok[i]);
        if (!t.ok()) return t.status();
        e.inputs.push_back(*t);
      }
      if (i == tok.size()) return Error("missing '->'");
      for (++i; i < tok.size(); ++i) {
        if (e.kind == EventKind::kMutate) {
          auto t = Use(tok[i]);
          if (!t.ok()) return t.status();
          bool is_input = false;
          for (int in : e.inputs) is_input |= in == *t;
          if (!is_input) return Error(absl::StrCat("mutated tensor '", tok[i], "' is not an input"));
          e.mutated.push_back(*t);
          continue;
        }
        TraceOutput out;
        size_t colon = tok[i].find(':'), eq = tok[i].find('=');
        if (colon != absl::string_view::npos) {
          auto size = Size(tok[i].substr(colon + 1));
          if (!size.ok()) return size.status();
          out.size = *size;
          auto t = Define(tok[i].substr(0, colon));
          if (!t.ok()) return t.status();
          out.tensor = *t;
        } else if (eq != absl::string_view::npos) {
          auto base = Use(tok[i].substr(eq + 1));
          if (!base.ok()) return base.status();
          out.alias_of = *base;
          auto t = Define(tok[i].substr(0, eq));
          if (!t.ok()) return t.status();
          out.tensor = *t;
        } else {
          return Error(absl::StrCat("output '", tok[i], "' must be T:BYTES or T=BASE"));
        }
        e.outputs.push_back(out);
      }
      if (e.kind == EventKind::kMutate && e.mutated.empty()) return Error("mutate writes no tensor");
      if (e.overwrites && e.mutated.size() != 1) return Error("overwrite writes exactly one tensor");
    } else if (kind == "copy") {
      if (tok.size() != 3) return Error("expected 'copy T OLD'");
      e.kind = EventKind::kCopy;
      auto src = Use(tok[2]);
      if (!src.ok()) return src.status();
      auto t = Define(tok[1]);
      if (!t.ok()) return t.status();
      e.tensor = *t;
      e.source = *src;
    } else if (kind == "release") {
      if (tok.size() != 2) return Error("expected 'release T'");
      e.kind = EventKind::kRelease;
      auto t = Use(tok[1]);
      if (!t.ok()) return t.status();
      e.tensor = *t;
    } else if (kind == "mark") {
      if (version_ < 3) return Error("'mark' needs trace version 3");
      if (tok.size() != 2) return Error("expected 'mark LABEL'");
      e.kind = EventKind::kMark;
      e.name = std::string(tok[1]);
    } else if (kind == "wait") {
      if (version_ < 5) return Error("'wait' needs trace version 5");
      if (tok.size() != 2) return Error("expected 'wait TIME'");
      e.kind = EventKind::kWait;
      auto time = Cost(tok[1]);
      if (!time.ok()) return time.status();
      e.cost = *time;
    } else {
      return Error(absl::StrCat("unknown event '", kind,
                                "'; expected const, call, opaque, mutate, mutate-opaque, overwrite, copy, release, "
                                "mark or wait"));
    }
    trace_.events.push_back(std::move(e));
    return absl::OkStatus();
  }

  Trace trace_;
  absl::flat_hash_map<std::string, int> ids_;
  int line_no_ = 0;
  int version_ = 0;
};

}  // namespace

absl::StatusOr<Trace> ParseTrace(absl::string_view text) { return Parser().Parse(text); }

absl::StatusOr<Trace> ReadTraceFile(const std::string& path) { return ParseTextInput(path, "trace", ParseTrace); }

void WriteTrace(const Trace& trace, std::ostream& out) {
  const auto& names = trace.tensor_names;
  out << "dtr-trace " << kTraceVersion << "\n";
  for (const TraceEvent& e : trace.events) {
    switch (e.kind) {
      case EventKind::kConst:
        out << "const " << names[e.outputs[0].tensor] << " " << e.outputs[0].size << "\n";
        break;
      case EventKind::kCall:
      case EventKind::kOpaque:
      case EventKind::kMutate: {
        const char* word = e.kind == EventKind::kCall     ? "call "
                           : e.kind == EventKind::kOpaque ? "opaque "
                           : !e.replayable                ? "mutate-opaque "
                           : e.overwrites                 ? "overwrite "
                                                          : "mutate ";
        out << word << e.name << " " << e.cost;
        if (e.scratch > 0) out << " scratch=" << e.scratch;
        if (e.backward) out << " pass=backward";
        if (e.copies_input) out << " copy=whole";
        for (int in : e.inputs) out << " " << names[in];
        out << " ->";
        if (e.kind == EventKind::kMutate) {
          for (int m : e.mutated) out << " " << names[m];
        } else {
          for (const TraceOutput& o : e.outputs) {
            if (o.alias_of >= 0) out << " " << names[o.tensor] << "=" << names[o.alias_of];
            else out << " " << names[o.tensor] << ":" << o.size;
          }
        }
        out << "\n";
        break;
      }
      case EventKind::kCopy:
        out << "copy " << names[e.tensor] << " " << names[e.source] << "\n";
        break;
      case EventKind::kRelease:
        out << "release " << names[e.tensor] << "\n";
        break;
      case EventKind::kMark:
        out << "mark " << e.name << "\n";
        break;
      case EventKind::kWait:
        out << "wait " << e.cost << "\n";
        break;
    }
  }
}

std::string TraceToString(const Trace& trace) {
  std::ostringstream out;
  out.precision(17);
  WriteTrace(trace, out);
  return out.str();
}

}  // namespace dtr::sim

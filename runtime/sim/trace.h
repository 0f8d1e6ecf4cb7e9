// The dtr trace format: a versioned, line-oriented text log of what a training program did
// (op calls with their inputs, outputs, sizes, costs and aliasing; in-place ops; reference
// copies and drops). The torch layer writes it (DTR_TRACE_FILE); dtr-sim replays it.
//
// Note [Trace format]
//   dtr-trace 5                                  first non-comment line: magic and version
//   # anything                                   comment (also blank lines)
//   const T BYTES                                a constant storage (parameter, input) named T
//   call NAME COST [scratch=B] [pass=backward] [copy=whole] IN... -> OUT...
//                                                an op; each OUT is T:BYTES (new storage) or
//                                                T=BASE (a view of BASE's storage)
//   opaque NAME COST IN... -> OUT...             like call, but not replayable (outputs are
//                                                constants: an op that cannot be replayed)
//   mutate NAME COST IN... -> T...               in-place op writing the listed inputs
//   mutate-opaque NAME COST IN... -> T...        like mutate, but not replayable (the written
//                                                storages become constants)
//   overwrite NAME COST IN... -> T               in-place op writing all of T's storage without
//                                                reading it (Runtime::MutateCall::overwrites)
//   copy T OLD                                   T is another reference to OLD's tensor
//   release T                                    the program dropped its reference T
//   mark LABEL                                   a point the program named (torch.ops.dtr.
//                                                trace_mark): dtr-sim reports its costs so far
//                                                there, so a driver can measure the steps after
//                                                a warm-up (Note [Steady-state steps])
//   wait TIME                                    the program's own time since the last op
//                                                ended (Python, dispatch, work dtr does not
//                                                see), in clock units: Note [Program time
//                                                between ops] (remat.cc)
// Tensor names are tokens without whitespace, ':' or '='; every name is defined once (the
// torch layer numbers them). COST is a non-negative number in clock units (ns for real runs).
// Every op line (call, opaque, mutate, mutate-opaque, overwrite) may give, right after COST,
// `scratch=B`: the bytes of workspace the op held beyond its inputs and outputs while it ran
// (Note [Scratch memory], runtime.cc); absent means 0. After it may come `pass=backward`: the op ran
// in a backward pass (Note [Results of the backward pass], eviction_search.cc). A call may end its
// options with `copy=whole`: its one output is a byte-for-byte copy of its one input's storage
// (Runtime::OpCall::copies_input, Note [Copies of overwritten contents], mutation.cc).
// Version 1 is version 2 without `scratch=`, version 2 is version 3 without `mark`, version 3
// is version 4 without `pass=backward`, version 4 is version 5 without `wait`, and version 5 is
// version 6 without `copy=whole`; all are still read.
// A new tensor holds one reference; a storage lives while any of its tensors is referenced.
#ifndef DTR_RUNTIME_SIM_TRACE_H_
#define DTR_RUNTIME_SIM_TRACE_H_

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtr::sim {

inline constexpr int kTraceVersion = 6;
inline constexpr int kOldestTraceVersion = 1;

enum class EventKind { kConst, kCall, kOpaque, kMutate, kCopy, kRelease, kMark, kWait };

struct TraceOutput {
  int tensor = -1;
  uint64_t size = 0;   // for new storages
  int alias_of = -1;   // tensor whose storage this output views, or -1
};

struct TraceEvent {
  EventKind kind;
  std::string name;          // op name (call/opaque/mutate); mark: its label
  double cost = 0;            // call/opaque/mutate: the op's; wait: the program's time
  uint64_t scratch = 0;      // call/opaque/mutate: Note [Scratch memory]
  bool backward = false;      // call/opaque/mutate: ran in a backward pass (pass=backward)
  bool copies_input = false;  // call: copy=whole
  std::vector<int> inputs;   // tensor indices (mutate: all inputs)
  std::vector<TraceOutput> outputs;  // call/opaque: outputs; const: one output
  std::vector<int> mutated;  // mutate: written tensors, a subset of inputs
  bool replayable = true;    // mutate: false for mutate-opaque
  bool overwrites = false;   // mutate: true for overwrite
  int tensor = -1;           // copy/release: the tensor; copy: new name
  int source = -1;           // copy: the existing tensor
};

struct Trace {
  std::vector<std::string> tensor_names;  // index -> name
  std::vector<TraceEvent> events;
};

absl::StatusOr<Trace> ParseTrace(absl::string_view text);
// `path` "-" reads standard input (runtime/sim/text_input.h).
absl::StatusOr<Trace> ReadTraceFile(const std::string& path);
void WriteTrace(const Trace& trace, std::ostream& out);
std::string TraceToString(const Trace& trace);

}  // namespace dtr::sim

#endif  // DTR_RUNTIME_SIM_TRACE_H_

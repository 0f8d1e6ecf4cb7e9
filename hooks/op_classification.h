// How the fallback treats an operator, decided once per schema from the schema alone (OpInfo,
// Classify): pass it through, record it as the recipe of its outputs, route its writes through
// Runtime::Mutate, treat it as a view, or run it unrecorded. Also which ops draw from the default
// CPU generator (Note [Random ops without a Generator argument], op_classification.cc) and a
// fingerprint of that generator (GenMark).
#ifndef DTR_HOOKS_OP_CLASSIFICATION_H_
#define DTR_HOOKS_OP_CLASSIFICATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/function_schema.h>

#include "absl/strings/string_view.h"

namespace dtr::hooks {

enum class Kind {
  kPassthrough,  // runs untouched (no tensors, dtr:: control ops)
  kRecord,       // a functional op: recorded as the recipe of its new output storages
  kMutate,       // writes tensor arguments (a non-aten op: all of them): goes through Runtime::Mutate
  kView,         // an output aliases an input: never recorded (rule 4)
  kOpaque,       // runs unrecorded; its outputs become constants
  kCommunication,  // a collective or point-to-point op (Note [Communication is never replayed])
};

struct OpInfo {
  Kind kind = Kind::kPassthrough;
  bool replayable = false;
  std::vector<int> write_args;
  bool write_all = false;  // non-aten op with tensor args: treat every tensor input as written
  int gen_arg = -1;
  bool seeded_no_gen = false;
  // Note [Overwriting in-place ops] (op_classification.cc): writes every element of its single
  // written tensor without reading it (fill_, zero_, bernoulli_, uniform_, normal_, ...).
  bool overwrites = false;
  // aten::native_batch_norm, cudnn_batch_norm or miopen_batch_norm (Note [Hidden mutation in
  // native_batch_norm], fallback.cc): decided here, not by comparing names on every op.
  bool batch_norm = false;
  // aten::clone: its output may be a whole copy of its input's storage (Note [Copies of
  // overwritten contents], runtime/mutation.cc; decided per call in the fallback).
  bool clone = false;
  std::string name;
  absl::string_view interned_name;  // the runtime's copy of name (Runtime::InternName)
  // Note [Unevictable memory by reason] (hooks/memory_report.cc): its interned "written in place
  // by" reason, once it wrote a storage it could not record.
  uint16_t writer_reason = 0;
};

// `record_empty` is the debug switch for design rule 4 (never record empty* outputs: their
// contents are whatever the program writes next, possibly outside the dispatcher).
OpInfo Classify(const c10::FunctionSchema& schema, bool record_empty);

// Whether the calling thread is a communication backend's worker (gloo's pt_gloo_runloop threads,
// NCCL's watchdog): ops there are never recorded (Note [Communication is never replayed]).
// Decided once per thread, from the name the backend gives the thread before its first op.
bool OnCommunicationThread();

// The default generator of `device`: the CUDA device's Philox generator, else the CPU one.
at::Generator DefaultGenerator(c10::Device device);

// A cheap fingerprint of a default generator's position in its stream: the CPU Mersenne
// Twister's state, or a Philox generator's seed and offset.
struct GenMark {
  uint64_t seed = 0;
  int left = 0;
  uint32_t next = 0;
  uint64_t offset = 0;
  bool has_f = false, has_d = false;
  static GenMark Now(c10::Device device = c10::Device(c10::DeviceType::CPU));
  bool operator==(const GenMark& o) const {
    return seed == o.seed && left == o.left && next == o.next && offset == o.offset && has_f == o.has_f &&
           has_d == o.has_d;
  }
};

}  // namespace dtr::hooks

#endif  // DTR_HOOKS_OP_CLASSIFICATION_H_

// Every difference between the PyTorch releases dtr supports (2.11 to 2.14), in one place. Code
// elsewhere in hooks/ uses these names, never TORCH_VERSION_* directly.
//
// | API                                   | releases        | what dtr does                                  |
// |---------------------------------------|-----------------|------------------------------------------------|
// | c10::Allocator::allocate non-const,   | all 2.x         | CpuAllocatorAdapter overrides the 2.x form     |
// |   copy_data pure virtual              |                 |                                                |
// | DispatchKey::Fake above Python        | 2.11 (2.12?)    | the fallback passes ops whose key set has      |
// |   (below Python from 2.13)            |                 | Python (Note [Key order], fallback.cc): a run- |
// |                                       |                 | time check, both orders in one binary          |
// | headers #error below C++20            | 2.14            | every target is C++20                          |
// | Fake owned by torch's C++ FakeTensor  | after 2.14?     | RegisterFallback refuses, dtr stays inactive   |
// | private members read on every op:     | 2.13, 2.14      | PrivateMember (Note [Reading torch's private   |
// |   Context::fp32_precision (also       |   (read there;  |   members], below); a renamed or retyped       |
// |   written by replays),                |   2.11, 2.12    |   member fails to compile; what the map means  |
// |   CPUGeneratorImpl::engine_ and its   |   unchecked)    |   is checked by tests/hooks/replay_state_test  |
// |   next_{float,double}_normal_sample_, |                 |                                                |
// |   mt19937_engine::data_               |                 |                                                |
// Binaries are per wheel: a dtr built against one torch is refused with another
// (python/dtr/_library.py, check_torch).
#ifndef DTR_HOOKS_TORCH_COMPAT_H_
#define DTR_HOOKS_TORCH_COMPAT_H_

#include <torch/version.h>

#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 11)
#error "dtr supports PyTorch 2.11 to 2.14: install one of those and rebuild (LibTorch 1.x was dropped)"
#endif

namespace dtr::hooks {

// Note [Reading torch's private members]
// A few per-op reads have no cheap or exact public accessor: the public one copies 2.5 KB
// (CPUGeneratorImpl::engine()) or resolves what it reads (Context::float32Precision, Note [Raw
// float32 precisions], replay_record.cc). PrivateMember reaches the member itself, by the C++
// rule that access is not checked in the arguments of an explicit instantiation. The member's
// type is spelled out in its tag, so a torch that renames or retypes it fails to compile here
// instead of reading the wrong bytes. Each tag is declared once, beside its one use; the tags
// cannot move into an unnamed namespace (their friend Member would then name another function
// than the one PrivateMember defines). Usage:
//   struct EngineTag { using type = at::mt19937 at::CPUGeneratorImpl::*; friend type Member(EngineTag); };
//   template struct PrivateMember<EngineTag, &at::CPUGeneratorImpl::engine_>;
//   ... gen->*Member(EngineTag{}) ...
template <typename Tag, typename Tag::type kMember>
struct PrivateMember {
  friend typename Tag::type Member(Tag) { return kMember; }
};

}  // namespace dtr::hooks

#endif  // DTR_HOOKS_TORCH_COMPAT_H_

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
// | private members read on every op:     | 2.11 to 2.14    | PrivateMember (Note [Reading torch's private   |
// |   Context::fp32_precision,            |   (same names   |   members], below); a renamed or retyped       |
// |   CPUGeneratorImpl::engine_,          |   and types)    |   member fails to compile                      |
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
// A few per-op reads have no cheap public accessor: the public one copies 2.5 KB
// (CPUGeneratorImpl::engine()) or hashes (Context::float32Precision). PrivateMember reads the
// member itself, by the C++ rule that access is not checked in the arguments of an explicit
// instantiation. The member's type is spelled out in its tag, so a torch that renames or retypes
// it fails to compile here instead of reading the wrong bytes. Usage:
//   struct EngineTag { using type = at::mt19937 at::CPUGeneratorImpl::*; friend type Member(EngineTag); };
//   template struct PrivateMember<EngineTag, &at::CPUGeneratorImpl::engine_>;
//   ... gen->*Member(EngineTag{}) ...
template <typename Tag, typename Tag::type kMember>
struct PrivateMember {
  friend typename Tag::type Member(Tag) { return kMember; }
};

}  // namespace dtr::hooks

#endif  // DTR_HOOKS_TORCH_COMPAT_H_

// Every difference in torch's CUDAAllocator interface (c10/cuda/CUDACachingAllocator.h) between
// the releases dtr supports, in one table; CudaAllocatorAdapter (cuda_allocator.h) overrides a
// method only where the release declares it. Methods not listed are identical in 2.11 to 2.14.
//
// | method                          | releases    | native backend      | dtr backend                   |
// |---------------------------------|-------------|---------------------|-------------------------------|
// | getContextForPointer            | 2.12-2.14   | forwarded           | nullptr (no history)          |
// | attachOomRejectionObserver      | 2.12-2.14   | forwarded           | kept (dtr never pre-rejects)  |
// | markCaptureBegin/markCaptureEnd | 2.13-2.14   | forwarded           | refused (no graph capture)    |
// | allocateWithAddress             | 2.13-2.14   | forwarded (untracked)| refused                      |
// | supportsUserMetadata            | 2.14        | forwarded           | false                         |
// | annotateMemory                  | 2.14        | forwarded           | ignored, warns once           |
// | setUserMetadata (body only)     | 2.11-2.13 no-op, 2.14 warns | forwarded | ignored                  |
// | SnapshotInfo host_segments/     | 2.14        | forwarded           | left empty (no host segments) |
// |   host_traces                   |             |                     |                               |
// | DeviceStats num_oom_rejections  | 2.12-2.14   | forwarded           | 0                             |
// No method changed its signature across these releases; methods were only added (mid-vtable, so
// a binary is tied to its release: python/dtr/_library.py refuses another torch). Read from the
// 2.11.0, 2.12.0, 2.13.0 and 2.14.1 cu130 wheels' headers; 2.13 and 2.14 are compiled in CI, 2.11
// on the GPU machine (scripts/gpu-check.sh), 2.12 not at all.
#ifndef DTR_HOOKS_CUDA_COMPAT_H_
#define DTR_HOOKS_CUDA_COMPAT_H_

#include "hooks/torch_compat.h"

#define DTR_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#define DTR_CUDA_ALLOC_HAS_GET_CONTEXT_FOR_POINTER DTR_TORCH_AT_LEAST(2, 12)
#define DTR_CUDA_ALLOC_HAS_OOM_REJECTION_OBSERVER DTR_TORCH_AT_LEAST(2, 12)
#define DTR_CUDA_ALLOC_HAS_MARK_CAPTURE DTR_TORCH_AT_LEAST(2, 13)
#define DTR_CUDA_ALLOC_HAS_ALLOCATE_WITH_ADDRESS DTR_TORCH_AT_LEAST(2, 13)
#define DTR_CUDA_ALLOC_HAS_SUPPORTS_USER_METADATA DTR_TORCH_AT_LEAST(2, 14)
#define DTR_CUDA_ALLOC_HAS_ANNOTATE_MEMORY DTR_TORCH_AT_LEAST(2, 14)

#endif  // DTR_HOOKS_CUDA_COMPAT_H_

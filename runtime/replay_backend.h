// ReplayBackend: the mechanism the runtime drives. The runtime decides what to evict and what to
// replay; the backend owns the actual buffers. The torch layer implements it with StorageImpls
// and recorded operator calls; the simulator with hashed values; tests with fakes.
#ifndef DTR_RUNTIME_REPLAY_BACKEND_H_
#define DTR_RUNTIME_REPLAY_BACKEND_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "runtime/ids.h"
#include "runtime/records.h"

namespace dtr {

class ReplayBackend {
 public:
  virtual ~ReplayBackend() = default;

  // Re-executes `op`. Every input is resident and locked. For an op that creates its outputs,
  // keep[i] says whether output i must be put back into its (evicted) storage; outputs with
  // keep[i] == false are already resident or no longer produced by this op alone and must be
  // discarded. For an in-place op, outputs[0] is resident and is mutated again. Returns the
  // measured cost in clock units (simulators return op.cost).
  virtual absl::StatusOr<double> Replay(OpId id, const OpRecord& op, absl::Span<const bool> keep) = 0;

  // Releases the memory of a resident storage. `permanently` is false for an eviction (the
  // storage will be rematerialized by replay if needed) and true when the record is going away
  // (banished, or collected once nothing can need it).
  virtual void Release(StorageId id, const StorageRecord& storage, bool permanently) = 0;

  // Called after a storage's whole recipe has been replayed (checks, bookkeeping).
  virtual absl::Status OnRematerialized(StorageId id, const StorageRecord& storage) {
    return absl::OkStatus();
  }
  // Note [Copies of overwritten contents] (mutation.cc): a handle of its own for a record that
  // replays `op` as it was recorded and keeps only its output `output`; 0 if the backend cannot
  // make one (the runtime then freezes the copy, as without this).
  virtual uint64_t CopyReplay(const OpRecord& op, size_t output) { return 0; }
  // Called when an op record is dropped: no live storage can replay it any more.
  virtual void OnOpDropped(OpId id, const OpRecord& op) {}
};

}  // namespace dtr

#endif  // DTR_RUNTIME_REPLAY_BACKEND_H_

// Identifiers for the runtime's records. A StorageId / OpId is a slot index plus a generation, so
// an id that outlives its record (the torch layer may hold one after the record was collected)
// is detected instead of silently aliasing a newer record.
#ifndef DTR_RUNTIME_IDS_H_
#define DTR_RUNTIME_IDS_H_

#include <cstdint>
#include <functional>

namespace dtr {

template <typename Tag>
struct SlotId {
  uint32_t index = UINT32_MAX;
  uint32_t generation = 0;

  bool valid() const { return index != UINT32_MAX; }
  uint64_t packed() const { return (uint64_t{generation} << 32) | index; }
  static SlotId FromPacked(uint64_t v) { return SlotId{uint32_t(v), uint32_t(v >> 32)}; }
  friend bool operator==(SlotId a, SlotId b) { return a.index == b.index && a.generation == b.generation; }
  friend bool operator!=(SlotId a, SlotId b) { return !(a == b); }
  friend bool operator<(SlotId a, SlotId b) { return a.packed() < b.packed(); }
  template <typename H>
  friend H AbslHashValue(H h, SlotId id) { return H::combine(std::move(h), id.packed()); }
};

struct StorageTag {};
struct OpTag {};
using StorageId = SlotId<StorageTag>;
using OpId = SlotId<OpTag>;

}  // namespace dtr

#endif  // DTR_RUNTIME_IDS_H_

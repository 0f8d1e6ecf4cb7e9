// How dtr recognizes its storages: every DataPtr our CPU allocator hands out carries a Slot, every
// storage the runtime knows has an Entry, and an evicted storage holds a tombstone. The deleters
// of those DataPtrs tell the engine (g_engine, engine.h) when a tracked storage dies, and give
// resident blocks back to its caching allocator.
//
// Note [Slots and tombstones]
// Every DataPtr our allocator hands out has a Slot as context (mem, bytes, the Entry it belongs
// to, an allocation serial). An evicted storage holds a tombstone: a DataPtr with a null pointer
// whose context is a Slot with mem == nullptr and the same deleter. So the deleter runs whenever
// a tracked storage dies, resident or evicted, and the context of any storage tells us in O(1)
// whether it is ours and which runtime record it has. Before we ourselves replace a DataPtr
// (evict, restore, permanent release) we clear the old Slot's entry, so its deleter only frees.
#ifndef DTR_HOOKS_STORAGE_SLOTS_H_
#define DTR_HOOKS_STORAGE_SLOTS_H_

#include <cstddef>
#include <cstdint>

#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include "runtime/ids.h"

namespace dtr::hooks {

struct Entry;

// A resident slot sits in the first kHeader bytes of its allocator block, and the DataPtr's data
// and context are both the byte after it (c10's raw_allocate requires context == data). A
// tombstone slot is heap-allocated and has mem == nullptr.
struct Slot {
  void* mem = nullptr;  // the allocator block (== this for resident slots); nullptr: tombstone
  size_t bytes = 0;
  Entry* entry = nullptr;
  uint64_t serial = 0;
  // >= 0: memory on that CUDA device, a heap slot owned by the CUDA adapter (Note [CUDA slots],
  // cuda_allocator.cc); -1: host memory (resident slots live in their block's header).
  int16_t cuda_device = -1;
  // Note [Unevictable memory by reason] (memory_report.cc): set on a fresh output of an op dtr did
  // not record, which becomes a constant when first used; 0 for everything else.
  uint16_t origin = 0;
};
constexpr size_t kHeader = 64;
static_assert(sizeof(Slot) <= kHeader, "slot header");

// One per storage the runtime knows.
struct Entry {
  StorageId sid;
  c10::weak_intrusive_ptr<c10::StorageImpl> weak{c10::intrusive_ptr<c10::StorageImpl>()};
  c10::intrusive_ptr<c10::StorageImpl> owned;   // Note [Dead storages the runtime still needs]
  c10::intrusive_ptr<c10::StorageImpl> foreign; // memory not ours: kept alive while the entry is
  Slot* slot = nullptr;                          // current data slot or tombstone (ours only)
  size_t nbytes = 0;
  bool ours = false;
  // Note [Recording starts with a budget] (fallback.cc): allocated while ops passed through
  // unrecorded (before the first budget, or while paused); never made evictable by an overwrite,
  // since the pins that unrecorded ops would have taken on it (a packed weight, a CUDA graph, a
  // hidden alias) were never taken.
  bool made_unrecorded = false;
  bool dead = false;  // external reference dropped
  // Note [Memory read outside the dispatcher] (engine.cc): `changeable` contents may change
  // without an op (external memory, or a writable view handed out: numpy, DLPack), so no recipe
  // may read it; `kept_resident` holds one permanent runtime pin (a raw pointer or a
  // serialization handed out).
  bool external = false;
  c10::StorageImpl* foreign_key = nullptr;  // its key in Engine::foreign_ (memory not ours)
  bool exposed = false;
  bool kept_resident = false;
  bool changeable() const { return external || exposed; }
  int trace_id = -1;
  // Where a dead storage's bytes were (Slot::cuda_device) once its slot is gone (Note [Deaths
  // released at once], engine.cc), for the StorageImpl a later restore makes.
  int16_t dead_device = -1;
  // Note [Unevictable memory by reason] (memory_report.cc), Engine::Intern ids (0: none): the op
  // that made it without being recorded, the last op that wrote it without being replayable,
  // and what keeps a runtime pin on it.
  uint16_t origin = 0, writer = 0, pin_origin = 0;

  // The StorageImpl holding this storage's bytes now (strong ref), or null.
  c10::intrusive_ptr<c10::StorageImpl> impl() {
    if (owned) return owned;
    if (foreign) return foreign;
    return weak.lock();
  }
};

// What the engine did with a dying slot: nothing left to do but free it (kFree), took its bytes
// over or freed them itself (kKept), or will handle it later (kDeferred, Note [Deleters never
// wait]).
enum class SlotFate { kFree, kKept, kDeferred };

// The deleter of resident DataPtrs (data: the byte after the slot header) and of tombstones
// (ctx: the tombstone Slot). Both report a tracked storage's death to g_engine first.
void DataDeleter(void* data);
void TombDeleter(void* ctx);

inline Slot* SlotOfData(void* data) { return reinterpret_cast<Slot*>(static_cast<char*>(data) - kHeader); }
inline void* DataOf(Slot* s) { return reinterpret_cast<char*>(s) + kHeader; }

// The CUDA adapter's side of slots (Note [CUDA slots], cuda_allocator.cc), set when it is
// installed; all null in a CPU-only build or process.
struct CudaSlotOps {
  c10::DeleterFnPtr deleter = nullptr;       // the deleter of resident CUDA DataPtrs
  Slot* (*find)(const void* data) = nullptr;  // the slot of a resident CUDA pointer
  void (*free)(Slot* s) = nullptr;            // gives a CUDA slot's block back, deletes the slot
  c10::Allocator* allocator = nullptr;        // for StorageImpls the engine creates
};
extern CudaSlotOps g_cuda_slot_ops;

// Whether a DataPtr is one of ours (resident or tombstone).
bool IsOurs(const c10::DataPtr& dp);
// The slot (resident or tombstone) of one of our DataPtrs; nullptr for others.
Slot* SlotOf(const c10::DataPtr& dp);
// A tombstone DataPtr with `tomb` as its context, on `device` (the storage's device).
c10::DataPtr TombPtr(Slot* tomb, c10::Device device = c10::Device(c10::DeviceType::CPU));
// The device a slot's memory is (or, for a tombstone, was) on.
inline c10::Device SlotDevice(const Slot* s) {
  return s->cuda_device >= 0 ? c10::Device(c10::DeviceType::CUDA, c10::DeviceIndex(s->cuda_device))
                             : c10::Device(c10::DeviceType::CPU);
}
// A resident DataPtr for a slot whose bytes the engine took over (either device).
c10::DataPtr ResidentPtr(Slot* s);

// Allocation serials: the allocator stamps each new resident slot with the next one, so the
// fallback can tell storages allocated while an op ran (serial > the last serial before it).
uint64_t NextSlotSerial();
uint64_t LastSlotSerial();

}  // namespace dtr::hooks

#endif  // DTR_HOOKS_STORAGE_SLOTS_H_

// Slot deleters and lookups (see storage_slots.h, Note [Slots and tombstones]).
#include "hooks/storage_slots.h"

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "hooks/engine.h"

namespace dtr::hooks {
namespace {

std::atomic<uint64_t> g_serial{0};

}  // namespace

CudaSlotOps g_cuda_slot_ops;

uint64_t NextSlotSerial() { return ++g_serial; }
uint64_t LastSlotSerial() { return g_serial.load(); }

void DataDeleter(void* data) {
  Slot* s = SlotOfData(data);
  if (s->entry != nullptr && g_engine != nullptr && g_engine->OnSlotDeleted(s) != SlotFate::kFree) return;
  g_engine->FreeSlot(s);
}

void TombDeleter(void* ctx) {
  Slot* s = static_cast<Slot*>(ctx);
  // A deferred tombstone is deleted when the engine processes it (Note [Deleters never wait]).
  if (s->entry != nullptr && g_engine != nullptr && g_engine->OnSlotDeleted(s) == SlotFate::kDeferred) return;
  delete s;
}

bool IsOurs(const c10::DataPtr& dp) {
  c10::DeleterFnPtr d = dp.get_deleter();
  return d == &DataDeleter || d == &TombDeleter || (d != nullptr && d == g_cuda_slot_ops.deleter);
}

Slot* SlotOf(const c10::DataPtr& dp) {
  c10::DeleterFnPtr d = dp.get_deleter();
  if (d == &DataDeleter) return SlotOfData(dp.get_context());
  if (d == &TombDeleter) return static_cast<Slot*>(dp.get_context());
  if (d != nullptr && d == g_cuda_slot_ops.deleter) return g_cuda_slot_ops.find(dp.get());
  return nullptr;
}

c10::DataPtr TombPtr(Slot* tomb, c10::Device device) { return c10::DataPtr(nullptr, tomb, &TombDeleter, device); }

c10::DataPtr ResidentPtr(Slot* s) {
  if (s->cuda_device >= 0)
    return c10::DataPtr(s->mem, s->mem, g_cuda_slot_ops.deleter, c10::Device(c10::DeviceType::CUDA, s->cuda_device));
  return c10::DataPtr(DataOf(s), DataOf(s), &DataDeleter, c10::Device(c10::DeviceType::CPU));
}

}  // namespace dtr::hooks

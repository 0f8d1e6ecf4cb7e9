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

bool IsOurs(const c10::DataPtr& dp) { return dp.get_deleter() == &DataDeleter || dp.get_deleter() == &TombDeleter; }

Slot* SlotOf(const c10::DataPtr& dp) {
  if (dp.get_deleter() == &DataDeleter) return SlotOfData(dp.get_context());
  if (dp.get_deleter() == &TombDeleter) return static_cast<Slot*>(dp.get_context());
  return nullptr;
}

c10::DataPtr TombPtr(Slot* tomb) { return c10::DataPtr(nullptr, tomb, &TombDeleter, c10::Device(c10::DeviceType::CPU)); }

}  // namespace dtr::hooks

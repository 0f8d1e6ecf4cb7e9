// SlotMap: dense storage of records addressed by generation-checked SlotIds, with O(1) insert,
// erase and lookup and slot reuse. The runtime keeps storages and ops in these so that hot-path
// lookups are an index and a generation compare, not a hash.
#ifndef DTR_RUNTIME_SLOT_MAP_H_
#define DTR_RUNTIME_SLOT_MAP_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "runtime/ids.h"

namespace dtr {

template <typename Id, typename T>
class SlotMap {
 public:
  // Makes a default-constructed record in a free slot and returns its id, and the record through
  // *record for the caller to fill. The record is made where it lives, not built elsewhere and
  // moved in: a StorageRecord is about 250 bytes with inline vectors, and every recorded op
  // makes one per output and an OpRecord. *record is valid until the next Emplace.
  Id Emplace(T** record) {
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      index = uint32_t(slots_.size());
      slots_.emplace_back();
    }
    Slot& slot = slots_[index];
    *record = &slot.value.emplace();
    ++size_;
    return Id{index, slot.generation};
  }

  void Erase(Id id) {
    Slot& slot = slots_[id.index];
    slot.value.reset();
    ++slot.generation;
    free_.push_back(id.index);
    --size_;
  }

  bool Contains(Id id) const {
    return id.index < slots_.size() && slots_[id.index].generation == id.generation &&
           slots_[id.index].value.has_value();
  }
  T* Find(Id id) { return Contains(id) ? &*slots_[id.index].value : nullptr; }
  const T* Find(Id id) const { return Contains(id) ? &*slots_[id.index].value : nullptr; }
  // Unchecked access for ids the caller knows to be live (checked in debug builds).
  T& operator[](Id id) { return *slots_[id.index].value; }
  const T& operator[](Id id) const { return *slots_[id.index].value; }

  // Starts loading the first 128 bytes of a slot (wherever its cache lines begin), for a caller
  // about to visit many records at random.
  void Prefetch(Id id) const {
    if (id.index >= slots_.size()) return;
    const char* p = reinterpret_cast<const char*>(&slots_[id.index]);
    __builtin_prefetch(p);
    __builtin_prefetch(p + 64);
    __builtin_prefetch(p + 127);
  }
  size_t size() const { return size_; }

  // Calls fn(id, value) for every live record.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (uint32_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].value) fn(Id{i, slots_[i].generation}, *slots_[i].value);
  }
  template <typename Fn>
  void ForEach(Fn&& fn) {
    for (uint32_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].value) fn(Id{i, slots_[i].generation}, *slots_[i].value);
  }

 private:
  struct Slot {
    uint32_t generation = 0;
    std::optional<T> value;
  };
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
  size_t size_ = 0;
};

}  // namespace dtr

#endif  // DTR_RUNTIME_SLOT_MAP_H_

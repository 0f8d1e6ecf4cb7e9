// Recycler: keeps the memory of objects the engine makes and drops by the thousand a training
// step (an Entry per storage, a ReplayRecord per recorded op) for the next ones, instead of a
// malloc and a free each.
//
// Note [Recycled records]
// A training step makes an Entry for every storage it allocates and a ReplayRecord for every op
// it records, and drops nearly all of them again within the step or at the next optimizer step.
// glibc's malloc and free cost about 130 instructions a pair for these sizes (callgrind, the
// TreeLSTM with no budget), a tenth of what dtr adds to an op's own work apart from the kernel.
// Dropped objects are destroyed at once, as before, so nothing they held outlives them; only
// their memory is kept, up to kMaxSpare blocks (about 2 MiB of host memory for records), so a
// step that frees more returns the rest to malloc. Not thread-safe: the engine's lock guards it.
#ifndef DTR_HOOKS_RECYCLER_H_
#define DTR_HOOKS_RECYCLER_H_

#include <cstddef>
#include <new>
#include <utility>
#include <vector>

namespace dtr::hooks {

template <typename T, size_t kMaxSpare = 2048>
class Recycler {
 public:
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "blocks come from plain operator new");
  Recycler() { spare_.reserve(kMaxSpare); }  // so that Delete never allocates
  Recycler(const Recycler&) = delete;
  Recycler& operator=(const Recycler&) = delete;
  ~Recycler() {
    for (void* block : spare_) ::operator delete(block, sizeof(T));
  }

  template <typename... Args>
  T* New(Args&&... args) {
    void* block;
    if (spare_.empty()) {
      block = ::operator new(sizeof(T));
    } else {
      block = spare_.back();
      spare_.pop_back();
    }
    try {
      return new (block) T(std::forward<Args>(args)...);
    } catch (...) {
      spare_.push_back(block);
      throw;
    }
  }

  void Delete(T* object) {
    if (object == nullptr) return;
    object->~T();
    if (spare_.size() < kMaxSpare) spare_.push_back(object);
    else ::operator delete(static_cast<void*>(object), sizeof(T));
  }

  size_t spare() const { return spare_.size(); }

 private:
  std::vector<void*> spare_;
};

}  // namespace dtr::hooks

#endif  // DTR_HOOKS_RECYCLER_H_

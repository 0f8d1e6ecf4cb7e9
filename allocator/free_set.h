// The free blocks of one pool, indexed for best fit: the smallest free block of a stream with at
// least the requested size (Note [Binned free blocks]). Header-only, a template over the
// allocator's block type, so the index is tested on its own (tests/allocator/free_set_test.cc).
//
// Note [Binned free blocks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Block sizes are multiples of the allocator's granularity (min_block_size). A size up to
// kBins granules has a bin of its own: a doubly-linked list through the blocks themselves, most
// recently freed first, with one bit per bin in a 64 x 64 bitmap and one summary bit per bitmap
// word. A best-fit search is a masked word and a count of trailing zeros or two; adding or
// removing a block is a list splice and a bit. Larger sizes (CUDA's 512-byte granularity bins up
// to 2 MiB, the CPU allocator's 64 bytes up to 256 KiB) sit in a B-tree ordered by (stream,
// size, address), as in PyTorch's BlockComparator.
// Every binned size is below every B-tree size, so a search that finds no bin at or above the
// request takes the B-tree's smallest fit.
// Why: dtr's CPU allocator gives every tensor a segment of its own (Note [CPU allocator
// granularity], hooks/cpu_allocator_adapter.cc), so each op's output was a B-tree search and an
// erase, and each death an insert. allocator_bench's round trip of small tensors under that
// configuration: 224-274 ns an allocation or free with the B-tree alone, 118-123 ns binned
// (glibc malloc/free: 90-100 ns); its mixed trace 295-318 -> 177-182 ns.
// The policy stays PyTorch's best fit by size. Among free blocks of one binned size the most
// recently freed is handed out (its memory is likely still in cache), where the B-tree hands out
// the lowest address: keeping a bin in address order costs a walk of the bin on every insert, and
// with a segment per tensor, cached segments of one size pile up in a bin. allocator_bench's
// fragmentation (peak reserved / peak allocated): the mixed trace 1.513 either way, the small
// tensors' 1.198 -> 1.218.
// Invariants (CheckInvariants): each bin's list is linked both ways and holds only blocks of its
// size and stream; a bin's bit is set exactly when its list is not empty, a summary bit exactly
// when its word is not zero; size() counts the listed and the B-tree's blocks.
#ifndef DTR_ALLOCATOR_FREE_SET_H_
#define DTR_ALLOCATOR_FREE_SET_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/numeric/bits.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "allocator/stream.h"

namespace dtr::alloc {

// Block must have `uintptr_t ptr`, `size_t size`, `Stream stream` (its key, which must not change
// while it is in the set) and `Block* free_prev, *free_next` (the set's links, its own to write).
template <typename Block>
class FreeSet {
 public:
  static constexpr size_t kBins = 64 * 64;

  // `granularity`: a power of two dividing every block size.
  explicit FreeSet(size_t granularity) : granularity_(granularity), max_binned_(granularity * kBins) {}
  FreeSet(const FreeSet&) = delete;
  FreeSet& operator=(const FreeSet&) = delete;

  // Inserting a block already in the set, or erasing one that is not, changes nothing (as for
  // an ordered set): a binned block is in the set exactly when it has a predecessor or heads
  // its bin, since erase clears its links.
  void insert(Block* b) {
    if (b->size > max_binned_) {
      if (large_.emplace(KeyOf(*b), b).second) ++size_;
      return;
    }
    Bins& bins = BinsFor(b->stream.id);
    const size_t bin = BinOf(b->size);
    Block*& head = bins.heads[bin];
    if (b->free_prev != nullptr || head == b) return;
    ++size_;
    b->free_prev = nullptr;
    b->free_next = head;
    if (head != nullptr) head->free_prev = b;
    head = b;
    bins.words[bin / 64] |= uint64_t{1} << (bin % 64);
    bins.summary |= uint64_t{1} << (bin / 64);
  }

  void erase(Block* b) {
    if (b->size > max_binned_) {
      size_ -= large_.erase(KeyOf(*b));
      return;
    }
    if (b->free_prev != nullptr) {
      b->free_prev->free_next = b->free_next;
    } else {
      Bins* bins = FindBins(b->stream.id);
      const size_t bin = BinOf(b->size);
      if (bins == nullptr || bins->heads[bin] != b) return;  // not in the set
      bins->heads[bin] = b->free_next;
      if (b->free_next == nullptr) {
        uint64_t& word = bins->words[bin / 64];
        word &= ~(uint64_t{1} << (bin % 64));
        if (word == 0) bins->summary &= ~(uint64_t{1} << (bin / 64));
      }
    }
    if (b->free_next != nullptr) b->free_next->free_prev = b->free_prev;
    b->free_prev = b->free_next = nullptr;
    --size_;
  }

  // Walks the block's bin: for invariant checks.
  bool Contains(const Block* b) const {
    if (b->size > max_binned_) {
      auto it = large_.find(KeyOf(*b));
      return it != large_.end() && it->second == b;
    }
    const Bins* bins = FindBins(b->stream.id);
    if (bins == nullptr) return false;
    for (const Block* x = bins->heads[BinOf(b->size)]; x != nullptr; x = x->free_next)
      if (x == b) return true;
    return false;
  }

  size_t size() const { return size_; }

  // The smallest block of `stream` with at least `size` bytes (a multiple of the granularity),
  // or null.
  Block* SmallestFitting(Stream stream, size_t size) const {
    if (size <= max_binned_) {
      if (const Bins* bins = FindBins(stream.id)) {
        const size_t bin = BinOf(size);
        size_t word = bin / 64;
        uint64_t bits = bins->words[word] & (~uint64_t{0} << (bin % 64));
        if (bits == 0 && word + 1 < kWords) {
          const uint64_t later = bins->summary & (~uint64_t{0} << (word + 1));
          if (later != 0) {
            word = static_cast<size_t>(absl::countr_zero(later));
            bits = bins->words[word];
          }
        }
        if (bits != 0) return bins->heads[word * 64 + static_cast<size_t>(absl::countr_zero(bits))];
      }
    }
    auto it = large_.lower_bound(Key{stream.id, size, 0});
    return it == large_.end() || it->first.stream != stream.id ? nullptr : it->second;
  }

  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& bins : bins_)
      for (const Block* head : bins->heads)
        for (const Block* b = head; b != nullptr; b = b->free_next) fn(b);
    for (const auto& [key, block] : large_) fn(block);
  }

  absl::Status CheckInvariants() const {
    size_t listed = 0;
    for (const auto& bins : bins_) {
      for (size_t word = 0; word < kWords; ++word) {
        if (((bins->summary >> word) & 1) != (bins->words[word] != 0 ? 1u : 0u))
          return Fail("summary bit ", word, " of stream ", bins->stream, " disagrees with its word");
        for (size_t i = word * 64; i < word * 64 + 64; ++i) {
          const Block* head = bins->heads[i];
          if (((bins->words[word] >> (i % 64)) & 1) != (head != nullptr ? 1u : 0u))
            return Fail("bit of bin ", i, " of stream ", bins->stream, " disagrees with its list");
          const Block* prev = nullptr;
          for (const Block* b = head; b != nullptr; prev = b, b = b->free_next) {
            if (b->free_prev != prev) return Fail("broken free_prev link at block ", b->ptr);
            if (b->size > max_binned_ || BinOf(b->size) != i || b->stream.id != bins->stream)
              return Fail("block ", b->ptr, " of size ", b->size, " is listed in bin ", i);
            ++listed;
          }
        }
      }
    }
    if (listed + large_.size() != size_)
      return Fail("free set counts ", size_, " blocks, lists and B-tree hold ", listed + large_.size());
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kWords = kBins / 64;
  struct Bins {
    explicit Bins(uint64_t s) : stream(s) {}
    uint64_t stream;
    uint64_t summary = 0;                 // bit w: words[w] != 0
    std::array<uint64_t, kWords> words{};  // bit i % 64 of word i / 64: heads[i] != nullptr
    std::array<Block*, kBins> heads{};     // bin i: blocks of (i + 1) granules, last freed first
  };
  struct Key {
    uint64_t stream;
    size_t size;
    uintptr_t ptr;
    friend bool operator<(const Key& a, const Key& b) {
      return std::tie(a.stream, a.size, a.ptr) < std::tie(b.stream, b.size, b.ptr);
    }
  };
  static Key KeyOf(const Block& b) { return Key{b.stream.id, b.size, b.ptr}; }
  size_t BinOf(size_t size) const { return size / granularity_ - 1; }

  Bins* FindBins(uint64_t stream) const {
    if (last_ != nullptr && last_->stream == stream) return last_;
    for (const auto& bins : bins_)  // one stream almost always, a few at most
      if (bins->stream == stream) return last_ = bins.get();
    return nullptr;
  }
  Bins& BinsFor(uint64_t stream) {
    if (Bins* found = FindBins(stream)) return *found;
    return *bins_.emplace_back(std::make_unique<Bins>(stream));
  }
  template <typename... Args>
  static absl::Status Fail(const Args&... args) {
    return absl::FailedPreconditionError(absl::StrCat("Note [Binned free blocks]: ", args...));
  }

  const size_t granularity_;
  const size_t max_binned_;
  std::vector<std::unique_ptr<Bins>> bins_;  // per stream; stable addresses
  mutable Bins* last_ = nullptr;             // the last stream's, found first
  absl::btree_map<Key, Block*> large_;
  size_t size_ = 0;
};

}  // namespace dtr::alloc

#endif  // DTR_ALLOCATOR_FREE_SET_H_

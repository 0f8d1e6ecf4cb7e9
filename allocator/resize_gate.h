// Whether a miss may resize a cached segment of a nearby size (Note [Resizing a nearby cached
// segment], caching_allocator.cc): it may while most recent resizes were not undone. Header-only
// and torch-free, so the rule is tested on its own (tests/allocator/resize_gate_test.cc).
//
// Note [Undone resizes]
// ~~~~~~~~~~~~~~~~~~~~~
// Resizing a cached segment pays when its old size is not asked for again soon: a language model
// whose sequence length changes per batch turns last batch's logits segments into this batch's.
// It costs when the old size is still wanted: DenseNet's sizes repeat every step, so a segment
// taken for one request left a later request of its size to miss, which took another segment,
// and the misses never stopped (no budget, CPU time a step: 0.92-1.15x of plain's against
// 0.77-0.89x without resizing). Such a resize is undone: its old size is asked for again sooner
// after it than the segment had gone without a hand-out before it (both counted in hand-outs, so
// the rule has no notion of a step to tune). Resizing stops once more than half of the recent ones
// were undone (counts halved every kWindow resizes); a flush of the cache (a different phase of
// the run) starts the count afresh. What the rule lets through: a segment handed out just before
// it is taken counts as in use, not idle, so a short cycle of such resizes goes on (the
// Transformer: 2 small ones a step, DenseNet 4-5 against 68 in its first step), at no cost that
// step times show (the Transformer with no budget: 7.7-8.4 ms of CPU a step, 7.6-8.6 without
// resizing but under pressure, 16 steps each). Invariants (CheckInvariants): 0 <= undone <= resized < kWindow, and
// every remembered resize lies in the past.
#ifndef DTR_ALLOCATOR_RESIZE_GATE_H_
#define DTR_ALLOCATOR_RESIZE_GATE_H_

#include <cstddef>
#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dtr::alloc {

class ResizeGate {
 public:
  static constexpr int64_t kWindow = 64;
  // More remembered sizes than this: the expired ones are dropped.
  static constexpr size_t kMaxRemembered = 4096;

  bool Allowed() const { return undone_ * 2 <= resized_; }

  // A request for a segment of `size` found no cached one, at hand-out `now`.
  void OnMiss(size_t size, uint64_t now) {
    auto it = taken_.find(size);
    if (it == taken_.end()) return;
    // Clamped: sizes remembered from before the counts were halved may outnumber them.
    if (now - it->second.at <= it->second.idle && undone_ < resized_) ++undone_;
    taken_.erase(it);
  }

  // A cached segment of `old_size`, last handed out at `last_hand_out`, was resized at `now`.
  void OnResize(size_t old_size, uint64_t last_hand_out, uint64_t now) {
    taken_[old_size] = Taken{now, now - last_hand_out};
    if (++resized_ >= kWindow) {
      resized_ /= 2;
      undone_ /= 2;
    }
    if (taken_.size() > kMaxRemembered) {
      for (auto it = taken_.begin(); it != taken_.end();) {
        if (now - it->second.at > it->second.idle) {
          taken_.erase(it++);
        } else {
          ++it;
        }
      }
    }
  }

  void Reset() {
    taken_.clear();
    resized_ = undone_ = 0;
  }

  int64_t resized() const { return resized_; }
  int64_t undone() const { return undone_; }

  absl::Status CheckInvariants(uint64_t now) const {
    if (undone_ < 0 || undone_ > resized_ || resized_ >= kWindow) {
      return absl::InternalError(absl::StrCat("ResizeGate: undone ", undone_, " of ", resized_, " resizes"));
    }
    for (const auto& [size, taken] : taken_) {
      if (taken.at > now) return absl::InternalError(absl::StrCat("ResizeGate: a resize of ", size, " in the future"));
    }
    return absl::OkStatus();
  }

 private:
  struct Taken {
    uint64_t at = 0;    // hand-out clock when the segment was resized
    uint64_t idle = 0;  // hand-outs it had sat idle before
  };
  absl::flat_hash_map<size_t, Taken> taken_;  // by old size: the latest resize away from it
  int64_t resized_ = 0;
  int64_t undone_ = 0;
};

}  // namespace dtr::alloc

#endif  // DTR_ALLOCATOR_RESIZE_GATE_H_

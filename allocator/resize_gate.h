// Whether a miss may resize a cached segment of a nearby size (Note [Resizing a nearby cached
// segment], caching_allocator.cc): it may while most recent resizes were not undone. Header-only
// and torch-free, so the rule is tested on its own (tests/allocator/resize_gate_test.cc).
//
// Note [Undone resizes]
// ~~~~~~~~~~~~~~~~~~~~~
// Resizing a cached segment pays when its old size is not asked for again soon: a language model
// whose sequence length changes per batch turns last batch's logits segments into this batch's. It
// costs when the old size is still wanted: DenseNet's sizes repeat every step, so a segment taken
// for one request left a later request of its size to miss, which took another segment, and the
// misses never stopped (no budget, CPU time a step: 0.92-1.15x of plain's against 0.77-0.89x
// without resizing). Such a resize is undone: its old size is asked for again no later after it
// than the segment had gone without a hand-out before it (both counted in hand-outs, so the rule
// has no notion of a step to tune). Resizing stops once more than half of the recent ones were
// undone (counts halved every kWindow resizes), so the first resize undone stops it, until the
// cache is emptied (a different phase of the run, maybe). That first verdict is what stops
// DenseNet: tried and not kept (stop 62), judging at least 4 resizes first, with or without the
// segment's last interval between hand-outs added to the window, let its resizes go on at 42-69 a
// step (most of them judged not undone), and letting misses wear the undone count down while
// stopped, so that a run whose sizes start changing would resize again, reopened it every few steps
// (0.82-0.87x of plain with no budget against 0.76-0.77x). What it lets through where it stays
// open: a segment handed out just before it is taken counts as in use, not idle, so a short cycle
// of such resizes goes on (the Transformer: 2 small ones a step, DenseNet 4-5 against 68 in its
// first step), at no cost that step times show (the Transformer with no budget: 7.7-8.4 ms of CPU a
// step, 7.6-8.6 without resizing but under pressure, 16 steps each). Invariants (CheckInvariants):
// 0 <= undone <= resized < kWindow, and every remembered resize lies in the past.
#ifndef DTR_ALLOCATOR_RESIZE_GATE_H_
#define DTR_ALLOCATOR_RESIZE_GATE_H_

#include <algorithm>
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
    if (now - it->second.at <= it->second.within && undone_ < resized_) ++undone_;
    taken_.erase(it);
  }

  // A cached segment of `old_size` was resized at hand-out `now`; asked for again within `within`
  // hand-outs (the time it had gone without one), its size was still wanted.
  void OnResize(size_t old_size, uint64_t within, uint64_t now) {
    taken_[old_size] = Taken{now, within};
    if (++resized_ >= kWindow) {
      resized_ /= 2;
      undone_ /= 2;
    }
    if (taken_.size() > prune_at_) {
      for (auto it = taken_.begin(); it != taken_.end();) {
        if (now - it->second.at > it->second.within) {
          taken_.erase(it++);
        } else {
          ++it;
        }
      }
      // Amortized: the next walk waits until the map has doubled.
      prune_at_ = std::max(kMaxRemembered, 2 * taken_.size());
    }
  }

  void Reset() {
    taken_.clear();
    resized_ = undone_ = 0;
    prune_at_ = kMaxRemembered;
  }

  int64_t resized() const { return resized_; }
  int64_t undone() const { return undone_; }

  absl::Status CheckInvariants(uint64_t now) const {
    if (undone_ < 0 || undone_ > resized_ || resized_ >= kWindow) {
      return absl::FailedPreconditionError(
          absl::StrCat("ResizeGate invariant: undone ", undone_, " of ", resized_, " resizes"));
    }
    for (const auto& [size, taken] : taken_) {
      if (taken.at > now) {
        return absl::FailedPreconditionError(absl::StrCat("ResizeGate invariant: a resize of ", size, " in the future"));
      }
    }
    return absl::OkStatus();
  }

 private:
  struct Taken {
    uint64_t at = 0;    // hand-out clock when the segment was resized
    uint64_t within = 0;  // hand-outs after `at` within which a request undoes it
  };
  absl::flat_hash_map<size_t, Taken> taken_;  // by old size: the latest resize away from it
  size_t prune_at_ = kMaxRemembered;
  int64_t resized_ = 0;
  int64_t undone_ = 0;
};

}  // namespace dtr::alloc

#endif  // DTR_ALLOCATOR_RESIZE_GATE_H_

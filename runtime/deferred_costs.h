// DeferredCosts: op costs measured by events that complete later (CUDA kernels run
// asynchronously), read without ever waiting, and folded into the runtime's records as they come.
//
// Note [Deferred op costs]
// On a GPU the host returns from an op long before its kernels finish, so the wall time the
// fallback measures is the launch cost, not what recomputing the op would cost. Synchronizing to
// time it would serialize host and device. Instead each recorded op gets an event pair around its
// launch (CostEventSource: cudaEventRecord on the current stream); the op is recorded with its
// launch time as a provisional cost, and Poll, called at the start of later ops, checks the
// oldest pending pairs with a non-blocking query (cudaEventQuery), stops at the first one not yet
// complete (events complete in stream order), and hands each completed op's correction
// (measured - provisional) to the runtime (Runtime::AddOpCost). Nothing on this path blocks. The
// runtime's clock (staleness) keeps advancing by the provisional costs: a logical clock, as the
// heuristic only compares staleness between storages. At most `max_pending` ops wait; beyond
// that (a device far behind the host) new ops keep their provisional cost and are counted.
#ifndef DTR_RUNTIME_DEFERRED_COSTS_H_
#define DTR_RUNTIME_DEFERRED_COSTS_H_

#include <cstddef>
#include <cstdint>
#include <deque>

#include "absl/functional/function_ref.h"
#include "runtime/ids.h"

namespace dtr {

// Timing events, injected: CUDA events on a GPU, a fake in tests. Event 0 means "none".
class CostEventSource {
 public:
  virtual ~CostEventSource() = default;
  // An event recorded now (on the current stream); 0 if none could be made.
  virtual uint64_t Record() = 0;
  // Whether the event completed. Never blocks; false on errors (the queue then stops moving
  // and, once full, new ops keep their provisional costs).
  virtual bool Done(uint64_t event) = 0;
  // Nanoseconds between two completed events.
  virtual double ElapsedNs(uint64_t start, uint64_t end) = 0;
  virtual void Release(uint64_t event) = 0;
};

class DeferredCosts {
 public:
  struct Span {
    uint64_t start = 0;
    uint64_t end = 0;
  };
  struct Stats {
    uint64_t submitted = 0;
    uint64_t resolved = 0;
    uint64_t overflowed = 0;  // kept their provisional cost: too many pending
    double corrected_ns = 0;  // sum of the corrections applied
  };

  explicit DeferredCosts(CostEventSource* source, size_t max_pending = 4096)
      : source_(source), max_pending_(max_pending) {}
  ~DeferredCosts();
  DeferredCosts(const DeferredCosts&) = delete;
  DeferredCosts& operator=(const DeferredCosts&) = delete;

  // Around an op's launch.
  Span Begin();
  void End(Span& span);
  // The op was recorded as `op` with `provisional_ns`: queue its correction.
  void Submit(OpId op, const Span& span, double provisional_ns);
  // The op was not recorded: drop its events.
  void Discard(const Span& span);
  // Applies the corrections of completed ops, oldest first; returns how many.
  size_t Poll(absl::FunctionRef<void(OpId op, double delta_ns)> apply);

  size_t pending() const { return pending_.size(); }
  const Stats& stats() const { return stats_; }

 private:
  struct Pending {
    OpId op;
    Span span;
    double provisional_ns;
  };
  CostEventSource* const source_;
  const size_t max_pending_;
  std::deque<Pending> pending_;
  Stats stats_;
};

}  // namespace dtr

#endif  // DTR_RUNTIME_DEFERRED_COSTS_H_

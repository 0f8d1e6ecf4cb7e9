// Op costs read lazily from completed events (see deferred_costs.h, Note [Deferred op costs]).
#include "runtime/deferred_costs.h"

namespace dtr {

DeferredCosts::~DeferredCosts() {
  for (const Pending& p : pending_) Discard(p.span);
}

DeferredCosts::Span DeferredCosts::Begin() { return Span{source_->Record(), 0}; }

void DeferredCosts::End(Span& span) {
  if (span.start != 0) span.end = source_->Record();
}

void DeferredCosts::Discard(const Span& span) {
  if (span.start != 0) source_->Release(span.start);
  if (span.end != 0) source_->Release(span.end);
}

void DeferredCosts::Submit(OpId op, const Span& span, double provisional_ns) {
  if (span.start == 0 || span.end == 0) return Discard(span);
  if (pending_.size() >= max_pending_) {
    ++stats_.overflowed;
    return Discard(span);
  }
  ++stats_.submitted;
  pending_.push_back(Pending{op, span, provisional_ns});
}

size_t DeferredCosts::Poll(absl::FunctionRef<void(OpId, double)> apply) {
  size_t n = 0;
  while (!pending_.empty()) {
    const Pending& p = pending_.front();
    // Events complete in stream order: the first incomplete one ends this poll.
    if (!source_->Done(p.span.end)) break;
    const double measured = source_->ElapsedNs(p.span.start, p.span.end);
    const double delta = measured - p.provisional_ns;
    apply(p.op, delta);
    stats_.corrected_ns += delta;
    ++stats_.resolved;
    Discard(p.span);
    pending_.pop_front();
    ++n;
  }
  return n;
}

}  // namespace dtr

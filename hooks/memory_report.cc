// Where managed memory is and why it stays: the breakdown by reason behind dtr.stats()'s
// unevictable_bytes, out-of-memory messages and torch.ops.dtr.unevictable_at_peak, and the
// snapshot of it at the largest tracked memory.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "hooks/engine.h"
#include "runtime/bytes.h"

namespace dtr::hooks {

// Note [Unevictable memory by reason]
// Memory dtr can never evict sets the smallest budget that works, so users (and issue 16's
// benchmarks) need to know what it is. Every unevictable resident storage gets one reason:
//  - exposed: handed out for reading outside the dispatcher (numpy, DLPack, data_ptr, saving);
//  - pinned: by torch.ops.dtr.pin, or kept pinned by an op whose results may hide its inputs
//    (Entry::pin_origin names which);
//  - locked by the running op;
//  - constant, by the runtime's reason (Note [Constants by reason], runtime/records.h). For a
//    storage the runtime was given (AddConstant), the engine knows more: the op that made it
//    without being recorded (the slot's origin, tagged when the op returns: TagUnrecordedOutputs),
//    or nothing, which means it was first seen as an input (parameters, optimizer state, batches,
//    results of factories dtr does not see). A storage written by an unreplayable op names it
//    (Entry::writer).
// Reason texts are interned once (Intern) and entries carry the id of their whole text, so
// classifying a storage is a few branches, and tagging costs a hash lookup only when an
// unrecorded op returned a new storage or an unreplayable write happened. Tracked memory is
// watched after every managed op (PeakWatch); at each new high, 2% above the last, the
// breakdown is taken again in one pass with the storage of each unevictable byte, so that a
// report can leave out the ones a caller names (a model's parameters and optimizer state: what
// remains is what issue 16 asks to keep under 5% of the activations). The geometric steps bound
// the passes by log(peak / first) / log(1.02) per ResetPeak.

uint16_t Engine::Intern(absl::string_view text) {
  auto it = reason_ids_.find(text);
  if (it != reason_ids_.end()) return it->second;
  if (reasons_.size() > UINT16_MAX) return 1;  // more reasons than any program has ops: "other"
  const uint16_t id = uint16_t(reasons_.size());
  reasons_.emplace_back(text);
  reason_ids_.emplace(std::string(text), id);
  return id;
}

void Engine::InternFixedReasons() {
  FixedReasons& f = fixed_reasons_;
  f.exposed = Intern("exposed: read outside PyTorch (numpy, DLPack, data_ptr, serialization)");
  f.pinned_by_running_op = Intern("pinned: operand of the running op");
  f.locked = Intern("locked by the running op");
  f.first_seen = Intern(
      "constant: first seen as an input (parameters, optimizer state, batches, tensors made outside recorded ops)");
  for (size_t r = 0; r < kConstantReasonCount; ++r)
    f.constant[r] = Intern(absl::StrCat("constant: ", ConstantReasonName(ConstantReason(r))));
  bn_stats_writer_ = WriterReason("aten::native_batch_norm(running_stats)");
}

void Engine::TagUnrecordedOutputs(const torch::jit::Stack& stack, size_t nret, uint64_t serial0,
                                  const std::string& op, absl::string_view why) {
  if (LastSlotSerial() == serial0) return;  // the op allocated nothing
  uint16_t origin = 0;  // interned at the first new storage: most such ops return none
  ForEachTensor(stack.data() + stack.size() - nret, nret, [&](Path, const at::Tensor& t, bool) {
    if (!t.has_storage()) return;
    Slot* s = SlotOf(t.storage().unsafeGetStorageImpl()->data_ptr());
    if (s == nullptr || s->mem == nullptr || s->entry != nullptr || s->serial <= serial0) return;
    if (origin == 0) origin = Intern(absl::StrCat("constant: made by ", op, ", not recorded: ", why));
    s->origin = origin;
  });
}

Engine::Unevictability Engine::StandingOf(const Entry& e, const StorageRecord& r) const {
  const FixedReasons& f = fixed_reasons_;
  if (e.exposed || e.kept_resident) return {Standing::kExposed, f.exposed};
  if (r.pins > 0) return {Standing::kPinned, e.pin_origin != 0 ? e.pin_origin : f.pinned_by_running_op};
  if (r.locks > 0) return {Standing::kLocked, f.locked};
  if (r.rematerializable()) return {Standing::kEvictable, 0};
  if (r.constant_reason == ConstantReason::kAdded) return {Standing::kConstant, e.origin != 0 ? e.origin : f.first_seen};
  if (r.constant_reason == ConstantReason::kUnreplayableWrite && e.writer != 0) return {Standing::kConstant, e.writer};
  return {Standing::kConstant, f.constant[size_t(r.constant_reason)]};
}

Engine::MemoryByReason Engine::ByReason(std::vector<UnevictableStorage>* unevictable) {
  MemoryByReason m;
  m.tracked = rt_->memory();
  m.by_reason.assign(reasons_.size(), 0);
  for (auto& [k, e] : entries_) {
    const StorageRecord* r = rt_->storage(e->sid);
    if (r == nullptr) continue;
    if (!r->resident()) {
      m.evicted += r->size;
      continue;
    }
    if (e->external) {
      m.external += r->size;  // not dtr's memory: outside the budget
      continue;
    }
    if (!e->ours) continue;
    const Unevictability u = StandingOf(*e, *r);
    switch (u.standing) {
      case Standing::kEvictable: m.evictable += r->size; continue;
      case Standing::kExposed: m.exposed += r->size; break;
      case Standing::kPinned: m.pinned += r->size; break;
      case Standing::kLocked: m.locked += r->size; break;
      case Standing::kConstant: m.constant += r->size, ++m.constants; break;
    }
    m.by_reason[u.why] += r->size;
    if (unevictable != nullptr) unevictable->push_back({e->sid, r->size, u.why});
  }
  const uint64_t alloc = uint64_t(Counters().allocated);
  const uint64_t tracked = m.exposed + m.pinned + m.locked + m.constant + m.evictable;
  m.untracked = alloc > tracked ? alloc - tracked : 0;
  return m;
}

void Engine::ForgetPeakSnapshot() {
  std::lock_guard<std::recursive_timed_mutex> l(mu_);
  at_peak_ = PeakSnapshot();
  next_peak_snapshot_ = 0;
}

void Engine::SnapshotPeak() {
  at_peak_.unevictable.clear();
  at_peak_.by = ByReason(&at_peak_.unevictable);
  next_peak_snapshot_ = std::max<uint64_t>(1, rt_->memory() + rt_->memory() / 50);
}

std::string Engine::UnevictableDetailJson(const std::vector<uint64_t>& by_reason) const {
  std::string out = "{";
  for (size_t id = 0; id < by_reason.size(); ++id) {
    if (by_reason[id] == 0) continue;
    absl::StrAppend(&out, out.size() > 1 ? "," : "", "\"");
    for (char c : reasons_[id]) {  // op names and fixed texts: escape what JSON requires
      if (c == '"' || c == '\\') out += '\\';
      out += static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
    }
    absl::StrAppend(&out, "\":", by_reason[id]);
  }
  return out + "}";
}

std::string Engine::UnevictableAtPeakJson(at::TensorList exclude) {
  std::lock_guard<std::recursive_timed_mutex> l(mu_);
  absl::flat_hash_set<uint64_t> left_out;
  for (const at::Tensor& t : exclude) {
    if (!t.defined() || !Manageable(t)) continue;
    if (Entry* e = EntryOf(t, false)) left_out.insert(e->sid.packed());
  }
  std::vector<uint64_t> by_reason(reasons_.size(), 0);
  uint64_t total = 0, excluded = 0;
  for (const UnevictableStorage& u : at_peak_.unevictable) {
    if (left_out.contains(u.sid.packed())) {
      excluded += u.bytes;
      continue;
    }
    total += u.bytes;
    by_reason[u.why] += u.bytes;
  }
  const MemoryByReason& m = at_peak_.by;
  return absl::StrCat("{\"tracked_bytes\":", m.tracked, ",\"evictable_bytes\":", m.evictable,
                      ",\"unevictable_bytes\":", total, ",\"excluded_bytes\":", excluded,
                      ",\"by_reason\":", UnevictableDetailJson(by_reason), "}");
}

std::string Engine::BreakdownFor(uint64_t request) {
  std::unique_lock<std::recursive_timed_mutex> l(mu_, std::try_to_lock);
  if (!l.owns_lock()) return "breakdown unavailable";
  const MemoryByReason m = ByReason();
  std::string out = absl::StrCat(
      "allocated ", FormatBytes(uint64_t(Counters().allocated)), ": constants ", FormatBytes(m.constant), " in ",
      m.constants, " storages (parameters, gradients, optimizer state, inputs, outputs of unreplayable ops), "
      "exposed ", FormatBytes(m.exposed), " (memory handed to numpy, DLPack, data_ptr or serialization), pinned ",
      FormatBytes(m.pinned), ", locked by the running op ", FormatBytes(m.locked), ", evictable ",
      FormatBytes(m.evictable), ", untracked ", FormatBytes(m.untracked),
      " (allocator headers/rounding, tensors no op has read yet); evicted ", FormatBytes(m.evicted),
      // Note [Recording starts with a budget] (fallback.cc).
      last_unrecorded_serial_.load(std::memory_order_relaxed) > 0
          ? "; dtr started recording at the first budget, so what was made before it (among the constants and "
            "untracked bytes) is never evicted: to make a model's activations evictable, set the budget before "
            "running it"
          : "");
  // The largest unevictable reasons first: what to look at to lower the floor.
  std::vector<std::pair<uint64_t, uint16_t>> largest;
  for (size_t id = 0; id < m.by_reason.size(); ++id)
    if (m.by_reason[id] > 0) largest.push_back({m.by_reason[id], uint16_t(id)});
  std::sort(largest.rbegin(), largest.rend());
  if (!largest.empty()) {
    absl::StrAppend(&out, ". Unevictable, largest first: ");
    for (size_t i = 0; i < largest.size() && i < 4; ++i)
      absl::StrAppend(&out, i ? "; " : "", reasons_[largest[i].second], " ", FormatBytes(largest[i].first));
  }
  if (request > 0) {
    // What must stay resident now plus this request; the largest op seen so far bounds what a
    // later op may need at once.
    const uint64_t floor = m.constant + m.exposed + m.pinned + m.locked + m.untracked + request;
    absl::StrAppend(&out, ". The smallest budget that could work from here is about ",
                    FormatBytes(std::max<uint64_t>(floor, rt_->stats().largest_op_bytes)),
                    " (what cannot be evicted plus this request; the largest single op so far read and wrote ",
                    FormatBytes(rt_->stats().largest_op_bytes), ")");
  }
  return out;
}

}  // namespace dtr::hooks

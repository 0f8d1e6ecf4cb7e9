// Trace simulator; see simulator.h.
#include "runtime/sim/simulator.h"

#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/replay_backend.h"
#include "runtime/runtime.h"
#include "runtime/sim/json.h"

namespace dtr::sim {
namespace {

// Note [Simulated values]
// A storage's value is a hash of the op that wrote it (its trace event index), its output
// position, and the values of the op's distinct inputs in order; an in-place op hashes the
// target's previous value with the others. Replays recompute values the same way from the
// inputs' current values, so replaying with a wrong, stale or missing input, or in the wrong
// order, produces a different value and the check in OnRematerialized fails.
uint64_t Mix(uint64_t seed, uint64_t v) { return absl::HashOf(seed, v); }

class HashingBackend : public ReplayBackend {
 public:
  absl::StatusOr<double> Replay(OpId id, const OpRecord& op, absl::Span<const bool> keep) override {
    auto inputs = InputValues(op);
    if (auto copied = copied_handles_.find(op.handle); copied != copied_handles_.end()) {
      // Note [Copies of overwritten contents]: the original op's output, into the copy.
      if (!inputs.ok()) return inputs.status();
      if (values_.contains(op.outputs[0].packed()))
        return absl::InternalError(absl::StrCat("replay of ", op.name, " asked to keep a resident output"));
      values_[op.outputs[0].packed()] = OutputValue(copied->second.first, copied->second.second, *inputs);
      resident_bytes_ += op.output_sizes[0];
      return op.cost;
    }
    if (!inputs.ok()) return inputs.status();
    if (op.overwrites) {  // first in its recipe: the storage comes back with this value
      if (values_.contains(op.outputs[0].packed()))
        return absl::InternalError(absl::StrCat("overwriting replay of ", op.name, " on a resident storage"));
      values_[op.outputs[0].packed()] = OverwriteValue(op.handle, *inputs);
      resident_bytes_ += op.output_sizes[0];
      return op.cost;
    }
    if (op.in_place) {
      auto it = values_.find(op.outputs[0].packed());
      if (it == values_.end())
        return absl::InternalError(absl::StrCat("in-place replay of ", op.name, " on a non-resident storage"));
      it->second = MutateValue(op.handle, it->second, *inputs);
      return op.cost;
    }
    for (size_t i = 0; i < op.outputs.size(); ++i) {
      if (!keep[i]) continue;
      if (values_.contains(op.outputs[i].packed()))
        return absl::InternalError(absl::StrCat("replay of ", op.name, " asked to keep a resident output"));
      values_[op.outputs[i].packed()] = ResultValue(op.handle, i, *inputs, op.copies_input);
      resident_bytes_ += op.output_sizes[i];
    }
    return op.cost;
  }

  void Release(StorageId id, const StorageRecord& storage, bool permanently) override {
    auto it = values_.find(id.packed());
    if (it == values_.end()) {
      failure_ = absl::InternalError("released a storage that is not resident");
      return;
    }
    if (!permanently) expected_[id.packed()] = it->second;
    else expected_.erase(id.packed());
    values_.erase(it);
    resident_bytes_ -= storage.size;
  }

  absl::Status OnRematerialized(StorageId id, const StorageRecord& storage) override {
    auto want = expected_.find(id.packed());
    auto have = values_.find(id.packed());
    if (want == expected_.end() || have == values_.end() || want->second != have->second)
      return absl::DataLossError(absl::StrCat(
          "rematerialized storage ", id.index, " does not reproduce its original value"));
    expected_.erase(want);
    return absl::OkStatus();
  }

  // Note [Copies of overwritten contents]: a handle that replays `op` for its output `output`
  // alone, out of the trace's handles (event indices).
  uint64_t CopyReplay(const OpRecord& op, size_t output) override {
    const auto original = copied_handles_.find(op.handle);
    const std::pair<uint64_t, size_t> source =
        original != copied_handles_.end() ? original->second : std::make_pair(op.handle, output);
    const uint64_t handle = kFirstCopiedHandle + copied_handles_.size();
    copied_handles_[handle] = source;
    return handle;
  }

  // Values for a first execution; a copy (`copies_input`) has its input's value.
  absl::Status Created(uint64_t handle, absl::Span<const StorageId> inputs, absl::Span<const StorageId> outputs,
                       absl::Span<const uint64_t> sizes, bool copies_input = false) {
    OpRecord op;
    op.inputs.assign(inputs.begin(), inputs.end());
    auto values = InputValues(op);
    if (!values.ok()) return values.status();
    for (size_t i = 0; i < outputs.size(); ++i) {
      values_[outputs[i].packed()] =
          ResultValue(handle, i, *values, copies_input && values->size() == 1 && outputs.size() == 1);
      resident_bytes_ += sizes[i];
    }
    return absl::OkStatus();
  }
  absl::Status Mutated(uint64_t handle, StorageId target, absl::Span<const StorageId> others, bool overwrites) {
    OpRecord op;
    op.inputs.assign(others.begin(), others.end());
    auto values = InputValues(op);
    if (!values.ok()) return values.status();
    auto it = values_.find(target.packed());
    if (it == values_.end()) return absl::InternalError("mutated a storage that is not resident");
    it->second = overwrites ? OverwriteValue(handle, *values) : MutateValue(handle, it->second, *values);
    return absl::OkStatus();
  }

  uint64_t resident_bytes() const { return resident_bytes_; }
  const absl::Status& failure() const { return failure_; }

 private:
  absl::StatusOr<std::vector<uint64_t>> InputValues(const OpRecord& op) const {
    std::vector<uint64_t> values;
    for (StorageId in : op.inputs) {
      auto it = values_.find(in.packed());
      if (it == values_.end())
        return absl::InternalError(absl::StrCat("op ", op.name, " ran with non-resident input storage ", in.index));
      values.push_back(it->second);
    }
    return values;
  }
  // An op's result, made or replayed: a whole copy (OpRecord::copies_input: one input, one
  // output) has its input's value.
  static uint64_t ResultValue(uint64_t handle, size_t index, const std::vector<uint64_t>& inputs, bool whole_copy) {
    return whole_copy ? inputs[0] : OutputValue(handle, index, inputs);
  }
  static uint64_t OutputValue(uint64_t handle, size_t index, const std::vector<uint64_t>& inputs) {
    uint64_t h = Mix(handle, index);
    for (uint64_t v : inputs) h = Mix(h, v);
    return h;
  }
  static uint64_t OverwriteValue(uint64_t handle, const std::vector<uint64_t>& inputs) {
    uint64_t h = Mix(handle, ~uint64_t{1});
    for (uint64_t v : inputs) h = Mix(h, v);
    return h;
  }
  static uint64_t MutateValue(uint64_t handle, uint64_t old, const std::vector<uint64_t>& inputs) {
    uint64_t h = Mix(Mix(handle, ~uint64_t{0}), old);
    for (uint64_t v : inputs) h = Mix(h, v);
    return h;
  }

  static constexpr uint64_t kFirstCopiedHandle = uint64_t(1) << 62;  // above any event index
  absl::flat_hash_map<uint64_t, std::pair<uint64_t, size_t>> copied_handles_;  // -> (handle, output)
  absl::flat_hash_map<uint64_t, uint64_t> values_;    // resident storage -> value
  absl::flat_hash_map<uint64_t, uint64_t> expected_;  // evicted storage -> value to reproduce
  uint64_t resident_bytes_ = 0;
  absl::Status failure_;
};

struct TensorState {
  StorageId storage;
  bool live = false;
};

}  // namespace

std::string SimResult::ToJson(const RuntimeConfig& config) const {
  std::string json = absl::StrFormat(
      "{\"status\": \"%s\", \"heuristic\": \"%s\", \"dealloc\": \"%s\", \"search\": \"%s\", "
      "\"budget_bytes\": %d, \"peak_bytes\": %d, \"base_cost\": %.17g, \"total_cost\": %.17g, "
      "\"compute_ratio\": %.17g, \"evictions\": %d, \"rematerializations\": %d, \"events\": %d, "
      "\"stats\": %s",
      ok ? "ok" : "oom", HeuristicName(config.heuristic), DeallocPolicyName(config.dealloc),
      SearchModeName(config.search), budget_bytes, peak_bytes, base_cost, total_cost, compute_ratio(),
      stats.evictions, stats.rematerializations, events_replayed, stats.ToJson());
  absl::StrAppend(&json, ", \"marks\": [");
  for (size_t i = 0; i < marks.size(); ++i) {
    const MarkCosts& m = marks[i];
    absl::StrAppend(&json, i ? ", " : "", "{\"label\": ", JsonString(m.label), ", ",
                    absl::StrFormat("\"event\": %d, \"base_cost\": %.17g, \"total_cost\": %.17g, "
                                    "\"evictions\": %d, \"rematerializations\": %d}",
                                    m.event, m.base_cost, m.total_cost, m.evictions, m.rematerializations));
  }
  absl::StrAppend(&json, "]");
  if (!remat_events.empty()) {
    absl::StrAppend(&json, ", \"remat_events\": [");
    for (size_t i = 0; i < remat_events.size(); ++i) {
      const RematEvent& r = remat_events[i];
      absl::StrAppend(&json, i ? ", " : "", "{\"event\": ", r.event, ", \"op\": ", JsonString(r.op), ", ",
                      absl::StrFormat("\"pass\": \"%s\", \"mutate\": %s, \"rematerializations\": %d, "
                                      "\"remat_cost\": %.17g}",
                                      r.backward ? "backward" : "forward", r.mutate ? "true" : "false",
                                      r.rematerializations, r.remat_cost));
    }
    absl::StrAppend(&json, "]");
  }
  if (!ok) absl::StrAppend(&json, ", \"error\": ", JsonString(error));
  return json + "}";
}

absl::StatusOr<SimResult> Simulate(const Trace& trace, const SimOptions& options) {
  HashingBackend backend;
  auto created = Runtime::Create(options.runtime, &backend);
  if (!created.ok()) return created.status();
  Runtime& rt = **created;
  std::vector<TensorState> tensors(trace.tensor_names.size());
  SimResult result;
  result.budget_bytes = options.runtime.budget_bytes;

  auto tensor_error = [&](int t, absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("trace event ", result.events_replayed + 1, ": tensor '", trace.tensor_names[t], "' ", what));
  };
  auto storage_of = [&](int t) -> absl::StatusOr<StorageId> {
    if (!tensors[t].live) return tensor_error(t, "is used after it was released");
    return tensors[t].storage;
  };
  auto finish = [&](absl::Status status) -> absl::StatusOr<SimResult> {
    if (absl::IsResourceExhausted(status)) {
      result.ok = false;
      result.error = std::string(status.message());
    } else if (!status.ok()) {
      return status;
    } else {
      result.ok = true;
    }
    result.stats = rt.stats();
    result.peak_bytes = result.stats.peak_memory_bytes;
    result.base_cost = result.stats.base_cost;
    result.total_cost = result.stats.total_cost();
    return result;
  };

  std::vector<StorageId> inputs, mutated, others;
  std::vector<uint64_t> sizes;
  // SimOptions::log_remats: the counters before the event, to tell what it rematerialized.
  auto note_remats = [&](size_t ei, const TraceEvent& e, size_t remats_before, double cost_before) {
    const RuntimeStats& st = rt.stats();
    if (st.rematerializations == remats_before) return;
    result.remat_events.push_back(RematEvent{ei, e.name, e.backward, e.kind == EventKind::kMutate,
                                             st.rematerializations - remats_before, st.remat_cost - cost_before});
  };
  for (size_t ei = 0; ei < trace.events.size(); ++ei) {
    const TraceEvent& e = trace.events[ei];
    const size_t remats_before = options.log_remats ? rt.stats().rematerializations : 0;
    const double remat_cost_before = options.log_remats ? rt.stats().remat_cost : 0;
    uint64_t handle = ei;
    absl::Status status;
    switch (e.kind) {
      case EventKind::kConst: {
        auto id = rt.AddConstant(e.outputs[0].size, handle);
        if (!id.ok()) return finish(id.status());
        tensors[e.outputs[0].tensor] = {*id, true};
        status = backend.Created(handle, {}, {*id}, {e.outputs[0].size});
        break;
      }
      case EventKind::kCall:
      case EventKind::kOpaque: {
        inputs.clear();
        sizes.clear();
        for (int t : e.inputs) {
          auto s = storage_of(t);
          if (!s.ok()) return s.status();
          inputs.push_back(*s);
        }
        for (const TraceOutput& o : e.outputs)
          if (o.alias_of < 0) sizes.push_back(o.size);
        std::vector<StorageId> distinct;
        for (StorageId s : inputs)
          if (std::find(distinct.begin(), distinct.end(), s) == distinct.end()) distinct.push_back(s);
        Runtime::OpCall call{e.name, inputs, sizes, e.kind == EventKind::kCall, handle};
        call.scratch_bytes = e.scratch;  // Note [Scratch memory]
        call.backward = e.backward;        // Note [Results of the backward pass]
        call.copies_input = e.copies_input;  // Note [Copies of overwritten contents]
        auto outs = rt.Compute(call, [&](absl::Span<const StorageId> new_storages) -> absl::StatusOr<double> {
          if (absl::Status s = backend.Created(handle, distinct, new_storages, sizes, e.copies_input); !s.ok())
            return s;
          return e.cost;
        });
        if (!outs.ok()) return finish(outs.status());
        size_t next = 0;
        for (const TraceOutput& o : e.outputs) {
          if (o.alias_of < 0) {
            tensors[o.tensor] = {(*outs)[next++], true};
            continue;
          }
          auto base = storage_of(o.alias_of);
          if (!base.ok()) return base.status();
          tensors[o.tensor] = {*base, true};
          if (status = rt.AddRef(*base); !status.ok()) break;
        }
        break;
      }
      case EventKind::kMutate: {
        inputs.clear();
        mutated.clear();
        for (int t : e.inputs) {
          auto s = storage_of(t);
          if (!s.ok()) return s.status();
          inputs.push_back(*s);
        }
        for (int t : e.mutated) mutated.push_back(*storage_of(t));
        Runtime::MutateCall call{e.name, inputs, mutated, e.replayable, handle};
        call.overwrites = e.overwrites;
        call.scratch_bytes = e.scratch;
        call.backward = e.backward;
        status = rt.Mutate(call, [&]() -> absl::StatusOr<double> {
          for (StorageId m : mutated) {
            others.clear();
            for (StorageId s : inputs)
              if (s != m && std::find(others.begin(), others.end(), s) == others.end()) others.push_back(s);
            if (absl::Status s = backend.Mutated(handle, m, others, e.overwrites); !s.ok()) return s;
          }
          return e.cost;
        });
        break;
      }
      case EventKind::kCopy: {
        auto s = storage_of(e.source);
        if (!s.ok()) return s.status();
        tensors[e.tensor] = {*s, true};
        status = rt.AddRef(*s);
        break;
      }
      case EventKind::kRelease: {
        auto s = storage_of(e.tensor);
        if (!s.ok()) return s.status();
        tensors[e.tensor].live = false;
        status = rt.DropRef(*s);
        break;
      }
      case EventKind::kWait:  // Note [Program time between ops]
        rt.AddProgramTime(e.cost);
        break;
      case EventKind::kMark: {  // Note [Steady-state steps]
        const RuntimeStats& st = rt.stats();
        result.marks.push_back(MarkCosts{e.name, result.events_replayed, st.base_cost, st.total_cost(), st.evictions,
                                         st.rematerializations});
        break;
      }
    }
    ++result.events_replayed;
    if (options.log_remats) note_remats(ei, e, remats_before, remat_cost_before);
    if (!status.ok()) return finish(status);
    if (!backend.failure().ok()) return backend.failure();
    if (backend.resident_bytes() != rt.memory())
      return absl::InternalError(absl::StrCat("after event ", ei + 1, ": backend holds ", backend.resident_bytes(),
                                              " bytes but the runtime accounts ", rt.memory()));
    if (options.check_invariants) {
      if (absl::Status s = rt.CheckInvariants(); !s.ok())
        return absl::InternalError(absl::StrCat("after event ", ei + 1, ": ", s.message()));
    }
  }
  // Output condition (paper, Appendix C.6): whatever the program still holds must be resident
  // at the end, so it cannot "save" memory by dropping results it never brings back.
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (!tensors[t].live) continue;
    if (absl::Status s = rt.Pin(tensors[t].storage); !s.ok()) return finish(s);
  }
  return finish(rt.CheckInvariants());
}

absl::StatusOr<uint64_t> UnconstrainedPeak(const Trace& trace) {
  SimOptions options;
  auto result = Simulate(trace, options);
  if (!result.ok()) return result.status();
  return result->peak_bytes;
}

}  // namespace dtr::sim

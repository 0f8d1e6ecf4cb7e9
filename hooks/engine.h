// Engine: dtr's state in one process (g_engine), never destroyed (tensors may be freed during
// static destruction). Owns the dtr::Runtime (budget unlimited: the allocator enforces
// DTR_BUDGET), the caching allocator over host memory, the CPU c10::Allocator adapter, the
// storages the runtime knows (Entry, storage_slots.h), and one std::recursive_timed_mutex that
// serializes everything (the allocator's eviction callback re-enters on the same thread while an
// op is executing). It is the runtime's ReplayBackend: it evicts a StorageImpl by swapping in a
// tombstone DataPtr and restores it by replaying the recorded op with autograd and Fake excluded;
// and the allocator's EvictionHandler (MakeRoom). Its Fallback (fallback.cc) records every op.
//
// Note [Dead storages the runtime still needs]
// Runtime external references model "the program still holds this storage". Replay records keep
// only StorageIds (plus sizes/strides/offset/dtype) of their tensor inputs, never strong refs to
// StorageImpls of our memory, so a recorded op does not keep its inputs alive. When the program's
// StorageImpl dies (its deleter sees Entry::weak expired), the runtime may still need the bytes
// (a constant read by a live recipe, or a storage an evicted dependent must be replayed from).
// The deleter therefore *steals* the memory (or the tombstone) into a fresh internal StorageImpl
// owned by the Entry, and only then drops the runtime's external reference (deferred to when the
// runtime is not in the middle of a call). The runtime then evicts it eagerly, keeps it, or
// collects it (Release(permanently=true) frees the internal StorageImpl); a death the runtime
// releases in the same call skips the steal (Note [Deaths released at once], engine.cc).
// Storages whose memory is not ours (from_numpy, pre-activation allocations) cannot be stolen:
// replay records hold a strong reference to those (they are constants anyway, never evicted).
//
// Note [Memory replaced under a live storage]
// A live storage's memory can be replaced outside the dispatcher: FSDP frees an unsharded
// parameter with untyped_storage().resize_(0) after the forward and refills it before the
// backward; resize_ and set_ do the same inside ops. The records that read the old bytes (a
// layer's matmul reading its unsharded weight) would replay from whatever the storage holds
// later: nothing (an error) or other values (silently wrong). So the deleter keeps the old bytes
// exactly as for a dead storage: the entry takes them over (Entry::owned) and drops the program's
// reference. Replays read the old bytes, and the runtime releases them when no record needs
// them any more (at the latest when the step's activations die). The storage's new memory is
// a new constant from its first use. The kept bytes count against the budget. Pinning the
// readers instead (detaching them) kept more memory: every linear output of an FSDP model
// became a constant, and 0.85 of the peak no longer fit.
#ifndef DTR_HOOKS_ENGINE_H_
#define DTR_HOOKS_ENGINE_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "allocator/caching_allocator.h"
#include "allocator/eviction_handler.h"
#include "allocator/host_backend.h"
#include "hooks/cpu_allocator_adapter.h"
#include "hooks/env_config.h"
#include "hooks/generator_snapshots.h"
#include "hooks/op_classification.h"
#include "hooks/recycler.h"
#include "hooks/replay_record.h"
#include "hooks/storage_slots.h"
#include "runtime/deferred_costs.h"
#include "runtime/runtime.h"
#if DTR_WITH_CUDA
#include "hooks/cuda_allocator.h"
#endif

namespace dtr::hooks {

using Clock = std::chrono::steady_clock;
inline double NowNs() {
  return double(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}

// Which device's tensors dtr manages in this process (DTR_DEVICE): host memory through the CPU
// allocator adapter, or CUDA memory through the CUDA adapter (cuda_allocator.h). Tensors on other
// devices are unmanaged operands (Note [Unmanaged operands], fallback.cc).
enum class ManagedDevice { kCpu, kCuda };

class Engine final : public ReplayBackend,
                     public alloc::EvictionHandler
#if DTR_WITH_CUDA
    ,
                     public CudaEvictor
#endif
{
 public:
  explicit Engine(const DtrEnvConfig& cfg, ManagedDevice managed = ManagedDevice::kCpu)
      : cfg_(cfg), managed_(managed) {
    InternFixedReasons();
  }

  absl::Status Init();

  const DtrEnvConfig& cfg() const { return cfg_; }
  c10::Allocator* adapter() { return adapter_.get(); }
  alloc::CachingAllocator* allocator() { return alloc_.get(); }

  // ---------------- the fallback (fallback.cc) ----------------
  void Fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);
  // Note [Ops while paused] (fallback.cc): runs an op while dtr.disable() has ops pass through,
  // keeping the recipes recorded before true. `ks` as Fallback's (it goes on to Fallback if
  // dtr was enabled meanwhile).
  void FallbackPaused(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);
  // Note [Views on a short path] (fallback.cc): runs a view whose operands dtr tracks, all
  // resident, and returns true; false, the op not run, when it needs the general path.
  // `args` are the op's nargs arguments (on the stack, which the op then pops); mu_ is held.
  bool ViewOnShortPath(const c10::OperatorHandle& op, c10::DispatchKeySet after, torch::jit::Stack* stack,
                       const c10::IValue* args, size_t nargs, const OpInfo& info);

  // ---------------- deleter ----------------
  // Called by the deleters of tracked slots (storage_slots.h).
  SlotFate OnSlotDeleted(Slot* s);
  // Gives a resident slot's block back to the allocator.
  void FreeSlot(Slot* s);

  // ---------------- ReplayBackend ----------------
  absl::StatusOr<double> Replay(OpId id, const OpRecord& op, absl::Span<const bool> keep) override;
  // Note [Copies of overwritten contents] (runtime/mutation.cc): a record of its own that
  // replays op's call as recorded and keeps only its output `output` (0 for a random op).
  uint64_t CopyReplay(const OpRecord& op, size_t output) override;
  // Moves the memory of `from` (ours, just allocated by a replay) into e's storage `target`.
  void AdoptMemory(Entry* e, c10::StorageImpl* target, c10::StorageImpl* from);
  void Release(StorageId id, const StorageRecord& storage, bool permanently) override;
  void OnOpDropped(OpId id, const OpRecord& op) override {
    records_.Delete(reinterpret_cast<ReplayRecord*>(op.handle));
    // Note [Entries of collected storages]: its outputs may be being collected.
    dropped_outputs_.insert(dropped_outputs_.end(), op.outputs.begin(), op.outputs.end());
  }

  // ---------------- EvictionHandler ----------------
  // The CPU allocator's; CUDA devices under the dtr backend get a DeviceHandler each.
  alloc::EvictionResult MakeRoom(const alloc::EvictionRequest& request) override {
    return MakeRoomOn(*alloc_, -1, request);
  }
  // Evicts storages on `cuda_device` (-1: host) until `a` can serve `request`.
  alloc::EvictionResult MakeRoomOn(alloc::CachingAllocator& a, int cuda_device, const alloc::EvictionRequest& request);
  // Note [One victim at a time]: each evicts one storage on `cuda_device` (-1: host) and sets
  // *bytes to its size; false when none there can be evicted. EvictRankedOn lets `a`, when
  // given, prefer a victim whose block makes `request` fit.
  // When one returns false, *why (if given) says why (Note [Why nothing was evicted]).
  bool EvictNextVictimOn(int cuda_device, size_t* bytes, const char** why = nullptr);
  // The entry of a candidate whose memory lives on `cuda_device` (-1: host), else nullptr.
  Entry* ResidentEntryOn(const Runtime::Candidate& c, int cuda_device);
  bool EvictRankedOn(int cuda_device, alloc::CachingAllocator* a, const alloc::EvictionRequest* request, size_t* bytes,
                     const char** why = nullptr);
  ManagedDevice managed() const { return managed_; }

#if DTR_WITH_CUDA
  // ---------------- CudaEvictor ----------------
  // Manages CUDA tensors through `cuda`, timing op costs with CUDA events (Note [Deferred op
  // costs]); `events` is owned from then on.
  void AttachCuda(CudaAllocatorAdapter* cuda, std::unique_ptr<CostEventSource> events);
  Eviction EvictOnDevice(c10::DeviceIndex device, const std::function<bool()>& enough) override;
  alloc::EvictionHandler* HandlerFor(c10::DeviceIndex device, alloc::CachingAllocator* a) override;
  size_t UnevictableBytes(c10::DeviceIndex device) override;
#endif
  // Where the allocated bytes are, for out-of-memory reports (also CudaEvictor's); with the
  // failed `request`, also the smallest budget that could work.
  std::string Breakdown()
#if DTR_WITH_CUDA
      override
#endif
  {
    return BreakdownFor(0);
  }
  std::string BreakdownFor(uint64_t request);
  // Resident bytes by why they stay (stats: unevictable_bytes; README "What dtr pins"), and the
  // unevictable ones by their detailed reason (Note [Unevictable memory by reason]).
  struct MemoryByReason {
    uint64_t constant = 0, exposed = 0, external = 0, pinned = 0, locked = 0, evictable = 0, evicted = 0,
             untracked = 0, constants = 0;
    uint64_t tracked = 0;  // the runtime's resident bytes
    std::vector<uint64_t> by_reason;  // unevictable bytes by reason id (Engine::Intern)
  };
  // With `unevictable`, also lists each unevictable storage (one pass for SnapshotPeak).
  struct UnevictableStorage {
    StorageId sid;
    uint64_t bytes;
    uint16_t why;
  };
  MemoryByReason ByReason(std::vector<UnevictableStorage>* unevictable = nullptr);
  // Note [Unevictable memory by reason]: the breakdown at the largest tracked memory so far
  // (since ResetPeak), as JSON, leaving out the storages of `exclude` (a model's parameters and
  // optimizer state, to see what else stays); torch.ops.dtr.unevictable_at_peak.
  std::string UnevictableAtPeakJson(at::TensorList exclude);
  std::string UnevictableDetailJson(const std::vector<uint64_t>& by_reason) const;
  // allocated and reserved bytes (current, peak) of the managed device memory.
  struct MemoryCounters {
    int64_t allocated = 0, reserved = 0, peak_allocated = 0, peak_reserved = 0, ooms = 0, eviction_calls = 0,
            recovered_ooms = 0;
    bool expandable_segments_by_dtr = false;  // Note [Expandable segments under a budget]
  };
  MemoryCounters Counters();
  size_t PinnedBytes() const override {
    std::unique_lock<std::recursive_timed_mutex> l(mu_, std::try_to_lock);
    if (!l.owns_lock()) return 0;
    return rt_->UnevictableBytes();
  }

  std::string StatsJson();
  std::string CpuAllocatorJson();  // ",\"allocator\":{...}" on the CPU, else empty
  // torch.ops.dtr.pin / unpin: keep a tensor's storage resident (for raw access: .numpy(),
  // torch.save, data_ptr(), extensions), see README "Caveats".
  void PinTensor(const at::Tensor& t, bool pin);
  // torch.ops.dtr.expose (Note [Memory read outside the dispatcher], engine.cc): t's memory is
  // read outside the dispatcher from now on; `writable`: through a view that may write it.
  void ExposeTensor(const at::Tensor& t, bool writable);
  // Whether memory dtr did not allocate came from torch's own allocators (not numpy's, a shared
  // mapping's, a DLPack producer's): only ops write it.
  static bool TorchOwnsMemory(const c10::DataPtr& dp);
  void WriteStatsFile();
  // torch.ops.dtr.set_budget: changes the budget at run time (<= 0: unlimited). Evicts and
  // releases cached memory to get under a lower budget; raises (keeping the old budget) if the
  // memory that cannot be evicted does not fit.
  void SetBudget(int64_t bytes);
  int64_t Budget();
  void ResetPeak();
  // torch.ops.dtr.trace_mark: a `mark LABEL` line in the trace (DTR_TRACE_FILE), nothing when not
  // tracing (Note [Steady-state steps], runtime/sim/simulator.h). Throws for a label that is not
  // one trace token.
  void TraceMark(const std::string& label);
  // dtr.disable() / dtr.enable(): while paused the fallback passes every op through and nothing
  // is evicted. Pausing first brings back every evicted storage the program still holds, so
  // code that runs while paused (or reads memory outside the dispatcher) sees real data; what
  // ops do while paused keeps the recipes recorded before true (Note [Ops while paused]).
  void SetPaused(bool paused);
  // Note [fork] (engine.cc): pthread_atfork handlers.
  void PrepareFork();
  void ParentAfterFork();
  void ChildAfterFork();
  void HoldForFork();
  void ReleaseForkHold();
  bool paused() const { return paused_.load(std::memory_order_acquire); }
  // Note [Idle far below the budget] (fallback.cc): paused because memory stayed far below the
  // budget (not by dtr.disable()); the first op that finds it near the budget again resumes.
  bool idle() const { return idle_.load(std::memory_order_acquire); }
  // An allocation failed for want of an eviction while idle: the next op records again.
  void EndIdleAtNextOp() { idle_limit_bytes_.store(0, std::memory_order_relaxed); }
  // Why an allocation that needed an eviction failed while idle (out-of-memory messages).
  static constexpr char kIdleNothingEvicted[] =
      "dtr was idle, so it evicted nothing: memory had stayed below DTR_IDLE_BELOW of the budget, and the op "
      "under way took the rest; dtr records again from the next op (Note [Idle far below the budget]; "
      "DTR_IDLE_BELOW=0 keeps dtr recording, able to evict at any time)";
  // Note [fork] (engine.cc): a child forked while another thread was inside dtr runs paused and
  // never touches the runtime it inherited (whose state that thread may have left half-changed).
  bool runtime_untrusted() const { return runtime_untrusted_.load(std::memory_order_acquire); }
  // Note [Recording starts with a budget] (fallback.cc): false until the process has a budget
  // or a trace file; from then on true for good.
  bool recording() const { return recording_.load(std::memory_order_acquire); }
  // Turns recording on for good (a budget was accepted: set_budget, or a CUDA memory fraction).
  void StartRecording();
  // An op that began while ops passed through (not recording) ended with recording on: what it
  // allocated counts as made unrecorded too.
  void ExtendUnrecordedSerials();

 private:
  struct Busy {
    explicit Busy(Engine* e) : e_(e) { ++e_->busy_; }
    ~Busy() {
      if (--e_->busy_ == 0) e_->DrainDeaths();
    }
    Engine* e_;
  };

  // Whether dtr can record, evict and replay this tensor's storage: dense strided memory on the
  // managed device with no Python key (subclasses, FakeTensor) and not quantized or nested.
  bool Manageable(const at::Tensor& t) const {
    return !t.key_set().has(c10::DispatchKey::Python) && DenseOnManagedDevice(t);
  }
  // What a pin or an exposure acts on (Note [Raw access through a subclass], engine.cc): a
  // manageable tensor, or a Python-key subclass that shares a storage of dtr's memory.
  bool SharesOurMemory(const at::Tensor& t) const {
    if (!DenseOnManagedDevice(t)) return false;
    if (!t.key_set().has(c10::DispatchKey::Python)) return true;
    // unsafe_storage: a wrapper subclass (DTensor) throws on storage(); its storage holds nothing.
    return IsOurs(t.unsafeGetTensorImpl()->unsafe_storage().data_ptr());
  }
  bool DenseOnManagedDevice(const at::Tensor& t) const {
    return t.has_storage() && (managed_ == ManagedDevice::kCuda ? t.is_cuda() : t.is_cpu()) &&
           t.layout() == c10::kStrided && !t.is_quantized() && !t.is_nested();
  }
  // Note [Host operands of CUDA ops]: managing CUDA memory, a dense CPU tensor an op reads or
  // returns is not dtr's memory. Read (and not written), it is kept by value in the record when
  // small: Python numbers that became CPU tensors (x * 0.5), the Philox seed and offset that
  // efficient and flash attention return on the host and their backward reads. Returned, it is
  // left to the program: a replay recomputes it and drops it. Either way the op stays
  // recordable; before, such an op ran unrecorded and its CUDA outputs became constants (every
  // attention output and gradient of a Transformer).
  static constexpr size_t kHostOperandMaxBytes = 256;
  bool IsHostTensor(const at::Tensor& t) const {
    return managed_ == ManagedDevice::kCuda && t.is_cpu() && t.has_storage() && t.layout() == c10::kStrided &&
           !t.key_set().has(c10::DispatchKey::Python) && !t.is_quantized() && !t.is_nested();
  }
  bool IsHostOperand(const at::Tensor& t) const {
    return IsHostTensor(t) && (t.unsafeGetTensorImpl()->is_wrapped_number() ||
                               size_t(t.numel()) * t.element_size() <= kHostOperandMaxBytes);
  }
  // Whether an op's arguments hold a CUDA tensor or a CUDA device.
  static bool TouchesCuda(const c10::IValue* args, size_t n) {
    bool cuda = false;
    for (size_t i = 0; i < n && !cuda; ++i)
      if (args[i].isDevice()) cuda = args[i].toDevice().is_cuda();
    if (!cuda) ForEachTensor(args, n, [&](Path, const at::Tensor& t, bool) { cuda = cuda || t.is_cuda(); });
    return cuda;
  }
  // Note [Unevictable memory by reason] (memory_report.cc): reason texts interned once.
  uint16_t Intern(absl::string_view text);
  // Where a resident storage of ours stands, and why it cannot be evicted now (why: 0 when it can).
  enum class Standing : uint8_t { kEvictable, kExposed, kPinned, kLocked, kConstant };
  struct Unevictability {
    Standing standing;
    uint16_t why;
  };
  Unevictability StandingOf(const Entry& e, const StorageRecord& r) const;
  // The interned reason "constant: written in place by <op>".
  uint16_t WriterReason(absl::string_view op) {
    return Intern(absl::StrCat("constant: written in place by ", op));
  }
  // The classification of an op, made at its first call (under mu_).
  OpInfo& InfoOf(const c10::FunctionSchema& schema);
  void SetPausedLocked(bool paused);  // under mu_
  // The second half of a resume, without mu_: waits for the ops that began paused, then ends the
  // window of what was made unrecorded.
  void FinishResume();
  // Note [Idle far below the budget] (fallback.cc). At a recorded op, under mu_: whether the last
  // step (up to the end of a backward pass) stayed quiet long enough that dtr went idle now.
  bool IdleAfterQuietSteps(bool backward);
  // The allocated bytes below which dtr may stay idle (0: it may not idle): DTR_IDLE_BELOW of a CPU
  // budget, when not tracing.
  uint64_t IdleLimitBytes() const;
  // Evictions the budget forced (not at a storage's death) and rematerializations, so far.
  uint64_t PressureEvents() const;
  // Resumes recording if dtr is idle (not under mu_); `for_memory`: because memory reached the
  // limit (the next idle period then waits for twice the quiet steps), not for a new budget.
  void LeaveIdle(bool for_memory);
  // Whether the program holds a storage dtr evicted (SetPausedLocked(true) would bring it back).
  bool HoldsEvicted();
  // Calls f(entry) for each evicted storage the program still holds, the storage kept alive
  // meanwhile, until f returns false; whether it went through them all. A storage whose death
  // another thread's deleter has deferred (Note [Deleters never wait]) is gone already: nothing
  // can read it, and there is nothing to bring it back into.
  template <typename F>
  bool ForEachHeldEvicted(F f) {
    for (const auto& [packed, e] : entries_) {
      const StorageRecord* r = rt_->storage(e->sid);
      if (e->dead || r == nullptr || r->resident()) continue;
      if (c10::intrusive_ptr<c10::StorageImpl> alive = e->impl())
        if (!f(*e)) return false;
    }
    return true;
  }
  // Note [Ops while paused] (fallback.cc): waits until no op that began paused is under way.
  void AwaitPausedOps();
  // Writes that cannot be recorded: the tracked storages among the `n` arguments at `args` that
  // `info` writes become resident constants and their readers are detached (WriteUnreplayably).
  void WriteTrackedArgs(const c10::IValue* args, size_t n, const OpInfo& info);
  // Note [No replay during graph capture]: pins for good the storages of the `n` arguments at
  // `args` that dtr tracks (a captured graph keeps their addresses); throws if one is evicted.
  void PinReadInCapture(const c10::IValue* args, size_t n, const std::string& op);
  // Pins for good the storages of the arguments at `args` that dtr tracks, because `op`'s results
  // may hold them out of the dispatcher's sight (`why`).
  void PinHiddenOperands(const c10::IValue* args, size_t n, const std::string& op, absl::string_view why);
  void SetPinOrigin(StorageId sid, absl::string_view why) {
    if (Entry* e = FindEntry(sid)) e->pin_origin = Intern(absl::StrCat("pinned: ", why));
  }
  // The `nret` outputs on top of `stack` of `op`, which ran unrecorded (`why`), allocated since
  // `serial0`: their slots remember it.
  void TagUnrecordedOutputs(const torch::jit::Stack& stack, size_t nret, uint64_t serial0, const std::string& op,
                            absl::string_view why);
  // Checks, after each managed op, whether tracked memory reached a new high (2% steps).
  void WatchPeak() {
    if (rt_->memory() >= next_peak_snapshot_) SnapshotPeak();
  }
  void SnapshotPeak();
  void ForgetPeakSnapshot();  // ResetPeak: the next managed op takes a snapshot
  struct PeakWatch {
    explicit PeakWatch(Engine* e) : e_(e) {}
    ~PeakWatch() { e_->WatchPeak(); }
    Engine* e_;
  };
  // A write the runtime must see but can never replay (batch norm's running statistics, the
  // tensors of a collective): `written` become resident constants and their readers are
  // detached (Note [Mutation]); traced as a zero-cost mutate `name`. `op` names the failing op.
  // `writer`: the interned reason of the write, if the caller has it (else made from `name`).
  void WriteUnreplayably(const std::string& name, const std::vector<Entry*>& written, const char* op,
                         bool invalidate_readers, uint16_t writer = 0);
  // Note [Streams of evictable memory] (cuda_allocator.cc): the op about to run uses `s`.
  void NoteCudaUse(Slot* s);
  // Whether a CUDA stream capture is under way on the current stream: nothing may be evicted,
  // replayed or recorded then (Note [No replay during graph capture]).
  bool CaptureUnderway() const;
  // The storages an op holds while it runs (resident, never evicted: Note [Operands held for an
  // op], runtime/runtime.cc), released when it returns; KeepPinned() pins them for good as well
  // (Note [Unmanaged operands], fallback.cc).
  class OpOperands {
   public:
    OpOperands(Engine* e, const char* op) : e_(e), op_(op) {}
    void Add(StorageId id) {
      e_->Check(e_->rt_->HoldOperand(id), op_);
      ids_.push_back(id);
    }
    void KeepPinned(absl::string_view why) {
      for (StorageId id : ids_) {
        e_->Check(e_->rt_->Pin(id), op_);
        e_->SetPinOrigin(id, absl::StrCat(op_, ": ", why));
      }
    }
    ~OpOperands() {
      for (StorageId id : ids_) e_->rt_->ReleaseOperand(id);
    }

   private:
    Engine* e_;
    const char* op_;
    absl::InlinedVector<StorageId, 8> ids_;
  };
  // The engine lock for an eviction request. Inside a parallel region whose owner may hold it
  // (waiting for the region) it is only tried: owns_lock() false means "cannot evict now".
  std::unique_lock<std::recursive_timed_mutex> LockForEviction() {
    std::unique_lock<std::recursive_timed_mutex> l(mu_, std::defer_lock);
    if (at::in_parallel_region()) (void)l.try_lock();
    else l.lock();
    return l;
  }
  // Why an eviction under `l` (from LockForEviction) cannot run now, or null when it can: the lock
  // not had, dtr paused, a graph capture under way (Note [Why nothing was evicted]).
  const char* EvictionBlocked(const std::unique_lock<std::recursive_timed_mutex>& l);
  // Adds its lifetime to search_ns_ (Note [Where the time goes]).
  struct SearchClock {
    explicit SearchClock(Engine* e) : e_(e), t0_(NowNs()) {}
    ~SearchClock() {
      const double dt = NowNs() - t0_;
      e_->search_ns_ += dt;
      e_->rt_->AddSearchCost(dt);  // Note [Recomputation limit] (runtime/remat.cc)
    }
    Engine* e_;
    double t0_;
  };
  Entry* EntryOf(const at::Tensor& t, bool create);
  Entry* FindEntry(StorageId sid) {
    auto it = entries_.find(sid.packed());
    return it == entries_.end() ? nullptr : it->second;
  }
  Entry* NewEntry(StorageId sid, c10::StorageImpl* impl, size_t nbytes);
  // Drops a foreign entry from foreign_ (its storage died, its address was reused, or the entry
  // is being deleted); with `report_death`, the runtime then drops its record as for any death.
  void ForgetForeign(Entry* e, bool report_death);
  void DrainDeaths();
  // A dead storage's runtime reference goes (the program's, and a pin kept for a raw pointer).
  void DropProgramRef(Entry* e);
  bool OnSlotDeletedLocked(Slot* s);
  // Note [Deaths released at once] (engine.cc): drops the runtime's reference of a resident
  // storage whose last tensor just died; frees its block if the runtime released it, else the
  // entry takes the bytes over. Either way the caller must not free the slot.
  void DropAtDeath(Entry* e, Slot* s);
  // Gives a dead storage's entry a StorageImpl of its own holding `dp` (its bytes or a
  // tombstone) on `cuda_device` (-1: host): Note [Dead storages the runtime still needs].
  void TakeOver(Entry* e, c10::DataPtr dp, int cuda_device);
  // The StorageImpl a restore puts an entry's bytes into, made for a dead storage released at
  // its death (Note [Deaths released at once]); null for a live storage that is gone.
  c10::intrusive_ptr<c10::StorageImpl> RestoreTarget(Entry* e);
  void DrainDeferredSlots();
  // Read on every engine call, so without deferred_mu_: a slot handed over just after this
  // read waits for the next drain, as one handed over just after a locked read would.
  bool has_deferred_slots() const { return has_deferred_slots_.load(std::memory_order_acquire); }
  void Sweep();
  // Note [Entries of collected storages] (engine.cc).
  void FreeCollectedEntries();
  // Frees an entry already taken out of entries_.
  void DeleteEntry(Entry* e);
  void Check(const absl::Status& s, const char* what);
  // Callers test tracing() first: building the line costs more than most ops' bookkeeping.
  // A flag rather than trace_.is_open(), an out-of-line call that every op made several times.
  bool tracing() const { return tracing_; }
  void TraceLine(const std::string& s) {
    if (tracing_) trace_ << s << '\n';
  }
  std::string TName(Entry* e) { return absl::StrCat("t", e->trace_id); }

  DtrEnvConfig cfg_;
  const ManagedDevice managed_;
  // Note [Deferred op costs]: on CUDA, recorded ops' costs are corrected with kernel times.
  std::unique_ptr<CostEventSource> cost_events_;
  std::unique_ptr<DeferredCosts> deferred_costs_;
#if DTR_WITH_CUDA
  CudaAllocatorAdapter* cuda_ = nullptr;
  struct DeviceHandler;
  std::mutex handlers_mu_;  // guards device_handlers_ only
  std::vector<DeviceHandler*> device_handlers_;  // one per device allocator, never freed (like the engine)
#endif
  mutable std::recursive_timed_mutex mu_;
  bool fork_locked_ = false;  // Note [fork]: PrepareFork holds mu_, deferred_mu_ and the allocator's
  int fork_holds_ = 0;        // Note [fork]: HoldForFork's holds of mu_ (the Python hook's)
  std::unique_ptr<Runtime> rt_;
  std::unique_ptr<alloc::HostBackend> backend_;
  std::unique_ptr<alloc::CachingAllocator> alloc_;
  std::unique_ptr<CpuAllocatorAdapter> adapter_;
  absl::flat_hash_map<uint64_t, Entry*> entries_;                   // by StorageId
  Recycler<Entry> entry_memory_;       // Note [Recycled records] (recycler.h)
  Recycler<ReplayRecord> records_;     // every ReplayRecord is made and dropped through it
  GeneratorSnapshots generator_snapshots_;  // what records of random ops keep (Note [Generator snapshots])
  std::unordered_map<c10::StorageImpl*, Entry*> foreign_;            // memory not ours
  std::unordered_map<const c10::FunctionSchema*, OpInfo> infos_;
  // In front of infos_, direct-mapped by the schema's address: the ops of a training step are a
  // few dozen, so nearly every lookup is one compare (InfoOf).
  struct InfoCacheSlot {
    const c10::FunctionSchema* schema = nullptr;
    OpInfo* info = nullptr;
  };
  std::array<InfoCacheSlot, 256> info_cache_{};
  std::vector<Entry*> deaths_;
  // Note [Deaths released at once]: the entry whose storage is dying inside DropAtDeath, and
  // whether the runtime released it (Release saw it).
  Entry* dying_ = nullptr;
  bool dying_released_ = false;
  std::vector<StorageId> dropped_outputs_;  // Note [Entries of collected storages]
  std::mutex deferred_mu_;             // guards deferred_slots_ only; never held while calling out
  std::vector<Slot*> deferred_slots_;  // Note [Deleters never wait]
  std::atomic<bool> has_deferred_slots_{false};  // !deferred_slots_.empty(), written under deferred_mu_
  int busy_ = 0;
  uint64_t ops_seen_ = 0;
  uint64_t relayouts_ = 0;  // replays whose output was copied into the recorded layout (rule 5)
  uint64_t deaths_released_at_once_ = 0;  // Note [Deaths released at once]
  uint64_t views_on_short_path_ = 0;      // Note [Views on a short path]
  // Note [Where the time goes]: for benchmarks and users tuning overhead. search_ns_ is all time
  // in MakeRoom (choosing and evicting victims). Inside the fallback, hook_ns_ is the wall time of
  // managed ops, exec_ns_ the ops' own execution (first runs, eviction excluded), and the search
  // and rematerialization time spent inside the fallback is subtracted too; what remains is dtr's
  // bookkeeping (classification, recording, pinning, tracing). Recorded op costs exclude eviction.
  double search_ns_ = 0, hook_ns_ = 0, exec_ns_ = 0, hook_search_ns_ = 0, hook_remat_ns_ = 0;
  // Note [Program time between ops] (runtime/remat.cc): when the last managed op ended, and the
  // search and rematerialization clocks then (0: no op yet). Clocks never nest: the fallback,
  // their one user, runs with the Fake key excluded, so nothing it calls comes back to it.
  double last_op_end_ns_ = 0, search_at_op_end_ = 0, remat_at_op_end_ = 0;
  struct HookClock {
    explicit HookClock(Engine* e)
        : e_(e), t0_(NowNs()), search0_(e->search_ns_), remat0_(e->rt_->stats().remat_cost) {
      if (e_->last_op_end_ns_ > 0) e_->NoteProgramTime(*this);
    }
    ~HookClock() {
      const double t1 = NowNs(), remat1 = e_->rt_->stats().remat_cost;
      e_->hook_ns_ += t1 - t0_;
      e_->hook_search_ns_ += e_->search_ns_ - search0_;
      e_->hook_remat_ns_ += remat1 - remat0_;
      e_->last_op_end_ns_ = t1;
      e_->search_at_op_end_ = e_->search_ns_;
      e_->remat_at_op_end_ = remat1;
    }
    Engine* e_;
    double t0_, search0_, remat0_;
  };
  // Note [Program time between ops]: tells the runtime (and the trace) the program's own time
  // since the last managed op ended, up to the start of `clock`'s. A pause longer than
  // kMostProgramTimeNs (building the model, saving a checkpoint, waiting for input) counts as
  // that much: it says little of a step's pace, and a pause of seconds in a window of
  // millisecond ops would excuse a thrashing budget for thousands of ops (with a 1 s cap the
  // chain at 0.19 of its peak trained on at 80 times its plain step). The price: a program that
  // waits longer than that between ops every step (a synchronous data loader) meets the limit at
  // a smaller slowdown than its wall time would allow (README, DTR_MAX_RECOMPUTE).
  static constexpr double kMostProgramTimeNs = 1e7;
  void NoteProgramTime(const HookClock& clock);
  // Note [Scratch memory] (runtime/runtime.cc): an op's workspace is the allocator's high-water
  // mark while it runs above what it started and ended with. An estimate: ops running at the same
  // time on other threads add to it, bytes evicted during the op hide as much workspace, and an
  // op that frees an input's storage counts its output as workspace. It feeds statistics and
  // traces (taken with no budget, where nothing is evicted), not the budget, which the allocator
  // enforces. last_scratch_ is that of the op the fallback ran last.
  class ScratchMeter {
   public:
    explicit ScratchMeter(alloc::CachingAllocator* a) : a_(a), start_(a != nullptr ? a->MarkHighWater() : 0) {}
    uint64_t Bytes() const {
      if (a_ == nullptr) return 0;
      const auto [most, now] = a_->HighWaterSinceMark();
      const size_t held = std::max(start_, now);
      return most > held ? most - held : 0;
    }

   private:
    alloc::CachingAllocator* a_;
    size_t start_;
  };
  // The allocator of the managed device whose high-water mark ScratchMeter reads; none for
  // PyTorch's own CUDA allocator (DTR_CUDA_ALLOCATOR=native) or before CUDA is initialized.
  alloc::CachingAllocator* ScratchAllocator();
  uint64_t last_scratch_ = 0;
  // An op line's cost, then its scratch memory when it had any and whether a backward pass ran it:
  // COST [scratch=B] [pass=backward] (Note [Trace format], runtime/sim/trace.h).
  std::string TraceCost(double cost, bool backward) const {
    return absl::StrCat(int64_t(cost), last_scratch_ > 0 ? absl::StrCat(" scratch=", last_scratch_) : std::string(),
                        backward ? " pass=backward" : "");
  }
  int next_trace_id_ = 0;
  std::ofstream trace_;
  bool tracing_ = false;  // trace_ is open: set once, when the engine starts
  // Note [Unevictable memory by reason]: interned reasons (0 is ""), and the snapshot at the
  // largest tracked memory so far with what each unevictable storage was, so a report can leave
  // some out.
  std::vector<std::string> reasons_{"", "other (more distinct reasons than can be named)"};
  absl::flat_hash_map<std::string, uint16_t> reason_ids_;
  // The reasons with fixed texts, interned by the constructor.
  struct FixedReasons {
    uint16_t exposed = 0, pinned_by_running_op = 0, locked = 0, first_seen = 0;
    uint16_t constant[kConstantReasonCount] = {};  // by ConstantReason
  } fixed_reasons_;
  void InternFixedReasons();
  uint16_t bn_stats_writer_ = 0;  // WriterReason("aten::native_batch_norm(running_stats)")
  struct PeakSnapshot {
    MemoryByReason by;
    std::vector<UnevictableStorage> unevictable;
  };
  PeakSnapshot at_peak_;
  uint64_t next_peak_snapshot_ = 0;
  std::atomic<bool> paused_{false};
  // Note [Idle far below the budget] (fallback.cc): paused_ was set by idleness; the allocated
  // bytes that end it; and, under mu_, the step being watched: whether the last recorded op ran
  // in a backward pass, the most bytes allocated at a recorded op since the step began, the
  // PressureEvents() then, the quiet steps in a row and how many idling waits for (doubled by
  // every idle period that ended, up to kMostQuietSteps), and the idle periods so far.
  std::atomic<bool> idle_{false};
  std::atomic<uint64_t> idle_limit_bytes_{0};
  bool last_op_backward_ = false;
  uint64_t step_allocated_peak_ = 0;
  uint64_t step_pressure0_ = 0;
  uint32_t quiet_steps_ = 0, quiet_steps_needed_ = 1;
  static constexpr uint32_t kMostQuietSteps = 64;
  uint64_t idle_periods_ = 0;
  std::atomic<bool> runtime_untrusted_{false};
  // Note [Ops while paused] (fallback.cc): ops under way in FallbackPaused.
  std::atomic<int> paused_ops_{0};
  std::atomic<bool> recording_{false};
  // Note [Recording starts with a budget] (fallback.cc): the slot serials allocated while ops
  // passed through unrecorded, whose entries are Entry::made_unrecorded: up to
  // last_unrecorded_serial_ (0: recording from the start), and the ranges (after, upto] of each
  // pause (dtr.disable(); upto kNoSerialYet while paused; under mu_).
  bool MadeUnrecorded(uint64_t serial) const;
  static constexpr uint64_t kNoSerialYet = ~uint64_t(0);
  std::atomic<uint64_t> last_unrecorded_serial_{0};
  std::vector<std::pair<uint64_t, uint64_t>> paused_serials_;
  uint64_t exposures_unrecorded_ = 0;     // ExposeTensor calls before recording (under mu_)
};

// Note [Ops while paused] (fallback.cc): the ops under way in FallbackPaused on this thread.
extern thread_local int t_paused_ops;

// The process's engine: set once by dtr_activate (activation.cc), never destroyed; null while dtr
// is inactive. The allocator adapter, the slot deleters and the custom ops reach it here.
extern Engine* g_engine;

}  // namespace dtr::hooks

#endif  // DTR_HOOKS_ENGINE_H_

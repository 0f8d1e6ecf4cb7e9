// libdtr_torch.so: DTR inside stock PyTorch (CPU). The heavy half of the integration; the tiny
// preload shim (shim.c, libdtr.so) loads it only into processes that load libtorch.
//
// Pieces:
//  * Engine: one per process, never destroyed (tensors may be freed during static destruction).
//    Owns the dtr::Runtime (budget unlimited: the allocator enforces DTR_BUDGET), the caching
//    allocator over host memory, the CPU c10::Allocator adapter, the replay records, and one
//    std::recursive_mutex that serializes everything (the allocator's eviction callback re-enters
//    on the same thread while an op is executing).
//  * A boxed fallback on DispatchKey::Fake that records ops, makes inputs resident, routes
//    mutations through Runtime::Mutate and views through Runtime::Access.
//  * TorchReplayBackend: evicts a StorageImpl by swapping in a tombstone DataPtr and restores it
//    by replaying the recorded op with autograd and Fake excluded.
//
// Note [Slots and tombstones]
// Every DataPtr our allocator hands out has a Slot as context (mem, bytes, the Entry it belongs
// to, an allocation serial). An evicted storage holds a tombstone: a DataPtr with a null pointer
// whose context is a Slot with mem == nullptr and the same deleter. So the deleter runs whenever
// a tracked storage dies, resident or evicted, and the context of any storage tells us in O(1)
// whether it is ours and which runtime record it has. Before we ourselves replace a DataPtr
// (evict, restore, permanent release) we clear the old Slot's entry, so its deleter only frees.
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
// collects it (Release(permanently=true) frees the internal StorageImpl). Storages whose memory
// is not ours (from_numpy, pre-activation allocations) cannot be stolen: replay records hold a
// strong reference to those (they are constants anyway, never evicted).
//
// Note [Recording without knowing the outputs]
// Runtime::Compute needs the number and sizes of the outputs before it runs the op, which the
// torch layer only knows afterwards. So the fallback pins the inputs (Runtime::Pin makes them
// resident and unevictable), runs the op, and then calls Compute with an execute callback that
// returns the measured cost. Allocations inside the op may evict other storages (the new outputs
// are not tracked yet, so they cannot be chosen).
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>
#include <torch/version.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "allocator/caching_allocator.h"
#include "allocator/eviction_handler.h"
#include "allocator/eviction_strategy.h"
#include "allocator/host_backend.h"
#include "hooks/env_config.h"
#include "runtime/bytes.h"
#include "runtime/runtime.h"

#if TORCH_VERSION_MAJOR >= 2
#define DTR_ALLOC_CONST
#else
#define DTR_ALLOC_CONST const
#endif

namespace dtr::hooks {
namespace {

using Clock = std::chrono::steady_clock;
double NowNs() {
  return double(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}

struct Entry;

// A resident slot sits in the first kHeader bytes of its allocator block, and the DataPtr's data
// and context are both the byte after it (c10's raw_allocate requires context == data). A
// tombstone slot is heap-allocated and has mem == nullptr.
struct Slot {
  void* mem = nullptr;  // the allocator block (== this for resident slots); nullptr: tombstone
  size_t bytes = 0;
  Entry* entry = nullptr;
  uint64_t serial = 0;
};
constexpr size_t kHeader = 64;
static_assert(sizeof(Slot) <= kHeader, "slot header");

void DataDeleter(void* data);
void TombDeleter(void* ctx);
inline Slot* SlotOfData(void* data) { return reinterpret_cast<Slot*>(static_cast<char*>(data) - kHeader); }
inline void* DataOf(Slot* s) { return reinterpret_cast<char*>(s) + kHeader; }

// One per storage the runtime knows.
struct Entry {
  StorageId sid;
  c10::weak_intrusive_ptr<c10::StorageImpl> weak{c10::intrusive_ptr<c10::StorageImpl>()};
  c10::intrusive_ptr<c10::StorageImpl> owned;   // Note [Dead storages the runtime still needs]
  c10::intrusive_ptr<c10::StorageImpl> foreign; // memory not ours: kept alive while the entry is
  Slot* slot = nullptr;                          // current data slot or tombstone (ours only)
  size_t nbytes = 0;
  bool ours = false;
  bool dead = false;  // external reference dropped
  int trace_id = -1;

  // The StorageImpl holding this storage's bytes now (strong ref), or null.
  c10::intrusive_ptr<c10::StorageImpl> impl() {
    if (owned) return owned;
    if (foreign) return foreign;
    return weak.lock();
  }
};

struct TensorMeta {
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  // A Python scalar operand (`int_tensor * 0.5`) arrives as a wrapped-number tensor, which type
  // promotion treats as a scalar (default dtype) instead of a double tensor: replays keep the flag.
  bool wrapped_number = false;
  static TensorMeta Of(const at::Tensor& t) {
    TensorMeta m;
    m.wrapped_number = t.unsafeGetTensorImpl()->is_wrapped_number();
    m.sizes = t.sizes().vec();
    m.strides = t.strides().vec();
    m.offset = t.storage_offset();
    m.dtype = t.scalar_type();
    return m;
  }
  bool Matches(const at::Tensor& t) const {
    return t.sizes().vec() == sizes && t.strides().vec() == strides && t.storage_offset() == offset &&
           t.scalar_type() == dtype;
  }
};

// Where a tensor sits in an argument/return list: index, and element within a list (-1: none).
struct Path {
  int index = 0;
  int elem = -1;
};

struct TensorArg {
  Path path;
  StorageId sid;
  TensorMeta meta;
  bool is_optional_list = false;
};

struct OutputSpec {
  Path path;
  TensorMeta meta;
  size_t nbytes = 0;
};

struct ReplayRecord {
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;  // tensors replaced by None; lists keep their shape
  std::vector<TensorArg> tensors;
  std::vector<OutputSpec> outputs;  // aligned with OpRecord::outputs (creating ops)
  int gen_arg = -1;
  c10::optional<at::Generator> gen;          // pristine clone for Generator? args
  c10::optional<at::Generator> default_gen;  // pristine default generator state (seeded ops)
  // Note [Global state a replay depends on]: torch.set_default_dtype changes what many ops
  // produce (factories without dtype, int tensor * float scalar, ...). A replay runs under the
  // default dtype that was current when the op first ran.
  caffe2::TypeMeta default_dtype = c10::get_default_dtype();
  explicit ReplayRecord(c10::OperatorHandle h) : op(std::move(h)) {}
};

enum class Kind { kPassthrough, kRecord, kMutate, kView, kOpaque };

struct OpInfo {
  Kind kind = Kind::kPassthrough;
  bool replayable = false;
  std::vector<int> write_args;
  bool write_all = false;  // non-aten op with tensor args: treat every tensor input as written
  int gen_arg = -1;
  bool seeded_no_gen = false;
  std::string name;
};

bool StartsWith(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// Note [Random ops without a Generator argument]
// Many random aten ops have an overload without a `Generator?` argument that draws from the
// default CPU generator (rand, randn, randint, randperm, rand_like, native_dropout, ...). Replaying
// such an op without restoring the default generator's recorded state produces different values
// (a model input made by torch.randn, evicted and replayed, silently changed the loss) and
// advances the program's global RNG stream. Every aten op whose name has any overload taking a
// Generator, plus the *_like and dropout families, is treated as seeded: the default generator is
// cloned at record time and set/restored around each replay. As a safety net, Fallback also
// fingerprints the default generator around every recorded op and refuses to record an op that
// consumed it unexpectedly (its outputs become constants).
bool IsRandomFamily(const std::string& name) {
  static const std::unordered_set<std::string>* families = [] {
    auto* f = new std::unordered_set<std::string>{
        "aten::native_dropout", "aten::rand_like", "aten::randn_like", "aten::randint_like",
        "aten::dropout", "aten::feature_dropout", "aten::alpha_dropout", "aten::feature_alpha_dropout",
        "aten::rrelu", "aten::rrelu_with_noise", "aten::randperm", "aten::rand", "aten::randn",
        "aten::randint", "aten::bernoulli", "aten::multinomial", "aten::normal", "aten::poisson",
        "aten::binomial", "aten::_standard_gamma", "aten::_sample_dirichlet", "aten::_fused_dropout"};
    for (const c10::OperatorName& on : c10::Dispatcher::singleton().getAllOpNames()) {
      auto h = c10::Dispatcher::singleton().findOp(on);
      if (!h || !h->hasSchema()) continue;
      for (const auto& a : h->schema().arguments())
        if (a.type()->isSubtypeOf(*c10::OptionalType::create(c10::GeneratorType::get())) ||
            a.type()->kind() == c10::TypeKind::GeneratorType) {
          f->insert(on.name);
          break;
        }
    }
    return f;
  }();
  return families->count(name) > 0;
}

// A cheap fingerprint of the default CPU generator's position in its stream.
struct GenMark {
  uint64_t seed = 0;
  int left = 0;
  uint32_t next = 0;
  bool has_f = false, has_d = false;
  static GenMark Now() {
    at::Generator def = at::detail::getDefaultCPUGenerator();
    auto* g = def.get<at::CPUGeneratorImpl>();
    GenMark m;
    at::mt19937 e = g->engine();
    auto d = e.data();
    m.seed = d.seed_;
    m.left = d.left_;
    m.next = d.next_;
    m.has_f = g->next_float_normal_sample().has_value();
    m.has_d = g->next_double_normal_sample().has_value();
    return m;
  }
  bool operator==(const GenMark& o) const {
    return seed == o.seed && left == o.left && next == o.next && has_f == o.has_f && has_d == o.has_d;
  }
};

// `record_empty` is the debug switch for design rule 4 (never record empty* outputs: their
// contents are whatever the program writes next, possibly outside the dispatcher).
OpInfo Classify(const c10::FunctionSchema& schema, bool record_empty) {
  OpInfo info;
  info.name = schema.name();
  if (!schema.overload_name().empty()) info.name += "." + schema.overload_name();
  const std::string& n = schema.name();
  bool has_tensor_arg = false, has_tensor_ret = false, aliased_ret = false;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const auto& a = schema.arguments()[i];
    const auto& ty = a.type();
    if (ty->kind() == c10::TypeKind::TensorType || ty->isSubtypeOf(*c10::ListType::ofTensors()) ||
        ty->isSubtypeOf(*c10::OptionalType::ofTensor()) ||
        ty->isSubtypeOf(*c10::ListType::create(c10::OptionalType::ofTensor())))
      has_tensor_arg = true;
    if (a.alias_info() && a.alias_info()->isWrite()) info.write_args.push_back(int(i));
    if (ty->isSubtypeOf(*c10::OptionalType::create(c10::GeneratorType::get())) ||
        ty->kind() == c10::TypeKind::GeneratorType)
      info.gen_arg = int(i);
  }
  for (const auto& r : schema.returns()) {
    if (r.alias_info()) aliased_ret = true;
    const auto& ty = r.type();
    if (ty->kind() == c10::TypeKind::TensorType || ty->isSubtypeOf(*c10::ListType::ofTensors()))
      has_tensor_ret = true;
  }
  if (!StartsWith(n, "aten::")) {
    if (!has_tensor_arg || StartsWith(n, "dtr::")) return info;  // passthrough (dtr:: control ops, ...)
    info.kind = Kind::kMutate;
    info.write_all = true;
    info.replayable = false;
    return info;
  }
  static const char* kNever[] = {"aten::copy_", "aten::set_", "aten::resize_", "aten::resize_as_",
                                 "aten::record_stream", "aten::index_put_", "aten::_index_put_impl_",
                                 "aten::_local_scalar_dense", "aten::lift", "aten::lift_fresh",
                                 "aten::_resize_output_", "aten::detach_", "aten::requires_grad_",
                                 "aten::retain_grad", "aten::_coalesced_", "aten::set_data"};
  const bool empty_family =
      StartsWith(n, "aten::empty") || StartsWith(n, "aten::new_empty") || StartsWith(n, "aten::_empty");
  bool never = (empty_family && !record_empty) || StartsWith(n, "aten::_foreach_") ||
               n.find("profiler") != std::string::npos || n.find("record_function") != std::string::npos;
  for (const char* k : kNever)
    if (n == k) never = true;
  bool conservative = schema.aliasAnalysis() == c10::AliasAnalysisKind::CONSERVATIVE;
  if (!info.write_args.empty()) {
    info.kind = Kind::kMutate;
    bool single_tensor = info.write_args.size() == 1 &&
                         schema.arguments()[info.write_args[0]].type()->kind() == c10::TypeKind::TensorType;
    info.replayable = !never && !conservative && single_tensor && info.gen_arg < 0 && !IsRandomFamily(n);
    return info;
  }
  if (aliased_ret) {
    info.kind = Kind::kView;
    return info;
  }
  if (never || conservative || !has_tensor_ret) {
    info.kind = has_tensor_arg || has_tensor_ret ? Kind::kOpaque : Kind::kPassthrough;
    if (n == "aten::_local_scalar_dense") info.kind = Kind::kOpaque;
    return info;
  }
  info.kind = Kind::kRecord;
  info.replayable = true;
  info.seeded_no_gen = info.gen_arg < 0 && IsRandomFamily(n);
  return info;
}

// Visits every defined tensor in an IValue list (Tensor, Tensor[], Tensor?[]).
template <typename F>
void ForEachTensor(const c10::IValue* begin, size_t n, F&& f) {
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = begin[i];
    if (v.isTensor()) {
      if (v.toTensor().defined()) f(Path{int(i), -1}, v.toTensor(), false);
    } else if (v.isTensorList()) {
      auto l = v.toTensorList();
      for (size_t j = 0; j < l.size(); ++j) {
        at::Tensor t = l.get(j);
        if (t.defined()) f(Path{int(i), int(j)}, t, false);
      }
    } else if (v.isList()) {
      auto l = v.toListRef();
      for (size_t j = 0; j < l.size(); ++j)
        if (l[j].isTensor() && l[j].toTensor().defined()) f(Path{int(i), int(j)}, l[j].toTensor(), true);
    }
  }
}

// Copies arguments, deep-copying lists (c10::List has reference semantics).
std::vector<c10::IValue> CopyArgs(const c10::IValue* begin, const c10::IValue* end) {
  std::vector<c10::IValue> out;
  out.reserve(end - begin);
  for (const c10::IValue* a = begin; a != end; ++a) {
    if (a->isTensorList()) out.emplace_back(a->toTensorList().copy());
    else if (a->isList()) out.emplace_back(a->toList().copy());
    else out.push_back(*a);
  }
  return out;
}

class Engine;
Engine* g_engine = nullptr;
std::atomic<uint64_t> g_serial{0};
std::atomic<bool> g_active{false};

class CpuAllocatorAdapter final : public c10::Allocator {
 public:
  explicit CpuAllocatorAdapter(alloc::CachingAllocator* a) : alloc_(a) {}
  c10::DataPtr allocate(size_t n) DTR_ALLOC_CONST override;
  c10::DeleterFnPtr raw_deleter() const override { return &DataDeleter; }
#if TORCH_VERSION_MAJOR >= 2
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
  alloc::CachingAllocator* alloc_;
};

class Engine final : public ReplayBackend, public alloc::EvictionHandler {
 public:
  explicit Engine(const DtrEnvConfig& cfg) : cfg_(cfg) {}

  absl::Status Init() {
    RuntimeConfig rc;
    rc.budget_bytes = kUnlimitedBudget;
    rc.heuristic = cfg_.heuristic;
    rc.dealloc = cfg_.dealloc;
    rc.search = cfg_.search;
    auto rt = Runtime::Create(rc, this);
    if (!rt.ok()) return rt.status();
    rt_ = std::move(*rt);
    alloc::AllocatorConfig ac;
    ac.budget_bytes = cfg_.unlimited() ? alloc::AllocatorConfig::kUnlimited : size_t(cfg_.budget_bytes);
    ac.enable_eviction = cfg_.evict;
    // Note [CPU allocator granularity]
    // Host memory has no expensive segment allocation, and a budget only helps if freed bytes can
    // be reused by the next request. Segments shared by several tensors fragment under a tight
    // budget: one long-lived tensor (a parameter, a gradient) keeps its whole segment reserved,
    // and a 256 KiB small-pool segment could not grow inside a 460 KiB budget that already held
    // one. So every tensor gets its own segment, rounded to 512 B (the header included). Without
    // a budget, freed segments are cached for reuse. Under a budget they are released at once
    // (DataDeleter): reusing a larger cached segment splits it, and the remnant cannot be
    // released while its neighbour lives (MLP at 0.9 of its peak failed with 78 KiB free in
    // remnants). The caching allocator has no "do not split" option yet.
    ac.min_block_size = 512;
    ac.small_size = 512;
    ac.small_segment_size = 512;
    ac.min_large_alloc = 1024;
    ac.large_segment_size = 1024;
    ac.large_round = 512;
    backend_ = std::make_unique<alloc::HostBackend>(512);
    auto a = alloc::CachingAllocator::Create(ac, backend_.get());
    if (!a.ok()) return a.status();
    alloc_ = std::move(*a);
    alloc_->SetEvictionHandler(this);
    release_on_free_ = !cfg_.unlimited();
    adapter_ = std::make_unique<CpuAllocatorAdapter>(alloc_.get());
    if (!cfg_.trace_file.empty()) {
      trace_.open(cfg_.trace_file, std::ios::out | std::ios::trunc);
      if (!trace_) return absl::InvalidArgumentError("dtr: cannot open DTR_TRACE_FILE " + cfg_.trace_file);
      trace_ << "dtr-trace 1\n# written by libdtr_torch\n";
    }
    return absl::OkStatus();
  }

  const DtrEnvConfig& cfg() const { return cfg_; }
  bool release_on_free() const { return release_on_free_.load(std::memory_order_relaxed); }
  c10::Allocator* adapter() { return adapter_.get(); }
  alloc::CachingAllocator* allocator() { return alloc_.get(); }
  std::recursive_mutex& mu() { return mu_; }

  // ---------------- the fallback ----------------
  void Fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);

  // ---------------- deleter ----------------
  // Returns true when the bytes were kept (stolen into an internal StorageImpl).
  bool OnSlotDeleted(Slot* s);

  // ---------------- ReplayBackend ----------------
  absl::StatusOr<double> Replay(OpId id, const OpRecord& op, absl::Span<const bool> keep) override;
  void Release(StorageId id, const StorageRecord& storage, bool permanently) override;
  void OnOpDropped(OpId id, const OpRecord& op) override {
    delete reinterpret_cast<ReplayRecord*>(op.handle);
  }

  // ---------------- EvictionHandler ----------------
  alloc::EvictionResult MakeRoom(const alloc::EvictionRequest& request) override;
  size_t PinnedBytes() const override {
    std::unique_lock<std::recursive_mutex> l(mu_, std::try_to_lock);
    if (!l.owns_lock()) return 0;
    return rt_->UnevictableBytes();
  }

  std::string StatsJson();
  // Where the allocated bytes are, for out-of-memory reports.
  std::string Breakdown() {
    std::unique_lock<std::recursive_mutex> l(mu_, std::try_to_lock);
    if (!l.owns_lock()) return "breakdown unavailable";
    uint64_t constants = 0, pinned = 0, locked = 0, evictable = 0, evicted = 0, n_const = 0;
    for (auto& [k, e] : entries_) {
      const StorageRecord* r = rt_->storage(e->sid);
      if (r == nullptr) continue;
      if (!r->resident()) {
        evicted += r->size;
        continue;
      }
      if (!e->ours) continue;
      if (!r->rematerializable()) {
        constants += r->size;
        ++n_const;
      } else if (r->pins > 0) {
        pinned += r->size;
      } else if (r->locks > 0) {
        locked += r->size;
      } else {
        evictable += r->size;
      }
    }
    uint64_t alloc = uint64_t(alloc_->GetStats().allocated_bytes.current);
    uint64_t tracked = constants + pinned + locked + evictable;
    return absl::StrCat("allocated ", FormatBytes(alloc), ": constants ", FormatBytes(constants), " in ", n_const,
                        " storages (parameters, gradients, optimizer state, inputs, outputs of unreplayable "
                        "ops), pinned ", FormatBytes(pinned), ", locked by the running op ", FormatBytes(locked),
                        ", evictable ", FormatBytes(evictable), ", untracked ",
                        FormatBytes(alloc > tracked ? alloc - tracked : 0),
                        " (allocator headers/rounding, tensors no op has read yet); evicted ", FormatBytes(evicted));
  }
  // torch.ops.dtr.pin / unpin: keep a tensor's storage resident (for raw access: .numpy(),
  // torch.save, data_ptr(), extensions), see README "Tensors leaving the dispatcher".
  void PinTensor(const at::Tensor& t, bool pin) {
    if (!t.defined() || !t.has_storage() || !t.is_cpu()) return;
    std::lock_guard<std::recursive_mutex> l(mu_);
    Busy b(this);
    Entry* e = EntryOf(t, pin);
    if (e == nullptr) return;
    Check(pin ? rt_->Pin(e->sid) : rt_->Unpin(e->sid), pin ? "pin" : "unpin");
  }
  void WriteStatsFile();
  // torch.ops.dtr.set_budget: changes the budget at run time (<= 0: unlimited). Evicts and
  // releases cached memory to get under a lower budget; raises (keeping the old budget) if the
  // memory that cannot be evicted does not fit.
  void SetBudget(int64_t bytes) {
    std::lock_guard<std::recursive_mutex> l(mu_);
    Busy b(this);
    size_t nb = bytes <= 0 ? alloc::AllocatorConfig::kUnlimited : size_t(bytes);
    absl::Status st = alloc_->SetBudget(nb);
    if (!st.ok()) {
      alloc_->EmptyCache();
      st = alloc_->SetBudget(nb);
    }
    if (!st.ok()) {
      uint64_t reserved = uint64_t(alloc_->GetStats().reserved_bytes.current);
      if (reserved > nb) rt_->EvictAtLeast(reserved - nb);
      alloc_->EmptyCache();
      st = alloc_->SetBudget(nb);
    }
    if (!st.ok())
      TORCH_CHECK_WITH(OutOfMemoryError, false, "dtr: set_budget(", bytes, "): cannot get under ",
                       FormatBytes(nb), ": ", st.message(), " (", Breakdown(), ")");
    cfg_.budget_bytes = bytes <= 0 ? kUnlimitedBudget : uint64_t(bytes);
    release_on_free_ = bytes > 0;
  }
  int64_t Budget() {
    std::lock_guard<std::recursive_mutex> l(mu_);
    return cfg_.unlimited() ? -1 : int64_t(cfg_.budget_bytes);
  }
  void ResetPeak() { alloc_->ResetPeakStats(); }

 private:
  struct Busy {
    explicit Busy(Engine* e) : e_(e) { ++e_->busy_; }
    ~Busy() {
      if (--e_->busy_ == 0) e_->DrainDeaths();
    }
    Engine* e_;
  };

  Entry* EntryOf(const at::Tensor& t, bool create);
  Entry* FindEntry(StorageId sid) {
    auto it = entries_.find(sid.packed());
    return it == entries_.end() ? nullptr : it->second;
  }
  Entry* NewEntry(StorageId sid, c10::StorageImpl* impl, size_t nbytes);
  void DrainDeaths();
  void Sweep();
  void Check(const absl::Status& s, const char* what);
  void TraceLine(const std::string& s) {
    if (trace_.is_open()) trace_ << s << '\n';
  }
  std::string TName(Entry* e) { return absl::StrCat("t", e->trace_id); }

  DtrEnvConfig cfg_;
  mutable std::recursive_mutex mu_;
  std::unique_ptr<Runtime> rt_;
  std::unique_ptr<alloc::HostBackend> backend_;
  std::unique_ptr<alloc::CachingAllocator> alloc_;
  std::unique_ptr<CpuAllocatorAdapter> adapter_;
  absl::flat_hash_map<uint64_t, Entry*> entries_;                   // by StorageId
  std::unordered_map<c10::StorageImpl*, Entry*> foreign_;            // memory not ours
  std::unordered_map<const c10::FunctionSchema*, OpInfo> infos_;
  std::vector<Entry*> deaths_;
  int busy_ = 0;
  uint64_t ops_seen_ = 0;
  uint64_t relayouts_ = 0;  // replays whose output was copied into the recorded layout (rule 5)
  // Note [Where the time goes]: for benchmarks and users tuning overhead. search_ns_ is all time
  // in MakeRoom (choosing and evicting victims). Inside the fallback, hook_ns_ is the wall time of
  // managed ops, exec_ns_ the ops' own execution (first runs, eviction excluded), and the search
  // and rematerialization time spent inside the fallback is subtracted too; what remains is dtr's
  // bookkeeping (classification, recording, pinning, tracing). Recorded op costs exclude eviction.
  double search_ns_ = 0, hook_ns_ = 0, exec_ns_ = 0, hook_search_ns_ = 0, hook_remat_ns_ = 0;
  struct HookClock {
    explicit HookClock(Engine* e)
        : e_(e), t0_(NowNs()), search0_(e->search_ns_), remat0_(e->rt_->stats().remat_cost) {}
    ~HookClock() {
      e_->hook_ns_ += NowNs() - t0_;
      e_->hook_search_ns_ += e_->search_ns_ - search0_;
      e_->hook_remat_ns_ += e_->rt_->stats().remat_cost - remat0_;
    }
    Engine* e_;
    double t0_, search0_, remat0_;
  };
  int next_trace_id_ = 0;
  std::ofstream trace_;
  uint64_t oom_count_ = 0;
  std::atomic<bool> release_on_free_{false};
};

c10::DataPtr CpuAllocatorAdapter::allocate(size_t n) DTR_ALLOC_CONST {
  absl::StatusOr<void*> p = alloc_->Allocate(n + kHeader);
  if (!p.ok()) {
    std::string pinned;
    if (g_engine && !g_engine->cfg().evict)
      pinned = absl::StrCat(" Eviction is off (DTR_EVICT=0), so the budget is a plain cap (",
                            g_engine->Breakdown(), ").");
    else if (g_engine)
      pinned = absl::StrCat(" dtr could not evict enough: ", FormatBytes(g_engine->PinnedBytes()),
                            " are pinned/constant/in use by the running op (", g_engine->Breakdown(), ").");
    TORCH_CHECK_WITH(OutOfMemoryError, false, "dtr: out of memory under DTR_BUDGET: cannot allocate ",
                     FormatBytes(n), ".", pinned, " Allocator report: ", p.status().message());
  }
  Slot* s = new (*p) Slot{*p, n, nullptr, ++g_serial};
  void* data = DataOf(s);
  return c10::DataPtr(data, data, &DataDeleter, c10::Device(c10::DeviceType::CPU));
}

void DataDeleter(void* data) {
  Slot* s = SlotOfData(data);
  if (s->entry != nullptr && g_engine != nullptr && g_engine->OnSlotDeleted(s)) return;
  absl::Status st = g_engine->allocator()->Free(s->mem);
  if (!st.ok()) std::fprintf(stderr, "dtr: free failed: %s\n", std::string(st.message()).c_str());
  // Note [CPU allocator granularity]: under a budget, keep no cached free segments, so a later
  // request never splits a larger cached segment (remnants fragment the budget).
  if (g_engine->release_on_free()) g_engine->allocator()->EmptyCache();
}

void TombDeleter(void* ctx) {
  Slot* s = static_cast<Slot*>(ctx);
  if (s->entry != nullptr && g_engine != nullptr) g_engine->OnSlotDeleted(s);
  delete s;
}

bool IsOurs(const c10::DataPtr& dp) { return dp.get_deleter() == &DataDeleter || dp.get_deleter() == &TombDeleter; }
// The slot (resident or tombstone) of one of our DataPtrs.
Slot* SlotOf(const c10::DataPtr& dp) {
  if (dp.get_deleter() == &DataDeleter) return SlotOfData(dp.get_context());
  if (dp.get_deleter() == &TombDeleter) return static_cast<Slot*>(dp.get_context());
  return nullptr;
}
c10::DataPtr TombPtr(Slot* tomb) { return c10::DataPtr(nullptr, tomb, &TombDeleter, c10::Device(c10::DeviceType::CPU)); }

void Engine::Check(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  if (absl::IsResourceExhausted(s))
    TORCH_CHECK_WITH(OutOfMemoryError, false, "dtr: ", what, ": ", s.message());
  TORCH_CHECK(false, "dtr: ", what, ": ", s.message());
}

Entry* Engine::NewEntry(StorageId sid, c10::StorageImpl* impl, size_t nbytes) {
  Entry* e = new Entry;
  e->sid = sid;
  e->weak = c10::weak_intrusive_ptr<c10::StorageImpl>(
      c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl));
  e->nbytes = nbytes;
  e->trace_id = next_trace_id_++;
  entries_[sid.packed()] = e;
  return e;
}

// The entry of t's storage; with `create`, registers an unknown storage as a constant.
Entry* Engine::EntryOf(const at::Tensor& t, bool create) {
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  const c10::DataPtr& dp = impl->data_ptr();
  if (IsOurs(dp)) {
    Slot* s = SlotOf(dp);
    if (s->entry) return s->entry;
    if (!create) return nullptr;
    size_t nbytes = impl->nbytes();
    auto sid = rt_->AddConstant(nbytes);
    Check(sid.status(), "AddConstant");
    Entry* e = NewEntry(*sid, impl, nbytes);
    e->ours = true;
    e->slot = s;
    s->entry = e;
    TraceLine(absl::StrCat("const ", TName(e), " ", nbytes));
    return e;
  }
  auto it = foreign_.find(impl);
  if (it != foreign_.end()) return it->second;
  if (!create) return nullptr;
  size_t nbytes = impl->nbytes();
  auto sid = rt_->AddConstant(nbytes);
  Check(sid.status(), "AddConstant");
  Entry* e = NewEntry(*sid, impl, nbytes);
  e->foreign = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl);
  foreign_[impl] = e;
  TraceLine(absl::StrCat("const ", TName(e), " ", nbytes));
  return e;
}

bool Engine::OnSlotDeleted(Slot* s) {
  std::lock_guard<std::recursive_mutex> l(mu_);
  Entry* e = s->entry;
  s->entry = nullptr;
  if (e == nullptr || e->slot != s) return false;
  bool kept = false;
  if (e->owned) {  // the internal StorageImpl died: only via our own release paths
    e->slot = nullptr;
    return false;
  }
  if (e->weak.expired()) {
    // Note [Dead storages the runtime still needs]: steal the bytes (or tombstone).
    c10::DataPtr dp;
    if (s->mem != nullptr) {
      s->entry = e;
      kept = true;
      dp = c10::DataPtr(DataOf(s), DataOf(s), &DataDeleter, c10::Device(c10::DeviceType::CPU));
    } else {
      Slot* tomb = new Slot{nullptr, 0, e, 0};
      e->slot = tomb;
      dp = TombPtr(tomb);
    }
    e->owned = c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), int64_t(e->nbytes), std::move(dp), adapter_.get(),
        /*resizable=*/false);
  } else {
    e->slot = nullptr;  // someone replaced the memory of a live storage (resize_): no longer ours
  }
  if (!e->dead) {
    e->dead = true;
    deaths_.push_back(e);
  }
  if (busy_ == 0) DrainDeaths();
  return kept;
}

void Engine::DrainDeaths() {
  while (!deaths_.empty() && busy_ == 0) {
    std::vector<Entry*> d;
    d.swap(deaths_);
    Busy b(this);
    for (Entry* e : d) {
      TraceLine(absl::StrCat("release ", TName(e)));
      if (rt_->storage(e->sid) != nullptr) {
        absl::Status s = rt_->DropRef(e->sid);
        if (!s.ok() && cfg_.verbose)
          std::fprintf(stderr, "dtr: DropRef: %s\n", std::string(s.message()).c_str());
      }
    }
  }
}

// Frees entries whose records the runtime collected while evicted, and foreign storages the
// program dropped.
void Engine::Sweep() {
  Busy b(this);
  std::vector<uint64_t> gone;
  for (auto& [k, e] : entries_) {
    if (rt_->storage(e->sid) == nullptr) gone.push_back(k);
  }
  for (uint64_t k : gone) {
    Entry* e = entries_[k];
    entries_.erase(k);
    if (e->slot) e->slot->entry = nullptr;
    if (e->foreign) foreign_.erase(e->foreign.get());
    e->owned.reset();
    e->foreign.reset();
    delete e;
  }
  for (auto it = foreign_.begin(); it != foreign_.end(); ++it) {
    Entry* e = it->second;
    // Only our references remain (the entry's strong one, plus the weak one).
    if (!e->dead && e->foreign.use_count() == 1) {
      e->dead = true;
      deaths_.push_back(e);
    }
  }
}

void Engine::Release(StorageId id, const StorageRecord& storage, bool permanently) {
  Entry* e = FindEntry(id);
  if (e == nullptr) return;
  c10::intrusive_ptr<c10::StorageImpl> impl = e->impl();
  if (impl && e->ours && e->slot != nullptr && SlotOf(impl->data_ptr()) == e->slot && e->slot->mem != nullptr) {
    // Rule 3: only our own memory is ever released.
    e->slot->entry = nullptr;
    Slot* tomb = new Slot{nullptr, 0, permanently ? nullptr : e, 0};
    e->slot = permanently ? nullptr : tomb;
    impl->set_data_ptr_noswap(TombPtr(tomb));
  }
  impl.reset();
  if (permanently) {
    entries_.erase(id.packed());
    if (e->slot) e->slot->entry = nullptr;
    if (e->owned && IsOurs(e->owned->data_ptr())) SlotOf(e->owned->data_ptr())->entry = nullptr;
    if (e->foreign) foreign_.erase(e->foreign.get());
    e->owned.reset();
    e->foreign.reset();
    delete e;
  }
}

at::Tensor MakeTensor(const c10::intrusive_ptr<c10::StorageImpl>& impl, const TensorMeta& m) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(impl), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                    c10::scalarTypeToTypeMeta(m.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(m.sizes, m.strides);
  t.unsafeGetTensorImpl()->set_storage_offset(m.offset);
  if (m.wrapped_number) t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

void PutAt(std::vector<c10::IValue>& args, const Path& p, at::Tensor t, bool optional_list) {
  if (p.elem < 0) {
    args[p.index] = std::move(t);
  } else if (optional_list) {
    auto l = args[p.index].toList();
    l.set(p.elem, c10::IValue(std::move(t)));
  } else {
    auto l = args[p.index].toTensorList();
    l.set(p.elem, std::move(t));
  }
}

at::Tensor GetAt(const torch::jit::Stack& s, size_t base, const Path& p) {
  const c10::IValue& v = s[base + p.index];
  if (p.elem < 0) return v.toTensor();
  if (v.isTensorList()) return v.toTensorList().get(p.elem);
  return v.toListRef()[p.elem].toTensor();
}

absl::StatusOr<double> Engine::Replay(OpId id, const OpRecord& oprec, absl::Span<const bool> keep) {
  ReplayRecord& rr = *reinterpret_cast<ReplayRecord*>(oprec.handle);
  // Deep-copy lists so the record's placeholders are never mutated.
  std::vector<c10::IValue> args = CopyArgs(rr.args.data(), rr.args.data() + rr.args.size());
  for (const TensorArg& ta : rr.tensors) {
    Entry* e = FindEntry(ta.sid);
    c10::intrusive_ptr<c10::StorageImpl> impl = e ? e->impl() : c10::intrusive_ptr<c10::StorageImpl>();
    if (!impl || (impl->nbytes() > 0 && impl->data_ptr().get() == nullptr))
      return absl::InternalError(absl::StrCat("dtr: replay of ", oprec.name, ": input storage not resident"));
    PutAt(args, ta.path, MakeTensor(impl, ta.meta), ta.is_optional_list);
  }
  if (rr.gen) args[rr.gen_arg] = c10::IValue(rr.gen->clone());
  c10::impl::ExcludeDispatchKeyGuard g(c10::autograd_dispatch_keyset_with_ADInplaceOrView |
                                       c10::DispatchKeySet({c10::DispatchKey::Fake, c10::DispatchKey::Python,
                                                            c10::DispatchKey::PythonTLSSnapshot}));
  c10::optional<at::Generator> saved_default;
  at::Generator def = at::detail::getDefaultCPUGenerator();
  if (rr.default_gen) {
    std::lock_guard<std::mutex> gl(def.mutex());
    saved_default = def.clone();
    def.set_state(rr.default_gen->get_state());
  }
  torch::jit::Stack stack(std::make_move_iterator(args.begin()), std::make_move_iterator(args.end()));
  // Note [Global state a replay depends on]
  struct DefaultDtypeGuard {
    caffe2::TypeMeta saved = c10::get_default_dtype();
    explicit DefaultDtypeGuard(caffe2::TypeMeta recorded) {
      if (recorded != saved) c10::set_default_dtype(recorded);
    }
    ~DefaultDtypeGuard() {
      if (c10::get_default_dtype() != saved) c10::set_default_dtype(saved);
    }
  } default_dtype_guard(cfg_.rule_enabled(6) ? rr.default_dtype : c10::get_default_dtype());
  double t0 = NowNs();
  try {
    rr.op.callBoxed(&stack);
  } catch (const std::exception& ex) {
    if (saved_default) {
      std::lock_guard<std::mutex> gl(def.mutex());
      def.set_state(saved_default->get_state());
    }
    std::string msg = absl::StrCat("rematerializing (replay of ", oprec.name, "): ",
                                   dynamic_cast<const c10::Error*>(&ex)
                                       ? dynamic_cast<const c10::Error*>(&ex)->what_without_backtrace()
                                       : ex.what());
    if (dynamic_cast<const c10::OutOfMemoryError*>(&ex)) return absl::ResourceExhaustedError(msg);
    return absl::InternalError(msg);
  }
  double cost = NowNs() - t0;
  if (saved_default) {
    std::lock_guard<std::mutex> gl(def.mutex());
    def.set_state(saved_default->get_state());
  }
  if (oprec.in_place) return cost;
  for (size_t i = 0; i < rr.outputs.size() && i < oprec.outputs.size(); ++i) {
    if (!keep[i]) continue;
    const OutputSpec& os = rr.outputs[i];
    at::Tensor out = GetAt(stack, 0, os.path);
    // Rule 5: views and autograd's saved tensors read the restored storage with the recorded
    // layout, so the replay must reproduce it before its memory is swapped in. A kernel may pick
    // its output layout from things other than its inputs (thread count, backend heuristics):
    // then the values are copied into the recorded layout. A different dtype or shape means the
    // op is not a function of what was recorded: refuse rather than restore wrong contents.
    if (cfg_.rule_enabled(5) && (!os.meta.Matches(out) || out.storage().nbytes() != os.nbytes ||
                                 !IsOurs(out.storage().data_ptr()))) {
      if (out.scalar_type() != os.meta.dtype || out.sizes().vec() != os.meta.sizes)
        return absl::InternalError(absl::StrCat(
            "dtr: replay of ", oprec.name, " output ", i, " produced ", c10::toString(out.scalar_type()),
            c10::str(out.sizes()), " where ", c10::toString(os.meta.dtype), c10::str(c10::IntArrayRef(os.meta.sizes)),
            " was recorded; the op depends on state dtr does not record, so it cannot be rematerialized"));
      at::Tensor bytes = at::empty({int64_t(os.nbytes)}, at::TensorOptions().dtype(at::kByte));
      at::Tensor laid_out = at::empty({0}, out.options()).set_(bytes.storage(), os.meta.offset, os.meta.sizes,
                                                                os.meta.strides);
      laid_out.copy_(out);
      out = laid_out;
      ++relayouts_;
    }
    c10::StorageImpl* oimpl = out.storage().unsafeGetStorageImpl();
    Entry* e = FindEntry(oprec.outputs[i]);
    if (e == nullptr) return absl::InternalError("dtr: replay target has no entry");
    c10::intrusive_ptr<c10::StorageImpl> target = e->impl();
    if (!target) return absl::InternalError("dtr: replay target storage is gone");
    c10::DataPtr dp = oimpl->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));
    Slot* ns = SlotOf(dp);
    ns->entry = e;
    if (e->slot) e->slot->entry = nullptr;  // the tombstone
    e->slot = ns;
    target->set_data_ptr_noswap(std::move(dp));
  }
  return cost;
}

alloc::EvictionResult Engine::MakeRoom(const alloc::EvictionRequest& request) {
  alloc::EvictionResult res;
  std::unique_lock<std::recursive_mutex> l(mu_, std::defer_lock);
  if (at::in_parallel_region()) {
    if (!l.try_lock()) return res;  // the owner waits for this parallel region: cannot evict
  } else {
    l.lock();
  }
  Busy b(this);
  const double search_t0 = NowNs();
  struct AddElapsed {
    double* into;
    double t0;
    ~AddElapsed() { *into += NowNs() - t0; }
  } add_search{&search_ns_, search_t0};
  // The runtime ranks its lowest-scored storages; the allocator's fragmentation-aware strategy
  // picks among them (a single victim whose freed block fits, else by score), re-ranking per batch.
  static const alloc::FragmentationAwareEvictionStrategy strategy;
  while (!alloc_->CanSatisfy(request)) {
    std::vector<Runtime::Candidate> ranked = rt_->RankedCandidates(32);
    std::vector<alloc::EvictionCandidate> candidates;
    absl::flat_hash_map<void*, StorageId> storage_at;
    for (const Runtime::Candidate& c : ranked) {
      Entry* e = reinterpret_cast<Entry*>(c.handle);
      if (e == nullptr) e = FindEntry(c.id);
      if (e == nullptr || e->slot == nullptr || e->slot->mem == nullptr) continue;
      candidates.push_back({e->slot->mem, c.score});
      storage_at[e->slot->mem] = c.id;
    }
    if (candidates.empty()) break;
    alloc::EvictionResult round = strategy.Evict(*alloc_, request, std::move(candidates),
                                                 [&](const alloc::EvictionCandidate& c) {
                                                   return rt_->Evict(storage_at.at(c.ptr)).ok();
                                                 });
    res.bytes_freed += round.bytes_freed;
    res.blocks_freed += round.blocks_freed;
    if (round.blocks_freed == 0) break;
  }
  res.satisfied = alloc_->CanSatisfy(request);
  res.pinned_bytes = rt_->UnevictableBytes();
  return res;
}

void Engine::Fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard guard(c10::DispatchKey::Fake);
  const c10::DispatchKeySet after = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Fake);
  auto pass = [&] { op.redispatchBoxed(after, stack); };
  // Runs the op; returns its cost, excluding time spent evicting for its allocations.
  auto timed_pass = [&]() -> double {
    const double t0 = NowNs(), search0 = search_ns_;
    pass();
    const double cost = NowNs() - t0 - (search_ns_ - search0);
    exec_ns_ += cost;
    return cost;
  };
  if (at::in_parallel_region()) return pass();
  const c10::FunctionSchema& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t base = stack->size() - nargs;
  std::lock_guard<std::recursive_mutex> l(mu_);
  auto it = infos_.find(&schema);
  if (it == infos_.end()) it = infos_.emplace(&schema, Classify(schema, !cfg_.rule_enabled(4))).first;
  const OpInfo& info = it->second;
  if (info.kind == Kind::kPassthrough) return pass();

  // Tensors we cannot manage make the whole op pass through untouched.
  bool unmanaged = false;
  ForEachTensor(stack->data() + base, nargs, [&](Path, const at::Tensor& t, bool) {
    if (t.key_set().has(c10::DispatchKey::Python) || !t.has_storage() || !t.is_cpu() ||
        t.layout() != c10::kStrided || t.is_quantized())
      unmanaged = true;
  });
  if (unmanaged) return pass();

  Busy busy(this);
  HookClock hook_clock(this);
  if (++ops_seen_ % 4096 == 0) Sweep();

  // Input storages (registering unknown ones as constants).
  std::vector<TensorArg> targs;
  std::vector<StorageId> in_sids;
  std::vector<StorageId> written;
  std::vector<Entry*> in_entries;
  // Note [Hidden mutation in native_batch_norm]: 1.13's schema does not mark running_mean and
  // running_var (args 3, 4) as written, yet training mode updates them in place. Their values do
  // not affect the outputs in training mode, so the op is recorded without them: replays pass
  // None (no update). The real run's update is a mutation the runtime must see, though: the
  // buffers (made by zeros()/ones() and zero_()/fill_(), so they have recipes) would otherwise be
  // evictable and be rematerialized to their initial values, or read unmaterialized by the
  // kernel. So they go through Runtime::Mutate first (not replayable): resident constants from
  // then on, and readers of the old statistics (an eval-mode batch norm) are detached.
  const bool bn_training = info.name == "aten::native_batch_norm" && (*stack)[base + 5].isBool() &&
                           (*stack)[base + 5].toBool();
  std::vector<StorageId> running_stats;
  std::vector<Entry*> running_stat_entries;
  ForEachTensor(stack->data() + base, nargs, [&](Path p, const at::Tensor& t, bool optl) {
    if (bn_training && (p.index == 3 || p.index == 4)) {
      Entry* e = EntryOf(t, true);
      running_stats.push_back(e->sid);
      running_stat_entries.push_back(e);
      return;
    }
    Entry* e = EntryOf(t, true);
    TensorArg ta{p, e->sid, TensorMeta::Of(t), optl};
    targs.push_back(std::move(ta));
    in_sids.push_back(e->sid);
    in_entries.push_back(e);
    bool w = info.write_all;
    for (int wa : info.write_args)
      if (wa == p.index) w = true;
    if (w) written.push_back(e->sid);
  });

  auto trace_ins = [&] {
    std::string s;
    for (Entry* e : in_entries) absl::StrAppend(&s, " ", TName(e));
    return s;
  };

  if (!running_stats.empty() && cfg_.rule_enabled(1)) {
    Runtime::MutateCall mc{"aten::native_batch_norm(running stats)", {}, running_stats, false, 0};
    Check(rt_->Mutate(mc, []() -> absl::StatusOr<double> { return 0.0; }), info.name.c_str());
    std::string stats;
    for (Entry* e : running_stat_entries) absl::StrAppend(&stats, " ", TName(e));
    TraceLine(absl::StrCat("mutate aten::native_batch_norm(running_stats) 0", stats, " ->", stats));
  }

  // ---- mutations (rules 1 and 2) ----
  if (info.kind == Kind::kMutate && !written.empty() && cfg_.rule_enabled(1)) {
    ReplayRecord* rr = nullptr;
    if (info.replayable) {
      rr = new ReplayRecord(op);
      rr->args = CopyArgs(stack->data() + base, stack->data() + stack->size());
      for (const TensorArg& ta : targs) PutAt(rr->args, ta.path, at::Tensor(), ta.is_optional_list);
      // Only storages that are ours are referenced by id; foreign ones stay alive via their entry.
      rr->tensors = targs;
    }
    double cost = 0;
    std::exception_ptr err;
    Runtime::MutateCall mc{info.name, in_sids, written, rr != nullptr, reinterpret_cast<uint64_t>(rr)};
    mc.invalidate_readers = cfg_.rule_enabled(2);
    uint64_t serial0 = g_serial.load();
    absl::Status s = rt_->Mutate(mc, [&]() -> absl::StatusOr<double> {
      try {
        cost = timed_pass();
      } catch (...) {
        err = std::current_exception();
        return absl::InternalError("op threw");
      }
      return cost;
    });
    if (!s.ok() || err) {
      // The runtime did not record the op: free the record.
      delete rr;
      if (err) std::rethrow_exception(err);
      Check(s, info.name.c_str());
    }
    // If the op was recorded, the runtime owns rr (OnOpDropped deletes it); if not, drop it.
    // Runtime::Mutate records only a single rematerializable mutated storage.
    if (rr != nullptr) {
      const StorageRecord* r = rt_->storage(written[0]);
      bool recorded = r != nullptr && !r->recipe.empty() &&
                      rt_->op(r->recipe.back()) != nullptr &&
                      rt_->op(r->recipe.back())->handle == reinterpret_cast<uint64_t>(rr);
      if (!recorded) delete rr;
    }
    {
      std::string outs;
      for (StorageId w : written)
        if (Entry* e = FindEntry(w)) absl::StrAppend(&outs, " ", TName(e));
      TraceLine(absl::StrCat("mutate ", info.name, " ", int64_t(cost), trace_ins(), " ->", outs));
    }
    // Storages a mutating op created (e.g. native_batch_norm's outputs) become constants lazily;
    // a storage re-homed by a resize inside the op lost its entry in the deleter.
    (void)serial0;
    return;
  }

  // Make every input resident and unevictable while the op runs.
  std::vector<StorageId> pinned;
  struct Unpin {
    Engine* e;
    std::vector<StorageId>* p;
    ~Unpin() {
      for (StorageId id : *p)
        if (e->rt_->storage(id)) (void)e->rt_->Unpin(id);
    }
  } unpin{this, &pinned};
  for (StorageId id : in_sids) {
    Check(rt_->Pin(id), info.name.c_str());
    pinned.push_back(id);
  }

  if (info.kind == Kind::kView || info.kind == Kind::kOpaque || info.kind == Kind::kMutate) {
    // Views (rule 4: an output aliasing an input is never recorded) and unreplayable ops.
    double cost = timed_pass();
    if (info.kind == Kind::kView) {
      for (StorageId id : in_sids) (void)rt_->Access(id, 0);
      (void)cost;
    } else {
      TraceLine(absl::StrCat("opaque ", info.name, " ", int64_t(cost), trace_ins(), " ->"));
    }
    return;
  }

  // ---- a functional op: record it ----
  ReplayRecord* rr = new ReplayRecord(op);
  rr->args = CopyArgs(stack->data() + base, stack->data() + stack->size());
  for (const TensorArg& ta : targs) PutAt(rr->args, ta.path, at::Tensor(), ta.is_optional_list);
  if (bn_training) {
    rr->args[3] = c10::IValue();
    rr->args[4] = c10::IValue();
  }
  rr->tensors = targs;
  at::Generator def = at::detail::getDefaultCPUGenerator();
  if (info.gen_arg >= 0 && cfg_.rule_enabled(6)) {
    rr->gen_arg = info.gen_arg;
    const c10::IValue& g = (*stack)[base + info.gen_arg];
    at::Generator gen = g.isNone() ? def : g.toGenerator();
    std::lock_guard<std::mutex> gl(gen.mutex());
    rr->gen = gen.clone();
  }
  if (info.seeded_no_gen && cfg_.rule_enabled(6)) {
    std::lock_guard<std::mutex> gl(def.mutex());
    rr->default_gen = def.clone();
  }
  uint64_t serial0 = g_serial.load();
  const bool watch_rng = info.gen_arg < 0 && !info.seeded_no_gen && cfg_.rule_enabled(6);
  GenMark mark0;
  if (watch_rng) mark0 = GenMark::Now();
  double cost;
  try {
    cost = timed_pass();
  } catch (...) {
    delete rr;
    throw;
  }
  if (watch_rng && !(GenMark::Now() == mark0)) {
    // Note [Random ops without a Generator argument]: this op drew from the default generator
    // although we did not know it was random. Its outputs cannot be replayed exactly: keep them
    // as constants, and treat the op as seeded from now on.
    if (cfg_.verbose)
      std::fprintf(stderr, "dtr: %s consumed the default generator; treating it as seeded\n", info.name.c_str());
    it->second.seeded_no_gen = true;
    delete rr;
    TraceLine(absl::StrCat("opaque ", info.name, " ", int64_t(cost), trace_ins(), " ->"));
    return;
  }

  // New output storages: ours, allocated during this op, not yet tracked, each seen once.
  const size_t nret = schema.returns().size();
  const size_t rbase = stack->size() - nret;
  std::vector<c10::StorageImpl*> new_impls;
  std::vector<OutputSpec> outs;
  bool replayable = true;
  ForEachTensor(stack->data() + rbase, nret, [&](Path p, const at::Tensor& t, bool) {
    if (!t.has_storage() || !t.is_cpu()) {
      replayable = false;
      return;
    }
    c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    const c10::DataPtr& dp = impl->data_ptr();
    Slot* os = SlotOf(dp);
    bool fresh = os != nullptr && os->mem != nullptr && os->entry == nullptr && os->serial > serial0;
    for (auto* seen : new_impls)
      if (seen == impl) fresh = false;
    if (!fresh) {
      // Rule 4: an output whose storage is an input's or pre-existing is not a new storage.
      if (cfg_.rule_enabled(4)) {
        replayable = false;
        return;
      }
      if (os == nullptr || os->entry != nullptr) {
        replayable = false;
        return;
      }
    }
    new_impls.push_back(impl);
    outs.push_back(OutputSpec{p, TensorMeta::Of(t), impl->nbytes()});
  });
  if (!replayable || outs.empty()) {
    // Outputs become constants lazily when first used.
    delete rr;
    TraceLine(absl::StrCat("opaque ", info.name, " ", int64_t(cost), trace_ins(), " ->"));
    return;
  }
  rr->outputs = outs;
  std::vector<uint64_t> sizes;
  for (const auto& o : outs) sizes.push_back(o.nbytes);
  Runtime::OpCall call{info.name, in_sids, sizes, true, reinterpret_cast<uint64_t>(rr)};
  auto out_sids = rt_->Compute(call, [&](absl::Span<const StorageId>) -> absl::StatusOr<double> { return cost; });
  if (!out_sids.ok()) {
    delete rr;
    Check(out_sids.status(), info.name.c_str());
  }
  std::string trace_outs;
  for (size_t i = 0; i < outs.size(); ++i) {
    c10::StorageImpl* impl = new_impls[i];
    Entry* e = NewEntry((*out_sids)[i], impl, outs[i].nbytes);
    e->ours = true;
    Slot* s = SlotOf(impl->data_ptr());
    s->entry = e;
    e->slot = s;
    (void)rt_->SetHandle(e->sid, reinterpret_cast<uint64_t>(e));
    absl::StrAppend(&trace_outs, " ", TName(e), ":", outs[i].nbytes);
  }
  TraceLine(absl::StrCat("call ", info.name, " ", int64_t(cost), trace_ins(), " ->", trace_outs));
}

std::string Engine::StatsJson() {
  std::lock_guard<std::recursive_mutex> l(mu_);
  alloc::AllocatorStats as = alloc_->GetStats();
  const RuntimeStats& rs = rt_->stats();
  return absl::StrCat(
      "{\"budget_bytes\":", cfg_.unlimited() ? int64_t(-1) : int64_t(cfg_.budget_bytes),
      ",\"peak_reserved_bytes\":", as.reserved_bytes.peak, ",\"peak_allocated_bytes\":", as.allocated_bytes.peak,
      ",\"reserved_bytes\":", as.reserved_bytes.current, ",\"allocated_bytes\":", as.allocated_bytes.current,
      ",\"evictions\":", rs.evictions, ",\"eager_evictions\":", rs.eager_evictions,
      ",\"rematerializations\":", rs.rematerializations, ",\"replays\":", rs.replays,
      ",\"remat_seconds\":", rs.remat_cost * 1e-9, ",\"base_seconds\":", rs.base_cost * 1e-9,
      ",\"ops_recorded\":", rs.ops_recorded, ",\"constants\":", rs.constants, ",\"detached\":", rs.detached,
      ",\"op_seconds\":", exec_ns_ * 1e-9, ",\"search_seconds\":", search_ns_ * 1e-9,
      ",\"bookkeeping_seconds\":", std::max(0.0, hook_ns_ - exec_ns_ - hook_search_ns_ - hook_remat_ns_) * 1e-9,
      ",\"replay_relayouts\":", relayouts_, ",\"eviction_calls\":", as.num_eviction_calls, ",\"ooms\":", as.num_ooms,
      ",\"runtime\":", rs.ToJson(), "}");
}

void Engine::WriteStatsFile() {
  if (trace_.is_open()) trace_.flush();
  if (cfg_.stats_file.empty()) return;
  std::ofstream f(cfg_.stats_file, std::ios::out | std::ios::trunc);
  f << StatsJson() << "\n";
}

void BoxedFallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  g_engine->Fallback(op, ks, stack);
}

// ---- custom ops: torch.ops.dtr.* ----
std::string OpStats() { return g_engine ? g_engine->StatsJson() : std::string("{}"); }
void OpResetPeak() {
  if (g_engine) g_engine->ResetPeak();
}
bool OpActive() { return g_engine != nullptr; }
void OpSetBudget(int64_t bytes) {
  TORCH_CHECK(g_engine != nullptr, "dtr is not active");
  g_engine->SetBudget(bytes);
}
int64_t OpBudget() { return g_engine ? g_engine->Budget() : -1; }
void OpPin(const at::Tensor& t) {
  if (g_engine) g_engine->PinTensor(t, true);
}
void OpUnpin(const at::Tensor& t) {
  if (g_engine) g_engine->PinTensor(t, false);
}

torch::Library* g_fallback_lib = nullptr;
torch::Library* g_def_lib = nullptr;

void AtExit() {
  if (g_engine) g_engine->WriteStatsFile();
}

}  // namespace
}  // namespace dtr::hooks

extern "C" {

// Includes DispatchKey::Fake in this thread's TLS (called by the shim's pthread_create wrapper).
__attribute__((visibility("default"))) void dtr_thread_init() {
  if (dtr::hooks::g_active.load(std::memory_order_acquire))
    c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::Fake, true);
}

__attribute__((visibility("default"))) int dtr_is_active() { return dtr::hooks::g_active.load() ? 1 : 0; }

// Idempotent. Returns 0 when active (or disabled by DTR_ENABLE=0), exits on a configuration error.
__attribute__((visibility("default"))) int dtr_activate() {
  using namespace dtr::hooks;
  static std::once_flag once;
  static int result = 0;
  std::call_once(once, [] {
    auto cfg = ParseProcessEnv();
    if (!cfg.ok()) {
      std::fprintf(stderr, "%s\n", std::string(cfg.status().message()).c_str());
      std::fflush(stderr);
      _exit(2);
    }
    if (!cfg->enable) return;
    if (c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(c10::DispatchKey::Fake)) {
      std::fprintf(stderr,
                   "dtr: NOT activating: another library already registered a backend fallback for "
                   "DispatchKey::Fake (this PyTorch may use it for FakeTensor); dtr needs that key.\n");
      result = 1;
      return;
    }
    auto* e = new Engine(*cfg);
    if (absl::Status s = e->Init(); !s.ok()) {
      std::fprintf(stderr, "dtr: initialization failed: %s\n", std::string(s.message()).c_str());
      _exit(2);
    }
    g_engine = e;
    g_fallback_lib = new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::Fake, __FILE__, __LINE__);
    g_fallback_lib->fallback(torch::CppFunction::makeFromBoxedFunction<&BoxedFallback>());
    g_def_lib = new torch::Library(torch::Library::DEF, "dtr", c10::nullopt, __FILE__, __LINE__);
    g_def_lib->def("stats() -> str", &OpStats);
    g_def_lib->def("reset_peak() -> ()", &OpResetPeak);
    g_def_lib->def("is_active() -> bool", &OpActive);
    g_def_lib->def("pin(Tensor self) -> ()", &OpPin);
    g_def_lib->def("set_budget(int bytes) -> ()", &OpSetBudget);
    g_def_lib->def("budget() -> int", &OpBudget);
    g_def_lib->def("unpin(Tensor self) -> ()", &OpUnpin);
    c10::SetCPUAllocator(e->adapter(), /*priority=*/100);
    g_active.store(true, std::memory_order_release);
    c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::Fake, true);
    std::atexit(&AtExit);
    if (cfg->verbose) std::fprintf(stderr, "dtr: active: %s\n", cfg->ToString().c_str());
  });
  return result;
}

}  // extern "C"

namespace {
// Loaded directly (a .pth file, ctypes, or linking): activate at load time.
__attribute__((constructor)) void DtrTorchCtor() { dtr_activate(); }
}  // namespace

// The CUDA allocator dtr installs (see cuda_allocator.h).
//
// Note [Two CUDA backends]
// `native` keeps PyTorch's own allocator doing every allocation, so everything users and tools
// rely on (memory_stats, memory_snapshot and the visualizer, empty_cache, recordStream, CUDA
// graphs and private pools, IPC, expandable segments, cudaMallocAsync) keeps working unchanged.
// The budget becomes the native per-process memory fraction (a hard cap on reserved bytes; the
// user's own set_per_process_memory_fraction still applies, the smaller wins). A request that
// cannot fit (allocated + request > budget) first makes the engine evict tensors on that device;
// one that still fails with OutOfMemoryError (fragmentation) makes it evict more and retries,
// and only when nothing evictable is left does the user see torch.OutOfMemoryError, with dtr's
// account of where the memory is. Eviction is never run under the native allocator's lock.
// `dtr` serves allocations from allocator/'s CachingAllocator (one per device over a
// DeviceMemoryBackend: CudaBackend on a GPU), whose retry ladder asks the engine to evict with
// fragmentation-aware victim choice. It implements stats, snapshot, cacheInfo, empty_cache,
// recordStream, OOM observers and peer copies; it refuses, with a message naming
// DTR_CUDA_ALLOCATOR=native, what it does not implement (graph pools, IPC, history recording,
// checkpointed pool state).
//
// Note [CUDA slots]
// Device memory cannot hold dtr's slot header (Note [Slots and tombstones]), so a CUDA DataPtr is
// (ptr, ptr, CudaDataDeleter) and its Slot lives on the heap, found through a map keyed by ptr:
// data == context keeps torch's raw_allocate and copy-on-write paths working. A native-backend
// slot owns the DataPtr the native allocator returned (its deleter frees the block with the
// native stream bookkeeping, and recordStream must be given that DataPtr: the native allocator
// ignores DataPtrs whose deleter is not its own). Zero-byte allocations have no pointer and get
// no slot: the engine treats them as foreign, i.e. never evicts them.
#include "hooks/cuda_allocator.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstdio>
#include <limits>

#if DTR_TORCH_AT_LEAST(2, 13)  // NativeMappingHeadroom: the allocator settings (read in 2.13 and 2.14)
#include <c10/core/AllocatorConfig.h>
#endif
#include <c10/cuda/CUDAAllocatorConfig.h>  // setAllocatorSettings (Note [Expandable segments under a budget])
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "allocator/allocator_config.h"
#include "allocator/cuda_backend.h"
#include "hooks/engine.h"
#include "runtime/bytes.h"

namespace dtr::hooks {

std::atomic<CudaAllocatorAdapter*> g_cuda_adapter{nullptr};

namespace {

constexpr size_t kNativeRound = 512;  // the native allocator's kMinBlockSize
size_t RoundNative(size_t n) { return (n + kNativeRound - 1) / kNativeRound * kNativeRound; }

std::string DeviceName(c10::DeviceIndex d) { return absl::StrCat("cuda:", int(d)); }

const char* kUseNative = " Set DTR_CUDA_ALLOCATOR=native (the default) to use PyTorch's allocator under dtr.";

}  // namespace

// ---------------------------------------------------------------------------------------------
// Configuration values

const char* CudaBackendName(CudaBackendKind k) { return k == CudaBackendKind::kNative ? "native" : "dtr"; }

absl::StatusOr<CudaBackendKind> ParseCudaBackend(const std::string& s) {
  if (s == "native") return CudaBackendKind::kNative;
  if (s == "dtr") return CudaBackendKind::kDtr;
  return absl::InvalidArgumentError(absl::StrCat("unknown CUDA allocator backend '", s, "'; accepted: native | dtr"));
}

absl::StatusOr<size_t> CudaBudget::Resolve(size_t total, c10::DeviceIndex device) const {
  if (unlimited) return std::numeric_limits<size_t>::max();
  const size_t b = fraction > 0 ? size_t(fraction * double(total)) : size_t(bytes);
  if (b > total)
    return absl::InvalidArgumentError(absl::StrCat("dtr: DTR_BUDGET=", ToString(), " is larger than ",
                                                   DeviceName(device), "'s ", FormatBytes(total),
                                                   ": give at most the device's memory (or a fraction such as 0.8)"));
  return b;
}

std::string CudaBudget::ToString() const {
  if (unlimited) return "unlimited";
  if (fraction > 0) return absl::StrCat(fraction, " of device memory");
  return FormatBytes(bytes);
}

// ---------------------------------------------------------------------------------------------
// Slots

struct CudaAllocatorAdapter::CudaSlot : Slot {
  CudaAllocatorAdapter* owner = nullptr;
  c10::DataPtr native;  // native backend: the block as the native allocator handed it out
  cudaStream_t stream = nullptr;            // the allocation stream
  std::vector<cudaStream_t> other_streams;  // streams already recorded for this block
};

namespace {

// Note [CUDA slots]: every live CUDA slot by its device pointer, across adapters.
struct SlotMap {
  std::mutex mu;
  absl::flat_hash_map<const void*, Slot*> by_ptr;
};
SlotMap& Slots() {
  static SlotMap* m = new SlotMap();  // never destroyed: deleters run during static destruction
  return *m;
}

}  // namespace

void CudaDataDeleter(void* data) {
  Slot* s = nullptr;
  {
    SlotMap& m = Slots();
    std::lock_guard<std::mutex> g(m.mu);
    auto it = m.by_ptr.find(data);
    if (it != m.by_ptr.end()) s = it->second;
  }
  if (s == nullptr) {
    std::fprintf(stderr, "dtr: internal error: freeing CUDA pointer %p that dtr did not allocate\n", data);
    return;
  }
  if (s->entry != nullptr && g_engine != nullptr && g_engine->OnSlotDeleted(s) != SlotFate::kFree) return;
  static_cast<CudaAllocatorAdapter::CudaSlot*>(s)->owner->FreeSlot(s);
}

Slot* CudaAllocatorAdapter::FindSlot(const void* data) const {
  SlotMap& m = Slots();
  std::lock_guard<std::mutex> g(m.mu);
  auto it = m.by_ptr.find(data);
  return it == m.by_ptr.end() ? nullptr : it->second;
}

void CudaAllocatorAdapter::FreeSlot(Slot* s) {
  auto* cs = static_cast<CudaSlot*>(s);
  {
    SlotMap& m = Slots();
    std::lock_guard<std::mutex> g(m.mu);
    m.by_ptr.erase(cs->mem);
  }
  if (opts_.backend == CudaBackendKind::kNative) {
    cs->native.clear();  // the native deleter returns the block
  } else if (alloc::CachingAllocator* a = DtrAllocatorOf(cs->cuda_device)) {
    absl::Status st = a->Free(cs->mem);
    if (!st.ok()) std::fprintf(stderr, "dtr: freeing a CUDA block failed: %s\n", std::string(st.message()).c_str());
  }
  delete cs;
}

// Note [Streams of evictable memory]
// PyTorch frees a block only when its last reference dies, so a program that reads a tensor on a
// side stream without record_stream is still safe as long as it holds the tensor. dtr frees
// blocks of live tensors (eviction): a block read on another stream could then be reused on its
// allocation stream while that read is still running. So every managed operand of an op gets
// its op's stream recorded with the allocator when it differs from the allocation stream (once
// per stream): eviction then waits for those uses exactly as a free after record_stream does.
void CudaAllocatorAdapter::NoteUse(Slot* s, cudaStream_t stream) {
  auto* cs = static_cast<CudaSlot*>(s);
  if (cs->mem == nullptr || stream == cs->stream) return;
  for (cudaStream_t seen : cs->other_streams)
    if (seen == stream) return;
  cs->other_streams.push_back(stream);
  if (opts_.backend == CudaBackendKind::kNative) {
    auto cuda_stream = c10::cuda::getStreamFromExternal(stream, cs->cuda_device);
    native().recordStream(cs->native, cuda_stream);
  } else if (alloc::CachingAllocator* a = DtrAllocatorOf(cs->cuda_device)) {
    (void)a->RecordStream(cs->mem, alloc::Stream{uint64_t(reinterpret_cast<uintptr_t>(stream))});
  }
}

c10::DataPtr CudaAllocatorAdapter::DataPtrOf(Slot* s) const {
  return c10::DataPtr(s->mem, s->mem, &CudaDataDeleter, c10::Device(c10::DeviceType::CUDA, s->cuda_device));
}

// ---------------------------------------------------------------------------------------------
// Per-device state

struct CudaAllocatorAdapter::Device {
  c10::DeviceIndex index = 0;
  bool budget_resolved = false;
  size_t budget = std::numeric_limits<size_t>::max();
  size_t total = 0;
  double user_fraction = -1;  // set_per_process_memory_fraction; < 0: never set
  bool fraction_applied = false;
  bool fraction_ever_set = false;  // native: a fraction below 1 was given to the allocator
  // native: what the fraction caps reserved bytes at, the budget less the headroom of Note
  // [Expandable segments overshoot the fraction]; the eviction checks compare with it.
  std::atomic<size_t> native_cap{std::numeric_limits<size_t>::max()};
  // dtr backend
  std::unique_ptr<alloc::DeviceMemoryBackend> backend;
  std::unique_ptr<alloc::CachingAllocator> alloc;
  bool handler_set = false;
};

CudaAllocatorAdapter::CudaAllocatorAdapter(Options options, CudaPlatform platform, cca::CUDAAllocator* native)
    : opts_(std::move(options)), platform_(std::move(platform)), native_(native), budget_(opts_.budget) {}

CudaAllocatorAdapter::~CudaAllocatorAdapter() = default;

CudaAllocatorAdapter::Device& CudaAllocatorAdapter::DeviceState(c10::DeviceIndex device) {
  std::unique_lock<std::mutex> l(mu_);
  TORCH_CHECK(device >= 0, "dtr: invalid CUDA device index ", int(device));
  if (size_t(device) >= devices_.size()) devices_.resize(size_t(device) + 1);
  std::unique_ptr<Device>& slot = devices_[size_t(device)];
  if (!slot) {
    slot = std::make_unique<Device>();
    slot->index = device;
  }
  Device& d = *slot;
  if (!d.budget_resolved) {
    d.total = platform_.total_memory(device);
    absl::StatusOr<size_t> b = budget_.Resolve(d.total, device);
    if (!b.ok()) TORCH_CHECK_VALUE(false, std::string(b.status().message()));
    d.budget = *b;
    d.budget_resolved = true;
  }
  if (opts_.backend == CudaBackendKind::kDtr && !d.alloc) {
    auto backend = platform_.make_backend(device);
    TORCH_CHECK(backend.ok(), "dtr: cannot use ", DeviceName(device), ": ", std::string(backend.status().message()));
    alloc::AllocatorConfig ac;  // PyTorch's size classes (allocator_config.h)
    ac.budget_bytes = d.budget;
    ac.enable_eviction = opts_.evict;
    auto a = alloc::CachingAllocator::Create(ac, backend->get());
    TORCH_CHECK(a.ok(), "dtr: ", std::string(a.status().message()));
    d.backend = std::move(*backend);
    d.alloc = std::move(*a);
    if (size_t(device) < kCachedDevices) dtr_allocators_[size_t(device)].store(d.alloc.get(), std::memory_order_release);
  }
  return d;
}

alloc::CachingAllocator* CudaAllocatorAdapter::DtrAllocatorOf(c10::DeviceIndex device) {
  if (device >= 0 && size_t(device) < kCachedDevices) return dtr_allocators_[size_t(device)].load(std::memory_order_acquire);
  std::lock_guard<std::mutex> l(mu_);
  if (device < 0 || size_t(device) >= devices_.size() || !devices_[size_t(device)]) return nullptr;
  return devices_[size_t(device)]->alloc.get();
}

size_t CudaAllocatorAdapter::BudgetOn(c10::DeviceIndex device) { return DeviceState(device).budget; }

absl::Status CudaAllocatorAdapter::SetBudgetBytes(int64_t bytes) {
  CudaBudget budget;
  if (bytes > 0) {
    budget.unlimited = false;
    budget.bytes = uint64_t(bytes);
  }
  std::vector<std::pair<Device*, size_t>> devs;
  {
    std::lock_guard<std::mutex> l(mu_);
    // Validate on every device in use before changing anything.
    for (auto& d : devices_) {
      if (!d || !d->budget_resolved) continue;
      absl::StatusOr<size_t> b = budget.Resolve(d->total, d->index);
      if (!b.ok()) return b.status();
      devs.emplace_back(d.get(), *b);
    }
    budget_ = budget;
  }
  for (auto [d, b] : devs) {
    size_t cap = b;
    {
      std::lock_guard<std::mutex> l(mu_);
      d->budget = b;
      d->fraction_applied = false;
      if (d->user_fraction >= 0) cap = std::min(cap, size_t(d->user_fraction * double(d->total)));
    }
    if (d->alloc) {
      absl::Status st = d->alloc->SetBudget(cap);
      if (!st.ok()) return st;
    } else {
      ApplyNativeFraction(*d);
    }
  }
  return absl::OkStatus();
}

std::pair<size_t, size_t> CudaAllocatorAdapter::AllocatedAndReserved(c10::DeviceIndex device) {
  c10::CachingDeviceAllocator::DeviceStats s = getDeviceStats(device);
  const auto agg = size_t(c10::CachingAllocator::StatType::AGGREGATE);
  return {size_t(s.allocated_bytes[agg].current), size_t(s.reserved_bytes[agg].current)};
}

cca::CUDAAllocator& CudaAllocatorAdapter::native() const {
  TORCH_CHECK(native_ != nullptr, "dtr: no native CUDA allocator to forward to");
  return *native_;
}

void CudaAllocatorAdapter::Refuse(const char* what) const {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "dtr: the dtr CUDA allocator backend (DTR_CUDA_ALLOCATOR=dtr) does not support ",
                              what, ".", kUseNative);
}

// Note [Expandable segments overshoot the fraction]
// The native allocator checks its memory fraction against the size it was asked for (reserved +
// the rounded request <= allowed), and with expandable segments (PYTORCH_CUDA_ALLOC_CONF=
// expandable_segments:True) it then maps physical memory in whole pages of its segment size
// (large_segment_size, 20 MiB by default; 2 MiB in the small pool), so reserved memory can end
// up to one large page above the fraction: on an H200 a Transformer under a 1133 MiB budget
// reached 1146 MiB reserved (2026-11-28, torch 2.11). With cudaMalloc segments the check is
// exact. So with expandable segments the fraction leaves one large page of headroom below the
// budget, and DTR_BUDGET stays a hard cap on reserved memory; the checks that decide when to
// evict compare with that cap too (Device::native_cap), and a budget not above one page is
// refused with an error saying so. Read when the fraction is applied: turning expandable
// segments on later (torch.cuda.memory._set_allocator_settings) takes effect at the next budget
// or fraction change.
namespace {
// 0 without expandable segments. From torch 2.13 the allocator's own settings say (set from
// PYTORCH_CUDA_ALLOC_CONF or torch.cuda.memory._set_allocator_settings) and the large page size
// is configurable; before, the environment says and the page is 20 MiB. `turned_on_by_dtr`:
// dtr turned them on (Note [Expandable segments under a budget]) through settings that the
// environment does not show.
size_t NativeMappingHeadroom(bool turned_on_by_dtr) {
#if DTR_TORCH_AT_LEAST(2, 13)
  namespace cac = c10::CachingAllocator;
  return cac::AcceleratorAllocatorConfig::use_expandable_segments() || turned_on_by_dtr
             ? std::max(cac::AcceleratorAllocatorConfig::large_segment_size(), cac::kSmallBuffer)
             : 0;
#else
  if (turned_on_by_dtr) return size_t{20} << 20;
  for (const char* var : {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {
    const char* conf = std::getenv(var);
    if (conf == nullptr) continue;
    std::string c(conf);
    std::transform(c.begin(), c.end(), c.begin(), [](unsigned char ch) { return std::tolower(ch); });
    c.erase(std::remove_if(c.begin(), c.end(), [](unsigned char ch) { return std::isspace(ch); }), c.end());
    if (c.find("expandable_segments:true") != std::string::npos) return size_t{20} << 20;
  }
  return 0;
#endif
}
}  // namespace

// Note [Expandable segments under a budget]
// Under a budget the native allocator's fragmentation decides whether a run trains: its
// cudaMalloc segments are freed only when wholly unused, and a request fails when no free block
// in any segment is large enough, however much memory lies free in pieces. dtr can evict every
// evictable tensor and still fail: on an H200 a 4-layer nn.TransformerEncoder trained with
// zero_grad(set_to_none=True) ran out of memory at 0.7 of its plain peak with 665.6 MiB
// allocated and 548.4 MiB reserved but unallocated under a 1.21 GiB cap, where the `dtr`
// backend trained it bit-identically (bench/results/cuda.md, fifth session). Expandable
// segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, which PyTorch's own out-of-memory
// message recommends for this) map physical memory in pages and unmap free pages when a request
// fails, so what eviction frees can serve any later request. So when a budget first applies to
// the native allocator, dtr turns them on, and says so once on stderr, unless:
// - the user's settings name expandable_segments (either way: `expandable_segments:False` keeps
//   cudaMalloc segments);
// - they choose the cudaMallocAsync backend (which has no segments);
// - the budget is under kExpandableMinPages pages: the page of headroom that Note [Expandable
//   segments overshoot the fraction] keeps below the budget would cost more than pages save.
// The user's other settings are kept: they are applied again with expandable_segments:True added,
// since applying settings resets the keys they leave out, less any `backend` entry (the backend
// cannot change at runtime, and PyTorch asserts that a re-applied one names the installed
// allocator, which is dtr's adapter). Applying settings is not atomic in PyTorch (a thread
// rounding a request meanwhile may see the defaults of max_split_size and the roundup
// divisions); it happens once, at the first budgeted allocation or budget change. If PyTorch
// refuses the settings, dtr warns and goes on with cudaMalloc segments; either way the headroom
// stays, so the budget remains a hard cap. Segments made before (a budget set late) stay as they
// are; new ones expand. The setting is process-wide and stays on if the budget is lifted later.
// Without a budget nothing changes. Stats say whether dtr turned them on
// (expandable_segments_by_dtr).
//
// What changes for the user with them: PyTorch shares expandable memory between processes
// (torch.multiprocessing) through file descriptors that need pidfd_getfd, which some containers
// forbid, and NCCL's user-buffer registration does not take it; such programs should set
// expandable_segments:False (README, "On a GPU").
constexpr size_t kExpandableMinPages = 8;

std::optional<std::string> SettingsWithExpandableSegments(std::string_view settings) {
  std::string compact;
  for (char ch : settings)
    if (!std::isspace(static_cast<unsigned char>(ch))) compact.push_back(ch);
  if (compact.find("expandable_segments") != std::string::npos) return std::nullopt;  // the user chose
  if (compact.find("MallocAsync") != std::string::npos) return std::nullopt;  // backend:cudaMallocAsync
  // Top-level entries: roundup_power2_divisions:[256:1,>:4] has commas inside its brackets.
  std::string kept;
  int depth = 0;
  size_t start = 0;
  auto keep = [&](size_t end) {
    std::string_view entry(compact.data() + start, end - start);
    if (entry.empty() || entry.substr(0, 8) == "backend:") return;
    if (!kept.empty()) kept.push_back(',');
    kept.append(entry);
  };
  for (size_t i = 0; i < compact.size(); ++i) {
    if (compact[i] == '[') ++depth;
    if (compact[i] == ']') --depth;
    if (compact[i] == ',' && depth == 0) {
      keep(i);
      start = i + 1;
    }
  }
  keep(compact.size());
  return kept.empty() ? std::string("expandable_segments:True") : kept + ",expandable_segments:True";
}

void CudaAllocatorAdapter::TurnOnExpandableSegments(size_t budget) {
  std::call_once(expandable_decided_, [&] {
    if (!platform_.native_settings || !platform_.set_native_settings) return;
    if (budget < kExpandableMinPages * NativeMappingHeadroom(/*turned_on_by_dtr=*/true)) return;
    std::optional<std::string> settings = SettingsWithExpandableSegments(platform_.native_settings());
    if (!settings) return;
    expandable_tried_.store(true, std::memory_order_relaxed);  // the headroom stays from here on
    bool on = false;
    try {
      on = platform_.set_native_settings(*settings);
    } catch (const std::exception& e) {
      std::string why = e.what();
      why = why.substr(0, why.find('\n'));
      std::fprintf(stderr,
                   "dtr: warning: PyTorch refused the allocator settings \"%s\" (%s); the budget stays with "
                   "cudaMalloc segments, which fragment (Note [Expandable segments under a budget]). Setting "
                   "expandable_segments in PYTORCH_CUDA_ALLOC_CONF yourself avoids this.\n",
                   settings->c_str(), why.c_str());
      return;
    }
    if (!on) return;  // the settings did not take
    expandable_by_dtr_.store(true, std::memory_order_relaxed);
    std::fprintf(stderr,
                 "dtr: under DTR_BUDGET=%s, PyTorch's CUDA allocator now uses expandable segments, so that memory "
                 "dtr frees in pieces can serve any request (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False "
                 "keeps cudaMalloc segments).\n",
                 budget_.ToString().c_str());
  });
}

// The native budget is a memory fraction: the smaller of the user's and dtr's wins.
// Applied lazily (the native allocator needs init() for the device first, and only devices in
// use get a cap); re-applied after a budget or user-fraction change, and reset to 1.0 once a
// fraction was set and neither applies any more.
void CudaAllocatorAdapter::ApplyNativeFraction(Device& d) {
  double user, fraction;
  size_t budget, total;
  bool ever;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (d.fraction_applied) return;
    user = d.user_fraction;
    budget = d.budget;
    total = d.total;
    ever = d.fraction_ever_set;
  }
  if (!native().initialized()) return;  // applied at the first allocation instead
  const bool unlimited = budget == std::numeric_limits<size_t>::max() && user < 0;
  size_t cap = budget;
  if (!unlimited || ever) {
    fraction = user < 0 ? 1.0 : user;
    if (total > 0 && budget < total) {
      TurnOnExpandableSegments(budget);  // Note [Expandable segments under a budget]
      // Note [Expandable segments overshoot the fraction]
      const size_t headroom = NativeMappingHeadroom(expandable_tried_.load(std::memory_order_relaxed));
      TORCH_CHECK_WITH(OutOfMemoryError, budget > headroom, "dtr: DTR_BUDGET=", budget_.ToString(),
                       " leaves no room under PyTorch's expandable segments, which map memory in pages of ",
                       FormatBytes(headroom), ": dtr keeps one page below the budget so that it is never exceeded",
                       " (Note [Expandable segments overshoot the fraction]). Give a budget above ",
                       FormatBytes(headroom), ", or turn expandable segments off in PYTORCH_CUDA_ALLOC_CONF.");
      cap = budget - headroom;
      fraction = std::min(fraction, double(cap) / double(total));
    }
    native().setMemoryFraction(fraction, d.index);
  }
  d.native_cap.store(cap, std::memory_order_relaxed);
  std::lock_guard<std::mutex> l(mu_);
  d.fraction_applied = true;
  d.fraction_ever_set = d.fraction_ever_set || !unlimited;
}

// ---------------------------------------------------------------------------------------------
// Allocation

// Note [Recovered out-of-memory errors]
// Some callers catch an out-of-memory error and carry on another way: cuDNN, when a plan's
// workspace cannot be allocated, runs the next plan, and keeps it for that shape. Under a budget
// that can make a run take another (deterministic) algorithm than the same run without dtr, so
// results differ in the last bits, silently: the conv net trained at 0.5 of its peak on an H200
// with losses off in the 7th digit from the second step. When a thread that was just given an
// out-of-memory error allocates again, the error was caught: it is counted (stats:
// recovered_ooms) and reported once on stderr, naming the size, so the user knows the budget is
// the cause and how much more would avoid it.
namespace {
// The last error this thread raised, if any, and the adapter that raised it.
thread_local size_t t_unrecovered_oom_bytes = 0;
thread_local uint64_t t_unrecovered_oom_adapter = 0;  // its oom_id_ (addresses get reused)
std::atomic<uint64_t> g_next_adapter_id{1};
}  // namespace

uint64_t CudaAllocatorAdapter::NextOomId() { return g_next_adapter_id.fetch_add(1); }

void CudaAllocatorAdapter::NoteRecoveredOom(size_t n) {
  if (recovered_ooms_.fetch_add(1, std::memory_order_relaxed) == 0)
    std::fprintf(stderr,
                 "dtr: warning: an out-of-memory error dtr raised under DTR_BUDGET=%s (a request of %s) was caught "
                 "and the program went on: cuDNN and cuBLAS then use an algorithm with less workspace, so results "
                 "may differ from a run without dtr in the last bits. A budget larger by that much avoids it "
                 "(counted in stats as recovered_ooms).\n",
                 budget_.ToString().c_str(), FormatBytes(n).c_str());
}

c10::DataPtr CudaAllocatorAdapter::allocate(size_t n) {
  if (t_unrecovered_oom_bytes != 0) {
    if (t_unrecovered_oom_adapter == oom_id_) NoteRecoveredOom(t_unrecovered_oom_bytes);
    t_unrecovered_oom_bytes = 0;
  }
  const c10::DeviceIndex dev = platform_.current_device();
  Device& d = DeviceState(dev);
  c10::DataPtr native_dp;
  void* ptr = nullptr;
  const cudaStream_t stream = platform_.current_stream(dev);
  if (opts_.backend == CudaBackendKind::kNative) {
    native_dp = AllocateNative(d, n);
    ptr = native_dp.get();
    if (ptr == nullptr) return native_dp;  // zero bytes: no slot (Note [CUDA slots])
  } else {
    if (n == 0) return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CUDA, dev));
    ptr = AllocateDtr(d, n, stream);
  }
  auto* s = new CudaSlot();
  s->mem = ptr;
  s->bytes = n;
  s->serial = NextSlotSerial();
  s->cuda_device = dev;
  s->owner = this;
  s->native = std::move(native_dp);
  s->stream = stream;
  {
    SlotMap& m = Slots();
    std::lock_guard<std::mutex> g(m.mu);
    m.by_ptr[ptr] = s;
  }
  return c10::DataPtr(ptr, ptr, &CudaDataDeleter, c10::Device(c10::DeviceType::CUDA, dev));
}

c10::DataPtr CudaAllocatorAdapter::AllocateNative(Device& d, size_t n) {
  const bool budgeted = d.budget != std::numeric_limits<size_t>::max();
  // Uncached mode (PYTORCH_NO_CUDA_MEMORY_CACHING=1) is plain cudaMalloc: no stats, no memory
  // fraction, so no budget could hold. Refuse rather than run unbudgeted.
  TORCH_CHECK(!budgeted || native().isEnabled(), "dtr: DTR_BUDGET cannot be enforced while PyTorch's CUDA caching ",
              "allocator is disabled (PYTORCH_NO_CUDA_MEMORY_CACHING=1): unset it, or use DTR_CUDA_ALLOCATOR=dtr");
  ApplyNativeFraction(d);
  CudaEvictor* ev = opts_.evict ? evictor() : nullptr;
  const size_t need = RoundNative(n);
  const auto agg = size_t(c10::CachingAllocator::StatType::AGGREGATE);
  auto allocated = [&] { return size_t(native().getDeviceStats(d.index).allocated_bytes[agg].current); };
  // Note [Why nothing was evicted]
  // An out-of-memory error under a budget says whether dtr evicted what it could. When it freed
  // nothing for the request it says why: the request cannot fit beside the unevictable bytes,
  // eviction is off, dtr is paused, a graph capture is under way, the engine lock belongs to a
  // parallel region's owner, or nothing on the device was left to evict. (A run on an H200 with
  // expandable segments failed in its first backward pass with 768 MiB evictable and nothing
  // evicted, under a message claiming everything had been: 2026-11-28, cause not found.)
  const char* not_evicted = opts_.evict ? nullptr : "eviction is off (DTR_EVICT=0)";
  if (opts_.evict && ev == nullptr) not_evicted = "dtr's engine is not attached to this allocator";
  // What the native fraction lets it reserve: the budget, less a page with expandable segments.
  const size_t cap = std::min(d.budget, d.native_cap.load(std::memory_order_relaxed));
  // A request that cannot fit beside what can never be evicted fails without evicting anything.
  if (ev != nullptr && budgeted && need + ev->UnevictableBytes(d.index) > cap) {
    ev = nullptr;
    not_evicted = "the request does not fit beside the bytes no eviction can free";
  }
  size_t freed = 0;  // for this request, over every round
  // A request that cannot fit even with a perfectly packed cache: evict before asking.
  if (ev != nullptr && budgeted && n > 0 && allocated() + need > cap)
    freed += ev->EvictOnDevice(d.index, [&] { return allocated() + need <= cap; }).bytes_freed;
  for (;;) {
    try {
      return native().allocate(n);
    } catch (const c10::OutOfMemoryError& e) {
      // The native allocator already released its cached blocks and retried: what is left is
      // held by tensors. Evict at least one request's worth more (fragmentation) and retry.
      CudaEvictor::Eviction more{0, not_evicted};
      if (ev != nullptr) {
        const size_t before = allocated();
        more = ev->EvictOnDevice(d.index, [&] {
          const size_t now = allocated();
          return now < before && before - now >= need;
        });
        // Nothing evicted and no reason: another thread freed a request's worth meanwhile.
        if (more.bytes_freed == 0 && more.stopped_because == nullptr) continue;
      }
      if (more.bytes_freed == 0) {
        // Note [Why nothing was evicted]: the message claims everything was evicted only when it was.
        const char* why = more.stopped_because == CudaEvictor::kNothingLeftToEvict ? nullptr : more.stopped_because;
        ThrowOom(d.index, n, e.what_without_backtrace(), why, freed);
      }
      freed += more.bytes_freed;
    }
  }
}

void* CudaAllocatorAdapter::AllocateDtr(Device& d, size_t n, cudaStream_t stream) {
  if (!d.handler_set) {
    if (CudaEvictor* ev = evictor(); ev != nullptr && opts_.evict) {
      d.alloc->SetEvictionHandler(ev->HandlerFor(d.index, d.alloc.get()));
      d.handler_set = true;
    }
  }
  absl::StatusOr<void*> p = d.alloc->Allocate(n, alloc::Stream{uint64_t(reinterpret_cast<uintptr_t>(stream))});
  if (p.ok()) return *p;
  if (p.status().code() != absl::StatusCode::kResourceExhausted)
    TORCH_CHECK(false, "dtr: CUDA allocation failed: ", std::string(p.status().message()));
  std::vector<cca::OutOfMemoryObserver> observers;
  {
    std::lock_guard<std::mutex> l(mu_);
    observers = oom_observers_;
  }
  const alloc::AllocatorStats st = d.alloc->GetStats();
  for (const auto& o : observers) o(d.index, size_t(st.allocated_bytes.current), d.total, 0);
  ThrowOom(d.index, n, std::string(p.status().message()));
}

void CudaAllocatorAdapter::ThrowOom(c10::DeviceIndex device, size_t n, const std::string& why,
                                    const char* not_evicted, size_t freed) {
  t_unrecovered_oom_bytes = std::max<size_t>(n, 1);  // Note [Recovered out-of-memory errors]
  t_unrecovered_oom_adapter = oom_id_;
  std::string account;
  if (CudaEvictor* ev = evictor()) account = absl::StrCat(" dtr: ", ev->Breakdown(), ".");
  // Note [Why nothing was evicted]
  std::string evicted = " even after evicting every evictable tensor.";
  if (not_evicted != nullptr)
    evicted = freed == 0 ? absl::StrCat("; dtr evicted nothing for it: ", not_evicted, ".")
                         : absl::StrCat("; dtr evicted ", FormatBytes(freed), " for it, then stopped: ", not_evicted, ".");
  TORCH_CHECK_WITH(OutOfMemoryError, false, "dtr: CUDA out of memory on ", DeviceName(device), " under DTR_BUDGET=",
                   budget_.ToString(), ": cannot allocate ", FormatBytes(n), evicted, account, " Allocator: ", why);
}

c10::DeleterFnPtr CudaAllocatorAdapter::raw_deleter() const { return &CudaDataDeleter; }

void CudaAllocatorAdapter::copy_data(void* dest, const void* src, std::size_t count) const {
  if (opts_.backend == CudaBackendKind::kNative) return native().copy_data(dest, src, count);
  platform_.copy_sync(dest, src, count);
}

// ---------------------------------------------------------------------------------------------
// DeviceAllocator

bool CudaAllocatorAdapter::initialized() {
  if (opts_.backend == CudaBackendKind::kNative) return native().initialized();
  std::lock_guard<std::mutex> l(mu_);
  return !devices_.empty();
}

void CudaAllocatorAdapter::emptyCache(c10::MempoolId_t mempool_id) {
  if (opts_.backend == CudaBackendKind::kNative) return native().emptyCache(mempool_id);
  if (mempool_id != c10::MempoolId_t{0, 0}) Refuse("private memory pools (emptyCache of a pool)");
  std::vector<alloc::CachingAllocator*> all;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& d : devices_)
      if (d && d->alloc) all.push_back(d->alloc.get());
  }
  for (alloc::CachingAllocator* a : all) a->EmptyCache();
}

namespace {

void Copy(c10::CachingAllocator::Stat& to, const alloc::Stat& from) {
  to.current = from.current;
  to.peak = from.peak;
  to.allocated = from.allocated;
  to.freed = from.freed;
}

}  // namespace

c10::CachingDeviceAllocator::DeviceStats CudaAllocatorAdapter::getDeviceStats(c10::DeviceIndex device) {
  if (opts_.backend == CudaBackendKind::kNative) return native().getDeviceStats(device);
  c10::CachingDeviceAllocator::DeviceStats out;
  alloc::CachingAllocator* a = DtrAllocatorOf(device);
  if (a == nullptr) return out;
  const alloc::AllocatorStats s = a->GetStats();
  // dtr's allocator keeps one set of gauges (no per-pool split): aggregate and large pool alike.
  for (size_t t : {size_t(c10::CachingAllocator::StatType::AGGREGATE), size_t(c10::CachingAllocator::StatType::LARGE_POOL)}) {
    Copy(out.allocation[t], s.allocation_count);
    Copy(out.segment[t], s.segment_count);
    Copy(out.active[t], s.active_count);
    Copy(out.allocated_bytes[t], s.allocated_bytes);
    Copy(out.reserved_bytes[t], s.reserved_bytes);
    Copy(out.active_bytes[t], s.active_bytes);
    Copy(out.requested_bytes[t], s.requested_bytes);
  }
  out.num_alloc_retries = s.num_alloc_retries;
  out.num_ooms = s.num_ooms;
  out.num_device_alloc = s.num_segment_allocs;
  out.num_device_free = s.num_segment_frees;
  return out;
}

void CudaAllocatorAdapter::resetAccumulatedStats(c10::DeviceIndex device) {
  if (opts_.backend == CudaBackendKind::kNative) return native().resetAccumulatedStats(device);
  // Accumulated counters are kept for dtr's own accounting; only the peaks can be reset.
  TORCH_WARN_ONCE("dtr: the dtr CUDA allocator backend does not reset accumulated counters; peaks are reset by "
                  "torch.cuda.reset_peak_memory_stats()");
}

void CudaAllocatorAdapter::resetPeakStats(c10::DeviceIndex device) {
  if (opts_.backend == CudaBackendKind::kNative) return native().resetPeakStats(device);
  if (alloc::CachingAllocator* a = DtrAllocatorOf(device)) a->ResetPeakStats();
}

std::pair<size_t, size_t> CudaAllocatorAdapter::getMemoryInfo(c10::DeviceIndex device) {
  if (native_ != nullptr) return native().getMemoryInfo(device);
  return cca::CUDAAllocator::getMemoryInfo(device);
}

// ---------------------------------------------------------------------------------------------
// CUDAAllocator: untracked raw allocations, configuration

void* CudaAllocatorAdapter::raw_alloc(size_t nbytes) {
  if (opts_.backend == CudaBackendKind::kNative) return native().raw_alloc(nbytes);
  const c10::DeviceIndex dev = platform_.current_device();
  return raw_alloc_with_stream(nbytes, platform_.current_stream(dev));
}

void* CudaAllocatorAdapter::raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) {
  if (opts_.backend == CudaBackendKind::kNative) return native().raw_alloc_with_stream(nbytes, stream);
  if (nbytes == 0) return nullptr;
  return AllocateDtr(DeviceState(platform_.current_device()), nbytes, stream);
}

void CudaAllocatorAdapter::raw_delete(void* ptr) {
  // A pointer from allocate() whose DataPtr was released (torch's cudagraph trees swap the
  // deleter of "standard" DataPtrs for raw_delete): free it as its deleter would.
  if (ptr != nullptr && FindSlot(ptr) != nullptr) return CudaDataDeleter(ptr);
  if (opts_.backend == CudaBackendKind::kNative) return native().raw_delete(ptr);
  if (ptr == nullptr) return;
  std::vector<alloc::CachingAllocator*> all;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& d : devices_)
      if (d && d->alloc) all.push_back(d->alloc.get());
  }
  for (alloc::CachingAllocator* a : all)
    if (a->BlockSize(ptr).ok()) {
      absl::Status st = a->Free(ptr);
      TORCH_CHECK(st.ok(), "dtr: raw_delete: ", std::string(st.message()));
      return;
    }
  TORCH_CHECK(false, "dtr: raw_delete of a pointer the dtr CUDA allocator did not allocate");
}

void CudaAllocatorAdapter::init(int device_count) {
  if (native_ != nullptr) native().init(device_count);
  std::lock_guard<std::mutex> l(mu_);
  if (devices_.size() < size_t(device_count)) devices_.resize(size_t(device_count));
}

double CudaAllocatorAdapter::getMemoryFraction(c10::DeviceIndex device) {
  if (opts_.backend == CudaBackendKind::kNative) return native().getMemoryFraction(device);
  Device& d = DeviceState(device);
  std::lock_guard<std::mutex> l(mu_);
  return d.user_fraction < 0 ? 1.0 : d.user_fraction;
}

void CudaAllocatorAdapter::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  TORCH_CHECK_VALUE(fraction >= 0 && fraction <= 1, "invalid fraction ", fraction, ", please set within [0, 1]");
  Device& d = DeviceState(device);
  {
    std::lock_guard<std::mutex> l(mu_);
    d.user_fraction = fraction;
    d.fraction_applied = false;
  }
  // Note [Recording starts with a budget] (fallback.cc): a cap below the device is a budget.
  auto start_recording = [&] {
    if (fraction < 1 && g_engine != nullptr) g_engine->StartRecording();
  };
  if (opts_.backend == CudaBackendKind::kNative) {
    ApplyNativeFraction(d);
    return start_recording();
  }
  // dtr backend: the budget is the smaller of DTR_BUDGET and the user's fraction.
  const size_t cap = std::min(d.budget, size_t(fraction * double(d.total)));
  absl::Status st = d.alloc->SetBudget(cap);
  TORCH_CHECK(st.ok(), "dtr: set_per_process_memory_fraction(", fraction, "): ", std::string(st.message()));
  start_recording();
}

std::vector<cca::StreamSegmentSize> CudaAllocatorAdapter::getExpandableSegmentSizes(c10::DeviceIndex device) {
  if (opts_.backend == CudaBackendKind::kNative) return native().getExpandableSegmentSizes(device);
  return {};  // dtr's allocator has no expandable segments
}

void CudaAllocatorAdapter::enable(bool value) {
  if (opts_.backend == CudaBackendKind::kNative) return native().enable(value);
  if (!value) Refuse("disabling its cache (enable(false))");
}

bool CudaAllocatorAdapter::isEnabled() const {
  if (opts_.backend == CudaBackendKind::kNative) return native().isEnabled();
  return true;
}

void CudaAllocatorAdapter::cacheInfo(c10::DeviceIndex device, size_t* largestBlock) {
  if (opts_.backend == CudaBackendKind::kNative) {
    native().cacheInfo(device, largestBlock);
    // The native answer includes the device's free memory, beyond the budget: cuDNN would size
    // workspaces (and evict for them) from it. Nothing larger than the budget's room can fit.
    const size_t budget = DeviceState(device).budget;
    if (budget != std::numeric_limits<size_t>::max()) {
      const size_t allocated = AllocatedAndReserved(device).first;
      *largestBlock = std::min(*largestBlock, budget > allocated ? budget - allocated : 0);
    }
    return;
  }
  // Like the native allocator: the largest cached free block, or the device's free memory if
  // larger and the budget allows it (cuDNN sizes its benchmark workspace from this).
  size_t largest = 0;
  if (alloc::CachingAllocator* a = DtrAllocatorOf(device))
    largest = a->Snapshot().ComputeTotals().largest_free_block;
  *largestBlock = std::max(*largestBlock, largest);
}

void* CudaAllocatorAdapter::getBaseAllocation(void* ptr, size_t* size) {
  if (opts_.backend == CudaBackendKind::kNative) return native().getBaseAllocation(ptr, size);
  std::vector<alloc::CachingAllocator*> all;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& d : devices_)
      if (d && d->alloc) all.push_back(d->alloc.get());
  }
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  for (alloc::CachingAllocator* a : all)
    for (const alloc::SegmentSnapshot& seg : a->Snapshot().segments)
      if (p >= seg.address && p < seg.address + seg.size) {
        if (size) *size = seg.size;
        return reinterpret_cast<void*>(seg.address);
      }
  TORCH_CHECK(false, "dtr: getBaseAllocation of a pointer the dtr CUDA allocator did not allocate");
}

void CudaAllocatorAdapter::recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) {
  if (!ptr.get()) return;
  CudaSlot* s = ptr.get_deleter() == &CudaDataDeleter ? static_cast<CudaSlot*>(FindSlot(ptr.get())) : nullptr;
  if (opts_.backend == CudaBackendKind::kNative) {
    // Note [CUDA slots]: the native allocator only records streams for its own DataPtrs.
    return native().recordStream(s != nullptr ? s->native : ptr, stream);
  }
  if (s == nullptr) return;  // not ours (like the native allocator, ignore)
  alloc::CachingAllocator* a = DtrAllocatorOf(s->cuda_device);
  if (a == nullptr) return;
  absl::Status st =
      a->RecordStream(s->mem, alloc::Stream{uint64_t(reinterpret_cast<uintptr_t>(platform_.stream_handle(stream)))});
  TORCH_CHECK(st.ok(), "dtr: recordStream: ", std::string(st.message()));
}

cca::SnapshotInfo CudaAllocatorAdapter::snapshot(c10::MempoolId_t mempool_id, bool include_traces) {
  if (opts_.backend == CudaBackendKind::kNative) return native().snapshot(mempool_id, include_traces);
  cca::SnapshotInfo out;
  std::vector<std::pair<c10::DeviceIndex, alloc::CachingAllocator*>> all;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& d : devices_)
      if (d && d->alloc) all.emplace_back(d->index, d->alloc.get());
    out.device_traces.resize(devices_.size());
  }
  for (auto [dev, a] : all) {
    for (const alloc::SegmentSnapshot& seg : a->Snapshot().segments) {
      c10::CachingDeviceAllocator::SegmentInfo si;
      si.device = dev;
      si.address = seg.address;
      si.total_size = seg.size;
      si.stream = reinterpret_cast<void*>(uintptr_t(seg.stream.id));
      si.is_large = seg.pool == alloc::Pool::kLarge;
      for (const alloc::BlockSnapshot& b : seg.blocks) {
        c10::CachingDeviceAllocator::BlockInfo bi;
        bi.size = b.size;
        bi.requested_size = b.requested_size;
        bi.allocated = b.state == alloc::BlockState::kAllocated;
        bi.active = b.state != alloc::BlockState::kFree;
        if (bi.allocated) {
          si.allocated_size += b.size;
          si.requested_size += b.requested_size;
        }
        if (bi.active) si.active_size += b.size;
        si.blocks.push_back(std::move(bi));
      }
      out.segments.push_back(std::move(si));
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// CUDAAllocator: graph pools, IPC, history: forwarded, or refused by the dtr backend

void CudaAllocatorAdapter::beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                               std::function<bool(cudaStream_t)> filter) {
  if (opts_.backend == CudaBackendKind::kNative) {
#if !DTR_CUDA_ALLOC_HAS_MARK_CAPTURE
    captures_.fetch_add(1);  // before 2.13, pools are begun around captures (cuda_compat.h)
#endif
    return native().beginAllocateToPool(device, mempool_id, std::move(filter));
  }
  Refuse("CUDA graphs and private memory pools (beginAllocateToPool)");
}

void CudaAllocatorAdapter::endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  if (opts_.backend == CudaBackendKind::kNative) {
#if !DTR_CUDA_ALLOC_HAS_MARK_CAPTURE
    captures_.fetch_sub(1);
#endif
    return native().endAllocateToPool(device, mempool_id);
  }
  Refuse("CUDA graphs and private memory pools (endAllocateToPool)");
}

#if DTR_CUDA_ALLOC_HAS_MARK_CAPTURE
void CudaAllocatorAdapter::markCaptureBegin(c10::DeviceIndex device) {
  if (opts_.backend == CudaBackendKind::kNative) {
    captures_.fetch_add(1);
    return native().markCaptureBegin(device);
  }
  Refuse("CUDA graph capture (markCaptureBegin)");
}

void CudaAllocatorAdapter::markCaptureEnd(c10::DeviceIndex device) {
  if (opts_.backend == CudaBackendKind::kNative) {
    captures_.fetch_sub(1);
    return native().markCaptureEnd(device);
  }
  Refuse("CUDA graph capture (markCaptureEnd)");
}
#endif

void CudaAllocatorAdapter::releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  if (opts_.backend == CudaBackendKind::kNative) return native().releasePool(device, mempool_id);
  Refuse("private memory pools (releasePool)");
}

int CudaAllocatorAdapter::getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  if (opts_.backend == CudaBackendKind::kNative) return native().getPoolUseCount(device, mempool_id);
  Refuse("private memory pools (getPoolUseCount)");
}

void CudaAllocatorAdapter::createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                              std::shared_ptr<cca::CUDAAllocator> allocator) {
  if (opts_.backend == CudaBackendKind::kNative)
    return native().createOrIncrefPool(device, mempool_id, std::move(allocator));
  Refuse("private memory pools (torch.cuda.MemPool)");
}

void CudaAllocatorAdapter::setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id, bool use_on_oom) {
  if (opts_.backend == CudaBackendKind::kNative) return native().setUseOnOOM(device, mempool_id, use_on_oom);
  Refuse("private memory pools (setUseOnOOM)");
}

void CudaAllocatorAdapter::setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  if (opts_.backend == CudaBackendKind::kNative) return native().setNoSplit(device, mempool_id);
  Refuse("private memory pools (setNoSplit)");
}

bool CudaAllocatorAdapter::checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                                    const std::unordered_set<void*>& expected_live_allocations) {
  if (opts_.backend == CudaBackendKind::kNative)
    return native().checkPoolLiveAllocations(device, mempool_id, expected_live_allocations);
  Refuse("private memory pools (checkPoolLiveAllocations)");
}

cca::ShareableHandle CudaAllocatorAdapter::shareIpcHandle(void* ptr) {
  if (opts_.backend == CudaBackendKind::kNative) return native().shareIpcHandle(ptr);
  Refuse("sharing CUDA tensors between processes (IPC)");
}

std::shared_ptr<void> CudaAllocatorAdapter::getIpcDevPtr(std::string handle) {
  if (opts_.backend == CudaBackendKind::kNative) return native().getIpcDevPtr(std::move(handle));
  Refuse("receiving CUDA tensors from other processes (IPC)");
}

bool CudaAllocatorAdapter::isHistoryEnabled() {
  if (opts_.backend == CudaBackendKind::kNative) return native().isHistoryEnabled();
  return false;
}

#if DTR_CUDA_ALLOC_HAS_GET_CONTEXT_FOR_POINTER
std::shared_ptr<c10::GatheredContext> CudaAllocatorAdapter::getContextForPointer(const void* ptr) {
  if (opts_.backend == CudaBackendKind::kNative) return native().getContextForPointer(ptr);
  return nullptr;
}
#endif

void CudaAllocatorAdapter::recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                                         size_t alloc_trace_max_entries, cca::RecordContext when, bool clearHistory,
                                         const std::vector<std::string>& skip_actions) {
  if (opts_.backend == CudaBackendKind::kNative)
    return native().recordHistory(enabled, context_recorder, alloc_trace_max_entries, when, clearHistory,
                                  skip_actions);
  if (enabled) Refuse("recording allocation history (torch.cuda.memory._record_memory_history)");
}

void CudaAllocatorAdapter::recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) {
  if (opts_.backend == CudaBackendKind::kNative) return native().recordAnnotation(md);
}

void CudaAllocatorAdapter::pushCompileContext(std::string& md) {
  if (opts_.backend == CudaBackendKind::kNative) return native().pushCompileContext(md);
}

void CudaAllocatorAdapter::popCompileContext() {
  if (opts_.backend == CudaBackendKind::kNative) return native().popCompileContext();
}

#if DTR_CUDA_ALLOC_HAS_SUPPORTS_USER_METADATA
bool CudaAllocatorAdapter::supportsUserMetadata() {
  if (opts_.backend == CudaBackendKind::kNative) return native().supportsUserMetadata();
  return false;
}
#endif

void CudaAllocatorAdapter::setUserMetadata(const std::string& metadata) {
  if (opts_.backend == CudaBackendKind::kNative) return native().setUserMetadata(metadata);
}

std::string CudaAllocatorAdapter::getUserMetadata() {
  if (opts_.backend == CudaBackendKind::kNative) return native().getUserMetadata();
  return "";
}

#if DTR_CUDA_ALLOC_HAS_ANNOTATE_MEMORY
void CudaAllocatorAdapter::annotateMemory(const void* ptr, const std::string& metadata) {
  if (opts_.backend == CudaBackendKind::kNative) return native().annotateMemory(ptr, metadata);
  TORCH_WARN_ONCE("dtr: the dtr CUDA allocator backend ignores memory annotations.", kUseNative);
}
#endif

void CudaAllocatorAdapter::attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) {
  if (opts_.backend == CudaBackendKind::kNative) return native().attachOutOfMemoryObserver(std::move(observer));
  std::lock_guard<std::mutex> l(mu_);
  oom_observers_.push_back(std::move(observer));
}

#if DTR_CUDA_ALLOC_HAS_OOM_REJECTION_OBSERVER
void CudaAllocatorAdapter::attachOomRejectionObserver(cca::OomRejectionObserver observer) {
  if (opts_.backend == CudaBackendKind::kNative) return native().attachOomRejectionObserver(std::move(observer));
  // dtr's allocator never rejects a request before trying it: nothing to report.
}
#endif

void CudaAllocatorAdapter::attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) {
  if (opts_.backend == CudaBackendKind::kNative) return native().attachAllocatorTraceTracker(std::move(tracker));
  Refuse("allocator trace trackers (attachAllocatorTraceTracker)");
}

void CudaAllocatorAdapter::enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) {
  if (opts_.backend == CudaBackendKind::kNative) return native().enablePeerAccess(dev, dev_to_access);
  platform_.enable_peer_access(dev, dev_to_access);
}

cudaError_t CudaAllocatorAdapter::memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                                              cudaStream_t stream, bool p2p_enabled) {
  if (opts_.backend == CudaBackendKind::kNative)
    return native().memcpyAsync(dst, dstDevice, src, srcDevice, count, stream, p2p_enabled);
  return platform_.memcpy_async(dst, dstDevice, src, srcDevice, count, stream, p2p_enabled);
}

std::shared_ptr<cca::AllocatorState> CudaAllocatorAdapter::getCheckpointState(c10::DeviceIndex device,
                                                                               c10::MempoolId_t id) {
  if (opts_.backend == CudaBackendKind::kNative) return native().getCheckpointState(device, id);
  Refuse("checkpointed pool state (CUDA graph trees)");
}

cca::CheckpointDelta CudaAllocatorAdapter::setCheckpointPoolState(c10::DeviceIndex device,
                                                                  std::shared_ptr<cca::AllocatorState> pps) {
  if (opts_.backend == CudaBackendKind::kNative) return native().setCheckpointPoolState(device, std::move(pps));
  Refuse("checkpointed pool state (CUDA graph trees)");
}

#if DTR_CUDA_ALLOC_HAS_ALLOCATE_WITH_ADDRESS
c10::DataPtr CudaAllocatorAdapter::allocateWithAddress(size_t size, void* addr) {
  if (opts_.backend == CudaBackendKind::kNative) return native().allocateWithAddress(size, addr);
  Refuse("allocation at a given address (allocateWithAddress)");
}
#endif

std::string CudaAllocatorAdapter::name() {
  if (opts_.backend == CudaBackendKind::kNative) return absl::StrCat("dtr(", native().name(), ")");
  return "dtr";
}

// ---------------------------------------------------------------------------------------------
// The real CUDA platform and installation

CudaPlatform MakeCudaPlatform() {
  CudaPlatform p;
  p.device_count = [] { return int(c10::cuda::device_count()); };
  p.total_memory = [](c10::DeviceIndex d) {
    cudaDeviceProp prop{};
    C10_CUDA_CHECK(cudaGetDeviceProperties(&prop, d));
    return size_t(prop.totalGlobalMem);
  };
  p.current_device = [] { return c10::cuda::current_device(); };
  p.current_stream = [](c10::DeviceIndex d) { return c10::cuda::getCurrentCUDAStream(d).stream(); };
  p.stream_handle = [](const c10::cuda::CUDAStream& s) { return s.stream(); };
  p.make_backend = [](c10::DeviceIndex d) -> absl::StatusOr<std::unique_ptr<alloc::DeviceMemoryBackend>> {
    auto b = alloc::CudaBackend::Create(d);
    if (!b.ok()) return b.status();
    return std::unique_ptr<alloc::DeviceMemoryBackend>(std::move(*b));
  };
  p.enable_peer_access = [](c10::DeviceIndex dev, c10::DeviceIndex to) {
    c10::cuda::CUDAGuard g(dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(to, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
      return;
    }
    C10_CUDA_CHECK(err);
  };
  p.memcpy_async = [](void* dst, int dst_dev, const void* src, int src_dev, size_t count, cudaStream_t stream,
                      bool p2p) {
    if (p2p || dst_dev == src_dev) return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, count, stream);
  };
  p.copy_sync = [](void* dst, const void* src, size_t count) {
    C10_CUDA_CHECK(cudaMemcpy(dst, src, count, cudaMemcpyDeviceToDevice));
  };
  // Note [Expandable segments under a budget]
  p.native_settings = []() -> std::string {
#if DTR_TORCH_AT_LEAST(2, 13)
    return c10::CachingAllocator::getAllocatorSettings();
#else
    // As PyTorch reads them: the device-generic variable first. (Settings applied at runtime
    // with torch.cuda.memory._set_allocator_settings are not seen before torch 2.13.)
    for (const char* var : {"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"})
      if (const char* conf = std::getenv(var)) return conf;
    return "";
#endif
  };
  p.set_native_settings = [](const std::string& settings) {
    c10::cuda::CUDACachingAllocator::setAllocatorSettings(settings);
#if DTR_TORCH_AT_LEAST(2, 13)
    // The settings' own flag. (CUDAAllocatorConfig::expandable_segments() would also say whether
    // the build supports them, but it is inline and reads a macro of PyTorch's own build, which
    // an extension does not define: compiled here it always says no.)
    return c10::CachingAllocator::AcceleratorAllocatorConfig::use_expandable_segments();
#else
    return true;
#endif
  };
  return p;
}

absl::StatusOr<CudaAllocatorAdapter*> InstallCudaAllocator(const CudaAllocatorAdapter::Options& options) {
  if (g_cuda_adapter.load() != nullptr) return g_cuda_adapter.load();
  cca::CUDAAllocator* current = cca::allocator.load();
  if (current != nullptr && current->initialized())
    return absl::FailedPreconditionError(
        "dtr: CUDA is already initialized, so dtr cannot take over its allocator (memory allocated so far could not "
        "be tracked). Activate dtr before the first CUDA call: python -m dtr, DTR_BUDGET in the environment, or "
        "dtr.enable() before touching torch.cuda");
  // Never destroyed: DataPtrs may be freed during static destruction.
  auto* adapter = new CudaAllocatorAdapter(options, MakeCudaPlatform(), current);
  cca::allocator.store(adapter);
  c10::SetAllocator(c10::DeviceType::CUDA, adapter, /*priority=*/100);
  g_cuda_adapter.store(adapter);
  return adapter;
}

}  // namespace dtr::hooks

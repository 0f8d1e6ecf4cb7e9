// CudaAllocatorAdapter: the c10::cuda::CUDACachingAllocator::CUDAAllocator dtr installs as torch's
// CUDA allocator (stored into CUDACachingAllocator::allocator and registered for kCUDA). Two
// backends, chosen by DTR_CUDA_ALLOCATOR (Note [Two CUDA backends]):
//   native  forwards every method to the allocator torch had (its caching allocator, or
//           cudaMallocAsync), enforcing the budget as that allocator's memory fraction and
//           evicting tensors before a request would not fit / after it failed;
//   dtr     dtr's own allocator/ (CachingAllocator over a DeviceMemoryBackend per device), with
//           eviction in its retry ladder.
// Every DataPtr from allocate() has its device pointer as data and context and CudaDataDeleter
// as deleter; the adapter maps the pointer to a heap Slot (storage_slots.h) so the engine can
// track, evict and restore CUDA storages exactly like CPU ones (Note [CUDA slots]).
//
// Everything the adapter needs from CUDA or from the engine is injected (CudaPlatform,
// CudaEvictor), so tests run it on a machine without a GPU against a recording fake native
// allocator and alloc::FakeBackend.
#ifndef DTR_HOOKS_CUDA_ALLOCATOR_H_
#define DTR_HOOKS_CUDA_ALLOCATOR_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "allocator/caching_allocator.h"
#include "allocator/device_memory_backend.h"
#include "allocator/eviction_handler.h"
#include "hooks/cuda_compat.h"
#include "hooks/storage_slots.h"

namespace dtr::hooks {

namespace cca = c10::cuda::CUDACachingAllocator;

enum class CudaBackendKind { kNative, kDtr };
const char* CudaBackendName(CudaBackendKind k);
absl::StatusOr<CudaBackendKind> ParseCudaBackend(const std::string& s);

// The budget on each CUDA device: bytes, or a fraction of the device's total memory.
struct CudaBudget {
  bool unlimited = true;
  uint64_t bytes = 0;     // when !unlimited and fraction == 0
  double fraction = 0.0;  // in (0, 1] when set
  // Bytes on a device of `total` bytes; InvalidArgument if they exceed it.
  absl::StatusOr<size_t> Resolve(size_t total, c10::DeviceIndex device) const;
  std::string ToString() const;
};

// What the adapter asks of CUDA. Production fills it with the CUDA runtime (MakeCudaPlatform);
// tests with fakes. Every function may be called from any thread.
struct CudaPlatform {
  std::function<int()> device_count;
  std::function<size_t(c10::DeviceIndex)> total_memory;  // without creating a context
  std::function<c10::DeviceIndex()> current_device;
  std::function<cudaStream_t(c10::DeviceIndex)> current_stream;
  std::function<cudaStream_t(const c10::cuda::CUDAStream&)> stream_handle;  // CUDAStream::stream()
  // dtr backend: the device memory of one device.
  std::function<absl::StatusOr<std::unique_ptr<alloc::DeviceMemoryBackend>>(c10::DeviceIndex)> make_backend;
  // dtr backend: peer access and copies (cudaDeviceEnablePeerAccess, cudaMemcpy(Peer)Async).
  std::function<void(c10::DeviceIndex, c10::DeviceIndex)> enable_peer_access;
  std::function<cudaError_t(void*, int, const void*, int, size_t, cudaStream_t, bool)> memcpy_async;
  std::function<void(void*, const void*, size_t)> copy_sync;
  // native backend: the caching allocator's settings as last applied (PYTORCH_CUDA_ALLOC_CONF or
  // torch.cuda.memory._set_allocator_settings) and a way to apply new ones, which says whether
  // expandable segments are in effect after them and may throw (Note [Expandable segments under
  // a budget]). Either empty: the settings are left alone.
  std::function<std::string()> native_settings;
  std::function<bool(const std::string&)> set_native_settings;
};
// The real one (cuda_allocator.cc).
CudaPlatform MakeCudaPlatform();

// Note [Expandable segments under a budget] (cuda_allocator.cc): the native allocator's settings
// with expandable segments turned on, or nullopt when they say nothing should change (the user
// chose expandable_segments either way, or the cudaMallocAsync backend); a `backend` entry is
// left out.
std::optional<std::string> SettingsWithExpandableSegments(std::string_view settings);

// What the adapter asks of dtr's engine (engine.cc implements it; tests fake it). Called without
// any allocator lock held (Note [No lock across eviction] in allocator/caching_allocator.cc).
class CudaEvictor {
 public:
  virtual ~CudaEvictor() = default;
  // What an eviction for the native backend did: the bytes it freed and, when it stopped before
  // `enough()` held, why (a static string; kNothingLeftToEvict when no storage on the device was
  // left to evict). An out-of-memory message says it (Note [Why nothing was evicted]).
  struct Eviction {
    size_t bytes_freed = 0;
    const char* stopped_because = nullptr;
  };
  // An array, so that every translation unit sees one address (a pointer's value would be the
  // address of a string literal, which compilers may or may not merge).
  static constexpr char kNothingLeftToEvict[] = "nothing on the device was left to evict";
  // Native backend: evicts storages resident on `device` until `enough()` holds or nothing on the
  // device is evictable. `enough` reads the native allocator's stats.
  virtual Eviction EvictOnDevice(c10::DeviceIndex device, const std::function<bool()>& enough) = 0;
  // dtr backend: the EvictionHandler for `device`'s caching allocator (not owned).
  virtual alloc::EvictionHandler* HandlerFor(c10::DeviceIndex device, alloc::CachingAllocator* a) = 0;
  // Bytes on `device` that no eviction can free (pinned, constants, locked): a request that does
  // not fit beside them fails at once instead of evicting everything first.
  virtual size_t UnevictableBytes(c10::DeviceIndex device) = 0;
  // Where the memory is, for out-of-memory messages.
  virtual std::string Breakdown() = 0;
};

class CudaAllocatorAdapter final : public cca::CUDAAllocator {
 public:
  struct Options {
    CudaBackendKind backend = CudaBackendKind::kNative;
    CudaBudget budget;
    bool evict = true;
  };
  // `native` is the allocator torch had (native backend: every call is forwarded to it; dtr
  // backend: unused). Not owned; must outlive the adapter.
  CudaAllocatorAdapter(Options options, CudaPlatform platform, cca::CUDAAllocator* native);
  ~CudaAllocatorAdapter() override;

  void set_evictor(CudaEvictor* e) { evictor_.store(e, std::memory_order_release); }
  CudaBackendKind backend() const { return opts_.backend; }
  // Note [Recovered out-of-memory errors] (cuda_allocator.cc): out-of-memory errors dtr raised
  // that the caller caught and went on from.
  int64_t recovered_ooms() const { return recovered_ooms_.load(std::memory_order_relaxed); }
  // Note [Expandable segments under a budget]: whether dtr turned them on.
  bool turned_on_expandable_segments() const { return expandable_by_dtr_.load(std::memory_order_relaxed); }
  const Options& options() const { return opts_; }
  // Changes the budget (bytes; <= 0: unlimited) on every device; the engine evicts first.
  absl::Status SetBudgetBytes(int64_t bytes);
  // The budget in bytes on `device` (SIZE_MAX when unlimited). Resolves it on first use.
  size_t BudgetOn(c10::DeviceIndex device);
  // allocated/reserved bytes on `device` (either backend), for the engine's stats.
  std::pair<size_t, size_t> AllocatedAndReserved(c10::DeviceIndex device);
  // The dtr backend's caching allocator of `device` (nullptr for native or an unused device).
  // Lock-free for devices below kCachedDevices: the workspace meter asks on every op.
  alloc::CachingAllocator* DtrAllocatorOf(c10::DeviceIndex device);

  // ---- slots (Note [CUDA slots]) ----
  // The slot of a live DataPtr from allocate() (by its data pointer), or nullptr.
  Slot* FindSlot(const void* data) const;
  // Gives a slot's memory back (native: drops the native DataPtr; dtr: Free) and deletes it.
  void FreeSlot(Slot* s);
  // A resident DataPtr for a slot taken over by the engine (same pointer, same deleter).
  c10::DataPtr DataPtrOf(Slot* s) const;
  // The engine saw the slot's memory used by an op on `stream` (Note [Streams of evictable
  // memory]): records the stream with the allocator when it is not the allocation stream.
  void NoteUse(Slot* s, cudaStream_t stream);
  // The current stream of the current device (for NoteUse).
  cudaStream_t CurrentStream() { return platform_.current_stream(platform_.current_device()); }
  // CUDA graph captures begun and not ended, process-wide (markCaptureBegin/End, or
  // begin/endAllocateToPool before 2.13): dtr records, evicts and replays nothing meanwhile.
  int captures_underway() const { return captures_.load(std::memory_order_acquire); }

  // ---- c10::Allocator ----
  c10::DataPtr allocate(size_t n) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  // ---- c10::DeviceAllocator ----
  bool initialized() override;
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  // ---- CUDAAllocator ----
  void* raw_alloc(size_t nbytes) override;
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override;
  void raw_delete(void* ptr) override;
  void init(int device_count) override;
  double getMemoryFraction(c10::DeviceIndex device) override;
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override;
  void enable(bool value) override;
  bool isEnabled() const override;
  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override;
  void* getBaseAllocation(void* ptr, size_t* size) override;
  using cca::CUDAAllocator::recordStream;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override;
  cca::SnapshotInfo snapshot(c10::MempoolId_t mempool_id = {0, 0}, bool include_traces = true) override;
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
#if DTR_CUDA_ALLOC_HAS_MARK_CAPTURE
  void markCaptureBegin(c10::DeviceIndex device) override;
  void markCaptureEnd(c10::DeviceIndex device) override;
#endif
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                          std::shared_ptr<cca::CUDAAllocator> allocator = nullptr) override;
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id, bool use_on_oom) override;
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                const std::unordered_set<void*>& expected_live_allocations) override;
  cca::ShareableHandle shareIpcHandle(void* ptr) override;
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override;
  bool isHistoryEnabled() override;
#if DTR_CUDA_ALLOC_HAS_GET_CONTEXT_FOR_POINTER
  std::shared_ptr<c10::GatheredContext> getContextForPointer(const void* ptr) override;
#endif
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     cca::RecordContext when, bool clearHistory,
                     const std::vector<std::string>& skip_actions) override;
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override;
  void pushCompileContext(std::string& md) override;
  void popCompileContext() override;
#if DTR_CUDA_ALLOC_HAS_SUPPORTS_USER_METADATA
  bool supportsUserMetadata() override;
#endif
  void setUserMetadata(const std::string& metadata) override;
  std::string getUserMetadata() override;
#if DTR_CUDA_ALLOC_HAS_ANNOTATE_MEMORY
  void annotateMemory(const void* ptr, const std::string& metadata) override;
#endif
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override;
#if DTR_CUDA_ALLOC_HAS_OOM_REJECTION_OBSERVER
  void attachOomRejectionObserver(cca::OomRejectionObserver observer) override;
#endif
  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override;
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override;
  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override;
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device, c10::MempoolId_t id) override;
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> pps) override;
#if DTR_CUDA_ALLOC_HAS_ALLOCATE_WITH_ADDRESS
  c10::DataPtr allocateWithAddress(size_t size, void* addr) override;
#endif
  std::string name() override;

  struct CudaSlot;  // a Slot with its owner and native DataPtr (cuda_allocator.cc)

 private:
  struct Device;  // per-device state

  Device& DeviceState(c10::DeviceIndex device);
  // Allocates a block of `n` bytes on the current device and stream, evicting as needed.
  c10::DataPtr AllocateTracked(size_t n);
  c10::DataPtr AllocateNative(Device& d, size_t n);
  void* AllocateDtr(Device& d, size_t n, cudaStream_t stream);
  // `not_evicted`: why dtr stopped evicting for this request, after freeing `freed` bytes for it
  // (Note [Why nothing was evicted]); null when it evicted all it could.
  [[noreturn]] void ThrowOom(c10::DeviceIndex device, size_t n, const std::string& why,
                             const char* not_evicted = nullptr, size_t freed = 0);
  void NoteRecoveredOom(size_t n);
  static uint64_t NextOomId();
  const uint64_t oom_id_ = NextOomId();
  std::atomic<int64_t> recovered_ooms_{0};
  void ApplyNativeFraction(Device& d);
  void TurnOnExpandableSegments(size_t budget);
  std::atomic<bool> expandable_by_dtr_{false};
  std::atomic<bool> expandable_tried_{false};  // the headroom of a page is kept from then on
  std::once_flag expandable_decided_;
  cca::CUDAAllocator& native() const;
  [[noreturn]] void Refuse(const char* what) const;
  CudaEvictor* evictor() const { return evictor_.load(std::memory_order_acquire); }

  const Options opts_;
  const CudaPlatform platform_;
  cca::CUDAAllocator* const native_;
  std::atomic<CudaEvictor*> evictor_{nullptr};
  std::atomic<bool> enabled_{true};
  std::atomic<int> captures_{0};

  mutable std::mutex mu_;  // guards devices_, slots_, budget_ and the observers
  std::vector<std::unique_ptr<Device>> devices_;
  // devices_[i]->alloc, published once created (an allocator lives as long as the adapter).
  static constexpr size_t kCachedDevices = 64;
  std::array<std::atomic<alloc::CachingAllocator*>, kCachedDevices> dtr_allocators_{};
  absl::flat_hash_map<const void*, CudaSlot*> slots_;
  CudaBudget budget_;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
};

// The installed adapter (null until dtr installs one); CudaDataDeleter reaches it here.
extern std::atomic<CudaAllocatorAdapter*> g_cuda_adapter;
// The deleter of every DataPtr from CudaAllocatorAdapter::allocate (data == context).
void CudaDataDeleter(void* data);

// Builds the adapter for `options` around torch's current CUDA allocator and installs it
// (CUDACachingAllocator::allocator and SetAllocator(kCUDA)). Before CUDA is initialized only:
// FailedPrecondition otherwise (allocations of the previous allocator could not be tracked).
absl::StatusOr<CudaAllocatorAdapter*> InstallCudaAllocator(const CudaAllocatorAdapter::Options& options);

}  // namespace dtr::hooks

#endif  // DTR_HOOKS_CUDA_ALLOCATOR_H_

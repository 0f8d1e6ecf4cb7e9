// CudaAllocatorAdapter on a machine without a GPU: the native backend against a recording fake of
// torch's CUDAAllocator (every method must reach it with the same arguments), the dtr backend
// against alloc::FakeBackend devices, slots, budgets, eviction-and-retry, refusals, and a fuzzer.
#include "hooks/cuda_allocator.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if DTR_TORCH_AT_LEAST(2, 13)
#include <c10/core/AllocatorConfig.h>
#endif
#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "allocator/fake_backend.h"

namespace dtr::hooks {
namespace {

using ::testing::HasSubstr;
constexpr size_t kGiB = size_t{1} << 30;
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kDeviceTotal = 16 * kGiB;

cudaStream_t FakeStream(uintptr_t id) { return reinterpret_cast<cudaStream_t>(id); }

// ---------------------------------------------------------------------------------------------
// A CUDAAllocator that records every call as text and hands out fake pointers, with a cap that
// makes allocate() throw OutOfMemoryError like torch's allocator over its memory fraction.
class RecordingNative final : public cca::CUDAAllocator {
 public:
  std::vector<std::string> calls;
  size_t cap = SIZE_MAX;       // allocated + request above this: OutOfMemoryError
  int fail_next = 0;           // the next N allocate() calls throw regardless (fragmentation)
  size_t allocated = 0;
  std::map<uintptr_t, size_t> live;
  uintptr_t next = uintptr_t{1} << 44;
  static RecordingNative* self;

  void Log(std::string s) { calls.push_back(std::move(s)); }
  std::string Last() const { return calls.empty() ? "" : calls.back(); }

  static void Delete(void* p) { self->Free(p); }
  void Free(void* p) {
    auto it = live.find(reinterpret_cast<uintptr_t>(p));
    ASSERT_NE(it, live.end()) << "free of unknown pointer";
    allocated -= it->second;
    live.erase(it);
    Log(absl::StrCat("free(", reinterpret_cast<uintptr_t>(p), ")"));
  }

  c10::DataPtr allocate(size_t n) override {
    Log(absl::StrCat("allocate(", n, ")"));
    if (n == 0) return c10::DataPtr(nullptr, nullptr, &Delete, c10::Device(c10::DeviceType::CUDA, 0));
    const size_t r = (n + 511) / 512 * 512;
    if (fail_next > 0 || allocated + r > cap) {
      if (fail_next > 0) --fail_next;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory (fake): tried to allocate ", n);
    }
    void* p = reinterpret_cast<void*>(next);
    next += r;
    live[reinterpret_cast<uintptr_t>(p)] = r;
    allocated += r;
    return c10::DataPtr(p, p, &Delete, c10::Device(c10::DeviceType::CUDA, 0));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }
  void copy_data(void* d, const void* s, std::size_t n) const override {
    const_cast<RecordingNative*>(this)->Log(absl::StrCat("copy_data(", n, ")"));
  }
  bool initialized() override { Log("initialized()"); return true; }
  void emptyCache(c10::MempoolId_t id) override { Log(absl::StrCat("emptyCache(", id.first, ",", id.second, ")")); }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex d) override {
    c10::CachingDeviceAllocator::DeviceStats s;
    s.allocated_bytes[0].current = int64_t(allocated);
    s.reserved_bytes[0].current = int64_t(allocated);
    return s;  // not logged: the adapter reads it for its budget checks
  }
  void resetAccumulatedStats(c10::DeviceIndex d) override { Log(absl::StrCat("resetAccumulatedStats(", int(d), ")")); }
  void resetPeakStats(c10::DeviceIndex d) override { Log(absl::StrCat("resetPeakStats(", int(d), ")")); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex d) override {
    Log(absl::StrCat("getMemoryInfo(", int(d), ")"));
    return {kDeviceTotal / 2, kDeviceTotal};
  }
  void* raw_alloc(size_t n) override { Log(absl::StrCat("raw_alloc(", n, ")")); return reinterpret_cast<void*>(0x100); }
  void* raw_alloc_with_stream(size_t n, cudaStream_t s) override {
    Log(absl::StrCat("raw_alloc_with_stream(", n, ",", reinterpret_cast<uintptr_t>(s), ")"));
    return reinterpret_cast<void*>(0x200);
  }
  void raw_delete(void* p) override { Log(absl::StrCat("raw_delete(", reinterpret_cast<uintptr_t>(p), ")")); }
  void init(int n) override { Log(absl::StrCat("init(", n, ")")); }
  double getMemoryFraction(c10::DeviceIndex d) override { Log(absl::StrCat("getMemoryFraction(", int(d), ")")); return 0.5; }
  void setMemoryFraction(double f, c10::DeviceIndex d) override { Log(absl::StrCat("setMemoryFraction(", f, ",", int(d), ")")); }
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex d) override {
    Log(absl::StrCat("getExpandableSegmentSizes(", int(d), ")"));
    return {cca::StreamSegmentSize(FakeStream(7), true, 1024)};
  }
  void enable(bool v) override { Log(absl::StrCat("enable(", v, ")")); }
  bool enabled = true;  // false: like PYTORCH_NO_CUDA_MEMORY_CACHING=1
  bool isEnabled() const override { const_cast<RecordingNative*>(this)->Log("isEnabled()"); return enabled; }
  size_t largest_block = 4096;
  void cacheInfo(c10::DeviceIndex d, size_t* b) override { Log(absl::StrCat("cacheInfo(", int(d), ")")); *b = largest_block; }
  void* getBaseAllocation(void* p, size_t* size) override {
    Log(absl::StrCat("getBaseAllocation(", reinterpret_cast<uintptr_t>(p), ")"));
    *size = 8192;
    return p;
  }
  using cca::CUDAAllocator::recordStream;
  void recordStream(const c10::DataPtr& p, c10::cuda::CUDAStream s) override {
    // Like torch: only its own DataPtrs count.
    Log(absl::StrCat("recordStream(", reinterpret_cast<uintptr_t>(p.get()), ",", p.get_deleter() == &Delete ? "own" : "foreign",
                     ",", s.id(), ")"));
  }
  cca::SnapshotInfo snapshot(c10::MempoolId_t id, bool traces) override {
    Log(absl::StrCat("snapshot(", id.first, ",", traces, ")"));
    cca::SnapshotInfo s;
    s.segments.resize(3);
    return s;
  }
  void beginAllocateToPool(c10::DeviceIndex d, c10::MempoolId_t id, std::function<bool(cudaStream_t)> f) override {
    Log(absl::StrCat("beginAllocateToPool(", int(d), ",", id.first, ",", f(FakeStream(3)), ")"));
  }
  void endAllocateToPool(c10::DeviceIndex d, c10::MempoolId_t id) override {
    Log(absl::StrCat("endAllocateToPool(", int(d), ",", id.first, ")"));
  }
#if DTR_CUDA_ALLOC_HAS_MARK_CAPTURE
  void markCaptureBegin(c10::DeviceIndex d) override { Log(absl::StrCat("markCaptureBegin(", int(d), ")")); }
  void markCaptureEnd(c10::DeviceIndex d) override { Log(absl::StrCat("markCaptureEnd(", int(d), ")")); }
#endif
  void releasePool(c10::DeviceIndex d, c10::MempoolId_t id) override { Log(absl::StrCat("releasePool(", int(d), ",", id.first, ")")); }
  int getPoolUseCount(c10::DeviceIndex d, c10::MempoolId_t id) override {
    Log(absl::StrCat("getPoolUseCount(", int(d), ",", id.first, ")"));
    return 3;
  }
  void createOrIncrefPool(c10::DeviceIndex d, c10::MempoolId_t id, std::shared_ptr<cca::CUDAAllocator> a) override {
    Log(absl::StrCat("createOrIncrefPool(", int(d), ",", id.first, ",", a != nullptr, ")"));
  }
  void setUseOnOOM(c10::DeviceIndex d, c10::MempoolId_t id, bool u) override {
    Log(absl::StrCat("setUseOnOOM(", int(d), ",", id.first, ",", u, ")"));
  }
  void setNoSplit(c10::DeviceIndex d, c10::MempoolId_t id) override { Log(absl::StrCat("setNoSplit(", int(d), ",", id.first, ")")); }
  bool checkPoolLiveAllocations(c10::DeviceIndex d, c10::MempoolId_t id, const std::unordered_set<void*>& e) override {
    Log(absl::StrCat("checkPoolLiveAllocations(", int(d), ",", id.first, ",", e.size(), ")"));
    return true;
  }
  cca::ShareableHandle shareIpcHandle(void* p) override {
    Log(absl::StrCat("shareIpcHandle(", reinterpret_cast<uintptr_t>(p), ")"));
    return {16, "handle"};
  }
  std::shared_ptr<void> getIpcDevPtr(std::string h) override { Log("getIpcDevPtr(" + h + ")"); return nullptr; }
  bool isHistoryEnabled() override { Log("isHistoryEnabled()"); return true; }
#if DTR_CUDA_ALLOC_HAS_GET_CONTEXT_FOR_POINTER
  std::shared_ptr<c10::GatheredContext> getContextForPointer(const void* p) override {
    Log(absl::StrCat("getContextForPointer(", reinterpret_cast<uintptr_t>(p), ")"));
    return nullptr;
  }
#endif
  void recordHistory(bool on, cca::CreateContextFn, size_t n, cca::RecordContext w, bool clear,
                     const std::vector<std::string>& skip) override {
    Log(absl::StrCat("recordHistory(", on, ",", n, ",", int(w), ",", clear, ",", skip.size(), ")"));
  }
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override {
    Log(absl::StrCat("recordAnnotation(", md.size(), ")"));
  }
  void pushCompileContext(std::string& md) override { Log("pushCompileContext(" + md + ")"); }
  void popCompileContext() override { Log("popCompileContext()"); }
#if DTR_CUDA_ALLOC_HAS_SUPPORTS_USER_METADATA
  bool supportsUserMetadata() override { Log("supportsUserMetadata()"); return true; }
#endif
  void setUserMetadata(const std::string& m) override { Log("setUserMetadata(" + m + ")"); }
  std::string getUserMetadata() override { Log("getUserMetadata()"); return "md"; }
#if DTR_CUDA_ALLOC_HAS_ANNOTATE_MEMORY
  void annotateMemory(const void* p, const std::string& m) override {
    Log(absl::StrCat("annotateMemory(", reinterpret_cast<uintptr_t>(p), ",", m, ")"));
  }
#endif
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver) override { Log("attachOutOfMemoryObserver()"); }
#if DTR_CUDA_ALLOC_HAS_OOM_REJECTION_OBSERVER
  void attachOomRejectionObserver(cca::OomRejectionObserver) override { Log("attachOomRejectionObserver()"); }
#endif
  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker) override { Log("attachAllocatorTraceTracker()"); }
  void enablePeerAccess(c10::DeviceIndex a, c10::DeviceIndex b) override {
    Log(absl::StrCat("enablePeerAccess(", int(a), ",", int(b), ")"));
  }
  cudaError_t memcpyAsync(void* dst, int dd, const void* src, int sd, size_t n, cudaStream_t s, bool p2p) override {
    Log(absl::StrCat("memcpyAsync(", reinterpret_cast<uintptr_t>(dst), ",", dd, ",", reinterpret_cast<uintptr_t>(src), ",", sd,
                     ",", n, ",", reinterpret_cast<uintptr_t>(s), ",", p2p, ")"));
    return cudaSuccess;
  }
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex d, c10::MempoolId_t id) override {
    Log(absl::StrCat("getCheckpointState(", int(d), ",", id.first, ")"));
    return nullptr;
  }
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex d, std::shared_ptr<cca::AllocatorState>) override {
    Log(absl::StrCat("setCheckpointPoolState(", int(d), ")"));
    return {};
  }
#if DTR_CUDA_ALLOC_HAS_ALLOCATE_WITH_ADDRESS
  c10::DataPtr allocateWithAddress(size_t n, void* a) override {
    Log(absl::StrCat("allocateWithAddress(", n, ",", reinterpret_cast<uintptr_t>(a), ")"));
    return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CUDA, 0));
  }
#endif
  std::string name() override { return "native"; }
};
RecordingNative* RecordingNative::self = nullptr;

// ---------------------------------------------------------------------------------------------
// Fake platform and evictor

struct FakeCuda {
  c10::DeviceIndex device = 0;
  std::map<int, cudaStream_t> stream;  // current stream per device (default: 0)
  std::vector<alloc::FakeBackend*> backends;
  std::vector<std::string> calls;

  CudaPlatform Platform() {
    CudaPlatform p;
    p.device_count = [] { return 2; };
    p.total_memory = [](c10::DeviceIndex) { return kDeviceTotal; };
    p.current_device = [this] { return device; };
    p.current_stream = [this](c10::DeviceIndex d) { return stream.count(d) ? stream[d] : FakeStream(0); };
    // CUDAStream::stream() needs a GPU: the fake streams' handles are their ids.
    p.stream_handle = [](const c10::cuda::CUDAStream& s) { return FakeStream(uintptr_t(s.id())); };
    p.make_backend = [this](c10::DeviceIndex) -> absl::StatusOr<std::unique_ptr<alloc::DeviceMemoryBackend>> {
      auto b = std::make_unique<alloc::FakeBackend>(SIZE_MAX, 512, alloc::FakeBackend::kBaseAddress << backends.size());
      backends.push_back(b.get());
      return std::unique_ptr<alloc::DeviceMemoryBackend>(std::move(b));
    };
    p.enable_peer_access = [this](c10::DeviceIndex a, c10::DeviceIndex b) {
      calls.push_back(absl::StrCat("peer(", int(a), ",", int(b), ")"));
    };
    p.memcpy_async = [this](void*, int dd, const void*, int sd, size_t n, cudaStream_t, bool p2p) {
      calls.push_back(absl::StrCat("memcpy(", dd, ",", sd, ",", n, ",", p2p, ")"));
      return cudaSuccess;
    };
    p.copy_sync = [this](void*, const void*, size_t n) { calls.push_back(absl::StrCat("copy(", n, ")")); };
    if (fake_settings) {  // Note [Expandable segments under a budget]: settings kept here, not in c10
      p.native_settings = [this] { return settings; };
      p.set_native_settings = [this](const std::string& s) {
        calls.push_back(absl::StrCat("settings(", s, ")"));
        if (settings_refused) throw std::runtime_error("refused\nsecond line");
        settings = s;
        return true;
      };
    }
    return p;
  }
  bool fake_settings = false;    // leave the native settings alone unless a test asks
  bool settings_refused = false;  // applying settings throws, as PyTorch's checks do
  std::string settings;          // the native allocator's settings, as the fake platform sees them
};

// Holds "tensors" (DataPtrs from the adapter) and evicts them oldest first, like the engine.
class FakeEvictor final : public CudaEvictor {
 public:
  std::vector<c10::DataPtr> held;
  int native_calls = 0;
  int handler_calls = 0;
  size_t unevictable = 0;
  size_t UnevictableBytes(c10::DeviceIndex) override { return unevictable; }

  const char* refuse = nullptr;  // set: evicts nothing, giving this reason (the engine paused, ...)
  int refuse_after_calls = 0;    // ... once this many calls have evicted
  Eviction EvictOnDevice(c10::DeviceIndex device, const std::function<bool()>& enough) override {
    ++native_calls;
    Eviction done;
    if (refuse != nullptr && native_calls > refuse_after_calls) {
      done.stopped_because = refuse;
      return done;
    }
    while (!enough() && !held.empty()) {
      done.bytes_freed += held.front().get() ? 1 : 0;
      held.erase(held.begin());
    }
    if (!enough()) done.stopped_because = kNothingLeftToEvict;
    return done;
  }
  struct Handler final : alloc::EvictionHandler {
    FakeEvictor* ev;
    alloc::CachingAllocator* a;
    alloc::EvictionResult MakeRoom(const alloc::EvictionRequest& r) override {
      ++ev->handler_calls;
      alloc::EvictionResult res;
      for (size_t i = 0; i < ev->held.size() && !a->CanSatisfy(r);) {
        absl::StatusOr<size_t> size = a->BlockSize(ev->held[i].get());
        if (!size.ok()) {  // on another device
          ++i;
          continue;
        }
        res.bytes_freed += *size;
        ++res.blocks_freed;
        ev->held.erase(ev->held.begin() + long(i));
      }
      res.satisfied = a->CanSatisfy(r);
      return res;
    }
  };
  std::vector<std::unique_ptr<Handler>> handlers;
  alloc::EvictionHandler* HandlerFor(c10::DeviceIndex, alloc::CachingAllocator* a) override {
    handlers.push_back(std::make_unique<Handler>());
    handlers.back()->ev = this;
    handlers.back()->a = a;
    return handlers.back().get();
  }
  std::string Breakdown() override { return "fake breakdown: 0 B evictable"; }
};

CudaAllocatorAdapter::Options Opts(CudaBackendKind k, size_t budget_bytes = 0, double fraction = 0) {
  CudaAllocatorAdapter::Options o;
  o.backend = k;
  if (budget_bytes > 0 || fraction > 0) {
    o.budget.unlimited = false;
    o.budget.bytes = budget_bytes;
    o.budget.fraction = fraction;
  }
  return o;
}

class NativeTest : public ::testing::Test {
 protected:
  void SetUp() override { RecordingNative::self = &native_; }
  CudaAllocatorAdapter* Make(size_t budget = 0, double fraction = 0) {
    return Keep(std::make_unique<CudaAllocatorAdapter>(Opts(CudaBackendKind::kNative, budget, fraction),
                                                       cuda_.Platform(), &native_));
  }
  // The message of the OutOfMemoryError allocating n bytes must raise ("" and a failure if none).
  static std::string OomMessage(CudaAllocatorAdapter* a, size_t n) {
    try {
      c10::DataPtr p = a->allocate(n);
    } catch (const c10::OutOfMemoryError& e) {
      return e.what();
    }
    ADD_FAILURE() << "allocating " << n << " bytes raised no OutOfMemoryError";
    return "";
  }
  // How many times the adapter applied allocator settings (Note [Expandable segments under a budget]).
  long SettingsCalls() const {
    return std::count_if(cuda_.calls.begin(), cuda_.calls.end(),
                         [](const std::string& c) { return absl::StartsWith(c, "settings("); });
  }
  CudaAllocatorAdapter* Keep(std::unique_ptr<CudaAllocatorAdapter> a) {
    a->set_evictor(&evictor_);
    adapters_.push_back(std::move(a));
    return adapters_.back().get();
  }
  RecordingNative native_;
  FakeCuda cuda_;
  // Destroyed in reverse order: the evictor's tensors before the adapters that own their memory.
  std::vector<std::unique_ptr<CudaAllocatorAdapter>> adapters_;
  FakeEvictor evictor_;
};

// ---------------------------------------------------------------------------------------------
// Native backend: every method forwarded with its arguments

TEST_F(NativeTest, ForwardsEveryMethodWithItsArguments) {
  auto a = Make();
  const c10::MempoolId_t pool{5, 6};
  auto stream = c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED,
                                      c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::CUDA, 0), 0));
  int pass = 0;
  struct Case {
    std::function<void()> call;
    std::string expected;
  };
  std::vector<Case> cases = {
      {[&] { a->raw_alloc(100); }, "raw_alloc(100)"},
      {[&] { a->raw_alloc_with_stream(100, FakeStream(9)); }, "raw_alloc_with_stream(100,9)"},
      {[&] { a->raw_delete(reinterpret_cast<void*>(0x200)); }, "raw_delete(512)"},
      {[&] { a->init(2); }, "init(2)"},
      {[&] { EXPECT_EQ(a->getMemoryFraction(1), 0.5); }, "getMemoryFraction(1)"},
      {[&] { EXPECT_EQ(a->getExpandableSegmentSizes(1).size(), 1u); }, "getExpandableSegmentSizes(1)"},
      {[&] { a->enable(false); }, "enable(0)"},
      {[&] { EXPECT_TRUE(a->isEnabled()); }, "isEnabled()"},
      {[&] {
         size_t b = 0;
         a->cacheInfo(1, &b);
         EXPECT_EQ(b, 4096u);
       },
       "cacheInfo(1)"},
      {[&] {
         size_t s = 0;
         a->getBaseAllocation(reinterpret_cast<void*>(0x300), &s);
         EXPECT_EQ(s, 8192u);
       },
       "getBaseAllocation(768)"},
      {[&] { EXPECT_EQ(a->snapshot(pool, false).segments.size(), 3u); }, "snapshot(5,0)"},
      {[&] { a->beginAllocateToPool(1, pool, [](cudaStream_t s) { return s == FakeStream(3); }); },
       "beginAllocateToPool(1,5,1)"},
      {[&] { a->endAllocateToPool(1, pool); }, "endAllocateToPool(1,5)"},
#if DTR_CUDA_ALLOC_HAS_MARK_CAPTURE
      {[&] { a->markCaptureBegin(1); }, "markCaptureBegin(1)"},
      {[&] { a->markCaptureEnd(1); }, "markCaptureEnd(1)"},
#endif
      {[&] { a->releasePool(1, pool); }, "releasePool(1,5)"},
      {[&] { EXPECT_EQ(a->getPoolUseCount(1, pool), 3); }, "getPoolUseCount(1,5)"},
      {[&] { a->createOrIncrefPool(1, pool, nullptr); }, "createOrIncrefPool(1,5,0)"},
      {[&] { a->setUseOnOOM(1, pool, true); }, "setUseOnOOM(1,5,1)"},
      {[&] { a->setNoSplit(1, pool); }, "setNoSplit(1,5)"},
      {[&] { EXPECT_TRUE(a->checkPoolLiveAllocations(1, pool, {nullptr})); }, "checkPoolLiveAllocations(1,5,1)"},
      {[&] { EXPECT_EQ(a->shareIpcHandle(reinterpret_cast<void*>(0x400)).handle, "handle"); }, "shareIpcHandle(1024)"},
      {[&] { a->getIpcDevPtr("h"); }, "getIpcDevPtr(h)"},
      {[&] { EXPECT_TRUE(a->isHistoryEnabled()); }, "isHistoryEnabled()"},
#if DTR_CUDA_ALLOC_HAS_GET_CONTEXT_FOR_POINTER
      {[&] { a->getContextForPointer(reinterpret_cast<void*>(0x500)); }, "getContextForPointer(1280)"},
#endif
      {[&] { a->recordHistory(true, nullptr, 77, cca::RecordContext::ALL, true, {"x", "y"}); },
       "recordHistory(1,77,3,1,2)"},
      {[&] { a->recordAnnotation({{"k", "v"}}); }, "recordAnnotation(1)"},
      {[&] {
         std::string md = "ctx";
         a->pushCompileContext(md);
       },
       "pushCompileContext(ctx)"},
      {[&] { a->popCompileContext(); }, "popCompileContext()"},
#if DTR_CUDA_ALLOC_HAS_SUPPORTS_USER_METADATA
      {[&] { EXPECT_TRUE(a->supportsUserMetadata()); }, "supportsUserMetadata()"},
#endif
      {[&] { a->setUserMetadata("m"); }, "setUserMetadata(m)"},
      {[&] { EXPECT_EQ(a->getUserMetadata(), "md"); }, "getUserMetadata()"},
#if DTR_CUDA_ALLOC_HAS_ANNOTATE_MEMORY
      {[&] { a->annotateMemory(reinterpret_cast<void*>(0x600), "note"); }, "annotateMemory(1536,note)"},
#endif
      {[&] { a->attachOutOfMemoryObserver([](int64_t, size_t, size_t, size_t) {}); }, "attachOutOfMemoryObserver()"},
#if DTR_CUDA_ALLOC_HAS_OOM_REJECTION_OBSERVER
      {[&] { a->attachOomRejectionObserver([](int64_t, size_t, size_t, size_t) {}); }, "attachOomRejectionObserver()"},
#endif
      {[&] { a->attachAllocatorTraceTracker([](const c10::CachingDeviceAllocator::TraceEntry&) {}); },
       "attachAllocatorTraceTracker()"},
      {[&] { a->enablePeerAccess(0, 1); }, "enablePeerAccess(0,1)"},
      {[&] { a->memcpyAsync(reinterpret_cast<void*>(1), 0, reinterpret_cast<void*>(2), 1, 64, FakeStream(4), true); },
       "memcpyAsync(1,0,2,1,64,4,1)"},
      {[&] { a->getCheckpointState(1, pool); }, "getCheckpointState(1,5)"},
      {[&] { a->setCheckpointPoolState(1, nullptr); }, "setCheckpointPoolState(1)"},
#if DTR_CUDA_ALLOC_HAS_ALLOCATE_WITH_ADDRESS
      {[&] { a->allocateWithAddress(64, reinterpret_cast<void*>(0x700)); }, "allocateWithAddress(64,1792)"},
#endif
      {[&] { a->emptyCache(pool); }, "emptyCache(5,6)"},
      {[&] { EXPECT_TRUE(a->initialized()); }, "initialized()"},
      {[&] { a->resetAccumulatedStats(1); }, "resetAccumulatedStats(1)"},
      {[&] { a->resetPeakStats(1); }, "resetPeakStats(1)"},
      {[&] { EXPECT_EQ(a->getMemoryInfo(1).second, kDeviceTotal); }, "getMemoryInfo(1)"},
      {[&] { a->copy_data(nullptr, nullptr, 32); }, "copy_data(32)"},
      {[&] { a->recordStream(c10::DataPtr(reinterpret_cast<void*>(0x800), c10::Device(c10::DeviceType::CUDA, 0)), stream); },
       "recordStream(2048,foreign,0)"},
  };
  for (Case& c : cases) {
    native_.calls.clear();
    c.call();
    ASSERT_FALSE(native_.calls.empty()) << "nothing forwarded for " << c.expected;
    EXPECT_EQ(native_.calls.back(), c.expected);
    ++pass;
  }
  EXPECT_EQ(a->name(), "dtr(native)");
  EXPECT_GE(pass, 40);
}

TEST_F(NativeTest, AllocationsGetSlotsAndFreeThroughTheNativeDeleter) {
  auto a = Make();
  c10::DataPtr p = a->allocate(1000);
  ASSERT_NE(p.get(), nullptr);
  EXPECT_EQ(p.get(), p.get_context());  // Note [CUDA slots]: raw_allocate/COW need data == context
  EXPECT_EQ(p.get_deleter(), &CudaDataDeleter);
  EXPECT_EQ(p.device(), c10::Device(c10::DeviceType::CUDA, 0));
  Slot* s = a->FindSlot(p.get());
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->bytes, 1000u);
  EXPECT_EQ(s->cuda_device, 0);
  EXPECT_EQ(native_.allocated, 1024u);
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p.get());
  p.clear();
  EXPECT_EQ(native_.Last(), absl::StrCat("free(", addr, ")"));
  EXPECT_EQ(native_.allocated, 0u);
  EXPECT_EQ(a->FindSlot(reinterpret_cast<void*>(addr)), nullptr);
  // Zero bytes: no pointer, no slot.
  c10::DataPtr z = a->allocate(0);
  EXPECT_EQ(z.get(), nullptr);
}

TEST_F(NativeTest, RecordStreamHandsTheNativeDataPtrToTheNativeAllocator) {
  auto a = Make();
  c10::DataPtr p = a->allocate(4096);
  auto stream = c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED,
                                      c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::CUDA, 0), 42));
  a->recordStream(p, stream);
  // torch's allocator ignores DataPtrs that are not its own: it must see its own one.
  EXPECT_EQ(native_.Last(), absl::StrCat("recordStream(", reinterpret_cast<uintptr_t>(p.get()), ",own,42)"));
}

TEST_F(NativeTest, BudgetBecomesTheMemoryFractionAndTheSmallerFractionWins) {
  auto a = Make(4 * kGiB);
  c10::DataPtr p = a->allocate(10);
  EXPECT_THAT(native_.calls, ::testing::Contains("setMemoryFraction(0.25,0)"));
  native_.calls.clear();
  a->setMemoryFraction(0.5, 0);  // user asks for more than the budget: the budget stays
  EXPECT_EQ(native_.Last(), "setMemoryFraction(0.25,0)");
  a->setMemoryFraction(0.1, 0);  // less: the user's wins
  EXPECT_EQ(native_.Last(), "setMemoryFraction(0.1,0)");
  EXPECT_THROW(a->setMemoryFraction(1.5, 0), c10::ValueError);
}

// Whether this process's settings already turn expandable segments on (the environment's, before
// torch 2.13): the tests that expect cudaMalloc segments then skip.
bool ExpandableSegmentsAlreadyOn() {
#if DTR_TORCH_AT_LEAST(2, 13)
  return c10::CachingAllocator::AcceleratorAllocatorConfig::use_expandable_segments();
#else
  for (const char* var : {"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"})
    if (const char* conf = std::getenv(var); conf != nullptr && std::string(conf).find("expandable_segments:True") != std::string::npos)
      return true;
  return false;
#endif
}

#define SKIP_IF_EXPANDABLE_SEGMENTS_ALREADY_ON() \
  if (ExpandableSegmentsAlreadyOn()) GTEST_SKIP() << "expandable segments are on in this process's environment"

#if DTR_TORCH_AT_LEAST(2, 13)
// Note [Expandable segments overshoot the fraction] (hooks/cuda_allocator.cc): expandable
// segments map whole large pages after checking the fraction, so the fraction, and the checks
// that decide when to evict, leave one page below the budget; cudaMalloc segments get the
// budget itself. The allocator settings are process-wide: each test restores them.
class ExpandableSegments {
 public:
  explicit ExpandableSegments(int page_mb) {
    c10::CachingAllocator::setAllocatorSettings(
        absl::StrCat("expandable_segments:True,large_segment_size_mb:", page_mb));
  }
  ~ExpandableSegments() { c10::CachingAllocator::setAllocatorSettings("expandable_segments:False,large_segment_size_mb:20"); }
};


// The real platform's settings round trip (Note [Expandable segments under a budget]): what it
// reads and applies are c10's own settings, and the user's other keys survive.
TEST(RealNativeSettings, TurningOnExpandableSegmentsKeepsTheOtherSettings) {
  SKIP_IF_EXPANDABLE_SEGMENTS_ALREADY_ON();
  namespace cac = c10::CachingAllocator;
  CudaPlatform p = MakeCudaPlatform();
  struct Restore {  // the settings are process-wide: the defaults again, even after a failure
    CudaPlatform& p;
    ~Restore() { p.set_native_settings("expandable_segments:False,large_segment_size_mb:20"); }
  } restore{p};
  EXPECT_FALSE(p.set_native_settings("max_split_size_mb:256"));  // the setter says they are off
  std::optional<std::string> on = SettingsWithExpandableSegments(p.native_settings());
  ASSERT_TRUE(on.has_value());
  EXPECT_TRUE(p.set_native_settings(*on));
  EXPECT_TRUE(cac::AcceleratorAllocatorConfig::use_expandable_segments());
  EXPECT_EQ(cac::AcceleratorAllocatorConfig::max_split_size(), 256 * kMiB);
  EXPECT_EQ(SettingsWithExpandableSegments(p.native_settings()), std::nullopt);  // now the settings say
}

TEST_F(NativeTest, ExpandableSegmentsLeaveOneLargePageBelowTheBudget) {
  SKIP_IF_EXPANDABLE_SEGMENTS_ALREADY_ON();
  {
    ExpandableSegments on(32);
    auto a = Make(4 * kGiB);
    c10::DataPtr p = a->allocate(10);
    const double expected = double(4 * kGiB - 32 * kMiB) / double(kDeviceTotal);
    EXPECT_THAT(native_.calls, ::testing::Contains(absl::StrCat("setMemoryFraction(", expected, ",0)")));
  }
  auto a = Make(4 * kGiB);  // without them: the budget itself
  c10::DataPtr p = a->allocate(10);
  EXPECT_EQ(native_.Last(), "allocate(10)");
  EXPECT_THAT(native_.calls, ::testing::Contains("setMemoryFraction(0.25,0)"));
}

TEST_F(NativeTest, UnderExpandableSegmentsEvictionMakesRoomBelowTheLastPage) {
  SKIP_IF_EXPANDABLE_SEGMENTS_ALREADY_ON();
  ExpandableSegments on(20);
  auto a = Make(64 * kMiB);
  native_.cap = 44 * kMiB;  // what the fraction allows: the budget less one 20 MiB page
  for (int i = 0; i < 40; ++i) evictor_.held.push_back(a->allocate(kMiB));
  // 40 + 8 fits the budget but not the fraction: evict first, not after a failed request.
  c10::DataPtr big = a->allocate(8 * kMiB);
  EXPECT_NE(big.get(), nullptr);
  EXPECT_EQ(std::count(native_.calls.begin(), native_.calls.end(), "allocate(8388608)"), 1);
  EXPECT_EQ(evictor_.held.size(), 36u);
}

TEST_F(NativeTest, ABudgetNotAboveOneExpandablePageIsRefused) {
  SKIP_IF_EXPANDABLE_SEGMENTS_ALREADY_ON();
  ExpandableSegments on(20);
  auto a = Make(16 * kMiB);
  EXPECT_THAT(OomMessage(a, 10), HasSubstr("leaves no room under PyTorch's expandable segments, which map memory "
                                           "in pages of 20.00 MiB"));
}
#endif

// Note [Expandable segments under a budget] (hooks/cuda_allocator.cc).
TEST(SettingsWithExpandableSegments, AddsThemAndKeepsTheUsersOtherSettings) {
  EXPECT_EQ(SettingsWithExpandableSegments(""), "expandable_segments:True");
  EXPECT_EQ(SettingsWithExpandableSegments("max_split_size_mb:128"), "max_split_size_mb:128,expandable_segments:True");
  EXPECT_EQ(SettingsWithExpandableSegments("roundup_power2_divisions:[256:1,>:4], "),
            "roundup_power2_divisions:[256:1,>:4],expandable_segments:True");
}

// PyTorch asserts that a re-applied backend names the installed allocator (dtr's adapter).
TEST(SettingsWithExpandableSegments, LeavesOutTheBackend) {
  EXPECT_EQ(SettingsWithExpandableSegments("backend:native,max_split_size_mb:128"),
            "max_split_size_mb:128,expandable_segments:True");
  EXPECT_EQ(SettingsWithExpandableSegments("roundup_power2_divisions:[256:1,>:4],backend:native"),
            "roundup_power2_divisions:[256:1,>:4],expandable_segments:True");
  EXPECT_EQ(SettingsWithExpandableSegments("backend:native"), "expandable_segments:True");
}

TEST(SettingsWithExpandableSegments, LeavesTheUsersChoiceAndTheAsyncBackendAlone) {
  EXPECT_EQ(SettingsWithExpandableSegments("expandable_segments:False"), std::nullopt);
  EXPECT_EQ(SettingsWithExpandableSegments("max_split_size_mb:64, expandable_segments : True"), std::nullopt);
  EXPECT_EQ(SettingsWithExpandableSegments("backend:cudaMallocAsync"), std::nullopt);
}

constexpr size_t kDefaultLargePage = 20 * kMiB;  // torch's large_segment_size unless configured

TEST_F(NativeTest, ABudgetTurnsOnExpandableSegmentsAndLeavesOnePageBelowIt) {
  SKIP_IF_EXPANDABLE_SEGMENTS_ALREADY_ON();
  cuda_.fake_settings = true;
  cuda_.settings = "max_split_size_mb:256";
  auto a = Make(4 * kGiB);
  c10::DataPtr p = a->allocate(10);
  c10::DataPtr q = a->allocate(20);
  EXPECT_EQ(std::count(cuda_.calls.begin(), cuda_.calls.end(),
                       "settings(max_split_size_mb:256,expandable_segments:True)"),
            1);
  EXPECT_TRUE(a->turned_on_expandable_segments());
  const double expected = double(4 * kGiB - kDefaultLargePage) / double(kDeviceTotal);
  EXPECT_THAT(native_.calls, ::testing::Contains(absl::StrCat("setMemoryFraction(", expected, ",0)")));
}

TEST_F(NativeTest, ExpandableSegmentsStayAsTheUserSetThem) {
  SKIP_IF_EXPANDABLE_SEGMENTS_ALREADY_ON();
  cuda_.fake_settings = true;
  cuda_.settings = "expandable_segments:False";
  auto a = Make(4 * kGiB);
  c10::DataPtr p = a->allocate(10);
  EXPECT_EQ(SettingsCalls(), 0);
  EXPECT_FALSE(a->turned_on_expandable_segments());
  EXPECT_THAT(native_.calls, ::testing::Contains("setMemoryFraction(0.25,0)"));  // the budget itself
}

TEST_F(NativeTest, ABudgetOfAFewPagesKeepsCudaMallocSegments) {
  SKIP_IF_EXPANDABLE_SEGMENTS_ALREADY_ON();
  cuda_.fake_settings = true;
  auto a = Make(64 * kMiB);  // under 8 pages of 20 MiB
  c10::DataPtr p = a->allocate(10);
  EXPECT_EQ(SettingsCalls(), 0);
  EXPECT_THAT(native_.calls, ::testing::Contains(absl::StrCat("setMemoryFraction(", double(64 * kMiB) / double(kDeviceTotal), ",0)")));
}

// Refused settings: a warning, cudaMalloc segments, and still a page of headroom (the refusal
// may have come after part of the settings took effect).
TEST_F(NativeTest, RefusedSettingsLeaveTheBudgetAHardCap) {
  cuda_.fake_settings = true;
  cuda_.settings_refused = true;
  auto a = Make(4 * kGiB);
  c10::DataPtr p = a->allocate(10);
  c10::DataPtr q = a->allocate(20);
  EXPECT_NE(p.get(), nullptr);
  EXPECT_EQ(SettingsCalls(), 1);  // tried once, not at every allocation
  EXPECT_FALSE(a->turned_on_expandable_segments());
  const double expected = double(4 * kGiB - kDefaultLargePage) / double(kDeviceTotal);
  EXPECT_THAT(native_.calls, ::testing::Contains(absl::StrCat("setMemoryFraction(", expected, ",0)")));
}

TEST_F(NativeTest, WithoutABudgetTheSettingsAreLeftAlone) {
  cuda_.fake_settings = true;
  auto a = Make();
  c10::DataPtr p = a->allocate(10);
  EXPECT_EQ(SettingsCalls(), 0);
  EXPECT_FALSE(a->turned_on_expandable_segments());
}

TEST_F(NativeTest, FractionalBudget) {
  auto a = Make(0, 0.6);
  c10::DataPtr p = a->allocate(10);
  EXPECT_THAT(native_.calls, ::testing::Contains("setMemoryFraction(0.6,0)"));
  EXPECT_EQ(a->BudgetOn(0), size_t(0.6 * double(kDeviceTotal)));
}

TEST_F(NativeTest, BudgetLargerThanTheDeviceIsAClearError) {
  auto a = Make(32 * kGiB);
  try {
    a->allocate(10);
    FAIL() << "no error";
  } catch (const c10::ValueError& e) {
    EXPECT_THAT(e.what(), HasSubstr("larger than cuda:0's 16.00 GiB"));
  }
}

TEST_F(NativeTest, EvictsBeforeARequestThatCannotFit) {
  auto a = Make(8 * kMiB);
  native_.cap = 8 * kMiB;
  for (int i = 0; i < 6; ++i) evictor_.held.push_back(a->allocate(kMiB));
  c10::DataPtr big = a->allocate(4 * kMiB);  // 6 + 4 > 8: two tensors must go first
  EXPECT_NE(big.get(), nullptr);
  EXPECT_EQ(evictor_.native_calls, 1);
  EXPECT_EQ(evictor_.held.size(), 4u);
  // Evicted before asking: the native allocator was asked once, and did not fail.
  EXPECT_EQ(std::count(native_.calls.begin(), native_.calls.end(), "allocate(4194304)"), 1);
}

TEST_F(NativeTest, EvictsAndRetriesWhenTheNativeAllocatorStillFails) {
  auto a = Make(8 * kMiB);
  native_.cap = 8 * kMiB;
  for (int i = 0; i < 4; ++i) evictor_.held.push_back(a->allocate(kMiB));
  native_.fail_next = 1;  // fits on paper, fails in the allocator (fragmentation)
  c10::DataPtr p = a->allocate(2 * kMiB);
  EXPECT_NE(p.get(), nullptr);
  EXPECT_EQ(evictor_.native_calls, 1);
  EXPECT_EQ(evictor_.held.size(), 2u);  // at least one request's worth was evicted
}

TEST_F(NativeTest, OutOfMemoryWhenNothingIsEvictable) {
  auto a = Make(8 * kMiB);
  native_.cap = 8 * kMiB;
  c10::DataPtr keep = a->allocate(6 * kMiB);  // not held by the evictor: pinned
  std::string message = OomMessage(a, 4 * kMiB);
  EXPECT_THAT(message, HasSubstr("dtr: CUDA out of memory on cuda:0 under DTR_BUDGET=8.00 MiB"));
  EXPECT_THAT(message, HasSubstr("even after evicting every evictable tensor"));
  EXPECT_THAT(message, HasSubstr("fake breakdown"));
  EXPECT_THAT(message, HasSubstr("CUDA out of memory (fake)"));
}

// Note [Why nothing was evicted]: an error after which evictable tensors are still there says
// why dtr evicted none of them, instead of claiming it evicted everything.
TEST_F(NativeTest, OutOfMemoryWithoutEvictingSaysWhy) {
  auto a = Make(8 * kMiB);
  native_.cap = 8 * kMiB;
  for (int i = 0; i < 6; ++i) evictor_.held.push_back(a->allocate(kMiB));
  evictor_.refuse = "dtr is paused (fake)";
  std::string message = OomMessage(a, 4 * kMiB);
  EXPECT_THAT(message, HasSubstr("cannot allocate 4.00 MiB (4194304 bytes); dtr evicted nothing for it: "
                                  "dtr is paused (fake)."));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("even after evicting")));
  EXPECT_EQ(evictor_.held.size(), 6u);
  evictor_.unevictable = 5 * kMiB;  // the request can never fit: not even tried
  message = OomMessage(a, 4 * kMiB);
  EXPECT_THAT(message, HasSubstr("dtr evicted nothing for it: the request does not fit beside the bytes no "
                                  "eviction can free."));
}

TEST_F(NativeTest, AStopAfterSomeEvictionsSaysHowMuchWasFreed) {
  auto a = Make(8 * kMiB);
  native_.cap = 8 * kMiB;
  for (int i = 0; i < 6; ++i) evictor_.held.push_back(a->allocate(kMiB));
  native_.fail_next = 1;  // the first try fails after the evictions (fragmentation)
  evictor_.refuse_after_calls = 1;  // then the engine stops: say, another thread paused dtr
  evictor_.refuse = "dtr is paused (fake)";
  std::string message = OomMessage(a, 4 * kMiB);
  EXPECT_THAT(message, HasSubstr("dtr evicted 2 B for it, then stopped: dtr is paused (fake)."));
}

TEST_F(NativeTest, OutOfMemoryWithEvictionOffSaysSo) {
  CudaAllocatorAdapter::Options o = Opts(CudaBackendKind::kNative, 8 * kMiB);
  o.evict = false;
  auto a = Keep(std::make_unique<CudaAllocatorAdapter>(o, cuda_.Platform(), &native_));
  native_.cap = 8 * kMiB;
  c10::DataPtr keep = a->allocate(6 * kMiB);
  std::string message = OomMessage(a, 4 * kMiB);
  EXPECT_THAT(message, HasSubstr("dtr evicted nothing for it: eviction is off (DTR_EVICT=0)."));
  EXPECT_EQ(evictor_.native_calls, 0);
}

// Note [Recovered out-of-memory errors]: cuDNN catches the error for a plan's workspace and runs
// another plan. The next allocation on that thread shows the error was caught: it is counted,
// once per error.
TEST_F(NativeTest, CountsOutOfMemoryErrorsTheCallerRecoveredFrom) {
  auto a = Make(8 * kMiB);
  native_.cap = 8 * kMiB;
  c10::DataPtr keep = a->allocate(6 * kMiB);
  EXPECT_THROW(a->allocate(4 * kMiB), c10::OutOfMemoryError);
  EXPECT_EQ(a->recovered_ooms(), 0);
  c10::DataPtr smaller = a->allocate(kMiB);  // the caller's fallback
  EXPECT_EQ(a->recovered_ooms(), 1);
  c10::DataPtr more = a->allocate(kMiB / 2);
  EXPECT_EQ(a->recovered_ooms(), 1);
  // Another thread's allocations do not count this thread's errors.
  EXPECT_THROW(a->allocate(4 * kMiB), c10::OutOfMemoryError);
  std::thread([&] { c10::DataPtr other = a->allocate(kMiB / 4); }).join();
  EXPECT_EQ(a->recovered_ooms(), 1);
}

TEST_F(NativeTest, ARequestThatCannotFitBesideUnevictableMemoryFailsWithoutEvicting) {
  auto a = Make(8 * kMiB);
  native_.cap = 8 * kMiB;
  for (int i = 0; i < 6; ++i) evictor_.held.push_back(a->allocate(kMiB));
  evictor_.unevictable = 5 * kMiB;  // say five of them are pinned
  EXPECT_THROW(a->allocate(4 * kMiB), c10::OutOfMemoryError);
  EXPECT_EQ(evictor_.native_calls, 0);
  EXPECT_EQ(evictor_.held.size(), 6u);  // nothing was evicted for a request that could never fit
}

TEST_F(NativeTest, UsesOnOtherStreamsAreRecordedOncePerStream) {
  auto a = Make();
  c10::DataPtr p = a->allocate(4096);  // on stream 0
  Slot* s = a->FindSlot(p.get());
  a->NoteUse(s, FakeStream(0));  // the allocation stream: nothing to record
  EXPECT_EQ(native_.Last(), "allocate(4096)");
  a->NoteUse(s, FakeStream(5));
  a->NoteUse(s, FakeStream(5));
  int records = 0;
  for (const std::string& c : native_.calls) records += c.rfind("recordStream(", 0) == 0;
  EXPECT_EQ(records, 1);
  EXPECT_THAT(native_.Last(), HasSubstr(",own,"));  // torch's own DataPtr, so it is not ignored
}

TEST_F(NativeTest, RawDeleteOfAnAllocatedPointerFreesItsSlotOnce) {
  auto a = Make();
  c10::DataPtr p = a->allocate(4096);
  void* ptr = p.release_context();  // what torch's cudagraph trees do before raw_delete
  const size_t frees_before = native_.allocated;
  a->raw_delete(ptr);
  EXPECT_EQ(native_.allocated, frees_before - 4096);
  EXPECT_EQ(a->FindSlot(ptr), nullptr);
}

TEST_F(NativeTest, CacheInfoNeverReportsMoreThanTheBudgetLeaves) {
  auto a = Make(8 * kMiB);
  native_.largest_block = kGiB;  // the native answer includes free device memory
  c10::DataPtr p = a->allocate(2 * kMiB);
  size_t largest = 0;
  a->cacheInfo(0, &largest);
  EXPECT_EQ(largest, 6 * kMiB);
}

TEST_F(NativeTest, RefusesABudgetWhenTorchsCachingIsDisabled) {
  native_.enabled = false;
  auto a = Make(8 * kMiB);
  try {
    a->allocate(10);
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("PYTORCH_NO_CUDA_MEMORY_CACHING"));
  }
  auto unbudgeted = Make();
  EXPECT_NE(unbudgeted->allocate(10).get(), nullptr);  // without a budget it simply runs
}

TEST_F(NativeTest, LiftingTheBudgetResetsTheFraction) {
  auto a = Make(4 * kGiB);
  c10::DataPtr p = a->allocate(10);
  EXPECT_EQ(native_.Last().rfind("allocate", 0), 0u);
  ASSERT_TRUE(a->SetBudgetBytes(2 * kGiB).ok());
  EXPECT_EQ(native_.Last(), "setMemoryFraction(0.125,0)");
  ASSERT_TRUE(a->SetBudgetBytes(0).ok());
  EXPECT_EQ(native_.Last(), "setMemoryFraction(1,0)");
  EXPECT_FALSE(a->SetBudgetBytes(int64_t(64 * kGiB)).ok());  // larger than the device: refused,
  EXPECT_EQ(a->BudgetOn(0), SIZE_MAX);                        // and nothing changed
}

#if DTR_CUDA_ALLOC_HAS_MARK_CAPTURE
TEST_F(NativeTest, CountsCapturesUnderway) {
  auto a = Make();
  a->markCaptureBegin(0);
  EXPECT_EQ(a->captures_underway(), 1);
  a->markCaptureEnd(0);
  EXPECT_EQ(a->captures_underway(), 0);
}
#endif

// ---------------------------------------------------------------------------------------------
// dtr backend

class DtrTest : public NativeTest {
 protected:
  CudaAllocatorAdapter* MakeDtr(size_t budget = 0) {
    return Keep(std::make_unique<CudaAllocatorAdapter>(Opts(CudaBackendKind::kDtr, budget), cuda_.Platform(), nullptr));
  }
  static size_t Agg(const c10::CachingAllocator::StatArray& s) { return size_t(s[0].current); }
};

TEST_F(DtrTest, StatsMatchTheSnapshotOnEveryDevice) {
  auto a = MakeDtr();
  std::vector<c10::DataPtr> ptrs;
  for (int d = 0; d < 2; ++d) {
    cuda_.device = c10::DeviceIndex(d);
    for (size_t n : {size_t{100}, size_t{5000}, 3 * kMiB, 12 * kMiB}) ptrs.push_back(a->allocate(n));
  }
  ptrs.erase(ptrs.begin() + 1);
  const cca::SnapshotInfo snap = a->snapshot();
  for (int d = 0; d < 2; ++d) {
    const auto st = a->getDeviceStats(c10::DeviceIndex(d));
    size_t reserved = 0, allocated = 0;
    for (const auto& seg : snap.segments)
      if (seg.device == d) {
        reserved += seg.total_size;
        allocated += seg.allocated_size;
        size_t tiled = 0;
        for (const auto& b : seg.blocks) tiled += b.size;
        EXPECT_EQ(tiled, seg.total_size);
      }
    EXPECT_EQ(Agg(st.reserved_bytes), reserved);
    EXPECT_EQ(Agg(st.allocated_bytes), allocated);
    EXPECT_GT(allocated, 15 * kMiB);
    ASSERT_NE(a->DtrAllocatorOf(c10::DeviceIndex(d)), nullptr);
    EXPECT_TRUE(a->DtrAllocatorOf(c10::DeviceIndex(d))->CheckInvariants().ok());
  }
  ptrs.clear();
  a->emptyCache();
  EXPECT_EQ(Agg(a->getDeviceStats(0).reserved_bytes), 0u);
  EXPECT_EQ(cuda_.backends.size(), 2u);
  EXPECT_EQ(cuda_.backends[0]->counters().live_bytes, 0u);
}

TEST_F(DtrTest, ABlockUsedOnAnotherStreamIsNotReusedBeforeItsEvent) {
  auto a = MakeDtr();
  cuda_.stream[0] = FakeStream(1);
  c10::DataPtr p = a->allocate(kMiB);
  void* addr = p.get();
  auto side = c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED,
                                    c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::CUDA, 0), 2));
  a->recordStream(p, side);
  p.clear();
  c10::DataPtr q = a->allocate(kMiB);
  EXPECT_NE(q.get(), addr);  // the side stream may still read it
  q.clear();
  cuda_.backends[0]->CompleteAllEvents();
  c10::DataPtr r = a->allocate(kMiB);
  EXPECT_EQ(r.get(), addr);
}

TEST_F(DtrTest, EvictsThroughItsRetryLadderUnderTheBudget) {
  auto a = MakeDtr(40 * kMiB);
  for (int i = 0; i < 3; ++i) evictor_.held.push_back(a->allocate(12 * kMiB));
  c10::DataPtr p = a->allocate(12 * kMiB);
  EXPECT_NE(p.get(), nullptr);
  EXPECT_GE(evictor_.handler_calls, 1);
  EXPECT_LE(Agg(a->getDeviceStats(0).reserved_bytes), 40 * kMiB);
  EXPECT_LE(size_t(a->getDeviceStats(0).reserved_bytes[0].peak), 40 * kMiB);
}

TEST_F(DtrTest, OutOfMemoryCallsObserversAndNamesTheBudget) {
  auto a = MakeDtr(16 * kMiB);
  int observed = 0;
  a->attachOutOfMemoryObserver([&](int64_t dev, size_t, size_t total, size_t) {
    ++observed;
    EXPECT_EQ(total, kDeviceTotal);
  });
  c10::DataPtr keep = a->allocate(12 * kMiB);
  EXPECT_THROW(
      {
        try {
          a->allocate(12 * kMiB);
        } catch (const c10::OutOfMemoryError& e) {
          EXPECT_THAT(e.what(), HasSubstr("under DTR_BUDGET=16.00 MiB"));
          throw;
        }
      },
      c10::OutOfMemoryError);
  EXPECT_EQ(observed, 1);
  EXPECT_EQ(a->getDeviceStats(0).num_ooms, 1);
}

TEST_F(DtrTest, UserFractionLowersTheBudget) {
  auto a = MakeDtr();
  a->setMemoryFraction(0.001, 0);  // ~16.8 MB
  EXPECT_EQ(a->DtrAllocatorOf(0)->budget(), size_t(0.001 * double(kDeviceTotal)));
  EXPECT_THROW(a->allocate(20 * kMiB), c10::OutOfMemoryError);
  EXPECT_EQ(a->getMemoryFraction(0), 0.001);
}

TEST_F(DtrTest, ImplementedMethods) {
  auto a = MakeDtr();
  c10::DataPtr p = a->allocate(3 * kMiB);
  size_t size = 0;
  void* base = a->getBaseAllocation(p.get(), &size);
  EXPECT_EQ(base, p.get());
  EXPECT_GE(size, 3 * kMiB);
  c10::DataPtr q = a->allocate(kMiB);
  q.clear();
  size_t largest = 0;
  a->cacheInfo(0, &largest);
  EXPECT_GE(largest, kMiB);
  a->enablePeerAccess(0, 1);
  a->memcpyAsync(nullptr, 0, nullptr, 1, 8, FakeStream(0), false);
  a->copy_data(nullptr, nullptr, 16);
  EXPECT_EQ(cuda_.calls, (std::vector<std::string>{"peer(0,1)", "memcpy(0,1,8,0)", "copy(16)"}));
  void* raw = a->raw_alloc_with_stream(1000, FakeStream(0));
  EXPECT_NE(raw, nullptr);
  a->raw_delete(raw);
  EXPECT_THROW(a->raw_delete(reinterpret_cast<void*>(0x10)), c10::Error);
  a->resetPeakStats(0);
  EXPECT_EQ(size_t(a->getDeviceStats(0).allocated_bytes[0].peak), size_t(a->getDeviceStats(0).allocated_bytes[0].current));
  EXPECT_FALSE(a->isHistoryEnabled());
  EXPECT_TRUE(a->isEnabled());
  EXPECT_TRUE(a->getExpandableSegmentSizes(0).empty());
  EXPECT_EQ(a->name(), "dtr");
  a->recordHistory(false, nullptr, 0, cca::RecordContext::NEVER, false, {});  // turning it off is fine
}

TEST_F(DtrTest, RefusesWhatItDoesNotImplementNamingTheNativeBackend) {
  auto a = MakeDtr();
  const c10::MempoolId_t pool{1, 2};
  std::vector<std::function<void()>> refused = {
      [&] { a->beginAllocateToPool(0, pool, [](cudaStream_t) { return true; }); },
      [&] { a->endAllocateToPool(0, pool); },
#if DTR_CUDA_ALLOC_HAS_MARK_CAPTURE
      [&] { a->markCaptureBegin(0); },
      [&] { a->markCaptureEnd(0); },
#endif
      [&] { a->releasePool(0, pool); },
      [&] { a->getPoolUseCount(0, pool); },
      [&] { a->createOrIncrefPool(0, pool, nullptr); },
      [&] { a->setUseOnOOM(0, pool, true); },
      [&] { a->setNoSplit(0, pool); },
      [&] { a->checkPoolLiveAllocations(0, pool, {}); },
      [&] { a->shareIpcHandle(nullptr); },
      [&] { a->getIpcDevPtr("x"); },
      [&] { a->recordHistory(true, nullptr, 10, cca::RecordContext::ALL, false, {}); },
      [&] { a->attachAllocatorTraceTracker([](const c10::CachingDeviceAllocator::TraceEntry&) {}); },
      [&] { a->getCheckpointState(0, pool); },
      [&] { a->setCheckpointPoolState(0, nullptr); },
#if DTR_CUDA_ALLOC_HAS_ALLOCATE_WITH_ADDRESS
      [&] { a->allocateWithAddress(8, nullptr); },
#endif
      [&] { a->emptyCache(pool); },
      [&] { a->enable(false); },
  };
  for (size_t i = 0; i < refused.size(); ++i) {
    try {
      refused[i]();
      ADD_FAILURE() << "case " << i << " was not refused";
    } catch (const c10::NotImplementedError& e) {
      EXPECT_THAT(e.what(), HasSubstr("DTR_CUDA_ALLOCATOR=native")) << i;
    }
  }
}

// Random allocations, frees, stream uses, stream switches, evictions and cache flushes on two
// devices; every allocator's invariants and the stats/snapshot agreement hold throughout.
TEST_F(DtrTest, Fuzz) {
  for (int seed = 0; seed < 20; ++seed) {
    std::mt19937 rng(seed);
    cuda_.backends.clear();
    auto a = MakeDtr(64 * kMiB);
    std::vector<c10::DataPtr> live;
    for (int step = 0; step < 400; ++step) {
      const int op = int(rng() % 10);
      cuda_.device = c10::DeviceIndex(rng() % 2);
      cuda_.stream[cuda_.device] = FakeStream(rng() % 3);
      if (op < 4) {
        const size_t n = (rng() % 4 == 0) ? (1 + rng() % (12 * kMiB)) : (1 + rng() % 200000);
        try {
          c10::DataPtr p = a->allocate(n);
          if (rng() % 2) evictor_.held.push_back(std::move(p));
          else live.push_back(std::move(p));
        } catch (const c10::OutOfMemoryError&) {
        }
      } else if (op < 6 && !live.empty()) {
        live.erase(live.begin() + long(rng() % live.size()));
      } else if (op == 6 && !live.empty()) {
        const c10::DataPtr& p = live[rng() % live.size()];
        a->recordStream(p, c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED,
                                                 c10::Stream(c10::Stream::UNSAFE, p.device(), c10::StreamId(rng() % 3))));
      } else if (op == 7) {
        for (alloc::FakeBackend* b : cuda_.backends) b->CompleteAllEvents();
      } else if (op == 8) {
        a->emptyCache();
      } else if (!evictor_.held.empty()) {
        evictor_.held.erase(evictor_.held.begin());
      }
      for (int d = 0; d < 2; ++d)
        if (alloc::CachingAllocator* ca = a->DtrAllocatorOf(c10::DeviceIndex(d))) {
          ASSERT_TRUE(ca->CheckInvariants().ok()) << ca->CheckInvariants() << " seed " << seed << " step " << step;
          ASSERT_LE(size_t(ca->GetStats().reserved_bytes.peak), 64 * kMiB);
        }
    }
    live.clear();
    evictor_.held.clear();
  }
}

}  // namespace
}  // namespace dtr::hooks

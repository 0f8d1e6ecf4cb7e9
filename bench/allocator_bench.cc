// Google Benchmarks for the caching allocator: allocate/free round trips replaying a fixed-seed
// trace of realistic tensor sizes (512 B .. 64 MiB) and lifetimes, on the host backend versus
// glibc malloc/free in the same run (ratios printed at the end), the same for a trace of small
// tensors (512 B .. 64 KiB: a TreeLSTM's or an LSTM's) under dtr's CPU configuration (a segment
// per tensor), the fragmentation figure (peak reserved / peak allocated) of both traces, and bytes
// evicted beyond the request by the two eviction strategies on a fragmented heap.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <queue>
#include <random>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/eviction_strategy.h"
#include "allocator/fake_backend.h"
#include "allocator/host_backend.h"
#include "tests/allocator/fragmented_heap_eviction.h"

namespace dtr::alloc {
namespace {

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;

struct TraceOp {
  bool allocate;
  uint32_t id;
  size_t size;
};

enum class TraceKind { kMixed, kSmallTensors };

// A training-step-like trace: mostly short-lived activations and temporaries, some long-lived
// parameters/optimizer state, sizes log-uniform within buckets weighted towards small tensors
// (kMixed), or all of them 512 B .. 64 KiB (kSmallTensors).
std::vector<TraceOp> MakeTrace(uint64_t seed, int allocations, TraceKind kind) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto log_uniform = [&](double lo, double hi) {
    return static_cast<size_t>(std::exp(std::log(lo) + unit(rng) * (std::log(hi) - std::log(lo))));
  };
  std::vector<TraceOp> trace;
  using Death = std::pair<int, uint32_t>;  // (death step, id)
  std::priority_queue<Death, std::vector<Death>, std::greater<Death>> deaths;
  std::vector<size_t> sizes;
  for (int step = 0; step < allocations; ++step) {
    while (!deaths.empty() && deaths.top().first <= step) {
      trace.push_back({false, deaths.top().second, sizes[deaths.top().second]});
      deaths.pop();
    }
    const double bucket = unit(rng);
    size_t size;
    if (kind == TraceKind::kSmallTensors) {
      size = log_uniform(512, 64 * kKiB);
    } else if (bucket < 0.50) {
      size = log_uniform(512, 64 * kKiB);
    } else if (bucket < 0.85) {
      size = log_uniform(64 * kKiB, 4 * kMiB);
    } else if (bucket < 0.98) {
      size = log_uniform(4 * kMiB, 32 * kMiB);
    } else {
      size = log_uniform(32 * kMiB, 64 * kMiB);
    }
    const bool long_lived = unit(rng) < 0.05;
    const int lifetime = long_lived ? 500 + int(rng() % 2000)
                                    : 1 + int(-std::log(1.0 - unit(rng)) * 12.0);
    const auto id = static_cast<uint32_t>(sizes.size());
    sizes.push_back(size);
    trace.push_back({true, id, size});
    deaths.push({step + lifetime, id});
  }
  while (!deaths.empty()) {
    trace.push_back({false, deaths.top().second, sizes[deaths.top().second]});
    deaths.pop();
  }
  return trace;
}

const std::vector<TraceOp>& Trace(TraceKind kind = TraceKind::kMixed) {
  static const std::vector<TraceOp>* mixed = new std::vector<TraceOp>(MakeTrace(42, 20000, TraceKind::kMixed));
  static const std::vector<TraceOp>* small =
      new std::vector<TraceOp>(MakeTrace(42, 20000, TraceKind::kSmallTensors));
  return kind == TraceKind::kMixed ? *mixed : *small;
}

size_t NumIds(TraceKind kind = TraceKind::kMixed) {
  size_t ids = 0;
  for (const TraceOp& op : Trace(kind)) ids = std::max<size_t>(ids, op.id + 1);
  return ids;
}

void ReplayCaching(CachingAllocator& allocator, std::vector<void*>& slots, TraceKind kind = TraceKind::kMixed) {
  for (const TraceOp& op : Trace(kind)) {
    if (op.allocate) {
      absl::StatusOr<void*> p = allocator.Allocate(op.size);
      if (!p.ok()) std::abort();
      slots[op.id] = *p;
    } else if (!allocator.Free(slots[op.id]).ok()) {
      std::abort();
    }
  }
}

void ReplayMalloc(std::vector<void*>& slots, TraceKind kind = TraceKind::kMixed) {
  for (const TraceOp& op : Trace(kind)) {
    if (op.allocate) {
      slots[op.id] = std::malloc(op.size);
      benchmark::DoNotOptimize(slots[op.id]);
    } else {
      std::free(slots[op.id]);
    }
  }
}

std::unique_ptr<CachingAllocator> MakeHostAllocator(HostBackend& backend) {
  return std::move(*CachingAllocator::Create(AllocatorConfig{}, &backend));
}

void BM_RoundTrip_CachingAllocatorHost(benchmark::State& state) {
  HostBackend backend;
  auto allocator = MakeHostAllocator(backend);
  std::vector<void*> slots(NumIds());
  ReplayCaching(*allocator, slots);  // warm the cache: steady state of a training loop
  for (auto _ : state) ReplayCaching(*allocator, slots);
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(Trace().size()));
  state.counters["ns_per_op"] = benchmark::Counter(
      double(state.iterations()) * double(Trace().size()),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_RoundTrip_CachingAllocatorHost)->Unit(benchmark::kMillisecond);

void BM_RoundTrip_GlibcMalloc(benchmark::State& state) {
  std::vector<void*> slots(NumIds());
  ReplayMalloc(slots);
  for (auto _ : state) ReplayMalloc(slots);
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(Trace().size()));
  state.counters["ns_per_op"] = benchmark::Counter(
      double(state.iterations()) * double(Trace().size()),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_RoundTrip_GlibcMalloc)->Unit(benchmark::kMillisecond);

void BM_RoundTrip_SmallTensorsSegmentPerTensor(benchmark::State& state) {
  HostBackend backend(kHostBlockBytes);
  auto allocator = std::move(*CachingAllocator::Create(AllocatorConfig::SegmentPerBlock(kHostBlockBytes), &backend));
  std::vector<void*> slots(NumIds(TraceKind::kSmallTensors));
  ReplayCaching(*allocator, slots, TraceKind::kSmallTensors);
  for (auto _ : state) ReplayCaching(*allocator, slots, TraceKind::kSmallTensors);
  state.counters["ns_per_op"] = benchmark::Counter(
      double(state.iterations()) * double(Trace(TraceKind::kSmallTensors).size()),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_RoundTrip_SmallTensorsSegmentPerTensor)->Unit(benchmark::kMillisecond);

// Side-by-side timing in one process, alternating, for the printed ratio.
void PrintRoundTripRatio(TraceKind kind, const AllocatorConfig& config, const char* what) {
  HostBackend backend;
  auto allocator = std::move(*CachingAllocator::Create(config, &backend));
  std::vector<void*> slots(NumIds(kind));
  ReplayCaching(*allocator, slots, kind);
  ReplayMalloc(slots, kind);
  double caching_s = 0, malloc_s = 0;
  using Clock = std::chrono::steady_clock;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    ReplayCaching(*allocator, slots, kind);
    auto t1 = Clock::now();
    ReplayMalloc(slots, kind);
    auto t2 = Clock::now();
    caching_s += std::chrono::duration<double>(t1 - t0).count();
    malloc_s += std::chrono::duration<double>(t2 - t1).count();
  }
  const double ops = 5.0 * double(Trace(kind).size());
  std::printf("round trip, %s (%zu ops/replay): caching allocator (host) %.1f ns/op, glibc malloc/free "
              "%.1f ns/op, ratio caching/malloc = %.2f\n",
              what, Trace(kind).size(), caching_s / ops * 1e9, malloc_s / ops * 1e9, caching_s / malloc_s);
}

void PrintFragmentation(TraceKind kind, const AllocatorConfig& config, const char* what) {
  FakeBackend backend;
  auto allocator = std::move(*CachingAllocator::Create(config, &backend));
  std::vector<void*> slots(NumIds(kind));
  ReplayCaching(*allocator, slots, kind);
  const AllocatorStats stats = allocator->GetStats();
  std::printf("fragmentation, %s: peak reserved %.1f MiB / peak allocated %.1f "
              "MiB = %.3f (peak requested %.1f MiB, rounding overhead %.3f)\n",
              what,
              stats.reserved_bytes.peak / double(kMiB), stats.allocated_bytes.peak / double(kMiB),
              double(stats.reserved_bytes.peak) / double(stats.allocated_bytes.peak),
              stats.requested_bytes.peak / double(kMiB),
              double(stats.allocated_bytes.peak) / double(stats.requested_bytes.peak));
}

// Same scenario as tests/allocator/eviction_strategy_test.cc: a 400 MiB budget filled with
// 1-4.5 MiB blocks, 40% freed at random, then 6 MiB requests with randomly scored victims.
void PrintEvictionComparison() {
  testing::EvictionMeasurement simple, aware;
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    simple += testing::MeasureOnFragmentedHeap(std::make_unique<ScoreOrderEvictionStrategy>(), seed);
    aware += testing::MeasureOnFragmentedHeap(std::make_unique<FragmentationAwareEvictionStrategy>(), seed);
  }
  std::printf("%s\n%s\n", simple.ToString("score-order").c_str(), aware.ToString("fragmentation-aware").c_str());
}

}  // namespace
}  // namespace dtr::alloc

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  using dtr::alloc::TraceKind;
  const char* mixed = "mixed trace, default config";
  const char* small = "small tensors, a segment per tensor (dtr's CPU config)";
  dtr::alloc::PrintRoundTripRatio(TraceKind::kMixed, dtr::alloc::AllocatorConfig{}, mixed);
  dtr::alloc::PrintRoundTripRatio(TraceKind::kSmallTensors, dtr::alloc::AllocatorConfig::SegmentPerBlock(dtr::alloc::kHostBlockBytes), small);
  dtr::alloc::PrintFragmentation(TraceKind::kMixed, dtr::alloc::AllocatorConfig{}, mixed);
  dtr::alloc::PrintFragmentation(TraceKind::kSmallTensors, dtr::alloc::AllocatorConfig::SegmentPerBlock(dtr::alloc::kHostBlockBytes), small);
  dtr::alloc::PrintEvictionComparison();
  return 0;
}

// The fragmented-heap eviction measurement shared by eviction_strategy_test and
// bench/allocator_bench: fills a 400 MiB budget with 1-4 MiB blocks, frees 40% at random
// (fragmenting the segments), then issues forty 6 MiB requests that must evict; victims have
// random scores (heuristics do not know the layout). Same seed, same heap for every strategy.
// No GoogleTest here: the benchmark links it too.
#ifndef DTR_TESTS_ALLOCATOR_FRAGMENTED_HEAP_EVICTION_H_
#define DTR_TESTS_ALLOCATOR_FRAGMENTED_HEAP_EVICTION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "allocator/eviction_strategy.h"

namespace dtr::alloc::testing {

struct EvictionMeasurement {
  size_t requests = 0;         // requests that needed eviction
  size_t requested_bytes = 0;  // their sizes
  size_t evicted_bytes = 0;
  size_t beyond_request = 0;   // sum over requests of max(0, evicted - requested)
  size_t evicted_blocks = 0;
  size_t failures = 0;         // requests that could not be served
  size_t errors = 0;           // failed frees or invariant checks (must stay 0)

  EvictionMeasurement& operator+=(const EvictionMeasurement& other);
  // One line: requests, requested and evicted MiB, their ratio, blocks, bytes beyond request.
  std::string ToString(const std::string& name) const;
};

EvictionMeasurement MeasureOnFragmentedHeap(std::unique_ptr<EvictionStrategy> strategy, uint64_t seed);

}  // namespace dtr::alloc::testing

#endif  // DTR_TESTS_ALLOCATOR_FRAGMENTED_HEAP_EVICTION_H_

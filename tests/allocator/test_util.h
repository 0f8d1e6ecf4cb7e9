// Shared helpers for the allocator tests: status assertions and allocator construction.
#ifndef DTR_TESTS_ALLOCATOR_TEST_UTIL_H_
#define DTR_TESTS_ALLOCATOR_TEST_UTIL_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/caching_allocator.h"
#include "gtest/gtest.h"

#define DTR_ASSERT_OK(expr)                                   \
  do {                                                        \
    const absl::Status dtr_status_ = (expr);                  \
    ASSERT_TRUE(dtr_status_.ok()) << dtr_status_.ToString();  \
  } while (0)
#define DTR_EXPECT_OK(expr)                                   \
  do {                                                        \
    const absl::Status dtr_status_ = (expr);                  \
    EXPECT_TRUE(dtr_status_.ok()) << dtr_status_.ToString();  \
  } while (0)

namespace dtr::alloc::testing {

inline constexpr size_t kKiB = size_t{1} << 10;
inline constexpr size_t kMiB = size_t{1} << 20;

inline std::unique_ptr<CachingAllocator> MakeAllocator(const AllocatorConfig& config,
                                                       DeviceMemoryBackend* backend) {
  absl::StatusOr<std::unique_ptr<CachingAllocator>> allocator =
      CachingAllocator::Create(config, backend);
  EXPECT_TRUE(allocator.ok()) << allocator.status();
  return allocator.ok() ? std::move(*allocator) : nullptr;
}

inline AllocatorConfig BudgetConfig(size_t budget) {
  AllocatorConfig config;
  config.budget_bytes = budget;
  return config;
}

inline uintptr_t Addr(void* p) { return reinterpret_cast<uintptr_t>(p); }

}  // namespace dtr::alloc::testing

#endif  // DTR_TESTS_ALLOCATOR_TEST_UTIL_H_

// Tests for the host-RAM backend.
#include "allocator/host_backend.h"

#include <cstring>

#include "gtest/gtest.h"

namespace dtr::alloc {
namespace {

TEST(HostBackendTest, AllocatesAlignedWritableMemory) {
  HostBackend backend(4096);
  absl::StatusOr<void*> p = backend.Allocate(3 * 4096 + 1);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 4096, 0u);
  std::memset(*p, 0xab, 3 * 4096 + 1);
  EXPECT_EQ(static_cast<unsigned char*>(*p)[3 * 4096], 0xab);
  EXPECT_EQ(backend.live_bytes(), 3u * 4096 + 1);
  backend.Free(*p, 3 * 4096 + 1);
  EXPECT_EQ(backend.live_bytes(), 0u);
}

TEST(HostBackendTest, EventsAreImmediatelyComplete) {
  HostBackend backend;
  absl::StatusOr<EventHandle> e = backend.RecordEvent(Stream{7});
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(backend.EventDone(*e));
  backend.DestroyEvent(*e);
  EXPECT_EQ(backend.Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dtr::alloc

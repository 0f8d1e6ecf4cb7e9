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

// Note [Recycling a cached segment]: a mapped segment resizes in place of a free and an allocate;
// what it already had stays (a shrink keeps its head), and memory from malloc is not resized.
TEST(HostBackendTest, ResizesMappedSegments) {
  HostBackend backend(64);
  const size_t large = 1 << 20, smaller = 256 << 10, larger = 3 << 20;
  absl::StatusOr<void*> p = backend.Allocate(large);
  ASSERT_TRUE(p.ok()) << p.status();
  std::memset(*p, 0x5a, large);
  absl::StatusOr<void*> shrunk = backend.Resize(*p, large, smaller);
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  EXPECT_EQ(*shrunk, *p);  // a shrink stays where it was
  EXPECT_EQ(static_cast<unsigned char*>(*shrunk)[smaller - 1], 0x5a);
  EXPECT_EQ(backend.live_bytes(), smaller);
  absl::StatusOr<void*> grown = backend.Resize(*shrunk, smaller, larger);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(static_cast<unsigned char*>(*grown)[0], 0x5a);
  std::memset(*grown, 0x11, larger);  // all of it is writable
  EXPECT_EQ(backend.live_bytes(), larger);
  backend.Free(*grown, larger);
  EXPECT_EQ(backend.live_bytes(), 0u);
  // Below the mapping threshold memory comes from malloc: not resizable, and left as it was.
  absl::StatusOr<void*> small = backend.Allocate(4096);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(backend.Resize(*small, 4096, large).status().code(), absl::StatusCode::kUnimplemented);
  backend.Free(*small, 4096);
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

// Tests for the host-RAM backend.
#include "allocator/host_backend.h"

#include <sys/resource.h>
#include <unistd.h>

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

// Note [Small requests keep resizable segments]: rung 4 shrinks a cached segment by a shortfall,
// to a size that need not be a multiple of the page: the head keeps its contents, live bytes
// count the new size, and the segment grows and frees as usual afterwards.
TEST(HostBackendTest, ShrinksToASizeThatIsNotAMultipleOfThePage) {
  HostBackend backend(64);
  const size_t bytes = 1 << 20, shrunk = (300 << 10) + 64;
  absl::StatusOr<void*> p = backend.Allocate(bytes);
  ASSERT_TRUE(p.ok()) << p.status();
  std::memset(*p, 0x5a, bytes);
  ASSERT_TRUE(backend.CanResize(bytes, shrunk));
  absl::StatusOr<void*> q = backend.Resize(*p, bytes, shrunk);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(*q, *p);
  EXPECT_EQ(backend.live_bytes(), shrunk);
  EXPECT_EQ(static_cast<unsigned char*>(*q)[shrunk - 1], 0x5a);
  std::memset(*q, 0x11, shrunk);  // all of it is still writable
  absl::StatusOr<void*> grown = backend.Resize(*q, shrunk, bytes);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(static_cast<unsigned char*>(*grown)[0], 0x11);
  std::memset(*grown, 0x22, bytes);
  EXPECT_EQ(backend.live_bytes(), bytes);
  backend.Free(*grown, bytes);
  EXPECT_EQ(backend.live_bytes(), 0u);
}

// DeviceMemoryBackend::CanResize is monotone in the old size (Note [Releasable segments by size],
// caching_allocator.cc, relies on it): resizable from some size, resizable from every larger one.
TEST(HostBackendTest, CanResizeIsMonotoneInTheOldSize) {
  bool seen[2] = {false, false};
  for (size_t alignment : {size_t(64), size_t(512), size_t(1) << 16}) {
    HostBackend backend(alignment);
    const size_t sizes[] = {1, 4096, (128 << 10) - 64, 128 << 10, (128 << 10) + 1, 1 << 20, 3 << 20};
    for (size_t new_bytes : sizes) {
      bool resizable = false;
      for (size_t old_bytes : sizes) {
        const bool can = backend.CanResize(old_bytes, new_bytes);
        EXPECT_TRUE(can || !resizable) << "alignment " << alignment << ": " << old_bytes << " -> " << new_bytes;
        resizable = resizable || can;
      }
      seen[resizable] = true;
    }
  }
  EXPECT_TRUE(seen[false] && seen[true]) << "both kinds of target size";
}

// Note [Splitting a cached segment]: a mapped segment is cut at the page after the head, each
// piece keeps its contents and is freed on its own; memory from malloc, or a piece that would be
// too small to be mapped on its own, is not cut.
TEST(HostBackendTest, SplitsMappedSegmentsAtAPageBoundary) {
  HostBackend backend(64);
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t bytes = 1 << 20, head = (300 << 10) + 64;
  absl::StatusOr<void*> p = backend.Allocate(bytes);
  ASSERT_TRUE(p.ok()) << p.status();
  auto* base = static_cast<unsigned char*>(*p);
  std::memset(base, 0x5a, bytes);
  absl::StatusOr<size_t> tail = backend.Split(*p, bytes, head);
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ(*tail, (head + page - 1) / page * page);
  EXPECT_EQ(backend.live_bytes(), bytes - (*tail - head));
  EXPECT_EQ(base[head - 1], 0x5a);
  EXPECT_EQ(base[*tail], 0x5a);
  EXPECT_EQ(base[bytes - 1], 0x5a);
  // The tail grows on its own, keeping its pages; the head is untouched by it.
  absl::StatusOr<void*> grown = backend.Resize(base + *tail, bytes - *tail, bytes);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(static_cast<unsigned char*>(*grown)[0], 0x5a);
  std::memset(*grown, 0x11, bytes);
  EXPECT_EQ(base[head - 1], 0x5a);
  backend.Free(*grown, bytes);
  backend.Free(base, head);
  EXPECT_EQ(backend.live_bytes(), 0u);
  // A piece below the mapping threshold: not cut, and left as it was.
  p = backend.Allocate(bytes);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(backend.Split(*p, bytes, bytes - (16 << 10)).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(backend.Split(*p, bytes, 16 << 10).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(backend.live_bytes(), bytes);
  backend.Free(*p, bytes);
  absl::StatusOr<void*> small = backend.Allocate(4096);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(backend.Split(*small, 4096, 2048).status().code(), absl::StatusCode::kUnimplemented);
  backend.Free(*small, 4096);
  EXPECT_EQ(backend.live_bytes(), 0u);
}

long MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Filled with `value`, each of its pages faulted in.
void* Filled(HostBackend& backend, size_t bytes, unsigned char value) {
  absl::StatusOr<void*> p = backend.Allocate(bytes);
  EXPECT_TRUE(p.ok()) << p.status();
  std::memset(*p, value, bytes);
  return *p;
}

// Whether [p + begin, p + end) all hold `value`.
bool Holds(void* p, size_t begin, size_t end, unsigned char value) {
  const auto* bytes = static_cast<const unsigned char*>(p);
  for (size_t i = begin; i < end; ++i) {
    if (bytes[i] != value) return false;
  }
  return true;
}

// Note [Growing into cached pages]: a growth takes the donors' pages, in order, for its new
// tail, with no page faulted in again; what the tail does not need of the last donor goes back,
// and memory from malloc is freed. Note [Seams]: the segment made so is several kernel mappings,
// yet it grows, shrinks, gives its own pages to another growth and is freed like any other.
TEST(HostBackendTest, AGrowthTakesTheDonorsPagesAndTheResultResizesAcrossSeams) {
  constexpr size_t kKiB = 1024;
  HostBackend backend(64);
  void* a = Filled(backend, 256 * kKiB, 0xaa);
  void* d = Filled(backend, 512 * kKiB, 0xdd);
  void* e = Filled(backend, 384 * kKiB, 0xee);
  void* small = Filled(backend, 4 * kKiB, 0x55);
  const HostBackend::Piece donors[] = {{d, 512 * kKiB}, {small, 4 * kKiB}, {e, 384 * kKiB}};
  absl::StatusOr<void*> grown = backend.ResizeWithPagesOf(a, 256 * kKiB, 1024 * kKiB, donors);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(backend.live_bytes(), 1024 * kKiB);
  const long faults = MinorFaults();
  EXPECT_TRUE(Holds(*grown, 0, 256 * kKiB, 0xaa));
  EXPECT_TRUE(Holds(*grown, 256 * kKiB, 768 * kKiB, 0xdd));
  EXPECT_TRUE(Holds(*grown, 768 * kKiB, 1024 * kKiB, 0xee));
  std::memset(*grown, 0x11, 1024 * kKiB);
  EXPECT_LT(MinorFaults() - faults, 16) << "the 256 pages were moved, not mapped anew";
  // Grown again across its seams: its pages move with it into a larger mapping.
  std::memset(static_cast<char*>(*grown) + 512 * kKiB, 0x22, 512 * kKiB);
  absl::StatusOr<void*> larger = backend.Resize(*grown, 1024 * kKiB, 2048 * kKiB);
  ASSERT_TRUE(larger.ok()) << larger.status();
  EXPECT_TRUE(Holds(*larger, 0, 512 * kKiB, 0x11));
  EXPECT_TRUE(Holds(*larger, 512 * kKiB, 1024 * kKiB, 0x22));
  std::memset(*larger, 0x33, 2048 * kKiB);
  // Shrunk across them, then split, then given whole as a donor to another growth.
  absl::StatusOr<void*> shrunk = backend.Resize(*larger, 2048 * kKiB, 900 * kKiB);
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  EXPECT_EQ(*shrunk, *larger);
  absl::StatusOr<size_t> tail = backend.Split(*shrunk, 900 * kKiB, 300 * kKiB);
  ASSERT_TRUE(tail.ok()) << tail.status();
  void* b = Filled(backend, 200 * kKiB, 0xbb);
  void* rest = static_cast<char*>(*shrunk) + *tail;
  const size_t rest_bytes = 900 * kKiB - *tail;
  const HostBackend::Piece rest_donor[] = {{rest, rest_bytes}};
  absl::StatusOr<void*> third = backend.ResizeWithPagesOf(b, 200 * kKiB, 800 * kKiB, rest_donor);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_TRUE(Holds(*third, 0, 200 * kKiB, 0xbb));
  EXPECT_TRUE(Holds(*third, 200 * kKiB, 200 * kKiB + rest_bytes, 0x33));
  std::memset(*third, 0x44, 800 * kKiB);
  EXPECT_TRUE(Holds(*shrunk, 0, 300 * kKiB, 0x33)) << "the split's head is untouched";
  backend.Free(*third, 800 * kKiB);
  backend.Free(*shrunk, 300 * kKiB);
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

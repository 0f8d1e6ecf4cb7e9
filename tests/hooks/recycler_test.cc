// Recycler (Note [Recycled records], hooks/recycler.h): a dropped object is destroyed at once and
// its memory serves the next one; at most kMaxSpare blocks are kept; a constructor that throws
// loses no block.
#include "hooks/recycler.h"

#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace dtr::hooks {
namespace {

struct Counted {
  static int live;
  std::string name;
  explicit Counted(std::string n, bool fail = false) : name(std::move(n)) {
    if (fail) throw std::runtime_error("constructor failed");
    ++live;
  }
  ~Counted() { --live; }
};
int Counted::live = 0;

TEST(RecyclerTest, DroppedObjectsAreDestroyedAtOnceAndTheirMemoryServesTheNextOnes) {
  Recycler<Counted, 4> pool;
  Counted* a = pool.New("a");
  EXPECT_EQ(a->name, "a");
  EXPECT_EQ(Counted::live, 1);
  void* where = a;
  pool.Delete(a);
  EXPECT_EQ(Counted::live, 0);  // destroyed, not parked alive
  EXPECT_EQ(pool.spare(), 1u);
  Counted* b = pool.New("b");
  EXPECT_EQ(static_cast<void*>(b), where);
  EXPECT_EQ(b->name, "b");  // constructed afresh
  EXPECT_EQ(pool.spare(), 0u);
  pool.Delete(b);
  pool.Delete(nullptr);
  EXPECT_EQ(pool.spare(), 1u);
}

TEST(RecyclerTest, KeepsAtMostItsSpareLimit) {
  Recycler<Counted, 4> pool;
  std::vector<Counted*> made;
  for (int i = 0; i < 10; ++i) made.push_back(pool.New(std::to_string(i)));
  for (Counted* c : made) pool.Delete(c);
  EXPECT_EQ(Counted::live, 0);
  EXPECT_EQ(pool.spare(), 4u);  // the other six went back to operator delete
}

TEST(RecyclerTest, AThrowingConstructorLosesNoBlock) {
  Recycler<Counted, 4> pool;
  pool.Delete(pool.New("a"));
  ASSERT_EQ(pool.spare(), 1u);
  EXPECT_THROW(pool.New("b", /*fail=*/true), std::runtime_error);
  EXPECT_EQ(pool.spare(), 1u);
  EXPECT_EQ(Counted::live, 0);
}

}  // namespace
}  // namespace dtr::hooks

// Tests for SlotMap (runtime/slot_map.h): generation-checked ids, slot reuse, records made in place.
#include "runtime/slot_map.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/ids.h"

namespace dtr {
namespace {

struct Rec {
  int value = 7;  // a default the map must not skip
  std::vector<int> items;
};
using Map = SlotMap<StorageId, Rec>;

TEST(SlotMapTest, EmplaceMakesADefaultRecordTheCallerFills) {
  Map m;
  Rec* r = nullptr;
  const StorageId a = m.Emplace(&r);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->value, 7);
  EXPECT_TRUE(r->items.empty());
  r->value = 1;
  r->items = {1, 2, 3};
  EXPECT_EQ(m.size(), 1u);
  ASSERT_TRUE(m.Contains(a));
  EXPECT_EQ(m[a].value, 1);
  EXPECT_EQ(m.Find(a)->items.size(), 3u);
}

TEST(SlotMapTest, AReusedSlotStartsFreshAndTheOldIdIsStale) {
  Map m;
  Rec* r = nullptr;
  const StorageId a = m.Emplace(&r);
  r->value = 1;
  r->items = {1, 2};
  m.Erase(a);
  EXPECT_FALSE(m.Contains(a));
  EXPECT_EQ(m.Find(a), nullptr);
  EXPECT_EQ(m.size(), 0u);
  const StorageId b = m.Emplace(&r);
  EXPECT_EQ(b.index, a.index);  // the slot is reused
  EXPECT_NE(b.generation, a.generation);
  EXPECT_FALSE(m.Contains(a));
  EXPECT_EQ(r->value, 7);  // nothing of the erased record is left
  EXPECT_TRUE(r->items.empty());
}

TEST(SlotMapTest, ForEachVisitsTheLiveRecordsOnly) {
  Map m;
  std::vector<StorageId> ids;
  for (int i = 0; i < 5; ++i) {
    Rec* r = nullptr;
    ids.push_back(m.Emplace(&r));
    r->value = i;
  }
  m.Erase(ids[1]);
  m.Erase(ids[3]);
  int sum = 0, count = 0;
  m.ForEach([&](StorageId id, const Rec& r) {
    EXPECT_TRUE(m.Contains(id));
    sum += r.value;
    ++count;
  });
  EXPECT_EQ(count, 3);
  EXPECT_EQ(sum, 0 + 2 + 4);
}

}  // namespace
}  // namespace dtr

// Tests for the union-find behind dtr-eq.
#include "runtime/evicted_components.h"

#include "gtest/gtest.h"

namespace dtr {
namespace {

TEST(EvictedComponents, UnionSumsCostsAndSubtractionSplitsApproximately) {
  EvictedComponents uf;
  auto a = uf.MakeSet(1), b = uf.MakeSet(2), c = uf.MakeSet(4);
  EXPECT_EQ(uf.Cost(a), 1);
  uf.Union(a, b);
  EXPECT_EQ(uf.Find(a), uf.Find(b));
  EXPECT_EQ(uf.Cost(b), 3);
  EXPECT_NE(uf.Find(a), uf.Find(c));
  uf.Union(c, b);
  EXPECT_EQ(uf.Cost(a), 7);
  uf.AddCost(b, -2);  // b rematerialized: its cost leaves, the set stays joined
  EXPECT_EQ(uf.Cost(c), 5);
  EXPECT_EQ(uf.Find(a), uf.Find(c));
}

TEST(EvictedComponents, CompactionKeepsPartitionAndCosts) {
  EvictedComponents uf;
  std::vector<EvictedComponents::Node> nodes;
  for (int i = 0; i < 10; ++i) nodes.push_back(uf.MakeSet(i));
  for (int i = 0; i + 1 < 10; i += 2) uf.Union(nodes[i], nodes[i + 1]);  // {0,1},{2,3},...
  uf.AddCost(nodes[3], -3);  // 3 became a phantom member of {2,3}
  std::vector<EvictedComponents::Node> live = {nodes[0], nodes[1], nodes[2], nodes[5]};
  auto fresh = uf.Compact(live);
  EXPECT_EQ(uf.node_count(), 4u);
  EXPECT_EQ(uf.Find(fresh[0]), uf.Find(fresh[1]));
  EXPECT_NE(uf.Find(fresh[0]), uf.Find(fresh[2]));
  EXPECT_EQ(uf.Cost(fresh[0]), 1);
  EXPECT_EQ(uf.Cost(fresh[2]), 2);
  EXPECT_EQ(uf.Cost(fresh[3]), 9);
}

}  // namespace
}  // namespace dtr

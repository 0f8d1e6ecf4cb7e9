// Tests for the DTR runtime with a recording fake backend.
#include "runtime/runtime.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dtr {
namespace {

using ::testing::HasSubstr;

// Records what the runtime asks for and checks replay preconditions.
class FakeBackend : public ReplayBackend {
 public:
  Runtime* runtime = nullptr;
  std::vector<std::string> replays;          // op names, in order
  std::vector<std::vector<bool>> keeps;      // keep masks, in order
  std::vector<std::pair<StorageId, bool>> releases;
  std::vector<std::string> dropped_ops;
  std::vector<uint64_t> memory_at_replays;   // the runtime's memory() as each replay starts
  bool fail_replays = false;

  absl::StatusOr<double> Replay(OpId, const OpRecord& op, absl::Span<const bool> keep) override {
    if (fail_replays) return absl::UnavailableError("replay failed on purpose");
    for (StorageId in : op.inputs) {
      const StorageRecord* r = runtime->storage(in);
      if (r == nullptr || !r->resident()) return absl::InternalError("replay with a non-resident input");
      if (r->locks == 0) return absl::InternalError("replay with an unlocked input");
    }
    replays.emplace_back(op.name);
    keeps.emplace_back(keep.begin(), keep.end());
    memory_at_replays.push_back(runtime->memory());
    return op.cost;
  }
  void Release(StorageId id, const StorageRecord&, bool permanently) override {
    releases.push_back({id, permanently});
  }
  void OnOpDropped(OpId, const OpRecord& op) override { dropped_ops.emplace_back(op.name); }
  // Note [Copies of overwritten contents]: handles for copied records, when `copy_replays`.
  bool copy_replays = false;
  std::vector<std::pair<std::string, size_t>> copied;  // (op name, output kept)
  uint64_t CopyReplay(const OpRecord& op, size_t output) override {
    if (!copy_replays) return 0;
    copied.emplace_back(std::string(op.name), output);
    return 1000 + copied.size();
  }
};

class RuntimeTest : public ::testing::Test {
 protected:
  void Make(RuntimeConfig config) {
    auto r = Runtime::Create(config, &backend_);
    ASSERT_TRUE(r.ok()) << r.status();
    rt_ = std::move(*r);
    backend_.runtime = rt_.get();
  }
  void Make(uint64_t budget, HeuristicKind h = HeuristicKind::kDtrEq, DeallocPolicy d = DeallocPolicy::kEagerEvict) {
    RuntimeConfig config;
    config.budget_bytes = budget;
    config.heuristic = h;
    config.dealloc = d;
    config.search = SearchMode::kExact;
    Make(config);
  }
  StorageId Const(uint64_t size) {
    auto id = rt_->AddConstant(size);
    EXPECT_TRUE(id.ok()) << id.status();
    return *id;
  }
  std::vector<StorageId> Op(const std::string& name, std::vector<StorageId> inputs, std::vector<uint64_t> sizes,
                            double cost = 1, bool replayable = true) {
    auto outs = rt_->Compute({name, inputs, sizes, replayable, 0},
                             [&](absl::Span<const StorageId>) -> absl::StatusOr<double> { return cost; });
    EXPECT_TRUE(outs.ok()) << outs.status();
    Check();
    return outs.ok() ? std::vector<StorageId>(outs->begin(), outs->end()) : std::vector<StorageId>{};
  }
  StorageId Op1(const std::string& name, std::vector<StorageId> inputs, uint64_t size, double cost = 1) {
    return Op(name, inputs, {size}, cost)[0];
  }
  // An op of a forward pass or, with `backward`, of a backward pass (Note [Results of the backward
  // pass]).
  std::vector<StorageId> PassOp(absl::string_view name, std::vector<StorageId> inputs, std::vector<uint64_t> sizes,
                                bool backward) {
    Runtime::OpCall call{name, inputs, sizes, true, 0};
    call.backward = backward;
    auto out = rt_->Compute(call, [](absl::Span<const StorageId>) -> absl::StatusOr<double> { return 1.0; });
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? std::vector<StorageId>(out->begin(), out->end()) : std::vector<StorageId>(sizes.size());
  }
  StorageId PassOp1(absl::string_view name, std::vector<StorageId> inputs, bool backward, uint64_t size = 100) {
    return PassOp(name, std::move(inputs), {size}, backward)[0];
  }
  // A recorded clone of `original` (a forward op); `whole` marks it OpCall::copies_input, and
  // `inputs_held` calls as the torch layer does with the operand it holds.
  StorageId CopyOf(StorageId original, uint64_t size, bool whole = true, double cost = 1.0,
                   bool inputs_held = false) {
    const StorageId in[] = {original};
    const uint64_t sizes[] = {size};
    Runtime::OpCall call{"clone", in, sizes, true, 0};
    call.copies_input = whole;
    call.inputs_held = inputs_held;
    auto out = rt_->Compute(call, [cost](absl::Span<const StorageId>) -> absl::StatusOr<double> { return cost; });
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? (*out)[0] : StorageId{};
  }
  void Check() {
    absl::Status s = rt_->CheckInvariants();
    EXPECT_TRUE(s.ok()) << s;
  }
  bool Resident(StorageId id) { return rt_->storage(id)->resident(); }
  // Drops the program's last reference to the resident `dying` of `size` bytes, whose memory goes
  // either way, and checks whether `result` was frozen for it (Note [Held results of dead
  // inputs]): then `dying` is collected, else evicted with its record kept for `result`'s recipe.
  void ExpectDeathFreezes(StorageId dying, uint64_t size, StorageId result, bool frozen) {
    const uint64_t before = rt_->memory();
    ASSERT_TRUE(rt_->DropRef(dying).ok());
    EXPECT_EQ(rt_->memory(), before - size);
    EXPECT_EQ(rt_->storage(dying) == nullptr, frozen);
    EXPECT_EQ(rt_->storage(result)->rematerializable(), !frozen);
    if (frozen) EXPECT_EQ(rt_->storage(result)->constant_reason, ConstantReason::kHeldResult);
    Check();
  }
  // Note [Recomputation limit]: a chain of ten activations with room for three, five of them read
  // in turn 50 times over, replays much of it at each read while the program computes nothing
  // more; before each read the program spends `gap` between its ops (Note [Program time between
  // ops]). Returns the first error, or OK; *chain is the chain.
  absl::Status ThrashAChain(double limit, double gap, std::vector<StorageId>* chain) {
    RuntimeConfig config;
    config.budget_bytes = 5 + 30;  // the input and three of the ten activations
    config.search = SearchMode::kExact;
    config.max_recompute_ratio = limit;
    Make(config);
    StorageId x = Const(5);
    *chain = {Op1("a0", {x}, 10)};
    for (int i = 1; i < 10; ++i) chain->push_back(Op1(absl::StrCat("a", i), {chain->back()}, 10));
    const std::vector<StorageId>& c = *chain;
    for (int round = 0; round < 50; ++round)
      for (StorageId id : {c[9], c[0], c[7], c[2], c[5]}) {
        rt_->AddProgramTime(gap);
        absl::Status s = rt_->Access(id);
        Check();
        if (!s.ok()) return s;
      }
    return absl::OkStatus();
  }
  // For the sampled-search tests: samples of 4 even from a small pool (Note [Small pools are
  // searched whole]), scored 1/size (fixed, whatever the clock), of storages of sizes 1 to 200,
  // each read by a live recipe (not a result awaiting its reader).
  void MakeSampledPoolOfSizes1To200() {
    RuntimeConfig config;
    config.heuristic = HeuristicKind::kSize;
    config.min_samples = config.max_samples = 4;
    config.exhaustive_pool = 0;
    Make(config);
    StorageId x = Const(1);
    for (uint64_t size = 1; size <= 200; ++size) {
      StorageId s = Op1("op", {x}, size);
      ASSERT_TRUE(rt_->storage(s) != nullptr);
      (void)Op1("reader", {s}, 0);
    }
  }
  // For the neighborhood cost cache tests: x -> a -> b -> c -> d -> e with costs 1 .. 10000, and
  // y, unrelated, to evict and bring back while time passes; dtr, exact search.
  struct CostChain {
    StorageId a, b, c, d, e, y;
  };
  CostChain MakeCostChain(RuntimeConfig config) {
    config.search = SearchMode::kExact;
    config.heuristic = HeuristicKind::kDtr;
    Make(config);
    StorageId x = Const(1);
    CostChain k;
    k.a = Op1("a", {x}, 2, 1);
    k.b = Op1("b", {k.a}, 2, 10);
    k.c = Op1("c", {k.b}, 2, 100);
    k.d = Op1("d", {k.c}, 2, 1000);
    k.e = Op1("e", {k.d}, 2, 10000);
    k.y = Op1("y", {x}, 2, 1);
    return k;
  }
  // dtr, exact search, scores without Note [Thrashing]'s factor (so ScoreWith holds).
  static RuntimeConfig ExactDtrConfig(uint64_t budget_bytes = kUnlimitedBudget) {
    RuntimeConfig config;
    config.budget_bytes = budget_bytes;
    config.search = SearchMode::kExact;
    config.heuristic = HeuristicKind::kDtr;
    config.thrash_damping = 0;
    return config;
  }
  // dtr's score of `id` given its evicted neighborhood's cost.
  double ScoreWith(StorageId id, double neighborhood) {
    const StorageRecord& r = *rt_->storage(id);
    return (r.cost + neighborhood) / (double(r.size) * (rt_->now() - r.last_access + 1));
  }
  // Unlimited budget, exact search, the given Note [Bounded replay chains] limit.
  void MakeWithMaxDepth(uint32_t max_replay_depth) {
    RuntimeConfig config;
    config.search = SearchMode::kExact;
    config.max_replay_depth = max_replay_depth;
    Make(config);
  }

  FakeBackend backend_;
  std::unique_ptr<Runtime> rt_;
};

TEST_F(RuntimeTest, AccountsResidentBytesWithoutPressure) {
  Make(kUnlimitedBudget);
  StorageId x = Const(100);
  StorageId a = Op1("a", {x}, 40);
  auto bc = Op("split", {a, x}, {10, 20});
  EXPECT_EQ(rt_->memory(), 170u);
  EXPECT_EQ(rt_->stats().peak_memory_bytes, 170u);
  EXPECT_EQ(rt_->stats().evictions, 0u);
  EXPECT_EQ(rt_->stats().ops_recorded, 2u);
  EXPECT_EQ(rt_->storage(bc[1])->recipe.size(), 1u);
  EXPECT_FALSE(rt_->storage(x)->rematerializable());
}

TEST_F(RuntimeTest, EvictsUnderBudgetAndRematerializesOnAccess) {
  Make(35);
  StorageId x = Const(5);
  StorageId a = Op1("a", {x}, 10);
  StorageId b = Op1("b", {a}, 10);
  StorageId c = Op1("c", {b}, 10);
  EXPECT_LE(rt_->memory(), 35u);
  StorageId d = Op1("d", {c}, 10);  // 5 + 4 * 10 > 35: something goes
  EXPECT_LE(rt_->memory(), 35u);
  EXPECT_EQ(rt_->stats().evictions, 1u);
  StorageId victim = !Resident(a) ? a : !Resident(b) ? b : c;
  ASSERT_FALSE(Resident(victim));
  EXPECT_NE(victim, d);  // the just-computed output is never the victim
  ASSERT_TRUE(rt_->Access(victim).ok());
  EXPECT_TRUE(Resident(victim));
  EXPECT_EQ(rt_->stats().rematerializations, 1u);
  EXPECT_GT(rt_->stats().remat_cost, 0);
  Check();
}

TEST_F(RuntimeTest, RematerializesLongEvictedChainsWithoutRecursion) {
  RuntimeConfig config;
  config.search = SearchMode::kExact;
  config.max_replay_depth = 1 << 20;  // Note [Bounded replay chains] would cut this chain
  // One access replays 100,000 ops, 17 times the window of Note [Recomputation limit].
  config.max_recompute_ratio = 0;
  Make(config);
  constexpr int kDepth = 100000;
  std::vector<StorageId> chain = {Const(1)};
  uint64_t size = 1;
  for (int i = 0; i < kDepth; ++i) {  // no per-op Check(): it is O(records)
    auto out = rt_->Compute({"f", {&chain.back(), 1}, {&size, 1}, true, 0},
                            [](absl::Span<const StorageId>) -> absl::StatusOr<double> { return 1.0; });
    ASSERT_TRUE(out.ok());
    chain.push_back((*out)[0]);
  }
  for (int i = 1; i <= kDepth; ++i) ASSERT_TRUE(rt_->Evict(chain[i]).ok());
  ASSERT_TRUE(rt_->Access(chain.back()).ok());
  EXPECT_EQ(backend_.replays.size(), size_t(kDepth));
  EXPECT_EQ(rt_->stats().rematerializations, uint64_t(kDepth));
  Check();
}

TEST_F(RuntimeTest, MultiOutputReplayKeepsEvictedSiblingsAndDiscardsResidentOnes) {
  Make(kUnlimitedBudget);
  StorageId x = Const(8);
  auto ab = Op("two", {x}, {10, 20});
  ASSERT_TRUE(rt_->Evict(ab[0]).ok());
  ASSERT_TRUE(rt_->Evict(ab[1]).ok());
  ASSERT_TRUE(rt_->Access(ab[0]).ok());
  ASSERT_EQ(backend_.keeps.size(), 1u);
  EXPECT_EQ(backend_.keeps[0], (std::vector<bool>{true, true}));  // one replay brings both back
  EXPECT_TRUE(Resident(ab[1]));
  EXPECT_EQ(rt_->memory(), 38u);
  ASSERT_TRUE(rt_->Evict(ab[0]).ok());
  ASSERT_TRUE(rt_->Access(ab[0]).ok());
  EXPECT_EQ(backend_.keeps[1], (std::vector<bool>{true, false}));  // resident sibling not leaked
  EXPECT_EQ(rt_->memory(), 38u);
  EXPECT_EQ(rt_->stats().peak_memory_bytes, 38u + 20u);  // the discarded copy existed transiently
  Check();
}

TEST_F(RuntimeTest, InputsOfTheRunningOpAreLockedAndNeverChosen) {
  Make(30);
  StorageId x = Const(1);
  StorageId a = Op1("a", {x}, 9);
  StorageId b = Op1("b", {x}, 9);
  // Needs a and b resident and 10 more bytes: only c0 (unlocked) may go.
  StorageId c0 = Op1("c0", {x}, 9);
  StorageId d = Op1("d", {a, b}, 10);
  EXPECT_TRUE(Resident(a));
  EXPECT_TRUE(Resident(b));
  EXPECT_FALSE(Resident(c0));
  EXPECT_TRUE(Resident(d));
}

// Note [Lazy input locks]: d = D(a, b) with a resident and b = B(c), c = C(x) both evicted. Eager
// locks hold a and c while B replays (x + a + c + b = 31 bytes > 25): infeasible. Lazy ones evict
// the awaited a as the last resort, replay B, then bring a back (evicting c, which nothing
// awaits any more), all within the budget.
TEST_F(RuntimeTest, LazyInputLocksFitARematerializationEagerLocksCannot) {
  for (InputLocking locking : {InputLocking::kEager, InputLocking::kLazy}) {
    SCOPED_TRACE(InputLockingName(locking));
    backend_ = FakeBackend();
    RuntimeConfig config;
    config.search = SearchMode::kExact;
    config.input_locking = locking;
    Make(config);
    StorageId x = Const(1);
    StorageId a = Op1("A", {x}, 10);
    StorageId c = Op1("C", {x}, 10);
    StorageId b = Op1("B", {c}, 10);
    ASSERT_TRUE(rt_->Evict(b).ok());
    ASSERT_TRUE(rt_->Evict(c).ok());
    ASSERT_TRUE(rt_->SetBudget(25).ok());
    auto d = rt_->Compute({"D", {a, b}, {std::vector<uint64_t>{1}}, true, 0},
                          [](absl::Span<const StorageId>) -> absl::StatusOr<double> { return 1.0; });
    Check();
    if (locking == InputLocking::kEager) {
      ASSERT_FALSE(d.ok());
      EXPECT_TRUE(absl::IsResourceExhausted(d.status())) << d.status();
      EXPECT_THAT(std::string(d.status().message()), HasSubstr("rematerializing B"));
      EXPECT_TRUE(Resident(a));  // nothing lost: the replayed c stays, a was never touched
      continue;
    }
    ASSERT_TRUE(d.ok()) << d.status();
    // The fake backend fails a replay whose inputs are not resident and locked.
    EXPECT_EQ(backend_.replays, (std::vector<std::string>{"C", "B", "A"}));
    EXPECT_EQ(rt_->stats().awaited_evictions, 1u);
    // Each replay starts with room for its 10-byte output.
    for (uint64_t m : backend_.memory_at_replays) EXPECT_LE(m + 10, 25u);
    EXPECT_LE(rt_->memory(), 25u);
    EXPECT_TRUE(Resident(a));
    EXPECT_TRUE(Resident(b));
    EXPECT_FALSE(Resident(c));
  }
}

// Note [Lazy input locks]: an awaited input is the last resort. With another storage to evict,
// that one goes, and nothing is brought back twice.
TEST_F(RuntimeTest, AwaitedInputsAreEvictedOnlyWhenNothingElseCanBe) {
  RuntimeConfig config;
  config.search = SearchMode::kExact;
  Make(config);
  StorageId x = Const(1);
  StorageId a = Op1("A", {x}, 10);
  StorageId spare = Op1("E", {x}, 10);
  Op1("G", {spare}, 1);  // read, so spare is an ordinary candidate (Note [Results awaiting their reader])
  StorageId c = Op1("C", {x}, 10);
  StorageId b = Op1("B", {c}, 10);
  ASSERT_TRUE(rt_->Evict(b).ok());
  ASSERT_TRUE(rt_->Evict(c).ok());
  ASSERT_TRUE(rt_->SetBudget(36).ok());
  // Rebuilding b needs x + a + spare + g + c + b = 42 bytes: one of a (awaited) and spare goes.
  auto d = rt_->Compute({"D", {a, b}, {std::vector<uint64_t>{1}}, true, 0},
                        [](absl::Span<const StorageId>) -> absl::StatusOr<double> { return 1.0; });
  ASSERT_TRUE(d.ok()) << d.status();
  Check();
  EXPECT_EQ(backend_.replays, (std::vector<std::string>{"C", "B"}));
  EXPECT_EQ(rt_->stats().awaited_evictions, 0u);
  EXPECT_FALSE(Resident(spare));
  EXPECT_TRUE(Resident(a));
}

TEST_F(RuntimeTest, PinnedStoragesAreNotEvicted) {
  Make(25);
  StorageId x = Const(1);
  StorageId a = Op1("a", {x}, 10);
  ASSERT_TRUE(rt_->Pin(a).ok());
  StorageId b = Op1("b", {x}, 10);
  Op1("c", {x}, 10);
  EXPECT_TRUE(Resident(a));
  EXPECT_FALSE(Resident(b));
  EXPECT_FALSE(rt_->Evict(a).ok());
  ASSERT_TRUE(rt_->Unpin(a).ok());
  EXPECT_TRUE(rt_->Evict(a).ok());
  EXPECT_FALSE(rt_->Unpin(a).ok());
  Check();
}

// Note [Operands held for an op]: a held operand is brought back, is never a victim while held,
// counts as locked (not pinned), and a drop while held applies at its release.
TEST_F(RuntimeTest, HeldOperandsAreBroughtBackNotEvictedAndDroppedAtRelease) {
  Make(25);
  StorageId x = Const(1);
  StorageId a = Op1("a", {x}, 10);
  ASSERT_TRUE(rt_->Evict(a).ok());
  ASSERT_TRUE(rt_->HoldOperand(a).ok());
  EXPECT_TRUE(Resident(a));
  EXPECT_EQ(rt_->storage(a)->locks, 1u);
  EXPECT_EQ(rt_->storage(a)->pins, 0u);
  // Between the ops of a program nothing is held (CheckInvariants says so): these run inside
  // the op that holds a, so they are not checked one by one.
  auto b = rt_->Compute({"b", {&x, 1}, {std::vector<uint64_t>{10}}, true, 0},
                        [](absl::Span<const StorageId>) -> absl::StatusOr<double> { return 1.0; });
  ASSERT_TRUE(b.ok()) << b.status();
  // 1 + 10 + 10 + 10 > 25: someone goes, and it is not the held a.
  auto c = rt_->Compute({"c", {&x, 1}, {std::vector<uint64_t>{10}}, true, 0},
                        [](absl::Span<const StorageId>) -> absl::StatusOr<double> { return 1.0; });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(Resident(a));
  EXPECT_FALSE(Resident((*b)[0]));
  EXPECT_FALSE(rt_->Evict(a).ok());
  auto big = rt_->Compute({"big", {&x, 1}, {std::vector<uint64_t>{20}}, true, 0},
                          [](absl::Span<const StorageId>) -> absl::StatusOr<double> { return 1.0; });
  ASSERT_FALSE(big.ok());
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("11 B locked by the operation in progress, 0 B pinned"));
  ASSERT_TRUE(rt_->DropRef(a).ok());
  EXPECT_TRUE(rt_->storage(a) != nullptr && Resident(a));  // held: the drop waits
  rt_->ReleaseOperand(a);
  EXPECT_TRUE(rt_->storage(a) == nullptr || !Resident(a));
  Check();
}

// Runtime::AccessHeld is Access(id, 0) for a storage the caller holds (Note [Views on a short
// path], hooks/fallback.cc): it marks it used now, as Access does, and leaves its lock as it was;
// an id the runtime does not know is ignored.
TEST_F(RuntimeTest, AccessOfAHeldStorageMarksItUsedAsAccessDoes) {
  Make(1000);
  StorageId x = Const(1);
  StorageId a = Op1("a", {x}, 10);
  StorageId b = Op1("b", {x}, 10);
  ASSERT_TRUE(rt_->HoldOperand(a).ok());
  ASSERT_TRUE(rt_->HoldOperand(b).ok());
  const double before = rt_->storage(b)->last_access;
  // Inside the op that holds a and b (not checked one by one, as above); the clock moves on.
  auto c = rt_->Compute({"c", {&x, 1}, {std::vector<uint64_t>{10}}, true, 0},
                        [](absl::Span<const StorageId>) -> absl::StatusOr<double> { return 5.0; });
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(rt_->Access(a, 0).ok());
  rt_->AccessHeld(b);
  EXPECT_GT(rt_->storage(b)->last_access, before);
  EXPECT_EQ(rt_->storage(b)->last_access, rt_->storage(a)->last_access);
  EXPECT_EQ(rt_->storage(a)->locks, 1u);
  EXPECT_EQ(rt_->storage(b)->locks, 1u);
  rt_->AccessHeld(StorageId{});  // unknown: nothing happens
  rt_->ReleaseOperand(a);
  rt_->ReleaseOperand(b);
  Check();  // the pool's copy of b's last access agrees with its record
}

// OpCall::inputs_held: inputs the caller holds are read as they are (the torch layer holds an
// op's operands while it runs, then records it): the op is recorded as with any call, its inputs
// keep the caller's locks, and an input that is not held is refused: no output, no memory, no
// lock taken.
TEST_F(RuntimeTest, HeldInputsAreRecordedWithoutLockingThemAgain) {
  Make(1000);
  StorageId x = Const(10);
  StorageId a = Op1("a", {x}, 10);
  ASSERT_TRUE(rt_->HoldOperand(x).ok());
  ASSERT_TRUE(rt_->HoldOperand(a).ok());
  const StorageId ins[] = {a, x, a};
  const uint64_t sizes[] = {10};
  Runtime::OpCall call{"b", ins, sizes, true, 0};
  call.inputs_held = true;
  auto b = rt_->Compute(call, [](absl::Span<const StorageId>) -> absl::StatusOr<double> { return 2.0; });
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(rt_->storage(a)->locks, 1u);  // the caller's hold, no more and no less
  EXPECT_EQ(rt_->storage(x)->locks, 1u);
  ASSERT_EQ(rt_->storage((*b)[0])->recipe.size(), 1u);
  const OpRecord* op = rt_->op(rt_->storage((*b)[0])->recipe[0]);
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->inputs.size(), 2u);  // distinct
  EXPECT_EQ(op->cost, 2.0);
  rt_->ReleaseOperand(a);
  rt_->ReleaseOperand(x);
  Check();
  // b is not held: refused, and nothing was recorded.
  const uint64_t memory = rt_->memory();
  const StorageId unheld[] = {(*b)[0]};
  Runtime::OpCall bad{"c", unheld, sizes, true, 0};
  bad.inputs_held = true;
  auto c = rt_->Compute(bad, [](absl::Span<const StorageId>) -> absl::StatusOr<double> { return 1.0; });
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(c.status())) << c.status();
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("is not held"));
  EXPECT_EQ(rt_->memory(), memory);
  EXPECT_EQ(rt_->storage((*b)[0])->locks, 0u);
  Check();
}

TEST_F(RuntimeTest, InfeasibleBudgetFailsWithAnExplanationAndChangesNothing) {
  Make(100);
  StorageId x = Const(60);
  StorageId a = Op1("a", {x}, 30);
  ASSERT_TRUE(rt_->Pin(a).ok());
  uint64_t before = rt_->memory();
  auto outs = rt_->Compute({"big", {&x, 1}, {std::vector<uint64_t>{50}}, true, 0},
                           [](absl::Span<const StorageId>) -> absl::StatusOr<double> { return 1.0; });
  ASSERT_FALSE(outs.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(outs.status()));
  std::string msg(outs.status().message());
  EXPECT_THAT(msg, HasSubstr("infeasible"));
  EXPECT_THAT(msg, HasSubstr("outputs of big"));
  EXPECT_THAT(msg, HasSubstr("30 B pinned"));
  EXPECT_THAT(msg, HasSubstr("60 B locked"));
  EXPECT_THAT(msg, HasSubstr("at least 140 B"));
  EXPECT_EQ(rt_->memory(), before);
  Check();
  // The same runtime keeps working after the failure.
  ASSERT_TRUE(rt_->Unpin(a).ok());
  Op1("small", {x}, 10);
}

// The constants an infeasible budget reports are broken down by reason, largest first, so a user
// can tell the program's constants from results the runtime chose to keep.
TEST_F(RuntimeTest, InfeasibleBudgetNamesTheConstantsByReason) {
  Make(100);
  StorageId x = Const(40);
  StorageId y = Const(20);
  StorageId u = Op("unreplayable", {y}, {30}, 1, /*replayable=*/false)[0];
  ASSERT_TRUE(rt_->storage(u) != nullptr && Resident(u));
  auto outs = rt_->Compute({"big", {&x, 1}, {std::vector<uint64_t>{50}}, true, 0},
                           [](absl::Span<const StorageId>) -> absl::StatusOr<double> { return 1.0; });
  ASSERT_FALSE(outs.ok());
  EXPECT_THAT(std::string(outs.status().message()),
              HasSubstr("40 B locked by the operation in progress, 0 B pinned, 50 B constants (30 B output of "
                        "an op that is not replayable, 20 B given to the runtime)"));
  Check();
}

TEST_F(RuntimeTest, FailedExecutionRollsBack) {
  Make(kUnlimitedBudget);
  StorageId x = Const(4);
  auto outs = rt_->Compute({"boom", {&x, 1}, {std::vector<uint64_t>{100}}, true, 0},
                           [](absl::Span<const StorageId>) -> absl::StatusOr<double> {
                             return absl::InvalidArgumentError("kernel failed");
                           });
  EXPECT_FALSE(outs.ok());
  EXPECT_EQ(rt_->memory(), 4u);
  EXPECT_EQ(rt_->storage_count(), 1u);
  Check();
}

TEST_F(RuntimeTest, EagerEvictionEvictsNeededStoragesAndCollectsUnneededOnes) {
  Make(kUnlimitedBudget);
  StorageId x = Const(1);
  StorageId a = Op1("a", {x}, 10);
  StorageId b = Op1("b", {a}, 10);
  ASSERT_TRUE(rt_->DropRef(a).ok());  // b may need a again: evicted, record kept
  EXPECT_FALSE(Resident(a));
  EXPECT_EQ(rt_->stats().eager_evictions, 1u);
  EXPECT_EQ(rt_->memory(), 11u);
  ASSERT_TRUE(rt_->DropRef(b).ok());  // nothing reads b: collected, and then a too
  EXPECT_EQ(rt_->storage(b), nullptr);
  EXPECT_EQ(rt_->storage(a), nullptr);
  EXPECT_EQ(rt_->memory(), 1u);
  EXPECT_EQ(rt_->op_count(), 0u);
  EXPECT_EQ(backend_.dropped_ops.size(), 2u);
  EXPECT_TRUE(absl::IsNotFound(rt_->DropRef(b)));  // a stale id is reported, not misused
  Check();
}

// Note [Joins at the next search]: a storage evicted at its death tells its neighbors only when
// something would read what it tells them, and a queue that no search drains stays bounded.
TEST_F(RuntimeTest, EvictionsAtDeathJoinTheirNeighborsAtTheNextSearch) {
  Make(ExactDtrConfig());
  StorageId x = Const(1);
  StorageId a = Op1("a", {x}, 2, 1);
  StorageId b = Op1("b", {a}, 2, 8);
  StorageId c = Op1("c", {b}, 2, 4);
  EXPECT_DOUBLE_EQ(rt_->ScoreOf(c), ScoreWith(c, 0));  // walked and cached: no evicted neighbor
  ASSERT_TRUE(rt_->DropRef(b).ok());               // c still reads b: evicted at its death
  ASSERT_FALSE(Resident(b));
  EXPECT_EQ(rt_->queued_joins(), 1u);
  EXPECT_FALSE(rt_->storage(c)->neighbor_evicted);  // not told yet
  EXPECT_FALSE(rt_->storage(a)->neighbor_evicted);
  Check();  // a queued neighbor stands in for the hint, and c's cached cost awaits the join
  EXPECT_DOUBLE_EQ(rt_->ScoreOf(c), ScoreWith(c, 8));  // the search joins first: b's cost counts
  EXPECT_EQ(rt_->queued_joins(), 0u);
  EXPECT_TRUE(rt_->storage(a)->neighbor_evicted);
  EXPECT_TRUE(rt_->storage(c)->neighbor_evicted);
  Check();
  // A queued storage brought back for a dependent is joined before it comes back.
  StorageId d = Op1("d", {c}, 2, 2);
  ASSERT_TRUE(rt_->DropRef(c).ok());  // d reads c: queued
  ASSERT_TRUE(rt_->Evict(d).ok());
  ASSERT_TRUE(rt_->Access(d, 0).ok());  // replays b, then c, then d
  EXPECT_TRUE(Resident(d));
  EXPECT_EQ(rt_->queued_joins(), 0u);
  Check();

  // Many deaths and no search: storages evicted at their death and collected later leave the
  // queue when it outgrows twice the evicted storages (plus a constant).
  for (int i = 0; i < 5000; ++i) {
    StorageId p = Op1("p", {x}, 2, 1);
    StorageId q = Op1("q", {p}, 2, 1);
    ASSERT_TRUE(rt_->DropRef(p).ok());  // q reads p: evicted, queued
    ASSERT_FALSE(Resident(p));
    ASSERT_TRUE(rt_->DropRef(q).ok());  // nothing reads q: both collected, never joined
    ASSERT_EQ(rt_->storage(p), nullptr);
  }
  EXPECT_LE(rt_->queued_joins(), 1025u);
  EXPECT_EQ(rt_->stats().eager_evictions, 5002u);
  Check();
}

// Under the event-count cache a join's reset of its neighbors' costs is what refreshes a cost
// gone stale further away, so storages are joined at their death (found by review: C kept the
// cost of A alone, 3, and the victim changed).
TEST_F(RuntimeTest, UnderTheEventCountCacheEvictionsAtDeathJoinAtOnce) {
  RuntimeConfig config = ExactDtrConfig();
  config.neighborhood_cache_events = 8;
  Make(config);
  StorageId x = Const(1);
  StorageId a0 = Op1("a0", {x}, 2, 7);
  StorageId a = Op1("a", {a0}, 2, 3);
  StorageId c = Op1("c", {a}, 2, 1);
  ASSERT_TRUE(rt_->DropRef(a).ok());
  EXPECT_DOUBLE_EQ(rt_->ScoreOf(c), ScoreWith(c, 3));  // cached for 8 evictions
  ASSERT_TRUE(rt_->DropRef(a0).ok());              // two hops away: c's cost may stay stale
  StorageId q = Op1("q", {c}, 2, 1);
  StorageId r = Op1("r", {q}, 2, 1);
  ASSERT_TRUE(rt_->DropRef(q).ok());  // c's neighbor: its join makes c walk again
  EXPECT_EQ(rt_->queued_joins(), 0u);
  ASSERT_TRUE(rt_->DropRef(r).ok());  // r and q collected
  EXPECT_DOUBLE_EQ(rt_->ScoreOf(c), ScoreWith(c, 3 + 7));
  Check();
}

TEST_F(RuntimeTest, BanishingFreesForGoodAndPinsDependents) {
  Make(kUnlimitedBudget, HeuristicKind::kDtrEq, DeallocPolicy::kBanish);
  StorageId x = Const(1);
  StorageId a = Op1("a", {x}, 10);
  StorageId b = Op1("b", {a}, 10);
  ASSERT_TRUE(rt_->DropRef(a).ok());
  EXPECT_EQ(rt_->storage(a), nullptr);
  EXPECT_EQ(rt_->stats().banishments, 1u);
  EXPECT_FALSE(rt_->storage(b)->rematerializable());  // b can no longer be recomputed
  EXPECT_EQ(rt_->memory(), 11u);
  ASSERT_FALSE(backend_.releases.empty());
  EXPECT_TRUE(backend_.releases.back().second);  // released permanently
  Check();
}

TEST_F(RuntimeTest, BanishingWaitsForEvictedDependents) {
  Make(kUnlimitedBudget, HeuristicKind::kDtrEq, DeallocPolicy::kBanish);
  StorageId x = Const(1);
  StorageId a = Op1("a", {x}, 10);
  StorageId b = Op1("b", {a}, 10);
  ASSERT_TRUE(rt_->Evict(b).ok());
  ASSERT_TRUE(rt_->DropRef(a).ok());
  ASSERT_NE(rt_->storage(a), nullptr);  // b still needs a to come back
  EXPECT_TRUE(rt_->storage(a)->banish_pending);
  ASSERT_TRUE(rt_->Access(b).ok());      // b is back: a can go now
  EXPECT_EQ(rt_->storage(a), nullptr);
  EXPECT_FALSE(rt_->storage(b)->rematerializable());
  Check();
}

// A name InternName returned is recorded as it is when the call says so; any other is looked up
// and copied, so the caller's string may die after the call.
TEST_F(RuntimeTest, OpNamesAreInternedOnceAndPassedBackWithoutALookup) {
  Make(kUnlimitedBudget);
  StorageId x = Const(4);
  const absl::string_view add = rt_->InternName(std::string("aten::add"));
  EXPECT_EQ(rt_->InternName("aten::add").data(), add.data());
  Runtime::OpCall call{add, {&x, 1}, {}, true, 0};
  const uint64_t sizes[] = {8};
  call.output_sizes = sizes;
  call.name_interned = true;
  auto run = [](absl::Span<const StorageId>) -> absl::StatusOr<double> { return 1.0; };
  auto a = rt_->Compute(call, run);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(rt_->op(rt_->storage((*a)[0])->recipe[0])->name.data(), add.data());
  std::string transient = "aten::mul";
  call.name = transient;
  call.name_interned = false;
  auto b = rt_->Compute(call, run);
  ASSERT_TRUE(b.ok()) << b.status();
  const absl::string_view recorded = rt_->op(rt_->storage((*b)[0])->recipe[0])->name;
  EXPECT_NE(recorded.data(), transient.data());
  transient.assign("xxxxxxxxx");
  EXPECT_EQ(recorded, "aten::mul");
  EXPECT_EQ(rt_->InternName("aten::mul").data(), recorded.data());
  StorageId written[] = {(*a)[0]};
  Runtime::MutateCall mc{rt_->InternName("aten::relu_"), written, written, true, 0};
  mc.name_interned = true;
  ASSERT_TRUE(rt_->Mutate(mc, []() -> absl::StatusOr<double> { return 1.0; }).ok());
  EXPECT_EQ(rt_->op(rt_->storage((*a)[0])->recipe[1])->name.data(), rt_->InternName("aten::relu_").data());
  Check();
}

TEST_F(RuntimeTest, MutationDetachesReadersAndExtendsTheRecipe) {
  Make(kUnlimitedBudget);
  StorageId x = Const(4);
  StorageId a = Op1("a", {x}, 10);
  StorageId b = Op1("b", {a}, 10);
  ASSERT_TRUE(rt_->Evict(b).ok());
  StorageId mutated[] = {a};
  StorageId inputs[] = {a, x};
  ASSERT_TRUE(rt_->Mutate({"relu_", inputs, mutated, true, 0}, []() -> absl::StatusOr<double> { return 2.0; }).ok());
  // b read the old a: it was brought back first and is a constant now.
  EXPECT_TRUE(Resident(b));
  EXPECT_FALSE(rt_->storage(b)->rematerializable());
  EXPECT_EQ(rt_->stats().detached, 1u);
  ASSERT_EQ(rt_->storage(a)->recipe.size(), 2u);
  EXPECT_DOUBLE_EQ(rt_->storage(a)->cost, 3.0);
  backend_.replays.clear();
  ASSERT_TRUE(rt_->Evict(a).ok());
  ASSERT_TRUE(rt_->Access(a).ok());
  EXPECT_EQ(backend_.replays, (std::vector<std::string>{"a", "relu_"}));
  Check();
}

// Note [Accumulators of dead gradients]: SGD's momentum buffer copies the first gradient whole and
// accumulates later ones in place, ops of no backward pass. When such a gradient dies, the held
// buffer is frozen and the gradient is collected with the records behind it, so the frozen sum it
// was computed from (a constant here) goes when the program drops it. A forward storage read by a
// forward in-place sum (an LSTM's gates) keeps the sum's recipe, and so does an accumulator more
// than four times the size of the dying gradient.
TEST_F(RuntimeTest, AnAccumulatorOfADeadGradientIsFrozenSoTheGradientIsCollected) {
  Make(1 << 20);
  auto copy_of = [&](StorageId original) { return CopyOf(original, rt_->storage(original)->size); };
  auto accumulate = [&](StorageId into, StorageId what) {
    std::vector<StorageId> in{into, what}, out{into};
    ASSERT_TRUE(rt_->Mutate({"add_", in, out, true, 0}, []() -> absl::StatusOr<double> { return 1.0; }).ok());
    Check();
  };
  // Step 1: the bias gradient of a frozen sum, copied into the momentum buffer.
  const StorageId sum1 = Const(1000);
  const StorageId grad1 = PassOp1("sum_backward", {sum1}, true);
  const StorageId buf = copy_of(grad1);
  EXPECT_TRUE(rt_->storage(buf)->rematerializable());
  const uint64_t before = rt_->memory();
  ASSERT_TRUE(rt_->DropRef(sum1).ok());
  EXPECT_EQ(rt_->memory(), before);  // grad1's recipe reads it
  ASSERT_TRUE(rt_->DropRef(grad1).ok());  // zero_grad(set_to_none=True)
  EXPECT_EQ(rt_->storage(grad1), nullptr);
  EXPECT_EQ(rt_->storage(sum1), nullptr);
  EXPECT_EQ(rt_->memory(), before - 1000 - 100);
  EXPECT_EQ(rt_->storage(buf)->constant_reason, ConstantReason::kAccumulator);
  EXPECT_TRUE(Resident(buf));
  Check();
  // A later step accumulates into a buffer with a recipe (AdamW's zeros_like) in place.
  const StorageId x = Const(1);
  const StorageId avg = PassOp1("zeros_like", {x}, false);
  const StorageId sum2 = Const(1000);
  const StorageId grad2 = PassOp1("sum_backward", {sum2}, true);
  accumulate(avg, grad2);
  ASSERT_TRUE(rt_->DropRef(sum2).ok());
  ASSERT_TRUE(rt_->DropRef(grad2).ok());
  EXPECT_EQ(rt_->storage(sum2), nullptr);
  EXPECT_EQ(rt_->storage(avg)->constant_reason, ConstantReason::kAccumulator);
  // A forward sum in place keeps its recipe: the dying storage is no gradient.
  const StorageId gates = PassOp1("gates", {x}, false);
  const StorageId hidden = PassOp1("hidden", {x}, false);
  accumulate(gates, hidden);
  ASSERT_TRUE(rt_->DropRef(hidden).ok());
  EXPECT_TRUE(rt_->storage(gates)->rematerializable());
  EXPECT_FALSE(Resident(hidden));  // evicted, its record kept for the sum's recipe
  // A gradient frozen before it dies (the optimizer updated a parameter it was computed from):
  // a dead constant, freed from the copy the same way.
  const StorageId grad3 = PassOp1("linear_backward", {x}, true);
  std::vector<StorageId> grad3_only{grad3};
  Runtime::MutateCall unreplayable{"foreach_mul_", {}, grad3_only, false, 0};
  ASSERT_TRUE(rt_->Mutate(unreplayable, []() -> absl::StatusOr<double> { return 1.0; }).ok());
  ASSERT_FALSE(rt_->storage(grad3)->rematerializable());
  const StorageId buf3 = copy_of(grad3);
  ASSERT_TRUE(rt_->DropRef(grad3).ok());
  EXPECT_EQ(rt_->storage(grad3), nullptr);
  EXPECT_EQ(rt_->storage(buf3)->constant_reason, ConstantReason::kAccumulator);
  // A gradient that dies in a backward pass (a second one, create_graph): its copy is no
  // accumulator; the backward pass's own rule decides (Note [Held results of dead inputs]).
  const StorageId grad4 = PassOp1("linear_backward", {x}, true);
  const StorageId copy4 = copy_of(grad4);
  PassOp1("next_backward", {x}, true);
  ASSERT_TRUE(rt_->DropRef(grad4).ok());
  EXPECT_NE(rt_->storage(copy4)->constant_reason, ConstantReason::kAccumulator);
  // Nor is a buffer frozen for a gradient under a quarter of its size.
  const StorageId big = PassOp1("zeros_like", {x}, false, 1000);
  const StorageId small_grad = PassOp1("sum_backward", {x}, true, 200);
  accumulate(big, small_grad);
  ASSERT_TRUE(rt_->DropRef(small_grad).ok());
  EXPECT_TRUE(rt_->storage(big)->rematerializable());
  Check();
}

// Note [Gradients that keep dead constants]: a bias gradient summed from the contiguous copy of a
// frozen q/k/v sum keeps that sum resident, dead, through the evicted copy's record. When the
// optimizer (an op of no backward pass) reads the gradient it is frozen and both go. A gradient
// whose recipe reaches no dead constant, or only one under a quarter of its size, keeps its
// recipe, and a backward op reading it changes nothing.
TEST_F(RuntimeTest, AGradientKeepingADeadConstantIsFrozenWhenTheOptimizerReadsIt) {
  Make(1 << 20);
  // The frozen sum, its contiguous copy (dropped: evicted, its record kept for the gradient's
  // recipe) and the bias gradient summed from it.
  struct Chain {
    StorageId sum, copy, grad;
  };
  auto chain = [&](uint64_t sum_size) {
    Chain c;
    c.sum = Const(sum_size);
    c.copy = PassOp1("clone", {c.sum}, true, sum_size);
    // Over a quarter of the copy: Note [Smaller backward results] would freeze a smaller one
    // when the copy dies.
    c.grad = PassOp1("sum_backward", {c.copy}, true, 300);
    EXPECT_TRUE(rt_->DropRef(c.copy).ok());
    EXPECT_FALSE(Resident(c.copy));
    return c;
  };
  struct Case {
    uint64_t sum_size;
    bool held_sum;
    bool frozen;
  };
  for (Case c : {Case{1000, false, true}, Case{1000, true, false}, Case{8, false, false}}) {
    SCOPED_TRACE(absl::StrCat("sum of ", c.sum_size, " bytes, held ", c.held_sum));
    const auto [sum, copy, grad] = chain(c.sum_size);
    if (!c.held_sum) {
      ASSERT_TRUE(rt_->DropRef(sum).ok());
    }
    ASSERT_NE(rt_->storage(sum), nullptr);  // resident: the copy's recipe reads it
    PassOp1("next_backward", {grad}, true);
    EXPECT_TRUE(rt_->storage(grad)->rematerializable());
    const uint64_t before = rt_->memory();
    PassOp1("optimizer_step", {grad}, false, 1);
    EXPECT_EQ(rt_->storage(grad)->rematerializable(), !c.frozen);
    if (c.frozen) {
      EXPECT_EQ(rt_->storage(grad)->constant_reason, ConstantReason::kHeldResult);
      EXPECT_EQ(rt_->storage(sum), nullptr);
      EXPECT_EQ(rt_->storage(copy), nullptr);
      EXPECT_EQ(rt_->memory(), before + 1 - c.sum_size);
    } else {
      EXPECT_NE(rt_->storage(sum), nullptr);
    }
    Check();
  }
  // The torch layer holds an op's operands while it runs (OpCall::inputs_held), as for SGD's
  // first `torch.clone(grad)`: the gradient is frozen all the same and stays held.
  {
    const auto [sum, copy, grad] = chain(1000);
    ASSERT_TRUE(rt_->DropRef(sum).ok());
    ASSERT_TRUE(rt_->HoldOperand(grad).ok());
    CopyOf(grad, 300, /*whole=*/true, /*cost=*/1.0, /*inputs_held=*/true);
    EXPECT_EQ(rt_->storage(grad)->constant_reason, ConstantReason::kHeldResult);
    EXPECT_EQ(rt_->storage(sum), nullptr);
    EXPECT_EQ(rt_->storage(grad)->locks, 1u);
    rt_->ReleaseOperand(grad);
    Check();
  }
  // With freeze_held_results off (dtr-sim --keep-held-recipes) nothing is frozen.
  RuntimeConfig config = ExactDtrConfig(1 << 20);
  config.freeze_held_results = false;
  Make(config);
  const auto [sum, copy, grad] = chain(1000);
  ASSERT_TRUE(rt_->DropRef(sum).ok());
  PassOp1("optimizer_step", {grad}, false, 1);
  EXPECT_TRUE(rt_->storage(grad)->rematerializable());
  EXPECT_NE(rt_->storage(sum), nullptr);
  Check();
}

// Note [Copies of overwritten contents]: a whole copy of a storage an in-place op overwrites (what
// autograd saves for SiLU(inplace=True)) takes the op that made the original as its recipe
// instead of being frozen; a partial copy, an original already written in place, or a backend
// that cannot copy the replay handle leave it frozen as before.
TEST_F(RuntimeTest, ACopyOfOverwrittenContentsTakesItsOriginalsRecipe) {
  Make(kUnlimitedBudget);
  backend_.copy_replays = true;
  StorageId x = Const(4);
  auto copy_of = [&](StorageId original, uint64_t size, bool whole) { return CopyOf(original, size, whole, 0.5); };
  auto write = [&](StorageId target, const char* name) {
    StorageId t[] = {target};
    ASSERT_TRUE(rt_->Mutate({name, t, t, true, 0}, []() -> absl::StatusOr<double> { return 1.0; }).ok());
    Check();
  };
  auto reason = [&](StorageId id) { return rt_->storage(id)->constant_reason; };

  // The original is the second output of a two-output op, as batch norm's would be first.
  std::vector<StorageId> made = Op("bn", {x}, {2, 10}, /*cost=*/3);
  StorageId a = made[1];
  StorageId saved = copy_of(a, 10, true);
  write(a, "silu_");
  EXPECT_EQ(rt_->stats().copies_given_recipes, 1u);
  EXPECT_EQ(rt_->stats().detached, 0u);
  ASSERT_TRUE(rt_->storage(saved)->rematerializable());
  EXPECT_EQ(reason(saved), ConstantReason::kNone);
  ASSERT_EQ(rt_->storage(saved)->recipe.size(), 1u);
  const OpRecord* op = rt_->op(rt_->storage(saved)->recipe[0]);
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->name, "bn");
  EXPECT_EQ(op->inputs, (absl::InlinedVector<StorageId, 4>{x}));
  EXPECT_EQ(op->outputs, (absl::InlinedVector<StorageId, 2>{saved}));
  EXPECT_DOUBLE_EQ(rt_->storage(saved)->cost, 3.0);
  EXPECT_EQ(backend_.copied, (std::vector<std::pair<std::string, size_t>>{{"bn", 1}}));
  EXPECT_EQ(backend_.dropped_ops, (std::vector<std::string>{"clone"}));  // the copy op, read nothing else
  // The copy comes back by the producer alone; the original by the producer and the write.
  backend_.replays.clear();
  ASSERT_TRUE(rt_->Evict(saved).ok());
  ASSERT_TRUE(rt_->Access(saved).ok());
  EXPECT_EQ(backend_.replays, (std::vector<std::string>{"bn"}));
  EXPECT_EQ(backend_.keeps.back(), (std::vector<bool>{true}));
  backend_.replays.clear();
  ASSERT_TRUE(rt_->Evict(a).ok());
  ASSERT_TRUE(rt_->Access(a).ok());
  EXPECT_EQ(backend_.replays, (std::vector<std::string>{"bn", "silu_"}));
  Check();

  // An evicted copy is brought back by the copy op first, then takes the recipe.
  StorageId b = Op1("b", {x}, 10);
  StorageId evicted_copy = copy_of(b, 10, true);
  ASSERT_TRUE(rt_->Evict(evicted_copy).ok());
  backend_.replays.clear();
  write(b, "silu_");
  EXPECT_EQ(backend_.replays, (std::vector<std::string>{"clone"}));
  EXPECT_TRUE(Resident(evicted_copy));
  ASSERT_TRUE(rt_->storage(evicted_copy)->rematerializable());
  EXPECT_EQ(rt_->op(rt_->storage(evicted_copy)->recipe[0])->name, "b");
  EXPECT_EQ(rt_->stats().copies_given_recipes, 2u);

  // Frozen as before: a copy not known to be whole, ...
  StorageId c = Op1("c", {x}, 10);
  StorageId part = copy_of(c, 10, false);
  write(c, "silu_");
  EXPECT_EQ(reason(part), ConstantReason::kMutatedAncestor);
  // ... a copy of an original whose recipe already holds an in-place op, ...
  StorageId d = Op1("d", {x}, 10);
  write(d, "add_");
  StorageId of_written = copy_of(d, 10, true);
  write(d, "silu_");
  EXPECT_EQ(reason(of_written), ConstantReason::kMutatedAncestor);
  // ... a copy reached through a dead reader of the overwritten storage, ...
  StorageId e = Op1("e", {x}, 10);
  StorageId dead = Op1("neg", {e}, 10);
  StorageId copy_of_dead = copy_of(dead, 10, true);
  ASSERT_TRUE(rt_->DropRef(dead).ok());
  write(e, "silu_");
  EXPECT_EQ(reason(copy_of_dead), ConstantReason::kMutatedAncestor);
  // ... and a copy whose replay handle the backend cannot copy.
  backend_.copy_replays = false;
  StorageId f = Op1("f", {x}, 10);
  StorageId uncopied = copy_of(f, 10, true);
  write(f, "silu_");
  EXPECT_EQ(reason(uncopied), ConstantReason::kMutatedAncestor);
  EXPECT_EQ(rt_->stats().copies_given_recipes, 2u);
  EXPECT_EQ(rt_->stats().detached, 5u);  // the four frozen copies and the abandoned dead reader
  Check();
}

// Note [Constants by reason]: each way of becoming a constant leaves its own reason.
TEST_F(RuntimeTest, ConstantsKeepTheirReason) {
  MakeWithMaxDepth(3);
  auto reason = [&](StorageId id) { return rt_->storage(id)->constant_reason; };
  StorageId x = Const(4);
  EXPECT_EQ(reason(x), ConstantReason::kAdded);
  StorageId opaque = Op("opaque", {x}, {10}, 1, /*replayable=*/false)[0];
  EXPECT_EQ(reason(opaque), ConstantReason::kUnreplayableOp);
  StorageId a = Op1("a", {x}, 10);
  StorageId b = Op1("b", {a}, 10);
  EXPECT_EQ(reason(a), ConstantReason::kNone);
  StorageId a_only[] = {a};
  StorageId a_in[] = {a};
  // b read a's old contents: it is frozen; a's recipe goes on.
  ASSERT_TRUE(rt_->Mutate({"relu_", a_in, a_only, true, 0}, []() -> absl::StatusOr<double> { return 1.0; }).ok());
  EXPECT_EQ(reason(b), ConstantReason::kMutatedAncestor);
  EXPECT_EQ(reason(a), ConstantReason::kNone);
  ASSERT_TRUE(rt_->Mutate({"opaque_", a_in, a_only, false, 0}, []() -> absl::StatusOr<double> { return 1.0; }).ok());
  EXPECT_EQ(reason(a), ConstantReason::kUnreplayableWrite);
  // A chain deeper than max_replay_depth (3) is cut.
  StorageId c = Op1("c", {x}, 10), d = Op1("d", {c}, 10), e = Op1("e", {d}, 10), f = Op1("f", {e}, 10);
  EXPECT_EQ(reason(e), ConstantReason::kNone);
  EXPECT_EQ(reason(f), ConstantReason::kReplayDepth);
  // An overwriting op gives a constant a recipe again.
  StorageId x_only[] = {x};
  Runtime::MutateCall fill{"fill_", {}, x_only, true, 0};
  fill.overwrites = true;
  ASSERT_TRUE(rt_->Mutate(fill, []() -> absl::StatusOr<double> { return 1.0; }).ok());
  EXPECT_TRUE(rt_->storage(x)->rematerializable());
  EXPECT_EQ(reason(x), ConstantReason::kNone);
  Check();
}

TEST_F(RuntimeTest, MutationAbandonsUnreferencedEvictedReadersInsteadOfReplayingThem) {
  Make(kUnlimitedBudget);
  StorageId w = Const(4);   // a parameter
  StorageId x = Const(4);
  StorageId act = Op1("linear", {x, w}, 10);          // forward activation, reads w
  StorageId act2 = Op1("relu", {act}, 10);            // unreferenced later, evicted
  StorageId grad = Op1("linear_backward", {act2}, 4);  // the program keeps the gradient
  StorageId kept = Op1("other", {act}, 10);            // the program keeps this one, evicted
  ASSERT_TRUE(rt_->DropRef(act).ok());
  ASSERT_TRUE(rt_->DropRef(act2).ok());
  ASSERT_TRUE(rt_->Evict(kept).ok());
  ASSERT_FALSE(Resident(act));
  ASSERT_FALSE(Resident(act2));
  backend_.replays.clear();
  StorageId mutated[] = {w};
  StorageId inputs[] = {w, grad};
  ASSERT_TRUE(rt_->Mutate({"sgd_step_", inputs, mutated, true, 0}, []() -> absl::StatusOr<double> { return 1.0; }).ok());
  // Only `kept` (held by the program, evicted) was brought back, which needs act once; act2 was
  // never replayed. act and act2 were abandoned and collected, the resident gradient frozen.
  EXPECT_EQ(backend_.replays, (std::vector<std::string>{"linear", "other"}));
  EXPECT_EQ(rt_->storage(act), nullptr);
  EXPECT_EQ(rt_->storage(act2), nullptr);
  EXPECT_FALSE(rt_->storage(grad)->rematerializable());
  EXPECT_TRUE(Resident(kept));
  EXPECT_FALSE(rt_->storage(kept)->rematerializable());
  Check();
}

// Note [Mutation]: a resident reader of the mutated storage that the program no longer holds is
// dropped, not frozen: frozen, it would stay as a constant for as long as a dependent's recipe
// reads it. Its held evicted dependent is brought back (while the reader is still resident,
// so cheaply) and frozen.
TEST_F(RuntimeTest, MutationDropsDeadResidentReadersAfterBringingTheirHeldDependentsBack) {
  Make(kUnlimitedBudget);
  StorageId w = Const(4);
  StorageId x = Const(4);
  StorageId act = Op1("linear", {x, w}, 100);      // dropped by the program
  StorageId grad = Op1("backward", {act}, 4);      // held, evicted
  ASSERT_TRUE(rt_->Evict(grad).ok());
  ASSERT_TRUE(rt_->DropRef(act).ok());             // evicted eagerly
  ASSERT_TRUE(rt_->Access(grad).ok());             // act comes back for it and stays
  ASSERT_TRUE(rt_->Evict(grad).ok());
  ASSERT_TRUE(Resident(act));
  const uint64_t before = rt_->memory();
  backend_.replays.clear();
  StorageId mutated[] = {w};
  StorageId inputs[] = {w};
  ASSERT_TRUE(rt_->Mutate({"sgd_step_", inputs, mutated, true, 0}, []() -> absl::StatusOr<double> { return 1.0; }).ok());
  EXPECT_EQ(backend_.replays, (std::vector<std::string>{"backward"}));
  EXPECT_EQ(rt_->storage(act), nullptr);  // collected: its 100 bytes are free
  EXPECT_TRUE(Resident(grad));
  EXPECT_FALSE(rt_->storage(grad)->rematerializable());
  EXPECT_EQ(rt_->memory(), before - 100 + 4);
  Check();
}

// Note [Mutation]: held evicted dependents are brought back and frozen; a dependent that reads
// only frozen storages keeps its recipe.
TEST_F(RuntimeTest, MutationFreezesHeldReadersOnceBroughtBack) {
  Make(kUnlimitedBudget);
  StorageId w = Const(1);
  StorageId a = Op1("a", {w}, 10);
  StorageId b = Op1("b", {a}, 10);
  StorageId c = Op1("c", {a, b}, 10);
  StorageId d = Op1("d", {b}, 10);
  for (StorageId s : {a, b, c, d}) ASSERT_TRUE(rt_->Evict(s).ok());
  ASSERT_TRUE(rt_->DropRef(a).ok());
  backend_.replays.clear();
  StorageId mutated[] = {w};
  StorageId inputs[] = {w};
  ASSERT_TRUE(rt_->Mutate({"w_", inputs, mutated, true, 0}, []() -> absl::StatusOr<double> { return 1.0; }).ok());
  EXPECT_EQ(backend_.replays, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_FALSE(rt_->storage(b)->rematerializable());
  EXPECT_FALSE(rt_->storage(c)->rematerializable());
  EXPECT_EQ(rt_->storage(a), nullptr);
  // d reads only b, a constant with the right contents now: still evicted, still replayable.
  EXPECT_FALSE(Resident(d));
  ASSERT_TRUE(rt_->Access(d).ok());
  Check();
}

// Note [Results awaiting their reader]: a held storage no recipe reads (a gradient before the
// optimizer step) is evicted only when nothing else can be.
TEST_F(RuntimeTest, ResultsAwaitingTheirReaderAreVictimsOfLastResort) {
  Make(kUnlimitedBudget, HeuristicKind::kLru);
  StorageId x = Const(1);
  StorageId loss = Op1("loss", {x}, 1);      // what a gradient's replay would start from
  StorageId grad = Op1("grad", {loss}, 100);  // older than act: LRU's choice otherwise
  StorageId act = Op1("act", {x}, 100);
  StorageId next = Op1("next", {act}, 100);  // reads act
  ASSERT_TRUE(rt_->SetBudget(rt_->memory() - 2).ok());  // loss (1 byte) is not enough
  EXPECT_FALSE(Resident(loss));
  EXPECT_TRUE(Resident(grad));
  EXPECT_FALSE(Resident(act));
  auto ranked = rt_->RankedCandidates(8);
  ASSERT_EQ(ranked.size(), 2u);  // next (awaits its reader too) and grad, both last
  // When nothing else is left, they are evicted: the budget holds.
  ASSERT_TRUE(rt_->SetBudget(1 + 100).ok());
  EXPECT_EQ(int(Resident(grad)) + int(Resident(next)), 1);
  Check();
}

// Note [Results awaiting their reader]: a held, unread storage whose recipe is a single op of
// constants (replay depth 1: a gradient zeroed by zero_grad(set_to_none=False), a batch made by a
// factory) is brought back by that op alone, so it is an ordinary candidate, and the in-place
// accumulation that reads it replays only that op.
TEST_F(RuntimeTest, AZeroedGradientAwaitingItsReaderIsAnOrdinaryCandidate) {
  Make(kUnlimitedBudget, HeuristicKind::kLru);
  StorageId x = Const(1);
  StorageId grad = Const(100);  // a parameter's .grad from the last step
  StorageId grad_only[] = {grad};
  Runtime::MutateCall zero{"zero_", {}, grad_only, true, 0};
  zero.overwrites = true;
  ASSERT_TRUE(rt_->Mutate(zero, []() -> absl::StatusOr<double> { return 1.0; }).ok());
  EXPECT_EQ(rt_->storage(grad)->replay_depth, 1u);
  StorageId act = Op1("act", {x}, 100);
  StorageId next = Op1("next", {act}, 100);  // reads act
  ASSERT_TRUE(rt_->SetBudget(rt_->memory() - 1).ok());
  EXPECT_FALSE(Resident(grad));  // the least recently used, and cheap to bring back
  EXPECT_TRUE(Resident(act));
  // The backward pass accumulates into it in place: zero_ alone is replayed.
  StorageId contribution = Op1("grad_contribution", {next}, 100);
  ASSERT_TRUE(rt_->SetBudget(kUnlimitedBudget).ok());
  StorageId accumulate_in[] = {grad, contribution};
  ASSERT_TRUE(rt_->Mutate({"add_", accumulate_in, grad_only, true, 0},
                          []() -> absl::StatusOr<double> { return 1.0; }).ok());
  EXPECT_EQ(backend_.replays, (std::vector<std::string>{"zero_"}));
  // Now its recipe reads the contribution, whose own recipe reads more: a victim of last resort,
  // kept although it is the least recently used storage again.
  EXPECT_GT(rt_->storage(grad)->replay_depth, 1u);
  for (StorageId s : {act, next, contribution}) ASSERT_TRUE(rt_->Access(s).ok());
  ASSERT_TRUE(rt_->SetBudget(rt_->memory() - 1).ok());
  EXPECT_TRUE(Resident(grad));
  Check();
}

// Note [Held results of dead inputs]: when a storage dies, the held results of an op reading it
// are frozen if that op accumulated in place in a backward pass (a .grad) or is a forward op
// whose results the backward pass has gone past (the loss), and the dying storage is collected
// instead of evicted. In a forward pass a held result (an activation autograd saved) keeps its
// recipe, and so does a forward in-place sum; everything does with freeze_held_results off, and
// the loss does with backward_next_use 0 (the pass is not followed). The budget plays no part.
TEST_F(RuntimeTest, HeldResultsOfADyingStorageAreFrozenSoItIsCollected) {
  struct Case {
    bool option;
    uint64_t budget;  // 1 MiB never binds here
    double next_use;
  };
  std::vector<uint64_t> floors;
  for (Case c : {Case{true, 1 << 20, 0.75}, Case{false, 1 << 20, 0.75}, Case{true, kUnlimitedBudget, 0.75},
                 Case{true, 1 << 20, 0}}) {
    SCOPED_TRACE(absl::StrCat("freeze_held_results ", c.option, ", budget ", c.budget, ", next use ", c.next_use));
    RuntimeConfig config = ExactDtrConfig();
    config.freeze_held_results = c.option;
    config.budget_bytes = c.budget;
    config.backward_next_use = c.next_use;
    Make(config);
    const bool freeze = c.option;
    const bool freeze_loss = freeze && c.next_use > 0;
    const StorageId x = Const(1);
    // Forward pass: `saved` dies while `activation`, computed from it and held, waits for the
    // backward pass. Nothing is frozen.
    const StorageId saved = PassOp1("saved", {x}, false);
    const StorageId activation = PassOp1("activation", {saved}, false);
    const StorageId logits = PassOp1("logits", {activation}, false);
    // A sum a forward op accumulates in place, held, reading the logits.
    const StorageId running = PassOp1("running", {x}, false);
    std::vector<StorageId> sum_in{running, logits}, sum_out{running};
    ASSERT_TRUE(rt_->Mutate({"add_", sum_in, sum_out, true, 0}, []() -> absl::StatusOr<double> { return 1.0; }).ok());
    const StorageId loss = PassOp1("loss", {logits}, false);
    ASSERT_TRUE(rt_->DropRef(saved).ok());
    ASSERT_NE(rt_->storage(saved), nullptr);
    EXPECT_FALSE(Resident(saved));  // evicted: `activation`'s recipe reads it
    EXPECT_TRUE(rt_->storage(activation)->rematerializable());
    // A parameter's .grad, zeroed in place before the step.
    const StorageId grad = Const(100);
    std::vector<StorageId> grad_only{grad};
    Runtime::MutateCall zero{"zero_", {}, grad_only, true, 0};
    zero.overwrites = true;
    ASSERT_TRUE(rt_->Mutate(zero, []() -> absl::StatusOr<double> { return 1.0; }).ok());
    // Backward pass: the loss's input dies once read. The gradient it was read for still reads it,
    // so it is evicted either way, but the held loss no longer needs it.
    const StorageId grad_logits = PassOp1("loss_backward", {logits}, true);
    ASSERT_TRUE(rt_->DropRef(logits).ok());
    ASSERT_NE(rt_->storage(logits), nullptr);
    EXPECT_FALSE(Resident(logits));
    EXPECT_TRUE(Resident(loss));
    if (freeze_loss) {
      EXPECT_FALSE(rt_->storage(loss)->rematerializable());
      EXPECT_EQ(rt_->storage(loss)->constant_reason, ConstantReason::kHeldResult);
    } else {
      EXPECT_TRUE(rt_->storage(loss)->rematerializable());
    }
    EXPECT_TRUE(rt_->storage(running)->rematerializable());  // an in-place op of a forward pass
    // The backward pass accumulates a contribution into the .grad in place; the contribution dies.
    const StorageId contribution = PassOp1("linear_backward", {grad_logits, activation}, true);
    std::vector<StorageId> accumulate_in{grad, contribution};
    Runtime::MutateCall accumulate{"add_", accumulate_in, grad_only, true, 0};
    accumulate.backward = true;
    ASSERT_TRUE(rt_->Mutate(accumulate, []() -> absl::StatusOr<double> { return 1.0; }).ok());
    ASSERT_TRUE(rt_->storage(grad)->rematerializable());
    ASSERT_TRUE(rt_->DropRef(contribution).ok());
    if (freeze) {
      EXPECT_EQ(rt_->storage(contribution), nullptr);
      EXPECT_EQ(rt_->storage(grad)->constant_reason, ConstantReason::kHeldResult);
      EXPECT_TRUE(Resident(grad));
    } else {
      ASSERT_NE(rt_->storage(contribution), nullptr);
      EXPECT_FALSE(Resident(contribution));
      EXPECT_EQ(rt_->storage(grad)->recipe.size(), 2u);  // zero_, then add_ of the contribution
    }
    // The activation saved for the backward pass kept its recipe all along.
    EXPECT_TRUE(rt_->storage(activation)->rematerializable());
    // Note [Memory floor] counts what the runtime froze as evictable: the same floor either way,
    // set by this op, the largest (its operands count in full).
    std::vector<StorageId> step_in{grad, loss};
    std::vector<uint64_t> step_sizes{10000};
    ASSERT_TRUE(rt_->Compute({"optimizer_step", step_in, step_sizes, true, 0},
                             [](absl::Span<const StorageId>) -> absl::StatusOr<double> { return 1.0; })
                    .ok());
    floors.push_back(rt_->stats().floor_bytes);
    Check();
    // zero_grad again: the overwrite makes the frozen .grad a fill's result, no longer frozen.
    ASSERT_TRUE(rt_->Mutate(zero, []() -> absl::StatusOr<double> { return 1.0; }).ok());
    EXPECT_TRUE(rt_->storage(grad)->rematerializable());
    Check();
  }
  EXPECT_THAT(floors, ::testing::Each(floors[0]));
}

// Note [Held results of dead inputs]: the logits a program holds in its model's output are frozen
// when the final hidden state dies in the backward pass, also when the backward op that read it
// last had to bring it back first. Such an input does not move the mirror of Note [Next use in a
// backward pass]; it moves the reach, which says the pass has gone back past the logits. With
// the mirror as the rule's test, a Hugging Face Llama's logits kept their recipe, and the
// optimizer's first update replayed the forward pass to bring them back (Note [Mutation]).
TEST_F(RuntimeTest, HeldLogitsAreFrozenWhenTheirInputDiesAfterABackwardOpBroughtItBack) {
  RuntimeConfig config = ExactDtrConfig(1 << 20);  // never binds
  Make(config);
  const StorageId weight = Const(100);
  const StorageId hidden = PassOp1("norm", {weight}, false);
  const StorageId logits = PassOp1("lm_head", {hidden, weight}, false);
  const StorageId log_probs = PassOp1("log_softmax", {logits}, false);
  const StorageId loss = PassOp1("nll_loss", {log_probs}, false);
  // The backward pass reads the log-probabilities, computed after the logits: it has not gone
  // back past them yet.
  const StorageId grad_logits = PassOp1("nll_loss_backward", {log_probs}, true);
  ASSERT_TRUE(rt_->DropRef(log_probs).ok());
  // lm_head's backward reads the hidden state, evicted meanwhile, and brings it back.
  ASSERT_TRUE(rt_->Evict(hidden).ok());
  const StorageId grad_weight = PassOp1("lm_head_backward", {grad_logits, hidden}, true);
  EXPECT_TRUE(Resident(hidden));
  ASSERT_TRUE(rt_->DropRef(hidden).ok());
  EXPECT_TRUE(Resident(logits));
  EXPECT_FALSE(rt_->storage(logits)->rematerializable());
  EXPECT_EQ(rt_->storage(logits)->constant_reason, ConstantReason::kHeldResult);
  // The hidden state is evicted, its record kept for the weight gradient's recipe, which reads it.
  ASSERT_NE(rt_->storage(hidden), nullptr);
  EXPECT_FALSE(Resident(hidden));
  EXPECT_TRUE(rt_->storage(grad_weight)->rematerializable());
  // The loss was frozen when the log-probabilities died: the pass had read back to them.
  EXPECT_EQ(rt_->storage(loss)->constant_reason, ConstantReason::kHeldResult);
  Check();
}

// Note [Kept inputs of held results]: when the hidden state dies, logits many times its size keep
// their one-op recipe, and the hidden state stays as a constant instead: the logits can be
// evicted in the backward pass and brought back by one replay. The optimizer's update of the
// weight brings them back and freezes them (Note [Mutation]), and the hidden state goes with the
// last recipe reading it.
TEST_F(RuntimeTest, HeldLogitsKeepTheirRecipeAndTheirMuchSmallerInputIsKeptInstead) {
  RuntimeConfig config = ExactDtrConfig(1 << 20);  // never binds
  Make(config);
  const StorageId weight = Const(100);
  const StorageId hidden = PassOp1("norm", {weight}, false, 100);
  const StorageId logits = PassOp1("lm_head", {hidden, weight}, false, 1000);
  const StorageId log_probs = PassOp1("log_softmax", {logits}, false, 1000);
  const StorageId loss = PassOp1("nll_loss", {log_probs}, false, 4);
  const StorageId grad_logits = PassOp1("nll_loss_backward", {log_probs}, true, 1000);
  ASSERT_TRUE(rt_->DropRef(log_probs).ok());
  const StorageId grad_weight = PassOp1("lm_head_backward", {grad_logits, hidden}, true, 100);
  ASSERT_TRUE(rt_->DropRef(grad_logits).ok());
  ASSERT_TRUE(rt_->DropRef(hidden).ok());
  EXPECT_TRUE(Resident(hidden));
  EXPECT_EQ(rt_->storage(hidden)->constant_reason, ConstantReason::kKeptInput);
  EXPECT_TRUE(rt_->storage(logits)->rematerializable());
  EXPECT_EQ(rt_->storage(loss)->constant_reason, ConstantReason::kHeldResult);
  Check();
  ASSERT_TRUE(rt_->Evict(logits).ok());
  const uint64_t replays = rt_->stats().replays;
  ASSERT_TRUE(rt_->Access(logits).ok());
  EXPECT_EQ(rt_->stats().replays, replays + 1);
  ASSERT_TRUE(rt_->Evict(logits).ok());
  Check();
  // The update brings the held logits back (they read the old weight) and freezes them.
  std::vector<StorageId> update{weight};
  ASSERT_TRUE(rt_->Mutate({"add_", update, update, true, 0}, []() -> absl::StatusOr<double> { return 1.0; }).ok());
  EXPECT_TRUE(Resident(logits));
  EXPECT_FALSE(rt_->storage(logits)->rematerializable());
  // Nothing reads the hidden state any more: the weight's gradient, ten times smaller than the
  // logits' gradient it was computed from, was frozen when that died (Note [Smaller backward
  // results]).
  EXPECT_EQ(rt_->storage(grad_weight)->constant_reason, ConstantReason::kHeldResult);
  EXPECT_EQ(rt_->storage(hidden), nullptr);
  Check();
}

// Note [Smaller backward results]: a dying storage's backward reader whose held result is at most a
// quarter of its size has that result frozen, and the dying storage is collected with the records
// behind it; a larger result keeps its recipe, and the dying storage is evicted with its record
// kept. With freeze_held_results off (dtr-sim --keep-held-recipes) nothing is frozen.
TEST_F(RuntimeTest, ASmallerBackwardResultIsFrozenSoItsDyingInputIsCollected) {
  for (bool rule : {true, false}) {
    SCOPED_TRACE(absl::StrCat("freeze_held_results ", rule));
    RuntimeConfig config = ExactDtrConfig(1 << 20);
    config.freeze_held_results = rule;
    Make(config);
    const StorageId x = Const(1);
    for (uint64_t result_size : {250, 251}) {
      SCOPED_TRACE(absl::StrCat("result of ", result_size, " bytes"));
      const StorageId grad = PassOp1("mul_backward", {x}, true, 1000);
      const StorageId sum = PassOp1("sum_backward", {grad}, true, result_size);
      ExpectDeathFreezes(grad, 1000, sum, rule && result_size == 250);
    }
  }
}

// Note [Frozen results pass it on], by default: a gradient sum frozen when its contribution died
// (Note [Held results of dead inputs]) and then dying itself freezes the held result of the
// backward op that read it and is collected, instead of staying resident as a dead constant for
// that result's recipe. (HF Mamba's scan summed two 2 MiB gradients so, read by exp's backward:
// four such sums stayed resident through the rest of the backward pass.)
TEST_F(RuntimeTest, AFrozenSumThatDiesPassesItOnAndIsCollected) {
  for (bool rule : {true, false}) {
    SCOPED_TRACE(absl::StrCat("freeze_held_results ", rule));
    RuntimeConfig config = ExactDtrConfig(1 << 20);
    config.freeze_held_results = rule;
    Make(config);
    const StorageId x = Const(1);
    const StorageId sum = PassOp1("select_backward", {x}, true, 1000);
    const StorageId contribution = PassOp1("select_backward", {x}, true, 1000);
    std::vector<StorageId> reads{sum, contribution}, written{sum};
    Runtime::MutateCall add{"add_", reads, written, true, 0};
    add.backward = true;
    ASSERT_TRUE(rt_->Mutate(add, []() -> absl::StatusOr<double> { return 1.0; }).ok());
    ASSERT_TRUE(rt_->DropRef(contribution).ok());
    EXPECT_EQ(rt_->storage(sum)->rematerializable(), !rule);
    const StorageId grad = PassOp1("exp_backward", {sum, x}, true, 1000);
    ExpectDeathFreezes(sum, 1000, grad, rule);
  }
}

// An optimizer's update that cannot bring back an evicted gradient fails out of memory, and the
// error names DTR_FREEZE_GRADIENTS, which keeps gradients instead (Note [Frozen results pass it
// on]); with the option on, or for a held storage of the forward pass, it does not.
TEST_F(RuntimeTest, AnUpdateThatCannotBringBackAGradientNamesFrozenGradients) {
  for (bool backward : {true, false}) {
    SCOPED_TRACE(absl::StrCat("held result of a backward op ", backward));
    RuntimeConfig config = ExactDtrConfig(1 << 20);
    Make(config);
    const StorageId weight = Const(100);
    const StorageId activation = PassOp1("linear", {weight}, false);
    const StorageId grad = PassOp1(backward ? "linear_backward" : "scale", {activation}, backward);
    ASSERT_TRUE(rt_->DropRef(activation).ok());
    ASSERT_TRUE(rt_->Evict(grad).ok());
    ASSERT_FALSE(Resident(activation));
    // No room to replay the two ops behind the gradient.
    ASSERT_TRUE(rt_->SetBudget(rt_->memory() + 50).ok());
    std::vector<StorageId> update{weight};
    absl::Status s = rt_->Mutate({"add_", update, update, true, 0}, []() -> absl::StatusOr<double> { return 1.0; });
    ASSERT_TRUE(absl::IsResourceExhausted(s)) << s;
    EXPECT_EQ(absl::StrContains(s.message(), "DTR_FREEZE_GRADIENTS=1"), backward) << s;
    EXPECT_EQ(absl::StrContains(s.message(), "an optimizer's step"), backward) << s;
    Check();
  }
}

// The same failure inside a backward pass is autograd accumulating a gradient in place, and the
// hint says so instead of calling it an optimizer's step.
TEST_F(RuntimeTest, AnAccumulationInTheBackwardPassThatCannotBringBackAGradientSaysSo) {
  RuntimeConfig config = ExactDtrConfig(1 << 20);
  Make(config);
  const StorageId weight = Const(100);
  const StorageId activation = PassOp1("linear", {weight}, false);
  const StorageId grad = PassOp1("linear_backward", {activation}, true);
  ASSERT_TRUE(rt_->DropRef(activation).ok());
  ASSERT_TRUE(rt_->Evict(grad).ok());
  ASSERT_FALSE(Resident(activation));
  ASSERT_TRUE(rt_->SetBudget(rt_->memory() + 50).ok());
  std::vector<StorageId> update{weight};
  Runtime::MutateCall call{"add_", update, update, true, 0};
  call.backward = true;
  absl::Status s = rt_->Mutate(call, []() -> absl::StatusOr<double> { return 1.0; });
  ASSERT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "DTR_FREEZE_GRADIENTS=1")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "accumulation of a gradient in the backward pass")) << s;
  EXPECT_FALSE(absl::StrContains(s.message(), "optimizer")) << s;
  Check();
}

// Note [Frozen results pass it on]: a backward pass's gradients are frozen when their input dies,
// and a frozen gradient that dies once the next backward ops have read it freezes their held
// results in turn and is collected, instead of staying resident as a dead constant that their
// recipes read.
TEST_F(RuntimeTest, AFrozenGradientThatDiesFreezesItsReadersAndIsCollected) {
  for (bool option : {true, false}) {
    SCOPED_TRACE(absl::StrCat("freeze_backward_results ", option));
    RuntimeConfig config = ExactDtrConfig(1 << 20);
    config.freeze_backward_results = option;
    Make(config);
    const StorageId x = Const(1);
    const StorageId h1 = PassOp1("layer1", {x}, false);
    const StorageId h2 = PassOp1("layer2", {h1}, false);
    const StorageId seed = PassOp1("ones_like", {h2}, true);
    const StorageId g2 = PassOp1("layer2_backward", {seed, h1}, true);
    ASSERT_TRUE(rt_->DropRef(seed).ok());
    // Frozen, g2 no longer reads the seed, which is collected; kept, the seed is evicted.
    EXPECT_EQ(rt_->storage(seed) == nullptr, option);
    EXPECT_EQ(rt_->storage(g2)->rematerializable(), !option);
    const StorageId g1 = PassOp1("layer1_backward", {g2, x}, true);
    const StorageId w_grad = PassOp1("layer1_weight_backward", {g2, h1}, true);
    const uint64_t before = rt_->memory();
    ASSERT_TRUE(rt_->DropRef(g2).ok());
    // Either way g2's memory goes: collected, or (kept) evicted for g1's and w_grad's recipes.
    EXPECT_EQ(rt_->memory(), before - 100);
    EXPECT_EQ(rt_->storage(g2) == nullptr, option);
    for (StorageId g : {g1, w_grad}) {
      EXPECT_EQ(rt_->storage(g)->rematerializable(), !option);
      EXPECT_EQ(rt_->storage(g)->constant_reason, option ? ConstantReason::kHeldResult : ConstantReason::kNone);
    }
    // A forward activation the backward pass read keeps its recipe.
    EXPECT_TRUE(rt_->storage(h1)->rematerializable());
    ASSERT_TRUE(rt_->DropRef(h2).ok());
    Check();
  }
}

// Note [Dead siblings of a held result]: nll_loss returns the loss and total_weight. Here the
// program drops total_weight while a forward op's held result still reads it, so it is evicted
// with its record kept. When the log-probabilities die in the backward pass the held loss is
// frozen all the same (the op's record stays for the dead sibling), so an optimizer step never
// has to replay the forward pass to bring the loss back.
TEST_F(RuntimeTest, AHeldLossIsFrozenThoughADeadSiblingKeepsItsOp) {
  for (bool option : {true, false}) {
    SCOPED_TRACE(absl::StrCat("freeze_held_results ", option));
    RuntimeConfig config = ExactDtrConfig();
    config.freeze_held_results = option;
    config.budget_bytes = 1 << 20;
    Make(config);
    const StorageId x = Const(1);
    const StorageId log_probs = PassOp("log_softmax", {x}, {100}, false)[0];
    const std::vector<StorageId> nll = PassOp("nll_loss_forward", {log_probs}, {4, 4}, false);
    ASSERT_EQ(nll.size(), 2u);
    const StorageId loss = nll[0], total_weight = nll[1];
    const StorageId scaled = PassOp("scale", {total_weight}, {4}, false)[0];
    ASSERT_TRUE(rt_->DropRef(total_weight).ok());
    ASSERT_NE(rt_->storage(total_weight), nullptr);  // `scaled`'s recipe reads it
    EXPECT_FALSE(Resident(total_weight));
    const StorageId grad = PassOp("nll_loss_backward", {log_probs}, {100}, true)[0];
    ASSERT_TRUE(rt_->DropRef(log_probs).ok());
    EXPECT_TRUE(Resident(loss));
    EXPECT_EQ(rt_->storage(loss)->rematerializable(), !option);
    EXPECT_EQ(rt_->storage(loss)->constant_reason, option ? ConstantReason::kHeldResult : ConstantReason::kNone);
    // The dead sibling keeps its recipe, and with it the op and the dying storage's record.
    EXPECT_TRUE(rt_->storage(total_weight)->rematerializable());
    ASSERT_NE(rt_->storage(log_probs), nullptr);
    EXPECT_FALSE(Resident(log_probs));
    EXPECT_TRUE(rt_->storage(scaled)->rematerializable());
    // The gradient, a functional backward op's result, keeps its recipe (Note [Frozen results pass
    // it on] is off by default).
    EXPECT_TRUE(rt_->storage(grad)->rematerializable());
    Check();
  }
}

// Note [Memory floor]: unevictable bytes plus the largest op's evictable inputs and outputs.
TEST_F(RuntimeTest, FloorIsUnevictableBytesPlusTheWorstOpsOperands) {
  Make(kUnlimitedBudget);
  StorageId x = Const(7);
  StorageId a = Op1("a", {x}, 10);
  StorageId b = Op1("b", {a}, 20);
  EXPECT_EQ(rt_->stats().floor_bytes, 7u + 10 + 20);
  ASSERT_TRUE(rt_->DropRef(a).ok());  // evicted eagerly
  Op1("c", {b}, 5);
  EXPECT_EQ(rt_->stats().floor_bytes, 7u + 10 + 20);  // c needed 7 + 20 + 5 only
  Check();
}

// Note [Scratch memory]: an op's workspace is room the budget must hold while the op runs, when
// it first runs and when it is replayed, and part of its working set, but never resident after.
TEST_F(RuntimeTest, ScratchMemoryIsMadeRoomForWhenTheOpRunsAndWhenItIsReplayed) {
  Make(40);
  StorageId x = Const(5);
  std::vector<StorageId> in{x};
  std::vector<uint64_t> sizes{10};
  Runtime::OpCall conv{"conv", in, sizes, true, 0};
  conv.scratch_bytes = 15;
  auto a = rt_->Compute(conv, [&](absl::Span<const StorageId>) -> absl::StatusOr<double> { return 1.0; });
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(rt_->memory(), 15u);  // the workspace is gone once the op returns
  EXPECT_EQ(rt_->stats().peak_memory_bytes, 30u);
  EXPECT_EQ(rt_->stats().floor_bytes, 30u);
  EXPECT_EQ(rt_->stats().largest_op_bytes, 30u);
  EXPECT_EQ(rt_->op(rt_->storage((*a)[0])->recipe[0])->scratch_bytes, 15u);
  StorageId b = Op1("b", {(*a)[0]}, 10);
  Op1("c", {b}, 10);
  ASSERT_EQ(rt_->memory(), 35u);
  ASSERT_TRUE(rt_->Evict((*a)[0]).ok());
  const uint64_t evictions = rt_->stats().evictions;
  // 25 resident: replaying conv needs its 10-byte output and 15 bytes of workspace, so 10 more
  // must go first (without the workspace, 35 would have fit).
  ASSERT_TRUE(rt_->Access((*a)[0]).ok());
  ASSERT_EQ(backend_.replays, std::vector<std::string>{"conv"});
  EXPECT_LE(backend_.memory_at_replays[0] + 10 + 15, 40u);
  EXPECT_EQ(rt_->stats().evictions, evictions + 1);
  EXPECT_LE(rt_->stats().peak_memory_bytes, 40u);
  Check();
}

TEST_F(RuntimeTest, ScratchMemoryLearnedWhileTheOpRunsIsKept) {
  Make(kUnlimitedBudget);
  StorageId x = Const(5);
  auto a = rt_->Compute({"conv", std::vector<StorageId>{x}, std::vector<uint64_t>{10}, true, 0},
                        [&](absl::Span<const StorageId>) -> absl::StatusOr<double> {
                          rt_->ReportScratch(60);
                          rt_->ReportScratch(40);  // the largest report wins
                          return 1.0;
                        });
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(rt_->op(rt_->storage((*a)[0])->recipe[0])->scratch_bytes, 60u);
  EXPECT_EQ(rt_->stats().peak_memory_bytes, 75u);
  EXPECT_EQ(rt_->stats().floor_bytes, 75u);
  EXPECT_EQ(rt_->stats().largest_op_bytes, 75u);
  // An in-place op: the larger of what the call knew and what it reported.
  std::vector<StorageId> ins{(*a)[0], x}, mutated{(*a)[0]};
  Runtime::MutateCall add{"add_", ins, mutated};
  add.scratch_bytes = 30;
  ASSERT_TRUE(rt_->Mutate(add, [&]() -> absl::StatusOr<double> {
                    rt_->ReportScratch(20);
                    return 1.0;
                  }).ok());
  ASSERT_EQ(rt_->storage((*a)[0])->recipe.size(), 2u);
  EXPECT_EQ(rt_->op(rt_->storage((*a)[0])->recipe[1])->scratch_bytes, 30u);
  // A report does not outlive its op, not even one that failed.
  auto failed = rt_->Compute({"boom", std::vector<StorageId>{x}, std::vector<uint64_t>{10}, true, 0},
                             [&](absl::Span<const StorageId>) -> absl::StatusOr<double> {
                               rt_->ReportScratch(500);
                               return absl::InternalError("the op threw");
                             });
  ASSERT_FALSE(failed.ok());
  StorageId b = Op1("b", {(*a)[0]}, 10);
  EXPECT_EQ(rt_->op(rt_->storage(b)->recipe[0])->scratch_bytes, 0u);
  Check();
}

// Note [Recomputation limit]: a budget that only thrashes fails with a clear error instead of
// running ever slower, loses nothing, and starts afresh after the error or a new budget.
TEST_F(RuntimeTest, ThrashingPastTheRecomputationLimitFailsClearly) {
  std::vector<StorageId> chain;
  absl::Status error = ThrashAChain(/*limit=*/0, /*gap=*/0, &chain);
  EXPECT_TRUE(error.ok()) << error;  // no limit: slow, but it runs
  const double unlimited_remat = rt_->stats().remat_cost;
  EXPECT_GT(unlimited_remat, 20 * rt_->stats().base_cost);

  error = ThrashAChain(/*limit=*/4, /*gap=*/0, &chain);
  ASSERT_EQ(error.code(), absl::StatusCode::kResourceExhausted) << error;
  EXPECT_THAT(std::string(error.message()), HasSubstr("too small to train at a useful speed"));
  EXPECT_THAT(std::string(error.message()), HasSubstr("DTR_MAX_RECOMPUTE=0"));
  // It fired once the replays had cost about 4x the work, long before the unlimited run's total.
  EXPECT_LT(rt_->stats().remat_cost, 6 * rt_->stats().base_cost);
  // Nothing was lost: with room, every activation comes back.
  ASSERT_TRUE(rt_->SetBudget(kUnlimitedBudget - 1).ok());
  for (StorageId id : chain) EXPECT_TRUE(rt_->Access(id).ok());
  Check();
}

// Note [Program time between ops]: the window weighs the replays against the program's time
// between its ops as well as its ops' costs, so the thrash above, in a program that spends 100
// between reads, costs far less than 4x its time and passes a limit of 4; without the gaps the
// same reads fail it.
TEST_F(RuntimeTest, ProgramTimeBetweenOpsCountsTowardTheRecomputationLimit) {
  std::vector<StorageId> chain;
  EXPECT_EQ(ThrashAChain(/*limit=*/4, /*gap=*/0, &chain).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(ThrashAChain(/*limit=*/4, /*gap=*/100, &chain).ok());
  EXPECT_GT(rt_->stats().remat_cost, 20 * rt_->stats().base_cost);  // it did thrash
}

// Note [Dead constants in accumulating recipes]: SGD with momentum, step after step. The
// parameter update freezes the step's gradient (a dependent of the parameter); the momentum
// buffer's recipe reads it through add_. Once the program drops the gradient, nothing may keep
// it: memory must not grow by a gradient per step.
TEST_F(RuntimeTest, DeadGradientsReadByAnAccumulatorAreReleasedEachStep) {
  Make(kUnlimitedBudget);
  constexpr uint64_t kParam = 1000, kAct = 10;
  StorageId w = Const(kParam);
  StorageId buf;
  uint64_t memory_after_first_step = 0;
  for (int step = 0; step < 6; ++step) {
    StorageId x = Const(kAct);
    StorageId act = Op1("linear", {x, w}, kAct);
    StorageId grad = Op1("linear_backward", {act, x}, kParam);
    ASSERT_TRUE(rt_->DropRef(act).ok());
    if (step == 0) {
      buf = Op1("clone", {grad}, kParam);
    } else {
      StorageId buf_only[] = {buf};
      StorageId grad_in[] = {grad};
      ASSERT_TRUE(rt_->Mutate({"mul_", {}, buf_only, true, 0}, []() -> absl::StatusOr<double> { return 1.0; }).ok());
      ASSERT_TRUE(rt_->Mutate({"add_", grad_in, buf_only, true, 0}, []() -> absl::StatusOr<double> { return 1.0; }).ok());
    }
    StorageId w_only[] = {w};
    StorageId buf_in[] = {buf};
    ASSERT_TRUE(rt_->Mutate({"add_", buf_in, w_only, false, 0}, []() -> absl::StatusOr<double> { return 1.0; }).ok());
    ASSERT_TRUE(rt_->DropRef(grad).ok());
    ASSERT_TRUE(rt_->DropRef(x).ok());
    Check();
    if (step == 1) memory_after_first_step = rt_->memory();
    if (step > 1) { EXPECT_EQ(rt_->memory(), memory_after_first_step) << "step " << step; }
    if (step >= 1) { EXPECT_EQ(rt_->storage(grad), nullptr) << "step " << step; }
  }
  EXPECT_TRUE(Resident(buf));
}

// Note [Bounded replay chains]: acc = acc * 0.9 + x carried across steps.
TEST_F(RuntimeTest, ReplayChainsCarriedAcrossStepsAreCutAtMaxDepth) {
  MakeWithMaxDepth(10);  // Note [Bounded replay chains]
  StorageId acc = Op1("zeros", {}, 100);
  size_t records_at_step_20 = 0;
  for (int step = 0; step < 60; ++step) {
    StorageId x = Op1("randn", {}, 100);
    StorageId scaled = Op1("mul", {acc}, 100);
    StorageId next = Op1("add", {scaled, x}, 100);
    ASSERT_TRUE(rt_->DropRef(scaled).ok());
    ASSERT_TRUE(rt_->DropRef(x).ok());
    ASSERT_TRUE(rt_->DropRef(acc).ok());
    acc = next;
    Check();
    if (rt_->storage(acc)->rematerializable()) { EXPECT_LE(rt_->storage(acc)->replay_depth, 10u); }
    if (step == 20) records_at_step_20 = rt_->storage_count();
    if (step > 20) { EXPECT_LE(rt_->storage_count(), records_at_step_20 + 20) << "step " << step; }
  }
  EXPECT_GE(rt_->stats().depth_limited, 60u * 2 / 10 - 1);
  // Bringing acc back replays at most one chain segment: up to 10 levels of mul and add, and
  // the randn beside each add.
  if (rt_->storage(acc)->rematerializable()) { ASSERT_TRUE(rt_->Evict(acc).ok()); }
  backend_.replays.clear();
  ASSERT_TRUE(rt_->Access(acc).ok());
  EXPECT_LE(backend_.replays.size(), 15u);
}

TEST_F(RuntimeTest, InPlaceRecipesAreCutAtMaxDepth) {
  MakeWithMaxDepth(8);  // Note [Bounded replay chains]
  StorageId buf = Op1("zeros", {}, 100);
  StorageId only[] = {buf};
  for (int i = 0; i < 30; ++i) {
    ASSERT_TRUE(rt_->Mutate({"mul_", {}, only, true, 0}, []() -> absl::StatusOr<double> { return 1.0; }).ok());
    Check();
    EXPECT_LE(rt_->storage(buf)->recipe.size(), 8u);
  }
  // Frozen once, at depth 9: a constant from then on, whatever is written into it.
  EXPECT_EQ(rt_->stats().depth_limited, 1u);
  EXPECT_FALSE(rt_->storage(buf)->rematerializable());
}

TEST_F(RuntimeTest, StoragesBroughtBackForADependentStayResident) {
  Make(kUnlimitedBudget);
  StorageId x = Const(1);
  StorageId a = Op1("a", {x}, 10);
  StorageId b = Op1("b", {a}, 10);
  StorageId c = Op1("c", {a}, 10);
  ASSERT_TRUE(rt_->DropRef(a).ok());  // eagerly evicted
  ASSERT_TRUE(rt_->Evict(b).ok());
  ASSERT_TRUE(rt_->Evict(c).ok());
  ASSERT_TRUE(rt_->Access(b).ok());
  ASSERT_TRUE(rt_->Access(c).ok());
  // a came back once for b and stayed for c: no second replay of a.
  EXPECT_EQ(backend_.replays, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(Resident(a));
  Check();
}

TEST_F(RuntimeTest, MutatingSeveralStoragesMakesThemConstants) {
  Make(kUnlimitedBudget);
  StorageId x = Const(4);
  StorageId a = Op1("a", {x}, 10);
  StorageId b = Op1("b", {x}, 10);
  StorageId both[] = {a, b};
  ASSERT_TRUE(rt_->Mutate({"swap_", both, both, true, 0}, []() -> absl::StatusOr<double> { return 1.0; }).ok());
  EXPECT_FALSE(rt_->storage(a)->rematerializable());
  EXPECT_FALSE(rt_->storage(b)->rematerializable());
  Check();
}

// Note [Records of writes the runtime keeps] (hooks/fallback.cc): RecordsWrite tells beforehand
// whether Mutate keeps an in-place op's record, so the torch layer makes records only for those.
TEST_F(RuntimeTest, RecordsWriteSaysWhetherMutateKeepsTheRecord) {
  Make(kUnlimitedBudget);
  StorageId x = Const(4);
  StorageId a = Op1("a", {x}, 10);
  StorageId b = Op1("b", {x}, 10);
  const auto mutate = [&](std::vector<StorageId> written, bool overwrites) {
    const bool said = rt_->RecordsWrite(written, overwrites);
    bool recorded = false;
    Runtime::MutateCall mc{"w_", written, written, true, 7};
    mc.overwrites = overwrites;
    mc.recorded = &recorded;
    EXPECT_TRUE(rt_->Mutate(mc, []() -> absl::StatusOr<double> { return 1.0; }).ok());
    EXPECT_EQ(said, recorded);
    return recorded;
  };
  EXPECT_TRUE(mutate({a}, false));       // a recipe to extend
  EXPECT_TRUE(mutate({a, a}, false));    // the same storage twice
  EXPECT_FALSE(mutate({x}, false));      // a constant: its record would go unused
  EXPECT_TRUE(mutate({x}, true));        // overwritten whole: the recipe starts here
  EXPECT_FALSE(mutate({a, b}, false));   // two storages become constants
  EXPECT_FALSE(rt_->RecordsWrite({}, false));
  Check();
}

TEST_F(RuntimeTest, NeighborhoodCostsMatchTheirDefinitions) {
  for (HeuristicKind h : {HeuristicKind::kDtr, HeuristicKind::kDtrEq, HeuristicKind::kMsps}) {
    Make(kUnlimitedBudget, h);
    StorageId x = Const(1);
    StorageId a = Op1("a", {x}, 2, 1);
    StorageId b = Op1("b", {a}, 2, 2);
    StorageId c = Op1("c", {b}, 2, 4);
    StorageId d = Op1("d", {c}, 2, 8);
    StorageId e = Op1("e", {d}, 2, 16);
    ASSERT_TRUE(rt_->Evict(b).ok());
    ASSERT_TRUE(rt_->Evict(c).ok());
    ASSERT_TRUE(rt_->Evict(e).ok());
    double staleness = rt_->now() - rt_->storage(d)->last_access + 1;
    double expected_neighborhood = h == HeuristicKind::kMsps ? 2 + 4 : 2 + 4 + 16;
    double expected = h == HeuristicKind::kMsps ? (8 + expected_neighborhood) / 2
                                                : (8 + expected_neighborhood) / (2 * staleness);
    EXPECT_DOUBLE_EQ(rt_->ScoreOf(d), expected) << HeuristicName(h);
    double a_staleness = rt_->now() - rt_->storage(a)->last_access + 1;
    double a_expected = h == HeuristicKind::kMsps ? 1.0 / 2 : (1 + 2 + 4) / (2 * a_staleness);
    EXPECT_DOUBLE_EQ(rt_->ScoreOf(a), a_expected) << HeuristicName(h);
    Check();
  }
}

// Note [Bounded neighborhood walks]: each direction of the walk stops after
// neighborhood_walk_limit evicted storages; 0 walks the whole evicted neighborhood.
TEST_F(RuntimeTest, NeighborhoodWalksStopAtTheWalkLimit) {
  // {heuristic, limit, expected neighborhood cost of d}. Upstream of d, c, b and a are evicted
  // (costs 4, 2, 1, visited in that order); downstream e (16) is.
  struct Case {
    HeuristicKind h;
    uint32_t limit;
    double neighborhood;
  };
  for (Case k : {Case{HeuristicKind::kDtr, 0, 4 + 2 + 1 + 16}, Case{HeuristicKind::kDtr, 2, 4 + 2 + 16},
                 Case{HeuristicKind::kDtr, 1, 4 + 16}, Case{HeuristicKind::kMsps, 0, 4 + 2 + 1},
                 Case{HeuristicKind::kMsps, 2, 4 + 2}}) {
    RuntimeConfig config;
    config.search = SearchMode::kExact;
    config.heuristic = k.h;
    config.neighborhood_walk_limit = k.limit;
    Make(config);
    StorageId x = Const(1);
    StorageId a = Op1("a", {x}, 2, 1);
    StorageId b = Op1("b", {a}, 2, 2);
    StorageId c = Op1("c", {b}, 2, 4);
    StorageId d = Op1("d", {c}, 2, 8);
    StorageId e = Op1("e", {d}, 2, 16);
    for (StorageId id : {a, b, c, e}) ASSERT_TRUE(rt_->Evict(id).ok());
    double staleness = rt_->now() - rt_->storage(d)->last_access + 1;
    double expected = k.h == HeuristicKind::kMsps ? (8 + k.neighborhood) / 2 : (8 + k.neighborhood) / (2 * staleness);
    EXPECT_DOUBLE_EQ(rt_->ScoreOf(d), expected) << HeuristicName(k.h) << " limit " << k.limit;
    Check();
  }
}

// Note [Evicted-neighbor hint]: a storage evicted before its neighbor comes back knowing the
// neighbor is evicted, and the hint is dropped once a search finds no evicted neighbor.
TEST_F(RuntimeTest, EvictedNeighborHintFollowsStoragesBackIntoResidence) {
  RuntimeConfig config;
  config.search = SearchMode::kExact;
  config.thrash_damping = 0;  // scores without Note [Thrashing]'s factor for the remats below
  config.neighborhood_cache_events = 0;  // every score walks (Note [Neighborhood cost cache])
  Make(config);
  StorageId x = Const(1);
  StorageId a = Op1("a", {x}, 2, 1);
  StorageId b = Op1("b", {a}, 2, 8);
  StorageId c = Op1("c", {b}, 2, 4);
  auto score_without_neighbors = [&](StorageId id) {
    const StorageRecord& r = *rt_->storage(id);
    return r.cost / (double(r.size) * (rt_->now() - r.last_access + 1));
  };
  EXPECT_DOUBLE_EQ(rt_->ScoreOf(a), score_without_neighbors(a));
  ASSERT_TRUE(rt_->Evict(a).ok());
  ASSERT_TRUE(rt_->Evict(b).ok());  // a is evicted when its neighbor b goes
  Check();
  ASSERT_TRUE(rt_->Access(a, 0).ok());  // brings a back; b stays evicted
  ASSERT_TRUE(Resident(a));
  ASSERT_FALSE(Resident(b));
  Check();
  const StorageRecord& ra = *rt_->storage(a);
  EXPECT_DOUBLE_EQ(rt_->ScoreOf(a), (ra.cost + 8) / (double(ra.size) * (rt_->now() - ra.last_access + 1)));
  ASSERT_TRUE(rt_->Access(c, 0).ok());
  ASSERT_TRUE(rt_->Access(b, 0).ok());  // every neighbor of a resident again
  EXPECT_DOUBLE_EQ(rt_->ScoreOf(a), score_without_neighbors(a));
  EXPECT_FALSE(rt_->storage(a)->neighbor_evicted);  // the walk found none and said so
  Check();
}

// Note [Deferred op costs]: a cost corrected after recording reaches the op, the storages whose
// recipe holds it, and the evicted neighborhoods they belong to.
TEST_F(RuntimeTest, DeferredCostCorrectionsReachRecipesAndEvictedNeighborhoods) {
  Make(kUnlimitedBudget);
  StorageId x = Const(1);
  StorageId a = Op1("a", {x}, 2, 1);
  StorageId b = Op1("b", {a}, 2, 2);
  StorageId c = Op1("c", {b}, 2, 4);
  const OpId op_b = rt_->storage(b)->recipe.front();
  ASSERT_TRUE(rt_->Evict(b).ok());
  const double before = rt_->ScoreOf(c);
  ASSERT_TRUE(rt_->AddOpCost(op_b, 98).ok());  // the kernel took 100, not the 2 its launch took
  EXPECT_DOUBLE_EQ(rt_->op(op_b)->cost, 100);
  EXPECT_DOUBLE_EQ(rt_->storage(b)->cost, 100);
  const double staleness = rt_->now() - rt_->storage(c)->last_access + 1;
  EXPECT_DOUBLE_EQ(rt_->ScoreOf(c), (4 + 100) / (2 * staleness));  // b is in c's evicted neighborhood
  EXPECT_GT(rt_->ScoreOf(c), before);
  ASSERT_TRUE(rt_->AddOpCost(op_b, -500).ok());  // never negative
  EXPECT_DOUBLE_EQ(rt_->storage(b)->cost, 0);
  Check();
  ASSERT_TRUE(rt_->Access(b).ok());
  EXPECT_FALSE(rt_->AddOpCost(OpId{}, 1).ok());
  Check();
}

// Note [Deferred op costs]: a correction larger than its op's cost takes that op to 0, and a
// storage whose recipe has another op keeps that op's cost (it lost what the op lost, not the
// whole correction).
TEST_F(RuntimeTest, ACostCorrectionBelowZeroLeavesTheRestOfTheRecipe) {
  Make(kUnlimitedBudget);
  StorageId x = Const(4);
  StorageId a = Op1("a", {x}, 10, 5);
  StorageId mutated[] = {a};
  ASSERT_TRUE(rt_->Mutate({"relu_", mutated, mutated, true, 0}, []() -> absl::StatusOr<double> { return 3.0; }).ok());
  ASSERT_EQ(rt_->storage(a)->recipe.size(), 2u);
  EXPECT_DOUBLE_EQ(rt_->storage(a)->cost, 8);
  const double base = rt_->stats().base_cost;
  ASSERT_TRUE(rt_->AddOpCost(rt_->storage(a)->recipe[0], -500).ok());
  EXPECT_DOUBLE_EQ(rt_->op(rt_->storage(a)->recipe[0])->cost, 0);
  EXPECT_DOUBLE_EQ(rt_->storage(a)->cost, 3);  // relu_'s
  EXPECT_DOUBLE_EQ(rt_->stats().base_cost, base - 5);
  Check();
}

// Note [Staleness of replayed storages]: a storage rebuilt on the way to another keeps the last
// access it had, so it is the next victim before an older storage the program used after it; with
// replays_refresh_staleness the replay touches it and that older storage goes instead.
TEST_F(RuntimeTest, ReplaysLeaveTheStalenessOfWhatTheyBringBack) {
  for (bool refresh : {false, true}) {
    SCOPED_TRACE(refresh ? "replays refresh staleness" : "replays leave staleness");
    RuntimeConfig config;
    config.search = SearchMode::kExact;
    config.budget_bytes = 7;
    config.replays_refresh_staleness = refresh;
    Make(config);
    StorageId x = Const(1);
    StorageId a = Op1("a", {x}, 2);
    StorageId b = Op1("b", {a}, 1);  // the program's last use of a
    const double a_used = rt_->storage(a)->last_access;
    // k is as cheap and as large as a, and used after it. (b and l, read by no recipe, are
    // victims of last resort: Note [Results awaiting their reader].)
    StorageId k = Op1("k", {x}, 2);
    StorageId l = Op1("l", {k}, 1);
    ASSERT_TRUE(rt_->Evict(a).ok());
    ASSERT_TRUE(rt_->Evict(b).ok());
    ASSERT_TRUE(rt_->Access(b, 1).ok());  // replays a on the way to b: 7 of 7 bytes
    ASSERT_TRUE(Resident(a) && Resident(b) && Resident(k) && Resident(l));
    EXPECT_DOUBLE_EQ(rt_->storage(b)->last_access, rt_->now());  // the program read b
    if (refresh) {
      EXPECT_GT(rt_->storage(a)->last_access, rt_->storage(k)->last_access);
    } else {
      EXPECT_DOUBLE_EQ(rt_->storage(a)->last_access, a_used);
    }
    Check();
    Op1("e", {x}, 2);  // a or k must go
    EXPECT_EQ(Resident(a), refresh);
    EXPECT_EQ(Resident(k), !refresh);
    EXPECT_TRUE(Resident(b) && Resident(l));
    Check();
  }
}

// Pinning hands a storage's data to the program: a use, so a storage Pin brings back is touched
// (what it rebuilt on the way is not: Note [Staleness of replayed storages]).
TEST_F(RuntimeTest, PinTouchesWhatItBringsBack) {
  Make(kUnlimitedBudget, HeuristicKind::kDtr);
  StorageId x = Const(1);
  StorageId a = Op1("a", {x}, 2);
  StorageId b = Op1("b", {a}, 2);
  const double a_used = rt_->storage(a)->last_access;
  Op1("later", {x}, 2, 5);
  ASSERT_TRUE(rt_->Evict(a).ok());
  ASSERT_TRUE(rt_->Evict(b).ok());
  ASSERT_TRUE(rt_->Pin(b).ok());
  EXPECT_DOUBLE_EQ(rt_->storage(b)->last_access, rt_->now());
  EXPECT_DOUBLE_EQ(rt_->storage(a)->last_access, a_used);
  ASSERT_TRUE(rt_->Unpin(b).ok());
  Check();
}

// Note [Neighborhood cost cache]: a walked cost is reused for neighborhood_cache_events
// evictions and rematerializations, except that evicting or bringing back a neighbor clears it.
TEST_F(RuntimeTest, NeighborhoodCostIsReusedUntilANeighborChangesOrItExpires) {
  for (uint32_t reuse_for : {0u, 16u}) {
    SCOPED_TRACE(reuse_for);
    const bool reuse = reuse_for > 0;
    RuntimeConfig config;
    config.neighborhood_cache_events = reuse_for;
    auto [a, b, c, d, e, y] = MakeCostChain(config);
    auto score = [&](StorageId id, double neighborhood) { return ScoreWith(id, neighborhood); };
    ASSERT_TRUE(rt_->Evict(b).ok());  // residency change 1
    EXPECT_DOUBLE_EQ(rt_->ScoreOf(a), score(a, 10));  // walked: e*(a) = {b}
    EXPECT_DOUBLE_EQ(rt_->ScoreOf(c), score(c, 10));  // walked: e*(c) = {b}
    ASSERT_TRUE(rt_->Evict(d).ok());  // 2: c's neighbor, so c walks again
    EXPECT_DOUBLE_EQ(rt_->ScoreOf(c), score(c, 1010));
    ASSERT_TRUE(rt_->Evict(c).ok());  // 3: two hops from a: e*(a) = {b, c, d}, a keeps its cost
    EXPECT_DOUBLE_EQ(rt_->ScoreOf(a), score(a, reuse ? 10 : 1110));
    for (int i = 0; i < 6; ++i) {  // 4-15
      ASSERT_TRUE(rt_->Evict(y).ok());
      ASSERT_TRUE(rt_->Access(y).ok());
    }
    ASSERT_TRUE(rt_->Evict(y).ok());  // 16: 15 since a was walked
    EXPECT_DOUBLE_EQ(rt_->ScoreOf(a), score(a, reuse ? 10 : 1110));
    ASSERT_TRUE(rt_->Access(y).ok());  // 17: 16 since, the cached cost expires
    EXPECT_DOUBLE_EQ(rt_->ScoreOf(a), score(a, 1110));
    ASSERT_TRUE(rt_->Access(b).ok());  // a's neighbor comes back: e*(a) = {} at once
    EXPECT_DOUBLE_EQ(rt_->ScoreOf(a), score(a, 0));
    Check();
  }
}

// Note [Exact neighborhood cost cache] (the default): a walked cost is reused for as long as
// nothing it summed changes, and forgotten as soon as something does, however far away.
TEST_F(RuntimeTest, ExactNeighborhoodCacheIsForgottenExactlyWhenItsSumChanges) {
  ASSERT_EQ(RuntimeConfig{}.neighborhood_cache_events, kExactNeighborhoodCache);
  auto [a, b, c, d, e, y] = MakeCostChain(RuntimeConfig{});
  auto score = [&](StorageId id, double neighborhood) { return ScoreWith(id, neighborhood); };
  auto hits = [&] { return rt_->stats().neighborhood_cache_hits; };
  ASSERT_TRUE(rt_->Evict(b).ok());
  EXPECT_DOUBLE_EQ(rt_->ScoreOf(a), score(a, 10));  // walked: e*(a) = {b}
  uint64_t before = hits();
  ASSERT_TRUE(rt_->Evict(d).ok());  // not reachable from a through evicted storages
  EXPECT_DOUBLE_EQ(rt_->ScoreOf(a), score(a, 10));
  EXPECT_EQ(hits(), before + 1);
  Check();
  ASSERT_TRUE(rt_->Evict(c).ok());  // two hops from a: e*(a) = {b, c, d} at once
  EXPECT_DOUBLE_EQ(rt_->ScoreOf(a), score(a, 1110));
  before = hits();
  for (int i = 0; i < 20; ++i) {  // far more than any event count: nothing a summed changes
    ASSERT_TRUE(rt_->Evict(y).ok());
    ASSERT_TRUE(rt_->Access(y).ok());
    EXPECT_DOUBLE_EQ(rt_->ScoreOf(a), score(a, 1110));
  }
  EXPECT_EQ(hits(), before + 20);
  Check();
  // A corrected cost (Note [Deferred op costs]) of an evicted storage three hops away.
  ASSERT_TRUE(rt_->AddOpCost(rt_->storage(d)->recipe[0], 4000).ok());
  EXPECT_DOUBLE_EQ(rt_->ScoreOf(a), score(a, 5110));
  Check();
  ASSERT_TRUE(rt_->Access(c).ok());  // brings b and c back: e*(a) = {}
  EXPECT_DOUBLE_EQ(rt_->ScoreOf(a), score(a, 0));
  Check();
}

// Note [Exact neighborhood cost cache]: a walk beside more evicted sets than a record names is
// not cached, and compacting the sets (which renames them) forgets every cached cost.
TEST_F(RuntimeTest, ExactNeighborhoodCacheKeepsOnlyWhatItCanCheck) {
  RuntimeConfig config;
  config.search = SearchMode::kExact;
  config.heuristic = HeuristicKind::kDtr;
  config.max_recompute_ratio = 0;  // y is only ever replayed
  Make(config);
  StorageId x = Const(1);
  std::vector<StorageId> ins;
  for (int i = 0; i < 3; ++i) ins.push_back(Op1(absl::StrCat("in", i), {x}, 2, 1));
  StorageId two = Op1("two", {ins[0], ins[1]}, 2);
  StorageId three = Op1("three", {ins[0], ins[1], ins[2]}, 2);
  StorageId y = Op1("y", {x}, 2, 1);
  for (StorageId in : ins) ASSERT_TRUE(rt_->Evict(in).ok());  // three sets: nothing joins them
  auto hits_of = [&](StorageId id) {
    const uint64_t before = rt_->stats().neighborhood_cache_hits;
    rt_->ScoreOf(id);
    return rt_->stats().neighborhood_cache_hits - before;
  };
  EXPECT_EQ(hits_of(two), 0u);  // walked and cached: beside two sets
  EXPECT_EQ(hits_of(two), 1u);
  EXPECT_EQ(hits_of(three), 0u);  // beside three: walked every time
  EXPECT_EQ(hits_of(three), 0u);
  Check();
  // Each eviction makes a union-find node, and a storage brought back leaves its node behind, so
  // the nodes outgrow the evicted storages and are compacted (MaybeCompactComponents).
  const double cost_before = rt_->ScoreOf(two);
  for (int i = 0; i < 4200; ++i) {
    ASSERT_TRUE(rt_->Evict(y).ok());
    ASSERT_TRUE(rt_->Access(y).ok());
  }
  EXPECT_EQ(hits_of(two), 0u);  // walked again
  EXPECT_LT(rt_->ScoreOf(two), cost_before);  // the same cost, staler
  Check();
}

// Note [Neighborhood cost cache]: a walk cut short by the victim search (Note [Bounded victim
// search]) leaves nothing to reuse, so the next score is the full one.
TEST_F(RuntimeTest, ACutWalkLeavesNoCostToReuse) {
  uint64_t visits[2];
  for (bool cut : {false, true}) {
    SCOPED_TRACE(cut);
    RuntimeConfig config;
    config.search = SearchMode::kExact;
    config.heuristic = HeuristicKind::kDtr;
    config.neighborhood_cache_events = 16;
    config.cut_losing_walks = cut;
    Make(config);
    StorageId x = Const(1);
    StorageId p = Op1("p", {x}, 2, 1);  // the staler of p and q: scored first, and the victim
    StorageId s1 = Op1("s1", {p}, 2, 5);
    Op1("s2", {s1}, 2, 1);
    StorageId q = Op1("q", {x}, 2, 1);
    StorageId r1 = Op1("r1", {q}, 2, 100);
    StorageId r2 = Op1("r2", {r1}, 2, 100);
    Op1("r3", {r2}, 2, 1);
    for (StorageId id : {s1, r1, r2}) ASSERT_TRUE(rt_->Evict(id).ok());
    const uint64_t before = rt_->stats().neighborhood_visits;
    ASSERT_EQ(rt_->EvictAtLeast(1), 2u);
    visits[cut] = rt_->stats().neighborhood_visits - before;
    EXPECT_FALSE(Resident(p));
    const StorageRecord& rq = *rt_->storage(q);
    EXPECT_DOUBLE_EQ(rt_->ScoreOf(q), (1 + 200) / (2 * (rt_->now() - rq.last_access + 1)));
    Check();
  }
  EXPECT_LT(visits[true], visits[false]);  // q's walk was cut at r1
}

// Note [Cut walks leave a bound]: under the exact cache (the default) a cut walk's partial sum is
// kept as a lower bound, which cuts the next search's walk without visiting anything; a full
// score still walks.
TEST_F(RuntimeTest, ACutWalkLeavesABoundThatCutsItAgain) {
  RuntimeConfig config;
  config.search = SearchMode::kExact;
  config.heuristic = HeuristicKind::kDtr;
  ASSERT_EQ(config.neighborhood_cache_events, kExactNeighborhoodCache);
  Make(config);
  StorageId x = Const(1);
  // p1 and p2 are stale and cheap: the victims, in that order. Each heads an evicted t (and a u
  // that awaits its reader: a last resort). q is fresher, with 200 evicted behind it.
  StorageId p1 = Op1("p1", {x}, 2, 1);
  StorageId t1 = Op1("t1", {p1}, 2, 5);
  Op1("u1", {t1}, 2, 1);
  StorageId p2 = Op1("p2", {x}, 2, 1);
  StorageId t2 = Op1("t2", {p2}, 2, 5);
  Op1("u2", {t2}, 2, 1);
  StorageId q = Op1("q", {x}, 2, 1);
  StorageId r1 = Op1("r1", {q}, 2, 100);
  StorageId r2 = Op1("r2", {r1}, 2, 100);
  Op1("r3", {r2}, 2, 1);
  for (StorageId id : {t1, t2, r1, r2}) ASSERT_TRUE(rt_->Evict(id).ok());
  ASSERT_EQ(rt_->EvictAtLeast(1), 2u);
  EXPECT_FALSE(Resident(p1));
  const StorageRecord& rq = *rt_->storage(q);
  ASSERT_NE(rq.neighborhood_walked_at, StorageRecord::kNotCached);
  EXPECT_TRUE(rq.neighborhood_cost_is_bound);  // cut at r1: 100 of its 200
  EXPECT_DOUBLE_EQ(rq.neighborhood_cost, 100);
  Check();  // the bound is at most what a walk finds
  const uint64_t hits = rt_->stats().neighborhood_cache_hits;
  const uint64_t visits = rt_->stats().neighborhood_visits;
  ASSERT_EQ(rt_->EvictAtLeast(1), 2u);
  EXPECT_FALSE(Resident(p2));
  EXPECT_EQ(rt_->stats().neighborhood_cache_hits, hits + 1);  // q cut by its bound
  EXPECT_EQ(rt_->stats().neighborhood_visits - visits, 3u);  // p2's walk alone (x, t2, u2), none of q's
  EXPECT_TRUE(rq.neighborhood_cost_is_bound);
  EXPECT_DOUBLE_EQ(rt_->ScoreOf(q), (1 + 200) / (2 * (rt_->now() - rq.last_access + 1)));  // walked in full
  EXPECT_FALSE(rq.neighborhood_cost_is_bound);
  EXPECT_DOUBLE_EQ(rq.neighborhood_cost, 200);
  Check();
}

TEST_F(RuntimeTest, ThrashDampingRaisesTheScoreOfStoragesThatKeepComingBack) {
  double scores[2];
  for (int damping = 0; damping < 2; ++damping) {
    RuntimeConfig config;
    config.search = SearchMode::kExact;
    config.thrash_damping = damping;
    Make(config);
    StorageId x = Const(1);
    StorageId a = Op1("a", {x}, 10);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(rt_->Evict(a).ok());
      ASSERT_TRUE(rt_->Access(a).ok());
    }
    scores[damping] = rt_->ScoreOf(a);
    EXPECT_EQ(rt_->storage(a)->remat_count, 3u);
  }
  EXPECT_GT(scores[1], 3.5 * scores[0]);  // three recent remats: about 4x
}

// Note [Victim search]: sqrt(n) candidates a search, at least min_samples, at most max_samples.
TEST_F(RuntimeTest, SampledSearchScoresSqrtNCandidatesUpToMaxSamples) {
  // {max_samples, min_samples}: no cap; the default cap; a cap below the floor (the floor wins).
  for (auto [max_samples, min_samples] : {std::pair{0u, 32u}, std::pair{64u, 32u}, std::pair{20u, 50u}}) {
    RuntimeConfig config;
    config.search = SearchMode::kSampled;
    config.heuristic = HeuristicKind::kLru;
    config.max_samples = max_samples;
    config.min_samples = min_samples;
    Make(config);
    StorageId x = Const(1);
    uint64_t size = 1;
    // A chain, so that every storage but the last has a reader (Note [Results awaiting their
    // reader]: the last is a victim of last resort and not scored).
    for (int i = 0; i < 10001; ++i) {
      auto out = rt_->Compute({"f", {&x, 1}, {&size, 1}, true, 0},
                              [](absl::Span<const StorageId>) -> absl::StatusOr<double> { return 1.0; });
      ASSERT_TRUE(out.ok());
      x = (*out)[0];
    }
    uint64_t before = rt_->stats().candidates_scored;
    ASSERT_TRUE(rt_->SetBudget(rt_->memory() - 1).ok());
    EXPECT_EQ(rt_->stats().evictions, 1u);
    const uint64_t expected = max_samples == 0 ? 100 : std::max(max_samples, min_samples);
    EXPECT_EQ(rt_->stats().candidates_scored - before, expected) << max_samples << " " << min_samples;
    Check();
  }
}

// Note [Small pools are searched whole]: up to exhaustive_pool entries a sampled search scores
// every one (and so chooses what exact search chooses); one entry more, and it samples.
TEST_F(RuntimeTest, SampledSearchScoresASmallPoolWhole) {
  for (uint32_t pool : {255u, 256u, 257u}) {
    StorageId victim[2];
    uint64_t scored[2];
    for (SearchMode search : {SearchMode::kExact, SearchMode::kSampled}) {
      RuntimeConfig config;
      config.search = search;
      config.heuristic = HeuristicKind::kDtr;
      config.exhaustive_pool = 256;
      config.min_samples = config.max_samples = 4;
      Make(config);
      StorageId x = Const(1);
      uint64_t size = 1;
      // A chain (every storage but the last has a reader, Note [Results awaiting their reader])
      // of storages of different sizes and costs, so that one is the best victim.
      for (uint32_t i = 0; i < pool; ++i) {
        size = 10 + (i * 37) % 23;
        auto out = rt_->Compute({"f", {&x, 1}, {&size, 1}, true, 0},
                                [i](absl::Span<const StorageId>) -> absl::StatusOr<double> {
                                  return 1.0 + double((i * 13) % 7);
                                });
        ASSERT_TRUE(out.ok());
        x = (*out)[0];
      }
      const uint64_t before = rt_->stats().candidates_scored;
      auto next = rt_->NextVictim();
      ASSERT_TRUE(next.has_value());
      const int k = search == SearchMode::kSampled;
      victim[k] = next->id;
      scored[k] = rt_->stats().candidates_scored - before;
      Check();
    }
    EXPECT_EQ(scored[0], pool - 1) << pool;  // all but the chain's last, a last resort
    if (pool <= 256) {
      EXPECT_EQ(scored[1], pool - 1) << pool;
      EXPECT_EQ(victim[1], victim[0]) << pool;
    } else {
      EXPECT_LE(scored[1], 4u + 16u) << pool;  // a sample and the carried runners-up
    }
  }
}

TEST_F(RuntimeTest, ExactSearchFindsTheGlobalMinimumAndSkipsTinyStorages) {
  Make(kUnlimitedBudget, HeuristicKind::kLru);
  StorageId x = Const(1);
  StorageId tiny = Op1("tiny", {x}, 1);  // oldest, but under 1% of the mean size
  StorageId old = Op1("old", {x}, 1000);
  for (int i = 0; i < 20; ++i) Op1("f", {x}, 1000);
  ASSERT_TRUE(rt_->SetBudget(rt_->memory() - 1).ok());
  EXPECT_TRUE(Resident(tiny));
  EXPECT_FALSE(Resident(old));
}

TEST_F(RuntimeTest, SetBudgetBelowWhatIsPinnedFailsAndKeepsTheOldBudget) {
  Make(1000);
  StorageId x = Const(500);
  (void)x;
  EXPECT_FALSE(rt_->SetBudget(100).ok());
  EXPECT_EQ(rt_->budget(), 1000u);
  EXPECT_FALSE(rt_->SetBudget(0).ok());
}

TEST_F(RuntimeTest, ReplayFailureIsReportedAndStateStaysConsistent) {
  // Note [Inputs a rematerialization will read]: an unwound rematerialization releases its reads
  // (Check: none left between operations).
  for (double pending_protection : {1.0, 1000.0}) {
    RuntimeConfig config;
    config.budget_bytes = kUnlimitedBudget;
    config.search = SearchMode::kExact;
    config.pending_protection = pending_protection;
    Make(config);
    StorageId x = Const(1);
    StorageId a = Op1("a", {x}, 10);
    StorageId b = Op1("b", {a}, 10);
    ASSERT_TRUE(rt_->Evict(b).ok());
    ASSERT_TRUE(rt_->Evict(a).ok());
    backend_.fail_replays = true;
    absl::Status s = rt_->Access(b);
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_FALSE(Resident(a));
    EXPECT_FALSE(Resident(b));
    EXPECT_EQ(rt_->storage(x)->pending_reads, 0u);
    Check();
    backend_.fail_replays = false;
    EXPECT_TRUE(rt_->Access(b).ok());
    Check();
  }
}

TEST_F(RuntimeTest, EvictAtLeastFreesLowestScoresFirst) {
  Make(kUnlimitedBudget, HeuristicKind::kSize);
  StorageId x = Const(1);
  StorageId small = Op1("s", {x}, 100);
  StorageId big = Op1("b", {x}, 300);
  EXPECT_EQ(rt_->EvictAtLeast(200), 300u);
  EXPECT_FALSE(Resident(big));
  EXPECT_TRUE(Resident(small));
  auto ranked = rt_->RankedCandidates(10);
  ASSERT_EQ(ranked.size(), 1u);
  EXPECT_EQ(ranked[0].id, small);
  EXPECT_EQ(rt_->UnevictableBytes(), 1u);
}

// Note [One victim at a time] (hooks/engine.cc): the allocators evict Runtime::NextVictim's
// choice, which must be the storage Reserve would evict, left resident until then, and must be
// searched anew after each eviction (the victim's neighbours carry its cost afterwards).
// Note [Rebuilt segments]: bringing c back replays a and b. Making room for c, the search would
// evict a, stalest of all and just used, but it was rebuilt by the rematerialization under way:
// with protection it takes a fresh g instead, and a stays for the ops that need it next.
TEST_F(RuntimeTest, WhatARematerializationRebuiltIsTakenLastUntilItEnds) {
  for (double protection : {1.0, 30.0}) {
    RuntimeConfig config;
    config.budget_bytes = 1 + 4 * 100;
    config.heuristic = HeuristicKind::kDtr;
    config.search = SearchMode::kExact;
    config.rebuild_protection = protection;
    Make(config);
    StorageId x = Const(1);
    StorageId a = Op1("a", {x}, 100);
    StorageId b = Op1("b", {a}, 100);
    StorageId c = Op1("c", {b}, 100);
    for (StorageId s : {c, b, a}) ASSERT_TRUE(rt_->Evict(s).ok());
    std::vector<StorageId> g;
    for (int i = 0; i < 3; ++i) g.push_back(Op1("g", {x}, 100));
    for (StorageId s : g) (void)Op1("reader", {s}, 0);  // not results awaiting their reader
    ASSERT_TRUE(rt_->Access(c, 0).ok());
    Check();
    EXPECT_EQ(backend_.replays, (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_TRUE(Resident(b) && Resident(c));
    const int g_resident = int(std::count_if(g.begin(), g.end(), [&](StorageId s) { return Resident(s); }));
    if (protection == 1) {
      EXPECT_FALSE(Resident(a)) << "without protection the rebuild evicts behind itself";
      EXPECT_EQ(g_resident, 2);
    } else {
      EXPECT_TRUE(Resident(a)) << "a rebuilt storage is taken last while its rebuild is under way";
      EXPECT_EQ(g_resident, 1);
    }
    backend_.replays.clear();
  }
}

// Note [Inputs a rematerialization will read]: t's rematerialization replays p (reads l), then
// q's inputs y and s (reads l), then q and t. l stays resident and grows stale; three fresh g's,
// each read, fill the budget with `room` more storages of 100 bytes.
struct PendingReadsGraph {
  StorageId x, l, p, y, s, q, t;
  std::vector<StorageId> g;
};

class PendingReadsTest : public RuntimeTest {
 protected:
  PendingReadsGraph Build(double protection, int room) {
    RuntimeConfig config;
    config.budget_bytes = 1 + 6 * 100;  // the whole graph, until it is evicted
    config.heuristic = HeuristicKind::kDtr;
    config.search = SearchMode::kExact;
    config.pending_protection = protection;
    Make(config);
    PendingReadsGraph graph;
    graph.x = Const(1);
    graph.l = Op1("l", {graph.x}, 100);
    graph.p = Op1("p", {graph.l}, 100);
    graph.y = Op1("y", {graph.x}, 100);
    graph.s = Op1("s", {graph.l}, 100);
    graph.q = Op1("q", {graph.y, graph.s}, 100);
    graph.t = Op1("t", {graph.p, graph.q}, 100);
    for (StorageId e : {graph.t, graph.q, graph.s, graph.y, graph.p}) EXPECT_TRUE(rt_->Evict(e).ok());
    EXPECT_TRUE(rt_->SetBudget(1 + (4 + room) * 100).ok());
    for (int i = 0; i < 20; ++i) (void)Op1("filler", {graph.x}, 0);  // l grows stale
    for (int i = 0; i < 3; ++i) graph.g.push_back(Op1("g", {graph.x}, 100));
    for (StorageId e : graph.g) (void)Op1("reader", {e}, 0);  // not results awaiting their reader
    return graph;
  }
};

// Making room for y, the search would evict l, stalest of all and not awaited by any frame yet,
// though s, replayed next, reads it: without protection l is evicted and replayed again; with it
// a g goes instead, and each op replays once.
TEST_F(PendingReadsTest, WhatARematerializationWillStillReadIsTakenLast) {
  for (double protection : {1.0, 1000.0}) {
    PendingReadsGraph graph = Build(protection, /*room=*/0);
    backend_.replays.clear();
    ASSERT_TRUE(rt_->Access(graph.t, 0).ok());
    Check();
    if (protection == 1) {
      EXPECT_EQ(backend_.replays, (std::vector<std::string>{"p", "y", "l", "s", "q", "t"}))
          << "without protection the rebuild evicts an input it reads later";
    } else {
      EXPECT_EQ(backend_.replays, (std::vector<std::string>{"p", "y", "s", "q", "t"}))
          << "an input a pending replay reads is taken last";
    }
    EXPECT_TRUE(Resident(graph.t));
    EXPECT_EQ(std::count_if(graph.g.begin(), graph.g.end(), [&](StorageId e) { return Resident(e); }), 0);
  }
}

// With room for a fresh h as well: once p and s have replayed, nothing listed reads l any more,
// so it is an ordinary candidate again, and making room for q the search takes it, stalest,
// before h.
TEST_F(PendingReadsTest, AReadEndsWhenItsOpReplays) {
  PendingReadsGraph graph = Build(1000, /*room=*/1);
  StorageId h = Op1("h", {graph.x}, 100);
  (void)Op1("reader", {h}, 0);
  backend_.replays.clear();
  backend_.releases.clear();
  ASSERT_TRUE(rt_->Access(graph.t, 0).ok());
  Check();
  EXPECT_EQ(backend_.replays, (std::vector<std::string>{"p", "y", "s", "q", "t"}));
  auto released_at = [&](StorageId id) {
    for (size_t i = 0; i < backend_.releases.size(); ++i)
      if (backend_.releases[i].first == id) return int(i);
    return -1;
  };
  ASSERT_GE(released_at(graph.l), 0) << "l, read by no listed op after s, is evicted";
  if (released_at(h) >= 0) {
    EXPECT_GT(released_at(h), released_at(graph.l)) << "l goes before the fresh h";
  }
}

// Note [Results of the backward pass]: of two storages alike but for when they were last used,
// the search takes the staler, unless a backward pass computed it: then its score is multiplied
// by backward_protection and the fresher one goes first. An in-place op of a backward pass marks
// the storage it writes; an overwrite outside one starts its recipe afresh and clears the mark.
TEST_F(RuntimeTest, WhatABackwardPassComputedIsTakenAfterActivations) {
  for (double protection : {1.0, 10.0}) {
    RuntimeConfig config;
    config.heuristic = HeuristicKind::kDtr;
    config.search = SearchMode::kExact;
    config.backward_protection = protection;
    Make(config);
    StorageId x = Const(1);
    std::vector<StorageId> in{x};
    std::vector<uint64_t> sizes{100};
    Runtime::OpCall backward{"grad", in, sizes, true, 0};
    backward.backward = true;
    auto g = rt_->Compute(backward, [](absl::Span<const StorageId>) -> absl::StatusOr<double> { return 1.0; });
    ASSERT_TRUE(g.ok()) << g.status();
    const StorageId grad = (*g)[0];
    const StorageId activation = Op1("act", {x}, 100);
    for (StorageId s : {grad, activation}) (void)Op1("reader", {s}, 0);  // not awaiting their reader
    Check();
    EXPECT_TRUE(rt_->storage(grad)->backward_recipe);
    EXPECT_FALSE(rt_->storage(activation)->backward_recipe);
    auto victim = rt_->NextVictim();
    ASSERT_TRUE(victim.has_value());
    EXPECT_EQ(victim->id, protection == 1 ? grad : activation) << "protection " << protection;
    EXPECT_DOUBLE_EQ(rt_->ScoreOf(grad) / rt_->ScoreOf(activation) / protection,
                     [&] {  // the same ratio as with no protection: only the factor differs
                       const double stale_grad = rt_->now() - rt_->storage(grad)->last_access + 1;
                       const double stale_act = rt_->now() - rt_->storage(activation)->last_access + 1;
                       return stale_act / stale_grad;
                     }());
    // An in-place op of a backward pass marks what it writes; an overwrite outside one unmarks it.
    std::vector<StorageId> write{activation};
    Runtime::MutateCall update{"add_", write, write};
    update.backward = true;
    ASSERT_TRUE(rt_->Mutate(update, []() -> absl::StatusOr<double> { return 1.0; }).ok());
    EXPECT_TRUE(rt_->storage(activation)->backward_recipe);
    Check();
    Runtime::MutateCall fill{"fill_", write, write};
    fill.overwrites = true;
    ASSERT_TRUE(rt_->Mutate(fill, []() -> absl::StatusOr<double> { return 1.0; }).ok());
    ASSERT_EQ(rt_->storage(activation)->recipe.size(), 1u);
    EXPECT_FALSE(rt_->storage(activation)->backward_recipe);
    Check();
  }
}

// Note [Next use in a backward pass]: a backward pass reads the forward activations about in the
// reverse of their last forward use. Once it has read the one used last (d), c, used just before,
// is read next, and a and b, used long before, much later; by then all three are about as stale.
// With staleness alone the cheapest, c, goes; with the estimate the search keeps c and takes a,
// the one read last. What the backward pass has read scores by its staleness again, and so does
// everything once a forward op ends the pass. The mirror moves back to the latest forward use
// among what a backward op (or an in-place one) reads, never forward.
TEST_F(RuntimeTest, ABackwardPassTakesFirstWhatItWillReadLast) {
  for (double weight : {0.0, 0.75, 0.5}) {
    SCOPED_TRACE(weight);
    RuntimeConfig config = ExactDtrConfig();
    config.backward_next_use = weight;
    Make(config);
    StorageId x = Const(1);
    auto filler = [&] { (void)Op1("filler", {x}, 0, 100); };
    StorageId a = Op1("a", {x}, 100, 3);
    filler();
    StorageId b = Op1("b", {a}, 100, 2);
    filler();
    StorageId c = Op1("c", {b}, 100, 1);
    filler();
    StorageId d = Op1("d", {c}, 100, 1);
    StorageId loss = Op1("loss", {d}, 100, 1);  // never read by the backward pass
    for (StorageId s : {a, b, c, d, loss}) EXPECT_EQ(rt_->storage(s)->awaits_backward, weight > 0);
    auto backward_op = [&](StorageId in, double cost) {
      std::vector<StorageId> inputs{in};
      std::vector<uint64_t> sizes{100};
      Runtime::OpCall call{"grad", inputs, sizes, true, 0};
      call.backward = true;
      auto out = rt_->Compute(call, [&](absl::Span<const StorageId>) -> absl::StatusOr<double> { return cost; });
      EXPECT_TRUE(out.ok()) << out.status();
      Check();
    };
    double mirror = rt_->storage(d)->last_access;  // read last by the forward pass
    backward_op(d, 1000);
    EXPECT_FALSE(rt_->storage(d)->awaits_backward);
    EXPECT_EQ(rt_->storage(c)->awaits_backward, weight > 0);
    auto expected = [&](StorageId s) {
      const StorageRecord& r = *rt_->storage(s);
      const double staleness = rt_->now() - r.last_access + 1;
      const double next_use = (mirror - r.last_access) * 2 + 1;
      return r.cost / (double(r.size) * std::pow(staleness, 1 - weight) * std::pow(next_use, weight));
    };
    for (StorageId s : {a, b, c}) EXPECT_NEAR(rt_->ScoreOf(s) / expected(s), 1, 1e-12);
    auto victim = rt_->NextVictim();
    ASSERT_TRUE(victim.has_value());
    if (weight == 0) {
      EXPECT_EQ(victim->id, c);
    } else {
      EXPECT_NE(victim->id, c);
    }
    if (weight == 0.75) {
      EXPECT_EQ(victim->id, a);  // at 0.5, b, by a hair
    }
    // Read by the backward pass: its staleness alone again. The mirror moves back to c's last
    // forward use, which `loss`, used later and never read, is past: its staleness alone too.
    const double c_forward = rt_->storage(c)->last_access;
    backward_op(c, 1);
    EXPECT_FALSE(rt_->storage(c)->awaits_backward);
    EXPECT_DOUBLE_EQ(rt_->ScoreOf(c), ScoreWith(c, 0));
    EXPECT_DOUBLE_EQ(rt_->ScoreOf(loss), ScoreWith(loss, 0));
    if (weight > 0) {
      EXPECT_NE(rt_->ScoreOf(b), ScoreWith(b, 0));
    }
    mirror = c_forward;
    EXPECT_NEAR(rt_->ScoreOf(a) / expected(a), 1, 1e-12);
    // The mirror never moves forward: reading `loss` (used after c) leaves it where c put it.
    backward_op(loss, 1);
    EXPECT_NEAR(rt_->ScoreOf(a) / expected(a), 1, 1e-12);
    // An in-place op of the backward pass moves it back to what it reads (b) and clears the flag
    // of what it reads and writes.
    const double b_forward = rt_->storage(b)->last_access;
    std::vector<StorageId> read_b{b}, write_loss{loss};
    Runtime::MutateCall accumulate{"add_", read_b, write_loss};
    accumulate.backward = true;
    ASSERT_TRUE(rt_->Mutate(accumulate, []() -> absl::StatusOr<double> { return 1.0; }).ok());
    Check();
    mirror = b_forward;
    EXPECT_FALSE(rt_->storage(b)->awaits_backward);
    EXPECT_DOUBLE_EQ(rt_->ScoreOf(b), ScoreWith(b, 0));
    EXPECT_NEAR(rt_->ScoreOf(a) / expected(a), 1, 1e-12);
    if (weight > 0) {
      EXPECT_NE(rt_->ScoreOf(a), ScoreWith(a, 0));
    }
    // A forward op ends the backward pass.
    filler();
    for (StorageId s : {a, b, c}) EXPECT_DOUBLE_EQ(rt_->ScoreOf(s), ScoreWith(s, 0));
    // A forward op's in-place write does not flag what it writes (a gradient zeroed before the
    // forward pass would pull the mirror back to the start of the step).
    std::vector<StorageId> write_d{d};
    Runtime::MutateCall zero{"zero_", {}, write_d};
    zero.overwrites = true;
    ASSERT_TRUE(rt_->Mutate(zero, []() -> absl::StatusOr<double> { return 1.0; }).ok());
    EXPECT_FALSE(rt_->storage(d)->awaits_backward);
    Check();
  }
}

TEST_F(RuntimeTest, NextVictimIsWhatReserveEvictsAndIsSearchedAnewAfterEachEviction) {
  Make(kUnlimitedBudget, HeuristicKind::kDtr);  // exact search
  StorageId x = Const(1);
  StorageId a = Op1("a", {x}, 100, 1);
  StorageId b = Op1("b", {a}, 100, 1);
  StorageId c = Op1("c", {b}, 100, 1);
  StorageId d = Op1("d", {x}, 100, 1.5);
  const std::vector<StorageId> all = {a, b, c, d};
  for (StorageId s : all) (void)Op1("reader", {s}, 0);  // not results awaiting their reader
  auto lowest_score = [&] {
    double lowest = std::numeric_limits<double>::infinity();
    for (StorageId s : all)
      if (Resident(s)) lowest = std::min(lowest, rt_->ScoreOf(s));
    return lowest;
  };
  std::vector<StorageId> evicted;
  for (int round = 0; round < 3; ++round) {
    std::optional<Runtime::Candidate> next = rt_->NextVictim();
    ASSERT_TRUE(next.has_value());
    EXPECT_TRUE(Resident(next->id));
    EXPECT_EQ(next->size, 100u);
    EXPECT_DOUBLE_EQ(next->score, rt_->ScoreOf(next->id));
    EXPECT_DOUBLE_EQ(next->score, lowest_score()) << "round " << round;
    // Reserve takes the same one: a budget a byte short of what is resident evicts exactly it.
    ASSERT_TRUE(rt_->SetBudget(rt_->memory() - 1).ok());
    EXPECT_FALSE(Resident(next->id));
    for (StorageId s : all)
      if (s != next->id && std::find(evicted.begin(), evicted.end(), s) == evicted.end()) {
        EXPECT_TRUE(Resident(s));
      }
    evicted.push_back(next->id);
    Check();
  }
  // The constant is all that is left: nothing to offer.
  ASSERT_TRUE(rt_->SetBudget(kUnlimitedBudget).ok());
  (void)rt_->EvictAtLeast(1000);
  EXPECT_FALSE(rt_->NextVictim().has_value());
}

// Note [Victim search]: a sampled search carries its runners-up (the best of its candidates but
// the victim, at most 16) into the next one. A pool that does not change, searched with samples
// of 4: the first search scores its sample, the next ones the sample and up to 3 more carried
// each time, until 16; and the victim, not carried, is rarely the next search's victim again.
TEST_F(RuntimeTest, SampledVictimSearchCarriesItsRunnersUpButNotItsVictim) {
  ASSERT_NO_FATAL_FAILURE(MakeSampledPoolOfSizes1To200());
  std::vector<uint64_t> scored;
  std::vector<StorageId> victims;
  for (int call = 0; call < 40; ++call) {
    const uint64_t scored_before = rt_->stats().candidates_scored;
    auto victim = rt_->NextVictim();
    ASSERT_TRUE(victim.has_value());
    EXPECT_DOUBLE_EQ(victim->score, 1.0 / double(victim->size));
    scored.push_back(rt_->stats().candidates_scored - scored_before);
    victims.push_back(victim->id);
  }
  EXPECT_EQ(scored.front(), 4u);
  for (size_t call = 1; call < scored.size(); ++call) {
    EXPECT_LE(scored[call], std::min<uint64_t>(scored[call - 1] + 3, 4 + 16)) << "call " << call;
    EXPECT_GE(scored[call], 4u) << "call " << call;
  }
  EXPECT_EQ(scored.back(), 4u + 16u);
  int repeated = 0;
  for (size_t call = 1; call < victims.size(); ++call) repeated += victims[call] == victims[call - 1];
  EXPECT_LE(repeated, 3);  // drawn again by chance: 4 draws of 200, about 2% a search
  Check();
}

// Note [Ranked candidates]: in sampled mode a ranking scores the carried runners-up and a
// sample, not the pool, and carries its best on, so the best it offers never gets worse.
TEST_F(RuntimeTest, RankedCandidatesInSampledModeScoreASampleAndCarryTheBest) {
  ASSERT_NO_FATAL_FAILURE(MakeSampledPoolOfSizes1To200());
  double best = std::numeric_limits<double>::infinity();
  for (int call = 0; call < 50; ++call) {
    const uint64_t scored_before = rt_->stats().candidates_scored;
    auto ranked = rt_->RankedCandidates(8);
    EXPECT_LE(rt_->stats().candidates_scored - scored_before, 4u + 16u);  // sample + carried
    ASSERT_FALSE(ranked.empty());
    for (size_t i = 1; i < ranked.size(); ++i) {
      EXPECT_LE(ranked[i - 1].score, ranked[i].score);
      EXPECT_NE(ranked[i - 1].id, ranked[i].id);
    }
    EXPECT_LE(ranked[0].score, best) << "call " << call;
    best = ranked[0].score;
  }
  EXPECT_LT(best, 1.0 / 150);  // carrying climbed well above what one sample of 4 finds
  // Asking for more than a sample holds ranks the whole pool.
  auto all = rt_->RankedCandidates(1000);
  ASSERT_EQ(all.size(), 200u);
  EXPECT_DOUBLE_EQ(all[0].score, 1.0 / 200);
  Check();
}

// Note [Ranked candidates]: a sample holding only results awaiting their reader does not hide
// the one storage that can be evicted cheaply.
TEST_F(RuntimeTest, RankedCandidatesSearchThePoolWhenTheSampleHasNothingToRank) {
  RuntimeConfig config;
  config.heuristic = HeuristicKind::kSize;
  config.min_samples = config.max_samples = 4;
  config.exhaustive_pool = 0;  // a sample, not the whole pool (Note [Small pools are searched whole])
  Make(config);
  StorageId x = Const(1);
  // Held and read by nothing, with recipes that read a rematerializable storage (Note [Results
  // awaiting their reader]).
  StorageId root = Op1("root", {x}, 1);
  for (int i = 0; i < 99; ++i) (void)Op1("held", {root}, 10);
  ASSERT_TRUE(rt_->Evict(root).ok());  // so that read is the one ordinary candidate
  StorageId read = Op1("read", {x}, 10);
  (void)Op1("reader", {read}, 0);
  for (int call = 0; call < 10; ++call) {
    auto ranked = rt_->RankedCandidates(4);
    ASSERT_FALSE(ranked.empty());
    EXPECT_EQ(ranked[0].id, read) << "call " << call;
    EXPECT_TRUE(std::isfinite(ranked[0].score));
  }
  // Half the pool awaits its reader: a sampled ranking offers none of those while others exist.
  for (int i = 0; i < 60; ++i) (void)Op1("read_later", {Op1("act", {x}, 10)}, 0);
  for (int call = 0; call < 10; ++call)
    for (const auto& c : rt_->RankedCandidates(32)) EXPECT_TRUE(std::isfinite(c.score)) << "call " << call;
}

// Note [Bounded victim search]: cutting losing walks leaves the ranked list as it was.
TEST_F(RuntimeTest, CuttingLosingWalksKeepsTheRankedList) {
  for (SearchMode search : {SearchMode::kExact, SearchMode::kSampled}) {
    std::vector<std::vector<std::pair<StorageId, double>>> lists[2];
    for (bool cut : {false, true}) {
      RuntimeConfig config;
      config.heuristic = HeuristicKind::kDtr;
      config.search = search;
      config.min_samples = config.max_samples = 8;
      config.exhaustive_pool = 0;  // sampled searches on this small pool
      config.cut_losing_walks = cut;
      config.neighborhood_cache_events = 0;  // Note [Neighborhood cost cache]: cut and full walks cache differently
      Make(config);
      // A chain with side branches, then evictions all along it, ranked after each.
      StorageId x = Const(1);
      std::vector<StorageId> chain = {x};
      for (int i = 0; i < 120; ++i) {
        StorageId next = Op1("f", {chain.back()}, 10 + (i * 37) % 23, 1 + (i * 13) % 7);
        if (i % 3 == 0) (void)Op1("side", {chain.back(), next}, 5 + i % 4, 2);
        chain.push_back(next);
      }
      for (int round = 0; round < 30; ++round) {
        rt_->EvictAtLeast(40);
        std::vector<std::pair<StorageId, double>> list;
        for (const auto& c : rt_->RankedCandidates(6)) list.push_back({c.id, c.score});
        lists[cut].push_back(list);
        ASSERT_TRUE(rt_->Access(chain[1 + (round * 41) % 120]).ok());
        Check();
      }
    }
    EXPECT_EQ(lists[0], lists[1]) << SearchModeName(search);
  }
}

}  // namespace
}  // namespace dtr

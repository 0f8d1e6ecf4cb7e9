// Rotor's persistent-schedule dynamic program; see Note [Persistent DP] and
// Note [Rotor discretization] in rotor_planner.h.
#include "runtime/sim/rotor_planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "runtime/bytes.h"

namespace dtr::sim {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// DP choices recorded per (s, t, m), for Algorithm 4's reconstruction.
constexpr int32_t kInfeasible = -2;  // no persistent schedule fits
constexpr int32_t kForwardAll = -1;  // start with F_all^s; any other value is the split s'

// Chain quantities in the DP's memory unit (a slot, or one byte when exact), indexed by stage
// 0..L+1 (Note [Loss stage]).
struct UnitSizes {
  std::vector<int64_t> a, abar, o_f, o_b;  // w_delta^l = w_a^l

  // m_all(s, t) of Note [Persistent DP]: F_all^s with delta^t held, and B^s.
  int64_t ForwardAllPeak(int s, int t) const {
    return std::max(a[t] + abar[s] + o_f[s], a[s] + a[s - 1] + abar[s] + o_b[s]);
  }
  // The sweep's F^j peak, not counting delta^t: F_ck^s (j == s) or F_none^j (j > s).
  int64_t SweepStepPeak(int s, int j) const { return j == s ? a[s] + o_f[s] : a[j - 1] + a[j] + o_f[j]; }
};

UnitSizes ToUnits(const Chain& chain, uint64_t unit) {
  const int n = chain.loss_stage();
  auto up = [unit](uint64_t bytes) { return int64_t(bytes / unit + (bytes % unit != 0)); };
  UnitSizes u;
  u.a.resize(n + 1);
  u.abar.resize(n + 1);
  u.o_f.resize(n + 1);
  u.o_b.resize(n + 1);
  for (int l = 0; l <= n; ++l) {
    u.a[l] = up(chain.activation_bytes(l));
    u.abar[l] = up(chain.saved_for_backward_bytes(l));
    u.o_f[l] = up(chain.forward_overhead_bytes(l));
    u.o_b[l] = up(chain.backward_overhead_bytes(l));
  }
  return u;
}

// Algorithm 4: appends the schedule recorded for (s, t, m); `choice_at(s, t, m)` reads the
// recorded choices. False if they are inconsistent (a bug, reported by PlanRotor).
template <typename ChoiceAt>
bool Rebuild(const UnitSizes& u, const ChoiceAt& choice_at, int s, int t, int64_t m, ChainSchedule* out) {
  if (m < 0) return false;
  const int32_t choice = choice_at(s, t, m);
  if (choice == kForwardAll) {
    out->push_back(ChainOp::ForwardAll(s));
    if (s < t && !Rebuild(u, choice_at, s + 1, t, m - u.abar[s], out)) return false;
    out->push_back(ChainOp::Backward(s));
    return true;
  }
  const int split = choice;
  if (split <= s || split > t) return false;
  out->push_back(ChainOp::ForwardCheckpoint(s));
  for (int j = s + 1; j < split; ++j) out->push_back(ChainOp::ForwardNoSave(j));
  return Rebuild(u, choice_at, split, t, m - u.a[split - 1], out) && Rebuild(u, choice_at, s, split - 1, m, out);
}

// Algorithm 3 with slots: C(s, t, m) for every m = 0..max_m, one row per (s, t), shorter chains
// first. Each candidate start is evaluated for a whole row at once, which keeps the O(S L^3)
// inner loop a scan over contiguous memory.
class SlotTable {
 public:
  SlotTable(const Chain& chain, const UnitSizes& u, int64_t max_m)
      : chain_(chain), u_(u), n_(chain.loss_stage()), width_(size_t(max_m) + 1) {
    const size_t pairs = size_t(n_) * size_t(n_ + 1) / 2;
    costs_.assign(pairs * width_, kInfinity);
    choices_.assign(pairs * width_, kInfeasible);
    for (int d = 0; d < n_; ++d)
      for (int s = 1; s + d <= n_; ++s) FillRow(s, s + d);
  }

  double cost(int s, int t, int64_t m) const { return costs_[Row(s, t) + size_t(m)]; }
  int32_t choice(int s, int t, int64_t m) const { return choices_[Row(s, t) + size_t(m)]; }

 private:
  size_t Row(int s, int t) const {
    // Pairs 1 <= s <= t <= n_, numbered row by row.
    const size_t r = size_t(s - 1);
    return (r * size_t(n_) - r * (r - 1) / 2 + size_t(t - s)) * width_;
  }

  void FillRow(int s, int t) {
    double* cost = &costs_[Row(s, t)];
    int32_t* choice = &choices_[Row(s, t)];
    const int64_t last = int64_t(width_) - 1;
    // Start with F_all^s (for s == t, the only start: F_all^s B^s).
    const double forward_backward = chain_.forward_cost(s) + chain_.backward_cost(s);
    const int64_t m_all = u_.ForwardAllPeak(s, t);
    if (s == t) {
      for (int64_t m = m_all; m <= last; ++m) {
        cost[m] = forward_backward;
        choice[m] = kForwardAll;
      }
      return;
    }
    const double* rest = &costs_[Row(s + 1, t)];
    const int64_t shift_all = u_.abar[s];
    for (int64_t m = std::max(m_all, shift_all); m <= last; ++m) {
      const double c = forward_backward + rest[m - shift_all];
      if (c < cost[m]) {
        cost[m] = c;
        choice[m] = kForwardAll;
      }
    }
    // Start with F_ck^s F_none^{s+1} .. F_none^{s'-1}, keeping a^{s'-1} until B^{s'}.
    int64_t sweep = 0;
    double sweep_cost = 0;
    for (int split = s + 1; split <= t; ++split) {
      const int j = split - 1;  // the sweep's last stage
      sweep = std::max(sweep, u_.SweepStepPeak(s, j));
      const int64_t m_sweep = u_.a[t] + sweep;
      if (m_sweep > last) break;  // the sweep only grows with s'
      sweep_cost += chain_.forward_cost(j);
      const double* right = &costs_[Row(split, t)];
      const double* left = &costs_[Row(s, split - 1)];
      const int64_t shift = u_.a[split - 1];
      for (int64_t m = std::max(m_sweep, shift); m <= last; ++m) {
        const double c = sweep_cost + right[m - shift] + left[m];
        if (c < cost[m]) {
          cost[m] = c;
          choice[m] = split;
        }
      }
    }
  }

  const Chain& chain_;
  const UnitSizes& u_;
  const int n_;
  const size_t width_;
  std::vector<double> costs_;
  std::vector<int32_t> choices_;
};

// The same recurrence without slots: memoized on exact remaining bytes, computing only the
// (s, t, m) the top call reaches.
class ExactMemo {
 public:
  ExactMemo(const Chain& chain, const UnitSizes& u, size_t max_entries)
      : chain_(chain), u_(u), max_entries_(max_entries) {}

  bool overflowed() const { return overflowed_; }

  double Solve(int s, int t, int64_t m) {
    if (m < 0 || overflowed_) return kInfinity;
    if (auto it = memo_.find(Key(s, t, m)); it != memo_.end()) return it->second.cost;
    Entry best{kInfinity, kInfeasible};
    if (m >= u_.ForwardAllPeak(s, t)) {
      const double rest = s == t ? 0 : Solve(s + 1, t, m - u_.abar[s]);
      if (rest < kInfinity) best = {chain_.forward_cost(s) + rest + chain_.backward_cost(s), kForwardAll};
    }
    int64_t sweep = 0;
    double sweep_cost = 0;
    for (int split = s + 1; split <= t; ++split) {
      const int j = split - 1;
      sweep = std::max(sweep, u_.SweepStepPeak(s, j));
      if (u_.a[t] + sweep > m) break;
      sweep_cost += chain_.forward_cost(j);
      const double right = Solve(split, t, m - u_.a[split - 1]);
      if (right == kInfinity) continue;
      const double left = Solve(s, split - 1, m);
      if (left == kInfinity) continue;
      if (sweep_cost + right + left < best.cost) best = {sweep_cost + right + left, split};
    }
    memo_[Key(s, t, m)] = best;
    if (memo_.size() > max_entries_) overflowed_ = true;
    return best.cost;
  }

  int32_t choice(int s, int t, int64_t m) const {
    auto it = memo_.find(Key(s, t, m));
    return it == memo_.end() ? kInfeasible : it->second.choice;
  }

 private:
  struct Entry {
    double cost;
    int32_t choice;
  };
  static std::tuple<int, int, int64_t> Key(int s, int t, int64_t m) { return {s, t, m}; }

  const Chain& chain_;
  const UnitSizes& u_;
  const size_t max_entries_;
  absl::flat_hash_map<std::tuple<int, int, int64_t>, Entry> memo_;
  bool overflowed_ = false;
};

}  // namespace

uint64_t MinimumPersistentPeakBytes(const Chain& chain) {
  // need(s, t): the least m for which C(s, t, m) is finite (feasibility is monotone in m).
  const int n = chain.loss_stage();
  const UnitSizes u = ToUnits(chain, 1);
  std::vector<std::vector<int64_t>> need(n + 2, std::vector<int64_t>(n + 2, 0));
  for (int d = 0; d < n; ++d) {
    for (int s = 1; s + d <= n; ++s) {
      const int t = s + d;
      const int64_t m_all = u.ForwardAllPeak(s, t);
      int64_t best = s == t ? m_all : std::max(m_all, u.abar[s] + need[s + 1][t]);
      int64_t sweep = 0;
      for (int split = s + 1; split <= t; ++split) {
        sweep = std::max(sweep, u.SweepStepPeak(s, split - 1));
        best = std::min(best, std::max({u.a[t] + sweep, u.a[split - 1] + need[split][t], need[s][split - 1]}));
      }
      need[s][t] = best;
    }
  }
  return uint64_t(u.a[0] + need[1][n]);
}

absl::StatusOr<RotorPlan> PlanRotor(const Chain& chain, uint64_t budget_bytes, const RotorOptions& options) {
  if (options.slots < 0) return absl::InvalidArgumentError(absl::StrCat("slots must be >= 0, got ", options.slots));
  const bool exact = options.slots == 0;
  RotorPlan plan;
  plan.slot_bytes = exact ? 1
                          : std::max<uint64_t>(1, budget_bytes / uint64_t(options.slots) +
                                                      (budget_bytes % uint64_t(options.slots) != 0));
  plan.budget_slots = int64_t(budget_bytes / plan.slot_bytes);
  // Running every F and B once is the least any schedule can cost, so when it fits it is the
  // optimum, exactly, whatever the rounding would have made of it.
  if (auto store_all = ExecuteSchedule(chain, StoreAllSchedule(chain));
      store_all.ok() && store_all->peak_bytes <= budget_bytes) {
    plan.schedule = StoreAllSchedule(chain);
    plan.run = *store_all;
    plan.makespan = store_all->makespan;
    return plan;
  }

  const int n = chain.loss_stage();
  constexpr size_t kEntryBytes = sizeof(double) + sizeof(int32_t);
  const size_t pairs = size_t(n) * size_t(n + 1) / 2;
  if (!exact && pairs * size_t(plan.budget_slots + 1) > options.max_table_bytes / kEntryBytes)
    return absl::FailedPreconditionError(
        absl::StrCat("the DP table for ", chain.length(), " stages and ", options.slots, " slots needs ",
                     FormatBytes(pairs * size_t(plan.budget_slots + 1) * kEntryBytes), ", over the limit of ",
                     FormatBytes(options.max_table_bytes), "; use fewer slots"));

  auto infeasible = [&]() {
    const uint64_t minimum = MinimumPersistentPeakBytes(chain);
    if (budget_bytes < minimum)
      return absl::ResourceExhaustedError(absl::StrCat("no persistent schedule fits in ", budget_bytes,
                                                       " bytes: the smallest possible peak is ", minimum, " bytes (",
                                                       FormatBytesShort(minimum), ")"));
    return absl::ResourceExhaustedError(
        absl::StrCat("no persistent schedule fits in ", budget_bytes, " bytes once sizes are rounded up to ",
                     plan.budget_slots, " slots of ", plan.slot_bytes, " bytes; the exact minimum peak is ", minimum,
                     " bytes, so more slots or a budget of about ",
                     minimum + uint64_t(chain.length() + 6) * plan.slot_bytes, " bytes would do"));
  };

  const UnitSizes sizes = ToUnits(chain, plan.slot_bytes);
  const int64_t top_m = plan.budget_slots - sizes.a[0];
  if (top_m < 0) return infeasible();
  bool rebuilt = false;
  if (exact) {
    ExactMemo memo(chain, sizes, options.max_table_bytes / (kEntryBytes + 32));
    plan.makespan = memo.Solve(1, n, top_m);
    if (memo.overflowed())
      return absl::FailedPreconditionError(absl::StrCat("the exact DP (slots = 0) outgrew ",
                                                        FormatBytes(options.max_table_bytes),
                                                        " of memo for this chain; use slots > 0"));
    if (plan.makespan == kInfinity) return infeasible();
    auto choice_at = [&memo](int s, int t, int64_t m) { return memo.choice(s, t, m); };
    rebuilt = Rebuild(sizes, choice_at, 1, n, top_m, &plan.schedule);
  } else {
    SlotTable table(chain, sizes, plan.budget_slots);
    plan.makespan = table.cost(1, n, top_m);
    if (plan.makespan == kInfinity) return infeasible();
    auto choice_at = [&table](int s, int t, int64_t m) { return table.choice(s, t, m); };
    rebuilt = Rebuild(sizes, choice_at, 1, n, top_m, &plan.schedule);
  }
  if (!rebuilt) return absl::InternalError("rotor's DP table is inconsistent: cannot rebuild the schedule");

  auto run = ExecuteSchedule(chain, plan.schedule);
  if (!run.ok())
    return absl::InternalError(absl::StrCat("rotor produced an invalid schedule: ", run.status().message()));
  plan.run = *run;
  if (plan.run.peak_bytes > budget_bytes)
    return absl::InternalError(
        absl::StrCat("rotor's schedule peaks at ", plan.run.peak_bytes, " bytes, over the budget of ", budget_bytes));
  if (std::abs(plan.run.makespan - plan.makespan) > 1e-9 * std::max(1.0, std::abs(plan.makespan)))
    return absl::InternalError(
        absl::StrCat("rotor's schedule takes ", plan.run.makespan, ", not the DP's ", plan.makespan));
  return plan;
}

}  // namespace dtr::sim

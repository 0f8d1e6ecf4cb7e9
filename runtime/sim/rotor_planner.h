// Rotor's optimal persistent schedule for a chain under a memory budget (Beaumont et al.,
// "Optimal checkpointing for heterogeneous chains", Theorem 4.8 and Algorithms 3 and 4): the
// dynamic program over (first stage s, last stage t, memory m), with memory discretized into
// slots (Note [Rotor discretization]). A static planner's comparison point for DTR, not a lower
// bound on it: it is optimal only among persistent schedules in the paper's operation set.
//
// Note [Persistent DP]
//   C(s, t, m): the least makespan to turn {a^{s-1}, delta^t} into {delta^{s-1}} by a persistent
//   schedule of stages s..t, peak at most m not counting a^{s-1} (which the caller holds).
//     C(s, s, m)   = u_f^s + u_b^s                       if m >= m_all(s, s)
//     C_all(s,t,m) = u_f^s + C(s+1, t, m - w_abar^s) + u_b^s          if m >= m_all(s, t)
//     C_ck(s,s',t,m) = sum_{k=s}^{s'-1} u_f^k + C(s', t, m - w_a^{s'-1}) + C(s, s'-1, m)
//                                                      if m >= m_sweep(s, s', t), s < s' <= t
//     C(s, t, m)   = min(C_all, min over s' of C_ck)
//   m_all(s, t) = max(w_delta^t + w_abar^s + o_f^s, w_delta^s + w_delta^{s-1} + w_abar^s + o_b^s)
//   is the paper's. m_sweep(s, s', t) = w_delta^t + max(w_a^s + o_f^s, max_{s<j<s'} w_a^{j-1} +
//   w_a^j + o_f^j) is the exact peak of the sweep F_ck^s F_none^{s+1} .. F_none^{s'-1} for this
//   s'; the paper checks one bound for every s' (its m_empty(s, t), j up to t-1), which gives
//   the same optimum when w_abar >= w_a everywhere (the later F^j then happen inside C(s', t, .)
//   with at least as much held) and is only stricter otherwise. The whole chain's optimum is
//   C(1, L+1, M - w_a^0), the loss being stage L+1 (Note [Loss stage]). With slots the table is
//   filled bottom-up as in Algorithm 3, shorter chains first, one row over all m per (s, t):
//   O(S L^3) time, O(S L^2) memory (about 1.7 s per budget for L = 200, S = 500). Exact mode
//   evaluates the same recurrence top-down, memoized on the exact remaining bytes. Either way
//   the schedule is rebuilt from the recorded choices as in Algorithm 4.
//
// Note [Rotor discretization]
//   With S slots and budget M, one slot is ceil(M / S) bytes, the budget is floor(M / slot)
//   slots, and every size and overhead is rounded UP to whole slots (the paper rounds down,
//   which can return schedules that do not fit). So a schedule the DP accepts always fits in M
//   (PlanRotor checks this with the executor). The price is pessimism: a check sums at most L+5
//   rounded values (a^0, one held value per stage below s, and four terms of the operation
//   itself), so the DP finds every persistent schedule whose exact peak is at most
//   M - (L+6) * slot:
//       OPT(M) <= PlanRotor(M, S).makespan <= OPT(M - (L+6) * ceil(M / S))
//   where OPT is the exact persistent optimum (slots = 0 below computes it). With S = 500 and the
//   paper's 6-stage toy chain that tolerance is 2.4% of the budget. One case is exact whatever
//   S: a budget that holds the store-all schedule (F_all all the way, then B) gets it, since
//   running each F and B once is the least any schedule costs.
#ifndef DTR_RUNTIME_SIM_ROTOR_PLANNER_H_
#define DTR_RUNTIME_SIM_ROTOR_PLANNER_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "runtime/sim/chain.h"
#include "runtime/sim/chain_schedule.h"

namespace dtr::sim {

inline constexpr int kDefaultRotorSlots = 500;

struct RotorOptions {
  // S, the number of memory slots (Note [Rotor discretization]). 0 means exact: the DP keys its
  // memo on exact remaining bytes, which is only practical for short chains (it stops with
  // FailedPrecondition past max_table_bytes).
  int slots = kDefaultRotorSlots;
  // Refuse (FailedPrecondition) when the memo would need more than this.
  size_t max_table_bytes = size_t(1) << 30;
};

struct RotorPlan {
  ChainSchedule schedule;
  double makespan = 0;      // the DP's value; equals run.makespan up to float summation order
  ScheduleRun run;          // the executor's exact measurement of `schedule`
  uint64_t slot_bytes = 1;  // the DP's memory unit
  int64_t budget_slots = 0;
};

// The optimal persistent schedule within `budget_bytes`. ResourceExhausted when none fits: the
// message names the smallest peak any persistent schedule reaches (MinimumPersistentPeakBytes)
// and says when it is the slot rounding, not the budget, that rules the schedules out.
// InvalidArgument for slots < 0; FailedPrecondition when the memo would outgrow
// max_table_bytes; Internal if the schedule fails the executor's check (a bug).
absl::StatusOr<RotorPlan> PlanRotor(const Chain& chain, uint64_t budget_bytes, const RotorOptions& options = {});

// The smallest exact peak of any persistent schedule (in bytes, no discretization): budgets below
// it are infeasible for every S. O(L^3).
uint64_t MinimumPersistentPeakBytes(const Chain& chain);

}  // namespace dtr::sim

#endif  // DTR_RUNTIME_SIM_ROTOR_PLANNER_H_

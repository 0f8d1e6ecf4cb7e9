// A heterogeneous chain in the model of Rotor (Beaumont et al., "Optimal checkpointing for
// heterogeneous chains", Section 3): per stage the forward and backward costs, the sizes of the
// activation a^l and of everything the recorded forward keeps for the backward (abar^l), and the
// transient overheads of the forward and backward. The static planners (rotor_planner.h,
// sequential_checkpoint_planner.h) and the schedule executor (chain_schedule.h) work on it;
// dtr-chain reads it from the text format below.
//
// Note [Chain format v1]
//   dtr-chain v1                                 first non-comment line: magic and version
//   # anything                                   comment (also blank lines, and a '#' token
//                                                that starts a trailing comment on any line)
//   input <a0_bytes>                             size of the chain's input a^0; exactly once
//   stage <name> <u_f> <u_b> <a_bytes> <abar_bytes> <o_f_bytes> <o_b_bytes>
//                                                stage l = 1, 2, ... in file order
// u_f, u_b: non-negative finite costs of F^l and B^l in any one unit (ms, ns: the outputs use
// it). Byte fields are non-negative integers: a_bytes = w_a^l (the output a^l, also the size of
// its gradient delta^l); abar_bytes = w_abar^l (everything F_all^l keeps for B^l, a^l included
// but not a^{l-1}, as the paper defines it: so normally abar_bytes >= a_bytes, which is not
// enforced because measured chains, the paper's own Table 2 among them, break it by noise);
// o_f_bytes, o_b_bytes: the memory F^l and B^l need on top of their inputs and outputs.
// A stage name is any token without whitespace; names are labels only. Any line may carry extra
// `key=value` tokens after its fields; they are kept (and printed back) but not interpreted, so
// writers can add annotations without a version change.
//
// Note [Loss stage]
//   The paper models the loss as a stage L+1 after the L stages (F^{L+1}, B^{L+1}, with
//   delta^{L+1} = dLoss/dLoss the first gradient). A chain file lists only the L stages; the
//   loss stage is implicit, with zero costs, zero sizes and zero overheads (fold a real loss's
//   cost into the last stage). It matters even at zero size: B^{L+1} is what creates delta^L,
//   so delta^L takes no memory during the forward sweep. Schedules (chain_schedule.h) name it
//   as stage L+1, and the accessors below answer for l = L+1.
#ifndef DTR_RUNTIME_SIM_CHAIN_H_
#define DTR_RUNTIME_SIM_CHAIN_H_

#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtr::sim {

inline constexpr int kChainFormatVersion = 1;

// Extra `key=value` annotations of one line, in file order (Note [Chain format v1]).
using ChainAnnotations = std::vector<std::pair<std::string, std::string>>;

struct ChainStage {
  std::string name;
  double forward_cost = 0;                // u_f
  double backward_cost = 0;               // u_b
  uint64_t activation_bytes = 0;          // w_a (and w_delta)
  uint64_t saved_for_backward_bytes = 0;  // w_abar, a^l included
  uint64_t forward_overhead_bytes = 0;    // o_f
  uint64_t backward_overhead_bytes = 0;   // o_b
  ChainAnnotations annotations;
};

struct Chain {
  uint64_t input_bytes = 0;  // w_a^0
  ChainAnnotations input_annotations;
  std::vector<ChainStage> stages;  // stage l is stages[l - 1], l = 1..L

  // L, the number of listed stages; the loss is stage L+1 (Note [Loss stage]).
  int length() const { return int(stages.size()); }
  int loss_stage() const { return length() + 1; }

  // Per-stage quantities for l = 1..L+1 (the loss stage answers zero), and
  // activation_bytes(0) = input_bytes. gradient_bytes(l) = activation_bytes(l) (delta^l has the
  // shape of a^l).
  double forward_cost(int l) const;
  double backward_cost(int l) const;
  uint64_t activation_bytes(int l) const;
  uint64_t gradient_bytes(int l) const { return activation_bytes(l); }
  uint64_t saved_for_backward_bytes(int l) const;
  uint64_t forward_overhead_bytes(int l) const;
  uint64_t backward_overhead_bytes(int l) const;

  // sum over the stages of u_f + u_b: the makespan of a schedule that recomputes nothing.
  double base_cost() const;
};

absl::StatusOr<Chain> ParseChain(absl::string_view text);
// `path` "-" reads standard input (runtime/sim/text_input.h).
absl::StatusOr<Chain> ReadChainFile(const std::string& path);
// Writes the chain in format v1; ParseChain reads it back to an equal chain (costs are printed
// with enough digits to round-trip).
void WriteChain(const Chain& chain, std::ostream& out);
std::string ChainToString(const Chain& chain);

}  // namespace dtr::sim

#endif  // DTR_RUNTIME_SIM_CHAIN_H_

// GeneratorSnapshots: the copies of random generators that records of random ops keep (design
// rule 6: a replay draws what the op drew), made without constructing a generator each time.
//
// Note [Generator snapshots]
// A record of dropout's bernoulli_ keeps the state of the generator the op drew from. On the CPU
// at::Generator::clone constructs a CPUGeneratorImpl, whose constructor seeds a fresh Mersenne
// Twister before the source's state is copied over it: about 10,000 instructions. On the
// Transformer (16 dropouts a step) under a budget that never binds, what dtr adds an op went from
// 9,624 to 9,393 instructions with snapshots (bench/step_instructions.py). A snapshot here reuses a CPU generator that
// no record holds any more (the pool's reference is its only one) and copies the source's whole
// state into it: the Mersenne Twister and the cached normal samples, which is everything
// CPUGeneratorImpl's clone copies. Pooled generators never reach a program or an op: records
// hand their ops clones of them (Engine::Replay). Other devices' generators are cloned as
// before. Not thread-safe: the engine's lock guards it, as it guards the records.
#ifndef DTR_HOOKS_GENERATOR_SNAPSHOTS_H_
#define DTR_HOOKS_GENERATOR_SNAPSHOTS_H_

#include <cstddef>
#include <vector>

#include <ATen/core/Generator.h>

namespace dtr::hooks {

class GeneratorSnapshots {
 public:
  // A generator in `source`'s state, independent of it. The caller holds source's mutex.
  at::Generator Take(const at::Generator& source);

  size_t pooled() const { return pool_.size(); }

 private:
  // Generators handed out, each reusable once the pool holds its only reference. Bounded: past
  // kMaxPooled live snapshots (records of random ops) further ones are plain clones.
  static constexpr size_t kMaxPooled = 256;
  // Records die about in the order they were made, so the search starts after the last reuse
  // and looks at a few entries only.
  static constexpr size_t kMaxProbes = 16;
  std::vector<at::Generator> pool_;
  size_t next_ = 0;
};

}  // namespace dtr::hooks

#endif  // DTR_HOOKS_GENERATOR_SNAPSHOTS_H_

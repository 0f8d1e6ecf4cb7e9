// SplitMix64 (Steele, Lea and Flood, OOPSLA 2014): the random generator of the victim search's
// samples (Note [Victim search]). A sample of 64 indices drew each from std::mt19937_64 through
// std::uniform_int_distribution in about 43 instructions (the twister's state refresh included),
// about a tenth of a decision at 1e5 storages; this takes 14, with Lemire's multiply-shift for
// the range (no division; its bias, under n / 2^64, is far below any sample's noise).
// Statistical quality is ample for sampling: SplitMix64 passes BigCrush.
#ifndef DTR_RUNTIME_SPLIT_MIX_H_
#define DTR_RUNTIME_SPLIT_MIX_H_

#include <cstdint>
#include <limits>

namespace dtr {

class SplitMix64 {
 public:
  using result_type = uint64_t;  // a UniformRandomBitGenerator, for <random>'s distributions
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return std::numeric_limits<result_type>::max(); }
  result_type operator()() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), n >= 1.
  uint64_t Below(uint64_t n) { return uint64_t((static_cast<unsigned __int128>((*this)()) * n) >> 64); }

 private:
  uint64_t state_;
};

}  // namespace dtr

#endif  // DTR_RUNTIME_SPLIT_MIX_H_

// The global state a recorded op snapshots for its replay (Note [Global state a replay depends
// on], replay_record.h) and the default generator's fingerprint (GenMark, op_classification.h),
// both read without torch's slow accessors: BackendFlags::Current caches the float32 precisions
// (Note [Backend flags without hashing], replay_record.cc) and GenMark reads the Mersenne Twister
// in place (Note [Reading torch's private members], torch_compat.h). Every setter of every flag
// must show in the next snapshot, every draw from the default CPU generator in the next mark,
// exactly as through the public accessors.
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "hooks/op_classification.h"
#include "hooks/replay_record.h"

namespace dtr::hooks {
namespace {

using Flags = ReplayRecord::BackendFlags;

// The snapshot as it was taken before the cache: the precisions through float32Precision every
// time (the other fields are read afresh by Current itself; the tests below check they move).
Flags Uncached() {
  const at::Context& c = at::globalContext();
  Flags f = Flags::Current();
  const std::pair<at::Float32Backend, at::Float32Op> keys[4] = {
      {at::Float32Backend::CUDA, at::Float32Op::MATMUL},
      {at::Float32Backend::CUDA, at::Float32Op::CONV},
      {at::Float32Backend::MKLDNN, at::Float32Op::MATMUL},
      {at::Float32Backend::MKLDNN, at::Float32Op::CONV},
  };
  for (int i = 0; i < 4; ++i) f.precision[i] = uint8_t(c.float32Precision(keys[i].first, keys[i].second));
  return f;
}

std::string Show(const Flags& f) {
  std::string s = std::to_string(f.deterministic) + std::to_string(f.deterministic_warn_only) +
                  std::to_string(f.cudnn_deterministic) + std::to_string(f.cudnn_benchmark) +
                  std::to_string(f.cudnn_enabled) + std::to_string(f.mkldnn_enabled) + " precision";
  for (uint8_t p : f.precision) s += " " + std::to_string(p);
  return s + " ftz " + std::to_string(f.flush_denormal) + " threads " + std::to_string(f.num_threads);
}

// Runs a setter (torch refuses some combinations: those are skipped), then compares the
// snapshot with the uncached one. Returns the snapshot, or nothing if the setter threw.
std::optional<Flags> AfterSetting(const std::string& what, const std::function<void()>& set) {
  try {
    set();
  } catch (const c10::Error&) {
    return std::nullopt;
  }
  const Flags cached = Flags::Current();
  const Flags uncached = Uncached();
  EXPECT_TRUE(cached == uncached) << what << ": snapshot " << Show(cached) << ", accessors " << Show(uncached);
  return cached;
}

class BackendFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = Flags::Current(); }
  void TearDown() override {
    // Apply sets the four resolved precisions; with the ALL and GENERIC entries back at NONE
    // (their defaults) nothing shadows them.
    at::Context& c = at::globalContext();
    c.setFloat32Precision(at::Float32Backend::GENERIC, at::Float32Op::ALL, at::Float32Precision::NONE);
    c.setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::ALL, at::Float32Precision::NONE);
    c.setFloat32Precision(at::Float32Backend::MKLDNN, at::Float32Op::ALL, at::Float32Precision::NONE);
    saved_.Apply();
    EXPECT_TRUE(Flags::Current() == saved_);
  }
  Flags saved_;
};

TEST_F(BackendFlagsTest, EveryFloat32PrecisionSetterShowsInTheNextSnapshot) {
  using B = at::Float32Backend;
  using O = at::Float32Op;
  using P = at::Float32Precision;
  std::set<std::string> distinct;
  (void)Flags::Current();  // warm this thread's cache
  for (B b : {B::GENERIC, B::CUDA, B::MKLDNN})
    for (O o : {O::ALL, O::CONV, O::RNN, O::MATMUL})
      for (P p : {P::TF32, P::BF16, P::IEEE, P::NONE, P::TF32, P::IEEE}) {
        const std::string what = "setFloat32Precision(" + std::to_string(int(b)) + ", " + std::to_string(int(o)) +
                                 ", " + std::to_string(int(p)) + ")";
        if (auto f = AfterSetting(what, [&] { at::globalContext().setFloat32Precision(b, o, p); }))
          distinct.insert(Show(*f));
      }
  for (const char* m : {"medium", "high", "highest", "high", "medium", "highest"})
    if (auto f = AfterSetting(std::string("setFloat32MatmulPrecision ") + m,
                              [&] { at::globalContext().setFloat32MatmulPrecision(m); }))
      distinct.insert(Show(*f));
  for (bool on : {true, false, true, false}) {
    if (auto f = AfterSetting("setAllowTF32CuBLAS", [&] { at::globalContext().setAllowTF32CuBLAS(on); }))
      distinct.insert(Show(*f));
    if (auto f = AfterSetting("setAllowTF32CuDNN", [&] { at::globalContext().setAllowTF32CuDNN(on); }))
      distinct.insert(Show(*f));
    if (auto f = AfterSetting("setAllowTF32OneDNN", [&] { at::globalContext().setAllowTF32OneDNN(on); }))
      distinct.insert(Show(*f));
  }
  // The setters did change the precisions, many times over.
  EXPECT_GE(distinct.size(), 8u);
}

TEST_F(BackendFlagsTest, EveryOtherFlagShowsInTheNextSnapshot) {
  at::Context& c = at::globalContext();
  std::set<std::string> distinct;
  (void)Flags::Current();
  // Each setter, then the field it must move to.
  auto check = [&](const std::string& what, const std::function<void()>& set, auto field, auto expected) {
    if (auto f = AfterSetting(what, set)) {
      EXPECT_EQ((*f).*field, expected()) << what;
      distinct.insert(Show(*f));
    }
  };
  check("deterministic", [&] { c.setDeterministicAlgorithms(true, false); }, &Flags::deterministic, [] { return true; });
  check("deterministic, warn only", [&] { c.setDeterministicAlgorithms(true, true); },
        &Flags::deterministic_warn_only, [] { return true; });
  check("not deterministic", [&] { c.setDeterministicAlgorithms(false, false); }, &Flags::deterministic,
        [] { return false; });
  check("cudnn deterministic", [&] { c.setDeterministicCuDNN(!c.deterministicCuDNN()); },
        &Flags::cudnn_deterministic, [&] { return c.deterministicCuDNN(); });
  check("cudnn benchmark", [&] { c.setBenchmarkCuDNN(!c.benchmarkCuDNN()); }, &Flags::cudnn_benchmark,
        [&] { return c.benchmarkCuDNN(); });
  check("cudnn enabled", [&] { c.setUserEnabledCuDNN(!c.userEnabledCuDNN()); }, &Flags::cudnn_enabled,
        [&] { return c.userEnabledCuDNN(); });
  check("mkldnn enabled", [&] { c.setUserEnabledMkldnn(!c.userEnabledMkldnn()); }, &Flags::mkldnn_enabled,
        [&] { return c.userEnabledMkldnn(); });
  check("flush denormal", [&] { (void)c.setFlushDenormal(true); }, &Flags::flush_denormal, [] { return true; });
  check("threads", [&] { at::set_num_threads(at::get_num_threads() == 2 ? 1 : 2); }, &Flags::num_threads,
        [] { return at::get_num_threads(); });
  EXPECT_GE(distinct.size(), 8u);
}

TEST_F(BackendFlagsTest, ApplyRestoresASnapshot) {
  at::Context& c = at::globalContext();
  c.setFloat32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL, at::Float32Precision::BF16);
  c.setDeterministicAlgorithms(true, true);
  const Flags recorded = Flags::Current();
  c.setFloat32MatmulPrecision("highest");
  c.setFloat32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL, at::Float32Precision::IEEE);
  c.setDeterministicAlgorithms(false, false);
  ASSERT_FALSE(Flags::Current() == recorded);
  recorded.Apply();
  EXPECT_TRUE(Flags::Current() == recorded) << Show(Flags::Current()) << " vs " << Show(recorded);
  EXPECT_TRUE(Uncached() == recorded);
}

// The fields of a mark as the public (copying) accessors give them.
GenMark PublicMark() {
  auto* g = at::detail::getDefaultCPUGenerator().get<at::CPUGeneratorImpl>();
  const at::mt19937_data_pod d = g->engine().data();
  return GenMark{d.seed_, d.left_, d.next_, /*offset=*/0, g->next_float_normal_sample().has_value(),
                 g->next_double_normal_sample().has_value()};
}

TEST(GenMarkTest, ReadsTheDefaultCpuGeneratorAsItsPublicAccessorsDo) {
  at::manual_seed(1234);
  EXPECT_TRUE(GenMark::Now() == PublicMark());
  (void)at::rand({7});
  const GenMark m = GenMark::Now();
  EXPECT_TRUE(m == PublicMark());
  EXPECT_EQ(m.seed, 1234u);
  EXPECT_NE(m.next, 0u);
}

TEST(GenMarkTest, EveryDrawFromTheDefaultCpuGeneratorShows) {
  at::manual_seed(7);
  GenMark before = GenMark::Now();
  (void)(at::ones({3}) * 2);  // no draw
  EXPECT_TRUE(GenMark::Now() == before);
  const std::vector<std::pair<std::string, std::function<void()>>> draws = {
      {"rand 1", [] { (void)at::rand({1}); }},
      {"rand 5000", [] { (void)at::rand({5000}); }},
      {"randint", [] { (void)at::randint(0, 1 << 30, {3}); }},
      {"randn 1 (caches a normal sample)", [] { (void)at::randn({1}); }},
      {"randn 1 (uses the cached sample)", [] { (void)at::randn({1}); }},
      {"randn 1000", [] { (void)at::randn({1000}); }},
      {"randperm", [] { (void)at::randperm(50); }},
      {"bernoulli", [] { (void)at::bernoulli(at::full({10}, 0.5)); }},
      {"random64", [] {
         auto gen = at::detail::getDefaultCPUGenerator();
         std::lock_guard<std::mutex> l(gen.mutex());
         (void)gen.get<at::CPUGeneratorImpl>()->random64();
       }},
      {"manual_seed (another seed)", [] { at::manual_seed(8); }},
  };
  for (const auto& [what, draw] : draws) {
    draw();
    const GenMark after = GenMark::Now();
    EXPECT_FALSE(after == before) << what << " did not change the mark";
    EXPECT_TRUE(after == PublicMark()) << what;
    before = after;
  }
}

TEST(ClassifyTest, KnownRandomOpsAreSeeded) {
  auto schema = [](const char* name, const char* overload) -> const c10::FunctionSchema& {
    return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload).schema();
  };
  // randn without a Generator argument draws from the default generator: seeded; add is not.
  EXPECT_TRUE(Classify(schema("aten::randn", ""), false).seeded_no_gen);
  EXPECT_TRUE(Classify(schema("aten::normal", "Tensor_float"), false).gen_arg >= 0);
  EXPECT_FALSE(Classify(schema("aten::add", "Tensor"), false).seeded_no_gen);
}

}  // namespace
}  // namespace dtr::hooks

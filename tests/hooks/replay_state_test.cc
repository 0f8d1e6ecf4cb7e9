// The global state a recorded op snapshots for its replay (Note [Global state a replay depends
// on], replay_record.h) and the default generator's fingerprint (GenMark, op_classification.h),
// both read without torch's slow accessors: BackendFlags::Current caches the float32 precisions
// (Note [Backend flags without hashing], replay_record.cc) and GenMark reads the Mersenne Twister
// in place (Note [Reading torch's private members], torch_compat.h). Every setter of every flag
// must show in the next snapshot, every draw from the default CPU generator in the next mark,
// exactly as through the public accessors. A generator snapshot (Note [Generator snapshots],
// generator_snapshots.h) must hold its source's whole state.
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

#include "hooks/generator_snapshots.h"
#include "hooks/op_classification.h"
#include "hooks/replay_record.h"

namespace dtr::hooks {
namespace {

using Flags = ReplayRecord::BackendFlags;
using B = at::Float32Backend;
using O = at::Float32Op;
using P = at::Float32Precision;

// Every float32 precision as torch resolves it (the public getter), for the keys it has.
std::vector<int> Resolved() {
  std::vector<int> out;
  for (B b : {B::GENERIC, B::CUDA, B::MKLDNN})
    for (O o : {O::ALL, O::CONV, O::RNN, O::MATMUL}) {
      try {
        out.push_back(int(at::globalContext().float32Precision(b, o)));
      } catch (const c10::Error&) {
        out.push_back(-1);
      }
    }
  return out;
}

std::string Show(const Flags& f) {
  std::string s = std::to_string(f.deterministic) + std::to_string(f.deterministic_warn_only) +
                  std::to_string(f.deterministic_fill) + std::to_string(f.cudnn_deterministic) +
                  std::to_string(f.cudnn_benchmark) + std::to_string(f.cudnn_enabled) +
                  std::to_string(f.mkldnn_enabled) + std::to_string(f.nnpack_enabled) + " precision";
  for (uint8_t p : f.precision) s += " " + std::to_string(p);
  return s + " cublas " + std::to_string(f.fp16_reduction_cublas) + std::to_string(f.bf16_reduction_cublas) +
         std::to_string(f.fp16_accumulation_cublas) + " cpu fp16 " + std::to_string(f.fp16_reduction_cpu) +
         " blas " + std::to_string(f.blas_backend) + " linalg " + std::to_string(f.linalg_backend) + " ftz " +
         std::to_string(f.flush_denormal) + " threads " + std::to_string(f.num_threads);
}

// A snapshot unlike `f` in every field Apply can set on any machine (left as they are: the
// preferred BLAS and linalg libraries, whose other choices need CUDA libraries, and the CPU's
// float16 reductions, which need a CPU with float16 arithmetic).
Flags Unlike(const Flags& f) {
  Flags o = f;
  o.deterministic = !f.deterministic;
  o.deterministic_fill = !f.deterministic_fill;
  o.cudnn_deterministic = !f.cudnn_deterministic;
  o.cudnn_benchmark = !f.cudnn_benchmark;
  o.cudnn_enabled = !f.cudnn_enabled;
  o.mkldnn_enabled = !f.mkldnn_enabled;
  o.nnpack_enabled = !f.nnpack_enabled;
  for (uint8_t& p : o.precision)
    if (p != Flags::kNoPrecision) p = uint8_t(p == uint8_t(P::IEEE) ? P::NONE : P::IEEE);
  o.fp16_reduction_cublas = uint8_t((f.fp16_reduction_cublas + 1) % 3);
  o.bf16_reduction_cublas = uint8_t((f.bf16_reduction_cublas + 1) % 3);
  o.fp16_accumulation_cublas = !f.fp16_accumulation_cublas;
  o.flush_denormal = !f.flush_denormal;
  o.num_threads = f.num_threads == 1 ? 2 : 1;
  return o;
}

// Runs a setter (torch refuses some combinations: those are skipped), then checks that the
// snapshot round-trips: a replay applies another snapshot and restores this one, after which
// every field and every resolved precision must be as the setter left them. Returns the
// snapshot, or nothing if the setter threw.
std::optional<Flags> AfterSetting(const std::string& what, const std::function<void()>& set) {
  try {
    set();
  } catch (const c10::Error&) {
    return std::nullopt;
  }
  const Flags f = Flags::Current();
  const std::vector<int> resolved = Resolved();
  const Flags other = Unlike(f);
  EXPECT_TRUE(other.Apply().ok()) << what;
  EXPECT_TRUE(Flags::Current() == other) << what << ": applied " << Show(other) << ", got " << Show(Flags::Current());
  EXPECT_TRUE(f.Apply().ok()) << what;
  EXPECT_TRUE(Flags::Current() == f) << what << ": restored " << Show(f) << ", got " << Show(Flags::Current());
  EXPECT_EQ(Resolved(), resolved) << what;
  return f;
}

class BackendFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = Flags::Current(); }
  void TearDown() override {
    EXPECT_TRUE(saved_.Apply().ok());
    EXPECT_TRUE(Flags::Current() == saved_);
  }
  Flags saved_;
};

TEST_F(BackendFlagsTest, EveryFloat32PrecisionSetterSurvivesAReplay) {
  std::set<std::string> distinct;
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

// Note [Raw float32 precisions]: an op recorded under the defaults and replayed after the
// program set the generic precision must leave the specific entries deferring to it, so that
// the program's next setting reaches them as it does without dtr.
TEST_F(BackendFlagsTest, AReplayLeavesDeferringPrecisionsDeferring) {
  at::Context& c = at::globalContext();
  const Flags recorded = Flags::Current();
  c.setFloat32Precision(B::GENERIC, O::ALL, P::IEEE);
  c.setFloat32Precision(B::GENERIC, O::ALL, P::TF32);
  const std::vector<int> without_replay = Resolved();
  ASSERT_TRUE(recorded.Apply().ok());
  ASSERT_TRUE(Flags::Current() == recorded);

  c.setFloat32Precision(B::GENERIC, O::ALL, P::IEEE);
  const Flags program = Flags::Current();
  ASSERT_TRUE(recorded.Apply().ok());  // the replay
  ASSERT_TRUE(program.Apply().ok());   // and the restore
  c.setFloat32Precision(B::GENERIC, O::ALL, P::TF32);
  EXPECT_EQ(Resolved(), without_replay);
  // The specific entries still defer: the generic setting moved them.
  EXPECT_NE(without_replay, std::vector<int>(without_replay.size(), int(P::IEEE)));
}

TEST_F(BackendFlagsTest, EveryOtherFlagShowsInTheNextSnapshot) {
  at::Context& c = at::globalContext();
  std::set<std::string> distinct;
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
  check("deterministic fill", [&] { c.setDeterministicFillUninitializedMemory(!c.deterministicFillUninitializedMemory()); },
        &Flags::deterministic_fill, [&] { return c.deterministicFillUninitializedMemory(); });
  check("cudnn deterministic", [&] { c.setDeterministicCuDNN(!c.deterministicCuDNN()); },
        &Flags::cudnn_deterministic, [&] { return c.deterministicCuDNN(); });
  check("cudnn benchmark", [&] { c.setBenchmarkCuDNN(!c.benchmarkCuDNN()); }, &Flags::cudnn_benchmark,
        [&] { return c.benchmarkCuDNN(); });
  check("cudnn enabled", [&] { c.setUserEnabledCuDNN(!c.userEnabledCuDNN()); }, &Flags::cudnn_enabled,
        [&] { return c.userEnabledCuDNN(); });
  check("mkldnn enabled", [&] { c.setUserEnabledMkldnn(!c.userEnabledMkldnn()); }, &Flags::mkldnn_enabled,
        [&] { return c.userEnabledMkldnn(); });
  check("nnpack enabled", [&] { c.setUserEnabledNNPACK(!c.userEnabledNNPACK()); }, &Flags::nnpack_enabled,
        [&] { return c.userEnabledNNPACK(); });
  check("fp16 reduction cublas", [&] { c.setAllowFP16ReductionCuBLAS(false, false); }, &Flags::fp16_reduction_cublas,
        [&] { return uint8_t(c.allowFP16ReductionCuBLAS()); });
  check("bf16 reduction cublas", [&] { c.setAllowBF16ReductionCuBLAS(false, true); }, &Flags::bf16_reduction_cublas,
        [&] { return uint8_t(c.allowBF16ReductionCuBLAS()); });
  check("fp16 accumulation cublas", [&] { c.setAllowFP16AccumulationCuBLAS(!c.allowFP16AccumulationCuBLAS()); },
        &Flags::fp16_accumulation_cublas, [&] { return c.allowFP16AccumulationCuBLAS(); });
  check("fp16 reduction cpu", [&] { c.setAllowFP16ReductionCPU(!c.allowFP16ReductionCPU()); },
        &Flags::fp16_reduction_cpu, [&] { return c.allowFP16ReductionCPU(); });
  check("flush denormal", [&] { (void)c.setFlushDenormal(true); }, &Flags::flush_denormal, [] { return true; });
  check("threads", [&] { at::set_num_threads(at::get_num_threads() == 2 ? 1 : 2); }, &Flags::num_threads,
        [] { return at::get_num_threads(); });
  EXPECT_GE(distinct.size(), 12u);
}

TEST_F(BackendFlagsTest, ApplyRestoresASnapshot) {
  at::Context& c = at::globalContext();
  c.setFloat32Precision(B::MKLDNN, O::MATMUL, P::BF16);
  c.setDeterministicAlgorithms(true, true);
  const Flags recorded = Flags::Current();
  const std::vector<int> resolved = Resolved();
  c.setFloat32MatmulPrecision("highest");
  c.setFloat32Precision(B::MKLDNN, O::MATMUL, P::IEEE);
  c.setDeterministicAlgorithms(false, false);
  ASSERT_FALSE(Flags::Current() == recorded);
  ASSERT_TRUE(recorded.Apply().ok());
  EXPECT_TRUE(Flags::Current() == recorded) << Show(Flags::Current()) << " vs " << Show(recorded);
  EXPECT_EQ(Resolved(), resolved);
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
  // The cached normal samples, read through the members themselves.
  auto* g = at::detail::getDefaultCPUGenerator().get<at::CPUGeneratorImpl>();
  g->set_next_float_normal_sample(0.5f);
  g->set_next_double_normal_sample(std::nullopt);
  EXPECT_TRUE(GenMark::Now().has_f);
  EXPECT_FALSE(GenMark::Now().has_d);
  EXPECT_TRUE(GenMark::Now() == PublicMark());
  g->set_next_float_normal_sample(std::nullopt);
  g->set_next_double_normal_sample(0.5);
  EXPECT_FALSE(GenMark::Now().has_f);
  EXPECT_TRUE(GenMark::Now().has_d);
  EXPECT_TRUE(GenMark::Now() == PublicMark());
  g->set_next_double_normal_sample(std::nullopt);
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

// The bytes of a generator's whole state, as torch serializes it (Generator::get_state).
std::vector<uint8_t> StateBytes(at::Generator g) {
  std::lock_guard<std::mutex> l(g.mutex());
  const at::Tensor t = g.get_state();
  const uint8_t* p = t.data_ptr<uint8_t>();
  return std::vector<uint8_t>(p, p + t.numel());
}

// Note [Generator snapshots]: a snapshot is in its source's whole state, stays in it while a
// record holds it, and its clone draws what the source draws.
TEST(GeneratorSnapshotsTest, ASnapshotIsTheSourcesWholeStateAndStaysSo) {
  GeneratorSnapshots snapshots;
  at::Generator source = at::make_generator<at::CPUGeneratorImpl>(99);
  auto snapshot_of = [&] {
    std::lock_guard<std::mutex> l(source.mutex());
    return snapshots.Take(source);
  };
  (void)at::randn({1}, source);  // caches a normal sample
  at::Generator first = snapshot_of();
  EXPECT_EQ(StateBytes(first), StateBytes(source));
  EXPECT_NE(first.unsafeGetGeneratorImpl(), source.unsafeGetGeneratorImpl());
  const std::vector<uint8_t> first_state = StateBytes(first);
  const at::Tensor drawn = at::randn({9}, source);  // the cached sample, then fresh ones
  EXPECT_TRUE(at::equal(at::randn({9}, first.clone()), drawn));

  // While `first` is held, a snapshot of the source's new state does not reuse it.
  at::Generator second = snapshot_of();
  EXPECT_NE(second.unsafeGetGeneratorImpl(), first.unsafeGetGeneratorImpl());
  EXPECT_EQ(StateBytes(first), first_state);
  EXPECT_EQ(StateBytes(second), StateBytes(source));

  // Dropped by every record, a pooled generator is reused, in the new state.
  at::GeneratorImpl* reusable = first.unsafeGetGeneratorImpl();
  first = at::Generator();
  (void)at::rand({1000}, source);
  {
    std::lock_guard<std::mutex> l(source.mutex());
    source.get<at::CPUGeneratorImpl>()->set_next_float_normal_sample(0.25f);
  }
  at::Generator third = snapshot_of();
  EXPECT_EQ(third.unsafeGetGeneratorImpl(), reusable);
  EXPECT_EQ(StateBytes(third), StateBytes(source));
  EXPECT_TRUE(at::equal(at::bernoulli(at::full({64}, 0.5), third.clone()), at::bernoulli(at::full({64}, 0.5), source)));
  EXPECT_EQ(snapshots.pooled(), 2u);
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

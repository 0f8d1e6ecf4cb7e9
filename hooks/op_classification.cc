// Operator classification and the random-op family (see op_classification.h).
#include "hooks/op_classification.h"

#include <unordered_set>

#include <pthread.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "hooks/torch_compat.h"

namespace dtr::hooks {
namespace {

bool StartsWith(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// Note [Random ops without a Generator argument]
// Many random aten ops have an overload without a `Generator?` argument that draws from the
// default CPU generator (rand, randn, randint, randperm, rand_like, native_dropout, ...). Replaying
// such an op without restoring the default generator's recorded state produces different values
// (a model input made by torch.randn, evicted and replayed, silently changed the loss) and
// advances the program's global RNG stream. Every aten op whose name has any overload taking a
// Generator, plus the *_like and dropout families, is treated as seeded: the default generator is
// cloned at record time and set/restored around each replay. As a safety net, Fallback also
// fingerprints the default generator around every recorded op and refuses to record an op that
// consumed it unexpectedly (its outputs become constants).
bool IsRandomFamily(const std::string& name) {
  static const std::unordered_set<std::string>* families = [] {
    auto* f = new std::unordered_set<std::string>{
        "aten::native_dropout", "aten::rand_like", "aten::randn_like", "aten::randint_like",
        "aten::dropout", "aten::feature_dropout", "aten::alpha_dropout", "aten::feature_alpha_dropout",
        "aten::rrelu", "aten::rrelu_with_noise", "aten::randperm", "aten::rand", "aten::randn",
        "aten::randint", "aten::bernoulli", "aten::multinomial", "aten::normal", "aten::poisson",
        "aten::binomial", "aten::_standard_gamma", "aten::_sample_dirichlet", "aten::_fused_dropout",
        // Attention with dropout draws from the device's default generator, and returns the
        // Philox seed and offset it used (Note [Host operands of CUDA ops], engine.h).
        "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_cudnn_attention", "aten::_efficient_attention_forward",
        "aten::_flash_attention_forward", "aten::_scaled_dot_product_fused_attention_overrideable"};
    // Made once: creating it per argument of every registered op (~13.7k ops) cost 27M
    // instructions on the first call.
    const c10::TypePtr optional_generator = c10::OptionalType::create(c10::GeneratorType::get());
    for (const c10::OperatorName& on : c10::Dispatcher::singleton().getAllOpNames()) {
      auto h = c10::Dispatcher::singleton().findOp(on);
      if (!h || !h->hasSchema()) continue;
      for (const auto& a : h->schema().arguments())
        if (a.type()->isSubtypeOf(*optional_generator) || a.type()->kind() == c10::TypeKind::GeneratorType) {
          f->insert(on.name);
          break;
        }
    }
    return f;
  }();
  return families->count(name) > 0;
}

// Note [Communication is never replayed]
// Collectives and point-to-point ops (c10d::allreduce_, broadcast_, _allgather_base_, send,
// recv_, ...; the functional collectives of _c10d_functional, wait_tensor included) exchange
// data with other processes: replaying one would communicate again, out of step with the other
// ranks (a hang or wrong data). So:
//  - every tensor argument of such an op goes through Runtime::Mutate as an unreplayable write
//    before the op runs: it becomes a resident constant, never evicted. That also covers the
//    time after the op returns, while an asynchronous Work still reads or writes the memory
//    through raw pointers (a Work not yet waited on). Outputs a functional collective
//    allocates have no record and become constants when first used.
//  - the op itself runs without the engine lock: it may block on another thread of this
//    process (wait_tensor waits for a gloo worker, which runs aten ops of its own), and the
//    engine lock held across that wait would deadlock.
//  - ops that communication backends run on their own worker threads (gloo flattens inputs
//    with at::cat, reduce_scatter works on a clone, DDP's comm hook divides the bucket in a
//    future callback) are never recorded: their results are read through raw pointers by the
//    transport, so an evicted and replayed intermediate could be sent while freed. On those
//    threads recordable ops run unrecorded (their inputs pinned while they run) and writes are
//    unreplayable mutations.
bool IsCommunication(const std::string& n) {
  return StartsWith(n, "c10d::") || StartsWith(n, "_c10d_functional::") ||
         StartsWith(n, "_c10d_functional_autograd::") || StartsWith(n, "c10d_functional::");
}

}  // namespace

bool OnCommunicationThread() {
  thread_local const bool comm = [] {
    char name[32] = {0};
    if (pthread_getname_np(pthread_self(), name, sizeof name) != 0) return false;
    for (const char* prefix : {"pt_gloo", "gloo", "pt_nccl", "pt_ucc", "pt_mpi"})
      if (StartsWith(name, prefix)) return true;
    return false;
  }();
  return comm;
}

at::Generator DefaultGenerator(c10::Device device) {
  if (!device.is_cuda()) return at::detail::getDefaultCPUGenerator();
  return at::globalContext().defaultGenerator(device);
}

// The CPU generator's Mersenne Twister and cached normal samples, by reference (Note [Reading
// torch's private members], torch_compat.h): CPUGeneratorImpl::engine() and mt19937_engine::data()
// return 2.5 KB copies, the samples' getters are calls out of line, and GenMark::Now runs twice
// for most recorded ops (Note [Random ops without a Generator argument]).
struct CpuGeneratorEngineTag {
  using type = at::mt19937 at::CPUGeneratorImpl::*;
  friend type Member(CpuGeneratorEngineTag);
};
struct Mt19937DataTag {
  using type = at::mt19937_data_pod at::mt19937_engine::*;
  friend type Member(Mt19937DataTag);
};
struct CpuFloatSampleTag {
  using type = std::optional<float> at::CPUGeneratorImpl::*;
  friend type Member(CpuFloatSampleTag);
};
struct CpuDoubleSampleTag {
  using type = std::optional<double> at::CPUGeneratorImpl::*;
  friend type Member(CpuDoubleSampleTag);
};
template struct PrivateMember<CpuGeneratorEngineTag, &at::CPUGeneratorImpl::engine_>;
template struct PrivateMember<Mt19937DataTag, &at::mt19937_engine::data_>;
template struct PrivateMember<CpuFloatSampleTag, &at::CPUGeneratorImpl::next_float_normal_sample_>;
template struct PrivateMember<CpuDoubleSampleTag, &at::CPUGeneratorImpl::next_double_normal_sample_>;

GenMark GenMark::Now(c10::Device device) {
  GenMark m;
  if (device.is_cuda()) {
    at::Generator gen = DefaultGenerator(device);
    std::lock_guard<std::mutex> l(gen.mutex());
    m.seed = gen.current_seed();
    m.offset = gen.get_offset();
    return m;
  }
  // The default CPU generator is one object for the life of the process (a function-local static
  // in torch; seeding and set_rng_state change it in place).
  static at::CPUGeneratorImpl* const g = at::detail::getDefaultCPUGenerator().get<at::CPUGeneratorImpl>();
  const at::mt19937_data_pod& d = (g->*Member(CpuGeneratorEngineTag{})).*Member(Mt19937DataTag{});
  m.seed = d.seed_;
  m.left = d.left_;
  m.next = d.next_;
  m.has_f = (g->*Member(CpuFloatSampleTag{})).has_value();
  m.has_d = (g->*Member(CpuDoubleSampleTag{})).has_value();
  return m;
}

// Note [Overwriting in-place ops]
// These write every element of `self` and read none: dropout on the CPU is empty_like, then
// bernoulli_(1 - p), then div_; nn.init fills parameters with uniform_ or normal_. When `self`
// covers its whole storage, what was there before does not matter, so the storage's recipe can
// restart from this op, replayed on fresh memory (Runtime::MutateCall::overwrites): a storage
// made by an unrecorded op (empty_like is never recorded, design rule 4) stops being a constant.
// That made the CPU dropout masks of the benchmark Transformer evictable.
static bool IsOverwriting(const std::string& name) {
  static const std::unordered_set<std::string> kOverwriting = {
      "aten::fill_",        "aten::zero_",     "aten::bernoulli_",   "aten::uniform_",
      "aten::normal_",      "aten::random_",   "aten::exponential_", "aten::geometric_",
      "aten::cauchy_",      "aten::log_normal_"};
  return kOverwriting.count(name) > 0;
}

OpInfo Classify(const c10::FunctionSchema& schema, bool record_empty) {
  OpInfo info;
  info.name = schema.name();
  if (!schema.overload_name().empty()) info.name += "." + schema.overload_name();
  const std::string& n = schema.name();
  info.clone = info.name == "aten::clone";
  info.batch_norm = info.name == "aten::native_batch_norm" || info.name == "aten::cudnn_batch_norm" ||
                    info.name == "aten::miopen_batch_norm";
  bool has_tensor_arg = false, has_tensor_ret = false, aliased_ret = false;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const auto& a = schema.arguments()[i];
    const auto& ty = a.type();
    if (ty->kind() == c10::TypeKind::TensorType || ty->isSubtypeOf(*c10::ListType::ofTensors()) ||
        ty->isSubtypeOf(*c10::OptionalType::ofTensor()) ||
        ty->isSubtypeOf(*c10::ListType::create(c10::OptionalType::ofTensor())))
      has_tensor_arg = true;
    if (a.alias_info() && a.alias_info()->isWrite()) info.write_args.push_back(int(i));
    if (ty->isSubtypeOf(*c10::OptionalType::create(c10::GeneratorType::get())) ||
        ty->kind() == c10::TypeKind::GeneratorType)
      info.gen_arg = int(i);
  }
  for (const auto& r : schema.returns()) {
    if (r.alias_info()) aliased_ret = true;
    const auto& ty = r.type();
    if (ty->kind() == c10::TypeKind::TensorType || ty->isSubtypeOf(*c10::ListType::ofTensors()))
      has_tensor_ret = true;
  }
  if (!StartsWith(n, "aten::")) {
    if (!has_tensor_arg || StartsWith(n, "dtr::")) return info;  // passthrough (dtr:: control ops, ...)
    info.kind = IsCommunication(n) ? Kind::kCommunication : Kind::kMutate;
    info.write_all = true;
    info.replayable = false;
    return info;
  }
  static const char* kNever[] = {"aten::copy_", "aten::set_", "aten::resize_", "aten::resize_as_",
                                 "aten::record_stream", "aten::index_put_", "aten::_index_put_impl_",
                                 "aten::_local_scalar_dense", "aten::lift", "aten::lift_fresh",
                                 "aten::_resize_output_", "aten::detach_", "aten::requires_grad_",
                                 "aten::retain_grad", "aten::_coalesced_", "aten::set_data"};
  const bool empty_family =
      StartsWith(n, "aten::empty") || StartsWith(n, "aten::new_empty") || StartsWith(n, "aten::_empty");
  bool never = (empty_family && !record_empty) || StartsWith(n, "aten::_foreach_") ||
               n.find("profiler") != std::string::npos || n.find("record_function") != std::string::npos;
  for (const char* k : kNever)
    if (n == k) never = true;
  bool conservative = schema.aliasAnalysis() == c10::AliasAnalysisKind::CONSERVATIVE;
  if (!info.write_args.empty()) {
    info.kind = Kind::kMutate;
    bool single_tensor = info.write_args.size() == 1 &&
                         schema.arguments()[info.write_args[0]].type()->kind() == c10::TypeKind::TensorType;
    // A random in-place op is replayable when it takes a Generator: the record keeps a clone of
    // it (or of the default one) from before the op ran, as for functional random ops.
    info.replayable = !never && !conservative && single_tensor && (info.gen_arg >= 0 || !IsRandomFamily(n));
    info.overwrites = single_tensor && info.write_args[0] == 0 && IsOverwriting(n);
    return info;
  }
  if (aliased_ret) {
    info.kind = Kind::kView;
    return info;
  }
  if (never || conservative || !has_tensor_ret) {
    info.kind = has_tensor_arg || has_tensor_ret ? Kind::kOpaque : Kind::kPassthrough;
    if (n == "aten::_local_scalar_dense") info.kind = Kind::kOpaque;
    return info;
  }
  info.kind = Kind::kRecord;
  info.replayable = true;
  info.seeded_no_gen = info.gen_arg < 0 && IsRandomFamily(n);
  return info;
}

}  // namespace dtr::hooks

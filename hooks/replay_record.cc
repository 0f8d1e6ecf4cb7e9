// Tensor layouts and boxed-stack helpers of replay records (see replay_record.h).
#include "hooks/replay_record.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <unordered_map>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "hooks/torch_compat.h"

namespace dtr::hooks {

TensorMeta TensorMeta::Of(const at::Tensor& t) {
  TensorMeta m;
  m.Set(t);
  return m;
}

void TensorMeta::Set(const at::Tensor& t) {
  wrapped_number = t.unsafeGetTensorImpl()->is_wrapped_number();
  sizes.assign(t.sizes().begin(), t.sizes().end());
  strides.assign(t.strides().begin(), t.strides().end());
  offset = t.storage_offset();
  dtype = t.scalar_type();
  conj = t.is_conj();
  neg = t.is_neg();
}

bool TensorMeta::Matches(const at::Tensor& t) const {
  return t.sizes().equals(sizes) && t.strides().equals(strides) && t.storage_offset() == offset &&
         t.scalar_type() == dtype && t.is_conj() == conj && t.is_neg() == neg;
}

namespace {

// The CPU's flush-to-zero state, which torch.set_flush_denormal sets and ATen cannot read back.
bool FlushDenormalOn() {
#if defined(__x86_64__) || defined(__i386__)
  return (_mm_getcsr() & 0x8040) != 0;  // FTZ (bit 15) or DAZ (bit 6)
#elif defined(__aarch64__)
  uint64_t fpcr;
  asm volatile("mrs %0, fpcr" : "=r"(fpcr));
  return (fpcr & (uint64_t(1) << 24)) != 0;  // FZ
#else
  return false;
#endif
}

}  // namespace

// Note [Raw float32 precisions]
// torch stores the float32 precisions as a map from (backend, op) to a precision, where DEFAULT
// and NONE on a specific op defer to the backend's ALL entry and then to the generic one;
// float32Precision resolves them. A snapshot keeps the map's entries as stored, and Apply writes
// back the ones that differ. Keeping the resolved values instead would turn deferring entries
// into explicit ones after a replay's restore, so a later torch.backends.fp32_precision = ...
// would no longer reach them: other kernels than in a plain run, for the rest of the program.
// Reading the entries is also cheaper than resolving them (float32Precision hashes up to three
// keys a call, ~1,100 instructions for four): the map's nine nodes are walked in place (Note
// [Reading torch's private members], torch_compat.h). tests/hooks/replay_state_test.cc checks
// that every setter's effect survives a snapshot, an Apply of another and an Apply of it.
using Fp32Key = std::pair<at::Float32Backend, at::Float32Op>;
struct ContextFp32PrecisionTag {
  using type = std::unordered_map<Fp32Key, at::Float32Precision, c10::hash<Fp32Key>> at::Context::*;
  friend type Member(ContextFp32PrecisionTag);
};
template struct PrivateMember<ContextFp32PrecisionTag, &at::Context::fp32_precision>;

namespace {

using Flags = ReplayRecord::BackendFlags;
static_assert(int(at::Float32Backend::MKLDNN) == 2 && int(at::Float32Op::MATMUL) == 3,
              "Float32Backend or Float32Op changed: resize BackendFlags::precision");

// The slot of a key in BackendFlags::precision, or -1 (a key this build does not know).
int PrecisionSlot(const Fp32Key& key) {
  const int slot = int(key.first) * 4 + int(key.second);
  return int(key.second) < 4 && slot >= 0 && slot < Flags::kPrecisionSlots ? slot : -1;
}

std::unordered_map<Fp32Key, at::Float32Precision, c10::hash<Fp32Key>>& Fp32PrecisionMap(at::Context& c) {
  return c.*Member(ContextFp32PrecisionTag{});
}

// CuBLASReductionOption as the setter's two flags.
std::pair<bool, bool> ReductionSetterArgs(uint8_t option) {
  switch (at::CuBLASReductionOption(option)) {
    case at::CuBLASReductionOption::AllowReducedPrecisionWithSplitK: return {true, true};
    case at::CuBLASReductionOption::DisallowReducedPrecisionAllowSplitK: return {false, true};
    case at::CuBLASReductionOption::DisallowReducedPrecisionDisallowSplitK: return {false, false};
  }
  return {false, false};
}

}  // namespace

ReplayRecord::BackendFlags ReplayRecord::BackendFlags::Current() {
  at::Context& c = at::globalContext();
  BackendFlags f;
  f.deterministic = c.deterministicAlgorithms();
  f.deterministic_warn_only = c.deterministicAlgorithmsWarnOnly();
  f.deterministic_fill = c.deterministicFillUninitializedMemory();
  f.cudnn_deterministic = c.deterministicCuDNN();
  f.cudnn_benchmark = c.benchmarkCuDNN();
  f.cudnn_enabled = c.userEnabledCuDNN();
  f.mkldnn_enabled = c.userEnabledMkldnn();
  f.nnpack_enabled = c.userEnabledNNPACK();
  std::fill(std::begin(f.precision), std::end(f.precision), kNoPrecision);
  for (const auto& [key, value] : Fp32PrecisionMap(c))
    if (int slot = PrecisionSlot(key); slot >= 0) f.precision[slot] = uint8_t(value);
  f.fp16_reduction_cublas = uint8_t(c.allowFP16ReductionCuBLAS());
  f.bf16_reduction_cublas = uint8_t(c.allowBF16ReductionCuBLAS());
  f.fp16_accumulation_cublas = c.allowFP16AccumulationCuBLAS();
  f.fp16_reduction_cpu = c.allowFP16ReductionCPU();
  f.blas_backend = uint8_t(c.blasPreferredBackend());
  f.linalg_backend = uint8_t(c.linalgPreferredBackend());
  f.flush_denormal = FlushDenormalOn();
  f.num_threads = at::get_num_threads();
  return f;
}

absl::Status ReplayRecord::BackendFlags::Apply() const try {
  at::Context& c = at::globalContext();
  if (c.deterministicAlgorithms() != deterministic || c.deterministicAlgorithmsWarnOnly() != deterministic_warn_only)
    c.setDeterministicAlgorithms(deterministic, deterministic_warn_only);
  if (c.deterministicFillUninitializedMemory() != deterministic_fill)
    c.setDeterministicFillUninitializedMemory(deterministic_fill);
  if (c.deterministicCuDNN() != cudnn_deterministic) c.setDeterministicCuDNN(cudnn_deterministic);
  if (c.benchmarkCuDNN() != cudnn_benchmark) c.setBenchmarkCuDNN(cudnn_benchmark);
  if (c.userEnabledCuDNN() != cudnn_enabled) c.setUserEnabledCuDNN(cudnn_enabled);
  if (c.userEnabledMkldnn() != mkldnn_enabled) c.setUserEnabledMkldnn(mkldnn_enabled);
  if (c.userEnabledNNPACK() != nnpack_enabled) c.setUserEnabledNNPACK(nnpack_enabled);
  // Note [Raw float32 precisions]: the entries as they were stored, written in place (the setter
  // refuses DEFAULT, which torch itself stores).
  for (auto& [key, value] : Fp32PrecisionMap(c)) {
    const int slot = PrecisionSlot(key);
    if (slot >= 0 && precision[slot] != kNoPrecision) value = at::Float32Precision(precision[slot]);
  }
  if (uint8_t(c.allowFP16ReductionCuBLAS()) != fp16_reduction_cublas) {
    auto [reduced, splitk] = ReductionSetterArgs(fp16_reduction_cublas);
    c.setAllowFP16ReductionCuBLAS(reduced, splitk);
  }
  if (uint8_t(c.allowBF16ReductionCuBLAS()) != bf16_reduction_cublas) {
    auto [reduced, splitk] = ReductionSetterArgs(bf16_reduction_cublas);
    c.setAllowBF16ReductionCuBLAS(reduced, splitk);
  }
  if (c.allowFP16AccumulationCuBLAS() != fp16_accumulation_cublas) c.setAllowFP16AccumulationCuBLAS(fp16_accumulation_cublas);
  if (c.allowFP16ReductionCPU() != fp16_reduction_cpu) c.setAllowFP16ReductionCPU(fp16_reduction_cpu);
  if (uint8_t(c.blasPreferredBackend()) != blas_backend) c.setBlasPreferredBackend(at::BlasBackend(blas_backend));
  if (uint8_t(c.linalgPreferredBackend()) != linalg_backend) c.setLinalgPreferredBackend(at::LinalgBackend(linalg_backend));
  if (FlushDenormalOn() != flush_denormal) (void)c.setFlushDenormal(flush_denormal);
  if (at::get_num_threads() != num_threads) at::set_num_threads(num_threads);
  return absl::OkStatus();
} catch (const c10::Error& e) {
  return absl::InternalError(absl::StrCat("dtr: torch refused a recorded backend setting: ", e.what_without_backtrace()));
}

at::Tensor MakeTensor(const c10::intrusive_ptr<c10::StorageImpl>& impl, const TensorMeta& m) {
  // The dispatch key of the storage's device (CPU or CUDA).
  const c10::DispatchKey key = c10::computeDispatchKey(std::nullopt, c10::kStrided, impl->device());
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(impl), c10::DispatchKeySet(key),
                                                    c10::scalarTypeToTypeMeta(m.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(m.sizes, m.strides);
  t.unsafeGetTensorImpl()->set_storage_offset(m.offset);
  if (m.wrapped_number) t.unsafeGetTensorImpl()->set_wrapped_number(true);
  if (m.conj) t.unsafeGetTensorImpl()->_set_conj(true);
  if (m.neg) t.unsafeGetTensorImpl()->_set_neg(true);
  return t;
}

ScalarArg ScalarArg::Of(Path p, const at::Tensor& t, bool optional_list) {
  ScalarArg sa{p, c10::Scalar(), t.scalar_type(), t.device(), optional_list};
  if (Applies(t)) sa.value = t.item();
  else sa.host_copy = t.detach().clone();
  return sa;
}

at::Tensor ScalarArg::Make() const {
  if (host_copy.defined()) return host_copy.clone();
  at::Tensor t = at::scalar_tensor(value, at::TensorOptions().dtype(dtype).device(device));
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

const at::Tensor& GetAt(const torch::jit::Stack& s, size_t base, const Path& p) {
  const c10::IValue& v = s[base + p.index];
  if (p.elem < 0) return v.toTensor();
  return v.toListRef()[p.elem].toTensor();  // a Tensor[] too: its elements are IValues
}

}  // namespace dtr::hooks

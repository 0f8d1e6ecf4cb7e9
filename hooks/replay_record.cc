// Tensor layouts and boxed-stack helpers of replay records (see replay_record.h).
#include "hooks/replay_record.h"

#include <algorithm>
#include <array>
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

std::vector<c10::IValue> CopyArgs(const c10::IValue* begin, const c10::IValue* end, uint64_t leave_out) {
  std::vector<c10::IValue> out;
  out.reserve(end - begin);
  for (const c10::IValue* a = begin; a != end; ++a) {
    const size_t i = size_t(a - begin);
    if (i < 64 && (leave_out >> i & 1) != 0) out.emplace_back(at::Tensor());
    else if (!a->isList()) out.push_back(*a);  // isTensorList (not inline) implies isList
    else if (a->isTensorList()) out.emplace_back(a->toTensorList().copy());
    else out.emplace_back(a->toList().copy());
  }
  return out;
}

namespace {

constexpr std::pair<at::Float32Backend, at::Float32Op> kPrecisionKeys[4] = {
    {at::Float32Backend::CUDA, at::Float32Op::MATMUL},
    {at::Float32Backend::CUDA, at::Float32Op::CONV},
    {at::Float32Backend::MKLDNN, at::Float32Op::MATMUL},
    {at::Float32Backend::MKLDNN, at::Float32Op::CONV},
};

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

// Note [Backend flags without hashing]
// Every recorded op snapshots the backend flags (Note [Global state a replay depends on]). The
// four float32 precisions were most of it: Context::float32Precision hashes up to three
// (backend, op) keys per call, about 1,100 instructions for the four, more than the rest of a
// small op's recording. In the torch releases dtr supports, float32Precision is a function of
// the map Context::fp32_precision alone (nine fixed keys). So each thread keeps the map's nodes
// as it last read them, in iteration order, with the precisions computed from them, and calls
// float32Precision again only when a node's key or value differs: exact, and a few dozen
// instructions. The map is read in place (Note [Reading torch's private members],
// torch_compat.h); the other flags are plain fields behind cheap accessors, read every time.
// tests/hooks/replay_state_test.cc changes each flag through every setter between snapshots.
using Fp32Key = std::pair<at::Float32Backend, at::Float32Op>;
struct ContextFp32PrecisionTag {
  using type = std::unordered_map<Fp32Key, at::Float32Precision, c10::hash<Fp32Key>> at::Context::*;
  friend type Member(ContextFp32PrecisionTag);
};
template struct PrivateMember<ContextFp32PrecisionTag, &at::Context::fp32_precision>;

namespace {

// The map as a thread last read it, and the precisions computed from it.
struct SeenFp32Precision {
  static constexpr size_t kMaxNodes = 16;
  size_t nodes = SIZE_MAX;  // SIZE_MAX: nothing cached
  std::array<std::pair<Fp32Key, at::Float32Precision>, kMaxNodes> node;
  uint8_t precision[4] = {};
};

void Float32Precisions(const at::Context& c, uint8_t (&out)[4]) {
  thread_local SeenFp32Precision seen;
  const auto& map = c.*Member(ContextFp32PrecisionTag{});
  bool same = map.size() == seen.nodes;
  if (same) {
    size_t i = 0;
    for (const auto& [key, value] : map) {
      if (key != seen.node[i].first || value != seen.node[i].second) {
        same = false;
        break;
      }
      ++i;
    }
  }
  if (!same) {
    // The nodes first: a concurrent change after this read is seen as a difference next time.
    seen.nodes = SIZE_MAX;
    if (map.size() <= SeenFp32Precision::kMaxNodes) {
      size_t i = 0;
      for (const auto& kv : map) seen.node[i++] = kv;
      seen.nodes = i;
    }
    for (int i = 0; i < 4; ++i)
      seen.precision[i] = uint8_t(c.float32Precision(kPrecisionKeys[i].first, kPrecisionKeys[i].second));
  }
  std::copy(std::begin(seen.precision), std::end(seen.precision), out);
}

}  // namespace

ReplayRecord::BackendFlags ReplayRecord::BackendFlags::Current() {
  const at::Context& c = at::globalContext();
  BackendFlags f;
  f.deterministic = c.deterministicAlgorithms();
  f.deterministic_warn_only = c.deterministicAlgorithmsWarnOnly();
  f.cudnn_deterministic = c.deterministicCuDNN();
  f.cudnn_benchmark = c.benchmarkCuDNN();
  f.cudnn_enabled = c.userEnabledCuDNN();
  f.mkldnn_enabled = c.userEnabledMkldnn();
  Float32Precisions(c, f.precision);
  f.flush_denormal = FlushDenormalOn();
  f.num_threads = at::get_num_threads();
  return f;
}

void ReplayRecord::BackendFlags::Apply() const {
  at::Context& c = at::globalContext();
  if (c.deterministicAlgorithms() != deterministic || c.deterministicAlgorithmsWarnOnly() != deterministic_warn_only)
    c.setDeterministicAlgorithms(deterministic, deterministic_warn_only);
  if (c.deterministicCuDNN() != cudnn_deterministic) c.setDeterministicCuDNN(cudnn_deterministic);
  if (c.benchmarkCuDNN() != cudnn_benchmark) c.setBenchmarkCuDNN(cudnn_benchmark);
  if (c.userEnabledCuDNN() != cudnn_enabled) c.setUserEnabledCuDNN(cudnn_enabled);
  if (c.userEnabledMkldnn() != mkldnn_enabled) c.setUserEnabledMkldnn(mkldnn_enabled);
  for (int i = 0; i < 4; ++i)
    if (uint8_t(c.float32Precision(kPrecisionKeys[i].first, kPrecisionKeys[i].second)) != precision[i])
      c.setFloat32Precision(kPrecisionKeys[i].first, kPrecisionKeys[i].second, at::Float32Precision(precision[i]));
  if (FlushDenormalOn() != flush_denormal) (void)c.setFlushDenormal(flush_denormal);
  if (at::get_num_threads() != num_threads) at::set_num_threads(num_threads);
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

void PutAt(std::vector<c10::IValue>& args, const Path& p, at::Tensor t, bool optional_list) {
  if (p.elem < 0) {
    args[p.index] = std::move(t);
  } else if (optional_list) {
    auto l = args[p.index].toList();
    l.set(p.elem, c10::IValue(std::move(t)));
  } else {
    auto l = args[p.index].toTensorList();
    l.set(p.elem, std::move(t));
  }
}

at::Tensor GetAt(const torch::jit::Stack& s, size_t base, const Path& p) {
  const c10::IValue& v = s[base + p.index];
  if (p.elem < 0) return v.toTensor();
  if (v.isTensorList()) return v.toTensorList().get(p.elem);
  return v.toListRef()[p.elem].toTensor();
}

}  // namespace dtr::hooks

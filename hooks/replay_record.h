// What the fallback keeps of a recorded op so the engine can replay it (ReplayRecord: the
// operator, its arguments with tensors taken out, each tensor input as a StorageId plus layout,
// the outputs' layouts, generator and default-dtype state), and the helpers that walk boxed
// argument stacks and put tensors back into them.
#ifndef DTR_HOOKS_REPLAY_RECORD_H_
#define DTR_HOOKS_REPLAY_RECORD_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/SmallVector.h>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "runtime/ids.h"

namespace dtr::hooks {

// A tensor's view of its storage: what a replay needs to rebuild the tensor around it.
struct TensorMeta {
  // Inline up to 5 dimensions, like TensorImpl's own sizes: recording an op allocates nothing
  // for its operands' layouts (measured: two heap allocations per operand were ~10% of the
  // fallback's bookkeeping).
  c10::SmallVector<int64_t, 5> sizes, strides;
  int64_t offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  // A Python scalar operand (`int_tensor * 0.5`) arrives as a wrapped-number tensor, which type
  // promotion treats as a scalar (default dtype) instead of a double tensor: replays keep the flag.
  bool wrapped_number = false;
  // The lazy conjugate and negative bits of a view (x.conj() of a complex tensor, _neg_view):
  // kernels that take such a view read it conjugated / negated, so replays must pass it as well.
  bool conj = false, neg = false;
  static TensorMeta Of(const at::Tensor& t);
  // Of(t), in place (moving a TensorMeta copies its inline dimensions).
  void Set(const at::Tensor& t);
  bool Matches(const at::Tensor& t) const;
};

// Where a tensor sits in an argument/return list: index, and element within a list (-1: none).
struct Path {
  int index = 0;
  int elem = -1;
};

struct TensorArg {
  Path path;
  StorageId sid;
  TensorMeta meta;
  bool is_optional_list = false;
};

// Note [Python numbers are kept by value]: a Python number operand (`acc * 0.9`) arrives as a
// one-element wrapped-number tensor. Recording it as a storage kept one allocation per op alive
// for as long as the recipe lived (512 bytes a step for an EMA carried across steps); the record
// keeps its value instead and makes a fresh wrapped number for each replay.
struct ScalarArg {
  Path path;
  c10::Scalar value;
  c10::ScalarType dtype = c10::ScalarType::Double;
  c10::Device device{c10::DeviceType::CPU};
  bool is_optional_list = false;
  // Note [Host operands of CUDA ops] (engine.h): a small host tensor that is not a Python number
  // is kept as a private copy (its shape and dtype matter), made fresh for each replay.
  at::Tensor host_copy;
  static bool Applies(const at::Tensor& t) {
    return t.unsafeGetTensorImpl()->is_wrapped_number() && t.numel() == 1 && t.is_cpu();
  }
  static ScalarArg Of(Path p, const at::Tensor& t, bool optional_list);
  at::Tensor Make() const;
};

struct OutputSpec {
  Path path;
  TensorMeta meta;
  size_t nbytes = 0;
};

// Note [Outputs that share a storage]
// A kernel may return several outputs over one storage it allocated. On CUDA,
// _efficient_attention_backward does so for packed attention (nn.MultiheadAttention's q, k and v
// are views of one in-projection, and their gradients are made as three views of one chunk,
// saving a cat); so does any kernel that slices one allocation into its results. Such an op used
// to run unrecorded, its chunk a constant ("an output is not a new dense storage of its own"):
// 48 MiB a layer for a d-512 encoder at batch 32 x 256. It is recorded now: the first output over
// the storage is its OutputSpec, and every later one an OutputView of it, its layout kept. A
// replay restores the storage from the first, after checking each view against what the kernel
// returned again: the same storage, the same layout. Where a kernel lays its results out
// differently from one call to the next, rule 5's relayout (Engine::Replay) copies every one of
// them into the recorded layout, the views' bytes too; a different dtype or shape is refused.
struct OutputView {
  Path path;
  TensorMeta meta;
  size_t output = 0;  // index into ReplayRecord::outputs: the output whose storage it views
};

// What a record keeps of its op's arguments and tensor operands. Most ops have at most four
// arguments and two tensor operands: inline, so recording one allocates neither list.
using RecordedArgs = absl::InlinedVector<c10::IValue, 4>;
using RecordedTensors = absl::InlinedVector<TensorArg, 2>;

// The runtime's OpRecord::handle of a recorded op (the runtime owns it: Engine::OnOpDropped
// deletes it).
struct ReplayRecord {
  c10::OperatorHandle op;
  RecordedArgs args;  // tensors replaced by None; lists keep their shape
  RecordedTensors tensors;
  std::vector<ScalarArg> scalars;  // Note [Python numbers are kept by value]
  // Aligned with OpRecord::outputs (creating ops). Most ops have one: inline, so recording one
  // allocates nothing for it.
  absl::InlinedVector<OutputSpec, 1> outputs;
  std::vector<OutputView> output_views;  // Note [Outputs that share a storage]; almost always empty
  int gen_arg = -1;
  c10::optional<at::Generator> gen;          // pristine clone for Generator? args
  c10::optional<at::Generator> default_gen;  // pristine default generator state (seeded ops)
  c10::Device gen_device{c10::DeviceType::CPU};  // whose default generator default_gen is
  // Note [Global state a replay depends on]: torch.set_default_dtype changes what many ops
  // produce (factories without dtype, int tensor * float scalar, ...), and the backend flags
  // (deterministic algorithms and their uninitialized-memory fill, cuDNN deterministic/benchmark,
  // NNPACK, the float32 precisions, cuBLAS reduced-precision reductions and accumulation, the
  // preferred BLAS and linalg libraries) change which kernel runs and so the bits, as do the
  // flush-to-zero mode and the intra-op thread count. So does grad mode, a thread-local that
  // autograd leaves on below its key: aten::mkldnn_rnn_layer (nn.LSTM on CPU) runs oneDNN's
  // training forward, with a workspace output, when it is on and the inference forward, without
  // one and other bits, when it is off, as it is while backward replays forward ops. A replay
  // runs under the values that were current when the op first ran, and restores the program's
  // own afterwards exactly: the float32 precisions as torch stores them (Note [Raw float32
  // precisions], replay_record.cc), not as they resolve.
  // Not snapshotted: state read only above dtr's key (the scaled-dot-product backend choice,
  // made by the composite op before the kernel dtr records), and InferenceMode (it forces grad
  // mode off, which is recorded; its own flag marks tensors, and a replay's output memory is
  // adopted into the original storage).
  caffe2::TypeMeta default_dtype = c10::get_default_dtype();
  bool grad_enabled = c10::GradMode::is_enabled();
  struct BackendFlags {
    bool deterministic = false, deterministic_warn_only = false, deterministic_fill = true, cudnn_deterministic = false,
         cudnn_benchmark = false, cudnn_enabled = true, mkldnn_enabled = true, nnpack_enabled = true;
    // Context::fp32_precision by (backend, op), index backend * 4 + op; kNoPrecision where torch
    // has no such key.
    static constexpr uint8_t kNoPrecision = 0xff;
    static constexpr int kPrecisionSlots = 3 * 4;
    uint8_t precision[kPrecisionSlots] = {};
    uint8_t fp16_reduction_cublas = 0, bf16_reduction_cublas = 0;  // at::CuBLASReductionOption
    bool fp16_accumulation_cublas = false, fp16_reduction_cpu = false;
    uint8_t blas_backend = 0, linalg_backend = 0;  // at::BlasBackend, at::LinalgBackend
    // torch.set_flush_denormal (the CPU's flush-to-zero mode) changes results with subnormal
    // operands; torch.set_num_threads may change a parallel reduction's order.
    bool flush_denormal = false;
    int num_threads = 1;
    static BackendFlags Current();
    // Sets what differs; an error if torch refused a value (the flags may then be partly set).
    absl::Status Apply() const;
    bool operator==(const BackendFlags&) const = default;
  } flags = BackendFlags::Current();
  explicit ReplayRecord(c10::OperatorHandle h) : op(std::move(h)) {}
};

// Visits every defined tensor in an IValue list (Tensor, Tensor[], Tensor?[]).
template <typename F>
void ForEachTensor(const c10::IValue* begin, size_t n, F&& f) {
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = begin[i];
    if (v.isTensor()) {
      if (v.toTensor().defined()) f(Path{int(i), -1}, v.toTensor(), false);
    } else if (v.isList()) {
      // By reference, a Tensor[]'s elements too: no reference-count round trip a tensor.
      const bool optional_list = !v.isTensorList();
      const c10::ArrayRef<c10::IValue> l = v.toListRef();
      for (size_t j = 0; j < l.size(); ++j)
        if (l[j].isTensor() && l[j].toTensor().defined()) f(Path{int(i), int(j)}, l[j].toTensor(), optional_list);
    }
  }
}

// Copies arguments into *out (cleared first), deep-copying lists (c10::List has reference
// semantics). Bit i of `leave_out` set: argument i is not copied, None takes its place (a
// replay puts the operand there; None, unlike an undefined tensor, costs nothing to make, copy
// and destroy). Args: a std::vector (a replay's stack) or RecordedArgs.
template <typename Args>
void CopyArgs(const c10::IValue* begin, const c10::IValue* end, Args* out, uint64_t leave_out = 0) {
  out->clear();
  out->reserve(end - begin);
  for (const c10::IValue* a = begin; a != end; ++a) {
    const size_t i = size_t(a - begin);
    if (i < 64 && (leave_out >> i & 1) != 0) out->emplace_back();
    else if (!a->isList()) out->push_back(*a);  // isTensorList (not inline) implies isList
    else if (a->isTensorList()) out->emplace_back(a->toTensorList().copy());
    else out->emplace_back(a->toList().copy());
  }
}

// A CPU tensor over `impl` with the layout `m`.
at::Tensor MakeTensor(const c10::intrusive_ptr<c10::StorageImpl>& impl, const TensorMeta& m);

// Puts `t` at `p` in `args` (`optional_list`: a Tensor?[] argument); Args as for CopyArgs.
template <typename Args>
void PutAt(Args& args, const Path& p, at::Tensor t, bool optional_list) {
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

// The tensor at `p` of the list that starts at s[base], by reference (valid while the stack is).
const at::Tensor& GetAt(const torch::jit::Stack& s, size_t base, const Path& p);

}  // namespace dtr::hooks

#endif  // DTR_HOOKS_REPLAY_RECORD_H_

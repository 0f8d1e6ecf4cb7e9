// The boxed fallback on DispatchKey::Fake: Engine::Fallback sees every op the program runs,
// records functional ops as recipes (Note [Recording without knowing the outputs]), makes their
// inputs resident, routes mutations through Runtime::Mutate and views through Runtime::Access.
// RegisterFallback installs it for the whole process, and lets the aten views that read no element
// pass dtr's key by (Note [Views the dispatcher passes by]).
//
// Note [Recording without knowing the outputs]
// Runtime::Compute needs the number and sizes of the outputs before it runs the op, which the
// torch layer only knows afterwards. So the fallback holds the inputs (Runtime::HoldOperand makes
// them resident and unevictable, Note [Operands held for an op]), runs the op, and then calls
// Compute with an execute callback that returns the measured cost. Allocations inside the op
// may evict other storages (the new outputs are not tracked yet, so they cannot be chosen).
//
// Note [Recording starts with a budget]
// With no budget nothing is ever evicted, so recording recipes, holding operands and tracking
// deaths buys nothing: it cost 1.02-1.18x the instructions of a plain training step on the
// benchmark models (stop 58), where passing every op through costs 1.000-1.013x (the boxing
// of every op; bench/results/instructions.md). So until the process has a budget (DTR_BUDGET, dtr.enable(budget),
// torch.ops.dtr.set_budget) or a trace file, every op passes through; dtr's allocator still
// serves and counts the memory, so peaks and torch's memory statistics are unchanged. The first
// budget accepted (or a CUDA memory fraction below 1) turns recording on for good
// (Engine::StartRecording; lifting the budget later keeps it, since evicted storages and recipes
// exist by then). Tensors made before that are what tensors made before dtr.enable() are:
// constants to the runtime once an op reads them (EntryOf), and never evicted, not even after an
// op overwrites all of one (Entry::made_unrecorded; Note [Overwriting in-place ops] would make
// it evictable): the ops that ran unrecorded took none of the pins they take on what they hide
// from the dispatcher (a packed weight's bias, what a CUDA graph reads, a sparse output's
// values). The same holds for what is allocated while dtr.disable() has ops pass through
// (Engine::MadeUnrecorded keeps the serials of both windows; an op that began unrecorded and
// ends with recording on extends the first). Exposures (Engine::ExposeTensor) are noted all
// along. A program that wants every tensor recorded while nothing limits it (to read
// unevictable_at_peak, or to evict on demand) sets a budget that never binds from the start; a
// trace file records from the start too.
//
// Note [Idle far below the budget]
// A budget that never binds still had every op recorded: 1.17-1.22x a plain step in time on the
// small-op models (the LSTM, the TreeLSTM, the chain, the Transformer; bench/results/
// activation_runs.md), where passing ops through costs what a plain step does. Recording only pays
// when something will be evicted, so dtr goes idle while memory stays far below the budget: at the
// end of a backward pass (the first recorded op outside one after ops inside one), when the step
// that ended there kept the allocated bytes below DTR_IDLE_BELOW of the budget (default 0.5) at
// every recorded op and evicted and rematerialized nothing under pressure, and the program holds
// nothing evicted, dtr pauses as dtr.disable() does (Note [Ops while paused]), keeping the budget.
// Allocated, not reserved: the cache keeps what a larger step reserved, which no eviction is needed
// for (the allocator releases cached segments before it asks the runtime; the CPU's segments hold
// one block each). Idle, nothing is evicted: ops run without any check of their inputs, so none may
// be taken from under them. Every op that enters the dispatcher's fallback while idle first
// compares the allocator's allocated bytes (an atomic read) with that limit and, at or above it,
// resumes recording before it runs (when no other op is under way paused: resuming waits for those,
// so a thread holding the GIL could otherwise wait for one that needs it; the next op tries again);
// what was allocated while idle is then constant until it dies (as before a first budget), which in
// a training loop is the activations of the step under way up to that point, so at most
// DTR_IDLE_BELOW of the budget less what the program keeps between steps. If the ops between two
// checks (one op, with its nested ops) take the rest of the budget, the allocator's cap stands and
// the request fails with the out-of-memory error, saying why; the next op then records again
// (CpuAllocatorAdapter::allocate), so a program that catches the error and retries evicts as
// before. Every idle period that memory ends doubles the quiet steps the next one waits for (up to
// 64), so steps straddling the limit do not flap. A new budget (set_budget), dtr.disable() and
// enable() end idleness; a trace file (every op recorded), an unlimited budget and CUDA (whose
// native allocator's counts cost its lock) never idle.
#include "hooks/fallback.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "hooks/engine.h"
#include "hooks/torch_compat.h"

namespace dtr::hooks {

// Whether an op's returns include an object that may hold its tensor inputs out of the
// dispatcher's sight (quantized::linear_prepack packs its bias into a torchbind object; later
// ops read it from there). Its inputs are then pinned for good (Note [Unmanaged operands]).
static bool ReturnsHideTensors(const torch::jit::Stack& stack, size_t nret) {
  for (size_t i = stack.size() - nret; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isObject() || v.isCapsule() || v.isGenericDict() || v.isFuture()) return true;
  }
  return false;
}

namespace {

// A tensor operand as the fallback first sees it; its layout is read only if the op is recorded.
struct Operand {
  Path path;
  StorageId sid;
  bool is_optional_list = false;
};
using Operands = absl::InlinedVector<Operand, 8>;

}  // namespace

// The arguments of a recorded op with its tensor operands taken out: storages are referenced by
// id (foreign ones stay alive through their entry), Python numbers kept by value (Note [Python
// numbers are kept by value], replay_record.h), each operand's layout read from the stack.
// Takes the scalar list (the fallback has no further use for it).
static void RecordOperands(ReplayRecord* rr, const torch::jit::Stack& stack, size_t base, const Operands& operands,
                           std::vector<ScalarArg>&& scalars) {
  // Operands that are whole arguments are never copied (CopyArgs leaves None in their place);
  // list elements are replaced in the copied lists.
  uint64_t whole = 0;
  auto is_whole = [](const Path& p) { return p.elem < 0 && p.index < 64; };
  for (const Operand& o : operands)
    if (is_whole(o.path)) whole |= uint64_t(1) << o.path.index;
  for (const ScalarArg& sa : scalars)
    if (is_whole(sa.path)) whole |= uint64_t(1) << sa.path.index;
  CopyArgs(stack.data() + base, stack.data() + stack.size(), &rr->args, whole);
  rr->tensors.reserve(operands.size());
  for (const Operand& o : operands) {
    if (!is_whole(o.path)) PutAt(rr->args, o.path, at::Tensor(), o.is_optional_list);
    TensorArg& ta = rr->tensors.emplace_back();  // in place: moving a TensorMeta copies its dimensions
    ta.path = o.path;
    ta.sid = o.sid;
    ta.meta.Set(GetAt(stack, base, o.path));
    ta.is_optional_list = o.is_optional_list;
  }
  for (const ScalarArg& sa : scalars)
    if (!is_whole(sa.path)) PutAt(rr->args, sa.path, at::Tensor(), sa.is_optional_list);
  rr->scalars = std::move(scalars);
}

// Note [Copies of overwritten contents] (runtime/mutation.cc): whether a recorded clone's output
// holds exactly the bytes of its input's storage, so that the op that made the input also makes
// the copy: one dense input covering its whole storage from offset 0, copied with the same
// dtype, sizes and strides into a storage of the same size.
static bool CopiesWholeStorage(const ReplayRecord& rr, absl::Span<const StorageId> in_sids) {
  if (rr.tensors.size() != 1 || rr.outputs.size() != 1 || in_sids.size() != 1) return false;
  const TensorMeta& in = rr.tensors[0].meta;
  const OutputSpec& out = rr.outputs[0];
  if (in.offset != 0 || out.meta.offset != 0 || in.dtype != out.meta.dtype || in.conj || in.neg ||
      in.wrapped_number || in.sizes != out.meta.sizes || in.strides != out.meta.strides)
    return false;
  // Dense and non-overlapping: the dimensions, by stride, step through the elements one by one,
  // so they fill exactly numel x itemsize bytes.
  absl::InlinedVector<std::pair<int64_t, int64_t>, 5> dims;  // (stride, size), sizes above 1
  int64_t numel = 1;
  for (size_t d = 0; d < in.sizes.size(); ++d) {
    numel *= in.sizes[d];
    if (in.sizes[d] != 1) dims.emplace_back(in.strides[d], in.sizes[d]);
  }
  if (numel == 0 || uint64_t(numel) * c10::elementSize(in.dtype) != out.nbytes) return false;
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

void Engine::NoteProgramTime(const HookClock& clock) {
  // Searches and replays between the ops (an allocation in an op dtr lets pass, a tensor the
  // program exposed) are dtr's overhead, counted as such already.
  const double outside = (clock.search0_ - search_at_op_end_) + (clock.remat0_ - remat_at_op_end_);
  const double program = std::min(clock.t0_ - last_op_end_ns_ - outside, kMostProgramTimeNs);
  if (!(program > 0)) return;
  rt_->AddProgramTime(program);
  if (tracing()) TraceLine(absl::StrCat("wait ", int64_t(program)));  // Note [Trace format]
}

void Engine::Fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard guard(c10::DispatchKey::Fake);
  const c10::DispatchKeySet after = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Fake);
  auto pass = [&] { op.redispatchBoxed(after, stack); };
  // Runs the op; returns its cost, excluding time spent evicting for its allocations.
  auto timed_pass = [&]() -> double {
    const double t0 = NowNs(), search0 = search_ns_;
    ScratchMeter scratch(ScratchAllocator());  // Note [Scratch memory]
    pass();
    last_scratch_ = scratch.Bytes();
    const double cost = NowNs() - t0 - (search_ns_ - search0);
    exec_ns_ += cost;
    return cost;
  };
  // Note [Key order]: in 2.11 (maybe 2.12) Fake sits above Python, so a TorchDispatchMode or a
  // __torch_dispatch__ subclass has not run yet when we see the op: ks then has the Python key
  // and the op passes through (the mode redispatches the real op to us, with Python excluded).
  // From 2.13 Fake is below Python and ks never has it here.
  if (!recording()) {
    // Note [Recording starts with a budget]: recording may start while this op runs.
    pass();
    if (recording()) ExtendUnrecordedSerials();
    return;
  }
  if (ks.has(c10::DispatchKey::Python) || at::in_parallel_region()) return pass();
  if (paused()) return FallbackPaused(op, ks, stack);
  const c10::FunctionSchema& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t base = stack->size() - nargs;
  // Note [No Python decref under the engine lock]: the op's kernel pops its arguments off the
  // stack while mu_ is held. Dropping the last C++ reference to a tensor that has a Python object
  // decrefs that object, which takes the GIL; a thread holding the GIL and waiting for mu_ (a
  // Python call that does not release the GIL, such as Tensor.numpy()'s detach) then deadlocks
  // with this one (seen: two training threads, one in clone, one in numpy). These copies keep the
  // arguments alive until after mu_ is released: declared before the lock, destroyed after it.
  // Increfs likewise: kernels take references of their inputs under mu_ (TensorIterator's
  // operands), which reach Python only for a tensor at one reference; the dispatcher's boxed copy
  // is the second, taken before the lock (test_no_deadlock_with_a_thread_holding_the_gil; kernels
  // per op that borrowed arguments without it hung there, runtime/README.md, stop 83).
  // Inline: most ops have at most eight arguments, and this copy then allocates nothing.
  const absl::InlinedVector<c10::IValue, 8> arguments_alive(stack->begin() + base, stack->end());
  std::unique_lock<std::recursive_timed_mutex> l(mu_);
  OpInfo& classified = InfoOf(schema);
  if (classified.kind == Kind::kPassthrough) {
    // No tensor in or out. Not under mu_: torch.ops.dtr.set_budget is one, and may wait for ops
    // that began idle, which take mu_ (Note [Idle far below the budget]).
    l.unlock();
    return pass();
  }
  // Note [Views on a short path]: the arguments are copied above, so the view may pop them.
  if (classified.kind == Kind::kView && managed_ != ManagedDevice::kCuda &&
      ViewOnShortPath(op, after, stack, arguments_alive.data(), nargs, classified))
    return;
  // Note [Communication is never replayed]: on a communication backend's worker thread nothing
  // is recorded.
  // Made only there: an OpInfo holds a string and a vector, built and destroyed for every op.
  std::optional<OpInfo> unrecorded;
  if (OnCommunicationThread()) {
    unrecorded = classified;
    unrecorded->replayable = false;
    if (unrecorded->kind == Kind::kRecord) unrecorded->kind = Kind::kOpaque;
  }
  const OpInfo& info = unrecorded ? *unrecorded : classified;
  // Managing CUDA memory, an op with no CUDA tensor and no CUDA device argument (host-side
  // work: data loading, CPU scalars) is none of dtr's business.
  // Not under the engine lock: a CPU collective (wait_tensor on a gloo mesh) may block on a
  // worker thread that needs it (Note [Communication is never replayed]).
  if (managed_ == ManagedDevice::kCuda && !TouchesCuda(stack->data() + base, nargs)) {
    l.unlock();
    return pass();
  }
  if (CaptureUnderway()) {
    // Note [No replay during graph capture]: run the op as is. The graph keeps the addresses of
    // what it reads, so those storages are pinned for good; an evicted one cannot be brought
    // back now.
    PinReadInCapture(stack->data() + base, nargs, info.name);
    return pass();
  }

  if (info.kind == Kind::kCommunication) {
    // Note [Communication is never replayed]: every tensor argument becomes a resident constant
    // first; then the op runs without the engine lock.
    {
      Busy busy(this);
      std::vector<Entry*> args;
      ForEachTensor(stack->data() + base, nargs, [&](Path, const at::Tensor& t, bool) {
        if (Manageable(t)) args.push_back(EntryOf(t, true));
      });
      if (!args.empty() && cfg_.rule_enabled(1))
        WriteUnreplayably(info.name, args, info.name.c_str(), cfg_.rule_enabled(2));
    }
    l.unlock();
    return pass();
  }

  // Note [Unmanaged operands]: an op with a tensor dtr cannot record or replay (sparse,
  // quantized, nested, a Python-key subclass, another device) runs unrecorded, but its
  // operands that are ours must be resident while it runs (a sparse.mm(coo, h) with an evicted
  // h would read unallocated memory): they are held for the op's duration. Its outputs become
  // constants when first used.
  bool unmanaged = false;
  auto written_arg = [&](const Path& p) {
    return info.write_all || std::find(info.write_args.begin(), info.write_args.end(), p.index) != info.write_args.end();
  };
  // Note [Host operands of CUDA ops] (engine.h).
  auto by_value = [&](const Path& p, const at::Tensor& t) {
    return !written_arg(p) && (ScalarArg::Applies(t) || IsHostOperand(t));
  };
  ForEachTensor(stack->data() + base, nargs, [&](Path p, const at::Tensor& t, bool) {
    if (!Manageable(t) && !by_value(p, t)) unmanaged = true;
  });
  if (unmanaged) {
    Busy busy(this);
    // By storage, not by Manageable: a Python-key subclass may share a storage of dtr's. A write
    // into one cannot be recorded (Note [Ops while paused] treats it alike).
    WriteTrackedArgs(stack->data() + base, nargs, info);
    OpOperands held(this, info.name.c_str());
    ForEachTensor(stack->data() + base, nargs, [&](Path, const at::Tensor& t, bool) {
      if (!t.has_storage()) return;
      if (Entry* e = EntryOf(t, false)) held.Add(e->sid);
    });
    const uint64_t serial0 = LastSlotSerial();
    pass();
    const size_t nret = schema.returns().size();
    if (ReturnsHideTensors(*stack, nret)) held.KeepPinned("its results may hold its operands' memory");
    TagUnrecordedOutputs(*stack, nret, serial0, info.name,
                         "has operands dtr cannot manage (sparse, quantized, nested, a subclass, another device)");
    return;
  }

  // Note [Results of the backward pass] (runtime/eviction_search.cc): the autograd engine runs
  // this op for a backward pass (a graph task is current on this thread). Not gradient mode:
  // custom Function forwards, reentrant checkpointing and AOTAutograd run forward ops with it off.
  // Read here, where an op is recorded: a thread-local lookup that views and the ops let pass do
  // not need.
  const bool in_backward = torch::autograd::get_current_graph_task_id() != -1;
  // Note [Idle far below the budget]: this op may begin an idle period.
  if (IdleAfterQuietSteps(in_backward)) {
    l.unlock();
    return FallbackPaused(op, ks, stack);
  }
  Busy busy(this);
  HookClock hook_clock(this);
  PeakWatch peak_watch(this);  // Note [Unevictable memory by reason]
  if (++ops_seen_ % 4096 == 0) Sweep();

  // Input storages (registering unknown ones as constants).
  Operands operands;
  absl::InlinedVector<StorageId, 8> in_sids;
  absl::InlinedVector<StorageId, 2> written;
  absl::InlinedVector<Entry*, 8> in_entries;
  // Note [Hidden mutation in native_batch_norm]: its schema (1.13 and 2.13/2.14 alike) does not
  // mark running_mean and running_var (args 3, 4) as written, yet training mode updates them in place. Their values do
  // not affect the outputs in training mode, so the op is recorded without them: replays pass
  // None (no update). The real run's update is a mutation the runtime must see, though: the
  // buffers (made by zeros()/ones() and zero_()/fill_(), so they have recipes) would otherwise be
  // evictable and be rematerialized to their initial values, or read unmaterialized by the
  // kernel. So they go through Runtime::Mutate first (not replayable): resident constants from
  // then on, and readers of the old statistics (an eval-mode batch norm) are detached.
  // cudnn_batch_norm and miopen_batch_norm (reached directly on GPUs) share the argument layout.
  const bool bn_training = info.batch_norm && (*stack)[base + 5].isBool() && (*stack)[base + 5].toBool();
  std::vector<Entry*> running_stat_entries;
  // An op with an input no replay can reproduce is never recorded; its outputs are constants:
  // memory that may change without an op (Note [Memory read outside the dispatcher], engine.cc),
  // or batch norm statistics whose layout the replay would not pass (below).
  bool unrecordable_inputs = false;
  std::vector<ScalarArg> scalar_args;  // Note [Python numbers are kept by value]
  bool covers_storage = false;
  c10::Device written_device(c10::DeviceType::CPU);
  ForEachTensor(stack->data() + base, nargs, [&](Path p, const at::Tensor& t, bool optl) {
    if (by_value(p, t)) {
      scalar_args.push_back(ScalarArg::Of(p, t, optl));
      return;
    }
    if (bn_training && (p.index == 3 || p.index == 4)) {
      Entry* e = EntryOf(t, true);
      running_stat_entries.push_back(e);
      // The CPU kernel takes another path for non-contiguous statistics than for None, one
      // ulp apart: such an op is not recorded (its replay would pass None).
      if (!t.is_contiguous()) unrecordable_inputs = true;
      return;
    }
    Entry* e = EntryOf(t, true);
    if (managed_ == ManagedDevice::kCuda && e->slot != nullptr && e->slot->mem != nullptr && e->slot->cuda_device >= 0)
      NoteCudaUse(e->slot);  // Note [Streams of evictable memory]
    operands.push_back({p, e->sid, optl});
    in_sids.push_back(e->sid);
    in_entries.push_back(e);
    unrecordable_inputs = unrecordable_inputs || e->changeable();
    if (written_arg(p)) {
      written.push_back(e->sid);
      // Note [Overwriting in-place ops]: only when self is all of its storage, which is dtr's
      // memory (rule 3: only that is ever released, so only that can be evicted).
      covers_storage = e->ours && !e->made_unrecorded && t.is_non_overlapping_and_dense() &&
                       t.storage_offset() == 0 && size_t(t.numel()) * t.element_size() == t.storage().nbytes();
      written_device = t.device();
    }
  });

  auto trace_ins = [&] {
    std::string s;
    for (Entry* e : in_entries) absl::StrAppend(&s, " ", TName(e));
    return s;
  };

  if (!running_stat_entries.empty() && cfg_.rule_enabled(1))
    WriteUnreplayably("aten::native_batch_norm(running_stats)", running_stat_entries, info.name.c_str(), true,
                      bn_stats_writer_);

  // ---- mutations (rules 1 and 2) ----
  // Note [Records of writes the runtime keeps]
  // The runtime keeps an in-place op's record only where it extends a recipe: the op writes one
  // storage, which has a recipe or which the op overwrites whole (Runtime::RecordsWrite). Most
  // writes are not such: an optimizer's updates of parameters and momentum buffers write
  // constants. Their records (the arguments copied, each operand's layout, the backend flags,
  // about 1.2k instructions) were made and dropped unused; now they are not made. The trace still
  // says whether the op could be replayed, which dtr-sim decides the same way.
  if (info.kind == Kind::kMutate && !written.empty() && cfg_.rule_enabled(1)) {
    ReplayRecord* rr = nullptr;
    // Note [Overwriting in-place ops]: and self is the op's only view of its storage.
    const bool overwrites = info.overwrites && covers_storage && written.size() == 1 &&
                            std::count(in_sids.begin(), in_sids.end(), written[0]) == 1;
    // Rule 6: a random op's record needs the generator state it drew from.
    const bool replayable = info.replayable && !unrecordable_inputs && (info.gen_arg < 0 || cfg_.rule_enabled(6));
    // Note [Records of writes the runtime keeps]: made only where the runtime will keep them.
    if (replayable && rt_->RecordsWrite(written, overwrites)) {
      rr = records_.New(op);
      RecordOperands(rr, *stack, base, operands, std::move(scalar_args));
      if (info.gen_arg >= 0) {
        rr->gen_arg = info.gen_arg;
        rr->gen_device = written_device.is_cuda() ? written_device : c10::Device(c10::DeviceType::CPU);
        if (rr->gen_device.is_cuda() && !rr->gen_device.has_index())
          rr->gen_device = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice();
        const c10::IValue& g = (*stack)[base + info.gen_arg];
        at::Generator gen = g.isNone() ? DefaultGenerator(rr->gen_device) : g.toGenerator();
        std::lock_guard<std::mutex> gl(gen.mutex());
        rr->gen = generator_snapshots_.Take(gen);  // Note [Generator snapshots]
      }
    }
    double cost = 0;
    std::exception_ptr err;
    Runtime::MutateCall mc{info.interned_name, in_sids, written, rr != nullptr, reinterpret_cast<uint64_t>(rr)};
    mc.name_interned = true;
    mc.invalidate_readers = cfg_.rule_enabled(2);
    mc.backward = in_backward;
    mc.overwrites = overwrites;
    bool mc_recorded = false;
    mc.recorded = &mc_recorded;
    const uint64_t serial0 = LastSlotSerial();
    absl::Status s = rt_->Mutate(mc, [&]() -> absl::StatusOr<double> {
      try {
        cost = timed_pass();
      } catch (...) {
        err = std::current_exception();
        return absl::InternalError("op threw");
      }
      rt_->ReportScratch(last_scratch_);  // Note [Scratch memory]
      return cost;
    });
    if (!s.ok() || err) {
      // The runtime did not record the op: free the record.
      records_.Delete(rr);
      if (err) std::rethrow_exception(err);
      Check(s, info.name.c_str());
    }
    // If the op was recorded, the runtime owns rr (OnOpDropped deletes it, perhaps already: a
    // recipe cut at max_replay_depth); if not, drop it.
    if (rr != nullptr && !mc_recorded) records_.Delete(rr);
    if (!mc_recorded) {  // Note [Unevictable memory by reason]
      uint16_t& writer = classified.writer_reason;  // interned once per op
      if (writer == 0) writer = WriterReason(info.name);
      for (StorageId w : written)
        if (Entry* e = FindEntry(w)) e->writer = writer;
    }
    if (tracing()) {
      std::string outs;
      for (StorageId w : written)
        if (Entry* e = FindEntry(w)) absl::StrAppend(&outs, " ", TName(e));
      // Note [Trace format]: how the runtime recorded it.
      const char* kind = !replayable ? "mutate-opaque " : mc.overwrites ? "overwrite " : "mutate ";
      TraceLine(absl::StrCat(kind, info.name, " ", TraceCost(cost, in_backward), trace_ins(), " ->", outs));
    }
    // Storages a mutating op created (e.g. native_batch_norm's outputs) become constants lazily;
    // a storage re-homed by a resize inside the op lost its entry in the deleter.
    TagUnrecordedOutputs(*stack, schema.returns().size(), serial0, info.name,
                         "a result of an in-place op besides the tensor it writes");
    return;
  }

  // Make every input resident and unevictable while the op runs (Note [Recording without knowing
  // the outputs]).
  OpOperands held(this, info.name.c_str());
  for (StorageId id : in_sids) held.Add(id);

  if (info.kind == Kind::kView || info.kind == Kind::kOpaque || info.kind == Kind::kMutate ||
      unrecordable_inputs) {
    // Views (rule 4: an output aliasing an input is never recorded) and unreplayable ops.
    const uint64_t serial0 = LastSlotSerial();
    double cost = timed_pass();
    const size_t nret = schema.returns().size();
    if (ReturnsHideTensors(*stack, nret)) held.KeepPinned("its results may hold its operands' memory");
    if (info.kind != Kind::kView)
      TagUnrecordedOutputs(*stack, nret, serial0, info.name,
                           unrecordable_inputs ? "reads memory that may change outside PyTorch" : "not replayable");
    rt_->AddUnrecordedOpCost(cost);  // Note [Recomputation limit]: the program's work too
    if (info.kind == Kind::kView) {
      for (StorageId id : in_sids) rt_->AccessHeld(id);  // `held` holds them
    } else {
      if (tracing()) TraceLine(absl::StrCat("opaque ", info.name, " ", TraceCost(cost, in_backward), trace_ins(), " ->"));
    }
    return;
  }

  // ---- a functional op: record it ----
  ReplayRecord* rr = records_.New(op);
  RecordOperands(rr, *stack, base, operands, std::move(scalar_args));
  if (bn_training) {
    rr->args[3] = c10::IValue();
    rr->args[4] = c10::IValue();
  }
  // Random ops draw from the default generator of the device they run on: a device argument
  // (factories), else the first tensor's.
  rr->gen_device = c10::Device(c10::DeviceType::CPU);
  {
    bool found = false;
    for (size_t i = base; i < stack->size() && !found; ++i)
      if ((*stack)[i].isDevice()) {
        rr->gen_device = (*stack)[i].toDevice();
        found = true;
      }
    if (!found && !rr->tensors.empty()) rr->gen_device = GetAt(*stack, base, rr->tensors.front().path).device();
    if (!rr->gen_device.is_cuda()) rr->gen_device = c10::Device(c10::DeviceType::CPU);  // meta, ...
    if (rr->gen_device.is_cuda() && !rr->gen_device.has_index())
      rr->gen_device = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice();
  }
  if (info.gen_arg >= 0 && cfg_.rule_enabled(6)) {
    rr->gen_arg = info.gen_arg;
    const c10::IValue& g = (*stack)[base + info.gen_arg];
    at::Generator gen = g.isNone() ? DefaultGenerator(rr->gen_device) : g.toGenerator();
    std::lock_guard<std::mutex> gl(gen.mutex());
    rr->gen = generator_snapshots_.Take(gen);  // Note [Generator snapshots]
  }
  if (info.seeded_no_gen && cfg_.rule_enabled(6)) {
    at::Generator def = DefaultGenerator(rr->gen_device);
    std::lock_guard<std::mutex> gl(def.mutex());
    rr->default_gen = generator_snapshots_.Take(def);
  }
  // Note [Deferred op costs]: on CUDA the launch time is provisional; the kernel time corrects
  // it once its events complete. Earlier ops' corrections are applied first.
  struct CostSpan {
    DeferredCosts* costs;
    DeferredCosts::Span span;
    OpId op;
    double provisional = 0;
    bool recorded = false;
    ~CostSpan() {
      if (costs == nullptr) return;
      if (recorded) costs->Submit(op, span, provisional);
      else costs->Discard(span);
    }
  } cost_span{deferred_costs_.get()};
  if (deferred_costs_ && rr->gen_device.is_cuda()) {
    if (deferred_costs_->pending() > 0)
      deferred_costs_->Poll([&](OpId op, double delta) { (void)rt_->AddOpCost(op, delta); });
    cost_span.span = deferred_costs_->Begin();
  } else {
    cost_span.costs = nullptr;
  }
  uint64_t serial0 = LastSlotSerial();
  const bool watch_rng = info.gen_arg < 0 && !info.seeded_no_gen && cfg_.rule_enabled(6);
  GenMark mark0;
  if (watch_rng) mark0 = GenMark::Now(rr->gen_device);
  double cost;
  try {
    cost = timed_pass();
  } catch (...) {
    records_.Delete(rr);
    throw;
  }
  if (cost_span.costs != nullptr) deferred_costs_->End(cost_span.span);
  if (watch_rng && !(GenMark::Now(rr->gen_device) == mark0)) {
    // Note [Random ops without a Generator argument]: this op drew from the default generator
    // although we did not know it was random. Its outputs cannot be replayed exactly: keep them
    // as constants, and treat the op as seeded from now on.
    if (cfg_.verbose)
      std::fprintf(stderr, "dtr: %s consumed the default generator; treating it as seeded\n", info.name.c_str());
    classified.seeded_no_gen = true;
    records_.Delete(rr);
    TagUnrecordedOutputs(*stack, schema.returns().size(), serial0, info.name, "drew from the default generator");
    if (tracing()) TraceLine(absl::StrCat("opaque ", info.name, " ", TraceCost(cost, in_backward), trace_ins(), " ->"));
    return;
  }

  // New output storages: ours, allocated during this op, not yet tracked, each seen once.
  const size_t nret = schema.returns().size();
  const size_t rbase = stack->size() - nret;
  absl::InlinedVector<c10::StorageImpl*, 2> new_impls;
  auto& outs = rr->outputs;  // filled in place
  bool replayable = true;
  // Ops whose schema declares no aliasing but whose outputs are views of an input (unsafe_split,
  // unsafe_chunk) are views in effect: the storage stays the input's, evictable as before.
  bool views_of_inputs = nret > 0;
  bool hidden_alias = false;
  ForEachTensor(stack->data() + rbase, nret, [&](Path p, const at::Tensor& t, bool) {
    if (IsHostTensor(t)) {
      // Note [Host operands of CUDA ops]: the program's, not ours; a replay drops it.
      views_of_inputs = false;
      return;
    }
    if (!Manageable(t)) {
      // A sparse, quantized or nested output may hold an input's storage inside it without
      // the schema saying so (sparse_coo_tensor keeps its values tensor): see below.
      hidden_alias = hidden_alias || t.is_sparse() || t.is_sparse_csr() || t.is_nested();
      replayable = false;
      views_of_inputs = false;
      return;
    }
    c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    const c10::DataPtr& dp = impl->data_ptr();
    Slot* os = SlotOf(dp);
    if (os == nullptr && impl->nbytes() == 0 && managed_ == ManagedDevice::kCuda) {
      // An empty CUDA output has no pointer and no slot (Note [CUDA slots]): nothing to manage,
      // and no reason to keep the op's other outputs from being recorded.
      views_of_inputs = false;
      return;
    }
    if (auto seen = std::find(new_impls.begin(), new_impls.end(), impl); seen != new_impls.end()) {
      // Note [Outputs that share a storage] (replay_record.h): a view of a storage an earlier
      // output of this op made.
      OutputView& v = rr->output_views.emplace_back();
      v.path = p;
      v.meta.Set(t);
      v.output = size_t(seen - new_impls.begin());
      views_of_inputs = false;
      return;
    }
    const bool fresh = os != nullptr && os->mem != nullptr && os->entry == nullptr && os->serial > serial0;
    if (fresh || os == nullptr || os->entry == nullptr ||
        std::find(in_entries.begin(), in_entries.end(), os->entry) == in_entries.end())
      views_of_inputs = false;
    if (!fresh) {
      // Rule 4: an output whose storage is an input's or pre-existing is not a new storage.
      if (cfg_.rule_enabled(4)) {
        replayable = false;
        return;
      }
      if (os == nullptr || os->entry != nullptr) {
        replayable = false;
        return;
      }
    }
    new_impls.push_back(impl);
    OutputSpec& o = outs.emplace_back();
    o.path = p;
    o.meta.Set(t);
    o.nbytes = impl->nbytes();
  });
  if (views_of_inputs) {
    records_.Delete(rr);
    rt_->AddUnrecordedOpCost(cost);  // Note [Recomputation limit]
    for (StorageId id : in_sids) rt_->AccessHeld(id);  // `held` holds them
    return;
  }
  // When in doubt, pin: the inputs stay resident for good.
  if (hidden_alias) held.KeepPinned("an output may hold an input's storage (sparse, nested)");
  if (!replayable || outs.empty()) {
    // Outputs become constants lazily when first used.
    records_.Delete(rr);
    rt_->AddUnrecordedOpCost(cost);  // Note [Recomputation limit]
    TagUnrecordedOutputs(*stack, nret, serial0, info.name,
                         "an output is not a new dense storage of its own");
    if (tracing()) TraceLine(absl::StrCat("opaque ", info.name, " ", TraceCost(cost, in_backward), trace_ins(), " ->"));
    return;
  }
  absl::InlinedVector<uint64_t, 2> sizes;
  for (const auto& o : outs) sizes.push_back(o.nbytes);
  Runtime::OpCall call{info.interned_name, in_sids, sizes, true, reinterpret_cast<uint64_t>(rr)};
  call.name_interned = true;
  call.scratch_bytes = last_scratch_;  // Note [Scratch memory]: known, the op has run
  call.backward = in_backward;
  call.inputs_held = true;  // `held` holds every one until this returns
  call.copies_input = info.clone && CopiesWholeStorage(*rr, in_sids);
  auto out_sids = rt_->Compute(call, [&](absl::Span<const StorageId>) -> absl::StatusOr<double> { return cost; });
  if (!out_sids.ok()) {
    records_.Delete(rr);
    Check(out_sids.status(), info.name.c_str());
  }
  // Note [Bounded replay chains]: an op recorded too deep was dropped at once (its outputs are
  // constants and OnOpDropped deleted rr): no recipe to correct the cost of.
  if (cost_span.costs != nullptr && !out_sids->empty() && !rt_->storage((*out_sids)[0])->recipe.empty()) {
    cost_span.op = rt_->storage((*out_sids)[0])->recipe.front();
    cost_span.provisional = cost;
    cost_span.recorded = true;
  }
  std::string trace_outs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    c10::StorageImpl* impl = new_impls[i];
    Entry* e = NewEntry((*out_sids)[i], impl, sizes[i]);
    e->ours = true;
    Slot* s = SlotOf(impl->data_ptr());
    s->entry = e;
    e->slot = s;
    (void)rt_->SetHandle(e->sid, reinterpret_cast<uint64_t>(e));
    if (tracing()) absl::StrAppend(&trace_outs, " ", TName(e), ":", sizes[i]);
  }
  if (tracing())
    TraceLine(absl::StrCat("call ", info.name, " ", TraceCost(cost, in_backward), call.copies_input ? " copy=whole" : "",
                           trace_ins(), " ->", trace_outs));
}

// Note [Views on a short path]
// A view (an op whose result aliases an operand, rule 4) is never recorded: the general path
// holds its operands (resident and unevictable while it runs: nothing says a kernel registered
// as a view never allocates or reads), runs it, and marks them used (Runtime::Access). A third
// of the ops a CPU TreeLSTM step sends through the fallback are views (1,204 of 3,927 over two
// steps), and under a budget that never binds a view cost about 2,530 instructions more than in
// a plain run
// (callgrind, bench/op_overhead.py's loop with two views added), a thousand of them the
// dispatcher's boxing for the fallback and most of the rest what only a recorded op needs: the
// clocks around the op and the hook, the peak watch, the scratch meter, a second walk over the
// arguments, the vectors a record is built from. So a view whose tensors dtr already tracks, all
// resident and ours to manage (by-value scalars apart), takes this path: the same holds, the same
// touch (Runtime::AccessHeld, which is Access for a held storage), the same pin when its results
// may hide its operands, and nothing else: 2,000 instructions over a plain run's instead of 2,530.
// Anything else (an operand to register as a constant, to bring back, or that dtr cannot manage)
// takes the general path, which sees the op as this one left it (deaths this one's Busy drained
// are drained already). The view's time is not measured: it counts as the program's time between
// ops (Note [Program time between ops], remat.cc), where the general path counted it as an
// unrecorded op's cost; both are the program's work to Note [Recomputation limit] (a view takes
// microseconds; the 10 ms cap on a gap would only cut a view far slower than any aten view), and
// the view still moves the limit's window by one op and counts towards the next Sweep. The peak
// watch has nothing to see: a view adds no record, so the runtime's memory cannot rise. CUDA keeps
// the general path (its stream bookkeeping, Note [Streams of evictable memory], sees every op),
// unmeasured on a GPU so far. Since stop 86 aten's views that read no element do not reach the
// fallback at all, on the CPU or a GPU (Note [Views the dispatcher passes by]; a view enqueues no
// work on a stream): this path serves the other views.
bool Engine::ViewOnShortPath(const c10::OperatorHandle& op, c10::DispatchKeySet after, torch::jit::Stack* stack,
                             const c10::IValue* args, size_t nargs, const OpInfo& info) {
  Busy busy(this);  // EntryOf may report a foreign storage's death
  absl::InlinedVector<StorageId, 4> ids;
  bool short_path = true;
  ForEachTensor(args, nargs, [&](Path, const at::Tensor& t, bool) {
    if (!short_path || ScalarArg::Applies(t)) return;  // by value, as the general path keeps it
    Entry* e = Manageable(t) ? EntryOf(t, /*create=*/false) : nullptr;
    const StorageRecord* r = e != nullptr ? rt_->storage(e->sid) : nullptr;
    if (r == nullptr || !r->resident()) {
      short_path = false;
      return;
    }
    ids.push_back(e->sid);
  });
  if (!short_path) return false;
  if (++ops_seen_ % 4096 == 0) Sweep();  // as the general path counts every op it sees
  OpOperands held(this, info.name.c_str());
  for (StorageId id : ids) held.Add(id);
  op.redispatchBoxed(after, stack);
  if (ReturnsHideTensors(*stack, op.schema().returns().size()))
    held.KeepPinned("its results may hold its operands' memory");
  rt_->AddUnrecordedOpCost(0);  // the window moves by one op; the time is the program's
  for (StorageId id : ids) rt_->AccessHeld(id);
  ++views_on_short_path_;
  return true;
}

OpInfo& Engine::InfoOf(const c10::FunctionSchema& schema) {
  // A schema lives as long as its operator's registration, and infos_ is node-based: a cached
  // pointer stays valid.
  InfoCacheSlot& cached = info_cache_[(reinterpret_cast<uintptr_t>(&schema) >> 4) % info_cache_.size()];
  if (cached.schema == &schema) return *cached.info;
  auto it = infos_.find(&schema);
  if (it == infos_.end()) {
    it = infos_.emplace(&schema, Classify(schema, !cfg_.rule_enabled(4))).first;
    it->second.interned_name = rt_->InternName(it->second.name);
  }
  cached = {&schema, &it->second};
  return it->second;
}

void Engine::PinReadInCapture(const c10::IValue* args, size_t n, const std::string& op) {
  Busy busy(this);
  ForEachTensor(args, n, [&](Path, const at::Tensor& t, bool) {
    if (!Manageable(t)) return;
    Entry* e = EntryOf(t, false);
    const StorageRecord* r = e ? rt_->storage(e->sid) : nullptr;
    TORCH_CHECK(r == nullptr || r->resident(), "dtr: ", op,
                " reads a tensor dtr evicted, inside CUDA graph capture (dtr never rematerializes while a graph is "
                "captured). Pin the tensors the captured region reads (torch.ops.dtr.pin) or call dtr.disable() "
                "before capturing");
    if (r != nullptr) {
      Check(rt_->Pin(e->sid), op.c_str());
      e->pin_origin = Intern("pinned: read inside CUDA graph capture");
    }
  });
}

void Engine::PinHiddenOperands(const c10::IValue* args, size_t n, const std::string& op, absl::string_view why) {
  Busy busy(this);
  ForEachTensor(args, n, [&](Path, const at::Tensor& t, bool) {
    if (!t.has_storage()) return;
    if (Entry* e = EntryOf(t, false)) {
      Check(rt_->Pin(e->sid), op.c_str());
      SetPinOrigin(e->sid, absl::StrCat(op, ": ", why));
    }
  });
}

void Engine::WriteTrackedArgs(const c10::IValue* args, size_t n, const OpInfo& info) {
  if (!cfg_.rule_enabled(1)) return;
  // Note [Hidden mutation in native_batch_norm]: training mode writes the running statistics.
  const bool bn_training = info.batch_norm && n > 5 && args[5].isBool() && args[5].toBool();
  std::vector<Entry*> written, stats;
  ForEachTensor(args, n, [&](Path p, const at::Tensor& t, bool) {
    const bool stat = bn_training && (p.index == 3 || p.index == 4);
    const bool writes = info.kind == Kind::kCommunication || info.write_all || stat ||
                        std::find(info.write_args.begin(), info.write_args.end(), p.index) != info.write_args.end();
    if (!writes || !t.has_storage()) return;  // sparse: no storage of dtr's to look up
    Entry* e = EntryOf(t, false);
    std::vector<Entry*>& to = stat ? stats : written;
    if (e != nullptr && std::find(to.begin(), to.end(), e) == to.end()) to.push_back(e);
  });
  if (!stats.empty())
    WriteUnreplayably("aten::native_batch_norm(running_stats)", stats, info.name.c_str(), true, bn_stats_writer_);
  if (!written.empty()) WriteUnreplayably(info.name, written, info.name.c_str(), cfg_.rule_enabled(2));
}

// Note [Ops while paused]
// dtr.disable() brings back every evicted storage the program holds and lets ops pass through,
// but the recipes recorded before stay: after enable() their storages may be evicted and
// replayed again. So what an op does while paused must not make them false (seen: `a.add_(1)`
// while disabled was lost once `a` was evicted after enable() and replayed from its recipe, a
// silent wrong result):
//  - a write to a storage dtr tracks (in place, out=, a collective, batch norm's running
//    statistics) goes through WriteUnreplayably before the op runs, as a write dtr cannot record
//    does while recording: the storage becomes a resident constant and the recipes that read its
//    old value are detached (they can still be replayed then: nothing is evicted while paused);
//  - the tracked operands of an op whose results may hold them out of the dispatcher's sight (a
//    packed weight, a sparse tensor over its values), or that runs inside CUDA graph capture, are
//    pinned for good, as when recording.
// Writes are found by storage, so a Python-key subclass sharing one of dtr's is seen too (the
// recording path's unmanaged ops do the same). Storages made while paused have no entry and are
// never evicted (Engine::MadeUnrecorded), so ops on them cost a lookup. Exposures are noted while
// paused too (Engine::ExposeTensor). An enable() on another thread waits for the paused ops
// under way (Engine::paused_ops_, SetPaused): their operands must not be evicted while they run
// (seen: a matmul on a worker thread read freed memory). Only a child forked while another
// thread was inside dtr skips all this (Note [fork]).
void Engine::FallbackPaused(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const c10::DispatchKeySet after = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Fake);
  if (runtime_untrusted()) return op.redispatchBoxed(after, stack);
  // Note [Idle far below the budget]: checked where no op that began paused is under way, on this
  // thread or another, so that resuming waits for none but those that race with it; a later op
  // tries again.
  if (idle() && t_paused_ops == 0 && alloc_->AllocatedNow() >= idle_limit_bytes_.load(std::memory_order_relaxed) &&
      paused_ops_.load(std::memory_order_seq_cst) == 0)
    LeaveIdle(/*for_memory=*/true);
  auto pass = [&] { op.redispatchBoxed(after, stack); };
  // Declared before `done`, so destroyed after it: its Python decrefs may wait for the GIL, which a
  // resuming thread waiting for this op to be counted out may hold (Tensor.numpy()'s detach runs
  // with it).
  absl::InlinedVector<c10::IValue, 8> arguments;
  // Counted before paused() is read again (both sequentially consistent): an enable() that
  // returned either made this op record or waited for it (SetPaused).
  paused_ops_.fetch_add(1);
  ++t_paused_ops;
  struct Done {
    std::atomic<int>* count;
    void Now() {
      if (count == nullptr) return;
      count->fetch_sub(1);
      --t_paused_ops;
      count = nullptr;
    }
    ~Done() { Now(); }
  } done{&paused_ops_};
  if (!paused_.load(std::memory_order_seq_cst)) {
    done.Now();
    return Fallback(op, ks, stack);
  }
  const c10::FunctionSchema& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t base = stack->size() - nargs;
  // The arguments outlive the op (which pops them) for PinHiddenOperands, and mu_ (Note [No
  // Python decref under the engine lock]).
  arguments.assign(stack->begin() + base, stack->end());
  std::unique_lock<std::recursive_timed_mutex> l(mu_);
  const OpInfo& info = InfoOf(schema);
  if (info.kind == Kind::kPassthrough ||
      (managed_ == ManagedDevice::kCuda && !TouchesCuda(arguments.data(), nargs))) {
    l.unlock();
    return pass();
  }
  {
    Busy busy(this);
    WriteTrackedArgs(arguments.data(), nargs, info);
    if (CaptureUnderway()) PinReadInCapture(arguments.data(), nargs, info.name);
  }
  l.unlock();
  // A collective may block on its peers: its operands are resident constants now, so enable()
  // need not wait for it.
  if (info.kind == Kind::kCommunication) done.Now();
  pass();
  const size_t nret = schema.returns().size();
  bool hides = ReturnsHideTensors(*stack, nret);
  ForEachTensor(stack->data() + stack->size() - nret, nret, [&](Path, const at::Tensor& t, bool) {
    hides = hides || t.is_sparse() || t.is_sparse_csr() || t.is_nested();
  });
  if (!hides) return;
  l.lock();
  PinHiddenOperands(arguments.data(), nargs, info.name, "its results may hold its operands' memory");
}

void Engine::WriteUnreplayably(const std::string& name, const std::vector<Entry*>& written, const char* op,
                               bool invalidate_readers, uint16_t writer) {
  std::vector<StorageId> ids;
  std::string names;
  for (Entry* e : written) {
    ids.push_back(e->sid);
    absl::StrAppend(&names, " ", TName(e));
  }
  Runtime::MutateCall mc{name, {}, ids, false, 0};
  mc.invalidate_readers = invalidate_readers;
  // Note [Unevictable memory by reason]
  if (writer == 0) writer = WriterReason(name);
  for (Entry* e : written) e->writer = writer;
  Check(rt_->Mutate(mc, []() -> absl::StatusOr<double> { return 0.0; }), op);
  if (tracing()) TraceLine(absl::StrCat("mutate-opaque ", name, " 0", names, " ->", names));
}

namespace {

void BoxedFallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  g_engine->Fallback(op, ks, stack);
}

}  // namespace

// Note [Views the dispatcher passes by]
// A view makes a tensor of new sizes, strides and offset over its operand's storage; it reads
// no element. A third or more of the ops the small-op benchmark models send through the fallback
// are views (a training step of the TreeLSTM: 666 of 1,683 ops, 280 of them `t` and 220
// `detach`; the chain 519 of 1,566, the LSTM 383 of 1,029, the Transformer 385 of 985), and even
// Note [Views on a short path] cost each up to 2,000 instructions over a plain run (about 1,100 on
// the TreeLSTM and the chain: runtime/README.md, stop 86): the boxing (the dispatcher copies the
// arguments, and on torch 2.14 a tensor only Python held takes the GIL twice for it), the engine
// lock, the holds and the touch. So the aten views below, whose kernels read only metadata (the
// storage's size included, which an evicted storage keeps: its memory is swapped for a
// tombstone, Engine::Release), have a fallthrough kernel on dtr's key:
// the dispatcher goes past dtr for them as in a plain run, and dtr sees their results when an op
// reads them, the storage being the operand's. What that changes (the trace has no line for a
// view, so dtr-sim has always treated views so):
// - a view of an evicted storage no longer brings it back; the op that reads the view does, as
//   it would for any tensor of that storage, and a view nothing reads costs no replay;
// - a view no longer counts as a use of its storage (staleness, Note [Thrashing
//   rematerializations]'s count of replays for one op) nor as an op of the recomputation limit's
//   window (Note [Recomputation limit]); the op that reads the view does both;
// - a storage first seen through a view is registered (a constant, EntryOf) when an op reads it;
// - a fallthrough does not exclude dtr's key below it as the fallback does, so the ops a view's
//   kernel calls reach dtr as ops of their own (a sparse tensor's `t` clones it and transposes
//   the clone in place), handled as any other.
// Only ops whose schema, in the running torch, Classify calls views are passed by; any other
// view (a custom op's, one not listed) takes the fallback's path for views as before. The
// dispatcher keeps the registrations for the life of the process, as it keeps the fallback.
static void PassViewsBy(c10::Dispatcher& d) {
  static constexpr const char* kMetadataOnlyViews[][2] = {
      {"aten::view", ""},           {"aten::t", ""},
      {"aten::transpose", "int"},   {"aten::permute", ""},
      {"aten::expand", ""},         {"aten::select", "int"},
      {"aten::slice", "Tensor"},    {"aten::split", "Tensor"},
      {"aten::split_with_sizes", ""}, {"aten::unbind", "int"},
      {"aten::squeeze", ""},        {"aten::squeeze", "dim"},
      {"aten::squeeze", "dims"},    {"aten::unsqueeze", ""},
      {"aten::detach", ""},         {"aten::alias", ""},
      {"aten::as_strided", ""},     {"aten::diagonal", ""},
      {"aten::unfold", ""},         {"aten::_reshape_alias", ""},
      {"aten::view_as_real", ""},   {"aten::view_as_complex", ""},
  };
  static auto* handles = new std::vector<c10::RegistrationHandleRAII>();
  for (const auto& [name, overload] : kMetadataOnlyViews) {
    const c10::OperatorName op_name(name, overload);
    std::optional<c10::OperatorHandle> op = d.findSchema(op_name);
    if (!op || Classify(op->schema(), /*record_empty=*/false).kind != Kind::kView) continue;
    if (op->hasKernelForDispatchKey(c10::DispatchKey::Fake)) continue;  // someone else's: leave it
    handles->push_back(d.registerImpl(op_name, c10::DispatchKey::Fake, c10::KernelFunction::makeFallthrough(),
                                      std::nullopt, nullptr, "dtr: Note [Views the dispatcher passes by]"));
  }
}

absl::Status RegisterFallback() {
  c10::Dispatcher& d = c10::Dispatcher::singleton();
  // A second registration would throw (or abort, from a static initializer): check first.
  if (d.hasBackendFallbackForDispatchKey(c10::DispatchKey::Fake))
    return absl::FailedPreconditionError(
        "another library already registered a backend fallback for DispatchKey::Fake (a PyTorch that "
        "uses it for its own FakeTensor, or dtr loaded twice from different copies); dtr needs that key. "
        "Nothing was changed; run without dtr or with the PyTorch versions README lists");
  // Leaked on purpose: the fallback stays for the life of the process (tensors die during
  // static destruction too, and their ops must still find it).
  static auto* handle = new c10::RegistrationHandleRAII(
      d.registerFallback(c10::DispatchKey::Fake, c10::KernelFunction::makeFromBoxedFunction<&BoxedFallback>(),
                         "dtr: hooks/fallback.cc"));
  (void)handle;
  PassViewsBy(d);
  return absl::OkStatus();
}

}  // namespace dtr::hooks

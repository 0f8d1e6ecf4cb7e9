// Synthetic trace generators; see generators.h.
#include "runtime/sim/generators.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/runtime.h"

namespace dtr::sim {
namespace {

// Appends events to a Trace, naming tensors t0, t1, ...
class TraceEmitter {
 public:
  int Const(uint64_t size) {
    TraceEvent e{EventKind::kConst};
    int t = NewTensor();
    e.outputs.push_back({t, size, -1});
    trace_.events.push_back(std::move(e));
    return t;
  }
  std::vector<int> Call(absl::string_view name, double cost, const std::vector<int>& inputs,
                        const std::vector<uint64_t>& sizes, bool replayable = true) {
    TraceEvent e{replayable ? EventKind::kCall : EventKind::kOpaque};
    e.name = std::string(name);
    e.cost = cost;
    e.inputs = inputs;
    std::vector<int> outs;
    for (uint64_t size : sizes) {
      int t = NewTensor();
      e.outputs.push_back({t, size, -1});
      outs.push_back(t);
    }
    trace_.events.push_back(std::move(e));
    return outs;
  }
  int View(absl::string_view name, double cost, int base) {
    TraceEvent e{EventKind::kCall};
    e.name = std::string(name);
    e.cost = cost;
    e.inputs = {base};
    int t = NewTensor();
    e.outputs.push_back({t, 0, base});
    trace_.events.push_back(std::move(e));
    return t;
  }
  void Mutate(absl::string_view name, double cost, const std::vector<int>& inputs, const std::vector<int>& mutated) {
    TraceEvent e{EventKind::kMutate};
    e.name = std::string(name);
    e.cost = cost;
    e.inputs = inputs;
    e.mutated = mutated;
    trace_.events.push_back(std::move(e));
  }
  int Copy(int source) {
    TraceEvent e{EventKind::kCopy};
    e.tensor = NewTensor();
    e.source = source;
    trace_.events.push_back(std::move(e));
    return e.tensor;
  }
  void Release(int t) {
    TraceEvent e{EventKind::kRelease};
    e.tensor = t;
    trace_.events.push_back(std::move(e));
  }
  Trace Take() { return std::move(trace_); }

 private:
  int NewTensor() {
    int t = int(trace_.tensor_names.size());
    trace_.tensor_names.push_back(absl::StrCat("t", t));
    return t;
  }
  Trace trace_;
};

// A backend with no memory at all: lets the adversary drive a Runtime to observe its choices.
class NullBackend : public ReplayBackend {
 public:
  absl::StatusOr<double> Replay(OpId, const OpRecord& op, absl::Span<const bool>) override { return op.cost; }
  void Release(StorageId, const StorageRecord&, bool) override {}
};

absl::StatusOr<Trace> Chain(int n) {
  TrainingStepBuilder b;
  auto x = b.Input(1);
  auto t = x;
  for (int i = 0; i < n; ++i) t = b.Op1("layer", 1, {t}, 1);
  return b.Build(t);
}

absl::StatusOr<Trace> Unet(int depth, uint64_t seed) {
  TrainingStepBuilder b;
  const uint64_t base = uint64_t{1} << 20;  // bytes of the first level's activation
  auto conv = [&](TrainingStepBuilder::Value in, uint64_t size) {
    auto w = b.Param(size / 64 + 256);
    auto y = b.Op1("conv", double(size) / 1024, {in, w}, size);
    return b.Op1("relu", double(size) / 8192, {y}, size);
  };
  auto x = b.Input(base / 4);
  auto h = x;
  std::vector<TrainingStepBuilder::Value> skips;
  for (int l = 0; l < depth; ++l) {
    uint64_t size = base >> l;
    h = conv(conv(h, size), size);
    skips.push_back(h);
    h = b.Op1("max_pool", double(size) / 8192, {h}, size / 4);
  }
  h = conv(h, base >> depth);
  for (int l = depth - 1; l >= 0; --l) {
    uint64_t size = base >> l;
    auto up = b.Op1("upsample", double(size) / 8192, {h}, size / 2);
    auto cat = b.Op1("cat", double(size) / 8192, {up, skips[l]}, size + size / 2);
    h = conv(conv(cat, size), size);
  }
  auto loss = b.Op1("mse_loss", double(base) / 8192, {h, x}, 4);
  (void)seed;
  return b.Build(loss);
}

absl::StatusOr<Trace> TreeLstm(int leaves, uint64_t seed) {
  std::mt19937_64 rng(seed);
  TrainingStepBuilder b;
  const uint64_t hidden = 4096;
  auto embedding = b.Param(hidden * 64);
  auto cell_w = b.Param(hidden * 8);
  std::vector<TrainingStepBuilder::Value> losses;
  for (int tree = 0; tree < 2; ++tree) {
    // Random binary tree: repeatedly join two random roots of the forest.
    std::vector<std::pair<TrainingStepBuilder::Value, TrainingStepBuilder::Value>> forest;
    for (int i = 0; i < leaves; ++i) {
      auto token = b.Input(8);
      auto hc = b.Op("embed", 2, {token, embedding}, {hidden, hidden});
      forest.push_back({hc[0], hc[1]});
    }
    while (forest.size() > 1) {
      std::uniform_int_distribution<size_t> pick(0, forest.size() - 1);
      size_t i = pick(rng), j = pick(rng);
      while (j == i) j = pick(rng);
      if (i > j) std::swap(i, j);
      auto left = forest[i], right = forest[j];
      forest.erase(forest.begin() + j);
      forest.erase(forest.begin() + i);
      auto hc = b.Op("tree_lstm_cell", 10, {left.first, left.second, right.first, right.second, cell_w},
                     {hidden, hidden});
      forest.push_back({hc[0], hc[1]});
    }
    auto label = b.Input(8);
    losses.push_back(b.Op1("cross_entropy", 3, {forest[0].first, label}, 4));
  }
  auto loss = b.Op1("add", 1, losses, 4);
  return b.Build(loss);
}

// A forward-only random program exercising every trace feature: multi-output ops, views, copies,
// in-place ops (also on storages others have read), unreplayable ops and releases.
absl::StatusOr<Trace> RandomDag(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  TraceEmitter out;
  std::vector<int> live;  // tensors the program holds
  for (int i = 0; i < 3; ++i) live.push_back(out.Const(uint64_t(uniform(64, 4096))));
  auto pick_live = [&]() { return live[size_t(uniform(std::max(0, int(live.size()) - 12), int(live.size()) - 1))]; };
  for (int step = 0; step < n; ++step) {
    int r = uniform(0, 99);
    if (r < 60) {
      std::vector<int> inputs;
      for (int k = uniform(1, 3); k > 0; --k) inputs.push_back(pick_live());
      std::vector<uint64_t> sizes;
      for (int k = uniform(0, 9) == 0 ? 2 : 1; k > 0; --k) sizes.push_back(uint64_t(uniform(16, 8192)));
      for (int t : out.Call("op", uniform(1, 100), inputs, sizes)) live.push_back(t);
    } else if (r < 66) {
      for (int t : out.Call("opaque_op", uniform(1, 100), {pick_live()}, {uint64_t(uniform(16, 4096))}, false))
        live.push_back(t);
    } else if (r < 74) {
      live.push_back(out.View("view", 0, pick_live()));
    } else if (r < 82) {
      int target = pick_live();
      std::vector<int> inputs = {target};
      if (uniform(0, 1)) inputs.push_back(pick_live());
      out.Mutate("inplace_", uniform(1, 20), inputs, {target});
    } else if (r < 86) {
      live.push_back(out.Copy(pick_live()));
    } else if (live.size() > 4) {
      size_t i = size_t(uniform(0, int(live.size()) - 1));
      out.Release(live[i]);
      live.erase(live.begin() + i);
    }
  }
  // Keep a few results; drop the rest, like a program returning its outputs.
  while (live.size() > 3) {
    out.Release(live.front());
    live.erase(live.begin());
  }
  return out.Take();
}

// Theorem 3.2: t0 has `budget` children; each next node extends a path from t0 none of whose
// tensors is resident under the live runtime's decisions, so it must all be rematerialized.
absl::StatusOr<Trace> Adversarial(int n, const GeneratorOptions& options) {
  int budget = options.budget > 0 ? options.budget : 8;
  if (n <= budget) return absl::InvalidArgumentError("adversarial needs --n larger than --b");
  RuntimeConfig config = options.adversary_config;
  config.max_recompute_ratio = 0;  // the adversary forces thrashing on purpose (Theorem 3.2)
  config.budget_bytes = uint64_t(budget) + 1;  // t0 (a constant) plus `budget` unit tensors
  NullBackend backend;
  auto created = Runtime::Create(config, &backend);
  if (!created.ok()) return created.status();
  Runtime& rt = **created;
  TraceEmitter out;
  int root = out.Const(1);
  auto root_id = rt.AddConstant(1);
  if (!root_id.ok()) return root_id.status();
  std::vector<std::vector<std::pair<int, StorageId>>> paths(budget);
  auto extend = [&](int path) -> absl::Status {
    int parent = paths[path].empty() ? root : paths[path].back().first;
    StorageId parent_id = paths[path].empty() ? *root_id : paths[path].back().second;
    int t = out.Call("f", 1, {parent}, {1})[0];
    uint64_t size = 1;
    auto ids = rt.Compute({"f", {&parent_id, 1}, {&size, 1}, true, 0},
                          [](absl::Span<const StorageId>) -> absl::StatusOr<double> { return 1.0; });
    if (!ids.ok()) return ids.status();
    // The program holds only the tip of each path.
    if (!paths[path].empty()) {
      out.Release(parent);
      if (absl::Status s = rt.DropRef(parent_id); !s.ok()) return s;
    }
    paths[path].push_back({t, (*ids)[0]});
    return absl::OkStatus();
  };
  for (int p = 0; p < budget; ++p)
    if (absl::Status s = extend(p); !s.ok()) return s;
  for (int made = budget; made < n; ++made) {
    // The path with the longest fully evicted suffix (a fully evicted path if one exists).
    int best = 0;
    size_t best_len = 0;
    for (int p = 0; p < budget; ++p) {
      size_t len = 0;
      for (auto it = paths[p].rbegin(); it != paths[p].rend(); ++it) {
        const StorageRecord* r = rt.storage(it->second);
        if (r == nullptr || r->resident()) break;
        ++len;
      }
      if (len > best_len) best = p, best_len = len;
    }
    if (absl::Status s = extend(best); !s.ok()) return s;
  }
  for (const auto& path : paths) out.Release(path.back().first);
  return out.Take();
}

}  // namespace

TrainingStepBuilder::Value TrainingStepBuilder::Input(uint64_t size) {
  values_.push_back({size, -1, false});
  return Value(values_.size() - 1);
}

TrainingStepBuilder::Value TrainingStepBuilder::Param(uint64_t size) {
  values_.push_back({size, -1, true});
  return Value(values_.size() - 1);
}

std::vector<TrainingStepBuilder::Value> TrainingStepBuilder::Op(absl::string_view name, double cost,
                                                                const std::vector<Value>& inputs,
                                                                const std::vector<uint64_t>& output_sizes) {
  OpInfo op{std::string(name), cost, inputs, {}};
  for (uint64_t size : output_sizes) {
    values_.push_back({size, int(ops_.size()), false});
    op.outputs.push_back(Value(values_.size() - 1));
  }
  ops_.push_back(op);
  return ops_.back().outputs;
}

Trace TrainingStepBuilder::Build(Value loss) {
  TraceEmitter out;
  std::vector<int> tensor(values_.size(), -1);   // forward value -> trace tensor
  std::vector<int> grad(values_.size(), -1);     // value -> trace tensor of its gradient
  std::vector<int> pending_uses(values_.size(), 0);
  for (const OpInfo& op : ops_) {
    std::vector<Value> distinct;
    for (Value v : op.inputs)
      if (std::find(distinct.begin(), distinct.end(), v) == distinct.end()) distinct.push_back(v);
    for (Value v : distinct) ++pending_uses[v];
  }
  auto is_activation = [&](Value v) { return values_[v].producer >= 0; };
  auto needs_grad = [&](Value v) { return values_[v].is_param || is_activation(v); };

  // Forward, in creation order (inputs and parameters as constants where they were created).
  size_t next_value = 0;
  auto emit_leaves_up_to = [&](Value limit) {
    for (; next_value < values_.size() && Value(next_value) <= limit; ++next_value)
      if (values_[next_value].producer < 0) tensor[next_value] = out.Const(values_[next_value].size);
  };
  for (const OpInfo& op : ops_) {
    emit_leaves_up_to(op.outputs.front() - 1);
    std::vector<int> ins;
    for (Value v : op.inputs) ins.push_back(tensor[v]);
    std::vector<uint64_t> sizes;
    for (Value v : op.outputs) sizes.push_back(values_[v].size);
    std::vector<int> outs = out.Call(op.name, op.cost, ins, sizes);
    for (size_t i = 0; i < outs.size(); ++i) tensor[op.outputs[i]] = outs[i];
    next_value = std::max<size_t>(next_value, size_t(op.outputs.back()) + 1);
    for (Value v : op.outputs)  // results nothing reads and that are not the loss die at once
      if (pending_uses[v] == 0 && v != loss) out.Release(tensor[v]);
  }

  // Backward.
  grad[loss] = out.Call("grad_seed", 1, {tensor[loss]}, {values_[loss].size})[0];
  out.Release(tensor[loss]);
  for (auto op = ops_.rbegin(); op != ops_.rend(); ++op) {
    std::vector<int> ins;
    for (Value v : op->outputs)
      if (grad[v] >= 0) ins.push_back(grad[v]);
    std::vector<Value> targets;
    for (Value v : op->inputs)
      if (needs_grad(v) && std::find(targets.begin(), targets.end(), v) == targets.end()) targets.push_back(v);
    if (!ins.empty() && !targets.empty()) {
      for (Value v : op->inputs) ins.push_back(tensor[v]);
      std::vector<uint64_t> sizes;
      for (Value v : targets) sizes.push_back(values_[v].size);
      std::vector<int> contribs = out.Call(op->name + "_backward", op->cost, ins, sizes);
      for (size_t i = 0; i < targets.size(); ++i) {
        Value v = targets[i];
        if (grad[v] < 0) {
          grad[v] = contribs[i];
        } else if (values_[v].is_param) {
          // Parameter gradients accumulate in place, as autograd does into .grad.
          out.Mutate("add_", 1, {grad[v], contribs[i]}, {grad[v]});
          out.Release(contribs[i]);
        } else {
          int sum = out.Call("add", 1, {grad[v], contribs[i]}, {values_[v].size})[0];
          out.Release(grad[v]);
          out.Release(contribs[i]);
          grad[v] = sum;
        }
      }
    }
    for (Value v : op->outputs)
      if (grad[v] >= 0) {
        out.Release(grad[v]);
        grad[v] = -1;
      }
    std::vector<Value> distinct;
    for (Value v : op->inputs)
      if (std::find(distinct.begin(), distinct.end(), v) == distinct.end()) distinct.push_back(v);
    for (Value v : distinct)
      if (--pending_uses[v] == 0 && is_activation(v)) out.Release(tensor[v]);
  }
  return out.Take();
}

std::vector<std::string> GeneratorKinds() { return {"chain", "adversarial", "unet", "treelstm", "random-dag"}; }

absl::StatusOr<Trace> GenerateTrace(absl::string_view kind, const GeneratorOptions& options) {
  if (options.n < 0) return absl::InvalidArgumentError("--n must be positive");
  if (kind == "chain") return Chain(options.n > 0 ? options.n : 100);
  if (kind == "adversarial") return Adversarial(options.n > 0 ? options.n : 200, options);
  if (kind == "unet") return Unet(options.n > 0 ? options.n : 4, options.seed);
  if (kind == "treelstm") return TreeLstm(options.n > 0 ? options.n : 32, options.seed);
  if (kind == "random-dag") return RandomDag(options.n > 0 ? options.n : 300, options.seed);
  return absl::InvalidArgumentError(absl::StrCat("unknown trace kind '", kind,
                                                 "'; expected one of: ", absl::StrJoin(GeneratorKinds(), ", ")));
}

}  // namespace dtr::sim

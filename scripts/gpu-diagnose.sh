#!/usr/bin/env bash
# Failure diagnosis on the GPU machine, for when scripts/gpu-check.sh shows crashes or unexpected
# out-of-memory errors: builds dtr as gpu-check.sh does, then runs each failing shape of run alone
# (full output kept), and reruns under cuda-gdb any that died of a signal, for a native
# backtrace of every thread (the machine has cuda-gdb but no gdb). Everything goes to one
# archive, $OUT/diagnose.tgz (the device tool brings back at most 8 files).
#   source .gpu-deps/env.sh is done here; carry .gpu-deps as for gpu-check.sh.
#   GPU_DIAG_SECONDS (default 360): the deadline of the whole run, from its start.
#   GPU_DIAG_CASES: the names of the cases to run (default: all), GPU_DIAG_SWEEP_MODELS those of
#   the sweep case.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu-diagnose}
work=$out/diagnose
mkdir -p "$work"
deadline=$(( $(date +%s) + ${GPU_DIAG_SECONDS:-360} ))
left() { local l=$(( deadline - $(date +%s) - 10 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
pack() { tar czf "$out/diagnose.tgz" -C "$out" diagnose; }
trap pack EXIT
exec > >(tee "$work/diagnose.log") 2>&1
source .gpu-deps/env.sh
deps_prefix=$DTR_GPU_PREFIX_PATH
unset DTR_GPU_PREFIX_PATH
py=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')  # a binary, for cuda-gdb
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
"$py" -m pip install -q --no-index --find-links .gpu-deps/wheels scikit-build-core
start=$(date +%s)
"$py" -m pip install -q --no-build-isolation -C build-dir=build/py-gpu \
  -C cmake.define.CMAKE_PREFIX_PATH="$deps_prefix" . || { echo "build failed"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
lib=$("$py" -c 'import dtr; print(dtr.library_path)')
export PYTHONFAULTHANDLER=1 PYTHONUNBUFFERED=1
# Note [Exported symbols] (hooks/CMakeLists.txt): what the built library exports, and the compiler.
so=$(dirname "$lib")/libdtr_torch.so
echo "exported by libdtr_torch.so: $(nm -D --defined-only "$so" | wc -l) symbols, of them C++: $(nm -D --defined-only "$so" | awk '{print $3}' | grep -c '^_Z')"
readelf -p .comment "$so" 2>/dev/null | grep -m3 -i "gcc\|clang"

# case NAME LIMIT [VAR=VALUE ...] -- COMMAND...: runs it with the variables set, output to
# NAME.log; after a signal, again under cuda-gdb (NAME.gdb.log).
case_() {
  local name=$1 limit=$2; shift 2
  if [ -n "${GPU_DIAG_CASES:-}" ] && [[ " $GPU_DIAG_CASES " != *" $name "* ]]; then return; fi
  local vars=()
  while [ "$1" != "--" ]; do vars+=("$1"); shift; done
  shift
  local t; t=$(left "$limit")
  [ "$t" -le 5 ] && { echo "== $name: skipped, no time left"; return; }
  echo "== $name (limit $t s): ${vars[*]} $*"
  local s=$(date +%s)
  env "${vars[@]}" timeout "$t" "$@" > "$work/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $(( $(date +%s) - s )) s"; tail -n 4 "$work/$name.log" | cut -c1-400
  if [ $rc -ge 128 ] && [ $rc -ne 124 ] && command -v cuda-gdb >/dev/null; then
    t=$(left 120)
    [ "$t" -le 20 ] && return
    local gdbenv=()
    for v in "${vars[@]}"; do gdbenv+=(-ex "set environment ${v%%=*}=${v#*=}"); done
    echo "   rerun under cuda-gdb (limit $t s)"
    timeout "$t" cuda-gdb -q -batch -ex "set pagination off" -ex "set print thread-events off" \
      -ex "handle SIGPIPE nostop noprint" "${gdbenv[@]}" -ex run -ex "bt 60" -ex "info threads" \
      -ex "thread apply all bt 25" --args "$@" > "$work/$name.gdb.log" 2>&1
    grep -n -m1 -A25 "received signal" "$work/$name.gdb.log" | cut -c1-300
  fi
}

smoke='
import json, torch, dtr
x = torch.randn(256, 1024, device="cuda", requires_grad=True)
w = [torch.randn(1024, 1024, device="cuda", requires_grad=True) for _ in range(6)]
h = x
for m in w: h = torch.relu(h @ m)
h.sum().backward()
torch.cuda.synchronize()
print("grad digest", float(x.grad.double().sum()))
print(json.dumps(dtr.stats()))'
case_ smoke_native 60 DTR_CUDA_ALLOCATOR=native -- "$py" -m dtr -c "$smoke"
case_ smoke_dtr 60 DTR_CUDA_ALLOCATOR=dtr -- "$py" -m dtr -c "$smoke"
case_ smoke_budget 60 DTR_CUDA_ALLOCATOR=native -- "$py" -m dtr --budget 40MiB -c "$smoke"
case_ convnet_plain 60 X=1 -- "$py" scripts/gpu_budget_check.py --worker convnet --steps 3 --warmup 1
case_ convnet_dtr 60 DTR_CUDA_ALLOCATOR=native DTR_STATS_FILE=$work/convnet_dtr.stats.json -- \
  "$py" -m dtr scripts/gpu_budget_check.py --worker convnet --steps 3 --warmup 1
case_ resnet_preload 90 LD_PRELOAD=$lib -- "$py" bench/step_worker.py blocks --model resnet --device cuda \
  --blocks '[{"variant": "model", "budget": null, "label": "unlimited"}]' --warmup 1 --steps 2
case_ transformer_unbudgeted 60 DTR_CUDA_ALLOCATOR=native DTR_STATS_FILE=$work/transformer_unbudgeted.stats.json -- \
  "$py" -m dtr scripts/gpu_budget_check.py --worker transformer --steps 3 --warmup 1
# 0.7 of the plain run's max_memory_reserved (2430 MiB) on the first GPU run: it ran out of memory.
case_ transformer_budget 60 DTR_CUDA_ALLOCATOR=native DTR_STATS_FILE=$work/transformer_budget.stats.json -- \
  "$py" -m dtr --budget 1701MiB --verbose 1 scripts/gpu_budget_check.py --worker transformer --steps 3 --warmup 1
case_ transformer_dtr_backend 60 DTR_CUDA_ALLOCATOR=dtr DTR_STATS_FILE=$work/transformer_dtr_backend.stats.json -- \
  "$py" -m dtr --budget 1701MiB scripts/gpu_budget_check.py --worker transformer --steps 3 --warmup 1
# The Transformer's constants (issue 16 item 5; bench/results/cuda.md): a trace of 2 unbudgeted
# steps says which ops made them (opaque lines, const lines), and the same budgeted run with
# flash and memory-efficient attention off tests whether attention's CPU Philox tensors are the cause.
case_ transformer_trace 90 DTR_CUDA_ALLOCATOR=native DTR_TRACE_FILE=$work/transformer.trace \
  DTR_STATS_FILE=$work/transformer_trace.stats.json -- \
  "$py" -m dtr scripts/gpu_budget_check.py --worker transformer --steps 2 --warmup 1
math_sdp='import runpy, sys, torch
torch.backends.cuda.enable_flash_sdp(False); torch.backends.cuda.enable_mem_efficient_sdp(False)
sys.argv = ["gpu_budget_check.py"] + sys.argv[1:]
runpy.run_path("scripts/gpu_budget_check.py", run_name="__main__")'
case_ transformer_math_sdp 90 DTR_CUDA_ALLOCATOR=native DTR_STATS_FILE=$work/transformer_math_sdp.stats.json -- \
  "$py" -m dtr --budget 1701MiB --verbose 1 -c "$math_sdp" --worker transformer --steps 3 --warmup 1
# The conv net at 0.5 of its peak trained but not bit-identically (first run after issue 16's
# runtime changes): the same run, and with zero_grad(set_to_none=True) (no zero_ on gradients, so
# no overwritten gradient recipes), each against its own plain run, losses per step.
none_grads='import runpy, sys, torch
zero_grad = torch.optim.Optimizer.zero_grad
torch.optim.Optimizer.zero_grad = lambda self, set_to_none=True: zero_grad(self, True)
sys.argv = ["gpu_budget_check.py"] + sys.argv[1:]
runpy.run_path("scripts/gpu_budget_check.py", run_name="__main__")'
conv_budget=${GPU_DIAG_CONV_BUDGET:-1941962752}
case_ conv_plain 60 X=1 -- "$py" scripts/gpu_budget_check.py --worker convnet --steps 8 --warmup 2
case_ conv_half 90 DTR_CUDA_ALLOCATOR=native DTR_STATS_FILE=$work/conv_half.stats.json -- \
  "$py" -m dtr --budget "$conv_budget" scripts/gpu_budget_check.py --worker convnet --steps 8 --warmup 2
case_ conv_plain_none 60 X=1 -- "$py" -c "$none_grads" --worker convnet --steps 8 --warmup 2
case_ conv_half_none 90 DTR_CUDA_ALLOCATOR=native DTR_STATS_FILE=$work/conv_half_none.stats.json -- \
  "$py" -m dtr --budget "$conv_budget" -c "$none_grads" --worker convnet --steps 8 --warmup 2
case_ conv_half_lru 90 DTR_CUDA_ALLOCATOR=native DTR_HEURISTIC=lru -- \
  "$py" -m dtr --budget "$conv_budget" scripts/gpu_budget_check.py --worker convnet --steps 8 --warmup 2
# Note [Recovered out-of-memory errors] (hooks/cuda_allocator.cc): the same run without cuDNN
# (no workspace plans to fall back between), each against its own plain run.
no_cudnn='import runpy, sys, torch
torch.backends.cudnn.enabled = False
sys.argv = ["gpu_budget_check.py"] + sys.argv[1:]
runpy.run_path("scripts/gpu_budget_check.py", run_name="__main__")'
case_ conv_plain_nocudnn 60 X=1 -- "$py" -c "$no_cudnn" --worker convnet --steps 8 --warmup 2
case_ conv_half_nocudnn 90 DTR_CUDA_ALLOCATOR=native DTR_STATS_FILE=$work/conv_half_nocudnn.stats.json -- \
  "$py" -m dtr --budget "$conv_budget" -c "$no_cudnn" --worker convnet --steps 8 --warmup 2
# The conv net at 0.5 of its peak on the dtr backend trained on 2026-11-27 (4.08x) and ran out of
# memory on 2026-11-28, in SGD's _foreach_add_ with 1.38 GiB locked by a rematerialization: a
# trace of unbudgeted steps for dtr-sim (which rule changed it), and the failing run's stats.
case_ conv_trace 60 DTR_CUDA_ALLOCATOR=dtr DTR_TRACE_FILE=$work/convnet.trace -- \
  "$py" -m dtr scripts/gpu_budget_check.py --worker convnet --steps 4 --warmup 1
case_ conv_half_dtr 90 DTR_CUDA_ALLOCATOR=dtr DTR_STATS_FILE=$work/conv_half_dtr.stats.json -- \
  "$py" -m dtr --budget "$conv_budget" scripts/gpu_budget_check.py --worker convnet --steps 4 --warmup 1
case_ sweep_native 200 X=1 -- "$py" scripts/gpu_budget_check.py --cuda-allocator native --out "$work/sweep_native" \
  --steps 8 --warmup 2 --models ${GPU_DIAG_SWEEP_MODELS:-convnet transformer}
echo "== done in $(( $(date +%s) - start )) s after the build began"

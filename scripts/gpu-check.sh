#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU (../shared/gpu/README.md: torch 2.11+cu130 on
# Python 3.12, nvcc, cmake, ninja, no network). Steps, each logged to $OUT/gpu-check.log:
#   1. build and install dtr against the machine's torch (CUDA adapter included);
#   2. the CUDA adapter's C++ tests (fake backends); compute-sanitizer's memcheck on a budgeted
#      training run on the dtr backend, when present;
#   3. pytest on the CPU paths of the torch integration (tests/hooks, tests/python);
#   4. the budget sweep on CUDA (scripts/gpu_budget_check.py: a conv net and a Transformer, plain
#      vs dtr at 0.9/0.7/0.5 of the plain peak: time per step, max_memory_reserved <= budget,
#      bit-identical losses and weights), for both DTR_CUDA_ALLOCATOR backends;
#   5. with 2 or more GPUs, a 2-process NCCL DDP job (tests/hooks/dist_train.py) plain and under
#      dtr at 0.8 of each rank's peak: losses and weights must match (skipped, saying so, with one);
#   6. a report ($OUT/report.md: versions, GPU, pass/fail per step, the sweep's table), and
#      everything under $OUT in $OUT/gpu-check.tgz.
#   7. with time left before the deadline, the benchmark sweep on CUDA (bench/sweep.py --device
#      cuda --no-sim: the benchmark models at 1.0/0.5/0.3 of their peak), its JSON in $OUT/bench.
# Step 4 runs first after the build (it is what needs the GPU), then 2, 3, 5 and 7.
# Budget: at most 9 minutes on an H100 (build ~1.5 min, tests ~3, sweep ~5). GPU_CHECK_PYTEST=0
# skips step 3, GPU_CHECK_CXX=0 step 2's C++ tests, GPU_CHECK_MEMCHECK_SECONDS=0 its memcheck;
# GPU_CHECK_FRACTIONS (default "0.9 0.7 0.5") are step 4's budgets, GPU_CHECK_STEPS (default 20)
# its measured steps, GPU_CHECK_BACKENDS (default "native dtr") its sweeps; GPU_CHECK_SECONDS
# (default 520) is the deadline of the whole check, from its start: the later steps get what is
# left, never more than their own limits.
# Prepare at home, once:
#   mkdir -p .git/info && bash ../shared/gpu/fetch-deps.sh   (abseil/GoogleTest debs into .gpu-deps/)
#   pip download --no-deps --python-version 3.12 --only-binary=:all: -d .gpu-deps/wheels \
#       scikit-build-core packaging pathspec "pytest<9" pluggy iniconfig pytest-xdist execnet
# then on the device, carrying .gpu-deps:   bash scripts/gpu-check.sh [pytest args]
# Here, without a GPU:   bash scripts/gpu-check.sh --dry-run
#   builds the hooks with the CUDA adapter against this machine's venv (scripts/env.sh), runs
#   step 2, checks that every later step's inputs exist, and prints the plan.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1
report="$out/report.md"
step() { echo "== $*"; echo "- $*" >> "$report"; }
result() { echo "  - $*" >> "$report"; }

if [ "${1:-}" = "--dry-run" ]; then
  echo "# gpu-check --dry-run ($(date -u +%FT%TZ))" > "$report"
  source scripts/env.sh
  step "1. build the hooks with the CUDA adapter against $("$VENV_PY" -c 'import torch; print(torch.__version__)')"
  "$VENV_PY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else "a CUDA build of torch is needed")'
  cmake -G Ninja -S . -B build-hooks -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTR_PYTHON="$VENV_PY" \
    -DDTR_BUILD_BENCH=OFF >/dev/null
  ninja -C build-hooks dtr_torch cuda_allocator_test env_config_test recycler_test replay_state_test
  result "built"
  step "2. CUDA adapter tests (fake backends)"
  ctest --test-dir build-hooks -L hooks --output-on-failure && result "passed"
  step "3-4. inputs of the GPU steps"
  for f in scripts/gpu_budget_check.py tests/hooks tests/hooks/dist_train.py tests/python ../shared/gpu/fetch-deps.sh; do
    test -e "$f" || { echo "missing: $f"; exit 1; }
  done
  "$VENV_PY" -m py_compile scripts/gpu_budget_check.py tests/hooks/dist_train.py
  "$VENV_PY" scripts/gpu_budget_check.py --help >/dev/null
  "$VENV_PY" tests/hooks/dist_train.py --help >/dev/null
  result "present; gpu_budget_check.py compiles"
  echo "plan on the GPU machine: deps from .gpu-deps, pip install --no-build-isolation ., python -m dtr --info,"
  echo "  build-gpu/bin/cuda_allocator_test, compute-sanitizer memcheck of a budgeted run, pytest tests/hooks tests/python,"
  echo "  gpu_budget_check.py with DTR_CUDA_ALLOCATOR=native and =dtr, NCCL DDP on 2 GPUs if present,"
  echo "  report in \$OUT/report.md"
  cat "$report"
  exit 0
fi

echo "# gpu-check ($(date -u +%FT%TZ))" > "$report"
deadline=$(( $(date +%s) + ${GPU_CHECK_SECONDS:-520} ))
# Seconds a step may take: its own limit, or what is left before the deadline (minus a margin
# for the report), whichever is less; at least 1 (timeout 0 would mean no limit).
left() { local l=$(( deadline - $(date +%s) - 15 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
source .gpu-deps/env.sh
# dtr refuses unknown DTR_* variables (a typo must not run without its budget): keep env.sh's
# prefix under another name.
deps_prefix=$DTR_GPU_PREFIX_PATH
unset DTR_GPU_PREFIX_PATH
py=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$report" || true
echo "== install build tools from .gpu-deps/wheels"
"$py" -m pip install -q --no-index --find-links .gpu-deps/wheels scikit-build-core pytest
# pytest-xdist, when .gpu-deps has it: pytest then runs one worker a core (step 3).
"$py" -m pip install -q --no-index --find-links .gpu-deps/wheels pytest-xdist 2>/dev/null || true
step "1. build and install dtr against $("$py" -c 'import torch; print(torch.__version__)')"
start=$(date +%s)
"$py" -m pip install -q --no-build-isolation -C build-dir=build/py-gpu \
  -C cmake.define.CMAKE_PREFIX_PATH="$deps_prefix" .
echo "built in $(( $(date +%s) - start )) s"
"$py" -m dtr --info
"$py" - <<'PY'
import torch, ctypes, dtr._library as L
lib = L.load()
k = lib.dtr_dispatch_key()
names = {int(v): n for n, v in torch._C.DispatchKey.__members__.items()}
print(f"DispatchKey::Fake = {k}; Python = {int(torch._C.DispatchKey.Python)}: Fake is "
      f"{'above' if k > int(torch._C.DispatchKey.Python) else 'below'} Python; "
      f"fallback on Fake before dtr: {torch._C._dispatch_has_backend_fallback(torch._C.DispatchKey(k))}")
PY
"$py" -m dtr --info | tee -a "$report"
set +e
# GPU_CHECK_BACKENDS (default "native dtr"): the sweeps to run; "native-cudamalloc" is the native
# backend with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False (Note [Expandable segments under a
# budget]: without it dtr turns them on under a budget).
for backend in ${GPU_CHECK_BACKENDS:-native dtr}; do
  step "4. budget sweep on CUDA, $backend"
  conf=(); [ "$backend" = native-cudamalloc ] && conf=(--alloc-conf expandable_segments:False)
  # shellcheck disable=SC2086  # GPU_CHECK_FRACTIONS is a list of numbers
  timeout $(left 150) "$py" scripts/gpu_budget_check.py --cuda-allocator "${backend%-cudamalloc}" "${conf[@]}" \
    --out "$out/$backend" --steps ${GPU_CHECK_STEPS:-20} --warmup 5 --fractions ${GPU_CHECK_FRACTIONS:-0.9 0.7 0.5} \
    && result "ran" || result "FAILED or timed out"
  cat "$out/$backend/budget_sweep.md" >> "$report" 2>/dev/null
done
step "2. CUDA adapter C++ tests; dtr-sim for the trace test"
if [ "${GPU_CHECK_CXX:-1}" = 1 ]; then
  cmake -G Ninja -S . -B build-gpu -DDTR_PYTHON="$py" -DDTR_BUILD_BENCH=OFF \
    -DCMAKE_PREFIX_PATH="$deps_prefix" >/dev/null
  ninja -C build-gpu dtr-sim dtr-chain cuda_allocator_test >/dev/null
  build-gpu/bin/cuda_allocator_test --gtest_brief=1 && result "passed" || result "FAILED"
else
  result "skipped (GPU_CHECK_CXX=0)"
fi
# The C++ tests use fake backends and make no CUDA call (compute-sanitizer then exits 255,
# "terminated before first instrumented API call"): memcheck watches a real training run on the
# dtr backend instead, under a budget that evicts and rematerializes (0.75 of the conv net's peak:
# 0.7, 2600 MiB, trains in the sweep but ran out of memory under compute-sanitizer, 2026-11-28).
# GPU_CHECK_MEMCHECK_SECONDS (default 150; 0 skips) limits it.
memcheck_seconds=${GPU_CHECK_MEMCHECK_SECONDS:-150}
if command -v compute-sanitizer >/dev/null && [ "$memcheck_seconds" -gt 0 ]; then
  timeout $(left "$memcheck_seconds") compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 \
    "$py" -m dtr --cuda-allocator dtr --budget 2800MiB scripts/gpu_budget_check.py --worker convnet \
    --steps 3 --warmup 1 > "$out/memcheck.log" 2>&1
  case $? in
    0) grep -q '"evictions": [1-9]' "$out/memcheck.log" \
         && result "memcheck of a budgeted conv net on the dtr backend (it evicted): clean" \
         || result "memcheck clean, but the run evicted nothing: raise the pressure (--budget)" ;;
    9) result "memcheck FOUND ERRORS: $(grep -m1 'ERROR SUMMARY' "$out/memcheck.log")" ;;
    124) result "memcheck timed out" ;;
    # The program failed (compute-sanitizer passes its exit status on), not the memory check.
    *) grep -q 'ERROR SUMMARY: 0 errors' "$out/memcheck.log" \
         && result "memcheck clean (0 errors), but the program failed: $(grep -m1 -o '[A-Za-z.]*Error: .\{0,160\}' "$out/memcheck.log")" \
         || result "memcheck FAILED: $(tail -1 "$out/memcheck.log")" ;;
  esac
fi
step "3. pytest (CPU paths of the torch integration)"
# GPU_CHECK_PYTEST_SECONDS (default 180) limits it; the arguments of gpu-check.sh replace the
# default selection (tests/hooks tests/python); the output is kept in $out/pytest.log.
tests=("$@"); [ ${#tests[@]} = 0 ] && tests=(tests/hooks tests/python)
workers=(); "$py" -c 'import xdist' 2>/dev/null && workers=(-n "$(nproc)" --dist loadgroup)
# (pipefail is on: the pipeline fails when pytest does)
[ "${GPU_CHECK_PYTEST:-1}" = 1 ] && BUILD_DIR=$PWD/build-gpu timeout $(left "${GPU_CHECK_PYTEST_SECONDS:-180}") \
  "$py" -m pytest -q -p no:cacheprovider "${workers[@]}" -o junit_family=xunit2 --junitxml="$out/pytest.xml" \
  "${tests[@]}" 2>&1 | tee "$out/pytest.log" | tail -40 \
  && result "passed" || result "FAILED, timed out or skipped (GPU_CHECK_PYTEST=0): $(tail -1 "$out/pytest.log" 2>/dev/null)"
ngpu=$("$py" -c 'import torch; print(torch.cuda.device_count())')
step "5. 2-process NCCL DDP (plain, then dtr at 0.8 of each rank's peak)"
if [ "$ngpu" -ge 2 ]; then
  for tag in plain dtr; do
    mkdir -p "$out/ddp-$tag"
    extra=(); [ $tag = dtr ] && extra=(--budget-fraction 0.8)
    env $([ $tag = dtr ] && echo DTR_ENABLE=1) DIST_OUT="$out/ddp-$tag" timeout 120 "$py" -m torch.distributed.run \
      --standalone --nproc-per-node=2 tests/hooks/dist_train.py ddp --device cuda "${extra[@]}"
  done
  "$py" - "$out" <<'PY' && result "bit-identical" || result "FAILED"
import json, sys
a, b = ([json.load(open(f"{sys.argv[1]}/ddp-{t}/rank{r}.json")) for r in (0, 1)] for t in ("plain", "dtr"))
for x, y in zip(a, b):
    assert x["losses"] == y["losses"] and x["params"] == y["params"], x["rank"]
    print(f"rank {y['rank']}: evictions {y['dtr']['evictions']}, remats {y['dtr']['rematerializations']}")
PY
else
  result "skipped: $ngpu GPU(s), the check needs 2"
fi
step "7. benchmark sweep on CUDA (bench/sweep.py, real runs only)"
t=$(left 400)
if [ "$t" -ge 60 ]; then
  timeout "$t" "$py" bench/sweep.py --device cuda --no-sim --no-refine --heuristics "${GPU_CHECK_HEURISTICS:-dtr}" \
    --models "${GPU_CHECK_MODELS:-transformer,resnet,lstm,treelstm,unet}" --ratios 1.0,0.5,0.3 \
    --warmup 2 --steps 5 --out "$out/bench" --build build-gpu && result "ran" || result "FAILED or timed out"
  cat "$out/bench/cuda.md" >> "$report" 2>/dev/null
else
  result "skipped: $t s left before the deadline"
fi
set -e
step "6. report: $report"
cat "$report"
# Everything in one archive too: the device tool brings back at most 8 files from $OUT.
# (gpu-check.log is still being written by the tee above: tar may warn that it changed.)
(cd "$out" && tar czf /tmp/gpu-check.tgz --warning=no-file-changed --exclude=gpu-check.tgz . ; mv /tmp/gpu-check.tgz .) || true

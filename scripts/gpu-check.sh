#!/usr/bin/env bash
# On the GPU machine (../shared/gpu/README.md: torch 2.11+cu130 on Python 3.12, nvcc, cmake, ninja,
# no network): builds dtr against the machine's own torch and runs the torch test-suites there.
# Everything that prints goes to $OUT/gpu-check.log too.
#   bash ../shared/gpu/fetch-deps.sh   (at home, once: abseil/GoogleTest debs into .gpu-deps/), and
#   pip download --no-deps --python-version 3.12 --only-binary=:all: -d .gpu-deps/wheels \
#       scikit-build-core packaging pathspec pytest pluggy iniconfig
# then on the device, carrying .gpu-deps:   bash scripts/gpu-check.sh [pytest args]
# Today this checks the CPU paths on torch 2.11 (the oldest supported release, where DispatchKey
# Fake sits above Python); the CUDA allocator checks join it with the CUDA adapter.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1
source .gpu-deps/env.sh
# dtr refuses unknown DTR_* variables (a typo must not run without its budget): keep env.sh's
# prefix under another name.
deps_prefix=$DTR_GPU_PREFIX_PATH
unset DTR_GPU_PREFIX_PATH
py=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
echo "== install build tools from .gpu-deps/wheels"
"$py" -m pip install -q --no-index --find-links .gpu-deps/wheels scikit-build-core pytest
echo "== build and install dtr against $("$py" -c 'import torch; print(torch.__version__)')"
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
echo "== dtr-sim (for the trace test)"
cmake -G Ninja -S . -B build-gpu -DDTR_BUILD_HOOKS=OFF -DDTR_BUILD_TESTS=OFF -DDTR_BUILD_BENCH=OFF \
  -DCMAKE_PREFIX_PATH="$deps_prefix" >/dev/null
ninja -C build-gpu dtr-sim dtr-chain >/dev/null
echo "== pytest (CPU paths of the torch integration)"
BUILD_DIR=$PWD/build-gpu "$py" -m pytest -q -p no:cacheprovider -o junit_family=xunit2 \
  --junitxml="$out/pytest.xml" tests/hooks tests/python "$@"

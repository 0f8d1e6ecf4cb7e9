#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for dtr, idempotently (CI included):
#   1. Debian packages: compilers, ccache, CMake, Ninja, abseil, GoogleTest, Google Benchmark,
#      Python's venv and headers, valgrind (bench/step_instructions.py counts instructions with it);
#   2. a virtual environment (scripts/env.sh: .venv with torch 2.14.1 by default,
#      TORCH_VERSION=2.13.0 for the CPU wheel in .venv-2.13.0) with torch pinned (any other
#      request would download gigabytes), torchvision 0.29.1 (the only torch it imports with) and
#      transformers 5.25.0 beside 2.14.1, pytest with pytest-xdist, numpy, matplotlib,
#      scikit-build-core and ninja;
#   3. dtr itself: `pip install --no-build-isolation .`, built against that torch (build tree
#      kept in build/py-torch<version> so a rebuild is incremental), with GCC's profile-guided
#      optimization (Note [Profile-guided optimization], CMakeLists.txt): an instrumented build
#      runs scripts/pgo_workload.py, then the installed one is built from its profile, kept in
#      build/pgo-torch<version> until a source file changes. PGO=0 builds without it (faster
#      when iterating on the code).
# Run as root or with sudo available.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

packages=(build-essential ccache cmake ninja-build pkg-config libabsl-dev libgtest-dev libgmock-dev googletest
          libbenchmark-dev python3-venv python3-dev valgrind)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

python=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [ ! -x "$VENV_PY" ]; then
  echo "setup: creating $VENV_DIR with $python"
  "$python" -m venv "$VENV_DIR"
fi
# pip, with the machine's "Location ... is ignored" noise dropped (its exit status is kept).
pip_q() { "$VENV_PY" -m pip -q --disable-pip-version-check "$@" 2> >(grep -v '^WARNING: Location' >&2); }
# pytest below 9: pytest-xdist 3.8's --dist loadgroup (scripts/test.sh) renames a grouped test
# through item._nodeid, which pytest 9 no longer reads, so every group was silently split.
pytest_below=9
want=(torch=="$TORCH_VERSION" numpy "pytest<$pytest_below" pytest-xdist matplotlib "scikit-build-core>=0.10" ninja)
# Beside 2.14.1 only, where CI runs the real-model tests: torchvision (the only torch it imports
# with) and Hugging Face transformers (from PyPI, pinned: its models change between releases).
real_models=()
[ "$TORCH_VERSION" = 2.14.1 ] && real_models=(torchvision==0.29.1 transformers==5.25.0)
want+=("${real_models[@]}")
have=$("$VENV_PY" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)
have_real_models=$("$VENV_PY" -c 'import importlib.metadata as m
print(" ".join(f"{p}=={m.version(p)}" for p in ("torchvision", "transformers")))' 2>/dev/null || true)
if [ "$have" != "$TORCH_VERSION" ] || { [ ${#real_models[@]} -gt 0 ] && [ "$have_real_models" != "${real_models[*]}" ]; } ||
   ! "$VENV_PY" -c 'import sys, pytest, xdist, numpy, matplotlib, scikit_build_core
sys.exit(int(pytest.__version__.split(".")[0]) >= '"$pytest_below"')' 2>/dev/null; then
  echo "setup: installing ${want[*]} into $VENV_DIR"
  pip_q install "${want[@]}"
  "$VENV_PY" -c "import torch; assert torch.__version__.split('+')[0] == '$TORCH_VERSION', torch.__version__"
fi

echo "setup: building and installing dtr into $VENV_DIR (torch $TORCH_VERSION)"
# Through ccache (scripts/env.sh): the runtime, the allocator and the simulator do not include
# torch, so the second wheel's build reuses their objects from the first (about 100 s of CI's
# two cores) when built without a profile; a profile-guided build's objects depend on its own
# profile. CMake takes the launcher from the environment when it first configures a tree.
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_C_COMPILER_LAUNCHER=ccache
fi
build_tree=build/py-torch$TORCH_VERSION
pgo=()
cxx=${CXX:-c++}  # what CMake compiles with
if [ "${PGO:-1}" != 0 ] && "$cxx" --version 2>/dev/null | grep -q "Free Software Foundation"; then
  pgo_dir=$PWD/build/pgo-torch$TORCH_VERSION
  # The profile is kept while nothing it was made from changes: the library's sources and build
  # files (not its notes), the workload, the compiler, flags from the environment, torch (its
  # build: CUDA or CPU), nvcc (the CUDA adapter) and where the build tree is (GCC names each
  # profile file after its object's absolute path).
  key=$( { "$cxx" --version | head -1; "$VENV_PY" -c 'import torch; print("torch", torch.__version__)'
           echo "$PWD/$build_tree ${CXXFLAGS:-} ${CFLAGS:-} ${LDFLAGS:-} ${CMAKE_ARGS:-} $(command -v nvcc || true)"
           find runtime allocator hooks cmake -type f \( -name '*.cc' -o -name '*.h' -o -name '*.c' -o -name '*.cmake' \
             -o -name '*.in' -o -name CMakeLists.txt \) -print0 | sort -z | xargs -0 sha1sum
           sha1sum CMakeLists.txt pyproject.toml scripts/pgo_workload.py; } | sha1sum | cut -c1-40)
  if [ "$(cat "$pgo_dir/key" 2>/dev/null)" != "$key" ]; then
    echo "setup: profile-guided build, 1 of 2: instrumented, then scripts/pgo_workload.py writes the profile"
    rm -rf "$pgo_dir"
    pip_q install --no-build-isolation --no-deps --target "$pgo_dir/instrumented" -C build-dir="$build_tree" \
      -C cmake.define.DTR_PGO=generate -C cmake.define.DTR_PGO_DIR="$pgo_dir/profile" .
    # Without the caller's DTR_* settings (a trace or stats file, another heuristic): the workload's own.
    env $(env | sed -n 's/^\(DTR_[A-Za-z0-9_]*\)=.*/-u \1/p') PYTHONPATH="$pgo_dir/instrumented" OMP_NUM_THREADS=1 \
      "$VENV_PY" -m dtr --budget 1TiB scripts/pgo_workload.py
    # GCC names each profile file after its object's absolute path, '/' mangled to '#'.
    ls "$pgo_dir/profile/$(echo "$PWD/$build_tree" | tr / '#')#"*.gcda >/dev/null 2>&1 ||
      { echo "setup: the workload wrote no profile for $build_tree into $pgo_dir/profile" >&2; exit 1; }
    rm -rf "$pgo_dir/instrumented"
    echo "$key" > "$pgo_dir/key"
    echo "setup: profile-guided build, 2 of 2: the library installed, from the profile"
  fi
  pgo=(-C cmake.define.DTR_PGO=use -C cmake.define.DTR_PGO_DIR="$pgo_dir/profile")
else
  echo "setup: building without profile-guided optimization ($([ "${PGO:-1}" = 0 ] && echo PGO=0 || echo "$cxx is not GCC"))"
fi
pip_q install --no-build-isolation -C build-dir="$build_tree" "${pgo[@]}" .
if [ ${#pgo[@]} -gt 0 ]; then
  "$VENV_PY" -c 'import sys, dtr._build_info as b; sys.exit(b.PGO != "use")' ||
    { echo "setup: the installed dtr was not built from the profile" >&2; exit 1; }
fi
"$VENV_PY" -m dtr --info

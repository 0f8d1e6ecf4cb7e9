#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine (scripts/setup.sh: the venv with torch and dtr installed) and
# runs every test dtr has:
#   1. the C++ build (Ninja; runtime, allocator, simulator, benchmarks);
#   1b. on the CUDA wheel: the C++ tests of the hooks and the CUDA adapter (fake backends);
#   2. every ctest suite (runtime, allocator, simulator) under AddressSanitizer +
#      UndefinedBehaviorSanitizer (with --quick: without sanitizers, in the build of step 1);
#   3. the multi-threaded allocator tests under ThreadSanitizer;
#   4. pytest through the installed package: tests/hooks (the torch integration), tests/python
#      (activation paths, the C++ example via find_package(dtr), the main job) and tests/bench
#      (not with --python-only).
# Each section's header says how long the script has run (bash's SECONDS), setup included, so a
# slow CI run shows where its minutes went.
# Usage: bash scripts/test.sh [--quick] [--python-only]
#   --quick        skips the sanitizer builds
#   --python-only  only steps 1's simulator build and 4, without the training sweep (CI runs the
#                  C++ suites and the sweep once, for the first wheel, the rest for each wheel)
#   TORCH_VERSION=2.13.0 bash scripts/test.sh   against the other wheel (scripts/env.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
python_only=0
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    --python-only) python_only=1 ;;
    *) echo "test.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

bash scripts/setup.sh
source scripts/env.sh
jobs=$(nproc)

echo "== C++ build (RelWithDebInfo) (at ${SECONDS} s)"
cmake -G Ninja -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTR_BUILD_HOOKS=OFF >/dev/null
if [ "$python_only" -eq 1 ]; then
  ninja -C build -j"$jobs" dtr-sim dtr-chain
elif [ "$quick" -eq 0 ]; then
  # The C++ suites run under ASan + UBSan below, every one of them (all are labelled `unit`):
  # compiling them a second time here would only cost CI minutes. The simulator tools (the
  # Python tests use them) and the benchmarks (so they keep compiling) are built here.
  ninja -C build -j"$jobs" dtr-sim dtr-chain runtime_bench allocator_bench
else
  ninja -C build -j"$jobs"
  echo "== C++ tests (at ${SECONDS} s)"
  ctest --test-dir build --output-on-failure -j"$jobs"
fi

if [ "$python_only" -eq 0 ] && "$VENV_PY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)'; then
  # The hooks against the CUDA wheel, with the CUDA adapter, and their C++ tests (fake backends,
  # no GPU needed).
  # Built in setup.sh's pip build tree, where the hooks are already compiled: the tests are
  # switched on there and only they are built (with the ninja that tree was made with, the
  # venv's: another version's build log would make ninja compile everything again).
  echo "== hooks + CUDA adapter against torch $TORCH_VERSION: C++ tests (at ${SECONDS} s)"
  pip_tree=build/py-torch$TORCH_VERSION
  cmake -S . -B "$pip_tree" -DDTR_BUILD_TESTS=ON >/dev/null
  cmake --build "$pip_tree" -j"$jobs" --target cuda_allocator_test env_config_test recycler_test replay_state_test
  ctest --test-dir "$pip_tree" -L hooks --output-on-failure
fi

if [ "$quick" -eq 0 ] && [ "$python_only" -eq 0 ]; then
  echo "== C++ tests under ASan + UBSan (at ${SECONDS} s)"
  # Both sanitized builds at -O1, as the sanitizers' documentation advises, with -g1 (line tables:
  # reports keep their file and line): ASan's build takes 3.4 min on CI's two cores, against 4.4
  # with -g and 5.9 at -O2 -g, and the suites run as fast.
  sanitized=(-G Ninja -S . -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG")
  cmake "${sanitized[@]}" -B build-asan -DDTR_SANITIZE=address,undefined >/dev/null
  ninja -C build-asan -j"$jobs"
  # Every suite, whatever its label, so that none is left out of CI.
  ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j"$jobs"

  echo "== TSan: multi-threaded tests (at ${SECONDS} s)"
  cmake "${sanitized[@]}" -B build-tsan -DDTR_SANITIZE=thread >/dev/null
  # Only what the `threads` label runs.
  threaded=$(ctest --test-dir build-tsan -L threads -N | sed -n 's/^ *Test *#[0-9]*: *//p')
  [ -n "$threaded" ] || { echo "test.sh: no test is labelled threads" >&2; exit 1; }
  ninja -C build-tsan -j"$jobs" $threaded
  TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan -L threads --output-on-failure
fi

echo "== torch $TORCH_VERSION: integration, package and benchmark smoke tests (pytest, $VENV_DIR) (at ${SECONDS} s)"
suites=(tests/hooks tests/python)
# The sweep harness's smoke test does not depend on the wheel: once, with the C++ suites. So does
# the seven-model training sweep (the same engine code on every wheel; the version-sensitive
# paths are in the activation, semantics, coexistence and config tests, which run on both).
[ "$python_only" -eq 0 ] && suites+=(tests/bench)
[ "$python_only" -eq 1 ] && suites+=(--ignore=tests/hooks/test_training.py)
# So do the Hugging Face models (setup.sh installs transformers beside the first wheel only): the
# same engine code on every wheel, about 80 s of CI.
[ "$python_only" -eq 1 ] && suites+=(--ignore=tests/hooks/test_transformers_models.py)
# Of the seven DDP/FSDP modes, the second wheel runs plain DDP, FSDP and the collectives; the
# other four are DDP reducer options (bucket views, no_sync, unused parameters, static graph),
# the same dtr code paths as plain DDP: once, on the first wheel (about 50 s of CI).
# Of the three launchers, the second wheel runs the environment variable: `python -m dtr` and
# `dtr-run` only set it before exec'ing the same torchrun (Python code that does not depend on the
# wheel), about 45 s of CI.
if [ "$python_only" -eq 1 ]; then
  for mode in ddp_bucket_view ddp_no_sync ddp_unused ddp_static; do
    suites+=(--deselect "tests/hooks/test_distributed.py::test_training_is_bit_identical_under_a_budget_on_every_rank[$mode]")
  done
  for launcher in "python -m dtr" dtr-run; do
    suites+=(--deselect "tests/hooks/test_distributed.py::test_every_launcher_puts_every_rank_under_its_budget[$launcher]")
  done
fi
# The property test's 2,000 random programs run on the first wheel; 500 on the second keep its
# version-sensitive paths covered within CI's time.
[ "$python_only" -eq 1 ] && export PROPERTY_PROGRAMS="${PROPERTY_PROGRAMS:-500}"
# One pytest-xdist worker a core. Tests that share a module-scoped fixture carry an xdist_group
# mark, and --dist loadgroup keeps each group on one worker, so the fixture runs once.
BUILD_DIR=$PWD/build "$VENV_PY" -m pytest -q -p no:cacheprovider -n "$jobs" --dist loadgroup --durations=12 \
  "${suites[@]}"
echo "== all tests passed (torch $TORCH_VERSION) (at ${SECONDS} s)"

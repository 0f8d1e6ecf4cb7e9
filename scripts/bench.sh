#!/usr/bin/env bash
# The budget sweep benchmark on a fresh Debian 12 machine: sets up the venv with dtr installed
# (scripts/setup.sh), builds dtr-sim and dtr-chain in Release and runs bench/sweep.py, which writes
# bench/results/<device>.md, <device>.json and <device>_<model>.png, then bench/activation_budgets.py
# (bench/results/activations.md), the same budgets in real training runs (bench/activation_runs.py:
# bench/results/activation_runs.md), the per-op overhead (bench/op_overhead.py), dtr's instructions a
# training step (bench/step_instructions.py: bench/results/instructions.md) and the DDP overhead
# (bench/results/ddp.md).
#   bash scripts/bench.sh                       all eight models, CPU (about 75 minutes on 2 cores,
#                                               40 minutes of it counting instructions under valgrind)
#   bash scripts/bench.sh --quick               smoke run: 2 models, 3 budgets, 1 heuristic (< 1 min)
#   bash scripts/bench.sh --device cuda         the same on a GPU machine
#   TORCH_VERSION=2.13.0 bash scripts/bench.sh  against the other wheel (scripts/setup.sh)
#   BUILD_DIR=dir bash scripts/bench.sh         another build directory (default: build-release)
# Every argument is passed to bench/sweep.py (see .venv/bin/python bench/sweep.py --help).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-release}

source scripts/setup.sh
echo "== build dtr-sim, dtr-chain (Release) into $build"
cmake -G Ninja -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDTR_BUILD_HOOKS=OFF -DDTR_BUILD_TESTS=OFF -DDTR_BUILD_BENCH=OFF >/dev/null
ninja -C "$build" -j"$(nproc)" dtr-sim dtr-chain

echo "== sweep"
start=$(date +%s)
BENCH_INVOKED_BY="bash scripts/bench.sh${*:+ $*}" "$VENV_PY" bench/sweep.py --build "$build" "$@"
echo "== bench.sh: sweep took $(( $(date +%s) - start )) s"

echo "== budgets on activations in dtr-sim -> bench/results/activations.md"
"$VENV_PY" bench/activation_budgets.py --build "$build" --out bench/results/activations.md

echo "== budgets on activations in real training runs, side by side with plain PyTorch -> bench/results/activation_runs.md"
if [[ " $* " == *" --quick "* ]]; then
  "$VENV_PY" bench/activation_runs.py --models chain --rounds 1 --out "${TMPDIR:-/tmp}/dtr-activation-runs-quick.md"
else
  "$VENV_PY" bench/activation_runs.py --out bench/results/activation_runs.md
fi

echo "== per-op bookkeeping on small CPU ops, side by side with plain PyTorch (bench/results/runtime.md)"
"$VENV_PY" bench/op_overhead.py

echo "== dtr's instructions a training step, side by side with plain PyTorch (callgrind) -> bench/results/instructions.md"
# --quick: the chain alone (one valgrind run, about 6 minutes), into a scratch file.
if [[ " $* " == *" --quick "* ]]; then
  "$VENV_PY" bench/step_instructions.py --models chain --cache-sim --out "${TMPDIR:-/tmp}/dtr-instructions-quick.md"
else
  "$VENV_PY" bench/step_instructions.py --cache-sim --out bench/results/instructions.md
fi

echo "== 2-rank DDP overhead (gloo, CPU) -> bench/results/ddp.md"
"$VENV_PY" bench/ddp_overhead.py --out bench/results/ddp.md

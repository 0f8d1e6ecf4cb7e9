#!/usr/bin/env bash
# The budget sweep benchmark (issue 6) on a fresh Debian 12 machine: installs what it needs
# (scripts/setup.sh), builds dtr in Release (libdtr.so, dtr-sim, dtr-chain) and runs
# bench/sweep.py, which writes bench/results/<device>.md, <device>.json and <device>_<model>.png.
#   bash scripts/bench.sh                       all seven models, CPU (under 20 minutes on 2 cores)
#   bash scripts/bench.sh --quick               smoke run: 2 models, 3 budgets, 1 heuristic (< 1 min)
#   bash scripts/bench.sh --device cuda         the same on a GPU machine
#   PYTHON=python bash scripts/bench.sh         another interpreter with torch (default /usr/bin/python3,
#                                               Debian's CPU-only torch; a CUDA run needs a CUDA torch)
#   BUILD_DIR=dir bash scripts/bench.sh         another build directory (default: build-release,
#                                               so that build/ keeps the RelWithDebInfo type that
#                                               scripts/test.sh and scripts/main.sh give it)
# Every argument is passed to bench/sweep.py (see /usr/bin/python3 bench/sweep.py --help).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-release}

bash scripts/setup.sh
echo "== build (Release) into $build"
cmake -G Ninja -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$build" -j"$(nproc)" dtr dtr_torch dtr-sim dtr-chain

echo "== sweep"
start=$(date +%s)
BENCH_INVOKED_BY="bash scripts/bench.sh${*:+ $*}" "${PYTHON:-/usr/bin/python3}" bench/sweep.py --build "$build" "$@"
echo "== bench.sh: sweep took $(( $(date +%s) - start )) s"

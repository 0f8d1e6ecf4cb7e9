#!/usr/bin/env bash
# The main job: set up, build, then train a Transformer (with dropout) under a memory budget of
# 80% of its peak, three ways, and print each outcome:
#   1. plain PyTorch under dtr's allocator, no budget (measures the peak);
#   2. the budget with eviction switched off (DTR_EVICT=0): out of memory;
#   3. the same budget with dtr: trains, with the same losses, and dtr's stats.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -G Ninja -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build dtr dtr_torch dtr-sim

PY=/usr/bin/python3
LIB=$PWD/build/lib/libdtr.so
TRAIN=tests/hooks/train.py
field() { "$PY" -c 'import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(eval(sys.argv[1]))' "$1"; }

echo "== 1. no budget"
plain=$(LD_PRELOAD=$LIB "$PY" $TRAIN transformer)
peak=$(echo "$plain" | field 'd["dtr"]["peak_allocated_bytes"]')
budget=$((peak * 80 / 100))
echo "losses: $(echo "$plain" | field 'd["losses"]')"
echo "peak allocated: $peak bytes; the budget below is $budget bytes (80%)"

echo "== 2. DTR_BUDGET=$budget without rematerialization (DTR_EVICT=0)"
if out=$(LD_PRELOAD=$LIB DTR_BUDGET=$budget DTR_EVICT=0 "$PY" $TRAIN transformer 2>&1); then
  echo "unexpected: it fit without eviction"; exit 1
fi
echo "$out" | grep -m1 -o "OutOfMemoryError.*" | cut -c1-400

echo "== 3. DTR_BUDGET=$budget with dtr"
stats=$(mktemp --suffix=.json)
trap 'rm -f "$stats"' EXIT
with=$(LD_PRELOAD=$LIB DTR_BUDGET=$budget DTR_STATS_FILE=$stats "$PY" $TRAIN transformer)
echo "losses: $(echo "$with" | field 'd["losses"]')"
same=$( [ "$(echo "$with" | field 'd["losses"]')" = "$(echo "$plain" | field 'd["losses"]')" ] && echo yes || echo NO)
echo "losses bit-identical to the run without a budget: $same"
echo "dtr stats: $(cat "$stats")"
[ "$same" = yes ]

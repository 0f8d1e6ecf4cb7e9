#!/usr/bin/env bash
# The main job: set up, build, then train under a budget that fails without rematerialization
# and succeeds with dtr, printing both outcomes and dtr's stats.
# Until the torch integration (hooks/) lands, the training step is a simulated one: a UNet
# training-step trace replayed through the real DTR runtime by dtr-sim.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -G Ninja -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build dtr-sim

trace=$(mktemp --suffix=.trace)
trap 'rm -f "$trace"' EXIT
build/bin/dtr-sim --generate unet --n 5 > "$trace"
peak=$(build/bin/dtr-sim --trace "$trace" | tail -n 1 | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["peak_bytes"])')
budget=$((peak * 45 / 100))
echo "UNet training step: peak without a budget is $peak bytes; budget is $budget bytes (45%)."
echo "-- without rematerialization (every tensor kept until the program frees it):"
if [ "$peak" -gt "$budget" ]; then
  echo "   out of memory: the step needs $peak bytes > budget $budget bytes"
fi
echo "-- with dtr (dtr-eq, eager eviction):"
build/bin/dtr-sim --trace "$trace" --budget "$budget" --heuristic dtr-eq

#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: set up (scripts/setup.sh: venv, torch, dtr), then
# train torchvision's ResNet-18 on synthetic images plainly, under dtr, under a budget at 80% of
# its peak with eviction off (dies with torch.OutOfMemoryError) and with dtr (trains, losses and
# weights bit-identical to the plain run), and print dtr's stats (scripts/main_job.py).
# TORCH_VERSION selects the wheel (scripts/env.sh); torchvision imports beside 2.14.1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
"$VENV_PY" scripts/main_job.py

#!/usr/bin/env bash
# Installs everything dtr needs to build and test on a fresh Debian 12 machine (CI included).
# Idempotent: packages already present are skipped by apt. Run as root or with sudo available.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libabsl-dev libgtest-dev libgmock-dev googletest libbenchmark-dev
  # LibTorch 1.13 (CPU) and its Python binding for /usr/bin/python3: used by hooks/ and tests/hooks.
  libtorch-dev python3-torch python3-pytest python3-numpy
  # Plots of the benchmark results (bench/sweep.py).
  python3-matplotlib
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"

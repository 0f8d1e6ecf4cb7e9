#!/usr/bin/env bash
# Installs activation by environment variable alone for /usr/bin/python3: after this, any
# `DTR_BUDGET=... python3 train.py` runs under dtr without LD_PRELOAD (see hooks/dtr_activate.py).
# Usage: bash scripts/install.sh [--lib PATH/libdtr.so] [SITE_DIR]
#                                    (default: build/lib/libdtr.so, built if missing;
#                                     /usr/bin/python3's site-packages)
#        bash scripts/install.sh --uninstall [SITE_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
uninstall=0
lib=""
if [ "${1:-}" = "--uninstall" ]; then uninstall=1; shift; fi
if [ "${1:-}" = "--lib" ]; then
  lib=$(realpath "${2:?--lib needs a path to libdtr.so}")
  [ -f "$lib" ] || { echo "install.sh: --lib $2: no such file" >&2; exit 2; }
  shift 2
fi
site=${1:-$(/usr/bin/python3 -c 'import site; print(site.getsitepackages()[0])')}
if [ "$uninstall" -eq 1 ]; then
  rm -f "$site/dtr.pth" "$site/dtr_activate.py"
  echo "dtr: removed activation from $site"
  exit 0
fi
if [ -z "$lib" ]; then
  lib=$PWD/build/lib/libdtr.so
fi
if [ ! -f "$lib" ]; then
  bash scripts/setup.sh
  cmake -G Ninja -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  ninja -C build dtr dtr_torch
fi
mkdir -p "$site"
sed "s|@DTR_LIB@|$lib|" hooks/dtr_activate.py > "$site/dtr_activate.py"
echo "import dtr_activate" > "$site/dtr.pth"
echo "dtr: installed activation into $site (DTR_BUDGET=... now enables dtr; DTR_ENABLE=0 disables it)"

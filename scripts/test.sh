#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine (scripts/setup.sh) and runs every test dtr has:
#   1. the full build (Ninja) and all ctest suites;
#   2. the runtime and allocator unit tests under AddressSanitizer + UndefinedBehaviorSanitizer;
#   3. the multi-threaded allocator tests under ThreadSanitizer;
#   4. the torch integration tests and the benchmark harness's smoke test (pytest with
#      /usr/bin/python3), when hooks/ is built.
# Usage: bash scripts/test.sh [--quick]   (--quick skips the sanitizer builds)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1

bash scripts/setup.sh
jobs=$(nproc)

echo "== build (RelWithDebInfo)"
cmake -G Ninja -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build -j"$jobs"
echo "== tests"
ctest --test-dir build --output-on-failure -j"$jobs"

if [ "$quick" -eq 0 ]; then
  echo "== ASan + UBSan: runtime and allocator unit tests"
  cmake -G Ninja -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTR_SANITIZE=address,undefined >/dev/null
  ninja -C build-asan -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan -L unit --output-on-failure -j"$jobs"

  echo "== TSan: multi-threaded tests"
  cmake -G Ninja -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTR_SANITIZE=thread >/dev/null
  ninja -C build-tsan -j"$jobs"
  TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan -L threads --output-on-failure
fi

if [ -d tests/hooks ] && [ -f build/lib/libdtr.so ]; then
  echo "== torch integration and benchmark smoke test (pytest)"
  /usr/bin/python3 -m pytest -q tests/hooks tests/bench
fi
echo "== all tests passed"

#!/usr/bin/env bash
# The host code under AddressSanitizer and UndefinedBehaviorSanitizer: a Debug build of the
# library, the test suite and the CLI into build-asan/ (portable sm_80 device code only, no
# Hopper path: the device code is not what this checks), then the CPU tests and the CPU demo.
# Any ASan or UBSan report fails the run (UBSan's -fsanitize=enum caught C-API validation reading
# out-of-range enum values through the enum type, session 14). GPU tests skip without a GPU; on a
# GPU machine run compute-sanitizer instead (scripts/gpu_suite.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
B=build-asan
SAN="-fsanitize=address -fsanitize=undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSA_BUILD_SM90=OFF \
  -DSA_PORTABLE_ARCHS=80-real -DCMAKE_CXX_FLAGS="$SAN -O1" \
  "-DCMAKE_CUDA_FLAGS=$(for f in $SAN; do printf -- '-Xcompiler=%s ' "$f"; done)" \
  -DCMAKE_EXE_LINKER_FLAGS="$SAN" -DCMAKE_SHARED_LINKER_FLAGS="$SAN" >/dev/null
ninja -C "$B" -j "${JOBS:-$(nproc)}" >"$B/build.log" 2>&1 || { tail -30 "$B/build.log"; exit 1; }
# protect_shadow_gap=0: the CUDA runtime maps memory where ASan's shadow gap would be.
export ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1
"$B/sa_tests" --gtest_brief=1
"$B/sparse-attention" demo --device cpu >/dev/null
echo "[sanitize_host] ASan + UBSan: tests and CPU demo clean"

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
# Adversarial flags (issue #37): each run exits 2 with its message and no sanitizer report.
for args in "--block 4294967296" "--block 2147483648" "--repeats 99999999999" \
    "--batch 1152921504606846977 --heads 1 --kv-heads 1 --density 0.25 --op bsa_bwd" \
    "--batch 4611686018427387905 --heads 1 --kv-heads 1 --op bsa_fwd" \
    "--dsa-queries 4611686018427387905 --dsa-heads 1 --dsa-dqk 512 --topk 4 --op dsa_fwd" \
    "--seq 9223372036854775807 --op bsa_fwd" "--topk 2147483648 --op dsa_fwd"; do
  rc=0
  # shellcheck disable=SC2086  # the flags split on purpose
  out=$("$B/sparse-attention" demo --device cpu $args 2>&1 >/dev/null) || rc=$?
  if [ "$rc" -ne 2 ] || grep -qE "Sanitizer|runtime error" <<<"$out"; then
    echo "[sanitize_host] demo $args: exit $rc"; echo "$out"; exit 1
  fi
done
echo "[sanitize_host] ASan + UBSan: tests, CPU demo and adversarial flags clean"

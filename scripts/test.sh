#!/usr/bin/env bash
# The test command: set-up, build, then every registered test (GPU tests skip without a GPU).
# ctest's full output goes to build/ctest.log; the console shows the failures' output and ends
# with one summary line, "ctest: N passed, M failed, K skipped". Extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
LOG=build/ctest.log
jobs="${JOBS:-$(nproc)}"
total=$(ctest --test-dir build -N "$@" | sed -n 's/^Total Tests: *//p')
echo "[test] running ${total:-the} tests (ctest -j $jobs); full output in $LOG"
set +e
ctest --test-dir build --output-on-failure -j "$jobs" "$@" >"$LOG" 2>&1
rc=$?
set -e
# One line per test: "  12/1124 Test  #12: Name ....   Passed   0.01 sec", "***Skipped",
# "***Failed", "***Timeout", "***Exception: ...", "Not Run".
result="^ *[0-9]+/[0-9]+ Test +#[0-9]+: "
passed=$(grep -c -E "$result.* Passed " "$LOG" || true)
skipped=$(grep -c -E "$result.*\*\*\*Skipped" "$LOG" || true)
failed=$(grep -E "$result" "$LOG" | grep -c -v -E " Passed |\*\*\*Skipped" || true)
if [ "$failed" -gt 0 ] || [ "$rc" -ne 0 ]; then
  # The failing tests' output (--output-on-failure), then their names.
  grep -v -E "^ +Start +[0-9]+: |$result.*( Passed |\*\*\*Skipped)" "$LOG" |
    awk '/^The following tests did not run:/ { skip = 1; next }
         skip && /^[ \t]/ { next }
         { skip = 0; print }' | tail -200
fi
if [ "$skipped" -gt 0 ]; then
  echo "[test] skipped: GPU tests (they skip themselves without a GPU, or without the GPU" \
       "their kernel needs); the list is in $LOG"
fi
echo "ctest: $passed passed, $failed failed, $skipped skipped"
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "[test] ctest failed (exit $rc); see $LOG" >&2
fi
exit "$rc"

#!/usr/bin/env bash
# One test binary's GPU check in a device call: a gtest filter in parallel shards, and
# compute-sanitizer's memcheck, racecheck and synccheck on a few cases beside them.
#
#   scripts/shard_check.sh TESTS FILTER SHARDS SANITIZER_CASES OUT
#
# TESTS: an sa_tests binary; FILTER: gtest filter of the suites; SHARDS: parallel processes;
# SANITIZER_CASES: gtest filter of the cases each tool runs (empty: no sanitizer); OUT: the
# folder for tests.log. Prints one summary line of the shards' results, the failed tests and each
# tool's summary and exit status. Exit status 0 (the caller reads the summary).
set -u
[ $# -eq 5 ] || { echo "usage: $0 TESTS FILTER SHARDS SANITIZER_CASES OUT" >&2; exit 2; }
bin=$1 filter=$2 shards=$3 cases=$4 out=$5
tmp=$(mktemp -d)
pids=()
for ((i = 0; i < shards; ++i)); do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout 280 "$bin" --gtest_brief=1 \
    --gtest_filter="$filter" > "$tmp/t_$i" 2>&1 & pids+=($!)
done
if [ -n "$cases" ]; then
  for tool in memcheck racecheck synccheck; do
    (timeout 280 compute-sanitizer --tool $tool --error-exitcode 9 "$bin" --gtest_brief=1 \
       --gtest_filter="$cases" > "$tmp/s_$tool.log" 2>&1
     echo "$tool rc=$?" >> "$tmp/s_$tool.log") & pids+=($!)
  done
fi
for p in "${pids[@]}"; do wait "$p"; done
mkdir -p "$out"
cat "$tmp"/t_* "$tmp"/s_*.log > "$out/tests.log" 2>/dev/null
echo "tests:" $(grep -hE "FAILED|PASSED|SKIPPED" "$tmp"/t_* | sort | uniq -c | tr '\n' ' ')
grep -hE "^\[  FAILED" "$tmp"/t_* | head -12
[ -n "$cases" ] && grep -hE "ERROR SUMMARY|rc=|RACECHECK SUMMARY" "$tmp"/s_*.log
rm -rf "$tmp"
exit 0

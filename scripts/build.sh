#!/usr/bin/env bash
# Configure and build (Release) into build/. Runs the set-up step first; safe to re-run.
# The console shows what is being built and its progress ([n/N]: one updating line on a
# terminal, a line every ~10% in a log); the full compiler output, with the ptxas resource report
# of every kernel (registers, shared memory, spills), is kept in build/build.log.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
JOBS="${JOBS:-$(nproc)}"
LOG=build/build.log
first=0
[ -f build/libsparse_attention.so ] || first=1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null

cache() { sed -n "s/^$1:[A-Z]*=//p" build/CMakeCache.txt; }
what="libsparse_attention.so (CUDA: portable path for $(cache SA_PORTABLE_ARCHS)"
[ "$(cache SA_BUILD_SM90)" = ON ] && what+=", Hopper path for $(cache SA_SM90_ARCHS)"
what+="), the sparse-attention CLI"
[ "$(cache SA_BUILD_TESTS)" = ON ] && what+=" and the test suite"
echo "[build] $what into build/, $JOBS jobs; compiler output in $LOG"
if [ "$first" = 1 ]; then
  echo "[build] a first build compiles every CUDA kernel: about 6 min on 2 cores"
fi

# ninja's "[n/N] Building ... src/x.cu.o" lines -> progress; everything -> the log.
progress() {
  local tty=0 shown=-1 n total pct name
  [ -t 1 ] && tty=1
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$LOG"
    [[ $line =~ ^\[([0-9]+)/([0-9]+)\]\ (.*)$ ]] || continue
    [[ ${BASH_REMATCH[3]} == Re-* ]] && continue  # CMake's own re-run, not the build
    n=${BASH_REMATCH[1]} total=${BASH_REMATCH[2]} name=${BASH_REMATCH[3]##* }
    name=${name#CMakeFiles/*.dir/}
    pct=$((100 * n / total))
    if [ "$tty" = 1 ]; then
      printf '\r[build] %3d%% [%d/%d] %s\033[K' "$pct" "$n" "$total" "${name%.o}"
    elif [ $((pct / 10)) -gt "$shown" ]; then
      shown=$((pct / 10))
      printf '[build] %3d%% [%d/%d] %s\n' "$pct" "$n" "$total" "${name%.o}"
    fi
  done
  if [ "$tty" = 1 ]; then printf '\r\033[K'; fi
}

: >"$LOG"
start=$SECONDS
set +e
ninja -C build -j "$JOBS" 2>&1 | progress
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
  # The failing commands and their messages, without the resource reports.
  sed -n '/^FAILED: /,$p' "$LOG" | grep -v -E "^ptxas info|bytes stack frame|^\[[0-9]+/[0-9]+\]" |
    head -80 >&2 || true
  echo "[build] failed (exit $rc); full log in $LOG" >&2
  exit "$rc"
fi
warnings=$(grep -c -E "warning[ :]" "$LOG" || true)
if grep -q "^ninja: no work to do" "$LOG"; then
  echo "[build] up to date"
else
  echo "[build] done in $((SECONDS - start)) s ($warnings warning lines in $LOG)"
fi

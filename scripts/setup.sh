#!/usr/bin/env bash
# One set-up step for a fresh machine: installs what the build needs into .deps/ (git-ignored).
#  * CUTLASS/CuTe headers from the pinned nvidia-cutlass PyPI package;
#  * GoogleTest from Debian when the machine lacks it.
# Idempotent: a second run does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

CUTLASS_VERSION=4.2.0.0
DEPS=.deps
CUTLASS_DIR="$DEPS/nvidia-cutlass-$CUTLASS_VERSION"

if [ ! -f "$CUTLASS_DIR/cutlass_library/source/include/cute/tensor.hpp" ]; then
  echo "[setup] installing nvidia-cutlass==$CUTLASS_VERSION into $CUTLASS_DIR"
  rm -rf "$CUTLASS_DIR"
  python3 -m pip install --quiet --no-deps --no-compile --disable-pip-version-check \
    --target "$CUTLASS_DIR" "nvidia-cutlass==$CUTLASS_VERSION"
fi

if [ ! -f /usr/include/gtest/gtest.h ] && [ ! -d /usr/src/googletest ]; then
  echo "[setup] installing GoogleTest (Debian libgtest-dev)"
  apt-get update -qq && apt-get install -y -qq libgtest-dev
fi

for tool in cmake nvcc g++; do
  command -v "$tool" >/dev/null || { echo "[setup] missing required tool: $tool" >&2; exit 1; }
done
if ! command -v ninja >/dev/null; then
  echo "[setup] installing ninja"
  apt-get update -qq && apt-get install -y -qq ninja-build
fi
echo "[setup] ok: CUTLASS headers in $CUTLASS_DIR/cutlass_library/source/include"

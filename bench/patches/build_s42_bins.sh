#!/usr/bin/env bash
# Builds the binaries bench/patches/s42-device-call.sh needs and packs them into
# .devcall/s42w.tar.xz: main's CLI (cli_main), then the patched CLI and test binary (cli_w3,
# t_w3), then reverts the patch and rebuilds main. Needs a configured Hopper build in build/
# (scripts/build.sh -DSA_BUILD_SM90=ON -DSA_BUILD_TESTS=ON -DSA_SM90_ARCHS=90a-real) and a clean
# work tree. About 5 minutes on 2 cores after a first build.
set -euo pipefail
cd "$(dirname "$0")/../.."
PATCH=bench/patches/s42-dsa-bwd-wg0-three-pieces.patch
git diff --quiet || { echo "work tree not clean" >&2; exit 1; }
tmp=$(mktemp -d)
mkdir -p "$tmp/bins" .devcall
ninja -C build sparse-attention sa_tests >/dev/null
cp build/sparse-attention "$tmp/bins/cli_main"
git apply "$PATCH"
trap 'git apply -R "$PATCH" 2>/dev/null || true' EXIT
ninja -C build sparse-attention sa_tests >/dev/null
cp build/sparse-attention "$tmp/bins/cli_w3"
cp build/sa_tests "$tmp/bins/t_w3"
git apply -R "$PATCH"
trap - EXIT
strip "$tmp/bins"/*
tar -C "$tmp" -cf - bins | xz -9 -T2 > .devcall/s42w.tar.xz
cp bench/patches/s42-device-call.sh .devcall/s42w.sh
rm -rf "$tmp"
ninja -C build sparse-attention sa_tests >/dev/null
ls -la .devcall/s42w.tar.xz
echo "carry .devcall/s42w.sh and .devcall/s42w.tar.xz; run: bash .devcall/s42w.sh"

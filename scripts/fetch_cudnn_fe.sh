#!/usr/bin/env bash
# Fetches cuDNN-frontend 1.32 (the anchor of issue 33) and the wheels it needs for Python 3.12 on
# x86-64 into .whl/ (git-ignored), packed for the GPU machine, whose calls carry at most 64 MiB
# with the working tree (about 15 MiB, growing with bench/results/logs):
#   .whl/cfe-a/   the files of the CUTLASS DSL's cu13 libraries wheel, tar.xz, first 44 MiB
#   .whl/cfe-b/   the rest of it (17 MiB) and every other wheel (28 MiB)
# The split point balances the two parts (~44 MiB each), so that each call keeps ~4 MiB beside
# the tree (session 45: with a 40 MiB split, cfe-b and a 15.2 MiB tree passed 64 MiB).
# Each folder holds MANIFEST (every file of the set with its sha256). Send cfe-a in one device
# call and cfe-b in the next, while the machine is still held (30 s after a call);
# scripts/cudnn_fe_env.sh, sourced in each call, gathers the parts under /tmp and installs the
# set once it is complete. Checks each wheel's Requires-Dist against the set (or the device's
# image, for the packages it already has).
set -euo pipefail
cd "$(dirname "$0")/.."
DL=.whl/cudnn_fe_dl
mkdir -p "$DL"
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64)
PKGS=(nvidia-cudnn-frontend==1.32.0 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
      nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1
      apache-tvm-ffi==0.1.15.post2 cuda-bindings==13.5.0 cuda-pathfinder==1.9.1
      torch-c-dlpack-ext==0.1.5)
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp "${PLAT[@]}" -d "$DL" "${PKGS[@]}"

# Requires-Dist: every requirement (no extras, Python >= 3.11) is in the set or is one the
# device's image holds (KINDS.md: protobuf, typing-extensions, torch).
have=" $(ls "$DL" | sed -E 's/-[0-9].*//; s/_/-/g' | tr 'A-Z' 'a-z' | tr '\n' ' ') protobuf typing-extensions torch "
missing=0
for w in "$DL"/*.whl; do
  while read -r req; do
    name=$(echo "$req" | sed -E 's/^Requires-Dist: *//; s/[ ;<>=!~\[].*//' | tr 'A-Z_' 'a-z-')
    case "$req" in *"extra =="*|*"python_version < \"3.11\""*) continue;; esac
    # nvidia-cutlass-dsl names the cu12 libraries; the cu13 ones replace them (the [cu13] extra).
    [ "$name" = nvidia-cutlass-dsl-libs-cu12 ] && continue
    [[ "$have" == *" $name "* ]] || { echo "missing requirement of $(basename "$w"): $req"; missing=1; }
  done < <(unzip -p "$w" '*.dist-info/METADATA' | grep '^Requires-Dist' || true)
done
[ $missing -eq 0 ] || { echo "[fetch_cudnn_fe] a requirement is missing from the set" >&2; exit 1; }

rm -rf .whl/cfe-a .whl/cfe-b
mkdir -p .whl/cfe-a .whl/cfe-b
big=$(ls "$DL"/nvidia_cutlass_dsl_libs_cu13-*.whl)
# A wheel is a deflate zip: xz over it gains little (92 -> 87 MiB). Its files, tarred and xz'd,
# take 61 MiB; a wheel's install is those files in site-packages, which the device side untars.
tmp=$(mktemp -d)
unzip -q "$big" -d "$tmp/site"
tar -C "$tmp/site" -cf - . | xz -9 -T2 > "$tmp/cu13.tar.xz"
split -b 44M -d "$tmp/cu13.tar.xz" .whl/cfe-b/cu13.tar.xz.part
rm -rf "$tmp"
mv .whl/cfe-b/cu13.tar.xz.part00 .whl/cfe-a/
for w in "$DL"/*.whl; do [ "$w" = "$big" ] || cp "$w" .whl/cfe-b/; done
( cd .whl && sha256sum cfe-a/* cfe-b/* | sed 's# cfe-[ab]/# #' ) > /tmp/cfe_manifest
cp /tmp/cfe_manifest .whl/cfe-a/MANIFEST; cp /tmp/cfe_manifest .whl/cfe-b/MANIFEST
du -sh .whl/cfe-a .whl/cfe-b
echo "[fetch_cudnn_fe] ok: carry .whl/cfe-a in one call, .whl/cfe-b in the next"

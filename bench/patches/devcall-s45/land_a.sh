#!/usr/bin/env bash
# (Copy into .devcall/ before use: the script runs from there.)
# Landing run, call 1 of 2 (carry .whl/cfe-a, .devcall/land.tar.xz and this script): stages
# cuDNN-FE part a and unpacks the library to land (land.tar.xz holds bins/lib.so: HEAD's
# build/libsparse_attention.so, xz'd; ~4.3 MiB, which fits beside cfe-a and the tree).
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/d && tar -xJf .devcall/land.tar.xz -C /tmp/d
source scripts/cudnn_fe_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $OUT/log.txt
ls -la /tmp/d/bins | tee -a $OUT/log.txt

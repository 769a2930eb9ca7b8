#!/usr/bin/env bash
# Session 44 call c (carry .whl/cfe-a and this script, right after call b on the same machine):
# stages cuDNN-FE part a.
set -u
cd "$(dirname "$0")/.."
source scripts/cudnn_fe_env.sh
ls /tmp/d/bins | tee $OUT/log.txt

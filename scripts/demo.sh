#!/usr/bin/env bash
# The main job: BSA and DSA forward and backward on a default problem, with a correctness summary,
# then (with no arguments, when this python3 has PyTorch) a DSA training step: attention with its
# lightning indexer, dense warm-up then sparse training (python/examples/dsa_train_step.py --check:
# the KL loss must fall and every gradient match an eager PyTorch layer).
# Builds first (scripts/build.sh), then runs `sparse-attention demo` with the arguments given
# (see --help). A first argument naming another command of the CLI runs that command instead:
#   ./scripts/demo.sh bench --op bsa_bwd --variants "impl=portable/impl=sm90"
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh >&2
case "${1:-}" in
  demo | bench | help) exec ./build/sparse-attention "$@" ;;
esac
rc=0
./build/sparse-attention demo "$@" || rc=$?
[ $# -eq 0 ] || exit "$rc"
echo
if python3 -c "import torch" 2>/dev/null; then
  echo "== DSA training step (python/examples/dsa_train_step.py --check, CPU)"
  SPARSE_ATTENTION_LIBRARY="$PWD/build/libsparse_attention.so" PYTHONPATH="$PWD/python" \
    python3 python/examples/dsa_train_step.py --check || rc=$?
else
  echo "== DSA training step: skipped (this python3 has no PyTorch; after pip install \".[test]\""
  echo "   run: python3 python/examples/dsa_train_step.py --check)"
fi
exit "$rc"

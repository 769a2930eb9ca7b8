# Sourced on the GPU machine (bash): gathers the cuDNN-frontend set that scripts/fetch_cudnn_fe.sh
# packed into .whl/cfe-a and .whl/cfe-b (carried in two back-to-back device calls: a call carries
# 64 MiB at most), installs it into /tmp/cudnn_fe/site once both parts have arrived, and then
# exports PYTHONPATH so that `import cudnn` works. /tmp outlives a call while the machine stays
# held (30 s after each call), so the part of the first call waits there for the second.
#   source scripts/cudnn_fe_env.sh   -> CUDNN_FE_READY=1 when the set is installed
CUDNN_FE_READY=0
_cfe=/tmp/cudnn_fe
mkdir -p "$_cfe/stage"
for _d in .whl/cfe-a .whl/cfe-b; do [ -d "$_d" ] && cp -n "$_d"/* "$_cfe/stage/" 2>/dev/null; done
if [ -f "$_cfe/site/.complete" ]; then
  CUDNN_FE_READY=1
elif [ -f "$_cfe/stage/MANIFEST" ] && (cd "$_cfe/stage" && sha256sum --quiet -c MANIFEST 2>/dev/null); then
  echo "[cudnn_fe] installing into $_cfe/site"
  rm -rf "$_cfe/site"; mkdir -p "$_cfe/site"
  # The wheels first: pip --target replaces a top-level folder that a wheel brings
  # (nvidia_cutlass_dsl/), so the cu13 files, which live in that folder, are untarred after.
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
       --target "$_cfe/site" "$_cfe"/stage/*.whl &&
     cat "$_cfe"/stage/cu13.tar.xz.part* | xz -dc | tar -C "$_cfe/site" -xf -; then
    touch "$_cfe/site/.complete"; CUDNN_FE_READY=1
  else
    echo "[cudnn_fe] install failed" >&2
  fi
else
  echo "[cudnn_fe] parts so far: $(cd "$_cfe/stage" && ls | tr '\n' ' ')"
fi
if [ "$CUDNN_FE_READY" = 1 ]; then
  # pip --target skips the .pth that puts the DSL's packages on the path.
  export PYTHONPATH="$_cfe/site:$_cfe/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}"
  echo "[cudnn_fe] ready: $(python3 -c 'import cudnn; print(cudnn.__version__)' 2>&1 | tail -1)"
fi
unset _cfe _d

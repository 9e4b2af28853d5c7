#!/usr/bin/env bash
# Create (once) and print the path of a CPU-only venv holding vllm==0.24.0, for the ReplaySSM
# integration tests and `vllm bench serve`. The venv lives OUTSIDE the clone, keyed by the pinned
# requirements, so CI and every clone on a machine reuse it.
#
#   bash tools/vllm_venv.sh          # last stdout line: the venv path; on failure one line on stderr, exit 1
#
# Why not `pip install vllm==0.24.0`: vllm pins torch==2.11.0 (a CUDA build, several GB with the nvidia-*
# wheels) plus flashinfer, cutlass and other CUDA-only packages. The pinned list beside this script is the
# small set that imports vllm's Python modules (config, model classes, Mamba layers, attention backends)
# on a CPU torch; everything is installed with --no-deps. vllm's compiled ops (vllm._C) do not load
# without CUDA; Triton kernels run in the interpreter (TRITON_INTERPRET=1 with CUDA_VISIBLE_DEVICES="").
# First build: about 1.5 min and 2.7 GB (measured on a 2-core machine).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REQ=$HERE/vllm-0.24.0-cpu.txt
SHIM=$HERE/vllm_cpu_torchvision.py  # lets the CUDA build of torchvision import on CPU torch (see the file)
PYTHON=${PYTHON:-python3}
CACHE=${REPLAYBENCH_CACHE:-$HOME/.cache/replaybench}
fail() { echo "error: vllm venv: $*" >&2; exit 1; }

[ -f "$REQ" ] || fail "pinned requirements $REQ missing; restore it from git"
PYVER=$("$PYTHON" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")') \
  || fail "no usable $PYTHON; set PYTHON=/path/to/python3.11+"
KEY=$(cat "$REQ" "$SHIM" "$HERE/vllm_venv.sh" | sha256sum | cut -c1-16)  # the pins and how they are installed
VENV=$CACHE/vllm-0.24.0-$PYVER-$KEY
STAMP=$VENV/.replaybench-complete

mkdir -p "$CACHE" || fail "cannot create cache dir $CACHE; set REPLAYBENCH_CACHE to a writable folder"
exec 9>"$CACHE/.vllm-venv.lock"
flock 9  # concurrent test runs wait for one builder instead of racing

if [ ! -f "$STAMP" ]; then
  rm -rf "$VENV"
  LOG=$CACHE/vllm-venv-build.log
  start=$(date +%s)
  {
    "$PYTHON" -m venv "$VENV" &&
      "$VENV/bin/python" -m pip install -q --no-deps --disable-pip-version-check -r "$REQ" &&
      SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') &&
      cp "$SHIM" "$SITE/" && echo "import vllm_cpu_torchvision" >"$SITE/vllm_cpu_torchvision.pth"
  } >"$LOG" 2>&1 || { rm -rf "$VENV"; fail "install failed (log: $LOG); check that PyPI is reachable"; }
  "$VENV/bin/python" -c "import vllm.model_executor.layers.mamba.mamba_mixer2, compressed_tensors, torchvision" \
    >>"$LOG" 2>&1 \
    || { rm -rf "$VENV"; fail "vllm does not import after install (log: $LOG)"; }
  echo "built $VENV in $(($(date +%s) - start)) s, $(du -sh "$VENV" | cut -f1)" >&2
  touch "$STAMP"
fi
echo "$VENV"

#!/usr/bin/env bash
# First GPU call after the bundle parts: install, start ReplaySSM (GPU 0), benchmark the kernels (GPU 1), start
# the baseline (GPU 1), smoke-replay a trace slice against ReplaySSM, and time decode on both with the
# calibration file's closed loop. Results come back as $OUT/probe.tgz; a table is printed at the end.
set -uo pipefail
cd "$(dirname "$0")/../.."
S="bash tools/gpu/session.sh"
RES=/tmp/gpu/out
trap '$S pack probe' EXIT
$S recv 3 > /dev/null
$S setup 2>&1 | tee "$RES/setup.log" | tail -4 || exit 1
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
$S serve candidate 0 8001 --additional-config '{"replayssm": {"enable": true, "buffer_len": 16, "split_precision": false}}'
CUDA_VISIBLE_DEVICES=1 timeout 200 python3 -m replayssm_patch.gpu.kernel_bench --out "$RES" > "$RES/kernel_bench.log" 2>&1
echo "kernel bench exit $?"; tail -30 "$RES/kernel_bench.md" 2>/dev/null
$S serve baseline 1 8000
if $S wait 240 8001; then
  timeout 120 python3 -m harness replay traces/azure-conv-2023.parquet --url http://127.0.0.1:8001 \
    --limit 400 --time-scale 0.25 -o "$RES/smoke-candidate.parquet" 2>&1 | tail -25
  $S decode 8001 candidate 256
else
  echo "candidate did not start:"; grep -iE "error|replayssm|Traceback" /tmp/gpu/candidate.log | tail -30
fi
$S wait 200 8000 && $S decode 8000 baseline 256

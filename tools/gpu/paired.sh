#!/usr/bin/env bash
# Issue 9 in GPU calls on a 2x H200 host (kind nvidia-h200-x2), after `session.sh recv 0..2` calls:
#   paired.sh start     recv part 3, install, start baseline (GPU 0, :8000) and ReplaySSM (GPU 1, :8001), wait,
#                       then run the paired experiment (stops itself at ~8.5 min; `resume` finishes it)
#   paired.sh resume    finish the paired experiment, then swap GPU 1 to a second baseline and time decode +
#                       `vllm bench serve` on the exported trace against the baseline while it starts
#   paired.sh aa        the A/A experiment on the two baselines; packs everything into $OUT/h200.tgz
# Every stage tees its log into /tmp/gpu/out, which `pack` sends back; servers run detached between calls.
set -uo pipefail
cd "$(dirname "$0")/../.."
S="bash tools/gpu/session.sh"
RES=/tmp/gpu/out RUNS=/tmp/gpu/runs
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
REPLAYSSM='{"replayssm": {"enable": true, "buffer_len": 16, "split_precision": false}}'
RB="python3 -m harness"
latest() { ls -td "$RUNS"/"$1"-2* 2>/dev/null | head -1; }
trap '$S pack h200' EXIT

case ${1:-} in
  start)
    $S recv 3 > /dev/null
    $S setup 2>&1 | tee "$RES/setup.log" | tail -4 || exit 1
    $S serve baseline 0 8000
    $S serve candidate 1 8001 --additional-config "$REPLAYSSM"
    $S wait 300 8000 8001 || { grep -iE "replayssm|error" /tmp/gpu/candidate.log | tail -20; exit 1; }
    $RB check configs/h200-nemotron-h-8b.toml 2>&1 | tee "$RES/check.log"
    timeout 330 $RB run --config configs/h200-nemotron-h-8b.toml --output-dir "$RUNS" 2>&1 | tee "$RES/run.log" | tail -30
    ;;
  resume)
    run=$(latest h200-nemotron-h-8b)
    [ -f "$run/decision.json" ] || timeout 400 $RB run --resume "$run" 2>&1 | tee -a "$RES/run.log" | tail -30
    $S decode 8001 candidate 64 128 256
    $S stop candidate
    $S serve baseline-b 1 8001
    $S decode 8000 baseline 64 128 256
    $RB slice traces/azure-conv-2023.parquet --start 600 --duration 190 --time-scale 0.32 -o "$RES/slice.parquet"
    $RB export "$RES/slice.parquet" --format vllm-timed -o "$RES/timed.jsonl" 2>&1 | tee "$RES/export.log"
    # the export prints the matching `vllm bench serve --dataset-name timed_trace ...` line: run it on :8000
    cmd=$(grep -o 'vllm bench serve.*' "$RES/export.log" | head -1)
    [ -n "$cmd" ] && timeout 150 python3 -m vllm.entrypoints.cli.main ${cmd#vllm } --base-url http://127.0.0.1:8000 \
      --model m --tokenizer /tmp/model --save-result --result-dir "$RES" --result-filename peer-timed.json \
      > "$RES/peer-timed.log" 2>&1; tail -25 "$RES/peer-timed.log"
    ;;
  aa)
    $S wait 300 8001 || exit 1
    timeout 420 $RB run --config configs/h200-nemotron-h-8b-aa.toml --output-dir "$RUNS" 2>&1 | tee "$RES/aa.log" | tail -30
    cp -r "$(latest h200-nemotron-h-8b)" "$(latest h200-nemotron-h-8b-aa)" "$RES/" 2>/dev/null
    ;;
  *) echo "usage: paired.sh start|resume|aa"; exit 2 ;;
esac

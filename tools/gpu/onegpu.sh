#!/usr/bin/env bash
# Issues 13 and 14 on ONE H200 (kind nvidia-h200) in three calls, after `session.sh recv 0..2` calls. Both arms in
# vLLM's default compile mode. Each stage keeps inside one call's 10 minutes (CALL_S, default 585 s):
#   onegpu.sh pace     recv part 3, install; engine-side decode step of the baseline (LLM.generate, batch 64 and
#                      256, GPU memory share 0.45); the baseline served at 0.45 on :8000 and its client-seen decode
#                      pace through `replaybench replay` at 64 and 256 streams, 1 and 4 workers; the recorder's
#                      quick bench. The baseline stays up for `ab`.
#   onegpu.sh ab       ReplaySSM fp32 started at 0.45 on :8001 beside it while the baseline's capacity is measured
#                      on the A/B slice; then the ABBA A/B at 65 % of that capacity until the call's time is up
#   onegpu.sh resume   finish the A/B (`run --resume`)
#   onegpu.sh aa       instead of `ab` (a session of its own): a second baseline at 0.45 on :8001, the baseline's
#                      capacity, then the A/A at 65 % of it (`AA=1 onegpu.sh resume` finishes it)
# Every stage tees its log into /tmp/gpu/out, which `pack` sends back as $OUT/<stage>.tgz.part*; servers run detached.
set -uo pipefail
cd "$(dirname "$0")/../.."
export MODE=default
S="bash tools/gpu/session.sh"
RES=/tmp/gpu/out RUNS=/tmp/gpu/runs
export PYTHONPATH=/tmp/site:/tmp/rb-site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
NAME=h200-1gpu-nemotron-h-8b${AA:+-aa}
CONFIG=configs/$NAME.toml
FP32=$(python3 -m replayssm_patch.gpu.variants replayssm_fp32)
RB="python3 -m harness"
CALL_S=${CALL_S:-585}
left() { echo $((CALL_S - SECONDS)); }
latest() { ls -td "$RUNS"/"$1"-2* 2>/dev/null | head -1; }
mkdir -p "$RES" "$RUNS"
trap '$S pack "${STAGE:-onegpu}"; echo "call used ${SECONDS}s"' EXIT

finish_ab() {  # run (or resume) the A/B with what is left of this call
  local run; run=$(latest "$NAME")
  if [ -z "$run" ]; then
    timeout $(($(left) - 15)) $RB run --config "$CONFIG" --output-dir "$RUNS" 2>&1 | tee -a "$RES/ab.log" | tail -30
  elif [ ! -f "$run/decision.json" ]; then
    timeout $(($(left) - 15)) $RB run --resume "$run" 2>&1 | tee -a "$RES/ab.log" | tail -30
  fi
  run=$(latest "$NAME")
  [ -n "$run" ] && rm -rf "$RES/$NAME" && cp -r "$run" "$RES/$NAME"
}

case ${1:-} in
  pace)
    STAGE=pace
    $S recv 3 > /dev/null
    $S setup 2>&1 | tee "$RES/setup.log" | tail -4
    [ -d /tmp/site/vllm ] || exit 1
    # the engine side at the A/B's memory share (0.45), so the server measured next has the same KV capacity
    ENGINE_UTIL=0.45 ENGINE_TIMEOUT_S=300 $S engine baseline 0 64,256
    SERVE_UTIL=0.45 $S serve baseline 0 8000
    $S wait 240 8000 || { $S diagnose baseline; exit 1; }
    grep -h "Maximum concurrency" /tmp/gpu/baseline.log
    PACE_TIMEOUT_S=150 $S pace 8000 baseline 64,256
    # the recorder's added latency on this quiet 16-core host (the baseline server stays up, idle, for `ab`)
    timeout 120 python3 -m bench.bench_record --quick --out "$RES" > "$RES/bench_record.log" 2>&1
    echo "bench_record exit $?"; tail -12 "$RES/bench_record.log"
    ;;
  ab | aa)
    STAGE=$1
    [ "$1" = aa ] && { NAME=h200-1gpu-nemotron-h-8b-aa; CONFIG=configs/$NAME.toml; }
    $S wait 60 8000 || { $S diagnose baseline; exit 1; }
    if [ "$1" = aa ]; then SERVE_UTIL=0.45 $S serve candidate 0 8001; else
      SERVE_UTIL=0.45 $S serve candidate 0 8001 --additional-config "$FP32"; fi
    # the baseline's capacity on the slice and SLO while the candidate starts (after its profiling run its
    # start-up barely loads the GPU); bounds around the 0.31 time scale measured on 2026-12-01
    timeout 300 $RB capacity --config "$CONFIG" --arm baseline --repeats 1 --min-scale 0.22 --max-scale 0.45 \
      --tolerance 0.2 --output-dir "$RUNS" 2>&1 | tee "$RES/capacity.log" | tail -12
    cap=$(latest "$NAME-capacity")
    [ -f "$cap/capacity.json" ] || exit 1
    cp -r "$cap" "$RES/capacity-run"
    sed -i "s|^capacity = .*|capacity = \"$cap\"|" "$CONFIG"
    $S wait 240 8001 || { $S diagnose candidate; exit 1; }
    grep -h "ReplaySSM active\|Maximum concurrency" /tmp/gpu/candidate.log
    $RB check "$CONFIG" 2>&1 | tee "$RES/check.log" | grep -v "^  ok"
    finish_ab
    ;;
  resume)
    STAGE=resume
    finish_ab
    ;;
  *) echo "usage: onegpu.sh pace|ab|aa|resume"; exit 2 ;;
esac

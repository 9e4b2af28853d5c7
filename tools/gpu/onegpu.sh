#!/usr/bin/env bash
# Issues 13-16 on ONE H200 (kind nvidia-h200), after `session.sh recv 0..2` calls. Both arms in vLLM's default compile
# mode. Each stage keeps inside one call's 10 minutes (CALL_S, default 585 s):
#   onegpu.sh pace     recv part 3, install; engine-side decode step of the baseline (LLM.generate, batch 64 and
#                      256, GPU memory share 0.45); the baseline served at 0.45 on :8000 and its client-seen decode
#                      pace through `replaybench replay` at 64 and 256 streams, 1 and 4 workers; the recorder's
#                      quick bench (Nemotron only: it does not depend on the model). The baseline stays up for `ab`.
#   onegpu.sh ab       (on a fresh host: recv part 3, install, the baseline at 0.45 on :8000 first) ReplaySSM fp32
#                      started at 0.45 on :8001 beside it while the baseline's capacity is measured on the A/B slice;
#                      then the ABBA A/B at 65 % of that capacity until the call's time is up
#   onegpu.sh resume   finish the A/B (`run --resume`); once it is done, the candidate's capacity beside the baseline's
#                      in the run's capacity.json and the report again (with CAND_CAP_S, 240 s, of the call left)
#   onegpu.sh aa       instead of `ab` (a session of its own): a second baseline at 0.45 on :8001, the baseline's
#                      capacity, then the A/A at 65 % of it (`AA=1 onegpu.sh resume` finishes it); Nemotron only
#   onegpu.sh agree    greedy cross-arm agreement (issue 15): with the baseline up on :8000 and ReplaySSM fp32 on :8001
#                      (started at 0.45 if not up), `replaybench agree` of AGREE_REQUESTS (64) random prompts, each
#                      answered with exactly 512 tokens by both: baseline vs ReplaySSM -> agree-<model>.json, then,
#                      with the time left, baseline vs itself (the floor set by the engine alone) -> agree-<model>-aa.json
#   onegpu.sh moe      qwen3.5-35b-a3b served with the plugin (issue 16), the GPU to itself: install if needed, stop
#                      the 0.45 servers, ReplaySSM fp32 at 0.85 on :8002, a MOE_S-second (60) slice of the A/B trace
#                      replayed with exact output lengths -> served-qwen3.5-35b-a3b.json (zero errors, exact lengths,
#                      the plugin active); a server still starting when the call ends is waited for by the next `moe`
# MODEL=nemotron (default, Nemotron-H-8B) or MODEL=qwen35 (qwen3.5-4b, configs/h200-1gpu-qwen3.5-4b.toml) picks the
# model of pace, ab, resume and agree; MODEL=mtp (issue 17: Nemotron-H-8B with its MTP layer, both servers speculating
# with MTP k = 3 at synthetic AL 3.0, configs/h200-1gpu-nemotron-h-8b-mtp.toml) the spec-decode A/B and agreement of
# native vs ReplaySSM speculation; CAP_MIN/CAP_MAX override the capacity search's time-scale bounds, CAP_TOL its
# tolerance (0.2), CAP_EXPAND how often it may step past a bound that did not bracket the capacity (2); MIN_RUN_S
# (120) is the least of a call left in which the A/B starts or resumes a replay.
# Every stage tees its log into /tmp/gpu/out, which `pack` sends back as $OUT/<stage>.tgz.part*; servers run detached.
set -uo pipefail
cd "$(dirname "$0")/../.."
export MODE=default MODEL=${MODEL:-nemotron}
S="bash tools/gpu/session.sh"
RES=/tmp/gpu/out RUNS=/tmp/gpu/runs
export PYTHONPATH=/tmp/site:/tmp/rb-site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
# the capacity search's time-scale bounds: around the 0.31 measured for Nemotron-H-8B on 2026-12-01; qwen3.5-4b has
# half the weights and half the recurrent state to read per step, so its capacity is expected near twice as high
case $MODEL in
  nemotron) SHAPE=nemotron-h-8b SCALES=(0.22 0.45) ;;
  qwen35) SHAPE=qwen3.5-4b SCALES=(0.10 0.32) ;;
  # native speculation at 0.45 held 0.311 on 2026-12-04 (it fails where its KV cache fills, ~101 requests)
  mtp) SHAPE=nemotron-h-8b-mtp SCALES=(0.2 0.36) ;;
  *) [ "${1:-}" = moe ] || { echo "MODEL=$MODEL: onegpu.sh takes MODEL=nemotron, MODEL=qwen35 or MODEL=mtp"; exit 2; } ;;
esac
NAME=h200-1gpu-${SHAPE:-}${AA:+-aa}
CONFIG=configs/$NAME.toml
FP32=$(python3 -m replayssm_patch.gpu.variants replayssm_fp32)
RB="python3 -m harness"
CALL_S=${CALL_S:-585}
left() { echo $((CALL_S - SECONDS)); }
latest() { ls -td "$RUNS"/"$1"-2* 2>/dev/null | head -1; }
up() { $S wait 1 "$1" > /dev/null 2>&1; }  # a healthy server answers on port $1
starting() { pgrep -f -- "--port $1" > /dev/null; }  # a server process on port $1 (up or still starting)
mkdir -p "$RES" "$RUNS"
trap '$S pack "${STAGE:-onegpu}"; echo "call used ${SECONDS}s"' EXIT

install() {  # the last bundle part (carried in this call), vLLM and this checkout's plugin, the model dirs
  $S recv 3 > /dev/null
  $S setup 2>&1 | tee "$RES/setup.log" | tail -4
  [ -d /tmp/site/vllm ]
}

start_baseline() {  # on a fresh host: install, then the baseline at 0.45 on :8000 (the candidate starts once it is up)
  up 8000 && return 0
  [ -d /tmp/site/vllm ] || install || return 1
  SERVE_UTIL=0.45 $S serve baseline 0 8000
  $S wait 300 8000 || { $S diagnose baseline; return 1; }
}

start_candidate() {  # ReplaySSM fp32 at 0.45 on :8001 (ARGS: extra server flags), unless a server is up there
  up 8001 && { echo "a server is up on :8001 already"; return 0; }
  starting 8001 && { echo "a server is starting on :8001 already"; return 0; }
  SERVE_UTIL=0.45 $S serve candidate 0 8001 "$@"
}

gpu_released() {  # wait (up to 30 s) until stopped servers have given their GPU memory back
  local used
  for _ in $(seq 15); do
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
    [ "${used:-0}" -lt 2048 ] && return 0
    sleep 2
  done
  echo "GPU 0 still holds ${used} MiB"
}

finish_ab() {  # run (or resume) the A/B with what is left of this call, unless too little is left for one replay
  local run; run=$(latest "$NAME")
  if [ "$(left)" -lt "${MIN_RUN_S:-120}" ]; then
    echo "${SECONDS}s used: too little of the call left for a replay, the next resume starts it"
  elif [ -z "$run" ]; then
    timeout $(($(left) - 15)) $RB run --config "$CONFIG" --output-dir "$RUNS" 2>&1 | tee -a "$RES/ab.log" | tail -30
  elif [ ! -f "$run/decision.json" ]; then
    timeout $(($(left) - 15)) $RB run --resume "$run" 2>&1 | tee -a "$RES/ab.log" | tail -30
  fi
  run=$(latest "$NAME")
  [ -n "$run" ] && [ -f "$run/decision.json" ] && candidate_capacity "$run"
  [ -n "$run" ] && rm -rf "${RES:?}/$NAME" && cp -r "$run" "$RES/$NAME"
}

search_capacity() {  # SECONDS LOG ARGS: `replaybench capacity`, one replay per probe, this script's tolerance and steps
  local seconds=$1 log=$2; shift 2
  timeout "$seconds" $RB capacity --repeats 1 --tolerance "${CAP_TOL:-0.2}" --expand "${CAP_EXPAND:-2}" "$@" 2>&1 \
    | tee -a "$RES/$log" | tail -12
}

candidate_capacity() {  # RUN: once the A/B is done, the candidate's capacity on the same servers beside the
  # baseline's in RUN/capacity.json (from the baseline's scale down: a candidate is searched for more capacity), then
  # the report again; only with CAND_CAP_S (240) of the call left, and once
  grep -q '"candidate"' "$1/capacity.json" 2>/dev/null && return 0
  [ "$(left)" -ge "${CAND_CAP_S:-240}" ] || { echo "the candidate's capacity: next call"; return 0; }
  local scales; scales=$(python3 -c 'import json, sys
top = json.load(open(sys.argv[1]))["baseline"]["time_scale_at_capacity"]
print(top, round(top * 0.64, 4))' "$1/capacity.json") || return 0
  set -- "$1" $scales  # RUN, the baseline's time scale at capacity, 0.64 of it
  search_capacity $(($(left) - 40)) capacity-candidate.log --run-dir "$1" --arm candidate --max-scale "$2" \
    --min-scale "$3"
  $RB report "$1" 2>&1 | tail -2
}

agree() {  # NAME BASELINE_PORT CANDIDATE_PORT: `replaybench agree` within what is left of the call
  timeout $(($(left) - 10)) $RB agree --baseline "http://127.0.0.1:$2" --candidate "http://127.0.0.1:$3" \
    --requests "${AGREE_REQUESTS:-64}" --tokens 512 --out "$RES/$1.json" 2>&1 | tee -a "$RES/agree.log"
}

case ${1:-} in
  pace)
    STAGE=pace
    install || exit 1
    # the engine side at the A/B's memory share (0.45), so the server measured next has the same KV capacity
    ENGINE_UTIL=0.45 ENGINE_TIMEOUT_S=300 $S engine baseline 0 64,256
    start_baseline || exit 1
    grep -h "Maximum concurrency" /tmp/gpu/baseline.log
    PACE_TIMEOUT_S=150 $S pace 8000 baseline 64,256
    if [ "$MODEL" = nemotron ]; then
      # the recorder's added latency on this quiet 16-core host (the baseline server stays up, idle, for `ab`)
      timeout 120 python3 -m bench.bench_record --quick --out "$RES" > "$RES/bench_record.log" 2>&1
      echo "bench_record exit $?"; tail -12 "$RES/bench_record.log"
    fi
    ;;
  ab | aa)
    STAGE=$1
    if [ "$1" = aa ]; then
      [ "$MODEL" = nemotron ] || { echo "onegpu.sh aa: only configs/h200-1gpu-nemotron-h-8b-aa.toml exists"; exit 2; }
      NAME=h200-1gpu-nemotron-h-8b-aa CONFIG=configs/h200-1gpu-nemotron-h-8b-aa.toml
    fi
    start_baseline || exit 1
    if [ "$1" = aa ]; then start_candidate; else start_candidate --additional-config "$FP32"; fi
    # the baseline's capacity on the slice and SLO while the candidate starts (after its profiling run its
    # start-up barely loads the GPU); searched once per host: a second `ab` on this host keeps the one found
    cap=$(latest "$NAME-capacity")
    if [ ! -f "$cap/capacity.json" ]; then
      cap_s=$(($(left) - 20)); [ "$cap_s" -gt 300 ] && cap_s=300
      search_capacity "$cap_s" capacity.log --config "$CONFIG" --arm baseline --min-scale "${CAP_MIN:-${SCALES[0]}}" \
        --max-scale "${CAP_MAX:-${SCALES[1]}}" --output-dir "$RUNS"
      cap=$(latest "$NAME-capacity")
      [ -f "$cap/capacity.json" ] || { echo "no capacity within the call: run ab again on this host"; exit 1; }
      rm -rf "$RES/capacity-run" && cp -r "$cap" "$RES/capacity-run"
    fi
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
  agree)
    STAGE=agree
    start_baseline || exit 1
    start_candidate --additional-config "$FP32"
    $S wait $(($(left) - 90)) 8001 || { $S diagnose candidate; exit 1; }
    grep -q "ReplaySSM active" /tmp/gpu/candidate.log || { echo ":8001 is not ReplaySSM (candidate.log)"; exit 1; }
    agree "agree-$SHAPE" 8000 8001
    if [ "$(left)" -gt 60 ]; then agree "agree-$SHAPE-aa" 8000 8000; fi
    ;;
  moe)
    STAGE=moe
    export MODEL=qwen35moe
    [ -d /tmp/site/vllm ] || install || exit 1
    [ -f "$RES/moe-slice.parquet" ] || $RB slice traces/azure-conv-2023.parquet --start 600 --duration "${MOE_S:-60}" \
      -o "$RES/moe-slice.parquet" | tail -1
    if ! up 8002 && ! starting 8002; then  # neither up nor starting
      $S stop candidate; $S stop baseline; gpu_released  # the GPU to itself
      SERVE_UTIL=0.85 $S serve candidate-moe 0 8002 --additional-config "$FP32"
    fi
    if ! $S wait $(($(left) - 150)) 8002; then  # still starting: exit 75 (EX_TEMPFAIL) so that a queue runs it again
      starting 8002 && { echo ":8002 still starting: run moe again"; exit 75; }
      $S diagnose candidate-moe; exit 1
    fi
    grep -h "ReplaySSM active\|GPU KV cache size\|Maximum concurrency" /tmp/gpu/candidate-moe.log
    timeout $(($(left) - 20)) $RB replay "$RES/moe-slice.parquet" --url http://127.0.0.1:8002 --workers auto \
      -o "$RES/moe-replay.parquet" 2>&1 | tee "$RES/moe-replay.log" | grep -v "━"
    python3 -m replayssm_patch.gpu.served_replay "$RES/moe-replay.parquet" --model-dir /tmp/model-qwen35moe \
      --variant replayssm_fp32 --mode "$MODE" --server-log /tmp/gpu/candidate-moe.log --out "$RES/served-qwen3.5-35b-a3b.json"
    ;;
  *) echo "usage: [MODEL=nemotron|qwen35|mtp] onegpu.sh pace|ab|aa|resume|agree, or onegpu.sh moe"; exit 2 ;;
esac

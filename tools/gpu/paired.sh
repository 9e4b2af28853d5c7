#!/usr/bin/env bash
# Issues 8 and 9 in three GPU calls on a 2x H200 host (kind nvidia-h200-x2), after `session.sh recv 0..2` calls.
# Each stage keeps inside one call's 10 minutes (CALL_S, default 585 s) and skips what no longer fits:
#   paired.sh start    recv part 3, install, start baseline (GPU 0, :8000) and ReplaySSM fp32 (GPU 1, :8001),
#                      check, then the paired experiment until the call's time is up (`resume` finishes it)
#   paired.sh resume   finish the paired run; client decode pace of ReplaySSM fp32; then in parallel:
#                        GPU 1: ReplaySSM split precision start + its decode pace, then the second baseline starts
#                        GPU 0: baseline decode pace, `vllm bench serve` on the exported trace, kernel benchmark
#   paired.sh aa [N]   the A/A experiment (baseline vs baseline, N repeats, default the config's); packs all
#   paired.sh rerun [N]  one call after a plugin change (instead of start/resume/aa): recv part 3, install, the
#                      GPU layer check, both servers, a paired run of N repeats (default 3), decode paces
#   paired.sh steps [VARIANT...]  one call after `session.sh recv 0..2` (no servers): recv part 3, install, then
#                      the engine-side decode step (engine_step.py, ENGINE_UTIL 0.85 as in the calibration) of the
#                      variants (default all three) at batch 64 and 256 in MODE (default O0; MODE=default for
#                      vLLM's compile mode), one engine per GPU at a time; an engine takes ~2-5 min, so a call
#                      holds about two per GPU
# "Decode pace" is bench/decode_pace.py through `session.sh pace`; decode-step figures are engine_step.py's.
# Every stage tees its log into /tmp/gpu/out, which `pack` sends back as $OUT/h200.tgz; servers run detached.
set -uo pipefail
cd "$(dirname "$0")/../.."
S="bash tools/gpu/session.sh"
RES=/tmp/gpu/out RUNS=/tmp/gpu/runs
export PYTHONPATH=/tmp/site:/tmp/rb-site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
FP32=$(python3 -m replayssm_patch.gpu.variants replayssm_fp32)
SPLIT=$(python3 -m replayssm_patch.gpu.variants replayssm_split)
RB="python3 -m harness"
CALL_S=${CALL_S:-585}
left() { echo $((CALL_S - SECONDS)); }
latest() { ls -td "$RUNS"/"$1"-2* 2>/dev/null | head -1; }
finish_paired() {  # run (or resume) the paired experiment with what is left of this call
  local run; run=$(latest h200-nemotron-h-8b)
  if [ -z "$run" ]; then
    timeout $(($(left) - 10)) $RB run --config configs/h200-nemotron-h-8b.toml --output-dir "$RUNS" 2>&1 \
      | tee -a "$RES/run.log" | tail -25
  elif [ ! -f "$run/decision.json" ]; then
    timeout $(($(left) - 10)) $RB run --resume "$run" 2>&1 | tee -a "$RES/run.log" | tail -25
  fi
}
install() {  # the last bundle part, then vLLM and this checkout's plugin
  $S recv 3 > /dev/null
  $S setup 2>&1 | tee "$RES/setup.log" | tail -4
  [ -d /tmp/site/vllm ]
}
install_and_start_pair() {  # install, then baseline (GPU 0, :8000) and ReplaySSM (GPU 1, :8001)
  install || return 1
  $S serve baseline 0 8000
  $S serve candidate 1 8001 --additional-config "$FP32"
}
mkdir -p "$RES"
trap '$S pack h200; echo "call used ${SECONDS}s"' EXIT

case ${1:-} in
  start)
    install_and_start_pair || exit 1
    $S wait 330 8000 8001 || { $S diagnose candidate; $S diagnose baseline; exit 1; }
    grep -h "ReplaySSM active\|Setting attention block size\|Maximum concurrency" /tmp/gpu/candidate.log /tmp/gpu/baseline.log
    $RB check configs/h200-nemotron-h-8b.toml 2>&1 | tee "$RES/check.log" | grep -v "^  ok"
    finish_paired
    ;;
  resume)
    finish_paired
    cp -r "$(latest h200-nemotron-h-8b)" "$RES/" 2>/dev/null
    $S pace 8001 replayssm_fp32
    $S stop candidate
    $S serve candidate-split 1 8001 --additional-config "$SPLIT"
    (  # GPU 0 while the split server starts on GPU 1
      $S pace 8000 baseline
      $RB slice traces/azure-conv-2023.parquet --start 600 --duration 150 --time-scale 0.32 -o "$RES/slice.parquet"
      $RB export "$RES/slice.parquet" --format vllm-timed -o "$RES/timed.jsonl" > "$RES/export.log" 2>&1
      # the export prints the matching `vllm bench serve --dataset-name timed_trace ...` line: run it on :8000
      cmd=$(grep -o 'vllm bench serve.*' "$RES/export.log" | head -1)
      [ -n "$cmd" ] && timeout 150 python3 -m vllm.entrypoints.cli.main ${cmd#vllm } --base-url http://127.0.0.1:8000 \
        --model m --tokenizer /tmp/model --save-result --result-dir "$RES" --result-filename peer-timed.json \
        > "$RES/peer-timed.log" 2>&1
      tail -22 "$RES/peer-timed.log"
      CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m replayssm_patch.gpu.kernel_bench --out "$RES/kernels" \
        > "$RES/kernel_bench.log" 2>&1
      echo "kernel bench exit $?"; grep -A4 "## Layer-level" "$RES/kernels/kernel_bench.md"
    ) > "$RES/gpu0.log" 2>&1 &
    gpu0=$!
    if $S wait 240 8001; then $S pace 8001 replayssm_split; else $S diagnose candidate-split; fi
    $S stop candidate-split
    $S serve baseline-b 1 8001
    wait $gpu0; cat "$RES/gpu0.log"
    ;;
  aa)
    $S wait 300 8001 || { $S diagnose baseline-b; exit 1; }
    [ -n "${2:-}" ] && sed -i "s/^repeats = .*/repeats = $2/" configs/h200-nemotron-h-8b-aa.toml
    timeout $(($(left) - 15)) $RB run --config configs/h200-nemotron-h-8b-aa.toml --output-dir "$RUNS" 2>&1 \
      | tee "$RES/aa.log" | tail -25
    cp -r "$(latest h200-nemotron-h-8b)" "$(latest h200-nemotron-h-8b-aa)" "$RES/" 2>/dev/null
    ;;
  rerun)  # after a plugin change, in one call: GPU layer check, both servers, a paired run, decode timings
    install_and_start_pair || exit 1
    # on GPU 0 while the servers start (a few GB beside the baseline's start-up)
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m replayssm_patch.gpu.layer_check --model /tmp/model \
      --out "$RES/layer" > "$RES/layer_check.log" 2>&1; tail -6 "$RES/layer_check.log"
    $S wait 300 8000 8001 || { $S diagnose candidate; $S diagnose baseline; exit 1; }
    $S pace 8000 baseline & timing=$!
    $S pace 8001 replayssm_fp32
    wait $timing
    timeout $(($(left) - 15)) $RB run --config configs/h200-nemotron-h-8b.toml --repeats "${2:-3}" \
      --output-dir "$RUNS" 2>&1 | tee "$RES/run.log" | tail -22
    cp -r "$(latest h200-nemotron-h-8b)" "$RES/" 2>/dev/null
    ;;
  steps)  # engine side only: one engine per GPU at a time, the variants queued over the GPUs
    install || exit 1
    gpus=$(nvidia-smi -L | wc -l)
    variants=("${@:2}")
    [ ${#variants[@]} -gt 0 ] || variants=(baseline replayssm_fp32 replayssm_split)
    for g in $(seq 0 $((gpus - 1))); do
      (for i in $(seq "$g" "$gpus" $((${#variants[@]} - 1))); do
        ENGINE_UTIL=${ENGINE_UTIL:-0.85} ENGINE_TIMEOUT_S=$(($(left) - 20)) $S engine "${variants[$i]}" "$g"
      done) 2>&1 | tee -a "$RES/steps.log" &
    done
    wait
    ;;
  *) echo "usage: paired.sh start|resume|aa [REPEATS]|rerun [REPEATS]|steps [VARIANT...]"; exit 2 ;;
esac

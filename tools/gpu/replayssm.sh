#!/usr/bin/env bash
# Issue 15 on ONE H200 (kind nvidia-h200), after `session.sh recv 0..2` calls; vLLM's default compile mode.
#   replayssm.sh kernels            recv part 3, install; the kernel bench (2,000-step equivalence at batch 256 vs
#                                   vLLM's SSU, launch-shape sweep, timing at 64/128/256, registers); its fastest
#                                   shapes go to $RES/kernel_bench/launch_config.json for the engine runs
#   replayssm.sh engine VARIANT [profile]
#                                   engine-side decode step of VARIANT at batch 1..256 (LLM.generate, the GPU to
#                                   itself at 0.85), with the tuned shapes; then, with what is left of the call, the
#                                   step profile at 64 and 256
#   replayssm.sh spec ARM [BATCHES]
#                                   issue 17: speculative decoding on the engine (spec_step.py) of ARM (native_standard
#                                   native_spec replayssm_standard replayssm_spec) on /tmp/model-mtp at BATCHES
#                                   [64,128,256], the tuned shapes, k = SPEC_TOKENS [3]; a spec arm at SWEEP_AL [3.0],
#                                   one engine per AL, none started in the call's last 120 s (SPEC_BUDGET_S)
# Every stage keeps inside one call (CALL_S, default 585 s) and tars /tmp/gpu/out to $OUT at the end.
set -uo pipefail
cd "$(dirname "$0")/../.."
export MODE=default ENGINE_UTIL=0.85 MAX_LEN=2048
S="bash tools/gpu/session.sh"
RES=/tmp/gpu/out
export PYTHONPATH=/tmp/site:/tmp/rb-site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
CALL_S=${CALL_S:-585}
TUNED=$RES/kernel_bench/launch_config.json
mkdir -p "$RES"
trap '$S pack "${STAGE:-replayssm}"; echo "call used ${SECONDS}s"' EXIT

case ${1:-} in
  kernels)
    STAGE=kernels
    $S recv 3 > /dev/null
    $S setup 2>&1 | tee "$RES/setup.log" | tail -4
    [ -d /tmp/site/vllm ] || exit 1
    timeout $((CALL_S - SECONDS - 20)) python3 -m replayssm_patch.gpu.kernel_bench --out "$RES/kernel_bench" \
      2>&1 | tee "$RES/kernel_bench.log" | grep -v "^\[kernel_bench\]   step"
    ;;
  engine)
    STAGE=engine-$2
    [ -f "$TUNED" ] && export REPLAYSSM_LAUNCH_CONFIG=$TUNED && echo "launch shapes: $(tr -d '\n ' < "$TUNED")"
    ENGINE_TIMEOUT_S=$((CALL_S - SECONDS - 30)) $S engine "$2" 0 1,8,32,64,128,256
    if [ "${3:-}" = profile ] && [ $((CALL_S - SECONDS)) -gt 200 ]; then
      ENGINE_TIMEOUT_S=$((CALL_S - SECONDS - 25)) $S profile "$2" 0 64,256
    fi
    ;;
  spec)
    STAGE=spec-$2
    [ -f "$TUNED" ] && export REPLAYSSM_LAUNCH_CONFIG=$TUNED
    SPEC_BUDGET_S=${SPEC_BUDGET_S:-$((CALL_S - SECONDS - 120))} ENGINE_TIMEOUT_S=$((CALL_S - SECONDS - 30)) \
      $S spec "$2" 0 "${3:-64,128,256}"
    ;;
  *) echo "usage: replayssm.sh kernels | engine VARIANT [profile] | spec ARM [BATCHES]"; exit 2 ;;
esac

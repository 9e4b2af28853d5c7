#!/usr/bin/env bash
# Stages of a GPU session on the H200 host (run through the `device` tool, one stage list per call).
#   recv [K]      copy bundle part K (and the installer files carried beside it) from .gpu/ to /tmp/pkg (PKG)
#   setup         unpack vLLM 0.24.0 to /tmp/site, add the carried wheels, make this checkout's plugin visible
#                 (a dist-info under /tmp/rb-site, see replayssm_patch/plugin_site.py), build a model dir (config +
#                 word-level tokenizer) for every carried config: /tmp/model (.device/model, Nemotron-H-8B),
#                 /tmp/model-qwen35 (.device/qwen35, qwen3.5-4b), /tmp/model-qwen35moe (.device/qwen35moe, qwen3.5-35b-a3b)
#                 and /tmp/model-mtp (.device/model-mtp, Nemotron-H-8B with an MTP layer) for `spec`
#   model DIR CONFIG                one more model dir the same way (replayssm.sh builds /tmp/model-floor so)
#   serve ARM GPU PORT [EXTRA...]   start a vLLM server detached (setsid); ARM names the log/pid files
#   wait TIMEOUT_S PORT...          poll /health of each port until ready (exit 1 on timeout or death)
#   stop ARM      kill a server started by `serve` (its whole session)
#   engine VARIANT GPU [BATCHES]    engine-side decode step (replayssm_patch/gpu/engine_step.py, LLM.generate, no
#                                   HTTP; default batches 64,256; REPEATS [3]) -> rows merged into engine_step-h200.json
#   pair VARIANT GPU [BATCHES]      the engine-side step paired (engine_pair.py): the baseline and VARIANT as two
#                                   engines (ENGINE_UTIL 0.45 each), PAIRS [6] interleaved pairs on shared prompts
#                                   -> rows (ratio with its 95 % interval) merged into engine_pair-h200.json
#   profile VARIANT GPU [BATCHES]   kernel time per layer kind of a decode step (step_profile.py) -> profile/;
#                                   with STEP_BATCHES the same engine first measures the engine rows (as engine)
#   churn VARIANT GPU [BATCHES]     engine-side step under churn (replayssm_patch/gpu/churn_step.py): B requests
#                                   decoding while each finished one is replaced by a fresh prompt, so prefills
#                                   land in decode steps as in a served load; mixed vs decode-only steps (default
#                                   batches 64,128; REPEATS [3]) -> rows merged into churn_step-h200.json; with
#                                   CHURN_PROFILE=1 each batch's two kinds of step are then profiled -> profile-churn/
#   hostprof VARIANT GPU [BATCHES]  host time per decode step by function (host_profile.py: the engine in-process
#                                   under cProfile) -> rows merged into host_profile-h200.json (+ .md)
#   hostchurn VARIANT GPU [BATCHES] host time per step under churn by function (churn_host_profile.py: churn_step's
#                                   workload, the engine in-process under cProfile; a ReplaySSM row also lists its
#                                   extra over the baseline's row) -> rows merged into host_profile_churn-h200.json
#   spec ARM GPU [BATCHES]          engine-side speculative decoding (replayssm_patch/gpu/spec_step.py) of ARM
#                                   (native_standard native_spec replayssm_standard replayssm_spec
#                                   replayssm_split_spec replayssm_spec_l28 replayssm_split_spec_l28
#                                   replayssm_spec_l28_per_group) on /tmp/model-mtp,
#                                   MTP k = SPEC_TOKENS [3], synthetic AL 3.0 or the list SWEEP_AL (one engine each,
#                                   SPEC_BUDGET_S seconds at most) -> rows merged into spec_step-h200.json; with
#                                   SPEC_PROFILE_BATCHES the same engine then profiles its verify steps there
#                                   (step_profile.py's summary) -> profile-spec/
#   pace PORT VARIANT [STREAMS]     client-seen decode pace of the server on PORT through `replaybench replay`
#                                   (bench/decode_pace.py: 1 and 4 workers, prompt 1024, exactly 256 tokens; default
#                                   streams 64,256) against engine_step-h200.json -> rows merged into decode_pace-h200.json
#   diagnose ARM  the lines of a server log that say why it died
#   pack NAME     copy server logs into the results and tar them to $OUT/NAME.tgz (one file comes back)
# MODE=O0 (default: -O0 + FULL_DECODE_ONLY graphs) or MODE=default (vLLM's torch.compile mode) applies to serve,
# engine, profile, spec and pace alike (replayssm_patch/gpu/variants.py holds the flags and each variant's knob).
# MODEL=nemotron (default) | qwen35 | qwen35moe | mtp picks the model dir of serve, engine and profile (mtp: servers
# speculate with MTP, `variants --speculative`); serve adds the
# family's flags (Qwen3.5: text only, Triton GDN prefill; `variants --family`). Engine-step, pace and profile
# results of a Qwen model go to files of their own (engine_step-h200-qwen3.5-4b.json, ...), Nemotron's keep their names.
# Logs and pids live in /tmp/gpu (survives between calls while the host is kept); `pack` sends the results back.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# The card's short name (h200, h100): every results file carries it, so one card's rows never merge into another's
# (session 31 ran on an H100 while the files said h200); h200 where nvidia-smi names no H card
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oE 'H[0-9]+' | tr 'A-Z' 'a-z')
CARD=${CARD:-h200}
STATE=${GPU_STATE:-/tmp/gpu}  # another folder only for tests on a CPU machine
RES=$STATE/out  # everything worth keeping; `pack` tars it into $OUT
MODE=${MODE:-O0}
case $MODE in O0 | default) ;; *) echo "MODE=$MODE: use MODE=O0 or MODE=default"; exit 2 ;; esac
case ${MODEL:-nemotron} in
  nemotron) MODEL_DIR=/tmp/model SUFFIX= ;;
  qwen35) MODEL_DIR=/tmp/model-qwen35 SUFFIX=-qwen3.5-4b ;;
  qwen35moe) MODEL_DIR=/tmp/model-qwen35moe SUFFIX=-qwen3.5-35b-a3b ;;
  floor) MODEL_DIR=/tmp/model-floor SUFFIX=-floor ;;  # Nemotron-H-8B's host floor (replayssm.sh floor:VARIANT)
  qwen35floor) MODEL_DIR=/tmp/model-qwen35-floor SUFFIX=-qwen3.5-4b-floor ;;  # Qwen3.5-4B's (gdnfloor:VARIANT)
  mtp) MODEL_DIR=/tmp/model-mtp SUFFIX=-nemotron-h-8b-mtp ;;  # served with MTP speculation (serve adds it)
  mtpfloor) MODEL_DIR=/tmp/model-mtp-floor SUFFIX=-floor ;;  # the MTP model's host floor (replayssm.sh specfloor:ARM)
  *) echo "MODEL=$MODEL: use MODEL=nemotron (the default), MODEL=qwen35, MODEL=qwen35moe, MODEL=floor, MODEL=qwen35floor, MODEL=mtp or MODEL=mtpfloor"
     exit 2 ;;
esac
# PROMPT_TOKENS=N: the engine-side scripts' prompt length (default 1024), into files of their own (-pN);
# MAX_NUM_SEQS=N: their --max-num-seqs (default 256), which caps a `fit` batch (the largest the KV cache holds)
SUFFIX=$SUFFIX${PROMPT_TOKENS:+-p$PROMPT_TOKENS}
PKG=${PKG:-/tmp/pkg}  # the bundle's parts and installer, as the transfer calls leave them
mkdir -p "$STATE" "$RES" "$PKG"
export PYTHONPATH=/tmp/site:/tmp/rb-site:$ROOT VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Every default-mode engine start spent 76-91 s in vLLM's silent "Initial profiling/warmup run", the second engine
# on a host as long as the first (session 7): vLLM points TRITON_CACHE_DIR at a folder per config hash, so each arm
# compiled and autotuned the SSD / FLA prefill kernels anew. One Triton cache for every engine and server here
# (replayssm_patch/gpu/shared_triton_cache.py); vLLM already sets TRITON_CACHE_AUTOTUNING=1 itself.
export TRITON_CACHE_MANAGER=replayssm_patch.gpu.shared_triton_cache:SharedTritonCache
export REPLAYBENCH_TRITON_CACHE=$STATE/triton-cache
mapfile -t MODE_FLAGS < <(python3 -m replayssm_patch.gpu.variants --mode "$MODE")
VLLM_FLAGS=(--model "$MODEL_DIR" --served-model-name m --load-format dummy --max-num-seqs 256 --max-model-len "${MAX_LEN:-8192}"
  --gpu-memory-utilization "${SERVE_UTIL:-0.85}" --mamba-ssm-cache-dtype float32 "${MODE_FLAGS[@]}")
seed() {  # a results file (and its history) starts from the committed one, so the packed one is the merged whole
  local file
  for file in "$1" "${1%.json}.history.jsonl"; do
    [ -f "$file" ] || cp "$ROOT/replayssm_patch/gpu/results/${file##*/}" "$file" 2>/dev/null
  done
}
STEPS=$RES/engine_step-$CARD$SUFFIX.json
seed "$STEPS"
MODEL_MTP=/tmp/model-mtp
SPEC_MODEL=$MODEL_MTP SPEC_SUFFIX=  # the spec jobs' model; MODEL=mtpfloor: its host floor, rows in a file of their own
[ "${MODEL:-}" = mtpfloor ] && SPEC_MODEL=$MODEL_DIR SPEC_SUFFIX=-floor
SPECS=$RES/spec_step-$CARD${PROMPT_TOKENS:+-p$PROMPT_TOKENS}$SPEC_SUFFIX.json  # the same for the spec-decode rows
seed "$SPECS"

recv() {
  local k=${1:-}  # none: the installer files alone (the wheel's own call)
  if [ -n "$k" ]; then cp "$ROOT/.gpu/site.part0$k" "$PKG/"; fi
  # the installer's files ride with whichever part has room (the repo plus part 0 and the wheel passed 64 MiB)
  for f in "$ROOT"/.gpu/zstandard-*.whl "$ROOT/.gpu/SHA256" "$ROOT/.gpu/install-bundle.sh"; do
    if [ -f "$f" ]; then cp "$f" "$PKG/"; fi
  done
  ls -la "$PKG"
}

setup() {  # needs .whl carried beside part 3: without tomli_w every `replaybench run/capacity` dies on the host
  ls "$ROOT"/.whl/*.whl > /dev/null 2>&1 || { echo "setup: no .whl/ here: carry .whl with part 3 (README)"; return 1; }
  bash "$PKG/install-bundle.sh" "$PKG" || return 1
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$ROOT"/.whl/*.whl
  python3 -c "from pathlib import Path; from replayssm_patch.plugin_site import write_plugin_site; \
write_plugin_site(Path('/tmp/rb-site'))" || return 1
  model_dir /tmp/model "$ROOT/.device/model/config.json" || return 1
  for name in qwen35 qwen35moe; do
    [ -f "$ROOT/.device/$name/config.json" ] && { model_dir "/tmp/model-$name" "$ROOT/.device/$name/config.json" || return 1; }
  done
  [ -f "$ROOT/.device/model-mtp/config.json" ] && { model_dir "$MODEL_MTP" "$ROOT/.device/model-mtp/config.json" || return 1; }
  python3 -c "import vllm, harness, replayssm_patch, importlib.metadata as m; \
print('vllm', vllm.__version__, '| plugins:', [e.name for e in m.entry_points(group='vllm.general_plugins')])"
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
}

model_dir() {  # DIR CONFIG: the config and a word-level tokenizer of its vocabulary (make-tokenizer.py reads a
               # top-level vocab_size; Qwen3.5 keeps it in text_config, so the tokenizer is made from a stand-in)
  local dir=$1 config=$2 vocab=$STATE/vocab-${1##*/}
  mkdir -p "$dir" "$vocab" && cp "$config" "$dir/config.json" || return 1
  python3 -c "import json, sys; c = json.load(open(sys.argv[1])); n = c.get('vocab_size') or c['text_config']['vocab_size']; \
json.dump({'vocab_size': n}, open(sys.argv[2], 'w'))" "$config" "$vocab/config.json" || return 1
  python3 "$ROOT/.device/make-tokenizer.py" "$vocab" && cp "$vocab"/tokenizer*.json "$dir/"
}

serve() {
  local arm=$1 gpu=$2 port=$3 family; shift 3
  [ -f "$MODEL_DIR/config.json" ] || { echo "$MODEL_DIR/config.json missing: carry its .device config and run setup"; return 1; }
  mapfile -t family < <(python3 -m replayssm_patch.gpu.variants --family "$MODEL_DIR")
  # MODEL=mtp: every server speculates alike (MTP k = 3, synthetic acceptance 3.0), so only the plugin knob differs
  [ "${MODEL:-nemotron}" = mtp ] && family+=(--speculative-config "$(python3 -m replayssm_patch.gpu.variants --speculative)")
  CUDA_VISIBLE_DEVICES=$gpu setsid python3 -m vllm.entrypoints.openai.api_server "${VLLM_FLAGS[@]}" "${family[@]}" \
    --port "$port" "$@" \
    > "$STATE/$arm.log" 2>&1 < /dev/null &
  echo $! > "$STATE/$arm.pid"
  echo "started $arm on GPU $gpu port $port pid $(cat "$STATE/$arm.pid") at ${SECONDS}s"
}

wait_ready() {
  local timeout=$1; shift
  local deadline=$((SECONDS + timeout))
  for p in "$@"; do
    until python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$p/health', timeout=2)" 2>/dev/null; do
      [ $SECONDS -ge $deadline ] && { echo "port $p not ready after ${timeout}s"; return 1; }
      if ! pgrep -f -- "--port $p" >/dev/null; then echo "server on port $p died"; return 1; fi
      sleep 2
    done
    echo "port $p ready at ${SECONDS}s"
  done
}

stop() {
  local pid; pid=$(cat "$STATE/$1.pid" 2>/dev/null) || return 0
  kill -TERM -- "-$pid" 2>/dev/null; sleep 4; kill -KILL -- "-$pid" 2>/dev/null; rm -f "$STATE/$1.pid"; echo "stopped $1"
}

on_gpu() {  # MODULE NAME GPU BATCHES OUT SHOWN [ARGS...]: one engine-side script (ENGINE_UTIL: its GPU memory
            # share, 0.45 leaves room for a server beside it) on ENGINE_MODEL [the MODEL dir], with the script's own
            # ARGS; prints its exit code and the log lines matching SHOWN, and returns that code (the queue keeps a
            # job whose script exits 75 for the next call: until session 23 grep's status hid it)
  local module=$1 name=$2 gpu=$3 batches=$4 out=$5 shown=$6 log=$STATE/$1-$2-$MODE$SUFFIX.log; shift 6
  CUDA_VISIBLE_DEVICES=$gpu timeout "${ENGINE_TIMEOUT_S:-540}" python3 -m "replayssm_patch.gpu.$module" \
    --model "${ENGINE_MODEL:-$MODEL_DIR}" --mode "$MODE" --batches "$batches" \
    --gpu-memory-utilization "${ENGINE_UTIL:-0.45}" --max-model-len "${MAX_LEN:-8192}" --out "$out" \
    ${PROMPT_TOKENS:+--prompt-tokens "$PROMPT_TOKENS"} ${MAX_NUM_SEQS:+--max-num-seqs "$MAX_NUM_SEQS"} "$@" > "$log" 2>&1
  local rc=$?
  echo "$module $name $MODE exit $rc"; grep -E "$shown|^error" "$log"
  return $rc
}

spec() {  # ARM GPU [BATCHES]: spec_step.py on the MTP model (see the stage list above)
  local arm=$1 gpu=$2 batches=${3:-64,128,256}
  local extra=(--arm "$1" --spec-tokens "${SPEC_TOKENS:-3}" --repeats "${REPEATS:-3}")  # sessions 20-22's REPEATS=5 ran 3
  [ -f "$SPEC_MODEL/config.json" ] || {
    echo "no $SPEC_MODEL: carry .device/model-mtp/config.json, run setup (a floor: replayssm.sh specfloor:ARM)"; return 1; }
  case $arm in *_spec) [ -n "${SWEEP_AL:-}" ] && extra+=(--sweep-al "$SWEEP_AL") ;; esac
  [ -n "${SPEC_BUDGET_S:-}" ] && extra+=(--budget-s "$SPEC_BUDGET_S")
  [ -n "${SPEC_PROFILE_BATCHES:-}" ] && extra+=(--profile-batches "$SPEC_PROFILE_BATCHES" --profile-out "$RES/profile-spec$SPEC_SUFFIX")
  ENGINE_MODEL=$SPEC_MODEL on_gpu spec_step "$arm" "$gpu" "$batches" "$SPECS" \
    "tok/s \(spread|maximum concurrency|^skipped" "${extra[@]}"
}

pace() {
  local port=$1 variant=$2 streams=${3:-64,256} reference=()
  [ -f "$STEPS" ] && reference=(--engine-step "$STEPS")  # without it the rows say engine_step_ms null
  timeout "${PACE_TIMEOUT_S:-300}" python3 -m bench.decode_pace --url "http://127.0.0.1:$port" --streams "$streams" \
    --workers 1,4 --variant "$variant" --mode "$MODE" "${reference[@]}" --out "$RES/decode_pace-$CARD$SUFFIX.json" \
    > "$STATE/pace-$variant-$MODE.log" 2>&1
  echo "pace $variant $MODE exit $?"; grep -E "streams [0-9]+ workers|^error" "$STATE/pace-$variant-$MODE.log"
}

diagnose() {
  grep -nE "Traceback|Error|error|ReplaySSM|replayssm" "$STATE/$1.log" | tail -25
  tail -15 "$STATE/$1.log"
}

pack() {
  cp "$STATE"/*.log "$RES/" 2>/dev/null
  tar czf - -C "$STATE" out | split -b 15m - "$OUT/${1:-results}.tgz.part" && ls -la "$OUT"
}

cmd=$1; shift
case $cmd in
  recv) recv "$@" ;;
  card) echo "$CARD" ;;
  setup) setup ;;
  model) model_dir "$@" ;;
  serve) serve "$@" ;;
  wait) wait_ready "$@" ;;
  stop) stop "$@" ;;
  engine) on_gpu engine_step "$1" "$2" "${3:-64,256}" "$STEPS" "step .* ms \(spread" --variant "$1" --repeats "${REPEATS:-3}" ;;
  pair) on_gpu engine_pair "$1" "$2" "${3:-64,256}" "$RES/engine_pair-$CARD$SUFFIX.json" " vs baseline .* B=[0-9]+: |^skipped" \
    --candidate "$1" --pairs "${PAIRS:-6}" ;;
  churn)  # CHURN_PROFILE=1: then one profiled churn run per batch, decode-only and mixed steps apart -> profile-churn/
    profiled=(); [ -n "${CHURN_PROFILE:-}" ] && profiled=(--profile-out "$RES/profile-churn$SUFFIX")
    on_gpu churn_step "$1" "$2" "${3:-64,128}" "$RES/churn_step-$CARD$SUFFIX.json" "churn|^skipped" --variant "$1" \
      --repeats "${REPEATS:-3}" "${profiled[@]}" ;;
  hostprof) on_gpu host_profile "$1" "$2" "${3:-64,256}" "$RES/host_profile-$CARD$SUFFIX.json" "in-process| µs  " --variant "$1" ;;
  hostchurn) on_gpu churn_host_profile "$1" "$2" "${3:-64}" "$RES/host_profile_churn-$CARD$SUFFIX.json" "in-process|µs  " \
    --variant "$1" ;;
  profile)  # STEP_BATCHES=B,...: the same engine measures engine_step's rows at those batches first (one start-up)
    steps=(); [ -n "${STEP_BATCHES:-}" ] && steps=(--step-batches "$STEP_BATCHES" --steps-out "$STEPS" --repeats "${REPEATS:-3}")
    on_gpu step_profile "$1" "$2" "${3:-64,256}" "$RES/profile$SUFFIX" "B=[0-9]+: |step .* ms \(spread" --variant "$1" "${steps[@]}" ;;
  spec) spec "$@" ;;
  pace) pace "$@" ;;
  diagnose) diagnose "$@" ;;
  pack) pack "$@" ;;
  *) echo "unknown stage $cmd"; exit 2 ;;
esac

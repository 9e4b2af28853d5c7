#!/usr/bin/env bash
# Stages of a GPU session on the H200 host (run through the `device` tool, one stage list per call).
#   recv K        copy bundle part K (and, for K=0, the installer files) from .gpu/ to /tmp/pkg
#   setup         unpack vLLM 0.24.0 to /tmp/site, add the carried wheels, make this checkout's plugin visible
#                 (a dist-info under /tmp/rb-site, see replayssm_patch/plugin_site.py), build the model dir
#   serve ARM GPU PORT [EXTRA...]   start a vLLM server detached (setsid); ARM names the log/pid files
#   wait TIMEOUT_S PORT...          poll /health of each port until ready (exit 1 on timeout or death)
#   stop ARM      kill a server started by `serve` (its whole session)
#   decode PORT ARM NAME C...       closed-loop decode timing of ARM's running server as variant NAME (serve_check
#                                   --attach: C streams, prompt 1024, exactly 256 output tokens) -> results serve-NAME/
#   diagnose ARM  the lines of a server log that say why it died
#   pack NAME     copy server logs into the results and tar them to $OUT/NAME.tgz (one file comes back)
# Logs and pids live in /tmp/gpu (survives between calls while the host is kept); `pack` sends the results back.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
STATE=/tmp/gpu
RES=$STATE/out  # everything worth keeping; `pack` tars it into $OUT
mkdir -p "$STATE" "$RES" /tmp/pkg
export PYTHONPATH=/tmp/site:/tmp/rb-site:$ROOT VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MODEL=/tmp/model
VLLM_FLAGS=(--model "$MODEL" --served-model-name m --load-format dummy --max-num-seqs 256 --max-model-len "${MAX_LEN:-8192}"
  --gpu-memory-utilization 0.85 --mamba-ssm-cache-dtype float32 -O0 -cc '{"cudagraph_mode":"FULL_DECODE_ONLY"}')

recv() {
  local k=$1
  cp "$ROOT/.gpu/site.part0$k" /tmp/pkg/
  if [ "$k" = 0 ]; then cp "$ROOT"/.gpu/zstandard-*.whl "$ROOT/.gpu/SHA256" "$ROOT/.gpu/install-bundle.sh" /tmp/pkg/; fi
  ls -la /tmp/pkg
}

setup() {
  bash /tmp/pkg/install-bundle.sh || return 1
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$ROOT"/.whl/*.whl
  python3 -c "from pathlib import Path; from replayssm_patch.plugin_site import write_plugin_site; \
write_plugin_site(Path('/tmp/rb-site'))" || return 1
  mkdir -p "$MODEL" && cp "$ROOT/.device/model/config.json" "$MODEL/"
  python3 "$ROOT/.device/make-tokenizer.py" "$MODEL"
  python3 -c "import vllm, harness, replayssm_patch, importlib.metadata as m; \
print('vllm', vllm.__version__, '| plugins:', [e.name for e in m.entry_points(group='vllm.general_plugins')])"
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
}

serve() {
  local arm=$1 gpu=$2 port=$3; shift 3
  CUDA_VISIBLE_DEVICES=$gpu setsid python3 -m vllm.entrypoints.openai.api_server "${VLLM_FLAGS[@]}" --port "$port" "$@" \
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

decode() {
  local port=$1 arm=$2 name=$3; shift 3
  timeout 240 python3 -m replayssm_patch.gpu.serve_check --model "$MODEL" --out "$RES/serve-$name" --attach "$port" \
    --name "$name" --log "$STATE/$arm.log" --concurrency "$@" --budget-s 200 > "$STATE/decode-$name.log" 2>&1
  grep -E "^\| $name " "$RES/serve-$name/serve_check.md" || tail -5 "$STATE/decode-$name.log"
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
  setup) setup ;;
  serve) serve "$@" ;;
  wait) wait_ready "$@" ;;
  stop) stop "$@" ;;
  decode) decode "$@" ;;
  diagnose) diagnose "$@" ;;
  pack) pack "$@" ;;
  *) echo "unknown stage $cmd"; exit 2 ;;
esac

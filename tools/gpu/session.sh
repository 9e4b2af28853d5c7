#!/usr/bin/env bash
# Stages of a GPU session on the H200 host (run through the `device` tool, one stage list per call).
#   recv K        copy bundle part K (and, for K=0, the installer files) from .gpu/ to /tmp/pkg
#   setup         unpack vLLM 0.24.0 to /tmp/site, add our package + carried wheels, build the model dir
#   serve ARM GPU PORT [EXTRA...]   start a vLLM server detached (setsid); ARM names the log/pid files
#   wait TIMEOUT_S PORT...          poll /health of each port until ready (exit 1 on timeout or death)
#   stop ARM      kill a server started by `serve` (its whole session)
# Logs and pids live in /tmp/gpu (survives between calls while the host is kept); copy what matters to $OUT.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
STATE=/tmp/gpu
mkdir -p "$STATE" /tmp/pkg
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MODEL=/tmp/model
VLLM_FLAGS=(--model "$MODEL" --served-model-name m --load-format dummy --max-num-seqs 256 --max-model-len 4096
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
  (cd "$ROOT" && python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/site-rb . \
    && cp -r /tmp/site-rb/. /tmp/site/) || return 1
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
  echo "started $arm on GPU $gpu port $port pid $(cat "$STATE/$arm.pid")"
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
  kill -TERM -- "-$pid" 2>/dev/null; sleep 5; kill -KILL -- "-$pid" 2>/dev/null; echo "stopped $1"
}

cmd=$1; shift
case $cmd in
  recv) recv "$@" ;;
  setup) setup ;;
  serve) serve "$@" ;;
  wait) wait_ready "$@" ;;
  stop) stop "$@" ;;
  *) echo "unknown stage $cmd"; exit 2 ;;
esac

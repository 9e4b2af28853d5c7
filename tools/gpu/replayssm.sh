#!/usr/bin/env bash
# ReplaySSM's own speed on ONE H200 (kind nvidia-h200), after `session.sh recv 0..2` calls; vLLM's default compile
# mode, the GPU to one engine at a time (0.85). A queue: every call names the whole plan, runs the jobs not done yet
# in order while they fit in the call (CALL_S, default 585 s; a job that would not fit is left for the next call,
# and a shorter one after it may run; a job that exits 75 runs again first in the next call), then tars /tmp/gpu/out to $OUT. Issue the same command again, the moment the
# previous call returns, until it prints "plan done".
#   replayssm.sh JOB...
# Engine jobs run the launch table of this host's kernel benches once `kernels` wrote it; TABLE=committed in front
# runs the committed one (replayssm_patch/kernels/launch_h200.json) instead.
# Jobs (estimated seconds in JOB_S):
#   setup            recv part 3, install the bundle (first call only)
#   kernels          kernel bench: 2,000-step equivalence at batch 256 vs vLLM's SSU, launch-shape sweep, timing at
#                    1/8/16/32/64/128/256, registers, the speculative verify's timing and its 250-step equivalence
#                    vs the fp64 recurrence; its fastest shapes and native_max_batch (where vLLM's kernel wins) go to
#                    the engine jobs after it (as do gdnkernels'); KERNEL_BENCH_ARGS=--no-sweep skips the sweeps
#   gdnkernels       GDN kernel bench (gdn_kernel_bench.py): gdn_decode_step vs vLLM's packed GDN decode, 2,000-step
#                    equivalence at batch 256, replay and fold launch-shape sweep (-> gdn_launch_config.json),
#                    timing at 1/8/16/32/64/128/256 on the qwen3.5-4b shape (and gdn_native_max_batch)
#   gdncheck         GDN layer equivalence in vLLM (gdn_layer_check.py): ReplayGatedDeltaNet vs vLLM's GDN layer, 2,000
#                    decode steps at batch 256 on the qwen3.5-4b shape -> gdn_layer_check/
#   engine:VARIANT   engine-side decode step of Nemotron-H-8B at batch 1..256, 5 repeats -> engine_step-h200.json;
#                    every call ends by printing each engine-step file's table over the baseline, a job's runs on
#                    this host pooled (engine_summary.py --pool -> engine_summary-<file>.md; paired files:
#                    pair_summary.py -> pair_summary-<file>.md)
#   gdn:VARIANT      the same for Qwen3.5-4B (GDN; .device/qwen35/config.json) -> engine_step-h200-qwen3.5-4b.json
#   pair:VARIANT     the engine-side step paired (engine_pair.py): the baseline and VARIANT as two engines at 0.45
#                    each, PAIRS [6] interleaved pairs (A B, B A, ...) at ALL_BATCHES on the same prompts, so the
#                    host's slow phases fall on both -> engine_pair-h200.json (ratio, 95 % interval over pairs);
#                    gdnpair:VARIANT the same for Qwen3.5-4B -> engine_pair-h200-qwen3.5-4b.json
#   moe:VARIANT      the same for qwen3.5-35b-a3b (GDN + MoE; .device/qwen35moe) at batch 1, 8, 64, 256 (issue 16's
#                    step ratio of the MoE shape) -> engine_step-h200-qwen3.5-35b-a3b.json
#   floor:VARIANT    the host floor: Nemotron-H-8B's layers at toy widths (replayssm_patch/gpu/host_floor.py) at
#                    FLOOR_BATCHES [1,8,64,256] -> engine_step-h200-floor.json
#   churn:VARIANT    engine-side step under churn (churn_step.py) of Nemotron-H-8B at CHURN_BATCHES [64,128]: B
#                    requests decoding while finished ones are replaced by fresh 1,024-token prompts, mixed steps
#                    (a prefill beside the decodes) timed apart from decode-only ones -> churn_step-h200.json
#   gdnchurn:VARIANT the same for Qwen3.5-4B -> churn_step-h200-qwen3.5-4b.json
#   gdnfloor:VARIANT the same for Qwen3.5-4B -> engine_step-h200-qwen3.5-4b-floor.json
#   profile:VARIANT  the step profile at batch 64 and 256 (PROFILE_BATCHES) -> profile/
#   gdnprofile:VARIANT  the same for Qwen3.5-4B -> profile-qwen3.5-4b/
#   engprof:VARIANT  engine:VARIANT and profile:VARIANT in one engine (one start-up, ~200 s saved)
#   gdnengprof:VARIANT  gdn:VARIANT and gdnprofile:VARIANT in one engine
#   hostprof:VARIANT where vLLM's host time per decode step goes (host_profile.py: the engine in-process under
#                    cProfile) on the host-floor model at batch 64 and 256, -O0 with full decode graphs (fast
#                    start-up; a decode step replays a full graph in both modes) -> host_profile-h200-floor.json
#   hostchurn:VARIANT  where the host time of steps under churn goes (churn_host_profile.py: churn_step's workload
#                    at CHURN_BATCHES, the engine in-process under cProfile, default mode); run the baseline first:
#                    a ReplaySSM row then lists its extra host time per function -> host_profile_churn-h200.json
#   gdnhostchurn:VARIANT  the same for Qwen3.5-4B -> host_profile_churn-h200-qwen3.5-4b.json
#   spec:ARM         issue 17: speculative decoding on the engine (spec_step.py) of ARM (native_standard native_spec
#                    replayssm_standard replayssm_spec replayssm_split_spec replayssm_spec_l28 replayssm_split_spec_l28
#                    replayssm_spec_l28_per_group) on /tmp/model-mtp at
#                    batch 64, 128, 256, k = SPEC_TOKENS [3];
#                    a spec arm at AL 3.0, or one engine per AL of SWEEP_AL, none started in the call's last 120 s;
#                    SPEC_BATCHES=64,128,256,fit MAX_NUM_SEQS=768 adds the largest batch the arm holds;
#                    SPEC_PROFILE_BATCHES=128 then profiles the arm's verify steps at 128 in the same engine
#                    (-> profile-spec/; ~40 s more: both spec arms on one host account for each other's step)
#   specfloor:ARM    spec:ARM on the MTP model's host floor (its layers at toy widths, host_floor.py) at SPEC_BATCHES
#                    [128]: the step vLLM's host work allows the arm, next to its real rows (session 24: ReplaySSM's
#                    spec step at 128 is within ~0.8 ms of what 1.6x native spec needs) -> spec_step-h200-floor.json
#   alsweep:ARM      a spec arm's throughput against AL: one engine per AL of SWEEP_AL [2.0,4.0,1.0,2.8] at
#                    AL_BATCHES [128], no profile, none started in the call's last 120 s (an AL skipped for time is
#                    not rerun: give each AL a job of its own, alsweep:ARM@AL, ~150-200 s each)
#   ksweep:ARM       a spec arm at k = 1 and 5 (K_SWEEP; ksweep:ARM@K for one k), AL 3.0 or k + 1 if lower, at
#                    AL_BATCHES [128]
#   JOB@O0           an engine job in -O0 + FULL_DECODE_ONLY graphs (MODE=O0 in front runs every job so)
#   JOB@TAG          any job again, as a job of its own (a job runs once per host: /tmp/gpu/done), e.g.
#                    SPEC_BATCHES=fit ... spec:replayssm_spec@fit after spec:replayssm_spec ran 128; for alsweep
#                    and ksweep the tag is the AL list or the k
#   onegpu:STAGE     a stage of onegpu.sh with what is left of the call: agree (greedy cross-arm agreement, both
#                    servers at 0.45), moe (qwen3.5-35b-a3b served with the plugin, a replay with exact lengths)
# e.g. replayssm.sh setup kernels engine:replayssm_fp32 gdn:baseline gdn:replayssm_fp32 floor:baseline \
#        floor:replayssm_fp32 engine:replayssm_split engine:baseline
set -uo pipefail
cd "$(dirname "$0")/../.."
export MODE=${MODE:-default} ENGINE_UTIL=0.85 MAX_LEN=2048
S="bash tools/gpu/session.sh"
RES=${GPU_STATE:-/tmp/gpu}/out  # GPU_STATE: another folder only for tests on a CPU machine
DONE=${GPU_STATE:-/tmp/gpu}/done
export PYTHONPATH=/tmp/site:/tmp/rb-site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
CALL_S=${CALL_S:-585}
TUNED=$RES/launch_config.json  # the launch table the engine jobs run: the kernel benches' fastest shapes
ALL_BATCHES=${ALL_BATCHES:-1,8,32,64,128,256}  # the engine jobs' batches (e.g. 1,8,16,32,64 for the small ones)
CHURN_BATCHES=${CHURN_BATCHES:-64,128}  # the churn jobs' batches (decode rows beside arriving prompts' prefill)
FLOOR_BATCHES=${FLOOR_BATCHES:-1,8,64,256}  # the floor jobs' batches
PROFILE_BATCHES=${PROFILE_BATCHES:-64,256}  # the profile jobs' batches (e.g. 8,32 where GDN loses 0.5-0.9 ms per step)
# measured 2026-12-01: install 40 s, kernel bench 53 s, a floor run of four batches 173-175 s, engine start-up 131-191 s (ReplaySSM's compiles more), six
# batches x 3 repeats ~150 s after it; 5 repeats (the default here: ReplaySSM's repeats spread by 3-5 ms) ~250 s
declare -A JOB_S=([setup]=90 [kernels]=360 [gdnkernels]=120 [gdncheck]=150 [engine]=450 [gdn]=450 [pair]=480 [gdnpair]=480 [churn]=330 [gdnchurn]=330 [hostchurn]=300 [gdnhostchurn]=300 [moe]=450 [floor]=240 [gdnfloor]=240 [hostprof]=150 [profile]=240 [gdnprofile]=240 [engprof]=540 [gdnengprof]=540 [spec]=280 [specfloor]=280 [alsweep]=200 [ksweep]=200 [onegpu]=420)
mkdir -p "$RES" "$DONE"
trap '$S pack replayssm; echo "call used ${SECONDS}s"' EXIT

left() { echo $((CALL_S - SECONDS)); }

# measured 2026-12-02 with the shared Triton cache: a model's first engine on a host started in 221-236 s, its later ones
# (either arm) in 82-96 s; so an engine job of a model that already started here is estimated 120 s shorter
WARM_START_SAVES_S=120

engine_model() {  # JOB: the model its engine runs (none: the job starts no engine)
  case ${1%%:*} in
    engine | pair | engprof | profile | churn | hostchurn) echo nemotron ;;
    gdn | gdnpair | gdnengprof | gdnprofile | gdnchurn | gdnhostchurn) echo qwen35 ;;
    floor | hostprof) echo floor ;;
    gdnfloor) echo qwen35floor ;;
    moe) echo qwen35moe ;;
    spec | alsweep | ksweep) echo mtp ;;
    specfloor) echo mtpfloor ;;
  esac
}

starts_engine() { [ -n "$(engine_model "$1")" ]; }

need_s() {  # JOB: its estimate (EST_<kind> overrides JOB_S), less the warm start when its model's engine already started
  local est="EST_${1%%:*}" model done_job
  local need=${!est:-${JOB_S[${1%%:*}]:-300}}
  model=$(engine_model "$1")
  if [ -n "$model" ]; then
    for done_job in "$DONE"/*; do
      [ "$(engine_model "$(basename "$done_job")")" = "$model" ] && { need=$((need - WARM_START_SAVES_S)); break; }
    done
  fi
  echo "$need"
}

engine_job() {  # MODEL VARIANT BATCHES (MODEL as session.sh names them), REPEATS [5]
  REPEATS=${REPEATS:-5} MODEL=$1 ENGINE_TIMEOUT_S=$(($(left) - 25)) $S engine "$2" 0 "$3"
}

floor_model() {  # [MODEL_DIR]: its layers at toy widths (gpu/host_floor.py) and a tokenizer in MODEL_DIR-floor
  local real=${1:-/tmp/model}
  [ -d "$real-floor" ] || { python3 -m replayssm_patch.gpu.host_floor --model "$real" --out "$real-floor-config" \
    && $S model "$real-floor" "$real-floor-config/config.json"; }
}

tuned_table() {  # $TUNED: this card's committed table with the entries this host's kernel benches measured; 1 if none
  local found=()
  for f in "$RES/kernel_bench/launch_config.json" "$RES/gdn_kernel_bench/gdn_launch_config.json"; do
    [ -f "$f" ] && found+=("$f")
  done
  [ ${#found[@]} -gt 0 ] || return 1
  # this card's committed table (none for a card without one), then what this host's benches measured
  python3 -c 'import json, os, sys; t = {}; [t.update(json.load(open(f))) for f in sys.argv[2:] if os.path.exists(f)]; \
json.dump(t, open(sys.argv[1], "w"), indent=2)' "$TUNED" "replayssm_patch/kernels/launch_$($S card).json" "${found[@]}"
}

run_job() {
  local kind=${1%%:*} variant=${1#*:} tag=""
  [[ $1 == *@* ]] && tag=${1#*@}
  variant=${variant%%@*}  # JOB@TAG: the same job once more under its own done-marker (e.g. spec:replayssm_spec@fit)
  [ "$tag" = O0 ] && local -x MODE=O0  # JOB@O0: the job in -O0 + FULL_DECODE_ONLY (issue 15's other mode), same call
  if starts_engine "$1"; then  # the kernel benches' fastest shapes, once `kernels` / `gdnkernels` wrote them; the GPU
    if [ "${TABLE:-tuned}" = committed ]; then unset REPLAYSSM_LAUNCH_CONFIG  # an engine A/B of two tables, one host
    else tuned_table && export REPLAYSSM_LAUNCH_CONFIG=$TUNED; fi  # (a rerun's row replaces the first's; *.history.jsonl keeps both)
    for arm in baseline candidate candidate-moe; do $S stop "$arm"; done
  fi
  case $kind in
    setup)
      $S recv 3 > /dev/null
      $S setup 2>&1 | tee "$RES/setup.log" | tail -4
      [ -d /tmp/site/vllm ] ;;
    kernels)
      timeout $(($(left) - 20)) python3 -m replayssm_patch.gpu.kernel_bench --out "$RES/kernel_bench" ${KERNEL_BENCH_ARGS:-} \
        2>&1 | tee "$RES/kernel_bench.log" | grep -v "^\[kernel_bench\]   step" ;;
    gdnkernels)
      timeout $(($(left) - 20)) python3 -m replayssm_patch.gpu.gdn_kernel_bench --out "$RES/gdn_kernel_bench" \
        2>&1 | tee "$RES/gdn_kernel_bench.log" | grep -v "^\[gdn_kernel_bench\]   step" ;;
    gdncheck)
      timeout $(($(left) - 20)) python3 -m replayssm_patch.gpu.gdn_layer_check --model /tmp/model-qwen35 \
        --out "$RES/gdn_layer_check" 2>&1 | tee "$RES/gdn_layer_check.log" | tail -5 ;;
    engine) engine_job nemotron "$variant" $ALL_BATCHES ;;
    gdn) engine_job qwen35 "$variant" $ALL_BATCHES ;;
    pair | gdnpair)  # two engines: each at 0.45 of the card
      MODEL=$(engine_model "$1") ENGINE_UTIL=0.45 ENGINE_TIMEOUT_S=$(($(left) - 25)) $S pair "$variant" 0 "$ALL_BATCHES" ;;
    churn | gdnchurn)
      MODEL=$(engine_model "$1") ENGINE_TIMEOUT_S=$(($(left) - 25)) $S churn "$variant" 0 "$CHURN_BATCHES" ;;
    hostchurn | gdnhostchurn)
      MODEL=$(engine_model "$1") ENGINE_TIMEOUT_S=$(($(left) - 25)) $S hostchurn "$variant" 0 "$CHURN_BATCHES" ;;
    moe) engine_job qwen35moe "$variant" 1,8,64,256 ;;
    floor) floor_model && engine_job floor "$variant" "$FLOOR_BATCHES" ;;
    gdnfloor) floor_model /tmp/model-qwen35 && engine_job qwen35floor "$variant" "$FLOOR_BATCHES" ;;
    hostprof) floor_model && MODE=O0 MODEL=floor ENGINE_TIMEOUT_S=$(($(left) - 25)) $S hostprof "$variant" 0 64,256 ;;
    profile)
      ENGINE_TIMEOUT_S=$(($(left) - 25)) $S profile "$variant" 0 "$PROFILE_BATCHES" ;;
    gdnprofile)
      MODEL=qwen35 ENGINE_TIMEOUT_S=$(($(left) - 25)) $S profile "$variant" 0 "$PROFILE_BATCHES" ;;
    engprof | gdnengprof)
      MODEL=$(engine_model "$1") STEP_BATCHES=$ALL_BATCHES REPEATS=${REPEATS:-5} ENGINE_TIMEOUT_S=$(($(left) - 25)) \
        $S profile "$variant" 0 "$PROFILE_BATCHES" ;;
    spec)
      SPEC_BUDGET_S=${SPEC_BUDGET_S:-$(($(left) - 120))} ENGINE_TIMEOUT_S=$(($(left) - 25)) \
        $S spec "$variant" 0 "${SPEC_BATCHES:-64,128,256}" ;;
    specfloor)
      floor_model /tmp/model-mtp && MODEL=mtpfloor SPEC_BUDGET_S=${SPEC_BUDGET_S:-$(($(left) - 120))} \
        ENGINE_TIMEOUT_S=$(($(left) - 25)) $S spec "$variant" 0 "${SPEC_BATCHES:-128}" ;;
    alsweep)  # one engine per AL (the tag's, else SWEEP_AL), at AL_BATCHES only, no profile
      SWEEP_AL=${tag:-${SWEEP_AL:-2.0,4.0,1.0,2.8}} SPEC_PROFILE_BATCHES='' \
        SPEC_BUDGET_S=${SPEC_BUDGET_S:-$(($(left) - 120))} ENGINE_TIMEOUT_S=$(($(left) - 25)) \
        $S spec "$variant" 0 "${AL_BATCHES:-128}" ;;
    ksweep)  # the same arm at k = 1 and 5 (the tag's k, else K_SWEEP), AL 3.0 capped at k + 1, one engine each
      local k
      for k in ${tag:-${K_SWEEP:-1 5}}; do
        [ "$(left)" -lt 150 ] && { echo "-- k = $k left out: ~150 s needed"; continue; }
        SPEC_TOKENS=$k SWEEP_AL=$(python3 -c "print(min(3.0, $k + 1.0))") SPEC_PROFILE_BATCHES='' \
          SPEC_BUDGET_S=$(($(left) - 120)) ENGINE_TIMEOUT_S=$(($(left) - 25)) $S spec "$variant" 0 "${AL_BATCHES:-128}"
      done ;;
    onegpu) env -u MAX_LEN -u ENGINE_UTIL CALL_S=$(($(left) - 10)) bash tools/gpu/onegpu.sh "$variant" ;;  # its own sizes
    *) echo "unknown job $1"; return 2 ;;
  esac
}

[ $# -gt 0 ] || { echo "usage: replayssm.sh JOB...  (setup kernels gdnkernels gdncheck engine:V gdn:V pair:V gdnpair:V churn:V gdnchurn:V moe:V floor:V gdnfloor:V hostprof:V profile:V gdnprofile:V engprof:V gdnengprof:V hostchurn:V gdnhostchurn:V spec:ARM specfloor:ARM alsweep:ARM ksweep:ARM onegpu:STAGE)"; exit 2; }
pending=0
order=()  # a job that exited 75 in the last call goes first, before an engine job could stop its server
for job in "$@"; do [ -f "$DONE/$job.continues" ] && order+=("$job"); done
for job in "$@"; do [ -f "$DONE/$job.continues" ] || order+=("$job"); done
for job in "${order[@]}"; do
  [ -f "$DONE/$job" ] && continue
  need=$(need_s "$job")
  if [ "$(left)" -lt "$need" ]; then
    echo "-- $job left for the next call (needs ~${need}s, $(left)s left)"; pending=1; continue
  fi
  echo "-- $job at ${SECONDS}s"
  run_job "$job"; rc=$?
  case $rc in
    0) touch "$DONE/$job"; rm -f "$DONE/$job.continues" ;;
    75) echo "-- $job not finished: it continues in the next call"; touch "$DONE/$job.continues"; pending=1 ;;
    *) echo "-- $job FAILED (exit $rc) at ${SECONDS}s"; rm -f "$DONE/$job.continues"
       # a failed job is not retried, except setup: on 2026-12-03 a refused first transfer left the bundle short, and a
       # setup marked done made the next call run every job without vLLM
       [ "$job" = setup ] || touch "$DONE/$job" ;;
  esac
  [ "$job" = setup ] && [ ! -d /tmp/site/vllm ] && { echo "setup failed: nothing else can run"; exit 1; }
done
# the table of every engine-step file here (issue 15's Nemotron-H-8B rows, issue 16's qwen3.5-4b; the committed rows
# included; a job run again on this host, JOB@TAG, pooled with its first run; a floor under its model's table) and of
# every paired file (engine_pair.py)
card=$($S card)
for steps in "$RES"/engine_step-"$card"*.json "$RES"/engine_pair-"$card"*.json; do
  [ -f "$steps" ] || continue
  case $steps in
    *-floor.json) continue ;;
    */engine_pair-*) summary=(pair_summary "$steps") ;;
    *) summary=(engine_summary "$steps" --pool) ;;
  esac
  table=$RES/${summary[0]}-$(basename "$steps" .json).md
  python3 -m "replayssm_patch.gpu.${summary[0]}" "${summary[@]:1}" > "$table" 2>&1 || continue  # no baseline row yet
  echo "$(basename "$steps"):"; grep -E "^\| (default|O0) \|" "$table"
done
# jobs left for the next call are not a failure: the call exits 0 either way
if [ $pending = 0 ]; then echo "plan done"; else echo "plan continues in the next call"; fi

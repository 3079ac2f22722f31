#!/usr/bin/env bash
# One node: a vLLM generation server (`trl vllm-serve`) on some GPUs, training with `accelerate launch` on the others.
#
#   examples/launch/launch_single_node.sh --config recipes/DeepSeek-R1-Distill-Qwen-1.5B/riskpo/config_dapo_math.yaml \
#       --vllm-gpus 0,1 --train-gpus 2,3,4,5,6,7 [--accelerate-config recipes/accelerate_configs/zero3.yaml] \
#       [--tp 1] [--port 8000] [--model ID] [--health-timeout 900] [--vllm-args "ARGS"] [--dry-run] \
#       [-- extra training args]
#
# vLLM data parallel size = (number of vLLM GPUs) / tp. --vllm-args adds arguments to `trl vllm-serve` (split as a
# shell would, a quoted value stays one argument; a repeated option wins over the launcher's). --dry-run prints the two
# commands and exits. Training runs under `accelerate launch --quiet`: a start-up error of one training process is its
# one `error:` line, without accelerate's traceback. Exit code 75: training stopped cleanly at a checkpoint (a signal,
# a server timeout); the same command resumes it.
# See docs/scale_out.md for the GPU split, ports, failure modes and the CPU server's --vllm-args.
set -euo pipefail

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
die() { echo "error: $*" >&2; exit 2; }

CONFIG="" ACCELERATE_CONFIG="recipes/accelerate_configs/zero3.yaml" VLLM_GPUS="0" TRAIN_GPUS="" TP=1 PORT=8000
MODEL="" HEALTH_TIMEOUT=900 DRY_RUN=0 EXTRA=() VLLM_ARGS=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --config) CONFIG="${2:?--config needs a value}"; shift 2 ;;
    --accelerate-config) ACCELERATE_CONFIG="${2:?--accelerate-config needs a value}"; shift 2 ;;
    --vllm-gpus) VLLM_GPUS="${2:?--vllm-gpus needs a value}"; shift 2 ;;
    --train-gpus) TRAIN_GPUS="${2:?--train-gpus needs a value}"; shift 2 ;;
    --tp) TP="${2:?--tp needs a value}"; shift 2 ;;
    --port) PORT="${2:?--port needs a value}"; shift 2 ;;
    --model) MODEL="${2:?--model needs a value}"; shift 2 ;;
    --health-timeout) HEALTH_TIMEOUT="${2:?--health-timeout needs a value}"; shift 2 ;;
    --vllm-args) VLLM_ARGS="${2?--vllm-args needs a value}"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

[[ -n "$CONFIG" ]] || die "--config <recipe.yaml> is required"
[[ -f "$CONFIG" ]] || die "recipe '$CONFIG' does not exist"
[[ -f "$ACCELERATE_CONFIG" ]] || die "accelerate config '$ACCELERATE_CONFIG' does not exist"
[[ -n "$TRAIN_GPUS" ]] || die "--train-gpus is required, e.g. --train-gpus 1,2,3,4,5,6,7"
[[ "$TP" =~ ^[1-9][0-9]*$ ]] || die "--tp must be a positive integer, got '$TP'"
[[ "$PORT" =~ ^[0-9]+$ ]] || die "--port must be a number, got '$PORT'"

IFS=',' read -r -a vllm_list <<< "$VLLM_GPUS"
IFS=',' read -r -a train_list <<< "$TRAIN_GPUS"
for gpu in "${vllm_list[@]}"; do
  for other in "${train_list[@]}"; do
    [[ "$gpu" != "$other" ]] || die "GPU $gpu is in both --vllm-gpus and --train-gpus; the server and training need their own GPUs"
  done
done
(( ${#vllm_list[@]} % TP == 0 )) || die "${#vllm_list[@]} vLLM GPUs cannot be split into tensor-parallel groups of $TP"
DP=$(( ${#vllm_list[@]} / TP ))
NUM_TRAIN=${#train_list[@]}

if [[ -z "$MODEL" ]]; then
  MODEL=$(python -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["model_name_or_path"])' "$CONFIG") \
    || die "could not read model_name_or_path from '$CONFIG'; pass --model"
fi

SERVE_EXTRA=()  # --vllm-args split like a shell, without running anything in it; words pass NUL-separated, so a
                # quoted value with newlines stays one argument, and an empty or blank list adds none
SPLIT_WORDS='import shlex, sys; sys.stdout.write("".join(word + "\0" for word in shlex.split(sys.argv[1])))'
python -c "$SPLIT_WORDS" "$VLLM_ARGS" > /dev/null 2>&1 \
  || die "--vllm-args: cannot split '$VLLM_ARGS' into arguments (unbalanced quotes?)"
mapfile -d '' -t SERVE_EXTRA < <(python -c "$SPLIT_WORDS" "$VLLM_ARGS")
SERVE_CMD=(env "CUDA_VISIBLE_DEVICES=$VLLM_GPUS" trl vllm-serve --model "$MODEL" --tensor_parallel_size "$TP"
           --data_parallel_size "$DP" --host 0.0.0.0 --port "$PORT" ${SERVE_EXTRA[@]+"${SERVE_EXTRA[@]}"})
TRAIN_CMD=(env "CUDA_VISIBLE_DEVICES=$TRAIN_GPUS" accelerate launch --quiet --config_file "$ACCELERATE_CONFIG"
           --num_processes "$NUM_TRAIN" -m riskpo_trl.scripts.train --config "$CONFIG"
           --vllm_mode server --vllm_server_host 127.0.0.1 --vllm_server_port "$PORT" ${EXTRA[@]+"${EXTRA[@]}"})

if (( DRY_RUN )); then
  show() { python -c 'import shlex, sys; print(f"{sys.argv[1]}: {shlex.join(sys.argv[2:])}")' "$@"; }
  show vllm "${SERVE_CMD[@]}"
  show train "${TRAIN_CMD[@]}"
  exit 0
fi

STOPPED=75  # riskpo_trl.job.preemption.STOPPED_EXIT_CODE: stopped at a checkpoint; the same command resumes
# The launcher (torchrun) reports its processes' exit code 75 as a failure (exit 1); the training processes also
# write their stop line to this file, which carries the clean stop past it.
export RISKPO_STOP_FILE="${TMPDIR:-/tmp}/riskpo-stop-$$-$PORT"
rm -f "$RISKPO_STOP_FILE"
"${SERVE_CMD[@]}" &
SERVER_PID=$!
trap 'kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; rm -f "$RISKPO_STOP_FILE"' EXIT

echo "Waiting up to ${HEALTH_TIMEOUT}s for the vLLM server on port $PORT ..."
deadline=$(( SECONDS + HEALTH_TIMEOUT ))
until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do
  kill -0 "$SERVER_PID" 2>/dev/null || die "the vLLM server exited before becoming healthy (see its log above)"
  (( SECONDS < deadline )) || die "the vLLM server was not healthy after ${HEALTH_TIMEOUT}s"
  sleep 5
done
echo "vLLM server is up; training on GPUs $TRAIN_GPUS."
# Training runs as a job of its own (job control on: a background command would otherwise start with SIGINT ignored),
# and this script passes Ctrl-C and SIGTERM on to it; torchrun passes them on to the training processes, which stop at
# a checkpoint (a second Ctrl-C aborts).
set -m
"${TRAIN_CMD[@]}" &
TRAIN_PID=$!
trap 'kill -INT "$TRAIN_PID" 2>/dev/null || true' INT
trap 'kill -TERM "$TRAIN_PID" 2>/dev/null || true' TERM
while :; do  # `wait` returns early when a trapped signal arrives: wait again until training has ended
  status=0; wait "$TRAIN_PID" || status=$?
  kill -0 "$TRAIN_PID" 2>/dev/null || break
done
if [[ -s "$RISKPO_STOP_FILE" ]]; then
  echo "Training stopped at a checkpoint: exit code $STOPPED (the same command resumes)." >&2
  exit "$STOPPED"
fi
exit "$status"

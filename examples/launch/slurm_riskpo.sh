#!/usr/bin/env bash
#SBATCH --job-name=riskpo
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:8
#SBATCH --exclusive
#SBATCH --output=logs/%x-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@900
# Multi-node RiskPO: the last node of the allocation serves generations with `trl vllm-serve` (tensor x data
# parallel over its GPUs), all other nodes train with DeepSpeed ZeRO-3 through `accelerate launch`.
#
#   sbatch --nodes=3 examples/launch/slurm_riskpo.sh --config recipes/DeepSeek-R1-Distill-Qwen-1.5B/riskpo/config_dapo_math.yaml \
#       [--accelerate-config recipes/accelerate_configs/zero3.yaml] [--gpus-per-node 8] [--tp 1] [--port 8000]
#       [--main-port 29500] [--health-timeout 1800] [--dry-run] [--nodelist "host1 host2 host3"] [-- extra training args]
#
# The paper recipes are written for 8 training processes; with T = (nodes - 1) x gpus-per-node processes pass
# `-- --gradient_accumulation_steps $((240 / T)) --steps_per_generation $((960 / T))` to keep 480 prompts per
# generation batch in 4 mini-batches (T must divide 240). --dry-run prints the commands (no SLURM needed with
# --nodelist). See docs/scale_out.md.
#
# Time limit and preemption: 900 s before the time limit SLURM sends SIGUSR1 to this script only (B:; a signal to
# every step would kill the vLLM server), which passes it on to the training step. Training stops at the end of its
# generation batch, saves a checkpoint and exits with code 75; the script then requeues the job, and the requeued job
# runs the same command, which resumes from that checkpoint. Give the stop more time with `sbatch --signal=B:USR1@<s>`.
set -euo pipefail

usage() { sed -n '11,26p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
die() { echo "error: $*" >&2; exit 2; }

CONFIG="" ACCELERATE_CONFIG="recipes/accelerate_configs/zero3.yaml" GPUS_PER_NODE=8 TP=1 PORT=8000 MAIN_PORT=29500
HEALTH_TIMEOUT=1800 DRY_RUN=0 NODELIST="" MODEL="" EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --config) CONFIG="${2:?--config needs a value}"; shift 2 ;;
    --accelerate-config) ACCELERATE_CONFIG="${2:?--accelerate-config needs a value}"; shift 2 ;;
    --gpus-per-node) GPUS_PER_NODE="${2:?--gpus-per-node needs a value}"; shift 2 ;;
    --tp) TP="${2:?--tp needs a value}"; shift 2 ;;
    --port) PORT="${2:?--port needs a value}"; shift 2 ;;
    --main-port) MAIN_PORT="${2:?--main-port needs a value}"; shift 2 ;;
    --model) MODEL="${2:?--model needs a value}"; shift 2 ;;
    --health-timeout) HEALTH_TIMEOUT="${2:?--health-timeout needs a value}"; shift 2 ;;
    --nodelist) NODELIST="${2:?--nodelist needs a value}"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

[[ -n "$CONFIG" ]] || die "--config <recipe.yaml> is required"
[[ -f "$CONFIG" ]] || die "recipe '$CONFIG' does not exist"
[[ -f "$ACCELERATE_CONFIG" ]] || die "accelerate config '$ACCELERATE_CONFIG' does not exist"
for value in "$GPUS_PER_NODE" "$TP" "$PORT" "$MAIN_PORT"; do
  [[ "$value" =~ ^[1-9][0-9]*$ ]] || die "expected a positive integer, got '$value'"
done
(( GPUS_PER_NODE % TP == 0 )) || die "--gpus-per-node $GPUS_PER_NODE is not a multiple of --tp $TP"

if [[ -z "$NODELIST" ]]; then
  [[ -n "${SLURM_JOB_NODELIST:-}" ]] || die "not inside a SLURM allocation; submit with sbatch or pass --nodelist"
  NODELIST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tr '\n' ' ')
fi
read -r -a nodes <<< "$NODELIST"
(( ${#nodes[@]} >= 2 )) || die "need at least 2 nodes (training + vLLM), got ${#nodes[@]}: '$NODELIST'"
VLLM_NODE="${nodes[-1]}"
TRAIN_NODES=("${nodes[@]:0:${#nodes[@]}-1}")
NUM_MACHINES=${#TRAIN_NODES[@]}
NUM_PROCESSES=$(( NUM_MACHINES * GPUS_PER_NODE ))
MAIN_NODE="${TRAIN_NODES[0]}"
DP=$(( GPUS_PER_NODE / TP ))

if [[ -z "$MODEL" ]]; then
  MODEL=$(python -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["model_name_or_path"])' "$CONFIG") \
    || die "could not read model_name_or_path from '$CONFIG'; pass --model"
fi

SERVE_CMD=(trl vllm-serve --model "$MODEL" --tensor_parallel_size "$TP" --data_parallel_size "$DP"
           --host 0.0.0.0 --port "$PORT")
# machine_rank comes from SLURM on each training node: one task per node, SLURM_NODEID 0..NUM_MACHINES-1.
TRAIN_CMD=(accelerate launch --config_file "$ACCELERATE_CONFIG" --num_machines "$NUM_MACHINES"
           --num_processes "$NUM_PROCESSES" --machine_rank '$SLURM_NODEID' --main_process_ip "$MAIN_NODE"
           --main_process_port "$MAIN_PORT" --rdzv_backend static
           -m riskpo_trl.scripts.train --config "$CONFIG" --vllm_mode server --vllm_server_host "$VLLM_NODE"
           --vllm_server_port "$PORT" ${EXTRA[@]+"${EXTRA[@]}"})

if (( DRY_RUN )); then
  echo "vllm node: $VLLM_NODE"
  echo "train nodes: ${TRAIN_NODES[*]} ($NUM_PROCESSES processes)"
  printf 'vllm: %s\n' "${SERVE_CMD[*]}"
  printf 'train: %s\n' "${TRAIN_CMD[*]}"
  exit 0
fi

STOPPED=75  # riskpo_trl.job.preemption.STOPPED_EXIT_CODE: stopped at a checkpoint; the same command resumes
STOP_REQUESTED=0 TERMINATING=0 SIGNALLED=0 TRAIN_PID=""
requeue() {
  echo "Training stopped at a checkpoint: requeueing job $SLURM_JOB_ID; it resumes from that checkpoint."
  scontrol requeue "$SLURM_JOB_ID"
  exit "$STOPPED"
}
on_usr1() {  # SLURM's early warning: pass it on to the training step (srun forwards it to every process of the step)
  STOP_REQUESTED=1 SIGNALLED=1
  if [[ -n "$TRAIN_PID" ]]; then
    echo "SIGUSR1: asking the training step to stop at its next checkpoint."
    kill -USR1 "$TRAIN_PID" 2>/dev/null || true
  fi
}
trap on_usr1 USR1
# SIGTERM (scancel, preemption, the time limit) reaches every step from SLURM itself: do not pass it on, wait for the
# step to save, and do not requeue (a preemption that requeues does it itself; scancel must not be undone).
trap 'TERMINATING=1 SIGNALLED=1' TERM

mkdir -p logs
srun --nodes=1 --ntasks=1 --nodelist="$VLLM_NODE" "${SERVE_CMD[@]}" &
SERVER_PID=$!
trap 'kill "$SERVER_PID" 2>/dev/null || true' EXIT

echo "Waiting up to ${HEALTH_TIMEOUT}s for the vLLM server on $VLLM_NODE:$PORT ..."
deadline=$(( SECONDS + HEALTH_TIMEOUT ))
until curl -sf "http://$VLLM_NODE:$PORT/health" > /dev/null; do
  (( ! STOP_REQUESTED )) || requeue  # nothing trained yet: the last checkpoint is still the one to resume from
  kill -0 "$SERVER_PID" 2>/dev/null || die "the vLLM server step exited before becoming healthy (see logs/)"
  (( SECONDS < deadline )) || die "the vLLM server was not healthy after ${HEALTH_TIMEOUT}s"
  sleep 10
done
(( ! STOP_REQUESTED )) || requeue

# Each training node runs this through bash -c, so that $SLURM_NODEID expands there. The launcher ignores SIGUSR1 (by
# default it would die of it, and SLURM would then kill the step); the training processes install their own handler.
# The launcher reports the processes' exit code 75 as a failure (exit 1), so the stop file carries it past it.
NODE_CMD="trap '' USR1; trap : TERM INT
export RISKPO_STOP_FILE=\"\${TMPDIR:-/tmp}/riskpo-stop-\$SLURM_JOB_ID-\$SLURM_NODEID\"; rm -f \"\$RISKPO_STOP_FILE\"
$(printf '%q ' "${TRAIN_CMD[@]}" | sed 's/\\\$SLURM_NODEID/$SLURM_NODEID/')
status=\$?; if [[ -s \"\$RISKPO_STOP_FILE\" ]]; then rm -f \"\$RISKPO_STOP_FILE\"; exit $STOPPED; fi; exit \$status"
srun --nodes="$NUM_MACHINES" --ntasks="$NUM_MACHINES" --ntasks-per-node=1 --nodelist="$(IFS=,; echo "${TRAIN_NODES[*]}")" \
  bash -c "$NODE_CMD" &
TRAIN_PID=$!
# `wait` returns early when a trapped signal arrives: wait again until the step itself has ended.
while :; do
  SIGNALLED=0
  status=0; wait "$TRAIN_PID" || status=$?
  (( SIGNALLED && status > 128 )) || break
done
(( status != STOPPED || ! STOP_REQUESTED || TERMINATING )) || requeue
exit "$status"

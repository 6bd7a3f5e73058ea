#!/usr/bin/env bash
# MAD's six tasks on this CPU (issue 43, section 3): configs/mad.py's mini (a 64-wide
# 2-layer model on MAD's baseline data, 1,000 steps of batch 64, lr 1e-3 cosine; MAD's
# baseline difficulty of each task) for the 13 variants below, seeds 0 and 1, one lra.sweep
# queue per seed (the two CPU cores), a sweep folder per task. About 4-7 CPU-minutes a run
# (transformer on in_context_recall: 4 alone, 574 s of wall time beside two other training
# jobs on the 2 cores; mamba2, with mamba_ssm's GPU-tuned d_state 128 / chunk 256: 16-35
# minutes), so the 78 runs of a seed take 6-9 hours of one core:
# the fast variants first, and the tasks by run time (compression and memorization have
# L 32, a quarter of the others' tokens; selective copying L 256), so that a stopped grid
# has the most complete columns; run it again to continue (finished runs are skipped,
# unfinished ones resume from their checkpoints). SEEDS picks the queues (default "0 1",
# one per seed).
#
#   scripts/mad_cpu_grid.sh [DIR]                                  # default workdirs/mad_grid
#   SEEDS=2 scripts/mad_cpu_grid.sh                                # a third seed, one queue
#   python -m lra.synthetic_report DIR --out=results/cpu/mad_grid  # MAD's table (_mad.md)
#   MODELS=kda,rwkv7 TASKS="compression memorization" SEEDS=0 scripts/mad_cpu_grid.sh DIR
#                                                      # other rows / tasks (issue 71's rows)
#   STATUS=1 scripts/mad_cpu_grid.sh DIR     # runs nothing: each sweep's lra.sweep --status
#   FINISHED_IN=results/cpu/mad_2025_runs.jsonl scripts/mad_cpu_grid.sh DIR
#                  # the runs that record holds count as finished (lra.sweep --finished_in)
#   FOREGROUND=1 SEEDS="0 1" scripts/mad_cpu_grid.sh DIR   # one queue, the seeds in turn,
#                  # printing to stdout (scripts/cpu_grids.sh: one copy per core shares it)
set -u
DIR=${1:-workdirs/mad_grid}
MODELS=${MODELS:-transformer,linear,retnet,gla,deltanet,gated_deltanet,mamba2,local,s4d,s5,mega,lru,performer}
TASKS=${TASKS:-"in_context_recall noisy_in_context_recall compression memorization
       fuzzy_in_context_recall selective_copying"}
PY=${PYTHON:-python}
FLAG=(); [ -n "${STATUS:-}" ] && FLAG=(--status)
[ -n "${FINISHED_IN:-}" ] && FLAG+=(--finished_in="$FINISHED_IN")
[ -z "${STATUS:-}" ] && mkdir -p "$DIR"
queue() {  # queue SEED
    for task in $TASKS; do
        "$PY" -m lra.sweep --task=mad --models=$MODELS --config_arg="task=$task,mini" \
            --seeds="$1" --sweep_dir="$DIR/$task" "${FLAG[@]}"
    done
}
for seed in ${SEEDS:-0 1}; do
    if [ -n "${STATUS:-}${FOREGROUND:-}" ]; then queue "$seed"
    else queue "$seed" >>"$DIR/queue$seed.log" 2>&1 & fi
done
wait

#!/usr/bin/env bash
# MAD's six tasks on this CPU (issue 43, section 3): configs/mad.py's mini (a 64-wide
# 2-layer model on MAD's baseline data, 1,000 steps of batch 64, lr 1e-3 cosine; MAD's
# baseline difficulty of each task) for the 13 variants below, seeds 0 and 1, one lra.sweep
# queue per seed (the two CPU cores), a sweep folder per task. About 4-7 CPU-minutes a run
# (transformer on in_context_recall: 4 alone, 574 s of wall time beside two other training
# jobs on the 2 cores; mamba2, with mamba_ssm's GPU-tuned d_state 128 / chunk 256: 16-35
# minutes), so the 78 runs of a seed take 6-9 hours of one core:
# the fast variants and the three recall tasks first, so that a stopped grid has the most
# comparable rows; run it again to continue (finished runs are skipped, unfinished ones
# resume from their checkpoints).
#
#   scripts/mad_cpu_grid.sh [DIR]                                  # default workdirs/mad_grid
#   python -m lra.synthetic_report DIR --out=results/cpu/mad_grid  # MAD's table (_mad.md)
set -u
DIR=${1:-workdirs/mad_grid}
MODELS=transformer,linear,retnet,gla,deltanet,gated_deltanet,mamba2,local,s4d,s5,mega,lru,performer
TASKS="in_context_recall noisy_in_context_recall selective_copying fuzzy_in_context_recall compression memorization"
PY=${PYTHON:-python}
mkdir -p "$DIR"
queue() {  # queue SEED
    for task in $TASKS; do
        "$PY" -m lra.sweep --task=mad --models=$MODELS --config_arg="task=$task,mini" \
            --seeds="$1" --sweep_dir="$DIR/$task"
    done
}
queue 0 >"$DIR/queue0.log" 2>&1 &
queue 1 >"$DIR/queue1.log" 2>&1 &
wait

#!/usr/bin/env bash
# Bits per byte on the Wikipedia excerpt (issue 44, section 3): configs/enwik8.py's mini
# (rows of 128 bytes, 64 wide, 2 layers, batch 32, 2,000 steps at lr 1e-3, the test split
# whole) for the 15 variants below, seeds 0 and 1, one lra.sweep queue per seed (the two CPU
# cores); then Fashion-MNIST's mini (configs/fashion_mnist.py) for a similar set. A stopped
# grid resumes: finished runs are skipped, unfinished ones resume from their checkpoints.
#
#   scripts/enwik8_cpu_grid.sh [DIR]     # default workdirs/real_data; data/enwik8 holds
#                                        # the excerpt (lra/tasks/enwik8.py: how to get it)
#   python -m lra.lm_eval --workdir=DIR/enwik8   # bits per byte, 3 contexts; results/cpu/real_data.md
set -u
DIR=${1:-workdirs/real_data}
# Slowest on this CPU last, so that a stopped grid has the most rows.
LM=transformer,linear,retnet,gla,deltanet,gated_deltanet,mamba2,local,strided,s4d,transformer_xl,adaptive_span,lru,performer,reformer
IMG=transformer,linear,gla,mamba2,local,s4d
PY=${PYTHON:-python}
mkdir -p "$DIR"
lm() { "$PY" -m lra.sweep --task=enwik8 --models=$LM --config_arg=mini --seeds="$1" \
           --sweep_dir="$DIR/enwik8"; }
img() { "$PY" -m lra.sweep --task=fashion_mnist --models=$IMG --config_arg=mini \
            --seeds="$1" --sweep_dir="$DIR/fashion_mnist"; }
(lm 0; img 0) >"$DIR/queue0.log" 2>&1 &
(lm 1; img 1) >"$DIR/queue1.log" 2>&1 &
wait

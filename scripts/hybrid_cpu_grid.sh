#!/usr/bin/env bash
# Issue 45, section 3 on this CPU: gla, mamba2, gated_deltanet and linear with layer 1 (of
# 2) sliding-window attention (`local`) on MQAR (L 64, width 64: the folder the MQAR grid
# uses, scripts/mqar_cpu_grid.sh), then ListOps' mini with layer 1 softmax attention
# (`transformer`) beside the pure forms; seeds 0 and 1, one queue per seed (the two cores).
# Resumable like every lra.sweep.
#
#   scripts/hybrid_cpu_grid.sh [MQAR_DIR] [LISTOPS_DIR]
#   python -m lra.synthetic_report MQAR_DIR --out=results/cpu/mqar_grid
#   python -m lra.report LISTOPS_DIR/listops                # results/cpu/hybrids.md
set -u
MQAR=${1:-workdirs/mqar_grid}
LISTOPS=${2:-workdirs/hybrid_listops}
PY=${PYTHON:-python}
mkdir -p "$MQAR" "$LISTOPS"
mqar() { "$PY" -m lra.sweep --task=mqar --models=gla,mamba2,gated_deltanet,linear \
             --config_arg="mini,seq_len=64,d_model=64,hybrid=local" --override=hybrid.layers=1 \
             --seeds="$1" --sweep_dir="$MQAR/L64-d64-hybrid-local"; }
listops() {
    "$PY" -m lra.sweep --task=listops --models=gla,mamba2,gated_deltanet,linear \
        --config_arg="mini,hybrid=transformer" --override=hybrid.layers=1 --seeds="$1" \
        --sweep_dir="$LISTOPS/hybrid-transformer"
    "$PY" -m lra.sweep --task=listops --models=transformer,gla,mamba2,gated_deltanet,linear \
        --config_arg=mini --seeds="$1" --sweep_dir="$LISTOPS/pure"; }
(mqar 0; listops 0) >"$LISTOPS/queue0.log" 2>&1 &
(mqar 1; listops 1) >"$LISTOPS/queue1.log" 2>&1 &
wait

#!/usr/bin/env bash
# Parity with and without negative eigenvalues (issue 72's ablation): configs/state_tracking.py's
# mini (train lengths 3..40, test 40..128, then lengths 64, 128, 256) on its grazzi scaffold,
# for deltanet, gated_deltanet, mamba2 (the `neg_eig` switch: [-1, 1]; without it [0, 1]) and
# gated_deltaproduct (its layer default is fla's allow_neg_eigval=True: [0, 1] is the override).
# A resumable queue of lra.sweep runs, seed 0 of every cell first, then seeds 1 and 2 (a seed
# varies data and initialisation). About 15 CPU-minutes a run on one core.
#
#   taskset -c 1 scripts/parity_neg_eig_grid.sh [DIR]       # DIR default workdirs/st_parity
#   python -m lra.synthetic_report DIR --out=results/cpu/state_tracking_parity
set -u
DIR=${1:-workdirs/st_parity}
PY=${PYTHON:-python}
mkdir -p "$DIR"
cell() {  # cell SIGN SEEDS MODEL [lra.sweep flags...]
    local sign=$1 seeds=$2 model=$3; shift 3
    local arg=mini
    [ "$sign" = neg ] && [ "$model" != gated_deltaproduct ] && arg=mini,neg_eig
    local extra=()
    [ "$sign" = pos ] && [ "$model" = gated_deltaproduct ] && \
        extra=(--override=model_hparams.allow_neg_eigval=False)
    "$PY" -m lra.sweep --task=state_tracking --models="$model" --config_arg="$arg" \
        --seeds="$seeds" --sweep_dir="$DIR/$sign" "${extra[@]}" "$@"
}
for seeds in 0 1 2; do
    for model in deltanet mamba2 gated_deltanet gated_deltaproduct; do
        cell neg "$seeds" "$model"
        cell pos "$seeds" "$model"
    done
done

#!/usr/bin/env bash
# Parity with and without negative eigenvalues (issue 72's ablation): configs/state_tracking.py's
# mini (train lengths 3..40, test 40..128, then lengths 64, 128, 256) on its grazzi scaffold,
# for deltanet, gated_deltanet, mamba2 (the `neg_eig` switch: [-1, 1]; without it [0, 1]) and
# gated_deltaproduct (its layer default is fla's allow_neg_eigval=True: [0, 1] is the override).
# A resumable queue of lra.sweep runs, seed 0 of every cell first, then seeds 1 and 2 (a seed
# varies data and initialisation). About 20-25 minutes a run on one core beside another
# queue (gated_deltaproduct, with its 2 Householder steps a token, about an hour: 0.6 steps/s on
# 2026-12-06; its seed-0 runs had taken 2.5 hours each on a more crowded machine).
# LANGUAGE=S5 (or any language of configs/state_tracking.py) runs the same ablation on that
# word problem; MODELS and SEEDS narrow the queue.
#
#   taskset -c 1 scripts/parity_neg_eig_grid.sh [DIR]       # DIR default workdirs/st_parity
#   LANGUAGE=S5 taskset -c 0 scripts/parity_neg_eig_grid.sh workdirs/st_s5
#   python -m lra.length_report DIR --out=results/cpu/state_tracking_parity
#   STATUS=1 scripts/parity_neg_eig_grid.sh [DIR]   # runs nothing: lra.sweep --status per cell
# The cells committed in results/cpu/state_tracking_<language>_runs.jsonl (the report's
# runs record) count as finished (lra.sweep --finished_in): a fresh machine runs only the
# rest. FINISHED_IN names other records (a comma list; empty: none); the report then
# takes the record and DIR: python -m lra.length_report RECORD DIR --out=...
set -u
DIR=${1:-workdirs/st_parity}
PY=${PYTHON:-python}
LANGUAGE=${LANGUAGE:-parity}
MODELS=${MODELS:-deltanet mamba2 gated_deltanet gated_deltaproduct}
SEEDS=${SEEDS:-0 1 2}
RECORD=results/cpu/state_tracking_$(echo "$LANGUAGE" | tr 'A-Z' 'a-z')_runs.jsonl
[ -f "$RECORD" ] || RECORD=
FINISHED_IN=${FINISHED_IN-$RECORD}
FLAG=(); [ -n "${STATUS:-}" ] && FLAG=(--status)
[ -n "$FINISHED_IN" ] && FLAG+=(--finished_in="$FINISHED_IN")
[ -z "${STATUS:-}" ] && mkdir -p "$DIR"
cell() {  # cell SIGN SEEDS MODEL [lra.sweep flags...]
    local sign=$1 seeds=$2 model=$3; shift 3
    local arg=mini
    [ "$LANGUAGE" != parity ] && arg=mini,language=$LANGUAGE
    [ "$sign" = neg ] && [ "$model" != gated_deltaproduct ] && arg=$arg,neg_eig
    local extra=()
    [ "$sign" = pos ] && [ "$model" = gated_deltaproduct ] && \
        extra=(--override=model_hparams.allow_neg_eigval=False)
    "$PY" -m lra.sweep --task=state_tracking --models="$model" --config_arg="$arg" \
        --seeds="$seeds" --sweep_dir="$DIR/$sign" "${extra[@]}" "${FLAG[@]}" "$@"
}
for seeds in $SEEDS; do
    for model in $MODELS; do
        cell neg "$seeds" "$model"
        cell pos "$seeds" "$model"
    done
done

#!/usr/bin/env bash
# State tracking across the catalogue (issue 72): configs/state_tracking.py's mini (parity
# by default: train lengths 3..40, test 40..128, then lengths 64, 128 and 256) on its
# grazzi scaffold, every variant at its default transitions (the delta rule and Mamba-2 in
# [0, 1]; their [-1, 1] rows are scripts/parity_neg_eig_grid.sh's), for the 13 variants of
# results/cpu/mqar_grid.md, then issue 71's rows. A resumable queue of lra.sweep runs, seed
# 0 of every variant first, then seeds 1 and 2 (a seed varies data and initialisation).
# About 12-25 minutes a run on one core beside another queue (gated_deltaproduct about an
# hour); `lra.sweep --status` (STATUS=1) times what is left from the finished runs.
#
#   taskset -c 1 scripts/state_tracking_cpu_grid.sh [DIR]    # DIR default workdirs/st_parity/pos
#   LANGUAGE=S5 scripts/state_tracking_cpu_grid.sh workdirs/st_s5/pos   # another word problem
#   MODELS="transformer gla" SEEDS=0 scripts/state_tracking_cpu_grid.sh   # narrow the queue
#   STATUS=1 scripts/state_tracking_cpu_grid.sh [DIR]        # runs nothing: lra.sweep --status
#   python -m lra.length_report results/cpu/state_tracking_parity_runs.jsonl DIR \
#       --out=results/cpu/state_tracking_parity
#
# The cells committed in results/cpu/state_tracking_<language>_runs.jsonl (the report's runs
# record, shared with the [-1, 1] ablation: its [0, 1] cells are these) count as finished
# (lra.sweep --finished_in): a fresh machine runs only the rest. FINISHED_IN names other
# records (a comma list; empty: none).
set -u
LANGUAGE=${LANGUAGE:-parity}
language=$(echo "$LANGUAGE" | tr 'A-Z' 'a-z')
DIR=${1:-workdirs/st_$language/pos}
PY=${PYTHON:-python}
GRID13="transformer gla deltanet gated_deltanet mamba2 retnet linear local s4d mega s5 performer lru"
ROWS2025="kda gated_deltaproduct fox rwkv7 nsa moba loglinear_mamba2 path based hyena"
MODELS=${MODELS:-$GRID13 $ROWS2025}
SEEDS=${SEEDS:-0 1 2}
AT_TRAINING_LENGTH=${AT_TRAINING_LENGTH:-hyena}
RECORD=results/cpu/state_tracking_${language}_runs.jsonl
[ -f "$RECORD" ] || RECORD=
FINISHED_IN=${FINISHED_IN-$RECORD}
ARG=mini
[ "$LANGUAGE" != parity ] && ARG=mini,language=$LANGUAGE
FLAG=(); [ -n "${STATUS:-}" ] && FLAG=(--status)
[ -n "$FINISHED_IN" ] && FLAG+=(--finished_in="$FINISHED_IN")
[ -z "${STATUS:-}" ] && mkdir -p "$DIR"
for seed in $SEEDS; do
    for model in $MODELS; do
        extra=()  # DeltaProduct's layer default is fla's [-1, 1]: its [0, 1] is an override
        [ "$model" = gated_deltaproduct ] && \
            extra=(--override=model_hparams.allow_neg_eigval=False)
        # hyena's trained position table z is shaped by the length: lengths past training
        # are refused (lra.training.lengths), so it is tested at its training lengths only.
        [[ " $AT_TRAINING_LENGTH " == *" $model "* ]] && extra+=(--override=eval_lengths=)
        "$PY" -m lra.sweep --task=state_tracking --models="$model" --config_arg="$ARG" \
            --seeds="$seed" --sweep_dir="$DIR" "${extra[@]}" "${FLAG[@]}"
    done
done

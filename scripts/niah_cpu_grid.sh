#!/usr/bin/env bash
# Needle in a haystack across the catalogue (issue 72): configs/niah.py's mini (RULER's
# single_2 row over our tokens, trained at L 256, tested at 512, 1,024 and 2,048 and at five
# needle depths) on its zoology scaffold (no positions, one shared 3-tap convolution, the
# variants' own off, 2 heads, no MLP), for the 13 variants of results/cpu/mqar_grid.md, then
# issue 71's rows. A resumable queue of lra.sweep runs, seed 0 of every variant first, then
# seeds 1 and 2 (a seed varies data and initialisation). About 10-20 CPU-minutes a run on
# one core, most of it the 2K tests.
#
#   taskset -c 1 scripts/niah_cpu_grid.sh [DIR]       # DIR default workdirs/niah_mini
#   MODELS="gla mamba2" SEEDS="1 2" scripts/niah_cpu_grid.sh   # narrow the queue
#   LRS="1e-3 1e-2" MODELS=gla scripts/niah_cpu_grid.sh   # other learning rates (the mini's
#       is 3e-3); the report shows each row's best on validation (lra.length_report)
#   STATUS=1 scripts/niah_cpu_grid.sh [DIR]           # runs nothing: lra.sweep --status
#   python -m lra.length_report results/cpu/niah_mini_runs.jsonl DIR --out=results/cpu/niah_mini
#
# hyena is tested at its training length only (eval_lengths emptied; its depths at 256):
# its implicit filter reads a trained position table z of max_len rows (Zoology registers
# it as a parameter), so its weights are shaped by the length, as learned positions are,
# and lra.training.lengths refuses them at 512 and past (AT_TRAINING_LENGTH names such rows).
#
# The cells committed in results/cpu/niah_mini_runs.jsonl (the report's runs record) count
# as finished (lra.sweep --finished_in): a fresh machine runs only the rest. FINISHED_IN
# names other records (a comma list; empty: none).
set -u
DIR=${1:-workdirs/niah_mini}
PY=${PYTHON:-python}
GRID13="transformer gla deltanet gated_deltanet mamba2 retnet linear local s4d mega s5 performer lru"
ROWS2025="kda gated_deltaproduct fox rwkv7 nsa moba loglinear_mamba2 path based hyena"
MODELS=${MODELS:-$GRID13 $ROWS2025}
SEEDS=${SEEDS:-0 1 2}
LRS=${LRS:-}
AT_TRAINING_LENGTH=${AT_TRAINING_LENGTH:-hyena}
RECORD=results/cpu/niah_mini_runs.jsonl
[ -f "$RECORD" ] || RECORD=
FINISHED_IN=${FINISHED_IN-$RECORD}
FLAG=(); [ -n "${STATUS:-}" ] && FLAG=(--status)
[ -n "$FINISHED_IN" ] && FLAG+=(--finished_in="$FINISHED_IN")
[ -z "${STATUS:-}" ] && mkdir -p "$DIR"
for seed in $SEEDS; do
    for model in $MODELS; do
        ONLY=()
        [[ " $AT_TRAINING_LENGTH " == *" $model "* ]] && ONLY=(--override=eval_lengths=)
        if [ -z "$LRS" ]; then
            "$PY" -m lra.sweep --task=niah --models="$model" --config_arg=mini \
                --seeds="$seed" --sweep_dir="$DIR" "${ONLY[@]}" "${FLAG[@]}"
        fi
        for lr in $LRS; do
            "$PY" -m lra.sweep --task=niah --models="$model" --config_arg=mini \
                --seeds="$seed" --sweep_dir="$DIR" --override=learning_rate="$lr" \
                "${ONLY[@]}" "${FLAG[@]}"
        done
    done
done

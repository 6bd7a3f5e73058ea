#!/usr/bin/env bash
# MQAR under the controlled scaffold (issue 68): configs/mqar.py's mini with its default
# scaffold (configs/scaffold.py ZOOLOGY_MQAR: no positions, one shared 3-tap convolution
# before every mixer, the variants' own convolutions off, 2 heads, RetNet its 8), the 13
# variants of results/cpu/mqar_grid.md and the 2025 rows (kda, gated_deltaproduct, fox, rwkv7,
# nsa, loglinear_mamba2), and the ablations that show what the scaffold does,
# in two resumable queues of lra.sweep (the two CPU cores). Seeds vary data and
# initialisation (data_seed_from_run). A stopped grid resumes: finished runs are skipped,
# unfinished ones resume from their checkpoints.
#
#   scripts/mqar_scaffold_grid.sh [DIR] [STAGE]   # DIR default workdirs/mqar_scaffold
#   STATUS=1 scripts/mqar_scaffold_grid.sh [DIR] [STAGE]   # runs nothing: each sweep's
#                                  # lra.sweep --status (where its runs stand, time left)
#   python -m lra.synthetic_report DIR --out=results/cpu/mqar_scaffold_zoology_init
#
# The scaffold declares Zoology's initialisation and tied head since 2026-12-07
# (scaffold.init, scaffold.tie_head): the 72 cells committed in
# results/cpu/mqar_scaffold_cells_runs.jsonl, made before under each variant's own, are
# not this grid's runs and run again (their report stays as it was: mqar_scaffold.md).
# A cell committed in its report's record (above) counts as finished (lra.sweep --finished_in:
# a fresh machine runs only the rest); FINISHED_IN names other records (a comma list;
# empty: none).
#
# STAGE: all (default), or one of the functions below. Order: seed 0 of every cell at the
# mini's lr (3e-3), the ablations, then seeds 1-2, then lr 1e-3 and 1e-2 (Zoology picks
# the best lr per cell on validation: logspace(-4, -2, 4) there).
set -u
DIR=${1:-workdirs/mqar_scaffold}
STAGE=${2:-all}
PY=${PYTHON:-python}
RECORD=results/cpu/mqar_scaffold_zoology_init_runs.jsonl  # the report above writes it
[ -f "$RECORD" ] || RECORD=
FINISHED_IN=${FINISHED_IN-$RECORD}
FLAG=(); [ -n "${STATUS:-}" ] && FLAG=(--status)
[ -n "$FINISHED_IN" ] && FLAG+=(--finished_in="$FINISHED_IN")
MODELS=transformer,gla,deltanet,gated_deltanet,mamba2,retnet,linear,local,s4d,mega,s5,performer,lru,kda,gated_deltaproduct,fox,rwkv7,nsa,loglinear_mamba2  # from kda on: issue 71
ABLATED=linear,retnet,performer,gla,deltanet
[ -z "${STATUS:-}" ] && mkdir -p "$DIR"
run() {  # run L WIDTH SEEDS MODELS [lra.sweep flags...]
    local L=$1 W=$2 S=$3 M=$4; shift 4
    "$PY" -m lra.sweep --task=mqar --models="$M" --config_arg="mini,seq_len=$L,d_model=$W" \
        --seeds="$S" --sweep_dir="$DIR/L$L-d$W" "${FLAG[@]}" "$@"
}
hybrids() {  # run L WIDTH SEEDS: one attention layer (rotary, fla's) or a window of L / 2
    local L=$1 W=$2 S=$3
    "$PY" -m lra.sweep --task=mqar --models=gla,mamba2,gated_deltanet \
        --config_arg="mini,seq_len=$L,d_model=$W,hybrid=transformer" \
        --override=hybrid.layers=1 --seeds="$S" --sweep_dir="$DIR/L$L-d$W" "${FLAG[@]}"
    "$PY" -m lra.sweep --task=mqar --models=gla,mamba2,gated_deltanet \
        --config_arg="mini,seq_len=$L,d_model=$W,hybrid=local" --override=hybrid.layers=1 \
        --override=hybrid.window=$((L / 2)) --seeds="$S" --sweep_dir="$DIR/L$L-d$W" "${FLAG[@]}"
}
ablations() {  # run L WIDTH SEEDS: the shared convolution off; RetNet at 1 head; local's
    local L=$1 W=$2 S=$3  # window covering every key-query gap
    run "$L" "$W" "$S" "$ABLATED" --override=scaffold.short_conv=0 \
        --override=scaffold.ablate=short_conv
    run "$L" "$W" "$S" retnet --override=scaffold.keep.retnet.num_heads=1
    run "$L" "$W" "$S" local --override=model_hparams.window="$L"
}
queue_a() {
    run 128 64 0 "$MODELS"; ablations 128 64 0; hybrids 128 64 0
    run 128 64 1,2 "$MODELS"; ablations 128 64 1,2; hybrids 128 64 1,2
    run 128 64 0,1,2 "$MODELS" --grid=learning_rate=1e-3,1e-2
}
queue_b() {
    run 256 64 0 "$MODELS"; ablations 256 64 0
    run 128 128 0,1,2 "$MODELS"; run 256 128 0 "$MODELS"
    run 256 64 1,2 "$MODELS"; run 256 128 1,2 "$MODELS"
}
case "$STAGE" in
    all) if [ -n "${STATUS:-}" ]; then queue_a; queue_b
         else queue_a >"$DIR/queue_a.log" 2>&1 & queue_b >"$DIR/queue_b.log" 2>&1 & wait; fi ;;
    queue_a|queue_b) "$STAGE" ;;
    *) echo "unknown stage $STAGE: all, queue_a, queue_b" >&2; exit 2 ;;
esac

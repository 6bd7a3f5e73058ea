#!/usr/bin/env bash
# MQAR on this CPU (issue 43, section 3): configs/mqar.py's mini (V 256, 20,000 training
# examples, batch 64, 1,200 steps, lr 3e-3 cosine, 2 layers without MLP, 1 head) for the 13
# variants below (and issue 45's hybrids), at Zoology's (L, kv) = (64, 4) and (128, 8) [(256, 16) last, if time
# allows], widths 64 and 128, seeds 0-2, in two queues of lra.sweep (one per length: the
# two CPU cores). Each cell (L, width) is its own sweep folder; a stopped grid resumes
# (finished runs are skipped, unfinished ones resume from their checkpoints).
# At L 256 the mini runs 3,600 steps with Zoology's early stop at 99% validation accuracy
# (configs/mqar.py: attention forms the binding after 1,200 steps there).
#
#   scripts/mqar_cpu_grid.sh [DIR]          # default workdirs/mqar_grid
#   python -m lra.synthetic_report DIR --out=results/cpu/mqar_grid   # figure, tables
set -u
DIR=${1:-workdirs/mqar_grid}
# The slowest on this CPU last (performer, lru, mega, s5: 4-10 minutes a run at L 64 on
# the shared cores, against 1-2 for the others), so that a stopped grid has the most rows.
MODELS=transformer,linear,retnet,gla,deltanet,gated_deltanet,mamba2,local,s4d,s5,mega,lru,performer
PY=${PYTHON:-python}
mkdir -p "$DIR"
cell() {  # cell L WIDTH SEED
    "$PY" -m lra.sweep --task=mqar --models=$MODELS --config_arg="mini,seq_len=$1,d_model=$2" \
        --seeds="$3" --sweep_dir="$DIR/L$1-d$2"
}
# Issue 45's hybrids: gla, mamba2, gated_deltanet and linear with layer 1 (of 2) softmax
# attention, or sliding-window attention (local), named e.g. gla+transformer@1.
hcell() {  # hcell L WIDTH SEED MIXER
    "$PY" -m lra.sweep --task=mqar --models=gla,mamba2,gated_deltanet,linear \
        --config_arg="mini,seq_len=$1,d_model=$2,hybrid=$4" --override=hybrid.layers=1 \
        --seeds="$3" --sweep_dir="$DIR/L$1-d$2-hybrid-$4"
}
# Two seeds of a width before the next width: a ranking needs the spread first.
short() { cell 64 64 0; cell 64 64 1; hcell 64 64 0 transformer; hcell 64 64 1 transformer;
          cell 64 128 0; cell 64 128 1; hcell 64 64 0 local; hcell 64 64 1 local;
          cell 64 64 2; cell 64 128 2; }
long() { cell 128 64 0; cell 128 64 1; cell 128 128 0; cell 128 128 1; cell 128 64 2;
         cell 128 128 2; cell 256 64 0; }
short >"$DIR/queue_L64.log" 2>&1 &
long >"$DIR/queue_L128.log" 2>&1 &
wait

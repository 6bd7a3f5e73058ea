#!/usr/bin/env bash
# Every CPU grid the open issues (68, 72) still hold, in the order they are to run, as one
# queue: the issue with the fewest CPU-hours left first, so that issues close one by one
# (72, about 60 CPU-hours; then 68: MAD under mad-lab's initialisation, about 60, and the
# MQAR grid, at most about 230). Within 72, its own tasks (niah, flip-flop) before the
# state-tracking grids,
# whose scaffold declares Grazzi et al.'s initialisation since 2026-12-07 (the committed
# parity runs, made under each variant's own, run again under it: the [-1, 1] ablation
# first, then the catalogue). Start one copy per core: the copies share the
# runs (lra.sweep leaves a run another live process holds to it and goes on to the next),
# so N copies work through the list N runs at a time. Finished runs are skipped (their
# workdirs, and the committed runs records each grid script passes as --finished_in: a
# fresh machine resumes where the committed results end); stopped runs resume from their
# checkpoints. Each step's own script says what its runs are and how to report them;
# results/README.md states what each still costs.
#
#   for core in 0 1; do   # under the newest JAX: scripts/jax_env.sh run latest bash ...
#       setsid nohup taskset -c $core bash scripts/cpu_grids.sh \
#           > workdirs/cpu_grids.$core.log 2>&1 < /dev/null &
#   done
#   STATUS=1 scripts/cpu_grids.sh   # runs nothing: each sweep's lra.sweep --status, then
#                                   # each step's runs and time left, and the queue's
#   STATUS=1 scripts/jax_env.sh run latest bash scripts/cpu_grids.sh   # the same there
#                                   # (jax_env.sh hands these knobs into its root)
#   LIST=1 scripts/cpu_grids.sh     # the steps, in order
#   FROM=4 scripts/cpu_grids.sh     # from step 4 on
#   STATUS=1 FROM=10 TO=12 scripts/cpu_grids.sh   # steps 10 to 12 only
#
# Stop a copy with `kill -TERM -- -<its process group>`: its run saves and it stops.
set -u
# The queue is one function, which bash reads whole before it runs: editing this file while
# copies run changes only the copies started after (a plain script is read as it runs).
main() {
cd "$(dirname "$0")/.."
for bound in FROM TO; do
    if [ -n "${!bound:-}" ] && ! [[ "${!bound}" =~ ^[1-9][0-9]*$ ]]; then
        echo "error: $bound=${!bound} is not a step number (1, 2, ...; LIST=1 lists them)" >&2
        exit 2
    fi
done
PY=${PYTHON:-python}
ROWS2025=kda,gated_deltaproduct,fox,rwkv7,nsa,moba,loglinear_mamba2,path,based,hyena
# MAD's 13-variant grid (results/cpu/mad_grid_mad.md) less the two rows ROWS2025 joins
MAD_OLD=linear,retnet,gla,deltanet,mamba2,local,s4d,s5,mega,lru,performer
niah_ablations() {  # the rows of niah_mini.md's ablations, at seeds 1 and 2
    "$PY" -m lra.sweep --task=niah --models=gated_deltanet,mamba2,gla,retnet \
        --config_arg=mini --seeds=1,2 --sweep_dir=workdirs/niah_mini \
        --override=model_hparams.decay=False \
        --finished_in=results/cpu/niah_mini_runs.jsonl ${STATUS:+--status}
    "$PY" -m lra.sweep --task=niah --models=transformer --config_arg=mini --seeds=1,2 \
        --sweep_dir=workdirs/niah_rotary --override=scaffold.pos_emb=rotary \
        --override=scaffold.ablate=positions \
        --finished_in=results/cpu/niah_mini_runs.jsonl ${STATUS:+--status}
}
is_function() { [[ "$1" != *=* ]] && declare -F "$1" > /dev/null; }
n=0
step() {  # step ISSUE WHAT -- COMMAND...: one step of the queue
    local issue=$1 what=$2; shift 3
    n=$((n + 1))
    if [ -n "${LIST:-}" ]; then  # a function of this script: its commands, on one line
        local body="$*"
        is_function "$1" && body="$1: $(declare -f "$1" | sed '1,2d;$d' |
            tr -s ' \n\\' ' ' | sed 's/^ //')"
        echo "$n. issue $issue: $what: $body"; return
    fi
    [ "$n" -lt "${FROM:-1}" ] && return
    [ -n "${TO:-}" ] && [ "$n" -gt "$TO" ] && return
    echo "== $(date -u +%FT%TZ) step $n (issue $issue): $what"
    local run=(env); is_function "$1" && run=()  # a function of this script runs as it is
    if [ -n "${STATUS:-}" ]; then "${run[@]}" "$@" | totals "step $n"; else "${run[@]}" "$@"; fi
}
# STATUS=1: each step's runs left and time left, summed from its sweeps' --status summary
# lines (lra/runs/status.py summary: "<n> runs: <k> finished, ...; time left: about <t>
# (h|min) ...; <u> runs without an estimate" or "no estimate yet"), and the whole queue's.
totals() {  # totals LABEL < status lines: the lines, then the step's sums
    awk -v label="$1" -v file="${TOTALS:-/dev/null}" '
        { print; fflush() }
        /^[0-9]+ runs?: / {
            n = $1; done = 0; rest = $0
            while (match(rest, /[0-9]+ (finished|refused)/)) {
                split(substr(rest, RSTART, RLENGTH), a, " "); done += a[1]
                rest = substr(rest, RSTART + RLENGTH)
            }
            left += n - done
            if (match($0, /time left: about [0-9.]+ (h|min)/)) {
                split(substr($0, RSTART, RLENGTH), b, " ")
                hours += (b[5] == "h") ? b[4] : b[4] / 60
            }
            if ($0 ~ /no estimate yet/) unknown += n - done
            else if (match($0, /[0-9]+ runs? without an estimate/)) {
                split(substr($0, RSTART, RLENGTH), c, " "); unknown += c[1]
            }
        }
        END {
            printf "%s: %d runs left, about %.1f h of one core for %d of them", label, left,
                hours, left - unknown
            if (unknown) printf "; %d without an estimate", unknown
            printf "\n"
            printf "%d %.2f %d\n", left, hours, unknown >> file
        }'
}
[ -n "${STATUS:-}" ] && [ -z "${TOTALS:-}" ] && TOTALS=$(mktemp) && trap 'rm -f "$TOTALS"' EXIT
record() {  # record FILE: FILE when it is committed, else nothing (a first run of a grid)
    [ -f "$1" ] && echo "$1"
}
step 72 "niah, issue 71's rows, seed 0" -- \
    MODELS="${ROWS2025//,/ }" SEEDS=0 bash scripts/niah_cpu_grid.sh workdirs/niah_mini
step 72 "flip-flop, seed 1" -- \
    "$PY" -m lra.sweep --task=flipflop --models=transformer,gla,mamba2,deltanet \
    --config_arg=mini --seeds=1 --sweep_dir=workdirs/flipflop \
    --finished_in=results/cpu/flipflop_mini_runs.jsonl ${STATUS:+--status}
step 72 "niah, every row, seeds 1 and 2" -- \
    SEEDS="1 2" bash scripts/niah_cpu_grid.sh workdirs/niah_mini
step 72 "niah's ablations (decay held at 1; attention with rotary positions), seeds 1-2" -- \
    niah_ablations
step 72 "parity's [-1, 1] ablation under the scaffold's initialisation (Grazzi et al.'s), seeds 0-1" -- \
    SEEDS="0 1" bash scripts/parity_neg_eig_grid.sh workdirs/st_parity
step 72 "parity across the catalogue, seed 0" -- \
    SEEDS=0 bash scripts/state_tracking_cpu_grid.sh workdirs/st_parity/pos
step 72 "S5 across the catalogue, seed 0" -- \
    LANGUAGE=S5 SEEDS=0 bash scripts/state_tracking_cpu_grid.sh workdirs/st_s5/pos
step 72 "parity across the catalogue, seeds 1 and 2" -- \
    SEEDS="1 2" bash scripts/state_tracking_cpu_grid.sh workdirs/st_parity/pos
step 72 "S5, seeds 1 and 2" -- \
    LANGUAGE=S5 SEEDS="1 2" bash scripts/state_tracking_cpu_grid.sh workdirs/st_s5/pos
# MAD's scaffold declares mad-lab's initialisation since 2026-12-07: every row again under
# it (mad_2025's 144 runs, seeds 0-1, were made under each variant's own: that grid is
# complete and stays the `own` record), seed 0 of all 23 rows before seed 1.
step 68 "MAD under MAD's protocol, scaffold and initialisation, all 23 rows, seeds 0-1" -- \
    FOREGROUND=1 MODELS=transformer,gated_deltanet,$ROWS2025,$MAD_OLD SEEDS="0 1" \
    FINISHED_IN=$(record results/cpu/mad_protocol_runs.jsonl) \
    bash scripts/mad_cpu_grid.sh workdirs/mad_protocol
step 68 "MQAR under the controlled scaffold, L 128: seeds, ablations, hybrids, the lr grid" -- \
    bash scripts/mqar_scaffold_grid.sh workdirs/mqar_scaffold queue_a
step 68 "MQAR under the controlled scaffold, L 256 and width 128" -- \
    bash scripts/mqar_scaffold_grid.sh workdirs/mqar_scaffold queue_b
[ -z "${LIST:-}${STATUS:-}" ] && echo "== $(date -u +%FT%TZ) every step done"
[ -n "${STATUS:-}" ] && awk '{ left += $1; hours += $2; unknown += $3 } END {
    printf "every step: %d runs left, about %.1f h of one core for %d of them", left, hours,
        left - unknown
    if (unknown) printf "; %d without an estimate", unknown
    printf "\n" }' "$TOTALS"
}
main "$@"; exit 0

#!/usr/bin/env bash
# Copies automl/unlocking_state_tracking's formal-language generator (the xLSTM repository's
# code) at one commit into a scratch dir, for theirs.py; torch and torchmetrics come from the
# torch venv of scripts/fla_comparison/setup.sh (+ `pip install torchmetrics`).
#   UST_MIRROR  bare git dir of automl/unlocking_state_tracking (default below)
#   UST_COMMIT  df8f84071e2d81783c73dbfc44a96e60f495c694
#   CMP_DIR     default /tmp/st_cmp
set -euo pipefail
UST_MIRROR=${UST_MIRROR:-/work/.mirror/automl+unlocking_state_tracking/repo}
UST_COMMIT=${UST_COMMIT:-df8f84071e2d81783c73dbfc44a96e60f495c694}
CMP_DIR=${CMP_DIR:-/tmp/st_cmp}
ROOT=xlstm/experiments
FILES=(data/__init__.py data/utils.py metrics.py
       data/formal_language/__init__.py data/formal_language/generate.py
       data/formal_language/online_generate.py data/formal_language/formal_language_dataset.py
       data/formal_language/tasks/__init__.py data/formal_language/tasks/parity.py
       data/formal_language/tasks/modular_arithmetic.py
       data/formal_language/tasks/modular_arithmetic_with_brackets.py
       data/formal_language/tasks/cycle_navigation.py data/formal_language/tasks/even_pairs.py)
for f in "${FILES[@]}"; do
  mkdir -p "$CMP_DIR/src/experiments/$(dirname "$f")"
  git -C "$UST_MIRROR" show "$UST_COMMIT:$ROOT/$f" > "$CMP_DIR/src/experiments/$f"
done
touch "$CMP_DIR/src/experiments/__init__.py"
echo "copied ${#FILES[@]} files to $CMP_DIR/src"

#!/usr/bin/env bash
# CI's stage under the newest JAX (issue 42), after `make test` on .venv's JAX: in the
# environment scripts/jax_env.sh builds (Debian 13, Python 3.13, the newest JAX on the
# package index), the kernels' tests (every kernel's CUDA lowering under an abstract H100
# and TPU export, their interpreted numerics) and the whole-model lowering tests, then one
# `runlocal` training run and a decode from it. Prints each step's time; exits non-zero on
# the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ENV=scripts/jax_env.sh
VERSION=${JAX_CI_VERSION:-latest}

step() { echo "ci_latest: $*"; }
start=$SECONDS
t=$SECONDS
$ENV build "$VERSION"
step "environment ready in $((SECONDS - t)) s ($(sed -n 2p "$($ENV path "$VERSION")/.installed"))"

t=$SECONDS
# The kernel tests and the whole-model lowering: never an empty selection (pytest's exit
# 5 would fail the stage, as it should).
$ENV run "$VERSION" python -m pytest -q -n 2 -p no:cacheprovider \
  tests/kernels tests/test_model_lowering.py
step "kernel and lowering tests in $((SECONDS - t)) s"

t=$SECONDS
# One runlocal training run of a causal language model on a tiny generated ListOps set,
# then samples from its checkpoint: the data and workdir live in the root's /tmp.
$ENV run "$VERSION" bash -c '
  set -euo pipefail
  out=/tmp/ci-latest; rm -rf "$out"; mkdir -p "$out"
  python -m lra.tasks.listops --output_dir="$out/data" --num_train_samples=256 \
    --num_valid_samples=64 --num_test_samples=64 --min_length=10 --max_length=60 \
    --max_depth=3
  python launch.py --config=configs/listops.py:model=transformer,runlocal,causal,pretrain \
    --config.data_dir="$out/data" --config.num_train_steps=20 --config.eval_frequency=20 \
    --config.checkpoint_freq=20 --workdir="$out/run"
  python -m lra.generate --workdir="$out/run" --num_samples=2 --max_new_tokens=8 \
    --data_dir="$out/data"
  test -s "$out/run/samples/samples.txt"'
step "runlocal train + decode in $((SECONDS - t)) s"
step "stage done in $((SECONDS - start)) s"

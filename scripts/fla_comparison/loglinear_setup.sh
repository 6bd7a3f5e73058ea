#!/usr/bin/env bash
# Prepare the loglinear_mamba2 / fla comparison (compare_loglinear.py): verbatim copies of
# the fla files loglinear_fla.py reads or executes, from a bare mirror of
# flash-linear-attention at one commit, and the torch venv outside the repo (setup.sh's).
#   FLA_MIRROR   bare git dir of fla-org/flash-linear-attention (default below)
#   FLA_COMMIT   bc3b101dcb713ddc5bd8924b66754eb68b5ccf89 (the commit loglinear.py ports)
#   CMP_DIR      scratch dir (default /tmp/fla_cmp): fla_src/ (the copies), *.npz (results)
#   TORCH_VENV   default /tmp/torchvenv; TORCH_SPEC default torch==2.13.0
set -euo pipefail
source "$(dirname "$0")/setup_lib.sh"
FLA_MIRROR=${FLA_MIRROR:-/work/.mirror/fla-org+flash-linear-attention/repo}
FLA_COMMIT=${FLA_COMMIT:-bc3b101dcb713ddc5bd8924b66754eb68b5ccf89}
CMP_DIR=${CMP_DIR:-/tmp/fla_cmp}

FILES=(
  fla/ops/log_linear_attn/naive.py   # naive_log_linear_attn (torch + numpy): executed as is
  fla/ops/log_linear_attn/chunk.py   # chunk_log_linear_attn (Triton; the naive op stands in), LogLinearAttentionState
  fla/layers/log_linear_mamba2.py    # LogLinearMamba2 + hmamba_*: executed as is, imports stubbed (loglinear_fla.py)
  fla/layers/mamba2.py               # apply_mask_to_padding_states (executed), causal_conv1d_fn (CUDA: re-written)
  fla/modules/layernorm_gated.py     # RMSNormGated (executed), rms_norm_ref (executed for the Triton rmsnorm_fn)
  fla/models/mamba2/configuration_mamba2.py                  # defaults: use_bias False, use_conv_bias True
  fla/models/log_linear_mamba2/configuration_log_linear_mamba2.py  # chunk_size 64
  fla/models/log_linear_mamba2/modeling_log_linear_mamba2.py       # _init_weights: A = 1..H, L = 1, D = 1
  tests/ops/test_log_linear_attn.py  # how fla calls the naive op (q, k with one group)
  LICENSE
)
resolved=$(copy_files "$FLA_MIRROR" "$FLA_COMMIT" "$CMP_DIR/fla_src" "${FILES[@]}")
echo "fla files at $resolved -> $CMP_DIR/fla_src"

torch_venv

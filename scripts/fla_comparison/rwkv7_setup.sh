#!/usr/bin/env bash
# Prepare the rwkv7 / fla comparison (results/cpu/rwkv7_vs_fla.md): verbatim copies of the
# fla files rwkv7_fla.py reads, taken from a bare mirror of flash-linear-attention at one
# commit, and the torch venv of setup.sh (created here too if missing).
#   FLA_MIRROR   bare git dir of fla-org/flash-linear-attention (default below)
#   FLA_COMMIT   bc3b101dcb713ddc5bd8924b66754eb68b5ccf89 (the commit rwkv7.py ports)
#   CMP_DIR      scratch dir (default /tmp/fla_cmp): fla_src/ (the copies), rwkv7_*.npz
#   TORCH_VENV   default /tmp/torchvenv; TORCH_SPEC default torch==2.13.0
set -euo pipefail
source "$(dirname "$0")/setup_lib.sh"
FLA_MIRROR=${FLA_MIRROR:-/work/.mirror/fla-org+flash-linear-attention/repo}
FLA_COMMIT=${FLA_COMMIT:-bc3b101dcb713ddc5bd8924b66754eb68b5ccf89}
CMP_DIR=${CMP_DIR:-/tmp/fla_cmp}

FILES=(
  fla/ops/generalized_delta_rule/dplr/naive.py  # dplr_recurrence, dplr_chunkwise (torch + einops; scale d_k^-0.5 built in)
  fla/ops/rwkv7/chunk.py                 # chunk_rwkv7 -> chunk_dplr_delta_rule(q=r, gk=w, a, b, scale)
  fla/ops/rwkv7/fused_recurrent.py       # the kernel's step: S = e^w S + b (a^T S) + k v^T (K x V)
  fla/layers/rwkv7.py                    # RWKV7Attention (Triton kernels: re-written in rwkv7_fla.py)
  fla/layers/rwkv6.py                    # LoRA (rwkv7_fla.py execs that class only)
  fla/modules/token_shift.py             # token_shift_ref (the file imports triton: that function only)
  fla/ops/rwkv7/fused_addcmul.py         # torch_addcmul_rwkv7 (idem)
  fla/ops/rwkv7/fused_k_update.py        # k_update_ref (idem)
  fla/ops/rwkv7/gate_output_correction.py  # gate_output_correction_ref (idem)
  LICENSE
)
resolved=$(copy_files "$FLA_MIRROR" "$FLA_COMMIT" "$CMP_DIR/fla_src" "${FILES[@]}")
echo "fla files at $resolved -> $CMP_DIR/fla_src"

torch_venv

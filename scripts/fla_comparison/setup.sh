#!/usr/bin/env bash
# Prepare the fla comparison: a torch venv outside the repo and verbatim copies of the fla
# files the comparisons read (kda, fox, gated_deltaproduct), taken from a bare mirror of
# flash-linear-attention at one commit.
#   FLA_MIRROR   bare git dir of fla-org/flash-linear-attention (default below)
#   FLA_COMMIT   bc3b101dcb713ddc5bd8924b66754eb68b5ccf89 (the commit kda.py ports)
#   CMP_DIR      scratch dir (default /tmp/fla_cmp): fla_src/ (the copies), *.npz (results)
#   TORCH_VENV   default /tmp/torchvenv; TORCH_SPEC default torch==2.13.0
set -euo pipefail
source "$(dirname "$0")/setup_lib.sh"
FLA_MIRROR=${FLA_MIRROR:-/work/.mirror/fla-org+flash-linear-attention/repo}
FLA_COMMIT=${FLA_COMMIT:-bc3b101dcb713ddc5bd8924b66754eb68b5ccf89}
CMP_DIR=${CMP_DIR:-/tmp/fla_cmp}

FILES=(
  fla/ops/kda/naive.py           # naive_recurrent_kda, naive_chunk_kda (torch + einops)
  fla/ops/kda/gate.py            # naive_kda_gate (the file imports triton: kda_fla.py execs that function only)
  fla/layers/kda.py              # KimiDeltaAttention (Triton kernels: re-written in kda_fla.py)
  fla/ops/kda/chunk.py           # chunk_kda's flags (l2norm in kernel, beta sigmoid, gate in kernel)
  fla/modules/fused_norm_gate.py # FusedRMSNormGated: rmsnorm(x) * w * sigmoid(g)
  fla/modules/convolution.py
  fla/modules/conv/short_conv.py # ShortConvolution: nn.Conv1d(groups=C, padding=W-1), weight C x 1 x W
  fla/modules/conv/triton/kernels.py  # causal_conv1d: weight[:, W-1] weighs the current token
  fla/modules/l2norm.py          # l2norm: x / sqrt(sum x^2 + 1e-6)
  # fox (fox_fla.py)
  fla/ops/forgetting_attn/naive.py     # naive_forgetting_attn (torch + einops)
  fla/layers/forgetting_attn.py        # ForgettingAttention (Triton kernel: re-written in fox_fla.py)
  fla/ops/forgetting_attn/parallel.py  # parallel_forgetting_attn: scale default K^-0.5, g = log f per token
  fla/ops/attn/parallel.py             # parallel_attn: cumsum of g inside (chunk_global_cumsum)
  # gated_deltaproduct (gated_deltaproduct_fla.py)
  fla/ops/gated_delta_product/naive.py      # naive_recurrent_gated_delta_product (ignores scale)
  fla/ops/gated_delta_product/chunk_ref.py  # chunk_gated_delta_product_ref (calls Triton chunk_gated_delta_rule)
  fla/ops/gated_delta_product/chunk.py      # chunk_gated_delta_product: l2norm in kernel, scale default, g interleave
  fla/ops/gated_delta_rule/naive.py         # naive_recurrent_gated_delta_rule (stands in for the Triton rule in chunk_ref)
  fla/layers/gated_deltaproduct.py          # GatedDeltaProduct (Triton kernels: re-written in gated_deltaproduct_fla.py)
  LICENSE
)
resolved=$(copy_files "$FLA_MIRROR" "$FLA_COMMIT" "$CMP_DIR/fla_src" "${FILES[@]}")
echo "fla files at $resolved -> $CMP_DIR/fla_src"

torch_venv

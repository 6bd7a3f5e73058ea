#!/usr/bin/env bash
# Prepare the path / fla comparison (results/cpu/path_vs_fla.md): verbatim copies of the fla
# files path_fla.py executes (or that state what it re-writes), taken from a bare mirror of
# flash-linear-attention at one commit, into their own folder $CMP_DIR/path_src/, and the
# torch venv of setup.sh (created here too if missing; no other package is needed).
#   FLA_MIRROR   bare git dir of fla-org/flash-linear-attention (default below)
#   FLA_COMMIT   bc3b101dcb713ddc5bd8924b66754eb68b5ccf89 (the commit path.py follows)
#   CMP_DIR      scratch dir (default /tmp/fla_cmp): path_src/ (the copies), path_*.npz
#   TORCH_VENV   default /tmp/torchvenv; TORCH_SPEC default torch==2.13.0
set -euo pipefail
source "$(dirname "$0")/setup_lib.sh"
FLA_MIRROR=${FLA_MIRROR:-/work/.mirror/fla-org+flash-linear-attention/repo}
FLA_COMMIT=${FLA_COMMIT:-bc3b101dcb713ddc5bd8924b66754eb68b5ccf89}
CMP_DIR=${CMP_DIR:-/tmp/fla_cmp}
SRC="$CMP_DIR/path_src"

FILES=(
  fla/ops/path_attn/naive.py     # naive_path_attn (torch + einops): executed as is
  fla/ops/path_attn/parallel.py  # parallel_path_attn (Triton): the layer's op; its defaults (scale K^-0.5, g None)
  fla/ops/path_attn/parallel_path_fwd.py          # Triton: (q.Hk + g_q - g_k) * scale (lines 106-107, 139-140)
  fla/ops/path_attn/intra_chunk_preprocess_fwd.py # Triton, the diagonal chunk: the same (lines 122, 125)
  fla/ops/attn/decoding.py       # attn_decoding_one_step: do_gate_scale ("PaTH-FoX"), which the layer sets
  fla/layers/path_attn.py        # PaTHAttention (imports transformers + Triton: re-written in path_fla.py)
  fla/modules/conv/short_conv.py # ShortConvolution: depthwise Conv1d, padding W-1, first T outputs, SiLU
  fla/modules/l2norm.py          # l2_norm: x / sqrt(sum x^2 + 1e-6)
  tests/ops/test_path_attn.py    # how fla calls its naive op (w L2-normalised, g = zeros without the gate)
  LICENSE
)
resolved=$(copy_files "$FLA_MIRROR" "$FLA_COMMIT" "$SRC" "${FILES[@]}")
echo "fla files at $resolved -> $SRC"

torch_venv

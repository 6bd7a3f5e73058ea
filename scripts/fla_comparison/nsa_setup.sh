#!/usr/bin/env bash
# Prepare the nsa / fla comparison (results/cpu/nsa_vs_fla.md): verbatim copies of the fla
# files nsa_fla.py reads (or that state what it re-writes), taken from a bare mirror of
# flash-linear-attention at one commit, and the torch venv of setup.sh (created here too
# if missing).
#   FLA_MIRROR   bare git dir of fla-org/flash-linear-attention (default below)
#   FLA_COMMIT   bc3b101dcb713ddc5bd8924b66754eb68b5ccf89 (the commit nsa.py ports)
#   CMP_DIR      scratch dir (default /tmp/fla_cmp): fla_src/ (the copies), nsa_*.npz
#   TORCH_VENV   default /tmp/torchvenv; TORCH_SPEC default torch==2.13.0
set -euo pipefail
source "$(dirname "$0")/setup_lib.sh"
FLA_MIRROR=${FLA_MIRROR:-/work/.mirror/fla-org+flash-linear-attention/repo}
FLA_COMMIT=${FLA_COMMIT:-bc3b101dcb713ddc5bd8924b66754eb68b5ccf89}
CMP_DIR=${CMP_DIR:-/tmp/fla_cmp}

FILES=(
  fla/ops/nsa/naive.py          # naive_nsa & co (torch + einops; nsa_fla.py execs its functions,
                                #   with mean_pooling and flash_attn_func as plain-torch stand-ins)
  fla/ops/nsa/parallel.py       # parallel_nsa (Triton): the layer's op; its topk kernel's rules
  fla/ops/nsa/compression.py    # parallel_nsa_compression (Triton): complete blocks only
  fla/ops/nsa/utils.py          # the bitonic sort of the topk kernel
  fla/ops/utils/pooling.py      # mean_pooling (Triton): a block's sum / min(BS, T - i BS)
  fla/layers/nsa.py             # NativeSparseAttention (re-written in nsa_fla.py)
  fla/modules/rotary.py         # RotaryEmbedding: rotary_embedding_ref (execed), not interleaved
  fla/models/nsa/configuration_nsa.py  # NSAConfig defaults
  tests/ops/test_nsa.py         # build_block_indices: the given-indices rows draw alike
  LICENSE
)
resolved=$(copy_files "$FLA_MIRROR" "$FLA_COMMIT" "$CMP_DIR/fla_src" "${FILES[@]}")
echo "fla files at $resolved -> $CMP_DIR/fla_src"

torch_venv

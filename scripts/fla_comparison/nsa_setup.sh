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
FLA_MIRROR=${FLA_MIRROR:-/work/.mirror/fla-org+flash-linear-attention/repo}
FLA_COMMIT=${FLA_COMMIT:-bc3b101dcb713ddc5bd8924b66754eb68b5ccf89}
CMP_DIR=${CMP_DIR:-/tmp/fla_cmp}
TORCH_VENV=${TORCH_VENV:-/tmp/torchvenv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

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
mkdir -p "$CMP_DIR/fla_src"
resolved=$(git -C "$FLA_MIRROR" rev-parse "$FLA_COMMIT^{commit}")
for f in "${FILES[@]}"; do
  mkdir -p "$CMP_DIR/fla_src/$(dirname "$f")"
  git -C "$FLA_MIRROR" show "$resolved:$f" > "$CMP_DIR/fla_src/$f"
done
echo "$resolved" > "$CMP_DIR/fla_src/COMMIT"
echo "fla files at $resolved -> $CMP_DIR/fla_src"

if [ ! -x "$TORCH_VENV/bin/python" ]; then
  python3 -m venv "$TORCH_VENV"
fi
"$TORCH_VENV/bin/python" -c "import torch, einops, numpy" 2>/dev/null \
  || "$TORCH_VENV/bin/pip" install "$TORCH_SPEC" einops numpy
"$TORCH_VENV/bin/python" -c "import torch, einops, numpy; print('torch', torch.__version__, 'einops', einops.__version__, 'numpy', numpy.__version__)"

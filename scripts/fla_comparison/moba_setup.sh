#!/usr/bin/env bash
# Prepare the moba comparison (results/cpu/moba_vs_original.md): verbatim copies of the
# original files moba_orig.py runs (or that state what it stands in for), taken with
# `git show <commit>:<path>` from bare mirrors of the two originals, into $CMP_DIR/moba_src/
#   MoBA/...  MoonshotAI/MoBA at MOBA_COMMIT (the reference moba.py follows)
#   fla/...   fla-org/flash-linear-attention at FLA_COMMIT (its MoBA layer and op)
# and the torch venv of setup.sh (created here too if missing), plus transformers 4.48.3
# (MoBA's requirements.txt: transformers>=4.48.3; its wrapper is an attention function of
# transformers' ALL_ATTENTION_FUNCTIONS, run here inside transformers' LlamaAttention;
# fla's layer file imports transformers.utils.logging).
#   MOBA_MIRROR  bare git dir of MoonshotAI/MoBA (default below)
#   MOBA_COMMIT  61e456bc956c5a25fd9c84e5496b661329cb1b72
#   FLA_MIRROR   bare git dir of fla-org/flash-linear-attention (default below)
#   FLA_COMMIT   bc3b101dcb713ddc5bd8924b66754eb68b5ccf89
#   CMP_DIR      scratch dir (default /tmp/fla_cmp): moba_src/ (the copies), moba_*.npz
#   TORCH_VENV   default /tmp/torchvenv; TORCH_SPEC default torch==2.13.0
#   TRANSFORMERS_SPEC default transformers==4.48.3
set -euo pipefail
source "$(dirname "$0")/setup_lib.sh"
MOBA_MIRROR=${MOBA_MIRROR:-/work/.mirror/MoonshotAI+MoBA/repo}
MOBA_COMMIT=${MOBA_COMMIT:-61e456bc956c5a25fd9c84e5496b661329cb1b72}
FLA_MIRROR=${FLA_MIRROR:-/work/.mirror/fla-org+flash-linear-attention/repo}
FLA_COMMIT=${FLA_COMMIT:-bc3b101dcb713ddc5bd8924b66754eb68b5ccf89}
CMP_DIR=${CMP_DIR:-/tmp/fla_cmp}
TRANSFORMERS_SPEC=${TRANSFORMERS_SPEC:-transformers==4.48.3}

MOBA_FILES=(
  moba/__init__.py          # register_moba: ALL_ATTENTION_FUNCTIONS["moba_naive"] = moba_layer + naive
  moba/config.py            # MoBAConfig(moba_chunk_size, moba_topk)
  moba/moba_naive.py        # moba_attn_varlen_naive: the reference (plain torch)
  moba/moba_efficient.py    # moba_attn_varlen: flash-attn two-stream form (stand-ins for flash_attn)
  moba/wrapper.py           # moba_layer: the attention function (prefill: packs, calls the op)
  tests/test_moba_attn.py   # efficient vs naive (bf16, GPU): top_k 2..4 only
  examples/llama.py         # how it is used: a LLaMA with attn_implementation="moba_naive"
  requirements.txt
  LICENSE
)
FLA_FILES=(
  fla/layers/moba.py        # class MoBA: executed verbatim with stand-ins for its Triton modules
  fla/layers/utils.py       # unpad_input / pad_input (executed verbatim)
  fla/ops/moba/parallel.py  # parallel_moba: executed verbatim, flash_attn stand-ins
  fla/ops/utils/index.py    # prepare_* (executed verbatim; a triton stub lets it import)
  fla/modules/rotary.py     # RotaryEmbedding class and rotary_embedding_ref (executed verbatim)
  fla/modules/layernorm.py  # RMSNorm class and rms_norm_ref (executed verbatim)
  fla/models/moba/configuration_moba.py  # MoBAConfig defaults
  tests/ops/test_moba.py    # fla's tests: full-attention limits only, topk=1 = full causal
  LICENSE
)

m=$(copy_files "$MOBA_MIRROR" "$MOBA_COMMIT" "$CMP_DIR/moba_src/MoBA" "${MOBA_FILES[@]}")
f=$(copy_files "$FLA_MIRROR" "$FLA_COMMIT" "$CMP_DIR/moba_src/fla" "${FLA_FILES[@]}")
printf 'MoonshotAI/MoBA %s\nfla-org/flash-linear-attention %s\n' "$m" "$f" \
  > "$CMP_DIR/moba_src/COMMIT"
echo "MoBA files at $m, fla files at $f -> $CMP_DIR/moba_src"

torch_venv "transformers=$TRANSFORMERS_SPEC"

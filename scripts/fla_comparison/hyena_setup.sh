#!/usr/bin/env bash
# Prepare the hyena / Zoology comparison (results/cpu/hyena_vs_zoology.md): verbatim copies
# of the Zoology files hyena_zoology.py executes or reads, taken with `git show` from a bare
# mirror of HazyResearch/zoology at one commit, and the torch venv of setup.sh (created
# here too if missing) with pydantic added (Zoology's Hyena.__init__ is wrapped in
# pydantic's validate_call).
#   ZOOLOGY_MIRROR  bare git dir of HazyResearch/zoology (default below)
#   ZOOLOGY_COMMIT  d88d6f5 (the commit models/mixers/hyena.py follows)
#   CMP_DIR         scratch dir (default /tmp/fla_cmp): hyena_src/ (the copies), hyena_*.npz
#   TORCH_VENV      default /tmp/torchvenv; TORCH_SPEC default torch==2.13.0
set -euo pipefail
ZOOLOGY_MIRROR=${ZOOLOGY_MIRROR:-/work/.mirror/HazyResearch+zoology/repo}
ZOOLOGY_COMMIT=${ZOOLOGY_COMMIT:-d88d6f5}
CMP_DIR=${CMP_DIR:-/tmp/fla_cmp}
TORCH_VENV=${TORCH_VENV:-/tmp/torchvenv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

FILES=(
  zoology/mixers/hyena.py            # Hyena, Filter, fftconv_ref, Sin, PositionalEmbedding,
                                     #   ExponentialModulation: executed as they are (torch,
                                     #   einops, pydantic; no CUDA / Triton import)
  zoology/experiments/models_repo.py # add_hyena: the MQAR row "hyena" = Hyena(l_max=L), defaults
  LICENSE.md
)
SRC="$CMP_DIR/hyena_src"
mkdir -p "$SRC"
resolved=$(git -C "$ZOOLOGY_MIRROR" rev-parse "$ZOOLOGY_COMMIT^{commit}")
for f in "${FILES[@]}"; do
  mkdir -p "$SRC/$(dirname "$f")"
  git -C "$ZOOLOGY_MIRROR" show "$resolved:$f" > "$SRC/$f"
done
echo "$resolved" > "$SRC/COMMIT"
echo "zoology files at $resolved -> $SRC"

if [ ! -x "$TORCH_VENV/bin/python" ]; then
  python3 -m venv "$TORCH_VENV"
fi
"$TORCH_VENV/bin/python" -c "import torch, einops, numpy" 2>/dev/null \
  || "$TORCH_VENV/bin/pip" install "$TORCH_SPEC" einops numpy
"$TORCH_VENV/bin/python" -c "import pydantic" 2>/dev/null \
  || "$TORCH_VENV/bin/pip" install pydantic  # 2.14.4 (with pydantic-core 2.50.5) was used
"$TORCH_VENV/bin/python" -c "import torch, einops, numpy, pydantic; print('torch', torch.__version__, 'einops', einops.__version__, 'numpy', numpy.__version__, 'pydantic', pydantic.VERSION)"

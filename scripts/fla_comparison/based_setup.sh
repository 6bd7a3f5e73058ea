#!/usr/bin/env bash
# Prepare the based / Zoology comparison (results/cpu/based_vs_zoology.md): verbatim copies
# of the Zoology files based_zoology.py imports (the `zoology` package's own layout, so that
# its imports resolve as they are), of fla's naive Based op (a second reference for the op),
# and the torch venv of setup.sh (created here too if missing) with the two pure-python
# packages Zoology's based.py / taylor.py import: opt_einsum and pydantic.
#   ZOOLOGY_MIRROR  bare git dir of HazyResearch/zoology (default below)
#   ZOOLOGY_COMMIT  d88d6f5 (the commit based.py ports; resolved to the full hash)
#   FLA_MIRROR      bare git dir of fla-org/flash-linear-attention (default below)
#   FLA_COMMIT      bc3b101dcb713ddc5bd8924b66754eb68b5ccf89
#   CMP_DIR         scratch dir (default /tmp/fla_cmp): based_src/ (the copies), based_*.npz
#   TORCH_VENV      default /tmp/torchvenv; TORCH_SPEC default torch==2.13.0
set -euo pipefail
ZOOLOGY_MIRROR=${ZOOLOGY_MIRROR:-/work/.mirror/HazyResearch+zoology/repo}
ZOOLOGY_COMMIT=${ZOOLOGY_COMMIT:-d88d6f5}
FLA_MIRROR=${FLA_MIRROR:-/work/.mirror/fla-org+flash-linear-attention/repo}
FLA_COMMIT=${FLA_COMMIT:-bc3b101dcb713ddc5bd8924b66754eb68b5ccf89}
CMP_DIR=${CMP_DIR:-/tmp/fla_cmp}
TORCH_VENV=${TORCH_VENV:-/tmp/torchvenv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
SRC="$CMP_DIR/based_src"

ZOOLOGY_FILES=(
  zoology/__init__.py                   # empty: the package
  zoology/utils.py                      # import_from_str (based.py imports it; the module
                                        #   also imports wandb and pandas, unused by Based:
                                        #   empty stand-ins in based_zoology.py)
  zoology/mixers/__init__.py            # empty
  zoology/mixers/based.py               # Based (the layer), init_feature_map
  zoology/mixers/feature_maps/__init__.py  # empty
  zoology/mixers/feature_maps/base.py   # FeatureMap (TaylorExp's parent)
  zoology/mixers/feature_maps/taylor.py # TaylorExp
  zoology/experiments/models_repo.py    # add_based: the MQAR row's options (not executed)
  LICENSE.md
)
FLA_FILES=(
  fla/ops/based/naive.py                # naive_parallel_based, naive_chunk_based (plain torch)
  LICENSE
)
mkdir -p "$SRC/zoology" "$SRC/fla"
zres=$(git -C "$ZOOLOGY_MIRROR" rev-parse "$ZOOLOGY_COMMIT^{commit}")
for f in "${ZOOLOGY_FILES[@]}"; do
  mkdir -p "$SRC/zoology/$(dirname "$f")"
  git -C "$ZOOLOGY_MIRROR" show "$zres:$f" > "$SRC/zoology/$f"
done
fres=$(git -C "$FLA_MIRROR" rev-parse "$FLA_COMMIT^{commit}")
for f in "${FLA_FILES[@]}"; do
  mkdir -p "$SRC/fla/$(dirname "$f")"
  git -C "$FLA_MIRROR" show "$fres:$f" > "$SRC/fla/$f"
done
echo "$zres" > "$SRC/COMMIT"
echo "$fres" > "$SRC/FLA_COMMIT"
echo "zoology files at $zres -> $SRC/zoology; fla's naive Based at $fres -> $SRC/fla"

if [ ! -x "$TORCH_VENV/bin/python" ]; then
  python3 -m venv "$TORCH_VENV"
fi
"$TORCH_VENV/bin/python" -c "import torch, einops, numpy" 2>/dev/null \
  || "$TORCH_VENV/bin/pip" install "$TORCH_SPEC" einops numpy
"$TORCH_VENV/bin/python" -c "import opt_einsum, pydantic" 2>/dev/null \
  || "$TORCH_VENV/bin/pip" install opt_einsum pydantic
"$TORCH_VENV/bin/python" -c "
import torch, einops, numpy, opt_einsum, pydantic
print('torch', torch.__version__, 'einops', einops.__version__, 'numpy', numpy.__version__,
      'opt_einsum', opt_einsum.__version__, 'pydantic', pydantic.__version__)"

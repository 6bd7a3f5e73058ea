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
source "$(dirname "$0")/setup_lib.sh"
ZOOLOGY_MIRROR=${ZOOLOGY_MIRROR:-/work/.mirror/HazyResearch+zoology/repo}
ZOOLOGY_COMMIT=${ZOOLOGY_COMMIT:-d88d6f5}
FLA_MIRROR=${FLA_MIRROR:-/work/.mirror/fla-org+flash-linear-attention/repo}
FLA_COMMIT=${FLA_COMMIT:-bc3b101dcb713ddc5bd8924b66754eb68b5ccf89}
CMP_DIR=${CMP_DIR:-/tmp/fla_cmp}
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
zres=$(copy_files "$ZOOLOGY_MIRROR" "$ZOOLOGY_COMMIT" "$SRC/zoology" "${ZOOLOGY_FILES[@]}")
fres=$(copy_files "$FLA_MIRROR" "$FLA_COMMIT" "$SRC/fla" "${FLA_FILES[@]}")
echo "$zres" > "$SRC/COMMIT"
echo "$fres" > "$SRC/FLA_COMMIT"
echo "zoology files at $zres -> $SRC/zoology; fla's naive Based at $fres -> $SRC/fla"

torch_venv opt_einsum=opt_einsum pydantic=pydantic

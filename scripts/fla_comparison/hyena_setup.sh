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
source "$(dirname "$0")/setup_lib.sh"
ZOOLOGY_MIRROR=${ZOOLOGY_MIRROR:-/work/.mirror/HazyResearch+zoology/repo}
ZOOLOGY_COMMIT=${ZOOLOGY_COMMIT:-d88d6f5}
CMP_DIR=${CMP_DIR:-/tmp/fla_cmp}

FILES=(
  zoology/mixers/hyena.py            # Hyena, Filter, fftconv_ref, Sin, PositionalEmbedding,
                                     #   ExponentialModulation: executed as they are (torch,
                                     #   einops, pydantic; no CUDA / Triton import)
  zoology/experiments/models_repo.py # add_hyena: the MQAR row "hyena" = Hyena(l_max=L), defaults
  LICENSE.md
)
SRC="$CMP_DIR/hyena_src"
resolved=$(copy_files "$ZOOLOGY_MIRROR" "$ZOOLOGY_COMMIT" "$SRC" "${FILES[@]}")
echo "zoology files at $resolved -> $SRC"

torch_venv pydantic=pydantic  # 2.14.4 (with pydantic-core 2.50.5) was used

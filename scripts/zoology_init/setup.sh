#!/usr/bin/env bash
# Prepare the initialisation comparison (results/cpu/zoology_init_vs_zoology.md): verbatim
# copies of the Zoology files that build its MQAR LanguageModel for the attention, Based and
# Hyena rows (zoology/model.py's _init_weights and tied head, the mixers, the shared
# BaseConv), and the torch venv of scripts/fla_comparison (created here too if missing) with
# pydantic (Zoology's configs and validate_call) and opt_einsum (based.py).
#   ZOOLOGY_MIRROR  bare git dir of HazyResearch/zoology (default below)
#   ZOOLOGY_COMMIT  d88d6f5 (the commit models/init_schemes.py follows)
#   CMP_DIR         scratch dir (default /tmp/fla_cmp): zoology_init_src/, zoology_init.json
#   TORCH_VENV      default /tmp/torchvenv; TORCH_SPEC default torch==2.13.0
set -euo pipefail
source "$(dirname "$0")/../fla_comparison/setup_lib.sh"
ZOOLOGY_MIRROR=${ZOOLOGY_MIRROR:-/work/.mirror/HazyResearch+zoology/repo}
ZOOLOGY_COMMIT=${ZOOLOGY_COMMIT:-d88d6f5}
CMP_DIR=${CMP_DIR:-/tmp/fla_cmp}

FILES=(
  zoology/__init__.py zoology/utils.py   # import_from_str (ModuleConfig.instantiate)
  zoology/config.py                      # ModelConfig, ModuleConfig
  zoology/model.py                       # LanguageModel, _init_weights, the tied head
  zoology/mixers/__init__.py zoology/mixers/hybrid.py
  zoology/mixers/base_conv.py zoology/mixers/convolution.py  # the shared conv_mixer
  zoology/mixers/attention.py            # MHA (out_proj: rescaled)
  zoology/mixers/based.py                # Based (proj_o: not rescaled)
  zoology/mixers/feature_maps/__init__.py zoology/mixers/feature_maps/base.py
  zoology/mixers/feature_maps/taylor.py
  zoology/mixers/hyena.py                # Hyena (out_proj: rescaled; its filter's Linears)
  zoology/experiments/models_repo.py     # the rows' options (not executed)
  zoology/experiments/mqar_example_configs/original_mqar_configs.py  # conv_mixer, Identity
  LICENSE.md
)
resolved=$(copy_files "$ZOOLOGY_MIRROR" "$ZOOLOGY_COMMIT" "$CMP_DIR/zoology_init_src" "${FILES[@]}")
echo "zoology files at $resolved -> $CMP_DIR/zoology_init_src"
torch_venv pydantic=pydantic opt_einsum=opt_einsum

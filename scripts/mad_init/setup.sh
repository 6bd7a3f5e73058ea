#!/usr/bin/env bash
# Prepare the initialisation comparison (results/cpu/mad_init_vs_mad_lab.md): verbatim
# copies of the mad-lab files that build its LanguageModel and AutoEncoder for the GLA and
# Hyena rows with the SwiGLU channel mixer (mad/model/language_model.py and auto_encoder.py
# with their _init_weights, the layers, the ops they import, the layers' and tasks' yml),
# and the torch venv of scripts/fla_comparison (created here too if missing) with triton
# (rmsnorm.py, fused_norm_gate.py and ops/gla import it at module level; nothing of it runs
# here), transformers (GLA's ACT2FN) and pyyaml (the configs).
#   MAD_MIRROR  bare git dir of athms/mad-lab (default below)
#   MAD_COMMIT  0f49a45 (the commit models/init_schemes.py follows)
#   CMP_DIR     scratch dir (default /tmp/fla_cmp): mad_init_src/, mad_init.json
#   TORCH_VENV  default /tmp/torchvenv; TORCH_SPEC default torch==2.13.0
# Not copied: mad/model/__init__.py (it imports the Lightning wrapper) and
# mad/model/layers/__init__.py (it imports every layer, flash_attn's among them), so those
# packages are namespace packages and only the modules the rows need are imported.
# mad-lab's Attention (mad/model/layers/attention.py) is flash_attn's MHA: flash-attn has
# no CPU build (a CUDA extension, source distribution only), so no attention row here.
set -euo pipefail
source "$(dirname "$0")/../fla_comparison/setup_lib.sh"
MAD_MIRROR=${MAD_MIRROR:-/work/.mirror/athms+mad-lab/repo}
MAD_COMMIT=${MAD_COMMIT:-0f49a45}
CMP_DIR=${CMP_DIR:-/tmp/fla_cmp}

FILES=(
  mad/model/language_model.py            # LanguageModel, _init_weights (lines 73-79)
  mad/model/auto_encoder.py              # AutoEncoder, _init_weights (lines 132-138)
  mad/model/layers/mlp.py                # SwiGLU (GLU: w1, w2, w3)
  mad/model/layers/attention_gated_linear.py  # GatedLinearAttention, reset_parameters
  mad/model/layers/hyena.py              # HyenaOperator
  mad/model/layers/featurization/hyena_filter.py mad/model/layers/featurization/rtf.py
  mad/model/layers/featurization/posemb.py    # the AutoEncoder's decoder positions
  mad/model/layers/ops/fftconv.py
  mad/model/layers/ops/norm/__init__.py mad/model/layers/ops/norm/rmsnorm.py
  mad/model/layers/ops/norm/fused_norm_gate.py
  mad/model/layers/ops/gla/__init__.py mad/model/layers/ops/gla/chunk.py
  mad/model/layers/ops/gla/chunk_fuse.py mad/model/layers/ops/gla/chunk_util.py
  mad/model/layers/ops/gla/recurrent_fuse.py mad/model/layers/ops/gla/utils.py
  configs/layers/gated-linear-attention.yml configs/layers/hyena.yml
  configs/layers/swiglu.yml
  configs/tasks/in-context-recall.yml configs/tasks/compression.yml
  benchmark.py mad/registry.py           # make_model_fn, the layer registry (not executed)
  LICENSE
)
resolved=$(copy_files "$MAD_MIRROR" "$MAD_COMMIT" "$CMP_DIR/mad_init_src" "${FILES[@]}")
echo "mad-lab files at $resolved -> $CMP_DIR/mad_init_src"
torch_venv triton=triton transformers=transformers yaml=pyyaml

#!/usr/bin/env bash
# Prepare the cosformer comparison: a torch venv outside the repo and a verbatim copy of
# OpenNLPLab/cosFormer's cosformer.py (and its LICENSE) at one commit, from a bare mirror.
#   COSFORMER_MIRROR  bare git dir of OpenNLPLab/cosFormer (default below)
#   COSFORMER_COMMIT  8e12da111e2a683ea875711e0bf5810c6b4e8f9f (the repository's head)
#   CMP_DIR           scratch dir (default /tmp/cosformer_cmp): src/ (the copy), *.npz
#   TORCH_VENV        default /tmp/torchenv; TORCH_SPEC default torch==2.13.0
set -euo pipefail
COSFORMER_MIRROR=${COSFORMER_MIRROR:-/work/.mirror/OpenNLPLab+cosFormer/repo}
COSFORMER_COMMIT=${COSFORMER_COMMIT:-8e12da111e2a683ea875711e0bf5810c6b4e8f9f}
CMP_DIR=${CMP_DIR:-/tmp/cosformer_cmp}
TORCH_VENV=${TORCH_VENV:-/tmp/torchenv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

mkdir -p "$CMP_DIR/src"
resolved=$(git -C "$COSFORMER_MIRROR" rev-parse "$COSFORMER_COMMIT^{commit}")
for f in cosformer.py LICENSE; do
  git -C "$COSFORMER_MIRROR" show "$resolved:$f" > "$CMP_DIR/src/$f"
done
echo "$resolved" > "$CMP_DIR/src/COMMIT"
echo "cosFormer files at $resolved -> $CMP_DIR/src"

if [ ! -x "$TORCH_VENV/bin/python" ]; then
  python3 -m venv "$TORCH_VENV"
fi
"$TORCH_VENV/bin/python" -c "import torch, numpy" 2>/dev/null \
  || "$TORCH_VENV/bin/pip" install "$TORCH_SPEC" numpy
"$TORCH_VENV/bin/python" -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)"

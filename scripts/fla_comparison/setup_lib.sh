# What the *_setup.sh scripts share (sourced, not run): verbatim copies of an original's
# files from a bare git mirror at one commit, and the torch venv outside the repo.
#   TORCH_VENV   default /tmp/torchvenv; TORCH_SPEC default torch==2.13.0

TORCH_VENV=${TORCH_VENV:-/tmp/torchvenv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

# copy_files MIRROR COMMIT DEST FILE...: `git show COMMIT:FILE > DEST/FILE` for each file
# (folders made), the resolved commit written to DEST/COMMIT and printed.
copy_files() {
  local mirror=$1 commit=$2 dest=$3 resolved f
  shift 3
  resolved=$(git -C "$mirror" rev-parse "$commit^{commit}")
  mkdir -p "$dest"
  for f in "$@"; do
    mkdir -p "$dest/$(dirname "$f")"
    git -C "$mirror" show "$resolved:$f" > "$dest/$f"
  done
  echo "$resolved" > "$dest/COMMIT"
  echo "$resolved"
}

# torch_venv [MODULE=PIP_SPEC ...]: the venv with torch (TORCH_SPEC), einops and numpy, plus
# each MODULE, pip-installed from PIP_SPEC where it does not import; prints the versions.
torch_venv() {
  local pair modules="torch einops numpy"
  [ -x "$TORCH_VENV/bin/python" ] || python3 -m venv "$TORCH_VENV"
  "$TORCH_VENV/bin/python" -c "import torch, einops, numpy" 2>/dev/null \
    || "$TORCH_VENV/bin/pip" install "$TORCH_SPEC" einops numpy
  for pair in "$@"; do
    "$TORCH_VENV/bin/python" -c "import ${pair%%=*}" 2>/dev/null \
      || "$TORCH_VENV/bin/pip" install "${pair#*=}"
    modules="$modules ${pair%%=*}"
  done
  "$TORCH_VENV/bin/python" -c "
import importlib, sys
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    print(name, getattr(module, '__version__', getattr(module, 'VERSION', '?')))" $modules
}

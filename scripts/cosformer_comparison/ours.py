"""Our `cosformer` on the comparison's inputs (repo venv): draws every input and weight with
numpy into $CMP_DIR/inputs.npz (seed 20220215), runs ours and saves outputs and gradients to
$CMP_DIR/ours_<dtype>.npz.

    PYTHONPATH=$PWD .venv/bin/python scripts/cosformer_comparison/ours.py            # float32
    PYTHONPATH=$PWD .venv/bin/python scripts/cosformer_comparison/ours.py --float64

float32 is our code as it runs (matmul precision "highest"). --float64 runs the same code in
float64: it casts to jnp.float32 throughout, so this process turns x64 on and reads
jnp.float32 as float64 before importing the models (a patch of this process only).
"""
import os
import sys

import jax
import numpy as np

FLOAT64 = "--float64" in sys.argv
if FLOAT64:
    jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

if FLOAT64:
    jnp.float32 = jnp.float64
from flax import nnx  # noqa: E402

from models import registry  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cases import BATCH, CASES, CHUNK, DIM, HEADS, PARAMS  # noqa: E402

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/cosformer_cmp")
DTYPE = jnp.float64 if FLOAT64 else jnp.float32


def path_name(path) -> str:
    """'query/kernel' of a Param's path (its dict keys; the trailing `.value` dropped)."""
    return "/".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def inputs() -> dict:
    path = os.path.join(CMP_DIR, "inputs.npz")
    if os.path.exists(path):
        return dict(np.load(path))
    rng = np.random.default_rng(20220215)
    out = {}
    for case, length, _, _ in CASES:
        for p in PARAMS:
            out[f"{case}/{p}/kernel"] = 0.3 * rng.standard_normal((DIM, DIM))
            out[f"{case}/{p}/bias"] = 0.3 * rng.standard_normal(DIM)
        out[f"{case}/x"] = rng.standard_normal((BATCH, length, DIM))
        out[f"{case}/w"] = rng.standard_normal((BATCH, length, DIM))
    os.makedirs(CMP_DIR, exist_ok=True)
    np.savez(path, **out)
    return out


def main() -> None:
    data, out = inputs(), {}
    for case, length, causal, m in CASES:
        mixer = registry.build("cosformer", dim=DIM, num_heads=HEADS, max_len=length,
                               causal=causal, rngs=nnx.Rngs(0), chunk_size=CHUNK,
                               reweight_len=m * length)
        graphdef, state, rest = nnx.split(mixer, nnx.Param, ...)
        state = jax.tree_util.tree_map_with_path(
            lambda p, leaf: jnp.asarray(data[f"{case}/{path_name(p)}"], DTYPE), state)
        x = jnp.asarray(data[f"{case}/x"], DTYPE)
        w = jnp.asarray(data[f"{case}/w"], DTYPE)

        def loss(s, x):
            y = nnx.merge(graphdef, s, rest)(x)
            return jnp.sum(w * y), y

        (g_state, g_x), y = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(state, x)
        out[f"{case}/y"], out[f"{case}/grad/x"] = np.asarray(y), np.asarray(g_x)
        for p, leaf in jax.tree_util.tree_leaves_with_path(g_state):
            out[f"{case}/grad/{path_name(p)}"] = np.asarray(leaf)
        print(f"{case}: y {y.dtype} {y.shape}")
    name = "ours_float64.npz" if FLOAT64 else "ours_float32.npz"
    np.savez(os.path.join(CMP_DIR, name), **out)
    print(f"-> {os.path.join(CMP_DIR, name)}")


if __name__ == "__main__":
    with jax.default_matmul_precision("highest"):
        main()

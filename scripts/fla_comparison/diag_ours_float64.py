"""DIAGNOSTIC (not part of the comparison proper): our layer's own code run in float64,
against fla's float64 layer, to tell the algorithm from float32 rounding. Our code casts
to jnp.float32 throughout, so this process turns x64 on and reads jax.numpy.float32 as
float64 before importing the models (a patch of this process only; no file is changed).
Needs kda_ours.py and kda_fla.py to have run. Repo venv:

    PYTHONPATH=/work/main /work/main/.venv/bin/python scripts/fla_comparison/diag_ours_float64.py

Prints, per length and chunk size, the worst relative difference over y, dL/dx and every
parameter's gradient (rel = max abs / max |fla|), and the dtypes seen (all float64).
"""
import os
import sys

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

jnp.float32 = jnp.float64
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kda_ours as o  # noqa: E402
from ours_common import CMP_DIR, param_name  # noqa: E402
from flax import nnx  # noqa: E402

inp = dict(np.load(os.path.join(CMP_DIR, "kda_inputs.npz")))
fla = np.load(os.path.join(CMP_DIR, "kda_fla.npz"))


def rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - b)) / np.max(np.abs(b)))


for length in o.LAYER_LENGTHS:
    for chunk in (16, 64):
        o.LAYER["chunk_size"] = chunk
        graphdef, state = nnx.split(o.build_layer(length))
        state = jax.tree_util.tree_map_with_path(
            lambda p, leaf: jnp.asarray(inp["layer/param/" + param_name(p)], jnp.float64), state)
        x = jnp.asarray(inp[f"layer/L{length}/x"], jnp.float64)
        w = jnp.asarray(inp[f"layer/L{length}/w_y"], jnp.float64)

        def loss(s, x):
            y = nnx.merge(graphdef, s)(x)
            return jnp.sum(w * y), y
        (g_state, g_x), y = jax.grad(loss, argnums=(0, 1), has_aux=True)(state, x)
        ref = f"layer/L{length}/recurrent/f64/"
        rows = [("y", rel(y, fla[ref + "y"]), y.dtype), ("x", rel(g_x, fla[ref + "grad_x"]), g_x.dtype)]
        for p, leaf in jax.tree_util.tree_leaves_with_path(g_state):
            rows.append((param_name(p), rel(leaf, fla[ref + "grad_param/" + param_name(p)]),
                         leaf.dtype))
        name, worst, _ = max(rows, key=lambda r: r[1])
        print(f"L={length} chunk {chunk}: ours in float64 vs fla layer + naive_recurrent_kda "
              f"f64: worst rel {worst:.2e} ({name}); dtypes {sorted({str(r[2]) for r in rows})}")

"""DIAGNOSTIC (not part of the comparison proper): our fox and gated_deltaproduct layers'
own code run in float64, against fla's float64 layers, to tell the algorithm from float32
rounding (as diag_ours_float64.py does for kda). Our code casts to jnp.float32, so this
process turns x64 on and reads jax.numpy.float32 as float64 before importing the models
(a patch of this process only; no file is changed). Needs fox_ours.py, fox_fla.py,
gated_deltaproduct_ours.py and gated_deltaproduct_fla.py to have run. Repo venv:

    PYTHONPATH=/work/main /work/main/.venv/bin/python scripts/fla_comparison/diag_fox_gdp_float64.py

Prints, per layer and length, the worst relative difference over y, dL/dx and every
parameter's gradient (rel = max abs / max |fla f64|), and the dtypes seen (all float64).
"""
import os
import sys

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

jnp.float32 = jnp.float64
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fox_ours as fo  # noqa: E402
import gated_deltaproduct_ours as go  # noqa: E402
from flax import nnx  # noqa: E402
from ours_common import CMP_DIR, param_name  # noqa: E402



def rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - b)) / np.max(np.abs(b)))


def worst(y, g_x, g_params, fla, ref):
    rows = [("y", rel(y, fla[ref + "y"]), y.dtype), ("x", rel(g_x, fla[ref + "grad_x"]), g_x.dtype)]
    for p, leaf in jax.tree_util.tree_leaves_with_path(g_params):
        rows.append((param_name(p), rel(leaf, fla[ref + "grad_param/" + param_name(p)]),
                     leaf.dtype))
    name, w, _ = max(rows, key=lambda r: r[1])
    return f"worst rel {w:.2e} ({name}); dtypes {sorted({str(r[2]) for r in rows})}"


def grads(module_parts, x, w):
    graphdef, params, *rest = module_parts

    def loss(p, x):
        y = nnx.merge(graphdef, p, *rest)(x)
        return jnp.sum(w * y), y
    (g_p, g_x), y = jax.grad(loss, argnums=(0, 1), has_aux=True)(params, x)
    return y, g_x, g_p


inp = dict(np.load(os.path.join(CMP_DIR, "fox_inputs.npz")))
fla = np.load(os.path.join(CMP_DIR, "fox_fla.npz"))
for variant in fo.VARIANTS:
    fkey = "gate" if variant.endswith("gate") else "nogate"
    for length in fo.LAYER_LENGTHS:
        graphdef, params, rest = fo.split(fo.build_layer(variant, length))
        params = jax.tree_util.tree_map_with_path(
            lambda p, leaf: jnp.asarray(inp["layer/param/" + param_name(p)], jnp.float64), params)
        x = jnp.asarray(inp[f"layer/L{length}/x"], jnp.float64)
        w = jnp.asarray(inp[f"layer/L{length}/w_y"], jnp.float64)
        y, g_x, g_p = grads((graphdef, params, rest), x, w)
        print(f"fox {variant} L={length}: ours in float64 vs fla layer + naive f64: "
              + worst(y, g_x, g_p, fla, f"layer/{fkey}/L{length}/naive/f64/"))

inp = dict(np.load(os.path.join(CMP_DIR, "gdp_inputs.npz")))
fla = np.load(os.path.join(CMP_DIR, "gdp_fla.npz"))
for n in go.LAYER_NS:
    for length in go.LAYER_LENGTHS:
        graphdef, state = nnx.split(go.build_layer(n, length))
        state = jax.tree_util.tree_map_with_path(
            lambda p, leaf: jnp.asarray(inp[f"layer/n{n}/param/" + param_name(p)], jnp.float64),
            state)
        x = jnp.asarray(inp[f"layer/L{length}/x"], jnp.float64)
        w = jnp.asarray(inp[f"layer/L{length}/w_y"], jnp.float64)
        y, g_x, g_p = grads((graphdef, state), x, w)
        print(f"gated_deltaproduct n_h={n} L={length} C=16: ours in float64 vs fla layer + "
              "naive f64: " + worst(y, g_x, g_p, fla, f"layer/n{n}/L{length}/naive/f64/"))

"""What the `*_ours.py` scripts share (README.md): a parameter's name, the layer's weights
and inputs drawn with numpy, one layer case run through the layer class (its output and the
gradients of sum(w_y * y) with respect to the input and every parameter), and the save.

Each script keeps its own draws, in its own order (the inputs files are what the fla side
reads), and its own layer builds and calls; only the mechanics are here.
"""
from __future__ import annotations

import os
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")


def param_name(path) -> str:
    """'forward_scan.conv_q', 'value.kernel', ...: the module path (DictKeys), without
    the Variable's trailing `.value` attribute (a GetAttrKey)."""
    return ".".join(str(key.key) for key in path if isinstance(key, jax.tree_util.DictKey))


def draw_params(rng, inp: dict, prefix: str, tree, scale: float = 0.4,
                adjust: Callable[[str, np.ndarray], np.ndarray] | None = None) -> None:
    """inp[prefix + name] = scale N(0, 1) for every leaf of `tree`, drawn in the order of
    their names (`adjust(name, draw)` may shift or rescale a draw), as float32."""
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    for path, leaf in sorted(leaves, key=lambda pl: param_name(pl[0])):
        name = param_name(path)
        draw = scale * rng.standard_normal(leaf.shape)
        if adjust is not None:
            draw = adjust(name, draw)
        inp[prefix + name] = draw.astype(np.float32)


def draw_x(rng, inp: dict, prefix: str, shape: tuple[int, ...]) -> None:
    """The layer's input x and the loss weights w_y (N(0, 1), float32) of one case."""
    inp[prefix + "x"] = rng.standard_normal(shape).astype(np.float32)
    inp[prefix + "w_y"] = rng.standard_normal(shape).astype(np.float32)


def load_params(inp: dict, prefix: str, tree):
    """`tree` with every leaf replaced by the drawn inp[prefix + its name]."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: jnp.asarray(inp[prefix + param_name(path)]), tree)


def layer_grads(out: dict, prefix: str, graphdef, tree, x, w_y, call, *, rest=(),
                jit: bool = False):
    """y = call(layer, x) for the layer nnx.merge(graphdef, tree, *rest); saves y and the
    gradients of sum(w_y * y) w.r.t. x and every leaf of `tree` under `prefix`; returns y."""
    def loss(tree, x):
        y = call(nnx.merge(graphdef, tree, *rest), x)
        return jnp.sum(w_y * y), y
    grad = jax.grad(loss, argnums=(0, 1), has_aux=True)
    (g_tree, g_x), y = (jax.jit(grad) if jit else grad)(tree, x)
    out[prefix + "y"], out[prefix + "grad_x"] = np.asarray(y), np.asarray(g_x)
    for path, leaf in jax.tree_util.tree_leaves_with_path(g_tree):
        out[prefix + "grad_param/" + param_name(path)] = np.asarray(leaf)
    return y


def save(stem: str, inp: dict, out: dict, start: float) -> None:
    """$CMP_DIR/<stem>_inputs.npz and <stem>_ours.npz (with the JAX version)."""
    os.makedirs(CMP_DIR, exist_ok=True)
    np.savez(os.path.join(CMP_DIR, f"{stem}_inputs.npz"), **inp)
    out["meta/jax_version"] = np.array(jax.__version__)
    np.savez(os.path.join(CMP_DIR, f"{stem}_ours.npz"), **out)
    print(f"saved {len(inp)} inputs and {len(out)} results to {CMP_DIR} "
          f"(jax {jax.__version__}, {time.time() - start:.1f} s)")

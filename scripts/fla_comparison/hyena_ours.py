"""Our side of the hyena / Zoology comparison (README.md, results/cpu/hyena_vs_zoology.md):
draws every input and weight with numpy (fixed seed), saves them to
$CMP_DIR/hyena_inputs.npz, runs our JAX code (models/mixers/hyena.py) on them and saves
outputs and gradients to $CMP_DIR/hyena_ours.npz. Run with the repo's venv:

    PYTHONPATH=/work/main /work/main/.venv/bin/python scripts/fla_comparison/hyena_ours.py

Float32, matmul precision 'highest'. Layouts saved: ours (x, y B x L x D; the long filter
L x D; the conv op's kernel k D x L, as Zoology's fftconv_ref takes it).

- buffers: `position_embedding(MAX_LEN)` (our z at init), `decay_deltas(DIM)` and the t
  that `Hyena.filters` uses (`jnp.linspace(0, 1, max_len)`), against Zoology's
  PositionalEmbedding.z / .t and ExponentialModulation.deltas at init. No gradients.
- filter: `Hyena.filters(L)[0]` (L x D: the FFN of z[:L] times exp(-t |deltas|)) of the
  layer built at max_len 128 with the drawn weights; loss sum(w_h h); gradients w.r.t.
  the filter's parameters (z, freq, filter_in/hidden/out).
- conv: our long convolution is inline in `Hyena.__call__`; it is run as it is, on a
  stand-in `self` whose in_proj gives (x1, x2, v) = (1, 1, u), no short convolution,
  `filters` returns the given k and out_proj is the identity, so the call computes
  irfft(rfft(u) rfft(k))[:L] + u bias (Zoology's fftconv_ref(u, k, D=bias, gelu=False)).
  Gradients w.r.t. u, k and bias.
- layer: `registry.build("hyena", dim=32, num_heads=2, max_len=128, causal=True, rngs=...)`
  with the builder's defaults (filter_order 64, short_filter_order 3: Zoology's MQAR
  preset, Hyena(l_max=L) and its defaults), and with short_filter_order=0 (the MQAR / MAD
  scaffolds' setting here: no short convolution); L = 77 and 128 (77 < max_len: the first
  77 taps). Every parameter 0.4 N(0, 1) except z = position_embedding + 0.1 N(0, 1),
  freq = 1 + 0.4 N(0, 1), bias ~ N(0, 1) (its init); deltas stay the builder's buffer.
  Gradients of sum(w_y y) w.r.t. x and every nnx.Param.
- control (ours): the layer built with max_len = 77 at L = 77 (z = the drawn z[:77]):
  t = linspace(0, 1, 77) instead of Zoology's linspace(0, 1, 128)[:77]; must differ. Its
  z gradient is zero-padded to 128 rows.
"""
from __future__ import annotations

import os
import sys
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

jax.config.update("jax_default_matmul_precision", "highest")

from models import registry  # noqa: E402
from models.mixers import hyena  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ours_common as common  # noqa: E402

SEED = 20251210
B, DIM, MAX_LEN = 2, 32, 128
LENGTHS = (77, 128)
CONV_D = 16  # channels of the conv op rows
VARIANTS = {"sfo3": {}, "sfo0": {"short_filter_order": 0}}
FILTER_PARAMS = ("z", "freq", "filter_in", "filter_hidden", "filter_out")


def build(variant="sfo3", max_len=MAX_LEN):
    return registry.build("hyena", dim=DIM, num_heads=2, max_len=max_len, causal=True,
                          rngs=nnx.Rngs(0), **VARIANTS[variant])


def adjust(name, draw):
    if name == "z":
        return hyena.position_embedding(MAX_LEN) + draw / 4  # + 0.1 N(0, 1)
    if name == "freq":
        return 1.0 + draw
    if name == "bias":
        return draw / 0.4  # N(0, 1), as its init
    return draw


def draw_inputs(rng):
    inp = {}
    _, params, _ = nnx.split(build(), nnx.Param, ...)
    common.draw_params(rng, inp, "layer/param/", params, adjust=adjust)
    for length in LENGTHS:
        common.draw_x(rng, inp, f"layer/L{length}/", (B, length, DIM))
        inp[f"filter/L{length}/w_h"] = rng.standard_normal((length, DIM)).astype(np.float32)
        p = f"conv/L{length}/"
        inp[p + "u"] = rng.standard_normal((B, length, CONV_D)).astype(np.float32)
        inp[p + "k"] = (0.3 * rng.standard_normal((CONV_D, length))).astype(np.float32)
        inp[p + "bias"] = rng.standard_normal((CONV_D,)).astype(np.float32)
        inp[p + "w_o"] = rng.standard_normal((B, length, CONV_D)).astype(np.float32)
    return inp


def run_buffers(out):
    out["buffers/z_init"] = hyena.position_embedding(MAX_LEN)
    out["buffers/deltas"] = hyena.decay_deltas(DIM)
    out["buffers/t"] = np.asarray(jnp.linspace(0.0, 1.0, MAX_LEN))


def run_filter(inp, out):
    graphdef, params, rest = nnx.split(build(), nnx.Param, ...)
    tree = common.load_params(inp, "layer/param/", params)
    for length in LENGTHS:
        w_h = jnp.asarray(inp[f"filter/L{length}/w_h"])

        def loss(tree):
            h = nnx.merge(graphdef, tree, rest).filters(length)[0]
            return jnp.sum(w_h * h), h
        g_tree, h = jax.grad(loss, has_aux=True)(tree)
        p = f"filter/L{length}/"
        out[p + "h"] = np.asarray(h)
        for path, leaf in jax.tree_util.tree_leaves_with_path(g_tree):
            name = common.param_name(path)
            if name.split(".")[0] in FILTER_PARAMS:
                out[p + "grad_param/" + name] = np.asarray(leaf)


def conv_standin(length, k_DxL, bias_D):
    """A stand-in `self` for Hyena.__call__ (module docstring, conv)."""
    return types.SimpleNamespace(
        max_len=length, causal=True, short_filter_order=0,
        in_proj=lambda u: jnp.concatenate([jnp.ones_like(u), jnp.ones_like(u), u], -1),
        filters=lambda n: k_DxL.T[None, :n], bias=bias_D, out_proj=lambda y: y)


def run_conv(inp, out):
    for length in LENGTHS:
        p = f"conv/L{length}/"
        u, k, bias = (jnp.asarray(inp[p + a]) for a in ("u", "k", "bias"))
        w_o = jnp.asarray(inp[p + "w_o"])

        def loss(u, k, bias):
            o = hyena.Hyena.__call__(conv_standin(length, k, bias), u)
            return jnp.sum(w_o * o), o
        grads, o = jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(u, k, bias)
        out[p + "o"] = np.asarray(o)
        for a, d in zip(("u", "k", "bias"), grads):
            out[p + "grad_" + a] = np.asarray(d)


def call(layer, x):
    return layer(x, padding_mask=None, deterministic=True)


def run_layer(inp, out):
    for variant in VARIANTS:
        graphdef, params, rest = nnx.split(build(variant), nnx.Param, ...)
        tree = common.load_params(inp, "layer/param/", params)
        for length in LENGTHS:
            common.layer_grads(out, f"layer/{variant}/L{length}/", graphdef, tree,
                               jnp.asarray(inp[f"layer/L{length}/x"]),
                               jnp.asarray(inp[f"layer/L{length}/w_y"]), call, rest=(rest,))
    # control: max_len = L = 77 (t = linspace(0, 1, 77)), z = the drawn z[:77]
    length = 77
    graphdef, params, rest = nnx.split(build(max_len=length), nnx.Param, ...)
    short = {k: (v[:length] if k == "layer/param/z" else v) for k, v in inp.items()}
    p = f"layer/control_maxlen/L{length}/"
    common.layer_grads(out, p, graphdef, common.load_params(short, "layer/param/", params),
                       jnp.asarray(inp[f"layer/L{length}/x"]),
                       jnp.asarray(inp[f"layer/L{length}/w_y"]), call, rest=(rest,))
    gz = out[p + "grad_param/z"]
    out[p + "grad_param/z"] = np.concatenate([gz, np.zeros((MAX_LEN - length, 3), gz.dtype)])


def main():
    t0 = time.time()
    rng = np.random.default_rng(SEED)
    inp = draw_inputs(rng)
    out = {}
    run_buffers(out)
    run_filter(inp, out)
    run_conv(inp, out)
    run_layer(inp, out)
    common.save("hyena", inp, out, t0)


if __name__ == "__main__":
    main()

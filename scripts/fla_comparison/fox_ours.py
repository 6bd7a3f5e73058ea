"""Our side of the fox / fla comparison (README.md): draws every input and weight with
numpy (fixed seed), saves them to $CMP_DIR/fox_inputs.npz, runs our JAX code on them and
saves outputs and gradients to $CMP_DIR/fox_ours.npz. Run with the repo's venv:

    PYTHONPATH=/work/main /work/main/.venv/bin/python scripts/fla_comparison/fox_ours.py

Float32, matmul precision 'highest'.

Layouts saved: ours, i.e. q/k/v BxHxLxD, log f BxHxL (fla: BxTxHxD and BxTxH; fox_fla.py
converts its results to ours before saving).
"""
from __future__ import annotations

import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

jax.config.update("jax_default_matmul_precision", "highest")

from models import masks, registry  # noqa: E402
from models.attention import dense, forgetting  # noqa: E402
from models.kernels.chunked_attention import chunked_attention  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ours_common as common  # noqa: E402

SEED = 20251101
B, H, D = 2, 3, 16
OP_LENGTHS = (128, 77)
TILES = (32, 16)  # chunked_attention chunk_q = chunk_k for the tiled rows (besides the default)
OP_GRADS = ("q", "k", "v", "logf")
LAYER = dict(dim=32, num_heads=2)
LAYER_LENGTHS = (77, 128)
# variant: build kwargs (besides dim, num_heads, max_len, causal, rngs, attention_dropout)
VARIANTS = {
    "dense": {},
    "flash": {"attention_impl": "flash"},
    "dense_gate": {"output_gate": True},
    "flash_gate": {"attention_impl": "flash", "output_gate": True},
}


def draw_inputs(rng):
    inp = {}
    for length in OP_LENGTHS:
        p = f"op/L{length}/"
        for name in ("q", "k", "v"):
            inp[p + name] = rng.standard_normal((B, H, length, D)).astype(np.float32)
        # log f = log sigmoid(N(1.5, 1.5^2)): f mostly in (0.5, 1), a few near 0.
        z = 1.5 + 1.5 * rng.standard_normal((B, H, length))
        inp[p + "logf"] = (-np.logaddexp(0.0, -z)).astype(np.float32)
        inp[p + "w_o"] = rng.standard_normal((B, H, length, D)).astype(np.float32)
    return inp


# ----------------------------------------------------------------------------- op level


def op_dense(q, k, v, logf):
    """ForgettingAttention.__call__'s dense path on given q, k, v, log f (no projections):
    c = cumsum(log f), logits q.k/sqrt(D) + forget_bias(c, c), the causal mask, softmax."""
    length = q.shape[2]
    c = jnp.cumsum(logf, axis=-1)
    logits = jnp.einsum("bhqk,bhsk->bhqs", q, k,
                        preferred_element_type=jnp.float32) / math.sqrt(q.shape[-1])
    logits = logits + forgetting.forget_bias(c, c, causal=True)
    mask = dense.make_attention_mask(None, causal=True, q_len=length, kv_len=length)
    return dense.attend_logits(logits, v, mask=mask)


def op_flash(tile=None):
    """ForgettingAttention.__call__'s flash path: chunked_attention with forget=(c, c)."""
    kw = {} if tile is None else {"chunk_q": tile, "chunk_k": tile}

    def run(q, k, v, logf):
        c = jnp.cumsum(logf, axis=-1)
        return chunked_attention(q, k, v, masks.causal(), forget=(c, c), **kw)
    return run


def op_impls():
    impls = {"dense": op_dense, "flash": op_flash()}
    for tile in TILES:
        impls[f"flash{tile}"] = op_flash(tile)
    return impls


def run_ops(inp, out):
    for length in OP_LENGTHS:
        p = f"op/L{length}/"
        args = tuple(jnp.asarray(inp[p + a]) for a in OP_GRADS)
        w_o = jnp.asarray(inp[p + "w_o"])
        for impl, fn in op_impls().items():
            def loss(*a):
                o = fn(*a)
                return jnp.sum(w_o * o), o
            grads, o = jax.grad(loss, argnums=tuple(range(4)), has_aux=True)(*args)
            out[f"{p}{impl}/o"] = np.asarray(o)
            for a, d in zip(OP_GRADS, grads):
                out[f"{p}{impl}/grad_{a}"] = np.asarray(d)


# ----------------------------------------------------------------------------- layer


def build_layer(variant, max_len):
    return registry.build("fox", dim=LAYER["dim"], num_heads=LAYER["num_heads"],
                          max_len=max_len, causal=True, rngs=nnx.Rngs(0),
                          attention_dropout=0.0, **VARIANTS[variant])


def split(module):
    """(graphdef, the parameters, the rest: the dropout's rng state)."""
    return nnx.split(module, nnx.Param, ...)


def draw_layer(rng, inp):
    """One set of weights (the output-gate build's, a superset), shared by every variant."""
    _, params, _ = split(build_layer("dense_gate", max(LAYER_LENGTHS)))
    common.draw_params(rng, inp, "layer/param/", params)
    for length in LAYER_LENGTHS:
        common.draw_x(rng, inp, f"layer/L{length}/", (B, length, LAYER["dim"]))


def run_layer(inp, out):
    for variant in VARIANTS:
        for length in LAYER_LENGTHS:
            graphdef, params, rest = split(build_layer(variant, length))
            common.layer_grads(
                out, f"layer/{variant}/L{length}/", graphdef,
                common.load_params(inp, "layer/param/", params),
                jnp.asarray(inp[f"layer/L{length}/x"]), jnp.asarray(inp[f"layer/L{length}/w_y"]),
                lambda layer, x: layer(x, padding_mask=None, deterministic=True), rest=(rest,))


def main():
    t0 = time.time()
    rng = np.random.default_rng(SEED)
    inp = draw_inputs(rng)
    draw_layer(rng, inp)
    out = {}
    run_ops(inp, out)
    run_layer(inp, out)
    common.save("fox", inp, out, t0)


if __name__ == "__main__":
    main()

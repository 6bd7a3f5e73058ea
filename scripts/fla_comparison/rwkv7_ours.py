"""Our side of the rwkv7 / fla comparison (results/cpu/rwkv7_vs_fla.md): draws every input
and weight with numpy (fixed seed), saves them to $CMP_DIR/rwkv7_inputs.npz, runs our JAX
code on them and saves outputs and gradients to $CMP_DIR/rwkv7_ours.npz. Repo venv:

    PYTHONPATH=/work/main /work/main/.venv/bin/python scripts/fla_comparison/rwkv7_ours.py

Float32 (our code casts to float32 throughout), matmul precision 'highest'.

Op: fla's chunk_rwkv7 arguments (r, w = log decay, k, v, a, b; rwkv7's a = -kk, b = kk *
a_lr), drawn as the layer makes them: kk unit per head, a_lr in (0, 1), w in
[-e^{-1/2}, 0). Layouts saved: ours, i.e. BxHxLxF and the state BxHxVxK (fla: BxTxHxF and
BxHxKxV; rwkv7_fla.py converts its results to ours before saving). Layer: the causal
rwkv7 at dim 32, 2 heads (head 16), chunk 16, every parameter 0.4 N(0, 1); at L 77 and
128 without a mask, and at L 64 with left-padded rows (fla's attention_mask), the loss
then over real positions only.
"""
from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

jax.config.update("jax_default_matmul_precision", "highest")

from models import registry  # noqa: E402
from models.attention import rwkv7  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ours_common as common  # noqa: E402

SEED = 20250318
B, H, K = 2, 3, 16
OP_CASES = {"L128_V32": (128, 32), "L77_V16": (77, 16)}  # name: (L, d_v)
CHUNKS = (16, 32, 64)
OP_ARGS = ("r", "w", "k", "v", "a", "b")
LAYER = dict(dim=32, num_heads=2, chunk_size=16)
LAYER_CASES = {"L77": (77, None), "L128": (128, None), "L64_leftpad": (64, (0, 19))}


def draw_inputs(rng):
    inp = {}
    for name, (length, v_dim) in OP_CASES.items():
        p = f"op/{name}/"
        kk = rng.standard_normal((B, H, length, K))
        kk /= np.linalg.norm(kk, axis=-1, keepdims=True)
        a_lr = 1 / (1 + np.exp(-rng.standard_normal((B, H, length, K))))
        inp[p + "r"] = rng.standard_normal((B, H, length, K)).astype(np.float32)
        inp[p + "w"] = (-rwkv7.DECAY_SCALE / (1 + np.exp(-rng.standard_normal(
            (B, H, length, K))))).astype(np.float32)
        inp[p + "k"] = rng.standard_normal((B, H, length, K)).astype(np.float32)
        inp[p + "v"] = rng.standard_normal((B, H, length, v_dim)).astype(np.float32)
        inp[p + "a"] = (-kk).astype(np.float32)
        inp[p + "b"] = (kk * a_lr).astype(np.float32)
        inp[p + "w_o"] = rng.standard_normal((B, H, length, v_dim)).astype(np.float32)
        inp[p + "w_s"] = rng.standard_normal((B, H, v_dim, K)).astype(np.float32)
    return inp


def run_ops(inp, out):
    for name in OP_CASES:
        p = f"op/{name}/"
        args = tuple(jnp.asarray(inp[p + a]) for a in OP_ARGS)
        w_o, w_s = jnp.asarray(inp[p + "w_o"]), jnp.asarray(inp[p + "w_s"])
        impls = [("reference", rwkv7.dplr_reference)] + [
            (f"chunk{c}", lambda *a, c=c: rwkv7.chunk_dplr(*a, chunk_size=c)) for c in CHUNKS]
        for impl, fn in impls:
            def loss(*a, fn=fn):
                o, s = fn(*a)
                return jnp.sum(w_o * o) + jnp.sum(w_s * s), (o, s)
            grads, (o, s) = jax.grad(loss, argnums=tuple(range(6)), has_aux=True)(*args)
            out[f"{p}{impl}/o"], out[f"{p}{impl}/S"] = np.asarray(o), np.asarray(s)
            for a, d in zip(OP_ARGS, grads):
                out[f"{p}{impl}/grad_{a}"] = np.asarray(d)


# ----------------------------------------------------------------------------- layer


def build_layer(max_len):
    return registry.build("rwkv7", dim=LAYER["dim"], num_heads=LAYER["num_heads"],
                          max_len=max_len, causal=True, rngs=nnx.Rngs(0),
                          chunk_size=LAYER["chunk_size"])


def layer_mask(length, pad):
    """Row 0 real everywhere, row 1 left-padded by `pad` positions (fla's convention for
    its attention_mask: padding before the tokens); None without padding."""
    if pad is None:
        return None
    mask = np.ones((B, length), bool)
    mask[1, :pad[1]] = False
    return mask


def draw_layer(rng, inp):
    _, state = nnx.split(build_layer(128))
    common.draw_params(rng, inp, "layer/param/", state)
    for name, (length, pad) in LAYER_CASES.items():
        common.draw_x(rng, inp, f"layer/{name}/", (B, length, LAYER["dim"]))
        if pad is not None:
            inp[f"layer/{name}/mask"] = layer_mask(length, pad)


def run_layer(inp, out):
    for name, (length, _) in LAYER_CASES.items():
        graphdef, state = nnx.split(build_layer(length))
        p = f"layer/{name}/"
        x, w_y = jnp.asarray(inp[p + "x"]), jnp.asarray(inp[p + "w_y"])
        mask = jnp.asarray(inp[p + "mask"]) if p + "mask" in inp else None
        real = jnp.ones(x.shape[:2], bool) if mask is None else mask
        # Padded outputs are out of the loss and saved as 0 (fla's).
        common.layer_grads(
            out, p, graphdef, common.load_params(inp, "layer/param/", state), x, w_y,
            lambda layer, x: jnp.where(real[..., None], layer(x, padding_mask=mask), 0.0),
            jit=True)


def main():
    t0 = time.time()
    rng = np.random.default_rng(SEED)
    inp = draw_inputs(rng)
    draw_layer(rng, inp)
    out = {}
    run_ops(inp, out)
    run_layer(inp, out)
    common.save("rwkv7", inp, out, t0)


if __name__ == "__main__":
    main()

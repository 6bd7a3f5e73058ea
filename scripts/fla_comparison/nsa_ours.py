"""Our side of the nsa / fla comparison (results/cpu/nsa_vs_fla.md): draws every input and
weight with numpy (fixed seed), saves them to $CMP_DIR/nsa_inputs.npz, runs our JAX code
(models/attention/nsa.py) on them and saves outputs, gradients and the chosen blocks to
$CMP_DIR/nsa_ours.npz. Run with the repo's venv:

    PYTHONPATH=/work/main /work/main/.venv/bin/python scripts/fla_comparison/nsa_ours.py

Float32, matmul precision 'highest'.

Op level: nsa.parallel_nsa on given (rotated) q, k, v and gates, with block indices drawn
as fla's tests/ops/test_nsa.py build_block_indices ("given") and with the blocks it
chooses ("chosen"). Layer level: the causal `nsa` mixer with rotary (fla's layer always
rotates), also with the second row right-padded (fla: attention_mask, unpadded to
cu_seqlens). Layouts saved: ours, i.e. q BxHxLxK, k/v BxGxLxK (G kv heads), gates and w_o
BxHxL(xK), block indices BxGxLxS (nsa_fla.py converts fla's BxTxHx... to ours).
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
from models.attention import nsa  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ours_common as common  # noqa: E402

SEED = 20251205
B = 2
# op cases: (L, query heads, kv heads, K, block_size, block_counts, window_size). fla's
# kernels need a group of >= 16 query heads per kv head (naive_nsa asserts it too).
OP_CASES = {"L128": (128, 16, 1, 16, 8, 6, 16), "L77": (77, 32, 2, 16, 8, 5, 12)}
OP_GRADS = ("q", "k", "v", "g_cmp", "g_slc", "g_swa")
# layer cases: (L, dim, heads, kv heads, head_dim, block_size, block_counts, window_size)
LAYER_CASES = {"L128": (128, 32, 16, 1, 8, 8, 6, 16), "L77": (77, 32, 32, 2, 4, 8, 5, 12)}
WEIGHT_SCALE = 0.3
PAD = 24  # padded positions at the end of the second row in the padded layer runs


def given_indices(rng, length, kv_heads, counts, block_size):
    """fla's build_block_indices: per (b, t, h) up to S distinct blocks among the
    ceil((t + 1) / block_size) blocks up to t's own, sorted, -1 in the free slots.
    Ours layout BxGxLxS."""
    idx = np.full((B, kv_heads, length, counts), -1, np.int32)
    for b in range(B):
        for t in range(length):
            for h in range(kv_heads):
                pick = rng.permutation(-(-(t + 1) // block_size))[:counts]
                idx[b, h, t, :len(pick)] = pick
    return np.sort(idx, axis=-1)  # -1 first, as fla's .sort(-1)


def draw_inputs(rng):
    inp = {}
    for case, (length, hq, h, k, bs, s, _) in OP_CASES.items():
        p = f"op/{case}/"
        inp[p + "q"] = rng.standard_normal((B, hq, length, k)).astype(np.float32)
        inp[p + "k"] = rng.standard_normal((B, h, length, k)).astype(np.float32)
        inp[p + "v"] = rng.standard_normal((B, h, length, k)).astype(np.float32)
        for g in ("g_cmp", "g_slc", "g_swa"):
            inp[p + g] = (1 / (1 + np.exp(-rng.standard_normal((B, hq, length))))).astype(
                np.float32)
        inp[p + "w_o"] = rng.standard_normal((B, hq, length, k)).astype(np.float32)
        inp[p + "block_idx"] = given_indices(rng, length, h, s, bs)
    return inp


# ----------------------------------------------------------------------------- op level


def run_ops(inp, out):
    for case, (length, hq, h, k, bs, s, w) in OP_CASES.items():
        p = f"op/{case}/"
        args = tuple(jnp.asarray(inp[p + a]) for a in OP_GRADS)
        w_o = jnp.asarray(inp[p + "w_o"])
        valid = jnp.ones((B, length), bool)
        for mode in ("given", "chosen"):
            idx = jnp.asarray(inp[p + "block_idx"]) if mode == "given" else None

            def loss(q, k, v, g_cmp, g_slc, g_swa):
                o, chosen = nsa.parallel_nsa(q, k, v, (g_cmp, g_slc, g_swa), valid,
                                             block_size=bs, block_counts=s, window_size=w,
                                             causal=True, block_idx=idx)
                return jnp.sum(w_o * o), (o, chosen)
            grads, (o, chosen) = jax.jit(jax.grad(loss, argnums=tuple(range(6)),
                                                  has_aux=True))(*args)
            key = f"{p}{mode}/"
            out[key + "o"] = np.asarray(o)
            out[key + "block_idx"] = np.asarray(chosen)
            for a, d in zip(OP_GRADS, grads):
                out[key + "grad_" + a] = np.asarray(d)


# ----------------------------------------------------------------------------- layer


def build_layer(case):
    length, dim, heads, kv, head_dim, bs, s, w = LAYER_CASES[case]
    return registry.build("nsa", dim=dim, num_heads=heads, max_len=length, causal=True,
                          rngs=nnx.Rngs(0), rotary=True, qkv_dim=heads * head_dim,
                          num_kv_heads=kv, block_size=bs, block_counts=s, window_size=w)


def split(module):
    return nnx.split(module, nnx.Param, ...)


def run_layers(rng, inp, out):
    for case, (length, dim, *_rest) in LAYER_CASES.items():
        graphdef, params, rest = split(build_layer(case))
        p = f"layer/{case}/"
        common.draw_params(rng, inp, p + "param/", params, scale=WEIGHT_SCALE)
        params = common.load_params(inp, p + "param/", params)
        common.draw_x(rng, inp, p, (B, length, dim))
        # The padded run: the second row right-padded (fla: attention_mask -> unpad).
        inp[p + "mask"] = np.arange(length)[None] < np.array([[length], [length - PAD]])
        x, w_y = jnp.asarray(inp[p + "x"]), jnp.asarray(inp[p + "w_y"])
        for run, mask in (("", None), ("padded/", jnp.asarray(inp[p + "mask"]))):
            # Padded outputs are unspecified (fla's are 0): out of the loss, zeroed.
            keep = 1.0 if mask is None else mask[..., None]
            common.layer_grads(
                out, p + run, graphdef, params, x, w_y,
                lambda layer, x: layer(x, padding_mask=mask, deterministic=True) * keep,
                rest=(rest,), jit=True)


def main():
    t0 = time.time()
    rng = np.random.default_rng(SEED)
    inp = draw_inputs(rng)
    out = {}
    run_layers(rng, inp, out)
    for case, cfg in OP_CASES.items():
        inp[f"op/{case}/config"] = np.array(cfg[4:])  # block_size, block_counts, window
    for case, cfg in LAYER_CASES.items():
        inp[f"layer/{case}/config"] = np.array(cfg[1:])  # dim, heads, kv, head_dim, bs, S, W
    run_ops(inp, out)
    common.save("nsa", inp, out, t0)


if __name__ == "__main__":
    main()

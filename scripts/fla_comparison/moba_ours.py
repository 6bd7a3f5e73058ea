"""Our side of the moba comparison (results/cpu/moba_vs_original.md): draws every input and
weight with numpy (fixed seed), saves them to $CMP_DIR/moba_inputs.npz, runs our JAX code
(models/attention/moba.py) on them and saves outputs, gradients and the chosen blocks to
$CMP_DIR/moba_ours.npz. Run with the repo's venv:

    PYTHONPATH=/work/main nice -n 10 /work/main/.venv/bin/python scripts/fla_comparison/moba_ours.py

Float32, matmul precision 'highest'.

- op level (B 2, H 3, K 16; q, k, v ~ N(0, 1), BxHxLxK): per case a batch of two rows of
  lengths (128, 128), (77, 77) or (77, 50) (the second row right-padded to 77: a varlen batch,
  the original's cu_seqlens [0, 77, 127]), a block size (16, 12, 10: 12 and 10 do not divide
  77) and top_k 1, 2, 3 (1: L 128 only). Ours, the causal mixer's two forms on given q, k, v:
  "dense" is `MixtureOfBlockAttention.attend` (selected_blocks, key_mask, the masked
  softmax) of a layer built by the registry; "flash" is the lines of its __call__ for
  attention_impl='flash' (selected_blocks, then chunked_attention with the causal pattern,
  valid_BxKv and key_blocks) with the default tiles (one tile here) and with tiles of 32 and
  16 (several tiles, a padded tail at 77). Loss sum(w_o o), w_o ~ N(0, 1), 0 on padded
  query rows; gradients w.r.t. q, k, v. Saved: o (0 on padded rows: unspecified there), the
  gradients, and selected_blocks' table (BxHxLxN bool).
- layer: `registry.build("moba", dim=32, num_heads=2, max_len=L, causal=True,
  rngs=nnx.Rngs(0), attention_dropout=0.0, block_size=bs, top_k=k)` with attention_impl
  'dense' / 'flash' and rotary False / True (four variants sharing one weight set, every
  parameter 0.3 N(0, 1): query/key/value/out kernel and bias); x ~ N(0, 1), (L, bs, k) =
  (77, 12, 3) and (128, 16, 2); loss sum(w_y y); gradients w.r.t. x and every parameter.
  Also the rotary variants with padding_mask (row 2 right-padded by 24; w_y 0 there, y saved
  0 there).
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

from models import masks, registry  # noqa: E402
from models.attention import moba  # noqa: E402
from models.kernels.chunked_attention import chunked_attention  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ours_common as common  # noqa: E402

SEED = 20251107
B, H, D = 2, 3, 16
# case: (row lengths, block size, top_k values)
OP_CASES = {
    "L128_bs16": ((128, 128), 16, (1, 2, 3)),
    "L77_bs12": ((77, 77), 12, (2, 3)),
    "varlen77_50_bs10": ((77, 50), 10, (2, 3)),
}
TILES = (32, 16)  # chunked_attention chunk_q = chunk_k, besides the default (one tile)
OP_GRADS = ("q", "k", "v")
LAYER = dict(dim=32, num_heads=2)
# case: (L, block size, top_k)
LAYER_CASES = {"L77": (77, 12, 3), "L128": (128, 16, 2)}
PAD = 24  # the padded runs: row 2's last PAD positions are padding
VARIANTS = {
    "dense": {},
    "flash": {"attention_impl": "flash"},
    "dense_rope": {"rotary": True},
    "flash_rope": {"attention_impl": "flash", "rotary": True},
}
PADDED_VARIANTS = ("dense_rope", "flash_rope")


def valid_of(lengths, length):
    return np.arange(length)[None, :] < np.asarray(lengths)[:, None]  # BxL


def draw_inputs(rng):
    inp = {}
    for case, (lengths, bs, top_ks) in OP_CASES.items():
        p = f"op/{case}/"
        length = max(lengths)
        for name in ("q", "k", "v"):
            inp[p + name] = rng.standard_normal((B, H, length, D)).astype(np.float32)
        valid = valid_of(lengths, length)
        w_o = rng.standard_normal((B, H, length, D)) * valid[:, None, :, None]
        inp[p + "w_o"] = w_o.astype(np.float32)
        inp[p + "lengths"] = np.asarray(lengths, np.int64)
        inp[p + "block_size"] = np.asarray(bs, np.int64)
        inp[p + "top_ks"] = np.asarray(top_ks, np.int64)
    return inp


# ----------------------------------------------------------------------------- op level


def op_layer(bs, top_k):
    """A causal layer of the registry: only its attend() and settings are used."""
    return registry.build("moba", dim=H * D, num_heads=H, max_len=128, causal=True,
                          rngs=nnx.Rngs(0), attention_dropout=0.0, block_size=bs, top_k=top_k)


def op_impls(layer, valid, pos):
    def dense(q, k, v):
        return layer.attend(q, k, v, valid, pos, None)

    def flash(tile=None):
        kw = {} if tile is None else {"chunk_q": tile, "chunk_k": tile}

        def run(q, k, v):  # MixtureOfBlockAttention.__call__, attention_impl='flash'
            chosen = moba.selected_blocks(q, k, valid, pos, block_size=layer.block_size,
                                          top_k=layer.top_k, causal=layer.causal)
            return chunked_attention(q, k, v, masks.causal(), valid_BxKv=valid,
                                     key_blocks=(chosen, layer.block_size), **kw)
        return run

    impls = {"dense": dense, "flash": flash()}
    for tile in TILES:
        impls[f"flash{tile}"] = flash(tile)
    return impls


def run_ops(inp, out):
    for case, (lengths, bs, top_ks) in OP_CASES.items():
        p = f"op/{case}/"
        length = max(lengths)
        valid_np = valid_of(lengths, length)
        valid = jnp.asarray(valid_np)
        pos = jnp.broadcast_to(jnp.arange(length)[None], (B, length))
        args = tuple(jnp.asarray(inp[p + a]) for a in OP_GRADS)
        w_o = jnp.asarray(inp[p + "w_o"])
        for top_k in top_ks:
            layer = op_layer(bs, top_k)
            key = f"{p}k{top_k}/"
            chosen = moba.selected_blocks(*args[:2], valid, pos, block_size=bs, top_k=top_k,
                                          causal=True)
            out[key + "chosen"] = np.asarray(chosen)
            for impl, fn in op_impls(layer, valid, pos).items():
                def loss(*a):
                    o = fn(*a)
                    return jnp.sum(w_o * o), o
                grads, o = jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(*args)
                out[f"{key}{impl}/o"] = np.asarray(o) * valid_np[:, None, :, None]
                for a, d in zip(OP_GRADS, grads):
                    out[f"{key}{impl}/grad_{a}"] = np.asarray(d)
            print(f"op {case} top_k {top_k} done", flush=True)


# ----------------------------------------------------------------------------- layer


def build_layer(variant, length, bs, top_k):
    return registry.build("moba", dim=LAYER["dim"], num_heads=LAYER["num_heads"],
                          max_len=length, causal=True, rngs=nnx.Rngs(0),
                          attention_dropout=0.0, block_size=bs, top_k=top_k,
                          **VARIANTS[variant])


def split(module):
    """(graphdef, the parameters, the rest: the dropout's rng state)."""
    return nnx.split(module, nnx.Param, ...)


def draw_layer(rng, inp):
    """One weight set (the same shapes in every variant and case)."""
    _, params, _ = split(build_layer("dense", 77, 12, 3))
    common.draw_params(rng, inp, "layer/param/", params, scale=0.3)
    for case, (length, bs, top_k) in LAYER_CASES.items():
        p = f"layer/{case}/"
        common.draw_x(rng, inp, p, (B, length, LAYER["dim"]))
        inp[p + "config"] = np.asarray([length, bs, top_k], np.int64)
        mask = np.ones((B, length), bool)
        mask[1, length - PAD:] = False
        inp[p + "mask"] = mask
        inp[p + "w_y_padded"] = (inp[p + "w_y"] * mask[..., None]).astype(np.float32)


def run_layer(inp, out):
    for case, (length, bs, top_k) in LAYER_CASES.items():
        p = f"layer/{case}/"
        x = jnp.asarray(inp[p + "x"])
        mask = jnp.asarray(inp[p + "mask"])
        for variant in VARIANTS:
            graphdef, params, rest = split(build_layer(variant, length, bs, top_k))
            params = common.load_params(inp, "layer/param/", params)
            common.layer_grads(out, f"{p}{variant}/", graphdef, params, x,
                               jnp.asarray(inp[p + "w_y"]),
                               lambda layer, x: layer(x, padding_mask=None, deterministic=True),
                               rest=(rest,))
            if variant in PADDED_VARIANTS:
                key = f"{p}padded/{variant}/"
                common.layer_grads(
                    out, key, graphdef, params, x, jnp.asarray(inp[p + "w_y_padded"]),
                    lambda layer, x: layer(x, padding_mask=mask, deterministic=True),
                    rest=(rest,))
                out[key + "y"] = out[key + "y"] * inp[p + "mask"][..., None]
            print(f"layer {case} {variant} done", flush=True)


def main():
    t0 = time.time()
    rng = np.random.default_rng(SEED)
    inp = draw_inputs(rng)
    draw_layer(rng, inp)
    out = {}
    run_ops(inp, out)
    run_layer(inp, out)
    common.save("moba", inp, out, t0)


if __name__ == "__main__":
    main()

"""Our side of the based / Zoology comparison (README.md, results/cpu/based_vs_zoology.md):
draws every input and weight with numpy (fixed seed), saves them to
$CMP_DIR/based_inputs.npz, runs our JAX code on them and saves outputs and gradients to
$CMP_DIR/based_ours.npz. Run with the repo's venv:

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python scripts/fla_comparison/based_ours.py

Float32, matmul precision 'highest'. Three levels:
- the feature map: `based.taylor_features` (Zoology's TaylorExp.forward), d = 16 and 8;
- the op: `linear_attention(taylor_features(q), taylor_features(k), v)` (what
  BasedLinearAttention.attend computes without padding) causal with chunk sizes 64 (the
  default), 16 and 128 (one chunk), bidirectional; eps 1e-12 (Zoology's) and, for fla's
  naive op, 1e-6 (fla's);
- the layer through the layer class: `registry.build("based", ...)` with feature_dim 16
  and 1 head (Zoology's MQAR row, models_repo.py add_based: num_heads =
  num_key_value_heads = 1) or 2 heads (our zoology scaffold's, configs/scaffold.py), and
  feature_dim 8 with 2 heads; every causal chunk size above, causal=False, and the
  decoding form (prefill of ragged prompts, then one `step` per token; forward only).

Layouts saved: ours (q, k BxHxLxF, v BxHxLxK; the layer's x BxLxD); based_zoology.py
converts its results to ours.
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
from models.attention import based  # noqa: E402
from models.attention.linear_scan import linear_attention  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ours_common as common  # noqa: E402

SEED = 20251212
B = 2
FM_DIMS = (16, 8)  # feature map input widths (feature_dim)
FM_SHAPE = (B, 2, 77)  # BxHxL of the feature map's input
OP = dict(heads=2, feature_dim=16, head_dim=16)
OP_LENGTHS = (128, 77)
OP_GRADS = ("q", "k", "v")
CHUNKS = (64, 16, 128)  # 64: the default (DEFAULT_CHUNK); 128: one chunk at both lengths
EPS_ZOOLOGY, EPS_FLA = 1e-12, 1e-6
DIM = 32
LAYER_LENGTHS = (77, 128)
# config: (num_heads, feature_dim, our forms); form: build kwargs, or "decode"
FORMS_FULL = ("chunk64", "chunk16", "chunk128", "quadratic", "bidir", "decode")
CONFIGS = {"h1f16": (1, 16, FORMS_FULL), "h2f16": (2, 16, FORMS_FULL),
           "h2f8": (2, 8, ("chunk64", "bidir"))}
QK_SCALE = 0.5  # query/key kernels 0.2 N(0,1) (the others 0.4): q.k/sqrt(d) of order 1


def form_kwargs(form):
    if form == "bidir":
        return dict(causal=False)
    if form == "decode":
        return dict(causal=True)  # impl auto: the prompt's outputs by the quadratic form
    if form == "quadratic":
        return dict(causal=True, impl="quadratic")
    return dict(causal=True, chunk_size=int(form[len("chunk"):]), impl="chunked")


# ----------------------------------------------------------------------------- draws


def draw_inputs(rng):
    inp = {}
    for d in FM_DIMS:
        p = f"fm/d{d}/"
        inp[p + "x"] = rng.standard_normal(FM_SHAPE + (d,)).astype(np.float32)
        inp[p + "w"] = rng.standard_normal(FM_SHAPE + (1 + d + d * d,)).astype(np.float32)
    h, f, k = OP["heads"], OP["feature_dim"], OP["head_dim"]
    for length in OP_LENGTHS:
        p = f"op/L{length}/"
        for name, width in (("q", f), ("k", f), ("v", k)):
            inp[p + name] = rng.standard_normal((B, h, length, width)).astype(np.float32)
        inp[p + "w_o"] = rng.standard_normal((B, h, length, k)).astype(np.float32)
    return inp


def build_layer(config, form, length):
    heads, feature_dim, _ = CONFIGS[config]
    return registry.build("based", dim=DIM, num_heads=heads, max_len=length,
                          rngs=nnx.Rngs(0), feature_dim=feature_dim, **form_kwargs(form))


def split(module):
    """(graphdef, the parameters, the rest: the unused dropout's rng state)."""
    return nnx.split(module, nnx.Param, ...)


def draw_layer(rng, inp):
    """One weight set per config (shared by its forms); x and w_y per length."""
    for config in CONFIGS:
        _, params, _ = split(build_layer(config, "chunk64", max(LAYER_LENGTHS)))
        common.draw_params(
            rng, inp, f"layer/{config}/param/", params,
            adjust=lambda name, w: QK_SCALE * w if name in ("query.kernel", "key.kernel") else w)
    for length in LAYER_LENGTHS:
        common.draw_x(rng, inp, f"layer/L{length}/", (B, length, DIM))
        # decoding: ragged prompts (right-padded to the longer), then one step per token
        inp[f"layer/L{length}/prompt_lens"] = np.array([length // 3, length // 2], np.int32)


# ----------------------------------------------------------------------------- runs


def run_feature_map(inp, out):
    for d in FM_DIMS:
        p = f"fm/d{d}/"
        w = jnp.asarray(inp[p + "w"])

        def loss(x):
            phi = based.taylor_features(x)
            return jnp.sum(w * phi), phi
        g, phi = jax.grad(loss, has_aux=True)(jnp.asarray(inp[p + "x"]))
        out[p + "ours/phi"], out[p + "ours/grad_x"] = np.asarray(phi), np.asarray(g)


def op_forms():
    """name -> (causal, chunk_size, eps)."""
    forms = {f"chunk{c}": (True, c, EPS_ZOOLOGY) for c in CHUNKS}
    forms["bidir"] = (False, 64, EPS_ZOOLOGY)
    forms["chunk64_eps1e-6"] = (True, 64, EPS_FLA)
    forms["chunk16_eps1e-6"] = (True, 16, EPS_FLA)
    return forms


def run_ops(inp, out):
    for length in OP_LENGTHS:
        p = f"op/L{length}/"
        args = tuple(jnp.asarray(inp[p + a]) for a in OP_GRADS)
        w_o = jnp.asarray(inp[p + "w_o"])
        for name, (causal, chunk, eps) in op_forms().items():
            def loss(q, k, v):
                o = linear_attention(based.taylor_features(q), based.taylor_features(k), v,
                                     causal=causal, chunk_size=chunk, eps=eps)
                return jnp.sum(w_o * o), o
            grads, o = jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(*args)
            out[f"{p}{name}/o"] = np.asarray(o)
            for a, d in zip(OP_GRADS, grads):
                out[f"{p}{name}/grad_{a}"] = np.asarray(d)

        def quadratic_loss(q, k, v):  # the layer's closed-form causal op (impl="quadratic")
            o = based.quadratic(q, k, v, None, EPS_ZOOLOGY)
            return jnp.sum(w_o * o), o
        grads, o = jax.grad(quadratic_loss, argnums=(0, 1, 2), has_aux=True)(*args)
        out[f"{p}quadratic/o"] = np.asarray(o)
        for a, d in zip(OP_GRADS, grads):
            out[f"{p}quadratic/grad_{a}"] = np.asarray(d)


def decode(layer, x, lens):
    """Row b's first lens[b] tokens through `prefill` (right-padded to max(lens)), then one
    `step` per token to the end of the row: y at every position (BxLxD, forward only)."""
    length = x.shape[1]
    prompt_len = int(lens.max())
    mask = jnp.arange(prompt_len)[None] < jnp.asarray(lens)[:, None]
    cache = layer.init_cache(x.shape[0], length)
    prefill = nnx.jit(lambda m, c, xp, msk: m.prefill(c, xp, msk))
    y_prompt, cache = prefill(layer, cache, x[:, :prompt_len], mask)
    y = np.zeros(x.shape, np.float32)
    for b, n in enumerate(lens):
        y[b, :n] = np.asarray(y_prompt)[b, :n]
    steps = length - int(lens.min())
    # rows that reach the end first read zero tokens past it (outputs ignored)
    x_pad = jnp.concatenate([x, jnp.zeros((x.shape[0], steps, x.shape[2]), x.dtype)], axis=1)
    graphdef, state = nnx.split(layer)
    step = jax.jit(lambda c, xb: nnx.merge(graphdef, state).step(c, xb))
    for i in range(steps):
        pos = jnp.asarray(lens) + i
        y_i, cache = step(cache, jnp.take_along_axis(x_pad, pos[:, None, None], axis=1)[:, 0])
        for b, n in enumerate(lens):
            if n + i < length:
                y[b, n + i] = np.asarray(y_i)[b]
    return y


def run_layer(inp, out):
    for config, (_, _, forms) in CONFIGS.items():
        for form in forms:
            for length in LAYER_LENGTHS:
                graphdef, params, rest = split(build_layer(config, form, length))
                params = common.load_params(inp, f"layer/{config}/param/", params)
                x = jnp.asarray(inp[f"layer/L{length}/x"])
                key = f"layer/{config}/{form}/L{length}/"
                if form == "decode":
                    out[key + "y"] = decode(nnx.merge(graphdef, params, rest), x,
                                            inp[f"layer/L{length}/prompt_lens"])
                    continue
                common.layer_grads(
                    out, key, graphdef, params, x, jnp.asarray(inp[f"layer/L{length}/w_y"]),
                    lambda layer, x: layer(x, padding_mask=None, deterministic=True),
                    rest=(rest,), jit=True)


def main():
    t0 = time.time()
    rng = np.random.default_rng(SEED)
    inp = draw_inputs(rng)
    draw_layer(rng, inp)
    out = {}
    run_feature_map(inp, out)
    run_ops(inp, out)
    run_layer(inp, out)
    common.save("based", inp, out, t0)


if __name__ == "__main__":
    main()

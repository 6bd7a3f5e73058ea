"""Our side of the path / fla comparison (README.md, section "path"): draws every input and
weight with numpy (fixed seed), saves them to $CMP_DIR/path_inputs.npz, runs our JAX code
(models/attention/path.py, path_flash.py) on them and saves outputs and gradients to
$CMP_DIR/path_ours.npz. Run with the repo's venv:

    PYTHONPATH=/work/main nice -n 10 /work/main/.venv/bin/python scripts/fla_comparison/path_ours.py

Float32, matmul precision 'highest'.

Layouts saved: ours, i.e. q/k/v/w BxHxLxK, beta and log f BxHxL (fla: BxTxHxK and BxTxH;
path_fla.py converts its results to ours before saving).
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

from models import registry  # noqa: E402
from models.attention import dense, path, path_flash  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ours_common as common  # noqa: E402

SEED = 20251107
B, H, K = 2, 3, 16  # op level: d_v = K
OP_LENGTHS = (128, 77)
OP_GATES = ("nogate", "gate")  # log f = 0 (fla's test: g = zeros), or log sigmoid(z)
OP_GRADS = ("q", "k", "v", "w", "beta", "logf")
LAYER = dict(dim=32, num_heads=2)  # head_dim 16 (fla's kernel takes 16, 32, 64, 128)
LAYER_LENGTHS = (77, 128)
# variant: build kwargs (besides dim, num_heads, max_len, causal, rngs, attention_dropout);
# chunk_size the default (16): 8 chunks at L=128, 5 (the last padded) at L=77.
FORMS = {
    "chunked_dense": {"impl": "chunked", "attention_impl": "dense"},
    "scan_dense": {"impl": "scan", "attention_impl": "dense"},
    "chunked_flash": {"impl": "chunked", "attention_impl": "flash"},
}
VARIANTS = {f"{form}/{gate}": dict(kw, forget_gate=(gate == "gate"))
            for form, kw in FORMS.items() for gate in OP_GATES}


def draw_inputs(rng):
    inp = {}
    for length in OP_LENGTHS:
        p = f"op/L{length}/"
        for name in ("q", "k", "v"):
            inp[p + name] = rng.standard_normal((B, H, length, K)).astype(np.float32)
        w = rng.standard_normal((B, H, length, K))
        inp[p + "w"] = (w / np.linalg.norm(w, axis=-1, keepdims=True)).astype(np.float32)
        # beta = 2 sigmoid(N(0, 1.5^2)) in (0, 2): reflections (beta ~ 2) and near-identities.
        inp[p + "beta"] = (2.0 / (1.0 + np.exp(-1.5 * rng.standard_normal((B, H, length))))
                           ).astype(np.float32)
        # log f = log sigmoid(N(1.5, 1.5^2)) for the gate rows (fox_ours.py's draw).
        z = 1.5 + 1.5 * rng.standard_normal((B, H, length))
        inp[p + "logf_gate"] = (-np.logaddexp(0.0, -z)).astype(np.float32)
        inp[p + "logf_nogate"] = np.zeros((B, H, length), np.float32)
        inp[p + "w_o"] = rng.standard_normal((B, H, length, K)).astype(np.float32)
    return inp


# ----------------------------------------------------------------------------- op level


def op_dense(impl, chunk):
    """PaTHAttention.__call__'s dense causal path on given q, k, v, w, beta, log f (no
    projections): LOGITS[impl], / sqrt(K) + c_i - c_j (c = cumsum log f), the causal
    mask, softmax, @ v."""
    logits_fn = path.LOGITS[impl]

    def run(q, k, v, w, beta, logf):
        length = q.shape[2]
        logits = logits_fn(q, k, w, beta, chunk_size=chunk)
        c = jnp.cumsum(logf, axis=-1)
        logits = logits / math.sqrt(q.shape[-1]) + (c[..., :, None] - c[..., None, :])
        mask = dense.make_attention_mask(None, causal=True, q_len=length, kv_len=length)
        return dense.attend_logits(logits, v, mask=mask)
    return run


def op_flash(chunk):
    """PaTHAttention._flash's causal path: path._inside_chunks, then
    path_flash.flash_path_attention (every key valid, c = cumsum log f)."""
    def run(q, k, v, w, beta, logf):
        _, _, keys, prod, intra, q_turned = path._inside_chunks(q, k, w, beta, chunk)
        real = jnp.ones(q.shape[:1] + q.shape[2:3], jnp.bool_)
        o, _ = path_flash.flash_path_attention(
            q_turned, keys, prod, intra, v, real, jnp.cumsum(logf, axis=-1),
            scale=1.0 / math.sqrt(q.shape[-1]))
        return o
    return run


def op_impls():
    return {"scan": op_dense("scan", 16),  # chunk_size: only the scan's remat grouping
            "chunked16": op_dense("chunked", 16), "chunked32": op_dense("chunked", 32),
            "chunked64": op_dense("chunked", 64),
            "flash16": op_flash(16), "flash32": op_flash(32)}


def gate_scaled(fn):
    """fn with log f multiplied by K^-0.5 on its way in, as PaTHAttention.gates hands it to
    the op: (q.Hk)/sqrt(K) + (c_i - c_j)/sqrt(K) = fla's (q.Hk + c_i - c_j) * K^-0.5; the
    gradient w.r.t. the unscaled log f."""
    return lambda q, k, v, w, beta, logf: fn(q, k, v, w, beta, logf / math.sqrt(q.shape[-1]))


def run_ops(inp, out):
    for length in OP_LENGTHS:
        p = f"op/L{length}/"
        w_o = jnp.asarray(inp[p + "w_o"])
        for gate in OP_GATES:
            args = tuple(jnp.asarray(inp[p + (a if a != "logf" else f"logf_{gate}")])
                         for a in OP_GRADS)
            # Without the gate log f = 0 is a constant (the layer has no g: fla passes g None,
            # its test zeros without grad): no gradient w.r.t. it.
            n_grads = len(OP_GRADS) if gate == "gate" else len(OP_GRADS) - 1
            impls = dict(op_impls())
            if gate == "gate":  # the layer's convention; the op unscaled: a control
                impls = {impl: gate_scaled(fn) for impl, fn in op_impls().items()}
                impls.update({f"{impl}_unscaled": fn for impl, fn in op_impls().items()})
            for impl, fn in impls.items():
                def loss(*a, fn=fn):
                    o = fn(*a)
                    return jnp.sum(w_o * o), o
                grads, o = jax.jit(jax.grad(loss, argnums=tuple(range(n_grads)),
                                            has_aux=True))(*args)
                key = f"{p}{gate}/{impl}/"
                out[key + "o"] = np.asarray(o)
                for a, d in zip(OP_GRADS, grads):
                    out[key + "grad_" + a] = np.asarray(d)


# ----------------------------------------------------------------------------- layer


def build_layer(variant, max_len):
    if variant.endswith("/gate_unscaled"):
        return build_gate_unscaled(variant[:-len("/gate_unscaled")])
    return registry.build("path", dim=LAYER["dim"], num_heads=LAYER["num_heads"],
                          max_len=max_len, causal=True, rngs=nnx.Rngs(0),
                          attention_dropout=0.0, **VARIANTS[variant])


class GateUnscaledPaTH(path.PaTHAttention):
    """CONTROL (README "path": findings): our layer class as it was before this comparison
    found the difference: log f not multiplied by head_dim^-0.5 in `gates` (c_i - c_j added
    after the logits' scale, as FoX's layer does); nothing else changed."""

    def gates(self, x_BxLxD, real_BxL):
        beta, log_f = super().gates(x_BxLxD, real_BxL)
        return beta, log_f * math.sqrt(self.head_dim)


def build_gate_unscaled(form):
    """GateUnscaledPaTH with what build_path passes (its defaults, the gate on)."""
    return GateUnscaledPaTH(dim=LAYER["dim"], num_heads=LAYER["num_heads"], causal=True,
                          qkv_dim=None, attention_dropout=0.0, conv_size=path.CONV_SIZE,
                          forget_gate=True, chunk_size=path.DEFAULT_CHUNK, rngs=nnx.Rngs(0),
                          **FORMS[form])


def split(module):
    """(graphdef, the parameters, the rest: the dropout's rng state)."""
    return nnx.split(module, nnx.Param, ...)


def draw_layer(rng, inp):
    """One set of weights (the forget-gate build's, a superset), shared by every variant."""
    _, params, _ = split(build_layer("chunked_dense/gate", max(LAYER_LENGTHS)))
    common.draw_params(rng, inp, "layer/param/", params)
    for length in LAYER_LENGTHS:
        common.draw_x(rng, inp, f"layer/L{length}/", (B, length, LAYER["dim"]))


def run_layer(inp, out):
    for variant in list(VARIANTS) + [f"{form}/gate_unscaled" for form in FORMS]:
        for length in LAYER_LENGTHS:
            graphdef, params, rest = split(build_layer(variant, length))
            common.layer_grads(
                out, f"layer/{variant}/L{length}/", graphdef,
                common.load_params(inp, "layer/param/", params),
                jnp.asarray(inp[f"layer/L{length}/x"]), jnp.asarray(inp[f"layer/L{length}/w_y"]),
                lambda layer, x: layer(x, padding_mask=None, deterministic=True), rest=(rest,),
                jit=True)


def main():
    t0 = time.time()
    rng = np.random.default_rng(SEED)
    inp = draw_inputs(rng)
    draw_layer(rng, inp)
    out = {}
    run_ops(inp, out)
    print(f"op level done ({time.time() - t0:.1f} s)")
    run_layer(inp, out)
    common.save("path", inp, out, t0)


if __name__ == "__main__":
    main()

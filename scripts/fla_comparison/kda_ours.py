"""Our side of the kda / fla comparison (README.md): draws every input and weight with
numpy (fixed seed), saves them to $CMP_DIR/kda_inputs.npz, runs our JAX code on them and
saves outputs and gradients to $CMP_DIR/kda_ours.npz. Run with the repo's venv:

    PYTHONPATH=/work/main /work/main/.venv/bin/python scripts/fla_comparison/kda_ours.py

Float32 (our code casts to float32 throughout), matmul precision 'highest'.

Layouts saved: ours, i.e. q/k/v BxHxLxF, beta BxHxL, state BxHxVxK (fla: BxTxHxF and
BxHxKxV; kda_fla.py converts its results to ours before saving). The raw gate input f is
BxLxHxK on both sides (per token, heads x key channels, as fla's f_proj output reshaped).
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
from models.attention import delta, kda  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ours_common as common  # noqa: E402
SEED = 20251031
B, H, K = 2, 3, 16
OP_CASES = {"L128_V32": (128, 32), "L77_V16": (77, 16)}  # name: (L, d_v)
CHUNKS = (16, 32, 64)
LAYER = dict(dim=32, num_heads=2, chunk_size=16)
LAYER_LENGTHS = (77, 128)
OP_GRADS = ("q", "k", "v", "beta", "f", "A_log", "dt_bias")


def l2norm_np(x):
    x = x.astype(np.float64)
    return (x / np.sqrt(np.sum(x * x, -1, keepdims=True) + 1e-6)).astype(np.float32)


def draw_inputs(rng):
    inp = {}
    for name, (length, v_dim) in OP_CASES.items():
        p = f"op/{name}/"
        inp[p + "q"] = l2norm_np(rng.standard_normal((B, H, length, K)))
        inp[p + "k"] = l2norm_np(rng.standard_normal((B, H, length, K)))
        inp[p + "v"] = rng.standard_normal((B, H, length, v_dim)).astype(np.float32)
        inp[p + "beta"] = (1 / (1 + np.exp(-rng.standard_normal((B, H, length))))).astype(np.float32)
        inp[p + "f"] = rng.standard_normal((B, length, H, K)).astype(np.float32)
        inp[p + "A_log"] = rng.standard_normal((H,)).astype(np.float32)
        inp[p + "dt_bias"] = (rng.standard_normal((H * K,)) - 3.0).astype(np.float32)
        inp[p + "w_o"] = rng.standard_normal((B, H, length, v_dim)).astype(np.float32)
        inp[p + "w_s"] = rng.standard_normal((B, H, v_dim, K)).astype(np.float32)
        inp[p + "w_g"] = rng.standard_normal((B, length, H, K)).astype(np.float32)
    return inp


# ----------------------------------------------------------------------------- op level


def our_gate(f_BxLxHxK, a_log_H, dt_bias_F):
    """Our real `KDADirection.gates`, called on a stand-in `self` whose projections are
    the identity (decay_up(decay_down(x)) = f), so g = gates' own arithmetic on f.
    Returns g BxLxHxK (the method's layout, before `features` moves heads first)."""
    b, length, h, k = f_BxLxHxK.shape
    f_BxLxF = f_BxLxHxK.reshape(b, length, h * k)
    stub = types.SimpleNamespace(
        beta=lambda x: x[..., :h], decay_down=lambda x: x, decay_up=lambda x: x,
        dt_bias=dt_bias_F, a_log=a_log_H, num_heads=h)
    _, g = kda.KDADirection.gates(stub, f_BxLxF)
    return g


def op_fn(impl):
    """(q, k, v, beta, f, A_log, dt_bias) -> (o BxHxLxV, S BxHxVxK)."""
    def run(q, k, v, beta, f, a_log, dt_bias):
        g_BxHxLxK = jnp.moveaxis(our_gate(f, a_log, dt_bias), 1, 2)
        if impl == "reference":
            return delta.delta_rule_reference(q, k, v, beta, g_BxHxLxK)
        return kda.chunk_kda(q, k, v, beta, g_BxHxLxK, chunk_size=int(impl[5:]))
    return run


def run_ops(inp, out):
    for name in OP_CASES:
        p = f"op/{name}/"
        args = tuple(jnp.asarray(inp[p + a]) for a in OP_GRADS)
        w_o, w_s, w_g = (jnp.asarray(inp[p + w]) for w in ("w_o", "w_s", "w_g"))
        # The gate alone, against naive_kda_gate.
        g_fn = lambda f, a, d: our_gate(f, a, d)  # noqa: E731
        g = g_fn(*args[4:])
        gg = jax.grad(lambda *a: jnp.sum(w_g * g_fn(*a)), argnums=(0, 1, 2))(*args[4:])
        out[f"{p}gate/g"] = np.asarray(g)
        for a, d in zip(("f", "A_log", "dt_bias"), gg):
            out[f"{p}gate/grad_{a}"] = np.asarray(d)
        for impl in ("reference",) + tuple(f"chunk{c}" for c in CHUNKS):
            fn = op_fn(impl)

            def loss(*a):
                o, s = fn(*a)
                return jnp.sum(w_o * o) + jnp.sum(w_s * s), (o, s)
            grads, (o, s) = jax.grad(loss, argnums=tuple(range(7)), has_aux=True)(*args)
            out[f"{p}{impl}/o"], out[f"{p}{impl}/S"] = np.asarray(o), np.asarray(s)
            for a, d in zip(OP_GRADS, grads):
                out[f"{p}{impl}/grad_{a}"] = np.asarray(d)


# ----------------------------------------------------------------------------- layer


def build_layer(max_len):
    return registry.build("kda", dim=LAYER["dim"], num_heads=LAYER["num_heads"],
                          max_len=max_len, causal=True, rngs=nnx.Rngs(0),
                          chunk_size=LAYER["chunk_size"])


def draw_layer(rng, inp):
    _, state = nnx.split(build_layer(max(LAYER_LENGTHS)))
    common.draw_params(rng, inp, "layer/param/", state)
    for length in LAYER_LENGTHS:
        common.draw_x(rng, inp, f"layer/L{length}/", (B, length, LAYER["dim"]))


def run_layer(inp, out):
    for length in LAYER_LENGTHS:
        graphdef, state = nnx.split(build_layer(length))
        p = f"layer/L{length}/"
        common.layer_grads(out, p, graphdef, common.load_params(inp, "layer/param/", state),
                           jnp.asarray(inp[p + "x"]), jnp.asarray(inp[p + "w_y"]),
                           lambda layer, x: layer(x, padding_mask=None))


def main():
    t0 = time.time()
    rng = np.random.default_rng(SEED)
    inp = draw_inputs(rng)
    draw_layer(rng, inp)
    out = {}
    run_ops(inp, out)
    run_layer(inp, out)
    common.save("kda", inp, out, t0)


if __name__ == "__main__":
    main()

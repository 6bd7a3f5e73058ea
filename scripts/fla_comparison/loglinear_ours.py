"""Our side of the loglinear_mamba2 / fla comparison (compare_loglinear.py): draws every
input and weight with numpy (fixed seed), saves them to $CMP_DIR/loglinear_inputs.npz,
runs our JAX code on them and saves outputs and gradients to $CMP_DIR/loglinear_ours.npz.
Run with the repo's venv:

    PYTHONPATH=/work/main /work/main/.venv/bin/python scripts/fla_comparison/loglinear_ours.py

Float32 (our code casts to float32 throughout), matmul precision 'highest'.

Op level, our layouts: x (already times dt) BxHxLxP, log_a = dt A BxHxL, B and C Bx1xLxN
(one group, as fla's q, k BxTx1xN; broadcast to the heads inside), lambda BxHxLxK (K =
NUM_LEVELS = 15). Forms: `loglinear_reference` (quadratic), `chunk_loglinear` at C = 4,
16, 64, and `loglinear_step` run over the sequence (the decoding recurrence). Layer: the
causal `loglinear_mamba2` (dim 32, 2 heads, state 32, chunk 16), every parameter drawn,
at L 77 and 128, and at L 77 with the second row right-padded to 50 real tokens.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ours_common as common  # noqa: E402

from models import registry  # noqa: E402
from models.attention import loglinear  # noqa: E402

SEED = 20251205
B, H, P, N = 2, 3, 16, 16
K = loglinear.NUM_LEVELS
OP_LENGTHS = (77, 128)
CHUNKS = (4, 16, 64)
OP_GRADS = ("x", "log_a", "b", "c", "lam")
LAYER = dict(dim=32, num_heads=2, state_size=32, chunk_size=16)
LAYER_LENGTHS = (77, 128)
PADDED = (77, 50)  # (L, real tokens of the second row)


def draw_inputs(rng):
    inp = {}
    for length in OP_LENGTHS:
        p = f"op/L{length}/"
        # Mild decays (dt ~ softplus(N(-4, 1)), A in [1, e]): the high levels stay visible.
        dt = np.log1p(np.exp(rng.standard_normal((B, H, length)) - 4.0))
        inp[p + "x"] = rng.standard_normal((B, H, length, P)).astype(np.float32)
        inp[p + "log_a"] = (-np.exp(rng.uniform(0, 1, (1, H, 1))) * dt).astype(np.float32)
        inp[p + "b"] = rng.standard_normal((B, 1, length, N)).astype(np.float32)
        inp[p + "c"] = rng.standard_normal((B, 1, length, N)).astype(np.float32)
        inp[p + "lam"] = rng.uniform(0.1, 2.0, (B, H, length, K)).astype(np.float32)
        inp[p + "w_o"] = rng.standard_normal((B, H, length, P)).astype(np.float32)
    return inp


# ----------------------------------------------------------------------------- op level


@jax.jit
def recurrent(x, log_a, b, c, lam):
    """loglinear_step over the sequence from the empty Fenwick slots (the decoding form)."""
    batch, heads, length, p = x.shape
    slots = max(1, (length - 1).bit_length())

    def one(carry, xs):
        s, pos = carry
        y, s = loglinear.loglinear_step(s, pos, *xs)
        return (s, pos + 1), y

    s0 = jnp.zeros((batch, slots, heads, p, b.shape[-1]))
    xs = tuple(jnp.moveaxis(t, 2, 0) for t in (x, log_a, b, c, lam))
    _, y = jax.lax.scan(one, (s0, jnp.zeros((batch,), jnp.int32)), xs)
    return jnp.moveaxis(y, 0, 2)


def op_fn(impl):
    """(x, log_a, b, c, lam) -> y BxHxLxP; b, c Bx1xLxN broadcast to the heads."""
    def run(x, log_a, b, c, lam):
        b, c = (jnp.broadcast_to(t, x.shape[:3] + t.shape[-1:]) for t in (b, c))
        if impl == "reference":
            return loglinear.loglinear_reference(x, log_a, b, c, lam)
        if impl == "recurrent":
            return recurrent(x, log_a, b, c, lam)
        return loglinear.chunk_loglinear(x, log_a, b, c, lam, chunk_size=int(impl[5:]))
    return run


def run_ops(inp, out):
    for length in OP_LENGTHS:
        p = f"op/L{length}/"
        args = tuple(jnp.asarray(inp[p + a]) for a in OP_GRADS)
        w_o = jnp.asarray(inp[p + "w_o"])
        for impl in ("reference", "recurrent") + tuple(f"chunk{c}" for c in CHUNKS):
            fn = op_fn(impl)

            def loss(*a):
                o = fn(*a)
                return jnp.sum(w_o * o), o
            grads, o = jax.grad(loss, argnums=tuple(range(5)), has_aux=True)(*args)
            out[f"{p}{impl}/o"] = np.asarray(o)
            for a, d in zip(OP_GRADS, grads):
                out[f"{p}{impl}/grad_{a}"] = np.asarray(d)


# ----------------------------------------------------------------------------- layer


def build_layer(max_len):
    return registry.build("loglinear_mamba2", dim=LAYER["dim"], num_heads=LAYER["num_heads"],
                          max_len=max_len, causal=True, rngs=nnx.Rngs(0),
                          state_size=LAYER["state_size"], chunk_size=LAYER["chunk_size"])


def _adjust(name, draw):
    if name.endswith("level_weight"):  # L around its init (1): lambda = softplus(L dl)
        return 1.0 + draw
    if name == "dt.kernel":  # dt = softplus(dt x + dt_bias) about 0.02: mild decays,
        return 0.125 * draw  # so that the levels far back still weigh in the outputs
    if name.endswith("dt_bias"):
        return draw - 4.0
    return draw


def draw_layer(rng, inp):
    _, state = nnx.split(build_layer(max(LAYER_LENGTHS)))
    common.draw_params(rng, inp, "layer/param/", state, adjust=_adjust)
    for length in LAYER_LENGTHS:
        common.draw_x(rng, inp, f"layer/L{length}/", (B, length, LAYER["dim"]))
    length, real = PADDED
    inp[f"layer/L{length}pad/mask"] = np.arange(length)[None] < np.array([[length], [real]])


def run_layer(inp, out):
    cases = [(f"L{n}", n, None) for n in LAYER_LENGTHS] + [(f"L{PADDED[0]}pad", PADDED[0], True)]
    for tag, length, padded in cases:
        graphdef, state = nnx.split(build_layer(length))
        w_y = jnp.asarray(inp[f"layer/L{length}/w_y"])
        mask = jnp.asarray(inp[f"layer/{tag}/mask"]) if padded else None
        if padded:  # the loss reads real positions only
            w_y = w_y * mask[..., None]
        common.layer_grads(out, f"layer/{tag}/", graphdef,
                           common.load_params(inp, "layer/param/", state),
                           jnp.asarray(inp[f"layer/L{length}/x"]), w_y,
                           lambda layer, x: layer(x, padding_mask=mask))
    mixer = build_layer(max(LAYER_LENGTHS))
    out["meta/param_count"] = np.array(
        sum(p.size for p in jax.tree.leaves(nnx.state(mixer, nnx.Param))))


def main():
    t0 = time.time()
    rng = np.random.default_rng(SEED)
    inp = draw_inputs(rng)
    draw_layer(rng, inp)
    out = {}
    run_ops(inp, out)
    run_layer(inp, out)
    common.save("loglinear", inp, out, t0)


if __name__ == "__main__":
    main()

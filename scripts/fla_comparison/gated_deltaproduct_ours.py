"""Our side of the gated_deltaproduct / fla comparison (README.md): draws every input and
weight with numpy (fixed seed), saves them to $CMP_DIR/gdp_inputs.npz, runs our JAX code
on them and saves outputs and gradients to $CMP_DIR/gdp_ours.npz. Run with the repo's venv:

    PYTHONPATH=/work/main /work/main/.venv/bin/python scripts/fla_comparison/gated_deltaproduct_ours.py

Float32 (our code casts to float32 throughout), matmul precision 'highest'.

Layouts saved: ours, i.e. q BxHxLxK, k BxHxLxNxK, v BxHxLxNxV, beta BxHxLxN, g BxHxL,
state BxHxVxK (fla: q BxTxHxK, k/v Bx(T N)xHxF, beta Bx(T N)xH, g BxTxH, state BxHxKxV;
gated_deltaproduct_fla.py converts its results to ours before saving). Layer weights in
our channel order (head, step, feature); the fla script permutes them to fla's.
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
from models.attention import delta, deltaproduct  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ours_common as common  # noqa: E402
from kda_ours import l2norm_np  # noqa: E402

SEED = 20251102
B, H, K = 2, 3, 16
# name: (num_householder, L, d_v)
OP_CASES = {"n2_L128_V32": (2, 128, 32), "n2_L77_V16": (2, 77, 16),
            "n3_L128_V32": (3, 128, 32), "n3_L77_V16": (3, 77, 16)}
CHUNKS = (16, 32, 64)  # in micro-steps (L n of them)
LAYER = dict(dim=32, num_heads=2, chunk_size=16)
LAYER_NS = (2, 3)
LAYER_LENGTHS = (77, 128)
OP_GRADS = ("q", "k", "v", "beta", "g")


def draw_inputs(rng):
    inp = {}
    for name, (n, length, v_dim) in OP_CASES.items():
        p = f"op/{name}/"
        inp[p + "q"] = l2norm_np(rng.standard_normal((B, H, length, K)))
        inp[p + "k"] = l2norm_np(rng.standard_normal((B, H, length, n, K)))
        inp[p + "v"] = rng.standard_normal((B, H, length, n, v_dim)).astype(np.float32)
        # beta = 2 sigmoid(N(0, 1.5^2)) in (0, 2): reflections (beta > 1) about half the time.
        inp[p + "beta"] = (2 / (1 + np.exp(-1.5 * rng.standard_normal((B, H, length, n))))
                           ).astype(np.float32)
        # g = log sigmoid(N(2, 1)): a decay per token, mostly in (-0.4, -0.02).
        inp[p + "g"] = (-np.logaddexp(0.0, -(2.0 + rng.standard_normal((B, H, length))))
                        ).astype(np.float32)
        inp[p + "w_o"] = rng.standard_normal((B, H, length, v_dim)).astype(np.float32)
        inp[p + "w_s"] = rng.standard_normal((B, H, v_dim, K)).astype(np.float32)
    return inp


# ----------------------------------------------------------------------------- op level


def unroll_decay_last(q, k, v, beta, g):
    """CONTROL: deltaproduct.unroll with the decay on each token's last micro-step."""
    n = k.shape[3]
    q_u, k_u, v_u, beta_u, _ = deltaproduct.unroll(q, k, v, beta, g)
    g_u = jnp.where(jnp.arange(n) == n - 1, g[..., None], 0.0)
    return q_u, k_u, v_u, beta_u, g_u.reshape(g.shape[:2] + (-1,))


def op_fn(impl):
    """(q, k, v, beta, g) -> (o BxHxLxV read at each token's last micro-step, S BxHxVxK),
    as GatedDeltaProduct.scan: the rule on the L n unrolled micro-steps."""
    def run(q, k, v, beta, g):
        n = k.shape[3]
        if impl == "control_decay_last":
            o, s = delta.delta_rule_reference(*unroll_decay_last(q, k, v, beta, g))
        elif impl == "reference":
            o, s = delta.delta_rule_reference(*deltaproduct.unroll(q, k, v, beta, g))
        else:
            o, s = delta.chunk_delta_rule(*deltaproduct.unroll(q, k, v, beta, g),
                                          chunk_size=int(impl[5:]))
        return o[:, :, n - 1::n], s
    return run


def run_ops(inp, out):
    for name in OP_CASES:
        p = f"op/{name}/"
        args = tuple(jnp.asarray(inp[p + a]) for a in OP_GRADS)
        w_o, w_s = jnp.asarray(inp[p + "w_o"]), jnp.asarray(inp[p + "w_s"])
        impls = ("reference",) + tuple(f"chunk{c}" for c in CHUNKS) + ("control_decay_last",)
        for impl in impls:
            fn = op_fn(impl)

            def loss(*a):
                o, s = fn(*a)
                return jnp.sum(w_o * o) + jnp.sum(w_s * s), (o, s)
            grads, (o, s) = jax.grad(loss, argnums=tuple(range(5)), has_aux=True)(*args)
            out[f"{p}{impl}/o"], out[f"{p}{impl}/S"] = np.asarray(o), np.asarray(s)
            for a, d in zip(OP_GRADS, grads):
                out[f"{p}{impl}/grad_{a}"] = np.asarray(d)


# ----------------------------------------------------------------------------- layer


def build_layer(n, max_len):
    return registry.build("gated_deltaproduct", dim=LAYER["dim"], num_heads=LAYER["num_heads"],
                          max_len=max_len, causal=True, rngs=nnx.Rngs(0),
                          chunk_size=LAYER["chunk_size"], num_householder=n)


def draw_layer(rng, inp):
    for n in LAYER_NS:
        _, state = nnx.split(build_layer(n, max(LAYER_LENGTHS)))
        common.draw_params(rng, inp, f"layer/n{n}/param/", state)
    for length in LAYER_LENGTHS:
        common.draw_x(rng, inp, f"layer/L{length}/", (B, length, LAYER["dim"]))


def run_layer(inp, out):
    for n in LAYER_NS:
        for length in LAYER_LENGTHS:
            graphdef, state = nnx.split(build_layer(n, length))
            common.layer_grads(
                out, f"layer/n{n}/L{length}/", graphdef,
                common.load_params(inp, f"layer/n{n}/param/", state),
                jnp.asarray(inp[f"layer/L{length}/x"]), jnp.asarray(inp[f"layer/L{length}/w_y"]),
                lambda layer, x: layer(x, padding_mask=None))


def main():
    t0 = time.time()
    rng = np.random.default_rng(SEED)
    inp = draw_inputs(rng)
    draw_layer(rng, inp)
    out = {}
    run_ops(inp, out)
    run_layer(inp, out)
    common.save("gdp", inp, out, t0)


if __name__ == "__main__":
    main()

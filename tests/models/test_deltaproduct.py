"""gated_deltaproduct (models/attention/deltaproduct.py) against its references.

The conformance, fidelity and decoding suites (through configs/listops.py) check shapes,
padding, causality and the decoding contract; here: the unrolled micro-step scan equals
the paper's product of Householder steps written in numpy (negative eigenvalues too);
num_householder=1 without them is gated_deltanet's layer, weight for weight; the layer's
chunked form equals its step-by-step form; prefill + steps equal the parallel form for 2
and 3 steps; beta reaches (0, 2); the parameters are fla's GatedDeltaProduct's.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from models.attention import delta, deltaproduct

from tests.models.helpers import check_prefill_and_steps, normal, randomize_params
from tests.models.test_delta import assert_close, run

TOL = dict(rtol=1e-4, atol=1e-5)


def build(*, causal: bool, dim: int = 16, heads: int = 2, **hparams):
    mixer = registry.build("gated_deltaproduct", dim=dim, num_heads=heads, max_len=64,
                           causal=causal, rngs=nnx.Rngs(params=0), **hparams)
    return randomize_params(mixer, seed=3, scale=0.4)


def paper_recurrence(q, k, v, beta, g):
    """S_t = alpha_t S_{t-1} prod_j (I - beta_tj k_tj k_tj^T) + sum_j ..., each step
    S <- S (I - b k k^T) + b v k^T after the decay; o_t = S_t q_t / sqrt(d) (float64).
    q BxHxLxK, k BxHxLxNxK, v BxHxLxNxV, beta BxHxLxN, g BxHxL."""
    q, k, v, beta, alpha = (np.asarray(a, np.float64) for a in (q, k, v, beta, jnp.exp(g)))
    b, h, length, n, d = k.shape
    s = np.zeros((b, h, v.shape[-1], d))
    out = np.zeros((b, h, length, v.shape[-1]))
    for t in range(length):
        s = alpha[:, :, t, None, None] * s
        for j in range(n):
            kt, bt = k[:, :, t, j], beta[:, :, t, j, None, None]
            erase = np.eye(d) - bt * np.einsum("bhi,bhj->bhij", kt, kt)
            s = s @ erase + bt * np.einsum("bhv,bhk->bhvk", v[:, :, t, j], kt)
        out[:, :, t] = np.einsum("bhvk,bhk->bhv", s, q[:, :, t]) / np.sqrt(d)
    return out, s


@pytest.mark.parametrize("n", [1, 2, 3])
def test_unrolled_scan_is_the_papers_product(n):
    b, h, length, d = 2, 2, 9, 4
    q = delta.l2_normalise(normal(0, (b, h, length, d)))
    k = delta.l2_normalise(normal(1, (b, h, length, n, d)))
    v = normal(2, (b, h, length, n, 5))
    beta = 2.0 * jax.nn.sigmoid(normal(3, (b, h, length, n)))  # negative eigenvalues
    g = -jax.nn.softplus(normal(4, (b, h, length)))
    o_n, s = delta.chunk_delta_rule(*deltaproduct.unroll(q, k, v, beta, g), chunk_size=4)
    o_want, s_want = paper_recurrence(q, k, v, beta, g)
    assert_close(o_n[:, :, n - 1::n], o_want, rtol=1e-4, atol=1e-5)
    assert_close(s, s_want, rtol=1e-4, atol=1e-5)


def test_one_step_without_reflections_is_gated_deltanet():
    """num_householder=1, allow_neg_eigval=False: gated_deltanet's layer with the same
    weights (every parameter copied), causal and bidirectional outputs equal."""
    for causal in (True, False):
        gdp = build(causal=causal, num_householder=1, allow_neg_eigval=False, chunk_size=4)
        gdn = registry.build("gated_deltanet", dim=16, num_heads=2, max_len=64,
                             causal=causal, rngs=nnx.Rngs(params=1), chunk_size=4)
        nnx.update(gdn, nnx.state(gdp, nnx.Param))
        x = normal(5, (2, 11, 16))
        mask = jnp.arange(11)[None] < jnp.array([[11], [7]])
        real = np.asarray(mask)
        assert_close(np.asarray(run(gdp, "__call__", x, mask))[real],
                     np.asarray(run(gdn, "__call__", x, mask))[real])


@pytest.mark.parametrize("causal", [True, False])
def test_layer_chunked_equals_reference_form(causal, monkeypatch):
    mixer = build(causal=causal, chunk_size=4)
    x = normal(8, (2, 11, 16))
    mask = jnp.arange(11)[None] < jnp.array([[11], [7]])
    y = run(mixer, "__call__", x, mask)
    monkeypatch.setattr(delta, "chunk_delta_rule", lambda q, k, v, beta, g, chunk_size:
                        delta.delta_rule_reference(q, k, v, beta, g))
    y_ref = run(mixer, "__call__", x, mask)
    real = np.asarray(mask)
    assert_close(np.asarray(y)[real], np.asarray(y_ref)[real])


@pytest.mark.parametrize("n", [2, 3])
def test_prefill_and_steps_equal_the_parallel_form(n):
    mixer = build(causal=True, chunk_size=4, num_householder=n)
    check_prefill_and_steps(mixer, run, normal(12, (3, 16, 16)), jnp.array([1, 5, 9]), 9,
                            **TOL)


def test_beta_reaches_reflections():
    """allow_neg_eigval: beta = 2 sigmoid, in (0, 2), some above 1 (eigenvalue < 0)."""
    mixer = build(causal=True)
    beta, g = mixer.forward_scan.gates(normal(14, (4, 32, 16)))
    beta = np.asarray(beta)
    assert beta.shape == (4, 32, 2, 2) and g.shape == (4, 32, 2)
    assert (beta > 0).all() and (beta < 2).all() and (beta > 1).any()


def test_parameters_are_flas_gated_deltaproduct():
    """fla's GatedDeltaProduct(hidden_size=D, head_dim=K, num_heads=H, expand_v=2,
    num_householder=n): q D HK, k D nHK, v D 2nHK, b_proj D nH, a_proj D H, A_log H,
    dt_bias H, convolutions 4 (HK + nHK + 2nHK), g_proj D 2HK, o_norm 2K, o_proj 2HK D."""
    dim, heads, n = 24, 3, 2
    mixer = registry.build("gated_deltaproduct", dim=dim, num_heads=heads, max_len=16,
                           causal=True, rngs=nnx.Rngs(0), num_householder=n)
    hk, head = dim, dim // heads
    want = (dim * hk + dim * n * hk + dim * 2 * n * hk + dim * n * heads + dim * heads
            + 2 * heads + 4 * (hk + n * hk + 2 * n * hk) + dim * 2 * hk + 2 * head
            + 2 * hk * dim)
    count = sum(p.size for p in jax.tree.leaves(nnx.state(mixer, nnx.Param)))
    assert count == want

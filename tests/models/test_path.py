"""path (models/attention/path.py) against the paper's formula.

The conformance and decoding suites check padding, causality and decoding through the
configs; here: the logits are q_i^T H_i ... H_{j+1} k_j with the products formed
explicitly in numpy (and the mirror for causal=False); beta = 0 is q.k; the whole causal
layer equals the formula from its weights; decoding with the forget gate and without the
convolution; the forget gate inside the logits' scale, as fla's PaTH-FoX; the parameters
are fla's PaTHAttention's; the O(L)-memory form
(attention_impl='flash') equals the dense one: outputs and gradients with and without
the forget gate, its dropout the hashed keep mask (through the task config:
tests/kernels/test_flash_attention.py).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from models.attention import delta, path, path_flash
from models.kernels.block_sparse_tiles import dropout_multiplier
from tests import tiers

from tests.models.helpers import (assert_forms_agree, assert_forms_train_alike,
                                  check_prefill_and_steps, normal, randomize_params)
from tests.models.test_delta import assert_close, run


def build(*, causal: bool, dim: int = 16, heads: int = 2, **hparams):
    mixer = registry.build("path", dim=dim, num_heads=heads, max_len=64, causal=causal,
                           rngs=nnx.Rngs(0), attention_dropout=0.0,
                           **{"chunk_size": 4, **hparams})
    return randomize_params(mixer, seed=3, scale=0.4)


def products(q, k, w, beta, mirror=False):
    """logit_ij = q_i^T P_ij k_j in float64: P = H_i ... H_{j+1} for j <= i, or with
    mirror P = H_i ... H_{j-1} for j >= i (0 elsewhere); the rightmost H acts first."""
    q, k, w, beta = (np.asarray(t, np.float64) for t in (q, k, w, beta))
    b, h, length, d = q.shape
    out = np.zeros((b, h, length, length))
    for bi in range(b):
        for hi in range(h):
            hs = [np.eye(d) - beta[bi, hi, s] * np.outer(w[bi, hi, s], w[bi, hi, s])
                  for s in range(length)]
            for i in range(length):
                for j in (range(i, length) if mirror else range(i + 1)):
                    p = np.eye(d)
                    for s in (range(j - 1, i - 1, -1) if mirror else range(j + 1, i + 1)):
                        p = hs[s] @ p
                    out[bi, hi, i, j] = q[bi, hi, i] @ p @ k[bi, hi, j]
    return out


@pytest.mark.parametrize("impl,chunk", [("scan", 4), ("chunked", 4), ("chunked", 2),
                                        ("chunked", 16), ("chunked", 1)])
def test_logits_are_householder_products(impl, chunk):
    """Both forms (a chunk that divides L or not, one chunk, chunks of one position)."""
    logits = path.LOGITS[impl]
    q, k = normal(0, (1, 2, 9, 4)), normal(1, (1, 2, 9, 4))
    w = delta.l2_normalise(normal(2, (1, 2, 9, 4)))
    beta = 2 * jax.nn.sigmoid(normal(3, (1, 2, 9)))
    got = logits(q, k, w, beta, chunk_size=chunk)
    assert_close(got, products(q, k, w, beta), rtol=1e-5, atol=1e-5)
    none = logits(q, k, w, jnp.zeros_like(beta), chunk_size=chunk)
    assert_close(none, np.tril(np.einsum("bhik,bhjk->bhij", q, k)), rtol=1e-5, atol=1e-5)


def test_closed_form_chunks_hold_in_float32_where_the_solve_is_hardest():
    """_inside_chunks' UT transform (a C x C triangular solve) against the position scan,
    float32, at C 64 with beta near 2 (eigenvalues near -1) and w nearly parallel (the
    solve's off-diagonal terms near beta): within rounding (measured 2026-12-06: 3.9e-7)."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((1, 2, 1, 16))
    w = delta.l2_normalise(jnp.asarray(0.99 * base + 0.01 * rng.standard_normal((1, 2, 256, 16)),
                                       jnp.float32))
    beta = jnp.asarray(rng.uniform(0.99, 1.99, (1, 2, 256)), jnp.float32)
    q, k = (jnp.asarray(rng.standard_normal((1, 2, 256, 16)), jnp.float32) for _ in range(2))
    want = path.path_logits(q, k, w, beta, chunk_size=16)
    got = path.path_logits_chunked(q, k, w, beta, chunk_size=64)
    assert float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want))) < 1e-5


@pytest.mark.parametrize("impl,chunk", [("scan", 4), ("chunked", 4), ("chunked", 3),
                                        ("chunked", 16), ("chunked", 1)])
def test_prefill_keys_are_householder_products(impl, chunk):
    """The keys a prefill caches, H_{L-1} ... H_{j+1} k_j (the last position's view), in
    float64 products; padded positions at the end (beta 0) change nothing."""
    k, w = normal(1, (2, 2, 9, 4)), delta.l2_normalise(normal(2, (2, 2, 9, 4)))
    beta = np.asarray(2 * jax.nn.sigmoid(normal(3, (2, 2, 9))), np.float64)
    want = np.zeros((2, 2, 9, 4))
    for bi, hi, j in np.ndindex(2, 2, 9):
        key = np.asarray(k[bi, hi, j], np.float64)
        for s_ in range(j + 1, 9):
            u = np.asarray(w[bi, hi, s_], np.float64)
            key = key - beta[bi, hi, s_] * (key @ u) * u
        want[bi, hi, j] = key
    got = path.KEYS[impl](k, w, jnp.asarray(beta, jnp.float32), chunk_size=chunk)
    assert_close(got, want, rtol=1e-5, atol=1e-5)
    padded = path.KEYS[impl](jnp.pad(k, ((0, 0), (0, 0), (0, 3), (0, 0))),
                             jnp.pad(w, ((0, 0), (0, 0), (0, 3), (0, 0))),
                             jnp.pad(jnp.asarray(beta, jnp.float32), ((0, 0), (0, 0), (0, 3))),
                             chunk_size=chunk)
    assert_close(padded[:, :, :9], want, rtol=1e-5, atol=1e-5)


def test_chunked_gradients_equal_the_scans():
    q, k = normal(0, (2, 2, 19, 8)), normal(1, (2, 2, 19, 8))
    w = delta.l2_normalise(normal(2, (2, 2, 19, 8)))
    beta = 2 * jax.nn.sigmoid(normal(3, (2, 2, 19)))
    weights = normal(4, (2, 2, 19, 19))
    grads = {impl: jax.grad(lambda *a, f=path.LOGITS[impl]: jnp.sum(
        weights * f(*a, chunk_size=5)), argnums=(0, 1, 2, 3))(q, k, w, beta)
        for impl in path.LOGITS}
    for got, want in zip(grads["chunked"], grads["scan"]):
        assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_chunked_train_step_equals_the_scans_through_the_task_config():
    """`configs/mqar.py:model=path,runlocal` (the scaffold's positions-free softmax with
    PaTH's transforms) with model_hparams.impl=chunked and =scan: one training step's loss,
    gradient norm and updated parameters agree."""
    assert_forms_train_alike(path.PaTHAttention, "impl", {
        impl: ("model=path,runlocal", {"impl": impl}) for impl in path.LOGITS})


def test_an_unknown_impl_is_refused_by_name():
    with pytest.raises(ValueError, match="impl='fused'; choose one of chunked, scan"):
        build(causal=True, impl="fused")


@pytest.mark.parametrize("causal,forget_gate", [(True, False), (False, False), (True, True),
                                                (False, True)])
def test_layer_is_the_formula(causal, forget_gate):
    """With the gate, fla's PaTH-FoX: softmax((q.Hk + c_i - c_j) / sqrt(d)), the bias inside
    the scale (fla/ops/path_attn/naive.py; results/cpu/path_vs_fla.md), c the cumulative
    log sigmoid of the forget projection; the mirror's -|c_i - c_j| likewise."""
    mixer = build(causal=causal, forget_gate=forget_gate)
    x = normal(4, (2, 10, 16))
    y = np.asarray(run(mixer, "__call__", x))

    @nnx.jit
    def pieces(m, x):
        q, k, v = m.project_qkv(x)
        raw = m.w_raw(x)
        beta, _ = m.gates(x, jnp.ones(x.shape[:2], bool))
        f = m.forget(x) if m.forget is not None else jnp.zeros(x.shape[:2] + (2,))
        return q, k, v, m.w_of(raw), m.w_of(jnp.flip(raw, 2)), beta, f

    q, k, v, w, w_back, beta, f = (np.asarray(t, np.float64) for t in pieces(mixer, x))
    logits = products(q, k, w, beta)
    if not causal:  # the mirror's w: the convolution run over the reversed order
        upper = products(q, k, np.flip(w_back, 2), beta, mirror=True)
        logits = np.where(np.triu(np.ones((10, 10), bool), 1), upper, logits)
    log_f = -np.logaddexp(0.0, -f) if forget_gate else np.zeros_like(f)
    c = np.cumsum(log_f, axis=1).transpose(0, 2, 1)  # BxHxL
    diff = c[..., :, None] - c[..., None, :]
    logits = (logits + (diff if causal else -np.abs(diff))) / np.sqrt(8)
    if causal:
        logits = np.where(np.tril(np.ones((10, 10), bool)), logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    o = (p / p.sum(-1, keepdims=True)) @ v
    want = o.transpose(0, 2, 1, 3).reshape(2, 10, 16) @ np.asarray(mixer.out.kernel[...])
    assert_close(y, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("hparams", [{"forget_gate": True}, {"conv_size": 0},
                                     {"impl": "scan"}])
def test_prefill_and_steps_equal_the_parallel_form(hparams):
    mixer = build(causal=True, **hparams)
    check_prefill_and_steps(mixer, run, normal(5, (3, 14, 16)), jnp.array([1, 5, 9]), 9,
                            rtol=1e-5, atol=1e-5)


def test_parameters_are_flas_path_attention():
    """fla's PaTHAttention(hidden_size=D, num_heads=H): q/k/v/o D x D bias-free, w_proj
    D x 32 + 32 x D, w_conv1d 3 x D, bt_proj D x H + H."""
    dim, heads = 24, 3
    mixer = registry.build("path", dim=dim, num_heads=heads, max_len=16, causal=True,
                           rngs=nnx.Rngs(0))
    count = sum(p.size for p in jax.tree.leaves(nnx.state(mixer, nnx.Param)))
    assert count == 4 * dim * dim + 2 * 32 * dim + 3 * dim + dim * heads + heads


@pytest.mark.parametrize("length", [19, tiers.exhaustive(3)])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("forget_gate", [tiers.exhaustive(False), True])
def test_flash_form_equals_the_dense_one(causal, forget_gate, length):
    """attention_impl='flash' against 'dense': the layer's output and the gradients of its
    parameters and input, 19 positions in chunks of 4 (the last one partial) or 3 (one
    chunk: no chain), a padded row; causal=False merges the mirror's call by lse."""
    mask = jnp.arange(length)[None] < jnp.array([[length], [length - 2]])
    assert_forms_agree(lambda **kw: build(causal=causal, forget_gate=forget_gate, **kw),
                       normal(1, (2, length, 16)), mask,
                       {impl: {"attention_impl": impl} for impl in ("dense", "flash")})


def test_flash_dropout_is_the_hashed_keep_mask():
    """With dropout, the flash form is softmax(logits) * keep @ v, keep the counter-based
    hash per (batch * heads + head, query, key), in output and gradients."""
    b, h, length, d, chunk, rate = 2, 2, 11, 4, 4, 0.3
    q, k, v = (normal(s, (b, h, length, d)) for s in (1, 2, 3))
    w = delta.l2_normalise(normal(4, (b, h, length, d)))
    beta = 2 * jax.nn.sigmoid(normal(5, (b, h, length)))
    c = jnp.cumsum(jax.nn.log_sigmoid(normal(6, (b, h, length))), axis=-1)
    valid = jnp.arange(length)[None] < jnp.array([[length], [8]])
    seed = jnp.int32(7)
    i, j = jnp.arange(length)[:, None], jnp.arange(length)[None]
    keep = dropout_multiplier(seed, (jnp.arange(b)[:, None] * h + jnp.arange(h))[..., None, None],
                              i, j, rate)

    def flash(q, k, v):
        _, _, keys, prod, intra, q_t = path._inside_chunks(q, k, w, beta, chunk)
        return path_flash.flash_path_attention(q_t, keys, prod, intra, v, valid, c,
                                               scale=d ** -0.5, dropout_rate=rate,
                                               dropout_seed=seed)[0]

    def reference(q, k, v):
        s = (path.path_logits_chunked(q, k, w, beta, chunk_size=chunk) * d ** -0.5
             + c[..., :, None] - c[..., None, :])
        allowed = (j <= i)[None, None] & valid[:, None, None, :]
        p = jax.nn.softmax(jnp.where(allowed, s, -jnp.inf), axis=-1)
        return jnp.einsum("bhij,bhjd->bhid", jnp.where(allowed, p, 0.0) * keep, v)

    assert_close(flash(q, k, v), reference(q, k, v), rtol=1e-5, atol=1e-6)
    weights = normal(8, (b, h, length, d))
    loss = lambda f, *a: jnp.sum(weights * f(*a))  # noqa: E731
    for got, want in zip(jax.grad(loss, argnums=(1, 2, 3))(flash, q, k, v),
                         jax.grad(loss, argnums=(1, 2, 3))(reference, q, k, v)):
        assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_flash_is_refused_where_it_does_not_apply():
    with pytest.raises(registry.RegistryError, match="impl='scan'"):
        build(causal=True, attention_impl="flash", impl="scan")
    with pytest.raises(registry.RegistryError, match="attention_impl='pallas' is not"):
        build(causal=True, attention_impl="pallas")

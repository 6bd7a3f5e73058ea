"""kda (models/attention/kda.py) against its references.

The conformance, fidelity and decoding suites (through configs/listops.py) check shapes,
padding, causality and the decoding contract; here: the chunked form equals the scan with a
per-channel decay and the paper's recurrence written in numpy, at any chunk and with a
padded tail, stays finite at L = 16384, reduces to gated_deltanet's chunked form when the
decay is the same on every channel; the layer's chunked form equals its reference form,
padding reaches no real token, prefill + steps equal the parallel form; the gate is fla's
(naive_kda_gate's formula, A ~ U(1, 16), dt log-uniform) and the parameters are fla's
KimiDeltaAttention's. The comparison with fla's own code: scripts/fla_comparison/.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from models.attention import delta, kda

from tests.models.helpers import check_prefill_and_steps, normal, randomize_params
from tests.models.test_delta import assert_close, run

TOL = dict(rtol=1e-4, atol=1e-5)


def kda_inputs(seed: int, shape=(2, 2, 13, 4), v_dim: int = 6, decay: float = 1.0):
    """L2-normalised q, k, values, beta in (0, 1), g <= 0 per key channel (BxHxLxK)."""
    b, h, length, _ = shape
    q = delta.l2_normalise(normal(seed, shape))
    k = delta.l2_normalise(normal(seed + 1, shape))
    v = normal(seed + 2, (b, h, length, v_dim))
    beta = jax.nn.sigmoid(normal(seed + 3, (b, h, length)))
    g = -decay * jax.nn.softplus(normal(seed + 4, shape))
    return q, k, v, beta, g


def paper_recurrence(q, k, v, beta, g):
    """Kimi Linear's update in float64, from the equation:
    S_t = S_{t-1} Diag(alpha_t) (I - beta_t k_t k_t^T) + beta_t v_t k_t^T (S is V x K)."""
    q, k, v, beta, alpha = (np.asarray(a, np.float64) for a in (q, k, v, beta, jnp.exp(g)))
    b, h, length, d = q.shape
    s = np.zeros((b, h, v.shape[-1], d))
    out = np.zeros(v.shape)
    eye = np.eye(d)
    for t in range(length):
        kt, bt = k[:, :, t], beta[:, :, t, None, None]
        erase = eye - bt * np.einsum("bhi,bhj->bhij", kt, kt)
        decayed = s * alpha[:, :, t, None, :]
        s = decayed @ erase + bt * np.einsum("bhv,bhk->bhvk", v[:, :, t], kt)
        out[:, :, t] = np.einsum("bhvk,bhk->bhv", s, q[:, :, t]) / np.sqrt(d)
    return out, s


def build(*, causal: bool, dim: int = 16, heads: int = 2, seed: int = 0, **hparams):
    mixer = registry.build("kda", dim=dim, num_heads=heads, max_len=64, causal=causal,
                           rngs=nnx.Rngs(params=seed), **hparams)
    return randomize_params(mixer, seed=seed + 3, scale=0.4)


# ----------------------------------------------------------------------------- the op


def test_reference_is_the_papers_recurrence():
    q, k, v, beta, g = kda_inputs(0)
    o, s = delta.delta_rule_reference(q, k, v, beta, g)
    o_want, s_want = paper_recurrence(q, k, v, beta, g)
    assert_close(o, o_want, rtol=1e-5, atol=1e-6)
    assert_close(s, s_want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunk_size", [1, 4, 5, 13, 32])
def test_chunked_equals_reference(chunk_size):
    q, k, v, beta, g = kda_inputs(1)
    o, s = kda.chunk_kda(q, k, v, beta, g, chunk_size=chunk_size)
    o_ref, s_ref = delta.delta_rule_reference(q, k, v, beta, g)
    assert_close(o, o_ref)
    assert_close(s, s_ref)


def test_one_decay_per_head_is_gated_deltanets_rule():
    """A decay equal on every key channel is gated_deltanet's scalar gate: kda's chunked
    form equals delta.chunk_delta_rule's (chunk 4); a decay that varies over channels
    does not (the per-channel gate is used)."""
    q, k, v, beta, g = kda_inputs(2)
    g_scalar = g[..., 0]
    o, s = kda.chunk_kda(q, k, v, beta, jnp.broadcast_to(g_scalar[..., None], g.shape),
                         chunk_size=4)
    o_gdn, s_gdn = delta.chunk_delta_rule(q, k, v, beta, g_scalar, chunk_size=4)
    assert_close(o, o_gdn)
    assert_close(s, s_gdn)
    o_channels, _ = kda.chunk_kda(q, k, v, beta, g, chunk_size=4)
    assert not np.allclose(np.asarray(o_channels), np.asarray(o_gdn), atol=1e-3)


def test_gradients_equal_and_finite():
    q, k, v, beta, g = kda_inputs(3)
    w = normal(9, v.shape)

    def loss(fn):
        return lambda *a: jnp.sum(fn(*a)[0] * w) + jnp.sum(fn(*a)[1])

    want = jax.grad(loss(delta.delta_rule_reference), argnums=range(5))(q, k, v, beta, g)
    got = jax.grad(loss(lambda *a: kda.chunk_kda(*a, chunk_size=4)), argnums=range(5))(
        q, k, v, beta, g)
    for a, b in zip(got, want):
        assert np.isfinite(np.asarray(a)).all()
        assert_close(a, b, rtol=1e-4, atol=2e-5)


def test_padded_tail_leaves_the_state():
    """beta = 0 and g = 0 after position 9: the state is the first 9 positions'."""
    q, k, v, beta, g = kda_inputs(4)
    real = jnp.arange(13) < 9
    o, s = kda.chunk_kda(q, k, v, jnp.where(real, beta, 0.0),
                         jnp.where(real[:, None], g, 0.0), chunk_size=4)
    o_prefix, s_prefix = kda.chunk_kda(q[:, :, :9], k[:, :, :9], v[:, :, :9],
                                       beta[:, :, :9], g[:, :, :9], chunk_size=4)
    assert_close(s, s_prefix)
    assert_close(o[:, :, :9], o_prefix)


def test_long_sequence_stays_finite_and_exact():
    """L = 16384, channels decaying up to e^-16 a step beside channels that barely
    decay: every exponent is <= 0, so nothing overflows; equal to the scan."""
    shape = (1, 1, 16384, 2)
    q, k, v, beta, _ = kda_inputs(5, shape=shape, v_dim=2)
    g = jnp.stack([-16.0 * jax.nn.sigmoid(normal(11, shape[2:3])),
                   -1e-3 * jax.nn.sigmoid(normal(12, shape[2:3]))], axis=-1)[None, None]
    beta = jnp.maximum(beta, 0.9)
    chunked = jax.jit(lambda *a: kda.chunk_kda(*a, chunk_size=32))
    o, s = chunked(q, k, v, beta, g)
    o_ref, s_ref = jax.jit(delta.delta_rule_reference)(q, k, v, beta, g)
    assert np.isfinite(np.asarray(o)).all()
    assert_close(o, o_ref, rtol=1e-4, atol=2e-5)
    assert_close(s, s_ref, rtol=1e-4, atol=2e-5)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(chunked(*a)[0]), argnums=(1, 4)))(
        q, k, v, beta, g)
    assert all(np.isfinite(np.asarray(grad)).all() for grad in grads)


# ----------------------------------------------------------------------------- the layer


def with_reference_form(monkeypatch):
    monkeypatch.setattr(kda, "chunk_kda", lambda q, k, v, beta, g, chunk_size:
                        delta.delta_rule_reference(q, k, v, beta, g))


@pytest.mark.parametrize("causal", [True, False])
def test_layer_chunked_equals_reference_form(causal, monkeypatch):
    mixer = build(causal=causal, chunk_size=4)
    x = normal(8, (2, 11, 16))
    mask = jnp.arange(11)[None] < jnp.array([[11], [7]])
    y = run(mixer, "__call__", x, mask)
    with_reference_form(monkeypatch)
    y_ref = run(mixer, "__call__", x, mask)
    real = np.asarray(mask)
    assert_close(np.asarray(y)[real], np.asarray(y_ref)[real])


@pytest.mark.parametrize("causal", [True, False])
def test_padding_never_reaches_real_tokens(causal):
    mixer = build(causal=causal, chunk_size=4)
    x = normal(10, (2, 12, 16))
    mask = jnp.array([[True] * 8 + [False] * 4, [False] * 3 + [True] * 9])
    y = run(mixer, "__call__", x, mask)
    y_changed = run(mixer, "__call__", jnp.where(mask[..., None], x, 5.0 * normal(11, x.shape)),
                    mask)
    real = np.asarray(mask)
    assert_close(np.asarray(y)[real], np.asarray(y_changed)[real], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("conv_size", [4, 0])
def test_prefill_and_steps_equal_the_parallel_form(conv_size):
    """With fla's short convolutions and without (conv_size 0, the scaffold's switch)."""
    mixer = build(causal=True, chunk_size=4, conv_size=conv_size)
    check_prefill_and_steps(mixer, run, normal(12, (3, 16, 16)), jnp.array([1, 5, 9]), 9,
                            **TOL)


def test_gate_is_flas_formula_and_init():
    """g = -exp(A_log)[h] softplus(W_up W_down x + dt_bias)[h, k] (fla's naive_kda_gate),
    < 0 and different across a head's channels; A = exp(A_log) ~ U(1, 16), per head;
    softplus(dt_bias) log-uniform in [1e-3, 1e-1], per head and channel."""
    mixer = build(causal=True)
    direction = mixer.forward_scan
    x = normal(14, (3, 5, 16))
    beta, g = direction.gates(x)
    assert beta.shape == (3, 5, 2) and g.shape == (3, 5, 2, 8)
    f = np.asarray(direction.decay_up(direction.decay_down(x)), np.float64).reshape(3, 5, 2, 8)
    dt_bias = np.asarray(direction.dt_bias[...], np.float64).reshape(2, 8)
    a = np.exp(np.asarray(direction.a_log[...], np.float64))[:, None]
    assert_close(g, -a * np.logaddexp(0.0, f + dt_bias), rtol=1e-5, atol=1e-6)
    assert (np.asarray(g) < 0).all() and np.asarray(g).std(axis=-1).min() > 0
    heads = 20000
    fresh = kda.KDADirection(dim=1, num_heads=heads, key_dim=heads, value_dim=heads,
                             conv_size=4, gated=True, rngs=nnx.Rngs(params=0))
    a = np.exp(np.asarray(fresh.a_log[...], np.float64))
    assert 1 <= a.min() and a.max() <= 16
    assert_close(np.quantile(a, np.linspace(0.1, 0.9, 9)), np.linspace(2.5, 14.5, 9),
                 rtol=0, atol=0.15)
    dt = np.asarray(jax.nn.softplus(fresh.dt_bias[...]), np.float64)
    assert_close(np.quantile(np.log(dt), [0.1, 0.5, 0.9]),
                 np.log(1e-3) + np.array([0.1, 0.5, 0.9]) * np.log(100.0), rtol=0, atol=0.05)


def test_parameters_are_flas_kimi_delta_attention():
    """fla's KimiDeltaAttention(hidden_size=D, head_dim=K, num_heads=H, expand_v=1):
    q/k/v 3 D H K, convolutions 3 x 4 H K, f_proj D K + K H K, b_proj D H, A_log H,
    dt_bias H K, g_proj D K + K H K + H K (its bias), o_norm K, o_proj H K D."""
    dim, heads, head = 24, 3, 8
    mixer = registry.build("kda", dim=dim, num_heads=heads, max_len=16, causal=True,
                           rngs=nnx.Rngs(0))
    hk = heads * head
    want = (3 * dim * hk + 3 * 4 * hk + dim * head + head * hk + dim * heads + heads + hk
            + dim * head + head * hk + hk + head + hk * dim)
    count = sum(p.size for p in jax.tree.leaves(nnx.state(mixer, nnx.Param)))
    assert count == want

"""deltanet / gated_deltanet (models/attention/delta.py) against their references.

The conformance, fidelity and decoding suites check shapes, padding, causality and the
decoding contract through the configs; here: the three forms (step-by-step reference,
chunked WY form, recurrent step) equal each other and the paper's recurrence written
independently in numpy, at any chunk size and at L = 16384, with padding, and the
gates' ranges and initial statistics (fla's).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import decoding, registry
from models.attention import delta, linear

from tests.models.helpers import check_prefill_and_steps, normal, randomize_params

NAMES = ("deltanet", "gated_deltanet")
TOL = dict(rtol=1e-4, atol=1e-5)


def rule_inputs(seed: int, shape=(2, 2, 13, 4), v_dim: int = 6, gated: bool = True,
                decay: float = 1.0):
    """L2-normalised q, k, values, beta in (0, 1), g <= 0 (None without a gate)."""
    b, h, length, _ = shape
    q = delta.l2_normalise(normal(seed, shape))
    k = delta.l2_normalise(normal(seed + 1, shape))
    v = normal(seed + 2, (b, h, length, v_dim))
    beta = jax.nn.sigmoid(normal(seed + 3, (b, h, length)))
    g = -decay * jax.nn.softplus(normal(seed + 4, (b, h, length))) if gated else None
    return q, k, v, beta, g


def paper_recurrence(q, k, v, beta, g):
    """The papers' update in float64, written from the equations:
    S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T, o_t = S_t q_t / sqrt(d)."""
    q, k, v, beta = (np.asarray(a, np.float64) for a in (q, k, v, beta))
    alpha = np.ones(beta.shape) if g is None else np.exp(np.asarray(g, np.float64))
    b, h, length, d = q.shape
    s = np.zeros((b, h, v.shape[-1], d))
    out = np.zeros(v.shape)
    eye = np.eye(d)
    for t in range(length):
        kt, bt = k[:, :, t], beta[:, :, t, None, None]
        erase = eye - bt * np.einsum("bhi,bhj->bhij", kt, kt)
        s = alpha[:, :, t, None, None] * s @ erase + bt * np.einsum("bhv,bhk->bhvk", v[:, :, t], kt)
        out[:, :, t] = np.einsum("bhvk,bhk->bhv", s, q[:, :, t]) / np.sqrt(d)
    return out, s


def build(name: str, *, causal: bool, dim: int = 16, heads: int = 2, seed: int = 0,
          **hparams) -> nnx.Module:
    mixer = registry.build(name, dim=dim, num_heads=heads, max_len=64, causal=causal,
                           rngs=nnx.Rngs(params=seed), **hparams)
    # Random weights everywhere (norm scale, A_log, dt_bias too) so no term is trivially 1
    # or 0; the scale keeps the gates away from saturation.
    return randomize_params(mixer, seed=seed + 3, scale=0.4)


def run(mixer, method: str, *args):
    """mixer.<method>(*args) under one jit (eager dispatch op by op is slow on CPU)."""
    return nnx.jit(lambda m, *a: getattr(m, method)(*a))(mixer, *args)


def with_reference_form(monkeypatch):
    """Makes the layers run the step-by-step reference instead of the chunked form."""
    monkeypatch.setattr(delta, "chunk_delta_rule",
                        lambda q, k, v, beta, g, chunk_size: delta.delta_rule_reference(
                            q, k, v, beta, g))


def assert_close(a, b, **tol):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **(tol or TOL))


# ----------------------------------------------------------------------------- pure functions


@pytest.mark.parametrize("gated", [False, True])
def test_reference_is_the_papers_recurrence(gated):
    inputs = rule_inputs(0, gated=gated)
    o, s = delta.delta_rule_reference(*inputs)
    o_paper, s_paper = paper_recurrence(*inputs)
    assert_close(o, o_paper)
    assert_close(s, s_paper)


@pytest.mark.parametrize("size", [1, 2, 5, 16, 64])  # powers of two and not
def test_unit_lower_inverse_solves_the_triangular_system(size):
    """The UT transform's inverse against jax.scipy.linalg.solve_triangular and float64."""
    a = 0.3 * normal(15, (2, 3, size, size))  # the diagonal and upper part must be ignored
    b = normal(16, (2, 3, size, 4))
    x = delta.unit_lower_inverse(a) @ b
    assert_close(x, jax.scipy.linalg.solve_triangular(a, b, lower=True, unit_diagonal=True))
    eye_plus = np.eye(size) + np.tril(np.asarray(a, np.float64), -1)
    assert_close(x, np.linalg.solve(eye_plus, np.asarray(b, np.float64)))


@pytest.mark.parametrize("chunk_size", [1, 5, 64])  # L = 13: 5 leaves a tail, 64 > L
@pytest.mark.parametrize("gated", [False, True])
def test_chunked_equals_reference(gated, chunk_size):
    inputs = rule_inputs(1, gated=gated)
    o_ref, s_ref = delta.delta_rule_reference(*inputs)
    o, s = delta.chunk_delta_rule(*inputs, chunk_size=chunk_size)
    assert_close(o, o_ref)
    assert_close(s, s_ref)


def test_ungated_rule_is_fast_weights_delta_rule():
    """Without a gate the rule is linear.py's fast-weight scan (q pre-scaled)."""
    q, k, v, beta, _ = rule_inputs(2, gated=False)
    o, s = delta.chunk_delta_rule(q, k, v, beta, chunk_size=4)
    o_fw, s_fw = linear.delta_rule_attention(q * q.shape[-1] ** -0.5, k, v, beta, causal=True,
                                             chunk_size=4, return_state=True)
    assert_close(o, o_fw)
    assert_close(s, s_fw)


@pytest.mark.parametrize("gated", [False, True])
def test_gradients_equal_and_finite(gated):
    inputs = rule_inputs(3, gated=gated)
    w = normal(9, inputs[2].shape)
    argnums = (0, 1, 2, 3, 4) if gated else (0, 1, 2, 3)

    def loss(fn, *args):
        o, s = fn(*args)
        return jnp.sum(o * w) + jnp.sum(s ** 2)

    chunked = jax.grad(lambda *a: loss(lambda *b: delta.chunk_delta_rule(*b, chunk_size=5), *a),
                       argnums=argnums)(*inputs)
    reference = jax.grad(lambda *a: loss(delta.delta_rule_reference, *a),
                         argnums=argnums)(*inputs)
    for got, want in zip(chunked, reference):
        assert np.isfinite(np.asarray(got)).all()
        assert_close(got, want, rtol=2e-4, atol=2e-5)


def test_padded_tail_leaves_the_state():
    """beta = 0 and g = 0 (what the layer gives padded positions) neither write nor decay:
    the final state is the real prefix's, and the prefix's outputs are unchanged."""
    q, k, v, beta, g = rule_inputs(4)
    real = 9
    keep = jnp.arange(q.shape[2]) < real
    o, s = delta.chunk_delta_rule(q, k, v, jnp.where(keep, beta, 0.0), jnp.where(keep, g, 0.0),
                                  chunk_size=4)
    o_prefix, s_prefix = delta.chunk_delta_rule(q[:, :, :real], k[:, :, :real], v[:, :, :real],
                                                beta[:, :, :real], g[:, :, :real], chunk_size=4)
    assert_close(s, s_prefix)
    assert_close(o[:, :, :real], o_prefix)


def test_long_sequence_stays_finite_and_exact():
    """L = 16384, tiny dims, decays up to e^-16 a step and beta near 1: every exponent
    of the chunked form is <= 0, so nothing overflows; equal to the step-by-step form at
    every position (checked in full) and finite in the backward pass."""
    shape = (1, 2, 16384, 2)
    q, k, v, beta, _ = rule_inputs(5, shape=shape, v_dim=2)
    g_1x2xL = jnp.stack([-16.0 * jax.nn.sigmoid(normal(11, shape[2:3])),  # strong decay
                         -1e-3 * jax.nn.sigmoid(normal(12, shape[2:3]))])[None]  # nearly none
    beta = jnp.maximum(beta, 0.9)
    chunked = jax.jit(lambda *a: delta.chunk_delta_rule(*a, chunk_size=64))
    o, s = chunked(q, k, v, beta, g_1x2xL)
    o_ref, s_ref = jax.jit(delta.delta_rule_reference)(q, k, v, beta, g_1x2xL)
    assert np.isfinite(np.asarray(o)).all() and np.isfinite(np.asarray(s)).all()
    assert_close(o, o_ref, rtol=1e-4, atol=2e-5)
    assert_close(s, s_ref, rtol=1e-4, atol=2e-5)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(chunked(*a)[0]), argnums=(1, 4)))(
        q, k, v, beta, g_1x2xL)
    assert all(np.isfinite(np.asarray(grad)).all() for grad in grads)


def test_causal_conv_is_pytorchs_padded_conv1d():
    """w[-1] weighs the current token, w[0] the one conv_size - 1 before; zeros before 0."""
    x = normal(6, (1, 2, 7, 3))
    w = normal(7, (4, 2, 3))
    want = np.zeros(x.shape)
    for t in range(7):
        for i in range(4):
            if t - 3 + i >= 0:
                want[:, :, t] += np.asarray(w[i]) * np.asarray(x[:, :, t - 3 + i])
    assert_close(delta.causal_conv(x, w), want, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- layers


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", NAMES)
def test_layer_chunked_equals_reference_form(name, causal, monkeypatch):
    """The layer's chunked form (chunk 4, L = 11: a tail) equals it run with the
    step-by-step reference, causal and bidirectional, with padding."""
    mixer = build(name, causal=causal, chunk_size=4)
    x = normal(8, (2, 11, 16))
    mask = jnp.arange(11)[None] < jnp.array([[11], [7]])
    y = run(mixer, "__call__", x, mask)
    with_reference_form(monkeypatch)
    y_ref = run(mixer, "__call__", x, mask)
    real = np.asarray(mask)
    assert_close(np.asarray(y)[real], np.asarray(y_ref)[real])


@pytest.mark.parametrize("name", NAMES)
def test_bidirectional_is_forward_plus_reversed_backward(name, monkeypatch):
    """causal=False: output = finish(forward scan + the backward scan's causal run on the
    reversed sequence, reversed back); checked with the reference form and a mixer whose
    backward direction is then removed."""
    with_reference_form(monkeypatch)
    mixer = build(name, causal=False, chunk_size=4)
    x = normal(9, (1, 10, 16))

    @nnx.jit
    def by_hand(mixer, x):
        q, k, v = mixer.qkv(x)
        real = jnp.ones((1, 10), bool)
        o_fwd, _ = mixer.scan(mixer.forward_scan, q, k, v, x, real)
        flip = lambda t: jnp.flip(t, axis=2)  # noqa: E731
        o_bwd, _ = mixer.scan(mixer.backward_scan, flip(q), flip(k), flip(v), jnp.flip(x, 1),
                              real)
        return mixer.out(mixer.merge_heads(mixer.finish(o_fwd + flip(o_bwd), x)))

    y = run(mixer, "__call__", x)
    assert_close(y, by_hand(mixer, x))
    # Not vacuous: the backward scan reaches the first output from the last input.
    y_moved = run(mixer, "__call__", x.at[:, -1].add(1.0))
    assert not np.allclose(np.asarray(y_moved[:, 0]), np.asarray(y[:, 0]))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", NAMES)
def test_padding_never_reaches_real_tokens(name, causal):
    """Left and right padding, both directions: padded inputs may be anything."""
    mixer = build(name, causal=causal, chunk_size=4)
    x = normal(10, (2, 12, 16))
    mask = jnp.array([[True] * 8 + [False] * 4, [False] * 3 + [True] * 9])
    y = run(mixer, "__call__", x, mask)
    y_changed = run(mixer, "__call__", jnp.where(mask[..., None], x, 5.0 * normal(11, x.shape)),
                    mask)
    real = np.asarray(mask)
    assert_close(np.asarray(y)[real], np.asarray(y_changed)[real], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_prefill_and_steps_equal_the_parallel_form(name):
    """Prompts of 1, 5 and 9 tokens (right-padded to 9), then each row steps on at its
    own position: the outputs are the parallel causal form's (chunk 4) at every
    position, and the cache is the same size whatever max_len."""
    mixer = build(name, causal=True, chunk_size=4)
    check_prefill_and_steps(mixer, run, normal(12, (3, 16, 16)), jnp.array([1, 5, 9]), 9,
                            **TOL)
    assert jax.tree.map(jnp.shape, mixer.init_cache(3, 16)) == jax.tree.map(
        jnp.shape, mixer.init_cache(3, 4096))


@pytest.mark.parametrize("name", NAMES)
def test_right_padding_leaves_the_prompt_state(name):
    """prefill of a right-padded prompt gives the cache of its real tokens alone."""
    mixer = build(name, causal=True, chunk_size=4)
    x = normal(13, (1, 10, 16))
    _, padded = run(mixer, "prefill", mixer.init_cache(1, 16),
                    jnp.where(jnp.arange(10)[None, :, None] < 6, x, 7.0),
                    jnp.arange(10)[None] < 6)
    _, alone = run(mixer, "prefill", mixer.init_cache(1, 16), x[:, :6], None)
    for key in alone:
        assert_close(padded[key], alone[key], rtol=1e-6, atol=1e-6)


def test_bidirectional_form_does_not_decode():
    with pytest.raises(decoding.DecodingError, match="causal=False"):
        build("deltanet", causal=False).init_cache(1, 8)


# ----------------------------------------------------------------------------- gates


@pytest.mark.parametrize("name", NAMES)
def test_beta_in_open_unit_interval_and_decay_at_most_one(name):
    mixer = build(name, causal=True)
    beta, g = mixer.forward_scan.gates(normal(14, (4, 32, 16)))
    beta, g = np.asarray(beta), np.asarray(g)
    assert (beta > 0).all() and (beta < 1).all() and beta.std() > 0.05
    assert (g <= 0).all()
    assert (g == 0).all() if name == "deltanet" else (g < 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_allow_neg_eigval_doubles_beta_in_every_form(name, monkeypatch):
    """allow_neg_eigval (fla's, Grazzi et al.'s sigmoid_scale 2): beta = 2 sigmoid(.) in
    (0, 2), the same weights otherwise; the chunked form equals the step-by-step one and
    the decoding steps equal the parallel form with it."""
    plain = build(name, causal=True, chunk_size=4)
    mixer = build(name, causal=True, chunk_size=4, allow_neg_eigval=True)
    x = normal(14, (4, 32, 16))
    beta, _ = mixer.forward_scan.gates(x)
    beta_plain, _ = plain.forward_scan.gates(x)
    assert_close(beta, 2.0 * np.asarray(beta_plain), rtol=1e-6, atol=0)
    assert (np.asarray(beta) > 1).any() and (np.asarray(beta) < 2).all()
    check_prefill_and_steps(mixer, run, normal(12, (3, 16, 16)), jnp.array([1, 5, 9]), 9,
                            **TOL)
    x = normal(8, (2, 11, 16))
    mask = jnp.arange(11)[None] < jnp.array([[11], [7]])
    y = run(mixer, "__call__", x, mask)
    assert not np.allclose(np.asarray(y), np.asarray(run(plain, "__call__", x, mask)))
    with_reference_form(monkeypatch)
    real = np.asarray(mask)
    assert_close(np.asarray(y)[real], np.asarray(run(mixer, "__call__", x, mask))[real])


def test_gated_deltanet_without_its_decay_is_the_same_layer_at_alpha_one():
    """decay=False (the ablation of the decay alone): no decay parameters, g = 0 at every
    step, and the output is the gated layer's with its decay forced to alpha = 1 (the same
    other weights), its chunked form equal to the step-by-step one and to decoding."""
    gated = build("gated_deltanet", causal=True, chunk_size=4)
    plain = build("gated_deltanet", causal=True, chunk_size=4, decay=False)
    assert plain.forward_scan.decay is None and not hasattr(plain.forward_scan, "a_log")
    x = normal(8, (2, 11, 16))
    _, g = plain.forward_scan.gates(x)
    assert (np.asarray(g) == 0).all()
    # the gated layer's weights, its decay switched off by hand: the same outputs
    weights = dict(nnx.state(gated).flat_state())
    nnx.update(plain, nnx.State.from_flat_path(
        {path: weights[path] for path, _ in nnx.state(plain).flat_state()}))
    gated.forward_scan.decay = None
    assert_close(run(plain, "__call__", x), run(gated, "__call__", x), rtol=1e-6, atol=1e-6)
    check_prefill_and_steps(plain, run, normal(12, (3, 16, 16)), jnp.array([1, 5, 9]), 9,
                            **TOL)


def test_gate_initialisation_is_flas():
    """A = exp(A_log) ~ U(0, 16); softplus(dt_bias) = dt, log-uniform in [1e-3, 1e-1]
    (fla's GatedDeltaNet, Mamba-2's ranges); neither takes weight decay."""
    heads = 20000
    direction = delta.ScanDirection(dim=1, num_heads=heads, key_dim=heads, value_dim=heads,
                                    conv_size=4, gated=True, rngs=nnx.Rngs(params=0))
    a = np.exp(np.asarray(direction.a_log[...], np.float64))
    dt = np.asarray(jax.nn.softplus(direction.dt_bias[...]), np.float64)
    assert 0 < a.min() and a.max() < 16
    # Uniform: the deciles at 1.6, 3.2, ... (binomial sd of a decile's share ~0.002).
    assert_close(np.quantile(a, np.linspace(0.1, 0.9, 9)), np.linspace(1.6, 14.4, 9),
                 rtol=0, atol=0.15)
    assert 1e-3 * (1 - 1e-5) < dt.min() and dt.max() < 1e-1 * (1 + 1e-5)
    log_dt = np.log(dt)
    assert_close(np.quantile(log_dt, np.linspace(0.1, 0.9, 9)),
                 np.log(1e-3) + np.linspace(0.1, 0.9, 9) * np.log(100.0), rtol=0, atol=0.05)
    for param in (direction.a_log, direction.dt_bias):
        assert param.get_metadata()["no_weight_decay"] is True

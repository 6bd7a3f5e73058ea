"""mamba2 (models/attention/ssd.py) against its references.

The conformance, fidelity and decoding suites check shapes, padding, causality and the
decoding contract through the configs; here: the three forms (step-by-step reference,
chunked, recurrent step) equal each other and the paper's recurrence written
independently in numpy, at any chunk size and at L = 16384, with padding, and the
initial A, dt and D as mamba_ssm's.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import decoding, registry
from models.attention import ssd

from tests.models.helpers import check_prefill_and_steps, normal, randomize_params
from tests.models.test_retention import pallas_against_dense

TOL = dict(rtol=1e-4, atol=1e-5)


def ssd_inputs(seed: int, shape=(2, 3, 13, 4), n: int = 5, decay: float = 1.0):
    """x (already times dt), log a = dt A <= 0, B, C."""
    b, h, length, _ = shape
    x = normal(seed, shape)
    log_a = -decay * jax.nn.softplus(normal(seed + 1, (b, h, length)))
    return x, log_a, normal(seed + 2, (b, h, length, n)), normal(seed + 3, (b, h, length, n))


def paper_recurrence(x, log_a, b, c, sign=None):
    """h_t = exp(dt_t A) h_{t-1} + (dt_t x_t) B_t^T, y_t = h_t C_t, float64 (the decay
    times `sign` where given)."""
    x, log_a, b, c = (np.asarray(t, np.float64) for t in (x, log_a, b, c))
    a = np.exp(log_a) * (1.0 if sign is None else np.asarray(sign, np.float64))
    h = np.zeros(x.shape[:2] + (x.shape[-1], b.shape[-1]))
    y = np.zeros(x.shape)
    for t in range(x.shape[2]):
        h = a[:, :, t][..., None, None] * h + np.einsum(
            "bhp,bhn->bhpn", x[:, :, t], b[:, :, t])
        y[:, :, t] = np.einsum("bhpn,bhn->bhp", h, c[:, :, t])
    return y, h


def build(*, causal: bool, seed: int = 0, **hparams) -> nnx.Module:
    mixer = registry.build("mamba2", dim=16, num_heads=2, max_len=64, causal=causal,
                           rngs=nnx.Rngs(params=seed), state_size=8, **hparams)
    return randomize_params(mixer, seed=seed + 3, scale=0.4)


def run(mixer, method: str, *args):
    """mixer.<method>(*args) under one jit (eager dispatch op by op is slow on CPU)."""
    return nnx.jit(lambda m, *a: getattr(m, method)(*a))(mixer, *args)


def assert_close(a, b, **tol):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **(tol or TOL))


# ----------------------------------------------------------------------------- pure functions


def test_reference_is_the_papers_recurrence():
    inputs = ssd_inputs(0)
    y, h = ssd.ssd_reference(*inputs)
    y_paper, h_paper = paper_recurrence(*inputs)
    assert_close(y, y_paper)
    assert_close(h, h_paper)


@pytest.mark.parametrize("chunk_size", [1, 5, 64])  # L = 13: 5 leaves a tail, 64 > L
def test_chunked_equals_reference(chunk_size):
    inputs = ssd_inputs(1)
    y_ref, h_ref = ssd.ssd_reference(*inputs)
    y, h = ssd.chunk_ssd(*inputs, chunk_size=chunk_size)
    assert_close(y, y_ref)
    assert_close(h, h_ref)


def test_gradients_equal_and_finite():
    inputs = ssd_inputs(2)
    w_y, w_h = normal(9, inputs[0].shape), normal(10, (2, 3, 4, 5))

    def loss(fn):
        def f(*args):
            y, h = fn(*args)
            return jnp.sum(y * w_y) + jnp.sum(h * w_h)
        return f

    chunked = jax.grad(loss(lambda *a: ssd.chunk_ssd(*a, chunk_size=5)), argnums=(0, 1, 2, 3))(
        *inputs)
    reference = jax.grad(loss(ssd.ssd_reference), argnums=(0, 1, 2, 3))(*inputs)
    for got, want in zip(chunked, reference):
        assert np.isfinite(np.asarray(got)).all()
        assert_close(got, want, rtol=2e-4, atol=5e-5)


def signed_inputs(seed: int):
    """ssd_inputs with a = 2 exp(log_a) - 1 in (-1, 1) as (log |a|, sign): about half
    the decays negative."""
    x, log_a, b, c = ssd_inputs(seed)
    a = 2.0 * jnp.exp(log_a) - 1.0
    return x, jnp.log(jnp.abs(a)), b, c, jnp.where(a < 0, -1.0, 1.0)


def test_signed_decays_chunked_equal_reference_and_the_recurrence():
    """allow_neg_eigval's decays sign exp(log |a|): the chunked form (chunk 1, 5 with a
    tail, 64 > L) equals the step-by-step form and the recurrence in float64, and their
    gradients agree."""
    x, log_abs, b, c, sign = signed_inputs(5)
    assert 0.2 < float(jnp.mean(sign < 0)) < 0.8
    y_paper, h_paper = paper_recurrence(x, log_abs, b, c, sign)
    y_ref, h_ref = ssd.ssd_reference(x, log_abs, b, c, sign)
    assert_close(y_ref, y_paper)
    assert_close(h_ref, h_paper)
    for chunk_size in (1, 5, 64):
        y, h = ssd.chunk_ssd(x, log_abs, b, c, sign, chunk_size=chunk_size)
        assert_close(y, y_ref)
        assert_close(h, h_ref)
    loss = lambda fn: lambda *a: jnp.sum(fn(*a, sign)[0] * c[..., :4])  # noqa: E731
    chunked = jax.grad(loss(lambda *a: ssd.chunk_ssd(*a, chunk_size=5)), argnums=(0, 1, 2, 3))(
        x, log_abs, b, c)
    reference = jax.grad(loss(ssd.ssd_reference), argnums=(0, 1, 2, 3))(x, log_abs, b, c)
    for got, want in zip(chunked, reference):
        assert np.isfinite(np.asarray(got)).all()
        assert_close(got, want, rtol=2e-4, atol=5e-5)


def test_allow_neg_eigval_layer_forms_equal(monkeypatch):
    """mamba2 allow_neg_eigval (a = 2 exp(dt A) - 1): some decays negative; chunked equals
    the step-by-step form, decoding equals the parallel form, and the Pallas kernels
    (log decays only) are refused in one line."""
    mixer = build(causal=True, chunk_size=4, allow_neg_eigval=True)
    plain = build(causal=True, chunk_size=4)
    dt, log_abs, sign = mixer.forward_scan.transition(normal(14, (4, 32, 2)),
                                                      jnp.ones((4, 32), bool))
    _, log_a = plain.forward_scan.steps(normal(14, (4, 32, 2)), jnp.ones((4, 32), bool))
    assert_close(sign * jnp.exp(log_abs), 2.0 * jnp.exp(log_a) - 1.0, rtol=1e-5, atol=1e-6)
    assert (np.asarray(sign) < 0).any() and (np.asarray(log_abs) <= 0).all()
    check_prefill_and_steps(mixer, run, normal(12, (3, 16, 16)), jnp.array([1, 5, 9]), 9,
                            **TOL)
    _assert_chunked_equals_reference(mixer, monkeypatch)
    with pytest.raises(registry.RegistryError, match="allow_neg_eigval.*Pallas"):
        build(causal=True, attention_impl="pallas", allow_neg_eigval=True)


def test_padded_tail_leaves_the_state():
    """x = 0 and log a = 0 (dt = 0, what the layer gives padded positions): the final
    state is the real prefix's."""
    x, log_a, b, c = ssd_inputs(3)
    keep = jnp.arange(13) < 9
    y, h = ssd.chunk_ssd(jnp.where(keep[:, None], x, 0.0), jnp.where(keep, log_a, 0.0), b, c,
                         chunk_size=4)
    y_prefix, h_prefix = ssd.chunk_ssd(x[:, :, :9], log_a[:, :, :9], b[:, :, :9], c[:, :, :9],
                                       chunk_size=4)
    assert_close(h, h_prefix)
    assert_close(y[:, :, :9], y_prefix)


def test_long_sequence_stays_finite_and_exact():
    """L = 16384, tiny dims, decays from e^-16 to e^-1e-3 a step: every exponent of the
    chunked form is <= 0, so nothing overflows; equal to the step-by-step form everywhere
    and finite in the backward pass."""
    x, _, b, c = ssd_inputs(4, shape=(1, 2, 16384, 2), n=2)
    log_a = jnp.stack([-16.0 * jax.nn.sigmoid(normal(11, (16384,))),
                       -1e-3 * jax.nn.sigmoid(normal(12, (16384,)))])[None]
    chunked = jax.jit(lambda *a: ssd.chunk_ssd(*a, chunk_size=256))
    y, h = chunked(x, log_a, b, c)
    y_ref, h_ref = ssd.ssd_reference(x, log_a, b, c)
    assert np.isfinite(np.asarray(y)).all() and np.isfinite(np.asarray(h)).all()
    # The slow head sums ~1000 terms of size ~1: float32 rounding, not the form.
    assert_close(y, y_ref, rtol=1e-4, atol=1e-3)
    assert_close(h, h_ref, rtol=1e-4, atol=1e-3)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(chunked(*a)[0]), argnums=(0, 1)))(
        x, log_a, b, c)
    assert all(np.isfinite(np.asarray(grad)).all() for grad in grads)


# ----------------------------------------------------------------------------- the layer


@pytest.mark.parametrize("causal", [True, False])
def test_layer_chunked_equals_reference_form(causal, monkeypatch):
    """Chunk 4 at L = 11 (a tail), with padding, against the step-by-step form."""
    _assert_chunked_equals_reference(build(causal=causal, chunk_size=4), monkeypatch)


def _assert_chunked_equals_reference(mixer, monkeypatch):
    """The layer at L = 11 with a padded row: its chunked SSD, then ssd_reference in its
    place (monkeypatched), equal on the real positions."""
    x = normal(8, (2, 11, 16))
    mask = jnp.arange(11)[None] < jnp.array([[11], [7]])
    y = run(mixer, "__call__", x, mask)
    monkeypatch.setattr(ssd, "chunk_ssd",
                        lambda x, log_a, b, c, sign=None, chunk_size=0: ssd.ssd_reference(
                            x, log_a, b, c, sign))
    real = np.asarray(mask)
    assert_close(np.asarray(y)[real], np.asarray(run(mixer, "__call__", x, mask))[real])


def test_bidirectional_is_forward_plus_reversed_backward():
    mixer = build(causal=False, chunk_size=4)
    x = normal(9, (1, 10, 16))

    @nnx.jit
    def by_hand(mixer, x):
        z, xbc, dt_raw = mixer.conv_inputs(x)
        real = jnp.ones((1, 10), bool)
        y_fwd, _ = mixer.scan(mixer.forward_scan, xbc, dt_raw, real)
        y_bwd, _ = mixer.scan(mixer.backward_scan, jnp.flip(xbc, 1), jnp.flip(dt_raw, 1), real)
        return mixer.finish(y_fwd + jnp.flip(y_bwd, 2), z)

    y = run(mixer, "__call__", x)
    assert_close(y, by_hand(mixer, x))
    y_moved = run(mixer, "__call__", x.at[:, -1].add(1.0))  # the last input reaches output 0
    assert not np.allclose(np.asarray(y_moved[:, 0]), np.asarray(y[:, 0]))


@pytest.mark.parametrize("causal", [True, False])
def test_padding_never_reaches_real_tokens(causal):
    """Left and right padding, both directions: padded inputs may be anything."""
    mixer = build(causal=causal, chunk_size=4)
    x = normal(10, (2, 12, 16))
    mask = jnp.array([[True] * 8 + [False] * 4, [False] * 3 + [True] * 9])
    y = run(mixer, "__call__", x, mask)
    y_changed = run(mixer, "__call__", jnp.where(mask[..., None], x, 5.0 * normal(11, x.shape)),
                    mask)
    real = np.asarray(mask)
    assert_close(np.asarray(y)[real], np.asarray(y_changed)[real], rtol=1e-6, atol=1e-6)


def test_prefill_and_steps_equal_the_parallel_form():
    """Prompts of 1, 5 and 9 tokens (right-padded to 9), then each row steps on at its own
    position: the parallel causal form's outputs (chunk 4) at every position; the cache is
    the same size whatever max_len."""
    mixer = build(causal=True, chunk_size=4)
    check_prefill_and_steps(mixer, run, normal(12, (3, 16, 16)), jnp.array([1, 5, 9]), 9,
                            **TOL)
    assert jax.tree.map(jnp.shape, mixer.init_cache(3, 16)) == jax.tree.map(
        jnp.shape, mixer.init_cache(3, 4096))


def test_right_padding_leaves_the_prompt_state():
    mixer = build(causal=True, chunk_size=4)
    x = normal(13, (1, 10, 16))
    _, padded = run(mixer, "prefill", mixer.init_cache(1, 16),
                    jnp.where(jnp.arange(10)[None, :, None] < 6, x, 7.0),
                    jnp.arange(10)[None] < 6)
    _, alone = run(mixer, "prefill", mixer.init_cache(1, 16), x[:, :6], None)
    for key in alone:
        assert_close(padded[key], alone[key], rtol=1e-6, atol=1e-6)


def test_bidirectional_form_does_not_decode():
    with pytest.raises(decoding.DecodingError, match="causal=False"):
        build(causal=False).init_cache(1, 8)


def test_steps_positive_and_decay_at_most_one():
    mixer = build(causal=True)
    dt, log_a = mixer.forward_scan.steps(normal(14, (4, 32, 2)), jnp.ones((4, 32), bool))
    assert (np.asarray(dt) > 0).all() and (np.asarray(log_a) < 0).all()


def test_initialisation_is_mamba2s():
    """A = exp(A_log) ~ U(1, 16), softplus(dt_bias) = dt log-uniform in [1e-3, 1e-1], D = 1
    (mamba_ssm's Mamba2); none takes weight decay."""
    heads = 20000
    direction = ssd.SSDDirection(num_heads=heads, channels=4, conv_size=4,
                                 rngs=nnx.Rngs(params=0))
    a = np.exp(np.asarray(direction.a_log[...], np.float64))
    dt = np.asarray(jax.nn.softplus(direction.dt_bias[...]), np.float64)
    assert 1 <= a.min() and a.max() < 16
    deciles = np.linspace(0.1, 0.9, 9)
    assert_close(np.quantile(a, deciles), 1 + 15 * deciles, rtol=0, atol=0.15)
    assert 1e-3 * (1 - 1e-5) < dt.min() and dt.max() < 1e-1 * (1 + 1e-5)
    assert_close(np.quantile(np.log(dt), deciles), np.log(1e-3) + deciles * np.log(100.0),
                 rtol=0, atol=0.05)
    assert (np.asarray(direction.d[...]) == 1).all()
    for param in (direction.a_log, direction.dt_bias, direction.d):
        assert param.get_metadata()["no_weight_decay"] is True


# ----------------------------------------------------------------------------- pallas


@pytest.mark.parametrize("causal", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["bidirectional", "causal"])
def test_pallas_kernel_matches_dense_through_the_config(causal):
    """attention_impl="pallas" (C, B, dt x and the scalar decay through the decayed
    linear-attention kernels) against chunk_ssd, through configs/listops.py's mini."""
    pallas_against_dense("mamba2", causal)


def test_pallas_prefill_keeps_the_chunked_state():
    """prefill needs h_L: it runs chunk_ssd under attention_impl="pallas" too, and its
    outputs are the kernel's forward."""
    mixer = build(causal=True, attention_impl="pallas")
    x = normal(12, (2, 9, 16))
    mask = jnp.arange(9)[None] < jnp.array([[9], [5]])
    y_prefill, cache = run(mixer, "prefill", mixer.init_cache(2, 9), x, mask)
    real = np.asarray(mask)
    assert_close(np.asarray(y_prefill)[real], np.asarray(run(mixer, "__call__", x, mask))[real])
    mixer.attention_impl = "dense"
    _, cache_dense = run(mixer, "prefill", mixer.init_cache(2, 9), x, mask)
    assert_close(cache["h"], cache_dense["h"], rtol=0, atol=0)


def test_without_its_decay_the_layer_is_the_same_at_a_one(monkeypatch):
    """decay=False (the ablation of the decay alone): A = 0 (A_log not built), so
    log a = 0 at every step while dt still scales the inputs; the output is the decayed
    layer's with A forced to 0 (the same other weights); chunked equals the step-by-step
    form and decoding the parallel one; with allow_neg_eigval it is refused."""
    decayed = build(causal=True, chunk_size=4)
    plain = build(causal=True, chunk_size=4, decay=False)
    assert plain.forward_scan.a_log is None
    dt, log_a = plain.forward_scan.steps(normal(14, (4, 32, 2)), jnp.ones((4, 32), bool))
    assert (np.asarray(log_a) == 0).all() and (np.asarray(dt) > 0).all()
    weights = dict(nnx.state(decayed).flat_state())
    nnx.update(plain, nnx.State.from_flat_path(
        {path: weights[path] for path, _ in nnx.state(plain).flat_state()}))
    decayed.forward_scan.a_log = None  # A = 0 by hand: the same function
    x = normal(8, (2, 11, 16))
    assert_close(run(plain, "__call__", x), run(decayed, "__call__", x))
    check_prefill_and_steps(plain, run, normal(12, (3, 16, 16)), jnp.array([1, 5, 9]), 9,
                            **TOL)
    _assert_chunked_equals_reference(plain, monkeypatch)
    with pytest.raises(ValueError, match="decay=False"):
        build(causal=True, decay=False, allow_neg_eigval=True)

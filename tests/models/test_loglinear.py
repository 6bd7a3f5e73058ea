"""loglinear_mamba2 (models/attention/loglinear.py) against its references.

The conformance, fidelity and decoding suites check shapes, padding, causality and the
decoding contract through the configs; here: the quadratic form is fla's
naive_log_linear_attn (its level masks ported to numpy as written, float64), the chunked
form and the one-token Fenwick steps equal it at any chunk size and length (values and
gradients), the prompt's Fenwick states equal the steps', unit level weights give
Mamba-2's SSD (the op, and the whole layer against `mamba2` with the same weights), a
right-padded row is its unpadded prefix in both directions, prefill + steps equal the
parallel form, and the parameters and their initialisation are fla's LogLinearMamba2's.
The comparison with fla's own code: scripts/fla_comparison/compare_loglinear.py.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import decoding, registry
from models.attention import loglinear as ll
from models.attention import ssd
from tests.models.helpers import check_prefill_and_steps, normal, randomize_params
from tests.models.test_delta import run

TOL = dict(rtol=1e-4, atol=1e-5)


def assert_close(a, b, **tol):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **(tol or TOL))


def op_inputs(seed: int, length: int, batch: int = 2, heads: int = 2, p: int = 3, n: int = 4):
    """x (already times dt), log a <= 0, B, C shared by the heads (one group, as the layer),
    lambda > 0 per level far from 1, so that a wrong level shows."""
    x = normal(seed, (batch, heads, length, p))
    log_a = -0.3 * jax.nn.softplus(normal(seed + 1, (batch, heads, length)))
    b = jnp.broadcast_to(normal(seed + 2, (batch, 1, length, n)), (batch, heads, length, n))
    c = jnp.broadcast_to(normal(seed + 3, (batch, 1, length, n)), (batch, heads, length, n))
    lam = jnp.asarray(np.random.default_rng(seed + 4).uniform(
        0.1, 3.0, (batch, heads, length, ll.NUM_LEVELS)), jnp.float32)
    return x, log_a, b, c, lam


# ----------------------------------------------------------------------------- fla's naive


def fla_naive(x, log_a, b, c, lam):
    """fla/ops/log_linear_attn/naive.py at bc3b101 in numpy float64, line for line
    (segsum, construct_level_mask, construct_H_matrix, naive_log_linear_attn), on our
    layouts (fla's q, k are BxTx1xN, v BxTxHxP, g BxTxH, level_scales BxTxHxK)."""
    x, a, b, c, lam_L = (np.asarray(t, np.float64) for t in (x, log_a, b, c, lam))
    lam_L = lam_L.transpose(0, 1, 3, 2)  # BxHxKxT, construct_H_matrix's L
    t_len = a.shape[-1]
    cs = np.cumsum(a, -1)
    segsum = np.where(np.tril(np.ones((t_len, t_len), bool)),
                      cs[..., :, None] - cs[..., None, :], -np.inf)
    i, j = np.meshgrid(np.arange(t_len), np.arange(t_len), indexing="ij")  # cartesian_prod
    h_mat = np.zeros(segsum.shape)
    for level in range(int(np.ceil(np.log2(t_len))) + 1):
        if level == 0:
            mask = lam_L[..., 0, :][..., :, None] * np.eye(t_len)  # diag_embed
        else:
            half = 1 << (level - 1)
            cond = ((i % (1 << level) >= half) & (j + half >= i - (i % half))
                    & (j < i - (i % half)))
            mask = np.where(cond, lam_L[..., level, :][..., :, None], 0.0)
        h_mat += np.exp(segsum) * mask
    m = np.einsum("bhlc,bhln,bhcn->bhlc", h_mat, c, b)
    return np.einsum("bhlc,bhcp->bhlp", m, x)


@pytest.mark.parametrize("length", [1, 13, 32])
def test_reference_is_flas_naive(length):
    inputs = op_inputs(0, length)
    assert_close(ll.loglinear_reference(*inputs), fla_naive(*inputs))


def test_levels_are_not_mamba2s():
    """Not vacuous: the same inputs with every lambda = 1 (Mamba-2) are far off."""
    x, log_a, b, c, lam = op_inputs(0, 13)
    y = np.asarray(ll.loglinear_reference(x, log_a, b, c, lam))
    y_unit = np.asarray(ll.loglinear_reference(x, log_a, b, c, jnp.ones_like(lam)))
    assert np.abs(y - y_unit).max() > 0.1 * np.abs(y).max()


@pytest.mark.parametrize("length,chunk", [(13, 1), (13, 4), (13, 16), (32, 4), (37, 8)])
def test_chunked_equals_reference(length, chunk):
    """Tails (13, 37), one short chunk (16 > 13), and 8 chunks (three chunk levels:
    merges that cascade)."""
    inputs = op_inputs(1, length)
    assert_close(ll.chunk_loglinear(*inputs, chunk_size=chunk), fla_naive(*inputs))


def test_chunked_gradients_equal_reference():
    inputs = op_inputs(2, 21)
    w = normal(9, (2, 2, 21, 3))
    grads = [jax.grad(lambda *a: jnp.sum(w * f(*a)), argnums=tuple(range(5)))(*inputs)
             for f in (ll.loglinear_reference,
                       lambda *a: ll.chunk_loglinear(*a, chunk_size=4))]
    for g_ref, g_chunk in zip(*grads):
        assert np.isfinite(np.asarray(g_chunk)).all()
        assert_close(g_chunk, g_ref)


@jax.jit
def _steps(x, log_a, b, c, lam):
    """loglinear_step over every position from the empty slots: (y BxHxLxP, the slots
    after each position LxBxSxHxPxN)."""
    batch, heads, length, p = x.shape
    slots = max(1, (length - 1).bit_length())

    def one(carry, xs):
        s, pos = carry
        y, s = ll.loglinear_step(s, pos, *xs)
        return (s, pos + 1), (y, s)

    s0 = jnp.zeros((batch, slots, heads, p, b.shape[-1]))
    xs = tuple(jnp.moveaxis(t, 2, 0) for t in (x, log_a, b, c, lam))
    _, (y, states) = jax.lax.scan(one, (s0, jnp.zeros((batch,), jnp.int32)), xs)
    return jnp.moveaxis(y, 0, 2), states


def test_steps_and_prompt_states_equal_reference():
    """The one-token Fenwick steps give the quadratic form's outputs; `fenwick_states`
    of a right-padded prompt (rows of 0, 5, 8 and 13 real positions) are the steps'
    slots after those positions (the padded tail has log a = 0, x = 0, as in the layer)."""
    x, log_a, b, c, lam = op_inputs(3, 13, batch=4)
    y, states = _steps(x, log_a, b, c, lam)
    assert_close(y, fla_naive(x, log_a, b, c, lam))
    lens = jnp.array([0, 5, 8, 13])
    real = (jnp.arange(13)[None] < lens[:, None])[:, None]
    got = ll.fenwick_states(jnp.where(real[..., None], x, 0.0), jnp.where(real, log_a, 0.0),
                            b, lens, states.shape[2])
    for row, n in enumerate(np.asarray(lens)):
        want = np.zeros(got.shape[1:]) if n == 0 else np.asarray(states[n - 1, row])
        assert_close(got[row], want)
    # The Fenwick invariant: before position 13 = 0b1101, slots 0, 2, 3 hold 1, 4, 8 keys.
    assert (np.abs(np.asarray(states[12, 3])).sum(axis=(1, 2, 3)) > 0).tolist() == [
        True, False, True, True]


def test_unit_levels_are_mamba2s_ssd():
    """lambda = 1 at every level: the mask is Mamba-2's, so every form is ssd.chunk_ssd."""
    x, log_a, b, c, lam = op_inputs(4, 19)
    ones = jnp.ones_like(lam)
    want, _ = ssd.chunk_ssd(x, log_a, b, c, chunk_size=4)
    assert_close(ll.chunk_loglinear(x, log_a, b, c, ones, chunk_size=4), want)
    assert_close(ll.loglinear_reference(x, log_a, b, c, ones), want)
    assert_close(_steps(x, log_a, b, c, ones)[0], want)


# ----------------------------------------------------------------------------- the layer


def build(*, causal: bool, dim: int = 16, heads: int = 2, seed: int = 0, **hparams):
    mixer = registry.build("loglinear_mamba2", dim=dim, num_heads=heads, max_len=64,
                           causal=causal, rngs=nnx.Rngs(params=seed),
                           **{"chunk_size": 4, "state_size": 8, **hparams})
    return randomize_params(mixer, seed=seed + 3, scale=0.4)


@pytest.mark.parametrize("causal", [True, False])
def test_layer_with_constant_levels_is_mamba2(causal):
    """L = 0 makes every lambda = softplus(0) = ln 2: y = ln 2 SSD(x) + D x. `mamba2` with
    the same weights and D / ln 2 gives y / ln 2, and the gated RMSNorm (eps 0 in both) is
    blind to the scale. Bidirectional with a padded row: ssd.py flips the whole sequence,
    ours each row's real part; on real positions they agree."""
    mixer = build(causal=causal, norm_eps=0.0)
    mamba = registry.build("mamba2", dim=16, num_heads=2, max_len=64, causal=causal,
                           rngs=nnx.Rngs(params=1), chunk_size=4, state_size=8, norm_eps=0.0)
    for name in ("gate", "value", "key", "query", "dt", "out"):
        nnx.update(getattr(mamba, name), nnx.state(getattr(mixer, name)))
    mamba.norm_scale[...] = mixer.norm_scale[...]
    for direction in ("forward_scan",) + (() if causal else ("backward_scan",)):
        ours, theirs = getattr(mixer, direction), getattr(mamba, direction)
        ours.level_weight[...] = jnp.zeros_like(ours.level_weight[...])
        for name in ("conv", "conv_bias", "dt_bias", "a_log"):
            getattr(theirs, name)[...] = getattr(ours, name)[...]
        theirs.d[...] = ours.d[...] / math.log(2.0)
    x = normal(5, (2, 11, 16))
    mask = jnp.arange(11)[None] < jnp.array([[11], [7]])
    real = np.asarray(mask)
    y = np.asarray(run(mixer, "__call__", x, mask))
    assert_close(y[real], np.asarray(run(mamba, "__call__", x, mask))[real])
    # Not vacuous: with the levels' weights back, the two differ.
    mixer.forward_scan.level_weight[...] = jnp.ones_like(mixer.forward_scan.level_weight[...])
    assert not np.allclose(np.asarray(run(mixer, "__call__", x, mask))[real], y[real], **TOL)


@pytest.mark.parametrize("causal", [True, False])
def test_padded_rows_are_their_prefixes(causal):
    """Rows of 13 and 6 real tokens in one batch, padding arbitrary: the short row is what
    its unpadded prefix gives, so the backward hierarchy starts at each row's last real
    token (a whole-sequence flip would put 7 pads before it and shift its levels)."""
    mixer = build(causal=causal)
    x = normal(6, (2, 13, 16))
    mask = jnp.arange(13)[None] < jnp.array([[13], [6]])
    y = np.asarray(run(mixer, "__call__", jnp.where(mask[..., None], x, 4.0), mask))
    assert_close(y[1, :6], np.asarray(run(mixer, "__call__", x[1:, :6]))[0])


def test_prefill_and_steps_equal_the_parallel_form():
    """Prompts of 0, 1, 5 and 9 tokens (right-padded to 9), then every row steps on from
    its own position to 16; the cache holds bit_length(max_len - 1) slots."""
    mixer = build(causal=True)
    check_prefill_and_steps(mixer, run, normal(7, (4, 16, 16)), jnp.array([0, 1, 5, 9]), 9,
                            **TOL)
    for max_len, slots in ((16, 4), (17, 5), (4096, 12)):
        assert mixer.init_cache(2, max_len)["h"].shape == (2, slots, 2, 16, 8)


def test_bidirectional_form_does_not_decode():
    with pytest.raises(decoding.DecodingError, match="causal=False"):
        build(causal=False).init_cache(1, 8)


def test_parameters_and_initialisation_are_flas():
    """fla's LogLinearMamba2 as LogLinearMamba2Config builds it (use_bias False,
    use_conv_bias True, one group, D per head): in_proj D x (2I + 2N + H + 15 H) (ours: gate,
    value, key, query, dt, levels), conv (I + 2N) x 4 + bias, dt_bias, A_log, D (H each), L
    (H x 15), the norm's weight (I) and out_proj I x D. A_log = log(1..H), L = 1, D = 1."""
    dim, heads, n = 32, 4, 16
    inner, conv_dim = 2 * dim, 2 * dim + 2 * n
    mixer = registry.build("loglinear_mamba2", dim=dim, num_heads=heads, max_len=64,
                           causal=True, rngs=nnx.Rngs(params=0), state_size=n)
    fla = (dim * (inner + conv_dim + heads * (ll.NUM_LEVELS + 1)) + conv_dim * 4 + conv_dim
           + 3 * heads + heads * ll.NUM_LEVELS + inner + inner * dim)
    ours = sum(p.size for p in jax.tree.leaves(nnx.state(mixer, nnx.Param)))
    assert ours == fla
    direction = mixer.forward_scan
    assert_close(np.exp(direction.a_log[...]), np.arange(1, heads + 1), rtol=1e-6)
    assert (np.asarray(direction.level_weight[...]) == 1).all()
    assert (np.asarray(direction.d[...]) == 1).all()
    for param in (direction.a_log, direction.dt_bias, direction.d, direction.level_weight):
        assert param.get_metadata()["no_weight_decay"] is True


def test_refusals():
    with pytest.raises(ValueError, match="power of two"):
        build(causal=True, chunk_size=6)
    with pytest.raises(ValueError, match="16384.*num_levels=16"):
        registry.build("loglinear_mamba2", dim=16, num_heads=2, max_len=20000, causal=True,
                       rngs=nnx.Rngs(0), num_levels=15)
    with pytest.raises(ValueError, match="num_levels"):
        registry.build("loglinear_mamba2", dim=16, num_heads=2, max_len=1, causal=True,
                       rngs=nnx.Rngs(0), num_levels=0)


def test_more_levels_read_only_the_levels_a_length_needs():
    """Past fla's 15 levels (2^14 positions) the layer takes the levels max_len needs (16 for
    the text model's 16,384 tokens + CLS) and adds lambda columns that a shorter sequence
    never reads: the 15-level layer's weights in a 16-level layer (anything in the new
    column) give its outputs."""
    for max_len, levels in ((16384, 15), (16385, 16), (32768, 16), (32769, 17)):
        mixer = registry.build("loglinear_mamba2", dim=16, num_heads=2, max_len=max_len,
                               causal=True, rngs=nnx.Rngs(0))  # num_levels unset: what it needs
        assert mixer.forward_scan.level_weight[...].shape == (2, levels)
    small, big = build(causal=True), build(causal=True, seed=1, num_levels=16)
    flat_small = dict(nnx.to_flat_state(nnx.state(small, nnx.Param)))
    flat_big = dict(nnx.to_flat_state(nnx.state(big, nnx.Param)))
    assert flat_small.keys() == flat_big.keys()
    rng = np.random.default_rng(0)
    widened = 0
    for path, var in flat_big.items():
        w = np.asarray(flat_small[path][...])
        if w.shape != var[...].shape:  # levels' kernel D x (H * K) and L (H x K): K 15 -> 16
            w = w.reshape(w.shape[:-1] + (-1, ll.NUM_LEVELS))  # ... x H x K, as level_inputs
            w = np.concatenate([w, rng.normal(size=w.shape[:-1] + (1,))], -1)
            w = w.reshape(var[...].shape)
            widened += 1
        var[...] = jnp.asarray(w, var[...].dtype)
    assert widened == 2  # the levels' projection and the forward scan's L
    nnx.update(big, nnx.from_flat_state(flat_big))
    x = normal(8, (2, 37, 16))
    y = np.asarray(run(small, "__call__", x))
    assert_close(np.asarray(run(big, "__call__", x)), y)
    assert np.abs(y).max() > 0

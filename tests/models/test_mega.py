"""mega (models/mixers/mega.py) against references written from the paper's equations in
float64 numpy: the EMA as a step-by-step recurrence (causal and bidirectional) or, when
truncated, as the sum over its lags; the whole layer with attention computed query by
query over the keys of its chunk (block-diagonal), softmax, laplace and relu2, padding
in both directions; chunk_size >= L as full attention; decoding (prefill + steps) equal to
the parallel causal form; refusals; length 16384; the presets and weight decay."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import image, listops, pathx
from lra.training import optim
from models import decoding, registry
from tests.models.helpers import f64, normal, randomize_params

DIM, LEN, MAX_LEN = 6, 12, 16
SMALL = dict(ndim=3, z_dim=5, hidden_dim=7)
_erf = np.vectorize(math.erf)


def build(causal: bool, seed: int = 0, randomize: bool = True, max_len: int = MAX_LEN,
          **hparams):
    mixer = registry.build("mega", dim=DIM, num_heads=1, max_len=max_len, causal=causal,
                           rngs=nnx.Rngs(params=seed, dropout=seed), **{**SMALL, **hparams})
    if randomize:  # away from the init (zero biases, 0.02 projections): every term counts
        randomize_params(mixer, seed=seed + 1, scale=0.5)
    return mixer


def sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def silu(a):
    return a * sigmoid(a)


def ema_reference(mixer, x_LxD: np.ndarray, real_L: np.ndarray) -> np.ndarray:
    """silu(EMA(x) + omega x): per channel and dimension h_t = p beta x_t + q h_{t-1}, read
    by gamma / sqrt(N), a step at a time (the backward direction from the end, including
    t); with truncation T the sum over lags l < T written out instead."""
    ema = mixer.ema
    p = sigmoid(f64(ema.delta))
    q = 1 - p * sigmoid(f64(ema.alpha))
    pb, read = p * f64(ema.beta), f64(ema.gamma) / math.sqrt(ema.ndim)
    u = x_LxD * real_L[:, None]
    length = len(u)
    y = np.zeros_like(u)
    for k in range(len(p)):  # direction 0 forward, 1 backward
        order = range(length) if k == 0 else range(length - 1, -1, -1)
        if ema.truncation:
            for t in range(length):
                lags = range(min(ema.truncation, length))
                src = [t - l if k == 0 else t + l for l in lags]
                y[t] += sum(np.sum(read[k] * pb[k] * q[k] ** l, -1) * u[s]
                            for l, s in zip(lags, src) if 0 <= s < length)
        else:
            h = np.zeros_like(p[k])
            for t in order:
                h = pb[k] * u[t][:, None] + q[k] * h
                y[t] += np.sum(read[k] * h, axis=-1)
    return silu(y + f64(ema.omega) * x_LxD)


def layer_reference(mixer, x_LxD: np.ndarray, real_L: np.ndarray) -> np.ndarray:
    """The mixer's output u (h - x) from the paper's equations, one query at a time over
    the keys of its chunk (position // chunk_size) that are real (and not later)."""
    d, z, hd = mixer.dim, mixer.z_dim, mixer.hidden_dim
    lin = lambda layer, a: a @ f64(layer.kernel) + f64(layer.bias)
    base = lin(mixer.mx_proj, ema_reference(mixer, x_LxD, real_L))
    u = sigmoid(base[:, :d])
    zr = silu(base[:, d:d + z + hd])
    zz, r, hx = zr[:, :z], zr[:, z:], base[:, d + z + hd:]
    gamma, beta = f64(mixer.qk_gamma), f64(mixer.qk_beta)
    q, k = zz * gamma[0] + beta[0], zz * gamma[1] + beta[1]
    v = silu(lin(mixer.v_proj, x_LxD))
    bias, span = f64(mixer.rel_pos_bias), mixer.rel_span
    length = len(x_LxD)
    chunk = mixer.chunk_size if 0 < mixer.chunk_size < length else length
    attn = np.zeros((length, hd))
    for i in np.flatnonzero(real_L):  # padded queries' outputs are unspecified
        keys = [j for j in range(length) if j // chunk == i // chunk and real_L[j]
                and (j <= i or not mixer.causal)]
        qk = np.array([q[i] @ k[j] for j in keys])
        b = np.array([bias[span - 1 + j - i] for j in keys])
        if mixer.attention_activation == "softmax":
            a = qk / math.sqrt(z) + b
            w = np.exp(a - a.max())
            w /= w.sum()
        else:
            a = qk / len(keys) + b
            w = (0.5 * (1 + _erf((a - 0.707107) / (0.282095 * math.sqrt(2))))
                 if mixer.attention_activation == "laplace" else np.maximum(a, 0) ** 2)
        attn[i] = w @ v[keys]
    h = silu(hx + lin(mixer.h_proj, attn * r))
    return u * (h - x_LxD)


def padding(length: int = LEN, pad: int = 4):
    return jnp.arange(length)[None] < jnp.array([[length], [length - pad]])


@pytest.mark.parametrize("truncation", [0, 5])
@pytest.mark.parametrize("causal", [True, False])
def test_ema_equals_the_recurrence(causal, truncation):
    mixer = build(causal, truncation=truncation)
    x, mask = normal(0, (2, LEN, DIM)), padding()
    got = mixer.ema(x, mask)
    for b in range(2):
        want = ema_reference(mixer, f64(x[b]), np.asarray(mask[b]))
        np.testing.assert_allclose(got[b], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("chunk_size,activation", [(-1, "softmax"), (-1, "laplace"),
                                                   (5, "softmax"), (5, "laplace"),
                                                   (4, "relu2")])
def test_layer_equals_the_papers_equations(chunk_size, activation, causal):
    """Chunks of 5 do not divide 12: the last chunk is partial (its missing keys masked);
    row 1 has 4 padded positions at the end."""
    mixer = build(causal, chunk_size=chunk_size, attention_activation=activation,
                  truncation=7)
    x, mask = normal(1, (2, LEN, DIM)), padding()
    got = np.asarray(mixer(x, padding_mask=mask))
    for b in range(2):
        real = np.asarray(mask[b])
        want = layer_reference(mixer, f64(x[b]), real)
        np.testing.assert_allclose(got[b][real], want[real], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("activation", ["softmax", "laplace"])
def test_chunk_covering_the_input_is_full_attention(activation):
    full = build(False, chunk_size=-1, attention_activation=activation)
    x = normal(2, (2, MAX_LEN, DIM))
    for chunk in (MAX_LEN, 0):  # same bias table (2 max_len - 1) as chunk_size -1
        other = build(False, chunk_size=chunk, attention_activation=activation,
                      randomize=False)
        nnx.update(other, nnx.state(full, nnx.Param))
        np.testing.assert_allclose(other(x), full(x), rtol=1e-6, atol=1e-6)
    # chunk_size > L: one chunk of L, the same offsets in a larger table.
    big = build(False, chunk_size=40, attention_activation=activation, randomize=False)
    table = np.zeros(2 * 40 - 1, np.float32)
    table[40 - MAX_LEN:40 + MAX_LEN - 1] = np.asarray(full.rel_pos_bias[...])
    nnx.update(big, nnx.state(full, nnx.Param))
    big.rel_pos_bias.set_value(jnp.asarray(table))
    np.testing.assert_allclose(big(x), full(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
def test_padded_positions_reach_no_real_one(causal):
    mixer = build(causal, chunk_size=4)
    x, mask = normal(3, (2, LEN, DIM)), padding()
    moved = jnp.where(mask[..., None], x, 50.0 * normal(4, (2, LEN, DIM)))
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(mixer(moved, padding_mask=mask))[real],
                               np.asarray(mixer(x, padding_mask=mask))[real],
                               rtol=1e-6, atol=1e-6)


def decode_all(mixer, x_BxTxD, prompt_lens, max_len):
    """(prefill outputs, step outputs BxSxD, positions BxS) for right-padded prompts."""
    batch, total, _ = x_BxTxD.shape
    lens_B = jnp.asarray(prompt_lens)
    prompt = max(prompt_lens)
    graphdef, state = nnx.split(mixer)

    @jax.jit
    def run(state, x):
        m = nnx.merge(graphdef, state)
        cache = m.init_cache(batch, max_len)
        mask = jnp.arange(prompt)[None] < lens_B[:, None]
        y_prompt, cache = m.prefill(cache, x[:, :prompt], mask)
        at_BxS = lens_B[:, None] + jnp.arange(total - prompt)[None]
        fed_BxSxD = jnp.take_along_axis(x, jnp.clip(at_BxS, 0, total - 1)[..., None], 1)

        def body(cache, x_BxD):
            y, cache = nnx.merge(graphdef, state).step(cache, x_BxD)
            return cache, y

        _, ys = jax.lax.scan(body, cache, fed_BxSxD.transpose(1, 0, 2))
        return y_prompt, ys.transpose(1, 0, 2), at_BxS

    return run(state, x_BxTxD)


@pytest.mark.parametrize("hparams", [
    dict(chunk_size=-1, truncation=0, attention_activation="softmax"),
    dict(chunk_size=4, truncation=5, attention_activation="laplace"),  # both rings
    dict(chunk_size=3, truncation=0, attention_activation="relu2")])
def test_prefill_and_steps_equal_the_parallel_form(hparams):
    mixer = build(True, **hparams)
    total, lens = 14, (1, 6, 9)
    x = normal(5, (3, total, DIM))
    y_prompt, y_steps, at = decode_all(mixer, x, lens, MAX_LEN)
    want = np.asarray(mixer(x))
    cache = mixer.init_cache(3, MAX_LEN)
    assert cache["k"].shape[1] == (hparams["chunk_size"] if hparams["chunk_size"] > 0
                                   else MAX_LEN)
    assert ("ema_x" in cache) == (hparams["truncation"] > 0)
    for b, n in enumerate(lens):
        np.testing.assert_allclose(np.asarray(y_prompt)[b, :n], want[b, :n], rtol=1e-5,
                                   atol=1e-5)
        reached = np.asarray(at[b]) < total
        np.testing.assert_allclose(np.asarray(y_steps)[b][reached],
                                   want[b, np.asarray(at[b])[reached]], rtol=1e-5, atol=1e-5)


def test_refusals():
    for bad in (dict(ndim=0), dict(z_dim=0), dict(hidden_dim=-1), dict(truncation=-1),
                dict(attention_activation="gelu"), dict(dropout=1.0)):
        with pytest.raises(ValueError):
            build(False, randomize=False, **bad)
    with pytest.raises(ValueError, match="max_len"):  # the bias table covers max_len
        build(False, randomize=False)(normal(0, (1, MAX_LEN + 1, DIM)))
    with pytest.raises(decoding.DecodingError, match="causal=False"):
        build(False, randomize=False).init_cache(1, 8)
    with pytest.raises(registry.RegistryError, match="relative bias"):
        registry.check_rotary("mega")


def test_length_16384_is_finite():
    """Mega-chunk at Path-X's length, tiny widths; one EMA decay saturated (p alpha = 1 in
    float32, so q = 0): the floored log keeps its kernel finite."""
    length = 16384
    mixer = registry.build("mega", dim=4, num_heads=1, max_len=length, causal=False,
                           rngs=nnx.Rngs(0), ndim=2, z_dim=4, hidden_dim=4, chunk_size=64)
    mixer.ema.delta[...] = mixer.ema.delta[...].at[0, 0, 0].set(40.0)
    mixer.ema.alpha[...] = mixer.ema.alpha[...].at[0, 0, 0].set(40.0)
    graphdef, params, rest = nnx.split(mixer, nnx.Param, ...)
    x = normal(6, (1, length, 4))

    def loss(params, x):
        return jnp.sum(nnx.merge(graphdef, params, rest)(x) ** 2)

    value, grads = jax.jit(jax.value_and_grad(loss))(params, x)
    assert np.isfinite(float(value)) and float(value) > 0
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))


def test_presets_initialisation_and_weight_decay():
    c = listops.get_config("model=mega")
    assert dict(c.model_hparams) == dict(ndim=16, z_dim=64, hidden_dim=0, chunk_size=-1,
                                         truncation=1024, attention_activation="softmax")
    assert c.pos_emb == "none" and not dict(c.param_groups)
    assert image.get_config("model=mega").model_hparams.z_dim == 96
    assert pathx.get_config("model=mega").model_hparams.truncation == 4096
    # Mega's reset_parameters: q = 1 - sigmoid(delta) sigmoid(alpha) near 3/4, beta +-1.
    mixer = build(False, randomize=False, ndim=16, max_len=8)
    p = sigmoid(f64(mixer.ema.delta))
    q = 1 - p * sigmoid(f64(mixer.ema.alpha))
    assert 0.70 < np.median(q) < 0.80 and q.min() > 0.4 and q.max() < 0.95
    np.testing.assert_allclose(f64(mixer.ema.beta)[..., 0::2].mean(), 1.0, atol=0.01)
    np.testing.assert_allclose(f64(mixer.ema.beta)[..., 1::2].mean(), -1.0, atol=0.01)
    assert mixer.mx_proj.kernel[...].std() < 0.03 and mixer.hidden_dim == 7
    # fairseq's Adam has one group: every parameter, the EMA's too, is decayed.
    mask = optim.weight_decay_mask(nnx.state(mixer, nnx.Param))
    assert all(jax.tree.leaves(mask))

"""hyena (models/mixers/hyena.py) against Zoology's Hyena.

The conformance and decoding suites check padding, causality and the decoding contract
through the configs; here: the causal layer equals Zoology's Hyena.forward written in numpy
from the weights, with the long convolution as a direct sum (not an FFT); the
bidirectional form reads the future; short_filter_order=0 has no short convolution; the
parameters are Zoology's.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models import registry
from models.mixers import hyena

from tests.models.helpers import normal, randomize_params
from tests.models.test_delta import assert_close, run


def build(*, causal: bool, dim: int = 8, max_len: int = 24, **hparams):
    mixer = registry.build("hyena", dim=dim, num_heads=2, max_len=max_len, causal=causal,
                           rngs=nnx.Rngs(0), filter_order=8, **hparams)
    return randomize_params(mixer, seed=3, scale=0.4)


def zoology_forward(m, x):
    """Zoology's Hyena.forward (num_heads 1, num_blocks 1) in float64 numpy."""
    f64 = lambda p: np.asarray(p[...], np.float64)  # noqa: E731
    lin = lambda layer, h: h @ f64(layer.kernel) + (  # noqa: E731
        f64(layer.bias) if layer.bias is not None else 0.0)
    x = np.asarray(x, np.float64)
    b, length, d = x.shape
    u = lin(m.in_proj, x)  # b l 3d
    w, bias = f64(m.short_w), f64(m.short_b)
    taps = w.shape[1]
    pad = np.concatenate([np.zeros((b, taps - 1, 3 * d)), u], axis=1)
    uc = bias + sum(w[:, i] * pad[:, i:i + length] for i in range(taps))
    x1, x2, v = uc[..., :d], uc[..., d:2 * d], uc[..., 2 * d:]
    v = v * x1
    z = f64(m.z)[:length]
    freq = f64(m.freq)
    h = np.sin(freq * lin(m.filter_in, z))
    for layer in m.filter_hidden:
        h = np.sin(freq * lin(layer, h))
    k = lin(m.filter_out, h)  # L x d
    t = np.linspace(0, 1, m.max_len)[:length, None]
    k = k * np.exp(-t * np.abs(f64(m.deltas)))
    y = np.zeros_like(v)
    for i in range(length):  # y_i = sum_{j <= i} k_{i-j} v_j
        y[:, i] = np.einsum("jd,bjd->bd", k[i::-1], v[:, :i + 1])
    y = (y + v * f64(m.bias)) * x2
    return lin(m.out_proj, y)


def test_causal_layer_is_zoologys_forward():
    mixer = build(causal=True)
    x = normal(1, (2, 17, 8))
    assert_close(run(mixer, "__call__", x), zoology_forward(mixer, x), rtol=1e-4, atol=1e-5)


def test_bidirectional_reads_the_future():
    mixer = build(causal=False)
    x = normal(2, (1, 12, 8))
    y = np.asarray(run(mixer, "__call__", x))
    moved = np.asarray(run(mixer, "__call__", x.at[:, -1].add(1.0)))
    assert not np.allclose(moved[:, 0], y[:, 0])
    causal = build(causal=True)
    y = np.asarray(run(causal, "__call__", x))
    moved = np.asarray(run(causal, "__call__", x.at[:, -1].add(1.0)))
    # An FFT convolution: the future reaches the past only as float32 rounding.
    assert_close(moved[:, :-1], y[:, :-1], rtol=0, atol=1e-6)


def test_without_the_short_filter():
    mixer = build(causal=True, short_filter_order=0)
    names = ["/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(mixer, nnx.Param))]
    assert not any("short" in n for n in names)
    assert np.isfinite(np.asarray(run(mixer, "__call__", normal(3, (1, 9, 8))))).all()


def test_filter_window_and_positions_are_zoologys():
    """z = [t, cos, sin] of one band (f = 1e-4); deltas from log(1e-2)/1.5 to /0.3."""
    z = hyena.position_embedding(5)
    assert_close(z[:, 0], np.linspace(0, 1, 5), rtol=0, atol=1e-7)
    w = 2 * np.pi * np.arange(5) / 5
    assert_close(z[:, 1], np.cos(1e-4 * w), rtol=0, atol=1e-7)
    assert_close(z[:, 2], -np.sin(1e-4 * w), rtol=0, atol=1e-7)
    d = hyena.decay_deltas(4)
    assert_close(d[[0, -1]], [np.log(1e-2) / 1.5, np.log(1e-2) / 0.3], rtol=1e-6, atol=0)


def test_parameters_are_zoologys_hyena():
    """Hyena(d_model=D, l_max=L, filter_order=F): in_proj D x 3D + 3D, out_proj D x D + D,
    short_filter 3D x 3 + 3D, the filter's z L x 3 (trained), Linear(3, F), two Linear(F, F),
    Linear(F, D) bias-free, one Sin freq F, bias D; the decay deltas are a buffer."""
    dim, length, order = 8, 24, 8
    mixer = registry.build("hyena", dim=dim, num_heads=1, max_len=length, causal=True,
                           rngs=nnx.Rngs(0), filter_order=order)
    count = sum(p.size for p in jax.tree.leaves(nnx.state(mixer, nnx.Param)))
    want = (dim * 3 * dim + 3 * dim + dim * dim + dim + 3 * dim * 3 + 3 * dim + length * 3
            + 3 * order + order + 2 * (order * order + order) + order * dim + order + dim)
    assert count == want
    assert jnp.asarray(mixer.deltas[...]).shape == (dim,)

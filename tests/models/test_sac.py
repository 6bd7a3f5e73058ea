"""sac (Sparse Adaptive Connection) against an explicit float64 numpy re-implementation."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from tests.models.helpers import f64, normal, randomize_params

DIM, HEADS, BATCH, LEN, RANK = 16, 2, 2, 16, 4
TOL = dict(rtol=1e-5, atol=1e-5)
REAL = np.arange(LEN)[None, :] < np.array([[LEN], [LEN - 5]])


def build(causal: bool = False, **hparams) -> nnx.Module:
    model = registry.build("sac", dim=DIM, num_heads=HEADS, max_len=LEN, causal=causal,
                           rngs=nnx.Rngs(params=0, dropout=1), rank=RANK, **hparams)
    randomize_params(model, seed=3)
    return model


def linear(layer: nnx.Linear, x) -> np.ndarray:
    return f64(x) @ f64(layer.kernel) + f64(layer.bias)


def heads(y: np.ndarray, width: int) -> np.ndarray:
    b, l, _ = y.shape
    return y.reshape(b, l, HEADS, width).transpose(0, 2, 1, 3)


def reference(model, x, real_BxL, *, causal: bool, k: int) -> np.ndarray:
    x = f64(x)
    xn = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6)
    xn = xn * f64(model.edge_norm.scale) + f64(model.edge_norm.bias)
    src, dst = (heads(linear(layer, xn), RANK) for layer in (model.edge_src, model.edge_dst))
    q, k_, v = (heads(linear(getattr(model, n), x), DIM // HEADS)
                for n in ("query", "key", "value"))
    b, h, length, d = q.shape
    out = np.zeros_like(v)
    for bi in range(b):
        for hi in range(h):
            for i in range(length):
                seen = [j for j in range(length) if real_BxL[bi, j] and (not causal or j <= i)]
                scores = np.array([src[bi, hi, i] @ dst[bi, hi, j] for j in seen])
                chosen = [seen[t] for t in np.argsort(-scores, kind="stable")[:k]]
                logits = q[bi, hi, i] @ k_[bi, hi, chosen].T / math.sqrt(d)
                w = np.exp(logits - logits.max())
                out[bi, hi, i] = (w / w.sum()) @ v[bi, hi, chosen]
    merged = out.transpose(0, 2, 1, 3).reshape(b, length, h * d)
    return merged @ f64(model.out.kernel) + f64(model.out.bias)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("k", [3, 13])  # 13 > the 11 real keys of the padded example
def test_matches_reference(causal, k):
    model = build(causal=causal, k=k)
    x = normal(0, (BATCH, LEN, DIM))
    y = model(x, padding_mask=jnp.asarray(REAL), deterministic=True)
    expected = reference(model, x, REAL, causal=causal, k=k)
    np.testing.assert_allclose(np.asarray(y)[REAL], expected[REAL], **TOL)


def test_edge_predictor_chooses_the_keys():
    """Not vacuous: other predictor weights pick other keys, so the output changes."""
    model = build(k=3)
    x = normal(1, (1, LEN, DIM))
    y = np.asarray(model(x))
    model.edge_dst.kernel[...] = -model.edge_dst.kernel[...]
    assert not np.allclose(y, np.asarray(model(x)), **TOL)


def test_edge_predictor_gets_the_straight_through_gradient():
    """The predictor's parameters get finite, nonzero gradients through the gate, while
    the forward value stays plain attention over the chosen keys."""
    model = build(k=3, attention_dropout=0.0)
    x = normal(2, (1, LEN, DIM))
    w_out = normal(3, (1, LEN, DIM))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params):
        return jnp.sum(nnx.merge(graphdef, params, rest)(x) * w_out)

    grads = jax.grad(loss)(params)
    g_src = np.asarray(grads["edge_src"]["kernel"][...])
    g_dst = np.asarray(grads["edge_dst"]["kernel"][...])
    assert np.isfinite(g_src).all() and np.abs(g_src).max() > 0
    assert np.isfinite(g_dst).all() and np.abs(g_dst).max() > 0
    # Forward values do not move with the gate: the output equals the reference.
    np.testing.assert_allclose(np.asarray(model(x)),
                               reference(model, x, np.ones((1, LEN), bool), causal=False,
                                         k=3), **TOL)


def test_bad_hparams_are_refused():
    with pytest.raises(ValueError, match="positive"):
        build(k=0)

"""clustered / improved-clustered attention against an explicit float64 numpy re-implementation."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from tests.models.helpers import f64, normal, project_heads, randomize_params

DIM, HEADS, BATCH, LEN = 16, 2, 2, 16
TOL = dict(rtol=1e-5, atol=1e-5)


def build(**hparams) -> nnx.Module:
    model = registry.build("clustered", dim=DIM, num_heads=HEADS, max_len=LEN,
                           rngs=nnx.Rngs(params=0, dropout=1), **hparams)
    randomize_params(model, seed=3)
    return model


def heads(layer: nnx.Linear, x) -> np.ndarray:
    return project_heads(layer, x, HEADS)


def softmax(z: np.ndarray) -> np.ndarray:
    w = np.exp(z - z.max())
    return w / w.sum()


def kmeans(codes: np.ndarray, real: np.ndarray, clusters: int, iterations: int) -> np.ndarray:
    """Lloyd in Hamming space, one position and one cluster at a time."""
    n = len(real)
    centroids = codes[[real[(c * n) // clusters] for c in range(clusters)]].copy()

    def assign():
        return np.array([int(np.argmin([np.sum(code != c) for c in centroids]))
                         for code in codes])

    for _ in range(iterations):
        ids = assign()
        for c in range(clusters):
            members = [i for i in real if ids[i] == c]
            if members:
                centroids[c] = codes[members].mean(0) > 0.5
    return assign()


def reference(model, x, real_BxL, *, mode, clusters, iterations, topk, bits, seed=0):
    q, k, v = (heads(getattr(model, n), x) for n in ("query", "key", "value"))
    b, h, length, d = q.shape
    planes = f64(jax.random.normal(jax.random.key(seed), (d, bits)))
    out = np.zeros_like(v)
    for bi in range(b):
        real = np.flatnonzero(real_BxL[bi])
        for hi in range(h):
            ids = kmeans((q[bi, hi] @ planes > 0).astype(float), real, clusters, iterations)
            for i in real:
                members = [j for j in real if ids[j] == ids[i]]
                qc = q[bi, hi, members].mean(0)
                ac = softmax(qc @ k[bi, hi, real].T / math.sqrt(d))  # over real keys
                if mode == "clustered":
                    out[bi, hi, i] = ac @ v[bi, hi, real]
                    continue
                top = np.argsort(-ac, kind="stable")[:min(topk, len(real))]
                rest = np.setdiff1d(np.arange(len(real)), top)
                exact = softmax(q[bi, hi, i] @ k[bi, hi, real[top]].T / math.sqrt(d))
                out[bi, hi, i] = (ac[top].sum() * exact @ v[bi, hi, real[top]]
                                  + ac[rest] @ v[bi, hi, real[rest]])
    merged = out.transpose(0, 2, 1, 3).reshape(b, length, h * d)
    return merged @ f64(model.out.kernel) + f64(model.out.bias)


def dense_reference(model, x, real_BxL) -> np.ndarray:
    q, k, v = (heads(getattr(model, n), x) for n in ("query", "key", "value"))
    logits = np.einsum("bhqk,bhsk->bhqs", q, k) / math.sqrt(q.shape[-1])
    logits = np.where(real_BxL[:, None, None, :], logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    out = (w / w.sum(-1, keepdims=True)) @ v
    merged = out.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], -1)
    return merged @ f64(model.out.kernel) + f64(model.out.bias)


REAL = np.arange(LEN)[None, :] < np.array([[LEN], [LEN - 5]])


@pytest.mark.parametrize("mode", ["clustered", "improved"])
def test_matches_reference(mode):
    hp = dict(mode=mode, clusters=3, iterations=2, topk=3, bits=8)
    model = build(mode=mode, num_clusters=3, iterations=2, topk=3, bits=8)
    x = normal(0, (BATCH, LEN, DIM))
    y = model(x, padding_mask=jnp.asarray(REAL), deterministic=True)
    expected = reference(model, x, REAL, **hp)
    np.testing.assert_allclose(np.asarray(y)[REAL], expected[REAL], **TOL)


@pytest.mark.parametrize("num_clusters", [1, 3])
def test_improved_with_topk_length_is_dense_for_any_clusters(num_clusters):
    model = build(mode="improved", num_clusters=num_clusters, topk=LEN)
    x = normal(1, (BATCH, LEN, DIM))
    y = model(x, padding_mask=jnp.asarray(REAL), deterministic=True)
    np.testing.assert_allclose(np.asarray(y)[REAL], dense_reference(model, x, REAL)[REAL],
                               **TOL)


def test_one_cluster_is_the_mean_query_not_dense():
    model = build(mode="clustered", num_clusters=1)
    x = normal(2, (1, LEN, DIM))
    y = np.asarray(model(x, deterministic=True))[0]
    np.testing.assert_allclose(y, np.broadcast_to(y[:1], y.shape), **TOL)  # one output
    assert not np.allclose(y, dense_reference(model, x, np.ones((1, LEN), bool))[0], **TOL)


def test_training_draws_fresh_hyperplanes_eval_is_fixed():
    model = build(mode="clustered", num_clusters=3, bits=4, attention_dropout=0.0)
    x = normal(3, (BATCH, LEN, DIM))
    np.testing.assert_array_equal(np.asarray(model(x)), np.asarray(model(x)))
    outs = [np.asarray(model(x, deterministic=False)) for _ in range(3)]
    assert not all(np.allclose(outs[0], o) for o in outs[1:])


def test_bad_hparams_are_refused():
    with pytest.raises(ValueError, match="unknown mode"):
        build(mode="fast")
    with pytest.raises(ValueError, match="num_clusters"):
        build(num_clusters=0)


def test_padded_queries_do_not_move_centroids():
    """Many padded codes, all zeros or all ones, must not change the real clusters."""
    from models.attention.clustered import kmeans_hamming

    rng = np.random.default_rng(4)
    real = np.arange(16) < 6
    codes = rng.integers(0, 2, (1, 1, 16, 8)).astype(np.float32)
    ids = []
    for fill in (0.0, 1.0):
        filled = np.where(real[None, None, :, None], codes, fill)
        ids.append(np.asarray(kmeans_hamming(jnp.asarray(filled), jnp.asarray(real[None]),
                                             num_clusters=3, iterations=3))[0, 0, real])
    np.testing.assert_array_equal(ids[0], ids[1])
    np.testing.assert_array_equal(ids[0], kmeans(codes[0, 0], np.flatnonzero(real), 3, 3)[real])

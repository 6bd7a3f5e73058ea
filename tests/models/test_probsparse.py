"""informer (ProbSparse) against an explicit float64 numpy re-implementation."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from models.attention import probsparse
from tests.models.helpers import f64, normal, project_heads, randomize_params

DIM, HEADS, BATCH, MAX_LEN = 16, 2, 2, 16
TOL = dict(rtol=1e-5, atol=1e-5)


def build(causal: bool = False, **hparams) -> nnx.Module:
    model = registry.build("informer", dim=DIM, num_heads=HEADS, max_len=MAX_LEN,
                           causal=causal, rngs=nnx.Rngs(params=0, dropout=1), **hparams)
    randomize_params(model, seed=3)
    return model


def heads(layer: nnx.Linear, x) -> np.ndarray:
    return project_heads(layer, x, HEADS)


def reference(model, x, real_BxL, *, causal: bool, factor: int, seed: int = 0) -> np.ndarray:
    """The paper's recipe, one query at a time, with this module's documented choices."""
    q, k, v = (heads(getattr(model, n), x) for n in ("query", "key", "value"))
    b, h, length, d = q.shape
    u = max(1, min(length, factor * math.ceil(math.log(length))))
    draws = np.asarray(jax.random.uniform(jax.random.key(seed),
                                          (h, max(length, MAX_LEN), u)))[:, :length]
    out = np.zeros_like(v)
    for bi in range(b):
        real = np.flatnonzero(real_BxL[bi])
        for hi in range(h):
            m = np.full(length, -np.inf)
            for i in real:
                seen = real[real <= i] if causal else real
                picks = seen[np.minimum(np.floor(draws[hi, i] * len(seen)).astype(int),
                                        len(seen) - 1)]
                s = q[bi, hi, i] @ k[bi, hi, picks].T / math.sqrt(d)
                m[i] = s.max() - s.mean()
            for i in real:
                seen = real[real <= i] if causal else real
                if causal:
                    prior = real[real <= i]
                    active = np.sum(m[prior] > m[i]) < u
                else:
                    active = np.sum(m[real] > m[i]) + np.sum(
                        (m[real] == m[i]) & (real < i)) < u
                if active:
                    logits = q[bi, hi, i] @ k[bi, hi, seen].T / math.sqrt(d)
                    w = np.exp(logits - logits.max())
                    out[bi, hi, i] = (w / w.sum()) @ v[bi, hi, seen]
                else:
                    out[bi, hi, i] = v[bi, hi, seen].mean(0)
    merged = out.transpose(0, 2, 1, 3).reshape(b, length, h * d)
    return merged @ f64(model.out.kernel) + f64(model.out.bias)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("factor", [1, 2])
def test_matches_reference(causal, factor):
    model = build(causal=causal, factor=factor)
    x = normal(0, (BATCH, MAX_LEN, DIM))
    real = np.arange(MAX_LEN)[None, :] < np.array([[MAX_LEN], [MAX_LEN - 5]])
    y = model(x, padding_mask=jnp.asarray(real), deterministic=True)
    expected = reference(model, x, real, causal=causal, factor=factor)
    np.testing.assert_allclose(np.asarray(y)[real], expected[real], **TOL)


def test_lazy_queries_exist_and_get_mean_of_values():
    """Not vacuous: with u = 3 < L, most outputs are the shared mean(V)."""
    model = build(factor=1)
    x = normal(1, (1, MAX_LEN, DIM))
    y = np.asarray(model(x, deterministic=True))[0]
    v = heads(model.value, x)[0]
    lazy = v.mean(1).reshape(-1) @ f64(model.out.kernel) + f64(model.out.bias)
    is_lazy = np.all(np.isclose(y, lazy, **TOL), axis=-1)
    # Lazy in both heads: at least L - 2u queries, at most L - u.
    assert MAX_LEN - 6 <= is_lazy.sum() <= MAX_LEN - 3


def test_samples_only_keys_the_query_may_see():
    real = jnp.asarray(np.arange(12)[None, :] < np.array([[12], [7]]))
    for causal in (False, True):
        idx, count = probsparse.sample_keys(jax.random.key(5), real, num_heads=2,
                                            num_samples=64, causal=causal, min_rows=12)
        idx = np.asarray(idx)
        assert np.asarray(real)[np.arange(2)[:, None, None, None], idx].all()
        if causal:
            assert (idx <= np.arange(12)[None, None, :, None]).all()
        np.testing.assert_array_equal(np.asarray(count)[1], np.minimum(np.arange(1, 13), 7)
                                      if causal else 7)


def test_training_draws_fresh_samples_eval_is_fixed():
    model = build(factor=1, attention_dropout=0.0)
    x = normal(2, (BATCH, MAX_LEN, DIM))
    np.testing.assert_array_equal(np.asarray(model(x)), np.asarray(model(x)))
    outs = [np.asarray(model(x, deterministic=False)) for _ in range(3)]
    assert not all(np.allclose(outs[0], o) for o in outs[1:])


def test_num_selected():
    assert probsparse.num_selected(5, 1) == 1
    assert probsparse.num_selected(5, 16) == 15  # 5 * ceil(ln 16) = 5 * 3
    assert probsparse.num_selected(5, 8) == 8  # clamped to L: dense
    assert probsparse.num_selected(5, 2000) == 40

"""BP-Transformer: the mask against a loop construction of the node sets, the output
against an explicit NumPy softmax over [tokens; pooled span nodes]."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from models.attention import bp
from tests.models.helpers import normal

DIM, HEADS = 16, 2
TOL = dict(rtol=2e-5, atol=2e-5)


def loop_nodes(i: int, length: int, k: int, max_level: int,
               causal: bool) -> set[tuple[int, int]]:
    """(level, start) of every node query i attends to, walking outwards one node at a
    time: per level and side k nodes, plus one while the frontier is not aligned to
    the next level's node size (except at the top level)."""
    chosen = set()
    left, right = i, i + 1  # covered: [left, right)
    for lv in range(max_level + 1):
        size = 2 ** lv
        aligned = (lambda p: True) if lv == max_level else (lambda p: p % (2 * size) == 0)
        taken = 0
        while taken < k or not aligned(left):
            left -= size
            taken += 1
            if left >= 0:
                chosen.add((lv, left))
        taken = 0
        while taken < k or not aligned(right):
            if not causal and right < length:
                chosen.add((lv, right))
            right += size
            taken += 1
    chosen.add((0, i))  # the query itself
    return chosen


def loop_mask(length: int, k: int, max_level: int, causal: bool) -> np.ndarray:
    columns = [(0, j) for j in range(length)] + [
        (int(lv), int(a)) for lv, a, _ in bp.span_nodes(length, max_level)]
    index = {c: n for n, c in enumerate(columns)}
    mask = np.zeros((length, len(columns)), bool)
    for i in range(length):
        for node in loop_nodes(i, length, k, max_level, causal):
            mask[i, index[node]] = True
    return mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("length", [16, 13, 5])
def test_mask_matches_loop(length, k, causal):
    max_level = bp.num_levels(16)
    np.testing.assert_array_equal(bp.bp_mask(length, k, max_level, causal),
                                  loop_mask(length, k, max_level, causal))


def test_mask_tiles_without_overlap():
    # With enough levels every query covers each token exactly once (k=1, L=16).
    length, max_level = 16, bp.num_levels(16)
    mask = bp.bp_mask(length, 1, max_level)
    cover = np.concatenate([np.eye(length, dtype=int),
                            bp.pooling_matrix(length, max_level).astype(int)])
    np.testing.assert_array_equal(mask.astype(int) @ cover, np.ones((length, length), int))
    # ... and attends to O(k log L) keys, not L.
    assert mask.sum(1).max() <= 2 * (1 + 1) * (max_level + 1)


def reference(model: bp.BPAttention, x, real_BxL, causal: bool) -> np.ndarray:
    """Explicit float64 attention over [tokens; mean-pooled span nodes], node sets
    from the loop construction."""
    b, length, _ = x.shape
    q, k, v = (np.asarray(t, np.float64) for t in model.project_qkv(x))
    nodes = bp.span_nodes(length, model.max_level)
    allowed = loop_mask(length, model.k, model.max_level, causal)
    out = np.zeros(q.shape)
    for bi in range(b):
        real = np.asarray(real_BxL[bi])
        keys, values, key_ok = [k[bi]], [v[bi]], [real]
        for _, start, end in nodes:
            members = np.flatnonzero(real[start:min(end, length)]) + start
            ok = members.size > 0
            keys.append(k[bi][:, members].mean(1, keepdims=True) if ok
                        else np.zeros_like(k[bi][:, :1]))
            values.append(v[bi][:, members].mean(1, keepdims=True) if ok
                          else np.zeros_like(v[bi][:, :1]))
            key_ok.append(np.array([ok]))
        kk, vv = np.concatenate(keys, 1), np.concatenate(values, 1)
        ok_M = np.concatenate(key_ok)
        for i in range(length):
            cols = np.flatnonzero(allowed[i] & ok_M)
            s = q[bi, :, i:i + 1] @ kk[:, cols].transpose(0, 2, 1) / np.sqrt(q.shape[-1])
            w = np.exp(s - s.max(-1, keepdims=True))
            out[bi, :, i] = ((w / w.sum(-1, keepdims=True)) @ vv[:, cols])[:, 0]
    merged = out.transpose(0, 2, 1, 3).reshape(b, length, -1)
    return merged @ np.asarray(model.out.kernel[...]) + np.asarray(model.out.bias[...])


def build(causal: bool, k: int, max_len: int = 16) -> bp.BPAttention:
    return registry.build("bp_transformer", dim=DIM, num_heads=HEADS, max_len=max_len,
                          causal=causal, rngs=nnx.Rngs(params=0, dropout=1), k=k)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length,k", [(16, 1), (13, 2)])
def test_output_matches_numpy(length, k, causal):
    model = build(causal, k)
    x = normal(0, (2, length, DIM))
    real = jnp.arange(length)[None, :] < jnp.array([[length], [length - 6]])
    y = model(x, padding_mask=real, deterministic=True)
    ref = reference(model, x, real, causal)
    rows = np.asarray(real)  # padded queries too: they are still well defined
    np.testing.assert_allclose(np.asarray(y)[rows], ref[rows], **TOL)
    y_nomask = model(x, deterministic=True)
    np.testing.assert_allclose(np.asarray(y_nomask),
                               reference(model, x, jnp.ones((2, length), bool), causal),
                               **TOL)


def test_causal_ignores_future():
    model = build(True, 1)
    x = normal(0, (2, 16, DIM))
    for t in (0, 5, 9):
        future = (jnp.arange(16) > t)[None, :, None]
        y = model(x, deterministic=True)
        y_future = model(jnp.where(future, normal(1, x.shape), x), deterministic=True)
        np.testing.assert_allclose(np.asarray(y[:, :t + 1]), np.asarray(y_future[:, :t + 1]),
                                   **TOL)


def test_padding_invariance():
    model = build(False, 1)
    x = normal(0, (2, 16, DIM))
    real = jnp.arange(16)[None, :] < jnp.array([[16], [7]])
    x_changed = jnp.where(real[..., None], x, 5.0 * normal(1, x.shape))
    y = model(x, padding_mask=real, deterministic=True)
    y_changed = model(x_changed, padding_mask=real, deterministic=True)
    rows = np.asarray(real)
    np.testing.assert_allclose(np.asarray(y)[rows], np.asarray(y_changed)[rows], **TOL)


def test_bad_hparams_rejected():
    with pytest.raises(registry.RegistryError, match="k >= 1"):
        build(False, 0)

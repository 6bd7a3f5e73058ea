"""sinkhorn: outputs against explicit float64 loops (local + sorted, SortCut, causal,
softmax normalisation), Sinkhorn balancing, Gumbel noise, length checks."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from models.attention.sinkhorn import sinkhorn
from tests.models.helpers import f64, normal, randomize_params

DIM, HEADS, BATCH, MAX_LEN, BLOCK = 16, 2, 2, 16, 4
TOL = dict(rtol=1e-5, atol=1e-5)


def build(causal: bool = False, **hparams) -> nnx.Module:
    model = registry.build("sinkhorn", dim=DIM, num_heads=HEADS, max_len=MAX_LEN,
                           causal=causal, rngs=nnx.Rngs(params=0, dropout=1),
                           block_size=BLOCK, attention_dropout=0.0, **hparams)
    randomize_params(model, seed=5)
    return model


def linear(layer: nnx.Linear, x) -> np.ndarray:
    return f64(x) @ f64(layer.kernel) + f64(layer.bias)


def sort_matrix(model, x_NxSxD, real_NxS, *, causal, normalization, iters, tau) -> np.ndarray:
    """P per head (H x N x N) for one example, in plain (not log) space."""
    n = x_NxSxD.shape[0]
    counts = real_NxS.sum(-1)
    summary = (x_NxSxD * real_NxS[..., None]).sum(1) / np.maximum(counts, 1)[:, None]
    if causal:
        summary = np.concatenate([np.zeros_like(summary[:1]), summary[:-1]])
    r = linear(model.sort_logits, np.maximum(linear(model.sort_hidden, summary), 0))
    r = r.reshape(n, HEADS, -1)[..., :n].transpose(1, 0, 2) / tau
    block_real = counts > 0
    allowed = (np.outer(block_real, block_real) | np.diag(~block_real))
    if causal:
        allowed &= np.tril(np.ones((n, n), bool), k=-1)
    p = np.where(allowed, np.exp(r - r.max()), 0.0)
    if causal or normalization == "softmax":
        return p / np.maximum(p.sum(-1, keepdims=True), 1e-300)
    for _ in range(iters):
        p = p / p.sum(-1, keepdims=True)
        p = p / p.sum(-2, keepdims=True)
    return p


def reference(model, x, real_BxL, *, causal=False, normalization="sinkhorn", sortcut=None,
              iters=5, tau=0.75) -> np.ndarray:
    """Local + sorted block attention (or SortCut) by explicit loops over queries."""
    b, length, _ = x.shape
    n = -(-length // BLOCK)
    lp = n * BLOCK
    xp = np.zeros((b, lp, DIM))
    xp[:, :length] = f64(x)
    real = np.zeros((b, lp), bool)
    real[:, :length] = real_BxL
    kd = DIM // HEADS

    def heads(t):
        return t.reshape(b, lp, HEADS, kd).transpose(0, 2, 1, 3)

    q = heads(linear(model.query, xp))
    k = heads(linear(model.key, xp)) * real[:, None, :, None]
    v = heads(linear(model.value, xp)) * real[:, None, :, None]
    o = np.zeros_like(q)
    for bi in range(b):
        p = sort_matrix(model, xp[bi].reshape(n, BLOCK, DIM), real[bi].reshape(n, BLOCK),
                        causal=causal, normalization=normalization, iters=iters, tau=tau)
        for hi in range(HEADS):
            kb, vb = k[bi, hi].reshape(n, BLOCK, kd), v[bi, hi].reshape(n, BLOCK, kd)
            ks, vs = np.einsum("ij,jtk->itk", p[hi], kb), np.einsum("ij,jtk->itk", p[hi], vb)
            sorted_real = np.einsum("ij,jt->it", p[hi], real[bi].reshape(n, BLOCK)) > 0
            for pos in np.flatnonzero(real[bi, :length]):
                i, s = divmod(pos, BLOCK)
                if sortcut is not None:
                    keys = [ks[j, t] for j in range(min(sortcut, n)) for t in range(BLOCK)
                            if sorted_real[j, t]]
                    vals = [vs[j, t] for j in range(min(sortcut, n)) for t in range(BLOCK)
                            if sorted_real[j, t]]
                else:
                    local = [t for t in range(BLOCK) if real[bi, i * BLOCK + t]
                             and (not causal or t <= s)]
                    srt = [t for t in range(BLOCK) if sorted_real[i, t]]
                    keys = [kb[i, t] for t in local] + [ks[i, t] for t in srt]
                    vals = [vb[i, t] for t in local] + [vs[i, t] for t in srt]
                logits = np.array(keys) @ q[bi, hi, pos] / np.sqrt(kd)
                w = np.exp(logits - logits.max())
                o[bi, hi, pos] = (w / w.sum()) @ np.array(vals)
    merged = o.transpose(0, 2, 1, 3).reshape(b, lp, DIM)[:, :length]
    return linear(model.out, merged)


CASES = {
    "sinkhorn": dict(),
    "causal": dict(causal=True),
    "softmax": dict(normalization="softmax"),
    "sortcut": dict(sortcut=2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(case):
    kw = dict(CASES[case])
    causal = kw.pop("causal", False)
    model = build(causal=causal, **kw)
    length = 10  # 3 blocks of 4: the last padded internally
    x = normal(0, (BATCH, length, DIM))
    real = np.arange(length)[None, :] < np.array([[length], [6]])  # block 2 fully padded
    y = model(x, padding_mask=jnp.asarray(real), deterministic=True)
    expected = reference(model, x, real, causal=causal, **kw)
    np.testing.assert_allclose(np.asarray(y)[real], expected[real], **TOL)


def test_sinkhorn_balances_and_keeps_zeros():
    log_r = normal(1, (1, 2, 5, 5)) * 3.0
    allowed = jnp.asarray(np.random.default_rng(2).random((1, 2, 5, 5)) > 0.3) | jnp.eye(5,
                                                                                      dtype=bool)
    p = np.exp(np.asarray(sinkhorn(log_r, allowed, iters=100)))
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-4)
    np.testing.assert_allclose(p.sum(-2), 1.0, atol=1e-4)
    assert (p[~np.asarray(allowed)] == 0).all()
    p1 = np.exp(np.asarray(sinkhorn(log_r, allowed, iters=1)))
    assert np.abs(p1.sum(-1) - 1).max() > 1e-3  # one round leaves the rows unbalanced


def test_sort_matrix_is_causal():
    model = build(causal=True)
    x = normal(3, (1, 16, DIM))
    p = np.asarray(model.sort_matrix(x, jnp.ones((1, 16), bool), True))
    assert (np.triu(np.ones((4, 4)), k=0)[None, None].astype(bool) <= (p == 0)).all()
    np.testing.assert_allclose(p[0, :, 1:].sum(-1), 1.0, rtol=1e-5)  # rows with a past
    x2 = x.at[:, 12:].set(normal(4, (1, 4, DIM)))  # the last block leaves P unchanged
    np.testing.assert_array_equal(
        p, np.asarray(model.sort_matrix(x2, jnp.ones((1, 16), bool), True)))


def test_gumbel_noise_in_training_only():
    plain, noisy = build(), build(gumbel_noise=True)
    x = normal(5, (BATCH, 8, DIM))
    np.testing.assert_array_equal(np.asarray(noisy(x)), np.asarray(plain(x)))
    y1, y2 = noisy(x, deterministic=False), noisy(x, deterministic=False)
    assert not np.allclose(np.asarray(y1), np.asarray(y2))
    np.testing.assert_allclose(np.asarray(plain(x, deterministic=False)),
                               np.asarray(plain(x)), **TOL)  # attention_dropout=0


def test_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="exceeds max_len"):
        build()(normal(6, (1, MAX_LEN + 1, DIM)))
    with pytest.raises(ValueError, match="sortcut"):
        build(causal=True, sortcut=1)
    with pytest.raises(ValueError, match="normalization"):
        build(normalization="sofmax")

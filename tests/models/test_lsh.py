"""reformer (LSH attention) against an explicit O(L^2) float64 numpy reference."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from tests.models.helpers import normal

DIM, HEADS, BATCH = 16, 2, 2
TOL = dict(rtol=1e-5, atol=1e-5)


def build(causal=False, **hparams):
    model = registry.build("reformer", dim=DIM, num_heads=HEADS, max_len=32, causal=causal,
                           rngs=nnx.Rngs(params=0, dropout=1), **hparams)
    rng = np.random.default_rng(3)  # random biases too (they start at zero)
    state = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(
        lambda a: jnp.asarray(0.5 * rng.standard_normal(a.shape), a.dtype), state))
    return model


@nnx.jit(static_argnames="deterministic")
def apply(model, x, padding_mask=None, deterministic=True):
    # One compiled program instead of many eagerly compiled ops: faster on small CPUs.
    return model(x, padding_mask=padding_mask, deterministic=deterministic)


def linear(layer, x) -> np.ndarray:
    return (np.asarray(x, np.float64) @ np.asarray(layer.kernel[...], np.float64)
            + np.asarray(layer.bias[...], np.float64))


def heads(x_BxLxF) -> np.ndarray:
    b, l, f = x_BxLxF.shape
    return x_BxLxF.reshape(b, l, HEADS, f // HEADS).transpose(0, 2, 1, 3)


def reference(model, x, real_BxL, *, self_penalty=True) -> np.ndarray:
    """Per round: sort by (bucket, position), chunks, own + previous chunk (wrapping to the
    last chunk with a real token), -1e5 on self; rounds weighted by softmax of their lse."""
    n_buckets, rounds, c = model.n_buckets, model.n_hashes, model.chunk_len
    q = heads(linear(model.query, x))
    v = heads(linear(model.value, x))
    k = q / np.linalg.norm(q, axis=-1, keepdims=True)
    rot = np.asarray(model.rotations[...], np.float64)  # R x K x n_buckets/2
    batch, nh, length, kd = q.shape
    out = np.zeros_like(q)
    for b in range(batch):
        real = np.asarray(real_BxL[b])
        real_chunks = max(-(-int(real.sum()) // c), 1)
        for h in range(nh):
            outs, lses = [], []
            for r in range(rounds):
                if n_buckets == 1:
                    bucket = np.zeros(length, int)
                else:
                    xr = k[b, h] @ rot[r]
                    bucket = np.argmax(np.concatenate([xr, -xr], -1), -1)
                bucket = np.where(real, bucket, n_buckets)
                order = sorted(range(length), key=lambda i: (bucket[i], i))
                chunk = np.empty(length, int)
                chunk[order] = np.arange(length) // c
                prev = (chunk - 1) % real_chunks
                allowed = real[None, :] & ((chunk[None, :] == chunk[:, None])
                                           | (chunk[None, :] == prev[:, None]))
                logits = q[b, h] @ k[b, h].T / np.sqrt(kd)
                if self_penalty:
                    np.fill_diagonal(logits, -1e5)
                logits = np.where(allowed, logits, -np.inf)
                top = logits.max(-1, keepdims=True)
                lse = top[:, 0] + np.log(np.exp(logits - top).sum(-1))
                outs.append(np.exp(logits - lse[:, None]) @ v[b, h])
                lses.append(lse)
            lses = np.stack(lses)
            w = np.exp(lses - lses.max(0))
            w = w / w.sum(0)
            out[b, h] = sum(w[r][:, None] * outs[r] for r in range(rounds))
    merged = out.transpose(0, 2, 1, 3).reshape(batch, length, -1)
    return linear(model.out, merged)


def test_hash_is_argmax_of_rotated_keys():
    model = build(n_buckets=8, n_hashes=3, chunk_len=4)
    k = normal(0, (BATCH, HEADS, 12, DIM // HEADS))
    got = np.asarray(model.hash(k, model.rotations[...]))
    xr = np.einsum("bhlk,rkn->bhrln", np.asarray(k, np.float64),
                   np.asarray(model.rotations[...], np.float64))
    want = np.argmax(np.concatenate([xr, -xr], -1), -1)
    np.testing.assert_array_equal(got, want)
    assert got.shape == (BATCH, HEADS, 3, 12) and len(np.unique(got)) > 4


@pytest.mark.parametrize("length,real,chunk_len", [(12, (12, 7), 4), (14, (14, 9), 4),
                                                    (10, (10, 10), 3)])
def test_matches_reference(length, real, chunk_len):
    model = build(n_buckets=4, n_hashes=3, chunk_len=chunk_len)
    x = normal(1, (BATCH, length, DIM))
    real_BxL = np.arange(length)[None, :] < np.asarray(real)[:, None]
    y = apply(model, x, jnp.asarray(real_BxL))
    want = reference(model, x, real_BxL)
    np.testing.assert_allclose(np.asarray(y)[real_BxL], want[real_BxL], **TOL)


def test_one_bucket_one_chunk_is_dense_shared_qk_attention():
    """The dense limit with shared QK: softmax over all real keys j != i of q_i.k_j/|k_j|."""
    model = build(n_buckets=1, n_hashes=1, chunk_len=16)
    x = normal(2, (BATCH, 12, DIM))
    real_BxL = np.arange(12)[None, :] < np.array([[12], [8]])
    y = apply(model, x, jnp.asarray(real_BxL))
    q = heads(linear(model.query, x))
    k = q / np.linalg.norm(q, axis=-1, keepdims=True)
    logits = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    logits = np.where(np.eye(12, dtype=bool), -np.inf, logits)  # exp(-1e5) is 0 in f32
    logits = np.where(real_BxL[:, None, None, :], logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    o = np.einsum("bhqk,bhkd->bhqd", w / w.sum(-1, keepdims=True),
                  heads(linear(model.value, x)))
    want = linear(model.out, o.transpose(0, 2, 1, 3).reshape(BATCH, 12, -1))
    np.testing.assert_allclose(np.asarray(y)[real_BxL], want[real_BxL], **TOL)


def test_alone_a_token_attends_to_itself():
    """A sequence of one real token: its only key is itself, so its output is out(v)."""
    model = build(n_buckets=4, n_hashes=2, chunk_len=4)
    x = normal(3, (1, 8, DIM))
    real = jnp.arange(8)[None, :] < 1
    y = apply(model, x, real)
    want = linear(model.out, linear(model.value, x[:, :1]))
    np.testing.assert_allclose(np.asarray(y)[:, :1], want, **TOL)


def test_training_draws_new_rotations_eval_does_not():
    model = build(n_buckets=4, n_hashes=1, chunk_len=4, attention_dropout=0.0)
    x = normal(4, (BATCH, 16, DIM))
    y_eval = apply(model, x)
    np.testing.assert_array_equal(np.asarray(y_eval), np.asarray(apply(model, x)))
    y_train = apply(model, x, deterministic=False)
    assert not np.allclose(np.asarray(y_train), np.asarray(y_eval))
    # The rotations come from the rng stream: the next training call draws others.
    assert not np.allclose(np.asarray(apply(model, x, deterministic=False)),
                           np.asarray(y_train))


@pytest.mark.parametrize("hparams", [{"n_buckets": 3}, {"n_hashes": 0}, {"chunk_len": 0}])
def test_bad_hparams_are_refused(hparams):
    with pytest.raises(ValueError, match="reformer"):
        build(**hparams)


def causal_reference(model, x, real_BxL) -> np.ndarray:
    """The causal form by its rule, O(L^2): per round, query i sees the real j <= i of its
    bucket with at most chunk_len positions of that bucket in (j, i]; -1e5 on self."""
    c = model.chunk_len
    q = heads(linear(model.query, x))
    v = heads(linear(model.value, x))
    k = q / np.linalg.norm(q, axis=-1, keepdims=True)
    xr = np.einsum("bhlk,rkn->bhrln", k, np.asarray(model.rotations[...], np.float64))
    bucket = np.argmax(np.concatenate([xr, -xr], -1), -1)  # BxHxRxL
    batch, nh, length, kd = q.shape
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    out = np.zeros_like(q)
    for b in range(batch):
        real = np.asarray(real_BxL[b])
        for h in range(nh):
            outs, lses = [], []
            for r in range(model.n_hashes):
                same = (bucket[b, h, r][:, None] == bucket[b, h, r][None, :]) & real[None]
                # same-bucket real positions in (j, i]: row i, column j
                between = np.array([[np.sum(same[ii, jj + 1:ii + 1]) for jj in range(length)]
                                    for ii in range(length)])
                allowed = same & (j <= i) & (between <= c)
                logits = q[b, h] @ k[b, h].T / np.sqrt(kd)
                np.fill_diagonal(logits, -1e5)
                logits = np.where(allowed, logits, -np.inf)
                with np.errstate(invalid="ignore"):  # padded rows see nothing: nan
                    top = logits.max(-1, keepdims=True)
                    lse = top[:, 0] + np.log(np.exp(logits - top).sum(-1))
                outs.append(np.exp(logits - lse[:, None]) @ v[b, h])
                lses.append(lse)
            w = np.exp(np.stack(lses) - np.max(lses, 0))
            w = w / w.sum(0)
            out[b, h] = sum(w[r][:, None] * outs[r] for r in range(model.n_hashes))
    return linear(model.out, out.transpose(0, 2, 1, 3).reshape(batch, length, -1))


@pytest.mark.parametrize("length,real,chunk_len", [(16, (16, 11), 2), (13, (13, 6), 3)])
def test_causal_matches_its_rule(length, real, chunk_len):
    model = build(causal=True, n_buckets=4, n_hashes=2, chunk_len=chunk_len)
    x = normal(5, (BATCH, length, DIM))
    real_BxL = np.arange(length)[None, :] < np.asarray(real)[:, None]
    y = apply(model, x, jnp.asarray(real_BxL))
    want = causal_reference(model, x, real_BxL)
    np.testing.assert_allclose(np.asarray(y)[real_BxL], want[real_BxL], **TOL)
    # Not vacuous: some query has more same-bucket predecessors than the window holds.
    k = heads(linear(model.query, x))
    xr = np.einsum("bhlk,rkn->bhrln", k, np.asarray(model.rotations[...], np.float64))
    bucket = np.argmax(np.concatenate([xr, -xr], -1), -1)[0, 0, 0]
    assert max(np.bincount(bucket)) > chunk_len + 1


def test_causal_outputs_do_not_depend_on_later_tokens():
    """The fixed chunks of the paper's masking would fail this: later tokens move them."""
    model = build(causal=True, n_buckets=4, n_hashes=2, chunk_len=2)
    x = normal(6, (1, 24, DIM))
    later = x.at[:, 10:].set(normal(7, (1, 14, DIM)))
    y, y_later = apply(model, x), apply(model, later)
    np.testing.assert_allclose(np.asarray(y)[:, :10], np.asarray(y_later)[:, :10], **TOL)
    assert not np.allclose(np.asarray(y)[:, 10:], np.asarray(y_later)[:, 10:])

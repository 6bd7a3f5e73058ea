"""set_transformer (ISAB), luna, poolingformer against explicit float64 numpy formulas."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from models.encoder import Encoder
from tests.models.helpers import f64, normal, randomize_params

DIM, HEADS, BATCH = 8, 2, 2
TOL = dict(rtol=1e-5, atol=1e-5)


def randomize(model: nnx.Module, seed: int = 0) -> nnx.Module:
    """Every Param (zero biases included) redrawn at random."""
    randomize_params(model, seed=seed)
    return model


def build(name: str, **hparams):
    return randomize(registry.build(name, dim=DIM, num_heads=HEADS, max_len=16,
                                    rngs=nnx.Rngs(params=0, dropout=1), **hparams))


def lengths_mask(length: int, real: tuple[int, ...]) -> np.ndarray:
    return np.arange(length)[None, :] < np.asarray(real)[:, None]


def linear(layer: nnx.Linear, x) -> np.ndarray:
    return f64(x) @ f64(layer.kernel) + f64(layer.bias)


def layer_norm(norm: nnx.LayerNorm, x) -> np.ndarray:
    x = f64(x)
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-6) * f64(norm.scale) + f64(norm.bias)


def heads(x_BxLxF) -> np.ndarray:
    b, l, f = x_BxLxF.shape
    return x_BxLxF.reshape(b, l, HEADS, f // HEADS).transpose(0, 2, 1, 3)


def merge(o_BxHxLxK) -> np.ndarray:
    b, h, l, k = o_BxHxLxK.shape
    return o_BxHxLxK.transpose(0, 2, 1, 3).reshape(b, l, h * k)


def attention(attn, queries, context, key_mask_BxS=None) -> np.ndarray:
    """out(softmax(q k^T / sqrt(d)) v) with attn's projections, masked keys removed."""
    q, k, v = (heads(linear(p, a)) for p, a in ((attn.query, queries), (attn.key, context),
                                                 (attn.value, context)))
    logits = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    if key_mask_BxS is not None:
        logits = np.where(key_mask_BxS[:, None, None, :], logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return linear(attn.out, merge(np.einsum("bhqk,bhkd->bhqd", w / w.sum(-1, keepdims=True),
                                            v)))


def assert_close(a, b, **tol):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **(tol or TOL))


def test_set_transformer_matches_formula():
    model = build("set_transformer", num_inducing=3)
    x = normal(0, (BATCH, 7, DIM))
    real = lengths_mask(7, (7, 4))
    inducing = np.broadcast_to(f64(model.inducing), (BATCH, 3, DIM))
    g = layer_norm(model.induce_norm1,
                   inducing + attention(model.induce, inducing, x, key_mask_BxS=real))
    h = layer_norm(model.induce_norm2, g + np.maximum(linear(model.induce_ff, g), 0.0))
    expected = attention(model, x, h)
    assert_close(model(x, padding_mask=jnp.asarray(real)), expected)


def test_luna_matches_formula_with_and_without_carry():
    model = build("luna", packed_len=3)
    x = normal(1, (BATCH, 6, DIM))
    real = lengths_mask(6, (6, 2))

    def reference(p):
        packed = attention(model.pack, p, x, key_mask_BxS=real)
        return attention(model, x, packed), layer_norm(model.pack_norm, p + packed)

    initial_p = np.broadcast_to(f64(model.packed), (BATCH, 3, DIM))
    y, carry = model(x, padding_mask=jnp.asarray(real))
    expected_y, expected_carry = reference(initial_p)
    assert_close(y, expected_y)
    assert_close(carry, expected_carry)
    carried_p = normal(2, (BATCH, 3, DIM))
    y, carry = model(x, padding_mask=jnp.asarray(real), carry=carried_p)
    expected_y, expected_carry = reference(f64(carried_p))
    assert_close(y, expected_y)
    assert_close(carry, expected_carry)


def test_encoder_threads_luna_carry_between_layers():
    encoder = Encoder(vocab_size=10, max_len=6, model="luna", model_hparams={"packed_len": 3},
                      emb_dim=DIM, num_heads=HEADS, num_layers=2, mlp_dim=16,
                      rngs=nnx.Rngs(params=0, dropout=1))
    inputs = jnp.asarray(np.random.default_rng(3).integers(1, 10, (BATCH, 6)), jnp.int32)
    mask = jnp.asarray(lengths_mask(6, (6, 4)))
    encoded, _ = encoder(inputs, mask, deterministic=True)
    x = encoder.embeddings(inputs, deterministic=True)
    first, carry = encoder.stack.blocks[0](x, mask, deterministic=True)
    second, _ = encoder.stack.blocks[1](first, mask, deterministic=True, carry=carry)
    assert_close(encoded, encoder.norm(second))
    fresh, _ = encoder.stack.blocks[1](first, mask, deterministic=True)  # initial P, not carried
    assert not np.allclose(np.asarray(encoder.norm(fresh)), np.asarray(encoded), **TOL)


def poolingformer_reference(model, x, real_BxL) -> np.ndarray:
    """Per query, explicit key lists: a window of tokens, then pooled segments near i."""
    w1, w2, p, s = model.window1, model.window2, model.pool_size, model.pool_stride
    q, k, v = (heads(linear(m, x)) for m in (model.query, model.key, model.value))
    k2, v2 = heads(linear(model.key2, x)), heads(linear(model.value2, x))
    b, h, length, kd = q.shape

    def attend(query_H, keys_HxS, values_HxS):
        logits = np.einsum("hk,hsk->hs", query_H, keys_HxS) / np.sqrt(kd)
        w = np.exp(logits - logits.max(-1, keepdims=True))
        return np.einsum("hs,hsk->hk", w / w.sum(-1, keepdims=True), values_HxS)

    y = np.zeros_like(q)
    for bi in range(b):
        for i in np.flatnonzero(real_BxL[bi]):  # padded outputs are unspecified
            near = [j for j in range(length) if abs(i - j) <= w1 and real_BxL[bi, j]]
            y[bi, :, i] = attend(q[bi, :, i], k[bi][:, near], v[bi][:, near])
    q2 = heads(linear(model.query2, merge(y)))
    z = np.zeros_like(q)
    starts = range(0, max(length - p, 0) + s, s)  # segments cover every position
    assert max(starts) + p >= length
    for bi in range(b):
        keys, values = [], []
        for start in starts:
            seg = [j for j in range(start, min(start + p, length)) if real_BxL[bi, j]]
            keys.append(k2[bi][:, seg].mean(1) if seg else None)
            values.append(v2[bi][:, seg].mean(1) if seg else None)
        for i in np.flatnonzero(real_BxL[bi]):
            near = [n for n, start in enumerate(starts) if keys[n] is not None
                    and start <= i + w2 and start + p - 1 >= i - w2]
            z[bi, :, i] = attend(q2[bi, :, i], np.stack([keys[n] for n in near], 1),
                                 np.stack([values[n] for n in near], 1))
    return linear(model.out, merge(y + z))


@pytest.mark.parametrize("length,hparams", [
    (11, dict(window1=1, window2=3, pool_size=3, pool_stride=2)),
    (9, dict(window1=2, window2=2, pool_size=4, pool_stride=4)),
    (24, dict(window1=2, window2=3, pool_size=2, pool_stride=2)),  # windows << L
    (10, dict(window1=0, window2=1, pool_size=3, pool_stride=1)),  # overlapping segments
])
def test_poolingformer_matches_explicit_construction(length, hparams):
    model = build("poolingformer", **hparams)
    x = normal(4, (BATCH, length, DIM))
    real = lengths_mask(length, (length, length - 3))
    y = model(x, padding_mask=jnp.asarray(real))
    assert_close(np.asarray(y)[real], poolingformer_reference(model, x, real)[real])

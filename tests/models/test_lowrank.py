"""linformer, compressed, synthesizer against explicit float64 numpy formulas."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from tests.models.helpers import normal

DIM, HEADS, MAX_LEN, BATCH = 8, 2, 8, 2
TOL = dict(rtol=1e-5, atol=1e-5)


def randomize(model: nnx.Module, seed: int = 0, keep: tuple[str, ...] = ()) -> nnx.Module:
    """Every Param (zero biases included) redrawn at random, except those named in keep."""
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        if any(getattr(k, "key", getattr(k, "name", None)) in keep for k in path):
            return leaf
        return jnp.asarray(0.5 * rng.standard_normal(leaf.shape), leaf.dtype)

    nnx.update(model, jax.tree_util.tree_map_with_path(draw, nnx.state(model, nnx.Param)))
    return model


def build(name: str, *, causal: bool = False, max_len: int = MAX_LEN,
          keep: tuple[str, ...] = (), **hparams):
    model = registry.build(name, dim=DIM, num_heads=HEADS, max_len=max_len, causal=causal,
                           rngs=nnx.Rngs(params=0, dropout=1), **hparams)
    return randomize(model, keep=keep)


def lengths_mask(length: int, real: tuple[int, ...]) -> np.ndarray:
    return np.arange(length)[None, :] < np.asarray(real)[:, None]


def linear(layer: nnx.Linear, x) -> np.ndarray:
    out = np.asarray(x, np.float64) @ np.asarray(layer.kernel[...], np.float64)
    return out + np.asarray(layer.bias[...], np.float64) if layer.bias is not None else out


def heads(x_BxLxF) -> np.ndarray:
    b, l, f = x_BxLxF.shape
    return x_BxLxF.reshape(b, l, HEADS, f // HEADS).transpose(0, 2, 1, 3)


def merge(o_BxHxLxK) -> np.ndarray:
    b, h, l, k = o_BxHxLxK.shape
    return o_BxHxLxK.transpose(0, 2, 1, 3).reshape(b, l, h * k)


def softmax_attend(logits, v, mask) -> np.ndarray:
    """Masked softmax(logits) v in float64; masked entries removed, empty rows 0."""
    logits = np.where(mask, logits, -np.inf)
    top = np.max(np.where(mask, logits, -1e300), -1, keepdims=True)
    w = np.where(mask, np.exp(logits - top), 0.0)
    w = w / np.maximum(w.sum(-1, keepdims=True), 1e-300)
    return np.einsum("bhqs,bhsd->bhqd", w, v)


def qkv(model, x):
    return (heads(linear(model.query, x)), heads(linear(model.key, x)),
            heads(linear(model.value, x)))


def assert_close(a, b, **tol):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **(tol or TOL))


def test_too_long_inputs_are_refused():
    for name, hparams in (("linformer", {"k": 4}), ("synthesizer", {"mode": "random"})):
        model = build(name, **hparams)
        with pytest.raises(ValueError, match="exceeds max_len"):
            model(normal(0, (1, MAX_LEN + 1, DIM)))


# Linformer -------------------------------------------------------------------------

def linformer_reference(model, x, real_BxL, e, f) -> np.ndarray:
    q, k, v = qkv(model, x)
    keep = real_BxL[:, None, :, None]
    kp = np.einsum("pl,bhlk->bhpk", e, np.where(keep, k, 0.0))
    vp = np.einsum("pl,bhlk->bhpk", f, np.where(keep, v, 0.0))
    logits = np.einsum("bhqk,bhpk->bhqp", q, kp) / np.sqrt(q.shape[-1])
    slot_real = ((e != 0) | (f != 0)).astype(float) @ real_BxL.T.astype(float) > 0  # PxB
    return linear(model.out, merge(softmax_attend(logits, vp, slot_real.T[:, None, None, :])))


@pytest.mark.parametrize("share_kv", [False, True])
@pytest.mark.parametrize("length", [MAX_LEN, 5])
def test_linformer_matches_formula(share_kv, length):
    model = build("linformer", k=3, share_kv=share_kv)
    assert (model.proj_v is None) == share_kv
    x = normal(1, (BATCH, length, DIM))
    real = lengths_mask(length, (length, length - 2))
    e = np.asarray(model.proj_k[...], np.float64)[:, :length]  # first L columns
    f = e if share_kv else np.asarray(model.proj_v[...], np.float64)[:, :length]
    y = model(x, padding_mask=jnp.asarray(real))
    assert_close(y, linformer_reference(model, x, real, e, f))


def test_linformer_identity_is_dense_attention():
    model = build("linformer", k=MAX_LEN, projection_init="identity", keep=("proj_k", "proj_v"))
    x = normal(2, (BATCH, MAX_LEN, DIM))
    real = lengths_mask(MAX_LEN, (MAX_LEN, 3))
    q, k, v = qkv(model, x)
    logits = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    expected = linear(model.out, merge(softmax_attend(logits, v, real[:, None, None, :])))
    y = model(x, padding_mask=jnp.asarray(real))
    assert_close(np.asarray(y)[real], expected[real])
    with pytest.raises(ValueError, match="k == max_len"):
        build("linformer", k=4, projection_init="identity")


# Memory-compressed attention -------------------------------------------------------

def compressed_reference(model, x, real_BxL, causal: bool) -> np.ndarray:
    """Per query, an explicit list of keys: compressed blocks and (causal) own-block keys."""
    c = model.compression
    q, k, v = qkv(model, x)
    b, h, length, kd = q.shape
    n = -(-length // c)
    keep = real_BxL[:, None, :, None]
    k, v = np.where(keep, k, 0.0), np.where(keep, v, 0.0)

    def conv(seq_BxHxLxK, conv_layer):
        kernel = np.asarray(conv_layer.kernel[...], np.float64)  # c x F x F
        flat = merge(seq_BxHxLxK)
        blocks = [sum(flat[:, m * c + t] @ kernel[t] for t in range(c) if m * c + t < length)
                  + np.asarray(conv_layer.bias[...], np.float64) for m in range(n)]
        return heads(np.stack(blocks, axis=1))

    kc, vc = conv(k, model.key_conv), conv(v, model.value_conv)
    out = np.zeros_like(q)
    for bi in range(b):
        for i in range(length):
            keys, values = [], []
            for m in range(n):
                block = range(m * c, min((m + 1) * c, length))
                if any(real_BxL[bi, j] for j in block) and (not causal or m < i // c):
                    keys.append(kc[bi, :, m]), values.append(vc[bi, :, m])
            if causal:
                for j in range((i // c) * c, i + 1):
                    if real_BxL[bi, j]:
                        keys.append(k[bi, :, j]), values.append(v[bi, :, j])
            if not keys:
                continue
            ks, vs = np.stack(keys, 1), np.stack(values, 1)  # H x S x K
            logits = np.einsum("hk,hsk->hs", q[bi, :, i], ks) / np.sqrt(kd)
            w = np.exp(logits - logits.max(-1, keepdims=True))
            out[bi, :, i] = np.einsum("hs,hsk->hk", w / w.sum(-1, keepdims=True), vs)
    return linear(model.out, merge(out))


@pytest.mark.parametrize("causal", [False, True])
def test_compressed_matches_formula(causal):
    model = build("compressed", causal=causal, compression=3)
    length = 7  # not a multiple of c: the last block is partial
    x = normal(3, (BATCH, length, DIM))
    real = lengths_mask(length, (length, 4))
    y = model(x, padding_mask=jnp.asarray(real))
    expected = compressed_reference(model, x, real, causal)
    assert_close(np.asarray(y)[real], expected[real])


def test_compressed_identity_conv_is_dense_attention():
    model = build("compressed", causal=True, compression=1, conv_init="identity",
                  keep=("key_conv", "value_conv"))
    x = normal(4, (BATCH, 6, DIM))
    q, k, v = qkv(model, x)
    logits = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    expected = linear(model.out, merge(softmax_attend(logits, v, np.tril(np.ones((6, 6), bool)))))
    assert_close(model(x), expected)


# Synthesizer -----------------------------------------------------------------------

def synth_logits(model, mode: str, x) -> np.ndarray:
    length = x.shape[1]
    if mode == "dense":
        hidden = heads(np.maximum(linear(model.dense_hidden, x), 0.0))
        w2 = np.asarray(model.dense_logits[...], np.float64)[:, :, :length]
        b2 = np.asarray(model.dense_bias[...], np.float64)[:, None, :length]
        return np.einsum("bhlk,hkm->bhlm", hidden, w2) + b2
    if mode == "random":
        return np.asarray(model.random_logits[...], np.float64)[None, :, :length, :length]
    if mode == "factorized_random":
        a = np.asarray(model.factor_a[...], np.float64)[:, :length]
        b = np.asarray(model.factor_b[...], np.float64)[:, :, :length]
        return np.einsum("hlk,hkm->hlm", a, b)[None]
    q, k, _ = qkv(model, x)
    return np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])


@pytest.mark.parametrize("mode,mix,causal,length", [
    ("dense", None, False, MAX_LEN),
    ("random", None, True, 5),
    ("factorized_random", None, False, 5),
    ("dense+dot", None, True, MAX_LEN),  # learned mixture weights
    ("random+factorized_random+dot", (0.2, 0.5, 0.3), False, 6),
])
def test_synthesizer_matches_formula(mode, mix, causal, length):
    model = build("synthesizer", causal=causal, mode=mode, k=3, mix=mix)
    modes = mode.split("+")
    if model.mix_logits is not None:  # move the mixture off its equal-weights init
        model.mix_logits[...] = normal(9, (len(modes),))
        a = np.exp(np.asarray(model.mix_logits[...], np.float64))
        weights = a / a.sum()
    else:
        weights = np.asarray(mix if mix is not None else (1.0,))
    x = normal(5, (BATCH, length, DIM))
    real = lengths_mask(length, (length, length - 2))
    logits = sum(w * synth_logits(model, m, x) for w, m in zip(weights, modes))
    mask = real[:, None, None, :] & (np.tril(np.ones((length, length), bool)) if causal else True)
    v = heads(linear(model.value, x))
    expected = linear(model.out, merge(softmax_attend(logits, v, mask)))
    y = model(x, padding_mask=jnp.asarray(real))
    assert_close(y, expected)


def test_synthesizer_fixed_random_is_not_trained():
    def unrandomized(**hparams):  # same draws for the same params
        return registry.build("synthesizer", dim=DIM, num_heads=HEADS, max_len=MAX_LEN,
                              rngs=nnx.Rngs(params=0, dropout=1), mode="random", **hparams)

    trained, fixed = unrandomized(), unrandomized(fixed_random=True)
    assert isinstance(trained.random_logits, nnx.Param)
    assert not isinstance(fixed.random_logits, nnx.Param)
    assert "random_logits" not in nnx.state(fixed, nnx.Param)
    assert_close(fixed.random_logits[...], trained.random_logits[...], rtol=0, atol=0)
    x = normal(6, (1, 5, DIM))
    assert_close(fixed(x), trained(x))


def test_synthesizer_rejects_bad_modes():
    for mode in ("dense+dense", "conv", "random+"):
        with pytest.raises(ValueError, match="mode"):
            build("synthesizer", mode=mode)
    with pytest.raises(ValueError, match="one weight per mode"):
        build("synthesizer", mode="dense+dot", mix=(1.0,))

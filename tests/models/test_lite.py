"""lite (LSRA) against an explicit float64 numpy formula: attention on the first channel
half, GLU + softmax-normalised lightweight/dynamic convolution (loops over taps) on the
second."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from tests.models.helpers import normal, randomize_params

DIM, HEADS, MAX_LEN, BATCH = 16, 2, 8, 2
TOL = dict(rtol=1e-5, atol=1e-5)


def build(*, causal: bool = False, seed: int = 0, **hparams) -> nnx.Module:
    model = registry.build("lite", dim=DIM, num_heads=HEADS, max_len=MAX_LEN, causal=causal,
                           rngs=nnx.Rngs(params=0, dropout=1), **hparams)
    randomize_params(model, seed=seed)
    return model


def np64(x) -> np.ndarray:
    return np.asarray(x, np.float64)


def linear(layer, x: np.ndarray) -> np.ndarray:
    out = x @ np64(layer.kernel[...])
    return out if layer.bias is None else out + np64(layer.bias[...])


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def attention_reference(att, x: np.ndarray, mask, causal: bool) -> np.ndarray:
    batch, length, _ = x.shape
    q, k, v = linear(att.query, x), linear(att.key, x), linear(att.value, x)
    hd = q.shape[-1] // HEADS
    out = np.zeros_like(q)
    for b in range(batch):
        for h in range(HEADS):
            cols = slice(h * hd, (h + 1) * hd)
            logits = q[b, :, cols] @ k[b, :, cols].T / np.sqrt(hd)
            allowed = np.ones((length, length), bool)
            if mask is not None:
                allowed &= mask[b][None, :]
            if causal:
                allowed &= np.tril(np.ones((length, length), bool))
            out[b, :, cols] = softmax(np.where(allowed, logits, -np.inf)) @ v[b, :, cols]
    return linear(att.out, out)


def conv_reference(model, x: np.ndarray, mask, causal: bool, conv: str, glu: bool,
                   kernel_size: int) -> np.ndarray:
    batch, length, channels = x.shape
    h = linear(model.conv_in, x)
    if glu:
        h = h[..., :channels] / (1 + np.exp(-h[..., channels:]))
    if mask is not None:
        h = np.where(mask[..., None], h, 0.0)
    heads = model.conv_heads
    per_head = channels // heads
    left = kernel_size - 1 if causal else kernel_size // 2
    out = np.zeros_like(h)
    for b in range(batch):
        for i in range(length):
            if conv == "lightweight":
                w = softmax(np64(model.conv_weight[...]))  # heads x K
            else:
                w = softmax((h[b, i] @ np64(model.kernel_proj.kernel[...])).reshape(
                    heads, kernel_size))
            for k in range(kernel_size):
                j = i - left + k  # tap k reads position i - left + k
                if 0 <= j < length:
                    out[b, i] += np.repeat(w[:, k], per_head) * h[b, j]
    return linear(model.conv_out, out)


MASK = np.array([[True] * 8, [True] * 5 + [False] * 3])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("conv", ["lightweight", "dynamic"])
def test_matches_reference(conv, causal):
    kernel_size = 5
    model = build(causal=causal, conv=conv, kernel_size=kernel_size)
    x = normal(0, (BATCH, MAX_LEN, DIM))
    for mask in (None, MASK):
        y = np.asarray(model(x, padding_mask=None if mask is None else jnp.asarray(mask)))
        xa, xc = np64(x)[..., :DIM // 2], np64(x)[..., DIM // 2:]
        expected = np.concatenate(
            [attention_reference(model.attention, xa, mask, causal),
             conv_reference(model, xc, mask, causal, conv, True, kernel_size)], axis=-1)
        real = np.ones((BATCH, MAX_LEN), bool) if mask is None else mask
        np.testing.assert_allclose(y[real], expected[real], **TOL)


@pytest.mark.parametrize("kernel_size", [4, 11])  # even size; size > length
def test_conv_branch_sizes_without_glu(kernel_size):
    model = build(conv="lightweight", glu=False, kernel_size=kernel_size, conv_heads=4)
    x = normal(1, (BATCH, 6, DIM))
    y = np.asarray(model(x))[..., DIM // 2:]
    expected = conv_reference(model, np64(x)[..., DIM // 2:], None, False, "lightweight",
                              False, kernel_size)
    np.testing.assert_allclose(y, expected, **TOL)


def test_weight_dropout_touches_only_the_conv_branch():
    model = build(attention_dropout=0.0, weight_dropout=0.5)
    x = normal(2, (BATCH, MAX_LEN, DIM))
    y, y_drop = np.asarray(model(x)), np.asarray(model(x, deterministic=False))
    np.testing.assert_allclose(y_drop[..., :DIM // 2], y[..., :DIM // 2], **TOL)
    assert not np.allclose(y_drop[..., DIM // 2:], y[..., DIM // 2:], **TOL)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="conv_heads"):
        build(conv_heads=3)
    with pytest.raises(ValueError, match="unknown conv"):
        build(conv="depthwise")

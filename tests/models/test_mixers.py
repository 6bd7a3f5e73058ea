"""fnet, gmlp and mixer against explicit float64 numpy formulas (O(L^2), loops)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from tests.models.helpers import normal, randomize_params

DIM, MAX_LEN, BATCH = 8, 8, 2
TOL = dict(rtol=1e-5, atol=1e-5)


def randomize(model: nnx.Module, seed: int = 0) -> nnx.Module:
    """Every Param (ones and zeros included) redrawn at random."""
    randomize_params(model, seed=seed)
    return model


def build(name: str, *, causal: bool = False, random: bool = True, **hparams) -> nnx.Module:
    model = registry.build(name, dim=DIM, num_heads=2, max_len=MAX_LEN, causal=causal,
                           rngs=nnx.Rngs(params=0, dropout=1), **hparams)
    return randomize(model) if random else model


def np64(x) -> np.ndarray:
    return np.asarray(x, np.float64)


def gelu(x: np.ndarray) -> np.ndarray:  # jax.nn.gelu's default (tanh) form
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


# Masks: full, right-padded, and one with a hole inside the real span.
MASKS = {
    "none": None,
    "right": np.array([[True] * 8, [True] * 5 + [False] * 3]),
    "hole": np.array([[True] * 6 + [False] * 2, [True, True, False, True, True, False,
                                                 False, False]]),
}


# FNet ---------------------------------------------------------------------------------

def fnet_reference(x: np.ndarray, mask: np.ndarray | None, norm: str) -> np.ndarray:
    """Re(F_n X F_D) per example, n = last real position + 1, with DFT matrices."""
    batch, length, dim = x.shape
    out = np.zeros_like(x)
    for b in range(batch):
        real = np.ones(length, bool) if mask is None else mask[b]
        n = int(np.nonzero(real)[0].max()) + 1
        xb = np.where(real[:n, None], x[b, :n], 0.0)
        f_n = np.exp(-2j * np.pi * np.outer(np.arange(n), np.arange(n)) / n)
        f_d = np.exp(-2j * np.pi * np.outer(np.arange(dim), np.arange(dim)) / dim)
        scale = 1 / np.sqrt(n * dim) if norm == "ortho" else 1.0
        out[b, :n] = (f_n @ xb @ f_d).real * scale
    return out


@pytest.mark.parametrize("norm", ["ortho", "backward"])
@pytest.mark.parametrize("mask_kind", list(MASKS))
def test_fnet_matches_dft(mask_kind, norm):
    model = build("fnet", norm=norm)
    x, mask = normal(0, (BATCH, MAX_LEN, DIM)), MASKS[mask_kind]
    y = model(x, padding_mask=None if mask is None else jnp.asarray(mask))
    expected = fnet_reference(np64(x), mask, norm)
    real = np.ones((BATCH, MAX_LEN), bool) if mask is None else np.cumsum(
        mask[:, ::-1], axis=1)[:, ::-1] > 0  # positions up to the last real one
    scale = 1.0 if norm == "ortho" else np.sqrt(MAX_LEN * DIM)
    np.testing.assert_allclose(np.asarray(y)[real] / scale, expected[real] / scale, **TOL)


def test_fnet_long_input_uses_one_fft_size_for_all_lengths():
    # L = 37 (FFT size 128) with per-example lengths 37, 20: each is its own DFT.
    x = normal(1, (2, 37, DIM))
    mask = np.arange(37)[None] < np.array([[37], [20]])
    y = build("fnet")(x, padding_mask=jnp.asarray(mask))
    expected = fnet_reference(np64(x), mask, "ortho")
    np.testing.assert_allclose(np.asarray(y)[mask], expected[mask], **TOL)


def test_fnet_gain_scales_channels():
    model = build("fnet", gain=True)
    plain = build("fnet", random=False)
    x = normal(2, (BATCH, MAX_LEN, DIM))
    np.testing.assert_allclose(np.asarray(model(x)),
                               np.asarray(plain(x)) * np.asarray(model.gain[...]), **TOL)
    assert not nnx.state(plain, nnx.Param)  # the paper's sublayer has no parameters


def test_fnet_rejects_unknown_norm():
    with pytest.raises(ValueError, match="norm"):
        build("fnet", norm="forward")


# gMLP ---------------------------------------------------------------------------------

def layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-6) * scale + bias


def gmlp_reference(model, x: np.ndarray, mask: np.ndarray | None, causal: bool) -> np.ndarray:
    batch, length, _ = x.shape
    z = gelu(x @ np64(model.proj_in.kernel[...]) + np64(model.proj_in.bias[...]))
    half = z.shape[-1] // 2
    u, v = z[..., :half], z[..., half:]
    v = layer_norm(v, np64(model.gate_norm.scale[...]), np64(model.gate_norm.bias[...]))
    w, bias = np64(model.spatial_weight[...]), np64(model.spatial_bias[...])
    gate = np.zeros_like(v)
    for b in range(batch):
        for i in range(length):
            gate[b, i] = bias[i]
            for j in range(length):
                if (causal and j > i) or (mask is not None and not mask[b, j]):
                    continue
                gate[b, i] += w[i, j] * v[b, j]
    return (u * gate) @ np64(model.proj_out.kernel[...]) + np64(model.proj_out.bias[...])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "hole"])
def test_gmlp_matches_reference(mask_kind, causal):
    model = build("gmlp", causal=causal, ffn_dim=12)
    mask = MASKS[mask_kind]
    for length in (MAX_LEN, 5):  # shorter inputs use the top-left block of W
        x = normal(3, (BATCH, length, DIM))
        m = None if mask is None else mask[:, :length]
        y = model(x, padding_mask=None if m is None else jnp.asarray(m))
        expected = gmlp_reference(model, np64(x), m, causal)
        real = np.ones((BATCH, length), bool) if m is None else m
        np.testing.assert_allclose(np.asarray(y)[real], expected[real], **TOL)


def test_gmlp_init_and_length_limit():
    model = build("gmlp", random=False, ffn_dim=12, init_eps=1e-3)
    np.testing.assert_array_equal(np.asarray(model.spatial_bias[...]), 1.0)
    w = np.asarray(model.spatial_weight[...])
    assert np.abs(w).max() <= 1e-3 / MAX_LEN and np.abs(w).max() > 0
    assert model.proj_in.out_features == 12 and model.proj_out.in_features == 6
    assert build("gmlp", random=False).proj_in.out_features == 6 * DIM  # paper's default
    with pytest.raises(ValueError, match="max_len 8"):
        model(normal(0, (1, MAX_LEN + 1, DIM)))
    with pytest.raises(ValueError, match="even"):
        build("gmlp", ffn_dim=7)


# MLP-Mixer ----------------------------------------------------------------------------

def mixer_reference(model, x: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    batch, length, dim = x.shape
    w1, b1 = np64(model.w1[...]), np64(model.b1[...])
    w2, b2 = np64(model.w2[...]), np64(model.b2[...])
    out = np.zeros_like(x)
    for b in range(batch):
        for c in range(dim):
            col = x[b, :, c] if mask is None else np.where(mask[b], x[b, :, c], 0.0)
            hidden = gelu(sum(col[j] * w1[j] for j in range(length)) + b1)
            out[b, :, c] = [hidden @ w2[:, i] + b2[i] for i in range(length)]
    return out


@pytest.mark.parametrize("mask_kind", ["none", "hole"])
def test_mixer_matches_reference(mask_kind):
    model = build("mixer", token_dim=6)
    x, mask = normal(4, (BATCH, MAX_LEN, DIM)), MASKS[mask_kind]
    y = model(x, padding_mask=None if mask is None else jnp.asarray(mask))
    expected = mixer_reference(model, np64(x), mask)
    real = np.ones((BATCH, MAX_LEN), bool) if mask is None else mask
    np.testing.assert_allclose(np.asarray(y)[real], expected[real], **TOL)


def test_mixer_short_input_is_zero_padded_and_long_refused():
    model = build("mixer", token_dim=6)
    x = normal(5, (BATCH, 5, DIM))
    zero_padded = jnp.pad(x, ((0, 0), (0, MAX_LEN - 5), (0, 0)))
    np.testing.assert_allclose(np.asarray(model(x)),
                               np.asarray(model(zero_padded))[:, :5], **TOL)
    with pytest.raises(ValueError, match="max_len 8"):
        model(normal(0, (1, MAX_LEN + 1, DIM)))

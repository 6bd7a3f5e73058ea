"""block.short_conv (models/blocks.py ShortConv): Zoology's ShortConvolution before any
mixer (the BASED recipe, issue 43): its numbers, causality through a model, the settings
it refuses (decoding through it: tests/models/test_decoding.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.blocks import ShortConv
from models.encoder import Classifier
from models.stacks import resolve_block
from tests.models.helpers import apply


def test_equals_torch_conv1d_semantics():
    """nn.Conv1d(d, d, k, groups=d, padding=k-1)(x)[..., :L]: a cross-correlation over
    k - 1 zeros, then x, cut to the first L outputs."""
    conv = ShortConv(5, 3, rngs=nnx.Rngs(0))
    x = np.random.default_rng(0).normal(size=(2, 7, 5)).astype(np.float32)
    w, b = np.asarray(conv.weight[...]), np.asarray(conv.bias[...])
    padded = np.concatenate([np.zeros((2, 2, 5), np.float32), x], axis=1)
    want = np.stack([sum(padded[:, t + j] * w[j] for j in range(3)) for t in range(7)], 1) + b
    np.testing.assert_allclose(conv(jnp.asarray(x)), want, rtol=1e-5, atol=1e-6)
    assert np.all(np.abs(w) <= 1 / np.sqrt(3)) and np.all(np.abs(b) <= 1 / np.sqrt(3))


def _model(model="transformer", **block):
    return Classifier(vocab_size=11, num_classes=3, max_len=12, model=model, emb_dim=16,
                      num_heads=2, num_layers=2, qkv_dim=16, mlp_dim=32, dropout_rate=0.0,
                      attention_dropout_rate=0.0, pooling="MEAN", causal=True,
                      block=resolve_block(model, {"short_conv": 3, **block}),
                      rngs=nnx.Rngs(0))


@pytest.mark.parametrize("model", ["transformer", "linear"])
def test_causal_through_the_encoder(model):
    m = _model(model)
    x = jnp.array([[1, 2, 3, 4, 5, 6, 7, 8]])
    y = jnp.array([[1, 2, 3, 4, 9, 9, 9, 9]])
    a, _ = apply(m.encoder, x, None)  # jitted: one compile instead of one per op
    b, _ = apply(m.encoder, y, None)
    np.testing.assert_allclose(a[:, :4], b[:, :4], rtol=1e-5, atol=1e-5)
    assert not np.allclose(a[:, 4:], b[:, 4:])
    # the convolution is there: its parameters, and outputs differ from the model without
    plain = Classifier(vocab_size=11, num_classes=3, max_len=12, model=model, emb_dim=16,
                       num_heads=2, num_layers=2, qkv_dim=16, mlp_dim=32, dropout_rate=0.0,
                       attention_dropout_rate=0.0, pooling="MEAN", causal=True,
                       block=resolve_block(model), rngs=nnx.Rngs(0))
    n_conv = sum(p.size for p in jax.tree.leaves(nnx.state(m, nnx.Param)))
    n_plain = sum(p.size for p in jax.tree.leaves(nnx.state(plain, nnx.Param)))
    assert n_conv - n_plain == 2 * (3 * 16 + 16)


@pytest.mark.parametrize("value,match", [(-1, "kernel size"), (True, "kernel size"),
                                          (2.5, "kernel size")])
def test_refuses_bad_values(value, match):
    with pytest.raises(ValueError, match=match):
        resolve_block("transformer", {"short_conv": value})
    with pytest.raises(ValueError, match="segment_recurrent"):
        resolve_block("transformer_xl", {"short_conv": 3})

"""MAD's auto-encoder backbone (athms/mad-lab, mad/model/auto_encoder.py at 0f49a45), the
model of its compression task, around this lab's encoder: any registered mixer.

MAD: token embedding (no positions in the benchmark), the layers as pre-norm residuals,
`global_pool='last'`: the output at the last position (the compression token, which a
causal stack lets see the whole row) is the row's code; the decoder adds a fixed
sin-cos table (`posemb_sincos_1d`) to the code at every position and runs a
non-expanding MLP per position (RMSNorm, Linear, GELU, RMSNorm, Linear, GELU), then
RMSNorm and a Linear onto the vocabulary: logits for every position, trained to give the
row back (lra/tasks/mad.py compression: the labels are the inputs).

Here: the encoder is `Classifier`'s (embeddings with the config's positions, the config's
block and stack, a final LayerNorm), the code is the output at the last real position
(the mask's), and the decoder is MAD's. Returns float32 BxLxV logits, as TokenPredictor
does, so the sequence_labels objective (lra/training/objectives.py) trains it unchanged.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers
from models.encoder import Classifier


def sincos_positions(length: int, dim: int) -> jax.Array:
    """MAD's posemb_sincos_1d: [sin(p f_i) for i < d/2, cos(p f_i) for i < d/2], f_i =
    10000^(-i / (d/2 - 1)), a zero column when d is odd."""
    half = dim // 2
    freq = jnp.exp(jnp.arange(half, dtype=jnp.float32) * -(math.log(10000) / (half - 1)))
    angle = jnp.arange(length, dtype=jnp.float32)[:, None] * freq[None]
    table = jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=1)
    if dim % 2:
        table = jnp.concatenate([table, jnp.zeros((length, 1))], axis=1)
    return table


def _rms_norm(dim: int, rngs: nnx.Rngs) -> nnx.RMSNorm:
    return nnx.RMSNorm(dim, epsilon=1e-5, scale_init=layers.named(layers.ones, ("embed",)),
                       rngs=rngs)


class SequenceAutoEncoder(Classifier):
    """Encoder -> the last real position's output -> MAD's per-position MLP decoder ->
    vocabulary logits (BxLxV). Takes the Classifier's arguments (num_classes is not one)."""

    def __init__(self, *, vocab_size: int, emb_dim: int = 512, rngs: nnx.Rngs,
                 **kwargs: Any):
        if emb_dim < 4:
            raise ValueError(f"SequenceAutoEncoder: emb_dim={emb_dim} is too small for the "
                             "sin-cos table (at least 4)")
        super().__init__(vocab_size=vocab_size, num_classes=1, emb_dim=emb_dim, rngs=rngs,
                         **kwargs)
        del self.head  # the classifier head is not part of this model
        init = jax.nn.initializers.normal(0.02)  # MAD's _init_weights
        self.dec_norm1 = _rms_norm(emb_dim, rngs)
        self.dec_fc1 = layers.dense(emb_dim, emb_dim, ("embed", "mlp"), kernel_init=init,
                                    rngs=rngs)
        self.dec_norm2 = _rms_norm(emb_dim, rngs)
        self.dec_fc2 = layers.dense(emb_dim, emb_dim, ("mlp", "embed"), kernel_init=init,
                                    rngs=rngs)
        self.unembed_norm = _rms_norm(emb_dim, rngs)
        self.lm_head = layers.dense(emb_dim, vocab_size, ("embed", "vocab"), kernel_init=init,
                                    rngs=rngs)

    def __call__(self, inputs_BxL: jax.Array, mask_BxL: jax.Array | None = None, *,
                 deterministic: bool) -> jax.Array:
        encoded_BxLxD, _ = self.encoder(inputs_BxL, mask_BxL, deterministic=deterministic)
        if self.encoder.cls_token:
            encoded_BxLxD = encoded_BxLxD[:, 1:]
        batch, length, dim = encoded_BxLxD.shape
        if mask_BxL is None:
            last_B = jnp.full((batch,), length - 1)
        else:
            last_B = jnp.maximum(jnp.sum(mask_BxL.astype(jnp.int32), axis=1) - 1, 0)
        code_BxD = jnp.take_along_axis(encoded_BxLxD, last_B[:, None, None], axis=1)[:, 0]
        x = code_BxD[:, None, :] + sincos_positions(length, dim)[None].astype(code_BxD.dtype)
        x = jax.nn.gelu(self.dec_fc1(self.dec_norm1(x)), approximate=False)
        x = jax.nn.gelu(self.dec_fc2(self.dec_norm2(x)), approximate=False)
        return self.lm_head(self.unembed_norm(x)).astype(jnp.float32)

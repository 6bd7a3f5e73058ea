"""Dense multi-head softmax attention: the `transformer` mixer (registered in sparse.py,
beside its block-sparse forms) and the reference
that every other variant is tested against.

`dot_product_attention` and `make_attention_mask` are pure functions so that
variants can reuse them on their own (gathered, sorted, pooled) queries and keys.
`MultiHeadAttention` owns the `query`, `key`, `value` and `out` projections;
variants subclass or compose it and keep those names, so that the conformance
suite can copy weights between a variant and `transformer`.
"""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers

DropoutFn = Callable[[jax.Array], jax.Array]


def make_attention_mask(padding_mask_BxL: jax.Array | None, *, causal: bool, q_len: int,
                        kv_len: int) -> jax.Array | None:
    """Bool mask broadcastable to BxHxQxKv (True = attend); None if nothing is masked.

    Only keys are masked by padding: padded queries still see the real keys, so
    no row is empty unless a sequence has no real token, and padded outputs stay
    finite without influencing real positions. With causal, the queries are the
    last q_len of the kv_len positions (the same positions in self-attention).
    """
    mask = None
    if padding_mask_BxL is not None:
        if padding_mask_BxL.shape[-1] != kv_len:
            raise ValueError(
                f"padding mask has length {padding_mask_BxL.shape[-1]}, keys have {kv_len}")
        mask = padding_mask_BxL.astype(jnp.bool_)[:, None, None, :]
    if causal:
        q_pos_Qx1 = jnp.arange(q_len)[:, None] + (kv_len - q_len)
        k_pos_1xKv = jnp.arange(kv_len)[None, :]
        causal_1x1xQxKv = (k_pos_1xKv <= q_pos_Qx1)[None, None]
        mask = causal_1x1xQxKv if mask is None else mask & causal_1x1xQxKv
    return mask


def dot_product_attention(q_BxHxQxK: jax.Array, k_BxHxKvxK: jax.Array, v_BxHxKvxD: jax.Array,
                          *, mask: jax.Array | None = None,
                          dropout_fn: DropoutFn | None = None) -> jax.Array:
    """softmax(q k^T / sqrt(K)) v, softmax in float32; returns BxHxQxD in v's dtype.

    `mask` is bool, broadcastable to BxHxQxKv, True = attend. A query with no key
    to attend to gets output 0 (finite, with finite gradients).
    """
    scale = 1.0 / math.sqrt(q_BxHxQxK.shape[-1])
    logits_BxHxQxKv = jnp.einsum("bhqk,bhsk->bhqs", q_BxHxQxK, k_BxHxKvxK,
                                 preferred_element_type=jnp.float32) * scale
    return attend_logits(logits_BxHxQxKv, v_BxHxKvxD, mask=mask, dropout_fn=dropout_fn)


def attend_logits(logits_BxHxQxKv: jax.Array, v_BxHxKvxD: jax.Array, *,
                  mask: jax.Array | None = None,
                  dropout_fn: DropoutFn | None = None) -> jax.Array:
    """softmax(logits) v in float32, for variants whose logits are not q.k (synthesizer).

    Masking as in `dot_product_attention`: a query with no key to attend to gets 0.
    """
    logits_BxHxQxKv = logits_BxHxQxKv.astype(jnp.float32)
    if mask is not None:
        mask = mask.astype(jnp.bool_)
        # A finite fill keeps fully-masked rows uniform instead of NaN (-inf - -inf).
        logits_BxHxQxKv = jnp.where(mask, logits_BxHxQxKv, jnp.finfo(jnp.float32).min)
    weights_BxHxQxKv = jax.nn.softmax(logits_BxHxQxKv, axis=-1)
    if mask is not None:
        # Zeroes the uniform weights of fully-masked rows; where() also stops their gradient.
        weights_BxHxQxKv = jnp.where(mask, weights_BxHxQxKv, 0.0)
    if dropout_fn is not None:
        weights_BxHxQxKv = dropout_fn(weights_BxHxQxKv)
    return jnp.einsum("bhqs,bhsd->bhqd", weights_BxHxQxKv.astype(v_BxHxKvxD.dtype), v_BxHxKvxD)


class MultiHeadAttention(nnx.Module):
    """Multi-head self-attention with `query`/`key`/`value`/`out` projections.

    rotary=True (the encoder's pos_emb='rotary'): `project_qkv` rotates queries and keys
    by their positions, 0..L-1 over what the mixer sees (the CLS slot is 0), with
    `models.layers.rotary`, so every q.k product depends on the offset only. Variants
    that form queries or keys their own way call `rotate` on them.
    """

    def __init__(self, *, dim: int, num_heads: int, causal: bool = False,
                 qkv_dim: int | None = None, attention_dropout: float = 0.1,
                 use_bias: bool = True, rotary: bool = False, rngs: nnx.Rngs):
        qkv_dim = dim if qkv_dim is None else qkv_dim
        if num_heads <= 0 or qkv_dim <= 0 or qkv_dim % num_heads:
            raise ValueError(
                f"qkv_dim ({qkv_dim}) must be a positive multiple of num_heads ({num_heads})")
        if rotary and (qkv_dim // num_heads) % 2:
            raise ValueError(f"pos_emb='rotary' rotates pairs of a head's features; the head "
                             f"size qkv_dim / num_heads = {qkv_dim // num_heads} is odd")
        self.num_heads = num_heads
        self.head_dim = qkv_dim // num_heads
        self.causal = causal
        self.rotary = rotary
        proj = dict(use_bias=use_bias, rngs=rngs)
        self.query = layers.dense(dim, qkv_dim, ("embed", "qkv"), **proj)
        self.key = layers.dense(dim, qkv_dim, ("embed", "qkv"), **proj)
        self.value = layers.dense(dim, qkv_dim, ("embed", "qkv"), **proj)
        self.out = layers.dense(qkv_dim, dim, ("qkv", "embed"), **proj)
        self.attention_dropout = nnx.Dropout(attention_dropout, rngs=rngs)

    def split_heads(self, x_BxLxF: jax.Array) -> jax.Array:
        b, l, _ = x_BxLxF.shape
        x_BxLxHxK = x_BxLxF.reshape(b, l, self.num_heads, self.head_dim)
        x_BxLxHxK = layers.constrain(x_BxLxHxK, ("batch", None, "act_heads", None))
        return x_BxLxHxK.transpose(0, 2, 1, 3)

    def merge_heads(self, x_BxHxLxK: jax.Array) -> jax.Array:
        b, h, l, k = x_BxHxLxK.shape
        return x_BxHxLxK.transpose(0, 2, 1, 3).reshape(b, l, h * k)

    def rotate(self, x_BxHxLxK: jax.Array, positions: jax.Array | None = None) -> jax.Array:
        """Queries or keys rotated by their positions (default 0..L-1) under rotary;
        unchanged otherwise. `positions` broadcasts against BxHxL."""
        if not self.rotary:
            return x_BxHxLxK
        if positions is None:
            positions = jnp.arange(x_BxHxLxK.shape[2])
        return layers.rotary(x_BxHxLxK, positions)

    def project_qkv(self, x_BxLxD: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Query, key and value of `x`, each BxHxLxK (query and key rotated under rotary)."""
        return (self.rotate(self.split_heads(self.query(x_BxLxD))),
                self.rotate(self.split_heads(self.key(x_BxLxD))),
                self.split_heads(self.value(x_BxLxD)))

    def dropout_fn(self, deterministic: bool) -> DropoutFn | None:
        """Attention-weight dropout, or None when deterministic."""
        if deterministic:
            return None
        return lambda w: self.attention_dropout(w, deterministic=False)

    def dropout_seed(self) -> jax.Array:
        """An int32 seed from the attention-dropout stream (for kernels that hash their
        own keep mask); advances the stream like one dropout call."""
        rngs = self.attention_dropout.rngs
        if rngs is None:
            raise ValueError("attention dropout in training needs a 'dropout' rng stream")
        key = rngs[self.attention_dropout.rng_collection]() if isinstance(rngs, nnx.Rngs) \
            else rngs()
        return jax.random.bits(key, (), jnp.uint32).view(jnp.int32)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        q_BxHxLxK, k_BxHxLxK, v_BxHxLxK = self.project_qkv(x_BxLxD)
        seq_len = x_BxLxD.shape[1]
        mask = make_attention_mask(padding_mask, causal=self.causal, q_len=seq_len,
                                   kv_len=seq_len)
        o_BxHxLxK = dot_product_attention(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, mask=mask,
                                          dropout_fn=self.dropout_fn(deterministic))
        return self.out(self.merge_heads(o_BxHxLxK))

"""Transformer-XL relative attention (Dai et al. 2019): `transformer_xl` and `gtrxl`.

Query i attends to key j with the score (Dai et al., eq. in section 3.3)

    A_ij = q_i.k_j (a) + q_i.W_R R_{i-j} (b) + u.k_j (c) + v.W_R R_{i-j} (d),

scaled by 1/sqrt(head_dim), with u, v learned per head and R the sinusoidal
encoding of the relative distance i - j (Transformer-XL's [sin, cos] layout).

Segment recurrence lives in the stack (`models.stacks.SegmentRecurrentStack`):
the mixer has `Capabilities.takes_memory`, so a stack may call it with the
previous segment's (stop-gradient, normalised) layer inputs as `memory`; their
keys and values are prepended, and the queries sit at the last positions. Called
plainly (no memory), it is relative attention over its input, which is what the
conformance suite checks. With causal=False a query sees the memory (the past)
and its whole current segment, never later segments.

`gtrxl` (Parisotto et al. 2020) is the same mixer inside the gated block
(`models.blocks.GatedBlock`: identity-map reordering, GRU gates in place of the
residual sums) on the segment-recurrent stack, as GTrXL is built on TrXL.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers, registry
from models.attention.dense import MultiHeadAttention, attend_logits, make_attention_mask


def relative_encodings(distance_N: jax.Array, dim: int) -> jax.Array:
    """Transformer-XL's R: [sin(d w), cos(d w)], w_i = 1 / 10000^(2i / dim); NxD."""
    inv_freq_F = 1.0 / (10000.0 ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    angles_NxF = distance_N.astype(jnp.float32)[:, None] * inv_freq_F[None]
    return jnp.concatenate([jnp.sin(angles_NxF), jnp.cos(angles_NxF)], axis=-1)[:, :dim]


def _relative_shift(x_BxHxQxN: jax.Array, kv_len: int) -> jax.Array:
    """out[..., i, j] = x[..., i, j + (Q - 1 - i)]: column n of x holds distance
    kv_len - 1 - n, so this picks distance (kv_len - Q) + i - j for query i, key j.

    Transformer-XL's skew: pad one column, flatten the last two axes, and read the
    rows back at stride N, shifted by Q - 1 (no gather, so no scatter in backward).
    """
    *batch, q_len, n = x_BxHxQxN.shape
    flat_BxHxF = jnp.pad(x_BxHxQxN, [(0, 0)] * len(batch) + [(0, 0), (0, 1)]).reshape(
        *batch, q_len * (n + 1))
    rows_BxHxQxN = flat_BxHxF[..., q_len - 1:q_len - 1 + q_len * n].reshape(*batch, q_len, n)
    return rows_BxHxQxN[..., :kv_len]


class RelativeAttention(MultiHeadAttention):
    """Multi-head attention with relative positions and an optional memory prefix."""

    def __init__(self, *, dim: int, num_heads: int, causal: bool, qkv_dim: int | None,
                 attention_dropout: float, use_bias: bool, rngs: nnx.Rngs):
        super().__init__(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=use_bias, rngs=rngs)
        self.dim = dim
        qkv = self.num_heads * self.head_dim
        self.relative = layers.dense(dim, qkv, ("embed", "qkv"), use_bias=False, rngs=rngs)
        init = layers.normal(0.02)  # Transformer-XL's init_std for u and v
        self.content_bias = layers.param(init, ("heads", None), (num_heads, self.head_dim),
                                         rngs=rngs)  # u
        self.position_bias = layers.param(init, ("heads", None), (num_heads, self.head_dim),
                                          rngs=rngs)  # v

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True, memory: jax.Array | None = None,
                 memory_mask: jax.Array | None = None) -> jax.Array:
        """memory_BxMxD (keys/values only) comes before x; memory_mask_BxM, True = real."""
        batch, q_len, _ = x_BxLxD.shape
        kv_in_BxSxD, kv_mask_BxS = x_BxLxD, padding_mask
        if memory is not None:
            kv_in_BxSxD = jnp.concatenate([memory.astype(x_BxLxD.dtype), x_BxLxD], axis=1)
            if memory_mask is not None or padding_mask is not None:
                mem_len = memory.shape[1]
                mem_mask = layers.valid_mask(memory_mask, batch, mem_len)
                seg_mask = layers.valid_mask(padding_mask, batch, q_len)
                kv_mask_BxS = jnp.concatenate([mem_mask, seg_mask], axis=1)
        kv_len = kv_in_BxSxD.shape[1]
        q_BxHxQxK = self.split_heads(self.query(x_BxLxD))
        k_BxHxSxK = self.split_heads(self.key(kv_in_BxSxD))
        v_BxHxSxK = self.split_heads(self.value(kv_in_BxSxD))

        # Query i sits at kv position (kv_len - q_len) + i; its distance to key j is
        # in [-(q_len - 1), kv_len - 1]: encode each distinct distance once, descending.
        distance_N = jnp.arange(kv_len - 1, -q_len, -1)
        r_NxD = relative_encodings(distance_N, self.dim)
        r_HxNxK = self.split_heads(self.relative(r_NxD)[None])[0]

        u_1xHx1xK = self.content_bias[...][None, :, None, :]
        v_1xHx1xK = self.position_bias[...][None, :, None, :]
        content_BxHxQxS = jnp.einsum("bhqk,bhsk->bhqs", q_BxHxQxK + u_1xHx1xK, k_BxHxSxK,
                                     preferred_element_type=jnp.float32)  # (a) + (c)
        position_BxHxQxN = jnp.einsum("bhqk,hnk->bhqn", q_BxHxQxK + v_1xHx1xK, r_HxNxK,
                                      preferred_element_type=jnp.float32)  # (b) + (d)
        position_BxHxQxS = _relative_shift(position_BxHxQxN, kv_len)
        logits_BxHxQxS = (content_BxHxQxS + position_BxHxQxS) / math.sqrt(self.head_dim)

        mask = make_attention_mask(kv_mask_BxS, causal=self.causal, q_len=q_len,
                                   kv_len=kv_len)
        o_BxHxQxK = attend_logits(logits_BxHxQxS, v_BxHxSxK, mask=mask,
                                  dropout_fn=self.dropout_fn(deterministic))
        return self.out(self.merge_heads(o_BxHxQxK))


def build_relative(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
                   qkv_dim: int | None = None, attention_dropout: float = 0.1,
                   use_bias: bool = True) -> RelativeAttention:
    del max_len  # relative positions: any length
    return RelativeAttention(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                             attention_dropout=attention_dropout, use_bias=use_bias, rngs=rngs)


# Both refuse rotary: the R_(i-j) terms are their position encoding already.
_HAS_RELATIVE = ("its attention has relative positions of its own (Transformer-XL's "
                 "sinusoidal R_(i-j) terms and biases u, v), which rotary would duplicate")

registry.register("transformer_xl", build_relative, registry.Capabilities(
    description="Transformer-XL: relative-position attention, segment recurrence with memory",
    causal=True, padding=True, variable_length=True, takes_memory=True,
    block={"stack": "segment_recurrent"}, rotary_refusal=_HAS_RELATIVE, pos_emb="none",
    decode="segment_memory"))

registry.register("gtrxl", build_relative, registry.Capabilities(
    description="GTrXL: Transformer-XL attention in GRU-gated identity-map-reordered blocks",
    causal=True, padding=True, variable_length=True, takes_memory=True,
    block={"kind": "gated", "stack": "segment_recurrent"}, rotary_refusal=_HAS_RELATIVE,
    pos_emb="none", decode="segment_memory"))

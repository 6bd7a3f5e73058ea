"""Attention through a small memory: `set_transformer` (ISAB), `luna`, `poolingformer`.

- `set_transformer` (Lee et al. 2019, ISAB): m learned inducing points summarise
  the sequence, H = MAB(I, X), and every position reads them back, MAB(X, H).
- `luna` (Ma et al. 2021): a packed sequence P (length l) attends to X, X attends
  to the packed result, and the packed result is carried to the next layer (the
  mixer has `carries_state`; see `models.registry.Capabilities`).
- `poolingformer` (Zhang et al. 2021): a sliding window of exact attention,
  then a second level over mean-pooled keys/values within a larger window.

In each, the last MAB / attention is the mixer's output: the residual, LayerNorm
and feed-forward around it are the encoder block's.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers, registry
from models.attention.dense import DropoutFn, MultiHeadAttention, dot_product_attention


def cross_attention(attn: MultiHeadAttention, queries_BxQxD: jax.Array,
                    context_BxSxD: jax.Array, *, mask: jax.Array | None,
                    deterministic: bool) -> jax.Array:
    """attn's projections with queries from one sequence and keys/values from another."""
    o_BxHxQxK = dot_product_attention(
        attn.split_heads(attn.query(queries_BxQxD)), attn.split_heads(attn.key(context_BxSxD)),
        attn.split_heads(attn.value(context_BxSxD)), mask=mask,
        dropout_fn=attn.dropout_fn(deterministic))
    return attn.out(attn.merge_heads(o_BxHxQxK))


def _key_mask(padding_mask_BxL: jax.Array | None) -> jax.Array | None:
    """Bx1x1xL key mask for `dot_product_attention`, or None."""
    if padding_mask_BxL is None:
        return None
    return padding_mask_BxL.astype(jnp.bool_)[:, None, None, :]


# Set Transformer (ISAB) --------------------------------------------------------------

class InducedSetAttention(MultiHeadAttention):
    """ISAB(X) = MAB(X, H), H = MAB(I, X), with the paper's MAB (Lee et al. 2019):

        MAB(A, B) = LN(G + relu(G W + b)),  G = LN(A + Multihead(A, B, B)).

    The inner MAB (own `induce` attention, `induce_ff`, norms) is complete; of the
    outer one this mixer returns Multihead(X, H, H) (`query`/`key`/`value`/`out`),
    the encoder block adding its residual, LayerNorm and feed-forward. Padded keys
    are masked in the inner MAB, so the inducing summary sees real tokens only.
    """

    def __init__(self, *, dim: int, num_heads: int, num_inducing: int,
                 qkv_dim: int | None, attention_dropout: float, use_bias: bool,
                 rngs: nnx.Rngs):
        super().__init__(dim=dim, num_heads=num_heads, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=use_bias, rngs=rngs)
        if num_inducing <= 0:
            raise ValueError(f"set_transformer: num_inducing must be positive, got "
                             f"{num_inducing}")
        self.inducing = layers.param(layers.xavier_uniform, (None, "embed"),
                                     (num_inducing, dim), rngs=rngs)
        self.induce = MultiHeadAttention(dim=dim, num_heads=num_heads, qkv_dim=qkv_dim,
                                         attention_dropout=attention_dropout,
                                         use_bias=use_bias, rngs=rngs)
        self.induce_norm1 = layers.layer_norm(dim, rngs=rngs)
        self.induce_ff = layers.dense(dim, dim, (None, "embed"), rngs=rngs)
        self.induce_norm2 = layers.layer_norm(dim, rngs=rngs)

    def induced(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None,
                deterministic: bool) -> jax.Array:
        """H = MAB(I, X), BxMxD."""
        inducing_BxMxD = jnp.broadcast_to(self.inducing[...][None],
                                          (x_BxLxD.shape[0], *self.inducing.shape))
        g_BxMxD = self.induce_norm1(inducing_BxMxD + cross_attention(
            self.induce, inducing_BxMxD, x_BxLxD, mask=_key_mask(padding_mask),
            deterministic=deterministic))
        return self.induce_norm2(g_BxMxD + jax.nn.relu(self.induce_ff(g_BxMxD)))

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        h_BxMxD = self.induced(x_BxLxD, padding_mask, deterministic)
        return cross_attention(self, x_BxLxD, h_BxMxD, mask=None, deterministic=deterministic)


@registry.register("set_transformer", capabilities=registry.Capabilities(
    description="Set Transformer ISAB: m inducing points attend to x, x attends to them",
    causal=False, padding=True, variable_length=True, test_hparams={"num_inducing": 4},
    rotary_refusal="its products pair tokens with learned inducing points, which have no "
    "position, so a rotation could only mark absolute positions, not offsets"))
def build_set_transformer(*, dim: int, num_heads: int, max_len: int, causal: bool,
                          rngs: nnx.Rngs, num_inducing: int = 32, qkv_dim: int | None = None,
                          attention_dropout: float = 0.1,
                          use_bias: bool = True) -> InducedSetAttention:
    del max_len, causal  # any length; the registry refuses causal=True
    return InducedSetAttention(dim=dim, num_heads=num_heads, num_inducing=num_inducing,
                               qkv_dim=qkv_dim, attention_dropout=attention_dropout,
                               use_bias=use_bias, rngs=rngs)


# Luna -----------------------------------------------------------------------------

class Luna(MultiHeadAttention):
    """Linear Unified Nested Attention (Ma et al. 2021), non-causal form.

        pack:    P_packed = Attn(P, X)         (`pack` projections; padded keys masked)
        unpack:  Y = Attn(X, P_packed)          (`query`/`key`/`value`/`out`)
        carry:   P' = LN(P + P_packed)          (the paper's P_A, the next layer's P)

    P is the carry of the previous layer, or the learned initial P (l x dim) in
    the first. Called with `carry=` and returns (Y, P'); the block adds X's
    residual, LayerNorm and feed-forward around Y. Cost O(L l).
    """

    def __init__(self, *, dim: int, num_heads: int, packed_len: int, qkv_dim: int | None,
                 attention_dropout: float, use_bias: bool, rngs: nnx.Rngs):
        super().__init__(dim=dim, num_heads=num_heads, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=use_bias, rngs=rngs)
        if packed_len <= 0:
            raise ValueError(f"luna: packed_len must be positive, got {packed_len}")
        self.packed = layers.param(layers.normal(dim ** -0.5), (None, "embed"),
                                   (packed_len, dim), rngs=rngs)
        self.pack = MultiHeadAttention(dim=dim, num_heads=num_heads, qkv_dim=qkv_dim,
                                       attention_dropout=attention_dropout,
                                       use_bias=use_bias, rngs=rngs)
        self.pack_norm = layers.layer_norm(dim, rngs=rngs)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True,
                 carry: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        if carry is None:
            carry = jnp.broadcast_to(self.packed[...][None],
                                     (x_BxLxD.shape[0], *self.packed.shape))
        p_BxPxD = carry
        packed_BxPxD = cross_attention(self.pack, p_BxPxD, x_BxLxD,
                                       mask=_key_mask(padding_mask),
                                       deterministic=deterministic)
        y_BxLxD = cross_attention(self, x_BxLxD, packed_BxPxD, mask=None,
                                  deterministic=deterministic)
        return y_BxLxD, self.pack_norm(p_BxPxD + packed_BxPxD)


@registry.register("luna", capabilities=registry.Capabilities(
    description="Luna: a packed sequence attends to x, x attends to it; carried across layers",
    causal=False, padding=True, variable_length=True, carries_state=True,
    test_hparams={"packed_len": 4},
    rotary_refusal="its products pair tokens with the packed sequence, which has no "
    "position, so a rotation could only mark absolute positions, not offsets"))
def build_luna(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
               packed_len: int = 16, qkv_dim: int | None = None,
               attention_dropout: float = 0.1, use_bias: bool = True) -> Luna:
    del max_len, causal  # any length; the registry refuses causal=True
    return Luna(dim=dim, num_heads=num_heads, packed_len=packed_len, qkv_dim=qkv_dim,
                attention_dropout=attention_dropout, use_bias=use_bias, rngs=rngs)


# Poolingformer -----------------------------------------------------------------------

class Poolingformer(MultiHeadAttention):
    """Two-level attention (Zhang et al. 2021), windows given as one-sided radii.

    Level 1, exact sliding window: y_i = Attn(q_i, {k_j, v_j : |i - j| <= window1}).
    Level 2, pooled: keys/values from `key2`/`value2` are mean-pooled over
    segments s_n = [n * pool_stride, n * pool_stride + pool_size) (real positions
    only; a segment without one is masked); the query, from `query2` applied to
    the level-1 output, attends to the segments that overlap
    [i - window2, i + window2]: z_i = Attn(q2(y_i), pooled segments near i).
    Output: out(y + z). Queries go in blocks of max(window1, 1); each block
    gathers only the contiguous run of tokens (level 1) or segments (level 2) that
    any of its queries may see, so the cost is O(L (window1 + window2 / pool_stride)).

    rotary: level 1 rotates q, k by position; level 2 rotates q2 at i and each token's
    key2 at its own position before the segment mean, so q2_i . mean_j R_j k2_j is a
    mean of terms that each depend on the offset j - i only.
    """

    def __init__(self, *, dim: int, num_heads: int, window1: int, window2: int,
                 pool_size: int, pool_stride: int, qkv_dim: int | None,
                 attention_dropout: float, use_bias: bool, rotary: bool, rngs: nnx.Rngs):
        super().__init__(dim=dim, num_heads=num_heads, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=use_bias,
                         rotary=rotary, rngs=rngs)
        if min(window1, window2) < 0 or min(pool_size, pool_stride) < 1:
            raise ValueError("poolingformer: windows must be >= 0 and pool_size, pool_stride "
                             f">= 1; got {window1}, {window2}, {pool_size}, {pool_stride}")
        self.window1, self.window2 = window1, window2
        self.pool_size, self.pool_stride = pool_size, pool_stride
        features = self.num_heads * self.head_dim
        proj = dict(use_bias=use_bias, rngs=rngs)
        self.query2 = layers.dense(features, features, (None, "qkv"), **proj)
        self.key2 = layers.dense(dim, features, ("embed", "qkv"), **proj)
        self.value2 = layers.dense(dim, features, ("embed", "qkv"), **proj)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        batch, seq_len, _ = x_BxLxD.shape
        real_BxL = layers.valid_mask(padding_mask, batch, seq_len)
        dropout_fn = self.dropout_fn(deterministic)
        w1, w2 = self.window1, self.window2
        size, stride = self.pool_size, self.pool_stride
        block = max(w1, 1)

        q_BxHxLxK, k_BxHxLxK, v_BxHxLxK = self.project_qkv(x_BxLxD)
        y_BxHxLxK = _block_window_attention(
            q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, real_BxL, block=block, width=block + 2 * w1,
            first=lambda b0: b0 - w1, sees=lambda i, j: jnp.abs(i - j) <= w1,
            dropout_fn=dropout_fn)

        # Mean of each segment's real positions; a segment without one is masked.
        num_segments = -(-max(seq_len - size, 0) // stride) + 1
        member_NxP = jnp.arange(num_segments)[:, None] * stride + jnp.arange(size)[None, :]
        inside_NxP = member_NxP < seq_len
        member_NxP = jnp.minimum(member_NxP, seq_len - 1)
        weight_BxNxP = (real_BxL[:, member_NxP] & inside_NxP[None]).astype(x_BxLxD.dtype)
        count_BxN = weight_BxNxP.sum(-1)
        weight_BxNxP = weight_BxNxP / jnp.maximum(count_BxN, 1.0)[..., None]

        def pooled(proj: nnx.Linear, rotate: bool) -> jax.Array:
            full_BxHxLxK = self.split_heads(proj(x_BxLxD))
            if rotate:  # each token at its own position, before the mean
                full_BxHxLxK = self.rotate(full_BxHxLxK)
            return jnp.einsum("bnp,bhnpk->bhnk", weight_BxNxP,
                              full_BxHxLxK[:, :, member_NxP])

        # Segment m (start m * stride) is near i when it overlaps [i - w2, i + w2].
        q2_BxHxLxK = self.rotate(self.split_heads(self.query2(self.merge_heads(y_BxHxLxK))))
        z_BxHxLxK = _block_window_attention(
            q2_BxHxLxK, pooled(self.key2, True), pooled(self.value2, False), count_BxN > 0,
            block=block,
            width=(block + 2 * w2 + size - 2) // stride + 2,
            first=lambda b0: -((w2 + size - 1 - b0) // stride),
            sees=lambda i, m: (m * stride <= i + w2) & (m * stride + size - 1 >= i - w2),
            dropout_fn=dropout_fn)
        return self.out(self.merge_heads(y_BxHxLxK + z_BxHxLxK))


def _block_window_attention(q_BxHxLxK: jax.Array, k_BxHxSxK: jax.Array, v_BxHxSxK: jax.Array,
                            key_real_BxS: jax.Array, *, block: int, width: int,
                            first: Callable[[jax.Array], jax.Array],
                            sees: Callable[[jax.Array, jax.Array], jax.Array],
                            dropout_fn: DropoutFn | None) -> jax.Array:
    """Attention where query i sees key j iff sees(i, j), with every key a block of
    queries [b0, b0 + block) may see inside [first(b0), first(b0) + width).

    Each query block gathers its `width` keys (a window kept inside [0, S)), so the
    cost is O(L width) instead of O(L S).
    """
    batch, heads, seq_len, kd = q_BxHxLxK.shape
    num_keys = k_BxHxSxK.shape[2]
    width = min(width, num_keys)
    n = -(-seq_len // block)
    q_BxHxPxK = jnp.pad(q_BxHxLxK, ((0, 0), (0, 0), (0, n * block - seq_len), (0, 0)))
    start_N = jnp.clip(first(jnp.arange(n) * block), 0, num_keys - width)
    key_NxW = start_N[:, None] + jnp.arange(width)[None, :]
    query_NxC = (jnp.arange(n) * block)[:, None] + jnp.arange(block)[None, :]
    sees_NxCxW = sees(query_NxC[:, :, None], key_NxW[:, None, :])
    mask_BxNxCxW = sees_NxCxW[None] & key_real_BxS[:, key_NxW][:, :, None, :]
    mask = jnp.broadcast_to(mask_BxNxCxW[:, None], (batch, heads, n, block, width))

    def gather(t_BxHxSxK):
        return t_BxHxSxK[:, :, key_NxW].reshape(batch, heads * n, width, t_BxHxSxK.shape[-1])

    o = dot_product_attention(q_BxHxPxK.reshape(batch, heads * n, block, kd),
                              gather(k_BxHxSxK), gather(v_BxHxSxK),
                              mask=mask.reshape(batch, heads * n, block, width),
                              dropout_fn=dropout_fn)
    return o.reshape(batch, heads, n * block, -1)[:, :, :seq_len]


@registry.register("poolingformer", capabilities=registry.Capabilities(
    description="Poolingformer: sliding-window attention plus pooled attention in a wider window",
    causal=False, padding=True, variable_length=True, receptive_field="limited",
    test_hparams={"window1": 2, "window2": 6, "pool_size": 3, "pool_stride": 2},
    rotary=True))
def build_poolingformer(*, dim: int, num_heads: int, max_len: int, causal: bool,
                        rngs: nnx.Rngs, rotary: bool = False, window1: int = 64,
                        window2: int = 256, pool_size: int = 5, pool_stride: int = 4,
                        qkv_dim: int | None = None, attention_dropout: float = 0.1,
                        use_bias: bool = True) -> Poolingformer:
    del max_len, causal  # any length; the registry refuses causal=True
    return Poolingformer(dim=dim, num_heads=num_heads, window1=window1, window2=window2,
                         pool_size=pool_size, pool_stride=pool_stride, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=use_bias,
                         rotary=rotary, rngs=rngs)

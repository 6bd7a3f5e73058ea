"""Sparse Adaptive Connection: `sac` (Li et al. 2020).

The sequence is a graph whose edges a learned edge predictor chooses: it scores
every (query i, key j) pair with a low-rank bilinear form on LayerNorm'd inputs,

    e_ij = (W_src LN(x_i)) . (W_dst LN(x_j)) / sqrt(r)     (per head, rank r),

and each query keeps its k best-scoring keys. Attention is softmax(q . k / sqrt(d))
over those k keys only, so the attention itself costs O(L k d); the edge scores
cost O(L^2 r) with a small r (the predictor stays cheap, not sub-quadratic).

Training the predictor: top-k is not differentiable. The paper trains its (LSTM)
edge predictor with policy gradients; here a straight-through gate passes it the
task gradient instead: each selected edge's weight is multiplied by
1 + e_ij - stop_gradient(e_ij), which is exactly 1 in the forward pass (so the
output is plain attention over the chosen keys) and gives dLoss/de_ij =
dLoss/dw_ij * w_ij in the backward pass (edges whose contribution lowers the loss
are pushed up). With k >= L every key is chosen and the mixer is dense attention.

Causal: future keys are masked before the top-k. Padding: padded keys score -inf
and are never chosen over real ones; when k exceeds the keys a query may see, the
extra picks are masked out of the softmax.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers, registry
from models.attention.clustered import masked_softmax
from models.attention.dense import MultiHeadAttention, make_attention_mask

_LOWEST = jnp.finfo(jnp.float32).min


class SparseAdaptiveAttention(MultiHeadAttention):
    """Attention over the k keys per query chosen by a learned low-rank edge predictor."""

    def __init__(self, *, dim: int, num_heads: int, causal: bool, k: int, rank: int,
                 qkv_dim: int | None, attention_dropout: float, use_bias: bool,
                 rotary: bool, rngs: nnx.Rngs):
        super().__init__(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=use_bias,
                         rotary=rotary, rngs=rngs)
        if k <= 0 or rank <= 0:
            raise ValueError(f"sac: k and rank must be positive, got k={k}, rank={rank}")
        self.k, self.rank = k, rank
        self.edge_norm = layers.layer_norm(dim, rngs=rngs)
        self.edge_src = layers.dense(dim, num_heads * rank, ("embed", None), rngs=rngs)
        self.edge_dst = layers.dense(dim, num_heads * rank, ("embed", None), rngs=rngs)

    def edge_scores(self, x_BxLxD: jax.Array) -> jax.Array:
        """e_ij per head, BxHxLxL, float32."""
        b, length, _ = x_BxLxD.shape
        xn_BxLxD = self.edge_norm(x_BxLxD)

        def per_head(y_BxLxF):
            return y_BxLxF.reshape(b, length, self.num_heads, self.rank).transpose(0, 2, 1, 3)

        src_BxHxLxR = per_head(self.edge_src(xn_BxLxD))
        dst_BxHxLxR = per_head(self.edge_dst(xn_BxLxD))
        return jnp.einsum("bhir,bhjr->bhij", src_BxHxLxR, dst_BxHxLxR,
                          preferred_element_type=jnp.float32) / math.sqrt(self.rank)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        q_BxHxLxK, k_BxHxLxK, v_BxHxLxK = self.project_qkv(x_BxLxD)
        length = q_BxHxLxK.shape[2]
        e_BxHxLxL = self.edge_scores(x_BxLxD)
        allowed = make_attention_mask(padding_mask, causal=self.causal, q_len=length,
                                      kv_len=length)
        w_BxHxLxT, vt_BxHxLxTxK = chosen_edge_weights(
            q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, e_BxHxLxL,
            jnp.ones((), jnp.bool_) if allowed is None else allowed,
            num_edges=min(self.k, length))
        dropout_fn = self.dropout_fn(deterministic)
        if dropout_fn is not None:
            w_BxHxLxT = dropout_fn(w_BxHxLxT)
        o_BxHxLxK = jnp.einsum("bhlt,bhltk->bhlk", w_BxHxLxT.astype(vt_BxHxLxTxK.dtype),
                               vt_BxHxLxTxK)
        return self.out(self.merge_heads(o_BxHxLxK))


# Jitted so that eager calls (tests, notebooks) compile one program, not one per op.
@functools.partial(jax.jit, static_argnames=("num_edges",))
def chosen_edge_weights(q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array, v_BxHxLxK: jax.Array,
                        e_BxHxLxL: jax.Array, allowed: jax.Array, *,
                        num_edges: int) -> tuple[jax.Array, jax.Array]:
    """Each query's top-`num_edges` allowed keys by edge score: the (gated) attention
    weights over them, BxHxLxT, and their values, BxHxLxTxK."""
    b, h, _, head_dim = q_BxHxLxK.shape
    allowed_BxHxLxL = jnp.broadcast_to(allowed, e_BxHxLxL.shape)
    _, idx_BxHxLxT = jax.lax.top_k(
        jax.lax.stop_gradient(jnp.where(allowed_BxHxLxL, e_BxHxLxL, _LOWEST)), num_edges)
    chosen_ok_BxHxLxT = jnp.take_along_axis(allowed_BxHxLxL, idx_BxHxLxT, axis=-1)
    bi = jnp.arange(b)[:, None, None, None]
    hi = jnp.arange(h)[None, :, None, None]
    kt_BxHxLxTxK = k_BxHxLxK[bi, hi, idx_BxHxLxT]
    logits_BxHxLxT = jnp.einsum("bhlk,bhltk->bhlt", q_BxHxLxK, kt_BxHxLxTxK,
                                preferred_element_type=jnp.float32) / math.sqrt(head_dim)
    w_BxHxLxT = masked_softmax(logits_BxHxLxT, chosen_ok_BxHxLxT)
    # Straight-through gate: exactly 1 forward, the edge predictor's gradient backward.
    e_chosen_BxHxLxT = jnp.take_along_axis(e_BxHxLxL, idx_BxHxLxT, axis=-1)
    w_BxHxLxT = w_BxHxLxT * (1.0 + e_chosen_BxHxLxT - jax.lax.stop_gradient(e_chosen_BxHxLxT))
    return w_BxHxLxT, v_BxHxLxK[bi, hi, idx_BxHxLxT]


@registry.register("sac", capabilities=registry.Capabilities(
    description="SAC: a learned low-rank edge predictor picks k keys per query",
    causal=True, decode="recompute", padding=True, variable_length=True, receptive_field="limited",
    dense_equivalent={"k": 16}, test_hparams={"k": 4, "rank": 4}, rotary=True))
def build_sac(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
              rotary: bool = False, k: int = 32, rank: int = 16, qkv_dim: int | None = None,
              attention_dropout: float = 0.1, use_bias: bool = True) -> SparseAdaptiveAttention:
    """k: keys per query (edges per node); rank: width of the edge predictor per head."""
    del max_len  # any length
    return SparseAdaptiveAttention(dim=dim, num_heads=num_heads, causal=causal, k=k, rank=rank,
                                   qkv_dim=qkv_dim, attention_dropout=attention_dropout,
                                   use_bias=use_bias, rotary=rotary, rngs=rngs)

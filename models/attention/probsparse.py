"""ProbSparse self-attention: `informer` (Zhou et al. 2021).

Each query's sparsity measure is estimated on U = c * ceil(ln L) keys sampled at
random (with replacement, among the keys it may attend to):

    M(q_i) = max_j s_ij - mean_j s_ij,   s_ij = q_i . k_j / sqrt(d), j sampled.

The u = c * ceil(ln L) "active" queries with the largest M get exact softmax
attention; the "lazy" ones get the mean of V over the real positions. With u >= L
every query is active and the mixer is dense attention.

Deviations from the reference code (with reasons):
- the mean in M is over the sampled keys (the reference divides their sum by L);
- samples are drawn among real keys (causal: real keys <= i), so padding never
  enters M; the draws come from the mixer's own RNG stream in training and from
  a fixed `sample_seed` when deterministic (eval is reproducible);
- causal form: the reference picks the global top-u, which lets future tokens decide
  whether a past query is active, and gives lazy queries an unnormalised cumulative
  sum. Here query i is active when fewer than u queries j <= i have a larger M (its
  rank within its prefix, so only the past decides), active queries get exact causal
  attention and lazy ones the normalised cumulative mean of V. This form computes
  causal attention for every query (O(L^2)) and keeps it for the active ones: honest
  causality costs the saving of the non-causal form.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers, registry
from models.attention.dense import (MultiHeadAttention, dot_product_attention,
                                    make_attention_mask)

_LOWEST = jnp.finfo(jnp.float32).min


def num_selected(factor: int, length: int) -> int:
    """c * ceil(ln L), at least 1 and at most L (the reference's u and U_part)."""
    return max(1, min(length, factor * math.ceil(math.log(length)))) if length > 1 else 1


def sample_keys(key: jax.Array, valid_BxL: jax.Array, *, num_heads: int, num_samples: int,
                causal: bool, min_rows: int) -> tuple[jax.Array, jax.Array]:
    """Per query, `num_samples` key positions drawn uniformly among the keys it may see.

    Returns (indices BxHxLxS, count BxL: how many keys each query may see). The
    uniform draws have shape H x max(L, min_rows) x S, sliced to L rows, so they do
    not depend on the batch, and a prefix of a longer input draws the same samples.
    """
    b, length = valid_BxL.shape
    u_HxLxS = jax.random.uniform(key, (num_heads, max(length, min_rows), num_samples))
    u_HxLxS = u_HxLxS[:, :length]
    valid_i32_BxL = valid_BxL.astype(jnp.int32)
    if causal:
        count_BxL = jnp.cumsum(valid_i32_BxL, axis=-1)
    else:
        count_BxL = jnp.broadcast_to(valid_i32_BxL.sum(-1, keepdims=True), (b, length))
    # Real positions first, in order: the r-th real key is order[r], and the first
    # count[i] of them are exactly the keys query i may see (causal: those <= i).
    order_BxL = jnp.argsort(~valid_BxL, axis=-1, stable=True)
    count_Bx1xLx1 = count_BxL[:, None, :, None]
    rank_BxHxLxS = jnp.floor(u_HxLxS[None] * count_Bx1xLx1).astype(jnp.int32)
    rank_BxHxLxS = jnp.clip(rank_BxHxLxS, 0, jnp.maximum(count_Bx1xLx1 - 1, 0))
    idx_BxHxLxS = order_BxL[jnp.arange(b)[:, None, None, None], rank_BxHxLxS]
    return idx_BxHxLxS, count_BxL


def sparsity_measure(q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array, idx_BxHxLxS: jax.Array,
                     count_BxL: jax.Array) -> jax.Array:
    """M(q_i) = max - mean of q_i . k_j / sqrt(d) over the sampled keys; lowest where
    a query sees no key."""
    b, h = q_BxHxLxK.shape[:2]
    bi = jnp.arange(b)[:, None, None, None]
    hi = jnp.arange(h)[None, :, None, None]
    ks_BxHxLxSxK = k_BxHxLxK[bi, hi, idx_BxHxLxS]
    s_BxHxLxS = jnp.einsum("bhlk,bhlsk->bhls", q_BxHxLxK, ks_BxHxLxSxK,
                           preferred_element_type=jnp.float32) / math.sqrt(q_BxHxLxK.shape[-1])
    m_BxHxL = s_BxHxLxS.max(-1) - s_BxHxLxS.mean(-1)
    return jnp.where(count_BxL[:, None, :] > 0, m_BxHxL, _LOWEST)


# Jitted so that eager calls (tests, notebooks) compile one program, not one per op.
@functools.partial(jax.jit, static_argnames=("num_samples", "causal", "min_rows"))
def query_sparsity(q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array, valid_BxL: jax.Array,
                   key: jax.Array, *, num_samples: int, causal: bool,
                   min_rows: int) -> jax.Array:
    """M per query, BxHxL, without gradient; padded queries rank below every real one."""
    idx_BxHxLxS, count_BxL = sample_keys(key, valid_BxL, num_heads=q_BxHxLxK.shape[1],
                                         num_samples=num_samples, causal=causal,
                                         min_rows=min_rows)
    # No gradient through the choice of queries (top-u is piecewise constant anyway).
    m_BxHxL = jax.lax.stop_gradient(
        sparsity_measure(q_BxHxLxK, k_BxHxLxK, idx_BxHxLxS, count_BxL))
    return jnp.where(valid_BxL[:, None, :], m_BxHxL, _LOWEST)


class ProbSparseAttention(MultiHeadAttention):
    """Exact attention for the u queries with the largest sparsity measure; mean(V)
    (causal: the cumulative mean) for the rest."""

    def __init__(self, *, dim: int, num_heads: int, max_len: int, causal: bool, factor: int,
                 sample_seed: int, qkv_dim: int | None, attention_dropout: float,
                 use_bias: bool, rotary: bool, rngs: nnx.Rngs):
        super().__init__(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=use_bias,
                         rotary=rotary, rngs=rngs)
        if factor <= 0:
            raise ValueError(f"informer: factor must be positive, got {factor}")
        self.factor = factor
        self.max_len = max_len
        self.sample_seed = sample_seed
        self.sample_rngs = layers.noise_stream(rngs)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        q_BxHxLxK, k_BxHxLxK, v_BxHxLxK = self.project_qkv(x_BxLxD)
        b, _, length, _ = q_BxHxLxK.shape
        valid_BxL = layers.valid_mask(padding_mask, b, length)
        u = num_selected(self.factor, length)
        key = (jax.random.key(self.sample_seed) if deterministic else self.sample_rngs())
        m_BxHxL = query_sparsity(q_BxHxLxK, k_BxHxLxK, valid_BxL, key, num_samples=u,
                                 causal=self.causal, min_rows=self.max_len)
        dropout_fn = self.dropout_fn(deterministic)
        valid_f_Bx1xLx1 = valid_BxL[:, None, :, None].astype(v_BxHxLxK.dtype)
        if self.causal:
            o_BxHxLxK = self._causal(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, m_BxHxL, u,
                                     padding_mask, valid_f_Bx1xLx1, dropout_fn)
        else:
            o_BxHxLxK = self._bidirectional(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, m_BxHxL, u,
                                            padding_mask, valid_f_Bx1xLx1, dropout_fn)
        return self.out(self.merge_heads(o_BxHxLxK))

    def _bidirectional(self, q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, m_BxHxL, u, padding_mask,
                       valid_f_Bx1xLx1, dropout_fn) -> jax.Array:
        b, h, length, _ = q_BxHxLxK.shape
        _, top_BxHxU = jax.lax.top_k(m_BxHxL, u)
        bi = jnp.arange(b)[:, None, None]
        hi = jnp.arange(h)[None, :, None]
        mask = make_attention_mask(padding_mask, causal=False, q_len=u, kv_len=length)
        o_BxHxUxK = dot_product_attention(q_BxHxLxK[bi, hi, top_BxHxU], k_BxHxLxK, v_BxHxLxK,
                                          mask=mask, dropout_fn=dropout_fn)
        mean_BxHx1xK = ((v_BxHxLxK * valid_f_Bx1xLx1).sum(2, keepdims=True)
                        / jnp.maximum(valid_f_Bx1xLx1.sum(2, keepdims=True), 1.0))
        lazy_BxHxLxK = jnp.broadcast_to(mean_BxHx1xK, v_BxHxLxK.shape).astype(o_BxHxUxK.dtype)
        return lazy_BxHxLxK.at[bi, hi, top_BxHxU].set(o_BxHxUxK)

    def _causal(self, q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, m_BxHxL, u, padding_mask,
                valid_f_Bx1xLx1, dropout_fn) -> jax.Array:
        length = q_BxHxLxK.shape[2]
        # Rank of query i among queries j <= i: only the past decides whether i is active.
        before_LxL = jnp.tril(jnp.ones((length, length), jnp.bool_))
        larger_BxHxLxL = m_BxHxL[..., None, :] > m_BxHxL[..., :, None]  # [i, j]: M_j > M_i
        rank_BxHxL = jnp.sum(larger_BxHxLxL & before_LxL, axis=-1)
        active_BxHxLx1 = (rank_BxHxL < u)[..., None]
        mask = make_attention_mask(padding_mask, causal=True, q_len=length, kv_len=length)
        o_BxHxLxK = dot_product_attention(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, mask=mask,
                                          dropout_fn=dropout_fn)
        cum_v_BxHxLxK = jnp.cumsum(v_BxHxLxK * valid_f_Bx1xLx1, axis=2)
        cum_n_Bx1xLx1 = jnp.cumsum(valid_f_Bx1xLx1, axis=2)
        lazy_BxHxLxK = cum_v_BxHxLxK / jnp.maximum(cum_n_Bx1xLx1, 1.0)
        return jnp.where(active_BxHxLx1, o_BxHxLxK, lazy_BxHxLxK.astype(o_BxHxLxK.dtype))


@registry.register("informer", capabilities=registry.Capabilities(
    description="Informer ProbSparse: top-u queries by max-minus-mean score, the rest mean(V)",
    causal=True, decode="recompute", padding=True, variable_length=True,
    dense_equivalent={"factor": 16}, test_hparams={"factor": 1}, rotary=True))
def build_informer(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
                   rotary: bool = False,
                   factor: int = 5, sample_seed: int = 0, qkv_dim: int | None = None,
                   attention_dropout: float = 0.1, use_bias: bool = True) -> ProbSparseAttention:
    """factor: c in u = U = c * ceil(ln L); sample_seed: key samples when deterministic."""
    return ProbSparseAttention(dim=dim, num_heads=num_heads, max_len=max_len, causal=causal,
                               factor=factor, sample_seed=sample_seed, qkv_dim=qkv_dim,
                               attention_dropout=attention_dropout, use_bias=use_bias,
                               rotary=rotary, rngs=rngs)

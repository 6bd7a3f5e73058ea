"""Sparse Sinkhorn attention (Tay et al. 2020): attention to a learned sorting of blocks.

The sequence is cut into nb blocks of b tokens (padded internally to a multiple of b).
A sorting network reads each block's summary (the mean of its real tokens' inputs) and
gives, per head, logits R (nb x nb): two layers with a ReLU, as the paper's F_P, whose last
layer has ceil(max_len / b) outputs (shorter inputs use the first nb; longer ones are
refused). R / temperature (plus Gumbel noise in training if asked) is made doubly
stochastic by `sinkhorn_iters` rounds of row and column normalisation in log space, giving
a soft permutation P; the sorted keys and values of block i are sum_j P_ij K_j (and V_j).

Each query block attends, in one softmax, to its own block and to its sorted block (the
paper's local + sorted attention). SortCut (`sortcut=n`): every query attends to the first
n sorted blocks only.

`normalization="softmax"` replaces the Sinkhorn rounds with a row softmax: LRA's code does
this by default; the paper's Sinkhorn balancing is the default here.

Padding: padded keys and values are zeroed before sorting, so a sorted block never carries
padded content; a sorted slot all of whose sources are padded is masked; fully padded
blocks take no part in the sort (they map to themselves).

Causal: the sort matrix is masked to past blocks (block i draws from blocks j < i; its
own block is already the local one, under the causal mask), and row i of R is computed
from block i-1's summary, since block i's own summary would carry positions after its
queries. A lower-triangular doubly stochastic matrix can only be the identity, so no
balancing is both causal and non-trivial: the causal path normalises rows only (a row
softmax, each sorted block a convex combination of earlier blocks) and ignores
`sinkhorn_iters`. Block 0 has no past block: its queries attend locally only.

rotary: queries and keys are rotated by their positions before the sort, so a sorted
key keeps the rotation of the position it came from (its product with a query depends
on the two positions' offset), and the sort mixes such keys.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers, registry
from models.attention.dense import MultiHeadAttention, attend_logits, dot_product_attention

NORMALIZATIONS = ("sinkhorn", "softmax")
# Finite stand-in for log(0): exp() of it is exactly 0, and no inf - inf NaNs appear.
_LOG_ZERO = -1e9


def sinkhorn(log_r_BxHxNxN: jax.Array, allowed_BxHxNxN: jax.Array, *,
             iters: int) -> jax.Array:
    """log of a (nearly) doubly stochastic matrix from logits by Sinkhorn balancing.

    Only `allowed` entries may be non-zero (every row and column needs one). Each round
    normalises rows, then columns (Mena et al.'s order), in log space.
    """
    log_p = jnp.where(allowed_BxHxNxN, log_r_BxHxNxN, _LOG_ZERO)
    for _ in range(iters):
        log_p = jnp.where(allowed_BxHxNxN,
                          log_p - jax.nn.logsumexp(log_p, axis=-1, keepdims=True), _LOG_ZERO)
        log_p = jnp.where(allowed_BxHxNxN,
                          log_p - jax.nn.logsumexp(log_p, axis=-2, keepdims=True), _LOG_ZERO)
    return log_p


class SinkhornAttention(MultiHeadAttention):
    """Local block attention plus attention to a Sinkhorn-sorted block (or SortCut)."""

    def __init__(self, *, dim: int, num_heads: int, max_len: int, causal: bool,
                 block_size: int, sinkhorn_iters: int, temperature: float,
                 gumbel_noise: bool, normalization: str, sortcut: int | None,
                 qkv_dim: int | None, attention_dropout: float, use_bias: bool,
                 rotary: bool, rngs: nnx.Rngs):
        super().__init__(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=use_bias,
                         rotary=rotary, rngs=rngs)
        if block_size <= 0:
            raise ValueError(f"sinkhorn: block_size must be positive, got {block_size}")
        if sinkhorn_iters < 0:
            raise ValueError(f"sinkhorn: sinkhorn_iters must be >= 0, got {sinkhorn_iters}")
        if temperature <= 0:
            raise ValueError(f"sinkhorn: temperature must be positive, got {temperature}")
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"sinkhorn: unknown normalization {normalization!r}; "
                             f"choose from {NORMALIZATIONS}")
        if sortcut is not None and sortcut <= 0:
            raise ValueError(f"sinkhorn: sortcut must be positive (or None), got {sortcut}")
        if sortcut is not None and causal:
            raise ValueError("sinkhorn: sortcut attends to sorted blocks from the whole "
                             "sequence and has no causal form; use sortcut=None")
        self.max_len, self.block_size = max_len, block_size
        self.sinkhorn_iters, self.temperature = sinkhorn_iters, temperature
        self.normalization, self.sortcut = normalization, sortcut
        self.max_blocks = -(-max_len // block_size)
        self.sort_hidden = layers.dense(dim, dim, ("embed", "mlp"), rngs=rngs)
        self.sort_logits = layers.dense(dim, num_heads * self.max_blocks, ("mlp", None),
                                        rngs=rngs)
        self.gumbel_rngs = layers.noise_stream(rngs) if gumbel_noise else None

    def sort_matrix(self, x_BxLxD: jax.Array, real_BxL: jax.Array,
                    deterministic: bool) -> jax.Array:
        """The soft block permutation P, BxHxNxN (row i: the sources of sorted block i)."""
        b, seq_len, dim = x_BxLxD.shape
        n, bs = seq_len // self.block_size, self.block_size
        real_BxNxS = real_BxL.reshape(b, n, bs)
        x_BxNxSxD = jnp.where(real_BxNxS[..., None], x_BxLxD.reshape(b, n, bs, dim), 0.0)
        count_BxN = jnp.sum(real_BxNxS, axis=-1)
        summary_BxNxD = jnp.sum(x_BxNxSxD, axis=2) / jnp.maximum(count_BxN, 1)[..., None]
        if self.causal:  # row i from block i-1: block i holds positions after its queries
            summary_BxNxD = jnp.pad(summary_BxNxD, ((0, 0), (1, 0), (0, 0)))[:, :-1]
        r = self.sort_logits(jax.nn.relu(self.sort_hidden(summary_BxNxD)))
        log_r_BxHxNxN = r.reshape(b, n, self.num_heads, self.max_blocks)[..., :n].transpose(
            0, 2, 1, 3).astype(jnp.float32)
        if self.gumbel_rngs is not None and not deterministic:
            log_r_BxHxNxN += jax.random.gumbel(self.gumbel_rngs(), log_r_BxHxNxN.shape)
        log_r_BxHxNxN /= self.temperature

        block_real_BxN = count_BxN > 0
        eye_NxN = jnp.eye(n, dtype=jnp.bool_)
        # Real blocks sort among themselves; fully padded blocks map to themselves.
        allowed = ((block_real_BxN[:, :, None] & block_real_BxN[:, None, :])
                   | (eye_NxN & ~block_real_BxN[:, :, None]))[:, None]
        if self.causal:
            allowed = allowed & jnp.tril(jnp.ones((n, n), jnp.bool_), k=-1)
        allowed = jnp.broadcast_to(allowed, log_r_BxHxNxN.shape)
        if self.normalization == "softmax" or self.causal:
            log_p = jax.nn.log_softmax(jnp.where(allowed, log_r_BxHxNxN, _LOG_ZERO), axis=-1)
        else:
            log_p = sinkhorn(log_r_BxHxNxN, allowed, iters=self.sinkhorn_iters)
        return jnp.where(allowed, jnp.exp(log_p), 0.0)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        b, seq_len, _ = x_BxLxD.shape
        if seq_len > self.max_len:
            raise ValueError(f"sinkhorn: input length {seq_len} exceeds max_len {self.max_len}"
                             ", the size of its sorting network; build it with a larger max_len")
        bs = self.block_size
        n = -(-seq_len // bs)
        pad = n * bs - seq_len
        real_BxL = layers.valid_mask(padding_mask, b, seq_len)
        real_BxL = jnp.pad(real_BxL, ((0, 0), (0, pad)))
        x_BxLxD = jnp.pad(x_BxLxD, ((0, 0), (0, pad), (0, 0)))
        q, k, v = self.project_qkv(x_BxLxD)
        # Zeroed padded keys/values: a sorted block mixes blocks and could not mask them.
        real_Bx1xLx1 = real_BxL[:, None, :, None]
        k, v = jnp.where(real_Bx1xLx1, k, 0.0), jnp.where(real_Bx1xLx1, v, 0.0)
        h, kd = self.num_heads, self.head_dim
        q_BxHxNxSxK, k_BxHxNxSxK, v_BxHxNxSxK = (
            t.reshape(b, h, n, bs, kd) for t in (q, k, v))
        real_BxNxS = real_BxL.reshape(b, n, bs)

        p_BxHxNxN = self.sort_matrix(x_BxLxD, real_BxL, deterministic)
        ks_BxHxNxSxK = jnp.einsum("bhij,bhjsk->bhisk", p_BxHxNxN, k_BxHxNxSxK)
        vs_BxHxNxSxK = jnp.einsum("bhij,bhjsk->bhisk", p_BxHxNxN, v_BxHxNxSxK)
        sorted_real_BxHxNxS = jnp.einsum("bhij,bjs->bhis", p_BxHxNxN,
                                         real_BxNxS.astype(jnp.float32)) > 0
        dropout_fn = self.dropout_fn(deterministic)

        if self.sortcut is not None:
            cut = min(self.sortcut, n)
            o_BxHxLxK = dot_product_attention(
                q, ks_BxHxNxSxK[:, :, :cut].reshape(b, h, cut * bs, kd),
                vs_BxHxNxSxK[:, :, :cut].reshape(b, h, cut * bs, kd),
                mask=sorted_real_BxHxNxS[:, :, :cut].reshape(b, h, 1, cut * bs),
                dropout_fn=dropout_fn)
        else:
            keys = jnp.concatenate([k_BxHxNxSxK, ks_BxHxNxSxK], axis=3)
            values = jnp.concatenate([v_BxHxNxSxK, vs_BxHxNxSxK], axis=3)
            local_BxHxNxS = jnp.broadcast_to(real_BxNxS[:, None], sorted_real_BxHxNxS.shape)
            key_real_BxHxNx1x2S = jnp.concatenate([local_BxHxNxS, sorted_real_BxHxNxS],
                                                  axis=-1)[..., None, :]
            mask = key_real_BxHxNx1x2S
            if self.causal:  # the local block under the causal mask; sorted ones are past
                offsets = jnp.arange(bs)
                causal_SxS = offsets[None, :] <= offsets[:, None]
                mask = mask & jnp.concatenate([causal_SxS, jnp.ones_like(causal_SxS)], axis=-1)
            logits = jnp.einsum("bhnsk,bhntk->bhnst", q_BxHxNxSxK, keys,
                                preferred_element_type=jnp.float32) / math.sqrt(kd)
            mask = jnp.broadcast_to(mask, logits.shape)
            o = attend_logits(logits.reshape(b, h * n, bs, 2 * bs),
                              values.reshape(b, h * n, 2 * bs, kd),
                              mask=mask.reshape(b, h * n, bs, 2 * bs), dropout_fn=dropout_fn)
            o_BxHxLxK = o.reshape(b, h, n * bs, kd)
        return self.out(self.merge_heads(o_BxHxLxK[:, :, :seq_len]))


@registry.register("sinkhorn", capabilities=registry.Capabilities(
    description="Sparse Sinkhorn attention: local block plus a Sinkhorn-sorted block",
    causal=True, decode="recompute", padding=True, variable_length=True,
    dense_equivalent={"block_size": 16},
    test_hparams={"block_size": 4}, rotary=True))
def build_sinkhorn(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
                   rotary: bool = False,
                   block_size: int = 64, sinkhorn_iters: int = 5, temperature: float = 0.75,
                   gumbel_noise: bool = False, normalization: str = "sinkhorn",
                   sortcut: int | None = None, qkv_dim: int | None = None,
                   attention_dropout: float = 0.1, use_bias: bool = True) -> SinkhornAttention:
    """block_size: b; sinkhorn_iters: balancing rounds; temperature: divides the sort
    logits; gumbel_noise: Gumbel noise on them in training; normalization: "sinkhorn"
    (paper) or "softmax" (LRA's default); sortcut: attend to the first n sorted blocks only."""
    return SinkhornAttention(dim=dim, num_heads=num_heads, max_len=max_len, causal=causal,
                             block_size=block_size, sinkhorn_iters=sinkhorn_iters,
                             temperature=temperature, gumbel_noise=gumbel_noise,
                             normalization=normalization, sortcut=sortcut, qkv_dim=qkv_dim,
                             attention_dropout=attention_dropout, use_bias=use_bias,
                             rotary=rotary, rngs=rngs)

"""Memory-efficient softmax attention in plain JAX: the CPU form of `attention_impl=flash`.

Rabe and Staats (2021, "Self-attention does not need O(n^2) memory") computed as
FlashAttention-2 does (Dao 2023): queries in chunks of `chunk_q`, and for each chunk a scan
over the keys in chunks of `chunk_k` with an online softmax (running max, normaliser and
weighted sum), so no L x L matrix exists at any time. Only the output and the per-row
log-sum-exp are kept for the backward pass (a custom VJP), which walks the key chunks
again, recomputing each tile's probabilities from the log-sum-exp: O(L) memory forward
and backward, O(L^2) compute.

The pattern (`models.masks`) and the key mask are evaluated on each tile's iotas, and the
tiles they leave empty are skipped (`lax.cond`), so a causal or a local pattern, or a
batch padded to the end, costs what its non-empty tiles cost. Keys are masked by `valid_BxKv`
(padding). Semantics are `models.attention.dense.dot_product_attention`'s: the queries are
the last Q of the Kv positions, softmax in float32, a query with no key gets 0 (and zero
gradients). Attention dropout: the counter-based hash of the Pallas kernels
(`block_sparse_tiles.dropout_multiplier`, per (batch * heads + head, query, key)),
recomputed tile by tile in the forward and backward passes; the normaliser sums the
undropped weights, so the output is softmax(...) * keep / (1 - rate) @ v exactly.

A forget-gate bias (fox, models/attention/forgetting.py): `forget=(c_BxHxQ, c_BxHxKv)`
adds c_i - c_j to the logits (the cumulative log forget gates of query i and key j), or
-|c_i - c_j| with `forget_both_ways`, computed per tile from the two vectors, so the
O(L) memory holds; its gradient is the logits' summed over keys (for c_i) and over
queries (for c_j), accumulated in the same backward pass.

Blocks chosen by content (moba, nsa's selected branch): `key_blocks=(chosen_BxHxQxN,
block_size)` lets query i see key j only where chosen[..., i, j // block_size]; each
tile gathers its rows and block columns of the table (Q x L / block_size booleans, not
L x L), and a tile none of whose queries chose any of its blocks is skipped as a masked
one is.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from models import masks
from models.kernels.block_sparse_tiles import dropout_multiplier

# Tile sizes: large enough that each tile's two matmuls dominate the loop overhead on a
# CPU, small enough that B x H x chunk_q x chunk_k floats stay a few MiB at LRA's sizes.
CHUNK_Q = 512
CHUNK_K = 512


def chunked_attention(q_BxHxQxK: jax.Array, k_BxHxKvxK: jax.Array, v_BxHxKvxD: jax.Array,
                      pattern: masks.Pattern | None = None, *,
                      valid_BxKv: jax.Array | None = None, dropout_rate: float = 0.0,
                      dropout_seed: jax.Array | None = None, chunk_q: int = CHUNK_Q,
                      chunk_k: int = CHUNK_K,
                      forget: tuple[jax.Array, jax.Array] | None = None,
                      forget_both_ways: bool = False,
                      key_blocks: tuple[jax.Array, int] | None = None) -> jax.Array:
    """softmax(q k^T / sqrt(K) [+ the forget bias]) v restricted to `pattern` (None: every
    key) and to the keys with `valid_BxKv` True; BxHxQxD in v's dtype. O(L) memory,
    forward and backward. `forget`: (c_BxHxQ, c_BxHxKv); `key_blocks`: (chosen
    BxHxQxN bool, block_size), the blocks each query may read (module docstring)."""
    b, h, q_len, _ = q_BxHxQxK.shape
    kv_len = k_BxHxKvxK.shape[2]
    if k_BxHxKvxK.shape[:2] != (b, h) or v_BxHxKvxD.shape[:3] != (b, h, kv_len):
        raise ValueError(f"q {q_BxHxQxK.shape}, k {k_BxHxKvxK.shape} and v "
                         f"{v_BxHxKvxD.shape} must share batch, heads and key length")
    if chunk_q < 1 or chunk_k < 1:
        raise ValueError(f"chunk sizes must be positive, got {chunk_q}, {chunk_k}")
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}")
    if dropout_rate > 0 and dropout_seed is None:
        raise ValueError("dropout_rate > 0 needs a dropout_seed")
    pattern = masks.all_() if pattern is None else pattern
    if pattern.num_heads not in (None, h):
        raise ValueError(f"per-head pattern has {pattern.num_heads} heads, q has {h}")
    valid = (jnp.ones((b, kv_len), jnp.bool_) if valid_BxKv is None
             else valid_BxKv.astype(jnp.bool_))
    seed = jnp.zeros((), jnp.int32) if dropout_seed is None else jnp.asarray(
        dropout_seed, jnp.int32)
    if forget is None:
        bias = None
        c_q, c_k = jnp.zeros((b, h, q_len), jnp.float32), jnp.zeros((b, h, kv_len), jnp.float32)
    else:
        bias = "abs" if forget_both_ways else "diff"
        c_q, c_k = (c.astype(jnp.float32) for c in forget)
        if c_q.shape != (b, h, q_len) or c_k.shape != (b, h, kv_len):
            raise ValueError(f"forget vectors {c_q.shape}, {c_k.shape}: want {(b, h, q_len)} "
                             f"and {(b, h, kv_len)}")
    cq, ck = min(chunk_q, q_len), min(chunk_k, kv_len)
    if key_blocks is None:
        block_size, chosen = 0, jnp.zeros((b, 1, 1, 1), jnp.bool_)
    else:
        chosen, block_size = key_blocks
        n_blocks = -(-kv_len // max(block_size, 1))
        if block_size < 1 or chosen.shape not in ((b, h, q_len, n_blocks),
                                                  (b, 1, q_len, n_blocks)):
            raise ValueError(f"key_blocks: a table {chosen.shape} of blocks of {block_size}: "
                             f"want {(b, h, q_len, n_blocks)} (or one head) and a block of "
                             "at least 1 key")
        # Padded to the tiles: rows of padded queries and blocks past the keys are False.
        n_cover = -(-(-(-kv_len // ck) * ck) // block_size)
        chosen = jnp.pad(chosen.astype(jnp.bool_),
                         ((0, 0), (0, 0), (0, -(-q_len // cq) * cq - q_len),
                          (0, n_cover - n_blocks)))
    cfg = _Config(pattern, q_len, kv_len, h, cq, ck, float(dropout_rate), bias, block_size)
    return _attention(cfg, q_BxHxQxK, k_BxHxKvxK, v_BxHxKvxD, valid, seed, c_q, c_k,
                      chosen)


class _Config:
    """The static part of a call (hashable: the custom VJP's non-differentiable argument)."""

    def __init__(self, pattern, q_len, kv_len, heads, cq, ck, rate, bias=None,
                 block_size=0):
        self.pattern, self.q_len, self.kv_len, self.heads = pattern, q_len, kv_len, heads
        self.cq, self.ck, self.rate, self.bias = cq, ck, rate, bias
        self.block_size = block_size  # 0: no key_blocks table
        self.nq, self.nk = -(-q_len // cq), -(-kv_len // ck)
        self.key = (pattern, q_len, kv_len, heads, cq, ck, rate, bias, block_size)

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, _Config) and self.key == other.key

    def tile_mask(self, qi, kj, valid_BxKv, chosen):
        """(bool B x (1|H) x cq x ck: the pattern's, the keys' and the chosen blocks' mask
        of tile (qi, kj), bool scalar: whether any of it is True)."""
        # Iotas, not numpy constants: a constant in a lax.platform_dependent branch
        # breaks jax.export (JAX 0.10.2).
        i = (qi * self.cq + lax.iota(jnp.int32, self.cq) + (self.kv_len - self.q_len))
        j = kj * self.ck + lax.iota(jnp.int32, self.ck)
        allowed = self.pattern.mask(i[:, None], j[None, :], jnp)
        allowed = jnp.broadcast_to(allowed, allowed.shape[:-2] + (self.cq, self.ck))
        allowed = allowed[None, None] if allowed.ndim == 2 else allowed[None]
        keys = lax.dynamic_slice_in_dim(valid_BxKv, kj * self.ck, self.ck, axis=1)
        mask = allowed & keys[:, None, None, :]
        if self.block_size:
            rows = lax.dynamic_slice_in_dim(chosen, qi * self.cq, self.cq, axis=2)
            mask = mask & jnp.take(rows, j // self.block_size, axis=3)
        return mask, jnp.any(mask)

    def logits(self, q_c, k_c, scale, cq_c, ck_c):
        """A tile's logits (f32 B x H x cq x ck), the forget bias added."""
        s = _scores(q_c, k_c, scale)
        if self.bias is None:
            return s
        diff = cq_c[..., :, None] - ck_c[..., None, :]
        return s + (diff if self.bias == "diff" else -jnp.abs(diff))

    def bias_grads(self, ds, cq_c, ck_c):
        """(dc_q B x H x cq, dc_k B x H x ck) of a tile from the logits' gradient ds."""
        if self.bias == "diff":
            return ds.sum(-1), -ds.sum(-2)
        sign = jnp.sign(cq_c[..., :, None] - ck_c[..., None, :])  # d(-|x|)/dx = -sign(x)
        return -(ds * sign).sum(-1), (ds * sign).sum(-2)

    def multiplier(self, seed, qi, kj, batch):
        """f32 B x H x cq x ck dropout multipliers of tile (qi, kj)."""
        i = qi * self.cq + lax.iota(jnp.int32, self.cq)
        j = kj * self.ck + lax.iota(jnp.int32, self.ck)
        bh = (lax.broadcasted_iota(jnp.int32, (batch, self.heads), 0) * self.heads
              + lax.broadcasted_iota(jnp.int32, (batch, self.heads), 1))
        return dropout_multiplier(seed, bh[:, :, None, None], i[None, None, :, None],
                                  j[None, None, None, :], self.rate)


def _pad_to(x, axis, size, value=0):
    extra = size - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def _chunks(x_BxHxLxF, n, c):
    """n x B x H x c x F."""
    b, h, _, f = x_BxHxLxF.shape
    return _pad_to(x_BxHxLxF, 2, n * c).reshape(b, h, n, c, f).transpose(2, 0, 1, 3, 4)


def _unchunk(x_NxBxHxCxF, length):
    n, b, h, c, f = x_NxBxHxCxF.shape
    return x_NxBxHxCxF.transpose(1, 2, 0, 3, 4).reshape(b, h, n * c, f)[:, :, :length]


def _scores(q_BxHxCxK, k_BxHxCxK, scale):
    return jnp.einsum("bhqk,bhsk->bhqs", q_BxHxCxK, k_BxHxCxK,
                      preferred_element_type=jnp.float32) * scale


def _forward(cfg, q, k, v, valid, seed, c_q, c_k, chosen):
    """(o BxHxQxD in v's dtype, lse BxHxQ f32; +inf on rows with no key)."""
    b, h, _, dk = q.shape
    dv = v.shape[-1]
    scale = 1.0 / math.sqrt(dk)
    q_n, k_n, v_n = _chunks(q, cfg.nq, cfg.cq), _chunks(k, cfg.nk, cfg.ck), _chunks(
        v, cfg.nk, cfg.ck)
    cq_n, ck_n = _chunks(c_q[..., None], cfg.nq, cfg.cq)[..., 0], _chunks(
        c_k[..., None], cfg.nk, cfg.ck)[..., 0]
    valid = _pad_to(valid, 1, cfg.nk * cfg.ck, False)

    def query_chunk(qi):
        q_c = q_n[qi]

        def key_step(carry, kj):
            mask, any_key = cfg.tile_mask(qi, kj, valid, chosen)

            def tile(carry):
                m, l, acc = carry
                s = jnp.where(mask, cfg.logits(q_c, k_n[kj], scale, cq_n[qi], ck_n[kj]),
                              -jnp.inf)
                m_new = jnp.maximum(m, s.max(-1))
                m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
                p = jnp.where(mask, jnp.exp(s - m_safe[..., None]), 0.0)
                alpha = jnp.exp(m - m_safe)  # 0 while m is -inf
                l = l * alpha + p.sum(-1)
                if cfg.rate:
                    p = p * cfg.multiplier(seed, qi, kj, b)
                pv = jnp.einsum("bhqs,bhsd->bhqd", p.astype(v.dtype), v_n[kj],
                                preferred_element_type=jnp.float32)
                return m_new, l, acc * alpha[..., None] + pv

            return lax.cond(any_key, tile, lambda c: c, carry), None

        init = (jnp.full((b, h, cfg.cq), -jnp.inf, jnp.float32),
                jnp.zeros((b, h, cfg.cq), jnp.float32),
                jnp.zeros((b, h, cfg.cq, dv), jnp.float32))
        m, l, acc = lax.scan(key_step, init, jnp.arange(cfg.nk))[0]
        o = jnp.where(l[..., None] > 0, acc / jnp.where(l > 0, l, 1.0)[..., None], 0.0)
        lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), jnp.inf)
        return o.astype(v.dtype), lse

    o_n, lse_n = lax.map(query_chunk, jnp.arange(cfg.nq))
    lse = lse_n.transpose(1, 2, 0, 3).reshape(b, h, cfg.nq * cfg.cq)[:, :, :cfg.q_len]
    return _unchunk(o_n, cfg.q_len), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(cfg, q, k, v, valid, seed, c_q, c_k, chosen):
    return _forward(cfg, q, k, v, valid, seed, c_q, c_k, chosen)[0]


def _attention_fwd(cfg, q, k, v, valid, seed, c_q, c_k, chosen):
    o, lse = _forward(cfg, q, k, v, valid, seed, c_q, c_k, chosen)
    return o, (q, k, v, valid, seed, c_q, c_k, chosen, o, lse)


def _attention_bwd(cfg, res, do):
    """One pass over the key chunks (dk, dv of the chunk accumulated over the query
    chunks; dq accumulated over the key chunks), probabilities recomputed from lse."""
    q, k, v, valid, seed, c_q, c_k, chosen, o, lse = res
    b, h, _, dk = q.shape
    scale = 1.0 / math.sqrt(dk)
    d_rows = jnp.einsum("bhqd,bhqd->bhq", do.astype(jnp.float32), o.astype(jnp.float32))
    q_n, do_n = _chunks(q, cfg.nq, cfg.cq), _chunks(do, cfg.nq, cfg.cq)
    k_n, v_n = _chunks(k, cfg.nk, cfg.ck), _chunks(v, cfg.nk, cfg.ck)
    lse_n = _chunks(lse[..., None], cfg.nq, cfg.cq)[..., 0]
    d_n = _chunks(d_rows[..., None], cfg.nq, cfg.cq)[..., 0]
    cq_n, ck_n = _chunks(c_q[..., None], cfg.nq, cfg.cq)[..., 0], _chunks(
        c_k[..., None], cfg.nk, cfg.ck)[..., 0]
    valid_p = _pad_to(valid, 1, cfg.nk * cfg.ck, False)

    def key_chunk(carry_n, kj):
        k_c, v_c = k_n[kj], v_n[kj]

        def query_step(carry, qi):
            mask, any_key = cfg.tile_mask(qi, kj, valid_p, chosen)

            def tile(carry):
                dk_c, dv_c, dck_c = carry
                q_c, do_c = q_n[qi], do_n[qi]
                s = cfg.logits(q_c, k_c, scale, cq_n[qi], ck_n[kj])
                p = jnp.where(mask, jnp.exp(s - lse_n[qi][..., None]), 0.0)
                dp = jnp.einsum("bhqd,bhsd->bhqs", do_c, v_c,
                                preferred_element_type=jnp.float32)
                p_kept = p
                if cfg.rate:
                    keep = cfg.multiplier(seed, qi, kj, b)
                    p_kept, dp = p * keep, dp * keep
                dv_c = dv_c + jnp.einsum("bhqs,bhqd->bhsd", p_kept.astype(do.dtype), do_c,
                                         preferred_element_type=jnp.float32)
                ds = p * (dp - d_n[qi][..., None])
                dk_c = dk_c + scale * jnp.einsum("bhqs,bhqk->bhsk", ds.astype(q.dtype), q_c,
                                                 preferred_element_type=jnp.float32)
                dq_c = scale * jnp.einsum("bhqs,bhsk->bhqk", ds.astype(k.dtype), k_c,
                                          preferred_element_type=jnp.float32)
                if cfg.bias is None:
                    dcq_c = jnp.zeros((b, h, cfg.cq), jnp.float32)
                else:
                    dcq_c, dck_tile = cfg.bias_grads(ds, cq_n[qi], ck_n[kj])
                    dck_c = dck_c + dck_tile
                return (dk_c, dv_c, dck_c), (dq_c, dcq_c)

            def skip(carry):
                return carry, (jnp.zeros((b, h, cfg.cq, dk), jnp.float32),
                               jnp.zeros((b, h, cfg.cq), jnp.float32))

            return lax.cond(any_key, tile, skip, carry)

        dq_n, dcq_n = carry_n
        init = (jnp.zeros((b, h, cfg.ck, dk), jnp.float32),
                jnp.zeros((b, h, cfg.ck, v.shape[-1]), jnp.float32),
                jnp.zeros((b, h, cfg.ck), jnp.float32))
        (dk_c, dv_c, dck_c), (dq_parts, dcq_parts) = lax.scan(query_step, init,
                                                              jnp.arange(cfg.nq))
        return (dq_n + dq_parts, dcq_n + dcq_parts), (dk_c, dv_c, dck_c)

    (dq_n, dcq_n), (dk_n, dv_n, dck_n) = lax.scan(
        key_chunk, (jnp.zeros((cfg.nq, b, h, cfg.cq, dk), jnp.float32),
                    jnp.zeros((cfg.nq, b, h, cfg.cq), jnp.float32)), jnp.arange(cfg.nk))
    dq = _unchunk(dq_n, cfg.q_len).astype(q.dtype)
    dk_ = _unchunk(dk_n, cfg.kv_len).astype(k.dtype)
    dv_ = _unchunk(dv_n, cfg.kv_len).astype(v.dtype)
    dc_q = _unchunk(dcq_n[..., None], cfg.q_len)[..., 0]
    dc_k = _unchunk(dck_n[..., None], cfg.kv_len)[..., 0]
    # valid, chosen (bool) and seed (int) have no cotangent: float0 zeros.
    return (dq, dk_, dv_, np.zeros(valid.shape, jax.dtypes.float0),
            np.zeros(seed.shape, jax.dtypes.float0), dc_q, dc_k,
            np.zeros(chosen.shape, jax.dtypes.float0))


_attention.defvjp(_attention_fwd, _attention_bwd)

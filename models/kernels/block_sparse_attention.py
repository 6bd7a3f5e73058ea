"""Block-sparse softmax attention for a `models.masks` pattern.

backend="xla": every query block gathers only its non-empty key blocks (the
pattern's static `BlockLayout`, computed on the host) and runs one softmax over
them, so compute and memory grow with the number of non-empty blocks instead of
L^2. Query blocks are grouped by how many key blocks they need (rounded up to a
power of two), so that a few dense rows (global tokens) do not widen every row.
The pattern predicate is evaluated on the gathered tiles to mask partial blocks;
gather slots past a row's count, keys past the end and padded keys are masked too.
Plain autodiff gives the gradients (the gathers become scatter-adds).

backend="pallas": flash attention (online softmax, log-sum-exp residual) over the same
block layout, as Pallas kernels: GPU (Triton) and TPU (Mosaic), interpreted on CPU. One
program per (batch, head, query block) walks that block's list of non-empty key blocks;
the pattern predicate (built from iotas) masks only partial blocks, the key-validity
vector (padding and keys past the end) masks every block. Custom VJP, FlashAttention-2
style: a dQ pass over the same per-query-block lists and a dK/dV pass over per-key-block
lists of query blocks (the transposed layout), both recomputing the probabilities from
the log-sum-exp.

- GPU: grid (B, H, blocks); the block lists are int32 inputs and the loop over them is a
  `fori_loop` with a data-dependent bound, so empty blocks cost nothing.
- TPU: grid (B, H, blocks, list slot) with `PrefetchScalarGridSpec`: the compacted lists
  are prefetched scalars that drive the index maps; padded slots repeat the last valid
  index, so the pipeline fetches nothing new, and `pl.when` skips their compute.

A query with no key at all gets output 0 and zero gradients (as `dot_product_attention`).
Attention-weight dropout (`dropout_rate`, `dropout_seed`): the kernels never hold the whole
weight matrix, so the keep mask is a counter-based hash of (seed, batch, head, query, key)
(`dropout_multiplier`), recomputed tile by tile in the forward and both backward passes:
the same mask in all three, no mask in memory. The normaliser sums the undropped weights,
so the output is exactly softmax(...) * mask / (1 - rate) @ v.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from models import layers, masks
from models.kernels import reference, targets

BACKENDS = ("xla", "pallas")
DropoutFn = Callable[[jax.Array], jax.Array]


def block_sparse_attention(q_BxHxQxK: jax.Array, k_BxHxKvxK: jax.Array,
                           v_BxHxKvxD: jax.Array, pattern: masks.Pattern, *,
                           padding_mask: jax.Array | None = None, backend: str = "xla",
                           block_q: int | None = None, block_k: int | None = None,
                           dropout_fn: DropoutFn | None = None, dropout_rate: float = 0.0,
                           dropout_seed: jax.Array | None = None, platform: str | None = None,
                           interpret: bool | None = None) -> jax.Array:
    """softmax(q k^T / sqrt(K)) v restricted to `pattern`; returns BxHxQxD.

    `padding_mask` is bool BxKv (True = real key). Queries are the last Q of the Kv
    positions, as in `models.attention.dense.make_attention_mask`. A query with no
    key to attend to gets output 0, like `dot_product_attention`.

    Attention dropout: backend="xla" applies `dropout_fn` to the weights; backend="pallas"
    takes `dropout_rate` and an int32 `dropout_seed` (scalar) instead and drops weight
    (b, h, i, j) where `dropout_multiplier` says so.

    `block_q`, `block_k`: tile sizes; default 64 (xla, Triton) or 128 (Mosaic).
    backend="pallas" only: `platform` "gpu" (Triton) or "tpu" (Mosaic) picks the kernel
    flavour (default: the one for the platform the program is lowered for; Triton,
    interpreted, on CPU; `models/kernels/targets.py`) and `interpret` runs it in the
    Pallas interpreter (default: on CPU only). Its tiles are rounded up to what the target
    takes (Triton: powers of two >= 16; Mosaic: multiples of 8, and of 128 for key tiles
    when compiled), which changes only the tiling, never the result.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    b, h, q_len, _ = q_BxHxQxK.shape
    kv_len = k_BxHxKvxK.shape[2]
    if pattern.num_heads not in (None, h):
        raise ValueError(f"pattern has {pattern.num_heads} heads, inputs have {h}")
    if padding_mask is not None and padding_mask.shape != (b, kv_len):
        raise ValueError(f"padding mask has shape {padding_mask.shape}, expected "
                         f"{(b, kv_len)}")
    if backend == "pallas":
        if dropout_fn is not None:
            raise ValueError("block_sparse_attention: backend='pallas' takes dropout_rate "
                             "and dropout_seed, not dropout_fn")
        if not 0.0 <= dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}")
        if dropout_rate > 0 and dropout_seed is None:
            raise ValueError("dropout_rate > 0 needs a dropout_seed")
        seed = jnp.asarray(0 if dropout_seed is None else dropout_seed, jnp.int32)

        def build(target: targets.Target):
            if target.backend == "xla":
                return functools.partial(_without_kernel, pattern=pattern, block_q=block_q,
                                         block_k=block_k, dropout_rate=dropout_rate)
            cfg = make_config(q_BxHxQxK, k_BxHxKvxK, pattern, block_q=block_q,
                              block_k=block_k, platform=target.platform,
                              interpret=target.interpret, dropout_rate=dropout_rate)

            def run(q, k, v, padding_mask, seed):
                valid = _key_validity(padding_mask, b, kv_len, cfg)
                return _sharded_pallas_attention(q, k, v, valid, seed, cfg)

            return run

        # The kernel form follows the platform the program is lowered for (models/kernels/
        # targets.py), not the host that traces it.
        return targets.dispatch(build, (q_BxHxQxK, k_BxHxKvxK, v_BxHxKvxD, padding_mask, seed),
                                platform=platform, interpret=interpret)
    if dropout_rate:
        raise ValueError("backend='xla' takes dropout_fn, not dropout_rate")
    bq, bk = min(block_q or 64, q_len), min(block_k or 64, kv_len)
    lay = pattern.blocks(q_len, kv_len, bq, bk)
    nq, nk = lay.layout.shape[-2:]
    # Shared patterns get a head axis P of 1 that broadcasts over heads.
    idx_PxNqxM = lay.kv_indices.reshape(-1, nq, lay.kv_indices.shape[-1])
    counts_PxNq = lay.kv_counts.reshape(-1, nq)
    full_PxNqxM = np.take_along_axis(lay.layout.reshape(-1, nq, nk), idx_PxNqxM,
                                     axis=-1) == masks.FULL

    def pad_to(x, n, axis):
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, n - x.shape[axis])
        return jnp.pad(x, widths)

    q_BxHxNqxBqxK = pad_to(q_BxHxQxK, nq * bq, 2).reshape(b, h, nq, bq, -1)
    k_BxHxNkxBkxK = pad_to(k_BxHxKvxK, nk * bk, 2).reshape(b, h, nk, bk, -1)
    v_BxHxNkxBkxD = pad_to(v_BxHxKvxD, nk * bk, 2).reshape(b, h, nk, bk, -1)
    pad_BxNkxBk = (None if padding_mask is None else
                   pad_to(padding_mask.astype(jnp.bool_), nk * bk, 1).reshape(b, nk, bk))

    # Row groups: query blocks needing up to 1, 2, 4, ... key blocks.
    need_Nq = counts_PxNq.max(0)
    bucket_Nq = 2 ** np.ceil(np.log2(np.maximum(need_Nq, 1))).astype(int)
    outs, order = [], []
    for bucket in np.unique(bucket_Nq):
        rows = np.flatnonzero(bucket_Nq == bucket)
        width = max(1, int(need_Nq[rows].max()))
        tiles = _Tiles(idx_PxNqxM[:, rows, :width], counts_PxNq[:, rows],
                       full_PxNqxM[:, rows, :width], rows, bq, bk)
        outs.append(_attend_rows(_take_rows(q_BxHxNqxBqxK, rows), k_BxHxNkxBkxK,
                                 v_BxHxNkxBkxD, pad_BxNkxBk, tiles, pattern, kv_len - q_len, kv_len,
                                 dropout_fn))
        order.append(rows)
    # Back to row order; slices of contiguous runs, not a gather: its transpose would be
    # a scatter that XLA may try to constant-fold.
    group_of = np.concatenate([np.full(len(r), g) for g, r in enumerate(order)])
    where = np.concatenate([np.arange(len(r)) for r in order])
    perm = np.argsort(np.concatenate(order))
    pieces = [outs[group_of[perm[run[0]]]][:, :, where[perm[run[0]]]:where[perm[run[-1]]] + 1]
              for run in _runs(perm, group_of, where)]
    out = pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=2)
    return out.reshape(b, h, nq * bq, -1)[:, :, :q_len]


def _without_kernel(q_BxHxQxK, k_BxHxKvxK, v_BxHxKvxD, padding_mask, seed, *,
                    pattern: masks.Pattern, block_q, block_k, dropout_rate: float):
    """backend="pallas" where this JAX has no kernel backend for the platform (a GPU
    without Triton: models/kernels/targets.py): the same function without a kernel. No
    dropout: the XLA block-sparse path. Dropout: the kernels' hashed keep mask on the
    whole index grid and a dense masked softmax (O(L^2) memory, the same numbers)."""
    if not dropout_rate:
        return block_sparse_attention(q_BxHxQxK, k_BxHxKvxK, v_BxHxKvxD, pattern,
                                      padding_mask=padding_mask, backend="xla",
                                      block_q=block_q, block_k=block_k)
    b, h, q_len, _ = q_BxHxQxK.shape
    kv_len = k_BxHxKvxK.shape[2]
    allowed = jnp.broadcast_to(pattern.dense(q_len, kv_len), (h, q_len, kv_len))[None]
    if padding_mask is not None:
        allowed = allowed & padding_mask.astype(jnp.bool_)[:, None, None, :]
    bh = (jnp.arange(b)[:, None] * h + jnp.arange(h)[None, :])[:, :, None, None]
    multiplier = dropout_multiplier(seed, bh, jnp.arange(q_len)[None, None, :, None],
                                    jnp.arange(kv_len)[None, None, None, :], dropout_rate)
    return reference.masked_softmax_attention(
        q_BxHxQxK, k_BxHxKvxK, v_BxHxKvxD, allowed, multiplier).astype(q_BxHxQxK.dtype)


def _runs(perm, group_of, where):
    """Consecutive output rows that are consecutive rows of one group's output."""
    runs, run = [], [0]
    for r in range(1, len(perm)):
        a, c = perm[run[-1]], perm[r]
        if group_of[a] == group_of[c] and where[c] == where[a] + 1:
            run.append(r)
        else:
            runs.append(run)
            run = [r]
    return runs + [run]


def _take_rows(x_BxHxNqx, rows):
    """x[:, :, rows] for sorted rows, as slices of contiguous runs."""
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    pieces = [x_BxHxNqx[:, :, run[0]:run[-1] + 1] for run in np.split(rows, breaks)]
    return pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=2)


class _Tiles:
    """Static (host) description of the key blocks gathered for some query blocks."""

    def __init__(self, idx_PxRxM, counts_PxR, full_PxRxM, rows_R, bq, bk):
        self.idx, self.counts, self.full, self.rows = idx_PxRxM, counts_PxR, full_PxRxM, rows_R
        self.bq, self.bk = bq, bk


def _attend_rows(q_BxHxRxBqxK, k_BxHxNkxBkxK, v_BxHxNkxBkxD, pad_BxNkxBk, t: _Tiles,
                 pattern: masks.Pattern, offset: int, kv_len: int,
                 dropout_fn: DropoutFn | None) -> jax.Array:
    """Attention of R query blocks over their M gathered key blocks: B x H x R x Bq x D."""
    b, h, r, bq, _ = q_BxHxRxBqxK.shape
    bk, m = t.bk, t.idx.shape[-1]
    idx_HxRxM = np.broadcast_to(t.idx, (h, r, m))
    heads_HxRxM = np.broadcast_to(np.arange(h)[:, None, None], (h, r, m))
    k_g = k_BxHxNkxBkxK[:, heads_HxRxM, idx_HxRxM]  # B x H x R x M x Bk x K
    v_g = v_BxHxNkxBkxD[:, heads_HxRxM, idx_HxRxM]
    scale = 1.0 / math.sqrt(q_BxHxRxBqxK.shape[-1])
    logits = jnp.einsum("bhrqk,bhrmsk->bhrqms", q_BxHxRxBqxK, k_g,
                        preferred_element_type=jnp.float32) * scale

    # Element mask on the gathered tiles, P x R x Bq x M x Bk, built in-graph from iotas.
    i = (jnp.asarray(t.rows)[:, None] * bq + jnp.arange(bq) + offset)[None, :, :, None, None]
    j = (jnp.asarray(t.idx)[..., None] * bk + jnp.arange(bk))[:, :, None]
    in_pattern = pattern.mask(i, j, jnp)
    if pattern.num_heads is not None:  # per-head predicate on per-head tiles: H x H x ...
        in_pattern = in_pattern[np.arange(h), np.arange(h)]
    # Full blocks need no predicate; slots past the count and keys past the end are out.
    live_PxRxM = np.arange(m) < t.counts[..., None]
    keep = jnp.where(jnp.asarray(t.full)[:, :, None, :, None], True, in_pattern)
    mask = (keep & jnp.asarray(live_PxRxM)[:, :, None, :, None] & (j < kv_len))[None]
    if pad_BxNkxBk is not None:
        mask = mask & pad_BxNkxBk[:, t.idx][:, :, :, None]  # B x P x R x 1 x M x Bk

    s = m * bk
    logits = logits.reshape(b, h, r, bq, s)
    mask = mask.reshape(mask.shape[:3] + (bq, s))
    # As dot_product_attention: finite fill, then zero rows that have no key at all.
    weights = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(jnp.float32).min), axis=-1)
    weights = jnp.where(mask, weights, 0.0)
    if dropout_fn is not None:
        weights = dropout_fn(weights)
    v_g = v_g.reshape(b, h, r, s, -1)
    return jnp.einsum("bhrqs,bhrsd->bhrqd", weights.astype(v_g.dtype), v_g)


# --------------------------------------------------------------------------------------
# backend="pallas": flash attention over the block layout.

_F32 = jnp.float32
# Masked logits: finite, so the running max of a tile with no key stays finite.
_NEG = -1e30
# 64 x 64 tiles keep a Triton program within registers; 128 matches the TPU MXU and lanes.
_DEFAULT_BLOCK = {"gpu": 64, "tpu": 128}


class _Config(NamedTuple):
    pattern: masks.Pattern
    q_len: int
    kv_len: int
    block_q: int
    block_k: int
    scale: float
    platform: str  # "gpu" (Triton) or "tpu" (Mosaic)
    interpret: bool
    dropout_rate: float = 0.0

    @property
    def num_q_blocks(self) -> int:
        return -(-self.q_len // self.block_q)

    @property
    def num_k_blocks(self) -> int:
        return -(-self.kv_len // self.block_k)


def _tile(block: int, length: int, platform: str) -> int:
    """The tile for a requested block: no larger than needed, of a size the target takes
    (Triton: a power of two >= 16; Mosaic: a multiple of 8, the sublanes)."""
    if platform == "gpu":
        return max(16, pl.next_power_of_2(min(block, length)))
    return -(-min(block, length) // 8) * 8


def make_config(q: jax.Array, k: jax.Array, pattern: masks.Pattern, *,
                block_q: int | None = None, block_k: int | None = None,
                platform: str | None = None, interpret: bool | None = None,
                dropout_rate: float = 0.0) -> _Config:
    """Resolves the kernel flavour, interpret mode and tile sizes.

    Called directly, an unset platform or interpret follows this host's default backend;
    the public entry point passes both, for each platform the program may be lowered for
    (models/kernels/targets.py)."""
    device = jax.default_backend()
    platform = platform or ("tpu" if device == "tpu" else "gpu")
    if platform not in ("gpu", "tpu"):
        raise ValueError(f"platform must be 'gpu' or 'tpu', got {platform!r}")
    interpret = device == "cpu" if interpret is None else interpret
    q_len, kv_len = q.shape[2], k.shape[2]
    bq = _tile(block_q or _DEFAULT_BLOCK[platform], q_len, platform)
    bk = _tile(block_k or _DEFAULT_BLOCK[platform], kv_len, platform)
    if platform == "tpu" and not interpret and bk < kv_len:
        # The key-validity tile (1, bk) has bk on the lanes: compiled Mosaic wants 128s.
        bk = -(-bk // 128) * 128
    return _Config(pattern, q_len, kv_len, bq, bk, 1.0 / math.sqrt(q.shape[-1]), platform,
                   bool(interpret), float(dropout_rate))


class _Lists(NamedTuple):
    """Compacted block lists, flattened for scalar access: entry (p, row, slot) sits at
    (p * rows + row) * width + slot; p is the pattern head (0 for shared patterns)."""
    indices: np.ndarray  # int32: the non-empty blocks, padded with the last valid one
    counts: np.ndarray  # int32 (p * rows + row): how many are real
    full: np.ndarray  # int32, like indices: 1 where the block needs no element mask
    width: int
    heads: int  # pattern heads P: 1 (shared) or H


def _compact(layout_PxRxC: np.ndarray) -> _Lists:
    nonempty = layout_PxRxC != masks.EMPTY
    counts = nonempty.sum(-1).astype(np.int32)
    width = max(1, int(counts.max()))
    order = np.argsort(~nonempty, axis=-1, kind="stable")[..., :width]
    last = np.take_along_axis(order, np.maximum(counts - 1, 0)[..., None], axis=-1)
    slot = np.arange(width)
    idx = np.where(slot < counts[..., None], order,
                   np.where(counts[..., None] > 0, last, 0)).astype(np.int32)
    full = (np.take_along_axis(layout_PxRxC, idx, axis=-1) == masks.FULL).astype(np.int32)
    return _Lists(idx.reshape(-1), counts.reshape(-1), full.reshape(-1), width,
                  layout_PxRxC.shape[0])


def _lists(cfg: _Config) -> tuple[_Lists, _Lists]:
    """Key blocks of each query block (forward, dQ) and query blocks of each key block
    (dK/dV: the transposed layout)."""
    return _layout_lists(cfg.pattern, cfg.q_len, cfg.kv_len, cfg.block_q, cfg.block_k)


@functools.lru_cache(maxsize=128)
def _layout_lists(pattern: masks.Pattern, q_len: int, kv_len: int, block_q: int,
                  block_k: int) -> tuple[_Lists, _Lists]:
    lay = pattern.blocks(q_len, kv_len, block_q, block_k)
    nq, nk = lay.layout.shape[-2:]
    layout = lay.layout.reshape(-1, nq, nk)
    by_q = _compact(layout)
    # The layout's own lists must agree with ours (same compaction rule).
    assert np.array_equal(by_q.indices, lay.kv_indices.reshape(-1))
    return by_q, _compact(layout.transpose(0, 2, 1))


def _head_mask(pattern: masks.Pattern, head, i, j):
    """The pattern's predicate for one (traced) head: per-head patterns select by `head`
    with a chain of wheres instead of a stacked head axis (no gathers in kernels)."""
    if pattern.num_heads is None:
        return jnp.broadcast_to(pattern.mask(i, j, jnp), i.shape)
    if isinstance(pattern, masks.PerHead):
        out = jnp.zeros(i.shape, jnp.bool_)
        for h, p in enumerate(pattern.patterns):
            out = jnp.where(head == h, _head_mask(p, head, i, j), out)
        return out
    if isinstance(pattern, (masks.Union, masks.Intersection)):
        parts = [_head_mask(p, head, i, j) for p in pattern.parts]
        op = (lambda a, b: a | b) if isinstance(pattern, masks.Union) else (lambda a, b: a & b)
        return functools.reduce(op, parts)
    raise NotImplementedError(f"per-head pattern {type(pattern).__name__} in a kernel")


def _keep(cfg: _Config, head, q_block, k_block, valid_1xBk, is_full):
    """Bool Bq x Bk: valid keys, and the pattern predicate on partial blocks only."""
    shape = (cfg.block_q, cfg.block_k)
    valid = jnp.broadcast_to(valid_1xBk != 0, shape)

    def partial():
        i = (q_block * cfg.block_q + lax.broadcasted_iota(jnp.int32, shape, 0)
             + (cfg.kv_len - cfg.q_len))
        j = k_block * cfg.block_k + lax.broadcasted_iota(jnp.int32, shape, 1)
        return valid & _head_mask(cfg.pattern, head, i, j)

    return lax.cond(is_full != 0, lambda: valid, partial)


def _dot(a, b, contract: tuple[int, int], dtype):
    """2-D matmul contracting a's dim contract[0] with b's contract[1], f32 accumulation."""
    precision = lax.Precision.HIGHEST if dtype == _F32 else None
    return lax.dot_general(a.astype(dtype), b.astype(dtype),
                           (((contract[0],), (contract[1],)), ((), ())),
                           precision=precision, preferred_element_type=_F32)


# Tile math shared by both flavours: one (query block, key block) pair.


def _fwd_step(q, k, v, keep, state, scale, drop=None):
    """Online softmax: folds one key block into (running max, normaliser, accumulator);
    `drop` (0 or 1/(1-rate) per weight) scales what reaches the accumulator only."""
    m_Bqx1, l_Bqx1, acc_BqxD = state
    s = jnp.where(keep, _dot(q, k, (1, 1), q.dtype) * scale, _NEG)
    m_new = jnp.maximum(m_Bqx1, jnp.max(s, axis=1, keepdims=True))
    # The where keeps masked entries at 0 even in a row whose keys are all masked.
    p = jnp.where(keep, jnp.exp(s - m_new), 0.0)
    alpha = jnp.exp(m_Bqx1 - m_new)
    return (m_new, alpha * l_Bqx1 + jnp.sum(p, axis=1, keepdims=True),
            alpha * acc_BqxD + _dot(p if drop is None else p * drop, v, (1, 0), v.dtype))


def _fwd_init(block_q: int, dim_v: int):
    return (jnp.full((block_q, 1), _NEG, _F32), jnp.zeros((block_q, 1), _F32),
            jnp.zeros((block_q, dim_v), _F32))


def _fwd_finish(state):
    """Output and log-sum-exp; a row with no key gets 0 (and lse 0, never used)."""
    m, l, acc = state
    seen = l > 0
    out = acc / jnp.where(seen, l, 1.0)
    return out, jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), 0.0)


def _probs_and_dlogits(q, k, v, do, lse, delta, keep, scale, drop):
    """Undropped weights P and dLogits. With dropout, O = (P * drop) V, so dP = (dO V^T)
    * drop, and delta = rowsum(dO * O) is still rowsum(P * dP)."""
    p = jnp.where(keep, jnp.exp(_dot(q, k, (1, 1), q.dtype) * scale - lse), 0.0)
    dp = _dot(do, v, (1, 1), v.dtype)
    if drop is not None:
        dp = dp * drop
    return p, p * (dp - delta)


def _dq_step(q, k, v, do, lse, delta, keep, dq, scale, drop=None):
    _, ds = _probs_and_dlogits(q, k, v, do, lse, delta, keep, scale, drop)
    return dq + _dot(ds, k, (1, 0), k.dtype) * scale


def _dkv_step(q, k, v, do, lse, delta, keep, state, scale, drop=None):
    dk, dv = state
    p, ds = _probs_and_dlogits(q, k, v, do, lse, delta, keep, scale, drop)
    return (dk + _dot(ds, q, (0, 0), q.dtype) * scale,
            dv + _dot(p if drop is None else p * drop, do, (0, 0), do.dtype))


# Attention dropout: murmur3's 32-bit finaliser as a counter-based generator, in int32
# (wrapping multiplies, logical shifts) so Triton, Mosaic and XLA compute the same bits.
def _as_int32(x: int) -> int:
    return int(np.array(x, np.uint32).view(np.int32))


_MIX1, _MIX2, _GOLDEN = _as_int32(0x85EBCA6B), _as_int32(0xC2B2AE35), _as_int32(0x9E3779B9)


def _fmix(x):
    x = x ^ lax.shift_right_logical(x, 16)
    x = x * _MIX1
    x = x ^ lax.shift_right_logical(x, 13)
    x = x * _MIX2
    return x ^ lax.shift_right_logical(x, 16)


def dropout_multiplier(seed, batch_head, i, j, rate: float) -> jax.Array:
    """f32 0 or 1/(1 - rate) for attention weight (batch_head, query i, key j) under int32
    `seed`; batch_head = batch * num_heads + head. Broadcasts; the kernels call it on
    tiles of iotas, the tests on whole index grids."""
    h = _fmix(jnp.asarray(seed, jnp.int32) ^ (jnp.asarray(batch_head, jnp.int32) * _GOLDEN))
    h = _fmix(_fmix(h ^ jnp.asarray(i, jnp.int32)) ^ jnp.asarray(j, jnp.int32))
    threshold = min(int(rate * 2.0**31), 2**31 - 1)
    keep = lax.shift_right_logical(h, 1) >= threshold  # 31 uniform bits, never negative
    return jnp.where(keep, jnp.float32(1.0 / (1.0 - rate)), jnp.float32(0.0))


def _batch_head(seed_ref, head):
    """The global batch * heads + head of this program (seed_ref: seed, batch offset,
    head offset, total heads; the offsets are non-zero inside a shard_map)."""
    return (seed_ref[1] + pl.program_id(0)) * seed_ref[3] + seed_ref[2] + head


def _drop(cfg: _Config, seed_ref, batch_head, q_block, k_block):
    """The dropout multipliers of one tile, or None without dropout."""
    if not cfg.dropout_rate:
        return None
    shape = (cfg.block_q, cfg.block_k)
    i = q_block * cfg.block_q + lax.broadcasted_iota(jnp.int32, shape, 0)
    j = k_block * cfg.block_k + lax.broadcasted_iota(jnp.int32, shape, 1)
    return dropout_multiplier(seed_ref[0], batch_head, i, j, cfg.dropout_rate)


# --------------------------------------------------------------------------------------
# The three passes on `[B, H, L, D]` arrays padded to whole tiles, two flavours each.

_ANY_SPEC = pl.BlockSpec(memory_space=pl.ANY)


def _poison_args(poison, n_in: int):
    """Extra inputs aliased to the outputs: the tests pass NaN so unwritten blocks show."""
    if poison is None:
        return (), {}
    return tuple(poison), {n_in + i: i for i in range(len(poison))}


def _call(kernel, cfg: _Config, name: str, grid, inputs, in_specs, out_shapes, out_specs,
          poison, *, num_scalar=0, scratch=()):
    extra, aliases = _poison_args(poison, len(inputs))  # inputs include the tables
    if cfg.platform == "gpu":
        params = dict(grid=grid, in_specs=list(in_specs) + [_ANY_SPEC] * len(extra),
                      out_specs=out_specs,
                      compiler_params=targets.triton_params(num_warps=4, num_stages=2))
    else:
        params = dict(
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=num_scalar, grid=grid,
                in_specs=list(in_specs) + [_ANY_SPEC] * len(extra), out_specs=out_specs,
                scratch_shapes=[pltpu.VMEM(s, _F32) for s in scratch]),
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")))
    return pl.pallas_call(kernel, out_shape=out_shapes, input_output_aliases=aliases,
                          interpret=cfg.interpret, name=f"block_sparse_{name}",
                          **params)(*inputs, *extra)


def _gpu_row(x):
    """Triton: a whole (batch, head) row; the kernel slices its tiles."""
    return pl.BlockSpec((pl.squeezed, pl.squeezed) + x.shape[2:], lambda b, h, i: (b, h, 0, 0))


def _gpu_block(rows: int, width: int):
    return pl.BlockSpec((pl.squeezed, pl.squeezed, rows, width), lambda b, h, i: (b, h, i, 0))


def _gpu_table(x):
    return pl.BlockSpec(x.shape, lambda b, h, i: (0,))


def _gpu_valid(x):
    return pl.BlockSpec((pl.squeezed, pl.squeezed, x.shape[2]), lambda b, h, i: (b, 0, 0))


def _row_of(lists: _Lists, head, block, n: int):
    return (head if lists.heads > 1 else 0) * n + block


def _tpu_tile(rows: int, width: int, index_map):
    return pl.BlockSpec((pl.squeezed, pl.squeezed, rows, width), index_map)


def _tpu_query_major_maps(by_q: _Lists, nq: int, m: int):
    """Index maps of the forward and dQ grids (b, h, query block, s): step s of query
    block qi visits key block idx[row * m + s] of the compacted layout."""

    def q_map(bi, hi, qi, s, *_):
        return bi, hi, qi, 0

    def kv_map(bi, hi, qi, s, idx, *_):
        return bi, hi, idx[_row_of(by_q, hi, qi, nq) * m + s], 0

    def valid_map(bi, hi, qi, s, idx, *_):
        return bi, 0, idx[_row_of(by_q, hi, qi, nq) * m + s]

    return q_map, kv_map, valid_map


def _forward(q, k, v, valid, seed, cfg: _Config, poison=None):
    """Padded inputs -> (out, lse Lq x 1 per row)."""
    by_q, _ = _lists(cfg)
    b, h, lq, _ = q.shape
    dv, nq, bq, bk = v.shape[-1], cfg.num_q_blocks, cfg.block_q, cfg.block_k
    out_shapes = (jax.ShapeDtypeStruct((b, h, lq, dv), q.dtype),
                  jax.ShapeDtypeStruct((b, h, lq, 1), _F32))
    tables = tuple(jnp.asarray(t) for t in (by_q.indices, by_q.counts, by_q.full)) + (seed,)
    m = by_q.width

    if cfg.platform == "gpu":
        def kernel(idx_ref, cnt_ref, full_ref, seed_ref, q_ref, k_ref, v_ref, valid_ref,
                   *refs):
            o_ref, lse_ref = refs[-2:]
            hi, qi = pl.program_id(1), pl.program_id(2)
            bh = _batch_head(seed_ref, hi)
            row = _row_of(by_q, hi, qi, nq)
            q_tile = q_ref[...]

            def body(s, state):
                kb = idx_ref[row * m + s]
                cols = pl.ds(pl.multiple_of(kb * bk, bk), bk)
                keep = _keep(cfg, hi, qi, kb, valid_ref[cols][None, :], full_ref[row * m + s])
                return _fwd_step(q_tile, k_ref[cols, :], v_ref[cols, :], keep, state,
                                 cfg.scale, _drop(cfg, seed_ref, bh, qi, kb))

            state = lax.fori_loop(0, cnt_ref[row], body, _fwd_init(bq, dv))
            out, lse = _fwd_finish(state)
            o_ref[...] = out.astype(o_ref.dtype)
            lse_ref[...] = lse

        return _call(kernel, cfg, "forward", (b, h, nq), tables + (q, k, v, valid),
                     [_gpu_table(t) for t in tables] + [
                         _gpu_block(bq, q.shape[-1]), _gpu_row(k), _gpu_row(v),
                         _gpu_valid(valid)],
                     out_shapes, [_gpu_block(bq, dv), _gpu_block(bq, 1)], poison)

    q_map, kv_map, valid_map = _tpu_query_major_maps(by_q, nq, m)

    def kernel(idx_ref, cnt_ref, full_ref, seed_ref, q_ref, k_ref, v_ref, valid_ref, *refs):
        o_ref, lse_ref, m_ref, l_ref, acc_ref = refs[-5:]
        hi, qi, s = pl.program_id(1), pl.program_id(2), pl.program_id(3)
        bh = _batch_head(seed_ref, hi)
        row = _row_of(by_q, hi, qi, nq)

        @pl.when(s == 0)
        def _init():
            for ref, x in zip((m_ref, l_ref, acc_ref), _fwd_init(bq, dv)):
                ref[...] = x

        @pl.when(s < cnt_ref[row])
        def _step():
            kb = idx_ref[row * m + s]
            keep = _keep(cfg, hi, qi, kb, valid_ref[...], full_ref[row * m + s])
            state = _fwd_step(q_ref[...], k_ref[...], v_ref[...], keep,
                              (m_ref[...], l_ref[...], acc_ref[...]), cfg.scale,
                              _drop(cfg, seed_ref, bh, qi, kb))
            for ref, x in zip((m_ref, l_ref, acc_ref), state):
                ref[...] = x

        @pl.when(s == m - 1)
        def _finish():
            out, lse = _fwd_finish((m_ref[...], l_ref[...], acc_ref[...]))
            o_ref[...] = out.astype(o_ref.dtype)
            lse_ref[...] = lse

    return _call(kernel, cfg, "forward", (b, h, nq, m), tables + (q, k, v, valid),
                 [_tpu_tile(bq, q.shape[-1], q_map), _tpu_tile(bk, k.shape[-1], kv_map),
                  _tpu_tile(bk, dv, kv_map), pl.BlockSpec((pl.squeezed, 1, bk), valid_map)],
                 out_shapes, [_tpu_tile(bq, dv, q_map), _tpu_tile(bq, 1, q_map)], poison,
                 num_scalar=4, scratch=((bq, 1), (bq, 1), (bq, dv)))


def _backward_dq(q, k, v, valid, seed, do, lse, delta, cfg: _Config, poison=None):
    """dQ: the forward's loop over each query block's key blocks."""
    by_q, _ = _lists(cfg)
    b, h, lq, dk = q.shape
    nq, bq, bk = cfg.num_q_blocks, cfg.block_q, cfg.block_k
    out_shapes = (jax.ShapeDtypeStruct((b, h, lq, dk), _F32),)
    tables = tuple(jnp.asarray(t) for t in (by_q.indices, by_q.counts, by_q.full)) + (seed,)
    m = by_q.width
    inputs = tables + (q, k, v, valid, do, lse, delta)

    if cfg.platform == "gpu":
        def kernel(idx_ref, cnt_ref, full_ref, seed_ref, q_ref, k_ref, v_ref, valid_ref,
                   do_ref, lse_ref, delta_ref, *refs):
            dq_ref = refs[-1]
            hi, qi = pl.program_id(1), pl.program_id(2)
            bh = _batch_head(seed_ref, hi)
            row = _row_of(by_q, hi, qi, nq)
            q_tile, do_tile, lse_tile, delta_tile = (
                r[...] for r in (q_ref, do_ref, lse_ref, delta_ref))

            def body(s, dq):
                kb = idx_ref[row * m + s]
                cols = pl.ds(pl.multiple_of(kb * bk, bk), bk)
                keep = _keep(cfg, hi, qi, kb, valid_ref[cols][None, :], full_ref[row * m + s])
                return _dq_step(q_tile, k_ref[cols, :], v_ref[cols, :], do_tile, lse_tile,
                                delta_tile, keep, dq, cfg.scale,
                                _drop(cfg, seed_ref, bh, qi, kb))

            dq_ref[...] = lax.fori_loop(0, cnt_ref[row], body, jnp.zeros((bq, dk), _F32))

        return _call(kernel, cfg, "backward_dq", (b, h, nq), inputs,
                     [_gpu_table(t) for t in tables] + [
                         _gpu_block(bq, dk), _gpu_row(k), _gpu_row(v), _gpu_valid(valid),
                         _gpu_block(bq, do.shape[-1]), _gpu_block(bq, 1), _gpu_block(bq, 1)],
                     out_shapes, [_gpu_block(bq, dk)], poison)[0]

    q_map, kv_map, valid_map = _tpu_query_major_maps(by_q, nq, m)

    def kernel(idx_ref, cnt_ref, full_ref, seed_ref, q_ref, k_ref, v_ref, valid_ref, do_ref,
               lse_ref, delta_ref, *refs):
        dq_ref, acc_ref = refs[-2:]
        hi, qi, s = pl.program_id(1), pl.program_id(2), pl.program_id(3)
        bh = _batch_head(seed_ref, hi)
        row = _row_of(by_q, hi, qi, nq)

        @pl.when(s == 0)
        def _init():
            acc_ref[...] = jnp.zeros(acc_ref.shape, _F32)

        @pl.when(s < cnt_ref[row])
        def _step():
            kb = idx_ref[row * m + s]
            keep = _keep(cfg, hi, qi, kb, valid_ref[...], full_ref[row * m + s])
            acc_ref[...] = _dq_step(q_ref[...], k_ref[...], v_ref[...], do_ref[...],
                                    lse_ref[...], delta_ref[...], keep, acc_ref[...],
                                    cfg.scale, _drop(cfg, seed_ref, bh, qi, kb))

        @pl.when(s == m - 1)
        def _finish():
            dq_ref[...] = acc_ref[...]

    return _call(kernel, cfg, "backward_dq", (b, h, nq, m), inputs,
                 [_tpu_tile(bq, dk, q_map), _tpu_tile(bk, k.shape[-1], kv_map),
                  _tpu_tile(bk, v.shape[-1], kv_map),
                  pl.BlockSpec((pl.squeezed, 1, bk), valid_map),
                  _tpu_tile(bq, do.shape[-1], q_map), _tpu_tile(bq, 1, q_map),
                  _tpu_tile(bq, 1, q_map)],
                 out_shapes, [_tpu_tile(bq, dk, q_map)], poison, num_scalar=4,
                 scratch=((bq, dk),))[0]


def _backward_dkv(q, k, v, valid, seed, do, lse, delta, cfg: _Config, poison=None):
    """dK and dV: each key block walks its list of query blocks (the transposed layout)."""
    _, by_k = _lists(cfg)
    b, h, lk, dk = k.shape
    dv, nk, bq, bk = v.shape[-1], cfg.num_k_blocks, cfg.block_q, cfg.block_k
    out_shapes = (jax.ShapeDtypeStruct((b, h, lk, dk), _F32),
                  jax.ShapeDtypeStruct((b, h, lk, dv), _F32))
    tables = tuple(jnp.asarray(t) for t in (by_k.indices, by_k.counts, by_k.full)) + (seed,)
    m = by_k.width
    inputs = tables + (q, k, v, valid, do, lse, delta)

    if cfg.platform == "gpu":
        def kernel(idx_ref, cnt_ref, full_ref, seed_ref, q_ref, k_ref, v_ref, valid_ref,
                   do_ref, lse_ref, delta_ref, *refs):
            dk_ref, dv_ref = refs[-2:]
            hi, ki = pl.program_id(1), pl.program_id(2)
            bh = _batch_head(seed_ref, hi)
            row = _row_of(by_k, hi, ki, nk)
            k_tile, v_tile, valid_tile = k_ref[...], v_ref[...], valid_ref[...][None, :]

            def body(s, state):
                qb = idx_ref[row * m + s]
                rows = pl.ds(pl.multiple_of(qb * bq, bq), bq)
                keep = _keep(cfg, hi, qb, ki, valid_tile, full_ref[row * m + s])
                return _dkv_step(q_ref[rows, :], k_tile, v_tile, do_ref[rows, :],
                                 lse_ref[rows, :], delta_ref[rows, :], keep, state, cfg.scale,
                                 _drop(cfg, seed_ref, bh, qb, ki))

            init = (jnp.zeros((bk, dk), _F32), jnp.zeros((bk, dv), _F32))
            dk_out, dv_out = lax.fori_loop(0, cnt_ref[row], body, init)
            dk_ref[...] = dk_out
            dv_ref[...] = dv_out

        valid_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, bk), lambda b, h, i: (b, 0, i))
        return _call(kernel, cfg, "backward_dkv", (b, h, nk), inputs,
                     [_gpu_table(t) for t in tables] + [
                         _gpu_row(q), _gpu_block(bk, dk), _gpu_block(bk, dv), valid_spec,
                         _gpu_row(do), _gpu_row(lse), _gpu_row(delta)],
                     out_shapes, [_gpu_block(bk, dk), _gpu_block(bk, dv)], poison)

    def q_map(bi, hi, ki, s, idx, *_):
        return bi, hi, idx[_row_of(by_k, hi, ki, nk) * m + s], 0

    def k_map(bi, hi, ki, s, *_):
        return bi, hi, ki, 0

    def valid_map(bi, hi, ki, s, *_):
        return bi, 0, ki

    def kernel(idx_ref, cnt_ref, full_ref, seed_ref, q_ref, k_ref, v_ref, valid_ref, do_ref,
               lse_ref, delta_ref, *refs):
        dk_ref, dv_ref, dk_acc, dv_acc = refs[-4:]
        hi, ki, s = pl.program_id(1), pl.program_id(2), pl.program_id(3)
        bh = _batch_head(seed_ref, hi)
        row = _row_of(by_k, hi, ki, nk)

        @pl.when(s == 0)
        def _init():
            dk_acc[...] = jnp.zeros(dk_acc.shape, _F32)
            dv_acc[...] = jnp.zeros(dv_acc.shape, _F32)

        @pl.when(s < cnt_ref[row])
        def _step():
            qb = idx_ref[row * m + s]
            keep = _keep(cfg, hi, qb, ki, valid_ref[...], full_ref[row * m + s])
            dk_new, dv_new = _dkv_step(q_ref[...], k_ref[...], v_ref[...], do_ref[...],
                                       lse_ref[...], delta_ref[...], keep,
                                       (dk_acc[...], dv_acc[...]), cfg.scale,
                                       _drop(cfg, seed_ref, bh, qb, ki))
            dk_acc[...] = dk_new
            dv_acc[...] = dv_new

        @pl.when(s == m - 1)
        def _finish():
            dk_ref[...] = dk_acc[...]
            dv_ref[...] = dv_acc[...]

    return _call(kernel, cfg, "backward_dkv", (b, h, nk, m), inputs,
                 [_tpu_tile(bq, q.shape[-1], q_map), _tpu_tile(bk, dk, k_map),
                  _tpu_tile(bk, dv, k_map),
                  pl.BlockSpec((pl.squeezed, 1, bk), valid_map),
                  _tpu_tile(bq, do.shape[-1], q_map), _tpu_tile(bq, 1, q_map),
                  _tpu_tile(bq, 1, q_map)],
                 out_shapes, [_tpu_tile(bk, dk, k_map), _tpu_tile(bk, dv, k_map)], poison,
                 num_scalar=4, scratch=((bk, dk), (bk, dv)))


# --------------------------------------------------------------------------------------
# Padding, custom VJP.


def _key_validity(padding_mask, b: int, kv_len: int, cfg: _Config) -> jax.Array:
    """int32 B x 1 x Kv_padded: 1 for real keys (not padding, not past the end)."""
    lk = cfg.num_k_blocks * cfg.block_k
    valid = (jnp.ones((b, kv_len), jnp.int32) if padding_mask is None
             else padding_mask.astype(jnp.int32))
    return jnp.pad(valid, ((0, 0), (0, lk - kv_len)))[:, None, :]


def _pad(x: jax.Array, length: int, cfg: _Config) -> jax.Array:
    dim = x.shape[-1]
    if cfg.platform == "gpu":
        dim = max(16, pl.next_power_of_2(dim))  # Triton tensors: powers of two, >= 16
    return jnp.pad(x, ((0, 0), (0, 0), (0, length - x.shape[2]), (0, dim - x.shape[3])))


def _padded_qkv(q, k, v, cfg: _Config):
    lq, lk = cfg.num_q_blocks * cfg.block_q, cfg.num_k_blocks * cfg.block_k
    return _pad(q, lq, cfg), _pad(k, lk, cfg), _pad(v, lk, cfg)


def _fwd_padded(q, k, v, valid, seed, cfg: _Config, poison=None):
    """Padded (out, lse) from unpadded inputs."""
    return _forward(*_padded_qkv(q, k, v, cfg), valid, seed, cfg, poison)


def _bwd_padded(q, k, v, valid, seed, out_p, lse, g, cfg: _Config, poison=None):
    """Unpadded (dq, dk, dv) from unpadded inputs, the padded forward results and g."""
    qp, kp, vp = _padded_qkv(q, k, v, cfg)
    gp = _pad(g, qp.shape[2], cfg)
    # delta_i = dO_i . O_i (in f32): the softmax Jacobian's row term.
    delta = jnp.sum(gp.astype(_F32) * out_p.astype(_F32), axis=-1, keepdims=True)
    args = (qp, kp, vp, valid, seed, gp, lse, delta, cfg)
    dq = _backward_dq(*args, None if poison is None else poison[:1])
    dk, dv = _backward_dkv(*args, None if poison is None else poison[1:])
    return (dq[:, :, :q.shape[2], :q.shape[3]].astype(q.dtype),
            dk[:, :, :k.shape[2], :k.shape[3]].astype(k.dtype),
            dv[:, :, :v.shape[2], :v.shape[3]].astype(v.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _pallas_attention(q, k, v, valid, seed, cfg: _Config):
    out, _ = _fwd_padded(q, k, v, valid, seed, cfg)
    return out[:, :, :q.shape[2], :v.shape[3]]


def _sharded_pallas_attention(q, k, v, valid, seed, cfg: _Config):
    """The kernels on each device's shard of the batch (and of the heads, for a pattern
    shared by all heads) when the enclosing logical rules and mesh shard them, as XLA
    cannot partition a Pallas call; the dropout hash gets global batch and head indices,
    so the result does not depend on the mesh."""
    b, h = q.shape[:2]
    axes = layers.mesh_axes(("batch", "act_heads" if cfg.pattern.num_heads is None else None),
                            (b, h))

    def local(q, k, v, valid, seed):
        lb, lh = q.shape[:2]
        offsets = [lax.axis_index(a) * n if a else 0 for a, n in zip(axes or (None, None),
                                                                     (lb, lh))]
        scalars = jnp.stack([seed, *(jnp.asarray(o, jnp.int32) for o in offsets),
                             jnp.int32(h)])
        return _pallas_attention(q, k, v, valid, scalars, cfg)

    if axes is None:
        return local(q, k, v, valid, seed)
    spec = P(*axes, None, None)
    return layers.manual_shards(local, (q, k, v, valid, seed),
                                (spec, spec, spec, P(axes[0], None, None), P()), spec, q)


def _pallas_attention_fwd(q, k, v, valid, seed, cfg: _Config):
    out, lse = _fwd_padded(q, k, v, valid, seed, cfg)
    return out[:, :, :q.shape[2], :v.shape[3]], (q, k, v, valid, seed, out, lse)


def _pallas_attention_bwd(cfg: _Config, residuals, g):
    q, k, v, valid, seed, out, lse = residuals
    return _bwd_padded(q, k, v, valid, seed, out, lse, g, cfg) + (None, None)


_pallas_attention.defvjp(_pallas_attention_fwd, _pallas_attention_bwd)

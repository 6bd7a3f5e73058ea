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

This file: the entry point and the XLA path; the Pallas kernels are in
models/kernels/block_sparse_pallas.py (the programs, padding, custom VJP) and
models/kernels/block_sparse_tiles.py (what a tile computes, the block lists, the dropout
hash).
"""
from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from models import masks
from models.kernels import block_sparse_mgpu, mgpu_common, reference, targets, tuning
from models.kernels.block_sparse_pallas import key_validity, sharded_pallas_attention
from models.kernels.block_sparse_tiles import dropout_multiplier, make_config

BACKENDS = ("xla", "pallas")
DropoutFn = Callable[[jax.Array], jax.Array]


def block_sparse_attention(q_BxHxQxK: jax.Array, k_BxHxKvxK: jax.Array,
                           v_BxHxKvxD: jax.Array, pattern: masks.Pattern, *,
                           padding_mask: jax.Array | None = None, backend: str = "xla",
                           block_q: int | None = None, block_k: int | None = None,
                           dropout_fn: DropoutFn | None = None, dropout_rate: float = 0.0,
                           dropout_seed: jax.Array | None = None, platform: str | None = None,
                           interpret: bool | None = None, gpu_form: str = "triton") -> jax.Array:
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
    `gpu_form="mosaic"` runs the GPU flavour as the Mosaic GPU kernels (`block_sparse_mgpu`:
    forward, dQ and dK/dV; on CPU in the Mosaic GPU interpreter inside
    `mgpu_common.interpreted()`) where they take the call, else the Triton form, said
    once.
    """
    mgpu_common.check_gpu_form(gpu_form)
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
            # The tuning table's tile where the caller gave none (compiled Triton only).
            tile, launch = tuning.for_target("block_sparse", target, q_BxHxQxK.dtype,
                                             q_BxHxQxK.shape[3], max(q_len, kv_len), None)
            cfg = make_config(q_BxHxQxK, k_BxHxKvxK, pattern, block_q=block_q or tile,
                              block_k=block_k or tile, platform=target.platform,
                              interpret=targets.interpret_for(target, interpret),
                              dropout_rate=dropout_rate)._replace(triton=launch)
            if target.platform == "gpu" and gpu_form == "mosaic":
                cfg = _mosaic_or_triton(cfg, q_BxHxQxK, v_BxHxKvxD)
                if cfg.gpu_form != "mosaic" and targets.triton_missing(target):
                    return build(targets.Target("xla", None, False))

            def run(q, k, v, padding_mask, seed):
                valid = key_validity(padding_mask, b, kv_len, cfg)
                return sharded_pallas_attention(q, k, v, valid, seed, cfg)

            return run

        # The kernel form follows the platform the program is lowered for (models/kernels/
        # targets.py), not the host that traces it.
        return targets.dispatch(build, (q_BxHxQxK, k_BxHxKvxK, v_BxHxKvxD, padding_mask, seed),
                                platform=platform, interpret=interpret,
                                mosaic_gpu=gpu_form == "mosaic" and mgpu_common.available())
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


def _mosaic_or_triton(cfg, q, v):
    """cfg with the Mosaic GPU kernels where they take the call (their tiles are 64 x 64
    whatever was asked: only the tiling changes)."""
    tiled = cfg._replace(block_q=block_sparse_mgpu.BLOCK, block_k=block_sparse_mgpu.BLOCK)
    why = lambda: block_sparse_mgpu.supports(tiled, q.dtype, q.shape[-1],  # noqa: E731
                                             v.shape[-1])
    if mgpu_common.takes("block-sparse attention", cfg.interpret, why):
        return tiled._replace(gpu_form="mosaic")
    return cfg


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

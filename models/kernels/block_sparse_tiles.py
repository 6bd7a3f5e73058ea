"""Block-sparse attention's Pallas kernels, what they compute per tile
(models/kernels/block_sparse_pallas.py runs them): the kernel's configuration (tile sizes
for the target, make_config), the compacted per-query-block lists of key blocks and
their transpose (the block layout the programs walk), the pattern predicate on a tile,
the online-softmax steps of the forward pass and of the dQ and dK/dV passes, and the
attention-dropout keep mask, a counter-based hash of (seed, batch, head, query, key)
recomputed tile by tile (dropout_multiplier): the same mask in all three passes, none
in memory."""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from models import masks
from models.kernels import mgpu_common, targets

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
    # "triton", or "mosaic": the Mosaic GPU kernels (block_sparse_mgpu.py).
    gpu_form: str = "triton"
    # Triton's (num_warps, num_stages) from models/kernels/tuning.py; None: the defaults
    triton: tuple[int, int] | None = None

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
                dropout_rate: float = 0.0, gpu_form: str = "triton") -> _Config:
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
    mgpu_common.check_gpu_form(gpu_form)
    return _Config(pattern, q_len, kv_len, bq, bk, 1.0 / math.sqrt(q.shape[-1]), platform,
                   targets.interpret_mode(interpret, platform), float(dropout_rate), gpu_form)


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

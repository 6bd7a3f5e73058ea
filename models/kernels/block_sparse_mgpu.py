"""Block-sparse softmax attention as Mosaic GPU kernels (issue 70): forward, dQ, dK/dV.

The Triton form (models/kernels/block_sparse_pallas.py) is the one `pl.pallas_call` lowers
on a GPU while JAX keeps its Triton backend (deprecated in 0.11). These are the same passes
written for Mosaic GPU (`plgpu.kernel`), the way JAX's FlashAttention-3 example
(`jax/experimental/pallas/ops/gpu/attention_mgpu.py`) is written, with our block lists.
Not yet its warp specialisation (a TMA warpgroup beside two compute warpgroups) nor
register operands for P: a first form that is right, to be tuned on a GPU:

- one CTA (one warpgroup) per (batch, head, query block) of 64 rows; its query tile is
  TMA-loaded once into 128-byte-swizzled shared memory;
- `plgpu.emit_pipeline` walks that block's list of non-empty key blocks (a data-dependent
  trip count, the list read from global memory in the index maps), TMA-loading key,
  value and key-validity tiles one step ahead of the compute (two buffers);
- Q K^T and P V are `wgmma`s (P through shared memory) into register accumulators; the
  online softmax, the key-validity mask and the pattern's predicate (where a block is
  partial) run in registers in the WGMMA layout, `block_sparse_tiles._fwd_step` step for
  step;
- the output and the log-sum-exp go back through shared memory by TMA;
- the backward is FlashAttention-2's two passes, as the Triton form's: dQ walks the same
  lists, dK/dV each key block's list of query blocks (the transposed layout) with the
  tiles transposed (keys on the rows), both recomputing P from the log-sum-exp; dS and P
  go through shared memory into the next wgmma.

What it takes: 16-bit q/k/v (wgmma's operands; float32 stays on Triton), head dims padded
to a multiple of 64 (one 128-byte swizzle row), 64 x 64 tiles. Attention dropout is the
Triton form's hashed keep mask (`block_sparse_tiles.dropout_multiplier`, the same bits).
`supports(cfg, dtype, ...)` says whether a call fits, and why not in one line.

Checked on a CPU only: numerics in the Mosaic GPU interpreter (`plgpu.InterpretGPUParams`,
race detection on) and the lowering for sm_90 under an abstract H100
(tests/kernels/test_block_sparse_mgpu.py, JAX 0.12). Never run on a GPU.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from models.kernels import mgpu_common
from models.kernels.block_sparse_tiles import (_F32, _NEG, _Config, _head_mask, _lists,
                                               dropout_multiplier)

BLOCK = 64  # a warpgroup's wgmma M; 64 16-bit values are one 128-byte swizzle row
_LOG2E = 1.4426950408889634


def supports(cfg: _Config, dtype, dim_k: int, dim_v: int) -> str | None:
    """None where the Mosaic GPU forward takes this call, else the reason in one line."""
    if mgpu_common.unavailable():
        return mgpu_common.unavailable()
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"wgmma takes 16-bit operands, got {jnp.dtype(dtype).name}"
    if (cfg.block_q, cfg.block_k) != (BLOCK, BLOCK):
        return f"tiles are {BLOCK} x {BLOCK}, got {cfg.block_q} x {cfg.block_k}"
    if max(dim_k, dim_v) > 256:
        return f"head dims up to 256, got {dim_k} / {dim_v}"
    return None


def _tile_of(scalar, like):
    """A scalar as a tile shaped (and laid out) like `like`: a per-head pattern selects by
    `where(head == h, ...)`, and Mosaic GPU has no implicit broadcast of a scalar
    condition (a scalar operand of arithmetic is fine)."""
    return like * 0 + scalar


def _padded_dim(d: int) -> int:
    return -(-d // BLOCK) * BLOCK


def forward(q, k, v, valid, seed, cfg: _Config, interpret: bool = False):
    """Padded 16-bit `[B, H, L, D]` q, k, v (L whole tiles), int32 B x 1 x Kv key
    validity and the Triton form's int32 scalars (seed, batch offset, head offset, total
    heads) -> (out `[B, H, Lq, Dv]`, lse `[B, H, Lq, 1]` f32), as the Triton forward."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    by_q, _ = _lists(cfg)
    b, h, lq, dk0 = q.shape
    dv0 = v.shape[-1]
    dk, dv = _padded_dim(dk0), _padded_dim(dv0)
    pad_d = lambda x, d: jnp.pad(x, ((0, 0),) * 3 + ((0, d - x.shape[-1]),))
    q, k, v = pad_d(q, dk), pad_d(k, dk), pad_d(v, dv)
    nq, bq, bk, m = cfg.num_q_blocks, cfg.block_q, cfg.block_k, by_q.width
    per_head = by_q.heads > 1
    idx, cnt, full = (jnp.asarray(t) for t in (by_q.indices, by_q.counts, by_q.full))
    valid = valid[:, 0, :]
    dtype = q.dtype
    swizzled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    wgmma_rows = plgpu.Layout.WGMMA.reduce(1)  # one value per query row
    wgmma_cols = plgpu.Layout.WGMMA.reduce(0)  # one value per key column

    def body(idx_g, cnt_g, full_g, seed_g, q_g, k_g, v_g, valid_g, o_g, lse_g, q_s, p_s, o_s,
             lse_s, bar):
        bi, hi, qi = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("q")
        batch_head = (seed_g[1] + bi) * seed_g[3] + seed_g[2] + hi  # as _batch_head
        row = (hi if per_head else 0) * nq + qi
        n = cnt_g[row]
        rows = pl.ds(qi * bq, bq)
        plgpu.copy_gmem_to_smem(q_g.at[bi, hi, rows], q_s, bar.at[0])
        plgpu.barrier_wait(bar.at[0])
        i = (qi * bq + (cfg.kv_len - cfg.q_len)
             + plgpu.broadcasted_iota(jnp.int32, (bq, bk), 0, layout=plgpu.Layout.WGMMA))
        j0 = plgpu.broadcasted_iota(jnp.int32, (bq, bk), 1, layout=plgpu.Layout.WGMMA)

        def step(indices, k_s, v_s, valid_s, carry):
            m_i, l_i, acc = carry
            slot = row * m + indices[0]
            kb = idx_g[slot]

            def qk(acc_ref):
                plgpu.wgmma(acc_ref, q_s, k_s.transpose((1, 0)))
                return acc_ref[...]

            s = pl.run_scoped(qk, plgpu.ACC((bq, bk), _F32)) * cfg.scale
            key_ok = plgpu.load(valid_s, layout=wgmma_cols) != 0
            keep = lax.broadcast_in_dim(key_ok, (bq, bk), [1])
            pattern_ok = _head_mask(cfg.pattern, _tile_of(hi, i), i, kb * bk + j0)
            keep = keep & (pattern_ok | (full_g[slot] != 0))
            s = jnp.where(keep, s, _NEG)
            m_new = jnp.maximum(m_i, s.max(axis=1))
            p = jnp.where(keep, jnp.exp2((s - lax.broadcast_in_dim(m_new, (bq, bk), [0]))
                                         * _LOG2E), 0.0)
            alpha = jnp.exp2((m_i - m_new) * _LOG2E)
            l_new = alpha * l_i + p.sum(axis=1)  # undropped

            if cfg.dropout_rate:  # the weights that reach V only (as _fwd_step)
                p = p * dropout_multiplier(seed_g[0], batch_head, i - (cfg.kv_len - cfg.q_len),
                                           kb * bk + j0, cfg.dropout_rate)
            # P goes through shared memory: the GPU interpreter takes wgmma operands from
            # shared memory only (JAX 0.12), so the register-operand form is untestable.
            p_s[...] = p.astype(dtype)
            plgpu.commit_smem()

            def pv(acc_ref):
                plgpu.wgmma(acc_ref, p_s, v_s)
                return acc_ref[...]

            acc = (lax.broadcast_in_dim(alpha, (bq, dv), [0]) * acc
                   + pl.run_scoped(pv, plgpu.ACC((bq, dv), _F32)))
            return m_new, l_new, acc

        init = (plgpu.layout_cast(jnp.full((bq,), _NEG, _F32), wgmma_rows),
                plgpu.layout_cast(jnp.zeros((bq,), _F32), wgmma_rows),
                plgpu.layout_cast(jnp.zeros((bq, dv), _F32), plgpu.Layout.WGMMA))
        key_block = lambda s: (idx_g[row * m + s], 0)
        pipeline = plgpu.emit_pipeline(
            step, grid=(n,), max_concurrent_steps=2, init_carry=init,
            in_specs=[plgpu.BlockSpec((bk, dk), key_block, transforms=swizzled),
                      plgpu.BlockSpec((bk, dv), key_block, transforms=swizzled),
                      plgpu.BlockSpec((bk,), lambda s: (idx_g[row * m + s],))])
        m_i, l_i, acc = pipeline(k_g.at[bi, hi], v_g.at[bi, hi], valid_g.at[bi])
        # _fwd_finish: a row with no key gets 0 (and lse 0, never used).
        seen = l_i > 0
        safe_l = jnp.where(seen, l_i, 1.0)
        o_s[...] = (acc / lax.broadcast_in_dim(safe_l, (bq, dv), [0])).astype(dtype)
        lse_s[...] = jnp.where(seen, m_i + jnp.log(safe_l), 0.0)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_s, o_g.at[bi, hi, rows])
        plgpu.copy_smem_to_gmem(lse_s, lse_g.at[bi, hi, rows])
        plgpu.wait_smem_to_gmem(0)

    kernel = plgpu.kernel(
        body,
        out_type=(jax.ShapeDtypeStruct((b, h, lq, dv), dtype),
                  jax.ShapeDtypeStruct((b, h, lq), _F32)),
        grid=(b, h, nq), grid_names=("b", "h", "q"),
        scratch_types=[plgpu.SMEM((bq, dk), dtype, transforms=swizzled),
                       plgpu.SMEM((bq, bk), dtype, transforms=swizzled),
                       plgpu.SMEM((bq, dv), dtype, transforms=swizzled),
                       plgpu.SMEM((bq,), _F32), plgpu.Barrier(num_barriers=1)],
        interpret=plgpu.InterpretGPUParams(detect_races=True) if interpret else False,
    )
    out, lse = kernel(idx, cnt, full, seed, q, k, v, valid)
    return out[..., :dv0], lse[..., None]


def backward(q, k, v, valid, seed, do, lse, delta, cfg: _Config, interpret: bool = False):
    """The Triton form's two backward passes as Mosaic GPU kernels: padded q, k, v, dO
    (16-bit), the forward's lse and delta = rowsum(dO * O) (`[B, H, Lq, 1]` f32) ->
    (dq, dk, dv) in f32, padded as the inputs (`block_sparse_tiles._dq_step`,
    `_dkv_step`)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    dk0, dv0 = q.shape[-1], v.shape[-1]
    dk, dv = _padded_dim(dk0), _padded_dim(dv0)
    pad_d = lambda x, d: jnp.pad(x, ((0, 0),) * 3 + ((0, d - x.shape[-1]),))
    dtype = q.dtype
    q, k, v, do = pad_d(q, dk), pad_d(k, dk), pad_d(v, dv), pad_d(do.astype(dtype), dv)
    args = (q, k, v, valid[:, 0, :], seed, do, lse[..., 0], delta[..., 0], cfg, interpret)
    dq = _backward_dq(*args, plgpu)
    dk_, dv_ = _backward_dkv(*args, plgpu)
    return dq[..., :dk0], dk_[..., :dk0], dv_[..., :dv0]


def _common(plgpu, interpret):
    swizzled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    params = plgpu.InterpretGPUParams(detect_races=True) if interpret else False
    return swizzled, params, plgpu.Layout.WGMMA.reduce(1), plgpu.Layout.WGMMA.reduce(0)


def _backward_dq(q, k, v, valid, seed, do, lse, delta, cfg, interpret, plgpu):
    """dQ: each query block walks its key blocks, as the forward."""
    by_q, _ = _lists(cfg)
    b, h, lq, dk = q.shape
    dv, dtype = v.shape[-1], q.dtype
    nq, bq, bk, m = cfg.num_q_blocks, cfg.block_q, cfg.block_k, by_q.width
    per_head = by_q.heads > 1
    swizzled, params, wgmma_rows, wgmma_cols = _common(plgpu, interpret)
    offset = cfg.kv_len - cfg.q_len

    def body(idx_g, cnt_g, full_g, seed_g, q_g, k_g, v_g, valid_g, do_g, lse_g, delta_g,
             dq_g, q_s, do_s, ds_s, lse_s, delta_s, dq_s, bar):
        bi, hi, qi = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("q")
        batch_head = (seed_g[1] + bi) * seed_g[3] + seed_g[2] + hi
        row = (hi if per_head else 0) * nq + qi
        rows = pl.ds(qi * bq, bq)
        for n_, (src, dst) in enumerate(((q_g.at[bi, hi, rows], q_s),
                                         (do_g.at[bi, hi, rows], do_s),
                                         (lse_g.at[bi, hi, rows], lse_s),
                                         (delta_g.at[bi, hi, rows], delta_s))):
            plgpu.copy_gmem_to_smem(src, dst, bar.at[n_])
        for n_ in range(4):
            plgpu.barrier_wait(bar.at[n_])
        lse_b = lax.broadcast_in_dim(plgpu.load(lse_s, layout=wgmma_rows), (bq, bk), [0])
        delta_b = lax.broadcast_in_dim(plgpu.load(delta_s, layout=wgmma_rows), (bq, bk), [0])
        i = qi * bq + offset + plgpu.broadcasted_iota(jnp.int32, (bq, bk), 0,
                                                      layout=plgpu.Layout.WGMMA)
        j0 = plgpu.broadcasted_iota(jnp.int32, (bq, bk), 1, layout=plgpu.Layout.WGMMA)

        def step(indices, k_s, v_s, valid_s, dq):
            slot = row * m + indices[0]
            kb = idx_g[slot]
            s = _mma(plgpu, q_s, k_s.transpose((1, 0)), (bq, bk)) * cfg.scale
            keep = lax.broadcast_in_dim(plgpu.load(valid_s, layout=wgmma_cols) != 0,
                                        (bq, bk), [1])
            keep = keep & (_head_mask(cfg.pattern, _tile_of(hi, i), i, kb * bk + j0)
                           | (full_g[slot] != 0))
            p = jnp.where(keep, jnp.exp2((s - lse_b) * _LOG2E), 0.0)
            dp = _mma(plgpu, do_s, v_s.transpose((1, 0)), (bq, bk))
            if cfg.dropout_rate:
                dp = dp * dropout_multiplier(seed_g[0], batch_head, i - offset, kb * bk + j0,
                                             cfg.dropout_rate)
            ds_s[...] = (p * (dp - delta_b)).astype(dtype)
            plgpu.commit_smem()
            return dq + _mma(plgpu, ds_s, k_s, (bq, dk)) * cfg.scale

        key_block = lambda s: (idx_g[row * m + s], 0)
        dq = plgpu.emit_pipeline(
            step, grid=(cnt_g[row],), max_concurrent_steps=2,
            init_carry=plgpu.layout_cast(jnp.zeros((bq, dk), _F32), plgpu.Layout.WGMMA),
            in_specs=[plgpu.BlockSpec((bk, dk), key_block, transforms=swizzled),
                      plgpu.BlockSpec((bk, dv), key_block, transforms=swizzled),
                      plgpu.BlockSpec((bk,), lambda s: (idx_g[row * m + s],))],
        )(k_g.at[bi, hi], v_g.at[bi, hi], valid_g.at[bi])
        dq_s[...] = dq
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(dq_s, dq_g.at[bi, hi, rows])
        plgpu.wait_smem_to_gmem(0)

    kernel = plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((b, h, lq, dk), _F32),
        grid=(b, h, nq), grid_names=("b", "h", "q"),
        scratch_types=[plgpu.SMEM((bq, dk), dtype, transforms=swizzled),
                       plgpu.SMEM((bq, dv), dtype, transforms=swizzled),
                       plgpu.SMEM((bq, bk), dtype, transforms=swizzled),
                       plgpu.SMEM((bq,), _F32), plgpu.SMEM((bq,), _F32),
                       plgpu.SMEM((bq, dk), _F32), plgpu.Barrier(num_barriers=4)],
        interpret=params)
    tables = (jnp.asarray(t) for t in (by_q.indices, by_q.counts, by_q.full))
    return kernel(*tables, seed, q, k, v, valid, do, lse, delta)


def _backward_dkv(q, k, v, valid, seed, do, lse, delta, cfg, interpret, plgpu):
    """dK and dV: each key block walks its query blocks (the transposed layout); the tiles
    are the transposed ones (keys on the rows), so no operand is transposed twice."""
    _, by_k = _lists(cfg)
    b, h, lk, dk = k.shape
    dv, dtype = v.shape[-1], q.dtype
    nk, bq, bk, m = cfg.num_k_blocks, cfg.block_q, cfg.block_k, by_k.width
    per_head = by_k.heads > 1
    swizzled, params, wgmma_rows, wgmma_cols = _common(plgpu, interpret)
    offset = cfg.kv_len - cfg.q_len

    def body(idx_g, cnt_g, full_g, seed_g, q_g, k_g, v_g, valid_g, do_g, lse_g, delta_g,
             dk_g, dv_g, k_s, v_s, valid_s, pt_s, dst_s, dk_s, dv_s, bar):
        bi, hi, ki = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("k")
        batch_head = (seed_g[1] + bi) * seed_g[3] + seed_g[2] + hi
        row = (hi if per_head else 0) * nk + ki
        cols = pl.ds(ki * bk, bk)
        for n_, (src, dst) in enumerate(((k_g.at[bi, hi, cols], k_s),
                                         (v_g.at[bi, hi, cols], v_s),
                                         (valid_g.at[bi, cols], valid_s))):
            plgpu.copy_gmem_to_smem(src, dst, bar.at[n_])
        for n_ in range(3):
            plgpu.barrier_wait(bar.at[n_])
        key_ok = lax.broadcast_in_dim(plgpu.load(valid_s, layout=wgmma_rows) != 0,
                                      (bk, bq), [0])
        j = ki * bk + plgpu.broadcasted_iota(jnp.int32, (bk, bq), 0, layout=plgpu.Layout.WGMMA)
        i0 = offset + plgpu.broadcasted_iota(jnp.int32, (bk, bq), 1,
                                             layout=plgpu.Layout.WGMMA)

        def step(indices, q_s, do_s, lse_s, delta_s, carry):
            d_k, d_v = carry
            slot = row * m + indices[0]
            qb = idx_g[slot]
            i = qb * bq + i0
            st = _mma(plgpu, k_s, q_s.transpose((1, 0)), (bk, bq)) * cfg.scale
            keep = key_ok & (_head_mask(cfg.pattern, _tile_of(hi, i), i, j)
                             | (full_g[slot] != 0))
            lse_c = lax.broadcast_in_dim(plgpu.load(lse_s, layout=wgmma_cols), (bk, bq), [1])
            delta_c = lax.broadcast_in_dim(plgpu.load(delta_s, layout=wgmma_cols), (bk, bq),
                                           [1])
            pt = jnp.where(keep, jnp.exp2((st - lse_c) * _LOG2E), 0.0)
            dpt = _mma(plgpu, v_s, do_s.transpose((1, 0)), (bk, bq))
            pt_dropped = pt
            if cfg.dropout_rate:
                drop = dropout_multiplier(seed_g[0], batch_head, i - offset, j,
                                          cfg.dropout_rate)
                dpt, pt_dropped = dpt * drop, pt * drop
            pt_s[...] = pt_dropped.astype(dtype)
            dst_s[...] = (pt * (dpt - delta_c)).astype(dtype)
            plgpu.commit_smem()
            return (d_k + _mma(plgpu, dst_s, q_s, (bk, dk)) * cfg.scale,
                    d_v + _mma(plgpu, pt_s, do_s, (bk, dv)))

        query_block = lambda s: (idx_g[row * m + s], 0)
        zeros = lambda d: plgpu.layout_cast(jnp.zeros((bk, d), _F32), plgpu.Layout.WGMMA)
        d_k, d_v = plgpu.emit_pipeline(
            step, grid=(cnt_g[row],), max_concurrent_steps=2, init_carry=(zeros(dk), zeros(dv)),
            in_specs=[plgpu.BlockSpec((bq, dk), query_block, transforms=swizzled),
                      plgpu.BlockSpec((bq, dv), query_block, transforms=swizzled),
                      plgpu.BlockSpec((bq,), lambda s: (idx_g[row * m + s],)),
                      plgpu.BlockSpec((bq,), lambda s: (idx_g[row * m + s],))],
        )(q_g.at[bi, hi], do_g.at[bi, hi], lse_g.at[bi, hi], delta_g.at[bi, hi])
        dk_s[...] = d_k
        dv_s[...] = d_v
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(dk_s, dk_g.at[bi, hi, cols])
        plgpu.copy_smem_to_gmem(dv_s, dv_g.at[bi, hi, cols])
        plgpu.wait_smem_to_gmem(0)

    kernel = plgpu.kernel(
        body, out_type=(jax.ShapeDtypeStruct((b, h, lk, dk), _F32),
                        jax.ShapeDtypeStruct((b, h, lk, dv), _F32)),
        grid=(b, h, nk), grid_names=("b", "h", "k"),
        scratch_types=[plgpu.SMEM((bk, dk), dtype, transforms=swizzled),
                       plgpu.SMEM((bk, dv), dtype, transforms=swizzled),
                       plgpu.SMEM((bk,), jnp.int32),
                       plgpu.SMEM((bk, bq), dtype, transforms=swizzled),
                       plgpu.SMEM((bk, bq), dtype, transforms=swizzled),
                       plgpu.SMEM((bk, dk), _F32), plgpu.SMEM((bk, dv), _F32),
                       plgpu.Barrier(num_barriers=3)],
        interpret=params)
    tables = (jnp.asarray(t) for t in (by_k.indices, by_k.counts, by_k.full))
    return kernel(*tables, seed, q, k, v, valid, do, lse, delta)


def _mma(plgpu, a_s, b_s, shape):
    """a @ b of two shared-memory tiles, f32 accumulation, into registers."""
    def run(acc_ref):
        plgpu.wgmma(acc_ref, a_s, b_s)
        return acc_ref[...]
    return pl.run_scoped(run, plgpu.ACC(shape, _F32))

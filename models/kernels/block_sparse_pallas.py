"""Block-sparse softmax attention's Pallas kernels (models/kernels/block_sparse_attention.py
calls them for backend="pallas"): flash attention (online softmax, log-sum-exp residual)
over the pattern's block layout, GPU (Triton) and TPU (Mosaic), interpreted on CPU. One
program per (batch, head, query block) walks that block's list of non-empty key blocks;
the pattern predicate (built from iotas) masks only partial blocks, the key-validity
vector (padding and keys past the end) masks every block. Custom VJP, FlashAttention-2
style: a dQ pass over the same per-query-block lists and a dK/dV pass over per-key-block
lists of query blocks (the transposed layout), both recomputing the probabilities from
the log-sum-exp. What a tile computes (the steps, the lists, the dropout hash) is in
models/kernels/block_sparse_tiles.py.

- GPU: grid (B, H, blocks); the block lists are int32 inputs and the loop over them is a
  `fori_loop` with a data-dependent bound, so empty blocks cost nothing.
- TPU: grid (B, H, blocks, list slot) with `PrefetchScalarGridSpec`: the compacted lists
  are prefetched scalars that drive the index maps; padded slots repeat the last valid
  index, so the pipeline fetches nothing new, and `pl.when` skips their compute.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from models import layers
from models.kernels import block_sparse_mgpu, targets
from models.kernels.block_sparse_tiles import (_F32, _Config, _Lists, _batch_head, _dkv_step,
                                               _dq_step, _drop, _fwd_finish, _fwd_init,
                                               _fwd_step, _keep, _lists)


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
                      compiler_params=targets.triton_launch(cfg.triton, default=(4, 2)))
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
    if cfg.platform == "gpu" and cfg.gpu_form == "mosaic":
        return block_sparse_mgpu.forward(q, k, v, valid, seed, cfg, interpret=cfg.interpret)
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


def key_validity(padding_mask, b: int, kv_len: int, cfg: _Config) -> jax.Array:
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
    if cfg.platform == "gpu" and cfg.gpu_form == "mosaic":
        dq, dk, dv = block_sparse_mgpu.backward(qp, kp, vp, valid, seed, gp, lse, delta, cfg,
                                                interpret=cfg.interpret)
    else:
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


def sharded_pallas_attention(q, k, v, valid, seed, cfg: _Config):
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

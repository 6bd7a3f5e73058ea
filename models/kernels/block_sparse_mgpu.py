"""Block-sparse softmax attention's forward pass as a Mosaic GPU kernel (issue 70).

The Triton form (models/kernels/block_sparse_pallas.py) is the one `pl.pallas_call` lowers
on a GPU while JAX keeps its Triton backend (deprecated in 0.11). This is the same forward
written for Mosaic GPU (`plgpu.kernel`), the way JAX's FlashAttention-3 example
(`jax/experimental/pallas/ops/gpu/attention_mgpu.py`) is written, with our block lists:

- one CTA (one warpgroup) per (batch, head, query block) of 64 rows; its query tile is
  TMA-loaded once into 128-byte-swizzled shared memory;
- `plgpu.emit_pipeline` walks that block's list of non-empty key blocks (a data-dependent
  trip count, the list read from global memory in the index maps), TMA-loading key,
  value and key-validity tiles two steps ahead of the compute;
- Q K^T and P V are `wgmma`s (P through shared memory) into register accumulators; the
  online softmax, the
  key-validity mask and the pattern's predicate (on partial blocks only) run in registers
  in the WGMMA layout, the tile math of `block_sparse_tiles._fwd_step` step for step;
- the output and the log-sum-exp go back through shared memory by TMA. The log-sum-exp is
  the Triton form's, so the backward passes (dQ, dK/dV) stay the Triton kernels.

What it takes: 16-bit q/k/v (wgmma's operands; float32 stays on Triton), head dims padded
to a multiple of 64 (one 128-byte swizzle row), 64 x 64 tiles. Attention dropout is the
Triton form's hashed keep mask (`block_sparse_tiles.dropout_multiplier`, the same bits),
so its backward recomputes the same mask. `supports(cfg, dtype)` says whether a call fits, and
why not in one line.

Checked on a CPU only: numerics in the Mosaic GPU interpreter (`plgpu.InterpretGPUParams`,
race detection on) and the lowering for sm_90 under an abstract H100
(tests/kernels/test_block_sparse_mgpu.py, JAX 0.12). Never run on a GPU.
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from models.kernels.block_sparse_tiles import (_F32, _NEG, _Config, _head_mask, _lists,
                                               dropout_multiplier)

BLOCK = 64  # a warpgroup's wgmma M; 64 16-bit values are one 128-byte swizzle row
_LOG2E = 1.4426950408889634


_INTERPRET = [False]


@contextlib.contextmanager
def interpreted():
    """Within it, a CPU run of `gpu_form="mosaic"` takes this kernel in the Mosaic GPU
    interpreter; outside it takes the Triton form in the Pallas interpreter. The GPU
    interpreter's ordered callbacks cannot sit beside a compiled form in
    `lax.platform_dependent`, so a program traced inside it lowers for the CPU only."""
    _INTERPRET.append(True)
    try:
        yield
    finally:
        _INTERPRET.pop()


def interpreting() -> bool:
    return _INTERPRET[-1]


def available() -> bool:
    """Whether this JAX has the Mosaic GPU API the kernel is written against (0.12's:
    `plgpu.kernel` grids, `emit_pipeline` carries, the GPU interpreter)."""
    try:
        from jax.experimental.pallas import mosaic_gpu as plgpu
    except ImportError:
        return False
    return all(hasattr(plgpu, n) for n in ("kernel", "emit_pipeline", "wgmma", "ACC",
                                          "InterpretGPUParams", "SwizzleTransform"))


def supports(cfg: _Config, dtype, dim_k: int, dim_v: int) -> str | None:
    """None where the Mosaic GPU forward takes this call, else the reason in one line."""
    if not available():
        return f"JAX {jax.__version__} lacks the Mosaic GPU API this kernel uses"
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"wgmma takes 16-bit operands, got {jnp.dtype(dtype).name}"
    if (cfg.block_q, cfg.block_k) != (BLOCK, BLOCK):
        return f"tiles are {BLOCK} x {BLOCK}, got {cfg.block_q} x {cfg.block_k}"
    if max(dim_k, dim_v) > 256:
        return f"head dims up to 256, got {dim_k} / {dim_v}"
    return None


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
            pattern_ok = _head_mask(cfg.pattern, hi, i, kb * bk + j0)
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

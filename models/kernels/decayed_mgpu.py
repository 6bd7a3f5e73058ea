"""Chunked decayed linear attention with a scalar decay per head (retnet, mamba2) as Mosaic
GPU kernels (issue 70): forward, dq, dk/dv.

The three passes of `decayed_attention.py` for G = 1 (`_forward_step`, `_dq_step`,
`_dkv_step`: read it first) written for Mosaic GPU the way `linear_mgpu.py` writes linear
attention's: one warpgroup per (batch, head) row walks its chunks of 64 (the dk/dv pass
from the last), q, k, v, dO and log a TMA-loaded a chunk ahead, the state (V x K, float32)
in registers. In a chunk the log-space sums of `_chunk_sums` (b, r, and e = b + r) are
masked row sums in registers, the C x C decay is exp of (b_i - b_j) masked before the exp,
and the matmuls are `wgmma`s on shared memory with the Triton form's roundings (decayed
queries and keys, the weighted scores and the state in the inputs' dtype). d log a is the
plain-JAX reverse cumulative sum after the kernels, as for every form.

A diagonal gate (gla: a C x C x K decay) has no Mosaic GPU form: the Triton form runs, said
once. 16-bit q, k, v; feature and value dims 64 or 128; `supports` says why not.

Checked on a CPU only: the Mosaic GPU interpreter (race detection on) and the lowering for
sm_90 (tests/kernels/test_decayed_mgpu.py, JAX 0.12). Never run on a GPU.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from models.kernels import mgpu_common
from models.kernels.mgpu_common import Toolkit

CHUNK = 64
_F32 = jnp.float32


def supports(dtype, dim_k: int, dim_v: int, diagonal: bool) -> str | None:
    """None where the Mosaic GPU kernels take this call, else the reason in one line."""
    if mgpu_common.unavailable():
        return mgpu_common.unavailable()
    if diagonal:
        return "a diagonal gate's C x C x K decay has no Mosaic GPU form"
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"wgmma takes 16-bit operands, got {jnp.dtype(dtype).name}"
    if dim_k % 64 or dim_v % 64 or max(dim_k, dim_v) > 128:
        return f"feature and value dims must be 64 or 128, got {dim_k} / {dim_v}"
    return None


def _sums(t: Toolkit, la_s, la2_s, strict: bool, dk: int):
    """b, r (rows), b as a column vector (cols), e (every entry the chunk's sum; cols,
    C wide) and the C x C decay of a
    chunk's log decays, as `decayed_attention._chunk_sums` / `_decay` for G = 1."""
    c = t.c
    row, col = t.iotas()
    # Two copies of the chunk's log decays: one shared-memory tile cannot be read in two
    # register layouts (Mosaic GPU's layout inference finds none).
    la_r, la_c = t.load(la_s, t.rows), t.load(la2_s, t.cols)
    t.fence()
    by_col = t.bcast(la_c, (c, c), 1)
    b = jnp.where(row >= col, by_col, 0.0).sum(axis=1)
    r = jnp.where(row < col, by_col, 0.0).sum(axis=1)
    b_col = jnp.where(row <= col, t.bcast(la_r, (c, c), 0), 0.0).sum(axis=0)
    # e (the chunk's sum) as a vector along the state's K columns: a scalar reduction
    # has no Mosaic GPU layout.
    e = t.bcast(la_r, (c, dk), 0).sum(axis=0)
    seen = row > col if strict else row >= col
    diff = t.bcast(b, (c, c), 0) - t.bcast(b_col, (c, c), 1)
    return b, r, e, jnp.exp(jnp.where(seen, diff, -jnp.inf))


def _decayed(t: Toolkit, x_s, weight, width):
    return t.load(x_s).astype(_F32) * jnp.exp(t.bcast(weight, (t.c, width), 0))


def forward(q, k, v, log_a, *, strict: bool, interpret: bool = False):
    """Padded `[B, H, L, K]` q, k, `[B, H, L, V]` v (16-bit) and log a `[B, H, L]` f32 ->
    o `[B, H, L, V]` in v's dtype (`decayed_attention._FORWARD`)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b_, h, length, dk = q.shape
    dv, dtype = v.shape[-1], q.dtype
    t = Toolkit(plgpu, CHUNK, length // CHUNK, interpret)
    c = t.c

    def body(q_g, k_g, v_g, la_g, o_g, st_s, p_s, qd_s, kd_s, o_s):
        bi, hi = jax.lax.axis_index("b"), jax.lax.axis_index("h")
        out_row = o_g.at[bi, hi]

        def step(idx, q_s, k_s, v_s, la_s, la2_s, st):
            b, r, e, decay = _sums(t, la_s, la2_s, strict, dk)
            t.to_smem(p_s, t.mma(q_s, k_s.transpose((1, 0)), (c, c)) * decay)
            t.to_smem(qd_s, _decayed(t, q_s, b, dk))
            t.to_smem(kd_s, _decayed(t, k_s, r, dk))
            t.to_smem(st_s, st)
            o = t.mma(p_s, v_s, (c, dv)) + t.mma(qd_s, st_s.transpose((1, 0)), (c, dv))
            t.store(o, o_s, out_row, idx[0])
            return (st * jnp.exp(t.bcast(e, (dv, dk), 1))
                    + t.mma(v_s.transpose((1, 0)), kd_s, (dv, dk)))

        row = lambda x: x.at[bi, hi]
        plgpu.emit_pipeline(step, grid=(t.n,), max_concurrent_steps=2,
                            init_carry=t.zeros((dv, dk)),
                            in_specs=[t.spec(dk), t.spec(dk), t.spec(dv), t.spec(None),
                                      t.spec(None)])(
            row(q_g), row(k_g), row(v_g), row(la_g), row(la_g))
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((b_, h, length, dv), v.dtype),
        grid=(b_, h), grid_names=("b", "h"),
        scratch_types=[t.smem((dv, dk), dtype), t.smem((c, c), dtype), t.smem((c, dk), dtype),
                       t.smem((c, dk), dtype), t.smem((c, dv), v.dtype)],
        interpret=t.params)(q, k, v, log_a)


def backward(q, k, v, log_a, do, *, strict: bool, interpret: bool = False):
    """The dq pass and the reverse dk/dv pass (`decayed_attention._BACKWARD_DQ`,
    `_BACKWARD_DKV`) on padded inputs -> dq, dk (float32), dv (v's dtype)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b_, h, length, dk = q.shape
    dv, dtype = v.shape[-1], q.dtype
    t = Toolkit(plgpu, CHUNK, length // CHUNK, interpret)
    c = t.c
    do = do.astype(dtype)

    def dq_body(q_g, k_g, v_g, la_g, do_g, dq_g, st_s, p_s, kd_s, dq_s):
        bi, hi = jax.lax.axis_index("b"), jax.lax.axis_index("h")

        def step(idx, k_s, v_s, la_s, la2_s, do_s, st):
            b, r, e, decay = _sums(t, la_s, la2_s, strict, dk)
            t.to_smem(p_s, t.mma(do_s, v_s.transpose((1, 0)), (c, c)) * decay)
            t.to_smem(kd_s, _decayed(t, k_s, r, dk))
            t.to_smem(st_s, st)
            dq = (t.mma(p_s, k_s, (c, dk))
                  + t.mma(do_s, st_s, (c, dk)) * jnp.exp(t.bcast(b, (c, dk), 0)))
            t.store(dq, dq_s, dq_g.at[bi, hi], idx[0])
            return (st * jnp.exp(t.bcast(e, (dv, dk), 1))
                    + t.mma(v_s.transpose((1, 0)), kd_s, (dv, dk)))

        row = lambda x: x.at[bi, hi]
        plgpu.emit_pipeline(step, grid=(t.n,), max_concurrent_steps=2,
                            init_carry=t.zeros((dv, dk)),
                            in_specs=[t.spec(dk), t.spec(dv), t.spec(None), t.spec(None),
                                      t.spec(dv)])(
            row(k_g), row(v_g), row(la_g), row(la_g), row(do_g))
        plgpu.wait_smem_to_gmem(0)

    dq = plgpu.kernel(
        dq_body, out_type=jax.ShapeDtypeStruct((b_, h, length, dk), _F32),
        grid=(b_, h), grid_names=("b", "h"),
        scratch_types=[t.smem((dv, dk), dtype), t.smem((c, c), dtype), t.smem((c, dk), dtype),
                       t.smem((c, dk), _F32, swizzle=False)],
        interpret=t.params)(q, k, v, log_a, do)

    def dkv_body(q_g, k_g, v_g, la_g, do_g, dk_g, dv_g, rt_s, p_s, sc_s, qd_s, kd_s, dk_s,
                 dv_s):
        bi, hi = jax.lax.axis_index("b"), jax.lax.axis_index("h")

        def step(idx, q_s, k_s, v_s, la_s, la2_s, do_s, rt):
            i = t.n - 1 - idx[0]
            b, r, e, decay = _sums(t, la_s, la2_s, strict, dk)
            t.to_smem(p_s, t.mma(do_s, v_s.transpose((1, 0)), (c, c)) * decay)
            t.to_smem(sc_s, t.mma(q_s, k_s.transpose((1, 0)), (c, c)) * decay)
            t.to_smem(qd_s, _decayed(t, q_s, b, dk))
            t.to_smem(kd_s, _decayed(t, k_s, r, dk))
            t.to_smem(rt_s, rt)
            d_k = (t.mma(p_s.transpose((1, 0)), q_s, (c, dk))
                   + t.mma(v_s, rt_s, (c, dk)) * jnp.exp(t.bcast(r, (c, dk), 0)))
            d_v = (t.mma(sc_s.transpose((1, 0)), do_s, (c, dv))
                   + t.mma(kd_s, rt_s.transpose((1, 0)), (c, dv)))
            t.store(d_k, dk_s, dk_g.at[bi, hi], i)
            t.store(d_v, dv_s, dv_g.at[bi, hi], i)
            return (rt * jnp.exp(t.bcast(e, (dv, dk), 1))
                    + t.mma(do_s.transpose((1, 0)), qd_s, (dv, dk)))

        row = lambda x: x.at[bi, hi]
        plgpu.emit_pipeline(
            step, grid=(t.n,), max_concurrent_steps=2, init_carry=t.zeros((dv, dk)),
            in_specs=[t.spec(dk, True), t.spec(dk, True), t.spec(dv, True),
                      t.spec(None, True), t.spec(None, True), t.spec(dv, True)])(
            row(q_g), row(k_g), row(v_g), row(la_g), row(la_g), row(do_g))
        plgpu.wait_smem_to_gmem(0)

    d_k, d_v = plgpu.kernel(
        dkv_body, out_type=(jax.ShapeDtypeStruct((b_, h, length, dk), _F32),
                            jax.ShapeDtypeStruct((b_, h, length, dv), v.dtype)),
        grid=(b_, h), grid_names=("b", "h"),
        scratch_types=[t.smem((dv, dk), dtype), t.smem((c, c), dtype), t.smem((c, c), dtype),
                       t.smem((c, dk), dtype), t.smem((c, dk), dtype),
                       t.smem((c, dk), _F32, swizzle=False), t.smem((c, dv), v.dtype)],
        interpret=t.params)(q, k, v, log_a, do)
    return dq, d_k, d_v

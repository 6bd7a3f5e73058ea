"""Chunked decayed linear attention with a scalar decay per head (retnet, mamba2) or a gate
per key feature (gla) as Mosaic GPU kernels (issue 70): forward, dq, dk/dv.

The three passes of `decayed_attention.py` for G = 1 (`_forward_step`, `_dq_step`,
`_dkv_step`: read it first) written for Mosaic GPU the way `linear_mgpu.py` writes linear
attention's: one warpgroup per (batch, head) row walks its chunks of 64 (the dk/dv pass
from the last), q, k, v, dO and log a TMA-loaded a chunk ahead, the state (V x K, float32)
in registers. In a chunk the log-space sums of `_chunk_sums` (b, r, and e = b + r) are
masked row sums in registers, the C x C decay is exp of (b_i - b_j) masked before the exp,
and the matmuls are `wgmma`s on shared memory with the Triton form's roundings (decayed
queries and keys, the weighted scores and the state in the inputs' dtype). d log a is the
plain-JAX reverse cumulative sum after the kernels, as for every form.

A diagonal gate (gla: a C x C x K decay) has its own three passes below (`gate_forward`,
`gate_backward`: the scores split at sub-chunk ends, as fla's chunk_gla), bfloat16 only.
16-bit q, k, v; feature and value dims 64 or 128; `supports` says why not.

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
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"wgmma takes 16-bit operands, got {jnp.dtype(dtype).name}"
    if diagonal and jnp.dtype(dtype) != jnp.dtype(jnp.bfloat16):
        return ("a diagonal gate's split scores need bfloat16's exponent range, got "
                f"{jnp.dtype(dtype).name}")
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


# --------------------------------------------------------------------------------------
# A diagonal gate (gla: one decay per key feature), G = K.
#
# The C x C x K decay exp(b_ik - b_jk) of a chunk does not fit a matmul, so each score is
# split at a reference row, as fla's chunk_gla splits its chunks into sub-chunks of 16: for
# key j in sub-chunk t (16 positions) and E_t the inclusive sum b at t's last row,
#     exp(b_i - b_j) = exp(b_i - E_t) exp(E_t - b_j),
# so A = sum_t (q o exp(b - E_t)) (k o exp(E_t - b))^T over the keys of sub-chunk t: four
# wgmmas of decayed queries and keys (16-bit, as fla's tf32 dot of the same products).
# exp(E_t - b_j) <= 1; exp(b_i - E_t) <= 1 for queries after t, and for the queries of t
# itself at most the sub-chunk's own decay exp(-sum of 16 log a), which bf16's exponent
# range holds whatever the gate (GLA's gates, log-sigmoid / 16, would need log a < -5.5 at
# 16 positions in a row to reach 1e38); float16's does not (6.5e4), so float16 keeps the
# Triton form. Entries masked before their exp, as everywhere here. b (the inclusive sums
# within a chunk, float32) comes in from plain JAX, as fla's chunk_local_cumsum.

SUB = 16


def _gate_sums(t: Toolkit, b_s, dk: int):
    """b (C x K, registers), e (the chunk's sum: b's last row, a K vector along the state's
    columns) and the four sub-chunk ends E_t, from the chunk's inclusive sums."""
    c = t.c
    b = t.load(b_s)
    t.fence()
    row = t.plgpu.broadcasted_iota(jnp.int32, (c, dk), 0, layout=t.wgmma)
    ends = [jnp.where(row == SUB * s + SUB - 1, b, 0.0).sum(axis=0) for s in range(c // SUB)]
    return b, row, ends[-1], ends


def _sub_weights(t: Toolkit, b, row, ends, s: int, dk: int):
    """Sub-chunk s's two halves of the split (module comment), C x K: the keys'
    exp(E_s - b) on s's rows and the queries' exp(b - E_s) on the rows from s's first on,
    0 elsewhere (masked before the exp)."""
    e_s = t.bcast(ends[s], (t.c, dk), 1)
    in_s = (row >= SUB * s) & (row < SUB * s + SUB)
    return (jnp.exp(jnp.where(in_s, e_s - b, -jnp.inf)),
            jnp.exp(jnp.where(row >= SUB * s, b - e_s, -jnp.inf)))


def _scaled(t: Toolkit, x_s, w):
    return t.load(x_s).astype(_F32) * w


def _gate_scores(t: Toolkit, q_s, k_s, b, row, ends, qd, kd, dk, seen):
    """The chunk's scores A[i, j] = sum_k q_ik k_jk exp(b_ik - b_jk) where j reaches i
    (float32, as the Triton form's: both decayed halves split hi + lo); `qd`, `kd`: the
    (hi, lo) tiles."""
    c = t.c
    scores = t.zeros((c, c))
    for s in range(c // SUB):
        key_w, query_w = _sub_weights(t, b, row, ends, s, dk)
        _hi_lo(t, *qd, _scaled(t, q_s, query_w))
        _hi_lo(t, *kd, _scaled(t, k_s, key_w))
        scores = scores + _mm3(t, qd, [x.transpose((1, 0)) for x in kd], (c, c))
    return jnp.where(seen, scores, 0.0)


def _hi_lo(t: Toolkit, hi_s, lo_s, x):
    """x (float32) into two 16-bit tiles, hi + lo (about 16 bits of mantissa in bf16): the
    Triton form computes a gate's scores, and dq's and dk's products of the score
    cotangents with the decayed keys or queries, in float32, which one 16-bit wgmma would
    round to 8 bits."""
    hi = x.astype(hi_s.dtype)
    t.to_smem(hi_s, hi)
    t.to_smem(lo_s, x - hi.astype(_F32))


def _mm3(t: Toolkit, a, b, shape):
    """a @ b for two float32 operands each split hi + lo (`_hi_lo`): hi hi + hi lo + lo hi."""
    return t.mma(a[0], b[0], shape) + t.mma(a[0], b[1], shape) + t.mma(a[1], b[0], shape)


def _seen(t: Toolkit, strict: bool):
    row, col = t.iotas()
    return (row > col) if strict else (row >= col)


def gate_forward(q, k, v, b, *, strict: bool, interpret: bool = False):
    """Padded `[B, H, L, K]` q, k, `[B, H, L, V]` v (bfloat16) and the inclusive sums b of
    the log gates within each chunk of 64 `[B, H, L, K]` (float32) -> o `[B, H, L, V]`."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b_, h, length, dk = q.shape
    dv, dtype = v.shape[-1], q.dtype
    t = Toolkit(plgpu, CHUNK, length // CHUNK, interpret)
    c = t.c

    def body(q_g, k_g, v_g, b_g, o_g, st_s, p_s, qd_s, ql_s, kd_s, kl_s, o_s):
        bi, hi = jax.lax.axis_index("b"), jax.lax.axis_index("h")
        out_row = o_g.at[bi, hi]

        def step(idx, q_s, k_s, v_s, b_s, st):
            bb, row, e, ends = _gate_sums(t, b_s, dk)
            t.to_smem(p_s, _gate_scores(t, q_s, k_s, bb, row, ends, (qd_s, ql_s),
                                        (kd_s, kl_s), dk, _seen(t, strict)))
            t.to_smem(qd_s, t.load(q_s).astype(_F32) * jnp.exp(bb))
            t.to_smem(st_s, st)
            o = t.mma(p_s, v_s, (c, dv)) + t.mma(qd_s, st_s.transpose((1, 0)), (c, dv))
            t.store(o, o_s, out_row, idx[0])
            r = t.bcast(e, (c, dk), 1) - bb
            t.to_smem(kd_s, t.load(k_s).astype(_F32) * jnp.exp(r))
            return (st * jnp.exp(t.bcast(e, (dv, dk), 1))
                    + t.mma(v_s.transpose((1, 0)), kd_s, (dv, dk)))

        row_of = lambda x: x.at[bi, hi]
        plgpu.emit_pipeline(step, grid=(t.n,), max_concurrent_steps=2,
                            init_carry=t.zeros((dv, dk)),
                            in_specs=[t.spec(dk), t.spec(dk), t.spec(dv),
                                      t.spec(dk, swizzle=False)])(
            row_of(q_g), row_of(k_g), row_of(v_g), row_of(b_g))
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((b_, h, length, dv), v.dtype),
        grid=(b_, h), grid_names=("b", "h"),
        scratch_types=[t.smem((dv, dk), dtype), t.smem((c, c), dtype),
                       *[t.smem((c, dk), dtype) for _ in range(4)], t.smem((c, dv), v.dtype)],
        interpret=t.params)(q, k, v, b)


def gate_backward(q, k, v, b, do, *, strict: bool, interpret: bool = False):
    """The dq pass and the reverse dk/dv pass for a diagonal gate (`decayed_attention`'s
    `_dq_step`, `_dkv_step` with G = K) -> dq, dk (float32), dv (v's dtype)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b_, h, length, dk = q.shape
    dv, dtype = v.shape[-1], q.dtype
    t = Toolkit(plgpu, CHUNK, length // CHUNK, interpret)
    c = t.c
    do = do.astype(dtype)

    def in_sub(s):  # the scores' columns of sub-chunk s
        col = t.iotas()[1]
        return (col >= SUB * s) & (col < SUB * s + SUB)

    def dq_body(q_g, k_g, v_g, b_g, do_g, dq_g, st_s, p_s, pl_s, kd_s, kl_s, dq_s):
        bi, hi = jax.lax.axis_index("b"), jax.lax.axis_index("h")

        def step(idx, k_s, v_s, b_s, do_s, st):
            bb, row, e, ends = _gate_sums(t, b_s, dk)
            dp = jnp.where(_seen(t, strict), t.mma(do_s, v_s.transpose((1, 0)), (c, c)), 0.0)
            dq = t.zeros((c, dk))
            for s in range(c // SUB):
                key_w, query_w = _sub_weights(t, bb, row, ends, s, dk)
                _hi_lo(t, p_s, pl_s, jnp.where(in_sub(s), dp, 0.0))
                _hi_lo(t, kd_s, kl_s, _scaled(t, k_s, key_w))
                dq = dq + _mm3(t, (p_s, pl_s), (kd_s, kl_s), (c, dk)) * query_w
            t.to_smem(st_s, st)
            dq = dq + t.mma(do_s, st_s, (c, dk)) * jnp.exp(bb)
            t.store(dq, dq_s, dq_g.at[bi, hi], idx[0])
            r = t.bcast(e, (c, dk), 1) - bb
            t.to_smem(kd_s, t.load(k_s).astype(_F32) * jnp.exp(r))
            return (st * jnp.exp(t.bcast(e, (dv, dk), 1))
                    + t.mma(v_s.transpose((1, 0)), kd_s, (dv, dk)))

        row_of = lambda x: x.at[bi, hi]
        plgpu.emit_pipeline(step, grid=(t.n,), max_concurrent_steps=2,
                            init_carry=t.zeros((dv, dk)),
                            in_specs=[t.spec(dk), t.spec(dv), t.spec(dk, swizzle=False),
                                      t.spec(dv)])(
            row_of(k_g), row_of(v_g), row_of(b_g), row_of(do_g))
        plgpu.wait_smem_to_gmem(0)

    dq = plgpu.kernel(
        dq_body, out_type=jax.ShapeDtypeStruct((b_, h, length, dk), _F32),
        grid=(b_, h), grid_names=("b", "h"),
        scratch_types=[t.smem((dv, dk), dtype), t.smem((c, c), dtype), t.smem((c, c), dtype),
                       t.smem((c, dk), dtype), t.smem((c, dk), dtype),
                       t.smem((c, dk), _F32, swizzle=False)],
        interpret=t.params)(q, k, v, b, do)

    def dkv_body(q_g, k_g, v_g, b_g, do_g, dk_g, dv_g, rt_s, p_s, pl_s, sc_s, qd_s, ql_s,
                 kd_s, kl_s, dk_s, dv_s):
        bi, hi = jax.lax.axis_index("b"), jax.lax.axis_index("h")

        def step(idx, q_s, k_s, v_s, b_s, do_s, rt):
            i = t.n - 1 - idx[0]
            bb, row, e, ends = _gate_sums(t, b_s, dk)
            seen = _seen(t, strict)
            dp = jnp.where(seen, t.mma(do_s, v_s.transpose((1, 0)), (c, c)), 0.0)
            scores, d_k = t.zeros((c, c)), t.zeros((c, dk))
            for s in range(c // SUB):
                key_w, query_w = _sub_weights(t, bb, row, ends, s, dk)
                _hi_lo(t, qd_s, ql_s, _scaled(t, q_s, query_w))
                _hi_lo(t, kd_s, kl_s, _scaled(t, k_s, key_w))
                _hi_lo(t, p_s, pl_s, jnp.where(in_sub(s), dp, 0.0))
                scores = scores + _mm3(t, (qd_s, ql_s), (kd_s.transpose((1, 0)),
                                                         kl_s.transpose((1, 0))), (c, c))
                d_k = d_k + _mm3(t, (p_s.transpose((1, 0)), pl_s.transpose((1, 0))),
                                 (qd_s, ql_s), (c, dk)) * key_w
            t.to_smem(sc_s, jnp.where(seen, scores, 0.0))
            r = t.bcast(e, (c, dk), 1) - bb
            t.to_smem(qd_s, t.load(q_s).astype(_F32) * jnp.exp(bb))
            t.to_smem(kd_s, t.load(k_s).astype(_F32) * jnp.exp(r))
            t.to_smem(rt_s, rt)
            d_k = d_k + t.mma(v_s, rt_s, (c, dk)) * jnp.exp(r)
            d_v = (t.mma(sc_s.transpose((1, 0)), do_s, (c, dv))
                   + t.mma(kd_s, rt_s.transpose((1, 0)), (c, dv)))
            t.store(d_k, dk_s, dk_g.at[bi, hi], i)
            t.store(d_v, dv_s, dv_g.at[bi, hi], i)
            return (rt * jnp.exp(t.bcast(e, (dv, dk), 1))
                    + t.mma(do_s.transpose((1, 0)), qd_s, (dv, dk)))

        row_of = lambda x: x.at[bi, hi]
        plgpu.emit_pipeline(
            step, grid=(t.n,), max_concurrent_steps=2, init_carry=t.zeros((dv, dk)),
            in_specs=[t.spec(dk, True), t.spec(dk, True), t.spec(dv, True),
                      t.spec(dk, True, swizzle=False), t.spec(dv, True)])(
            row_of(q_g), row_of(k_g), row_of(v_g), row_of(b_g), row_of(do_g))
        plgpu.wait_smem_to_gmem(0)

    d_k, d_v = plgpu.kernel(
        dkv_body, out_type=(jax.ShapeDtypeStruct((b_, h, length, dk), _F32),
                            jax.ShapeDtypeStruct((b_, h, length, dv), v.dtype)),
        grid=(b_, h), grid_names=("b", "h"),
        scratch_types=[t.smem((dv, dk), dtype), t.smem((c, c), dtype), t.smem((c, c), dtype),
                       t.smem((c, c), dtype), *[t.smem((c, dk), dtype) for _ in range(4)],
                       t.smem((c, dk), _F32, swizzle=False), t.smem((c, dv), v.dtype)],
        interpret=t.params)(q, k, v, b, do)
    return dq, d_k, d_v


def chunk_sums(log_a, chunk: int = CHUNK):
    """The inclusive sums of `[B, H, L, K]` log gates within each chunk (L a multiple of
    it), float32: the `b` the gate kernels take."""
    b_, h, length, g = log_a.shape
    x = log_a.astype(_F32).reshape(b_, h, length // chunk, chunk, g)
    return jnp.cumsum(x, axis=3).reshape(b_, h, length, g)

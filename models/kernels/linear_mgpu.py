"""Chunked linear attention as Mosaic GPU kernels (issue 70): forward, dq, dk/dv.

The three passes of `linear_attention.py` (`_FORWARD`: emit, then fold each chunk into the
state (S, z); `_BACKWARD_DQ` over the same state; `_BACKWARD_DKV` in reverse over the
later positions' (R, r)) written for Mosaic GPU (`plgpu.kernel`), as
`block_sparse_mgpu.py` is for the block-sparse kernel. One CTA (one warpgroup) per (batch, head) row walks its chunks of 64
positions in order (`plgpu.emit_pipeline`: the next chunk's q, k, v TMA-loaded while this
one computes; each output chunk stored by TMA while the next computes), carrying S (K x V)
and z (K) in registers, float32:

- causal: out = (q S + tril(q k^T) v) / (q . z + rowsum(tril(q k^T)) + eps), then
  S += k^T v, z += colsum(k);
- full: one pipeline folds every chunk into (S, z), a second emits q S / (q . z + eps).

The matmuls are `wgmma`s on shared memory: S and the masked scores are rounded to the
inputs' dtype on their way there, as the Triton form casts them (`_mm(..., dtype)`); the
normaliser uses the float32 scores. The backward passes likewise (dnum kept in float32
between them, as the Triton form keeps it). 16-bit inputs, feature dims 64 or 128;
`supports` says why not.

Checked on a CPU only: numerics in the Mosaic GPU interpreter (race detection on) and the
lowering for sm_90 (tests/kernels/test_linear_mgpu.py, JAX 0.12). Never run on a GPU.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from models.kernels import mgpu_common
from models.kernels.mgpu_common import Toolkit

CHUNK = 64
_F32 = jnp.float32


def supports(dtype, dim_k: int, dim_v: int, chunk: int) -> str | None:
    """None where the Mosaic GPU forward takes this call, else the reason in one line."""
    if mgpu_common.unavailable():
        return mgpu_common.unavailable()
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"wgmma takes 16-bit operands, got {jnp.dtype(dtype).name}"
    if dim_k % 64 or dim_v % 64 or max(dim_k, dim_v) > 128:
        return f"feature and value dims must be 64 or 128, got {dim_k} / {dim_v}"
    if chunk != CHUNK:
        return f"the chunk is {CHUNK}, got {chunk}"
    return None


def _kv_fold(t: Toolkit, k_s, v_s, state):
    """(S, z) += (k^T v, colsum k): a chunk folded into the forward's state."""
    s, z = state
    z = z + t.load(k_s).astype(_F32).sum(axis=0)
    # A fence between this register read of k_s and the TMA that refills its slot after
    # the step (the async proxy), as the interpreter's race detector asks.
    t.fence()
    return s + t.mma(k_s.transpose((1, 0)), v_s, (k_s.shape[1], v_s.shape[1])), z


def forward(q, k, v, *, causal: bool, eps: float, interpret: bool = False):
    """`[B, H, L, K]` q, k and `[B, H, L, V]` v (L a multiple of the chunk, 16-bit) ->
    out `[B, H, L, V]` in q's dtype, as `linear_attention._forward`."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b, h, length, dk = q.shape
    dv, dtype, c = v.shape[-1], q.dtype, CHUNK
    n = length // c
    t = Toolkit(plgpu, c, n, interpret)
    swizzled, wgmma, cols, mma = t.swizzled, t.wgmma, t.cols, t.mma

    def fold(k_s, v_s, state):
        return _kv_fold(t, k_s, v_s, state)

    def emit(i, q_s, o_s, o_g, s_s, state, k_s=None, v_s=None, p_s=None):
        s, z = state
        s_s[...] = s.astype(dtype)  # rounded as the Triton form's _mm(q, s, dtype)
        plgpu.commit_smem()
        num = mma(q_s, s_s, (c, dv))
        q = plgpu.load(q_s, layout=wgmma).astype(_F32)
        den = (q * lax.broadcast_in_dim(z, (c, dk), [1])).sum(axis=1)
        if k_s is not None:  # causal: this chunk's own keys, lower-triangular
            scores = mma(q_s, k_s.transpose((1, 0)), (c, c))
            row = plgpu.broadcasted_iota(jnp.int32, (c, c), 0, layout=wgmma)
            col = plgpu.broadcasted_iota(jnp.int32, (c, c), 1, layout=wgmma)
            scores = jnp.where(row >= col, scores, 0.0)
            den = den + scores.sum(axis=1)
            p_s[...] = scores.astype(dtype)
            plgpu.commit_smem()
            num = num + mma(p_s, v_s, (c, dv))
        t.store(num / lax.broadcast_in_dim(den + eps, (c, dv), [0]), o_s, o_g, i)

    def body(q_g, k_g, v_g, o_g, s_s, p_s, o_s):
        bi, hi = lax.axis_index("b"), lax.axis_index("h")
        init = (plgpu.layout_cast(jnp.zeros((dk, dv), _F32), wgmma),
                plgpu.layout_cast(jnp.zeros((dk,), _F32), cols))
        chunk = lambda width: plgpu.BlockSpec((c, width), lambda i: (i, 0),
                                              transforms=swizzled)
        rows = (q_g.at[bi, hi], k_g.at[bi, hi], v_g.at[bi, hi])
        out_row = o_g.at[bi, hi]
        if causal:
            def step(idx, q_s, k_s, v_s, state):
                emit(idx[0], q_s, o_s, out_row, s_s, state, k_s, v_s, p_s)
                return fold(k_s, v_s, state)

            plgpu.emit_pipeline(step, grid=(n,), max_concurrent_steps=2, init_carry=init,
                                in_specs=[chunk(dk), chunk(dk), chunk(dv)])(*rows)
            plgpu.wait_smem_to_gmem(0)
            return
        state = plgpu.emit_pipeline(
            lambda _, k_s, v_s, state: fold(k_s, v_s, state), grid=(n,),
            max_concurrent_steps=2, init_carry=init,
            in_specs=[chunk(dk), chunk(dv)])(rows[1], rows[2])

        def emit_step(idx, q_s):
            emit(idx[0], q_s, o_s, out_row, s_s, state)

        plgpu.emit_pipeline(emit_step, grid=(n,), max_concurrent_steps=2,
                            in_specs=[chunk(dk)])(rows[0])
        plgpu.wait_smem_to_gmem(0)

    kernel = plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((b, h, length, dv), dtype),
        grid=(b, h), grid_names=("b", "h"),
        scratch_types=[plgpu.SMEM((dk, dv), dtype, transforms=swizzled),
                       plgpu.SMEM((c, c), dtype, transforms=swizzled),
                       plgpu.SMEM((c, dv), dtype, transforms=swizzled)],
        interpret=t.params)
    return kernel(q, k, v)


def backward(q, k, v, out, g, *, causal: bool, eps: float, interpret: bool = False):
    """The Triton form's two backward passes (`linear_attention._BACKWARD_DQ`, then
    `_BACKWARD_DKV` in reverse chunk order) as Mosaic GPU kernels, on the forward's padded
    inputs, its output and the cotangent -> (dq, dk, dv) in the inputs' dtypes."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b, h, length, dk = q.shape
    dv, dtype, c = v.shape[-1], q.dtype, CHUNK
    n = length // c
    t = Toolkit(plgpu, c, n, interpret)
    wgmma, cols, params = t.wgmma, t.cols, t.params
    swizzled, mma, to_smem, store, spec, zeros = (t.swizzled, t.mma, t.to_smem, t.store,
                                                  t.spec, t.zeros)
    g = g.astype(dtype)

    def tril():
        row, col = t.iotas()
        return row >= col

    def kv_fold(k_s, v_s, state):
        return _kv_fold(t, k_s, v_s, state)

    # --- dq and dnum: the forward's order and state -----------------------------------
    def dq_body(q_g, k_g, v_g, g_g, dq_g, dn_g, s_s, p_s, dn16_s, dq_s, dn_s):
        bi, hi = lax.axis_index("b"), lax.axis_index("h")
        init = (zeros((dk, dv), wgmma), zeros((dk,), cols))

        def emit(i, q_s, g_s, state, k_s=None, v_s=None):
            s, z = state
            to_smem(s_s, s)  # S in the inputs' dtype, as _mm(q, s, dtype)
            num = mma(q_s, s_s, (c, dv))
            qr = plgpu.load(q_s, layout=wgmma).astype(_F32)
            den = (qr * lax.broadcast_in_dim(z, (c, dk), [1])).sum(axis=1)
            if causal:
                scores = jnp.where(tril(), mma(q_s, k_s.transpose((1, 0)), (c, c)), 0.0)
                den = den + scores.sum(axis=1)
                to_smem(p_s, scores)
                num = num + mma(p_s, v_s, (c, dv))
            den = den + eps
            dnum = (plgpu.load(g_s, layout=wgmma).astype(_F32)
                    / lax.broadcast_in_dim(den, (c, dv), [0]))
            dden = -(dnum * num / lax.broadcast_in_dim(den, (c, dv), [0])).sum(axis=1)
            to_smem(dn16_s, dnum)
            dq = (mma(dn16_s, s_s.transpose((1, 0)), (c, dk))
                  + lax.broadcast_in_dim(dden, (c, dk), [0])
                  * lax.broadcast_in_dim(z, (c, dk), [1]))
            if causal:
                p = mma(dn16_s, v_s.transpose((1, 0)), (c, c))
                p = jnp.where(tril(), p + lax.broadcast_in_dim(dden, (c, c), [0]), 0.0)
                to_smem(p_s, p)
                dq = dq + mma(p_s, k_s, (c, dk))
            store(dq, dq_s, dq_g.at[bi, hi], i)
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            dn_s[...] = dnum
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(dn_s, dn_g.at[bi, hi, pl.ds(i * c, c)])

        row = lambda x: x.at[bi, hi]
        if causal:
            def step(idx, q_s, k_s, v_s, g_s, state):
                emit(idx[0], q_s, g_s, state, k_s, v_s)
                return kv_fold(k_s, v_s, state)

            plgpu.emit_pipeline(step, grid=(n,), max_concurrent_steps=2, init_carry=init,
                                in_specs=[spec(dk), spec(dk), spec(dv), spec(dv)])(
                row(q_g), row(k_g), row(v_g), row(g_g))
        else:
            state = plgpu.emit_pipeline(
                lambda _, k_s, v_s, st: kv_fold(k_s, v_s, st), grid=(n,),
                max_concurrent_steps=2, init_carry=init,
                in_specs=[spec(dk), spec(dv)])(row(k_g), row(v_g))
            plgpu.emit_pipeline(lambda idx, q_s, g_s: emit(idx[0], q_s, g_s, state),
                                grid=(n,), max_concurrent_steps=2,
                                in_specs=[spec(dk), spec(dv)])(row(q_g), row(g_g))
        plgpu.wait_smem_to_gmem(0)

    dq, dnum = plgpu.kernel(
        dq_body, out_type=(jax.ShapeDtypeStruct((b, h, length, dk), dtype),
                           jax.ShapeDtypeStruct((b, h, length, dv), _F32)),
        grid=(b, h), grid_names=("b", "h"),
        scratch_types=[plgpu.SMEM((dk, dv), dtype, transforms=swizzled),
                       plgpu.SMEM((c, c), dtype, transforms=swizzled),
                       plgpu.SMEM((c, dv), dtype, transforms=swizzled),
                       plgpu.SMEM((c, dk), dtype, transforms=swizzled),
                       plgpu.SMEM((c, dv), _F32)],
        interpret=params)(q, k, v, g)

    # --- dk and dv: reverse order over (R, r) = sums over later positions -------------
    def dkv_body(q_g, k_g, v_g, o_g, dn_g, dk_g, dv_g, r_s, p_s, sc_s, dn16_s, dk_s, dv_s):
        bi, hi = lax.axis_index("b"), lax.axis_index("h")
        init = (zeros((dk, dv), wgmma), zeros((dk,), cols))

        def dden_of(o_s, dn_s):
            dnum = plgpu.load(dn_s, layout=wgmma)
            dden = -(dnum * plgpu.load(o_s, layout=wgmma).astype(_F32)).sum(axis=1)
            to_smem(dn16_s, dnum)  # also fences the register reads above
            return dden

        def q_fold(q_s, dden, state):  # (R, r) += (q^T dnum, q^T dden)
            r_mat, r_vec = state
            qr = plgpu.load(q_s, layout=wgmma).astype(_F32)
            r_vec = r_vec + (qr * lax.broadcast_in_dim(dden, (c, dk), [0])).sum(axis=0)
            plgpu.commit_smem()
            return r_mat + mma(q_s.transpose((1, 0)), dn16_s, (dk, dv)), r_vec

        def emit(i, k_s, v_s, state, q_s=None, dden=None):
            r_mat, r_vec = state
            to_smem(r_s, r_mat)
            d_k = (mma(v_s, r_s.transpose((1, 0)), (c, dk))
                   + lax.broadcast_in_dim(r_vec, (c, dk), [1]))
            d_v = mma(k_s, r_s, (c, dv))
            if causal:
                p = mma(dn16_s, v_s.transpose((1, 0)), (c, c))
                p = jnp.where(tril(), p + lax.broadcast_in_dim(dden, (c, c), [0]), 0.0)
                scores = jnp.where(tril(), mma(q_s, k_s.transpose((1, 0)), (c, c)), 0.0)
                to_smem(p_s, p)
                to_smem(sc_s, scores)
                d_k = d_k + mma(p_s.transpose((1, 0)), q_s, (c, dk))
                d_v = d_v + mma(sc_s.transpose((1, 0)), dn16_s, (c, dv))
            store(d_k, dk_s, dk_g.at[bi, hi], i)
            store(d_v, dv_s, dv_g.at[bi, hi], i)

        row = lambda x: x.at[bi, hi]
        if causal:
            def step(idx, q_s, k_s, v_s, o_s, dn_s, state):
                dden = dden_of(o_s, dn_s)
                emit(n - 1 - idx[0], k_s, v_s, state, q_s, dden)
                return q_fold(q_s, dden, state)

            plgpu.emit_pipeline(
                step, grid=(n,), max_concurrent_steps=2, init_carry=init,
                in_specs=[spec(dk, True), spec(dk, True), spec(dv, True), spec(dv, True),
                          spec(dv, True, swizzle=False)])(
                row(q_g), row(k_g), row(v_g), row(o_g), row(dn_g))
        else:
            state = plgpu.emit_pipeline(
                lambda _, q_s, o_s, dn_s, st: q_fold(q_s, dden_of(o_s, dn_s), st),
                grid=(n,), max_concurrent_steps=2, init_carry=init,
                in_specs=[spec(dk), spec(dv), spec(dv, swizzle=False)])(
                row(q_g), row(o_g), row(dn_g))
            plgpu.emit_pipeline(lambda idx, k_s, v_s: emit(idx[0], k_s, v_s, state),
                                grid=(n,), max_concurrent_steps=2,
                                in_specs=[spec(dk), spec(dv)])(row(k_g), row(v_g))
        plgpu.wait_smem_to_gmem(0)

    d_k, d_v = plgpu.kernel(
        dkv_body, out_type=(jax.ShapeDtypeStruct((b, h, length, dk), k.dtype),
                            jax.ShapeDtypeStruct((b, h, length, dv), v.dtype)),
        grid=(b, h), grid_names=("b", "h"),
        scratch_types=[plgpu.SMEM((dk, dv), dtype, transforms=swizzled),
                       plgpu.SMEM((c, c), dtype, transforms=swizzled),
                       plgpu.SMEM((c, c), dtype, transforms=swizzled),
                       plgpu.SMEM((c, dv), dtype, transforms=swizzled),
                       plgpu.SMEM((c, dk), k.dtype, transforms=swizzled),
                       plgpu.SMEM((c, dv), v.dtype, transforms=swizzled)],
        interpret=params)(q, k, v, out.astype(dtype), dnum)
    return dq, d_k, d_v

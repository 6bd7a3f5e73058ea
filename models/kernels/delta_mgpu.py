"""The chunked (gated) delta rule, DeltaNet and Gated DeltaNet, as Mosaic GPU kernels
(issue 70): the forward (o, S_L and the state each chunk starts from) and the reverse
backward (dq, dk, dv, d beta, d log alpha).

The two passes of `delta_rule.py` (`_forward_step`, `_backward_step`: read them first; the
algebra and every line's transpose are there) written for Mosaic GPU the way
`decayed_mgpu.py` writes decayed attention: one warpgroup per (batch, head) row walks its
chunks of 64 by `plgpu.emit_pipeline` (the backward from the last chunk), q, k, v, dO,
beta and log alpha TMA-loaded a chunk ahead into 128-byte-swizzled shared memory, the
carried state (S forward, dS backward; V x K float32) in registers, the log-space chunk
sums, the decay Gamma and every row sum in registers, the matmuls `wgmma`s.

Roundings follow the Triton form: a matmul the Triton step does in the inputs' dtype takes
bf16 / fp16 operands here (one wgmma); one it does in float32 (the UT transform
T = (I + A)^-1 by blocked doubling, W = T K', U = T V', and their cotangents) takes each
float32 operand as the sum of two 16-bit parts, hi + lo, and three wgmmas (hi hi + hi lo +
lo hi: about 16 bits of mantissa in bf16, 22 in fp16; tf32x3 is about 21). Hopper's
tensor cores have no full-float32 product; the split is what runs on the GPU and what the
interpreter checks (an f32 wgmma would be tf32 on the GPU and exact in the interpreter: a
check that could not fail). Operands are staged in shared memory scoped to the matmul
(`pl.run_scoped`), as the Mosaic GPU interpreter takes wgmma operands from shared memory
only.

16-bit q, k, v with key and value dims 64 per call: the backward's two slots of the chunk's
start state (V x K float32) beside the pipelined rows, the float32 output tiles and the
scoped operands overfill Hopper's shared memory at 128 keys (lowered for sm_90 with JAX
0.12.0.1: "smem_bytes=349208 > max_smem_bytes=232448"; the forward alone fits). A wider
value head (gated_deltanet's expand_v 2) is one call per 64 value channels
(`delta_rule._value_blocks`: every value channel of the state evolves on its own; the
key-side gradients are summed), which redoes the UT transform per block. Other shapes: `supports` says why not, and the Triton form runs.

Checked on a CPU only: the Mosaic GPU interpreter (race detection on) against the Triton
passes and the lowering for sm_90 (tests/kernels/test_delta_mgpu.py, JAX 0.12). Never run
on a GPU.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from models.kernels import decayed_mgpu, mgpu_common
from models.kernels.mgpu_common import Toolkit

CHUNK = 64
VALUE_BLOCK = 64  # value channels per kernel call (delta_rule.py cuts wider heads)
_F32 = jnp.float32
_T = (1, 0)  # a transposed view of a shared-memory tile


def supports(dtype, dim_k: int, dim_v: int) -> str | None:
    """None where the Mosaic GPU kernels take this call, else the reason in one line."""
    if mgpu_common.unavailable():
        return mgpu_common.unavailable()
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"wgmma takes 16-bit operands, got {jnp.dtype(dtype).name}"
    if dim_k != 64 or dim_v % VALUE_BLOCK:
        return (f"the delta rule's Mosaic GPU kernels take a key dim of 64 and value dims a "
                f"multiple of 64 (the backward's start states fill shared memory at 128 "
                f"keys), got {dim_k} / {dim_v}")
    return None


class _Ops:
    """The delta rule's matmuls and vector moves on one kernel's Toolkit."""

    def __init__(self, t: Toolkit, dtype):
        self.t, self.dtype = t, dtype

    def mm(self, a, b, shape, *, ta: bool = False, tb: bool = False, exact: bool = False):
        """a @ b (a^T with `ta`, b^T with `tb`) to `shape`, float32. a and b are register
        arrays or shared-memory refs (16-bit, taken as they are). `exact`: the Triton
        form's float32 product (a register operand split hi + lo in the inputs' dtype, as
        wgmma's two operands share one; three wgmmas at most); else its 16-bit one (a
        register operand in the inputs' dtype, one wgmma)."""
        t = self.t
        parts = []  # per operand: its 16-bit register parts, or None for a ref
        for x in (a, b):
            if not isinstance(x, jax.Array):
                parts.append(None)
            elif exact:
                hi = x.astype(self.dtype)
                parts.append([hi, (x - hi.astype(_F32)).astype(self.dtype)])
            else:
                parts.append([x.astype(self.dtype)])
        scratch = [t.smem(p.shape, p.dtype) for ps in parts if ps for p in ps]

        def run(*refs):
            it = iter(refs)
            tiles = []
            for x, ps, tr in zip((a, b), parts, (ta, tb)):
                if ps is None:
                    refs_x = [x]
                else:
                    refs_x = [next(it) for _ in ps]
                    for ref, p in zip(refs_x, ps):
                        ref[...] = p
                tiles.append([r.transpose(_T) if tr else r for r in refs_x])
            if scratch:
                t.plgpu.commit_smem()
            (a0, *a1), (b0, *b1) = tiles
            out = t.mma(a0, b0, shape)
            if a1:
                out = out + t.mma(a1[0], b0, shape)
            if b1:
                out = out + t.mma(a0, b1[0], shape)
            return out

        return pl.run_scoped(run, *scratch) if scratch else run()

    def inverse(self, a):
        """(I + strictly-lower(a))^-1 of a C x C chunk, by `delta_rule._unit_lower_inverse`'s
        doubling (the products float32, split)."""
        c = self.t.c
        row, col = self.t.iotas()
        x = jnp.where(row == col, 1.0, 0.0).astype(_F32)
        s = 1
        while s < c:
            pair = (row & -2 * s) == (col & -2 * s)
            below = pair & ((row & s) != 0) & ((col & s) == 0)
            xa = self.mm(x, jnp.where(below, a, 0.0), (c, c), exact=True)
            x = x - self.mm(xa, x, (c, c), exact=True)
            s *= 2
        return x

    def to_cols(self, x):
        """A vector over the chunk's positions from the rows layout to the columns one."""
        row, col = self.t.iotas()
        return jnp.where(row == col, self.t.bcast(x, (self.t.c,) * 2, 0), 0.0).sum(axis=0)

    def to_rows(self, x):
        row, col = self.t.iotas()
        return jnp.where(row == col, self.t.bcast(x, (self.t.c,) * 2, 1), 0.0).sum(axis=1)

    def total(self, x):
        """Every entry the sum of a rows-layout vector (a scalar has no layout)."""
        return self.to_rows(self.t.bcast(x, (self.t.c,) * 2, 0).sum(axis=0))


class _Chunk:
    """What the forward and the backward both build from one chunk (`delta_rule._chunk`):
    b, r (rows), e (columns, every entry the chunk's sum), Gamma, beta (rows), K K^T, T,
    K' = diag(beta e^b) K, V' = diag(beta) V, W = T K', U = T V' (float32 registers)."""

    def __init__(self, ops: _Ops, k_s, v_s, be_s, la_s, la2_s, dk: int, dv: int):
        t = ops.t
        c = t.c
        self.b, self.r, self.e, self.gamma = decayed_mgpu._sums(t, la_s, la2_s, False, dk)
        self.beta = t.load(be_s, t.rows)
        self.k, self.v = t.load(k_s).astype(_F32), t.load(v_s).astype(_F32)
        t.fence()
        row, col = t.iotas()
        self.kk = ops.mm(k_s, k_s, (c, c), tb=True)
        beta_cc = t.bcast(self.beta, (c, c), 0)
        self.t = ops.inverse(jnp.where(row > col, beta_cc * self.kk * self.gamma, 0.0))
        self.eb = jnp.exp(self.b)
        self.kbe = self.k * t.bcast(self.beta * self.eb, (c, dk), 0)
        self.vb = self.v * t.bcast(self.beta, (c, dv), 0)
        self.w = ops.mm(self.t, self.kbe, (c, dk), exact=True)
        self.u = ops.mm(self.t, self.vb, (c, dv), exact=True)


def _store_state(t: Toolkit, x, s_s, s_g, i):
    """A float32 V x K state out by TMA to rows i V.. of s_g `[N V, K]` once the previous
    one has left s_s (TMA strides at most 5 dimensions: the chunks and V are one axis)."""
    t.plgpu.wait_smem_to_gmem(0, wait_read_only=True)
    s_s[...] = x
    t.plgpu.commit_smem()
    t.plgpu.copy_smem_to_gmem(s_s, s_g.at[pl.ds(i * x.shape[0], x.shape[0])])


def forward(q, k, v, beta, log_a, *, states: bool = False, interpret: bool = False):
    """Padded `[B, H, L, 64]` q (scaled), k, v (16-bit), beta and log alpha `[B, H, L]`
    float32 -> o `[B, H, L, V]` (v's dtype), S_L `[B, H, V, K]` float32 and with `states`
    the state each chunk starts from `[B, H, N, V, K]` float32 (`delta_rule._forward`)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b_, h, length, dk = q.shape
    dv, dtype = v.shape[-1], q.dtype
    t = Toolkit(plgpu, CHUNK, length // CHUNK, interpret)
    ops, c, n = _Ops(t, dtype), t.c, t.n

    def body(q_g, k_g, v_g, be_g, la_g, *refs):
        o_g, last_g = refs[:2]
        states_g = refs[2] if states else None
        o_s, st_s = refs[-2:]
        bi, hi = lax.axis_index("b"), lax.axis_index("h")
        out_row = o_g.at[bi, hi]

        def step(idx, q_s, k_s, v_s, be_s, la_s, la2_s, st):
            i = idx[0]
            if states:
                _store_state(t, st, st_s, states_g.at[bi, hi], i)
            ch = _Chunk(ops, k_s, v_s, be_s, la_s, la2_s, dk, dv)
            v_new = ch.u - ops.mm(ch.w, st, (c, dv), tb=True)
            qd = t.load(q_s).astype(_F32) * t.bcast(ch.eb, (c, dk), 0)
            o = (ops.mm(qd, st, (c, dv), tb=True)
                 + ops.mm(ops.mm(q_s, k_s, (c, c), tb=True) * ch.gamma, v_new, (c, dv)))
            t.store(o, o_s, out_row, i)
            kr = ch.k * jnp.exp(t.bcast(ch.r, (c, dk), 0))
            return (st * jnp.exp(t.bcast(ch.e, (dv, dk), 1))
                    + ops.mm(v_new, kr, (dv, dk), ta=True))

        row = lambda x: x.at[bi, hi]  # noqa: E731
        last = plgpu.emit_pipeline(
            step, grid=(n,), max_concurrent_steps=2, init_carry=t.zeros((dv, dk)),
            in_specs=[t.spec(dk), t.spec(dk), t.spec(dv), t.spec(None), t.spec(None),
                      t.spec(None)])(
            row(q_g), row(k_g), row(v_g), row(be_g), row(la_g), row(la_g))
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        st_s[...] = last
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(st_s, last_g.at[bi, hi])
        plgpu.wait_smem_to_gmem(0)

    out_type = [jax.ShapeDtypeStruct((b_, h, length, dv), v.dtype),
                jax.ShapeDtypeStruct((b_, h, dv, dk), _F32)]
    if states:
        out_type.append(jax.ShapeDtypeStruct((b_, h, n * dv, dk), _F32))
    outs = plgpu.kernel(
        body, out_type=tuple(out_type), grid=(b_, h), grid_names=("b", "h"),
        scratch_types=[t.smem((c, dv), v.dtype), t.smem((dv, dk), _F32, swizzle=False)],
        interpret=t.params)(q, k, v, beta, log_a)
    return (*outs[:2], outs[2].reshape(b_, h, n, dv, dk)) if states else outs


def backward(q, k, v, beta, log_a, do, states, ds_last, *, interpret: bool = False):
    """The reverse pass (`delta_rule._BACKWARD`) on padded inputs, from the forward's start
    states `[B, H, N, V, K]` and dS_L `[B, H, V, K]` (float32) -> dq, dk, dv `[B, H, L, D]`,
    d beta and d log alpha `[B, H, L]`, all float32."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b_, h, length, dk = q.shape
    dv, dtype = v.shape[-1], q.dtype
    t = Toolkit(plgpu, CHUNK, length // CHUNK, interpret)
    ops, c, n = _Ops(t, dtype), t.c, t.n
    do = do.astype(dtype)

    def step(out_rows, idx, q_s, k_s, v_s, be_s, la_s, la2_s, do_s, s_s, ds):
        i = n - 1 - idx[0]
        ch = _Chunk(ops, k_s, v_s, be_s, la_s, la2_s, dk, dv)
        s = t.load(s_s)
        q_ = t.load(q_s).astype(_F32)
        t.fence()
        row, col = t.iotas()
        rows_k = lambda x: t.bcast(x, (c, dk), 0)  # noqa: E731
        er, ee = jnp.exp(rows_k(ch.r)), jnp.exp(t.bcast(ch.e, (dv, dk), 1))
        v_new = ch.u - ops.mm(ch.w, s, (c, dv), tb=True)
        qk = ops.mm(q_s, k_s, (c, c), tb=True)
        kr = ch.k * er
        # S' = e^(b_C) S + V_new^T kr and O = (Q e^b) S^T + (Q K^T o Gamma) V_new.
        dv_new = (ops.mm(kr, ds, (c, dv), tb=True)
                  + ops.mm(qk * ch.gamma, do_s, (c, dv), ta=True))
        dkr = ops.mm(v_new, ds, (c, dk))
        dp = ops.mm(do_s, v_new, (c, c), tb=True) * ch.gamma
        dqb = ops.mm(do_s, s, (c, dk))
        ds_prev = (ds * ee + ops.mm(do_s, q_ * rows_k(ch.eb), (dv, dk), ta=True)
                   - ops.mm(dv_new, ch.w, (dv, dk), ta=True))
        # V_new = U - W S^T; U = T V', W = T K'; T = (I + A)^-1.
        dw = -ops.mm(dv_new, s, (c, dk))
        dt = (ops.mm(dv_new, ch.vb, (c, c), tb=True, exact=True)
              + ops.mm(dw, ch.kbe, (c, c), tb=True, exact=True))
        dvb = ops.mm(ch.t, dv_new, (c, dv), ta=True, exact=True)
        dkbe = ops.mm(ch.t, dw, (c, dk), ta=True, exact=True)
        da = jnp.where(row > col, -ops.mm(ops.mm(ch.t, dt, (c, c), ta=True, exact=True),
                                          ch.t, (c, c), tb=True, exact=True), 0.0)
        # A = strictly-lower(beta_i (K K^T)_ij Gamma_ij).
        beta_cc = t.bcast(ch.beta, (c, c), 0)
        dkk = da * beta_cc * ch.gamma
        dgamma = da * beta_cc * ch.kk * ch.gamma + dp * qk
        dq = ops.mm(dp, k_s, (c, dk)) + dqb * rows_k(ch.eb)
        d_k = (ops.mm(dkk, k_s, (c, dk), exact=True)
               + ops.mm(dkk, k_s, (c, dk), ta=True, exact=True)
               + ops.mm(dp, q_s, (c, dk), ta=True)
               + dkbe * rows_k(ch.beta * ch.eb) + dkr * er)
        d_v = dvb * t.bcast(ch.beta, (c, dv), 0)
        kbe_dot = (dkbe * ch.k).sum(axis=1) * ch.eb
        dbeta = ((da * ch.kk * ch.gamma).sum(axis=1) + (dvb * ch.v).sum(axis=1) + kbe_dot)
        dr = (dkr * kr).sum(axis=1)
        db = (kbe_dot * ch.beta + (dqb * q_).sum(axis=1) * ch.eb - dr
              + dgamma.sum(axis=1) - ops.to_rows(dgamma.sum(axis=0)))
        # b_C: through r = b_C - b and the state's decay e^(b_C), on the last row.
        de = (ops.total(dr)
              + t.bcast((ds * s * ee).sum(axis=0), (c, dk), 1).sum(axis=1))
        last = plgpu.broadcasted_iota(jnp.int32, (c,), 0, layout=t.rows) == c - 1
        db = db + jnp.where(last, de, 0.0)
        # b = the inclusive sum of log alpha: d log alpha_s = sum over i >= s of db_i.
        dla = jnp.where(col >= row, t.bcast(ops.to_cols(db), (c, c), 1), 0.0).sum(axis=1)
        for x, (o_s, o_row) in zip((dq, d_k, d_v, dbeta, dla), out_rows):
            t.store(x, o_s, o_row, i)
        return ds_prev

    def body(q_g, k_g, v_g, be_g, la_g, do_g, st_g, dsl_g, dq_g, dk_g, dv_g, dbe_g, dla_g,
             dq_s, dk_s, dv_s, dbe_s, dla_s, ds_s, bar):
        bi, hi = lax.axis_index("b"), lax.axis_index("h")
        row = lambda x: x.at[bi, hi]  # noqa: E731
        plgpu.copy_gmem_to_smem(row(dsl_g), ds_s, bar)
        plgpu.barrier_wait(bar)
        ds0 = t.load(ds_s)
        outs = [(o_s, row(o_g)) for o_s, o_g in ((dq_s, dq_g), (dk_s, dk_g), (dv_s, dv_g),
                                                 (dbe_s, dbe_g), (dla_s, dla_g))]
        per_chunk = plgpu.BlockSpec((dv, dk), lambda j: (n - 1 - j, 0))
        plgpu.emit_pipeline(
            lambda *a: step(outs, *a), grid=(n,), max_concurrent_steps=2, init_carry=ds0,
            in_specs=[t.spec(dk, True), t.spec(dk, True), t.spec(dv, True),
                      t.spec(None, True), t.spec(None, True), t.spec(None, True),
                      t.spec(dv, True), per_chunk])(
            row(q_g), row(k_g), row(v_g), row(be_g), row(la_g), row(la_g), row(do_g),
            row(st_g))
        plgpu.wait_smem_to_gmem(0)

    rows_of = lambda w: jax.ShapeDtypeStruct((b_, h, length, w), _F32)  # noqa: E731
    vector = jax.ShapeDtypeStruct((b_, h, length), _F32)
    return plgpu.kernel(
        body, out_type=(rows_of(dk), rows_of(dk), rows_of(dv), vector, vector),
        grid=(b_, h), grid_names=("b", "h"),
        scratch_types=[t.smem((c, dk), _F32, swizzle=False),
                       t.smem((c, dk), _F32, swizzle=False),
                       t.smem((c, dv), _F32, swizzle=False),
                       t.smem((c,), _F32, swizzle=False), t.smem((c,), _F32, swizzle=False),
                       t.smem((dv, dk), _F32, swizzle=False),
                       plgpu.Barrier(num_arrivals=1)],
        interpret=t.params)(q, k, v, beta, log_a, do, states.reshape(b_, h, n * dv, dk),
                            ds_last)

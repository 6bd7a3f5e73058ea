"""The chunked (gated) delta rule, DeltaNet and Gated DeltaNet, as Pallas kernels and plain JAX.

`delta_rule(q, k, v, beta, log_alpha)` computes, per (batch, head) row, with S_0 = 0,

    S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,   o_t = S_t q_t scale

(S is V x K; alpha_t = exp(log_alpha_t) <= 1, one per head and position; log_alpha None:
alpha = 1, DeltaNet) and returns o `[B, H, L, V]` and S_L `[B, H, V, K]`: exactly
`models.attention.delta.chunk_delta_rule` (the WY / UT form fla's chunk_delta_rule and
chunk_gated_delta_rule use), which equals the recurrence `delta_rule_reference`.

The layout follows `models/kernels/decayed_attention.py` (read it, and linear_attention.py,
first): the chunk algorithm, written as steps on the 2-D arrays of one chunk of C positions
of a row, run three ways: a Triton kernel (one program per (batch, head), a `fori_loop`
over the chunks carrying the state in registers), a Mosaic TPU kernel (grid (batch, head,
chunk), the state in VMEM scratch across the sequential chunk axis) and plain JAX
(`lax.scan` over the chunks, backend="xla"), all under one custom VJP; and, as a rewrite
of the same steps for Hopper, Mosaic GPU kernels (`delta_mgpu.py`, `gpu_form="mosaic"`).

One chunk (b_i = the inclusive sum of log alpha from the chunk's start, by masked sums of
iotas as decayed_attention's `_chunk_sums`: neither Triton nor Mosaic lowers a cumsum;
Gamma_ij = exp(b_i - b_j) for j <= i, masked before the exp, so every exponent is <= 0):

1. UT transform: A = strictly-lower(diag(beta) (K K^T o Gamma)), T = (I + A)^-1, by
   blocked doubling (delta.py's `unit_lower_inverse`, fla's solve_tril): T starts as I
   (1 x 1 diagonal blocks); at block size s, T <- T - T (A o M_s) T, where M_s selects
   the block below each diagonal s-block inside its 2s-block (bit tests on iotas), which
   merges each pair [[T1, 0], [A21, T2]] into [[T1, 0], [-T2 A21 T1, T2]]. log2(C)
   levels of two C x C matmuls, float32 at full precision whatever the inputs' dtype
   (C must be a power of two). Not the Neumann product prod (I + A^(2^j)), which needs
   no masks but forms powers of A whose entries grow like binomials (1e8 at C = 64 for
   keys alike) and cancels catastrophically in float32.
2. W = T diag(beta e^b) K, U = T diag(beta) V.
3. With the state S carried from earlier chunks: V_new = U - W S^T,
   O = (Q e^b) S^T + (Q K^T o Gamma) V_new, S <- e^(b_C) S + V_new^T (K e^(b_C - b)).

The passes (two kernel calls per training step, as fla's chunk_delta_rule fwd / bwd):

- forward: emits O and S_L; under the VJP also the state each chunk starts from,
  `[B, H, N, V, K]` float32 (L V K / C per row: what delta.py's checkpointed scan keeps),
  so the backward recomputes no state.
- backward, in reverse over dS (the cotangent of the state a chunk leaves, from dS_L):
  recomputes the chunk's UT transform, W, U and V_new from its start state, and emits
  dq, dk, dv, d beta and d log alpha (float32), every term the transpose of a line of
  the forward: dT -> dA = -T^T dT T^T, d log alpha = the reverse in-chunk sum of db
  (masked sums again), b_C's terms (the state decay, K e^(b_C - b)) on the last row.

Matmul operands are the inputs' dtype (bfloat16 in, bfloat16 operands with float32
accumulation, as fla), except the UT transform's and its cotangents' (float32). Padding:
the tail to a multiple of C with beta = 0 and log alpha = 0 (no write, no decay: S_L is
the state after the real positions), and for Triton the feature widths to powers of two
>= 16 (zeros).

Tested in the interpreters on CPU (tests/kernels/test_delta_rule.py) and lowered for CUDA
(Triton) and exported for TPU (Mosaic); not yet compiled or timed on a GPU or a TPU, where
the backward's dozen live C x C float32 tiles at C = 64 may want a smaller chunk or more
warps for Triton's registers.
"""
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from models import layers
from models.kernels import delta_mgpu, mgpu_common, targets, tuning
from models.kernels.decayed_attention import _Config as _DecayConfig
from models.kernels.decayed_attention import _chunk_sums, _decay
from models.kernels.linear_attention import _F32, _mm, _mm_nt, _mm_tn

# fla's chunk for the delta rule (and delta.py's): 64 positions; the C x C inverse is
# log2(C) pairs of C x C matmuls.
_DEFAULT_CHUNK = 64
# decayed_attention's chunk helpers for one decay per head and position, inclusive.
_SCALAR = _DecayConfig(strict=False, diagonal=False, chunk=0, backend="", platform="",
                       interpret=False)


class _Config(NamedTuple):
    chunk: int
    backend: str  # "pallas" or "xla"
    platform: str  # "gpu" or "tpu": which pallas_call wrapper
    interpret: bool | pltpu.InterpretParams  # the latter: Mosaic's TPU interpreter
    # Triton's (num_warps, num_stages) from models/kernels/tuning.py; None: the defaults
    triton: tuple[int, int] | None = None
    gpu_form: str = "triton"  # "mosaic": the Mosaic GPU kernels (delta_mgpu.py)



# --------------------------------------------------------------------------------------
# The algorithm: one chunk, shared by every backend. A step takes the chunk's (C, D) row
# arrays, its per-chunk (V, K) arrays and the carried state; it returns row outputs,
# per-chunk outputs and the next state.


def _iotas(c: int):
    return (lax.broadcasted_iota(jnp.int32, (c, c), 0),
            lax.broadcasted_iota(jnp.int32, (c, c), 1))


def _unit_lower_inverse(a_CxC):
    """(I + strictly-lower(a))^-1 for a chunk (C a power of two), float32, by doubling."""
    row, col = _iotas(a_CxC.shape[0])
    t = jnp.where(row == col, 1.0, 0.0).astype(_F32)
    s = 1
    while s < a_CxC.shape[0]:
        # Row in the lower s-block, column in the upper s-block, of the same 2s-block.
        pair = (row & -2 * s) == (col & -2 * s)
        below = pair & ((row & s) != 0) & ((col & s) == 0)
        t = t - _mm(_mm(t, jnp.where(below, a_CxC, 0.0), _F32), t, _F32)
        s *= 2
    return t


class _Chunk(NamedTuple):
    """What the forward and the backward both build from one chunk's inputs."""
    b: jax.Array  # C x 1: inclusive sums of log alpha from the chunk's start
    r: jax.Array  # C x 1: b_C - b
    e: jax.Array  # 1 x 1: b_C
    gamma: jax.Array  # C x C: exp(b_i - b_j), j <= i; 0 above
    kk: jax.Array  # C x C: K K^T (float32)
    t: jax.Array  # C x C: (I + A)^-1
    kbe: jax.Array  # C x K: diag(beta e^b) K
    vb: jax.Array  # C x V: diag(beta) V
    w: jax.Array  # C x K: T kbe
    u: jax.Array  # C x V: T vb


def _chunk(k, v, beta, log_a) -> _Chunk:
    b, r, e, b_row = _chunk_sums(log_a, _SCALAR)
    gamma = _decay(b, b_row, _SCALAR)
    row, col = _iotas(k.shape[0])
    kk = _mm_nt(k, k, _F32)
    t = _unit_lower_inverse(jnp.where(row > col, beta * kk * gamma, 0.0))
    kbe, vb = k.astype(_F32) * (beta * jnp.exp(b)), v.astype(_F32) * beta
    return _Chunk(b, r, e, gamma, kk, t, kbe, vb, _mm(t, kbe, _F32), _mm(t, vb, _F32))


def _forward_step(rows, per_chunk, st_VxK, states: bool = False):
    """o for the chunk; with `states`, also the state it starts from (the backward's)."""
    del per_chunk
    q, k, v, beta, log_a = rows
    dtype = q.dtype
    ch = _chunk(k, v, beta.astype(_F32), log_a)
    v_new = ch.u - _mm_nt(ch.w, st_VxK, dtype)
    o = (_mm_nt(q.astype(_F32) * jnp.exp(ch.b), st_VxK, dtype)
         + _mm(_mm_nt(q, k, dtype) * ch.gamma, v_new, dtype))
    st_next = st_VxK * jnp.exp(ch.e) + _mm_tn(v_new, k.astype(_F32) * jnp.exp(ch.r), dtype)
    return (o,), ((st_VxK,) if states else ()), st_next


def _column(row_1xC):
    """A 1 x C row as a C x 1 column (a masked sum: no transpose of a vector)."""
    row, col = _iotas(row_1xC.shape[1])
    return jnp.sum(jnp.where(row == col, row_1xC, 0.0), axis=1, keepdims=True)


def _backward_step(rows, per_chunk, ds_VxK):
    """In reverse: from dS (the cotangent of the state the chunk leaves) and dO, the
    chunk's dq, dk, dv, d beta, d log alpha and the cotangent of the state it starts from.
    Every input's contribution is the transpose of a line of `_forward_step`."""
    q, k, v, beta, log_a, do = rows
    (s_VxK,) = per_chunk
    dtype = q.dtype
    beta = beta.astype(_F32)
    ch = _chunk(k, v, beta, log_a)
    c = q.shape[0]
    row, col = _iotas(c)
    f32 = lambda x: x.astype(_F32)  # noqa: E731
    eb, er, ee = jnp.exp(ch.b), jnp.exp(ch.r), jnp.exp(ch.e)
    v_new = ch.u - _mm_nt(ch.w, s_VxK, dtype)
    qk = _mm_nt(q, k, dtype)
    kr = f32(k) * er
    # S' = e^(b_C) S + V_new^T kr and O = (Q e^b) S^T + (Q K^T o Gamma) V_new.
    dv_new = _mm_nt(kr, ds_VxK, dtype) + _mm_tn(qk * ch.gamma, do, dtype)
    dkr = _mm(v_new, ds_VxK, dtype)
    dp = _mm_nt(do, v_new, dtype) * ch.gamma  # d scores, masked by Gamma
    dqb = _mm(do, s_VxK, dtype)
    ds_prev = (ds_VxK * ee + _mm_tn(do, f32(q) * eb, dtype)
               - _mm_tn(dv_new, ch.w, dtype))
    # V_new = U - W S^T; U = T vb, W = T kbe; T = (I + A)^-1.
    dw = -_mm(dv_new, s_VxK, dtype)
    dt = _mm_nt(dv_new, ch.vb, _F32) + _mm_nt(dw, ch.kbe, _F32)
    dvb, dkbe = _mm_tn(ch.t, dv_new, _F32), _mm_tn(ch.t, dw, _F32)
    da = jnp.where(row > col, -_mm_nt(_mm_tn(ch.t, dt, _F32), ch.t, _F32), 0.0)
    # A = strictly-lower(beta_i (K K^T)_ij Gamma_ij).
    dkk = da * beta * ch.gamma
    dgamma = da * beta * ch.kk * ch.gamma + dp * qk  # d Gamma o Gamma: d (b_i - b_j)
    dq = _mm(dp, k, dtype) + dqb * eb
    dk = (_mm(dkk, k, _F32) + _mm_tn(dkk, k, _F32) + _mm_tn(dp, q, dtype)
          + dkbe * beta * eb + dkr * er)
    dv = dvb * beta
    kbe_dot = jnp.sum(dkbe * f32(k), axis=1, keepdims=True) * eb
    dbeta = (jnp.sum(da * ch.kk * ch.gamma, axis=1, keepdims=True)
             + jnp.sum(dvb * f32(v), axis=1, keepdims=True) + kbe_dot)
    dr = jnp.sum(dkr * kr, axis=1, keepdims=True)
    db = (kbe_dot * beta + jnp.sum(dqb * f32(q), axis=1, keepdims=True) * eb - dr
          + jnp.sum(dgamma, axis=1, keepdims=True)
          - _column(jnp.sum(dgamma, axis=0, keepdims=True)))
    # b_C = e: through r = b_C - b and the state's decay e^(b_C).
    de = jnp.sum(dr, axis=0, keepdims=True) + jnp.sum(
        ds_VxK * s_VxK * ee, axis=(0, 1), keepdims=True)
    db = db + jnp.where(lax.broadcasted_iota(jnp.int32, (c, 1), 0) == c - 1, de, 0.0)
    # b = the inclusive sum of log alpha: d log alpha_s = sum over i >= s of db_i.
    db_row = jnp.sum(jnp.where(row == col, db, 0.0), axis=0, keepdims=True)
    dlog_a = jnp.sum(jnp.where(col >= row, db_row, 0.0), axis=1, keepdims=True)
    return (dq, dk, dv, dbeta, dlog_a), (), ds_prev


class _Pass(NamedTuple):
    step: Callable  # (rows, per_chunk, state) -> (row outputs, per-chunk outputs, state)
    reverse: bool  # runs from the last chunk to the first
    name: str


_FORWARD = _Pass(_forward_step, False, "delta_rule_forward")
_FORWARD_STATES = _Pass(functools.partial(_forward_step, states=True), False,
                        "delta_rule_forward")
_BACKWARD = _Pass(_backward_step, True, "delta_rule_backward")



# --------------------------------------------------------------------------------------
# Three ways to run a pass over row arrays `[B, H, L, D]` (L a multiple of the chunk) and
# per-chunk arrays `[B, H, N, V, K]`, from the state `init` `[B, H, V, K]` (zeros if None).
# Outputs: the row outputs (`row_outs`: (width, dtype) pairs), `n_chunk_outs` per-chunk
# outputs (float32 V x K) and the last state (float32).


def _state_shape(rows):
    return rows[2].shape[-1], rows[0].shape[-1]  # V x K


def _run_xla(pass_: _Pass, rows, chunks, init, row_outs, n_chunk_outs, cfg: _Config):
    del n_chunk_outs
    n, c = rows[0].shape[2] // cfg.chunk, cfg.chunk
    if init is None:
        init = jnp.zeros(rows[0].shape[:2] + _state_shape(rows), _F32)

    def one_row(rows, chunks, init):
        xs = (tuple(x.reshape(n, c, x.shape[-1]) for x in rows), chunks)

        def step(st, x):
            ys, zs, st = pass_.step(*x, st)
            return st, (ys, zs)

        st, (ys, zs) = lax.scan(step, init, xs, reverse=pass_.reverse)
        ys = tuple(y.reshape(n * c, y.shape[-1]).astype(d) for y, (_, d) in zip(ys, row_outs))
        return ys + tuple(zs) + (st,)

    return jax.vmap(jax.vmap(one_row))(rows, chunks, init)


def _out_shapes(rows, row_outs, n_chunk_outs, n):
    b, h, length, _ = rows[0].shape
    shape = _state_shape(rows)
    return (tuple(jax.ShapeDtypeStruct((b, h, length, w), d) for w, d in row_outs)
            + (jax.ShapeDtypeStruct((b, h, n) + shape, _F32),) * n_chunk_outs
            + (jax.ShapeDtypeStruct((b, h) + shape, _F32),))


def _run_gpu(pass_: _Pass, rows, chunks, init, row_outs, n_chunk_outs, cfg: _Config):
    """Triton: one program per (batch, head); the chunk loop runs inside the kernel."""
    b, h, length, _ = rows[0].shape
    c, n = cfg.chunk, length // cfg.chunk
    inits = () if init is None else (init,)
    ins = tuple(rows) + tuple(chunks) + inits
    n_rows, n_chunks, n_out = len(rows), len(chunks), len(row_outs)

    def kernel(*refs):
        row_refs, chunk_refs = refs[:n_rows], refs[n_rows:n_rows + n_chunks]
        init_refs, outs = refs[n_rows + n_chunks:len(ins)], refs[len(ins):]
        row_outs_, chunk_outs_, (last_ref,) = outs[:n_out], outs[n_out:-1], outs[-1:]

        def body(i, st):
            index = n - 1 - i if pass_.reverse else i
            at = pl.ds(pl.multiple_of(index * c, c), c)
            ys, zs, st = pass_.step(tuple(r[at, :] for r in row_refs),
                                    tuple(r[index] for r in chunk_refs), st)
            for ref, y in zip(row_outs_, ys):
                ref[at, :] = y.astype(ref.dtype)
            for ref, z in zip(chunk_outs_, zs):
                ref[index] = z.astype(ref.dtype)
            return st

        st = (init_refs[0][...] if init_refs
              else jnp.zeros(_state_shape(row_refs), _F32))
        last_ref[...] = lax.fori_loop(0, n, body, st)

    def spec(shape):  # the whole (batch, head) slice
        return pl.BlockSpec((pl.squeezed, pl.squeezed) + shape[2:],
                            lambda i, j: (i, j) + (0,) * (len(shape) - 2))

    out_shapes = _out_shapes(rows, row_outs, n_chunk_outs, n)
    return pl.pallas_call(
        kernel,
        out_shape=out_shapes,
        grid=(b, h),
        in_specs=[spec(x.shape) for x in ins],
        out_specs=[spec(o.shape) for o in out_shapes],
        compiler_params=targets.triton_launch(cfg.triton, default=(4, 1)),
        interpret=cfg.interpret,
        name=pass_.name,
    )(*ins)


def _run_tpu(pass_: _Pass, rows, chunks, init, row_outs, n_chunk_outs, cfg: _Config):
    """Mosaic: grid (batch, head, chunk) over (C, D) tiles and (V, K) per-chunk blocks;
    the state in VMEM scratch, written to the last state's block (the same block for
    every chunk of a row) after each chunk."""
    b, h, length, _ = rows[0].shape
    c, n = cfg.chunk, length // cfg.chunk
    inits = () if init is None else (init,)
    ins = tuple(rows) + tuple(chunks) + inits
    n_rows, n_chunks, n_out = len(rows), len(chunks), len(row_outs)

    def chunk_index(i):
        return n - 1 - i if pass_.reverse else i

    def kernel(*refs):
        row_refs, chunk_refs = refs[:n_rows], refs[n_rows:n_rows + n_chunks]
        init_refs, outs = refs[n_rows + n_chunks:len(ins)], refs[len(ins):]
        row_outs_, chunk_outs_ = outs[:n_out], outs[n_out:n_out + n_chunk_outs]
        last_ref, state_ref = outs[n_out + n_chunk_outs:]

        @pl.when(pl.program_id(2) == 0)
        def _init():
            state_ref[...] = (init_refs[0][...] if init_refs
                              else jnp.zeros(state_ref.shape, state_ref.dtype))

        ys, zs, st = pass_.step(tuple(r[...] for r in row_refs),
                                tuple(r[...] for r in chunk_refs), state_ref[...])
        for ref, y in zip(row_outs_ + chunk_outs_, ys + zs):
            ref[...] = y.astype(ref.dtype)
        state_ref[...] = st
        last_ref[...] = st

    v_dim, k_dim = _state_shape(rows)

    def tile(x):
        return pl.BlockSpec((pl.squeezed, pl.squeezed, c, x.shape[-1]),
                            lambda bi, hi, i: (bi, hi, chunk_index(i), 0))

    per_chunk = pl.BlockSpec((pl.squeezed,) * 3 + (v_dim, k_dim),
                             lambda bi, hi, i: (bi, hi, chunk_index(i), 0, 0))
    whole = pl.BlockSpec((pl.squeezed, pl.squeezed, v_dim, k_dim),
                         lambda bi, hi, i: (bi, hi, 0, 0))
    out_shapes = _out_shapes(rows, row_outs, n_chunk_outs, n)
    return pl.pallas_call(
        kernel,
        out_shape=out_shapes,
        grid=(b, h, n),
        in_specs=([tile(x) for x in rows] + [per_chunk] * n_chunks
                  + [whole] * len(inits)),
        out_specs=([tile(o) for o in out_shapes[:n_out]] + [per_chunk] * n_chunk_outs
                   + [whole]),
        scratch_shapes=[pltpu.VMEM((v_dim, k_dim), _F32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=cfg.interpret,
        name=pass_.name,
    )(*ins)


def _run(pass_: _Pass, rows, chunks, init, row_outs, n_chunk_outs, cfg: _Config):
    if cfg.backend == "xla":
        runner = _run_xla
    else:
        runner = _run_gpu if cfg.platform == "gpu" else _run_tpu
    return runner(pass_, rows, chunks, init, row_outs, n_chunk_outs, cfg)


# --------------------------------------------------------------------------------------
# Padding, custom VJP and the public entry point.


def _width(dim: int, cfg: _Config) -> int:
    if cfg.backend == "pallas" and cfg.platform == "gpu":
        return max(16, pl.next_power_of_2(dim))  # Triton tensors: powers of two, >= 16
    return dim


def _pad(x: jax.Array, cfg: _Config, width: int | None = None) -> jax.Array:
    """Zeros after the last position (beta 0: no write; log alpha 0: no decay) and after
    the last feature."""
    length = pl.cdiv(x.shape[2], cfg.chunk) * cfg.chunk
    width = _width(x.shape[3], cfg) if width is None else width
    return jnp.pad(x, ((0, 0), (0, 0), (0, length - x.shape[2]), (0, width - x.shape[3])))


def _padded(q, k, v, beta, log_a, cfg: _Config):
    return (_pad(q, cfg), _pad(k, cfg), _pad(v, cfg),
            _pad(beta.astype(_F32)[..., None], cfg, 1),
            _pad(log_a.astype(_F32)[..., None], cfg, 1))


def _mosaic(cfg: _Config) -> bool:
    return cfg.backend == "pallas" and cfg.platform == "gpu" and cfg.gpu_form == "mosaic"


def _value_blocks(x: jax.Array, axis: int) -> list[jax.Array]:
    """x cut along its value axis into the Mosaic kernels' blocks. Each value channel of
    the state evolves on its own (S's rows: the keys, beta and alpha act from the right),
    so a wide value head is the kernels run per block, the key-side gradients summed."""
    width = delta_mgpu.VALUE_BLOCK
    return [lax.slice_in_dim(x, j, j + width, axis=axis)
            for j in range(0, x.shape[axis], width)]


def _mosaic_forward(rows, states: bool, cfg: _Config):
    """(o, [start states,] S_L) of the padded rows by the Mosaic GPU kernels."""
    q, k, v, beta, log_a = rows
    outs = [delta_mgpu.forward(q, k, vj, beta[..., 0], log_a[..., 0], states=states,
                               interpret=cfg.interpret) for vj in _value_blocks(v, 3)]
    o, s = (jnp.concatenate([x[i] for x in outs], axis=a) for i, a in ((0, 3), (1, 2)))
    if states:
        return o, jnp.concatenate([x[2] for x in outs], axis=3), s
    return o, s


def _mosaic_backward(rows, states, ds, cfg: _Config):
    """dq, dk, dv, d beta, d log alpha (float32; the last two `[B, H, L, 1]`)."""
    q, k, v, beta, log_a, do = rows
    grads = [delta_mgpu.backward(q, k, vj, beta[..., 0], log_a[..., 0], doj, sj, dsj,
                                 interpret=cfg.interpret)
             for vj, doj, sj, dsj in zip(_value_blocks(v, 3), _value_blocks(do, 3),
                                         _value_blocks(states, 3), _value_blocks(ds, 2))]
    dq, dk, dbeta, dlog_a = (sum(g[i] for g in grads) for i in (0, 1, 3, 4))
    return (dq, dk, jnp.concatenate([g[2] for g in grads], axis=3), dbeta[..., None],
            dlog_a[..., None])


def _forward(q, k, v, beta, log_a, cfg: _Config, states: bool = False):
    """o (v's dtype) and S_L (float32); with `states`, ((o, S_L), the state each chunk
    starts from `[B, H, N, V, K]`: the backward's residual)."""
    rows = _padded(q, k, v, beta, log_a, cfg)
    if _mosaic(cfg):
        outs = _mosaic_forward(rows, states, cfg)
    else:
        outs = _run(_FORWARD_STATES if states else _FORWARD, rows, (), None,
                    ((rows[2].shape[3], v.dtype),), int(states), cfg)
    o, s = outs[0][:, :, :v.shape[2], :v.shape[3]], outs[-1][:, :, :v.shape[3], :k.shape[3]]
    return ((o, s), outs[1]) if states else (o, s)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _delta_rule(q, k, v, beta, log_a, cfg: _Config):
    return _forward(q, k, v, beta, log_a, cfg)


def _delta_rule_fwd(q, k, v, beta, log_a, cfg: _Config):
    out, states = _forward(q, k, v, beta, log_a, cfg, states=True)
    return out, (q, k, v, beta, log_a, states)


def _delta_rule_bwd(cfg: _Config, residuals, cotangents):
    q, k, v, beta, log_a, states = residuals
    do, ds = cotangents
    rows = _padded(q, k, v, beta, log_a, cfg) + (_pad(do.astype(v.dtype), cfg),)
    wk, wv = rows[0].shape[3], rows[2].shape[3]
    ds = jnp.pad(ds.astype(_F32), ((0, 0), (0, 0), (0, wv - ds.shape[2]),
                                   (0, wk - ds.shape[3])))
    if _mosaic(cfg):
        dq, dk, dv, dbeta, dlog_a = _mosaic_backward(rows, states, ds, cfg)
    else:
        dq, dk, dv, dbeta, dlog_a, _ = _run(
            _BACKWARD, rows, (states,), ds,
            ((wk, _F32), (wk, _F32), (wv, _F32), (1, _F32), (1, _F32)), 0, cfg)
    length = q.shape[2]
    grads = (dq[:, :, :length, :q.shape[3]], dk[:, :, :length, :k.shape[3]],
             dv[:, :, :length, :v.shape[3]], dbeta[:, :, :length, 0],
             dlog_a[:, :, :length, 0])
    return tuple(d.astype(x.dtype) for d, x in zip(grads, residuals))


_delta_rule.defvjp(_delta_rule_fwd, _delta_rule_bwd)


def make_config(q: jax.Array, k: jax.Array, v: jax.Array, beta: jax.Array,
                log_alpha: jax.Array | None, *, backend: str = "pallas",
                chunk_size: int | None = None, platform: str | None = None,
                interpret: bool | None = None) -> _Config:
    """Checks the shapes and resolves the defaults (kernel flavour, interpret mode, chunk)."""
    if q.ndim != 4 or k.shape != q.shape or v.ndim != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"q and k must be [B, H, L, K] and v [B, H, L, V] alike, got "
                         f"{q.shape}, {k.shape}, {v.shape}")
    for name, x in (("beta", beta), ("log_alpha", log_alpha)):
        if x is not None and x.shape != q.shape[:3]:
            raise ValueError(f"{name} must be [B, H, L] = {q.shape[:3]}, got {x.shape}")
    platform, interpret = targets.resolve_backend(backend, platform, interpret)
    if chunk_size is None:
        chunk_size = min(_DEFAULT_CHUNK, max(16, pl.next_power_of_2(q.shape[2])))
    if chunk_size < 1 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two (the blocked inverse), got "
                         f"{chunk_size}")
    if backend == "pallas" and platform == "gpu" and chunk_size < 16:
        raise ValueError(f"Triton chunks must be a power of two >= 16, got {chunk_size}")
    if backend == "pallas" and platform == "tpu" and chunk_size % 8:
        raise ValueError(f"TPU chunks must be a multiple of 8, got {chunk_size}")
    return _Config(int(chunk_size), backend, platform,
                   targets.interpret_mode(interpret, platform))


def delta_rule(q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array, v_BxHxLxV: jax.Array,
               beta_BxHxL: jax.Array, log_alpha_BxHxL: jax.Array | None = None, *,
               scale: float | None = None, chunk_size: int | None = None,
               backend: str = "pallas", platform: str | None = None,
               interpret: bool | None = None, gpu_form: str = "triton"
               ) -> tuple[jax.Array, jax.Array]:
    """The (gated) delta rule, chunked: `models.attention.delta.chunk_delta_rule`'s result.

    Args:
      q_BxHxLxK, k_BxHxLxK: queries and keys as the rule takes them (delta.py's layer
        L2-normalises them); q is scaled by `scale` (default K^-0.5, fla's) here.
      v_BxHxLxV: values.
      beta_BxHxL: write strengths (0 at padded positions: no write).
      log_alpha_BxHxL: log decays <= 0 (gated_deltanet), or None (deltanet: alpha = 1).
      chunk_size: a power of two; default 64 (fla's), at most the length rounded up to a
        power of two (and at least 16).
      backend: "pallas" (the forward a kernel) or "xla" (the same chunks under lax.scan).
      platform: "gpu" (Triton) or "tpu" (Mosaic); by default the one for the platform the
        program is lowered for (CPU: the Triton flavour, interpreted;
        `models/kernels/targets.py`).
      interpret: run the kernel in the Pallas interpreter; by default on CPU only. With
        platform="tpu", a `pltpu.InterpretParams` runs Mosaic's TPU interpreter instead.
      gpu_form: "triton", or "mosaic": the GPU flavour as the Mosaic GPU kernels
        (`delta_mgpu.py`: chunk 64, 16-bit, key dim 64, value dims a multiple of 64: a
        kernel per 64 value channels) where they take the call, else the
        Triton form, said once.

    Returns:
      o `[B, H, L, V]` in v's dtype and the final state S_L `[B, H, V, K]` float32.
      Differentiable in q, k, v, beta and log_alpha (a backward kernel: module docstring).
    """
    if backend not in ("pallas", "xla"):
        raise ValueError(f"backend must be 'pallas' or 'xla', got {backend!r}")
    if isinstance(interpret, pltpu.InterpretParams) and platform != "tpu":
        raise ValueError("pltpu.InterpretParams interprets the Mosaic (platform='tpu') form")
    mgpu_common.check_gpu_form(gpu_form)
    q, k, v, beta = q_BxHxLxK, k_BxHxLxK, v_BxHxLxV, beta_BxHxL
    scale = q.shape[3] ** -0.5 if scale is None else scale
    q = (q.astype(_F32) * scale).astype(q.dtype)
    log_a = jnp.zeros(beta.shape, _F32) if log_alpha_BxHxL is None else log_alpha_BxHxL
    args = (q, k, v, beta, log_a)

    def build(target: targets.Target):
        chunk, launch = tuning.for_target("delta", target, q.dtype, q.shape[3], q.shape[2],
                                          chunk_size)
        cfg = make_config(q, k, v, beta, log_alpha_BxHxL, backend=target.backend,
                          chunk_size=chunk, platform=target.platform,
                          interpret=targets.interpret_for(target, interpret))._replace(
                              triton=launch)
        if gpu_form == "mosaic" and target.platform == "gpu" and target.backend == "pallas":
            cfg = _mosaic_or_triton(cfg, target, q, v)
            if cfg.gpu_form != "mosaic" and targets.triton_missing(target):
                return build(targets.Target("xla", None, False))

        def run(*xs):
            return _delta_rule(*xs, cfg)

        # XLA cannot partition a Pallas call: under a mesh whose rules shard batch or
        # heads, each device runs the kernel on its own shard.
        axes = (layers.mesh_axes(("batch", "act_heads"), q.shape[:2])
                if cfg.backend == "pallas" else None)
        if axes is None:
            return run
        row, rows = P(*axes, None, None), P(*axes, None)
        specs = (row, row, row, rows, rows)

        def sharded(*xs):  # layers.manual_shards, for two outputs
            if jax.sharding.AxisType.Explicit in jax.sharding.get_abstract_mesh().axis_types:
                xs = [jax.sharding.reshard(x, spec) for x, spec in zip(xs, specs)]
            return jax.shard_map(run, in_specs=specs, out_specs=(row, row),
                                 check_vma=False)(*xs)
        return sharded

    if backend == "xla":
        return build(targets.Target("xla", None, False))(*args)
    return targets.dispatch(build, args, platform=platform, interpret=interpret,
                            mosaic_gpu=gpu_form == "mosaic" and mgpu_common.available())


def _mosaic_or_triton(cfg: _Config, target: targets.Target, q, v) -> _Config:
    """cfg with the Mosaic GPU kernels (chunk 64) where they take the call."""
    why = lambda: delta_mgpu.supports(q.dtype, q.shape[3], v.shape[3])  # noqa: E731
    if mgpu_common.takes("delta rule", target.interpret, why):
        return cfg._replace(chunk=delta_mgpu.CHUNK, gpu_form="mosaic")
    return cfg

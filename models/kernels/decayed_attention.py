"""Chunked decayed linear attention (retnet, gla, mamba2) as Pallas kernels and plain JAX.

`decayed_linear_attention(q, k, v, log_a)` computes, per (batch, head) row,

    o_i = sum_{j <= i} q_i diag(prod_{j<s<=i} a_s) k_j^T v_j      (j < i if `strict`)

with q, k `[B, H, L, K]`, v `[B, H, L, V]` and log a `[B, H, L, G]` <= 0, G = 1 (a scalar
decay per head: retnet, mamba2) or G = K (a diagonal gate: gla). No denominator. It equals
`models.attention.retention.chunked_retention` (its output; not its final state).

The layout follows `models/kernels/linear_attention.py` (read it first): one chunk
algorithm, written as pure functions on the arrays of one chunk of C positions of a row,
run three ways (a Triton kernel with a `fori_loop` over the chunks inside, a Mosaic kernel
with a grid over (batch, head, chunk) and the state in VMEM scratch, plain JAX `lax.scan`
for backend="xla"), all under one custom VJP. Every pass here is causal, so each is one
`step` (emit the chunk's outputs from the state carried so far, and fold the chunk in).

Stability (log space, every exponent <= 0, so L = 16384 with log a ~ -5 stays finite): in
a chunk, b = the inclusive cumulative sum of log a from the chunk's start (a matmul with
a lower-triangular ones matrix built from iotas: neither Triton nor Mosaic lowers a
cumsum), r = the sum of log a over the positions after each one to the chunk's end
(b_C - b, by the strictly upper matrix, so exactly <= 0) and e = b_C. The intra-chunk
weights exp(b_i - b_j) are masked (j > i, or j >= i when strict) BEFORE the exp; the
carried state is read through exp(b_i), keys reach the chunk's end through exp(r_j) and
the state decays by exp(e). G = 1: the C x C decay matrix (b as a column minus b as a
row, the row by a second matmul); G = K: a C x C x K decay tensor, which is why gates
default to chunks of 16 (fla's chunk_gla computes its exact log-space part on
sub-chunks of 16 too).

The passes (the state is kept transposed, V x K, so a diagonal gate scales its columns):

- forward: S^T = sum over earlier chunks of decayed v^T k; emits o.
- backward, queries: recomputes S^T; emits dq (float32).
- backward, keys and values: in reverse over R^T = sum over later positions of
  do_i^T (q_i decayed to the chunk's end); emits dk (float32) and dv.

d log a: with q~_t = q_t exp(B_t) and k~_t = k_t exp(-B_t) (B the cumulative sum over
the whole row: only conceptual, never formed), o is plain linear attention of q~, k~,
so dB_t = q_t dq_t - k_t dk_t (summed over K when G = 1) and d log a_s = sum_{t >= s} dB_t,
a reverse cumulative sum along L in plain JAX after the kernels (O(L K)), in float32.
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
from models.kernels import decayed_mgpu, mgpu_common, targets, tuning
from models.kernels.linear_attention import (_ANY_SPEC, _F32, _mm, _mm_nt, _mm_tn,
                                             _poison_args)

# Chunk sizes: scalar decays as linear_attention's (a 64 x 64 score tile for Triton, the
# MXU's 128 for Mosaic and XLA); diagonal gates 16 everywhere (the C x C x K decay).
_DEFAULT_CHUNK = {"gpu": 64, "tpu": 128, "xla": 128}
_GATE_CHUNK = 16


class _Config(NamedTuple):
    strict: bool
    diagonal: bool  # G = K (a gate per key feature) rather than G = 1
    chunk: int
    backend: str  # "pallas" or "xla"
    platform: str  # "gpu" or "tpu": which pallas_call wrapper
    interpret: bool
    # Triton's (num_warps, num_stages) from models/kernels/tuning.py; None: the defaults
    triton: tuple[int, int] | None = None
    gpu_form: str = "triton"  # "mosaic": the Mosaic GPU kernels (decayed_mgpu.py)



# --------------------------------------------------------------------------------------
# The algorithm: chunk math shared by every backend.


def _iotas(c: int):
    return (lax.broadcasted_iota(jnp.int32, (c, c), 0),
            lax.broadcasted_iota(jnp.int32, (c, c), 1))


def _ones_where(mask):
    return jnp.where(mask, 1.0, 0.0).astype(_F32)


def _chunk_sums(log_a, cfg: _Config):
    """b (inclusive sums of log a from the chunk's start), r (sums over the chunk's later
    positions, b_C - b: exactly <= 0) and e (the chunk's sum, 1 x G). A diagonal gate:
    C x K by matmuls with triangular ones. A scalar decay (C x 1): by masked sums, which
    also give b as a row (1 x C) for the decay matrix, without a transpose or a matmul
    one column wide."""
    row, col = _iotas(log_a.shape[0])
    log_a = log_a.astype(_F32)
    e = jnp.sum(log_a, axis=0, keepdims=True)
    if cfg.diagonal:
        return (_mm(_ones_where(row >= col), log_a, _F32),
                _mm(_ones_where(row < col), log_a, _F32), e, None)
    log_a_row = jnp.sum(jnp.where(row == col, log_a, 0.0), axis=0, keepdims=True)
    b = jnp.sum(jnp.where(row >= col, log_a_row, 0.0), axis=1, keepdims=True)
    r = jnp.sum(jnp.where(row < col, log_a_row, 0.0), axis=1, keepdims=True)
    b_row = jnp.sum(jnp.where(row <= col, log_a, 0.0), axis=0, keepdims=True)
    return b, r, e, b_row


def _decay(b, b_row, cfg: _Config):
    """exp(b_i - b_j) where key j reaches query i (j <= i; j < i if strict), else 0,
    masked before the exp: C x C (scalar) or C x C x K (diagonal, [i, j, k])."""
    c = b.shape[0]
    if cfg.diagonal:
        shape = (c, c, b.shape[1])
        row, col = (lax.broadcasted_iota(jnp.int32, shape, d) for d in (0, 1))
        diff = (lax.broadcast_in_dim(b, shape, (0, 2))
                - lax.broadcast_in_dim(b, shape, (1, 2)))
    else:
        row, col = _iotas(c)
        diff = b - b_row
    seen = row > col if cfg.strict else row >= col
    return jnp.exp(jnp.where(seen, diff, -jnp.inf))


def _scores(q, k, decay, cfg: _Config):
    """A[i, j] = sum_k q_ik k_jk decay_ijk (C x C, float32, 0 where j does not reach i)."""
    if cfg.diagonal:
        shape = decay.shape
        return jnp.sum(lax.broadcast_in_dim(q.astype(_F32), shape, (0, 2))
                       * lax.broadcast_in_dim(k.astype(_F32), shape, (1, 2)) * decay, axis=2)
    return _mm_nt(q, k, q.dtype) * decay


def _decayed(x, weight):
    return x.astype(_F32) * jnp.exp(weight)


def _forward_step(xs, st_VxK, cfg: _Config):
    q, k, v, log_a = xs
    dtype = q.dtype
    b, r, e, b_row = _chunk_sums(log_a, cfg)
    scores_CxC = _scores(q, k, _decay(b, b_row, cfg), cfg)
    o_CxV = _mm(scores_CxC, v, dtype) + _mm_nt(_decayed(q, b), st_VxK, dtype)
    return (o_CxV,), st_VxK * jnp.exp(e) + _mm_tn(v, _decayed(k, r), dtype)


def _dq_step(xs, st_VxK, cfg: _Config):
    q, k, v, log_a, do = xs
    dtype = q.dtype
    b, r, e, b_row = _chunk_sums(log_a, cfg)
    decay = _decay(b, b_row, cfg)
    dp_CxC = _mm_nt(do, v, dtype)  # [i, j]: do_i . v_j (the decay masks it)
    if cfg.diagonal:
        shape = decay.shape
        dq_CxK = jnp.sum(lax.broadcast_in_dim(dp_CxC, shape, (0, 1))
                         * lax.broadcast_in_dim(k.astype(_F32), shape, (1, 2)) * decay, axis=1)
    else:
        dq_CxK = _mm(dp_CxC * decay, k, dtype)
    dq_CxK = dq_CxK + _mm(do, st_VxK, dtype) * jnp.exp(b)
    return (dq_CxK,), st_VxK * jnp.exp(e) + _mm_tn(v, _decayed(k, r), dtype)


def _dkv_step(xs, rt_VxK, cfg: _Config):
    q, k, v, log_a, do = xs
    dtype = q.dtype
    b, r, e, b_row = _chunk_sums(log_a, cfg)
    decay = _decay(b, b_row, cfg)
    dp_CxC = _mm_nt(do, v, dtype)
    if cfg.diagonal:
        shape = decay.shape
        dk_CxK = jnp.sum(lax.broadcast_in_dim(dp_CxC, shape, (0, 1))
                         * lax.broadcast_in_dim(q.astype(_F32), shape, (0, 2)) * decay, axis=0)
    else:
        dk_CxK = _mm_tn(dp_CxC * decay, q, dtype)
    dv_CxV = _mm_tn(_scores(q, k, decay, cfg), do, dtype)
    # Later chunks: through R^T, keys carried to the chunk's end by exp(r).
    dk_CxK = dk_CxK + _mm(v, rt_VxK, dtype) * jnp.exp(r)
    dv_CxV = dv_CxV + _mm_nt(_decayed(k, r), rt_VxK, dtype)
    return (dk_CxK, dv_CxV), rt_VxK * jnp.exp(e) + _mm_tn(do, _decayed(q, b), dtype)


class _Pass(NamedTuple):
    step: Callable  # (chunk inputs, state, cfg) -> (chunk outputs, state)
    reverse: bool  # runs from the last chunk to the first


_FORWARD = _Pass(_forward_step, reverse=False)
_BACKWARD_DQ = _Pass(_dq_step, reverse=False)
_BACKWARD_DKV = _Pass(_dkv_step, reverse=True)


def _state_shape(inputs):
    return inputs[2].shape[-1], inputs[0].shape[-1]  # V x K


# --------------------------------------------------------------------------------------
# Three ways to run a pass over `[B, H, L, D]` arrays (L a multiple of the chunk); the
# outputs are `outs`: (width, dtype) pairs.


def _run_xla(pass_: _Pass, inputs, outs, cfg: _Config, poison=None):
    del poison
    n, c = inputs[0].shape[2] // cfg.chunk, cfg.chunk

    def one_row(*xs):
        chunks = tuple(x.reshape(n, c, x.shape[-1]) for x in xs)
        step = lambda st, x: pass_.step(x, st, cfg)[::-1]  # noqa: E731
        _, ys = lax.scan(step, jnp.zeros(_state_shape(xs), _F32), chunks,
                         reverse=pass_.reverse)
        return tuple(y.reshape(n * c, y.shape[-1]).astype(d) for y, (_, d) in zip(ys, outs))

    return jax.vmap(jax.vmap(one_row))(*inputs)


def _out_shapes(inputs, outs):
    b, h, length, _ = inputs[0].shape
    return tuple(jax.ShapeDtypeStruct((b, h, length, w), d) for w, d in outs)


def _name(pass_: _Pass) -> str:
    return f"decayed_attention_{pass_.step.__name__.strip('_')}"


def _run_gpu(pass_: _Pass, inputs, outs, cfg: _Config, poison=None):
    """Triton: one program per (batch, head); the chunk loop runs inside the kernel."""
    b, h, length, _ = inputs[0].shape
    c, n, n_in = cfg.chunk, length // cfg.chunk, len(inputs)
    out_shapes = _out_shapes(inputs, outs)
    extra, aliases = _poison_args(poison, out_shapes, n_in)

    def kernel(*refs):
        in_refs, out_refs = refs[:n_in], refs[n_in + len(extra):]

        def body(i, st):
            rows = pl.ds(pl.multiple_of((n - 1 - i if pass_.reverse else i) * c, c), c)
            ys, st = pass_.step(tuple(r[rows, :] for r in in_refs), st, cfg)
            for ref, y in zip(out_refs, ys):
                ref[rows, :] = y.astype(ref.dtype)
            return st

        lax.fori_loop(0, n, body, jnp.zeros(_state_shape(in_refs), _F32))

    def row_spec(x):
        return pl.BlockSpec((pl.squeezed, pl.squeezed, length, x.shape[-1]),
                            lambda i, j: (i, j, 0, 0))

    return pl.pallas_call(
        kernel,
        out_shape=out_shapes,
        grid=(b, h),
        in_specs=[row_spec(x) for x in inputs] + [_ANY_SPEC] * len(extra),
        out_specs=[row_spec(o) for o in out_shapes],
        input_output_aliases=aliases,
        compiler_params=targets.triton_launch(cfg.triton, default=(4, 1)),
        interpret=cfg.interpret,
        name=_name(pass_),
    )(*inputs, *extra)


def _run_tpu(pass_: _Pass, inputs, outs, cfg: _Config, poison=None):
    """Mosaic: grid (batch, head, chunk) over (C, D) tiles; the state in VMEM scratch."""
    b, h, length, _ = inputs[0].shape
    c, n, n_in = cfg.chunk, length // cfg.chunk, len(inputs)
    out_shapes = _out_shapes(inputs, outs)
    extra, aliases = _poison_args(poison, out_shapes, n_in)

    def index_map(bi, hi, i):
        return bi, hi, (n - 1 - i if pass_.reverse else i), 0

    def kernel(*refs):
        in_refs = refs[:n_in]
        out_refs = refs[n_in + len(extra):n_in + len(extra) + len(out_shapes)]
        (state_ref,) = refs[n_in + len(extra) + len(out_shapes):]

        @pl.when(pl.program_id(2) == 0)
        def _init():
            state_ref[...] = jnp.zeros(state_ref.shape, state_ref.dtype)

        ys, st = pass_.step(tuple(r[...] for r in in_refs), state_ref[...], cfg)
        for ref, y in zip(out_refs, ys):
            ref[...] = y.astype(ref.dtype)
        state_ref[...] = st

    def tile(x):
        return pl.BlockSpec((pl.squeezed, pl.squeezed, c, x.shape[-1]), index_map)

    return pl.pallas_call(
        kernel,
        out_shape=out_shapes,
        grid=(b, h, n),
        in_specs=[tile(x) for x in inputs] + [_ANY_SPEC] * len(extra),
        out_specs=[tile(o) for o in out_shapes],
        scratch_shapes=[pltpu.VMEM(_state_shape(inputs), _F32)],
        input_output_aliases=aliases,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=cfg.interpret,
        name=_name(pass_),
    )(*inputs, *extra)


def _run(pass_: _Pass, inputs, outs, cfg: _Config, poison=None):
    if cfg.backend == "xla":
        return _run_xla(pass_, inputs, outs, cfg)
    runner = _run_gpu if cfg.platform == "gpu" else _run_tpu
    return runner(pass_, inputs, outs, cfg, poison)


# --------------------------------------------------------------------------------------
# Padding, custom VJP and the public entry point.


def _width(dim: int, cfg: _Config) -> int:
    if cfg.backend == "pallas" and cfg.platform == "gpu":
        return max(16, pl.next_power_of_2(dim))  # Triton tensors: powers of two, >= 16
    return dim


def _pad(x: jax.Array, cfg: _Config, width: int | None = None) -> jax.Array:
    """Zeros after the last position (no write, no decay) and after the last feature."""
    length = pl.cdiv(x.shape[2], cfg.chunk) * cfg.chunk
    width = _width(x.shape[3], cfg) if width is None else width
    return jnp.pad(x, ((0, 0), (0, 0), (0, length - x.shape[2]), (0, width - x.shape[3])))


def _padded(q, k, v, log_a, cfg: _Config):
    # A scalar decay stays one column; a diagonal gate is padded as the keys.
    gates = _width(q.shape[3], cfg) if cfg.diagonal else 1
    return _pad(q, cfg), _pad(k, cfg), _pad(v, cfg), _pad(log_a.astype(_F32), cfg, gates)


def _unpad(x: jax.Array, like: jax.Array) -> jax.Array:
    return x[:, :, :like.shape[2], :like.shape[3]]


def _mosaic(cfg: _Config) -> bool:
    return cfg.backend == "pallas" and cfg.platform == "gpu" and cfg.gpu_form == "mosaic"


def _forward(q, k, v, log_a, cfg: _Config, poison=None):
    if _mosaic(cfg):
        qp, kp, vp, lap = _padded(q, k, v, log_a, cfg)
        if cfg.diagonal:
            o = decayed_mgpu.gate_forward(qp, kp, vp, decayed_mgpu.chunk_sums(lap),
                                          strict=cfg.strict, interpret=cfg.interpret)
        else:
            o = decayed_mgpu.forward(qp, kp, vp, lap[..., 0], strict=cfg.strict,
                                     interpret=cfg.interpret)
        return _unpad(o, v)
    (o,) = _run(_FORWARD, _padded(q, k, v, log_a, cfg), ((_width(v.shape[3], cfg), v.dtype),),
                cfg, poison)
    return _unpad(o, v)


def _backward(q, k, v, log_a, g, cfg: _Config, poison=None):
    """dq, dk (float32), dv (v's dtype) and d log a (float32)."""
    inputs = _padded(q, k, v, log_a, cfg) + (_pad(g.astype(v.dtype), cfg),)
    wk, wv = _width(q.shape[3], cfg), _width(v.shape[3], cfg)
    if _mosaic(cfg):
        qp, kp, vp, lap, gp = inputs
        if cfg.diagonal:
            dq, dk, dv = decayed_mgpu.gate_backward(
                qp, kp, vp, decayed_mgpu.chunk_sums(lap), gp, strict=cfg.strict,
                interpret=cfg.interpret)
        else:
            dq, dk, dv = decayed_mgpu.backward(qp, kp, vp, lap[..., 0], gp,
                                               strict=cfg.strict, interpret=cfg.interpret)
    else:
        (dq,) = _run(_BACKWARD_DQ, inputs, ((wk, _F32),), cfg,
                     None if poison is None else poison[:1])
        dk, dv = _run(_BACKWARD_DKV, inputs, ((wk, _F32), (wv, v.dtype)), cfg,
                      None if poison is None else poison[1:])
    dq, dk, dv = _unpad(dq, q), _unpad(dk, k), _unpad(dv, v)
    db = q.astype(_F32) * dq - k.astype(_F32) * dk
    if not cfg.diagonal:
        db = jnp.sum(db, axis=3, keepdims=True)
    return dq, dk, dv, lax.cumsum(db, axis=2, reverse=True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _decayed_attention(q, k, v, log_a, cfg: _Config):
    return _forward(q, k, v, log_a, cfg)


def _decayed_attention_fwd(q, k, v, log_a, cfg: _Config):
    return _forward(q, k, v, log_a, cfg), (q, k, v, log_a)


def _decayed_attention_bwd(cfg: _Config, residuals, g):
    q, k, v, log_a = residuals
    grads = _backward(q, k, v, log_a, g, cfg)
    return tuple(d.astype(x.dtype) for d, x in zip(grads, residuals))


_decayed_attention.defvjp(_decayed_attention_fwd, _decayed_attention_bwd)


def make_config(q: jax.Array, k: jax.Array, v: jax.Array, log_a: jax.Array, *,
                strict: bool = False, backend: str = "pallas", chunk_size: int | None = None,
                platform: str | None = None, interpret: bool | None = None) -> _Config:
    """Checks the shapes and resolves the defaults (kernel flavour, interpret mode, chunk).

    Called directly, an unset platform or interpret follows this host's default backend;
    the public entry point passes both, for each platform the program may be lowered for
    (models/kernels/targets.py)."""
    if q.ndim != 4 or k.shape != q.shape or v.shape[:3] != q.shape[:3] or v.ndim != 4:
        raise ValueError(f"q and k must be [B, H, L, K] and v [B, H, L, V] alike, got "
                         f"{q.shape}, {k.shape}, {v.shape}")
    if log_a.shape[:3] != q.shape[:3] or log_a.ndim != 4 or log_a.shape[3] not in (1, q.shape[3]):
        raise ValueError(f"log_a must be [B, H, L, 1] or [B, H, L, K] for q {q.shape}, got "
                         f"{log_a.shape}")
    platform, interpret = targets.resolve_backend(backend, platform, interpret)
    diagonal = log_a.shape[3] > 1
    if chunk_size is None:
        chunk_size = (_GATE_CHUNK if diagonal
                      else _DEFAULT_CHUNK["xla" if backend == "xla" else platform])
        chunk_size = min(chunk_size, max(16, pl.next_power_of_2(q.shape[2])))
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if backend == "pallas" and platform == "gpu" and (
            chunk_size < 16 or chunk_size & (chunk_size - 1)):
        raise ValueError(f"Triton chunks must be a power of two >= 16, got {chunk_size}")
    if backend == "pallas" and platform == "tpu" and chunk_size % 8:
        raise ValueError(f"TPU chunks must be a multiple of 8, got {chunk_size}")
    return _Config(bool(strict), diagonal, int(chunk_size), backend, platform,
                   targets.interpret_mode(interpret, platform))


def decayed_linear_attention(q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array,
                             v_BxHxLxV: jax.Array, log_a_BxHxLxG: jax.Array, *,
                             strict: bool = False, backend: str = "pallas",
                             chunk_size: int | None = None, platform: str | None = None,
                             interpret: bool | None = None, gpu_form: str = "triton"
                             ) -> jax.Array:
    """o_i = sum_{j<=i} q_i diag(prod_{j<s<=i} a_s) k_j^T v_j (j < i if `strict`).

    `gpu_form="mosaic"`: the GPU flavour as the Mosaic GPU kernels (`decayed_mgpu.py`,
    chunk 64, dims 64 or 128; scalar decays in 16 bits, gates in bfloat16) where they
    take the call, else the Triton form, said once.

    Args:
      q_BxHxLxK, k_BxHxLxK: queries and keys (no feature map, no scaling here).
      v_BxHxLxV: values.
      log_a_BxHxLxG: log decays <= 0; G = 1 (a scalar per head) or K (a diagonal gate).
      strict: key j reaches queries i > j only (the backward scan of a bidirectional form).
      backend: "pallas" (kernels) or "xla" (the same chunked algorithm under lax.scan).
      chunk_size: positions per chunk; defaults to 64 (Triton), 128 (Mosaic, XLA) for
        scalar decays and 16 for gates, at most the length rounded up to a power of two.
      platform: "gpu" (Triton) or "tpu" (Mosaic) kernel; by default the one for the
        platform the program is lowered for (CPU: the Triton flavour, interpreted; a GPU
        without Triton in this JAX: the XLA path; `models/kernels/targets.py`).
      interpret: run the kernels in the Pallas interpreter; by default on CPU only.

    Returns:
      `[B, H, L, V]` in the dtype of the values (float32 math inside). Differentiable in
      all four arguments.
    """
    args = (q_BxHxLxK, k_BxHxLxK, v_BxHxLxV, log_a_BxHxLxG)
    if backend not in ("pallas", "xla"):
        raise ValueError(f"backend must be 'pallas' or 'xla', got {backend!r}")
    mgpu_common.check_gpu_form(gpu_form)

    def build(target: targets.Target):
        chunk, launch = tuning.for_target("decayed", target, q_BxHxLxK.dtype,
                                          q_BxHxLxK.shape[3], q_BxHxLxK.shape[2], chunk_size)
        cfg = make_config(*args, strict=strict, backend=target.backend,
                          chunk_size=chunk, platform=target.platform,
                          interpret=targets.interpret_for(target, interpret))._replace(
                              triton=launch)
        if gpu_form == "mosaic" and target.platform == "gpu" and target.backend == "pallas":
            cfg = _mosaic_or_triton(cfg, target, q_BxHxLxK, v_BxHxLxV)
            if cfg.gpu_form != "mosaic" and targets.triton_missing(target):
                return build(targets.Target("xla", None, False))

        def run(q, k, v, log_a):
            return _decayed_attention(q, k, v, log_a, cfg)

        # XLA cannot partition a Pallas call: under a mesh whose rules shard batch or
        # heads, each device runs the kernels on its own shard.
        axes = (layers.mesh_axes(("batch", "act_heads"), q_BxHxLxK.shape[:2])
                if cfg.backend == "pallas" else None)
        if axes is None:
            return run
        spec = P(*axes, None, None)
        return lambda *xs: layers.manual_shards(run, xs, (spec,) * 4, spec, xs[2])

    if backend == "xla":
        return build(targets.Target("xla", None, False))(*args)
    # The kernel form follows the platform the program is lowered for (models/kernels/
    # targets.py), not the host that traces it.
    return targets.dispatch(build, args, platform=platform, interpret=interpret,
                            mosaic_gpu=gpu_form == "mosaic" and mgpu_common.available())


def _mosaic_or_triton(cfg: _Config, target: targets.Target, q, v) -> _Config:
    """cfg with the Mosaic GPU kernels (chunk 64) where they take the call."""
    why = lambda: decayed_mgpu.supports(q.dtype, _width(q.shape[3], cfg),  # noqa: E731
                                        _width(v.shape[3], cfg), cfg.diagonal)
    if mgpu_common.takes("decayed attention", target.interpret, why):
        return cfg._replace(chunk=decayed_mgpu.CHUNK, gpu_form="mosaic")
    return cfg

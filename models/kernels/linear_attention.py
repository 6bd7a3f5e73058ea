"""Chunked linear attention as Pallas kernels (GPU: Triton, TPU: Mosaic) and plain JAX.

`linear_attention(q, k, v, causal=...)` takes feature-mapped (non-negative) inputs
`[B, H, L, D]` and returns

    out_i = q_i . S_i / (q_i . z_i + eps),  S_i = sum_{j in A(i)} k_j v_j^T,
                                            z_i = sum_{j in A(i)} k_j,

with A(i) = every j (non-causal) or j <= i (causal).

The algorithm is written once, as three *passes* over chunks of C positions of one
(batch, head) row. Each pass is a pair of pure functions on 2-D chunk arrays: `emit`
(the chunk's outputs from the state carried so far) and `update` (fold the chunk into the
state). Causal passes emit, then update (so position i sees the chunks before its own,
and its own chunk through a lower-triangular mask built from iotas: neither Triton nor
Mosaic lowers a cumsum inside a kernel). Non-causal passes first fold every chunk, then
emit. The passes:

- forward: state (S, z); emits out.
- backward, queries: recomputes (S, z); emits dq and dnum = g / den.
- backward, keys and values: runs in reverse over a state (R, r) = sum over later
  positions of (q_i dnum_i^T, q_i dden_i), where dden_i = -dnum_i . out_i; emits dk, dv.

The same passes run three ways: a Triton kernel (grid over batch and heads; the chunk loop
is a `fori_loop` inside the kernel carrying the state in registers), a Mosaic kernel (grid
over batch, heads, phase, chunk; the state lives in VMEM scratch across the sequential
chunk axis; blocks are (C, D) tiles) and plain JAX (`lax.scan` over chunks), the
`backend="xla"` fallback. All three share the custom VJP.
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
from models.kernels import linear_mgpu, mgpu_common, targets, tuning

_F32 = jnp.float32
# Chunk sizes that suit each target: a 64 x 64 score tile keeps a Triton program within
# registers; 128 matches the TPU MXU and its lane width.
_DEFAULT_CHUNK = {"gpu": 64, "tpu": 128, "xla": 128}


class _Config(NamedTuple):
    causal: bool
    eps: float
    chunk: int
    backend: str  # "pallas" or "xla"
    platform: str  # "gpu" or "tpu": which pallas_call wrapper
    interpret: bool
    gpu_form: str = "triton"  # "mosaic": the Mosaic GPU kernels (linear_mgpu.py)
    # Triton's (num_warps, num_stages) from models/kernels/tuning.py; None: the defaults
    triton: tuple[int, int] | None = None



# --------------------------------------------------------------------------------------
# The algorithm: chunk math shared by every backend.


def _dot(a: jax.Array, b: jax.Array, contract: tuple[int, int], dtype) -> jax.Array:
    """2-D matmul contracting a's dim contract[0] with b's contract[1], f32 accumulation."""
    precision = lax.Precision.HIGHEST if dtype == _F32 else None
    return lax.dot_general(a.astype(dtype), b.astype(dtype),
                           (((contract[0],), (contract[1],)), ((), ())),
                           precision=precision, preferred_element_type=_F32)


def _mm(a, b, dtype):  # a @ b
    return _dot(a, b, (1, 0), dtype)


def _mm_nt(a, b, dtype):  # a @ b.T
    return _dot(a, b, (1, 1), dtype)


def _mm_tn(a, b, dtype):  # a.T @ b
    return _dot(a, b, (0, 0), dtype)


def _tril(chunk: int) -> jax.Array:
    row = lax.broadcasted_iota(jnp.int32, (chunk, chunk), 0)
    col = lax.broadcasted_iota(jnp.int32, (chunk, chunk), 1)
    return row >= col


def _numerator_denominator(q, k, v, s_KxV, z_1xK, causal: bool, eps: float):
    dtype = q.dtype
    num_CxV = _mm(q, s_KxV, dtype)
    den_Cx1 = jnp.sum(q.astype(_F32) * z_1xK, axis=1, keepdims=True)
    if causal:
        scores_CxC = jnp.where(_tril(q.shape[0]), _mm_nt(q, k, dtype), 0.0)
        num_CxV = num_CxV + _mm(scores_CxC, v, dtype)
        den_Cx1 = den_Cx1 + jnp.sum(scores_CxC, axis=1, keepdims=True)
    return num_CxV, den_Cx1 + eps


def _kv_update(xs, state):
    """Folds a chunk's keys and values into (S, z)."""
    _, k, v = xs[:3]
    s_KxV, z_1xK = state
    return (s_KxV + _mm_tn(k, v, k.dtype),
            z_1xK + jnp.sum(k.astype(_F32), axis=0, keepdims=True))


def _forward_emit(xs, state, causal, eps):
    q, k, v = xs
    num_CxV, den_Cx1 = _numerator_denominator(q, k, v, *state, causal, eps)
    return (num_CxV / den_Cx1,)


def _dq_emit(xs, state, causal, eps):
    q, k, v, g = xs
    s_KxV, z_1xK = state
    dtype = q.dtype
    num_CxV, den_Cx1 = _numerator_denominator(q, k, v, s_KxV, z_1xK, causal, eps)
    dnum_CxV = g.astype(_F32) / den_Cx1
    dden_Cx1 = -jnp.sum(dnum_CxV * num_CxV / den_Cx1, axis=1, keepdims=True)
    dq_CxK = _mm_nt(dnum_CxV, s_KxV, dtype) + dden_Cx1 * z_1xK
    if causal:
        # d(out_i)/d(q_i) through key j of the same chunk: v_j . dnum_i + dden_i.
        p_CxC = jnp.where(_tril(q.shape[0]), _mm_nt(dnum_CxV, v, dtype) + dden_Cx1, 0.0)
        dq_CxK = dq_CxK + _mm(p_CxC, k, dtype)
    return dq_CxK, dnum_CxV


def _dden(out, dnum_CxV):
    return -jnp.sum(dnum_CxV * out.astype(_F32), axis=1, keepdims=True)


def _dkv_emit(xs, state, causal, eps):
    del eps
    q, k, v, out, dnum_CxV = xs
    r_KxV, r_1xK = state
    dtype = q.dtype
    dk_CxK = _mm_nt(v, r_KxV, dtype) + r_1xK
    dv_CxV = _mm(k, r_KxV, dtype)
    if causal:
        mask = _tril(q.shape[0])  # [query i, key j]
        p_CxC = jnp.where(mask, _mm_nt(dnum_CxV, v, dtype) + _dden(out, dnum_CxV), 0.0)
        scores_CxC = jnp.where(mask, _mm_nt(q, k, dtype), 0.0)
        dk_CxK = dk_CxK + _mm_tn(p_CxC, q, dtype)
        dv_CxV = dv_CxV + _mm_tn(scores_CxC, dnum_CxV, dtype)
    return dk_CxK, dv_CxV


def _dkv_update(xs, state):
    """Folds a chunk's queries into the reverse state (R, r)."""
    q, _, _, out, dnum_CxV = xs
    r_KxV, r_1xK = state
    return (r_KxV + _mm_tn(q, dnum_CxV, q.dtype),
            r_1xK + jnp.sum(q.astype(_F32) * _dden(out, dnum_CxV), axis=0, keepdims=True))


class _Pass(NamedTuple):
    emit: Callable  # (chunk inputs, state, causal, eps) -> chunk outputs
    update: Callable  # (chunk inputs, state) -> state
    reverse: bool  # causal order runs from the last chunk to the first


_FORWARD = _Pass(_forward_emit, _kv_update, reverse=False)
_BACKWARD_DQ = _Pass(_dq_emit, _kv_update, reverse=False)
_BACKWARD_DKV = _Pass(_dkv_emit, _dkv_update, reverse=True)


def _state_shapes(inputs):
    """(K x V, 1 x K) for every pass: keys-by-values and a keys row vector."""
    dk, dv = inputs[0].shape[-1], inputs[2].shape[-1]
    return ((dk, dv), (1, dk))


# --------------------------------------------------------------------------------------
# Three ways to run a pass over `[B, H, L, D]` arrays (L a multiple of the chunk).


def _run_xla(pass_: _Pass, inputs, out_dtypes, cfg: _Config, poison=None):
    del poison
    n, c = inputs[0].shape[2] // cfg.chunk, cfg.chunk
    shapes = _state_shapes(inputs)

    def one_row(*xs):
        chunks = tuple(x.reshape(n, c, x.shape[-1]) for x in xs)
        if pass_.reverse and cfg.causal:
            chunks = tuple(x[::-1] for x in chunks)
        state = tuple(jnp.zeros(s, _F32) for s in shapes)
        if not cfg.causal:
            state, _ = lax.scan(lambda st, x: (pass_.update(x, st), None), state, chunks)

        def step(st, x):
            outs = pass_.emit(x, st, cfg.causal, cfg.eps)
            return (pass_.update(x, st) if cfg.causal else st), outs

        _, outs = lax.scan(step, state, chunks)
        if pass_.reverse and cfg.causal:
            outs = tuple(o[::-1] for o in outs)
        return tuple(o.reshape(n * c, o.shape[-1]).astype(d) for o, d in zip(outs, out_dtypes))

    return jax.vmap(jax.vmap(one_row))(*inputs)


def _out_shapes(inputs, out_dtypes):
    """One output (V wide: out) or two (K and V wide: dq and dnum, or dk and dv)."""
    b, h, length, _ = inputs[0].shape
    out_dims = ((inputs[0].shape[-1], inputs[2].shape[-1]) if len(out_dtypes) == 2
                else (inputs[2].shape[-1],))
    return tuple(jax.ShapeDtypeStruct((b, h, length, d), t)
                 for d, t in zip(out_dims, out_dtypes))


# The poison buffers stay where they are (never loaded): the kernels only write the outputs.
_ANY_SPEC = pl.BlockSpec(memory_space=pl.ANY)


def _poison_args(poison, out_shapes, n_in):
    """Extra inputs aliased to the outputs: the tests pass NaN so unwritten blocks show."""
    if poison is None:
        return (), {}
    return tuple(poison), {n_in + i: i for i in range(len(out_shapes))}


def _run_gpu(pass_: _Pass, inputs, out_dtypes, cfg: _Config, poison=None):
    """Triton: one program per (batch, head); the chunk loop runs inside the kernel."""
    b, h, length, _ = inputs[0].shape
    c, n, n_in = cfg.chunk, length // cfg.chunk, len(inputs)
    out_shapes = _out_shapes(inputs, out_dtypes)
    extra, aliases = _poison_args(poison, out_shapes, n_in)
    shapes = _state_shapes(inputs)

    def kernel(*refs):
        in_refs, out_refs = refs[:n_in], refs[n_in + len(extra):]

        def rows(i):
            chunk_index = n - 1 - i if (pass_.reverse and cfg.causal) else i
            return pl.ds(pl.multiple_of(chunk_index * c, c), c)

        def load(i):
            return tuple(r[rows(i), :] for r in in_refs)

        state = tuple(jnp.zeros(s, _F32) for s in shapes)
        if not cfg.causal:
            state = lax.fori_loop(0, n, lambda i, st: pass_.update(load(i), st), state)

        def body(i, st):
            xs = load(i)
            for ref, out in zip(out_refs, pass_.emit(xs, st, cfg.causal, cfg.eps)):
                ref[rows(i), :] = out.astype(ref.dtype)
            return pass_.update(xs, st) if cfg.causal else st

        lax.fori_loop(0, n, body, state)

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
        name=f"linear_attention_{pass_.emit.__name__.strip('_')}",
    )(*inputs, *extra)


def _run_tpu(pass_: _Pass, inputs, out_dtypes, cfg: _Config, poison=None):
    """Mosaic: grid (batch, head, phase, chunk) over (C, D) tiles; state in VMEM scratch.

    Non-causal passes take two phases: phase 0 folds every chunk into the state, phase 1
    emits. During phase 0 the output index stays on the first block phase 1 writes, so no
    block is written back before it holds its result.
    """
    b, h, length, _ = inputs[0].shape
    c, n, n_in = cfg.chunk, length // cfg.chunk, len(inputs)
    phases = 1 if cfg.causal else 2
    out_shapes = _out_shapes(inputs, out_dtypes)
    extra, aliases = _poison_args(poison, out_shapes, n_in)
    shapes = _state_shapes(inputs)

    def chunk_of(i):
        return n - 1 - i if (pass_.reverse and cfg.causal) else i

    def in_map(bi, hi, phase, i):
        return bi, hi, chunk_of(i), 0

    def out_map(bi, hi, phase, i):
        return bi, hi, chunk_of(i * phase if phases == 2 else i), 0

    def kernel(*refs):
        in_refs = refs[:n_in]
        out_refs = refs[n_in + len(extra):n_in + len(extra) + len(out_shapes)]
        state_refs = refs[n_in + len(extra) + len(out_shapes):]
        phase, i = pl.program_id(2), pl.program_id(3)

        @pl.when((phase == 0) & (i == 0))
        def _init():
            for ref in state_refs:
                ref[...] = jnp.zeros(ref.shape, ref.dtype)

        xs = tuple(r[...] for r in in_refs)
        state = tuple(r[...] for r in state_refs)

        @pl.when(phase == phases - 1)
        def _emit():
            for ref, out in zip(out_refs, pass_.emit(xs, state, cfg.causal, cfg.eps)):
                ref[...] = out.astype(ref.dtype)

        @pl.when(phase == 0)
        def _update():
            for ref, new in zip(state_refs, pass_.update(xs, state)):
                ref[...] = new

    def tile(x, index_map):
        return pl.BlockSpec((pl.squeezed, pl.squeezed, c, x.shape[-1]), index_map)

    return pl.pallas_call(
        kernel,
        out_shape=out_shapes,
        grid=(b, h, phases, n),
        in_specs=[tile(x, in_map) for x in inputs] + [_ANY_SPEC] * len(extra),
        out_specs=[tile(o, out_map) for o in out_shapes],
        scratch_shapes=[pltpu.VMEM(s, _F32) for s in shapes],
        input_output_aliases=aliases,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary", "arbitrary")),
        interpret=cfg.interpret,
        name=f"linear_attention_{pass_.emit.__name__.strip('_')}",
    )(*inputs, *extra)


def _run(pass_: _Pass, inputs, out_dtypes, cfg: _Config, poison=None):
    if cfg.backend == "xla":
        return _run_xla(pass_, inputs, out_dtypes, cfg)
    runner = _run_gpu if cfg.platform == "gpu" else _run_tpu
    return runner(pass_, inputs, out_dtypes, cfg, poison)


# --------------------------------------------------------------------------------------
# Padding, custom VJP and the public entry point.


def _padded_sizes(x: jax.Array, cfg: _Config) -> tuple[int, int]:
    length = pl.cdiv(x.shape[2], cfg.chunk) * cfg.chunk
    dim = x.shape[3]
    if cfg.backend == "pallas" and cfg.platform == "gpu":
        dim = max(16, pl.next_power_of_2(dim))  # Triton tensors: powers of two, >= 16
    return length, dim


def _pad(x: jax.Array, cfg: _Config, value: float = 0.0) -> jax.Array:
    length, dim = _padded_sizes(x, cfg)
    pads = ((0, 0), (0, 0), (0, length - x.shape[2]), (0, dim - x.shape[3]))
    if value == 0.0:
        return jnp.pad(x, pads)
    # Padded query rows get 1 in the real features (a non-zero denominator, so their
    # zero cotangents stay finite); padded feature columns stay 0 so no dot product moves.
    x = jnp.pad(x, pads[:3] + ((0, 0),), constant_values=value)
    return jnp.pad(x, ((0, 0),) * 3 + (pads[3],))


def _unpad(x: jax.Array, like: jax.Array) -> jax.Array:
    return x[:, :, :like.shape[2], :like.shape[3]]


def _forward(q, k, v, cfg: _Config, poison=None):
    inputs = (_pad(q, cfg, 1.0), _pad(k, cfg), _pad(v, cfg))
    if cfg.backend == "pallas" and cfg.platform == "gpu" and cfg.gpu_form == "mosaic":
        out = linear_mgpu.forward(*inputs, causal=cfg.causal, eps=cfg.eps,
                                  interpret=cfg.interpret)
        return _unpad(out, v)
    (out,) = _run(_FORWARD, inputs, (q.dtype,), cfg, poison)
    return _unpad(out, v)


def _backward(q, k, v, out, g, cfg: _Config, poison=None):
    qp, kp, vp = _pad(q, cfg, 1.0), _pad(k, cfg), _pad(v, cfg)
    gp, outp = _pad(g, cfg), _pad(out, cfg)
    if cfg.backend == "pallas" and cfg.platform == "gpu" and cfg.gpu_form == "mosaic":
        dq, dk, dv = linear_mgpu.backward(qp, kp, vp, outp, gp, causal=cfg.causal,
                                          eps=cfg.eps, interpret=cfg.interpret)
        return _unpad(dq, q), _unpad(dk, k), _unpad(dv, v)
    dq, dnum = _run(_BACKWARD_DQ, (qp, kp, vp, gp), (q.dtype, _F32), cfg,
                    None if poison is None else poison[:2])
    dk, dv = _run(_BACKWARD_DKV, (qp, kp, vp, outp, dnum), (k.dtype, v.dtype), cfg,
                  None if poison is None else poison[2:])
    return _unpad(dq, q), _unpad(dk, k), _unpad(dv, v)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _linear_attention(q, k, v, cfg: _Config):
    return _forward(q, k, v, cfg)


def _linear_attention_fwd(q, k, v, cfg: _Config):
    out = _forward(q, k, v, cfg)
    return out, (q, k, v, out)


def _linear_attention_bwd(cfg: _Config, residuals, g):
    q, k, v, out = residuals
    return _backward(q, k, v, out, g, cfg)


_linear_attention.defvjp(_linear_attention_fwd, _linear_attention_bwd)


def make_config(q: jax.Array, *, causal: bool, backend: str = "pallas",
                chunk_size: int | None = None, eps: float = 1e-6,
                platform: str | None = None, interpret: bool | None = None) -> _Config:
    """Resolves the defaults: the kernel flavour and interpret mode follow the backend.

    Called directly, an unset platform or interpret follows this host's default backend;
    the public entry point passes both, for each platform the program may be lowered for
    (models/kernels/targets.py)."""
    platform, interpret = targets.resolve_backend(backend, platform, interpret)
    if chunk_size is None:
        chunk_size = _DEFAULT_CHUNK["xla" if backend == "xla" else platform]
        chunk_size = min(chunk_size, max(16, pl.next_power_of_2(q.shape[2])))
    if backend == "pallas" and platform == "gpu" and (
            chunk_size < 16 or chunk_size & (chunk_size - 1)):
        raise ValueError(f"Triton chunks must be a power of two >= 16, got {chunk_size}")
    if backend == "pallas" and platform == "tpu" and chunk_size % 8:
        raise ValueError(f"TPU chunks must be a multiple of 8, got {chunk_size}")
    return _Config(bool(causal), float(eps), int(chunk_size), backend, platform,
                   targets.interpret_mode(interpret, platform))


def linear_attention(q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array, v_BxHxLxV: jax.Array, *,
                     causal: bool, backend: str = "pallas", chunk_size: int | None = None,
                     eps: float = 1e-6, platform: str | None = None,
                     interpret: bool | None = None, gpu_form: str = "triton") -> jax.Array:
    """Normalised linear attention on feature-mapped (non-negative) inputs.

    `gpu_form="mosaic"`: the GPU flavour as the Mosaic GPU kernels (`linear_mgpu.py`:
    forward and both backward passes; chunk 64, 16-bit, feature dims 64 or 128) where they
    take the call, else the Triton form, said once.

    Args:
      q_BxHxLxK, k_BxHxLxK: feature-mapped queries and keys (e.g. elu + 1).
      v_BxHxLxV: values.
      causal: position i attends to j <= i only.
      backend: "pallas" (kernels) or "xla" (the same chunked algorithm under lax.scan).
      chunk_size: positions per chunk; defaults to 64 (Triton), 128 (Mosaic, XLA).
      eps: added to the denominator.
      platform: "gpu" (Triton) or "tpu" (Mosaic) kernel; by default the one for the
        platform the program is lowered for (CPU: the Triton flavour, interpreted; a GPU
        without Triton in this JAX: the XLA path; `models/kernels/targets.py`).
      interpret: run the kernels in the Pallas interpreter; by default on CPU only.

    Returns:
      `[B, H, L, V]` in the dtype of the queries.
    """
    if backend not in ("pallas", "xla"):
        raise ValueError(f"backend must be 'pallas' or 'xla', got {backend!r}")
    mgpu_common.check_gpu_form(gpu_form)

    def build(target: targets.Target):
        chunk, launch = tuning.for_target("linear", target, q_BxHxLxK.dtype,
                                          q_BxHxLxK.shape[3], q_BxHxLxK.shape[2], chunk_size)
        cfg = make_config(q_BxHxLxK, causal=causal, backend=target.backend,
                          chunk_size=chunk, eps=eps, platform=target.platform,
                          interpret=targets.interpret_for(target, interpret))._replace(
                              triton=launch)
        if gpu_form == "mosaic" and target.platform == "gpu" and target.backend == "pallas":
            cfg = _mosaic_or_triton(cfg, target, q_BxHxLxK, v_BxHxLxV)
            if cfg.gpu_form != "mosaic" and targets.triton_missing(target):
                return build(targets.Target("xla", None, False))

        def run(q, k, v):
            return _linear_attention(q, k, v, cfg)

        # XLA cannot partition a Pallas call: under a mesh whose rules shard batch or
        # heads, each device runs the kernels on its own shard.
        axes = (layers.mesh_axes(("batch", "act_heads"), q_BxHxLxK.shape[:2])
                if cfg.backend == "pallas" else None)
        if axes is None:
            return run
        spec = P(*axes, None, None)
        return lambda q, k, v: layers.manual_shards(run, (q, k, v), (spec,) * 3, spec, q)

    args = (q_BxHxLxK, k_BxHxLxK, v_BxHxLxV)
    if backend == "xla":
        return build(targets.Target("xla", None, False))(*args)
    # The kernel form follows the platform the program is lowered for (models/kernels/
    # targets.py), not the host that traces it.
    return targets.dispatch(build, args, platform=platform, interpret=interpret,
                            mosaic_gpu=gpu_form == "mosaic" and mgpu_common.available())


def _mosaic_or_triton(cfg: _Config, target: targets.Target, q, v) -> _Config:
    """cfg with the Mosaic GPU kernels (chunk 64) where they take the call; the dims they
    see are Triton's padded ones (powers of two >= 16)."""
    dims = (max(16, pl.next_power_of_2(q.shape[3])), max(16, pl.next_power_of_2(v.shape[3])))
    why = lambda: linear_mgpu.supports(q.dtype, *dims, linear_mgpu.CHUNK)  # noqa: E731
    if mgpu_common.takes("linear attention", target.interpret, why):
        return cfg._replace(chunk=linear_mgpu.CHUNK, gpu_form="mosaic")
    return cfg

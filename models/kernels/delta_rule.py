"""The chunked (gated) delta rule, DeltaNet and Gated DeltaNet, as Pallas kernels and plain JAX.

`delta_rule(q, k, v, beta, log_alpha)` computes, per (batch, head) row, with S_0 = 0,

    S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,   o_t = S_t q_t scale

(S is V x K; alpha_t = exp(log_alpha_t) <= 1, one per head and position; log_alpha None:
alpha = 1, DeltaNet) and returns o `[B, H, L, V]` and S_L `[B, H, V, K]`: exactly
`models.attention.delta.chunk_delta_rule` (the WY / UT form fla's chunk_delta_rule and
chunk_gated_delta_rule use), which equals the recurrence `delta_rule_reference`.

The layout follows `models/kernels/decayed_attention.py` (read it, and linear_attention.py,
first): one chunk algorithm, `_forward_step`, written on the 2-D arrays of one chunk of C
positions of a row, run three ways: a Triton kernel (one program per (batch, head), a
`fori_loop` over the chunks carrying S in registers), a Mosaic TPU kernel (grid (batch,
head, chunk), S in VMEM scratch across the sequential chunk axis) and plain JAX
(`lax.scan` over the chunks, backend="xla"), all under one custom VJP.

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
   O = (Q e^b) S^T + (tril(Q K^T) o Gamma) V_new, S <- e^(b_C) S + V_new^T (K e^(b_C - b)).

Matmul operands are the inputs' dtype (bfloat16 in, bfloat16 operands with float32
accumulation, as fla), except the UT transform's (float32). Padding: the tail to a
multiple of C with beta = 0 and log alpha = 0 (no write, no decay: S_L is the state after
the real positions), and for Triton the feature widths to powers of two >= 16 (zeros).

The backward (first landing): the custom VJP's backward is jax.vjp of the XLA form of the
same chunk algorithm (`lax.scan` over chunks, recomputing the forward in XLA), not a
Pallas kernel: correct in every form, but on GPU / TPU only the forward is a kernel. A
Pallas backward (recomputing the chunk states, then a reverse pass over dS as fla's
chunk_delta_rule_bwd) is the missing piece.
"""
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from models import layers
from models.kernels import targets
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
    interpret: bool


# --------------------------------------------------------------------------------------
# The algorithm: one chunk, shared by every backend.


def _unit_lower_inverse(a_CxC):
    """(I + strictly-lower(a))^-1 for a chunk (C a power of two), float32, by doubling."""
    c = a_CxC.shape[0]
    row = lax.broadcasted_iota(jnp.int32, (c, c), 0)
    col = lax.broadcasted_iota(jnp.int32, (c, c), 1)
    t = jnp.where(row == col, 1.0, 0.0).astype(_F32)
    s = 1
    while s < c:
        # Row in the lower s-block, column in the upper s-block, of the same 2s-block.
        pair = (row & -2 * s) == (col & -2 * s)
        below = pair & ((row & s) != 0) & ((col & s) == 0)
        t = t - _mm(_mm(t, jnp.where(below, a_CxC, 0.0), _F32), t, _F32)
        s *= 2
    return t


def _forward_step(xs, st_VxK):
    q, k, v, beta, log_a = xs  # C x K, C x K, C x V, C x 1, C x 1
    dtype = q.dtype
    b, r, e, b_row = _chunk_sums(log_a, _SCALAR)
    gamma_CxC = _decay(b, b_row, _SCALAR)  # exp(b_i - b_j), j <= i; 0 above
    c = q.shape[0]
    row = lax.broadcasted_iota(jnp.int32, (c, c), 0)
    col = lax.broadcasted_iota(jnp.int32, (c, c), 1)
    beta = beta.astype(_F32)
    a_CxC = jnp.where(row > col, beta * _mm_nt(k, k, _F32) * gamma_CxC, 0.0)
    t_CxC = _unit_lower_inverse(a_CxC)
    w_CxK = _mm(t_CxC, k.astype(_F32) * (beta * jnp.exp(b)), _F32)
    u_CxV = _mm(t_CxC, v.astype(_F32) * beta, _F32)
    v_new_CxV = u_CxV - _mm_nt(w_CxK, st_VxK, dtype)
    scores_CxC = _mm_nt(q, k, dtype) * gamma_CxC
    o_CxV = (_mm_nt(q.astype(_F32) * jnp.exp(b), st_VxK, dtype)
             + _mm(scores_CxC, v_new_CxV, dtype))
    st_VxK = st_VxK * jnp.exp(e) + _mm_tn(v_new_CxV, k.astype(_F32) * jnp.exp(r), dtype)
    return o_CxV, st_VxK


def _state_shape(inputs):
    return inputs[2].shape[-1], inputs[0].shape[-1]  # V x K


# --------------------------------------------------------------------------------------
# Three ways to run the forward over `[B, H, L, D]` arrays (L a multiple of the chunk):
# o `[B, H, L, V]` in v's dtype and S_L `[B, H, V, K]` float32.


def _run_xla(inputs, cfg: _Config):
    n, c = inputs[0].shape[2] // cfg.chunk, cfg.chunk

    def one_row(*xs):
        chunks = tuple(x.reshape(n, c, x.shape[-1]) for x in xs)
        step = lambda st, x: _forward_step(x, st)[::-1]  # noqa: E731
        st, o = lax.scan(step, jnp.zeros(_state_shape(xs), _F32), chunks)
        return o.reshape(n * c, o.shape[-1]).astype(xs[2].dtype), st

    return jax.vmap(jax.vmap(one_row))(*inputs)


def _out_shapes(inputs):
    b, h, length, _ = inputs[0].shape
    v_dim, k_dim = _state_shape(inputs)
    return (jax.ShapeDtypeStruct((b, h, length, v_dim), inputs[2].dtype),
            jax.ShapeDtypeStruct((b, h, v_dim, k_dim), _F32))


def _run_gpu(inputs, cfg: _Config):
    """Triton: one program per (batch, head); the chunk loop runs inside the kernel."""
    b, h, length, _ = inputs[0].shape
    c, n, n_in = cfg.chunk, length // cfg.chunk, len(inputs)

    def kernel(*refs):
        in_refs, (o_ref, s_ref) = refs[:n_in], refs[n_in:]

        def body(i, st):
            rows = pl.ds(pl.multiple_of(i * c, c), c)
            o, st = _forward_step(tuple(r[rows, :] for r in in_refs), st)
            o_ref[rows, :] = o.astype(o_ref.dtype)
            return st

        s_ref[...] = lax.fori_loop(0, n, body, jnp.zeros(_state_shape(in_refs), _F32))

    def row_spec(x):
        return pl.BlockSpec((pl.squeezed, pl.squeezed, length, x.shape[-1]),
                            lambda i, j: (i, j, 0, 0))

    v_dim, k_dim = _state_shape(inputs)
    return pl.pallas_call(
        kernel,
        out_shape=_out_shapes(inputs),
        grid=(b, h),
        in_specs=[row_spec(x) for x in inputs],
        out_specs=[row_spec(inputs[2]),
                   pl.BlockSpec((pl.squeezed, pl.squeezed, v_dim, k_dim),
                                lambda i, j: (i, j, 0, 0))],
        compiler_params=targets.triton_params(num_warps=4, num_stages=1),
        interpret=cfg.interpret,
        name="delta_rule_forward",
    )(*inputs)


def _run_tpu(inputs, cfg: _Config):
    """Mosaic: grid (batch, head, chunk) over (C, D) tiles; S in VMEM scratch, written to
    the state's block (the same block for every chunk of a row) after each chunk."""
    b, h, length, _ = inputs[0].shape
    c, n, n_in = cfg.chunk, length // cfg.chunk, len(inputs)
    v_dim, k_dim = _state_shape(inputs)

    def kernel(*refs):
        in_refs, (o_ref, s_ref, state_ref) = refs[:n_in], refs[n_in:]

        @pl.when(pl.program_id(2) == 0)
        def _init():
            state_ref[...] = jnp.zeros(state_ref.shape, state_ref.dtype)

        o, st = _forward_step(tuple(r[...] for r in in_refs), state_ref[...])
        o_ref[...] = o.astype(o_ref.dtype)
        state_ref[...] = st
        s_ref[...] = st

    def tile(x):
        return pl.BlockSpec((pl.squeezed, pl.squeezed, c, x.shape[-1]),
                            lambda bi, hi, i: (bi, hi, i, 0))

    return pl.pallas_call(
        kernel,
        out_shape=_out_shapes(inputs),
        grid=(b, h, n),
        in_specs=[tile(x) for x in inputs],
        out_specs=[tile(inputs[2]),
                   pl.BlockSpec((pl.squeezed, pl.squeezed, v_dim, k_dim),
                                lambda bi, hi, i: (bi, hi, 0, 0))],
        scratch_shapes=[pltpu.VMEM((v_dim, k_dim), _F32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=cfg.interpret,
        name="delta_rule_forward",
    )(*inputs)


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


def _forward(q, k, v, beta, log_a, cfg: _Config):
    """o (v's dtype) and S_L (float32) of the scaled queries; beta and log a `[B, H, L]`."""
    inputs = (_pad(q, cfg), _pad(k, cfg), _pad(v, cfg),
              _pad(beta.astype(_F32)[..., None], cfg, 1),
              _pad(log_a.astype(_F32)[..., None], cfg, 1))
    if cfg.backend == "xla":
        o, s = _run_xla(inputs, cfg)
    else:
        o, s = (_run_gpu if cfg.platform == "gpu" else _run_tpu)(inputs, cfg)
    return o[:, :, :v.shape[2], :v.shape[3]], s[:, :, :v.shape[3], :k.shape[3]]


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _delta_rule(q, k, v, beta, log_a, cfg: _Config):
    return _forward(q, k, v, beta, log_a, cfg)


def _delta_rule_fwd(q, k, v, beta, log_a, cfg: _Config):
    return _forward(q, k, v, beta, log_a, cfg), (q, k, v, beta, log_a)


def _delta_rule_bwd(cfg: _Config, residuals, cotangents):
    # The XLA form of the same chunks, differentiated by JAX (module docstring).
    xla = _Config(cfg.chunk, "xla", cfg.platform, False)
    _, vjp = jax.vjp(lambda *xs: _forward(*xs, xla), *residuals)
    grads = vjp(cotangents)
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
    if backend not in ("pallas", "xla"):
        raise ValueError(f"backend must be 'pallas' or 'xla', got {backend!r}")
    device = jax.default_backend()
    if platform is None:
        platform = "tpu" if device == "tpu" else "gpu"
    if platform not in ("gpu", "tpu"):
        raise ValueError(f"platform must be 'gpu' or 'tpu', got {platform!r}")
    if interpret is None:
        interpret = device == "cpu"
    if chunk_size is None:
        chunk_size = min(_DEFAULT_CHUNK, max(16, pl.next_power_of_2(q.shape[2])))
    if chunk_size < 1 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two (the blocked inverse), got "
                         f"{chunk_size}")
    if backend == "pallas" and platform == "gpu" and chunk_size < 16:
        raise ValueError(f"Triton chunks must be a power of two >= 16, got {chunk_size}")
    if backend == "pallas" and platform == "tpu" and chunk_size % 8:
        raise ValueError(f"TPU chunks must be a multiple of 8, got {chunk_size}")
    return _Config(int(chunk_size), backend, platform, bool(interpret))


def delta_rule(q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array, v_BxHxLxV: jax.Array,
               beta_BxHxL: jax.Array, log_alpha_BxHxL: jax.Array | None = None, *,
               scale: float | None = None, chunk_size: int | None = None,
               backend: str = "pallas", platform: str | None = None,
               interpret: bool | None = None) -> tuple[jax.Array, jax.Array]:
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
      interpret: run the kernel in the Pallas interpreter; by default on CPU only.

    Returns:
      o `[B, H, L, V]` in v's dtype and the final state S_L `[B, H, V, K]` float32.
      Differentiable in q, k, v, beta and log_alpha (the backward is XLA: module docstring).
    """
    if backend not in ("pallas", "xla"):
        raise ValueError(f"backend must be 'pallas' or 'xla', got {backend!r}")
    q, k, v, beta = q_BxHxLxK, k_BxHxLxK, v_BxHxLxV, beta_BxHxL
    scale = q.shape[3] ** -0.5 if scale is None else scale
    q = (q.astype(_F32) * scale).astype(q.dtype)
    log_a = jnp.zeros(beta.shape, _F32) if log_alpha_BxHxL is None else log_alpha_BxHxL
    args = (q, k, v, beta, log_a)

    def build(target: targets.Target):
        cfg = make_config(q, k, v, beta, log_alpha_BxHxL, backend=target.backend,
                          chunk_size=chunk_size, platform=target.platform,
                          interpret=target.interpret)

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
    return targets.dispatch(build, args, platform=platform, interpret=interpret)

"""The delta rule with L2-normalised keys, chunked: `deltanet` and `gated_deltanet`.

- `deltanet` (Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule
  over Sequence Length"; the layer as flash-linear-attention's `DeltaNet` defaults):
      S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,   o_t = S_t q_t / sqrt(d_k)
- `gated_deltanet` (Yang et al. 2025, "Gated Delta Networks"; fla's `GatedDeltaNet`):
      S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,
      alpha_t = exp(g_t),  g_t = -exp(A_log) softplus(W_a x_t + dt_bias)  (Mamba-2's gate)

S is V x K per head (values by keys, as fast_weight's memory in linear.py, whose
`delta_write` is the rule's one step here too: alpha S moved a fraction beta towards
v along k). The layer around it, as fla's defaults: bias-free q/k/v projections, a
depthwise causal convolution of 4 taps on each (fla's ShortConvolution, no bias) followed
by SiLU, q and k L2-normalised (after the SiLU), beta_t = sigmoid(W_beta x_t) per head,
an RMSNorm per head on the output (weight shared by the heads, eps 1e-5), times
SiLU(W_g x_t) when use_gate (gated_deltanet's default, deltanet's is off), and a
bias-free output projection. gated_deltanet's value heads are expand_v = 2 times the key
heads (fla's default). allow_neg_eigval (fla's option, off by default as there; Grazzi
et al. 2025's sigmoid_scale 2.0, automl/unlocking_state_tracking parity_delta_net_2.yaml):
beta = 2 sigmoid(.) in (0, 2), so the transition's eigenvalue along k, 1 - beta, spans
(-1, 1): what parity and permutation tracking need. Not ported: fla's other options
(qk_activation, qk_norm='sum', num_v_heads), and fla's model-level re-initialisation
(normal(0.02) for every Linear and Conv1d): projections are xavier-uniform as every
variant here, the convolutions the layer's own default, U(-1/sqrt(taps), 1/sqrt(taps))
(PyTorch's Conv1d).

Three forms, equal (tests/models/test_delta.py):
1. `delta_rule_reference`: the recurrence, a `jax.lax.scan` over time (the test oracle);
2. `chunk_delta_rule` (what the layer runs): the WY / UT representation of the paper's
   Algorithm. Per chunk of C positions with b_i = sum of g over the chunk up to i and
   Gamma_ij = exp(b_i - b_j) (i >= j; 1 without a gate),
       (I + tril(diag(beta) (K K^T o Gamma), -1)) [U | W] = [diag(beta) V | diag(beta e^b) K]
   solved for all chunks at once through the inverse of the unit lower triangular matrix
   (`unit_lower_inverse`, block forward substitution); then a scan over the chunks
   carries S: V_new = U - W S^T, O = (Q e^b) S^T + tril(Q K^T o Gamma) V_new,
   S <- e^{b_C} S + V_new^T (K e^{b_C - b}). Float32; every exponent is <= 0 (the
   above-diagonal differences are masked before exp), so nothing overflows at any length;
3. `delta_rule_step`: one token (decoding, `models.decoding`'s "recurrent_state" through
   `recurrent.RecurrentDecoding`): the cache holds S and the last conv_size - 1 inputs
   of each convolution, whatever the position.

attention_impl="pallas" runs both training scans (and the prompt's) through
`models.kernels.delta_rule` (the chunked form's forward and backward passes as Triton
kernels on GPU, Mosaic on TPU, interpreted on CPU), at the kernel's chunk (64, fla's) rather
than the layer's chunk_size; "pallas_mosaic" the same with the Mosaic GPU kernels on a
Hopper (`models.kernels.delta_mgpu`; Triton where they decline, said once); "dense" (the
default) runs `chunk_delta_rule` under XLA, at chunk_size: by default fla's 64, and 16
where the CPU builds the layer (CPU_CHUNK; a training step of the MAD selective-copying
mini 1.3 times faster for gated_deltanet, 1.65 for gated_deltaproduct:
results/cpu/chunk_sizes.md).

causal=False (LRA's classifiers): a forward and a backward scan, summed before the
output norm and gate. The backward scan is the causal layer run on the reversed
sequence, with its own convolutions, beta (and gate) projections; q, k, v projections,
output norm, gate and output projection are shared. Padded positions neither write
(beta = 0) nor decay (g = 0), and their convolution inputs are zero, so they reach no
real position in either direction.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers, registry
from models.attention import recurrent
from models.attention.linear_scan import _pad_to_chunks, backend_chunk, delta_write
from models.kernels.delta_rule import delta_rule

DEFAULT_CHUNK = 64  # fla's chunk size
CPU_CHUNK = 16  # the default where the CPU builds the layer (linear_scan.backend_chunk)
CONV_SIZE = 4  # fla's short convolutions
L2_EPS = 1e-6  # fla's l2norm: x / sqrt(sum x^2 + eps)
NORM_EPS = 1e-5  # fla's output RMSNorm
A_INIT_RANGE = (0.0, 16.0)  # fla GatedDeltaNet: A ~ U(0, 16), A_log = log A
DT_INIT_RANGE = (1e-3, 1e-1)  # dt log-uniform in it, at least DT_INIT_FLOOR (Mamba-2)
DT_INIT_FLOOR = 1e-4
# chunk_delta_rule (XLA), or the Pallas delta-rule kernels (pallas_mosaic: their Mosaic GPU
# form on a Hopper, models/kernels/delta_mgpu.py)
IMPLS = ("dense", "pallas", "pallas_mosaic")


# ----------------------------------------------------------------------------- core math


def l2_normalise(x_BxHxLxK: jax.Array) -> jax.Array:
    """x / sqrt(|x|^2 + eps) over the last axis, float32 (a zero vector stays zero)."""
    x = x_BxHxLxK.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


def causal_conv(x_BxHxLxF: jax.Array, w_WxHxF: jax.Array) -> jax.Array:
    """Depthwise causal convolution, y_t = sum_i w[i] x_{t-W+1+i} (zeros before the
    start): PyTorch's Conv1d(padding=W-1) cut to the first L outputs, as fla's
    ShortConvolution, so w[-1] weighs the current token. W taps, a few: a sum of shifts."""
    taps, length = w_WxHxF.shape[0], x_BxHxLxF.shape[2]
    x_BxHxPxF = jnp.pad(x_BxHxLxF, ((0, 0), (0, 0), (taps - 1, 0), (0, 0)))
    return sum(w_WxHxF[i][None, :, None, :] * x_BxHxPxF[:, :, i:i + length]
               for i in range(taps))


def unit_lower_inverse(a_xCxC: jax.Array) -> jax.Array:
    """(I + tril(a, -1))^-1 (only a's strict lower part is read), batched over leading axes.

    Block forward substitution by doubling: the inverses of the diagonal blocks of size
    1, 2, 4, ... at once, two neighbours T1, T2 (coupled by the block A21 below T1) merged
    into [[T1, 0], [-T2 A21 T1, T2]] (fla's solve_tril on GPU merges 16 x 16 blocks the
    same way); C is padded to a power of two with identity. log2(C) steps of batched
    matmuls. Not jax.scipy.linalg.solve_triangular: on CPU its LAPACK kernel (jaxlib
    0.10.2) hands its batch to XLA's thread pool and blocks a pool thread waiting for it,
    so two such calls at once (the two scans' solves in one training step) deadlocked
    the pool on 2 cores. It stays the tests' oracle.
    """
    c = a_xCxC.shape[-1]
    size = 1 << (c - 1).bit_length()
    lead = a_xCxC.shape[:-2]
    a = jnp.pad(jnp.tril(a_xCxC, -1), [(0, 0)] * len(lead) + [(0, size - c), (0, size - c)])
    t_xNxSxS = jnp.ones(lead + (size, 1, 1), a.dtype)  # the 1 x 1 blocks: unit diagonal
    s = 1
    while s < size:
        n = size // (2 * s)
        # The n diagonal blocks of size 2s; A21 is the lower left s x s of each.
        diag_xNx2Sx2S = jnp.einsum("...iaib->...iab", a.reshape(lead + (n, 2 * s, n, 2 * s)))
        t_xNx2xSxS = t_xNxSxS.reshape(lead + (n, 2, s, s))
        t1, t2 = t_xNx2xSxS[..., 0, :, :], t_xNx2xSxS[..., 1, :, :]
        low = -(t2 @ diag_xNx2Sx2S[..., s:, :s] @ t1)
        t_xNxSxS = jnp.concatenate([jnp.concatenate([t1, jnp.zeros_like(t1)], -1),
                                    jnp.concatenate([low, t2], -1)], -2)
        s *= 2
    return t_xNxSxS.reshape(lead + (size, size))[..., :c, :c]


def delta_rule_step(s_BxHxVxK: jax.Array, q_BxHxK: jax.Array, k_BxHxK: jax.Array,
                    v_BxHxV: jax.Array, beta_BxH: jax.Array, log_alpha_BxH: jax.Array,
                    scale: float) -> tuple[jax.Array, jax.Array]:
    """One token: S <- alpha S (I - beta k k^T) + beta v k^T, o = S q scale (BxHxV).

    alpha S (I - beta k k^T) + beta v k^T = S' + beta (v - S' k) k^T with S' = alpha S:
    fast_weight's delta write on the decayed memory. log_alpha is BxH (a scalar decay per
    head) or BxHxK (one per key channel, kda's: S' = S Diag(alpha))."""
    alpha = jnp.exp(log_alpha_BxH)
    alpha = alpha[..., None, None] if alpha.ndim == beta_BxH.ndim else alpha[..., None, :]
    s_BxHxVxK = delta_write(alpha * s_BxHxVxK, k_BxHxK, v_BxHxV, beta_BxH)
    return jnp.einsum("bhvk,bhk->bhv", s_BxHxVxK, q_BxHxK * scale), s_BxHxVxK


def _inputs(q, k, v, beta, log_alpha):
    f32 = jnp.float32
    if log_alpha is None:  # no gate: g = 0, alpha = 1 exactly
        log_alpha = jnp.zeros(beta.shape, f32)
    return (q.astype(f32), k.astype(f32), v.astype(f32), beta.astype(f32),
            log_alpha.astype(f32))


@functools.partial(jax.jit, static_argnames=("scale",))
def delta_rule_reference(q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array, v_BxHxLxV: jax.Array,
                         beta_BxHxL: jax.Array, log_alpha_BxHxL: jax.Array | None = None, *,
                         scale: float | None = None) -> tuple[jax.Array, jax.Array]:
    """The recurrence step by step (a scan over time): outputs BxHxLxV (float32) and the
    final state S_L (BxHxVxK). q and k as the rule takes them (already normalised);
    `scale` defaults to d_k^-0.5 (fla's). log_alpha None: no gate."""
    q, k, v, beta, log_alpha = _inputs(q_BxHxLxK, k_BxHxLxK, v_BxHxLxV, beta_BxHxL,
                                       log_alpha_BxHxL)
    b, h, _, k_dim = q.shape
    scale = k_dim ** -0.5 if scale is None else scale

    def step(s_BxHxVxK, xs):
        o_BxHxV, s_BxHxVxK = delta_rule_step(s_BxHxVxK, *xs, scale)
        return s_BxHxVxK, o_BxHxV

    xs = tuple(jnp.moveaxis(a, 2, 0) for a in (q, k, v, beta, log_alpha))
    s_final, o_LxBxHxV = jax.lax.scan(step, jnp.zeros((b, h, v.shape[-1], k_dim)), xs)
    return jnp.moveaxis(o_LxBxHxV, 0, 2), s_final


@functools.partial(jax.jit, static_argnames=("chunk_size", "scale"))
def chunk_delta_rule(q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array, v_BxHxLxV: jax.Array,
                     beta_BxHxL: jax.Array, log_alpha_BxHxL: jax.Array | None = None, *,
                     chunk_size: int = DEFAULT_CHUNK, scale: float | None = None
                     ) -> tuple[jax.Array, jax.Array]:
    """`delta_rule_reference`'s outputs and final state, chunk by chunk (module docstring).

    Any L: the tail is zero-padded to a multiple of the chunk with beta = 0 and g = 0,
    which neither writes nor decays, so S_L is the state after the real positions. The
    scan over chunks is rematerialised: the backward pass keeps S at chunk boundaries,
    U and W (L x (V + K)) and the C x C matrices of the inverse (L x C), never L x V x K.
    """
    q, k, v, beta, log_alpha = _inputs(q_BxHxLxK, k_BxHxLxK, v_BxHxLxV, beta_BxHxL,
                                       log_alpha_BxHxL)
    b, h, length, k_dim = q.shape
    v_dim = v.shape[-1]
    scale = k_dim ** -0.5 if scale is None else scale
    chunk = max(1, min(chunk_size, length))
    q_NxBxHxCxK = _pad_to_chunks(q * scale, chunk)
    k_NxBxHxCxK = _pad_to_chunks(k, chunk)
    v_NxBxHxCxV = _pad_to_chunks(v, chunk)
    beta_NxBxHxC = _pad_to_chunks(beta[..., None], chunk)[..., 0]
    g_NxBxHxC = _pad_to_chunks(log_alpha[..., None], chunk)[..., 0]
    cum_NxBxHxC = jnp.cumsum(g_NxBxHxC, axis=-1)  # b_i, reset at each chunk: >= C min(g)
    lower_CxC = jnp.tril(jnp.ones((chunk, chunk), jnp.bool_))

    def decay_within(cum_xC):
        """Gamma_ij = exp(b_i - b_j) for i >= j, 0 above the diagonal. where() inside
        exp: the masked differences are positive and could overflow."""
        diff_xCxC = cum_xC[..., :, None] - cum_xC[..., None, :]
        return jnp.exp(jnp.where(lower_CxC, diff_xCxC, -jnp.inf))

    # The UT transform, all chunks at once: (I + A) [U | W] = [beta V | beta e^b K] with
    # A = tril(diag(beta) (K K^T o Gamma), -1) (the inverse reads the strict lower part).
    kk_NxBxHxCxC = jnp.einsum("nbhik,nbhjk->nbhij", k_NxBxHxCxK, k_NxBxHxCxK)
    a_NxBxHxCxC = beta_NxBxHxC[..., :, None] * kk_NxBxHxCxC * decay_within(cum_NxBxHxC)
    rhs_NxBxHxCxF = jnp.concatenate(
        [beta_NxBxHxC[..., None] * v_NxBxHxCxV,
         (beta_NxBxHxC * jnp.exp(cum_NxBxHxC))[..., None] * k_NxBxHxCxK], axis=-1)
    uw_NxBxHxCxF = unit_lower_inverse(a_NxBxHxCxC) @ rhs_NxBxHxCxF
    u_NxBxHxCxV, w_NxBxHxCxK = uw_NxBxHxCxF[..., :v_dim], uw_NxBxHxCxF[..., v_dim:]

    @jax.checkpoint
    def body(s_BxHxVxK, xs):
        q_BxHxCxK, k_BxHxCxK, u_BxHxCxV, w_BxHxCxK, cum_BxHxC = xs
        v_new_BxHxCxV = u_BxHxCxV - jnp.einsum("bhck,bhvk->bhcv", w_BxHxCxK, s_BxHxVxK)
        qk_BxHxCxC = (jnp.einsum("bhik,bhjk->bhij", q_BxHxCxK, k_BxHxCxK)
                      * decay_within(cum_BxHxC))
        from_state_BxHxCxK = q_BxHxCxK * jnp.exp(cum_BxHxC)[..., None]
        o_BxHxCxV = (jnp.einsum("bhck,bhvk->bhcv", from_state_BxHxCxK, s_BxHxVxK)
                     + jnp.einsum("bhij,bhjv->bhiv", qk_BxHxCxC, v_new_BxHxCxV))
        to_end_BxHxC = jnp.exp(cum_BxHxC[..., -1:] - cum_BxHxC)
        s_BxHxVxK = (jnp.exp(cum_BxHxC[..., -1])[..., None, None] * s_BxHxVxK
                     + jnp.einsum("bhcv,bhck->bhvk", v_new_BxHxCxV,
                                  k_BxHxCxK * to_end_BxHxC[..., None]))
        return s_BxHxVxK, o_BxHxCxV

    s_final, o_NxBxHxCxV = jax.lax.scan(
        body, jnp.zeros((b, h, v_dim, k_dim), jnp.float32),
        (q_NxBxHxCxK, k_NxBxHxCxK, u_NxBxHxCxV, w_NxBxHxCxK, cum_NxBxHxC))
    n = o_NxBxHxCxV.shape[0]
    o_BxHxLxV = o_NxBxHxCxV.transpose(1, 2, 0, 3, 4).reshape(b, h, n * chunk, v_dim)
    return o_BxHxLxV[:, :, :length], s_final


# ----------------------------------------------------------------------------- modules


def conv_init(taps: int) -> layers.Initializer:
    """PyTorch's Conv1d default for a depthwise kernel (fan_in = taps): U(-1/sqrt(taps),
    1/sqrt(taps)), for its weight and its bias alike."""
    bound = 1.0 / math.sqrt(taps)

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)
    return init


def a_log_init(key, shape, dtype=jnp.float32):
    """log A, A ~ U(0, 16) (fla's GatedDeltaNet); a draw of exactly 0 is moved to the
    smallest normal float so that its log is finite."""
    a = jax.random.uniform(key, shape, dtype, *A_INIT_RANGE)
    return jnp.log(jnp.maximum(a, jnp.finfo(dtype).tiny))


def dt_bias_init(key, shape, dtype=jnp.float32):
    """softplus^-1(dt), dt log-uniform in [1e-3, 1e-1] and at least 1e-4 (Mamba-2's and
    fla's), so that softplus(dt_bias) starts at dt."""
    lo, hi = (math.log(x) for x in DT_INIT_RANGE)
    dt = jnp.exp(jax.random.uniform(key, shape, dtype, lo, hi))
    dt = jnp.maximum(dt, DT_INIT_FLOOR)
    return dt + jnp.log(-jnp.expm1(-dt))


class ScanDirection(nnx.Module):
    """What one scan direction owns: the short convolutions of q, k, v, the beta
    projection and, gated, the decay's projection, A_log and dt_bias (fla's q_conv1d,
    k_conv1d, v_conv1d, b_proj, a_proj, A_log, dt_bias). `neg_eigval` (set by the layer):
    fla's allow_neg_eigval, beta = 2 sigmoid(.) in (0, 2)."""

    neg_eigval = False

    def __init__(self, *, dim: int, num_heads: int, key_dim: int, value_dim: int,
                 conv_size: int, gated: bool, rngs: nnx.Rngs):
        self.num_heads = num_heads
        self.widths = (key_dim // num_heads, key_dim // num_heads, value_dim // num_heads)
        if conv_size:
            conv = conv_init(conv_size)
            self.conv_q = layers.param(conv, (None, "qkv"), (conv_size, key_dim), rngs=rngs)
            self.conv_k = layers.param(conv, (None, "qkv"), (conv_size, key_dim), rngs=rngs)
            self.conv_v = layers.param(conv, (None, "qkv"), (conv_size, value_dim), rngs=rngs)
        else:  # fla's use_short_conv=False: no convolution (identity kernels, no parameter)
            self.conv_q = self.conv_k = self.conv_v = None
        self.beta = layers.dense(dim, num_heads, ("embed", "heads"), use_bias=False, rngs=rngs)
        self.decay = (layers.dense(dim, num_heads, ("embed", "heads"), use_bias=False,
                                   rngs=rngs) if gated else None)
        if gated:
            self.a_log = layers.param(a_log_init, ("heads",), (num_heads,), rngs=rngs,
                                      no_weight_decay=True, keep_float32=True)
            self.dt_bias = layers.param(dt_bias_init, ("heads",), (num_heads,), rngs=rngs,
                                        no_weight_decay=True, keep_float32=True)

    def conv_weights(self) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The three kernels as WxHxF (channels are heads x features, head-major); without
        convolutions (conv_size 0), one-tap identity kernels, so that the same code (and a
        decoding window of width 0) serves both forms."""
        if self.conv_q is None:
            return tuple(jnp.ones((1, self.num_heads, f), jnp.float32) for f in self.widths)
        return tuple(w[...].astype(jnp.float32).reshape(w.shape[0], self.num_heads, -1)
                     for w in (self.conv_q, self.conv_k, self.conv_v))

    def gates(self, x_xD: jax.Array) -> tuple[jax.Array, jax.Array]:
        """beta in (0, 1) ((0, 2) with neg_eigval) and g = log alpha <= 0 (0 without a
        gate), ...xH, float32."""
        x = x_xD.astype(jnp.float32)
        beta_xH = jax.nn.sigmoid(self.beta(x).astype(jnp.float32))
        if self.neg_eigval:
            # fla's allow_neg_eigval (Grazzi et al. 2025): the transition I - beta k k^T
            # has the eigenvalue 1 - beta in (-1, 1) along k, so a step can reflect.
            beta_xH = 2.0 * beta_xH
        if self.decay is None:
            return beta_xH, jnp.zeros_like(beta_xH)
        a_H = jnp.exp(self.a_log[...].astype(jnp.float32))
        dt_xH = jax.nn.softplus(self.decay(x).astype(jnp.float32) + self.dt_bias[...])
        return beta_xH, -a_H * dt_xH

    def features(self, q_BxHxLxK, k_BxHxLxK, v_BxHxLxV, x_BxLxD, real_BxL):
        """conv, SiLU, L2 norm (q, k); beta and g zero at padded positions (no write, no
        decay). The convolution inputs must already be zero there."""
        w_q, w_k, w_v = self.conv_weights()
        q = l2_normalise(jax.nn.silu(causal_conv(q_BxHxLxK.astype(jnp.float32), w_q)))
        k = l2_normalise(jax.nn.silu(causal_conv(k_BxHxLxK.astype(jnp.float32), w_k)))
        v = jax.nn.silu(causal_conv(v_BxHxLxV.astype(jnp.float32), w_v))
        beta_BxLxH, g_BxLxH = self.gates(x_BxLxD)
        real_BxLx1 = real_BxL[..., None]
        beta_BxHxL = jnp.where(real_BxLx1, beta_BxLxH, 0.0).transpose(0, 2, 1)
        # g is BxLxH, or BxLxHxK for a gate per key channel (kda): heads before length.
        real = real_BxL.reshape(real_BxL.shape + (1,) * (g_BxLxH.ndim - 2))
        g_BxHxL = jnp.moveaxis(jnp.where(real, g_BxLxH, 0.0), 1, 2)
        return q, k, v, beta_BxHxL, g_BxHxL


class DeltaNet(nnx.Module, recurrent.RecurrentDecoding):
    """DeltaNet / Gated DeltaNet layer (module docstring); `query`, `key`, `value`, `out`
    as in `transformer`, bias-free as fla's. `Direction`: what a scan direction owns (kda's
    subclass gives it a per-channel gate)."""

    Direction = ScanDirection

    def __init__(self, *, dim: int, num_heads: int, causal: bool, qkv_dim: int | None,
                 expand_v: float, chunk_size: int | None, conv_size: int, gated: bool,
                 use_gate: bool, norm_eps: float, rngs: nnx.Rngs, neg_eigval: bool = False,
                 attention_impl: str = "dense"):
        if attention_impl not in IMPLS:
            raise registry.RegistryError(
                f"attention_impl={attention_impl!r} is not available for the delta rule; "
                f"valid: {', '.join(IMPLS)}")
        self.attention_impl = attention_impl
        key_dim = dim if qkv_dim is None else qkv_dim
        value_dim = int(key_dim * expand_v)
        if num_heads <= 0 or key_dim % num_heads or value_dim % num_heads or value_dim <= 0:
            raise ValueError(f"qkv_dim ({key_dim}) and qkv_dim * expand_v ({key_dim} * "
                             f"{expand_v}) must be positive multiples of num_heads "
                             f"({num_heads})")
        if value_dim != key_dim * expand_v:
            raise ValueError(f"qkv_dim * expand_v = {key_dim * expand_v} is not a whole number")
        if chunk_size is None:
            chunk_size = backend_chunk(DEFAULT_CHUNK, CPU_CHUNK)
        if chunk_size <= 0 or conv_size < 0:
            raise ValueError(f"chunk_size ({chunk_size}) must be positive and conv_size "
                             f"({conv_size}) >= 0 (0: no short convolutions)")
        self.num_heads, self.causal, self.chunk_size = num_heads, causal, chunk_size
        self.head_dim, self.head_v_dim = key_dim // num_heads, value_dim // num_heads
        self.conv_size, self.norm_eps = conv_size, norm_eps
        proj = dict(use_bias=False, rngs=rngs)
        self.query = layers.dense(dim, key_dim, ("embed", "qkv"), **proj)
        self.key = layers.dense(dim, key_dim, ("embed", "qkv"), **proj)
        self.value = layers.dense(dim, value_dim, ("embed", "qkv"), **proj)
        self.out = layers.dense(value_dim, dim, ("qkv", "embed"), **proj)
        direction = dict(dim=dim, num_heads=num_heads, key_dim=key_dim, value_dim=value_dim,
                         conv_size=conv_size, gated=gated, rngs=rngs)
        self.forward_scan = self.Direction(**direction)
        # The backward scan is the causal layer read from the end, with its own
        # convolutions: a key's convolution then mixes the tokens the backward scan has
        # just read (those after it), as the forward scan's mixes those before it. One
        # centred convolution shared by both would hand each scan its future tokens too,
        # and make the backward form something other than the causal layer reversed.
        self.backward_scan = None if causal else self.Direction(**direction)
        for scan in (self.forward_scan, self.backward_scan):
            if scan is not None and neg_eigval:
                scan.neg_eigval = True
        self.norm_scale = layers.param(layers.ones, (None,), (self.head_v_dim,), rngs=rngs)
        self.gate = layers.dense(dim, value_dim, ("embed", "qkv"), **proj) if use_gate else None

    # ------------------------------------------------------------------ pieces

    @property
    def window(self) -> int:
        """The inputs a decoding step keeps per convolution: conv_size - 1 (0 without)."""
        return max(self.conv_size - 1, 0)

    def split_heads(self, x_BxLxF: jax.Array) -> jax.Array:
        b, l, f = x_BxLxF.shape
        return x_BxLxF.reshape(b, l, self.num_heads, f // self.num_heads).transpose(0, 2, 1, 3)

    def merge_heads(self, x_BxHxLxF: jax.Array) -> jax.Array:
        b, h, l, f = x_BxHxLxF.shape
        return x_BxHxLxF.transpose(0, 2, 1, 3).reshape(b, l, h * f)

    def qkv(self, x_BxLxD: jax.Array, positions: jax.Array | None = None
            ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The convolutions' inputs BxHxLxF (no positions: the order is the scan's)."""
        del positions
        return tuple(self.split_heads(p(x_BxLxD)) for p in (self.query, self.key, self.value))

    def finish(self, o_BxHxLxV: jax.Array, x_BxLxD: jax.Array) -> jax.Array:
        """RMSNorm per head (times SiLU(W_g x) with the gate), float32."""
        o = o_BxHxLxV.astype(jnp.float32)
        o = o * jax.lax.rsqrt(jnp.mean(o * o, axis=-1, keepdims=True) + self.norm_eps)
        o = o * self.norm_scale[...].astype(jnp.float32)
        if self.gate is not None:
            o = o * jax.nn.silu(self.split_heads(self.gate(x_BxLxD)).astype(jnp.float32))
        return o

    def scan(self, direction: ScanDirection, q, k, v, x_BxLxD, real_BxL):
        """One direction's outputs BxHxLxV and final state, chunked."""
        q, k, v, beta, g = direction.features(q, k, v, x_BxLxD, real_BxL)
        if self.attention_impl == "pallas":
            return delta_rule(q, k, v, beta, g)
        if self.attention_impl == "pallas_mosaic":
            # The Mosaic GPU kernels take 16-bit q, k, v (wgmma operands): under a 16-bit
            # compute view the features go in that dtype, as fla's layers hand bf16 to
            # their kernels under autocast; beta and the gate stay float32.
            if jnp.dtype(x_BxLxD.dtype).itemsize == 2:
                q, k, v = (t.astype(x_BxLxD.dtype) for t in (q, k, v))
            o, s = delta_rule(q, k, v, beta, g, gpu_form="mosaic")
            return o.astype(jnp.float32), s
        return chunk_delta_rule(q, k, v, beta, g, chunk_size=self.chunk_size)

    def attend(self, q_BxHxLxK, k_BxHxLxK, v_BxHxLxV, x_BxLxD, padding_mask):
        """Per-head outputs (finished), and for `prompt` the convolution inputs q, k, v as
        masked and the forward scan's final state."""
        b, length = x_BxLxD.shape[:2]
        real_BxL = layers.valid_mask(padding_mask, b, length)
        real_Bx1xLx1 = real_BxL[:, None, :, None]
        # Zero convolution inputs at padded positions: a convolution window (the backward
        # one, or any with left padding) must not read them.
        q, k, v = (jnp.where(real_Bx1xLx1, t, 0.0) for t in (q_BxHxLxK, k_BxHxLxK, v_BxHxLxV))
        o_BxHxLxV, s_BxHxVxK = self.scan(self.forward_scan, q, k, v, x_BxLxD, real_BxL)
        if self.backward_scan is not None:
            flip = lambda t: jnp.flip(t, axis=2)  # noqa: E731  (BxHxL...: the length axis)
            o_back, _ = self.scan(self.backward_scan, flip(q), flip(k), flip(v),
                                  jnp.flip(x_BxLxD, axis=1), jnp.flip(real_BxL, axis=1))
            o_BxHxLxV = o_BxHxLxV + flip(o_back)
        return self.finish(o_BxHxLxV, x_BxLxD), (q, k, v, s_BxHxVxK)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        del deterministic  # no dropout
        o_BxHxLxV, _ = self.attend(*self.qkv(x_BxLxD), x_BxLxD, padding_mask)
        return self.out(self.merge_heads(o_BxHxLxV.astype(x_BxLxD.dtype)))

    # ------------------------------------------------------------------ decoding

    def empty_state(self, batch: int) -> recurrent.State:
        """S (BxHxVxK) and each convolution's last conv_size - 1 inputs (BxHx(W-1)xF)."""
        h, k, v, w = self.num_heads, self.head_dim, self.head_v_dim, self.window
        zeros = lambda *shape: jnp.zeros((batch, h) + shape, jnp.float32)  # noqa: E731
        return {"s": zeros(v, k), "conv_q": zeros(w, k), "conv_k": zeros(w, k),
                "conv_v": zeros(w, v)}

    def prompt(self, q_BxHxLxK, k_BxHxLxK, v_BxHxLxV, x_BxLxD, padding_mask):
        o_BxHxLxV, (q, k, v, s_BxHxVxK) = self.attend(q_BxHxLxK, k_BxHxLxK, v_BxHxLxV,
                                                      x_BxLxD, padding_mask)
        b, length = x_BxLxD.shape[:2]
        w = self.window
        # Row b's window: its positions n_b - w .. n_b - 1, zeros before the start (the
        # inputs left-padded by w, so that window starts at n_b).
        lengths_B = jnp.sum(layers.valid_mask(padding_mask, b, length), axis=1)
        index_Bx1xWx1 = (lengths_B[:, None] + jnp.arange(w)[None])[:, None, :, None]

        def window(t_BxHxLxF):
            padded = jnp.pad(t_BxHxLxF.astype(jnp.float32), ((0, 0), (0, 0), (w, 0), (0, 0)))
            return jnp.take_along_axis(padded, index_Bx1xWx1, axis=2)

        return o_BxHxLxV, {"s": s_BxHxVxK, "conv_q": window(q), "conv_k": window(k),
                           "conv_v": window(v)}

    def recur(self, state, q_BxHx1xK, k_BxHx1xK, v_BxHx1xV, x_BxD, pos_B):
        del pos_B  # the state is the same size at every position
        direction = self.forward_scan
        windows = [jnp.concatenate([state[name], t.astype(jnp.float32)], axis=2)
                   for name, t in (("conv_q", q_BxHx1xK), ("conv_k", k_BxHx1xK),
                                   ("conv_v", v_BxHx1xV))]
        q, k, v = (jnp.einsum("bhwf,whf->bhf", win, w_WxHxF)
                   for win, w_WxHxF in zip(windows, direction.conv_weights()))
        q, k, v = l2_normalise(jax.nn.silu(q)), l2_normalise(jax.nn.silu(k)), jax.nn.silu(v)
        beta_BxH, g_BxH = direction.gates(x_BxD)
        o_BxHxV, s_BxHxVxK = delta_rule_step(state["s"], q, k, v, beta_BxH, g_BxH,
                                             self.head_dim ** -0.5)
        o_BxHxV = self.finish(o_BxHxV[:, :, None], x_BxD[:, None])[:, :, 0]
        return o_BxHxV, {"s": s_BxHxVxK, "conv_q": windows[0][:, :, 1:],
                         "conv_k": windows[1][:, :, 1:], "conv_v": windows[2][:, :, 1:]}


_BIDIRECTIONAL = "causal=False sums a forward and a backward scan"
_NO_ROTARY = ("its queries and keys meet through a recurrent state whose order gives "
              "positions (the papers add no position embedding)")
# pos_emb 'none' (Capabilities.pos_emb, the task configs' default): fla's DeltaNet and
# GatedDeltaNet (fla/layers/delta_net.py, gated_deltanet.py at bc3b101) have no rotary,
# and fla's models add no position table to the token embeddings (the papers' language
# models add none); the short convolutions (use_short_conv=True, conv_size 4, no bias) and
# the scan's order give positions. With CLS pooling the CLS slot's input starts at zero
# (no position is added to it), so gated_deltanet's output gate SiLU(W_g 0) = 0 gives it
# no update at initialisation; the gradient still reaches the CLS vector (through SiLU'(0)
# = 1/2 and the norms; tests/models/test_positions.py), so it leaves zero at the first step.


@registry.register("deltanet", capabilities=registry.Capabilities(
    description="DeltaNet: delta rule, L2-normalised q/k, short convs, chunked WY form (Yang "
                f"et al. 2024; XLA or attention_impl=pallas); {_BIDIRECTIONAL}",
    causal=True, decode="recurrent_state", padding=True, variable_length=True,
    test_hparams={"chunk_size": 5}, rotary_refusal=_NO_ROTARY,
    pos_emb="none", short_conv_hparam="conv_size"))
def build_deltanet(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
                   qkv_dim: int | None = None, chunk_size: int | None = None,
                   conv_size: int = CONV_SIZE, use_gate: bool = False,
                   norm_eps: float = NORM_EPS, allow_neg_eigval: bool = False,
                   attention_impl: str = "dense") -> DeltaNet:
    """fla's DeltaNet defaults: value heads as wide as key heads, no output gate, beta in
    (0, 1); allow_neg_eigval (fla's; Grazzi et al.'s sigmoid_scale 2) beta in (0, 2).
    attention_impl: "dense" (chunk_delta_rule under XLA) or "pallas" (the kernel);
    chunk_size by default DEFAULT_CHUNK, or CPU_CHUNK where the CPU builds it."""
    del max_len  # any length
    return DeltaNet(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                    expand_v=1.0, chunk_size=chunk_size, conv_size=conv_size, gated=False,
                    use_gate=use_gate, norm_eps=norm_eps, rngs=rngs,
                    neg_eigval=bool(allow_neg_eigval), attention_impl=attention_impl)


@registry.register("gated_deltanet", capabilities=registry.Capabilities(
    description="Gated DeltaNet: delta rule with Mamba-2's decay gate, chunked WY form (Yang "
                f"et al. 2025; XLA or attention_impl=pallas); {_BIDIRECTIONAL}",
    causal=True, decode="recurrent_state", padding=True, variable_length=True,
    test_hparams={"chunk_size": 5}, rotary_refusal=_NO_ROTARY,
    pos_emb="none", short_conv_hparam="conv_size"))
def build_gated_deltanet(*, dim: int, num_heads: int, max_len: int, causal: bool,
                         rngs: nnx.Rngs, qkv_dim: int | None = None, expand_v: float = 2.0,
                         chunk_size: int | None = None, conv_size: int = CONV_SIZE,
                         use_gate: bool = True, norm_eps: float = NORM_EPS,
                         allow_neg_eigval: bool = False, decay: bool = True,
                         attention_impl: str = "dense") -> DeltaNet:
    """fla's GatedDeltaNet defaults: value heads expand_v = 2 times the key heads, output
    gate on, beta in (0, 1) (allow_neg_eigval: (0, 2)). qkv_dim is the key width (fla's
    head_dim x num_heads). attention_impl: "dense" or "pallas" (as deltanet).
    decay=False (ours, an ablation): the same layer without the decay gate (alpha = 1; its
    projection, A_log and dt_bias not built), so a comparison changes the decay alone.
    chunk_size by default DEFAULT_CHUNK, or CPU_CHUNK where the CPU builds it."""
    del max_len  # any length
    return DeltaNet(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                    expand_v=expand_v, chunk_size=chunk_size, conv_size=conv_size,
                    gated=bool(decay),
                    use_gate=use_gate, norm_eps=norm_eps, rngs=rngs,
                    neg_eigval=bool(allow_neg_eigval), attention_impl=attention_impl)

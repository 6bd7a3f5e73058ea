"""Kimi Delta Attention (`kda`; Kimi Team 2025, "Kimi Linear: An Expressive, Efficient
Attention Architecture", arXiv 2510.26692): the gated delta rule with a decay per key
channel instead of one per head,

    S_t = S_{t-1} Diag(alpha_t) (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,   o_t = S_t q_t / sqrt(d_k)
    log alpha_t = g_t = -exp(A_log) softplus(W_up W_down x_t + dt_bias)   (a vector over K)

S is V x K per head, as delta.py's (fla's state is K x V; the same matrix transposed):
the decay scales S's key columns, then the delta write moves S a fraction beta towards v
along k. The layer is fla's `KimiDeltaAttention` (fla/layers/kda.py at bc3b101) with its
defaults: bias-free q/k/v projections, a 4-tap depthwise causal convolution and SiLU on
each, q and k L2-normalised, beta_t = sigmoid(W_b x_t) per head; the gate's input through
a low-rank bottleneck of width head_v_dim (f_proj: D -> d_v -> H d_k, bias-free), A_log per
head (A ~ U(1, 16)) and dt_bias per head and key channel (dt log-uniform in [1e-3, 1e-1],
Mamba-2's); the output an RMSNorm per head (eps 1e-5) times sigmoid(g_proj x), g_proj
low-rank too (D -> d_v bias-free -> H d_v with a bias: fla's FusedRMSNormGated with
activation='sigmoid'); value heads as wide as key heads (expand_v 1). Not ported: fla's
options besides the defaults (num_v_heads > num_heads, allow_neg_eigval, safe_gate and
lower_bound) and its model-level re-initialisation (normal(0.02) for every Linear):
projections are xavier-uniform, the output gate's bias zero.

Everything else is delta.py's `DeltaNet`: the convolutions and their decoding windows,
padding (padded positions neither write nor decay), the bidirectional form (a forward and
a backward scan summed before the output norm; fla has none) and the recurrent decoding
(`delta_rule_step` takes the per-channel decay). The chunked form here differs from
`chunk_delta_rule` only in the decays inside a chunk: with b_i the gate's cumulative sum
over the chunk up to i (a vector over K),

    A_ij = beta_i sum_d k_id k_jd exp(b_id - b_jd)       (i > j; the UT transform's matrix)
    P_ij = sum_d q_id k_jd exp(b_id - b_jd)              (i >= j; the intra-chunk output)

a C x C x K tensor per chunk instead of C x C (fla's `naive_chunk_kda`); the differences
are masked before exp, so every exponent is <= 0. Its memory is L C K per head, so the
default chunk is 32 (fla's kernel: 64, in sub-chunks of 16) on an accelerator and 4 on a
CPU (CPU_CHUNK: 3.4 times faster forward and backward at L 256 than 32, and faster at 2K
too; results/cpu/chunk_sizes.md). Three forms, equal
(tests/models/test_kda.py): `delta.delta_rule_reference` with a BxHxLxK decay (the scan),
`chunk_kda`, `delta.delta_rule_step`.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers, registry
from models.attention import delta
from models.attention.linear_scan import _pad_to_chunks, backend_chunk

DEFAULT_CHUNK = 32  # C x C x K decays per chunk (module docstring)
CPU_CHUNK = 4  # the default where the CPU builds the layer (linear_scan.backend_chunk)
A_INIT_RANGE = (1.0, 16.0)  # fla's KimiDeltaAttention: A_log = log U(1, 16), per head


@functools.partial(jax.jit, static_argnames=("chunk_size", "scale"))
def chunk_kda(q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array, v_BxHxLxV: jax.Array,
              beta_BxHxL: jax.Array, log_alpha_BxHxLxK: jax.Array, *,
              chunk_size: int = DEFAULT_CHUNK, scale: float | None = None
              ) -> tuple[jax.Array, jax.Array]:
    """`delta.delta_rule_reference`'s outputs BxHxLxV and final state BxHxVxK for a decay
    per key channel, chunk by chunk (module docstring). Any L: the tail is zero-padded with
    beta = 0 and g = 0 (no write, no decay). The scan over chunks is rematerialised, as
    `chunk_delta_rule`'s."""
    f32 = jnp.float32
    q, k, v = (t.astype(f32) for t in (q_BxHxLxK, k_BxHxLxK, v_BxHxLxV))
    beta, log_alpha = beta_BxHxL.astype(f32), log_alpha_BxHxLxK.astype(f32)
    b, h, length, k_dim = q.shape
    v_dim = v.shape[-1]
    scale = k_dim ** -0.5 if scale is None else scale
    chunk = max(1, min(chunk_size, length))
    q_NxBxHxCxK = _pad_to_chunks(q * scale, chunk)
    k_NxBxHxCxK = _pad_to_chunks(k, chunk)
    v_NxBxHxCxV = _pad_to_chunks(v, chunk)
    beta_NxBxHxC = _pad_to_chunks(beta[..., None], chunk)[..., 0]
    cum_NxBxHxCxK = jnp.cumsum(_pad_to_chunks(log_alpha, chunk), axis=-2)
    lower_CxCx1 = jnp.tril(jnp.ones((chunk, chunk), jnp.bool_))[..., None]

    def decay_within(cum_xCxK):
        """exp(b_i - b_j) per key channel for i >= j, 0 above the diagonal (xCxCxK)."""
        diff_xCxCxK = cum_xCxK[..., :, None, :] - cum_xCxK[..., None, :, :]
        return jnp.exp(jnp.where(lower_CxCx1, diff_xCxCxK, -jnp.inf))

    kk_NxBxHxCxC = jnp.einsum("nbhik,nbhjk,nbhijk->nbhij", k_NxBxHxCxK, k_NxBxHxCxK,
                              decay_within(cum_NxBxHxCxK))
    a_NxBxHxCxC = beta_NxBxHxC[..., :, None] * kk_NxBxHxCxC
    rhs_NxBxHxCxF = jnp.concatenate(
        [beta_NxBxHxC[..., None] * v_NxBxHxCxV,
         beta_NxBxHxC[..., None] * jnp.exp(cum_NxBxHxCxK) * k_NxBxHxCxK], axis=-1)
    uw_NxBxHxCxF = delta.unit_lower_inverse(a_NxBxHxCxC) @ rhs_NxBxHxCxF
    u_NxBxHxCxV, w_NxBxHxCxK = uw_NxBxHxCxF[..., :v_dim], uw_NxBxHxCxF[..., v_dim:]

    @jax.checkpoint
    def body(s_BxHxVxK, xs):
        q_BxHxCxK, k_BxHxCxK, u_BxHxCxV, w_BxHxCxK, cum_BxHxCxK = xs
        v_new_BxHxCxV = u_BxHxCxV - jnp.einsum("bhck,bhvk->bhcv", w_BxHxCxK, s_BxHxVxK)
        qk_BxHxCxC = jnp.einsum("bhik,bhjk,bhijk->bhij", q_BxHxCxK, k_BxHxCxK,
                                decay_within(cum_BxHxCxK))
        o_BxHxCxV = (jnp.einsum("bhck,bhvk->bhcv", q_BxHxCxK * jnp.exp(cum_BxHxCxK),
                                s_BxHxVxK)
                     + jnp.einsum("bhij,bhjv->bhiv", qk_BxHxCxC, v_new_BxHxCxV))
        end_BxHx1xK = cum_BxHxCxK[..., -1:, :]
        s_BxHxVxK = (jnp.exp(end_BxHx1xK) * s_BxHxVxK
                     + jnp.einsum("bhcv,bhck->bhvk", v_new_BxHxCxV,
                                  k_BxHxCxK * jnp.exp(end_BxHx1xK - cum_BxHxCxK)))
        return s_BxHxVxK, o_BxHxCxV

    s_final, o_NxBxHxCxV = jax.lax.scan(
        body, jnp.zeros((b, h, v_dim, k_dim), f32),
        (q_NxBxHxCxK, k_NxBxHxCxK, u_NxBxHxCxV, w_NxBxHxCxK, cum_NxBxHxCxK))
    n = o_NxBxHxCxV.shape[0]
    o_BxHxLxV = o_NxBxHxCxV.transpose(1, 2, 0, 3, 4).reshape(b, h, n * chunk, v_dim)
    return o_BxHxLxV[:, :, :length], s_final


def kda_a_log_init(key, shape, dtype=jnp.float32):
    """log A, A ~ U(1, 16) (fla's KimiDeltaAttention without safe_gate)."""
    return jnp.log(jax.random.uniform(key, shape, dtype, *A_INIT_RANGE))


class KDADirection(delta.ScanDirection):
    """A scan direction of kda: delta.py's convolutions and beta, and the per-channel
    gate (fla's f_proj, two bias-free Linears through head_v_dim; A_log per head; dt_bias
    per head and key channel)."""

    def __init__(self, *, dim: int, num_heads: int, key_dim: int, value_dim: int,
                 conv_size: int, gated: bool, rngs: nnx.Rngs):
        del gated  # always gated, per channel
        super().__init__(dim=dim, num_heads=num_heads, key_dim=key_dim, value_dim=value_dim,
                         conv_size=conv_size, gated=False, rngs=rngs)
        rank = value_dim // num_heads  # fla: head_v_dim
        self.decay_down = layers.dense(dim, rank, ("embed", None), use_bias=False, rngs=rngs)
        self.decay_up = layers.dense(rank, key_dim, (None, "qkv"), use_bias=False, rngs=rngs)
        self.a_log = layers.param(kda_a_log_init, ("heads",), (num_heads,), rngs=rngs,
                                  no_weight_decay=True, keep_float32=True)
        self.dt_bias = layers.param(delta.dt_bias_init, ("qkv",), (key_dim,), rngs=rngs,
                                    no_weight_decay=True, keep_float32=True)

    def gates(self, x_xD: jax.Array) -> tuple[jax.Array, jax.Array]:
        """beta ...xH in (0, 1) and g = log alpha ...xHxK <= 0, float32 (fla's
        naive_kda_gate: -exp(A_log) softplus(f + dt_bias))."""
        x = x_xD.astype(jnp.float32)
        beta_xH = jax.nn.sigmoid(self.beta(x).astype(jnp.float32))
        f_xF = self.decay_up(self.decay_down(x)).astype(jnp.float32) + self.dt_bias[...]
        f_xHxK = f_xF.reshape(f_xF.shape[:-1] + (self.num_heads, -1))
        a_Hx1 = jnp.exp(self.a_log[...].astype(jnp.float32))[:, None]
        return beta_xH, -a_Hx1 * jax.nn.softplus(f_xHxK)


class KimiDeltaAttention(delta.DeltaNet):
    """fla's KimiDeltaAttention (module docstring) on delta.py's DeltaNet: its own scan
    directions, chunked form and sigmoid output gate."""

    Direction = KDADirection

    def __init__(self, *, dim: int, num_heads: int, causal: bool, qkv_dim: int | None,
                 expand_v: float, chunk_size: int, conv_size: int, norm_eps: float,
                 rngs: nnx.Rngs):
        super().__init__(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                         expand_v=expand_v, chunk_size=chunk_size, conv_size=conv_size,
                         gated=True, use_gate=False, norm_eps=norm_eps, rngs=rngs)
        value_dim = self.num_heads * self.head_v_dim
        self.gate_down = layers.dense(dim, self.head_v_dim, ("embed", None), use_bias=False,
                                      rngs=rngs)
        self.gate_up = layers.dense(self.head_v_dim, value_dim, (None, "qkv"), rngs=rngs)

    def finish(self, o_BxHxLxV: jax.Array, x_BxLxD: jax.Array) -> jax.Array:
        """RMSNorm per head times sigmoid(g_proj x) (fla's FusedRMSNormGated, 'sigmoid')."""
        o = o_BxHxLxV.astype(jnp.float32)
        o = o * jax.lax.rsqrt(jnp.mean(o * o, axis=-1, keepdims=True) + self.norm_eps)
        o = o * self.norm_scale[...].astype(jnp.float32)
        gate = self.split_heads(self.gate_up(self.gate_down(x_BxLxD)))
        return o * jax.nn.sigmoid(gate.astype(jnp.float32))

    def scan(self, direction, q, k, v, x_BxLxD, real_BxL):
        q, k, v, beta, g = direction.features(q, k, v, x_BxLxD, real_BxL)
        return chunk_kda(q, k, v, beta, g, chunk_size=self.chunk_size)


@registry.register("kda", capabilities=registry.Capabilities(
    description="Kimi Delta Attention: gated delta rule with a decay per key channel, "
                f"chunked WY form (Kimi Linear 2025); {delta._BIDIRECTIONAL}",
    causal=True, decode="recurrent_state", padding=True, variable_length=True,
    test_hparams={"chunk_size": 5}, rotary_refusal=delta._NO_ROTARY,
    pos_emb="none", short_conv_hparam="conv_size"))
def build_kda(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
              qkv_dim: int | None = None, expand_v: float = 1.0,
              chunk_size: int | None = None, conv_size: int = delta.CONV_SIZE,
              norm_eps: float = delta.NORM_EPS) -> KimiDeltaAttention:
    """fla's KimiDeltaAttention defaults (expand_v 1, conv 4, norm eps 1e-5); qkv_dim is
    the key width (fla's head_dim x num_heads); chunk_size by default DEFAULT_CHUNK, or
    CPU_CHUNK where the CPU builds it (module docstring)."""
    del max_len  # any length
    if not math.isfinite(expand_v) or expand_v <= 0:
        raise ValueError(f"expand_v must be positive, got {expand_v}")
    if chunk_size is None:
        chunk_size = backend_chunk(DEFAULT_CHUNK, CPU_CHUNK)
    return KimiDeltaAttention(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                              expand_v=expand_v, chunk_size=chunk_size, conv_size=conv_size,
                              norm_eps=norm_eps, rngs=rngs)

"""Kernelised attention's core math (models/attention/linear.py's modules compute with it;
delta, ssd and retention share its chunking): phi(Q) (phi(K)^T V) with its normaliser, in
pure functions so that kernels can be tested against them. `linear_attention` (full, or
causal), `gated_linear_attention` (a per-position decay of the causal state) and
`delta_rule_attention` (the fast-weight memory's delta rule, `delta_write` one step).

Causal forms are chunked: exact (masked) attention inside a chunk of C positions, and a
d x dv state carried across chunks by `jax.lax.scan`, so no per-position state is stored
(the delta rule is a scan over time, rematerialised per chunk for the same reason).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

DEFAULT_CHUNK = 64


def elu_feature_map(x: jax.Array) -> jax.Array:
    """phi(x) = elu(x) + 1 (Katharopoulos et al.): positive, so normalisers are > 0."""
    return jax.nn.elu(x) + 1.0


def backend_chunk(accelerator: int, cpu: int) -> int:
    """A chunked form's default chunk on the backend that builds the layer: `cpu` where
    JAX's default backend is the CPU, else `accelerator` (fla's size, tuned for GPU tiles).
    On a CPU core the per-chunk C x C (x K) work dominates and the scan over chunks is
    cheap, so small chunks run faster (results/cpu/chunk_sizes.md); every chunk size
    computes the same outputs (the forms' tests)."""
    return cpu if jax.default_backend() == "cpu" else accelerator


def _pad_to_chunks(x_BxHxLxF: jax.Array, chunk: int) -> jax.Array:
    """Zero-pads the length to a multiple of `chunk` and gives NxBxHxCxF (N chunks)."""
    b, h, l, f = x_BxHxLxF.shape
    n = -(-l // chunk)
    x_BxHxLxF = jnp.pad(x_BxHxLxF, ((0, 0), (0, 0), (0, n * chunk - l), (0, 0)))
    return x_BxHxLxF.reshape(b, h, n, chunk, f).transpose(2, 0, 1, 3, 4)


@functools.partial(jax.jit, static_argnames=("chunk_size",))
def _causal_num_den(phi_q_BxHxLxK: jax.Array, phi_k_BxHxLxK: jax.Array,
                    v_BxHxLxD: jax.Array, log_g_BxHxL: jax.Array | None,
                    chunk_size: int) -> tuple[jax.Array, jax.Array]:
    """Numerator sum_j<=i w_ij (q_i.k_j) v_j and denominator sum_j<=i w_ij (q_i.k_j).

    w_ij = prod_{j<s<=i} g_s (1 without a gate). Inside a chunk the CxC weights are
    exact; across chunks the state S = sum_j w phi(k_j) v_j^T and z = sum_j w phi(k_j)
    are carried by a scan, so memory is O(d dv) carried plus O(L/C d dv) saved for the
    backward pass, never O(L d dv). Zero padding of the tail adds nothing to S or z.
    """
    b, h, l, _ = phi_q_BxHxLxK.shape
    chunk = max(1, min(chunk_size, l))
    f32 = jnp.float32
    q_NxBxHxCxK = _pad_to_chunks(phi_q_BxHxLxK.astype(f32), chunk)
    k_NxBxHxCxK = _pad_to_chunks(phi_k_BxHxLxK.astype(f32), chunk)
    v_NxBxHxCxD = _pad_to_chunks(v_BxHxLxD.astype(f32), chunk)
    gated = log_g_BxHxL is not None
    if gated:
        log_g_NxBxHxC = _pad_to_chunks(log_g_BxHxL.astype(f32)[..., None], chunk)[..., 0]
    else:
        log_g_NxBxHxC = jnp.zeros(q_NxBxHxCxK.shape[:-1], f32)
    causal_CxC = jnp.tril(jnp.ones((chunk, chunk), jnp.bool_))

    def body(carry, xs):
        s_BxHxKxD, z_BxHxK = carry
        q_BxHxCxK, k_BxHxCxK, v_BxHxCxD, log_g_BxHxC = xs
        scores_BxHxCxC = jnp.einsum("bhik,bhjk->bhij", q_BxHxCxK, k_BxHxCxK)
        if gated:
            # Decay from key j to query i within the chunk: exp(b_i - b_j), b = cumsum log g.
            cum_BxHxC = jnp.cumsum(log_g_BxHxC, axis=-1)
            diff_BxHxCxC = cum_BxHxC[..., :, None] - cum_BxHxC[..., None, :]
            # where() inside exp: masked (i < j) differences are positive and could overflow.
            decay_BxHxCxC = jnp.exp(jnp.where(causal_CxC, diff_BxHxCxC, -jnp.inf))
            scores_BxHxCxC = scores_BxHxCxC * decay_BxHxCxC
            q_from_state_BxHxCxK = q_BxHxCxK * jnp.exp(cum_BxHxC)[..., None]
            to_end_BxHxC = jnp.exp(cum_BxHxC[..., -1:] - cum_BxHxC)
            k_to_state_BxHxCxK = k_BxHxCxK * to_end_BxHxC[..., None]
            chunk_decay_BxHx1 = jnp.exp(cum_BxHxC[..., -1:])
        else:
            scores_BxHxCxC = jnp.where(causal_CxC, scores_BxHxCxC, 0.0)
            q_from_state_BxHxCxK, k_to_state_BxHxCxK = q_BxHxCxK, k_BxHxCxK
        num_BxHxCxD = (jnp.einsum("bhij,bhjd->bhid", scores_BxHxCxC, v_BxHxCxD)
                       + jnp.einsum("bhik,bhkd->bhid", q_from_state_BxHxCxK, s_BxHxKxD))
        den_BxHxC = (jnp.sum(scores_BxHxCxC, axis=-1)
                     + jnp.einsum("bhik,bhk->bhi", q_from_state_BxHxCxK, z_BxHxK))
        new_s = jnp.einsum("bhjk,bhjd->bhkd", k_to_state_BxHxCxK, v_BxHxCxD)
        new_z = jnp.sum(k_to_state_BxHxCxK, axis=-2)
        if gated:
            new_s = new_s + chunk_decay_BxHx1[..., None] * s_BxHxKxD
            new_z = new_z + chunk_decay_BxHx1 * z_BxHxK
        else:
            new_s, new_z = new_s + s_BxHxKxD, new_z + z_BxHxK
        return (new_s, new_z), (num_BxHxCxD, den_BxHxC)

    k_dim, d_dim = phi_q_BxHxLxK.shape[-1], v_BxHxLxD.shape[-1]
    init = (jnp.zeros((b, h, k_dim, d_dim), f32), jnp.zeros((b, h, k_dim), f32))
    _, (num_NxBxHxCxD, den_NxBxHxC) = jax.lax.scan(
        body, init, (q_NxBxHxCxK, k_NxBxHxCxK, v_NxBxHxCxD, log_g_NxBxHxC))
    n = num_NxBxHxCxD.shape[0]
    num_BxHxLxD = num_NxBxHxCxD.transpose(1, 2, 0, 3, 4).reshape(b, h, n * chunk, d_dim)
    den_BxHxL = den_NxBxHxC.transpose(1, 2, 0, 3).reshape(b, h, n * chunk)
    return num_BxHxLxD[:, :, :l], den_BxHxL[:, :, :l]


def _num_den(phi_q_BxHxLxK, phi_k_BxHxLxK, v_BxHxLxD, *, causal: bool,
             chunk_size: int) -> tuple[jax.Array, jax.Array]:
    if causal:
        return _causal_num_den(phi_q_BxHxLxK, phi_k_BxHxLxK, v_BxHxLxD, None, chunk_size)
    f32 = jnp.float32
    phi_q, phi_k = phi_q_BxHxLxK.astype(f32), phi_k_BxHxLxK.astype(f32)
    kv_BxHxKxD = jnp.einsum("bhlk,bhld->bhkd", phi_k, v_BxHxLxD.astype(f32))
    num_BxHxLxD = jnp.einsum("bhlk,bhkd->bhld", phi_q, kv_BxHxKxD)
    den_BxHxL = jnp.einsum("bhlk,bhk->bhl", phi_q, jnp.sum(phi_k, axis=-2))
    return num_BxHxLxD, den_BxHxL


def linear_attention(phi_q_BxHxLxK: jax.Array, phi_k_BxHxLxK: jax.Array,
                     v_BxHxLxD: jax.Array, *, causal: bool,
                     chunk_size: int = DEFAULT_CHUNK, eps: float = 1e-6) -> jax.Array:
    """phi(Q) (phi(K)^T V) / (phi(Q) phi(K)^T 1 + eps) on feature-mapped inputs; BxHxLxD.

    Inputs are ALREADY feature-mapped (positive features, so the denominator is > 0).
    Padding is the caller's job: zero `phi_k` (and `v`) at padded key positions; a zero
    key adds nothing to the numerator or the denominator. Outputs at padded query
    positions are whatever their (real) keys give and should be ignored.

    causal=True: output i uses keys j <= i, computed chunk by chunk (`chunk_size`,
    any L; the tail is zero-padded internally); the result does not depend on
    `chunk_size` beyond float rounding. Computed in float32, returned in v's dtype.
    """
    num, den = _num_den(phi_q_BxHxLxK, phi_k_BxHxLxK, v_BxHxLxD, causal=causal,
                        chunk_size=chunk_size)
    return (num / (den[..., None] + eps)).astype(v_BxHxLxD.dtype)


def gated_linear_attention(phi_q_BxHxLxK: jax.Array, phi_k_BxHxLxK: jax.Array,
                           v_BxHxLxD: jax.Array, log_g_BxHxL: jax.Array, *,
                           chunk_size: int = DEFAULT_CHUNK, eps: float = 1e-6) -> jax.Array:
    """Causal attention with a decaying state: S_t = g_t S_{t-1} + phi(k_t) v_t^T.

    z_t (the normaliser) decays the same way; output_t = phi(q_t) S_t / (phi(q_t) z_t),
    with the denominator kept at least `eps` away from 0 (sign kept: sin/cos features
    can make it negative). `log_g` = log g_t <= 0; a padded position should get
    log_g = 0 and phi_k = 0 so that it leaves the state untouched. RFA's (1 - g_t)
    write factor is the caller's, folded into phi_k.
    """
    num, den = _causal_num_den(phi_q_BxHxLxK, phi_k_BxHxLxK, v_BxHxLxD, log_g_BxHxL,
                               chunk_size)
    return (num / _away_from_zero(den, eps)[..., None]).astype(v_BxHxLxD.dtype)


def _away_from_zero(x: jax.Array, eps: float) -> jax.Array:
    return jnp.where(x >= 0, jnp.maximum(x, eps), jnp.minimum(x, -eps))


# FAVOR+ (positive features): the denominator's scale is arbitrary. Each query's features
# carry a free positive factor and the keys one per example and head (the stabilisers),
# all of which cancel in num / den; only an eps added to den does not cancel. den can be
# ~1e-4 at LRA's head size and far smaller as the q, k weights grow, so an absolute eps
# (1e-6) shrinks the output towards 0. The helpers below divide den by itself first
# (a stop_gradient scale, one per query), so eps is relative, O(eps) of the output,
# and no gradient goes through 1/den^2 of a tiny den (which overflows in float32). A
# query that sees no real key has num = den = 0 and gets 0.
_TINY = float(jnp.finfo(jnp.float32).tiny)


def _den_scale(den_BxHxL: jax.Array) -> jax.Array:
    """den itself where it is a positive normal float, else 1; no gradient."""
    return jax.lax.stop_gradient(jnp.where(den_BxHxL > _TINY, den_BxHxL, 1.0))


def _unit_den_queries(phi_q_BxHxLxK: jax.Array, phi_k_BxHxLxK: jax.Array) -> jax.Array:
    """Non-causal: each phi_q row divided by its own denominator phi_q . sum_j phi_k, so
    the attention's den is 1 and its eps relative (the factor cancels in the ratio, so
    its stop_gradient drops nothing but O(eps)). Padded keys must already be zero."""
    den_BxHxL = jnp.einsum("bhlk,bhk->bhl", phi_q_BxHxLxK.astype(jnp.float32),
                           jnp.sum(phi_k_BxHxLxK.astype(jnp.float32), axis=-2))
    return phi_q_BxHxLxK / _den_scale(den_BxHxL)[..., None]


def _relative_eps_ratio(num_BxHxLxD: jax.Array, den_BxHxL: jax.Array,
                        eps: float) -> jax.Array:
    """num / (den (1 + eps)) for den >= 0, computed as (num/s) / (den/s + eps), s = den."""
    scale_BxHxL = _den_scale(den_BxHxL)
    return (num_BxHxLxD / scale_BxHxL[..., None]) / (den_BxHxL / scale_BxHxL + eps)[..., None]


def delta_write(s_BxHxDxK: jax.Array, phi_k_BxHxK: jax.Array, v_BxHxD: jax.Array,
                beta_BxH: jax.Array) -> jax.Array:
    """One delta-rule write: S + beta (v - S phi(k)) phi(k)^T (the memory's old value for
    the key, moved a fraction beta towards v). Used by the scan and by decoding."""
    old_v_BxHxD = jnp.einsum("bhdk,bhk->bhd", s_BxHxDxK, phi_k_BxHxK)
    delta_BxHxD = beta_BxH[..., None] * (v_BxHxD - old_v_BxHxD)
    return s_BxHxDxK + jnp.einsum("bhd,bhk->bhdk", delta_BxHxD, phi_k_BxHxK)


@functools.partial(jax.jit, static_argnames=("causal", "chunk_size", "return_state"))
def delta_rule_attention(phi_q_BxHxLxK: jax.Array, phi_k_BxHxLxK: jax.Array,
                         v_BxHxLxD: jax.Array, beta_BxHxL: jax.Array, *, causal: bool,
                         chunk_size: int = DEFAULT_CHUNK, return_state: bool = False
                         ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Fast-weight delta rule: S_t = S_{t-1} + beta_t (v_t - S_{t-1} phi(k_t)) phi(k_t)^T.

    causal=True: y_t = S_t phi(q_t) (Schlag et al.). causal=False: the same recurrence
    runs over all positions and every query reads the final memory, y_t = S_L phi(q_t)
    (the bidirectional use of the memory for a classifier). A padded position must get
    beta = 0, so it writes nothing. A `jax.lax.scan` over time; each chunk of
    `chunk_size` steps is rematerialised so the backward pass stores S only at chunk
    boundaries (O(L/C d dv)), not at every step. BxHxLxD, float32 inside.
    return_state=True also returns the final memory S_L (BxHxDxK, float32), the state
    a decoder continues from.
    """
    b, h, l, k_dim = phi_q_BxHxLxK.shape
    d_dim = v_BxHxLxD.shape[-1]
    chunk = max(1, min(chunk_size, l))
    f32 = jnp.float32
    q_NxBxHxCxK = _pad_to_chunks(phi_q_BxHxLxK.astype(f32), chunk)
    k_NxBxHxCxK = _pad_to_chunks(phi_k_BxHxLxK.astype(f32), chunk)
    v_NxBxHxCxD = _pad_to_chunks(v_BxHxLxD.astype(f32), chunk)
    # The padded tail gets beta = 0: no write.
    beta_NxBxHxC = _pad_to_chunks(beta_BxHxL.astype(f32)[..., None], chunk)[..., 0]

    def step(s_BxHxDxK, xs):
        q_BxHxK, k_BxHxK, v_BxHxD, beta_BxH = xs
        s_BxHxDxK = delta_write(s_BxHxDxK, k_BxHxK, v_BxHxD, beta_BxH)
        return s_BxHxDxK, jnp.einsum("bhdk,bhk->bhd", s_BxHxDxK, q_BxHxK)

    @jax.checkpoint
    def chunk_body(s_BxHxDxK, xs):
        # Time-major inside the chunk: CxBxHx...
        xs = jax.tree.map(lambda a: jnp.moveaxis(a, 2, 0), xs)
        s_BxHxDxK, y_CxBxHxD = jax.lax.scan(step, s_BxHxDxK, xs)
        return s_BxHxDxK, jnp.moveaxis(y_CxBxHxD, 0, 2)

    init = jnp.zeros((b, h, d_dim, k_dim), f32)
    s_final, y_NxBxHxCxD = jax.lax.scan(
        chunk_body, init, (q_NxBxHxCxK, k_NxBxHxCxK, v_NxBxHxCxD, beta_NxBxHxC))
    if not causal:
        y_BxHxLxD = jnp.einsum("bhdk,bhlk->bhld", s_final, phi_q_BxHxLxK.astype(f32))
    else:
        n = y_NxBxHxCxD.shape[0]
        y_BxHxLxD = y_NxBxHxCxD.transpose(1, 2, 0, 3, 4).reshape(b, h, n * chunk, d_dim)
        y_BxHxLxD = y_BxHxLxD[:, :, :l]
    y_BxHxLxD = y_BxHxLxD.astype(v_BxHxLxD.dtype)
    return (y_BxHxLxD, s_final) if return_state else y_BxHxLxD

"""Feature maps and random projections of the kernelised variants (models/attention/linear.py):
DPFP (fast_weight), FAVOR+ positive and generalised-ReLU random features (performer),
RFA's sin/cos features, and the orthogonal Gaussian projection that performer and rfa
redraw on a schedule. Pure functions (tested against numpy/float64 references in
tests/models/test_linear.py) plus the `FeatureProjection` module that holds a projection.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models import layers


def dpfp_feature_map(x: jax.Array, nu: int = 1) -> jax.Array:
    """Deterministic parameter-free projection (Schlag et al.): 2 d nu positive features.

    r = [relu(x), relu(-x)]; features r_i r_{i+j} (indices mod 2d) for j = 1..nu.
    """
    r = jnp.concatenate([jax.nn.relu(x), jax.nn.relu(-x)], axis=-1)
    return jnp.concatenate([r * jnp.roll(r, j, axis=-1) for j in range(1, nu + 1)], axis=-1)


def sum_normalise(phi: jax.Array, eps: float = 1e-6) -> jax.Array:
    """phi / sum(phi) over features (Schlag et al.); eps keeps an all-zero phi finite."""
    return phi / (jnp.sum(phi, axis=-1, keepdims=True) + eps)


@functools.partial(jax.jit, static_argnames=("num_rows", "dim"))
def orthogonal_gaussian(key: jax.Array, num_rows: int, dim: int) -> jax.Array:
    """num_rows x dim: blocks of `dim` orthonormal rows (QR of a Gaussian), each row
    rescaled by an independent chi(dim) norm, so rows are marginally N(0, I) but
    orthogonal within a block (Choromanski et al., ORF)."""
    num_blocks = -(-num_rows // dim)
    block_key, norm_key = jax.random.split(key)
    gaussians = jax.random.normal(block_key, (num_blocks, dim, dim), jnp.float32)
    q_blocks, _ = jnp.linalg.qr(gaussians)
    rows = jnp.swapaxes(q_blocks, -1, -2).reshape(num_blocks * dim, dim)[:num_rows]
    norms = jnp.linalg.norm(jax.random.normal(norm_key, (num_rows, dim), jnp.float32), axis=-1)
    return rows * norms[:, None]


def _orthogonal_gaussian_np(rng: np.random.Generator, num_rows: int, dim: int) -> np.ndarray:
    """`orthogonal_gaussian` drawn with numpy (the same distribution)."""
    num_blocks = -(-num_rows // dim)
    q_blocks, _ = np.linalg.qr(rng.standard_normal((num_blocks, dim, dim)))
    rows = np.swapaxes(q_blocks, -1, -2).reshape(num_blocks * dim, dim)[:num_rows]
    norms = np.linalg.norm(rng.standard_normal((num_rows, dim)), axis=-1)
    return (rows * norms[:, None]).astype(np.float32)


def favor_softmax_features(x_BxHxLxK: jax.Array, w_MxK: jax.Array, *, is_query: bool,
                           mask_BxL: jax.Array | None = None) -> jax.Array:
    """FAVOR+ positive features: exp(w.x' - |x'|^2/2 - c) / sqrt(m), x' = x d^(-1/4).

    E[phi(q).phi(k)] = exp(q.k / sqrt(d)) up to constants that cancel in the normalised
    attention: a per-query factor, and one factor per example and head for the keys.
    So a query's features are exp(w.q' - max_m w.q') / sqrt(m): its |q'|^2/2 is such a
    per-query factor and is dropped, not subtracted. At LRA's head size (d = 64) with
    unit-scale q, k, |q'|^2/2 = |q|^2 / (2 sqrt(d)) is ~4 and grows quadratically with the
    weights; subtracting it (and the paper code's key max of w.k' alone, which leaves
    exp(-|k'|^2/2) on every key) pushed the attention's denominator sum_j phi(q).phi(k_j)
    to ~3e-7 (median; L = 1024) and ~1e-12 with q, k weights grown 1.5x, where it drowns
    in an absolute eps (the output fell to ~0.5x, then ~0). Keys subtract one max per
    example and head over all real keys and features of w.k' - |k'|^2/2, so the largest
    key feature is 1/sqrt(m)
    (padded keys excluded, so they cannot shift it); the largest query feature is too.
    """
    d, m = x_BxHxLxK.shape[-1], w_MxK.shape[0]
    x = x_BxHxLxK.astype(jnp.float32) * d ** -0.25
    proj_BxHxLxM = jnp.einsum("bhlk,mk->bhlm", x, w_MxK.astype(jnp.float32))
    if is_query:
        stab = jnp.max(proj_BxHxLxM, axis=-1, keepdims=True)
        log_phi = proj_BxHxLxM
    else:
        log_phi = proj_BxHxLxM - 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)
        real = log_phi
        if mask_BxL is not None:
            real = jnp.where(mask_BxL[:, None, :, None], log_phi, -jnp.inf)
        stab = jnp.max(real, axis=(-2, -1), keepdims=True)
        stab = jnp.where(jnp.isfinite(stab), stab, 0.0)  # no real key at all
    stab = jax.lax.stop_gradient(stab)  # cancels in the ratio
    return jnp.exp(log_phi - stab) / math.sqrt(m)


def favor_key_logits(k_BxHxLxK: jax.Array, w_MxK: jax.Array) -> jax.Array:
    """FAVOR+ key features in log space before any stabiliser: w.k' - |k'|^2/2 (BxHxLxM),
    k' = k d^(-1/4); a key's features are exp(logits - stabiliser) / sqrt(m). Shared by
    the causal parallel form and the one-token step (models/attention/linear.py)."""
    d = k_BxHxLxK.shape[-1]
    x = k_BxHxLxK.astype(jnp.float32) * d ** -0.25
    proj_BxHxLxM = jnp.einsum("bhlk,mk->bhlm", x, w_MxK.astype(jnp.float32))
    return proj_BxHxLxM - 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)


def favor_causal_key_features(k_BxHxLxK: jax.Array, w_MxK: jax.Array, *,
                               mask_BxL: jax.Array | None = None
                               ) -> tuple[jax.Array, jax.Array]:
    """Causal FAVOR+ key features stabilised by the running max P_j of past keys.

    A global key max (the paper's code) would let future keys change past outputs
    (through eps, and by underflowing early keys). Instead key j is scaled by
    exp(-P_j), P_j = max over real keys i <= j, and query i must see every key
    scaled by exp(-P_i): a decay exp(P_j - P_i) = prod_{j<s<=i} g_s with
    log g_s = P_{s-1} - P_s <= 0, exactly what `gated_linear_attention` carries.
    Returns (phi_k BxHxLxM, log_g BxHxL). (Decoding carries P_t itself and applies the
    same g_t one token at a time: `Performer.recur` in models/attention/linear.py.)
    """
    m = w_MxK.shape[0]
    # The max includes -|k'|^2/2 (see `favor_softmax_features`): the largest key feature
    # seen by each query is then exactly 1/sqrt(m), not exp(-|k'|^2/2) / sqrt(m).
    log_phi_BxHxLxM = favor_key_logits(k_BxHxLxK, w_MxK)
    row_max_BxHxL = jnp.max(log_phi_BxHxLxM, axis=-1)
    if mask_BxL is not None:
        row_max_BxHxL = jnp.where(mask_BxL[:, None, :], row_max_BxHxL, -jnp.inf)
    prefix_BxHxL = jax.lax.stop_gradient(jax.lax.cummax(row_max_BxHxL, axis=2))
    # Before the first real key the state is empty: any finite value will do.
    prefix_BxHxL = jnp.where(jnp.isfinite(prefix_BxHxL), prefix_BxHxL, 0.0)
    previous_BxHxL = jnp.concatenate([prefix_BxHxL[..., :1], prefix_BxHxL[..., :-1]], -1)
    log_g_BxHxL = jnp.minimum(previous_BxHxL - prefix_BxHxL, 0.0)
    phi_k = jnp.exp(log_phi_BxHxLxM - prefix_BxHxL[..., None]) / math.sqrt(m)
    return phi_k, log_g_BxHxL


def relu_features(x_BxHxLxK: jax.Array, w_MxK: jax.Array, eps: float = 1e-3) -> jax.Array:
    """Generalised ReLU kernel (Performer; LRA's default): relu(w.x) / sqrt(m) + eps."""
    m = w_MxK.shape[0]
    proj = jnp.einsum("bhlk,mk->bhlm", x_BxHxLxK.astype(jnp.float32),
                      w_MxK.astype(jnp.float32))
    return jax.nn.relu(proj) / math.sqrt(m) + eps


def trig_features(x_BxHxLxK: jax.Array, w_MxK: jax.Array,
                  inv_temperature_H: jax.Array) -> jax.Array:
    """RFA: [sin(W x^ / tau), cos(W x^ / tau)] / sqrt(m), x^ = x / |x|; 2m features.

    E[phi(x).phi(y)] = exp(-|x^ - y^|^2 / (2 tau^2)) = exp((x^.y^ - 1) / tau^2):
    softmax attention on unit vectors with a temperature tau (per head).
    """
    m = w_MxK.shape[0]
    x = x_BxHxLxK.astype(jnp.float32)
    x_hat = x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-12)
    proj = jnp.einsum("bhlk,mk->bhlm", x_hat, w_MxK.astype(jnp.float32))
    proj = proj * inv_temperature_H[None, :, None, None]
    return jnp.concatenate([jnp.sin(proj), jnp.cos(proj)], axis=-1) / math.sqrt(m)


# ----------------------------------------------------------------------------- modules


class RandomFeatures(nnx.Variable):
    """A random projection (not trained; redrawn on a schedule). Saved in checkpoints."""


class RedrawCounter(nnx.Variable):
    """Training calls made with the current features."""


class FeatureProjection(nnx.Module):
    """An m x d orthogonal Gaussian projection, redrawn every `redraw_interval` training
    calls (inside jit, from its own forked RNG stream) and frozen when deterministic.

    A training call redraws BEFORE it uses the projection (performer-pytorch's order), so
    the stored projection is always the one the weights were last trained with. Redrawing
    after the interval-th call instead left a run of N x interval steps with a draw it
    never trained on: the MAD minis (1,000 steps, interval 1,000) then validated at
    91.7% with the trained-on draw and 16.9% with the fresh one (results/cpu/mad_grid_mad.md);
    a model adapted to one draw loses recall under another until it trains again."""

    def __init__(self, num_features: int, dim: int, *, redraw_interval: int,
                 rngs: nnx.Rngs):
        if num_features <= 0:
            raise ValueError(f"num_features must be positive, got {num_features}")
        if redraw_interval < 0:
            raise ValueError(f"redraw_interval must be >= 0 (0 = never), got {redraw_interval}")
        self.num_features, self.dim = num_features, dim
        self.redraw_interval = redraw_interval
        key = rngs.params()
        try:
            # The first draw in numpy (seeded from the params stream): compiling jax.random
            # and QR programs costs seconds on a small CPU, paid only when training redraws.
            seed = np.asarray(jax.random.key_data(key)).tolist()
            w_MxK = _orthogonal_gaussian_np(np.random.default_rng(seed), num_features, dim)
        except jax.errors.TracerArrayConversionError:  # built under jit / eval_shape
            w_MxK = orthogonal_gaussian(key, num_features, dim)
        self.features = RandomFeatures(jnp.asarray(w_MxK))
        self.count = RedrawCounter(jnp.zeros((), jnp.int32))
        self.rngs = layers.noise_stream(rngs)

    def __call__(self, *, deterministic: bool) -> jax.Array:
        """The projection for this call (a training call first advances the schedule)."""
        if not deterministic and self.redraw_interval > 0:
            self.features[...], self.count[...] = _advance_schedule(
                self.features[...], self.count[...], self.rngs(),
                interval=self.redraw_interval)
        return self.features[...]


@functools.partial(jax.jit, static_argnames=("interval",))
def _advance_schedule(w_MxK: jax.Array, count: jax.Array, key: jax.Array, *,
                      interval: int) -> tuple[jax.Array, jax.Array]:
    """One training call: fresh features if the current ones have served `interval`
    calls, then this call counted (`count`: training calls made with the current ones)."""
    redraw = count >= interval
    w_MxK = jax.lax.cond(redraw, lambda: orthogonal_gaussian(key, *w_MxK.shape),
                         lambda: w_MxK)
    return w_MxK, jnp.where(redraw, 1, count + 1)

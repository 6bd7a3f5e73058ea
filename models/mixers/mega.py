"""Mega (Ma et al. 2023, "Mega: Moving Average Equipped Gated Attention"): the `mega` mixer.

As facebookresearch/mega's `MovingAverageGatedAttention` and `MultiHeadEMA`
(fairseq/modules/moving_average_gated_attention.py, exponential_moving_average.py).
x is the layer's input (D = dim channels), H = hidden_dim, Z = z_dim, N = ndim:

    EMA, per channel d, N damped EMAs (p = sigmoid(delta), q = 1 - p sigmoid(alpha)):
        h_t = p beta o x_t + q o h_{t-1},  y_t = sum_n gamma_n / sqrt(N) h_t,n
      i.e. the kernel k[l] = sum_n gamma_n / sqrt(N) p_n beta_n q_n^l (lags l < truncation),
      computed by FFT convolution (O(L log L)); mx = silu(y + omega o x)
    v = silu(x W_v)                                   (B x L x H)
    u, zr, hx = split(mx W_mx): u = sigmoid (D), z, r = split(silu(zr)) (Z, H), hx (D)
    q = z o gamma_0 + beta_0, k = z o gamma_1 + beta_1  (one shared z, single head)
    attention within chunks of chunk_size positions (chunk_size <= 0: the whole input),
    with the relative bias b[j - i] (their `SimpleRelativePositionalBias`):
        softmax: softmax(q k^T / sqrt(Z) + b);  laplace / relu2: f(q k^T / n + b), n the
        number of keys the query may see (its chunk's real keys; causal: those up to it),
        laplace f(a) = (1 + erf((a - sqrt(1/2)) / (sqrt(1/4pi) sqrt 2))) / 2, relu2 relu(a)^2
    h = silu(hx + (r o attn(q, k, v)) W_h);  Mega's output: x + u o (h - x).
Non-causal (causal=False): Mega's bidirectional EMA, two kernels (delta, alpha, beta, gamma
have 2D rows) y_t = sum_l k0[l] x_{t-l} + sum_l k1[l] x_{t+l}; both include lag 0 (as
their padded FFT; unlike S4's off-by-one). Causal: the forward kernel only and a causal
mask inside each chunk, as their decoder (mega_lm.py).

The residual. Mega's layer returns x + u o (h - x) with x its own input (before its norm
under prenorm). The mixer returns that output less the residual, u o (h - r): r is its
input unless the block passes `residual=` (the raw stream). Three blocks place it:
- `mega_pre_ln` (`--config.block.kind=mega_pre_ln`; Mega's --encoder-normalize-before, its
  LRA setting for Image, Pathfinder and Path-X, and the `paper` recipes of those): the
  mixer sees LN(x), gets residual=x, and the layer is x + u o (h - x), exactly Mega's
  prenorm layer (results/cpu/mega_prenorm_vs_original.md measures it against theirs).
- `post_ln` (Mega's normalize_before=False: ListOps, Text and Retrieval): the mixer sees
  the stream itself and LN(x + mixer(x)) is exactly Mega's post-norm layer
  LN(x + u o (h - x)) (LayerNorm where Text and Retrieval use ScaleNorm).
- `pre_ln` (the default block of every variant): the mixer sees only x_hat = LN(x) and
  returns u o (h - x_hat), so the layer is x + u o (h - x_hat): the update gate
  interpolates from the normalised input, not from the stream. That is not Mega's layer
  (it differs by u o (x - x_hat)); it is kept as the lab's common pre-LN form so that
  `mega` beside the other variants under LRA's budget has their block.
results/cpu/mega_vs_original.md compares mixer(x) + x with their layer without a norm.
Mega's normalised FFN after the layer is the block's channel MLP (GELU here, SiLU theirs).

Positions come from the relative bias and the EMA (Capabilities.pos_emb "none"; rotary is
refused: Mega's products already carry their own relative bias). The bias table has 2M - 1
entries, M = chunk_size if chunk_size > 0 else max_len (their `max_positions`).
Chunks: L is padded up to a multiple of chunk_size and the padded keys masked (as their LM,
which pads the tokens); chunk_size >= L is one chunk (full attention, as their code).
Padding: padded inputs are zeroed before the EMA (both directions) and padded keys masked
in the attention. Initialisation as Mega's reset_parameters: the projections' weights,
qk_gamma and the relative bias N(0, 0.02), the projections' biases and qk_beta zero; the
EMA's delta and alpha N(0, 0.2), beta (1, -1, 1, ...) + N(0, 0.02), gamma and omega
N(0, 1). Mega's optimiser (fairseq's Adam, one
parameter group) decays every parameter, the EMA's included: none is marked
`no_weight_decay`.

Decoding (causal; Capabilities.decode "kv_cache": with the default chunk_size -1 the cache
grows with max_len): the cache holds the forward EMA's state (B x D x N, float32), the
keys and values of the current chunk in a ring of min(chunk_size, max_len) slots (all
max_len slots for chunk_size <= 0) and, when 0 < truncation < max_len, the last
`truncation` EMA inputs (the truncated kernel's state drops q^T p beta x_{t-T} each step).
A step is the recurrence above and one query over the ring's keys of its own chunk.
Numerics: float32 inside; q^l = exp(l log q) with log q < 0, so no exponent is positive
(L = 16384 is finite).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import decoding, layers, registry
from models.mixers.ssm import _check_causal_form, _f32, _zero_padded

ATTENTION_ACTIVATIONS = ("softmax", "laplace", "relu2")
_STD = 0.02  # Mega's reset_parameters: every projection, gamma and the relative bias
_NEG = jnp.finfo(jnp.float32).min


def _normal(std: float) -> layers.Initializer:
    def init(key, shape, dtype=jnp.float32):
        return std * jax.random.normal(key, shape, dtype)
    return init


def _alternating(std: float) -> layers.Initializer:
    """The EMA's beta: (1, -1, 1, ...) over the N dimensions plus N(0, std) ("seems more
    stable", their comment)."""
    def init(key, shape, dtype=jnp.float32):
        sign = jnp.where(jnp.arange(shape[-1]) % 2 == 0, 1.0, -1.0).astype(dtype)
        return sign + std * jax.random.normal(key, shape, dtype)
    return init


def laplace(a: jax.Array) -> jax.Array:
    """Mega's laplace attention function (fairseq utils.laplace: mu = sqrt(1/2),
    sigma = sqrt(1/(4 pi)))."""
    mu, sigma = 0.707107, 0.282095
    return 0.5 * (1.0 + jax.lax.erf((a - mu) / (sigma * math.sqrt(2.0))))


class MultiHeadEMA(nnx.Module):
    """Mega's multi-dimensional damped EMA (module docstring); `__call__` is the FFT form.

    Parameters are directions x D x N (direction 0 the forward kernel, 1 the backward one
    of the bidirectional form; theirs stack them as 2D rows), omega D."""

    def __init__(self, dim: int, *, ndim: int, bidirectional: bool, truncation: int,
                 rngs: nnx.Rngs):
        self.ndim = ndim
        self.truncation = truncation
        self.bidirectional = bidirectional
        shape, names = (2 if bidirectional else 1, dim, ndim), (None, "embed", None)
        # The EMA's parameters stay float32 under mixed precision (models/precision.py).
        ema = dict(rngs=rngs, keep_float32=True)
        self.delta = layers.param(_normal(0.2), names, shape, **ema)
        self.alpha = layers.param(_normal(0.2), names, shape, **ema)
        self.beta = layers.param(_alternating(0.02), names, shape, **ema)
        self.gamma = layers.param(_normal(1.0), names, shape, **ema)
        self.omega = layers.param(_normal(1.0), ("embed",), (dim,), **ema)

    def coeffs(self) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(p beta, log q, gamma / sqrt(N)), each directions x D x N: the input weight,
        the log decay and the read-out. log q < 0; q is floored at the smallest normal
        float so that a saturated p alpha = 1 gives a huge negative log, not -inf (whose
        0 * -inf at lag 0 would be NaN)."""
        # float32 whatever the compute dtype (models/precision.py): the EMA is a state.
        p = jax.nn.sigmoid(_f32(self.delta))
        q = 1.0 - p * jax.nn.sigmoid(_f32(self.alpha))
        log_q = jnp.log(jnp.maximum(q, jnp.finfo(jnp.float32).tiny))
        return p * _f32(self.beta), log_q, _f32(self.gamma) / math.sqrt(self.ndim)

    def reach(self, length: int) -> int:
        """Lags the kernel has: min(truncation, length); all of them for truncation 0."""
        return min(self.truncation, length) if self.truncation > 0 else length

    def kernel(self, length: int) -> jax.Array:
        """k (directions x D x reach float32): k[l] = sum_n gamma_n / sqrt(N) p_n beta_n
        q_n^l."""
        pb, log_q, read = self.coeffs()
        lags = jnp.arange(self.reach(length), dtype=jnp.float32)
        return jnp.einsum("kdn,kdnl->kdl", pb * read, jnp.exp(log_q[..., None] * lags))

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None) -> jax.Array:
        """silu(EMA(x) + omega o x), float32 (padded inputs zeroed before the EMA)."""
        length, dim = x_BxLxD.shape[1:]
        x_BxLxD = x_BxLxD.astype(jnp.float32)
        u_BxLxD = _zero_padded(x_BxLxD, padding_mask)
        k_KxDxT = self.kernel(length)
        size = 2 * length  # lags in (-L, L): an FFT of size 2L never wraps
        k_DxS = jnp.pad(k_KxDxT[0], ((0, 0), (0, size - k_KxDxT.shape[-1])))
        if self.bidirectional:
            # The backward kernel on lags 0, -1, ..., -(T-1): lag -l at index size - l.
            k1_DxT = k_KxDxT[1]
            k_DxS = k_DxS + jnp.concatenate(
                [k1_DxT[:, :1], jnp.zeros((dim, size - k1_DxT.shape[-1]), jnp.float32),
                 k1_DxT[:, :0:-1]], axis=-1)
        y_BxLxD = jnp.fft.irfft(jnp.fft.rfft(u_BxLxD, n=size, axis=1)
                                * jnp.fft.rfft(k_DxS, n=size, axis=-1).T[None],
                                n=size, axis=1)[:, :length]
        return jax.nn.silu(y_BxLxD + _f32(self.omega) * x_BxLxD)


class Mega(nnx.Module):
    """Mega's moving-average gated attention (module docstring) without its norm; the
    output is the layer's minus its input."""

    def __init__(self, *, dim: int, max_len: int, causal: bool, ndim: int, z_dim: int,
                 hidden_dim: int, chunk_size: int, truncation: int,
                 attention_activation: str, dropout: float, hidden_dropout: float,
                 attention_dropout: float, rngs: nnx.Rngs):
        for name, value in (("ndim", ndim), ("z_dim", z_dim), ("hidden_dim", hidden_dim)):
            if value <= 0:
                raise ValueError(f"mega: {name} must be positive, got {value}")
        if truncation < 0:
            raise ValueError(f"mega: truncation must be >= 0 (0: no truncation), got "
                             f"{truncation}")
        if attention_activation not in ATTENTION_ACTIVATIONS:
            raise ValueError(f"mega: attention_activation must be one of "
                             f"{ATTENTION_ACTIVATIONS}, got {attention_activation!r}")
        for name, rate in (("dropout", dropout), ("hidden_dropout", hidden_dropout),
                           ("attention_dropout", attention_dropout)):
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"mega: {name} must be in [0, 1), got {rate}")
        self.dim, self.z_dim, self.hidden_dim = dim, z_dim, hidden_dim
        self.max_len, self.causal = max_len, causal
        self.chunk_size = chunk_size if chunk_size > 0 else -1  # 0 and -1: full attention
        self.attention_activation = attention_activation
        self.ema = MultiHeadEMA(dim, ndim=ndim, bidirectional=not causal,
                                truncation=truncation, rngs=rngs)
        proj = dict(kernel_init=_normal(_STD), rngs=rngs)
        self.v_proj = layers.dense(dim, hidden_dim, ("embed", "mlp"), **proj)
        self.mx_proj = layers.dense(dim, 2 * dim + z_dim + hidden_dim, ("embed", "mlp"),
                                    **proj)
        self.h_proj = layers.dense(hidden_dim, dim, ("mlp", "embed"), **proj)
        self.qk_gamma = layers.param(_normal(_STD), (None, None), (2, z_dim), rngs=rngs)
        self.qk_beta = layers.param(layers.zeros, (None, None), (2, z_dim), rngs=rngs)
        self.rel_span = self.chunk_size if self.chunk_size > 0 else max_len
        self.rel_pos_bias = layers.param(_normal(_STD), (None,), (2 * self.rel_span - 1,),
                                         rngs=rngs)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)  # on the EMA output and on h
        self.hidden_dropout = nnx.Dropout(hidden_dropout, rngs=rngs)  # on v
        self.attention_dropout = nnx.Dropout(attention_dropout, rngs=rngs)

    # ------------------------------------------------------------------ the pieces

    def _gates(self, mx_xD: jax.Array, deterministic: bool):
        """From the EMA's output: u (update gate), q, k (one z), r (reset gate), hx."""
        base_xF = self.mx_proj(self.dropout(mx_xD, deterministic=deterministic))
        d, z, h = self.dim, self.z_dim, self.hidden_dim
        zr_xF = jax.nn.silu(base_xF[..., d:d + z + h])
        z_xZ, r_xH = zr_xF[..., :z], zr_xF[..., z:]
        gamma, beta = self.qk_gamma[...], self.qk_beta[...]
        return (jax.nn.sigmoid(base_xF[..., :d]), z_xZ * gamma[0] + beta[0],
                z_xZ * gamma[1] + beta[1], r_xH, base_xF[..., d + z + h:])

    def _bias(self, offset: jax.Array) -> jax.Array:
        """The relative bias b[j - i] at offsets j - i in (-M, M)."""
        return self.rel_pos_bias[...][self.rel_span - 1 + offset]

    def _attend(self, q_xQxZ, k_xKxZ, v_xKxH, allowed_xQxK, bias_xQxK,
                deterministic: bool) -> jax.Array:
        """Single-head attention of the queries over the keys they are allowed."""
        qk_xQxK = jnp.einsum("...qz,...kz->...qk", q_xQxZ, k_xKxZ,
                             preferred_element_type=jnp.float32)  # softmax in float32
        if self.attention_activation == "softmax":
            logits = qk_xQxK * self.z_dim ** -0.5 + bias_xQxK
            weights = jax.nn.softmax(jnp.where(allowed_xQxK, logits, _NEG), axis=-1)
        else:
            # Their element attention divides by the number of keys seen (at least 1).
            seen = jnp.maximum(jnp.sum(allowed_xQxK, axis=-1, keepdims=True), 1)
            a = qk_xQxK / seen + bias_xQxK
            f = laplace(a) if self.attention_activation == "laplace" else jax.nn.relu(a) ** 2
            weights = jnp.where(allowed_xQxK, f, 0.0)
        weights = self.attention_dropout(weights, deterministic=deterministic)
        v_xKxH = self.hidden_dropout(v_xKxH, deterministic=deterministic)
        return jnp.einsum("...qk,...kh->...qh", weights, v_xKxH)

    def _output(self, r_xD, attn_xH, u_xD, r_xH, hx_xD, deterministic: bool) -> jax.Array:
        """u o (h - r): Mega's r + u o (h - r) less the residual r the block adds (the
        mixer's input, or the stream given as `residual`)."""
        h_xD = jax.nn.silu(hx_xD + self.h_proj(attn_xH * r_xH))
        return u_xD * (self.dropout(h_xD, deterministic=deterministic) - r_xD)

    @staticmethod
    def _residual(x_xD: jax.Array, residual: jax.Array | None) -> jax.Array:
        """float32 r of `_output`: `residual` where the block passes one, else x."""
        if residual is not None and residual.shape != x_xD.shape:
            raise ValueError(f"mega: residual shape {residual.shape} != input shape "
                             f"{x_xD.shape}")
        return (x_xD if residual is None else residual).astype(jnp.float32)

    def _forward(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None,
                 deterministic: bool, residual_BxLxD: jax.Array | None = None):
        """(output, k, v): the parallel form, and its keys and values for a prefill."""
        batch, length, _ = x_BxLxD.shape
        if self.chunk_size <= 0 and length > self.max_len:
            raise ValueError(f"mega: length {length} > max_len {self.max_len} (the relative "
                             "bias covers max_len positions without chunks)")
        x_BxLxD_ = x_BxLxD.astype(jnp.float32)
        valid_BxL = layers.valid_mask(padding_mask, batch, length)
        u, q_BxLxZ, k_BxLxZ, r, hx = self._gates(self.ema(x_BxLxD_, valid_BxL),
                                                  deterministic)
        v_BxLxH = jax.nn.silu(self.v_proj(x_BxLxD_))
        chunk = min(self.chunk_size, length) if self.chunk_size > 0 else length
        n = -(-length // chunk)
        extra = n * chunk - length  # the last chunk's missing keys: masked

        def chunks(t_BxLxF):
            return jnp.pad(t_BxLxF, ((0, 0), (0, extra), (0, 0))).reshape(
                batch, n, chunk, t_BxLxF.shape[-1])

        keys_BxNx1xC = jnp.pad(valid_BxL, ((0, 0), (0, extra))).reshape(batch, n, 1, chunk)
        offset_CxC = jnp.arange(chunk)[None] - jnp.arange(chunk)[:, None]  # j - i
        allowed = keys_BxNx1xC & (offset_CxC <= 0) if self.causal else keys_BxNx1xC
        allowed_BxNxCxC = jnp.broadcast_to(allowed, (batch, n, chunk, chunk))
        attn_BxNxCxH = self._attend(chunks(q_BxLxZ), chunks(k_BxLxZ), chunks(v_BxLxH),
                                    allowed_BxNxCxC, self._bias(offset_CxC), deterministic)
        attn_BxLxH = attn_BxNxCxH.reshape(batch, n * chunk, -1)[:, :length]
        y_BxLxD = self._output(self._residual(x_BxLxD_, residual_BxLxD), attn_BxLxH, u, r,
                               hx, deterministic)
        return y_BxLxD.astype(x_BxLxD.dtype), k_BxLxZ, v_BxLxH

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True, residual: jax.Array | None = None) -> jax.Array:
        """u o (h - r), r = `residual` (the mega_pre_ln block's raw stream) or x."""
        return self._forward(x_BxLxD, padding_mask, deterministic, residual)[0]

    # ------------------------------------------------------------------ decoding

    def init_cache(self, batch: int, max_len: int) -> decoding.Cache:
        _check_causal_form(self)
        if self.chunk_size <= 0 and max_len > self.max_len:
            raise decoding.DecodingError(f"mega: decoding {max_len} positions needs "
                                         f"max_len >= {max_len} (got {self.max_len})")
        # A query reaches the keys of its own chunk only: a ring of chunk_size slots.
        slots = min(self.chunk_size, max_len) if self.chunk_size > 0 else max_len
        cache = {"pos": jnp.zeros((batch,), jnp.int32),
                 "ema": jnp.zeros((batch, self.dim, self.ema.ndim), jnp.float32),
                 "k": jnp.zeros((batch, slots, self.z_dim), jnp.float32),
                 "v": jnp.zeros((batch, slots, self.hidden_dim), jnp.float32)}
        if 0 < self.ema.truncation < max_len:
            cache["ema_x"] = jnp.zeros((batch, self.ema.truncation, self.dim), jnp.float32)
        return cache

    def prefill(self, cache, x_BxLxD, padding_mask, residual=None):
        """The parallel causal outputs; the EMA state after row b's real tokens, sum over
        l < reach of q^l p beta x_{len_b - 1 - l} (each row read backwards from its last
        real token, so the powers are one D x N x L table for all rows), and the rings of
        its latest keys, values (and EMA inputs)."""
        _check_causal_form(self)
        batch, length, _ = x_BxLxD.shape
        pos_B = decoding.lengths_of(padding_mask, batch, length)
        y_BxLxD, k_BxLxZ, v_BxLxH = self._forward(x_BxLxD, padding_mask, True, residual)
        x_BxLxD_ = x_BxLxD.astype(jnp.float32)
        back_BxL = pos_B[:, None] - 1 - jnp.arange(length)[None]
        lags = self.ema.reach(length)
        back_BxT = back_BxL[:, :lags]
        u_BxTxD = jnp.take_along_axis(x_BxLxD_, jnp.clip(back_BxT, 0, length - 1)[..., None],
                                      axis=1)
        u_BxTxD = jnp.where((back_BxT >= 0)[..., None], u_BxTxD, 0.0)
        pb, log_q, _ = self.ema.coeffs()
        powers_DxNxT = jnp.exp(log_q[0][..., None] * jnp.arange(lags, dtype=jnp.float32))
        ema_BxDxN = pb[0] * jnp.einsum("dnt,btd->bdn", powers_DxNxT, u_BxTxD)

        def ring(t_BxLxF, slots):  # slot s: the latest prompt position p = s (mod slots)
            held_BxS = decoding.slot_positions(pos_B - 1, slots)
            taken = jnp.take_along_axis(t_BxLxF, jnp.clip(held_BxS, 0, length - 1)[..., None],
                                        axis=1)
            return jnp.where((held_BxS >= 0)[..., None], taken, 0.0).astype(jnp.float32)

        new = {"pos": pos_B, "ema": ema_BxDxN, "k": ring(k_BxLxZ, cache["k"].shape[1]),
               "v": ring(v_BxLxH, cache["v"].shape[1])}
        if "ema_x" in cache:
            new["ema_x"] = ring(x_BxLxD_, cache["ema_x"].shape[1])
        return y_BxLxD, new

    def step(self, cache, x_BxD, residual=None):
        _check_causal_form(self)
        pos_B = cache["pos"]
        x_BxD_ = x_BxD.astype(jnp.float32)
        pb, log_q, read = (c[0] for c in self.ema.coeffs())
        ema_BxDxN = jnp.exp(log_q) * cache["ema"] + pb * x_BxD_[..., None]
        new = {"pos": pos_B + 1}
        if "ema_x" in cache:  # the truncated kernel forgets x_{t-T}: subtract q^T p beta x
            trunc = cache["ema_x"].shape[1]
            slot_B = jnp.mod(pos_B, trunc)
            dropped_BxD = decoding.row_at(cache["ema_x"], slot_B)  # zero before any
            ema_BxDxN = ema_BxDxN - jnp.exp(trunc * log_q) * pb * dropped_BxD[..., None]
            new["ema_x"] = decoding.write_row(cache["ema_x"], slot_B, x_BxD_)
        mx_BxD = jax.nn.silu(jnp.einsum("bdn,dn->bd", ema_BxDxN, read)
                             + _f32(self.ema.omega) * x_BxD_)
        u, q_BxZ, k_BxZ, r, hx = self._gates(mx_BxD, True)
        slots = cache["k"].shape[1]
        slot_B = jnp.mod(pos_B, slots)
        k_BxSxZ = decoding.write_row(cache["k"], slot_B, k_BxZ)
        v_BxSxH = decoding.write_row(cache["v"], slot_B, jax.nn.silu(self.v_proj(x_BxD_)))
        held_BxS = decoding.slot_positions(pos_B, slots)
        start_B = (pos_B // self.chunk_size * self.chunk_size if self.chunk_size > 0
                   else jnp.zeros_like(pos_B))
        allowed_Bx1xS = (held_BxS >= start_B[:, None])[:, None]
        bias_Bx1xS = self._bias(held_BxS - pos_B[:, None])[:, None]
        attn_BxH = self._attend(q_BxZ[:, None], k_BxSxZ, v_BxSxH, allowed_Bx1xS, bias_Bx1xS,
                                True)[:, 0]
        y_BxD = self._output(self._residual(x_BxD_, residual), attn_BxH, u, r, hx, True)
        new.update(ema=ema_BxDxN, k=k_BxSxZ, v=v_BxSxH)
        return y_BxD.astype(x_BxD.dtype), new


@registry.register("mega", capabilities=registry.Capabilities(
    description="Mega: multi-dimensional damped EMA (FFT convolution; two kernels for "
    "causal=False), then single-head gated attention (shared z for q/k, reset and update "
    "gates, relative bias; softmax, laplace or relu2), chunked (linear time) for "
    "chunk_size > 0",
    causal=True, decode="kv_cache", padding=True, variable_length=True,
    receptive_field="global", pos_emb="none", takes_residual=True, span_hparam="chunk_size",
    test_hparams={"ndim": 2, "z_dim": 8, "hidden_dim": 16, "chunk_size": 4},
    rotary_refusal="its query-key products carry Mega's own relative bias (and the EMA "
    "orders the sequence)"))
def build_mega(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
               ndim: int = 16, z_dim: int = 64, hidden_dim: int = 0, chunk_size: int = -1,
               truncation: int = 0, attention_activation: str = "softmax",
               dropout: float = 0.0, hidden_dropout: float = 0.0,
               attention_dropout: float = 0.0) -> Mega:
    """ndim N (16, every LRA task), z_dim Z (the shared query/key width: 64; 96 image, 32
    Path-X), hidden_dim H (0: 2 * dim, the ratio of every Mega LRA architecture), chunk_size
    (-1 or 0: full attention, Mega; > 0: Mega-chunk), truncation (0: the EMA kernel spans
    the input; Mega's LRA architectures 1024, Path-X 4096), attention_activation
    ("softmax", "laplace", "relu2"), Mega's dropouts: `dropout` (on the EMA output and on
    h), `hidden_dropout` (on v) and `attention_dropout` (on the weights: the config's
    attention_dropout_rate). num_heads is unused: Mega has one head."""
    del num_heads
    return Mega(dim=dim, max_len=max_len, causal=causal, ndim=ndim, z_dim=z_dim,
                hidden_dim=hidden_dim or 2 * dim, chunk_size=chunk_size,
                truncation=truncation, attention_activation=attention_activation,
                dropout=dropout, hidden_dropout=hidden_dropout,
                attention_dropout=attention_dropout, rngs=rngs)

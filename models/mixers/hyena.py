"""The Hyena operator (`hyena`; Poli et al. 2023, "Hyena Hierarchy: Towards Larger
Convolutional Language Models"), order 2, as Zoology's `Hyena` mixer (zoology/mixers/
hyena.py at d88d6f5, the row its MQAR table names "hyena"):

    x1, x2, v = short_conv(W_in u)          (3 D channels, a depthwise 3-tap causal conv)
    y = W_out (x2 * (h * (x1 * v) + bias * (x1 * v)))

with h a long causal convolution per channel whose filter is implicit: an FFN of a
position embedding (t, cos, sin; emb_dim 3), width filter_order 64, three Sin activations
sharing one trained frequency vector (Zoology appends one `Sin` module three times),
times an exponential decay window exp(-t |delta|) with fixed deltas spread from
log(1e-2)/1.5 to log(1e-2)/0.3 over the channels; computed by FFT over 2L. The
position embedding is trained (Zoology registers it as a parameter; its lr_pos_emb and
the filter's lr / wd attributes are never read by Zoology's trainer, so everything trains
at the run's lr and weight decay, as here); the decay deltas are fixed (lr 0: a buffer).
Initialisation as PyTorch's Linear and Conv1d defaults (the filter's scale depends on it),
the filter's bias N(0, 1). One head (Zoology's num_heads=1: the filter has a channel per
model channel); the config's num_heads does not apply. The filter is defined up to the
builder's max_len (t = linspace(0, 1, max_len)); shorter inputs use its first L taps.

Not Zoology's: padded positions are zeroed before both convolutions (they reach no real
position); causal=False (LRA) gives the FFN a second output block, a filter over the
future read as S4D's bidirectional kernel (lags 0..L-1 and -L..-1 of one 2L-long kernel);
Zoology's bidirectional flag reaches no code (its Filter drops k_rev). short_filter_order=0
builds it without the short convolution (a benchmark scaffold's shared one instead).
Decoding: "recompute" (the prefix re-run per token: a long convolution has no small state).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models import layers, registry

FILTER_ORDER = 64
SHORT_FILTER = 3
EMB_DIM = 3  # t, cos, sin: Zoology's Filter default (one band)
FAST_DECAY_PCT, SLOW_DECAY_PCT, TARGET = 0.3, 1.5, 1e-2  # ExponentialModulation's


def torch_uniform(fan_in: int) -> layers.Initializer:
    """PyTorch's Linear / Conv1d default for weights and biases: U(-1/sqrt(fan_in), ..)."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)
    return init


def position_embedding(seq_len: int) -> np.ndarray:
    """Zoology's PositionalEmbedding(emb_dim 3, seq_len): (L, 3) = [t, cos, sin] with t
    = linspace(0, 1, L) and one band f = 1e-4 at w = 2 pi l / L."""
    t = np.linspace(0, 1, seq_len)[:, None]
    w = 2 * math.pi * np.arange(seq_len)[:, None] / seq_len
    f = np.linspace(1e-4, (EMB_DIM - 1) // 2 - 1, (EMB_DIM - 1) // 2)[None]
    z = np.exp(-1j * f * w)
    return np.concatenate([t, z.real, z.imag], axis=-1).astype(np.float32)


def decay_deltas(channels: int) -> np.ndarray:
    max_decay = math.log(TARGET) / FAST_DECAY_PCT
    min_decay = math.log(TARGET) / SLOW_DECAY_PCT
    return np.linspace(min_decay, max_decay, channels).astype(np.float32)


def causal_depthwise(x_BxLxC: jax.Array, w_CxW: jax.Array, b_C: jax.Array) -> jax.Array:
    """PyTorch's Conv1d(groups=C, padding=W-1) cut to the first L outputs: w[:, -1]
    weighs the current position."""
    taps, length = w_CxW.shape[1], x_BxLxC.shape[1]
    padded = jnp.pad(x_BxLxC, ((0, 0), (taps - 1, 0), (0, 0)))
    return b_C + sum(w_CxW[:, i] * padded[:, i:i + length] for i in range(taps))


class Hyena(nnx.Module):
    """Zoology's Hyena (module docstring)."""

    def __init__(self, *, dim: int, max_len: int, causal: bool, filter_order: int,
                 short_filter_order: int, rngs: nnx.Rngs):
        if filter_order < 1 or short_filter_order < 0 or max_len < 1:
            raise ValueError(f"filter_order ({filter_order}) must be positive, "
                             f"short_filter_order ({short_filter_order}) >= 0")
        self.dim, self.max_len, self.causal = dim, max_len, causal
        self.short_filter_order = short_filter_order
        self.in_proj = layers.dense(dim, 3 * dim, ("embed", "mlp"), rngs=rngs,
                                    kernel_init=torch_uniform(dim), bias_init=torch_uniform(dim))
        self.out_proj = layers.dense(dim, dim, ("mlp", "embed"), rngs=rngs,
                                     kernel_init=torch_uniform(dim), bias_init=torch_uniform(dim))
        if short_filter_order:
            init = torch_uniform(short_filter_order)
            self.short_w = layers.param(init, ("mlp", None), (3 * dim, short_filter_order),
                                        rngs=rngs)
            self.short_b = layers.param(init, ("mlp",), (3 * dim,), rngs=rngs)
        self.z = nnx.Param(jnp.asarray(position_embedding(max_len)))  # trained (Zoology)
        self.deltas = nnx.Variable(jnp.asarray(decay_deltas(dim)))  # fixed (lr 0)
        mlp = lambda i, o, bias=True: layers.dense(  # noqa: E731
            i, o, (None, None), use_bias=bias, rngs=rngs, kernel_init=torch_uniform(i),
            bias_init=torch_uniform(i))
        self.filter_in = mlp(EMB_DIM, filter_order)
        self.filter_hidden = nnx.List([mlp(filter_order, filter_order) for _ in range(2)])
        directions = 1 if causal else 2
        self.filter_out = mlp(filter_order, directions * dim, bias=False)
        self.freq = nnx.Param(jnp.ones((filter_order,), jnp.float32))  # Sin(w=1), shared
        self.bias = nnx.Param(jax.random.normal(rngs.params(), (dim,), jnp.float32))

    def filters(self, length: int) -> jax.Array:
        """The implicit filters, (1 or 2) x L x D: the FFN of z, times the decay window."""
        z_LxE = self.z[...][:length].astype(jnp.float32)
        t_Lx1 = jnp.linspace(0.0, 1.0, self.max_len)[:length, None]
        sin = lambda h: jnp.sin(self.freq[...] * h)  # noqa: E731
        h = sin(self.filter_in(z_LxE))
        for layer in self.filter_hidden:
            h = sin(layer(h))
        h_LxCD = self.filter_out(h).astype(jnp.float32)
        h_CxLxD = h_LxCD.reshape(length, -1, self.dim).transpose(1, 0, 2)
        return h_CxLxD * jnp.exp(-t_Lx1 * jnp.abs(self.deltas[...]))[None]

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        del deterministic  # Zoology's dropouts are 0
        length = x_BxLxD.shape[1]
        if length > self.max_len:
            raise ValueError(f"hyena's filter is defined up to max_len={self.max_len}; the "
                             f"input has {length} positions")
        real_BxLx1 = (jnp.ones(x_BxLxD.shape[:2] + (1,), jnp.bool_) if padding_mask is None
                      else padding_mask.astype(jnp.bool_)[..., None])
        u = jnp.where(real_BxLx1, self.in_proj(x_BxLxD).astype(jnp.float32), 0.0)
        if self.short_filter_order:
            u = causal_depthwise(u, self.short_w[...], self.short_b[...])
        x1, x2, v = jnp.split(u, 3, axis=-1)
        v = jnp.where(real_BxLx1, v * x1, 0.0)
        h_CxLxD = self.filters(length)
        # One kernel of length 2L: lags 0..L-1, and (bidirectional) the second filter
        # flipped on lags -L..-1; an FFT of 2L never wraps.
        k_DxT = h_CxLxD[0].T if self.causal else jnp.concatenate(
            [h_CxLxD[0].T, h_CxLxD[1, ::-1].T], axis=-1)
        size = 2 * length
        y = jnp.fft.irfft(jnp.fft.rfft(v, n=size, axis=1)
                          * jnp.fft.rfft(k_DxT, n=size, axis=-1).T[None], n=size,
                          axis=1)[:, :length]
        y = (y + v * self.bias[...]) * x2
        return self.out_proj(y.astype(x_BxLxD.dtype))


@registry.register("hyena", capabilities=registry.Capabilities(
    description="Hyena (order 2): short conv, gates, an implicit long convolution (FFN of "
                "positions times a decay window) by FFT (Poli et al. 2023; Zoology's mixer)",
    causal=True, decode="recompute", padding=True, variable_length=True,
    pos_emb="none", test_hparams={"filter_order": 8},
    short_conv_hparam="short_filter_order",
    rotary_refusal="no products of queries and keys: a gated long convolution"))
def build_hyena(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
                filter_order: int = FILTER_ORDER, short_filter_order: int = SHORT_FILTER
                ) -> Hyena:
    """Zoology's Hyena defaults (filter_order 64, short filter 3, one head); num_heads
    does not apply (module docstring)."""
    del num_heads
    return Hyena(dim=dim, max_len=max_len, causal=causal, filter_order=filter_order,
                 short_filter_order=short_filter_order, rngs=rngs)

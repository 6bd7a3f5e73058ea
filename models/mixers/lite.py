"""Lite Transformer's Long-Short Range Attention (Wu et al. 2020): the `lite` mixer.

LSRA splits the channels in two and runs two specialised branches side by side:

    x = [x_a ; x_c]                       dim // 2 and dim - dim // 2 channels
    y_a = MultiHeadAttention(x_a)         global context (its own q/k/v/out at dim // 2)
    y_c = W_out conv(GLU(W_in x_c))       local context
    y = [y_a ; y_c]                       the block's feed-forward mixes the halves

The convolution (Wu et al. 2019, "Pay Less Attention") is depthwise with kernel_size
taps, one kernel per conv head shared by its dim / (2 conv_heads) channels, softmax-
normalised over the taps, with DropConnect on the normalised kernel (weight_dropout):
  lightweight: the kernel is a learned [conv_heads, kernel_size] parameter;
  dynamic:     the kernel of position i is predicted from that position's GLU output.
Non-causal taps cover i - K//2 .. i + (K-1) - K//2 (centred for odd K, as the paper's
encoder); causal=True pads on the left only, taps i-K+1 .. i (the paper's decoder).
Padding: the GLU output is zeroed at padded positions right before the convolution,
so a real position near the end sees zeros there, exactly as at the sequence border
(the reference code zeroes before W_in, whose bias then leaks into real positions).

"Flattened" feed-forward: the paper drops the FFN bottleneck (ffn dim = model dim,
e.g. embed 496 / ffn 496). The FFN is the encoder's block MLP, so reproduce it with
`--config.mlp_dim=<emb_dim>` (configs/presets.py notes this beside the preset).
The paper varies kernel_size per layer (3, 7, 15, 31, 31, ...); a mixer does not know
its layer index, so one size is used in every layer: 31, the size of most layers.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import decoding, layers, registry
from models.attention.dense import MultiHeadAttention

CONVS = ("lightweight", "dynamic")


def conv_padding(kernel_size: int, causal: bool) -> tuple[int, int]:
    """(left, right) zero padding of the sequence for a 'same'-length convolution."""
    left = kernel_size - 1 if causal else kernel_size // 2
    return left, kernel_size - 1 - left


def _lightweight_init(key, shape, dtype=jnp.float32):
    # torch xavier_uniform_ on fairseq's (heads, 1, K) weight: fan_in K, fan_out heads*K.
    heads, taps = shape
    bound = math.sqrt(6.0 / (taps + heads * taps))
    return jax.random.uniform(key, shape, dtype, -bound, bound)


class LongShortRangeAttention(nnx.Module):
    """Attention on the first channel half, lightweight/dynamic convolution on the second."""

    def __init__(self, *, dim: int, num_heads: int, causal: bool, kernel_size: int,
                 conv: str, glu: bool, conv_heads: int, attention_dropout: float,
                 weight_dropout: float, rotary: bool = False, rngs: nnx.Rngs):
        if conv not in CONVS:
            raise ValueError(f"lite: unknown conv {conv!r}; valid: {', '.join(CONVS)}")
        if kernel_size < 1:
            raise ValueError(f"lite: kernel_size must be >= 1, got {kernel_size}")
        self.attn_dim = dim // 2
        conv_dim = dim - self.attn_dim
        if conv_heads < 1 or conv_dim % conv_heads:
            raise ValueError(f"lite: conv_heads ({conv_heads}) must divide the conv branch "
                             f"width dim - dim // 2 = {conv_dim}")
        self.causal = causal
        self.kernel_size = kernel_size
        self.conv = conv
        self.glu = glu
        self.conv_heads = conv_heads
        # rotary turns the attention branch's q, k; the convolution is relative already.
        self.attention = MultiHeadAttention(dim=self.attn_dim, num_heads=num_heads,
                                            causal=causal, attention_dropout=attention_dropout,
                                            rotary=rotary, rngs=rngs)
        self.conv_in = layers.dense(conv_dim, 2 * conv_dim if glu else conv_dim,
                                    ("embed", "mlp"), rngs=rngs)
        if conv == "lightweight":
            self.conv_weight = layers.param(_lightweight_init, ("heads", None),
                                            (conv_heads, kernel_size), rngs=rngs)
        else:
            self.kernel_proj = layers.dense(conv_dim, conv_heads * kernel_size,
                                            ("embed", None), use_bias=False, rngs=rngs)
        self.weight_dropout = nnx.Dropout(weight_dropout, rngs=rngs)
        self.conv_out = layers.dense(conv_dim, conv_dim, ("mlp", "embed"), rngs=rngs)

    def convolve(self, h_BxLxC: jax.Array, deterministic: bool) -> jax.Array:
        """Depthwise convolution with softmax-normalised per-head kernels."""
        batch, seq_len, channels = h_BxLxC.shape
        heads, taps = self.conv_heads, self.kernel_size
        left, right = conv_padding(taps, self.causal)
        if self.conv == "lightweight":
            w_HxK = self.weight_dropout(jax.nn.softmax(self.conv_weight[...], axis=-1),
                                        deterministic=deterministic)
            # Channel c belongs to head c // (C / H), as in fairseq's view(.., H, R, K).
            w_Kx1xC = jnp.repeat(w_HxK, channels // heads, axis=0).T[:, None, :]
            return jax.lax.conv_general_dilated(
                h_BxLxC, w_Kx1xC, window_strides=(1,), padding=[(left, right)],
                dimension_numbers=("NWC", "WIO", "NWC"), feature_group_count=channels)
        logits_BxLxHxK = self.kernel_proj(h_BxLxC).reshape(batch, seq_len, heads, taps)
        w_BxLxHxK = self.weight_dropout(jax.nn.softmax(logits_BxLxHxK, axis=-1),
                                        deterministic=deterministic)
        padded_BxPxHxR = jnp.pad(h_BxLxC, ((0, 0), (left, right), (0, 0))).reshape(
            batch, seq_len + taps - 1, heads, channels // heads)
        # A sum over the K taps (static, small): memory O(L C), not the O(L K C) unfold.
        y_BxLxHxR = sum(w_BxLxHxK[..., k, None] * padded_BxPxHxR[:, k:k + seq_len]
                        for k in range(taps))
        return y_BxLxHxR.reshape(batch, seq_len, channels)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        xa_BxLxA, xc_BxLxC = x_BxLxD[..., :self.attn_dim], x_BxLxD[..., self.attn_dim:]
        ya_BxLxA = self.attention(xa_BxLxA, padding_mask=padding_mask,
                                  deterministic=deterministic)
        h_BxLxC = self.conv_in(xc_BxLxC)
        if self.glu:
            h_BxLxC = jax.nn.glu(h_BxLxC, axis=-1)
        if padding_mask is not None:
            h_BxLxC = jnp.where(padding_mask.astype(jnp.bool_)[..., None], h_BxLxC, 0.0)
        yc_BxLxC = self.conv_out(self.convolve(h_BxLxC, deterministic))
        return jnp.concatenate([ya_BxLxA, yc_BxLxC], axis=-1)

    def _glu_in(self, xc_BxLxC: jax.Array) -> jax.Array:
        h_BxLxC = self.conv_in(xc_BxLxC)
        return jax.nn.glu(h_BxLxC, axis=-1) if self.glu else h_BxLxC

    # Decoding, form conv_kv (models.decoding): the attention half's kv cache and the last
    # kernel_size - 1 convolution inputs (oldest first), so a token costs O(M) for the
    # attention and O(kernel_size) for the convolution.
    def init_cache(self, batch: int, max_len: int) -> decoding.Cache:
        channels = self.conv_out.in_features
        return {"pos": jnp.zeros((batch,), jnp.int32),
                "attention": decoding.kv_init(self.attention, batch, max_len),
                "taps": jnp.zeros((batch, self.kernel_size - 1, channels), jnp.float32)}

    def prefill(self, cache, x_BxLxD, padding_mask):
        y_BxLxD = self(x_BxLxD, padding_mask=padding_mask, deterministic=True)
        batch, length, _ = x_BxLxD.shape
        pos_B = decoding.lengths_of(padding_mask, batch, length)
        xa_BxLxA, xc_BxLxC = x_BxLxD[..., :self.attn_dim], x_BxLxD[..., self.attn_dim:]
        h_BxLxC = self._glu_in(xc_BxLxC)
        # Row b's taps: its prompt positions pos_b - K + 1 .. pos_b - 1 (0 before the start).
        index_BxT = pos_B[:, None] - (self.kernel_size - 1) + jnp.arange(
            self.kernel_size - 1)[None]
        taps_BxTxC = jnp.take_along_axis(h_BxLxC, jnp.clip(index_BxT, 0, length - 1)[..., None],
                                         axis=1)
        taps_BxTxC = jnp.where((index_BxT >= 0)[..., None], taps_BxTxC, 0.0)
        return y_BxLxD, {"pos": pos_B,
                         "attention": decoding.kv_fill(self.attention, cache["attention"],
                                                       xa_BxLxA, pos_B),
                         "taps": taps_BxTxC.astype(jnp.float32)}

    def step(self, cache, x_BxD):
        xa_BxA, xc_BxC = x_BxD[..., :self.attn_dim], x_BxD[..., self.attn_dim:]
        ya_BxA, attention = decoding.kv_step(self.attention, cache["attention"], xa_BxA)
        h_BxC = self._glu_in(xc_BxC[:, None])[:, 0]
        window_BxKxC = jnp.concatenate([cache["taps"].astype(h_BxC.dtype), h_BxC[:, None]],
                                       axis=1)
        # The causal convolution's last position sees exactly the window's K taps.
        conv_BxC = self.convolve(window_BxKxC, deterministic=True)[:, -1]
        yc_BxC = self.conv_out(conv_BxC)
        return jnp.concatenate([ya_BxA, yc_BxC], axis=-1), {
            "pos": cache["pos"] + 1, "attention": attention,
            "taps": window_BxKxC[:, 1:].astype(jnp.float32)}


@registry.register("lite", capabilities=registry.Capabilities(
    description="Lite Transformer LSRA: attention on half the channels, conv on the other",
    causal=True, decode="conv_kv", padding=True, variable_length=True,
    test_hparams={"kernel_size": 3, "conv": "dynamic"}, rotary=True))
def build_lite(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
               rotary: bool = False, kernel_size: int = 31, conv: str = "dynamic",
               glu: bool = True,
               conv_heads: int | None = None, attention_dropout: float = 0.1,
               weight_dropout: float = 0.1) -> LongShortRangeAttention:
    """conv_heads defaults to num_heads (the paper's configs use 4 and 4)."""
    del max_len  # any length works
    return LongShortRangeAttention(
        dim=dim, num_heads=num_heads, causal=causal, kernel_size=kernel_size, conv=conv,
        glu=glu, conv_heads=num_heads if conv_heads is None else conv_heads,
        attention_dropout=attention_dropout, weight_dropout=weight_dropout, rotary=rotary,
        rngs=rngs)

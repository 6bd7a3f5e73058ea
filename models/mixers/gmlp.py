"""gMLP (Liu et al. 2021, "Pay Attention to MLPs"): the `gmlp` token mixer.

The gMLP block, minus its own LayerNorm and shortcut (the pre-LN block provides both):

    Z = GELU(X U)                       U: dim -> ffn_dim
    Z1, Z2 = split(Z)                   two halves of ffn_dim / 2 channels
    s(Z) = Z1 * (W LN(Z2) + b)          W: [L, L] along the sequence, b: [L]
    Y = s(Z) V                          V: ffn_dim / 2 -> dim

W starts near zero (uniform +-init_eps / max_len) and b at one, so every layer
starts close to a plain channel MLP (the paper's recipe for stable training).

Deviation from the paper: a gMLP layer is only this block, while here it stands in
for attention inside the pre-LN block, which adds its channel MLP after it.

Length: W is [max_len, max_len]. An input of L < max_len uses W[:L, :L] and b[:L],
which is exactly the max_len computation on the input zero-padded at the end with
the padded columns masked (for causal=True the prefix of a longer sequence gives
the same outputs, so nothing changes). L > max_len is refused.
Padding: padded positions are zeroed after the LayerNorm (the columns of W they
would feed), so they never reach a real position. Causal: W is masked to its lower
triangle (position i mixes positions j <= i).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models import decoding, layers, registry
from models.attention.lowrank import check_length


def symmetric_uniform(bound: float) -> layers.Initializer:
    """U(-bound, bound)."""
    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)
    return init


class SpatialGatingMLP(nnx.Module):
    """Channel projection in, spatial gating unit, channel projection out."""

    def __init__(self, *, dim: int, max_len: int, causal: bool, ffn_dim: int,
                 init_eps: float, rngs: nnx.Rngs):
        if ffn_dim <= 0 or ffn_dim % 2:
            raise ValueError(f"gmlp: ffn_dim must be a positive even number, got {ffn_dim}")
        half = ffn_dim // 2
        self.max_len = max_len
        self.causal = causal
        self.proj_in = layers.dense(dim, ffn_dim, ("embed", "mlp"), rngs=rngs)
        self.gate_norm = nnx.LayerNorm(half, epsilon=1e-6,
                                       scale_init=layers.named(layers.ones, ("mlp",)),
                                       bias_init=layers.named(layers.zeros, ("mlp",)),
                                       rngs=rngs)
        self.spatial_weight = layers.param(symmetric_uniform(init_eps / max_len),
                                           (None, None), (max_len, max_len), rngs=rngs)
        self.spatial_bias = layers.param(layers.ones, (None,), (max_len,), rngs=rngs)
        self.proj_out = layers.dense(half, dim, ("mlp", "embed"), rngs=rngs)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        del deterministic  # no dropout inside the block
        seq_len = x_BxLxD.shape[1]
        check_length("gmlp", seq_len, self.max_len)
        z_BxLxF = jax.nn.gelu(self.proj_in(x_BxLxD))
        u_BxLxH, v_BxLxH = jnp.split(z_BxLxF, 2, axis=-1)
        v_BxLxH = self.gate_norm(v_BxLxH)
        if padding_mask is not None:
            v_BxLxH = jnp.where(padding_mask.astype(jnp.bool_)[..., None], v_BxLxH, 0.0)
        w_LxL = self.spatial_weight[:seq_len, :seq_len]
        if self.causal:
            w_LxL = jnp.tril(w_LxL)
        gate_BxLxH = (jnp.einsum("ij,bjh->bih", w_LxL, v_BxLxH)
                      + self.spatial_bias[:seq_len][None, :, None])
        return self.proj_out(u_BxLxH * gate_BxLxH)

    # Decoding, form gate_cache (models.decoding): the gate inputs LN(Z2) of every earlier
    # position; token i gates with row i of W (j <= i): O(M ffn_dim / 2) per token.
    def init_cache(self, batch: int, max_len: int) -> decoding.Cache:
        half = self.proj_out.in_features
        return {"pos": jnp.zeros((batch,), jnp.int32),
                "v": jnp.zeros((batch, self.max_len, half), jnp.float32)}

    def prefill(self, cache, x_BxLxD, padding_mask):
        y_BxLxD = self(x_BxLxD, padding_mask=padding_mask)
        batch, length, _ = x_BxLxD.shape
        v_BxLxH = self.gate_norm(jnp.split(jax.nn.gelu(self.proj_in(x_BxLxD)), 2, axis=-1)[1])
        v_BxMxH = jax.lax.dynamic_update_slice(cache["v"], v_BxLxH.astype(jnp.float32),
                                               (0, 0, 0))
        return y_BxLxD, {"pos": decoding.lengths_of(padding_mask, batch, length),
                         "v": v_BxMxH}

    def step(self, cache, x_BxD):
        pos_B = cache["pos"]
        u_BxH, v_BxH = jnp.split(jax.nn.gelu(self.proj_in(x_BxD)), 2, axis=-1)
        v_BxMxH = decoding.write_row(cache["v"], pos_B, self.gate_norm(v_BxH))
        w_BxM = self.spatial_weight[...][pos_B]
        w_BxM = jnp.where(jnp.arange(self.max_len)[None] <= pos_B[:, None], w_BxM, 0.0)
        gate_BxH = (jnp.einsum("bj,bjh->bh", w_BxM, v_BxMxH.astype(w_BxM.dtype))
                    + self.spatial_bias[...][pos_B][:, None])
        return self.proj_out(u_BxH * gate_BxH.astype(u_BxH.dtype)), {"pos": pos_B + 1,
                                                                     "v": v_BxMxH}


@registry.register("gmlp", capabilities=registry.Capabilities(
    description="gMLP: spatial gating unit, one channel half gated by an L x L projection",
    causal=True, decode="gate_cache", padding=True, variable_length=True,
    test_hparams={"ffn_dim": 64, "init_eps": 0.5},
    rotary_refusal="it mixes tokens by a learned position-by-position matrix and forms no "
    "query-key products to rotate"))
def build_gmlp(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
               ffn_dim: int | None = None, init_eps: float = 1e-3) -> SpatialGatingMLP:
    """ffn_dim defaults to 6 * dim (every gMLP model in the paper)."""
    del num_heads  # no heads
    return SpatialGatingMLP(dim=dim, max_len=max_len, causal=causal,
                            ffn_dim=6 * dim if ffn_dim is None else ffn_dim,
                            init_eps=init_eps, rngs=rngs)

"""MLP-Mixer (Tolstikhin et al. 2021): the `mixer` token mixer.

The token-mixing MLP, shared by all channels, applied along the sequence:

    Y[:, c] = W2 GELU(W1 X[:, c] + b1) + b2     W1: max_len -> token_dim, W2: back

A Mixer layer is X + token_mix(LN(X)), then X + channel_mlp(LN(X)): exactly the
pre-LN block with this module as its mixer and the block's MLP as the channel MLP.

Length: the weights have a max_len axis. An input of L < max_len is treated as
zero-padded to max_len (W1[:L], W2[:, :L], b2[:L]); L > max_len is refused.
Padding: padded positions are zeroed before W1, so they contribute nothing (the
same as a shorter input). Not causal: every hidden unit sees every position.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers, registry
from models.attention.lowrank import check_length


class TokenMixingMLP(nnx.Module):
    """Per-channel MLP across positions (hidden width token_dim)."""

    def __init__(self, *, max_len: int, token_dim: int, rngs: nnx.Rngs):
        if token_dim <= 0:
            raise ValueError(f"mixer: token_dim must be positive, got {token_dim}")
        self.max_len = max_len
        lecun = jax.nn.initializers.lecun_normal()  # flax Dense's default, as in the paper code
        self.w1 = layers.param(lecun, (None, "mlp"), (max_len, token_dim), rngs=rngs)
        self.b1 = layers.param(layers.zeros, ("mlp",), (token_dim,), rngs=rngs)
        self.w2 = layers.param(lecun, ("mlp", None), (token_dim, max_len), rngs=rngs)
        self.b2 = layers.param(layers.zeros, (None,), (max_len,), rngs=rngs)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        del deterministic  # no dropout in the token MLP
        seq_len = x_BxLxD.shape[1]
        check_length("mixer", seq_len, self.max_len)
        if padding_mask is not None:
            x_BxLxD = jnp.where(padding_mask.astype(jnp.bool_)[..., None], x_BxLxD, 0.0)
        h_BxTxD = jax.nn.gelu(jnp.einsum("bld,lt->btd", x_BxLxD, self.w1[:seq_len])
                              + self.b1[...][None, :, None])
        return (jnp.einsum("btd,tl->bld", h_BxTxD, self.w2[:, :seq_len])
                + self.b2[:seq_len][None, :, None])


@registry.register("mixer", capabilities=registry.Capabilities(
    description="MLP-Mixer: a token-mixing MLP across positions (length-fixed weights)",
    causal=False, padding=True, variable_length=True,
    test_hparams={"token_dim": 8},
    rotary_refusal="it mixes tokens by an MLP over fixed positions and forms no query-key "
    "products to rotate"))
def build_mixer(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
                token_dim: int = 256) -> TokenMixingMLP:
    """token_dim defaults to Mixer-S's D_S = 256."""
    del dim, num_heads, causal  # channel-independent; the registry refuses causal=True
    return TokenMixingMLP(max_len=max_len, token_dim=token_dim, rngs=rngs)

"""Residual blocks around a token mixer.

`EncoderBlock` is LRA's pre-LayerNorm Transformer block with the attention
replaced by any registered token mixer.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
from flax import nnx

from models import layers, registry


class MlpBlock(nnx.Module):
    """Dense(dim -> mlp_dim) -> GELU -> Dropout -> Dense(mlp_dim -> dim) -> Dropout."""

    def __init__(self, *, dim: int, mlp_dim: int, dropout_rate: float = 0.1,
                 rngs: nnx.Rngs):
        bias_init = layers.normal(1e-6)  # LRA's MlpBlock
        self.fc1 = layers.dense(dim, mlp_dim, ("embed", "mlp"), bias_init=bias_init, rngs=rngs)
        self.fc2 = layers.dense(mlp_dim, dim, ("mlp", "embed"), bias_init=bias_init, rngs=rngs)
        self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)

    def __call__(self, x_BxLxD: jax.Array, *, deterministic: bool) -> jax.Array:
        h_BxLxF = self.dropout(jax.nn.gelu(self.fc1(x_BxLxD)), deterministic=deterministic)
        return self.dropout(self.fc2(h_BxLxF), deterministic=deterministic)


class EncoderBlock(nnx.Module):
    """x + Dropout(mixer(LN(x))), then x + MLP(LN(x))."""

    def __init__(self, *, dim: int, num_heads: int, mlp_dim: int, max_len: int,
                 model: str = "transformer", model_hparams: Mapping[str, Any] | None = None,
                 causal: bool = False, dropout_rate: float = 0.1, rngs: nnx.Rngs):
        self.mixer_norm = layers.layer_norm(dim, rngs=rngs)
        self.carries_state = registry.capabilities(model).carries_state
        self.mixer = registry.build(model, dim=dim, num_heads=num_heads, max_len=max_len,
                                    causal=causal, rngs=rngs, **dict(model_hparams or {}))
        self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)
        self.mlp_norm = layers.layer_norm(dim, rngs=rngs)
        self.mlp = MlpBlock(dim=dim, mlp_dim=mlp_dim, dropout_rate=dropout_rate, rngs=rngs)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None, *,
                 deterministic: bool, carry: Any = None) -> Any:
        """Returns x, or (x, new_carry) when the mixer carries state between layers."""
        h_BxLxD = self.mixer_norm(x_BxLxD)
        if self.carries_state:
            y_BxLxD, carry = self.mixer(h_BxLxD, padding_mask=padding_mask,
                                        deterministic=deterministic, carry=carry)
        else:
            y_BxLxD = self.mixer(h_BxLxD, padding_mask=padding_mask,
                                 deterministic=deterministic)
        x_BxLxD = x_BxLxD + self.dropout(y_BxLxD, deterministic=deterministic)
        x_BxLxD = x_BxLxD + self.mlp(self.mlp_norm(x_BxLxD), deterministic=deterministic)
        return (x_BxLxD, carry) if self.carries_state else x_BxLxD

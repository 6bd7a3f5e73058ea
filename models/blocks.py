"""Residual blocks around a token mixer, and the `block` settings that choose them.

`EncoderBlock` is LRA's pre-LayerNorm Transformer block with the attention
replaced by any registered token mixer. Which block (and which stack, see
`models.stacks`) a model uses is data: a `block` dict, resolved by
`resolve_block(model, overrides)` from `BLOCK_DEFAULTS`, the variant's
`Capabilities.block` and the user's `config.block`. So a residual form (e.g. a
gated or reversible one) wraps any mixer and the classifier has no special cases.

Every block kind is built as

    kind(dim=, num_heads=, mlp_dim=, max_len=, model=, model_hparams=, causal=,
         dropout_rate=, block=resolved_block_dict, rngs=)

and called as `block(x_BxLxD, padding_mask, deterministic=..., carry=None)`,
returning x, or (x, new_carry) when `block.carries_state` (the mixer threads a
state between layers, e.g. Luna).
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
from flax import nnx

from models import layers, registry

# Every key `config.block` may set, with its default. A variant's Capabilities.block
# overrides these; the user's config.block overrides both.
BLOCK_DEFAULTS: dict[str, Any] = {
    "kind": "pre_ln",  # the residual form of one layer: a key of BLOCK_KINDS
    "stack": "sequential",  # how the layers are applied: a key of models.stacks.STACKS
    "ffn_chunks": 1,  # feed-forward applied over this many sequence chunks; 1 = at once
}


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
                 causal: bool = False, dropout_rate: float = 0.1,
                 block: Mapping[str, Any] | None = None, rngs: nnx.Rngs):
        del block  # pre_ln has no options of its own
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


# kind name -> block class (constructor and call as in the module docstring).
BLOCK_KINDS: dict[str, type[nnx.Module]] = {"pre_ln": EncoderBlock}


def resolve_block(model: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The block settings `model` runs with: defaults < variant's < overrides.

    Raises ValueError on an unknown key, kind or stack (listing the valid ones).
    """
    from models import stacks  # stacks imports this module

    implied = registry.capabilities(model).block or {}
    overrides = dict(overrides or {})
    for source, values in (("Capabilities.block of " + repr(model), implied),
                           ("config.block", overrides)):
        unknown = sorted(set(values) - set(BLOCK_DEFAULTS))
        if unknown:
            raise ValueError(f"unknown {source} key(s) {', '.join(map(repr, unknown))}; "
                             f"valid: {', '.join(sorted(BLOCK_DEFAULTS))}")
    resolved = {**BLOCK_DEFAULTS, **implied, **overrides}
    if resolved["kind"] not in BLOCK_KINDS:
        raise ValueError(f"unknown block kind {resolved['kind']!r}; "
                         f"valid: {', '.join(sorted(BLOCK_KINDS))}")
    if resolved["stack"] not in stacks.STACKS:
        raise ValueError(f"unknown block stack {resolved['stack']!r}; "
                         f"valid: {', '.join(sorted(stacks.STACKS))}")
    if int(resolved["ffn_chunks"]) < 1:
        raise ValueError(f"block ffn_chunks must be >= 1, got {resolved['ffn_chunks']}")
    return resolved

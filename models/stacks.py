"""How an encoder applies its layers: `block["stack"]` picks one of `STACKS`.

Every stack is built as

    stack(num_layers=, dim=, num_heads=, mlp_dim=, max_len=, model=, model_hparams=,
          causal=, dropout_rate=, block=resolved_block_dict, rngs=)

and called as `stack(x_BxLxD, padding_mask_BxL, deterministic=...) -> x_BxLxD`.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
from flax import nnx

from models.blocks import BLOCK_KINDS


class SequentialStack(nnx.Module):
    """num_layers blocks of `block["kind"]`, applied in order, each with its own weights."""

    def __init__(self, *, num_layers: int, block: Mapping[str, Any], rngs: nnx.Rngs,
                 **block_args: Any):
        kind = BLOCK_KINDS[block["kind"]]
        self.blocks = nnx.List([kind(block=dict(block), rngs=rngs, **block_args)
                                for _ in range(num_layers)])

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array, *,
                 deterministic: bool) -> jax.Array:
        carry = None  # a state-carrying mixer (Luna) starts from its own initial state
        for layer in self.blocks:
            if layer.carries_state:
                x_BxLxD, carry = layer(x_BxLxD, padding_mask, deterministic=deterministic,
                                       carry=carry)
            else:
                x_BxLxD = layer(x_BxLxD, padding_mask, deterministic=deterministic)
        return x_BxLxD


# stack name -> stack class (constructor and call as in the module docstring).
STACKS: dict[str, type[nnx.Module]] = {"sequential": SequentialStack}

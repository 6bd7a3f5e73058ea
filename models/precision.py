"""Mixed precision: parameters kept in `param_dtype`, computation in a compute dtype.

The model is run on a copy of itself whose floating parameters are cast to the compute
dtype (`compute_view`): embeddings, projections and mixers then compute in it, and the
cast is differentiable, so gradients, the optimiser's state and the parameters stay in
their own dtype (float32 by default), as Flax's examples and MaxText do with
`dtype`/`param_dtype`. What must not be rounded to bfloat16 is computed in float32 by the
modules themselves whatever the input dtype: softmax and its normaliser, LayerNorm
statistics (flax's), the linear family's denominators and prefix sums, FAVOR+'s
stabiliser, SSM/EMA states, losses and metrics (lra/training/objectives.py casts logits to
float32); and parameters marked `keep_float32` are not cast at all.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# Param metadata: the parameter is never cast to the compute dtype (nnx.Param(value,
# keep_float32=True)): the SSMs' A, B, C and steps, Mega's EMA, Mamba-2's and Gated
# DeltaNet's A_log / dt_bias / D (mamba_ssm keeps those in float32 too). Rounded to
# bfloat16 (3 significant digits), a decay's phase and modulus drift over L steps.
KEEP_FLOAT32 = "keep_float32"


def dtype_of(name: str) -> Any:
    """config.dtype / config.param_dtype -> a jnp dtype; ValueError naming the choices."""
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def _cast_variable(v: nnx.Variable, dtype: Any) -> nnx.Variable:
    x = v[...]
    if (not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype == dtype
            or v.get_metadata().get(KEEP_FLOAT32)):
        return v
    return v.replace(x.astype(dtype))


def cast_params(params: Any, dtype: Any) -> Any:
    """A state of parameters with every floating one in `dtype`, except those marked
    `keep_float32` (config.param_dtype at initialisation; the compute view)."""
    return jax.tree.map(lambda v: _cast_variable(v, dtype), params, is_leaf=_is_variable)


def compute_view(model: nnx.Module, dtype: Any) -> nnx.Module:
    """A copy of `model` whose parameters are cast to `dtype` (differentiably), except
    those marked `keep_float32`; the model itself when nothing changes. Run the forward
    pass on the view, then `sync_rngs(model, view)` so that dropout's counters advance in
    the model."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    if all(_cast_variable(v, dtype) is v for v in jax.tree.leaves(params, is_leaf=_is_variable)):
        return model
    view = nnx.merge(graphdef, cast_params(params, dtype), rest)
    for _, module in view.iter_modules():
        # nnx.Embed fixes its output dtype at construction (the table's): the view's
        # embeddings must come out in the compute dtype too. Modules whose dtype is None
        # follow their (cast) parameters and inputs.
        if isinstance(module, nnx.Embed):
            module.dtype = dtype
    return view


def sync_rngs(model: nnx.Module, view: nnx.Module) -> None:
    """Copies the view's RNG counters (advanced by dropout) back into the model."""
    if view is not model:
        nnx.update(model, nnx.state(view, nnx.RngState))

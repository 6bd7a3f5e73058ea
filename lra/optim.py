"""The optimiser LRA's configs describe: the `factors` learning-rate schedule and AdamW
with global-norm clipping, obeying the metadata models put on their own parameters
(`no_weight_decay`, `bounds`). `lra.train` builds both from the config."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from lra.errors import ConfigError


def learning_rate_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
    """LRA's `factors` string, e.g. 'constant * linear_warmup * rsqrt_decay'."""
    factors = [f.strip() for f in config.factors.split("*")]
    known = ("constant", "linear_warmup", "rsqrt_decay", "rsqrt_normalized_decay",
             "cosine_decay")
    for f in factors:
        if f not in known:
            raise ConfigError(f"config.factors: unknown factor {f!r}; known: {', '.join(known)}")
    warmup = max(1, config.warmup)
    cycle = config.steps_per_cycle or max(1, config.num_train_steps - config.warmup)

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        lr = jnp.float32(1.0)
        for f in factors:
            if f == "constant":
                lr *= config.learning_rate
            elif f == "linear_warmup":
                lr *= jnp.minimum(1.0, step / warmup)
            elif f == "rsqrt_decay":
                lr /= jnp.sqrt(jnp.maximum(step, warmup))
            elif f == "rsqrt_normalized_decay":
                lr *= jnp.sqrt(warmup) / jnp.sqrt(jnp.maximum(step, warmup))
            elif f == "cosine_decay":
                progress = jnp.maximum(0.0, (step - config.warmup) / cycle)
                lr *= jnp.maximum(0.0, 0.5 * (1.0 + jnp.cos(jnp.pi * (progress % 1.0))))
        return lr

    return schedule


# Param metadata the optimiser obeys; a model sets them on its own parameters, e.g.
# nnx.Param(value, no_weight_decay=True, bounds=(0.0, 1.0)) (adaptive_span's span).
NO_WEIGHT_DECAY = "no_weight_decay"  # True: AdamW's weight decay leaves the parameter alone
PARAM_BOUNDS = "bounds"  # (low, high): the parameter is clamped to it after every update


def _metadata(x: Any) -> dict:
    return x.get_metadata() if isinstance(x, nnx.Variable) else {}


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def weight_decay_mask(params: Any) -> Any:
    """True for the parameters AdamW decays: all but those marked `no_weight_decay`."""
    return jax.tree.map(lambda v: not _metadata(v).get(NO_WEIGHT_DECAY, False), params,
                        is_leaf=_is_variable)


def clamp_to_bounds() -> optax.GradientTransformation:
    """Changes the updates of parameters with `bounds` metadata so that
    optax.apply_updates leaves them in [low, high] (adaptive-span's `clamp_param` after
    each step); an update that stays inside is unchanged. Last in the chain."""

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("clamp_to_bounds needs the params")

        def project(p, u):
            bounds = _metadata(p).get(PARAM_BOUNDS)
            if bounds is None:
                return u
            lo, hi = bounds
            p_val = p[...]
            u_val = u[...] if isinstance(u, nnx.Variable) else u
            new = p_val + u_val
            u_val = jnp.where(new < lo, lo - p_val, jnp.where(new > hi, hi - p_val, u_val))
            return u.replace(u_val) if isinstance(u, nnx.Variable) else u_val

        return jax.tree.map(project, params, updates, is_leaf=_is_variable), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def _has_marks(params: Any) -> bool:
    """Whether any parameter asks for `bounds` or `no_weight_decay`."""
    leaves = jax.tree.leaves(params, is_leaf=_is_variable)
    return any(PARAM_BOUNDS in _metadata(v) or _metadata(v).get(NO_WEIGHT_DECAY, False)
               for v in leaves)


def make_optimizer(config: ml_collections.ConfigDict,
                   schedule: optax.Schedule) -> optax.GradientTransformation:
    """AdamW (weight decay on all parameters not marked `no_weight_decay`), after global
    norm clipping if configured; parameters with `bounds` are clamped after each step.

    Models without such marks get the plain chain, whose state has the layout of the
    checkpoints written before the marks existed (so those runs still resume); the
    choice is made from the parameters' metadata, which init and update both see."""
    def chain(adamw: optax.GradientTransformation, *after: optax.GradientTransformation):
        clip = ([optax.clip_by_global_norm(config.grad_clip_norm)]
                if config.grad_clip_norm > 0 else [])
        parts = clip + [adamw, *after]
        return parts[0] if len(parts) == 1 else optax.chain(*parts)

    adam = dict(b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps,
                weight_decay=config.weight_decay)
    plain = chain(optax.adamw(schedule, **adam))
    marked = chain(optax.adamw(schedule, mask=weight_decay_mask, **adam), clamp_to_bounds())

    def init(params):
        return (marked if _has_marks(params) else plain).init(params)

    def update(updates, state, params=None):
        return (marked if _has_marks(params) else plain).update(updates, state, params)

    return optax.GradientTransformation(init, update)

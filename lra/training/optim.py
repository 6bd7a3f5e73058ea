"""The optimiser LRA's configs describe: the `factors` learning-rate schedule and AdamW
with global-norm clipping, obeying the metadata models put on their own parameters
(`no_weight_decay`, `bounds`, `param_group`) and the config's parameter groups
(`config.param_groups`). `lra.train` builds both from the config.

Parameter groups: a model names the group of a parameter in its metadata
(`nnx.Param(value, param_group="ssm")`: the SSMs' A, B and log step), and the config says
what the group trains with, e.g. S4's LRA setting (lr 0.001 for the SSM, 0.01 elsewhere,
no weight decay on the SSM):
    config.param_groups.ssm.lr_scale = 0.1      # times the schedule's learning rate
    config.param_groups.ssm.weight_decay = 0.0  # instead of config.weight_decay
(`--config.param_groups.ssm.lr_scale=0.5` on the command line). A group is the originals'
optax.multi_transform label; here the one AdamW chain scales the group's updates and
decays it by its own rate, which is AdamW with that group's learning rate and weight
decay (optax.adamw decays by lr * wd * p, so the lr scale applies to the decay too, as in
a separate AdamW). The per-variant groups are presets (configs/presets.py PARAM_GROUPS).
A parameter with no group, or a group the config does not name, trains with
config.learning_rate and config.weight_decay; `no_weight_decay` wins over any rate.
In a hybrid stack (configs/hybrid.py) a parameter of layer i (path `.../stack/blocks/i/...`)
looks its group up in that layer's settings (the run's RunSpec, lra/runs/spec.py,
`layer_groups`: config.param_groups for config.model's layers, config.hybrid.param_groups
over the other mixer's presets for its layers), so an SSM layer's group applies to that
layer only; a single-mixer model has one set for every parameter, as before. This module
reads the layers from the spec it is given and imports nothing of configs/.

Weight-decay exemptions by name (`config.weight_decay_exempt`): a tuple of fnmatch
patterns over the parameters' paths, the keys from the model's root joined by "/" ("*"
also matches "/"), e.g. S4's `bias_weight_decay: False, normalization_weight_decay:
False` over its backbone:
    config.weight_decay_exempt = ("encoder/stack/*bias", "encoder/stack/*norm/scale")
A matching parameter is not decayed, as if marked `no_weight_decay` (whatever its group);
its learning rate is its group's. A pattern that matches no parameter is a ConfigError."""
from __future__ import annotations

import fnmatch
import math
import re
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from lra.errors import ConfigError

if TYPE_CHECKING:  # lra/runs/spec.py imports this module
    from lra.runs.spec import RunSpec


def learning_rate_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
    """LRA's `factors` string, e.g. 'constant * linear_warmup * rsqrt_decay'."""
    factors = [f.strip() for f in config.factors.split("*")]
    known = ("constant", "linear_warmup", "rsqrt_decay", "rsqrt_normalized_decay",
             "cosine_decay", "linear_decay")
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
            elif f == "linear_decay":
                # 1 until the warmup ends, then linearly to 0 at num_train_steps (fairseq's
                # linear_decay scheduler, Mega's LRA recipes).
                span = max(1, config.num_train_steps - config.warmup)
                lr *= jnp.clip((config.num_train_steps - step) / span, 0.0, 1.0)
        return lr

    return schedule


# Param metadata the optimiser obeys; a model sets them on its own parameters, e.g.
# nnx.Param(value, no_weight_decay=True, bounds=(0.0, 1.0)) (adaptive_span's span).
NO_WEIGHT_DECAY = "no_weight_decay"  # True: AdamW's weight decay leaves the parameter alone
PARAM_BOUNDS = "bounds"  # (low, high): the parameter is clamped to it after every update
PARAM_GROUP = "param_group"  # a name: config.param_groups.<name> sets its lr scale and decay
# What a config.param_groups entry may set, with the default of a group that omits it
# (None: config.weight_decay).
GROUP_SETTINGS = {"lr_scale": 1.0, "weight_decay": None}


def _metadata(x: Any) -> dict:
    return x.get_metadata() if isinstance(x, nnx.Variable) else {}


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def param_path(path: tuple) -> str:
    """A parameter's tree path as the keys joined by "/", e.g.
    'encoder/stack/blocks/0/mixer_norm/scale' (what weight_decay_exempt patterns match)."""
    def name(k):
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                return str(getattr(k, attr))
        return str(k)

    return "/".join(name(k) for k in path)


def param_paths(params: Any) -> list[str]:
    return [param_path(path) for path, _ in
            jax.tree_util.tree_leaves_with_path(params, is_leaf=_is_variable)]


def exempt_patterns(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """config.weight_decay_exempt as a tuple of patterns (empty without the field);
    ConfigError unless it is a tuple or list of non-empty strings."""
    patterns = config.get("weight_decay_exempt") or ()
    if (not isinstance(patterns, (tuple, list))
            or not all(isinstance(p, str) and p for p in patterns)):
        raise ConfigError(f"config.weight_decay_exempt={patterns!r} must be a tuple of "
                          "path patterns, e.g. ('encoder/stack/*bias',)")
    return tuple(patterns)


def _exempt(path: str, meta: dict, patterns: tuple[str, ...]) -> bool:
    return bool(meta.get(NO_WEIGHT_DECAY, False)
                or any(fnmatch.fnmatchcase(path, p) for p in patterns))


def weight_decay_mask(params: Any, patterns: tuple[str, ...] = ()) -> Any:
    """True for the parameters AdamW decays: all but those marked `no_weight_decay` and
    those whose path matches one of `patterns` (config.weight_decay_exempt)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, v: not _exempt(param_path(path), _metadata(v), patterns), params,
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


def group_settings(config: ml_collections.ConfigDict) -> dict[str, dict[str, float]]:
    """config.param_groups as {group: {"lr_scale": s, "weight_decay": wd}} with the
    defaults filled in; raises ConfigError for an unknown setting or a value out of
    range (lr_scale > 0, weight_decay >= 0, both finite)."""
    return settings_of(config.get("param_groups"), config.weight_decay)


def settings_of(groups: Any, weight_decay: float,
                where: str = "config.param_groups") -> dict[str, dict[str, float]]:
    """`group_settings` of one set of groups (config.param_groups, or one layer's in a
    hybrid stack: `where` names it in the error)."""
    groups = groups or {}
    groups = groups.to_dict() if isinstance(groups, ml_collections.ConfigDict) else groups
    if not isinstance(groups, dict):
        raise ConfigError(f"{where}={groups!r} must map group names to "
                          "settings, e.g. {'ssm': {'lr_scale': 0.1, 'weight_decay': 0.0}}")
    out = {}
    for name, settings in groups.items():
        if not isinstance(settings, dict):
            raise ConfigError(f"{where}.{name}={settings!r} must be settings, "
                              f"e.g. {{'lr_scale': 0.1, 'weight_decay': 0.0}}")
        unknown = sorted(set(settings) - set(GROUP_SETTINGS))
        if unknown:
            raise ConfigError(f"{where}.{name}: unknown setting(s) "
                              f"{', '.join(unknown)}; known: {', '.join(GROUP_SETTINGS)}")
        merged = {**GROUP_SETTINGS, **settings}
        if merged["weight_decay"] is None:
            merged["weight_decay"] = float(weight_decay)
        for key, value in merged.items():
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
                  and math.isfinite(value) and (value > 0 if key == "lr_scale" else value >= 0))
            if not ok:
                bound = "> 0" if key == "lr_scale" else ">= 0"
                raise ConfigError(f"{where}.{name}.{key}={value!r} must be "
                                  f"finite and {bound}")
        out[name] = {k: float(v) for k, v in merged.items()}
    return out


# A parameter of layer i of the stack: its path holds `stack/blocks/<i>/`.
_LAYER_PATH = re.compile(r"(?:^|/)stack/blocks/(\d+)/")


def layer_of(path: str) -> int | None:
    """The stack layer a parameter path belongs to (None outside the stack's layers)."""
    match = _LAYER_PATH.search(path)
    return int(match.group(1)) if match else None


def groups_of(params: Any) -> set[str]:
    """The `param_group` names the parameters carry."""
    return {_metadata(v)[PARAM_GROUP] for v in jax.tree.leaves(params, is_leaf=_is_variable)
            if _metadata(v).get(PARAM_GROUP) is not None}


def _per_parameter(params: Any, value_of) -> Any:
    return jax.tree.map(lambda v: value_of(_metadata(v)), params, is_leaf=_is_variable)


def _map_updates(fn, params: Any, updates: Any) -> Any:
    """fn(param path, param metadata, param value, update value) -> new update value,
    leaf by leaf, for updates given as nnx Variables or plain arrays."""
    def one(path, p, u):
        u_val = u[...] if isinstance(u, nnx.Variable) else u
        new = fn(param_path(path), _metadata(p), p[...] if isinstance(p, nnx.Variable) else p,
                 u_val)
        return u.replace(new) if isinstance(u, nnx.Variable) else new

    return jax.tree_util.tree_map_with_path(one, params, updates, is_leaf=_is_variable)


def _stateless(update) -> optax.GradientTransformation:
    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("this transformation needs the params")
        return update(updates, params), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def decay_rate(path: str, meta: dict, groups: dict[str, dict[str, float]],
               default: float, patterns: tuple[str, ...] = ()) -> float:
    """A parameter's weight decay: 0 if marked no_weight_decay or exempt by path, else its
    group's weight_decay, else `default`."""
    if _exempt(path, meta, patterns):
        return 0.0
    return groups.get(meta.get(PARAM_GROUP), {}).get("weight_decay", default)


def lr_scale(meta: dict, groups: dict[str, dict[str, float]]) -> float:
    """A parameter's learning-rate scale: its group's lr_scale, else 1."""
    return groups.get(meta.get(PARAM_GROUP), {}).get("lr_scale", 1.0)


def _groups_at(groups: dict[str, dict[str, float]],
               per_layer: list[dict[str, dict[str, float]]] | None, path: str
               ) -> dict[str, dict[str, float]]:
    """The group settings of the parameter at `path`: its layer's in a hybrid stack
    (the RunSpec's `layer_groups`), else `groups`."""
    layer = layer_of(path) if per_layer is not None else None
    return groups if layer is None or layer >= len(per_layer) else per_layer[layer]


def decay_by_group(groups: dict[str, dict[str, float]], default: float,
                   patterns: tuple[str, ...] = (),
                   per_layer: list[dict[str, dict[str, float]]] | None = None
                   ) -> optax.GradientTransformation:
    """optax.add_decayed_weights with each parameter's rate (`decay_rate`; in a hybrid
    stack with its own layer's groups, `per_layer`)."""
    def decay(path, meta, p, u):
        rate = decay_rate(path, meta, _groups_at(groups, per_layer, path), default, patterns)
        return u + rate * p if rate else u

    return _stateless(lambda updates, params: _map_updates(decay, params, updates))


def scale_by_group(groups: dict[str, dict[str, float]],
                   per_layer: list[dict[str, dict[str, float]]] | None = None
                   ) -> optax.GradientTransformation:
    """Multiplies a parameter's update by its group's lr_scale (after the learning rate:
    the group trains with lr_scale times the schedule); in a hybrid stack its own
    layer's group (`per_layer`)."""
    def scale(path, meta, p, u):
        s = lr_scale(meta, _groups_at(groups, per_layer, path))
        return u * s if s != 1.0 else u

    return _stateless(lambda updates, params: _map_updates(scale, params, updates))


def _check_layer_groups(config, groups, per_layer, names, params) -> None:
    """A hybrid's groups, each where it applies: a group that config.param_groups names
    must be carried by a parameter of config.model's layers or outside the stack, and one
    that a layer of another mixer names by a parameter of that layer (else ConfigError:
    a misspelt name would change nothing)."""
    carried: dict[Any, set[str]] = {}
    for path, v in jax.tree_util.tree_leaves_with_path(params, is_leaf=_is_variable):
        layer = layer_of(param_path(path))
        scope = (layer if layer is not None and layer < len(per_layer)
                 and per_layer[layer] != groups else "model")
        group = _metadata(v).get(PARAM_GROUP)
        carried.setdefault(scope, set()).update({group} if group is not None else set())
    for scope, named in [("model", groups)] + [
            (l, g) for l, g in enumerate(per_layer) if g != groups]:
        have = carried.get(scope, set())
        missing = sorted(set(named) - have)
        if missing:
            where = (f"config.param_groups names {', '.join(missing)}, which no parameter of "
                     f"{config.get('model', '?')!r}'s layers carries" if scope == "model" else
                     f"the param_groups of layer {scope} ({names[scope]}) name "
                     f"{', '.join(missing)}, which no parameter of that layer carries")
            raise ConfigError(f"{where} (their groups: {', '.join(sorted(have)) or 'none'}); "
                              "remove it or fix the name")


def _has_marks(params: Any) -> bool:
    """Whether any parameter asks for `bounds` or `no_weight_decay`."""
    leaves = jax.tree.leaves(params, is_leaf=_is_variable)
    return any(PARAM_BOUNDS in _metadata(v) or _metadata(v).get(NO_WEIGHT_DECAY, False)
               for v in leaves)


def _asks_for_layers(config: ml_collections.ConfigDict) -> bool:
    """Whether a config names a layer list (configs/hybrid.py's forms: a valid one sets
    config.layers, hybrid.mixer or hybrid.pattern); only to refuse one given without its
    RunSpec."""
    h = config.get("hybrid") or {}
    return bool(config.get("layers") or h.get("mixer") or h.get("pattern"))


def make_optimizer(config: ml_collections.ConfigDict, schedule: optax.Schedule,
                   spec: RunSpec | None = None) -> optax.GradientTransformation:
    """AdamW (weight decay on all parameters not marked `no_weight_decay`), after global
    norm clipping if configured; parameters with `bounds` are clamped after each step;
    parameters in a group named by config.param_groups train with its lr scale and
    weight decay (module docstring).

    Models without such marks get the plain chain, whose state has the layout of the
    checkpoints written before the marks existed (so those runs still resume), and models
    whose groups the config does not name get the chain of before the groups existed; the
    choice is made from the parameters' metadata, which init and update both see. A group
    the config names that no parameter carries is a ConfigError (a misspelt name would
    otherwise change nothing), and so is a config.weight_decay_exempt pattern that matches
    no parameter's path.

    `spec`: the config's RunSpec (lra/runs/spec.py resolve), whose group settings (per
    layer in a hybrid stack) it reads; a single-mixer config may leave it out (its groups
    are config.param_groups), a hybrid's may not (ValueError)."""
    if spec is None and _asks_for_layers(config):
        raise ValueError("make_optimizer: the config is a hybrid stack; pass its RunSpec "
                         "(spec=lra.runs.spec.resolve(config)) for its layers' groups")
    groups = group_settings(config) if spec is None else spec.groups
    per_layer = None if spec is None else spec.layer_groups  # None: a single-mixer model
    names = None if spec is None else spec.layer_names
    patterns = exempt_patterns(config)
    def chain(adamw: optax.GradientTransformation, *after: optax.GradientTransformation):
        clip = ([optax.clip_by_global_norm(config.grad_clip_norm)]
                if config.grad_clip_norm > 0 else [])
        parts = clip + [adamw, *after]
        return parts[0] if len(parts) == 1 else optax.chain(*parts)

    adam = dict(b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps,
                weight_decay=config.weight_decay)
    plain = chain(optax.adamw(schedule, **adam))
    marked = chain(optax.adamw(schedule, mask=lambda p: weight_decay_mask(p, patterns),
                               **adam), clamp_to_bounds())
    # optax.adamw's own chain (scale_by_adam, decay, learning rate) with per-parameter
    # decay and lr scale: equal to `marked` when every group has lr_scale 1 and the
    # config's weight decay (tests/test_train.py checks it).
    grouped = chain(optax.scale_by_adam(config.adam_b1, config.adam_b2, config.adam_eps),
                    decay_by_group(groups, config.weight_decay, patterns, per_layer),
                    optax.scale_by_learning_rate(schedule),
                    scale_by_group(groups, per_layer), clamp_to_bounds())
    any_groups = bool(groups) or any(per_layer or ())

    def pick(params):
        if per_layer is not None:
            _check_layer_groups(config, groups, per_layer, names, params)
        else:
            carried = groups_of(params)
            if groups and not set(groups) <= carried:
                missing = ", ".join(sorted(set(groups) - carried))
                raise ConfigError(
                    f"config.param_groups names {missing}, which no parameter of model "
                    f"{config.get('model', '?')!r} carries (its groups: "
                    f"{', '.join(sorted(carried)) or 'none'}); remove it or fix the name")
        if patterns:
            paths = param_paths(params)
            unmatched = [p for p in patterns
                         if not any(fnmatch.fnmatchcase(path, p) for path in paths)]
            if unmatched:
                raise ConfigError(
                    f"config.weight_decay_exempt: {', '.join(map(repr, unmatched))} matches "
                    f"no parameter of model {config.get('model', '?')!r} (paths such as "
                    f"{paths[0]!r}); remove it or fix the pattern")
        if any_groups:
            return grouped
        return marked if patterns or _has_marks(params) else plain

    def init(params):
        return pick(params).init(params)

    def update(updates, state, params=None):
        return pick(params).update(updates, state, params)

    return optax.GradientTransformation(init, update)

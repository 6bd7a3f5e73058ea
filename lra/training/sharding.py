"""Device mesh and shardings from the config: data parallel, FSDP, head (tensor) parallel.

The mesh has two axes, `data` and `model`, shaped by `config.mesh_shape` (one entry may
be -1: "the rest of the devices"). Parameters carry logical axis names (`embed`, `qkv`,
`heads`, `mlp`, `vocab`, `length`, `classes`; see models/layers.py); `config.sharding`
picks the rules that map them onto mesh axes:

  data        parameters and optimizer state replicated; batches split over `data`.
  fsdp        parameters and optimizer state split over `data` along their `embed`
              dimension (ZeRO-3 / FSDP); each device holds 1/|data| of them.
  heads       attention heads (`qkv`, `heads`) and the feed-forward hidden (`mlp`) split
              over `model` (Megatron-style tensor parallelism).
  fsdp+heads  both.

Batches are always split over `data` (and replicated over `model`). Activations get
the same logical treatment inside the model (`models.layers.constrain`), so XLA keeps
them batch-sharded instead of following the parameters' layout.
A dimension that the mesh axis does not divide stays replicated (a tiny vocabulary, a
10-way classifier), so every model runs under every strategy.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from lra.errors import ConfigError

MESH_AXES = ("data", "model")

# strategy -> (logical name, mesh axis) rules for parameters.
PARAM_RULES: dict[str, tuple[tuple[str, str], ...]] = {
    "data": (),
    "fsdp": (("embed", "data"),),
    "heads": (("qkv", "model"), ("heads", "model"), ("mlp", "model")),
}
PARAM_RULES["fsdp+heads"] = PARAM_RULES["fsdp"] + PARAM_RULES["heads"]
STRATEGIES = tuple(PARAM_RULES)

# Activation rules (models.layers.constrain): batch over data; heads over model when the
# parameters are split by head.
ACTIVATION_RULES: dict[str, tuple[tuple[str, str], ...]] = {
    "data": (("batch", "data"),),
    "fsdp": (("batch", "data"),),
    "heads": (("batch", "data"), ("act_heads", "model")),
    "fsdp+heads": (("batch", "data"), ("act_heads", "model")),
}


def mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
    """`shape` with its one -1 resolved so that the product is `num_devices`."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != len(MESH_AXES):
        raise ConfigError(f"config.mesh_shape={shape} must have {len(MESH_AXES)} entries "
                          f"({', '.join(MESH_AXES)})")
    if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        raise ConfigError(f"config.mesh_shape={shape}: use positive sizes and at most one -1")
    known = math.prod(s for s in shape if s != -1)
    if num_devices % known:
        raise ConfigError(f"config.mesh_shape={shape} needs a multiple of {known} devices; "
                          f"there are {num_devices}")
    resolved = tuple(num_devices // known if s == -1 else s for s in shape)
    if math.prod(resolved) != num_devices:
        raise ConfigError(f"config.mesh_shape={shape} uses {math.prod(resolved)} devices, but "
                          f"there are {num_devices}; use -1 for 'the rest'")
    return resolved


def make_mesh(config) -> Mesh:
    if config.sharding not in STRATEGIES:
        raise ConfigError(f"config.sharding={config.sharding!r}; choose one of {STRATEGIES}")
    shape = mesh_shape(config.mesh_shape, jax.device_count())
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def _logical_names(var: nnx.Variable) -> tuple[str | None, ...] | None:
    return var.get_metadata().get("out_sharding")


def _spec(names: Sequence[str | None] | None, shape: tuple[int, ...],
          rules: dict[str, str], mesh: Mesh) -> P:
    if not names:
        return P()
    used: set[str] = set()
    axes = []
    for name, size in zip(names, shape):
        axis = rules.get(name) if name else None
        # An axis can split one dimension only, and only one it divides.
        if axis is None or axis in used or size % mesh.shape[axis]:
            axes.append(None)
        else:
            axes.append(axis)
            used.add(axis)
    return P(*axes)


def state_shardings(tree: Any, strategy: str, mesh: Mesh) -> Any:
    """NamedShardings for a tree of nnx Variables / arrays (params, optimizer state, ...).

    Variables with logical names follow `strategy`'s rules; everything else (step
    counters, RNG state, optimizer counts) is replicated.
    """
    rules = dict(PARAM_RULES[strategy])

    def one(x):
        if isinstance(x, nnx.Variable):
            shape = np.shape(x.get_value())
            spec = _spec(_logical_names(x), shape, rules, mesh) if shape else P()
            return x.replace(NamedSharding(mesh, spec))
        return NamedSharding(mesh, P())

    return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P("data"))


def activation_rules(strategy: str) -> tuple[tuple[str, str], ...]:
    return ACTIVATION_RULES[strategy]


def validate(config, num_heads: int) -> None:
    """Strategy-specific checks that must fail before anything is written."""
    if config.sharding not in STRATEGIES:
        raise ConfigError(f"config.sharding={config.sharding!r}; choose one of {STRATEGIES}")
    shape = mesh_shape(config.mesh_shape, jax.device_count())
    data, model = shape
    if "heads" not in config.sharding and model != 1:
        raise ConfigError(f"config.mesh_shape={tuple(config.mesh_shape)} has a model axis of "
                          f"{model}, which only config.sharding='heads' or 'fsdp+heads' uses")
    if "heads" in config.sharding and num_heads % model:
        raise ConfigError(f"config.sharding={config.sharding!r} splits {num_heads} heads over "
                          f"a model axis of {model}: it must divide num_heads")
    for name in ("batch_size", "eval_batch_size"):
        value = config[name] or config.batch_size
        if value % data:
            raise ConfigError(f"config.{name}={value} is not divisible by the data axis "
                              f"({data} of mesh {shape})")

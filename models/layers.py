"""Parameter factories that attach logical axis names to every parameter.

Logical axis names (mapped to mesh axes by the training loop; plain metadata
without a mesh):

  vocab    rows of the token-embedding table
  length   rows of the learned position-embedding table
  embed    model width (emb_dim): the residual stream
  qkv      query/key/value width, heads x head_dim flattened head-major, so
           sharding it shards whole heads when num_heads divides the mesh axis
  heads    per-head parameters (e.g. a learned span per head)
  mlp      hidden width of the feed-forward block and of the classifier head
  classes  classifier outputs

Activations use the names `batch` and `act_heads` (`constrain`), mapped by the
rules of an enclosing `nnx.logical_axis_rules(...)` context onto the mesh of an
enclosing `jax.set_mesh(...)`; outside such contexts `constrain` does nothing.

Names are attached with `nnx.with_partitioning(..., eager_sharding=False)`:
the metadata is kept (`nnx.get_partition_spec` returns it) but Flax does not
try to shard at creation, which would need a mesh whose axes are these names.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import spmd as flax_spmd

AXIS_NAMES = ("vocab", "length", "embed", "qkv", "heads", "mlp", "classes")

Initializer = jax.nn.initializers.Initializer
Names = Sequence[str | None]

# LRA's Transformer block initialisers (xavier kernels, tiny-normal MLP biases).
xavier_uniform = jax.nn.initializers.xavier_uniform()
zeros = jax.nn.initializers.zeros
ones = jax.nn.initializers.ones
normal = jax.nn.initializers.normal


def named(init: Initializer, names: Names) -> Initializer:
    """Wraps `init` so the Param it creates carries logical axis `names`."""
    unknown = [n for n in names if n is not None and n not in AXIS_NAMES]
    if unknown:
        raise ValueError(f"unknown logical axis names {unknown}; known: {AXIS_NAMES}")
    return nnx.with_partitioning(init, tuple(names), eager_sharding=False)


def param(init: Initializer, names: Names, shape: Sequence[int], *,
          rngs: nnx.Rngs, **metadata: Any) -> nnx.Param:
    """A free-standing Param with logical axis names (one key from the 'params' stream)
    and any further metadata, e.g. the optimiser's `bounds` and `no_weight_decay`
    (lra.training.optim.make_optimizer)."""
    if len(names) != len(shape):
        raise ValueError(f"names {tuple(names)} do not match shape {tuple(shape)}")
    return nnx.Param(named(init, names)(rngs.params(), tuple(shape), jnp.float32),
                     **metadata)


def dense(in_features: int, out_features: int, names: tuple[str | None, str | None], *,
          rngs: nnx.Rngs, use_bias: bool = True,
          kernel_init: Initializer | None = None,
          bias_init: Initializer = zeros) -> nnx.Linear:
    """nnx.Linear whose kernel is named `names` and bias `names[1]`. kernel_init None:
    the kernel the original leaves to its framework, drawn here as LRA's (xavier
    uniform) and marked `framework_kernel`, so that a benchmark whose framework draws
    it otherwise can redraw it by that law (models/init_schemes.py `mad`: torch's)."""
    linear = nnx.Linear(in_features, out_features, use_bias=use_bias,
                        kernel_init=named(kernel_init or xavier_uniform, names),
                        bias_init=named(bias_init, names[1:]), rngs=rngs)
    linear.framework_kernel = kernel_init is None
    return linear


def layer_norm(dim: int, *, rngs: nnx.Rngs) -> nnx.LayerNorm:
    """LayerNorm over the 'embed' axis (epsilon 1e-6, as LRA)."""
    return nnx.LayerNorm(dim, epsilon=1e-6, scale_init=named(ones, ("embed",)),
                         bias_init=named(zeros, ("embed",)), rngs=rngs)


def embed(num_embeddings: int, features: int, names: tuple[str, str], *,
          init: Initializer, rngs: nnx.Rngs) -> nnx.Embed:
    """nnx.Embed with a named table."""
    return nnx.Embed(num_embeddings, features, embedding_init=named(init, names), rngs=rngs)


def constrain(x: jax.Array, names: Names) -> jax.Array:
    """Pins the sharding of activation `x` by logical `names` (one per dimension).

    XLA's propagation would otherwise let activations follow the parameters' layout
    (e.g. split the residual stream by `embed` under FSDP); this keeps them split by
    batch (and by head under tensor parallelism). No-op without rules or a mesh.
    """
    rules = dict(flax_spmd.get_logical_axis_rules() or ())
    mesh = jax.sharding.get_abstract_mesh()
    if not rules or mesh.empty:
        return x
    spec = jax.sharding.PartitionSpec(*(rules.get(n) if n else None for n in names))
    return jax.lax.with_sharding_constraint(x, spec)


def valid_mask(padding_mask: jax.Array | None, batch: int, length: int) -> jax.Array:
    """[batch, length] bool, True at real tokens (all True without a padding mask)."""
    if padding_mask is None:
        return jnp.ones((batch, length), jnp.bool_)
    return padding_mask.astype(jnp.bool_)


def noise_stream(rngs: nnx.Rngs) -> nnx.RngStream:
    """A stream of the module's own for training-time randomness (hash planes, samples,
    Gumbel noise): forked from `dropout` like nnx.Dropout's, so every training call
    draws afresh; from `params` when the Rngs has no dropout stream."""
    return rngs["dropout" if "dropout" in rngs else "params"].fork()


def mesh_axes(names: Names, sizes: Sequence[int]) -> tuple[str | None, ...] | None:
    """The mesh axis that each logical name maps to under the enclosing rules and mesh
    (as `constrain` would shard), None for a name that is unmapped, on a mesh axis of size
    1, or whose size the mesh axis does not divide; None altogether outside a mesh or
    when nothing is sharded. For kernels that must be `shard_map`ped by hand (XLA cannot
    partition a Pallas custom call)."""
    rules = dict(flax_spmd.get_logical_axis_rules() or ())
    mesh = jax.sharding.get_abstract_mesh()
    if not rules or mesh.empty:
        return None
    axes = []
    for name, size in zip(names, sizes):
        axis = rules.get(name) if name else None
        if isinstance(axis, (tuple, list)):
            axis = axis[0] if len(axis) == 1 else None  # one mesh axis per dimension here
        n = mesh.shape[axis] if axis in mesh.shape else 1
        axes.append(axis if n > 1 and size % n == 0 else None)
    return tuple(axes) if any(axes) else None


def manual_shards(fn, args: Sequence[jax.Array], in_specs: Sequence, out_spec,
                  like: jax.Array) -> jax.Array:
    """`jax.shard_map(fn)` over the enclosing mesh, for kernels XLA cannot partition. On
    Explicit mesh axes the arguments are resharded to `in_specs` first and the result
    back to `like`'s sharding (Auto axes reshard by themselves)."""
    explicit = jax.sharding.AxisType.Explicit in jax.sharding.get_abstract_mesh().axis_types
    if explicit:
        args = [jax.sharding.reshard(a, s) for a, s in zip(args, in_specs)]
    out = jax.shard_map(fn, in_specs=tuple(in_specs), out_specs=out_spec,
                        check_vma=False)(*args)
    return jax.sharding.reshard(out, jax.typeof(like).sharding.spec) if explicit else out


def sinusoidal_positions(length: int, dim: int) -> jax.Array:
    """LRA's fixed table: even features sin(p / 10000^(2i/d)), odd features cos."""
    return sinusoidal_at(jnp.arange(length), dim)


def sinusoidal_at(positions: jax.Array, dim: int) -> jax.Array:
    """Rows of `sinusoidal_positions` at any int positions (shape positions.shape + (dim,)):
    the table does not depend on its length, so decoding takes row p alone."""
    pos_x1 = jnp.asarray(positions, jnp.float32)[..., None]
    inv_freq_F = jnp.exp(jnp.arange(0, dim, 2, dtype=jnp.float32) * -(math.log(10000.0) / dim))
    angles_xF = pos_x1 * inv_freq_F
    table_xD = jnp.zeros((*angles_xF.shape[:-1], dim), jnp.float32)
    table_xD = table_xD.at[..., 0::2].set(jnp.sin(angles_xF))
    return table_xD.at[..., 1::2].set(jnp.cos(angles_xF[..., :dim // 2]))


# RoFormer's base: pair i of a D-wide head turns at the angle p * ROTARY_BASE^(-2i/D).
ROTARY_BASE = 10000.0


def rotary(x: jax.Array, positions: jax.Array, *, base: float = ROTARY_BASE) -> jax.Array:
    """RoFormer's rotary position embedding (Su et al. 2021, eqs. 14-15): each pair of
    features (x_2i, x_2i+1) of the last axis, D wide, is rotated by the angle
    p * base^(-2i/D) of its position p.

    `positions` broadcasts against x.shape[:-1] (e.g. a length-L vector for a BxHxLxK
    tensor, or BxHxL for gathered or sorted queries); floats are allowed (a pooled key
    may sit between positions). Rotations compose, so (R_m q) . (R_n k) = q . R_{n-m} k:
    after rotating queries and keys, their products depend on positions only through the
    offset n - m. Computed in float32, returned in x's dtype.
    """
    dim = x.shape[-1]
    if dim % 2:
        raise ValueError(f"rotary rotates pairs of features; the last axis has {dim}, an odd "
                         "number")
    inv_freq_F = base ** (-jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    angles_xF = jnp.asarray(positions, jnp.float32)[..., None] * inv_freq_F
    cos_xF, sin_xF = jnp.cos(angles_xF), jnp.sin(angles_xF)
    pairs_xFx2 = x.astype(jnp.float32).reshape(*x.shape[:-1], dim // 2, 2)
    even_xF, odd_xF = pairs_xFx2[..., 0], pairs_xFx2[..., 1]
    rotated_xFx2 = jnp.stack([even_xF * cos_xF - odd_xF * sin_xF,
                              even_xF * sin_xF + odd_xF * cos_xF], axis=-1)
    return rotated_xFx2.reshape(x.shape).astype(x.dtype)

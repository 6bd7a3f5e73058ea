"""Helpers shared by the variant tests: random weights and float64 views for references."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def randomize_params(module: nnx.Module, seed: int = 3, scale: float = 0.5) -> nnx.Module:
    """Redraws every Param of `module` (zero biases and unit scales included) at random, so
    that a reference test cannot pass by a term being zero."""
    rng = np.random.default_rng(seed)
    nnx.update(module, jax.tree.map(
        lambda leaf: jnp.asarray(scale * rng.standard_normal(leaf.shape), leaf.dtype),
        nnx.state(module, nnx.Param)))
    return module


def f64(a) -> np.ndarray:
    """A Param or an array as a float64 numpy array."""
    return np.asarray(a[...] if hasattr(a, "value") else a, np.float64)


def normal(seed: int, shape: tuple[int, ...]) -> jax.Array:
    """Standard-normal float32 inputs. numpy draws: jax.random compiles a program per
    shape, slow on small CPUs."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def project_heads(layer: nnx.Linear, x, num_heads: int) -> np.ndarray:
    """A projection in float64, split into heads: [B, L, F] -> [B, H, L, F / H]."""
    y = f64(x) @ f64(layer.kernel) + f64(layer.bias)
    b, l, f = y.shape
    return y.reshape(b, l, num_heads, f // num_heads).transpose(0, 2, 1, 3)


@functools.partial(jax.jit, static_argnums=0, static_argnames="deterministic")
def _apply(graphdef, state, args, kwargs, deterministic=True):
    return nnx.merge(graphdef, state)(*args, deterministic=deterministic, **kwargs)


def apply(module: nnx.Module, *args, deterministic: bool = True, **kwargs):
    """`module(*args, deterministic=..., **kwargs)`, compiled as one program.

    Run eagerly, a variant's first call compiles every operation on its own (2-8 s a
    variant on 2 CPU cores); jitted, the whole call compiles in 0.3-2 s, and again only for
    a new structure or shape (modules of one graphdef share the program). State that the
    call would change (rng counters) is not written back: for deterministic checks."""
    graphdef, state = nnx.split(module)
    try:
        hash(graphdef)
    except TypeError:  # a module holding a dict or list: one program for this call
        return jax.jit(lambda state, args, kwargs: nnx.merge(graphdef, state)(
            *args, deterministic=deterministic, **kwargs))(state, args, kwargs)
    return _apply(graphdef, state, args, kwargs, deterministic=deterministic)


def check_prefill_and_steps(mixer: nnx.Module, run, x_BxLxD: jax.Array, lens_B: jax.Array,
                            prompt_len: int, **tol) -> None:
    """A mixer's decoding against its parallel causal form: each row's prompt of lens_B[b]
    tokens (right-padded to prompt_len) through `prefill`, then one `step` per position to
    the end, each row at its own position; the outputs equal the parallel form's at every
    position reached. `run(mixer, method, *args)` calls a method under jit."""
    from models import decoding

    length = x_BxLxD.shape[1]
    batch = x_BxLxD.shape[0]
    parallel = np.asarray(run(mixer, "__call__", x_BxLxD))
    cache = mixer.init_cache(batch, length)
    y_prompt, cache = run(mixer, "prefill", cache, x_BxLxD[:, :prompt_len],
                          jnp.arange(prompt_len)[None] < lens_B[:, None])
    outputs = np.zeros(parallel.shape)
    for b, n in enumerate(np.asarray(lens_B)):
        outputs[b, :n] = np.asarray(y_prompt)[b, :n]
    graphdef, state = nnx.split(mixer)
    step = jax.jit(lambda cache, x_BxD: nnx.merge(graphdef, state).step(cache, x_BxD))
    for i in range(length - prompt_len):
        y, cache = step(cache, decoding.row_at(x_BxLxD, lens_B + i))
        for b, n in enumerate(np.asarray(lens_B)):
            outputs[b, n + i] = np.asarray(y)[b]
    reached = np.arange(length)[None] < (np.asarray(lens_B) + length - prompt_len)[:, None]
    np.testing.assert_allclose(outputs[reached], parallel[reached], **tol)

"""Initialisation schemes a benchmark's scaffold declares (configs/scaffold.py, issue 68).

Each variant builds its parameters as its original does (models/layers.py: LRA's
xavier-uniform kernels and N(0, 1) token table for what the original leaves to the
framework). A benchmark's original code may then redraw them all: Zoology's LanguageModel
does, after the mixers are built, and that redraw decides which MQAR rows recall
(results/cpu/mqar_zoology_init_probe.md). A scheme here is that redraw, applied to the
built model (lra/training/model.py), so that every mixer of the benchmark starts as the
benchmark's own models start.

  own      nothing redrawn: each variant's own initialisation (every run before the
           scaffold declared one)
  zoology  HazyResearch/zoology d88d6f5 zoology/model.py `_init_weights`, applied by
           LMBackbone and LanguageModel to every module (torch's Module.apply), for the
           model's block_type (zoology/experiments/models_repo.py: Mamba2Block for the
           mamba2 row, TransformerBlock for every other):
             TransformerBlock: every nn.Linear weight N(0, 0.02), its bias 0; every
               nn.Embedding N(0, 0.02); then every parameter whose name contains
               `out_proj.weight` or `fc2.weight` N(0, 0.02 / sqrt(2 n_layers)).
             Mamba2Block: the nn.Linear weights keep torch's draw (kaiming-uniform with
               a = sqrt(5): U(+-1 / sqrt(fan_in))), their biases 0; nn.Embedding N(0,
               0.02); `out_proj.weight` / `fc2.weight` redrawn from torch's draw and
               divided by sqrt(n_layers) (n_residuals_per_layer 1).
           Here: every nnx.Linear and nnx.Embed as Zoology's nn.Linear and nn.Embedding
           (our mixers keep an original's Linear a Linear; a fused projection split into
           several, e.g. Mamba-2's in_proj, draws each part from the same law), and the
           rescale on the output projection of the variants whose Zoology mixer names it
           `out_proj` (ZOOLOGY_OUT_PROJ). fla's layers, which Zoology uses for the delta
           rules, GLA and RWKV-7, name theirs `o_proj` and Zoology's Based `proj_o`: not
           rescaled there, so not here; a variant Zoology does not have is treated as
           fla's layer of it (o_proj). Parameters that are not Linear or Embedding
           (decays, gates' biases held as parameters, convolutions, norms) keep their
           own draw, as in Zoology. The LM head tied to the embedding is a separate
           scaffold field (config.tie_head; Zoology ties it).

A scheme draws from its own key (the run's seed), so the mixers' own draws, and every
other scheme's, are unchanged by adding one.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

SCHEMES = ("own", "zoology")
ZOOLOGY_RANGE = 0.02  # zoology/model.py _init_weights: initializer_range
# Our variant -> the attribute of its mixer that is Zoology's `out_proj` (the rescale's
# target): zoology/mixers/attention.py MHA.out_proj, slide_attn.py SlidingAttn.out_proj,
# hyena.py Hyena.out_proj, mamba2.py Mamba2.out_proj (mamba_ssm's).
ZOOLOGY_OUT_PROJ = {"transformer": "out", "local": "out", "hyena": "out_proj",
                    "mamba2": "out"}
# The variants whose Zoology model is a Mamba2Block (models_repo.py add_mamba2).
ZOOLOGY_MAMBA_BLOCK = ("mamba2",)
_KEY_SALT = 0x5A00  # the scheme's stream, apart from the model's own (nnx.Rngs(seed))


def _blocks_by_path(model: Any) -> dict[tuple, int]:
    """{path of a block (a module holding a `mixer`): its index in the stack}."""
    out = {}
    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Module) and isinstance(getattr(node, "mixer", None),
                                                       nnx.Module):
            out[tuple(path)] = len(out)
    return out


def _normal(key, like: jax.Array, std: float) -> jax.Array:
    return (std * jax.random.normal(key, like.shape, jnp.float32)).astype(like.dtype)


def _torch_linear(key, kernel: jax.Array, scale: float = 1.0) -> jax.Array:
    """torch.nn.Linear's weight draw, U(+-1 / sqrt(fan_in)), times `scale` (kernel: in x
    out, fan_in its first axis)."""
    bound = 1.0 / math.sqrt(kernel.shape[0])
    u = jax.random.uniform(key, kernel.shape, jnp.float32, -bound, bound)
    return (scale * u).astype(kernel.dtype)


def out_proj_paths(model: Any, layer_models: Sequence[str]) -> set[tuple]:
    """Paths of the nnx.Linear modules Zoology's rescale reaches: each block's mixer's
    ZOOLOGY_OUT_PROJ attribute, for the block's variant (layer_models[i])."""
    found = set()
    for path, i in _blocks_by_path(model).items():
        name = ZOOLOGY_OUT_PROJ.get(layer_models[i] if i < len(layer_models) else "")
        if name and isinstance(getattr(model_at(model, path).mixer, name, None), nnx.Linear):
            found.add((*path, "mixer", name))
    return found


def model_at(model: Any, path: tuple) -> Any:
    node = model
    for part in path:
        node = node[part] if isinstance(part, int) else getattr(node, part)
    return node


def apply(model: Any, scheme: str, *, seed: int, base_model: str,
          layer_models: Sequence[str]) -> None:
    """Redraws `model`'s parameters (in place) as `scheme` does. base_model: the config's
    model (it picks Zoology's block_type); layer_models: each block's variant."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown initialisation scheme {scheme!r}; valid: "
                         f"{', '.join(SCHEMES)}")
    if scheme == "own":
        return
    n_layers = len(_blocks_by_path(model))
    mamba = base_model in ZOOLOGY_MAMBA_BLOCK
    rescaled = out_proj_paths(model, layer_models)
    key = jax.random.fold_in(jax.random.key(seed), _KEY_SALT)
    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Linear):
            key, sub = jax.random.split(key)
            kernel = node.kernel[...]
            if tuple(path) in rescaled:
                node.kernel[...] = (_torch_linear(sub, kernel, 1 / math.sqrt(n_layers))
                                    if mamba else
                                    _normal(sub, kernel, ZOOLOGY_RANGE / math.sqrt(2 * n_layers)))
            else:
                node.kernel[...] = (_torch_linear(sub, kernel) if mamba
                                    else _normal(sub, kernel, ZOOLOGY_RANGE))
            if node.bias is not None:
                node.bias[...] = jnp.zeros_like(node.bias[...])
        elif isinstance(node, nnx.Embed):
            key, sub = jax.random.split(key)
            node.embedding[...] = _normal(sub, node.embedding[...], ZOOLOGY_RANGE)

"""Initialisation schemes a benchmark's scaffold declares (configs/scaffold.py, issue 68).

Each variant builds its parameters as its original does (models/layers.py: LRA's
xavier-uniform kernels and N(0, 1) token table for what the original leaves to the
framework). A benchmark's original code may then redraw them all, after the mixers are
built: Zoology's LanguageModel does, and so do the fla language models Grazzi et al.
train, and that redraw decides which MQAR rows recall
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
           The rescale reaches the output projection of the variants whose Zoology mixer
           names it `out_proj` (ZOOLOGY_OUT_PROJ) and the feed-forward block's second
           Linear (Zoology's MLP names it fc2, as ours does). fla's layers, which Zoology
           uses for the delta rules, GLA and RWKV-7, name theirs `o_proj` and Zoology's
           Based `proj_o`: not rescaled there, so not here; a variant Zoology does not
           have is treated as fla's layer of it (o_proj).
  grazzi   the language models of Grazzi et al.'s state-tracking experiments
           (automl/unlocking_state_tracking df8f840): DeltaNet's is their fla
           (flash-linear-attention_mod/fla/models/delta_net/modeling_delta_net.py
           `_init_weights`, HF's post_init): every nn.Linear and nn.Conv1d weight N(0,
           0.02) (the short convolutions too), biases 0, nn.Embedding N(0, 0.02), then
           each module's direct `o_proj.weight` and `down_proj.weight` divided by
           sqrt(2 n_layers); the head untied. Mamba's is mamba_ssm's
           (mamba_dev/mamba_ssm/models/mixer_seq_simple.py `_init_weights`): Linear
           weights as torch draws them, biases 0, Embedding N(0, 0.02), `out_proj` /
           `fc2` redrawn from torch's draw over sqrt(n_residuals_per_layer n_layers)
           (2 with a feed-forward block, else 1); convolutions untouched. Here: the
           mamba2 row by the Mamba rule, every other row by DeltaNet's, with every
           mixer's output projection (OUT_PROJ_NAMES, fla's o_proj) and the feed-forward
           block's second Linear (fla's down_proj) rescaled, and the shared short
           convolution and the variants' own (parameters named conv*) as fla's Conv1d.
  mad      MAD's models (athms/mad-lab 0f49a45), which keep each layer's own draw:
             LanguageModel (mad/model/language_model.py `_init_weights`, lines 73-79):
               every nn.Linear bias 0 (but those marked `_no_reinit`: Mamba-1's
               dt_proj, no row here), every nn.Embedding N(0, 0.02); Linear weights
               untouched, so each is its layer's: torch's U(+-1 / sqrt(fan_in)) where
               the layer leaves it to torch (here the kernels layers.dense marks
               `framework_kernel`, drawn as LRA's xavier by `own`, and the unembedding,
               lecun-normal by `own`), and a layer's own law kept: ours where the row's
               original draws it (e.g. Hyena's torch draw, RWKV-7's orthogonal ones), and
               mad-lab's own for the rows mad-lab has (MAD_LAYER_XAVIER: its GLA draws
               q, k, v, g, o and the gate's two projections xavier-uniform with gain
               2^-2.5, mad/model/layers/attention_gated_linear.py lines 72-79).
             AutoEncoder (compression; mad/model/auto_encoder.py `_init_weights`, lines
               132-138): every nn.Linear weight N(0, 0.02) (the layers' too), biases 0,
               nn.Embedding N(0, 0.02).
           Head untied in both.

Here every nnx.Linear and nnx.Embed stands for the original's nn.Linear and nn.Embedding
(our mixers keep an original's Linear a Linear; a fused projection split into several,
e.g. Mamba-2's in_proj, draws each part from the same law). Parameters that are not
Linear, Embedding or (where the scheme says so) convolutions — decays, gates' biases held
as parameters, norms — keep their own draw, as in the originals. Whether the vocabulary
head is the embedding's transpose is a separate scaffold field (config.tie_head).

A scheme draws from its own key (the run's seed), so the mixers' own draws, and every
other scheme's, are unchanged by adding one.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

INIT_RANGE = 0.02  # initializer_range of zoology/model.py, fla's configs and mamba_ssm
# Our variant -> the attribute of its mixer that is Zoology's `out_proj` (the rescale's
# target): zoology/mixers/attention.py MHA.out_proj, slide_attn.py SlidingAttn.out_proj,
# hyena.py Hyena.out_proj, mamba2.py Mamba2.out_proj (mamba_ssm's).
ZOOLOGY_OUT_PROJ = {"transformer": "out", "local": "out", "hyena": "out_proj",
                    "mamba2": "out"}
# A mixer's output projection, as fla names it o_proj: our mixers' names for it (the
# attribute of the mixer itself; a mixer with none, e.g. S4D's GLU head, has none).
OUT_PROJ_NAMES = ("out", "out_proj", "o_proj", "proj_out")
FFN_OUT = ("mlp", "fc2")  # the feed-forward block's second Linear (fla's down_proj)
# mad-lab's layers that draw their own Linears (the rest keep torch's): our row -> (gain,
# our names for them), xavier-uniform with that gain. mad-lab's GatedLinearAttention
# (attention_gated_linear.py reset_parameters): q_proj, k_proj, v_proj, g_proj, o_proj,
# gk_proj[0], gk_proj[1].
MAD_LAYER_XAVIER = {"gla": (2 ** -2.5, ("query", "key", "value", "output_gate", "out",
                                        "alpha_down", "alpha_up"))}
MAD_HEAD = "lm_head"  # the LanguageModel's unembedding (an nn.Linear there)
# The rows whose original is a Mamba model (Zoology's Mamba2Block, Grazzi et al.'s
# mamba_ssm LM), drawn by its rule; every other row by the benchmark's other rule.
MAMBA_ROWS = ("mamba2",)


@dataclasses.dataclass(frozen=True)
class Rule:
    """One original's redraw. linear: 'normal' (N(0, INIT_RANGE)) or 'torch' (torch's
    nn.Linear draw kept); rescale: what the output projections become, 'normal'
    (N(0, INIT_RANGE / sqrt(residuals n_layers))) or 'torch' (torch's draw over
    sqrt(residuals n_layers)); residuals: None = 2 with a feed-forward block, else 1."""
    linear: str
    rescale: str
    residuals: int | None
    convs: bool  # the short convolutions drawn as the Linears (fla's nn.Conv1d)


ZOOLOGY_TRANSFORMER = Rule("normal", "normal", 2, convs=False)
ZOOLOGY_MAMBA = Rule("torch", "torch", 1, convs=False)
FLA_DELTANET = Rule("normal", "normal", 2, convs=True)
MAMBA_SSM = Rule("torch", "torch", None, convs=False)


def _rule(scheme: str, base_model: str) -> Rule:
    mamba = base_model in MAMBA_ROWS
    if scheme == "zoology":
        return ZOOLOGY_MAMBA if mamba else ZOOLOGY_TRANSFORMER
    return MAMBA_SSM if mamba else FLA_DELTANET


SCHEMES = ("own", "zoology", "grazzi", "mad")


def _blocks_by_path(model: Any) -> dict[tuple, int]:
    """{path of a block (a module holding a `mixer`): its index in the stack}."""
    out = {}
    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Module) and isinstance(getattr(node, "mixer", None),
                                                       nnx.Module):
            out[tuple(path)] = len(out)
    return out


def model_at(model: Any, path: tuple) -> Any:
    node = model
    for part in path:
        node = node[part] if isinstance(part, int) else getattr(node, part)
    return node


def rescaled_paths(model: Any, scheme: str, layer_models: Sequence[str]) -> set[tuple]:
    """Paths of the nnx.Linear modules the scheme's rescale reaches: per block, the
    mixer's output projection (zoology: ZOOLOGY_OUT_PROJ for the block's variant;
    grazzi: OUT_PROJ_NAMES) and the feed-forward block's second Linear."""
    found = set()
    for path, i in _blocks_by_path(model).items():
        block = model_at(model, path)
        variant = layer_models[i] if i < len(layer_models) else ""
        names = ((ZOOLOGY_OUT_PROJ[variant],) if variant in ZOOLOGY_OUT_PROJ else ()
                 ) if scheme == "zoology" else OUT_PROJ_NAMES
        for name in names:
            if isinstance(getattr(block.mixer, name, None), nnx.Linear):
                found.add((*path, "mixer", name))
                break
        mlp = getattr(block, FFN_OUT[0], None)
        if mlp is not None and isinstance(getattr(mlp, FFN_OUT[1], None), nnx.Linear):
            found.add((*path, *FFN_OUT))
    return found


def _normal(key, like: jax.Array, std: float) -> jax.Array:
    return (std * jax.random.normal(key, like.shape, jnp.float32)).astype(like.dtype)


def _torch_linear(key, kernel: jax.Array, scale: float = 1.0) -> jax.Array:
    """torch.nn.Linear's weight draw, U(+-1 / sqrt(fan_in)), times `scale` (kernel: in x
    out, fan_in its first axis)."""
    bound = 1.0 / math.sqrt(kernel.shape[0])
    u = jax.random.uniform(key, kernel.shape, jnp.float32, -bound, bound)
    return (scale * u).astype(kernel.dtype)


def _conv_params(model: Any) -> list[tuple[Any, str]]:
    """(module, attribute) of every short-convolution parameter: each block's shared
    ShortConv (weight, bias) and the mixer's own (Params named conv*, RWKV-7's shift has
    none)."""
    found = []
    for path in _blocks_by_path(model):
        block = model_at(model, path)
        conv = getattr(block, "short_conv", None)
        if conv is not None:
            found += [(conv, n) for n in ("weight", "bias")
                      if isinstance(getattr(conv, n, None), nnx.Param)]
        for _, node in nnx.iter_graph(block.mixer):
            if isinstance(node, nnx.Module):
                found += [(node, n) for n, v in vars(node).items()
                          if n.startswith("conv") and isinstance(v, nnx.Param)]
    return found


def _xavier(key, kernel: jax.Array, gain: float) -> jax.Array:
    """torch's xavier_uniform_(gain): U(+-gain sqrt(6 / (fan_in + fan_out)))."""
    bound = gain * math.sqrt(6.0 / (kernel.shape[0] + kernel.shape[1]))
    return jax.random.uniform(key, kernel.shape, jnp.float32, -bound, bound
                              ).astype(kernel.dtype)


def mad_layer_paths(model: Any, layer_models: Sequence[str]) -> dict[tuple, float]:
    """{path of an nnx.Linear a mad-lab layer draws itself: its xavier gain}."""
    found = {}
    for path, i in _blocks_by_path(model).items():
        variant = layer_models[i] if i < len(layer_models) else ""
        if variant in MAD_LAYER_XAVIER:
            gain, names = MAD_LAYER_XAVIER[variant]
            mixer = model_at(model, path).mixer
            found.update({(*path, "mixer", n): gain for n in names
                          if isinstance(getattr(mixer, n, None), nnx.Linear)})
    return found


def _apply_mad(model: Any, key: jax.Array, layer_models: Sequence[str], *,
               autoencoder: bool) -> None:
    own_laws = mad_layer_paths(model, layer_models)
    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Linear):
            key, sub = jax.random.split(key)
            kernel, path = node.kernel[...], tuple(path)
            if autoencoder:
                node.kernel[...] = _normal(sub, kernel, INIT_RANGE)
            elif path in own_laws:
                node.kernel[...] = _xavier(sub, kernel, own_laws[path])
            elif getattr(node, "framework_kernel", False) or path[-1:] == (MAD_HEAD,):
                node.kernel[...] = _torch_linear(sub, kernel)
            if node.bias is not None:
                node.bias[...] = jnp.zeros_like(node.bias[...])
        elif isinstance(node, nnx.Embed):
            key, sub = jax.random.split(key)
            node.embedding[...] = _normal(sub, node.embedding[...], INIT_RANGE)


def apply(model: Any, scheme: str, *, seed: int, base_model: str,
          layer_models: Sequence[str], autoencoder: bool = False) -> None:
    """Redraws `model`'s parameters (in place) as `scheme` does. base_model: the config's
    model (it picks the original's rule, e.g. Zoology's block_type); layer_models: each
    block's variant; autoencoder: the model is MAD's compression auto-encoder."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown initialisation scheme {scheme!r}; valid: "
                         f"{', '.join(SCHEMES)}")
    if scheme == "own":
        return
    key = jax.random.fold_in(jax.random.key(seed), 0x5A00 + SCHEMES.index(scheme))
    if scheme == "mad":
        return _apply_mad(model, key, layer_models, autoencoder=autoencoder)
    rule = _rule(scheme, base_model)
    blocks = _blocks_by_path(model)
    n_layers = len(blocks)
    has_ffn = any(getattr(model_at(model, p), "mlp", None) is not None for p in blocks)
    residuals = rule.residuals or (2 if has_ffn else 1)
    rescaled = rescaled_paths(model, scheme, layer_models)
    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Linear):
            key, sub = jax.random.split(key)
            kernel = node.kernel[...]
            if tuple(path) in rescaled:
                scale = 1 / math.sqrt(residuals * n_layers)
                node.kernel[...] = (_torch_linear(sub, kernel, scale) if rule.rescale == "torch"
                                    else _normal(sub, kernel, INIT_RANGE * scale))
            else:
                node.kernel[...] = (_torch_linear(sub, kernel) if rule.linear == "torch"
                                    else _normal(sub, kernel, INIT_RANGE))
            if node.bias is not None:
                node.bias[...] = jnp.zeros_like(node.bias[...])
        elif isinstance(node, nnx.Embed):
            key, sub = jax.random.split(key)
            node.embedding[...] = _normal(sub, node.embedding[...], INIT_RANGE)
    if rule.convs:
        for module, name in _conv_params(model):
            param = getattr(module, name)
            if name == "bias":
                param[...] = jnp.zeros_like(param[...])
            else:
                key, sub = jax.random.split(key)
                param[...] = _normal(sub, param[...], INIT_RANGE)

"""Token-mixer registry: name -> builder + capability flags.

A builder is a callable

    builder(*, dim, num_heads, max_len, causal, rngs, **hparams) -> nnx.Module

whose module is called as

    mixer(x_BxLxD, padding_mask=mask_BxL_or_None, deterministic=True) -> y_BxLxD

with `padding_mask` bool, True on real tokens. Variable-length mixers accept any
L <= max_len. The accepted hparams are the builder's extra keyword parameters;
`build` rejects any other name (this is how config typos are reported).
Two extensions are flagged in `Capabilities`: `carries_state` (a carry between
layers) and `takes_memory` (extra `memory=`/`memory_mask=` keys and values before
x, for Transformer-XL's segment recurrence).

Rotary position embeddings (the encoder's pos_emb='rotary'): a variant with
`Capabilities.rotary` has a builder that takes `rotary: bool = False` and, given True,
rotates its queries and keys by position before their products (`models.layers.rotary`);
`build(..., rotary=True)` refuses every other variant in one line naming
`Capabilities.rotary_refusal`. The flag is checked against the builder's signature at
registration, so the two cannot disagree.

Auxiliary losses (adaptive span L1, routing commitment, ACT ponder cost) are sown
by the mixer as `self.sow(nnx.Intermediate, 'aux_loss', value)` (a scalar); the
training loop sums every `aux_loss` it finds.

A variant declares in `Capabilities.dense_equivalent` the hparams under which it
computes exactly what `transformer` computes with the same `query`, `key`, `value`
and `out` parameters (top-level attribute names, `nnx.Linear`, as in
`models.attention.dense.MultiHeadAttention`). The conformance suite
(tests/models/test_conformance.py) builds both at dim 32, 2 heads, max_len 16 and
L <= 16, so `test_hparams` and `dense_equivalent` must be valid at those sizes.

Decoding (DESIGN.md 10): every variant with `causal=True` names in `Capabilities.decode`
the form it decodes with, one token at a time (`models.decoding`): "kv_cache" (softmax
attention over cached keys and values, a ring of the pattern's reach where that is
shorter than the sequence), "recurrent_state" (the linear family's state; the mixer has
`init_cache(batch, max_len)`, `prefill(cache, x_BxLxD, mask)` and `step(cache, x_BxD) ->
(y_BxD, cache)`; so do "conv_kv" (lite) and "gate_cache" (gmlp)), "recompute" (the inputs so far, the parallel form re-run per token:
exact, not cheap) or "segment_memory" (Transformer-XL: the segment_recurrent stack
decodes). Step-by-step decoding equals the parallel causal form at every position
(tests/models/test_decoding.py).

Variant modules register themselves on import; `_load_all` imports the variant
packages lazily, so `import models.registry` alone is enough to see every variant. A
variant of the user's own lives in the user's module (docs/variants.md#adding-a-variant):
`lra.launch` and `lra.sweep` import it given `--import=<module>`, and `_load_all` imports
the modules named in the environment variable LRA_IMPORTS (comma-separated), so every
command sees them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import os
from typing import Any, Callable, Iterator

from flax import nnx

# Importing these registers every variant (each package imports its modules).
_VARIANT_PACKAGES = ("models.attention", "models.mixers")

# Keyword arguments every builder takes; everything else is an hparam.
_BUILD_ARGS = ("dim", "num_heads", "max_len", "causal", "rngs")
# Keyword arguments a builder may take, set by the encoder, never by a config: how many
# positions before the content are not content (the CLS slot), and whether queries and
# keys are rotated by position (pos_emb='rotary'). A builder whose geometry is stated for
# the content (windows, 2-D rasters) takes prefix_len; a builder takes rotary exactly when
# its Capabilities.rotary is True. Others never see them.
_OPTIONAL_BUILD_ARGS = ("prefix_len", "rotary")

Builder = Callable[..., nnx.Module]

RECEPTIVE_FIELDS = ("global", "pattern", "limited")


class RegistryError(ValueError):
    """An unknown variant, an unknown hparam, or a capability the variant lacks."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Capabilities:
    """What a variant supports; the conformance suite tests exactly these claims."""

    description: str  # one line
    causal: bool  # supports causal=True
    padding: bool  # padded keys never influence real positions
    variable_length: bool  # works for any L <= max_len, not only L == max_len
    # hparams under which the variant equals `transformer` with the same
    # query/key/value/out weights; None when there is no such limit.
    dense_equivalent: dict[str, Any] | None = None
    # Keys of dense_equivalent that choose the form of attention, not how much of the
    # sequence it sees (e.g. reformer's shared_qk): lra.dense_check sets them to their
    # dense_equivalent values when it asks whether a run attends to every key.
    dense_form: tuple[str, ...] = ()
    test_hparams: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The mixer threads a state from one layer to the next (e.g. Luna's packed
    # sequence): it is called `mixer(x, padding_mask=..., deterministic=...,
    # carry=carry_or_None) -> (y, new_carry)`, with carry=None in the first layer.
    carries_state: bool = False
    # The mixer also accepts `memory=mem_BxMxD_or_None, memory_mask=mask_BxM_or_None`:
    # extra keys/values placed before x (Transformer-XL's previous segment, passed by
    # the segment_recurrent stack). Without memory it is an ordinary mixer.
    takes_memory: bool = False
    # The mixer returns a gated update towards its residual, u o (h - r), and also accepts
    # `residual=r_BxLxD` (its prefill and step `residual=` too): r is its input unless
    # given. The `mega_pre_ln` block passes the raw stream while the mixer sees LN(x), so
    # the layer is x + u o (h - x) (Mega's prenorm layer); other blocks never pass it.
    takes_residual: bool = False
    # Which positions reach which outputs in one layer (tests/models/test_fidelity.py
    # checks it inside the Classifier): "global" (every real position reaches every
    # output; the CLS summary sees everything), "pattern" (exactly the mixer's `pattern`
    # attribute, a models.masks.Pattern over the positions it sees, the CLS prefix
    # global), or "limited" (a neighbourhood chosen by the data or by windows that are
    # not one mask: buckets, clusters, learned spans, ReLU feature supports, pooled
    # windows; the CLS summary sees only what the method routes to position 0).
    receptive_field: str = "global"
    # Block settings the variant implies (keys of models.blocks.BLOCK_DEFAULTS), e.g.
    # {"kind": "gated"} for GTrXL; the user's config.block still overrides them.
    block: dict[str, Any] | None = None
    # Takes rotary position embeddings (pos_emb='rotary', RoFormer): the builder accepts
    # `rotary: bool = False` and, given True, rotates queries and keys by their positions
    # (what the mixer sees: the CLS slot 0, content 1..L) before every query-key product,
    # so that the encoder adds no absolute positions. False for variants without such
    # products, or whose products pair a position with something that has none.
    rotary: bool = False
    # Why a variant does not take rotary (one clause, for the refusal's message).
    rotary_refusal: str = ""
    # The encoder's position embedding the task configs give this variant by default (its
    # paper's): "none" for variants whose attention has relative positions of its own
    # (Transformer-XL, GTrXL), which the paper does not add absolute positions to.
    pos_emb: str = "learned"
    # How the causal form decodes one token at a time (DECODE_FORMS, see the module
    # docstring and models.decoding); "" for variants without a causal form.
    decode: str = ""
    # The hparam holding the taps of the variant's own short convolution(s) (fla's
    # use_short_conv / conv_size, Mamba's d_conv), where it has one; its value 0 builds the
    # variant without it. A benchmark scaffold (configs/scaffold.py) sets it, so that
    # every mixer of a comparison has the same short convolution, or none.
    short_conv_hparam: str = ""
    # The hparam whose value <= 0 makes the layer span its whole input (max_len), shaping
    # its weights by the length (Mega's chunk_size: a relative bias of 2 max_len - 1).
    # The length protocol (lra/training/lengths.py `extension`) tests such a layer at
    # other lengths with it set to the training length: its own form for longer inputs,
    # and at the training length the same function.
    span_hparam: str = ""


# Capabilities.decode values; "segment_memory" is decoded by the segment_recurrent stack.
DECODE_FORMS = ("kv_cache", "recurrent_state", "conv_kv", "gate_cache", "recompute",
                "segment_memory")


@dataclasses.dataclass(frozen=True)
class _Entry:
    builder: Builder
    capabilities: Capabilities
    hparams: dict[str, Any]  # accepted name -> default (inspect.Parameter.empty if none)
    open_hparams: bool  # the builder takes **kwargs
    takes_prefix: bool  # the builder takes prefix_len


_REGISTRY: dict[str, _Entry] = {}


def _signature_hparams(name: str, builder: Builder) -> tuple[dict[str, Any], bool]:
    params = inspect.signature(builder).parameters
    missing = [a for a in _BUILD_ARGS if a not in params]
    if missing:
        raise RegistryError(
            f"builder for {name!r} must take keyword arguments {', '.join(_BUILD_ARGS)}; "
            f"missing: {', '.join(missing)}")
    hparams = {
        p.name: p.default for p in params.values()
        if p.name not in _BUILD_ARGS + _OPTIONAL_BUILD_ARGS
        and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    }
    open_hparams = any(p.kind is p.VAR_KEYWORD for p in params.values())
    return hparams, open_hparams


def _check_hparams(name: str, entry: _Entry, given: dict[str, Any]) -> None:
    if entry.open_hparams:
        return
    unknown = sorted(set(given) - set(entry.hparams))
    if unknown:
        accepted = ", ".join(sorted(entry.hparams)) or "(none)"
        raise RegistryError(
            f"unknown hparam {', '.join(map(repr, unknown))} for model {name!r}; "
            f"accepted: {accepted}")


def register(name: str, builder: Builder | None = None,
             capabilities: Capabilities | None = None) -> Any:
    """Registers `builder` under `name`.

    Also usable as a decorator: `@register("local", capabilities=Capabilities(...))`.
    """
    if capabilities is None:
        raise TypeError("register() needs capabilities=Capabilities(...)")
    if builder is None:
        return lambda fn: register(name, fn, capabilities)
    if capabilities.receptive_field not in RECEPTIVE_FIELDS:
        raise RegistryError(f"{name!r}: receptive_field must be one of {RECEPTIVE_FIELDS}, "
                            f"got {capabilities.receptive_field!r}")
    if capabilities.causal != bool(capabilities.decode) or (
            capabilities.decode and capabilities.decode not in DECODE_FORMS):
        raise RegistryError(f"{name!r}: a causal variant names its decoding form, one of "
                            f"{DECODE_FORMS}, in Capabilities.decode (and only a causal one); "
                            f"got causal={capabilities.causal}, "
                            f"decode={capabilities.decode!r}")
    if capabilities.short_conv_hparam and capabilities.short_conv_hparam not in (
            inspect.signature(builder).parameters):
        raise RegistryError(f"{name!r}: Capabilities.short_conv_hparam="
                            f"{capabilities.short_conv_hparam!r} is not a builder argument")
    if name in _REGISTRY:
        raise RegistryError(f"model {name!r} is already registered")
    hparams, open_hparams = _signature_hparams(name, builder)
    takes_prefix = "prefix_len" in inspect.signature(builder).parameters
    takes_rotary = "rotary" in inspect.signature(builder).parameters
    if capabilities.rotary != takes_rotary:
        raise RegistryError(
            f"{name!r}: Capabilities.rotary={capabilities.rotary} but its builder "
            f"{'takes' if takes_rotary else 'does not take'} a `rotary` argument; they must "
            "agree")
    if capabilities.rotary and capabilities.rotary_refusal:
        raise RegistryError(f"{name!r}: rotary_refusal is for variants without rotary")
    entry = _Entry(builder, capabilities, hparams, open_hparams, takes_prefix)
    # A misspelt key in the flags fails at import, not deep inside the suite.
    _check_hparams(name, entry, capabilities.test_hparams)
    _check_hparams(name, entry, capabilities.dense_equivalent or {})
    if not set(capabilities.dense_form) <= set(capabilities.dense_equivalent or {}):
        raise RegistryError(f"{name!r}: dense_form keys must be keys of dense_equivalent")
    _REGISTRY[name] = entry
    return builder


def _unregister(name: str) -> None:
    """Removes a variant (tests only)."""
    del _REGISTRY[name]


@contextlib.contextmanager
def temporarily_registered(name: str, builder: Builder,
                           capabilities: Capabilities) -> Iterator[None]:
    """Registers a variant for the duration of a `with` block (tests only)."""
    register(name, builder, capabilities)
    try:
        yield
    finally:
        _unregister(name)


def _load_all() -> None:
    for package in _VARIANT_PACKAGES:
        importlib.import_module(package)
    for module in [m.strip() for m in os.environ.get("LRA_IMPORTS", "").split(",") if m.strip()]:
        import_user_module(module, "LRA_IMPORTS names")


def import_user_module(module: str, given: str) -> None:
    """Imports a user's module that registers variants (`--import`, LRA_IMPORTS).
    RegistryError, naming how it was `given`, when the module itself is not found, or when
    it registers what the registry refuses; a module it imports that is missing is the
    user's code's error and propagates."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and module != e.name and not module.startswith(e.name + "."):
            raise
        raise RegistryError(
            f"{given} {module!r}: no such module in {os.getcwd()} nor on PYTHONPATH; give "
            f"the module (e.g. {module.replace('.', '/')}.py in this folder) that registers "
            "your variants (docs/variants.md#adding-a-variant)") from None


def unknown_model(name: str) -> str:
    """The refusal of a name that is not registered (here, the configs, lra.sweep)."""
    return (f"unknown model {name!r}; available: {', '.join(available())}. A variant of your "
            "own registers in your module: --import=<module> (lra.launch, lra.sweep) or "
            "LRA_IMPORTS=<module> (docs/variants.md#adding-a-variant)")


def _entry(name: str) -> _Entry:
    _load_all()
    if name not in _REGISTRY:
        raise RegistryError(unknown_model(name))
    return _REGISTRY[name]


def available() -> list[str]:
    """Sorted names of all registered variants."""
    _load_all()
    return sorted(_REGISTRY)


def capabilities(name: str) -> Capabilities:
    return _entry(name).capabilities


def module_of(name: str) -> str:
    """The module whose builder registers `name` (`models.attention.sparse` for
    transformer, local, bigbird, ...): variants of one module share their code, and the
    test suite's default tier takes one of each (tests/tiers.py)."""
    builder = _entry(name).builder
    return getattr(builder, "__module__", None) or type(builder).__module__


def accepted_hparams(name: str) -> dict[str, Any]:
    """Accepted hparams of `name` and their defaults (`inspect.Parameter.empty` if required)."""
    return dict(_entry(name).hparams)


def check_rotary(name: str) -> None:
    """Raises RegistryError, in one line saying why, if `name` does not take rotary."""
    caps = _entry(name).capabilities
    if not caps.rotary:
        why = caps.rotary_refusal or "it does not declare Capabilities.rotary"
        raise RegistryError(f"model {name!r} does not take pos_emb='rotary': {why}; use "
                            "pos_emb=learned or sinusoidal")


def build(name: str, *, dim: int, num_heads: int, max_len: int, causal: bool = False,
          prefix_len: int = 0, rotary: bool = False, rngs: nnx.Rngs,
          **hparams: Any) -> nnx.Module:
    """Builds the token mixer `name`; raises RegistryError on what it cannot do.

    `max_len` counts every position the mixer sees; the first `prefix_len` of them are
    not content (the encoder's CLS slot). Builders that take `prefix_len` state their
    geometry for the content and make the prefix global; to the others the prefix is
    one more token. `rotary`: rotate queries and keys by position (variants with
    `Capabilities.rotary` only).
    """
    entry = _entry(name)
    if causal and not entry.capabilities.causal:
        raise RegistryError(f"model {name!r} does not support causal=True")
    if rotary:
        check_rotary(name)
    if not 0 <= prefix_len < max_len:
        raise RegistryError(f"prefix_len must be in [0, max_len={max_len}), got {prefix_len}")
    _check_hparams(name, entry, hparams)
    extra = {"prefix_len": prefix_len} if entry.takes_prefix else {}
    if entry.capabilities.rotary:
        extra["rotary"] = rotary
    return entry.builder(dim=dim, num_heads=num_heads, max_len=max_len, causal=causal,
                         rngs=rngs, **extra, **hparams)

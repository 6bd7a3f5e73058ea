"""Hybrid stacks in the config (issue 45): a model is a list of layers, each a registered
mixer with its own hparams (and, optionally, its own block settings and parameter groups).

The single-mixer model is the list with config.model in every layer; a config that sets
none of the fields below builds exactly that, through the same code as before (same
parameter tree, results and checkpoints). The list goes through registry -> blocks ->
stacks -> encoder (`models.stacks`, `layers=`): there is no second model tree.

Forms, concise first (each field takes a --config.<field>= override; examples on ListOps):

  fla's `attn={'layers': [1, 3]}`: the given layers are config.hybrid.mixer, the others
  config.model.
      python launch.py --config=configs/listops.py:model=gla,hybrid=transformer \
          --config.num_layers=4 --config.hybrid.layers=1,3 --workdir=...
  Jamba's attn_layer_period / attn_layer_offset: layer l is hybrid.mixer when
  l % period == offset.
      ... model=mamba2,hybrid=transformer --config.num_layers=8 \
          --config.hybrid.period=4 --config.hybrid.offset=2
  RecurrentGemma's block_types: a pattern of names repeated (and cut) over num_layers.
      ... model=gla --config.num_layers=6 --config.hybrid.pattern=gla,gla,local
  The full list (MAD's flat layer list): one entry per layer, len == num_layers; an entry
  is a name, or (in a config file or a Python literal) a dict {"model": name,
  "model_hparams": {...}, "block": {...}, "param_groups": {...}}.
      ... model=gla --config.num_layers=4 --config.layers=gla,local,gla,transformer
      --config.layers="('gla', {'model': 'local', 'model_hparams': {'window': 4}})"

A hybrid layer's own positions, heads and window (config.hybrid.pos_emb, num_heads,
window: LAYER_FIELDS; docs/hybrids.md): by default its mixer rotates queries and keys
(rotary, fla's hybrid attention), with the model's heads and the mixer's preset window.
      ... model=gla,hybrid=local --config.hybrid.layers=1 --config.hybrid.window=2048

What each layer gets:
  hparams   config.model's layers: config.model_hparams (as a single-mixer model); any
            other mixer: its presets (configs/presets.py, scaled to the max_length the
            config was built at, config.hybrid.preset_length, as config.model_hparams
            are), with config.hybrid.model_hparams over them for
            hybrid.mixer's layers and a dict entry's model_hparams over them for its layer.
            The config argument `hybrid=<mixer>` sets hybrid.mixer and writes its (scaled)
            presets into hybrid.model_hparams and its preset groups into
            hybrid.param_groups, so that they have fields to override
            (--config.hybrid.model_hparams.window=8), as `model=` does for model_hparams.
  block     config.block (the model's; the stack and its settings are the model's), then
            the per-layer keys (models.stacks.BLOCK_LAYER_KEYS: kind, ffn, ffn_chunks,
            gate_bias, short_conv) that the layer's mixer implies, then hybrid.block for hybrid.mixer's
            layers (--config.hybrid.block.ffn=False), or a dict entry's block.
  groups    config.param_groups for config.model's layers and every parameter outside the
            stack; hybrid.param_groups (over hybrid.mixer's preset groups) for hybrid.mixer's
            layers only; a dict entry's param_groups over its mixer's presets (lra/training/optim.py
            looks a parameter's group up in its own layer's settings).
  kernels   config.attention_impl goes to every layer whose mixer has the choice; a layer's
            own hparams may name another (--config.hybrid.model_hparams.attention_impl=
            pallas: the kernel in hybrid.mixer's layers only; `hybrid=<mixer>` gives a
            mixer with the choice that field, "" = config.attention_impl's). One that no
            layer takes is refused.

Name: config.model, then `+<mixer>@<layer indices>` per other mixer, e.g.
`gla+transformer@1,3` (results.json's `model`, lra.report's rows, the training log;
results.json's `layers` holds the resolved list). An unknown mixer, an index out of range,
a selection that leaves no layer of config.model, or two forms at once: one ConfigError
line from `layer_list` (common.validate calls it) before anything runs.
"""
from __future__ import annotations

from typing import Any, Mapping

import ml_collections

from configs import presets
from lra.errors import ConfigError

# config.hybrid's fields besides model_hparams, block and param_groups (ConfigDicts).
FIELDS = {"mixer": "", "layers": (), "period": 0, "offset": 0, "pattern": ()}
# What the layers of a mixer other than config.model (the hybrid's layers: hybrid.mixer's,
# or another mixer's in a pattern or full list) get of their own, as fla's hybrid `attn`
# layers (fla/models/utils.py and the models' `attn` config: rotary, num_heads,
# window_size):
#   pos_emb   "rotary" (fla's): a layer whose mixer takes rotary rotates its queries and
#             keys, whatever the base model's positions (gla and mamba2 have none: their
#             attention layer would otherwise see no position); "inherit": the base
#             model's positions only (the hybrids of results/cpu/hybrids.md before
#             2026-12-03)
#   num_heads 0: config.num_heads; else that layer's heads
#   window    0: the mixer's preset (scaled to the length); else its `window` hparam
#             (sliding-window layers, `local`: Samba's and Gated DeltaNet-H1's are 2,048)
LAYER_FIELDS = {"pos_emb": "rotary", "num_heads": 0, "window": 0}
HYBRID_POS_EMBS = ("rotary", "inherit")
# The max_length the layers' presets are taken at (0: config.max_length). common.finalize
# records the config's length here, so that `--config.max_length=` after get_config (or a
# tool that sets it, lra.cache_memory) leaves every layer's presets where it leaves the
# base model's config.model_hparams: at the length the config was built for.
PRESET_LENGTH = "preset_length"
ENTRY_KEYS = ("model", "model_hparams", "block", "param_groups")
# hybrid.model_hparams.attention_impl of a mixer with a choice of kernel (finalize): "" is
# config.attention_impl's; another value is the kernel of hybrid.mixer's layers only.
INHERIT_IMPL = ""


def defaults() -> ml_collections.ConfigDict:
    """config.hybrid of a single-mixer model (base_config)."""
    c = ml_collections.ConfigDict({**FIELDS, **LAYER_FIELDS})
    c.model_hparams = ml_collections.ConfigDict()
    c.block = ml_collections.ConfigDict()
    c.param_groups = ml_collections.ConfigDict()
    return c


def _plain(value: Any) -> Any:
    return value.to_dict() if isinstance(value, ml_collections.ConfigDict) else value


def _names(value: Any) -> tuple[str, ...]:
    """('gla,gla,transformer',) or ('gla', 'gla', ...) -> ('gla', 'gla', 'transformer')."""
    if isinstance(value, str):
        value = (value,)
    out = []
    for v in value or ():
        out.extend(s.strip() for s in v.split(",")) if isinstance(v, str) else out.append(v)
    return tuple(v for v in out if v != "")


def _indices(value: Any) -> tuple[int, ...]:
    out = []
    for v in _names(value) if not isinstance(value, int) else (value,):
        try:
            out.append(int(v))
        except (TypeError, ValueError):
            raise ConfigError(f"config.hybrid.layers={value!r}: layer indices are integers, "
                              "e.g. --config.hybrid.layers=1,3") from None
    return tuple(out)


def _hybrid(config: Any) -> dict[str, Any]:
    h = _plain(config.get("hybrid")) or {}
    # A config recorded before LAYER_FIELDS existed ran with the base model's positions.
    old = {} if "pos_emb" in h else {"pos_emb": "inherit"}
    return {**FIELDS, **LAYER_FIELDS, **old, "model_hparams": {}, "block": {},
            "param_groups": {}, **h}


def is_hybrid(config: Any) -> bool:
    """Whether the config asks for a layer list (any field of the forms above set)."""
    h = _hybrid(config)
    return bool(h["mixer"] or _names(h["pattern"]) or _names(h["layers"]) or h["period"]
                or h["offset"] or bool(_plain(config.get("layers"))))


def _entry_name(entry: Any) -> Any:
    return entry.get("model") if isinstance(entry, Mapping) else entry


def _entries(config: Any) -> list[Any]:
    """One unresolved entry (a name or a dict) per layer, from whichever form is set."""
    base, num_layers = config.get("model"), int(config.get("num_layers"))
    h = _hybrid(config)
    full = _plain(config.get("layers")) or ()
    full = [_plain(e) for e in ((full,) if isinstance(full, str) else full)]
    if all(isinstance(e, str) for e in full):  # ('gla,local',) from the command line
        given, full = bool(full), list(_names(full))
        if given and not full:  # --config.layers= : the field set, to no layer
            raise ConfigError(f"config.layers is empty; give one mixer per layer "
                              f"(config.num_layers={num_layers}), e.g. --config.layers="
                              f"{','.join([str(base)] * num_layers)}, or leave it unset "
                              f"for config.model in every layer")
    mixer, pattern = h["mixer"], _names(h["pattern"])
    indices, period, offset = _indices(h["layers"]), int(h["period"]), int(h["offset"])
    concise = [f for f, v in (("hybrid.mixer", mixer), ("hybrid.layers", indices),
                              ("hybrid.period", period), ("hybrid.offset", offset),
                              ("hybrid.pattern", pattern)) if v]
    if full:
        if concise:
            raise ConfigError(f"config.layers (the full list) and config.{concise[0]} (a "
                              "concise form) both set the layers; set one of them")
        if len(full) != num_layers:
            raise ConfigError(f"config.layers lists {len(full)} layers but config.num_layers="
                              f"{num_layers}; set --config.num_layers={len(full)}")
        return full
    if pattern:
        if indices or period or offset:
            raise ConfigError("config.hybrid.pattern is repeated over every layer; it does not "
                              "combine with hybrid.layers, hybrid.period or hybrid.offset")
        return [pattern[l % len(pattern)] for l in range(num_layers)]
    if not mixer:
        raise ConfigError(f"config.{concise[0]} selects layers for config.hybrid.mixer, which "
                          "is not set: add --config.hybrid.mixer=<name> (or the config "
                          "argument hybrid=<name>)")
    if indices and (period or offset):
        raise ConfigError("config.hybrid.layers and config.hybrid.period/offset both select "
                          "layers; set one of them")
    if indices:
        bad = [i for i in indices if not 0 <= i < num_layers]
        if bad:
            raise ConfigError(f"config.hybrid.layers={','.join(map(str, indices))}: "
                              f"{', '.join(map(str, bad))} out of range for config.num_layers="
                              f"{num_layers} (layers 0..{num_layers - 1})")
        chosen = set(indices)
    elif period:
        if period < 1 or not 0 <= offset < period:
            raise ConfigError(f"config.hybrid.period={period}, offset={offset}: need period >= "
                              "1 and 0 <= offset < period (layer l is hybrid.mixer when "
                              "l % period == offset)")
        chosen = {l for l in range(num_layers) if l % period == offset}
        if not chosen:
            raise ConfigError(f"config.hybrid.period={period}, offset={offset} selects none of "
                              f"the {num_layers} layers")
    else:
        raise ConfigError(f"config.hybrid.mixer={mixer!r} selects no layer: give "
                          "config.hybrid.layers (e.g. 1,3), config.hybrid.period (and offset) "
                          "or use config.hybrid.pattern")
    if mixer == base:
        raise ConfigError(f"config.hybrid.mixer is config.model ({base!r}); layers of one mixer "
                          "with other hparams are a full list: config.layers with dict entries")
    return [mixer if l in chosen else base for l in range(num_layers)]


def layer_names(config: Any) -> list[str] | None:
    """The mixer of every layer, checked (ConfigError in one line); None when the config
    sets no hybrid field (the single-mixer model)."""
    if not is_hybrid(config):
        return None
    from models import registry  # imports jax; only when a model is asked for

    base, known = config.get("model"), registry.available()
    entries = _entries(config)
    mixer = _hybrid(config)["mixer"]
    if mixer and mixer not in known:
        raise ConfigError(f"unknown mixer config.hybrid.mixer={mixer!r}; available: "
                          f"{', '.join(known)}")
    names = []
    for l, entry in enumerate(entries):
        if isinstance(entry, Mapping):
            extra = sorted(set(entry) - set(ENTRY_KEYS))
            if extra or "model" not in entry:
                raise ConfigError(f"layer {l} of config.layers is {entry!r}: an entry is a "
                                  f"name or a dict with 'model' and optionally "
                                  f"{', '.join(ENTRY_KEYS[1:])}")
        name = _entry_name(entry)
        if name not in known:
            raise ConfigError(f"unknown mixer {name!r} at layer {l} (layers: "
                              f"{', '.join(map(str, map(_entry_name, entries)))}); available: "
                              f"{', '.join(known)}")
        names.append(name)
    if base not in names:
        raise ConfigError(f"the layers ({', '.join(names)}) leave no layer of config.model="
                          f"{base!r}, the base mixer; keep at least one (or make the model "
                          "another mixer of the list)")
    return names


def _merge_groups(*sources: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for source in sources:
        for group, settings in (_plain(source) or {}).items():
            out[group] = {**out.get(group, {}), **(_plain(settings) or {})}
    return out


def _presets(config: Any, name: str) -> dict[str, Any]:
    """`name`'s presets at the config's task and max_length (with a dropout-free config's
    dropout hparams zeroed, as common.finalize does)."""
    length = _hybrid(config).get(PRESET_LENGTH) or config.get("max_length")
    hp = presets.model_hparams(name, presets.preset_task(config.get("task")),
                               max_length=length)
    if config.get("dropout_rate") == 0.0 and config.get("attention_dropout_rate") == 0.0:
        hp.update({k: 0.0 for k in presets.DROPOUT_HPARAMS if k in hp})
    return hp


def layer_list(config: Any) -> list[dict[str, Any]] | None:
    """Every layer, resolved: {"model", "model_hparams", "block" (per-layer overrides),
    "param_groups"} (module docstring); None for a single-mixer config. ConfigError in
    one line on anything the forms cannot mean."""
    names = layer_names(config)
    if names is None:
        return None
    from models.stacks import BLOCK_LAYER_KEYS

    base, h = config.get("model"), _hybrid(config)
    task = presets.preset_task(config.get("task"))
    out = []
    for l, (name, entry) in enumerate(zip(names, _entries(config))):
        own = dict(entry) if isinstance(entry, Mapping) else {}
        if name == base:
            hp, block = dict(_plain(config.get("model_hparams")) or {}), {}
            groups = _merge_groups(config.get("param_groups"))
        else:
            hp, block = _presets(config, name), {}
            groups = _merge_groups(presets.param_groups(name, task))
            if name == h["mixer"]:
                hp.update(_plain(h["model_hparams"]) or {})
                if hp.get("attention_impl") == INHERIT_IMPL:  # config.attention_impl's
                    del hp["attention_impl"]
                block = dict(_plain(h["block"]) or {})
                groups = _merge_groups(groups, h["param_groups"])
        extra = {} if name == base else _layer_settings(config, name, h, hp)
        hp.update(_plain(own.get("model_hparams")) or {})
        block.update(_plain(own.get("block")) or {})
        groups = _merge_groups(groups, own.get("param_groups"))
        unknown = sorted(set(block) - set(BLOCK_LAYER_KEYS))
        if unknown:
            raise ConfigError(f"layer {l} ({name}) sets block {', '.join(map(repr, unknown))}; "
                              f"a layer may set only {', '.join(BLOCK_LAYER_KEYS)} (the stack "
                              "and its settings are the model's: config.block)")
        out.append({"model": name, "model_hparams": hp, "block": block,
                    "param_groups": groups, **extra})
    return out


def _layer_settings(config: Any, name: str, h: dict, hp: dict) -> dict[str, Any]:
    """A hybrid layer's own positions and heads (LAYER_FIELDS), for the layer spec
    (models.stacks takes `rotary` and `num_heads`); its window goes into `hp`."""
    from models import registry

    pos_emb, heads, window = h["pos_emb"], int(h["num_heads"] or 0), int(h["window"] or 0)
    if pos_emb not in HYBRID_POS_EMBS:
        raise ConfigError(f"config.hybrid.pos_emb={pos_emb!r}; choose one of "
                          f"{', '.join(HYBRID_POS_EMBS)}")
    if heads < 0 or window < 0:
        raise ConfigError(f"config.hybrid.num_heads={heads} and config.hybrid.window={window} "
                          "must be >= 0 (0: the model's heads, the mixer's preset window)")
    if window:
        if "window" not in registry.accepted_hparams(name):
            raise ConfigError(f"config.hybrid.window={window}, but {name!r} has no window "
                              "(a sliding-window layer is `local`)")
        hp["window"] = window
    # A benchmark's scaffold switches every layer's own short convolution, whichever form
    # made the list (configs/scaffold.py builtin_conv; a dict entry's own hparams win).
    s = config.get("scaffold") or {}
    knob = registry.capabilities(name).short_conv_hparam
    if s.get("name") and knob and int(s.get("builtin_conv", -1)) >= 0:
        hp[knob] = int(s["builtin_conv"])
    extra: dict[str, Any] = {}
    if pos_emb == "rotary" and registry.capabilities(name).rotary:
        extra["rotary"] = True
    if heads:
        for field in ("emb_dim", "qkv_dim"):
            if int(config.get(field)) % heads:
                raise ConfigError(f"config.hybrid.num_heads={heads} does not divide "
                                  f"config.{field} ({config.get(field)})")
        extra["num_heads"] = heads
    return extra


def name_of(names: list[str] | None, base: str) -> str:
    """`gla+transformer@1,3`: the base, then each other mixer at its layer indices."""
    if names is None:
        return base
    others: dict[str, list[int]] = {}
    for l, n in enumerate(names):
        if n != base:
            others.setdefault(n, []).append(l)
    return base + "".join(f"+{n}@{','.join(map(str, idx))}" for n, idx in others.items())


def name(config: Any) -> str:
    """The model's name: config.model, or for a hybrid `gla+transformer@1,3`."""
    return name_of(layer_names(config), config.get("model"))


def describe_of(names: list[str] | None, base: str, num_layers: int) -> str:
    """'gla+transformer@1,3 (layers: gla, transformer, gla, transformer)', or 'gla in all
    4 layers' when `names` is None (a single-mixer model)."""
    if names is None:
        return f"{base} in all {num_layers} layers"
    return f"{name_of(names, base)} (layers: {', '.join(names)})"


def describe(config: Any) -> str:
    """'gla+transformer@1,3 (layers: gla, transformer, gla, transformer)' for messages."""
    return describe_of(layer_names(config), config.get("model"), config.get("num_layers"))


def check(config: Any) -> None:
    """ConfigError in one line for a layer list that cannot run: the forms (layer_list),
    a layer that is not causal in a causal model, a stack that takes no list."""
    layers = layer_list(config)
    if layers is None:
        return
    from models import registry

    if config.get("causal"):
        for l, spec in enumerate(layers):
            if not registry.capabilities(spec["model"]).causal:
                raise ConfigError(f"layer {l} ({spec['model']}) is not causal, so config.causal"
                                  f"=True is impossible for {describe(config)}")
    stack = (_plain(config.get("block")) or {}).get("stack", "sequential")
    if stack == "universal":
        raise ConfigError(f"the universal stack applies one shared block at every step; "
                          f"{describe(config)} needs config.block.stack=sequential")
    from lra.training.optim import settings_of  # imports optax; only here

    for l, spec in enumerate(layers):
        settings_of(spec["param_groups"], config.get("weight_decay"),
                    where=f"the param_groups of layer {l} ({spec['model']})")


def apply_arg(c: ml_collections.ConfigDict, mixer: str) -> None:
    """The config argument `hybrid=<mixer>`: config.hybrid.mixer, with its presets in
    hybrid.model_hparams (scaled by `finalize`) and its preset groups in
    hybrid.param_groups, so that overrides have fields to set."""
    from models import registry

    if mixer not in registry.available():
        raise ConfigError(f"unknown mixer in config argument hybrid={mixer!r}; available: "
                          f"{', '.join(registry.available())}")
    c.hybrid.mixer = mixer
    c.hybrid.param_groups = ml_collections.ConfigDict(
        presets.param_groups(mixer, presets.preset_task(c.task)))
    finalize(c)


def finalize(c: ml_collections.ConfigDict) -> None:
    """hybrid.mixer's presets at c.max_length into hybrid.model_hparams (common.finalize,
    after mini/runlocal set the length); nothing for a config without hybrid.mixer."""
    if "hybrid" not in c:
        return
    c.hybrid[PRESET_LENGTH] = int(c.max_length)
    mixer = c.hybrid.get("mixer")
    if not mixer:
        return
    hp = _presets(c, mixer)
    from models import registry

    if "attention_impl" in registry.accepted_hparams(mixer):
        # A field for --config.hybrid.model_hparams.attention_impl=<kernel> to set.
        hp.setdefault("attention_impl", INHERIT_IMPL)
    c.hybrid.model_hparams = ml_collections.ConfigDict(hp)


# ------------------------------------------------------------------ names as model specs
# The tools that take a list of models (lra.benchmark, lra.bench_generate,
# lra.cache_memory) take a hybrid by its name: --models=transformer,gla+transformer@1,3
# (a list flag splits at the commas: `split_models` joins an index back to its name).


def split_models(items: list[str]) -> list[str]:
    """A --models list with hybrid names put back together: ['gla+transformer@1', '3',
    'local'] -> ['gla+transformer@1,3', 'local'] (a bare index is never a model)."""
    out: list[str] = []
    for item in items:
        item = item.strip()
        if item.isdigit() and out and "@" in out[-1]:
            out[-1] += "," + item
        elif item:
            out.append(item)
    return out


def is_name(model: str) -> bool:
    """Whether `model` names a hybrid (`gla+transformer@1,3`) rather than one mixer."""
    return "+" in model or "@" in model


def parse_name(model: str) -> tuple[str, list[tuple[str, list[int]]]]:
    """'gla+transformer@1,3+local@2' -> ('gla', [('transformer', [1, 3]), ('local', [2])]);
    ConfigError in one line when it is not of that form."""
    base, *others = model.split("+")
    parsed = []
    for part in others:
        mixer, at, indices = part.partition("@")
        try:
            layers = [int(i) for i in indices.split(",")] if at else []
        except ValueError:
            layers = []
        if not mixer or not layers:
            raise ConfigError(f"{model!r} is not a hybrid's name: write <model>+<mixer>@<layer "
                              "indices>, e.g. gla+transformer@1,3")
        parsed.append((mixer, layers))
    if not base or "@" in base or not parsed:
        raise ConfigError(f"{model!r} is not a hybrid's name: write <model>+<mixer>@<layer "
                          "indices>, e.g. gla+transformer@1,3")
    return base, parsed


def base_of(model: str) -> str:
    """The base mixer of a model or hybrid name (what get_config's `model=` takes)."""
    return parse_name(model)[0] if is_name(model) else model


def apply_name(config: ml_collections.ConfigDict, model: str) -> None:
    """Makes `config` (built with model=base_of(model)) the hybrid `model` names, as the
    full list config.layers at its num_layers; checked (layer_names). A plain name: no
    change."""
    if not is_name(model):
        return
    base, others = parse_name(model)
    if base != config.model:
        raise ConfigError(f"{model!r} is a hybrid of {base!r}; the config's model is "
                          f"{config.model!r}")
    names = [base] * int(config.num_layers)
    for mixer, layers in others:
        for l in layers:
            if not 0 <= l < len(names):
                raise ConfigError(f"{model!r}: layer {l} out of range for num_layers="
                                  f"{len(names)} (layers 0..{len(names) - 1})")
            names[l] = mixer
    config.layers = tuple(names)
    layer_names(config)


def decode_forms(config: Any) -> str:
    """The decoding forms of the layers (Capabilities.decode), e.g.
    'recurrent_state+kv_cache' (each form once, in layer order)."""
    from models import registry

    names = layer_names(config) or [config.get("model")]
    return "+".join(dict.fromkeys(registry.capabilities(n).decode for n in names))

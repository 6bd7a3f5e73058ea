"""What a run is, resolved once from its finalised config: `resolve(config) -> RunSpec`.

The config says how to build a run in forms a user writes (configs/hybrid.py's concise
forms, `hybrid=<mixer>`, a full layer list, parameter groups by name); the spec is what
those forms mean: every layer's mixer, hparams, block and parameter groups, the model's
name, and the optimiser's group settings per layer. lra.train resolves it right after
common.resolve and common.validate, and hands it as data to what used to re-read the
config: the model builder (`layers=`), the optimiser (lra/training/optim.py), resume and
init_from (the layer list compared with a checkpointed run's), the scaffold card
(lra/runs/card.py) and results.json (`model`, `layers`).

Only this module (and configs/ itself) resolves layer lists through configs/hybrid.py on
the training path; lra/training/optim.py imports nothing of configs/ (tests/test_imports.py).
A checkpointed run's own config is resolved here too, to compare: `resolve(saved)`
(resume: the whole layer list) or `layers_of(saved)` (init_from: the mixers only).
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any

from configs import hybrid
from lra.training.optim import settings_of


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """A config's run, resolved (`resolve`). Treat the dicts as read-only: `layer_list()`
    gives a copy for code that may change it."""
    # config.model: the base mixer (every layer's, for a single-mixer model).
    model: str
    num_layers: int
    # Every layer resolved ({"model", "model_hparams", "block", "param_groups", and a
    # hybrid layer's own "rotary" / "num_heads"}: configs/hybrid.py layer_list); None for
    # a single-mixer model, built from config.model and config.model_hparams as before.
    layers: tuple[dict[str, Any], ...] | None
    # results.json's `model`: config.model, or a hybrid's `gla+transformer@1,3`.
    name: str
    # For messages: 'gla+transformer@1,3 (layers: gla, transformer, gla, transformer)',
    # or 'gla in all 4 layers'.
    description: str
    # config.param_groups' settings ({group: {"lr_scale", "weight_decay"}}, defaults
    # filled in: lra/training/optim.py settings_of).
    groups: dict[str, dict[str, float]]
    # Per layer of a hybrid, the settings its parameters train with (config.param_groups
    # for config.model's layers, the layer's own for the others); None otherwise.
    layer_groups: tuple[dict[str, dict[str, float]], ...] | None

    @property
    def is_hybrid(self) -> bool:
        return self.layers is not None

    @property
    def layer_names(self) -> tuple[str, ...] | None:
        """Every layer's mixer of a hybrid; None for a single-mixer model."""
        return None if self.layers is None else tuple(l["model"] for l in self.layers)

    @property
    def names(self) -> tuple[str, ...]:
        """Every layer's mixer (config.model repeated for a single-mixer model)."""
        return self.layer_names or (self.model,) * self.num_layers

    def layer_list(self) -> list[dict[str, Any]] | None:
        """A copy of `layers` as a list (the model builder's `layers=`, results.json's
        `layers`); None for a single-mixer model."""
        return None if self.layers is None else copy.deepcopy(list(self.layers))


def resolve(config: Any) -> RunSpec:
    """The RunSpec of a finalised config (a ConfigDict, or a checkpoint's config dict).
    ConfigError in one line on layer forms or parameter groups that cannot run."""
    base = config.get("model")
    num_layers = int(config.get("num_layers"))
    layers = hybrid.layer_list(config)
    weight_decay = config.get("weight_decay", 0.0)
    layer_groups = None if layers is None else tuple(
        settings_of(spec["param_groups"], weight_decay,
                    where=f"the param_groups of layer {l} ({spec['model']})")
        for l, spec in enumerate(layers))
    names = None if layers is None else [l["model"] for l in layers]
    return RunSpec(
        model=base, num_layers=num_layers,
        layers=None if layers is None else tuple(layers),
        name=hybrid.name_of(names, base),
        description=hybrid.describe_of(names, base, num_layers),
        groups=settings_of(config.get("param_groups"), weight_decay),
        layer_groups=layer_groups)


@dataclasses.dataclass(frozen=True)
class Layers:
    """A config's mixers only (`layers_of`): what init_from compares with an earlier run."""
    model: str
    # Every layer's mixer of a hybrid; None for a single-mixer model.
    layer_names: tuple[str, ...] | None
    names: tuple[str, ...]  # every layer's mixer
    description: str

    @property
    def is_hybrid(self) -> bool:
        return self.layer_names is not None


def layers_of(config: Any) -> Layers:
    """The mixers of a config's layers (a checkpointed run's config dict, typically),
    without resolving their hparams or groups: ConfigError only for forms that cannot
    mean a list."""
    base, num_layers = config.get("model"), int(config.get("num_layers"))
    names = hybrid.layer_names(config)
    return Layers(model=base, layer_names=None if names is None else tuple(names),
                  names=tuple(names) if names is not None else (base,) * num_layers,
                  description=hybrid.describe_of(names, base, num_layers))

"""Variant hyperparameter presets, shared by every task config.

`model_hparams(model, task)` gives the keyword arguments passed to
`models.registry.build(model, ...)`, beyond the common ones (dim, heads, qkv_dim, dropout).
Defaults follow the papers and LRA's configs (see ../shared/VARIANTS.md); a task may
override a variant's value where LRA did (e.g. a shorter window for a shorter task).
"""
from __future__ import annotations

from typing import Any

from lra.errors import ConfigError

# model -> hparams used for every task.
PRESETS: dict[str, dict[str, Any]] = {
    "transformer": {},
}

# (model, task) -> overrides of PRESETS[model] for that task.
TASK_OVERRIDES: dict[tuple[str, str], dict[str, Any]] = {}


def model_hparams(model: str, task: str) -> dict[str, Any]:
    from models import registry  # the registry is the source of truth for names

    if model not in registry.available():
        raise ConfigError(
            f"unknown model {model!r}; available: {', '.join(registry.available())}"
        )
    return {**PRESETS.get(model, {}), **TASK_OVERRIDES.get((model, task), {})}

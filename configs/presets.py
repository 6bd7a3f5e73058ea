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
    # Kernelised variants (models/attention/linear.py).
    "linear": {"eps": 1e-6},
    "performer": {"num_features": 256, "kernel": "softmax", "redraw_interval": 1000},
    "rfa": {"num_features": 128, "gate": False, "redraw_interval": 1000},
    "fast_weight": {"feature_map": "dpfp", "dpfp_nu": 1},
    # Low-rank / memory variants (models/attention/lowrank.py, memory.py).
    "linformer": {"k": 32, "share_kv": False},  # VARIANTS.md: LRA k 16-32
    "compressed": {"compression": 3},
    "synthesizer": {"mode": "dense", "k": 8, "fixed_random": False},
    "set_transformer": {"num_inducing": 32},
    "luna": {"packed_len": 16},
    "poolingformer": {"window1": 64, "window2": 256, "pool_size": 5, "pool_stride": 4},
    # Position-based sparse patterns (models/attention/sparse.py, models/masks.py).
    "local": {"window": 128},
    "strided": {"heads": "union"},  # stride defaults to ~sqrt(max_len)
    "fixed": {"block": 128, "c": 8, "heads": "union"},
    "dilated": {"window": 64, "dilation": 2},
    "global": {"num_global": 1, "extra_tokens": False},  # position 0 = CLS
    "random": {"num_random": 8},
    "block_local": {"block": 128, "memory": 128},
    "local_2d": {"query_height": 8, "query_width": 16, "flange_height": 8,
                 "flange_width": 8},  # width defaults to ceil(sqrt(max_len))
    "longformer": {"window": 256, "num_global": 1},
    "bigbird": {"block": 64, "num_random_blocks": 3, "num_global_blocks": 2},
    "axial": {"mode": "sum"},
    "star": {"cycles": 2},
    "bp_transformer": {"k": 4},  # max_level defaults to ceil(log2(max_len))
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

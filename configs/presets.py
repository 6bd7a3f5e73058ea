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
    # Content-based sparse attention (models/attention/routing.py, sinkhorn.py).
    # routing: num_clusters defaults to round(sqrt(max_len)), window to ceil(L / clusters).
    "routing": {"decay": 0.999, "commitment": 1e-4, "shared_qk": True},
    "sinkhorn": {"block_size": 64, "sinkhorn_iters": 5, "temperature": 0.75,
                 "normalization": "sinkhorn"},
    # reformer (models/attention/lsh.py): reversible stack by default (Capabilities.block).
    "reformer": {"n_buckets": 32, "n_hashes": 2, "chunk_len": 64},
    # Learned / query-prototype sparsity (models/attention/sac.py, clustered.py, probsparse.py).
    "sac": {"k": 32, "rank": 16},
    "clustered": {"mode": "clustered", "num_clusters": 100, "iterations": 10, "bits": 32,
                  "topk": 32},  # Vyas et al.: C = 100, 10 Lloyd steps; mode="improved" too
    "informer": {"factor": 5},  # u = U = 5 * ceil(ln L)
    # Span, recurrence, depth (models/attention/span.py, relative.py, universal.py); their
    # block/stack settings (segment_len, mem_len, gate_bias, act_*) are config.block keys.
    "adaptive_span": {"ramp": 32.0, "span_init": 0.0, "l1_weight": 2e-6},  # S = max_len
    "transformer_xl": {},
    "gtrxl": {},
    "universal": {},
    # Attention-free mixers (models/mixers/).
    "gmlp": {"init_eps": 1e-3},  # ffn_dim defaults to 6 * emb_dim (the paper's ratio)
    "mixer": {"token_dim": 256},  # Mixer-S's D_S
    "fnet": {"norm": "ortho"},  # the paper's unnormalised DFT is norm="backward"
    # Lite Transformer LSRA (models/mixers/lite.py). The paper's "flattened" FFN has no
    # bottleneck: also pass --config.mlp_dim=<emb_dim> (e.g. 512 for listops).
    "lite": {"kernel_size": 31, "conv": "dynamic", "glu": True, "weight_dropout": 0.1},
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

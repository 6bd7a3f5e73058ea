"""Variant hyperparameter presets, shared by every task config.

`model_hparams(model, task, max_length=L)` gives the keyword arguments passed to
`models.registry.build(model, ...)`, beyond the common ones (dim, heads, qkv_dim, dropout).
Defaults follow the papers and LRA's configs (see ../shared/VARIANTS.md); a task may
override a variant's value where LRA did (e.g. a shorter window for a shorter task).

Sizes that the papers or LRA chose for a sequence length are stated here at each task's
reference length, `REFERENCE_LENGTHS[task]`: the full-size task config's max_length.
`model_hparams` adapts them to `max_length` by a rule per key (`LENGTH_SCALED`), chosen by
what the size means:
- "linear": a number of tokens that is a fraction of the keys (a window, a block, a chunk,
  a number of random keys): value * L / L_ref, rounded, at least 1, so that the variant
  attends to the same fraction of the keys at any length. A `mini` config with 64 tokens
  gets ListOps' window of 128 of 2000 tokens as a window of 4, not a window that covers
  the whole input (dense attention under another name).
- "blocks": as "linear", but at least MIN_BLOCK (4) tokens (or the stated value, if
  smaller): the blocks that MoBA and NSA select by their pooled keys, and NSA's window. A
  block of one token is top-k token attention, not block selection (MoBA and NSA at MAD's
  32 tokens got blocks of 1 before this floor).
- "sqrt": a side of a rectangle on the raster of ceil(sqrt(L)) columns (local_2d's query
  and flange sizes): value * sqrt(L / L_ref), so the area fraction stays.
- "summaries": a rank or a bottleneck, i.e. how many summaries the method computes
  (Linformer's k, Set Transformer's inducing points, Luna's packed length, clusters) or
  how many keys a query's softmax weighs (SAC's k, clustered's top-k). These are not a
  fraction of the keys, and scaled linearly they reach 1 at short lengths, where the
  method degenerates: a softmax over one summary weighs it 1 whatever the query, so every
  position gets the same vector and the query/key projections get no gradient (issue 27:
  linformer, set_transformer, luna and sac at ListOps mini). They are not scaled: the
  stated value, but at most max(MIN_SUMMARIES, L // 4), so that a short input is still
  compressed (the papers keep k fixed as L grows: the cost is O(L k)). At ListOps mini
  (64 tokens) Linformer's k is 16, not 1. `lra.dense_check` flags a run whose sizes
  degenerate anyway (`degenerate`).
Rounding keeps the variants' constraints (reformer: n_buckets even, about L / chunk_len as
at the reference; fixed: c <= block). At the reference length the presets are exactly the
values below.
Sizes that the builders derive from max_len by the paper's own rule are left to the
builders, and do NOT keep the fraction of the keys at short lengths: strided's stride and
routing's clusters ~ sqrt(L) (a query sees ~2 sqrt(L) keys, 2 / sqrt(L) of them), axial's
and local_2d's raster width ceil(sqrt(L)), informer's u = factor * ceil(ln L) active
queries, bp's levels ~ log2 L; fixed's c and random's r are rounded up to 1 token. At
ListOps mini they reach a larger fraction of the input than at full length (measured by
`python -m lra.dense_check --config=configs/listops.py:mini --fractions`; docs/running.md,
"Sizes at a config's length").

config.block's token counts (`BLOCK_LENGTH_KEYS`: the segment_recurrent stack's
segment_len and mem_len) follow the same rule (`block_settings`).

The task configs compute the hparams at the end of get_config (`common.finalize`), after `mini`/`runlocal`
have set max_length. `--config.max_length=...` on the command line is applied by
ml_collections after get_config, so it does NOT rescale them: set the sizes as well
(`--config.model_hparams.window=...`). The hparams a run used are in its config and
results.json (`config.model_hparams`).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from lra.errors import ConfigError

# model -> hparams used for every task.
PRESETS: dict[str, dict[str, Any]] = {
    "transformer": {},
    # Kernelised variants (models/attention/linear.py).
    "linear": {"eps": 1e-6},
    "performer": {"num_features": 256, "kernel": "softmax", "redraw_interval": 1000},
    "rfa": {"num_features": 128, "gate": False, "redraw_interval": 1000},
    "fast_weight": {"feature_map": "dpfp", "dpfp_nu": 1},
    # cosFormer (models/attention/cosformer.py): M = the model's max_length (0), eps 1e-6.
    "cosformer": {"reweight_len": 0, "eps": 1e-6},
    # Decayed linear attention (models/attention/retention.py), fla's layer defaults:
    # widths over qkv_dim (retnet's value heads twice its key heads, as the paper), gla's
    # low-rank gate and its logit normaliser. chunk_size changes the speed, not the result.
    "retnet": {"expand_k": 1.0, "expand_v": 2.0},
    "gla": {"expand_k": 0.5, "expand_v": 1.0, "gate_low_rank_dim": 16,
            "gate_logit_normalizer": 16.0},
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
    # The CLS slot (when pooling is CLS) is global in every pattern variant; num_global
    # counts content positions on top of it.
    "global": {"num_global": 1, "extra_tokens": False},
    "random": {"num_random": 8},
    "block_local": {"block": 128, "memory": 128},
    "local_2d": {"query_height": 8, "query_width": 16, "flange_height": 8,
                 "flange_width": 8},  # width defaults to ceil(sqrt(max_len))
    "longformer": {"window": 256, "num_global": 1},
    "bigbird": {"block": 64, "num_random_blocks": 3, "num_global_blocks": 2},
    # MoBA (models/attention/moba.py): blocks of 64, top 3 (own block included): about
    # 10% of the keys at LRA's 2K, the fraction kept at other lengths.
    "moba": {"block_size": 64, "top_k": 3},
    # NSA (models/attention/nsa.py): fla's block of 64, a window of 128 (fla: 512 at 64K+),
    # 6 blocks per query (0, own - 1, own forced + 3 chosen): ~19% + 6% of ListOps' 2K keys.
    "nsa": {"block_size": 64, "block_counts": 6, "window_size": 128},
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
    # Diagonal state-space mixers (models/mixers/ssm.py): the builders' defaults are the
    # papers' (s4d: N = 64, S4D-Lin, dt in [1e-3, 1e-1]; lru: N = 256, ring [0.9, 0.999],
    # max_phase 2 pi). Sizes of a state, not of a window: not scaled with the length.
    "s4d": {},
    "lru": {},
    # Mega (models/mixers/mega.py), facebookresearch/mega (aeaa4b4) fairseq/models/lra/
    # model.py mega_lra_listop/_imdb/_aan: n_dim 16, z_dim 64, hidden_dim 2 x embed (0
    # here), truncation_length 1024 (scaled with L like a window), softmax. chunk_size -1
    # is Mega (full attention; their README.lra.md leaves CHUNK to the user); Mega-chunk
    # is --config.model_hparams.chunk_size=<c> (not scaled). Their one Adam group decays
    # every parameter: no PARAM_GROUPS entry.
    "mega": {"ndim": 16, "z_dim": 64, "hidden_dim": 0, "chunk_size": -1,
             "truncation": 1024, "attention_activation": "softmax"},
}

# (model, task) -> overrides of PRESETS[model] for that task.
TASK_OVERRIDES: dict[tuple[str, str], dict[str, Any]] = {
    # Mega's image architectures (model.py mega_lra_cifar10, _pf32, _pf128) and their
    # README.lra.md commands (--attention-activation-fn laplace).
    ("mega", "image"): {"z_dim": 96, "attention_activation": "laplace"},
    ("mega", "pathfinder"): {"attention_activation": "laplace"},
    ("mega", "pathx"): {"z_dim": 32, "truncation": 4096, "attention_activation": "laplace"},
}


# Optimiser groups (lra/training/optim.py, config.param_groups): model -> {group: settings} for
# the parameters a variant marks with `param_group` metadata. lr_scale multiplies the
# learning-rate schedule for the group, weight_decay replaces config.weight_decay. The
# originals train their SSM parameters with Adam at a smaller learning rate and no decay:
PARAM_GROUPS: dict[str, dict[str, dict[str, float]]] = {
    # state-spaces/s4 (e757cef): configs/model/layer/s4.yaml's default `lr: {dt: 0.001,
    # A: 0.001, B: 0.001}`, `wd: 0.0` (kernel.py register(): those three at lr 0.001 without
    # decay, C at the optimiser's), against the LRA experiments' optimizer lr 0.01
    # (s4-{listops,imdb,aan,cifar}.yaml): lr_scale 0.1 for A ("ssm"), B ("ssm_b") and dt
    # ("ssm_step"). The experiments themselves override layer.lr per task (dt at the
    # global rate on ListOps, IMDB, AAN; C too at 0.001 on CIFAR, Pathfinder, Path-X):
    # the `paper` recipes follow them (configs/recipes.py).
    "s4d": {"ssm": {"lr_scale": 0.1, "weight_decay": 0.0},
            "ssm_b": {"lr_scale": 0.1, "weight_decay": 0.0},
            "ssm_step": {"lr_scale": 0.1, "weight_decay": 0.0}},
    # NicolasZucchet/minimal-LRU (bbd71b1), run_train.py: ssm lr = lr_factor * lr with
    # lr_factor 0.5; lru/train_helpers.py: Adam without decay for nu, theta, gamma, B.
    "lru": {"ssm": {"lr_scale": 0.5, "weight_decay": 0.0}},
    # lindermanlab/S5 (3c18fdb), s5/train_helpers.py: Adam at ssm_lr_base without decay
    # for "ssm" (Lambda, log_step), AdamW at lr_factor * ssm_lr_base for the rest; B is
    # "ssm" under opt_config=standard (models/mixers/s5.py). Per task below, from
    # bin/run_experiments/run_lra_<task>.sh (lr_factor, opt_config).
    "s5": {"ssm": {"lr_scale": 1 / 3, "weight_decay": 0.0},
           "ssm_b": {"lr_scale": 1 / 3, "weight_decay": 0.0},
           "ssm_step": {"lr_scale": 1 / 3, "weight_decay": 0.0}},
}

# (model, task) -> that task's groups where the original's per-task configs differ.
TASK_PARAM_GROUPS: dict[tuple[str, str], dict[str, dict[str, float]]] = {
    # s4-pathfinder.yaml: lr 0.004, layer.lr 0.001; s4-pathx.yaml: lr 0.001 for both.
    ("s4d", "pathfinder"): {g: {"lr_scale": 0.25, "weight_decay": 0.0}
                            for g in ("ssm", "ssm_b", "ssm_step")},
    ("s4d", "pathx"): {g: {"lr_scale": 1.0, "weight_decay": 0.0}
                       for g in ("ssm", "ssm_b", "ssm_step")},
    # S5's scripts: listops lr_factor 3 and cifar 4.5 with BfastandCdecay (B trains with
    # the rest: no ssm_b entry); imdb 4, aan 2, pathfinder 5 with standard; pathx 3 with
    # BandCdecay (B at the ssm rate, decayed as the rest). imdb and aan set dt_global:
    # log_step trains with the rest (no ssm_step entry).
    ("s5", "listops"): {"ssm": {"lr_scale": 1 / 3, "weight_decay": 0.0},
                        "ssm_step": {"lr_scale": 1 / 3, "weight_decay": 0.0}},
    ("s5", "image"): {"ssm": {"lr_scale": 1 / 4.5, "weight_decay": 0.0},
                      "ssm_step": {"lr_scale": 1 / 4.5, "weight_decay": 0.0}},
    ("s5", "text"): {"ssm": {"lr_scale": 0.25, "weight_decay": 0.0},
                     "ssm_b": {"lr_scale": 0.25, "weight_decay": 0.0}},
    ("s5", "retrieval"): {"ssm": {"lr_scale": 0.5, "weight_decay": 0.0},
                          "ssm_b": {"lr_scale": 0.5, "weight_decay": 0.0}},
    ("s5", "pathfinder"): {"ssm": {"lr_scale": 0.2, "weight_decay": 0.0},
                           "ssm_b": {"lr_scale": 0.2, "weight_decay": 0.0},
                           "ssm_step": {"lr_scale": 0.2, "weight_decay": 0.0}},
    ("s5", "pathx"): {"ssm": {"lr_scale": 1 / 3, "weight_decay": 0.0},
                      "ssm_b": {"lr_scale": 1 / 3},
                      "ssm_step": {"lr_scale": 1 / 3, "weight_decay": 0.0}},
}


# Tasks outside LRA whose variant presets (stated at each LRA task's full length) are
# another task's: MNIST's 28x28 raster takes Image's 32x32 ones, scaled to its max_length
# by the same rules (a window of 128 of 1024 pixels is 98 of 784).
PRESET_TASK = {"mnist": "image", "fashion_mnist": "image"}
# The synthetic token tasks (MQAR, MAD: configs/mqar.py, configs/mad.py) take ListOps'
# presets, scaled from its 2000 tokens to their length.
PRESET_TASK.update({t: "listops" for t in (
    "mqar", "mad_in_context_recall", "mad_fuzzy_in_context_recall",
    "mad_noisy_in_context_recall", "mad_selective_copying", "mad_compression",
    "mad_memorization", "state_tracking", "niah", "flipflop")})
# Character-level LM (configs/enwik8.py, text8.py) takes LRA Text's (byte-level) presets.
PRESET_TASK.update({"enwik8": "text", "text8": "text"})


def preset_task(task: str) -> str:
    """The task whose presets `task` uses (itself for LRA's tasks)."""
    return PRESET_TASK.get(task, task)


# Variant hparams that are dropout rates, zeroed (common.finalize, configs/hybrid.py) in a
# config whose dropout_rate and attention_dropout_rate are 0.
DROPOUT_HPARAMS = ("weight_dropout",)


def param_groups(model: str, task: str) -> dict[str, dict[str, float]]:
    """config.param_groups of `model` on `task` (lra/training/optim.py): {} for most variants."""
    groups = TASK_PARAM_GROUPS.get((model, task), PARAM_GROUPS.get(model, {}))
    return {name: dict(settings) for name, settings in groups.items()}


# Task -> the length its presets are stated at: its full-size config's max_length
# (tests/test_configs.py checks that they agree).
REFERENCE_LENGTHS: dict[str, int] = {
    "listops": 2000, "text": 1000, "retrieval": 4000, "image": 1024, "pathfinder": 1024,
    "pathx": 16384,
}

# model -> {hparam: how it follows the length L} (module docstring): "linear" for a number
# of tokens (value * L / L_ref: the fraction of the keys stays), "sqrt" for a side of a
# rectangle on the raster of ceil(sqrt(L)) columns (value * sqrt(L / L_ref): the area
# fraction stays), "summaries" for a rank or bottleneck (not scaled; at most
# max(MIN_SUMMARIES, L // 4)). reformer's n_buckets follows chunk_len (see _scaled).
LENGTH_SCALED: dict[str, dict[str, str]] = {
    "linformer": {"k": "summaries"},  # the projected length: O(L k) at any L
    "set_transformer": {"num_inducing": "summaries"},
    "luna": {"packed_len": "summaries"},
    "poolingformer": {"window1": "linear", "window2": "linear"},  # pool size/stride: ratios
    "local": {"window": "linear"},
    "fixed": {"block": "linear", "c": "linear"},
    "dilated": {"window": "linear"},  # dilation: a ratio
    "random": {"num_random": "linear"},
    "block_local": {"block": "linear", "memory": "linear"},
    "local_2d": {"query_height": "sqrt", "query_width": "sqrt", "flange_height": "sqrt",
                 "flange_width": "sqrt"},
    "longformer": {"window": "linear"},  # num_global: a count of tokens
    "bigbird": {"block": "linear"},  # random/global blocks: counts of blocks
    "moba": {"block_size": "blocks"},  # top_k: a count of blocks
    "nsa": {"block_size": "blocks", "window_size": "blocks"},  # block_counts: a count
    "sinkhorn": {"block_size": "linear"},
    "reformer": {"chunk_len": "linear"},  # n_buckets: derived, see _scaled
    # SAC's k: the edges (keys) a node's softmax weighs; k = 1 is a hard gather whose q.k
    # attention is never used. clustered: C cluster summaries; top-k keys per cluster.
    "sac": {"k": "summaries"},
    "clustered": {"num_clusters": "summaries", "topk": "summaries"},
    "adaptive_span": {"ramp": "linear"},  # the soft mask's ramp R, in tokens (S = max_len)
    "mega": {"truncation": "linear"},  # the EMA kernel's reach, in tokens
}

# config.block keys (models/blocks.py BLOCK_DEFAULTS) that are numbers of tokens, scaled
# the same way by `block_settings`; 0 keeps its meaning ("the whole input" /
# "segment_len").
BLOCK_LENGTH_KEYS = ("segment_len", "mem_len")


# The fewest tokens a "blocks" size keeps: MoBA and NSA choose blocks by their pooled keys,
# and a block of one token (ListOps' 64 of 2000 at MAD's 32 tokens) is top-k token
# attention, not block selection; nor is a sliding window of 2 NSA's window branch.
MIN_BLOCK = 4

# The fewest summaries (or keys a query's softmax weighs) a short input still gets from a
# "summaries" size, unless the stated value is smaller: 8 is the smallest size the
# surveyed LRA configs use for such a rank (Synthesizer's k = 8).
MIN_SUMMARIES = 8


def _round(x: float) -> int:
    return max(1, math.floor(x + 0.5))


def _ratio(task: str, max_length: int | None) -> float:
    if max_length is None:
        return 1.0
    if task not in REFERENCE_LENGTHS:
        raise ConfigError(f"no reference length for task {task!r} to scale the presets to "
                          f"max_length={max_length}; known: {', '.join(REFERENCE_LENGTHS)}")
    if max_length <= 0:
        raise ConfigError(f"max_length must be positive, got {max_length}")
    return max_length / REFERENCE_LENGTHS[task]


def _scaled(model: str, hparams: dict[str, Any], ratio: float,
            reference: int) -> dict[str, Any]:
    """`hparams` (stated at the reference length `reference`) at `ratio` times it."""
    if ratio == 1.0:
        return dict(hparams)
    out = dict(hparams)
    for key, rule in LENGTH_SCALED.get(model, {}).items():
        value = hparams.get(key)
        if value is None or isinstance(value, bool):
            continue
        if rule == "summaries":
            length = round(ratio * reference)  # max_length
            size = min(int(value), max(MIN_SUMMARIES, length // 4))
        elif rule == "blocks":
            size = max(min(int(value), MIN_BLOCK), _round(value * ratio))
        else:
            size = _round(value * (ratio if rule == "linear" else math.sqrt(ratio)))
        out[key] = float(size) if isinstance(value, float) else size
    if model == "fixed" and "c" in out and "block" in out:
        out["c"] = min(out["c"], out["block"])  # masks.fixed: c <= block
    if model == "reformer" and hparams.get("n_buckets", 1) > 1 and "chunk_len" in hparams:
        # Keep L / n_buckets : chunk_len (a bucket about a chunk), n_buckets even.
        buckets = (hparams["n_buckets"] * ratio * hparams["chunk_len"] / out["chunk_len"])
        out["n_buckets"] = 2 * _round(buckets / 2)
    return out


def model_hparams(model: str, task: str, max_length: int | None = None) -> dict[str, Any]:
    """The presets of `model` on `task`, scaled to `max_length` (None: the task's
    reference length, i.e. the presets as stated)."""
    from models import registry  # the registry is the source of truth for names

    if model not in registry.available():
        raise ConfigError(registry.unknown_model(model))
    stated = {**PRESETS.get(model, {}), **TASK_OVERRIDES.get((model, task), {})}
    return _scaled(model, stated, _ratio(task, max_length), REFERENCE_LENGTHS.get(task, 0))


def block_settings(block: Mapping[str, Any], task: str,
                   max_length: int | None = None) -> dict[str, Any]:
    """Resolved config.block settings with the token counts (`BLOCK_LENGTH_KEYS`, e.g.
    the segment_recurrent stack's segment_len 256) scaled like the presets."""
    ratio = _ratio(task, max_length)
    out = dict(block)
    for key in BLOCK_LENGTH_KEYS:
        if ratio != 1.0 and out.get(key):
            out[key] = _round(out[key] * ratio)
    return out

"""Pieces every task config shares: argument parsing and the base config.

A task config is `configs/<task>.py: get_config(arg)`, where `arg` is the text after the
colon in `--config=configs/<task>.py:model=performer,runlocal`.
"""
from __future__ import annotations

import math
from typing import Any

import ml_collections

from configs import presets, recipes
from lra.errors import ConfigError

ATTENTION_IMPLS = ("dense", "blocksparse", "pallas", "pallas_mosaic", "flash")


# Config arguments every task config takes besides its own (`defaults` of parse_arg),
# applied by apply_objective_args: `locality`, the task's locality baseline (see
# apply_locality); `paper`, the variant's own published recipe (configs/recipes.py);
# `hybrid=<mixer>`, the other mixer of a hybrid stack with its presets (configs/hybrid.py).
SHARED_ARGS = {"locality": False, "paper": False, "hybrid": "", "attention_impl": ""}


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
    """Parses 'model=performer,runlocal' into a ConfigDict, typed by the defaults, plus
    SHARED_ARGS (the arguments every task config takes).

    A bare key (`runlocal`) means True. Unknown keys are an error that lists the known ones.
    """
    own = sorted(defaults)
    defaults = {**defaults, **{k: v for k, v in SHARED_ARGS.items() if k not in defaults}}
    parsed = ml_collections.ConfigDict(defaults)
    for item in filter(None, (arg or "").split(",")):
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in defaults:
            raise ConfigError(
                f"unknown config argument {key!r} in {arg!r}; known: "
                f"{', '.join(own + sorted(set(defaults) - set(own)))}"
            )
        default = defaults[key]
        if not _:
            value = "true"
        if isinstance(default, bool):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ConfigError(f"config argument {key}={value!r} is not a boolean")
            parsed[key] = value.lower() in ("true", "1")
        elif isinstance(default, int):
            parsed[key] = int(value)
        else:
            parsed[key] = value
    # Which arguments were given, not defaulted: a preset (runlocal, mini) yields to them
    # (given()). An attribute, not a field, so that the arguments stay what they were.
    object.__setattr__(parsed, "_given", frozenset(
        item.partition("=")[0].strip() for item in filter(None, (arg or "").split(","))))
    return parsed


def given(arg: ml_collections.ConfigDict, name: str) -> bool:
    """Whether config argument `name` was given in the --config string (parse_arg), as
    opposed to taking its default: a preset sets its own size only where none was given
    (`mqar.py:runlocal,seq_len=64` runs at L 64, not at runlocal's 32)."""
    return name in getattr(arg, "_given", ())


def base_config(*, task: str, model: str) -> ml_collections.ConfigDict:
    """Fields common to all tasks, with LRA's names. Task configs overwrite the values."""
    c = ml_collections.ConfigDict()
    c.task = task
    c.model = model
    c.recipe = ""  # the source of the `paper` recipe it follows (configs/recipes.py)
    # Variant hyperparameters (window, num_features, ...): from the shared presets, so
    # `--config.model_hparams.<name>=...` works for exactly the fields the variant takes.
    # Stated here at the task's reference length; `finalize` rescales them (and the
    # block's token counts) to the max_length the task config ends with.
    c.model_hparams = ml_collections.ConfigDict(presets.model_hparams(model, preset_task(task)))
    c.attention_impl = "dense"
    # Residual form and stack (models/blocks.py BLOCK_DEFAULTS, with what the variant
    # implies filled in), e.g. --config.block.kind=reversible --config.block.ffn_chunks=4.
    c.block = ml_collections.ConfigDict(_resolve_block(model))
    # Hybrid stacks (configs/hybrid.py): other mixers at some layers, e.g.
    # --config.hybrid.mixer=transformer --config.hybrid.layers=1,3, or the full list
    # --config.layers=gla,transformer,gla,transformer. Unset: config.model in every layer.
    from configs import hybrid

    c.hybrid = hybrid.defaults()
    c.layers = ()
    c.data_dir = f"data/{task}"
    c.task_options = ml_collections.ConfigDict()  # reader options specific to one task

    # Optimisation (LRA: Adam b2=0.98, eps=1e-9, decoupled weight decay).
    c.batch_size = 32
    c.learning_rate = 0.05
    c.weight_decay = 0.1
    c.adam_b1 = 0.9
    c.adam_b2 = 0.98
    c.adam_eps = 1e-9
    c.grad_clip_norm = 0.0  # 0 = no clipping
    # Parameter groups (lra/training/optim.py): the variant's parameters marked with a group (the
    # SSMs' A, B, log step: "ssm") train with the group's lr_scale (times the schedule)
    # and weight_decay, e.g. --config.param_groups.ssm.lr_scale=0.5; the papers' values
    # are presets (configs/presets.py PARAM_GROUPS).
    c.param_groups = ml_collections.ConfigDict(presets.param_groups(model, preset_task(task)))
    # Parameters not weight-decayed by name (lra/training/optim.py): fnmatch patterns over their
    # paths, e.g. ("encoder/stack/*bias",); the `paper` recipes set S4's.
    c.weight_decay_exempt = ()
    c.factors = "constant * linear_warmup * rsqrt_decay"
    c.warmup = 1000
    c.steps_per_cycle = 0  # cosine_decay period; 0 = num_train_steps - warmup
    c.num_train_steps = 5000

    # Devices (lra/training/sharding.py): a (data, model) mesh, -1 = the rest of the devices;
    # sharding = data | fsdp | heads | fsdp+heads.
    c.mesh_shape = (-1, 1)
    c.sharding = "data"
    # Mixed precision (models/precision.py): the forward and backward passes in `dtype`
    # (float32 | bfloat16), parameters and optimizer state in `param_dtype`; softmax,
    # norms' statistics, the linear family's sums, SSM/EMA states and losses stay float32.
    c.dtype = "float32"
    c.param_dtype = "float32"

    # Evaluation, checkpoints, logging.
    c.eval_frequency = 200
    c.num_eval_steps = -1  # validation batches per evaluation; -1 = the whole split
    c.eval_batch_size = 0  # 0 = batch_size
    # Length extrapolation (lra/training/lengths.py): after the test, the test weights on
    # the test split made at each of these lengths ("128,256,512"); "" = none.
    c.eval_lengths = ""
    # ... and at each of these lengths (the training length first) on test splits whose
    # needles lie in one of n equal depth ranges (NIAH; 0 = none).
    c.eval_depth_buckets = 0
    # ... and at the training length on test splits made with other task options, named:
    # "sparse:test_p_ignore=0.98;dense:test_p_ignore=0.1" (flip-flop's tails); "" = none.
    c.eval_splits = ""
    # These three tests in another form of the same attention (e.g. "flash": the O(L)
    # memory chunked softmax, equal to dense within float rounding); "" = the run's
    # config.attention_impl. Training and the usual test keep config.attention_impl.
    c.eval_attention_impl = ""
    c.checkpoint_freq = 500
    c.log_every_steps = 50
    # Stop after the evaluation whose validation accuracy exceeds this (Zoology's early
    # stop, 0.99); the learning-rate schedule still spans num_train_steps. 0 = off.
    c.early_stop_accuracy = 0.0
    # Which weights the test split is run with: "best" (the best-on-validation
    # checkpoint) or "last" (the last step's, as MAD's train.py tests its last epoch).
    c.test_weights = "best"
    # sequence_labels' macro accuracy (MAD's metric): "pooled", one macro over the whole
    # split's class counts, or "batch_mean", the mean of each batch's macro weighted by
    # its examples (mad-lab's Lightning `self.log(..., on_epoch=True)` of torchmetrics'
    # per-batch MulticlassAccuracy; depends on the eval batch size, the batch's own).
    c.macro_accuracy = "pooled"
    c.random_seed = 0
    # "N1,N2": a jax.profiler trace of training steps N1..N2 (process 0) written into
    # <workdir>/profile (TensorBoard's profile plugin; trace.json.gz opens in Perfetto).
    c.profile_steps = ""

    # Model (LRA's field names).
    c.max_length = 2000
    c.emb_dim = 512
    c.num_heads = 8
    c.num_layers = 4
    c.qkv_dim = 512
    c.mlp_dim = 1024
    c.dropout_rate = 0.1
    c.attention_dropout_rate = 0.1
    c.pooling = "CLS"
    # learned | sinusoidal | rotary | none; the variant's paper's (Capabilities.pos_emb):
    # Transformer-XL and GTrXL use their relative positions only ("none").
    c.pos_emb = _default_pos_emb(model)
    c.causal = False
    # A benchmark's redraw of the built parameters (models/init_schemes.py SCHEMES): `own`
    # (each variant's initialisation), `zoology`, `grazzi` or `mad` (the originals'); and
    # whether the vocabulary head is the token embedding's transpose (per-position
    # objectives only).
    # Set by a scaffold (configs/scaffold.py `init`, `tie_head`) where a task has one.
    c.init_scheme = "own"
    c.tie_head = False

    # Objective (models/pretrain.py): classify, or self-pretraining on the task's own
    # training inputs, mlm (masked tokens) or causal_lm (next token; causal=True). The
    # `pretrain` config argument sets them with the paper's masking ratio per task.
    c.objective = "classify"
    c.mask_ratio = PRETRAIN_MASK_RATIO.get(task, 0.15)  # of the real tokens (mlm)
    # Per-token loss when pretraining: xent (over the vocabulary) or, for pixel tasks, l1
    # on the intensity scaled to [0, 1]; each task's default is the paper's (PRETRAIN_LM_LOSS).
    c.lm_loss = PRETRAIN_LM_LOSS.get(task, "xent")
    # causal_lm only: also predict the first token. The model reads the tokens shifted
    # right by one behind a start token (id vocab_size, one more embedding row), so the
    # output at t predicts token t and every token is a target (bits per token over all
    # of them); the xent softmax stays over the task's vocab_size values. The `generation`
    # config argument sets it (pixel generation: bits per sub-pixel over the whole image).
    c.start_token = False
    # Workdir of an earlier run (e.g. a pretraining run) whose embeddings and encoder this
    # run starts from (its best checkpoint, else its last); the head starts fresh.
    c.init_from = ""
    return c


# Amos, Berant and Gupta (ICLR 2024), masking ratio of their self-pretraining per task.
# Their code agrees for Image and Path-X (0.5) and its Pathfinder dataset default is 0.5,
# but its two Pathfinder experiment configs (transformer-local-lra-pathfinder-mlm-small,
# mega/pathfinder-mlm-l1) set 0.05: --config.mask_ratio=0.05 reproduces those.
PRETRAIN_MASK_RATIO = {"listops": 0.10, "text": 0.15, "retrieval": 0.15, "image": 0.5,
                       "pathfinder": 0.5, "pathx": 0.5}
# Tasks whose tokens are pixel intensities 0..255 (where lm_loss='l1' makes sense).
PIXEL_TASKS = ("image", "pathfinder", "pathx", "mnist")
# The paper's per-token loss where it is not cross-entropy: L1 on the pixel value for Image
# and Pathfinder. Its code (IdoAmos/not-from-scratch, configs/experiment/lra/*pathx*-mlm*)
# pretrains Path-X with cross-entropy over the 256 intensities ("should not use l1 for
# pathx"), so Path-X keeps xent.
PRETRAIN_LM_LOSS = {"image": "l1", "pathfinder": "l1"}
# The task whose variant presets a task takes (MNIST: Image's; MQAR, MAD: ListOps'; ...):
# configs/presets.py, where configs/hybrid.py reads it too.
PRESET_TASK, preset_task = presets.PRESET_TASK, presets.preset_task


# The locality baseline (config argument `locality`, every task config): the task's model
# (width, heads, optimiser, steps, data) reduced to LOCALITY_LAYERS layer of attention over
# a short window, pooled by MEAN. The window is NOT scaled with the length (finalize keeps
# it): that it stays short is the point. Token tasks: `local`, |i - j| <= 4, 9 consecutive
# tokens; pixel tasks: `local_2d` with a 1x1 query block and a flange of 2 rows up and 1
# column each side, a 3x3 patch (models/masks.py Local2D: the flange reaches up, not down,
# as Image Transformer's memory does). With one layer the model's receptive field is the
# window's: the feed-forward block acts per position and the head on the mean.
LOCALITY_LAYERS = 1
LOCALITY_HPARAMS = {"local": {"window": 4},
                    "local_2d": {"query_height": 1, "query_width": 1, "flange_height": 2,
                                 "flange_width": 1}}


def locality_model(task: str) -> str:
    """The mixer of `task`'s locality baseline: `local_2d` on the pixel tasks' raster,
    `local` on token sequences."""
    return "local_2d" if task in PIXEL_TASKS else "local"


def locality_receptive_field(task: str) -> str:
    """What a position of `task`'s locality baseline sees, in words, from LOCALITY_HPARAMS:
    with LOCALITY_LAYERS = 1, the whole model's receptive field. Recorded in the config as
    `locality_baseline` (lra.report's footnote quotes it)."""
    model = locality_model(task)
    h = LOCALITY_HPARAMS[model]
    if model == "local":
        return (f"{2 * h['window'] + 1} consecutive tokens (the token and {h['window']} on "
                f"each side: `local`, window {h['window']}), {LOCALITY_LAYERS} layer")
    rows, cols = h["query_height"] + h["flange_height"], h["query_width"] + 2 * h["flange_width"]
    return (f"a {rows}x{cols} patch of pixels (the pixel, the {h['flange_height']} rows above "
            f"it and {h['flange_width']} column on each side: `local_2d`, a "
            f"{h['query_height']}x{h['query_width']} query block and its flange, which reaches "
            f"up only), {LOCALITY_LAYERS} layer")


def apply_locality(c: ml_collections.ConfigDict, arg: ml_collections.ConfigDict) -> None:
    """The `locality` config argument: `c` becomes the task's locality baseline (see
    LOCALITY_HPARAMS): model locality_model(task), LOCALITY_LAYERS layer, MEAN pooling (a
    CLS slot would summarise only its own window), rotary positions (a window's output
    then depends on the tokens in it and their offsets, not on where the window is; a
    learned table would add the position, and its mean the input's length), and
    `locality_baseline`, what a position sees (lra.report names the row and footnotes
    it). The width, optimiser, steps and data stay the task config's (after `mini` or
    `runlocal`). It is a model of its own: `model=` other than the task configs' default
    (transformer) or the baseline's own mixer is refused."""
    model = locality_model(c.task)
    if arg.model not in ("transformer", model):
        raise ConfigError(
            f"config argument 'locality' is the {c.task} locality baseline, a model of its own "
            f"({model}: {locality_receptive_field(c.task)}); it does not combine with "
            f"model={arg.model}: leave model= out")
    c.model = model
    c.model_hparams = ml_collections.ConfigDict(LOCALITY_HPARAMS[model])
    c.block = ml_collections.ConfigDict(_resolve_block(model))
    c.param_groups = ml_collections.ConfigDict(presets.param_groups(model, preset_task(c.task)))
    c.pos_emb = "rotary"
    c.pooling = "MEAN"
    c.num_layers = LOCALITY_LAYERS
    c.locality_baseline = locality_receptive_field(c.task)


def apply_generation(c: ml_collections.ConfigDict, arg: ml_collections.ConfigDict) -> None:
    """The `generation` config argument of the pixel tasks (image, mnist): autoregressive
    generation of the image's pixels (sub-pixels) in raster order, Katharopoulos et al.'s
    (2020) setting: causal_lm with a causal encoder, a start token so that every pixel is
    predicted (config.start_token), a 256-way softmax per pixel (lm_loss xent), MEAN
    pooling (what causal needs; the LM head is per position). Validation and test report
    bits per token = bits/dim over all of the image's dims. `pretrain` (it is one) and
    `paper` (classification recipes) do not combine with it."""
    clash = [name for name in ("pretrain", "paper", "locality") if arg.get(name)]
    if clash:
        raise ConfigError(f"config argument 'generation' (next-pixel prediction of the whole "
                          f"image) does not combine with {', '.join(repr(n) for n in clash)}")
    c.objective = "causal_lm"
    c.causal = True
    c.start_token = True
    c.lm_loss = "xent"
    c.pooling = "MEAN"


def apply_attention_impl(c: ml_collections.ConfigDict, arg: ml_collections.ConfigDict) -> None:
    """The config argument `attention_impl=<dense|blocksparse|pallas|pallas_mosaic|flash>`
    (every task config's): config.attention_impl, checked here so a typo fails at once."""
    if arg.get("attention_impl"):
        if arg.attention_impl not in ATTENTION_IMPLS:
            raise ConfigError(f"config argument attention_impl={arg.attention_impl!r}; choose "
                              f"one of {', '.join(ATTENTION_IMPLS)}")
        c.attention_impl = arg.attention_impl


def apply_objective_args(c: ml_collections.ConfigDict, arg: ml_collections.ConfigDict) -> None:
    """The config arguments shared by every task config: `paper`, `locality`, `causal`,
    `pretrain`, `hybrid`, `attention_impl` (apply_attention_impl).

    `paper`: the variant's own published recipe for the task (configs/recipes.py), a
    full-size one: refused with `mini`, `runlocal` or `locality`.
    `locality`: the task's locality baseline (apply_locality).
    `causal`: a causal encoder (models that support it), pooled by MEAN, since a causal
    CLS token (position 0) would see only itself.
    `pretrain`: self-pretraining on the task's own training inputs: masked-token
    prediction (mlm) at the task's masking ratio, or next-token prediction (causal_lm)
    with `causal`; the best weights are those of the lowest validation loss. Steps,
    schedule and model stay the task config's, so that the fine-tuning run
    (`--config.init_from=<this workdir>`, same arguments without `pretrain`) matches in
    size.
    `hybrid=<mixer>`: the other mixer of a hybrid stack, its presets in
    config.hybrid.model_hparams and groups in config.hybrid.param_groups (for overrides);
    which layers it takes is --config.hybrid.layers / period / pattern (configs/hybrid.py)."""
    if arg.paper:
        small = [name for name in ("mini", "runlocal", "locality") if arg.get(name)]
        if small:
            raise ConfigError(
                f"config argument 'paper' is {arg.model}'s published {c.task} recipe at its "
                f"full size (configs/recipes.py); it does not combine with "
                f"{', '.join(repr(n) for n in small)}")
        recipes.apply_recipe(c)
    if arg.locality:
        apply_locality(c, arg)
    if arg.causal:
        c.causal = True
        if c.pooling == "CLS":
            c.pooling = "MEAN"
    if arg.pretrain:
        c.objective = "causal_lm" if c.causal else "mlm"
    apply_attention_impl(c, arg)
    if arg.get("hybrid"):
        if arg.locality:
            raise ConfigError("config argument 'locality' is a one-layer baseline of its own; "
                              f"it does not combine with hybrid={arg.hybrid}")
        from configs import hybrid

        hybrid.apply_arg(c, arg.hybrid)


def _default_pos_emb(model: str) -> str:
    from models import registry  # imports jax; only when a config is built

    return registry.capabilities(model).pos_emb if model in registry.available() else "learned"


def _resolve_block(model: str) -> dict[str, Any]:
    from models.stacks import resolve_block  # imports jax; only when a config is built

    return resolve_block(model)


def finalize(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The last step of every task's get_config, once `mini`/`runlocal` have set
    max_length: the variant's presets and the block's token counts (segment_len, ...)
    scaled to it (configs/presets.py), so that a short config keeps each variant's
    fraction of attended keys. model_hparams come from the presets (a task-specific value
    belongs in presets.TASK_OVERRIDES), with a `paper` recipe's (c.recipe) merged over
    them; a block token count the task config changed is kept. `--config.max_length=...`
    on the command line comes after get_config and does not rescale them (see
    configs/presets.py)."""
    c.model_hparams = ml_collections.ConfigDict(
        presets.model_hparams(c.model, preset_task(c.task), max_length=c.max_length))
    if c.get("locality_baseline"):
        # The baseline's window, not the presets scaled to the length: it stays short.
        c.model_hparams.update(LOCALITY_HPARAMS[c.model])
    if c.get("recipe"):
        # The paper's values, stated at the paper's length (`paper` is full-size only).
        c.model_hparams.update(recipes.recipe(c.model, c.task)["model_hparams"])
    if c.dropout_rate == 0.0 and c.attention_dropout_rate == 0.0:
        # A config without dropout (every `mini`) has none anywhere: also not Lite's
        # DropConnect on its dynamic-convolution weights (`weight_dropout`).
        for key in DROPOUT_HPARAMS:
            if key in c.model_hparams:
                c.model_hparams[key] = 0.0
    stated = _resolve_block(c.model)
    scaled = presets.block_settings(stated, preset_task(c.task), max_length=c.max_length)
    for key in presets.BLOCK_LENGTH_KEYS:
        if key in c.block and c.block[key] == stated[key]:
            c.block[key] = scaled[key]
    from configs import hybrid

    hybrid.finalize(c)  # the hybrid mixer's presets at this length
    if c.block.stack == "segment_recurrent" and c.pooling == "CLS":
        # CLS is position 0, in the first segment, and memory flows forward only: it would
        # summarise the first segment alone (models/encoder.py refuses it).
        c.pooling = "MEAN"
    return c


# Variant hparams that are dropout rates, zeroed by `finalize` in a config whose
# dropout_rate and attention_dropout_rate are 0 (configs/presets.py).
DROPOUT_HPARAMS = presets.DROPOUT_HPARAMS


def apply_runlocal(c: ml_collections.ConfigDict) -> None:
    """Steps, batch and logging shared by every task's `runlocal` (a smoke test of about a
    minute on 2 CPU cores); each task config also shrinks its model and length."""
    c.batch_size = 8
    c.warmup = 5
    c.num_train_steps = 20
    c.eval_frequency = 10
    c.num_eval_steps = 2
    c.checkpoint_freq = 10
    c.log_every_steps = 5


def apply_mini(c: ml_collections.ConfigDict, *, num_train_steps: int, warmup: int,
               eval_frequency: int) -> None:
    """What every task's `mini` shares: a 64-wide 2-layer model, batch 32, no dropout,
    evaluation on 32 validation batches; minutes per variant on 2 CPU cores. Each task
    config also shortens its inputs."""
    c.batch_size = 32
    c.num_train_steps = num_train_steps
    c.warmup = warmup
    c.eval_frequency = c.checkpoint_freq = eval_frequency
    c.log_every_steps = max(eval_frequency // 2, 1)
    c.num_eval_steps = 32
    # Dropout costs ~40% of a step on CPU (random bits); these runs are too short to overfit.
    c.dropout_rate = c.attention_dropout_rate = 0.0
    c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 64, 4, 2, 64, 128


def _check_range(config, name: str, low: float, high: float | None = None, *,
                 low_open: bool = False, high_open: bool = True, hint: str = "") -> None:
    value = config[name]
    # NaN fails every comparison; inf is no setting (an infinite learning rate "diverges").
    ok = math.isfinite(value) and (value > low if low_open else value >= low) and (
        high is None or (value < high if high_open else value <= high))
    if not ok:
        lo = f"{'>' if low_open else '>='} {low}"
        hi = "" if high is None else f" and {'<' if high_open else '<='} {high}"
        finite = "" if math.isfinite(value) else "finite and "
        raise ConfigError(f"config.{name}={value!r} must be {finite}{lo}{hi}{hint}")


def validate(config: ml_collections.ConfigDict) -> None:
    """Checks values that the config system cannot type-check. Raises ConfigError."""
    if config.attention_impl not in ATTENTION_IMPLS:
        raise ConfigError(
            f"config.attention_impl={config.attention_impl!r}; choose one of {ATTENTION_IMPLS}"
        )
    eval_impl = config.get("eval_attention_impl", "")
    if eval_impl and eval_impl not in ATTENTION_IMPLS:
        raise ConfigError(f"config.eval_attention_impl={eval_impl!r}; choose one of "
                          f"{ATTENTION_IMPLS}, or '' for config.attention_impl")
    for name in ("batch_size", "num_train_steps", "eval_frequency", "checkpoint_freq",
                 "log_every_steps", "max_length", "emb_dim", "num_heads", "num_layers",
                 "qkv_dim", "mlp_dim"):
        if config[name] <= 0:
            raise ConfigError(f"config.{name} must be positive, got {config[name]}")
    _check_range(config, "learning_rate", 0.0, low_open=True)
    for name in ("dropout_rate", "attention_dropout_rate", "adam_b1", "adam_b2"):
        _check_range(config, name, 0.0, 1.0)
    # Adam divides by sqrt(v) + eps: eps = 0 is a division by zero where a gradient is 0.
    _check_range(config, "adam_eps", 0.0, low_open=True)
    for name in ("weight_decay", "grad_clip_norm", "warmup", "steps_per_cycle"):
        _check_range(config, name, 0.0)
    # A seed becomes a 32-bit JAX key (and offsets are added to it): a larger one was a
    # traceback from inside jax.random.
    _check_range(config, "random_seed", 0, 2**31, hint=" (a 31-bit integer)")
    if config.num_eval_steps == 0 or config.num_eval_steps < -1:
        raise ConfigError(f"config.num_eval_steps={config.num_eval_steps} must be positive, or "
                          "-1 for the whole validation split")
    _check_range(config, "eval_batch_size", 0, hint=" (0 = batch_size)")
    shape = config.mesh_shape
    if (not isinstance(shape, (tuple, list))
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in shape)):
        raise ConfigError(f"config.mesh_shape={shape!r} must be a tuple of integers, e.g. "
                          "'(-1,1)' or '(2,4)'")
    _validate_objective(config)
    for name in ("dtype", "param_dtype"):
        if config.get(name, "float32") not in ("float32", "bfloat16"):
            raise ConfigError(f"config.{name}={config[name]!r}; choose float32 or bfloat16")
    from lra.training.optim import exempt_patterns, group_settings  # imports optax; only here

    group_settings(config)
    exempt_patterns(config)
    from configs import hybrid

    hybrid.check(config)  # the layer list of a hybrid stack, one line if it cannot run
    parse_profile_steps(config.get("profile_steps", ""))
    for name, choices in (("test_weights", TEST_WEIGHTS), ("macro_accuracy", MACRO_RULES)):
        if config.get(name, choices[0]) not in choices:
            raise ConfigError(f"config.{name}={config.get(name)!r}; choose one of "
                              f"{', '.join(choices)}")
    stop = config.get("early_stop_accuracy", 0.0)
    if isinstance(stop, bool) or not isinstance(stop, (int, float)) or not 0 <= stop < 1:
        raise ConfigError(f"config.early_stop_accuracy={stop!r}: a validation accuracy in "
                          "[0, 1) to stop above (Zoology's 0.99), or 0 for no early stop")
    if config.emb_dim % config.num_heads or config.qkv_dim % config.num_heads:
        raise ConfigError(
            f"config.emb_dim ({config.emb_dim}) and config.qkv_dim ({config.qkv_dim}) must be "
            f"divisible by config.num_heads ({config.num_heads})"
        )


def resolve(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """What a config derives once the command line's overrides are in, before the run is
    built (lra/train.py) and when a sweep computes the config it would run
    (lra/runs/plan.py), so that results.json records the values the run used:
    `data_seed_from_run` (MQAR, MAD: the data's seed is the run's, task_options.seed =
    random_seed) and the benchmark's scaffold (configs/scaffold.py). In place."""
    if config.get("data_seed_from_run") and "seed" in config.get("task_options", {}):
        config.task_options.seed = int(config.random_seed)
    from configs import scaffold

    return scaffold.resolve(config)


def parse_profile_steps(value: str) -> tuple[int, int] | None:
    """config.profile_steps "N1,N2" (or "N": one step) as (N1, N2); None when empty."""
    if not str(value).strip():
        return None
    try:
        steps = [int(v) for v in str(value).split(",")]
    except ValueError:
        steps = []
    if len(steps) == 1:
        steps *= 2
    if len(steps) != 2 or not 1 <= steps[0] <= steps[1]:
        raise ConfigError(f"config.profile_steps={value!r}: give 'N1,N2' with 1 <= N1 <= N2 "
                          "(the training steps to trace), e.g. '10,20'")
    return steps[0], steps[1]


TEST_WEIGHTS = ("best", "last")
MACRO_RULES = ("pooled", "batch_mean")
OBJECTIVES = ("classify", "mlm", "causal_lm", "sequence_labels")
LM_LOSSES = ("xent", "l1")


def _validate_objective(config: ml_collections.ConfigDict) -> None:
    objective = config.get("objective", "classify")
    if objective not in OBJECTIVES:
        raise ConfigError(f"config.objective={objective!r}; choose one of {OBJECTIVES}")
    # Range-checked on every run: classification ignores it, but a value no run could use
    # (1.5) is a typo whatever the objective.
    _check_range(config, "mask_ratio", 0.0, 1.0, low_open=True, high_open=False,
                 hint=" (the fraction of tokens masked when pretraining)")
    if config.get("start_token", False) and objective != "causal_lm":
        raise ConfigError(f"config.start_token=True makes causal_lm predict the first token "
                          f"too; config.objective={objective!r} predicts no next token: set "
                          "start_token=False, or use the config argument 'generation' (pixel "
                          "tasks) or 'pretrain,causal'")
    if objective == "classify":
        return
    if objective == "mlm" and config.causal:
        raise ConfigError("config.objective='mlm' is bidirectional masked-token prediction, "
                          "but config.causal=True; use the config arguments 'pretrain,causal' "
                          "(or --config.objective=causal_lm) for next-token prediction")
    if objective == "causal_lm" and not config.causal:
        raise ConfigError("config.objective='causal_lm' predicts the next token and needs "
                          "config.causal=True; use the config arguments 'pretrain,causal'")
    if config.causal and config.pooling == "CLS":
        raise ConfigError("pretraining with config.causal=True and config.pooling='CLS': a "
                          "causal CLS token (position 0) sees only itself, so the fine-tuned "
                          "classifier could not use it; set --config.pooling=MEAN (the "
                          "'causal' config argument does)")
    if config.lm_loss not in LM_LOSSES:
        raise ConfigError(f"config.lm_loss={config.lm_loss!r}; choose one of {LM_LOSSES}")
    if objective == "sequence_labels" and config.lm_loss != "xent":
        raise ConfigError("config.objective='sequence_labels' predicts token labels with a "
                          "softmax over the vocabulary: set config.lm_loss='xent'")
    if config.lm_loss == "l1" and config.task not in PIXEL_TASKS:
        raise ConfigError(f"config.lm_loss='l1' regresses pixel intensities; task "
                          f"{config.task!r} has symbolic tokens: use lm_loss='xent'")

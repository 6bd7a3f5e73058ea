r"""Efficiency table: training steps/s and memory of every variant against two references:
`transformer[flash]` (transformer with attention_impl=flash: cuDNN's fused attention on a
GPU, splash on a TPU, the O(L)-memory chunked form on CPU; models/kernels/flash_attention.py)
and `transformer` (under --attention_impl, dense by default: the L x L logits materialised,
as LRA's Table 2 measured it). Both are measured in every run.

  python -m lra.benchmark --models=all --lengths=1024,2048,3072,4096        (make bench)
  python -m lra.benchmark --mode=mixer --models=linear --lengths=1024,4096 --dim=64
  python -m lra.benchmark --models=all --lengths=1024,2048,4096,8192,16384 --batch_size=1 \
      --attention_impl=blocksparse --growth_check_length=4096 --csv=eff.csv
                                    (results/cpu/efficiency.md: beyond 4K only the models
                                     whose cells up to 4K grew at most as L^1.4)
  python -m lra.benchmark --models=nsa --lengths=4096 --override=model_hparams.block_counts=12
                                    (config overrides, as launch.py's --config.<field>: a
                                     model_hparams field for the variants that take it)

--mode=train_step (default; LRA's efficiency table): the whole training step of the
task's model (`lra.train.make_steps`: embeddings, encoder, head, loss, gradients, optimizer
update) at the task config's size (LRA's text config by default: emb 256, 4 layers,
batch 32) on random tokens of length L; a task with a label per position (MQAR, MAD,
state tracking, niah, flip-flop) on one batch of its own generated rows at length L, its
head on the labelled positions as in a run. --mode=mixer: one token mixer's forward + backward
(gradients w.r.t. parameters and input) on a random [batch, L, dim] input. Reported per cell:
  time     median wall time of one step (ms; steps/s = 1000 / ms), after a warm-up call;
  memory   XLA's compiled temporary memory (`memory_analysis().temp_size_in_bytes`):
           reproducible, independent of the allocator; on a GPU or TPU also the device's
           peak (`memory_stats`), each cell then measured in a fresh process (--isolate)
           because that peak is a high-water mark of the whole process;
and, per model, the ratios to both references at the same L (measured in the same run),
the growth exponent in L (slope of log time / log memory against log L), and the length
from which it is faster than the fused transformer (the break-even column).
Markdown goes to stdout; progress goes to stderr. `--csv` receives each cell as it is
measured, with its settings; running again with the same --csv and settings measures only
the cells it lacks (a stopped run resumes; delete the file to measure afresh).
"""
from __future__ import annotations

import csv
import functools
import json
import os
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging
from flax import nnx

from configs import common, hybrid, presets
from lra.runs import cli
from lra.reporting.efficiency import (FUSED, growth_exponent, growth_goal, lra_comparison,
                                      table)
from models import registry
from models.kernels.flash_attention import FlashError

# The impl of a fused reference cell measured at attention_dropout_rate=0 because the
# backend's fused kernel has no attention-weight dropout (cuDNN, splash).
FUSED_NO_DROPOUT = "flash, attention dropout 0"

FLAGS = flags.FLAGS


def _define_flags() -> None:
    # Defined only when run as a program, so importing this module (tests, notebooks,
    # other tools) never claims global absl flag names.
    flags.DEFINE_enum("mode", "train_step", ["train_step", "eval_step", "mixer"],
                      "Time a whole training step, the task's eval step (the forward "
                      "pass its tests run, at eval_batch_size rows unless --batch_size), "
                      "or one mixer's forward+backward.")
    flags.DEFINE_list("models", ["transformer"], "Registry names, or 'all'; in train_step "
                      "mode a hybrid by its name, e.g. gla+transformer@1,3 (configs/hybrid.py; "
                      "the layers of the task config's num_layers, or --num_layers).")
    flags.DEFINE_list("lengths", ["1024", "2048", "3072", "4096"], "Sequence lengths.")
    flags.DEFINE_integer("batch_size", 0, "Batch size (0: the task config's in train_step "
                         "mode, 1 in mixer mode).")
    flags.DEFINE_integer("dim", 0, "Model width, emb_dim = qkv_dim (0: the task config's; "
                         "256 in mixer mode).")
    flags.DEFINE_integer("num_heads", 0, "Attention heads (0: the task config's; 4 in mixer "
                         "mode).")
    flags.DEFINE_integer("num_layers", 0, "Layers in the step modes (0: the task config's).")
    flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Step modes (train_step, "
                      "eval_step): config.dtype, the compute dtype (parameters stay float32).")
    flags.DEFINE_enum("attention_impl", "dense", list(common.ATTENTION_IMPLS),
                      "Step modes: config.attention_impl for the variants that have "
                      "it; the others run their own (attention_impl=dense), marked in the "
                      "table's impl column.")
    flags.DEFINE_integer("repeats", 3, "Timed calls per cell (the median is reported); 0: "
                         "compile only and report memory, e.g. at lengths this machine "
                         "cannot run in reasonable time.")
    flags.DEFINE_string("task", "text", "Task whose config (model size, presets) is used; "
                        "LRA measured on text.")
    flags.DEFINE_multi_string("override", [], "Step modes: config overrides "
                              "field=value (repeatable), e.g. model_hparams.chunk_size=32 or "
                              "block.ffn=False. A model_hparams field applies to the measured "
                              "models whose builder takes it (refused if none does; the "
                              "references never take another variant's), any other field to "
                              "every model, the references included.")
    flags.DEFINE_string("config_arg", "", "Step modes: extra get_config arguments, "
                        "e.g. 'mini' to time the mini configs' steps (how long a mini sweep "
                        "takes: steps x time per step).")
    flags.DEFINE_string("csv", None, "Also write each cell to this CSV file as it is "
                        "measured; cells already there (same settings) are not measured "
                        "again.")
    flags.DEFINE_enum("isolate", "auto", ["auto", "true", "false"],
                      "Measure each cell in a fresh process. The device's peak "
                      "(memory_stats) is a process-wide high-water mark that JAX cannot "
                      "reset, so only a fresh process reports a cell's own peak; a cell that "
                      "kills its process (an out-of-memory abort) then costs that cell only. "
                      "auto: true on GPU/TPU, false on CPU (no device peak there).")
    flags.DEFINE_string("cell", None, "Internal (--isolate): measure the one cell "
                        "MODEL:LENGTH and print it as a JSON line.")
    flags.DEFINE_integer("growth_check_length", 0,
                         "Above this length (0 = never), measure a model only if its "
                         "memory and time grew at most as L^--max_growth over the lengths "
                         "measured up to it: quadratic variants skip 8K/16K with the reason "
                         "in their cell, from their own numbers rather than a list (the "
                         "fused reference transformer[flash] is measured at every length).")
    flags.DEFINE_float("max_growth", 1.4, "The growth exponent --growth_check_length "
                       "allows (quadratic attention shows 1.5-2 on LRA's text model).")
    flags.DEFINE_integer("transformer_max_length", 0,
                         "Skip `transformer` above this length (0 = never): quadratic "
                         "memory and time make it the slowest cell by far.")


# Memory only: XLA's buffer assignment comes from the HLO passes, which this option leaves
# alone; skipping LLVM's optimisation cuts a third of the compile time on CPU.
_MEMORY_ONLY_OPTIONS = {"xla_backend_optimization_level": 0}


def measure(model: str, length: int, *, batch_size: int, dim: int, num_heads: int,
            repeats: int, task: str = "listops") -> dict:
    """Forward+backward time (s) and compiled temporary memory (bytes) of one mixer."""
    if hybrid.is_name(model):
        raise ValueError(f"{model} is a stack of layers, not one mixer: time it with "
                         "--mode=train_step")
    name, model = model, "transformer" if model == FUSED else model
    hparams = presets.model_hparams(model, common.preset_task(task))
    if name == FUSED:
        hparams["attention_impl"] = "flash"
    mixer = registry.build(model, dim=dim, num_heads=num_heads, max_len=length,
                           rngs=nnx.Rngs(0), **hparams)
    graphdef, params, rest = nnx.split(mixer, nnx.Param, ...)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((batch_size, length, dim)),
                    jnp.float32)
    mask = jnp.ones((batch_size, length), jnp.bool_)

    carries_state = registry.capabilities(model).carries_state

    def loss(params, x):
        y = nnx.merge(graphdef, params, rest)(x, padding_mask=mask, deterministic=True)
        if carries_state:  # (y, carry to the next layer): time the first layer's mixer
            y = y[0]
        return jnp.sum(y.astype(jnp.float32) ** 2)

    step = jax.jit(jax.grad(loss, argnums=(0, 1)))
    compiled = step.lower(params, x).compile(_MEMORY_ONLY_OPTIONS if repeats == 0 else None)
    analysis = compiled.memory_analysis()
    temp = getattr(analysis, "temp_size_in_bytes", None) if analysis is not None else None
    row = {"model": name, "length": length, "time_s": None, "temp_bytes": temp}
    if repeats == 0:
        return row
    jax.block_until_ready(compiled(params, x))  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(params, x))
        times.append(time.perf_counter() - start)
    row["time_s"] = statistics.median(times)
    device = jax.devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "peak_bytes_in_use" in stats:
        row["device_peak_bytes"] = stats["peak_bytes_in_use"]
    return row


def measure_train_step(model: str, length: int, *, task: str = "text", batch_size: int = 0,
                       dim: int = 0, num_heads: int = 0, num_layers: int = 0,
                       repeats: int = 3, attention_impl: str = "dense",
                       config_arg: str = "", dtype: str = "float32",
                       attention_dropout_rate: float | None = None,
                       overrides: tuple[str, ...] = (), step: str = "train") -> dict:
    """Time (s) and compiled temporary memory (bytes) of one training step of `model` on
    `task`'s config (get_config("model=<model>,<config_arg>")) at max_length `length`
    (sizes: the config's, unless given; `attention_dropout_rate` overrides the config's;
    `overrides`: --override's field=value pairs, apply_overrides); step="eval": of its
    eval step instead (the forward pass a test runs, batch config.eval_batch_size unless
    `batch_size`)."""
    import importlib

    import lra.tasks
    from lra import train
    from lra.runs import spec
    from lra.training import objectives, optim

    config = importlib.import_module(f"configs.{task}").get_config(
        f"model={hybrid.base_of(model)}" + (f",{config_arg}" if config_arg else ""))
    config.max_length, config.dtype = length, dtype
    if attention_dropout_rate is not None:
        config.attention_dropout_rate = attention_dropout_rate
    for field, value in (("batch_size", batch_size), ("emb_dim", dim), ("qkv_dim", dim),
                         ("num_heads", num_heads), ("num_layers", num_layers)):
        if value:
            config[field] = value
    hybrid.apply_name(config, model)  # a hybrid's name: its layers at this num_layers
    apply_overrides(config, overrides)
    if step == "eval" and not batch_size and config.eval_batch_size:
        config.batch_size = config.eval_batch_size
    task_info = lra.tasks.get(task)
    built, impl = build_model_with_impl(config, task_info, attention_impl)
    graphdef, params, rest = nnx.split(built, nnx.Param, ...)
    schedule = optim.learning_rate_schedule(config)
    tx = optim.make_optimizer(config, schedule, spec.resolve(config))
    state = {"step": jnp.int32(0), "params": params, "rest": rest,
             "opt_state": tx.init(params)}
    b = config.batch_size
    if task_info.sequence_labels:
        batch = generated_batch(config, task_info, length)
    else:
        rng = np.random.default_rng(0)
        batch = {"inputs": rng.integers(1, task_info.vocab_size, (b, length), np.int32),
                 "mask": np.ones((b, length), np.bool_),
                 "targets": rng.integers(0, task_info.num_classes, (b,), np.int32)}
        if task_info.dual_input:
            batch.update(inputs2=batch["inputs"][::-1].copy(), mask2=batch["mask"])
    # As a run does: a sequence_labels head on the labelled positions only where they are
    # few (MQAR: 4 of 64 positions, an 8,192-wide head).
    slots = objectives.label_slots({"train": batch}, config)
    train_step, eval_step = train.make_steps(graphdef, tx, schedule, task_info.num_classes,
                                             config, task_info.vocab_size, label_slots=slots)
    if step == "eval":  # weights in, sums out: nothing to donate
        state = {"params": params, "rest": rest}
        batch["weights"] = np.ones((b,), np.float32)
        compiled = jax.jit(eval_step).lower(state, batch).compile(
            _MEMORY_ONLY_OPTIONS if repeats == 0 else None)
    else:
        compiled = jax.jit(train_step, donate_argnums=0).lower(state, batch).compile(
            _MEMORY_ONLY_OPTIONS if repeats == 0 else None)
    analysis = compiled.memory_analysis()
    temp = getattr(analysis, "temp_size_in_bytes", None) if analysis is not None else None
    row = {"model": model, "length": length, "time_s": None, "temp_bytes": temp,
           "impl": impl}
    if repeats == 0:  # memory only: XLA's analysis needs no run
        return row
    def call():
        nonlocal state
        if step == "eval":
            return compiled(state, batch)
        state, metrics = compiled(state, batch)
        return metrics

    jax.block_until_ready(call())  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(call())
        times.append(time.perf_counter() - start)
    row["time_s"] = statistics.median(times)
    stats = jax.devices()[0].memory_stats()
    if stats and "peak_bytes_in_use" in stats:
        row["device_peak_bytes"] = stats["peak_bytes_in_use"]
    return row


def takes_override(model: str, override: str) -> bool:
    """Whether --override `field=value` applies to `model`: a model_hparams field only to
    the variants whose builder takes it, any other field to every model."""
    field = override.partition("=")[0]
    if not field.startswith("model_hparams."):
        return True
    if model == FUSED:
        model = "transformer"
    from lra.cache_memory import mixers_of

    name = field[len("model_hparams."):]
    return any(name in registry.accepted_hparams(m) for m in mixers_of(model))


def apply_overrides(config, overrides) -> None:
    """Sets each `field=value` (value as on launch.py's command line: a Python literal,
    true/false, else text) on the config, for the overrides its model takes
    (takes_override); a field the config lacks is refused in one line, model_hparams
    aside (a builder argument the presets leave at its default)."""
    from lra.errors import ConfigError
    from lra.runs import hparams

    for override in overrides:
        field, sep, text = override.partition("=")
        if not sep or not field:
            raise ConfigError(f"--override={override!r}: give field=value")
        if not takes_override(config.model, override):
            continue
        value = hparams.parse_value(text)
        *parents, leaf = field.split(".")
        node = config
        for part in parents:
            if part not in node:
                raise ConfigError(f"--override={override}: the config has no field "
                                  f"{part!r} ({field})")
            node = node[part]
        if parents == ["model_hparams"] and leaf not in node:
            takes = registry.accepted_hparams(config.model)
            with config.unlocked():
                node[leaf] = hparams.typed(config.model, leaf, value, takes[leaf])
        elif leaf not in node:
            raise ConfigError(f"--override={override}: the config has no field {field!r}")
        else:
            node[leaf] = value


def generated_batch(config, task_info, length: int) -> dict[str, np.ndarray]:
    """One training batch of a generated task with a label per position (MQAR, MAD,
    state tracking, niah, flip-flop) at max_length `length`, from its own generator with
    the config's task options: the labels (which positions, how many) and the padding of
    its real rows, so that the step timed is the step a run takes. Only a batch of rows
    is generated (config.task_options.num_train_examples set to the batch size)."""
    b = config.batch_size
    options = config.task_options.to_dict()
    options["num_train_examples"] = b
    rows = task_info.load(config.data_dir, "train", length, **options)
    return {key: np.asarray(value)[:b] for key, value in rows.items()}


def build_model_with_impl(config, task_info, attention_impl: str) -> tuple[nnx.Module, str]:
    """`lra.train.build_model` with config.attention_impl = `attention_impl` where the
    variant has that implementation (at this config), else with its own
    (attention_impl="dense"); returns (model, the attention_impl it was built with).

    Which values a variant takes is known only to its builder (and `Classifier` refuses any
    but "dense" for attention-free mixers), so the requested value is tried first: a
    ValueError (RegistryError included) there while "dense" builds means the variant lacks
    that implementation. An error that "dense" gives too is not about the implementation:
    the dense build's is raised (e.g. loglinear_mamba2 refusing a max_len over 16384, which
    the requested build would hide behind "has one implementation").
    """
    from lra import train

    config.attention_impl = attention_impl
    if attention_impl == "dense":
        return train.build_model(config, task_info), "dense"
    try:
        return train.build_model(config, task_info), attention_impl
    except ValueError as e:
        error = e
    config.attention_impl = "dense"
    try:
        return train.build_model(config, task_info), "dense"
    except Exception as dense_error:  # noqa: BLE001  (not about the implementation)
        raise dense_error from error


def first_line(text: str, limit: int = 300) -> str:
    """The first non-empty line of `text`, whole up to `limit` characters; a longer one is
    cut at the last word boundary before it, with an ellipsis (never mid-word)."""
    line = next((l.strip() for l in text.splitlines() if l.strip()), "")
    if len(line) <= limit:
        return line
    end = line.rfind(" ", 0, limit + 1)
    if end <= 0:  # one long word first: keep it whole
        end = line.find(" ", limit)
        if end < 0:
            return line
    return line[:end].rstrip(" ,;:") + "..."


def too_steep(model: str, rows: list[dict], up_to: int, max_growth: float) -> str | None:
    """Why `model` is not measured above `up_to` (its time or memory grew faster than
    L^max_growth over its cells at lengths <= up_to), or None."""
    mine = sorted((r["length"], r) for r in rows if r["model"] == model
                  and r["length"] <= up_to and "error" not in r)
    if len(mine) < 2:
        return f"skipped: fewer than 2 cells up to L={up_to} to estimate its growth"
    lengths = [l for l, _ in mine]
    for what, key in (("time", "time_s"), ("memory", "temp_bytes")):
        g = growth_exponent(lengths, [r.get(key) for _, r in mine])
        if g is not None and g > max_growth:
            return f"skipped: {what} grew as L^{g:.2f} up to L={up_to}"
    return None


CSV_FIELDS = ["model", "length", "time_s", "temp_bytes", "device_peak_bytes", "error",
              "impl", "mode", "task", "batch_size", "dim", "num_heads", "num_layers",
              "attention_impl", "repeats", "platform", "config_arg", "dtype", "overrides"]
# Written before --override: read as its column empty.
_OLD_CSV_FIELDS = set(CSV_FIELDS) - {"overrides"}


def append_csv(path: str, row: dict, settings: dict) -> None:
    """Appends one cell (with the settings it was measured under) to `path`."""
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        if new:
            writer.writeheader()
        writer.writerow({k: {**row, **settings}.get(k) for k in CSV_FIELDS})


def read_csv(path: str, settings: dict) -> dict[tuple[str, int], dict]:
    """Cells of an earlier run in `path` measured under the same `settings` (errors are
    measured again), keyed by (model, length)."""
    if not os.path.exists(path):
        return {}
    with open(path, newline="") as f:
        records = list(csv.DictReader(f))
    if records and set(records[0]) not in (set(CSV_FIELDS), _OLD_CSV_FIELDS):
        cli.refuse(f"{path} was not written by this benchmark version; "
                   "give another --csv or delete it")
    done = {}
    for rec in records:
        rec.setdefault("overrides", "")
        if rec["error"] or any(rec[k] != str(v) for k, v in settings.items()):
            continue
        done[(rec["model"], int(rec["length"]))] = {
            "model": rec["model"], "length": int(rec["length"]),
            "time_s": float(rec["time_s"]) if rec["time_s"] else None,
            "temp_bytes": int(rec["temp_bytes"]) if rec["temp_bytes"] else None,
            **({"device_peak_bytes": int(rec["device_peak_bytes"])}
               if rec["device_peak_bytes"] else {}),
            **({"impl": rec["impl"]} if rec["impl"] else {})}
    return done


def measure_cell(model: str, length: int) -> dict:
    """One cell under the flags' settings; a variant that cannot run at L gives an error
    row saying why instead of raising."""
    try:
        if FLAGS.mode in ("train_step", "eval_step"):
            fused = model == FUSED  # the reference: transformer, attention_impl=flash
            step = functools.partial(
                measure_train_step, "transformer" if fused else model, length,
                task=FLAGS.task, batch_size=FLAGS.batch_size, dim=FLAGS.dim,
                num_heads=FLAGS.num_heads, num_layers=FLAGS.num_layers,
                repeats=FLAGS.repeats,
                attention_impl="flash" if fused else FLAGS.attention_impl,
                config_arg=FLAGS.config_arg, dtype=FLAGS.dtype,
                overrides=tuple(FLAGS.override), step=FLAGS.mode.partition("_")[0])
            try:
                row = step()
            except FlashError as e:
                # cuDNN's and splash's fused attention have no attention-weight dropout
                # (LRA's text config: 0.1): the reference is then measured without it, as
                # a user of those kernels runs it, and its impl cell says so. (The first
                # GPU run's bf16 reference was this refusal in every cell: H200, 2026-12-04.)
                if not fused or "dropout" not in str(e):
                    raise
                row = {**step(attention_dropout_rate=0.0), "impl": FUSED_NO_DROPOUT}
            return {**row, "model": model}
        return measure(model, length, batch_size=FLAGS.batch_size or 1,
                       dim=FLAGS.dim or 256, num_heads=FLAGS.num_heads or 4,
                       repeats=FLAGS.repeats, task=FLAGS.task)
    except Exception as e:  # noqa: BLE001
        reason = first_line(str(e)) or type(e).__name__
        return {"model": model, "length": length, "error": reason}


_CELL_PREFIX = "benchmark-cell: "


def isolated_cell(model: str, length: int, setting_flags: list[str]) -> dict:
    """measure_cell in a fresh `python -m lra.benchmark --cell=...` process."""
    cmd = [sys.executable, "-m", "lra.benchmark", f"--cell={model}:{length}", *setting_flags]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_CELL_PREFIX):
            return json.loads(line[len(_CELL_PREFIX):])
    last = first_line((proc.stderr.strip().splitlines() or ["no output"])[-1])
    return {"model": model, "length": length,
            "error": f"process died (exit {proc.returncode}): {last}"}


def parse_lengths(values: list[str]) -> list[int]:
    """--lengths as positive integers; a ValueError says which entry is wrong."""
    if not values:
        raise ValueError("--lengths is empty; give a comma list of positive integers, e.g. "
                         "--lengths=1024,2048")
    lengths = []
    for v in values:
        try:
            length = int(v)
        except ValueError:
            length = None
        if length is None or length < 1:
            raise ValueError(f"--lengths: {v!r} is not a positive integer; give a comma list "
                             "of sequence lengths, e.g. --lengths=1024,2048")
        lengths.append(length)
    return list(dict.fromkeys(lengths))


def check_flags() -> list[int]:
    """The flags' mistakes as one ValueError (before anything is compiled); the lengths."""
    lengths = parse_lengths(FLAGS.lengths)
    for name in ("batch_size", "dim", "num_heads", "num_layers", "repeats",
                 "transformer_max_length", "growth_check_length"):
        if getattr(FLAGS, name) < 0:
            raise ValueError(f"--{name}={getattr(FLAGS, name)} must be >= 0 (see --helpfull)")
    if not FLAGS.models:
        raise ValueError("--models is empty; give registry names or 'all'")
    from lra.cache_memory import mixers_of
    from lra.errors import UserError

    try:
        unknown = [m for m in hybrid.split_models(FLAGS.models) if m not in ("all", FUSED)
                   and not set(mixers_of(m)) <= set(registry.available())]
    except UserError as e:  # a malformed hybrid name
        raise ValueError(str(e)) from None
    if unknown:  # else only a table cell said so, and the run exited 0
        raise ValueError(f"--models: unknown {', '.join(unknown)}; available: "
                         f"{', '.join(registry.available())}")
    for override in FLAGS.override:
        if FLAGS.mode == "mixer":
            raise ValueError("--override is for --mode=train_step or eval_step (a task "
                             "config's model)")
        field, sep, _ = override.partition("=")
        if not sep or not field:
            raise ValueError(f"--override={override!r}: give field=value")
        named = [m for m in hybrid.split_models(FLAGS.models) if m not in ("all", FUSED)]
        if field.startswith("model_hparams.") and "all" not in FLAGS.models and not any(
                takes_override(m, override) for m in named):
            raise ValueError(f"--override={override}: none of {', '.join(named)} takes "
                             f"{field[len('model_hparams.'):]!r}")
    if FLAGS.override and os.path.exists(os.path.join(
            os.path.dirname(os.path.abspath(common.__file__)), f"{FLAGS.task}.py")):
        import importlib

        from lra.errors import ConfigError
        for model in ["transformer", *(m for m in hybrid.split_models(FLAGS.models)
                                       if m not in ("all", FUSED))]:
            config = importlib.import_module(f"configs.{FLAGS.task}").get_config(
                f"model={hybrid.base_of(model)}"
                + (f",{FLAGS.config_arg}" if FLAGS.config_arg else ""))
            try:  # a missing field or a mistyped value: one line, not an error per cell
                apply_overrides(config, FLAGS.override)
            except (ConfigError, TypeError) as e:  # TypeError: ml_collections' field types
                raise ValueError(str(e) if str(e).startswith("--override")
                                 else f"--override: {e}") from None
    configs_dir = os.path.dirname(os.path.abspath(common.__file__))
    if not os.path.exists(os.path.join(configs_dir, f"{FLAGS.task}.py")):
        from lra import tasks
        raise ValueError(f"--task={FLAGS.task}: no task config configs/{FLAGS.task}.py; "
                         f"tasks: {', '.join(tasks.available())}")
    from lra.training.console import unwritable
    if FLAGS.csv and unwritable(FLAGS.csv, "--csv"):
        raise ValueError(unwritable(FLAGS.csv, "--csv"))
    return lengths


def main(argv):
    if len(argv) > 1:
        print(f"error: unexpected arguments: {' '.join(argv[1:])}", file=sys.stderr)
        sys.exit(2)
    logging.set_verbosity(logging.WARNING)
    if FLAGS.cell:
        model, length = FLAGS.cell.rsplit(":", 1)
        print(_CELL_PREFIX + json.dumps(measure_cell(model, int(length))), flush=True)
        return
    try:
        lengths = check_flags()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if FLAGS.isolate == "false":
        platform, isolate = jax.devices()[0].platform, False
    else:  # this process must not claim the accelerator the cell processes will need
        platform = subprocess.run(
            [sys.executable, "-c", "import jax; print(jax.devices()[0].platform)"],
            capture_output=True, text=True, check=True).stdout.split()[-1]
        isolate = FLAGS.isolate == "true" or platform != "cpu"
    models = (registry.available() if FLAGS.models == ["all"]
              else hybrid.split_models(FLAGS.models))
    # Ratios need both references in the same run: the fused transformer and the
    # materialised one (under --attention_impl, dense by default).
    models = ["transformer", FUSED, *(m for m in models if m not in ("transformer", FUSED))]
    settings = {"mode": FLAGS.mode, "task": FLAGS.task, "batch_size": FLAGS.batch_size,
                "dim": FLAGS.dim, "num_heads": FLAGS.num_heads, "num_layers": FLAGS.num_layers,
                "attention_impl": FLAGS.attention_impl, "repeats": FLAGS.repeats,
                "platform": platform, "config_arg": FLAGS.config_arg, "dtype": FLAGS.dtype,
                "overrides": " ".join(FLAGS.override)}
    setting_flags = ([f"--{k}={v}" for k, v in settings.items()
                      if k not in ("platform", "overrides")]
                     + [f"--override={o}" for o in FLAGS.override])
    done = read_csv(FLAGS.csv, settings) if FLAGS.csv else {}
    if done:
        print(f"{FLAGS.csv}: reusing {len(done)} cells measured with the same settings",
              file=sys.stderr)
    rows = []
    cells = [(m, l) for m in models for l in lengths]
    todo = sum((m, l) not in done for m, l in cells)
    started, measured = time.perf_counter(), 0
    for model, length in cells:
        if (model, length) in done:
            rows.append(done[(model, length)])
            continue
        elapsed = time.perf_counter() - started
        eta = f", ETA {elapsed / measured * (todo - measured):.0f}s" if measured else ""
        bar = "#" * (20 * measured // todo)
        print(f"[{bar:<20}] {measured + 1}/{todo} {model} L={length} ({elapsed:.0f}s{eta})",
              file=sys.stderr, flush=True)
        measured += 1
        if (model == "transformer" and FLAGS.transformer_max_length
                and length > FLAGS.transformer_max_length):
            rows.append({"model": model, "length": length, "error": "skipped"})
            continue
        # The fused reference is measured at every length: the break-even column needs it.
        too_fast = (too_steep(model, rows, FLAGS.growth_check_length, FLAGS.max_growth)
                    if FLAGS.growth_check_length and length > FLAGS.growth_check_length
                    and model != FUSED else None)
        if too_fast:
            rows.append({"model": model, "length": length, "error": too_fast})
            continue
        rows.append(isolated_cell(model, length, setting_flags) if isolate
                    else measure_cell(model, length))
        if FLAGS.csv:  # written as cells finish: a long run that is stopped keeps them
            append_csv(FLAGS.csv, rows[-1], settings)
    stepped = FLAGS.mode in ("train_step", "eval_step")
    what = (f"One {'training' if FLAGS.mode == 'train_step' else 'eval (test)'} step of "
            f"the {FLAGS.task}{':' + FLAGS.config_arg if FLAGS.config_arg else ''} model"
            if stepped else "Forward+backward of one mixer")
    sizes = ", ".join(f"{k} {v}" for k, v in (
        ("batch", FLAGS.batch_size), ("dim", FLAGS.dim), ("heads", FLAGS.num_heads),
        ("layers", FLAGS.num_layers)) if v) or "the task config's sizes"
    attention_impl = FLAGS.attention_impl if stepped else "dense"
    if attention_impl != "dense":
        what += (f" (attention_impl={attention_impl} where a variant has it, else its own: "
                 "the impl column)")
    if stepped and FLAGS.dtype != "float32":
        what += f", computing in {FLAGS.dtype}"
    if stepped and FLAGS.override:
        what += (", with " + ", ".join(FLAGS.override) + " (model_hparams: the models that "
                 "take them)")
    if platform == "cpu":  # 1.3-1.7x on a step (results/cpu/malloc_huge_pages.md)
        pages = cli.malloc_pages(dict(os.environ))
        if pages != "huge pages":
            pages = f"{pages} (GLIBC_TUNABLES={cli.HUGE_PAGES_TUNABLE} gives huge ones)"
        platform = f"cpu, malloc on {pages}"
    print(f"{what}; {sizes}; {platform}, jax {jax.__version__}. "
          f"Cells: time per step, XLA temporary memory (ratios to {FUSED}, the fused "
          "reference: cuDNN on GPU, splash on TPU, the O(L)-memory chunked form on CPU; "
          "and to transformer, the L x L logits materialised as LRA measured it).\n")
    print(table(rows, lengths, attention_impl))
    if FLAGS.mode == "train_step" and 4096 in lengths:
        print("\nAt L=4096 against LRA's Table 2 (speed: steps/s ratio to transformer; "
              "memory: transformer's / the variant's; LRA's on TPU, ours here; "
              "lra/reporting/efficiency.py says where LRA's numbers come from):\n")
        print(lra_comparison(rows))
    if max(lengths) > 4096:
        print(f"\nGrowth from L=4096 to {max(lengths)} of the models measured there (goal: "
              f"at most L^1.15 in time and memory):\n")
        print(growth_goal(rows, lengths))


if __name__ == "__main__":
    _define_flags()
    app.run(main, flags_parser=cli.parse_flags_or_refuse)

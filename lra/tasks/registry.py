"""Task registry: name -> metadata and a reader.

Every reader returns, for one split, a dict of numpy arrays:
  inputs_NxL  int32  token ids, right-padded with 0 to `max_length`
  mask_NxL    bool   True on real tokens (kept separate from token values: for
                     images, token 0 is a black pixel, not padding)
  targets_N   int32  class labels in [0, num_classes), or for a task with
                     `sequence_labels` targets_NxL: a label per position, -100 where
                     ignored (MQAR, MAD; objective sequence_labels)
Dual-input tasks (retrieval) add `inputs2` / `mask2`.
Keys in the dict drop the shape suffixes: "inputs", "mask", "targets".
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any, Callable

import numpy as np

from lra.errors import ConfigError, DataError

SPLITS = ("train", "val", "test")

# (data_dir, split, max_length, **options) -> {"inputs", "mask", "targets", ...}
# `options` are task-specific reader settings (config.task_options), keyword-only.
Reader = Callable[..., dict[str, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    num_classes: int
    vocab_size: int  # including the padding id 0
    max_length: int  # LRA's default sequence length for this task
    reader: Reader
    dual_input: bool = False
    default_data_dir: str = ""
    how_to_get_data: str = ""  # one line, shown when data is missing
    # Targets are a label per position (-100: ignored), for objective sequence_labels.
    sequence_labels: bool = False
    # A task whose vocabulary depends on its options (generated tasks: MQAR's
    # task_options.vocab_size): options -> vocab_size (with_options applies it).
    vocab_size_of: Callable[..., int] | None = None
    # The model is MAD's auto-encoder (models/autoencoder.py: the row from the last
    # position's code), not a per-position predictor: MAD's compression.
    autoencoder: bool = False
    # (options, max_length, length) -> (max_length, options) of the test split with rows
    # `length` long, for config.eval_lengths (lra/training/lengths.py); None: the split
    # regenerated at max_length = length with the same options.
    at_length: Callable[..., tuple[int, dict]] | None = None
    # (options, lo, hi) -> options of the test split with its needles at depths in
    # [lo, hi) of the context, for config.eval_depth_buckets (NIAH); None: no depths.
    at_depth: Callable[..., dict] | None = None

    def with_options(self, **options: Any) -> "Task":
        """The task as the options configure it (its vocabulary, for generated tasks)."""
        if self.vocab_size_of is None:
            return self
        vocab = int(self.vocab_size_of(**options))
        return dataclasses.replace(self, vocab_size=vocab,
                                   num_classes=vocab if self.sequence_labels else self.num_classes)

    def option_names(self) -> list[str]:
        """The reader's options: its keyword-only parameters (config.task_options)."""
        return [p.name for p in inspect.signature(self.reader).parameters.values()
                if p.kind == p.KEYWORD_ONLY]

    def load(self, data_dir: str, split: str, max_length: int,
             **options: Any) -> dict[str, np.ndarray]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        accepted = self.option_names()
        for name in options:
            if name not in accepted:
                raise ConfigError(
                    f"config.task_options.{name} is not an option of task {self.name!r}; "
                    f"its options: {', '.join(accepted) or 'none'}"
                )
        data = self.reader(data_dir, split, max_length, **options)
        if len(data["inputs"]) == 0:  # a run would train, then fail at its evaluation
            raise DataError(f"task {self.name}: the {split} split read from {data_dir} has "
                            f"no examples; {self.how_to_get_data or 'regenerate the data'}")
        return data


def generated_reader(read_split: Callable[..., dict[str, np.ndarray]]) -> Reader:
    """The reader of a task generated from its options (no files: data_dir is not read):
    read_split(split, max_length, **options), its options read_split's keyword-only
    parameters (what Task.load checks config.task_options against)."""
    def read(data_dir: str, split: str, max_length: int, **options) -> dict[str, np.ndarray]:
        del data_dir
        return read_split(split, max_length, **options)

    read.__signature__ = inspect.signature(read_split).replace(parameters=[
        p for p in inspect.signature(read_split).parameters.values()
        if p.kind == p.KEYWORD_ONLY])
    return read


_TASKS: dict[str, Task] = {}
# Modules that register tasks; imported on first use of the registry.
TASK_MODULES = ("lra.tasks.listops", "lra.tasks.text", "lra.tasks.retrieval", "lra.tasks.image",
                "lra.tasks.pathfinder", "lra.tasks.mnist", "lra.tasks.mqar",
                "lra.tasks.mad", "lra.tasks.enwik8", "lra.tasks.state_tracking",
                "lra.tasks.niah", "lra.tasks.flipflop")


def _load_all() -> None:
    for module in TASK_MODULES:
        importlib.import_module(module)


def register(task: Task) -> Task:
    if task.name in _TASKS:
        raise ValueError(f"task {task.name!r} is already registered")
    _TASKS[task.name] = task
    return task


def available() -> list[str]:
    _load_all()
    return sorted(_TASKS)


def get(name: str) -> Task:
    _load_all()
    if name not in _TASKS:
        raise ConfigError(f"unknown task {name!r}; available tasks: {', '.join(available())}")
    return _TASKS[name]

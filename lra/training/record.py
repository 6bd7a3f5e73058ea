"""What a run writes and prints about itself: results.json (`results`, with the majority
baseline beside the test accuracy) and the other JSON files, written whole or not at all
(write_json), the one-row results table launch.py prints, the
parameters' bytes (all, and the most one device holds), the device's peak memory, the
share of training time spent waiting for input, and a duration as the progress line
shows it."""
from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np

from lra.errors import CheckpointError
from lra.runs import cli


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def input_fraction(loop: dict) -> float:
    """Share of the timed training time spent waiting for input batches."""
    seconds = loop["train_seconds"]
    return min(loop.get("input_seconds", 0.0) / seconds, 1.0) if seconds else 0.0


def write_json(path: str, obj: Any) -> None:
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True, default=str)
        os.replace(tmp, path)
    except OSError as e:
        raise CheckpointError(f"cannot write {path}: {e.strerror or e}; free space or fix the "
                              "folder, then re-run the same command") from None


def param_bytes(params: Any) -> tuple[int, int]:
    """(total bytes of the parameters, the most any one local device holds)."""
    total, per_device = 0, {}
    for x in jax.tree.leaves(params):
        total += x.size * x.dtype.itemsize
        for shard in x.addressable_shards:
            per_device[shard.device] = (per_device.get(shard.device, 0)
                                        + shard.data.size * shard.data.dtype.itemsize)
    return total, max(per_device.values(), default=0)


def device_peak_bytes() -> int | None:
    """Peak memory in use on this process's first device (GPU/TPU; None on CPU)."""
    stats = jax.local_devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def results_table(results: dict) -> str:
    """A one-row markdown table of a run's results."""
    header = ("| task | model | params | steps | best val acc | test acc | majority baseline "
              "| steps/s |\n|---|---|---|---|---|---|---|---|")
    objective = results.get("objective", "classify")
    model = results["model"] + ("" if objective == "classify" else f" ({objective})")
    row = (f"| {results['task']} | {model} | {results['num_params']:,} "
           f"| {results['steps']} | {results['best_eval_accuracy']:.4f} "
           f"| {results['test_accuracy']:.4f} | {results['majority_baseline_accuracy']:.4f} "
           f"| {results['train_steps_per_sec']:.2f} |")
    c = results.get("scaffold_card")
    if not c:
        return header + "\n" + row
    from lra.runs.card import describe

    flops = c.get("flops_per_token")
    return (header + "\n" + row + f"\nscaffold {c['scaffold']}: {describe(c)}"
            + (f", {flops / 1e6:.2f} MFLOP per token" if flops else ""))


def majority_baseline(data: dict, task: Any, *, token_level: bool,
                      pretraining: bool) -> tuple[int, float]:
    """(the most frequent training target, its share of the test targets): what
    predicting one class (pretraining: one token; sequence_labels: one label at the
    labelled positions) everywhere would score."""
    if pretraining:
        def tokens(split):  # every real token, of both documents for retrieval
            return np.concatenate([data[split][i][data[split][m].astype(bool)]
                                   for i, m in (("inputs", "mask"), ("inputs2", "mask2"))
                                   if i in data[split]])

        majority = int(np.bincount(tokens("train"), minlength=task.vocab_size).argmax())
        test_tokens = tokens("test")
    elif token_level:
        def labels(split):
            y = data[split]["targets"]
            return y[(y != -100) & data[split]["mask"].astype(bool)]

        majority = int(np.bincount(labels("train"), minlength=task.vocab_size).argmax())
        test_tokens = labels("test")
    else:
        majority = int(np.bincount(data["train"]["targets"],
                                   minlength=task.num_classes).argmax())
        test_tokens = data["test"]["targets"]
    return majority, float(np.mean(test_tokens == majority))


def results(config: Any, loop: dict, test: dict, *, model: str, layers: list | None,
            best_info: dict, test_weights: str, num_params: int, scaffold_card: dict,
            majority: tuple[int, float], mesh_shape: dict, param_bytes: tuple[int, int],
            train_step_temp_bytes: int | None, fingerprint: dict) -> dict:
    """results.json's content (DESIGN.md 2): the run's config and loop record (`loop`:
    best step, histories, timings), the test metrics (`test`, with lra.train's
    length_accuracy, depth_accuracy and split_accuracy lists), and what the run measured
    on itself; `layers`: a hybrid's resolved layer list (lra/runs/spec.py), else None."""
    best_step = loop["best_step"] if loop["best_step"] >= 0 else None
    out = {
        "task": config.task,
        # A hybrid's name, e.g. gla+transformer@1,3 (its resolved layers below).
        "model": model,
        "objective": config.objective,
        "init_from": config.init_from or None,
        "num_params": int(num_params),
        "steps": int(config.num_train_steps),
        # The step an early stop ended training at (config.early_stop_accuracy), else None.
        "stopped_at_step": loop.get("stopped_at_step"),
        "best_eval_accuracy": loop["best_eval_accuracy"],
        # The best step on validation (its accuracy beside it), and the step whose weights
        # were tested: the last one when the best checkpoint could not be read.
        "best_step": best_step if best_step is not None else best_info["step"],
        "test_step": best_info["step"],
        "test_weights": test_weights,
        "test_accuracy": test["accuracy"],
        "test_loss": test["loss"],
        "best_eval_loss": loop.get("best_eval_loss"),
        "test_bits_per_token": test.get("bits_per_token"),
        # sequence_labels: test_accuracy is per labelled position; this, per example (every
        # labelled position of the example right).
        "test_example_accuracy": test.get("example_accuracy"),
        # config.eval_lengths: the test weights on the test split made at each length.
        "length_accuracy": test["length_accuracy"] or None,
        # config.eval_depth_buckets: the same per (length, needle depth range).
        "depth_accuracy": test["depth_accuracy"] or None,
        # config.eval_splits: the same on test splits made with other task options.
        "split_accuracy": test["split_accuracy"] or None,
        # Zoology's BASED recipe: the kernel of the short convolution before every mixer
        # (config.block.short_conv; 0 = none).
        "short_conv": int(config.block.get("short_conv", 0)) if "block" in config else 0,
        # Positions, convolutions, heads, capacity, params, flops per token, measured on
        # the model (lra/runs/card.py); the reports rank only cells whose cards agree.
        "scaffold_card": scaffold_card,
        # sequence_labels: the mean over classes of per-class accuracy, torchmetrics'
        # MulticlassAccuracy(average='macro') as MAD logs it (test_accuracy is micro).
        "test_macro_accuracy": test.get("macro_accuracy"),
        # ... by config.macro_accuracy's rule; with batch_mean, the pooled one beside it.
        "macro_accuracy_rule": config.get("macro_accuracy", "pooled"),
        "test_pooled_macro_accuracy": test.get("pooled_macro_accuracy",
                                               test.get("macro_accuracy")),
        "majority_class": majority[0],
        "majority_baseline_accuracy": majority[1],
        "train_steps_per_sec": (loop["timed_steps"] / loop["train_seconds"]
                                if loop["train_seconds"] else 0.0),
        # Share of the timed training wall time the host spent getting batches (reading,
        # batching, placing on devices): near 1, the run is input-bound.
        "input_wait_fraction": input_fraction(loop),
        # Where the run's wall time went, over all its segments (a resumed run's earlier
        # ones too): train (the timed steps, as train_steps_per_sec), evaluation
        # (validation inside the loop), test (the test split and config.eval_lengths /
        # depths / splits), wall (all of it: set-up, compilation, checkpoint saves, the
        # rest). lra.sweep --status times the runs of a queue from them. from_step:
        # the step wall and evaluation are counted from (not 0 where the run resumed from
        # a checkpoint written before this field existed: its earlier segments are missing).
        "run_seconds": {"wall": loop.get("wall_seconds"), "train": loop["train_seconds"],
                        "evaluation": loop.get("evaluation_seconds"),
                        "test": loop.get("test_seconds"),
                        "from_step": loop.get("wall_from_step", 0)},
        "eval_history": loop["eval_history"],
        "train_history": loop["train_history"],
        "num_devices": jax.device_count(),
        # What ran it ("cpu", "NVIDIA H100 80GB HBM3", "TPU v5 lite"): the timings' device.
        "device_kind": jax.devices()[0].device_kind,
        "mesh_shape": mesh_shape,
        "param_bytes": param_bytes[0],
        "param_bytes_per_device": param_bytes[1],
        "train_step_temp_bytes": train_step_temp_bytes,
        "device_peak_bytes": device_peak_bytes(),
        "num_processes": jax.process_count(),
        "jax_version": jax.__version__,
        # glibc malloc's pages (lra.runs.cli.malloc_pages): huge pages made CPU steps
        # 1.3-1.7x faster, so steps/s compare only between runs under the same.
        "host_malloc": cli.malloc_pages(dict(os.environ)),
        "data_fingerprint": fingerprint,
        "config": config.to_dict(),
    }
    if layers is not None:  # every layer's mixer, hparams, block and groups
        out["layers"] = layers
    return out

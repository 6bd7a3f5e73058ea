"""What a run writes and prints about itself: results.json and the other JSON files,
written whole or not at all (write_json), the one-row results table launch.py prints, the
parameters' bytes (all, and the most one device holds), the device's peak memory, the
share of training time spent waiting for input, and a duration as the progress line
shows it."""
from __future__ import annotations

import json
import os
from typing import Any

import jax

from lra.errors import CheckpointError


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

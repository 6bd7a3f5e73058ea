r"""Efficiency table: time and compiled memory of token mixers against `transformer`.

  python -m lra.benchmark --models=transformer,linear --lengths=1024,2048,4096

For each model and sequence length L, one mixer (dim, heads from flags; the variant's
preset hyperparameters) runs forward + backward (gradients w.r.t. parameters and input)
on a random [batch, L, dim] input under `jax.jit`. Reported per cell:
  time     median wall time of one forward+backward (ms), after a warm-up call;
  memory   XLA's compiled temporary memory (`memory_analysis().temp_size_in_bytes`):
           reproducible, independent of the allocator; on a GPU also the device's peak;
and, per model, the ratios to `transformer` at the same L (measured in the same run) and
the growth exponent in L (slope of log time / log memory against log L).
Markdown goes to stdout (and `--csv` to a file); progress goes to stderr.
"""
from __future__ import annotations

import csv
import math
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging
from flax import nnx

from configs import presets
from models import registry

FLAGS = flags.FLAGS


def _define_flags() -> None:
    # Defined only when run as a program, so importing this module (tests, notebooks,
    # other tools) never claims global absl flag names.
    flags.DEFINE_list("models", ["transformer"], "Registry names, or 'all'.")
    flags.DEFINE_list("lengths", ["1024", "2048", "4096"], "Sequence lengths.")
    flags.DEFINE_integer("batch_size", 1, "Batch size.")
    flags.DEFINE_integer("dim", 256, "Model width.")
    flags.DEFINE_integer("num_heads", 4, "Attention heads.")
    flags.DEFINE_integer("repeats", 3, "Timed calls per cell (the median is reported).")
    flags.DEFINE_string("task", "listops", "Task whose presets give the variant hyperparameters.")
    flags.DEFINE_string("csv", None, "Also write the rows to this CSV file.")
    flags.DEFINE_integer("transformer_max_length", 0,
                         "Skip `transformer` above this length (0 = never): quadratic "
                         "memory and time make it the slowest cell by far.")


def measure(model: str, length: int, *, batch_size: int, dim: int, num_heads: int,
            repeats: int, task: str = "listops") -> dict:
    """Forward+backward time (s) and compiled temporary memory (bytes) of one mixer."""
    hparams = presets.model_hparams(model, task)
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
    compiled = step.lower(params, x).compile()
    analysis = compiled.memory_analysis()
    temp = getattr(analysis, "temp_size_in_bytes", None) if analysis is not None else None
    jax.block_until_ready(compiled(params, x))  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(params, x))
        times.append(time.perf_counter() - start)
    row = {"model": model, "length": length, "time_s": statistics.median(times),
           "temp_bytes": temp}
    device = jax.devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "peak_bytes_in_use" in stats:
        row["device_peak_bytes"] = stats["peak_bytes_in_use"]
    return row


def growth_exponent(lengths: list[int], values: list[float | None]) -> float | None:
    """Least-squares slope of log(value) against log(L); None with fewer than 2 points."""
    pts = [(math.log(l), math.log(v)) for l, v in zip(lengths, values) if v]
    if len(pts) < 2:
        return None
    xs, ys = zip(*pts)
    return float(np.polyfit(xs, ys, 1)[0])


def table(rows: list[dict], lengths: list[int]) -> str:
    """Markdown: per model and L, time and memory with ratios to transformer."""
    by = {(r["model"], r["length"]): r for r in rows}
    models = list(dict.fromkeys(r["model"] for r in rows))
    head = ["model"] + [f"L={l}" for l in lengths] + ["time growth", "memory growth"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in models:
        cells = []
        for l in lengths:
            r, base = by.get((m, l)), by.get(("transformer", l))
            if r is None or "error" in r:
                cells.append(f"- ({r['error']})" if r else "-")
                continue
            ms, mib = r["time_s"] * 1e3, (r["temp_bytes"] or 0) / 2**20
            cell = f"{ms:.1f} ms, {mib:.1f} MiB"
            if base and "error" not in base and m != "transformer":
                speed = base["time_s"] / r["time_s"]
                mem = (base["temp_bytes"] / r["temp_bytes"]) if r["temp_bytes"] else float("nan")
                cell += f" ({speed:.2f}x faster, {mem:.2f}x less mem)"
            cells.append(cell)
        ok = [by.get((m, l)) for l in lengths]
        tg = growth_exponent(lengths, [r["time_s"] if r and "error" not in r else None for r in ok])
        mg = growth_exponent(lengths, [r["temp_bytes"] if r and "error" not in r else None
                                       for r in ok])
        cells += [f"L^{tg:.2f}" if tg is not None else "-", f"L^{mg:.2f}" if mg is not None else "-"]
        lines.append("| " + " | ".join([m] + cells) + " |")
    return "\n".join(lines)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    models = registry.available() if FLAGS.models == ["all"] else FLAGS.models
    if "transformer" not in models:
        models = ["transformer", *models]  # ratios need the reference in the same run
    lengths = [int(l) for l in FLAGS.lengths]
    rows = []
    total = len(models) * len(lengths)
    for n, (model, length) in enumerate(((m, l) for m in models for l in lengths), 1):
        print(f"[{n}/{total}] {model} L={length} ...", file=sys.stderr, flush=True)
        if (model == "transformer" and FLAGS.transformer_max_length
                and length > FLAGS.transformer_max_length):
            rows.append({"model": model, "length": length, "error": "skipped"})
            continue
        try:
            rows.append(measure(model, length, batch_size=FLAGS.batch_size, dim=FLAGS.dim,
                                num_heads=FLAGS.num_heads, repeats=FLAGS.repeats,
                                task=FLAGS.task))
        except Exception as e:  # noqa: BLE001  a variant that cannot run at L: say why
            reason = str(e).splitlines()[0][:80] if str(e) else type(e).__name__
            rows.append({"model": model, "length": length, "error": reason})
    print(f"Forward+backward of one mixer; batch {FLAGS.batch_size}, dim {FLAGS.dim}, "
          f"{FLAGS.num_heads} heads, {jax.devices()[0].platform}, jax {jax.__version__}\n")
    print(table(rows, lengths))
    if FLAGS.csv:
        keys = ["model", "length", "time_s", "temp_bytes", "device_peak_bytes", "error"]
        with open(FLAGS.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            for r in rows:
                writer.writerow({k: r.get(k) for k in keys})


if __name__ == "__main__":
    _define_flags()
    app.run(main)

"""The efficiency table's verdicts: our ratios beside LRA's Table 2, and the growth goals.

`lra.benchmark` prints these below its table when it measured L=4096 (LRA's longest
efficiency length) against `transformer`:

- **Against LRA's Table 2** (Tay et al. 2021, arXiv 2011.04006: one training step of the
  text model at 1K-4K on 4x4 TPU v3 chips). Per variant LRA measured, its steps/s and
  peak memory at 4K as ratios to the Transformer's (1.4 steps/s, 9.48 GB), beside ours at
  4K (steps/s ratio = transformer's time / the variant's; memory = XLA's temporary memory
  ratio). A variant meets the goal when both of ours are at least LRA's.
- **The growth goal**: every variant measured at the longest length (the sub-quadratic
  ones: --growth_check_length skips the others there, from their own numbers) should grow
  at most as L^1.15 in time and memory over the lengths from 4K up.

The Table 2 numbers below were transcribed from the paper's table (steps per second and
peak memory in GB at 4K); two of them were checked against an independent quotation
("Performer fastest (5.7x at 4k)", "Linformer smallest memory (0.99 vs 9.48 GB)"), the
others were not re-read here (the PDF could not be opened from this machine). LRA's
Longformer and Sparse Transformer rows have no efficiency numbers (they were implemented
without efficient kernels there).
"""
from __future__ import annotations

import math

import numpy as np

# Table 2 at L=4K: (steps/s, peak memory in GB); the ratios are against "transformer".
LRA_TABLE2_4K = {
    "transformer": (1.4, 9.48),
    "local": (7.4, 1.37),
    "linformer": (7.7, 0.99),
    "reformer": (1.1, 2.28),
    "sinkhorn": (5.3, 1.48),
    "synthesizer": (1.9, 6.99),
    "bigbird": (1.5, 2.88),
    "linear": (7.8, 1.03),
    "performer": (8.0, 1.06),
}
GOAL_GROWTH = 1.15


def growth_exponent(lengths: list[int], values: list[float | None]) -> float | None:
    """Least-squares slope of log(value) against log(L); None with fewer than 2 points."""
    pts = [(math.log(l), math.log(v)) for l, v in zip(lengths, values) if v]
    if len(pts) < 2:
        return None
    xs, ys = zip(*pts)
    return float(np.polyfit(xs, ys, 1)[0])


def _ratio(base: dict | None, r: dict | None, key: str) -> float | None:
    if not base or not r or "error" in base or "error" in r or not base.get(key) \
            or not r.get(key):
        return None
    return base[key] / r[key]


def lra_comparison(rows: list[dict], length: int = 4096) -> str:
    """Markdown: per Table 2 variant, LRA's speed and memory ratios at 4K beside ours."""
    by = {(r["model"], r["length"]): r for r in rows}
    base = by.get(("transformer", length))
    t_steps, t_mem = LRA_TABLE2_4K["transformer"]
    lines = ["| model | LRA speed (TPU) | ours | LRA memory (TPU) | ours | at least LRA's |",
             "|---|---|---|---|---|---|"]
    for model, (steps, mem) in LRA_TABLE2_4K.items():
        if model == "transformer" or (model, length) not in by:
            continue
        speed, memory = (_ratio(base, by[(model, length)], k)
                         for k in ("time_s", "temp_bytes"))
        lra_speed, lra_memory = steps / t_steps, t_mem / mem
        verdict = ("-" if speed is None or memory is None else
                   "yes" if speed >= lra_speed and memory >= lra_memory else
                   "no (" + ", ".join(w for w, ok in (("speed", speed >= lra_speed),
                                                       ("memory", memory >= lra_memory))
                                      if not ok) + ")")
        lines.append(f"| {model} | {lra_speed:.1f}x | "
                     + (f"{speed:.2f}x" if speed else "-") + f" | {lra_memory:.1f}x | "
                     + (f"{memory:.2f}x" if memory else "-") + f" | {verdict} |")
    return "\n".join(lines)


def growth_goal(rows: list[dict], lengths: list[int], from_length: int = 4096) -> str:
    """Markdown: each model measured at the longest length, its time and memory growth
    exponents over the lengths >= from_length, and whether both are <= GOAL_GROWTH."""
    longest = max(lengths)
    span = [l for l in lengths if l >= from_length]
    by = {(r["model"], r["length"]): r for r in rows}
    models = list(dict.fromkeys(r["model"] for r in rows))
    if not span:
        return ""
    lines = [f"| model | time growth {span[0]}-{longest} | memory growth | "
             f"at most L^{GOAL_GROWTH} |", "|---|---|---|---|"]
    for m in models:
        top = by.get((m, longest))
        if top is None or "error" in top:
            continue
        ok = [by.get((m, l)) for l in span]
        ok = [r if r and "error" not in r else None for r in ok]
        tg = growth_exponent(span, [r and r.get("time_s") for r in ok])
        mg = growth_exponent(span, [r and r.get("temp_bytes") for r in ok])
        good = [g is not None and g <= GOAL_GROWTH for g in (tg, mg)]
        verdict = "yes" if all(good) else "no (" + ", ".join(
            w for w, g in zip(("time", "memory"), good) if not g) + ")"
        lines.append(f"| {m} | " + " | ".join("-" if g is None or math.isnan(g)
                                              else f"L^{g:.2f}" for g in (tg, mg))
                     + f" | {verdict} |")
    return "\n".join(lines)

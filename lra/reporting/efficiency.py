"""The efficiency table (`table`: time and memory per model and length, with ratios to
`transformer` and growth exponents; lra.benchmark prints it, lra.gpu_suite's efficiency
stage too) and its verdicts: our ratios beside LRA's Table 2, and the growth goals.

`lra.benchmark` prints the verdicts below its table when it measured L=4096 (LRA's longest
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


def table(rows: list[dict], lengths: list[int], attention_impl: str = "dense") -> str:
    """Markdown: per model and L, time and memory with ratios to transformer.

    With `attention_impl` other than "dense" (or rows measured with another), an impl column
    gives the attention_impl each model's cells were measured with; `*` and a footnote mark
    the variants that lack the requested one and ran their own.
    """
    by = {(r["model"], r["length"]): r for r in rows}
    models = list(dict.fromkeys(r["model"] for r in rows))
    show_impl = attention_impl != "dense" or any(r.get("impl", "dense") != "dense"
                                                 for r in rows)
    head = (["model"] + (["impl"] if show_impl else []) + [f"L={l}" for l in lengths]
            + ["time growth", "memory growth"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    fallbacks = []
    for m in models:
        cells = []
        if show_impl:
            impls = list(dict.fromkeys(by[(m, l)]["impl"] for l in lengths
                                       if by.get((m, l), {}).get("impl")))
            if any(i != attention_impl for i in impls):
                fallbacks.append(m)
            cells.append("/".join(impls) + ("*" if m in fallbacks else "") if impls else "-")
        for l in lengths:
            r, base = by.get((m, l)), by.get(("transformer", l))
            if r is None or "error" in r:
                cells.append(f"- ({r['error']})".replace("|", "\\|") if r else "-")
                continue
            mib = (r["temp_bytes"] or 0) / 2**20
            cell = (f"{r['time_s'] * 1e3:.1f} ms, " if r["time_s"] else "") + f"{mib:.1f} MiB"
            if r.get("device_peak_bytes"):
                cell += f" (peak {r['device_peak_bytes'] / 2**20:.0f} MiB)"
            if base and "error" not in base and m != "transformer":
                ratios = []
                if r["time_s"] and base["time_s"]:
                    ratios.append(f"{base['time_s'] / r['time_s']:.2f}x faster")
                if r["temp_bytes"] and base["temp_bytes"]:
                    ratios.append(f"{base['temp_bytes'] / r['temp_bytes']:.2f}x less mem")
                cell += f" ({', '.join(ratios)})" if ratios else ""
            cells.append(cell)
        ok = [by.get((m, l)) for l in lengths]
        tg = growth_exponent(lengths, [r["time_s"] if r and "error" not in r else None for r in ok])
        mg = growth_exponent(lengths, [r["temp_bytes"] if r and "error" not in r else None
                                       for r in ok])
        cells += [f"L^{tg:.2f}" if tg is not None else "-",
                  f"L^{mg:.2f}" if mg is not None else "-"]
        lines.append("| " + " | ".join([m] + cells) + " |")
    if fallbacks:
        lines += ["", f"impl*: no attention_impl={attention_impl} in {', '.join(fallbacks)}; "
                      "measured with the variant's own implementation (the impl shown)."]
    return "\n".join(lines)


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

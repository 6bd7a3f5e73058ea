"""lra.report's tables and figure from the rows (lra/reporting/summary.py): LRA's Table 1
(table_rows: test accuracy per model and task, with marks, converged seeds and published
numbers), each task's comparison of from-scratch and self-pretrained rows with parameter
counts (comparison_rows), the pretraining runs' table (pretraining_rows), and Figure 3
(figure_points, plot: accuracy against speed, memory as the marker's area; speed and
memory from the runs or from an lra.benchmark --csv file: efficiency_ratios)."""
from __future__ import annotations

import csv
import statistics
from collections import defaultdict

from lra.reporting.protocol import (convergence_text, model_order, published_text,
                                    tasks_and_models)
from lra.runs.results import SELF_PRETRAINED

PARAMS_MARK = "!"
PARAMS_TOLERANCE_PERCENT = 10  # LRA kept its variants within 10% of the baseline's
PARAMS_NOTE = (f"{PARAMS_MARK}: the variant's parameter count is outside "
               f"±{PARAMS_TOLERANCE_PERCENT}% of `transformer`'s on the same task and config (LRA "
               "kept its variants within 10% of the baseline's parameters, without "
               "publishing the counts); its accuracy is not a like-for-like comparison.")


def efficiency_ratios(path: str, length: int = 0) -> tuple[int, dict[str, tuple]]:
    """(L, {model: (speed ratio, memory ratio)}) against `transformer` from an
    `lra.benchmark --csv` file. The cells measured with the file's last settings are used
    (a file can hold several runs); a ratio is None where a cell has no value."""
    with open(path, newline="") as f:
        records = list(csv.DictReader(f))
    if not records or "temp_bytes" not in records[0]:
        raise ValueError(f"{path}: not an lra.benchmark --csv file")
    setting_keys = [k for k in records[0] if k not in
                    ("model", "impl", "length", "time_s", "temp_bytes", "device_peak_bytes",
                     "error")]
    last = {k: records[-1][k] for k in setting_keys}
    cells = {(r["model"], int(r["length"])): r for r in records
             if not r["error"] and all(r[k] == v for k, v in last.items())}
    base_lengths = sorted(l for m, l in cells if m == "transformer")
    if not base_lengths:
        raise ValueError(f"{path}: no transformer cell to take ratios against")
    length = length or base_lengths[-1]
    if length not in base_lengths:
        raise ValueError(f"{path}: transformer was not measured at L={length} "
                         f"(measured: {base_lengths})")
    base = cells[("transformer", length)]

    def ratio(num, den):
        return float(num) / float(den) if num and den else None

    return length, {m: (ratio(base["time_s"], r["time_s"]),
                        ratio(r["temp_bytes"], base["temp_bytes"]))
                    for (m, l), r in cells.items() if l == length}




def _accuracy_cell(s: dict | None) -> str:
    if s is None or s["accuracy"] is None:
        return "-"
    cell = f"{100 * s['accuracy']:.2f}"
    return cell + (f" ± {100 * s['std']:.2f}" if s["std"] is not None else "")


def _param_reference(summary, task: str, s: dict) -> int | None:
    """transformer's parameter count on `task` with the config of row `s` (its fields but
    the variant's own: model, model_hparams, block, pooling); where transformer rows of
    several counts match, the one with `s`'s pooling; None when there is no single count."""
    key, pooling = s["param_key"]
    rows = [b for (t, _), b in summary.items()
            if t == task and b.get("model") == "transformer" and b["param_key"][0] == key]
    counts = {n for b in rows for n in b["num_params"]}
    if len(counts) > 1:
        counts = {n for b in rows if b["param_key"][1] == pooling for n in b["num_params"]}
    return counts.pop() if len(counts) == 1 else None


def comparison_rows(summary, task: str) -> tuple[list[str], list[list[str]], bool]:
    """One task's table: per model (and config), the from-scratch and self-pretrained test
    accuracy (%), their difference in points, the pretraining run (objective, steps of the
    total), the classifier's parameter count and its ratio to transformer's on the same
    task and config (PARAMS_MARK outside ±PARAMS_TOLERANCE_PERCENT). The self-pretrained columns
    appear when any row of the summary is self-pretrained. Returns (header, rows,
    whether a row is marked)."""
    with_pretrained = any(s.get("kind") == SELF_PRETRAINED for s in summary.values())
    header = ["model", "from scratch",
              *(["self-pretrained", "Δ", "pretraining"] if with_pretrained else []),
              "params", "vs transformer"]
    by_base = defaultdict(lambda: {"scratch": None, "pretrained": []})
    for (t, label), s in summary.items():
        if t != task:
            continue
        row = by_base[s["base"]]
        row["model"] = s["model"]
        if s["kind"] == SELF_PRETRAINED:
            row["pretrained"].append((label, s))
        else:
            row["scratch"] = s
    rows, marked = [], False
    for base in sorted(by_base, key=lambda b: (*model_order(by_base[b]["model"]), b)):
        scratch = by_base[base]["scratch"]
        pretrained = sorted(by_base[base]["pretrained"], key=lambda p: p[0])
        for label, pre in pretrained or [(base, None)]:
            parts = [s for s in (scratch, pre) if s is not None]
            counts = sorted({n for s in parts for n in s["num_params"]})
            reference = _param_reference(summary, task, parts[0]) if len(counts) == 1 else None
            ratio = "-"
            if reference:
                ratio = f"{counts[0] / reference:.3f}"  # 0.898, outside, would print 0.90
                # Integers: 110 against 100 is within 10%, whatever 110 / 100 rounds to.
                if abs(counts[0] - reference) * 100 > PARAMS_TOLERANCE_PERCENT * reference:
                    ratio += f" {PARAMS_MARK}"
                    marked = True
            cells = [label if pre is not None and len(by_base[base]["pretrained"]) > 1
                     else base, _accuracy_cell(scratch)]
            if with_pretrained:
                delta = "-"
                if scratch and pre and scratch["accuracy"] is not None \
                        and pre["accuracy"] is not None:
                    delta = f"{100 * (pre['accuracy'] - scratch['accuracy']):+.2f}"
                cells += [_accuracy_cell(pre), delta, pre["pretraining"] if pre else "-"]
            cells += [" / ".join(f"{n:,}" for n in counts) or "-", ratio]
            rows.append(cells)
    return header, rows, marked


def pretraining_rows(pretraining: dict) -> tuple[list[str], list[list[str]]]:
    """The pretraining runs' table (see summarize_pretraining): losses are per predicted
    token (masked, or next), accuracies in %."""
    header = ["task", "model", "objective", "steps", "best val loss", "test loss",
              "test token accuracy", "bits/token", "majority token", "seeds"]
    tasks, models = tasks_and_models(pretraining)
    rows = []
    for t in tasks:
        for m in models:
            s = pretraining.get((t, m))
            if s is None:
                continue

            def num(v, scale=1.0, digits=4):
                return "-" if v is None else f"{scale * v:.{digits}f}"

            rows.append([t, m, s["objective"], "/".join(map(str, s["steps"])) or "-",
                         num(s["best_eval_loss"]), num(s["test_loss"]),
                         num(s["accuracy"], 100, 2), num(s["bits_per_token"]),
                         num(s["baseline"], 100, 2), str(s["seeds"])])
    return header, rows


def table_rows(summary, marks: dict[tuple[str, str], list[str]] | None = None,
               published: dict[tuple[str, str], tuple[dict, dict]] | None = None
               ) -> tuple[list[str], list[list[str]]]:
    """Header and rows; a cell carries its marks (see run_marks), its count of converged
    seeds when some of several did not converge (see not_converged_reason), and its
    published number (`published`: see published_cells). `avg` leaves Path-X out (LRA's
    Table 1 average); with a pathx column, `avg incl. Path-X` follows."""
    marks, published = marks or {}, published or {}
    tasks, models = tasks_and_models(summary)
    averaged = [t for t in tasks if t != "pathx"]
    header = ["model", *tasks, "avg", *(["avg incl. Path-X"] if "pathx" in tasks else [])]
    rows = []
    for m in models:
        cells, accs = [], {}
        for t in tasks:
            s = summary.get((t, m))
            if s is None or s["accuracy"] is None:
                cells.append("-")
                continue
            accs[t] = s["accuracy"]
            cell = f"{100 * s['accuracy']:.2f}"
            if s["std"] is not None:
                cell += f" ± {100 * s['std']:.2f}"
            for mark in marks.get((t, m), ()):
                cell += f" {mark}"
            cell += convergence_text(s)
            if (t, m) in published:
                cell += " " + published_text(t, s, published[(t, m)])
            cells.append(cell)
        # The average covers the tasks this model has; '*' marks a partial row.
        avg = [_average([accs[t] for t in averaged if t in accs], len(averaged))]
        if "pathx" in tasks:
            avg.append(_average(list(accs.values()), len(tasks)))
        rows.append([m, *cells, *avg])
    baselines = []
    for t in tasks:
        values = [s["baseline"] for (tt, _), s in summary.items() if tt == t and s["baseline"]]
        baselines.append(f"{100 * statistics.fmean(values):.2f}" if values else "-")
    rows.append(["(majority class)", *baselines, *[""] * (len(header) - 1 - len(tasks))])
    return header, rows


def _average(accs: list[float], of: int) -> str:
    """The mean of `accs` in %, with '*' when the row has fewer than `of` tasks."""
    if not accs:
        return "-"
    return f"{100 * statistics.fmean(accs):.2f}" + ("*" if len(accs) < of else "")



def figure_points(summary, efficiency: tuple[int, dict] | None = None) -> list[tuple]:
    """(model, speed ratio, mean accuracy %, memory ratio) per model; speed and memory are
    means over tasks of the runs' own, or from `efficiency` (see efficiency_ratios), where
    a model the benchmark lacks gets speed None. `model` is the row label (see labels);
    the reference is the task's `transformer` row (the only transformer row if it has a
    label)."""
    tasks, models = tasks_and_models(summary)
    points = []
    for m in models:
        speeds, mems, accs = [], [], []
        for t in tasks:
            s, base = summary.get((t, m)), _reference(summary, t)
            if s is None or s["accuracy"] is None:
                continue
            accs.append(s["accuracy"])
            if base and base["steps_per_sec"] and s["steps_per_sec"]:
                speeds.append(s["steps_per_sec"] / base["steps_per_sec"])
            if base and base["memory_bytes"] and s["memory_bytes"]:
                mems.append(s["memory_bytes"] / base["memory_bytes"])
        if not accs:
            continue
        speed = statistics.fmean(speeds) if speeds else 1.0
        mem = statistics.fmean(mems) if mems else 1.0
        if efficiency is not None:
            model = next(summary[(t, m)].get("model", m) for t in tasks if (t, m) in summary)
            speed, mem = efficiency[1].get(model, (None, None))
            mem = mem or 1.0
        points.append((m, speed, 100 * statistics.fmean(accs), mem))
    return points


def _reference(summary, task: str) -> dict | None:
    """The `transformer` row of `task` that ratios are taken against: the plain one, or
    the only one; None when there is none or several labelled ones."""
    if (task, "transformer") in summary:
        return summary[(task, "transformer")]
    rows = [s for (t, _), s in summary.items() if t == task and s.get("model") == "transformer"]
    return rows[0] if len(rows) == 1 else None


def plot(summary, path: str, efficiency: tuple[int, dict] | None = None) -> None:
    """Accuracy vs relative speed, marker area from relative memory (LRA Figure 3)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks, _ = tasks_and_models(summary)
    points = figure_points(summary, efficiency)
    unmeasured = [p[0] for p in points if p[1] is None]
    fig, ax = plt.subplots(figsize=(7, 5))
    for name, speed, acc, mem in (p for p in points if p[1] is not None):
        ax.scatter(speed, acc, s=400 * mem, alpha=0.5)
        ax.annotate(name, (speed, acc), xytext=(0, 10), textcoords="offset points",
                    ha="center", fontsize=7)
    baselines = [s["baseline"] for (t, _), s in summary.items() if s["baseline"]]
    if baselines:  # a variant on this line learned nothing
        ax.axhline(100 * statistics.fmean(baselines), color="gray", linestyle="--",
                   linewidth=1, label="majority class (mean over tasks)")
        ax.legend(fontsize=8, loc="lower right")
    ax.margins(0.15)  # room for the names of the outermost points
    ax.set_xlabel("training speed relative to transformer (steps/s ratio)" + (
        f", lra.benchmark at L={efficiency[0]}" if efficiency else ", from the runs"))
    ax.set_ylabel(f"test accuracy, mean over {', '.join(tasks)} (%)")
    ax.set_title("Accuracy vs speed; marker area = training-step memory vs transformer")
    if unmeasured:
        fig.text(0.01, 0.01, "not in the benchmark: " + ", ".join(unmeasured), fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

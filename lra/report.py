r"""Turn a directory of runs into LRA's Table 1 and Figure 3.

  python -m lra.report workdirs/sweep_listops_mini [--out=<dir>]

Reads every `results.json` below the directory (any depth; e.g. a `lra.sweep` directory)
and writes, into `--out` (default: the directory itself):
  results.md / results.csv  test accuracy (%) per model (rows) and task (columns), mean over
                            seeds (± std when several), the average over tasks, and the
                            majority-class baseline of each task in its own row;
                            `≡ dense` marks a cell whose runs reduce to dense attention at
                            their length (lra/dense_check.py: e.g. a window that covers
                            the whole input), with a footnote; a run the check cannot
                            build gets no mark and a warning line;
  efficiency_accuracy.png   LRA's Figure 3: mean accuracy against training speed (steps/s
                            relative to `transformer` on the same task), marker area from
                            compiled training-step memory relative to `transformer`.

The runs' own steps/s are only comparable when the runs had the machine to themselves.
`--efficiency=bench.csv` takes speed and memory from an `lra.benchmark --csv` file instead
(as LRA's Figure 3 does, at one length: `--efficiency_length`, default the longest at which
`transformer` was measured):

  python -m lra.benchmark --models=all --lengths=1024 --csv=bench.csv
  python -m lra.report workdirs/sweep_listops_mini --efficiency=bench.csv
"""
from __future__ import annotations

import csv
import json
import os
import statistics
from collections import defaultdict

from absl import app, flags

TASK_ORDER = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")
DENSE_MARK = "≡ dense"
DENSE_NOTE = (f"{DENSE_MARK}: at the run's length (config.max_length, plus 1 with CLS "
              "pooling) the variant, with the hyperparameters the run used, attends to every "
              "key: its window, blocks, chunks, k, ... cover the whole input, and it computes "
              "what `transformer` computes (reformer, routing: on shared queries and keys; "
              "lra/dense_check.py). The cell does not measure the variant's approximation.")

FLAGS = flags.FLAGS


def _define_flags() -> None:
    # Defined only when run as a program, so importing this module (tests, notebooks,
    # other tools) never claims global absl flag names.
    flags.DEFINE_string("out", None, "Output directory (default: the input directory).")
    flags.DEFINE_string("efficiency", None, "An lra.benchmark --csv file: Figure 3 takes "
                        "speed and memory from it instead of from the runs.")
    flags.DEFINE_integer("efficiency_length", 0, "Length of the --efficiency cells to use "
                         "(0: the longest at which transformer was measured).")


def collect(root: str) -> list[dict]:
    """Every results.json under `root`."""
    found = []
    for dirpath, _, files in os.walk(root):
        if "results.json" in files:
            with open(os.path.join(dirpath, "results.json")) as f:
                r = json.load(f)
            r["_path"] = dirpath
            found.append(r)
    if not found:
        raise FileNotFoundError(f"no results.json under {root}; run launch.py or lra.sweep first")
    return found


def summarize(results: list[dict]) -> dict[tuple[str, str], dict]:
    """(task, model) -> mean/std test accuracy, seeds, speed, memory, baseline."""
    groups = defaultdict(list)
    for r in results:
        groups[(r["task"], r["model"])].append(r)

    def mean(rs, key):
        values = [r[key] for r in rs if r.get(key) is not None]
        return statistics.fmean(values) if values else None

    return {key: {
        "accuracy": mean(rs, "test_accuracy"),
        "std": statistics.stdev([r["test_accuracy"] for r in rs]) if len(rs) > 1 else None,
        "seeds": len(rs),
        "steps_per_sec": mean(rs, "train_steps_per_sec"),
        "memory_bytes": mean(rs, "train_step_temp_bytes"),
        "baseline": mean(rs, "majority_baseline_accuracy"),
    } for key, rs in groups.items()}


def dense_marks(results: list[dict]) -> tuple[set[tuple[str, str]], list[str]]:
    """(task, model) of the runs whose variant reduces to dense attention at their length
    (any of the group's runs), from each run's resolved `config`; and warning lines for
    the runs that could not be checked. Runs without a config are not checked;
    `transformer` and the variants that are its mixer by construction (`universal`) are
    never marked."""
    marked, warnings = set(), []
    for r in results:
        config = r.get("config")
        if not config or not config.get("model"):
            continue
        key = (r.get("task", config.get("task")), r.get("model", config["model"]))
        if key in marked:
            continue
        try:
            from lra import dense_check  # imports jax: only when a run has a config

            if (not dense_check.always_dense(config["model"])
                    and dense_check.run_reduces_to_dense(config)):
                marked.add(key)
        except Exception as e:  # noqa: BLE001  (an unknown model, a bad value, ...)
            warning = (f"{key[0]} {key[1]}: could not check whether it reduces to dense "
                       f"attention ({type(e).__name__}: {e})")
            if warning not in warnings:
                warnings.append(warning)
    return marked, warnings


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


def tasks_and_models(summary):
    tasks = [t for t in TASK_ORDER if any(k[0] == t for k in summary)]
    tasks += sorted({k[0] for k in summary} - set(tasks))
    models = sorted({k[1] for k in summary}, key=lambda m: (m != "transformer", m))
    return tasks, models


def table_rows(summary, dense: set[tuple[str, str]] = frozenset()
               ) -> tuple[list[str], list[list[str]]]:
    """Header and rows; a cell in `dense` (see dense_marks) carries DENSE_MARK."""
    tasks, models = tasks_and_models(summary)
    header = ["model", *tasks, "avg"]
    rows = []
    for m in models:
        cells, accs = [], []
        for t in tasks:
            s = summary.get((t, m))
            if s is None or s["accuracy"] is None:
                cells.append("-")
                continue
            accs.append(s["accuracy"])
            cell = f"{100 * s['accuracy']:.2f}"
            if s["std"] is not None:
                cell += f" ± {100 * s['std']:.2f}"
            if (t, m) in dense:
                cell += f" {DENSE_MARK}"
            cells.append(cell)
        # The average covers the tasks this model has; '*' marks a partial row.
        avg = f"{100 * statistics.fmean(accs):.2f}" if accs else "-"
        rows.append([m, *cells, avg + ("*" if 0 < len(accs) < len(tasks) else "")])
    baselines = []
    for t in tasks:
        values = [s["baseline"] for (tt, _), s in summary.items() if tt == t and s["baseline"]]
        baselines.append(f"{100 * statistics.fmean(values):.2f}" if values else "-")
    rows.append(["(majority class)", *baselines, ""])
    return header, rows


def markdown(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def figure_points(summary, efficiency: tuple[int, dict] | None = None) -> list[tuple]:
    """(model, speed ratio, mean accuracy %, memory ratio) per model; speed and memory are
    means over tasks of the runs' own, or from `efficiency` (see efficiency_ratios), where
    a model the benchmark lacks gets speed None."""
    tasks, models = tasks_and_models(summary)
    points = []
    for m in models:
        speeds, mems, accs = [], [], []
        for t in tasks:
            s, base = summary.get((t, m)), summary.get((t, "transformer"))
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
            speed, mem = efficiency[1].get(m, (None, None))
            mem = mem or 1.0
        points.append((m, speed, 100 * statistics.fmean(accs), mem))
    return points


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


def report(root: str, out: str | None = None, efficiency_csv: str | None = None,
           efficiency_length: int = 0) -> dict[str, str]:
    """Writes results.md, results.csv and efficiency_accuracy.png; returns their paths."""
    out = out or root
    os.makedirs(out, exist_ok=True)
    results = collect(root)
    summary = summarize(results)
    dense, warnings = dense_marks(results)
    header, rows = table_rows(summary, dense)
    notes = ([DENSE_NOTE] if dense else []) + [f"warning: {w}" for w in warnings]
    paths = {"markdown": os.path.join(out, "results.md"),
             "csv": os.path.join(out, "results.csv"),
             "plot": os.path.join(out, "efficiency_accuracy.png")}
    with open(paths["markdown"], "w", encoding="utf-8") as f:
        f.write(markdown(header, rows) + "\n")
        f.write("".join(f"\n{note}\n" for note in notes))
    with open(paths["csv"], "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    efficiency = (efficiency_ratios(efficiency_csv, efficiency_length)
                  if efficiency_csv else None)
    plot(summary, paths["plot"], efficiency)
    return paths


def main(argv):
    if len(argv) != 2:
        raise app.UsageError("usage: python -m lra.report <directory of runs> [--out=<dir>]")
    try:
        paths = report(argv[1], FLAGS.out, FLAGS.efficiency, FLAGS.efficiency_length)
    except (FileNotFoundError, ValueError) as e:  # no runs, or a bad --efficiency file
        raise SystemExit(f"error: {e}") from None
    print(open(paths["markdown"], encoding="utf-8").read())
    print(f"Wrote {paths['markdown']}, {paths['csv']}, {paths['plot']}")


if __name__ == "__main__":
    _define_flags()
    app.run(main)

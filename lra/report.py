r"""Turn a directory of runs into LRA's Table 1 and Figure 3.

  python -m lra.report workdirs/sweep_listops_mini [--out=<dir>]

Reads every `results.json` below the directory (any depth; e.g. a `lra.sweep` directory;
a file that is not a run's results, e.g. corrupt or missing `task`, `model` or
`test_accuracy`, is skipped with a warning line naming it, and counted)
and writes, into `--out` (default: the directory itself):
  results.md / results.csv  test accuracy (%) per model (rows) and task (columns), mean over
                            seeds (± std when several), the average over tasks, and the
                            majority-class baseline of each task in its own row. Runs are
                            averaged only when their recorded configs agree in every field
                            but `random_seed` and NON_RESULT_FIELDS (logging and checkpoint
                            frequency, device mesh and sharding); runs of one model that
                            differ in another field are separate rows, labelled with the
                            fields that differ, e.g. `transformer [learning_rate=0.01]`;
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
import sys
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


# Config fields that do not change a run's results (up to float summation order): runs that
# differ only in these (and in the seed) are averaged together. Everything else, data_dir
# included (another path may be other data), keeps runs apart. lra.sweep uses the same list
# to decide that a finished run is the one it would start.
SEED_FIELD = "random_seed"
NON_RESULT_FIELDS = ("log_every_steps", "checkpoint_freq", "mesh_shape", "sharding")
REQUIRED_KEYS = ("task", "model", "test_accuracy")
_NUMERIC_KEYS = ("test_accuracy", "train_steps_per_sec", "train_step_temp_bytes",
                 "majority_baseline_accuracy")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _json_type(v) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean",
            type(None): "null", dict: "object"}.get(type(v), type(v).__name__)


def _problem(r) -> str | None:
    """What makes a parsed results.json unusable, or None."""
    if not isinstance(r, dict):
        return f"a JSON {_json_type(r)}, not an object with {', '.join(REQUIRED_KEYS)}"
    missing = [k for k in REQUIRED_KEYS if k not in r]
    if missing:
        return f"missing {', '.join(missing)}"
    for k in ("task", "model"):
        if not isinstance(r[k], str) or not r[k]:
            return f"{k} is {r[k]!r}, not a name"
    for k in _NUMERIC_KEYS:
        if k in r and not (_is_number(r[k]) or (r[k] is None and k != "test_accuracy")):
            return f"{k} is {r[k]!r}, not a number"
    if r.get("config") is not None and not isinstance(r["config"], dict):
        return f"config is a JSON {_json_type(r['config'])}, not an object"
    return None


def load(root: str) -> tuple[list[dict], list[str]]:
    """(every usable results.json under `root`, one line per skipped file naming it and
    why: unreadable, not JSON, not an object, required keys missing)."""
    found, skipped = [], []
    for dirpath, dirnames, files in os.walk(root):
        dirnames.sort()
        if "results.json" not in files:
            continue
        path = os.path.join(dirpath, "results.json")
        try:
            with open(path, encoding="utf-8") as f:
                r = json.load(f)
        except (OSError, UnicodeDecodeError) as e:
            skipped.append(f"{path}: cannot be read ({e}); skipped")
            continue
        except ValueError as e:
            skipped.append(f"{path}: not valid JSON ({e}); skipped")
            continue
        problem = _problem(r)
        if problem:
            skipped.append(f"{path}: {problem}; skipped")
            continue
        r["_path"] = dirpath
        found.append(r)
    return found, skipped


def collect(root: str) -> list[dict]:
    """Every usable results.json under `root`; a skipped one gets a warning line on stderr
    (see load)."""
    found, skipped = load(root)
    for line in skipped:
        print(f"warning: {line}", file=sys.stderr)
    if not found:
        raise FileNotFoundError(_nothing_found(root, skipped))
    return found


def _nothing_found(root: str, skipped: list[str]) -> str:
    if not skipped:
        return f"no results.json under {root}; run launch.py or lra.sweep first"
    return (f"no usable results.json under {root}: {len(skipped)} skipped (first: "
            f"{skipped[0]})")


def flatten(d: dict, prefix: str = "") -> dict:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists stay values."""
    flat = {}
    for k, v in d.items():
        if isinstance(v, dict):
            flat.update(flatten(v, f"{prefix}{k}."))
        else:
            flat[f"{prefix}{k}"] = v
    return flat


def _grouping_config(r: dict) -> dict | None:
    """The run's config without the seed and NON_RESULT_FIELDS (flattened), or None."""
    config = r.get("config")
    if not isinstance(config, dict):
        return None
    return {k: v for k, v in flatten(config).items()
            if k != SEED_FIELD and k not in NON_RESULT_FIELDS}


_ABSENT = "(absent)"


def labels(results: list[dict]) -> list[str]:
    """One row label per run: its model, or when runs of that model and task were made
    with configs that differ beyond the seed and NON_RESULT_FIELDS, the model followed by
    the differing fields, e.g. `transformer [learning_rate=0.01]`."""
    canon = [json.dumps(_grouping_config(r), sort_keys=True, default=str) for r in results]
    by_model = defaultdict(dict)  # (task, model) -> {canonical config: config}
    for r, c in zip(results, canon):
        by_model[(r["task"], r["model"])].setdefault(c, _grouping_config(r))
    describe = {}
    for key, configs in by_model.items():
        if len(configs) == 1:
            describe.update({(key, c): "" for c in configs})
            continue
        recorded = {c: cfg for c, cfg in configs.items() if cfg is not None}
        fields = sorted({k for cfg in recorded.values() for k in cfg})
        differing = [k for k in fields
                     if len({json.dumps(cfg.get(k, _ABSENT), default=str)
                             for cfg in recorded.values()}) > 1]
        for c, cfg in configs.items():
            if cfg is None:
                text = "no config recorded"
            elif differing:
                text = ", ".join(f"{k}={_show(cfg.get(k, _ABSENT))}" for k in differing)
            else:
                text = "config recorded"
            describe[(key, c)] = text
    out = []
    for r, c in zip(results, canon):
        text = describe[((r["task"], r["model"]), c)]
        out.append(f"{r['model']} [{text}]" if text else r["model"])
    return out


def _show(v) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def summarize(results: list[dict]) -> dict[tuple[str, str], dict]:
    """(task, row label) -> mean/std test accuracy, seeds, speed, memory, baseline, and the
    model. Runs are averaged only when their configs agree but for the seed and
    NON_RESULT_FIELDS (see labels); the label is then the model name."""
    groups = defaultdict(list)
    for r, label in zip(results, labels(results)):
        groups[(r["task"], label)].append(r)

    def mean(rs, key):
        values = [r[key] for r in rs if r.get(key) is not None]
        return statistics.fmean(values) if values else None

    return {key: {
        "model": rs[0]["model"],
        "accuracy": mean(rs, "test_accuracy"),
        "std": statistics.stdev([r["test_accuracy"] for r in rs]) if len(rs) > 1 else None,
        "seeds": len(rs),
        "steps_per_sec": mean(rs, "train_steps_per_sec"),
        "memory_bytes": mean(rs, "train_step_temp_bytes"),
        "baseline": mean(rs, "majority_baseline_accuracy"),
    } for key, rs in groups.items()}


def repeated_seeds(results: list[dict]) -> list[str]:
    """Warning lines for rows that average several runs with the same recorded seed (e.g. a
    copied run folder): those are not independent seeds."""
    by_row = defaultdict(lambda: defaultdict(list))
    for r, label in zip(results, labels(results)):
        seed = (r.get("config") or {}).get(SEED_FIELD)
        if seed is not None:
            by_row[(r["task"], label)][json.dumps(seed)].append(r["_path"] if "_path" in r
                                                                else "?")
    return [f"{task} {label}: {len(paths)} runs with {SEED_FIELD}={seed} are averaged as if "
            f"independent ({', '.join(paths)})"
            for (task, label), seeds in by_row.items() for seed, paths in seeds.items()
            if len(paths) > 1]


def dense_marks(results: list[dict]) -> tuple[set[tuple[str, str]], list[str]]:
    """(task, row label) of the runs whose variant reduces to dense attention at their
    length (any of the row's runs; see labels), from each run's resolved `config`; and
    warning lines for the runs that could not be checked. Runs without a config are not
    checked; `transformer` and the variants that are its mixer by construction
    (`universal`) are never marked."""
    marked, warnings = set(), []
    for r, label in zip(results, labels(results)):
        config = r.get("config")
        if not config or not config.get("model"):
            continue
        key = (r["task"], label)
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
    model_of = {k[1]: s.get("model", k[1]) for k, s in summary.items()}
    models = sorted(model_of, key=lambda m: (model_of[m] != "transformer", model_of[m], m))
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


def report(root: str, out: str | None = None, efficiency_csv: str | None = None,
           efficiency_length: int = 0, skipped: list[str] | None = None) -> dict[str, str]:
    """Writes results.md, results.csv and efficiency_accuracy.png; returns their paths.
    The results.json files that were skipped (see load) are warning lines in results.md
    and, when `skipped` is a list, appended to it."""
    out = out or root
    results, skipped_here = load(root)
    if skipped is not None:
        skipped.extend(skipped_here)
    if not results:
        raise FileNotFoundError(_nothing_found(root, skipped_here))
    os.makedirs(out, exist_ok=True)
    summary = summarize(results)
    dense, warnings = dense_marks(results)
    header, rows = table_rows(summary, dense)
    labelled = any(s.get("model", m) != m for (_, m), s in summary.items())
    notes = ([DENSE_NOTE] if dense else [])
    if labelled:
        notes.append("model [field=value, ...]: runs of one model on one task whose recorded "
                     "configs differ in these fields are separate rows; runs are averaged "
                     f"only when their configs differ at most in {SEED_FIELD} and "
                     f"{', '.join(NON_RESULT_FIELDS)}.")
    notes += [f"warning: {w}" for w in warnings + repeated_seeds(results)]
    if skipped_here:
        notes.append(f"warning: {len(skipped_here)} results.json skipped (not in the table, "
                     f"{len(results)} used):")
        notes += [f"warning: {line}" for line in skipped_here]
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
        print("error: give one directory of runs: python -m lra.report <directory> "
              "[--out=<dir>] [--efficiency=<bench.csv>]", file=sys.stderr)
        sys.exit(2)
    skipped = []
    try:
        paths = report(argv[1], FLAGS.out, FLAGS.efficiency, FLAGS.efficiency_length,
                       skipped=skipped)
    except (OSError, ValueError) as e:  # no runs, a bad --efficiency file, --out unwritable
        raise SystemExit(f"error: {e}") from None
    print(open(paths["markdown"], encoding="utf-8").read())
    print(f"Wrote {paths['markdown']}, {paths['csv']}, {paths['plot']}"
          + (f"; {len(skipped)} results.json skipped (warnings above)" if skipped else ""))


if __name__ == "__main__":
    _define_flags()
    app.run(main)

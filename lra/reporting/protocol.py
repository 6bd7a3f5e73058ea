"""The protocol pieces of `lra.report`: which numbers a reviewer can trust, and why.

- The literature beside our numbers: the published results (lra/reporting/published_results.json,
  each with its paper, table and arXiv id), and which cells may be compared with them (only
  runs of the task's full-size config: `size_differences`, `published_cells`).
- Non-convergence, counted: a run at its majority baseline, or whose training loss never
  left ln(number of classes), has not converged (`not_converged_reason`); a cell gives
  converged seeds / seeds and the mean over both (`convergence_rows`).
- The locality baseline (`lra.sweep --locality_baseline`, the task configs' `locality`
  argument): its runs are the row `locality baseline`, after every model, with a footnote
  saying what each position saw (`row_model`, `locality_note`).
- LRA's task order and the tables' row order (`TASK_ORDER`, `tasks_and_models`), and the
  small helpers both modules use (`markdown`, `show`, `seed_of`).

`lra.report` imports these and re-exports them under their old names; this module imports
nothing from it.
"""
from __future__ import annotations

import functools
import importlib
import json
import math
import os
import statistics
import sys
from collections import defaultdict

from lra.runs.results import SCRATCH, SEED_FIELD, flatten, is_number

TASK_ORDER = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")
ABSENT = "(absent)"  # a config field a run did not record


def show(v) -> str:
    """A config value as a table cell: strings as they are, the rest as JSON."""
    return v if isinstance(v, str) else json.dumps(v)


def seed_of(r: dict):
    """The run's recorded random_seed as JSON, or None."""
    seed = (r.get("config") or {}).get(SEED_FIELD)
    return None if seed is None else json.dumps(seed)


def markdown(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# --- The locality baseline ---------------------------------------------------------------
# Its runs record config.locality_baseline (configs/common.py `locality`: what a position
# sees, e.g. "9 consecutive tokens ..."); their model is `local` or `local_2d`, yet they are
# not those variants' runs: a row of their own, never compared with `local`'s published
# numbers, placed after every model beside the majority class, the other floor.
LOCALITY_LABEL = "locality baseline"
LOCALITY_NOTE = (
    f"{LOCALITY_LABEL}: the task's model (width, heads, optimiser, steps) reduced to what a "
    "short window can tell: one layer of attention whose every position sees only the "
    "few positions around it, with relative positions only (rotary: a window's output does "
    "not depend on where the window is), pooled by MEAN (a CLS slot would see only its own "
    "window), i.e. a classifier of a bag of local features (lra.sweep --locality_baseline, "
    "config argument `locality`, configs/common.py). What a model gains over this row is "
    "what needs more than that window. What each position saw:")


def row_model(r: dict) -> str:
    """The name a run's row is made of: LOCALITY_LABEL for a locality baseline run, else
    its model."""
    if (r.get("config") or {}).get("locality_baseline"):
        return LOCALITY_LABEL
    return r["model"]


def locality_note(summary) -> str | None:
    """LOCALITY_NOTE with what each task's locality baseline runs saw (their recorded
    config.locality_baseline), or None when the summary has none."""
    seen = defaultdict(list)
    for (task, _), s in summary.items():
        if s.get("model") != LOCALITY_LABEL:
            continue
        for r in s.get("runs", []):
            what = (r.get("config") or {}).get("locality_baseline")
            if what and what not in seen[task]:
                seen[task].append(what)
    if not seen:
        return None
    tasks = [t for t in TASK_ORDER if t in seen] + sorted(set(seen) - set(TASK_ORDER))
    return LOCALITY_NOTE + " " + "; ".join(f"{t}: {' / '.join(seen[t])}" for t in tasks) + "."


def model_order(model: str) -> tuple[int, str]:
    """Where rows of `model` go: transformer first, the locality baseline last."""
    return (0 if model == "transformer" else 2 if model == LOCALITY_LABEL else 1, model)


def tasks_and_models(summary):
    """The summary's tasks in LRA's order (TASK_ORDER, then others) and its row labels:
    transformer first, the locality baseline last (model_order)."""
    tasks = [t for t in TASK_ORDER if any(k[0] == t for k in summary)]
    tasks += sorted({k[0] for k in summary} - set(tasks))
    model_of = {k[1]: s.get("model", k[1]) for k, s in summary.items()}
    models = sorted(model_of, key=lambda m: (*model_order(model_of[m]), m))
    return tasks, models


# --- Non-convergence ---------------------------------------------------------------------
CONVERGENCE_MARGIN = 0.01  # test accuracy within 1 point of the majority baseline
CHANCE_LOSS_FRACTION = 0.98  # every logged training loss >= 98% of ln(number of classes)
CONVERGENCE_NOTE = (
    f"(k/n converged: m): k of the cell's n seeds converged; m is the mean over those k "
    f"(the cell's first number is the mean over all n). A run has not converged when its "
    f"test accuracy is below its majority-class baseline plus {100 * CONVERGENCE_MARGIN:g} "
    f"point (results.json majority_baseline_accuracy: the most frequent training label's "
    f"share of the test set), or when every training loss it logged (train_history, the "
    f"mean over each log_every_steps window) is at least {100 * CHANCE_LOSS_FRACTION:g}% of "
    f"ln(number of classes), the loss of a uniform guess: it never left chance. Cells of "
    f"one seed carry no count; every cell with a run that did not converge is in the "
    f"convergence table.")


@functools.lru_cache(maxsize=None)
def _chance_loss(task: str) -> float | None:
    """ln(number of classes) of `task` (the cross-entropy of a uniform guess), or None."""
    try:
        from lra.tasks import registry as task_registry

        classes = task_registry.get(task).num_classes
    except Exception:  # noqa: BLE001  (a task this checkout does not have)
        return None
    return math.log(classes) if classes > 1 else None


def not_converged_reason(r: dict) -> str | None:
    """Why the classification run `r` has not converged (see CONVERGENCE_NOTE), or None
    (converged, or nothing recorded that says otherwise)."""
    acc, base = r.get("test_accuracy"), r.get("majority_baseline_accuracy")
    if is_number(acc) and is_number(base) and acc < base + CONVERGENCE_MARGIN:
        return (f"test {100 * acc:.2f} < majority {100 * base:.2f} + "
                f"{100 * CONVERGENCE_MARGIN:g} point")
    history = r.get("train_history")
    losses = [h["loss"] for h in history if isinstance(h, dict) and is_number(h.get("loss"))
              ] if isinstance(history, list) else []
    chance = _chance_loss(r["task"]) if losses else None
    if chance and min(losses) >= CHANCE_LOSS_FRACTION * chance:
        return f"training loss never below {min(losses):.3f} (chance: ln C = {chance:.3f})"
    return None


def run_name(r: dict) -> str:
    """'seed <s>', or the run's path when it records no seed (convergence table)."""
    seed = seed_of(r)
    return f"seed {seed}" if seed is not None else r.get("_path", "?")


def convergence_text(s: dict) -> str:
    """' (k/n converged: m)' for a cell of several seeds where some did not converge."""
    n, k = s["seeds"], s.get("converged", s["seeds"])
    if n < 2 or k == n:
        return ""
    if k == 0:
        return f" (0/{n} converged)"
    return f" ({k}/{n} converged: {100 * s['accuracy_converged']:.2f})"


def convergence_rows(summary) -> tuple[list[str], list[list[str]]]:
    """Every cell with a run that did not converge: seeds converged of all, the mean over
    all seeds and over the converged ones, and why each other run did not converge."""
    header = ["task", "model", "converged / seeds", "mean, all seeds", "mean, converged",
              "not converged"]
    tasks, models = tasks_and_models(summary)
    rows = []
    for t in tasks:
        for m in models:
            s = summary.get((t, m))
            if s is None or not s.get("not_converged"):
                continue
            conv = s["accuracy_converged"]
            rows.append([t, m, f"{s['converged']}/{s['seeds']}",
                         f"{100 * s['accuracy']:.2f}", "-" if conv is None else
                         f"{100 * conv:.2f}",
                         "; ".join(f"{run}: {why}" for run, why in s["not_converged"])])
    return header, rows


# --- Published results ---------------------------------------------------------------------
# The fields that make a run the task's full-size one (with task_options.*): a run is
# compared with a published number only when they equal what `configs/<task>.py:model=<m>`
# (no other argument: LRA's setting) builds.
SIZE_FIELDS = ("max_length", "batch_size", "num_train_steps", "emb_dim", "num_heads",
               "num_layers", "qkv_dim", "mlp_dim")
PUBLISHED_NOTE = (
    "[published P, ours d]: P is the published test accuracy of the same model "
    "(lra/reporting/published_results.json; `python -m lra.report --published` lists them "
    "with their sources), d our mean over all seeds minus P, in points; [published FAIL]: the source "
    "reports a failure (chance accuracy). Shown only for a cell whose every run is of the "
    "task's full-size config: its " + ", ".join(SIZE_FIELDS) + " and task_options equal "
    "what configs/<task>.py:model=<model> (LRA's setting, no other argument) builds, or, "
    "for a number published with the paper's own recipe (S5, Mega), what "
    "configs/<task>.py:model=<model>,paper builds, with the recipe recorded; never "
    "for `mini` or `runlocal` runs, nor for self-pretrained rows against from-scratch "
    "numbers.")
PUBLISHED_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                              "published_results.json")
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@functools.lru_cache(maxsize=None)
def published(path: str = PUBLISHED_PATH) -> dict:
    """The published results file (see lra/reporting/published_results.json `about`)."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def published_entries(task: str, model: str, training: str = SCRATCH,
                      path: str = PUBLISHED_PATH) -> list[tuple[dict, dict]]:
    """(result, source) for each published number (or FAIL) of `model` on `task` with
    `training` (SCRATCH or SELF_PRETRAINED), in the file's order."""
    data = published(path)
    return [(e, data["sources"][e["source"]]) for e in data["results"]
            if e.get("model") == model and e.get("training", SCRATCH) == training
            and (e["accuracy"].get(task) is not None or task in e.get("failed", ()))]


@functools.lru_cache(maxsize=None)
def _full_size_config(task: str, model: str, config_arg: str = "") -> str | None:
    """configs/<task>.py:model=<model> (LRA's setting; `config_arg` appended, e.g. the
    paper's recipe), flattened, as JSON; None if it cannot be built (a task or model this
    checkout does not have, a recipe it lacks)."""
    if _REPO not in sys.path:  # task configs import `configs.common`
        sys.path.insert(0, _REPO)
    try:
        config = importlib.import_module(f"configs.{task}").get_config(
            f"model={model}" + (f",{config_arg}" if config_arg else ""))
        return json.dumps(flatten(json.loads(json.dumps(config.to_dict(), default=str))))
    except Exception:  # noqa: BLE001
        return None


def size_differences(r: dict, config_arg: str = "") -> list[str]:
    """How the run's recorded config differs from its task's full-size config in
    SIZE_FIELDS and task_options ([] for a full-size run), e.g. 'max_length 64 (full
    size: 2000)'. With `config_arg` ("paper": a number published with the paper's own
    recipe), the reference is configs/<task>.py:model=<model>,<config_arg>, and the run
    must record the same recipe."""
    config = r.get("config")
    if not isinstance(config, dict):
        return ["no config recorded"]
    model = config.get("model") or r["model"]
    reference = _full_size_config(r["task"], model, config_arg)
    if reference is None:
        return [f"configs/{r['task']}.py cannot be built for {model}"
                + (f",{config_arg}" if config_arg else "")]
    full, flat = json.loads(reference), flatten(config)
    fields = [*SIZE_FIELDS, *sorted(k for k in full if k.startswith("task_options."))]
    if config_arg:
        fields.append("recipe")
    what = f"{config_arg} recipe" if config_arg else "full size"
    return [f"{k} {show(flat.get(k, ABSENT))} ({what}: {show(full.get(k, ABSENT))})"
            for k in fields if flat.get(k, ABSENT) != full.get(k, ABSENT)]


def published_cells(summary, path: str = PUBLISHED_PATH
                    ) -> tuple[dict[tuple[str, str], tuple[dict, dict]], list[str]]:
    """((task, row label) -> (result, source) shown beside the cell), and the cells that
    have a published number but are not shown with it (runs not of the full-size config:
    see size_differences), one line per set of differences (the first three):
    'listops linear, listops transformer: max_length 64 (full size: 2000); ...'."""
    shown, withheld = {}, defaultdict(list)
    for (task, label), s in summary.items():
        entries = published_entries(task, s.get("model", label), s.get("kind", SCRATCH),
                                    path)
        if not entries:
            continue
        config_arg = entries[0][0].get("config_arg", "")
        differences = list(dict.fromkeys(d for r in s.get("runs", [])
                                         for d in size_differences(r, config_arg)))
        if differences or not s.get("runs"):
            withheld["; ".join(differences[:3]) or "no runs"].append(f"{task} {label}")
        else:
            shown[(task, label)] = entries[0]
    return shown, [f"{', '.join(cells)}: {why}" for why, cells in withheld.items()]


def published_lm(task: str, model: str, num_layers: int | None = None,
                 path: str = PUBLISHED_PATH) -> list[tuple[dict, dict]]:
    """(result, source) for each published bits-per-token number (`lm_results`) of `model`
    on enwik8 / text8, with `num_layers` layers when given."""
    data = published(path)
    return [(e, data["sources"][e["source"]]) for e in data.get("lm_results", [])
            if e["task"] == task and e.get("model") == model
            and (num_layers is None or e["num_layers"] == num_layers)]


def published_lm_markdown(path: str = PUBLISHED_PATH) -> str:
    """The published enwik8 / text8 numbers with their sources."""
    data = published(path)
    rows = [[e.get("model") or "-", e["name_in_source"], e["task"], str(e["num_layers"]),
             e["params"], f"{e['bits_per_token']:.2f}",
             f"{data['sources'][e['source']]['short']}, {data['sources'][e['source']]['table']}"]
            for e in data.get("lm_results", [])]
    used = dict.fromkeys(e["source"] for e in data.get("lm_results", []))
    lines = ["Published enwik8 (bits per byte) and text8 (bits per character), test split",
             "", markdown(["model (ours)", "in the source", "task", "layers", "params",
                           "bits", "source"], rows), ""]
    for key in used:
        source = data["sources"][key]
        lines.append(f"- {source['short']}: {source['citation']} arXiv {source['arxiv']}. "
                     f"{source['setting']}. Checked against {source['checked_against']}.")
    return "\n".join(lines)


def published_text(task: str, s: dict, entry: tuple[dict, dict]) -> str:
    result, _ = entry
    value = result["accuracy"].get(task)
    if value is None:
        return "[published FAIL]"
    return f"[published {value:.2f}, ours {100 * s['accuracy'] - value:+.2f}]"


def published_rows(path: str = PUBLISHED_PATH) -> tuple[list[str], list[list[str]]]:
    """The published results as a table: one row per result, its source, its average
    without Path-X (the source's own where it gives one, marked † where that is not the
    mean of the five columns) and the average of all six where the source has all six."""
    data = published(path)
    header = ["model (ours)", "in the source", "source", *TASK_ORDER, "avg (no Path-X)",
              "avg (all 6)"]
    rows = []
    for e in data["results"]:
        source = data["sources"][e["source"]]
        accs = e["accuracy"]
        cells = ["FAIL" if t in e.get("failed", ()) else
                 "-" if accs.get(t) is None else f"{accs[t]:.2f}" for t in TASK_ORDER]
        five = [accs.get(t) for t in TASK_ORDER if t != "pathx"]
        six = five + [accs.get("pathx")]
        mean = statistics.fmean(five) if None not in five else None
        stated = e.get("average_in_source")
        average = "-" if stated is None and mean is None else (
            f"{mean:.2f}" if stated is None else
            f"{stated:.2f}" + (" †" if mean is not None and abs(stated - mean) > 0.006
                               else ""))
        rows.append([e.get("model") or "-", e["name_in_source"],
                     f"{source['short']}, {source['table']}, arXiv {source['arxiv']}", *cells,
                     average,
                     f"{statistics.fmean(six):.2f}" if None not in six else "-"])
    return header, rows


def published_markdown(path: str = PUBLISHED_PATH) -> str:
    data = published(path)
    lines = ["Published LRA test accuracy (%) (" + os.path.relpath(path, _REPO) + ")", "",
             markdown(*published_rows(path)), ""]
    lra_sources = {e["source"] for e in data["results"]}
    for key, source in data["sources"].items():
        if key not in lra_sources:  # enwik8 / text8's: published_lm_markdown
            continue
        lines.append(f"- {source['short']}: {source['citation']} arXiv {source['arxiv']}, "
                     f"{source['table']}. {source['setting']}. Average: {source['average']}."
                     + (f" Checked against {source['checked_against']}."
                        if source.get("checked_against") else ""))
    if any(row[-2].endswith("†") for row in published_rows(path)[1]):
        lines.append("- †: the source's average is not the mean of its five columns.")
    lines += [f"- {e['name_in_source']} -> `{e['model']}`: {e['note']}"
              for e in data["results"] if e.get("note")]
    if data.get("left_out"):
        lines += ["", "Not entered:"]
        lines += [f"- {e['paper']} (arXiv {e['arxiv']}): {e['why']}" for e in data["left_out"]]
    return "\n".join(lines)

"""MAD's table from its runs (configs/mad.py), by MAD's rule: per difficulty setting the
best (learning rate, weight decay) by the seeds' mean of MAD's metric (macro accuracy), the
mean over the settings per task, the average over the six; the majority label's score; the
published rows beside. Written by `python -m lra.synthetic_report ... --out=X` as X_mad.md
(the sources: directories of runs and _runs.jsonl records, lra/runs/record.py)."""
from __future__ import annotations

import statistics
import sys
from typing import Callable

from lra.reporting import ranking
from lra.runs import results as results_lib


# The benchmark's six tasks, columns as Yang et al. tabulate them.
MAD_TASKS = (("compression", "Compress"), ("fuzzy_in_context_recall", "Fuzzy"),
             ("in_context_recall", "ICR"), ("memorization", "Memorize"),
             ("noisy_in_context_recall", "Noisy"), ("selective_copying", "SelCopy"))
# Published per-architecture MAD scores (%), columns as MAD_TASKS, then the average: the
# DeltaNet paper's MAD table (Yang, Wang, Zhang, Shen, Kim, NeurIPS 2024, arXiv 2406.06484;
# "Table 1. MAD (Poli et al, 2024)" on the authors' poster, sustcsonglin/
# sustcsonglin.github.io f88d87a assets/pdf/neurips24_poster_deltanet.pdf, and the same six
# rows in _posts/2024-12-03-deltanet-1.md), row names as it writes them. Its caption (as
# quoted by others; not read here) says the rows other than DeltaNet are borrowed from
# Poli et al. 2024 (arXiv 2403.17844), MAD's protocol: dim 128, 200 epochs, every
# difficulty setting, the best of lr {1e-4, 5e-4, 1e-3} x wd {0, 0.1}; Poli et al.'s own
# text was not readable here. Its "Mamba" is Mamba-1 (Gu and Dao 2023), not `mamba2`;
# "Hyena" and "Multihead Hyena" have no row of ours. Every average is its row's mean.
PUBLISHED_MAD = {
    "Transformer": (51.6, 29.8, 94.1, 85.2, 86.8, 99.6, 74.5),
    "Hyena": (45.2, 7.9, 81.7, 89.5, 78.8, 93.1, 66.0),
    "Multihead Hyena": (44.8, 14.4, 99.0, 89.4, 98.6, 93.0, 73.2),
    "Mamba (Mamba-1)": (52.7, 6.7, 90.4, 89.5, 90.1, 86.3, 69.3),
    "GLA": (38.8, 6.9, 80.8, 63.3, 81.6, 88.6, 60.0),
    "DeltaNet": (42.2, 35.7, 100.0, 52.8, 100.0, 100.0, 71.8),
}
PUBLISHED_MAD_SOURCE = (
    "the DeltaNet paper's MAD table (Yang et al. 2024, arXiv 2406.06484: its rows other "
    "than DeltaNet borrowed from Poli et al. 2024, arXiv 2403.17844), names as it writes "
    "them; MAD's protocol (dim 128, 200 epochs, every difficulty setting, the best of 6 "
    "(lr, wd)); its Mamba is Mamba-1, not our mamba2")


def mad_scores(results: list[dict], row_of: Callable[[dict], tuple[str, list[str]]] | None
               = None) -> dict[str, dict[str, dict]]:
    """row -> MAD task -> {score, std, settings, seeds, accs, min, max, mean}: MAD's rule,
    per difficulty setting (the data's options and length) the best (learning rate, weight
    decay) by the seeds' mean of MAD's metric (macro accuracy, test_macro_accuracy; else
    per-position accuracy), then the mean over settings; std is the chosen runs' seed std
    averaged over settings (0 with one seed); accs the per-seed scores (a seed's mean over
    the settings, for the seeds that ran every one), whose range decides ties; params the
    model's parameter counts over its runs (they differ between tasks: vocabularies);
    unranked the scaffold card's fields in which the row's runs differ from their table's
    without a declared ablation. row_of(run) -> (row name, those fields): by default the
    model alone (lra.synthetic_report names a row by its scaffold card, so that runs of one
    model under two initialisations, say, are two rows, never one cell)."""
    cells: dict = {}
    params: dict = {}
    unranked: dict = {}
    for r in results:
        task = r.get("task", "")
        c = r.get("config")
        if not task.startswith("mad_") or not c:
            continue
        setting = _mad_setting(c)
        tuning = (c.get("learning_rate"), c.get("weight_decay"))
        metric = r.get("test_macro_accuracy")
        acc = 100 * float(metric if metric is not None else r["test_accuracy"])
        name, undeclared = row_of(r) if row_of else (r["model"], [])
        row = name + mad_protocol_note(c)
        unranked.setdefault(row, set()).update(undeclared)
        (cells.setdefault(row, {}).setdefault(task[4:], {}).setdefault(setting, {})
         .setdefault(tuning, {}))[c.get(results_lib.SEED_FIELD)] = acc
        counts = params.setdefault(row, set())
        if r.get("num_params"):  # a run without its count adds nothing, not a 0
            counts.add(int(r["num_params"]))
    out: dict[str, dict[str, dict]] = {}
    for model, tasks in cells.items():
        for task, settings in tasks.items():
            best = []
            for tunings in settings.values():
                best.append(max(tunings.values(),
                                key=lambda seeds: statistics.fmean(seeds.values())))
            common = set.intersection(*(set(runs) for runs in best))
            accs = [statistics.fmean(runs[s] for runs in best) for s in sorted(common, key=repr)]
            out.setdefault(model, {})[task] = {
                "model": model,
                "score": statistics.fmean(statistics.fmean(runs.values()) for runs in best),
                "std": statistics.fmean(statistics.stdev(runs.values()) if len(runs) > 1
                                        else 0.0 for runs in best),
                "settings": len(best), "seeds": min(len(runs) for runs in best),
                "accs": accs, "mean": statistics.fmean(accs) if accs else 0.0,
                "min": min(accs, default=0.0), "max": max(accs, default=0.0),
                "params": sorted(params[model]), "unranked": sorted(unranked[model])}
    return out


# MAD's own evaluation (configs/mad.py): mad-lab's batch-weighted mean of per-batch macro
# accuracies, on the last epoch's weights. A run evaluated otherwise is a row of its own.
MAD_PROTOCOL = ("batch_mean", "last")


def mad_protocol_note(config: dict) -> str:
    """'' for a run evaluated as MAD evaluates; else ' [pooled macro, best checkpoint]'
    (the rule it was measured by: the runs before 2026-12-03)."""
    rule = (config.get("macro_accuracy", "pooled"), config.get("test_weights", "best"))
    if rule == MAD_PROTOCOL:
        return ""
    macro = "pooled macro" if rule[0] == "pooled" else "batch-mean macro"
    weights = "best checkpoint" if rule[1] == "best" else "last weights"
    return f" [{macro}, {weights}]"


def _mad_setting(config: dict) -> tuple:
    """A MAD run's difficulty setting: its length and its data options."""
    options = dict(config.get("task_options") or {})
    if config.get("data_seed_from_run"):  # the data's seed is the run's: not a setting
        options.pop("seed", None)
    return int(config["max_length"]), tuple(sorted((k, repr(v)) for k, v in options.items()))


def mad_baselines(results: list[dict]) -> dict[str, float]:
    """MAD task -> the most frequent label's score under MAD's metric (%), averaged over
    the task's settings that ran (mad.majority_macro_accuracy: regenerates each setting's
    data, seconds to a minute a setting)."""
    from lra.tasks import mad

    settings: dict[str, dict] = {}
    for r in results:
        task, c = r.get("task", ""), r.get("config")
        if task.startswith("mad_") and c:
            settings.setdefault(task[4:], {})[_mad_setting(c)] = (
                int(c["max_length"]), dict(c.get("task_options") or {}))
    out = {}
    for task, found in settings.items():
        print(f"MAD {task}: the majority label's score on {len(found)} setting(s)...",
              file=sys.stderr, flush=True)
        out[task] = statistics.fmean(
            100 * mad.majority_macro_accuracy(task, length, **options)
            for length, options in found.values())
    return out


def mad_markdown(scores: dict[str, dict[str, dict]], source: str,
                 baselines: dict[str, float] | None = None) -> str:
    head = "| model | " + " | ".join(name for _, name in MAD_TASKS) + " | Avg | params |"
    lines = [f"# MAD: score per task (%), from `{source}`", "",
             "MAD's rule: per difficulty setting the best (lr, weight decay) by the seeds' "
             "mean of MAD's metric (macro accuracy), then the mean over the settings; `± s` "
             "the chosen runs' seed std averaged over settings; `(k/n)` k settings, n seeds "
             f"(where the seeds' scores span more than {ranking.SPLIT_POINTS:g} points, "
             "each seed's, in seed order). "
             "`=` tied with the column's best (its seed range reaches the best model's worst "
             "seed), `<` below it, among the models with two seeds or more (a seed's score: "
             "its mean over the settings); a model with one seed is not ranked. "
             "Avg only where all six tasks ran. `majority label`: always the most frequent "
             "test label, under MAD's metric (1 / the number of label classes). Published "
             f"rows: {PUBLISHED_MAD_SOURCE}. A row `[pooled macro, best checkpoint]` was "
             "measured by our old rule, not MAD's (last weights, batch-mean macro).",
             "params: the model's counts over its runs (the tasks' vocabularies differ).",
             "", head, "|---|" + "---|" * (len(MAD_TASKS) + 2)]
    # ranking.ties leaves a cell with an undeclared scaffold difference unranked ('')
    marks = {task: ranking.ties([scores[m][task] for m in scores if task in scores[m]])
             for task, _ in MAD_TASKS}
    unranked = {}
    for model in ranking.ordered(set(scores)):
        row = []
        for task, _ in MAD_TASKS:
            cell = scores[model].get(task)
            if cell is not None and cell.get("unranked"):
                unranked.setdefault(model, set()).update(cell["unranked"])
            row.append("-" if cell is None else (
                f"{cell['score']:.1f}" + (f" ± {cell['std']:.1f}" if cell["seeds"] > 1
                                          else "")
                + f" ({cell['settings']}/{cell['seeds']}"
                + f"{ranking.split_values(cell['accs'])}) {marks[task][model]}").rstrip())
        done = [scores[model][t]["score"] for t, _ in MAD_TASKS if t in scores[model]]
        avg = f"{statistics.fmean(done):.1f}" if len(done) == len(MAD_TASKS) else "-"
        counts = sorted({n for cell in scores[model].values() for n in cell["params"]})
        span = ("?" if not counts else f"{counts[0]:,}"
                + (f"-{counts[-1]:,}" if len(counts) > 1 else ""))
        lines.append(f"| {model} | " + " | ".join(row) + f" | {avg} | {span} |")
    if baselines:
        lines.append("| majority label | " + " | ".join(
            f"{baselines[t]:.1f}" if t in baselines else "-" for t, _ in MAD_TASKS)
            + " | | |")
    for name, values in PUBLISHED_MAD.items():
        lines.append(f"| {name} (published) | " + " | ".join(
            "-" if v is None else f"{v:.1f}" for v in values) + " | |")
    if unranked:
        lines += ["", "Not ranked (their scaffold differs from the table's in a field no "
                  "sweep declared an ablation axis, `config.scaffold.ablate`): "
                  + "; ".join(f"{m} ({', '.join(sorted(fs))})" for m, fs in unranked.items())
                  + "."]
    return "\n".join(lines) + "\n"

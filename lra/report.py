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
                            the whole input), `⚠ degenerate` a cell whose runs no longer
                            compute the method (a bottleneck of one: every position gets
                            the same output, or q/k get no gradient), each with a
                            footnote; a run the check cannot build gets no mark and a
                            warning line. Classifiers
                            only: a run fine-tuned from a self-pretraining
                            run (config.init_from) is the row `<model> (self-pretrained)`.
                            `avg` is LRA's: the mean over the tasks but Path-X (every
                            model failed Path-X in LRA's Table 1); with a Path-X column
                            `avg incl. Path-X` follows (later papers average all six).
                            Not converged: a run whose test accuracy is below its
                            majority baseline plus CONVERGENCE_MARGIN, or whose
                            logged training loss never went below
                            CHANCE_LOSS_FRACTION of ln(classes); a cell of several
                            seeds with such runs shows `(k/n converged: <mean of the
                            converged>)`, and a table lists every cell with one.
                            Published: a cell whose every run is of the task's
                            full-size config (SIZE_FIELDS and task_options as
                            configs/<task>.py:model=<m> builds them: never mini or
                            runlocal) and whose model has a number in
                            lra/reporting/published_results.json shows `[published P, ours
                            ±d]` (d: our mean minus P).
                            The locality baseline's runs (config.locality_baseline:
                            lra.sweep --locality_baseline) are the row `locality
                            baseline`, after every model, whatever their mixer
                            (`local`, `local_2d`), with a footnote saying what a
                            position saw on each task; never compared with a
                            published number;
  results.md (per task) /   per model: from-scratch and self-pretrained test accuracy, their
  comparison.csv            difference, the pretraining run (objective, steps of the total),
                            the classifier's parameter count and its ratio to
                            `transformer`'s on the same task and config, marked `!` outside
                            ±10% (LRA's unpublished rule for its variants), with a footnote;
  results.md (pretraining)  pretraining runs (objective mlm / causal_lm): best validation
                            loss, test loss and token accuracy, bits per token; never
                            averaged with classifiers;
  efficiency_accuracy.png   LRA's Figure 3: mean accuracy against training speed (steps/s
                            relative to `transformer` on the same task), marker area from
                            compiled training-step memory relative to `transformer`.

`python -m lra.report --published` prints the published numbers with their sources
(lra/reporting/published_results.json; no directory needed).

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
import math
import os
import statistics
import sys
from collections import defaultdict

from absl import app, flags

# `collect` is re-exported: notebooks/compare_variants.ipynb and researchers' own
# notebooks read runs as `report.collect(dir)`, as before lra/runs/results.py held it.
from lra.runs.results import (IMPLIED_WHEN_ABSENT, NON_RESULT_FIELDS, PRETRAINING,  # noqa: F401
                         SCRATCH, SEED_FIELD, SELF_PRETRAINED, annotate, collect, flatten, is_number, kind,
                         load, nothing_found, objective, pretraining_steps,
                         pretraining_warnings)
# The protocol's pieces (published numbers, convergence counting, the locality baseline,
# LRA's task order) live in lra/reporting/protocol.py; re-exported under the names tests,
# notebooks and scripts have used (`report.not_converged_reason`, `report.TASK_ORDER`, ...).
from lra.reporting.protocol import (  # noqa: F401
    ABSENT, CHANCE_LOSS_FRACTION, CONVERGENCE_MARGIN, CONVERGENCE_NOTE, LOCALITY_LABEL,
    LOCALITY_NOTE, PUBLISHED_NOTE, PUBLISHED_PATH, SIZE_FIELDS, TASK_ORDER,
    convergence_rows, convergence_text, locality_note, markdown, model_order,
    not_converged_reason, published, published_cells, published_entries,
    published_markdown, published_rows, published_text, row_model, run_name, seed_of, show,
    size_differences, tasks_and_models)

DENSE_MARK = "≡ dense"
DEGENERATE_MARK = "⚠ degenerate"
DEGENERATE_NOTE = (f"{DEGENERATE_MARK}: with the sizes the run used, at its length, the "
                   "variant no longer computes its method: every position gets the same "
                   "output, or a query/key projection gets no gradient (a softmax over one "
                   "summary or key, e.g. Linformer with k=1; lra/dense_check.py "
                   "`degenerate`). `python -m lra.dense_check <dir>` says why per run.")
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
    flags.DEFINE_bool("published", False, "Print the published LRA results with their "
                      "sources (lra/reporting/published_results.json); then the report of the "
                      "directory, if one is given.")


PARAMS_MARK = "!"
PARAMS_TOLERANCE_PERCENT = 10  # LRA kept its variants within 10% of the baseline's
PARAMS_NOTE = (f"{PARAMS_MARK}: the variant's parameter count is outside "
               f"±{PARAMS_TOLERANCE_PERCENT}% of `transformer`'s on the same task and config (LRA "
               "kept its variants within 10% of the baseline's parameters, without "
               "publishing the counts); its accuracy is not a like-for-like comparison.")
AVG_NOTE = ("avg: the mean over the row's tasks but Path-X, as LRA's Table 1 (Tay et al. "
            "2021) averages (every model there failed Path-X); `*`: the row lacks some of "
            "the averaged tasks. Later papers (S4 and after) average all six tasks.")
PRETRAINED_NOTE = ("self-pretrained: a classifier fine-tuned (config.init_from) from a "
                   "self-pretraining run on the task's own training inputs (lra.sweep "
                   "--pretrain). Its runs are grouped by being self-pretrained, not by the "
                   "path of init_from, and their num_train_steps counts the pretraining and "
                   "the fine-tuning steps, so that a row compares with the from-scratch run "
                   "of as many steps. Δ: self-pretrained minus from scratch, in points.")



def _grouping_config(r: dict) -> dict | None:
    """The run's config without the seed and NON_RESULT_FIELDS (flattened), or None. A
    self-pretrained run's init_from (a path per run) is left out: whether a run was
    self-pretrained keeps rows apart instead (labels); its num_train_steps counts its
    pretraining run's steps too (see annotate)."""
    config = r.get("config")
    if not isinstance(config, dict):
        return None
    flat = {**IMPLIED_WHEN_ABSENT,
            **{k: v for k, v in flatten(config).items()
               if k != SEED_FIELD and k not in NON_RESULT_FIELDS and k != "init_from"}}
    steps = pretraining_steps(r) if kind(r) == SELF_PRETRAINED else None
    if steps is not None and is_number(flat.get("num_train_steps")):
        flat["num_train_steps"] += steps
    return flat


# The config fields a variant brings with it (presets, its block, the pooling some stacks
# need): not part of "the same task and config" when counts are compared with transformer's.
_VARIANT_FIELDS = ("model", "pooling")
_VARIANT_PREFIXES = ("model_hparams.", "block.")


def _param_key(r: dict) -> tuple[str, object]:
    """(the run's config without the variant's own fields, as JSON; its pooling)."""
    config = _grouping_config(r)
    if config is None:
        return "null", None
    shared = {k: v for k, v in config.items()
              if k not in _VARIANT_FIELDS and not k.startswith(_VARIANT_PREFIXES)}
    return json.dumps(shared, sort_keys=True, default=str), config.get("pooling")




def _differing(configs: list[dict | None]) -> list[str]:
    """The fields whose values differ among `configs` (None: no config recorded)."""
    recorded = [cfg for cfg in configs if cfg is not None]
    fields = sorted({k for cfg in recorded for k in cfg})
    return [k for k in fields
            if len({json.dumps(cfg.get(k, ABSENT), default=str) for cfg in recorded}) > 1]


def _stdev(values: list[float]) -> float:
    """The sample standard deviation; nan when a value is not finite (a diverged run's
    nan accuracy: the row shows nan, as its mean, rather than the report failing)."""
    if not all(math.isfinite(v) for v in values):
        return float("nan")
    return statistics.stdev(values)


def _row_labels(results: list[dict]) -> list[tuple[str, str]]:
    """(base, suffix) per run; the row label is base + suffix (see labels). The base is
    shared by a model's from-scratch and self-pretrained rows of one config."""
    annotate(results)
    # The sweep's rule (lra.sweep.config_differences): a field only some runs of a model
    # recorded (added to the code since the older ones ran, and not in
    # IMPLIED_WHEN_ABSENT) is not compared, so those runs share a row and their seeds.
    def group_of(r):
        return (r["task"], row_model(r), kind(r) == PRETRAINING)

    recorded = defaultdict(list)
    for r in results:
        cfg = _grouping_config(r)
        if cfg is not None:
            recorded[group_of(r)].append(set(cfg))
    common = {g: set.intersection(*keys) for g, keys in recorded.items()}

    def compared(r):
        cfg = _grouping_config(r)
        return None if cfg is None else {k: v for k, v in cfg.items()
                                         if k in common[group_of(r)]}

    canon = [json.dumps(compared(r), sort_keys=True, default=str) for r in results]
    by_model = defaultdict(dict)  # (task, model, pretraining?) -> {canonical: config}
    for r, c in zip(results, canon):
        by_model[group_of(r)].setdefault(c, compared(r))
    describe = {}
    for key, configs in by_model.items():
        if len(configs) == 1:
            describe.update({(key, c): "" for c in configs})
            continue
        differing = _differing(list(configs.values()))
        for c, cfg in configs.items():
            if cfg is None:
                text = "no config recorded"
            elif differing:
                text = ", ".join(f"{k}={show(cfg.get(k, ABSENT))}" for k in differing)
            else:
                text = "config recorded"
            describe[(key, c)] = text
    bases = []
    for r, c in zip(results, canon):
        text = describe[((r["task"], row_model(r), kind(r) == PRETRAINING), c)]
        bases.append(f"{row_model(r)} [{text}]" if text else row_model(r))
    # Self-pretrained runs of one row whose pretraining runs differ (e.g. in steps): one row
    # per pretraining config, named by the fields that differ.
    sources = defaultdict(dict)  # (task, base) -> {canonical pretraining config: config}
    for r, base in zip(results, bases):
        if kind(r) == SELF_PRETRAINED:
            source = r.get("_source")
            cfg = _grouping_config(source) if source else None
            sources[(r["task"], base)].setdefault(
                json.dumps(cfg, sort_keys=True, default=str) if source else "missing", cfg)
    out = []
    for r, base in zip(results, bases):
        if kind(r) == PRETRAINING:
            out.append((base, f" ({objective(r)})"))
            continue
        if kind(r) == SCRATCH:
            out.append((base, ""))
            continue
        variants = sources[(r["task"], base)]
        source = r.get("_source")
        if len(variants) == 1:
            out.append((base, f" ({SELF_PRETRAINED})"))
        elif not source:
            out.append((base, f" ({SELF_PRETRAINED}; pretraining run not found)"))
        else:
            cfg = _grouping_config(source)
            fields = _differing(list(variants.values())) if cfg is not None else []
            text = (", ".join(f"{k}={show(cfg.get(k, ABSENT))}" for k in fields)
                    or "another pretraining run")
            out.append((base, f" ({SELF_PRETRAINED}; pretraining {text})"))
    return out


def labels(results: list[dict]) -> list[str]:
    """One row label per run: its model (`locality baseline` for the runs of the task
    configs' `locality` argument, whatever their mixer: row_model), or when runs of that
    model and task were made
    with configs that differ beyond the seed and NON_RESULT_FIELDS, the model followed by
    the differing fields, e.g. `transformer [learning_rate=0.01]`; then
    ` (self-pretrained)` for classifiers fine-tuned from a pretraining run (init_from; see
    _grouping_config), ` (mlm)` / ` (causal_lm)` for pretraining runs. Pretraining runs and
    classifiers never share a label."""
    return [base + suffix for base, suffix in _row_labels(results)]



def _mean(rs: list[dict], key: str) -> float | None:
    values = [r[key] for r in rs if r.get(key) is not None]
    return statistics.fmean(values) if values else None


def classifiers(results: list[dict]) -> list[dict]:
    """The classification runs (from scratch and self-pretrained): no pretraining runs."""
    return [r for r in results if kind(r) != PRETRAINING]


def summarize(results: list[dict]) -> dict[tuple[str, str], dict]:
    """(task, row label) -> mean/std test accuracy, seeds, speed, memory, baseline, the
    model (row_model: `locality baseline` for its runs), its kind (SCRATCH or
    SELF_PRETRAINED), the base label it shares with the other
    kind, its distinct parameter counts, the seeds that converged (`converged`, their mean
    `accuracy_converged`, and (run, why) for the others: not_converged_reason), and the
    runs themselves (`runs`). Classification runs only (pretraining runs:
    summarize_pretraining). Runs are averaged only when their configs agree but for the
    seed and NON_RESULT_FIELDS (see labels); the label is then the model name (followed by
    ` (self-pretrained)` for fine-tuned runs)."""
    annotate(results)  # while the pretraining runs are still among them
    results = classifiers(results)
    groups = defaultdict(list)
    for r, (base, suffix) in zip(results, _row_labels(results)):
        groups[(r["task"], base + suffix)].append((r, base))

    def entry(pairs):
        pairs = _one_run_per_seed(pairs, run_of=lambda pair: pair[0])
        rs = [r for r, _ in pairs]
        reasons = [not_converged_reason(r) for r in rs]
        converged = [r for r, why in zip(rs, reasons) if why is None]
        return {
            "model": row_model(rs[0]),
            "kind": kind(rs[0]),
            "base": pairs[0][1],
            "accuracy": _mean(rs, "test_accuracy"),
            "std": _stdev([r["test_accuracy"] for r in rs]) if len(rs) > 1 else None,
            "seeds": len(rs),
            "steps_per_sec": _mean(rs, "train_steps_per_sec"),
            "memory_bytes": _mean(rs, "train_step_temp_bytes"),
            "baseline": _mean(rs, "majority_baseline_accuracy"),
            "num_params": sorted({r["num_params"] for r in rs
                                  if r.get("num_params") is not None}),
            "param_key": _param_key(rs[0]),
            "pretraining": _pretraining_text(rs[0]) if kind(rs[0]) == SELF_PRETRAINED else "",
            "converged": len(converged),
            "accuracy_converged": _mean(converged, "test_accuracy"),
            "not_converged": [(run_name(r), why) for r, why in zip(rs, reasons) if why],
            "runs": rs,
        }

    return {key: entry(pairs) for key, pairs in groups.items()}




def _one_run_per_seed(items: list, run_of=lambda item: item) -> list:
    """`items` (runs, or anything `run_of` maps to one) with one run per recorded seed: the
    first (in path order); runs without a recorded seed all count. A copied run folder is
    not another seed (repeated_seeds says which run was kept)."""
    seen, kept = set(), []
    for item in items:
        seed = seed_of(run_of(item))
        if seed is not None and seed in seen:
            continue
        seen.add(seed)
        kept.append(item)
    return kept


def _pretraining_text(r: dict) -> str:
    """'mlm, 10 of 20 steps': the objective and steps of a self-pretrained run's
    pretraining run, of the total."""
    source = r.get("_source")
    if not source:
        return "not found"
    steps = pretraining_steps(r)
    own = r.get("steps", (r.get("config") or {}).get("num_train_steps"))
    of = f" of {steps + own}" if is_number(steps) and is_number(own) else ""
    return f"{objective(source)}, {steps}{of} steps"


def summarize_pretraining(results: list[dict]) -> dict[tuple[str, str], dict]:
    """(task, row label) -> the pretraining runs' objective, steps, validation loss (the
    best), test loss, test token accuracy, bits per token (causal_lm), the majority
    token's share of the test tokens, and seeds; means over seeds."""
    runs = [r for r in results if kind(r) == PRETRAINING]
    groups = defaultdict(list)
    for r, label in zip(runs, labels(runs)):
        groups[(r["task"], label)].append(r)
    groups = {key: _one_run_per_seed(rs) for key, rs in groups.items()}
    return {key: {
        "model": row_model(rs[0]),
        "objective": objective(rs[0]),
        "steps": sorted({r.get("steps", (r.get("config") or {}).get("num_train_steps"))
                         for r in rs} - {None}),
        "best_eval_loss": _mean(rs, "best_eval_loss"),
        "test_loss": _mean(rs, "test_loss"),
        "accuracy": _mean(rs, "test_accuracy"),
        "bits_per_token": _mean(rs, "test_bits_per_token"),
        "baseline": _mean(rs, "majority_baseline_accuracy"),
        "seeds": len(rs),
    } for key, rs in groups.items()}


def repeated_seeds(results: list[dict]) -> list[str]:
    """Warning lines for rows with several runs of the same recorded seed (e.g. a copied
    run folder): not independent seeds, so the row counts the seed once, with the first
    run in path order (summarize); the line names the one kept and the others."""
    by_row = defaultdict(lambda: defaultdict(list))
    for r, label in zip(results, labels(results)):
        seed = seed_of(r)
        if seed is not None:
            by_row[(r["task"], label)][seed].append(r["_path"] if "_path" in r else "?")
    return [f"{task} {label}: {len(paths)} runs with {SEED_FIELD}={seed}: counted as one "
            f"seed, {paths[0]} kept ({', '.join(paths[1:])} left out)"
            for (task, label), seeds in by_row.items() for seed, paths in seeds.items()
            if len(paths) > 1]


def run_marks(results: list[dict]) -> tuple[dict[tuple[str, str], list[str]], list[str]]:
    """(task, row label) -> the marks of its runs (see labels), from each run's resolved
    `config`: DENSE_MARK when a run's variant reduces to dense attention at its length,
    DEGENERATE_MARK when its sizes no longer compute the method (a bottleneck of one, a
    window of nothing: lra/dense_check.py `degenerate`); and warning lines for the runs
    that could not be checked. Runs without a config are not checked; `transformer` and
    the variants that are its mixer by construction (`universal`) are never marked
    dense."""
    marks, warnings, checked = defaultdict(list), [], set()
    annotate(results)
    results = classifiers(results)
    for r, label in zip(results, labels(results)):
        config = r.get("config")
        if not config or not config.get("model"):
            continue
        key = (r["task"], label)
        if key in checked:
            continue
        checked.add(key)
        try:
            from lra import dense_check  # imports jax: only when a run has a config

            if (not dense_check.always_dense(config["model"])
                    and dense_check.run_reduces_to_dense(config)):
                marks[key].append(DENSE_MARK)
            if dense_check.run_degenerate(config):
                marks[key].append(DEGENERATE_MARK)
        except Exception as e:  # noqa: BLE001  (an unknown model, a bad value, ...)
            warning = (f"{key[0]} {key[1]}: could not check whether it reduces to dense "
                       f"attention or degenerates ({type(e).__name__}: {e})")
            if warning not in warnings:
                warnings.append(warning)
    return dict(marks), warnings


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


def report(root: str, out: str | None = None, efficiency_csv: str | None = None,
           efficiency_length: int = 0, skipped: list[str] | None = None,
           published_path: str = PUBLISHED_PATH) -> dict[str, str]:
    """Writes results.md, results.csv, comparison.csv and efficiency_accuracy.png;
    returns their paths. `published_path`: the published results file (see
    published_cells).
    The results.json files that were skipped (see load) are warning lines in results.md
    and, when `skipped` is a list, appended to it."""
    out = out or root
    results, skipped_here = load(root)
    if skipped is not None:
        skipped.extend(skipped_here)
    if not results:
        raise FileNotFoundError(nothing_found(root, skipped_here))
    os.makedirs(out, exist_ok=True)
    summary = summarize(results)
    marks, warnings = run_marks(results)
    shown, withheld = published_cells(summary, published_path)
    header, rows = table_rows(summary, marks, shown)
    convergence = convergence_rows(summary)
    tasks, _ = tasks_and_models(summary)
    comparisons = {t: comparison_rows(summary, t) for t in tasks}
    pretraining = summarize_pretraining(results)
    labelled = any(s["base"] != s["model"] for s in summary.values())
    used = {mark for cell in marks.values() for mark in cell}
    notes = [note for mark, note in ((DENSE_MARK, DENSE_NOTE),
                                     (DEGENERATE_MARK, DEGENERATE_NOTE)) if mark in used]
    if summary:
        notes.append(AVG_NOTE + (" This table has a Path-X column: `avg incl. Path-X` "
                                 "averages all its tasks." if "pathx" in tasks else ""))
    if convergence[1]:
        notes.append(CONVERGENCE_NOTE)
    if shown:
        used_sources = {source["short"]: source for _, source in shown.values()}
        notes.append(PUBLISHED_NOTE + " Sources: " + "; ".join(
            f"{short}: arXiv {src['arxiv']}, {src['table']}" for short, src in
            used_sources.items()) + ".")
    if withheld:
        notes.append("Published numbers not shown (the runs are not of the task's full-size "
                     "config; see the note on published numbers): " + "; ".join(withheld)
                     + ".")
    locality = locality_note(summary)
    if locality:
        notes.append(locality)
    if any(marked for _, _, marked in comparisons.values()):
        notes.append(PARAMS_NOTE)
    if any(s["kind"] == SELF_PRETRAINED for s in summary.values()):
        notes.append(PRETRAINED_NOTE)
    if labelled:
        notes.append("model [field=value, ...]: runs of one model on one task whose recorded "
                     "configs differ in these fields are separate rows; runs are averaged "
                     f"only when their configs differ at most in {SEED_FIELD} and "
                     f"{', '.join(NON_RESULT_FIELDS)}.")
    notes += [f"warning: {w}" for w in warnings + repeated_seeds(results)
              + pretraining_warnings(results)]
    if skipped_here:
        notes.append(f"warning: {len(skipped_here)} results.json skipped (not in the table, "
                     f"{len(results)} used):")
        notes += [f"warning: {line}" for line in skipped_here]
    paths = {"markdown": os.path.join(out, "results.md"),
             "csv": os.path.join(out, "results.csv"),
             "comparison_csv": os.path.join(out, "comparison.csv"),
             "plot": os.path.join(out, "efficiency_accuracy.png")}
    with open(paths["markdown"], "w", encoding="utf-8") as f:
        if summary:
            f.write(markdown(header, rows) + "\n")
        else:
            f.write("No classification runs (only pretraining runs, below).\n")
        if convergence[1]:
            f.write("\n### Convergence: cells with a run that did not converge\n\n"
                    + markdown(*convergence) + "\n")
        for t, (c_header, c_rows, _) in comparisons.items():
            f.write(f"\n### {t}: test accuracy (%) and parameters\n\n"
                    + markdown(c_header, c_rows) + "\n")
        if pretraining:
            f.write("\n### Pretraining runs (masked-token or next-token prediction on the "
                    "task's own training inputs; not classification accuracy)\n\n"
                    + markdown(*pretraining_rows(pretraining)) + "\n")
        f.write("".join(f"\n{note}\n" for note in notes))
    with open(paths["csv"], "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    with open(paths["comparison_csv"], "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        for i, (t, (c_header, c_rows, _)) in enumerate(comparisons.items()):
            if i == 0:
                writer.writerow(["task", *c_header])
            writer.writerows([t, *row] for row in c_rows)
    efficiency = (efficiency_ratios(efficiency_csv, efficiency_length)
                  if efficiency_csv else None)
    plot(summary, paths["plot"], efficiency)
    return paths


def main(argv):
    if FLAGS.published:
        print(published_markdown())
        if len(argv) == 1:
            return
        print()
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
    print(f"Wrote {paths['markdown']}, {paths['csv']}, {paths['comparison_csv']}, "
          f"{paths['plot']}"
          + (f"; {len(skipped)} results.json skipped (warnings above)" if skipped else ""))


if __name__ == "__main__":
    _define_flags()
    app.run(main)

"""The runs of a report grouped into its rows (lra.report writes the tables): a row per
task and model, or per model and config when a model's runs differ in more than the seed
and the fields that do not change results (labels); the mean and spread over seeds, the
converged seeds, speed, memory and parameter counts of each row (summarize); the
pretraining runs' rows (summarize_pretraining); one run per recorded seed, with a warning
line for the repeats (repeated_seeds)."""
from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict

from lra.reporting.protocol import (ABSENT, not_converged_reason, row_model, run_name, seed_of,
                                    show)
from lra.runs.results import (IMPLIED_WHEN_ABSENT, NON_RESULT_FIELDS, PRETRAINING, SCRATCH,
                              SEED_FIELD, SELF_PRETRAINED, annotate, builder_default, flatten,
                              is_number, kind, objective, pretraining_steps)


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
    # The sweep's rule (lra.runs.plan.config_differences): a field only some runs of a
    # model recorded (added to the code since the older ones ran, and not in
    # IMPLIED_WHEN_ABSENT) is not compared, so those runs share a row and their seeds.
    def group_of(r):
        return (r["task"], row_model(r), kind(r) == PRETRAINING)

    recorded = defaultdict(list)
    for r in results:
        cfg = _grouping_config(r)
        if cfg is not None:
            recorded[group_of(r)].append(set(cfg))
    common = {g: set.intersection(*keys) for g, keys in recorded.items()}
    # Except a model_hparams key only some runs have (an --override its preset lacks):
    # the others ran at the builder's default, compared as such (results.builder_default).
    one_sided = {g: {k for k in set.union(*keys) - common[g] if k.startswith("model_hparams.")}
                 for g, keys in recorded.items()}

    def compared(r):
        cfg = _grouping_config(r)
        if cfg is None:
            return None
        out = {k: v for k, v in cfg.items() if k in common[group_of(r)]}
        for k in one_sided[group_of(r)]:
            default = builder_default(cfg.get("model") or r["model"], k.partition(".")[2])
            out[k] = cfg[k] if k in cfg else (default[0] if default else ABSENT)
        return out

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

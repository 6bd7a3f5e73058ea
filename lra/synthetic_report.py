r"""Zoology's MQAR figure and table, and MAD's table, from a directory of runs, with the
seeds' spread and ties.

  python -m lra.synthetic_report workdirs/mqar_grid --out=results/cpu/mqar_grid
      # writes results/cpu/mqar_grid.md, .csv, .png and _runs.jsonl
  python -m lra.synthetic_report results/cpu/mqar_grid_runs.jsonl workdirs/mqar_grid \
      --out=results/cpu/mqar_grid   # the committed runs and today's together

Sources: directories and `_runs.jsonl` files (below), one or more. Reads every MQAR run below
a directory (`lra.runs.results.load`: any depth, e.g. the sweep
folders of scripts/mqar_cpu_grid.sh) and groups them into cells: runs whose recorded
configs agree in every field but the seed (and lra.runs.results.NON_RESULT_FIELDS) are one
cell's seeds. A cell is (L, kv pairs, width, model) within a setting (everything else the
configs record: vocabulary, steps, short_conv, ...); a directory with several settings gets
a section per setting. The learning rate and weight decay are tuned per cell (TUNED): runs
of a cell at several values (`lra.sweep --grid=learning_rate=...`) are its grid, and the
values with the best validation accuracy (the seeds' mean of best_eval_accuracy; among
the values run at the most seeds) are the cell's, as Zoology picks the best lr per width.
A model_hparams override a sweep gave a run (`--override` or
`--grid=model_hparams.<name>=...`, from the run's sweep.json, kept in the runs record)
makes another model of the variant: its own row, named by it (`fox [forget_gate False]`),
as a capacity set away from the presets is (`local [window 32]`).
Written:

  <out>.md   per setting and (L, kv): test accuracy at the queried positions (%), mean ±
             standard deviation over seeds (n), per width; per model its parameter count
             and its decoding state (bytes of one sequence's cache, `lra.cache_memory`:
             the recurrent state, or the kv cache at L); the rows `majority label` (the
             most frequent training label's share of the test labels, from the runs) and
             `chance` (one of the V/2 values). Ties: per column, the models whose seed range
             (min to max) reaches the best model's worst seed are tied with it (`=`); a model
             is ranked below the best only when its best seed is under the best model's worst
             (`<`), among the models with two seeds or more; a model with one seed is
             not ranked.
  <out>.csv  one line per cell: setting, L, kv, width, model, seeds, mean, std, min, max,
             params, state_bytes, learning_rate, weight_decay (the chosen), tunings.
  <out>.png  Zoology's figure 2: a panel per (L, kv), accuracy against width, a line per
             model (error bars: the seeds' min to max); below, the same points against the
             decoding state's bytes (log scale).

  <out>_mad.md  MAD's runs (configs/mad.py), MAD's rule (lra/reporting/mad_table.py): per
             difficulty setting the best (lr, weight decay) by the seeds' mean of MAD's
             metric, the mean over settings per task, the average over the six; ties per task
             by the seeds' scores (as above); the majority label's score under MAD's metric (1 / the
             number of test label classes, from each setting's regenerated data); the
             published rows beside. Rows are named by the scaffold card as above (a model
             under another initialisation, say, is a row of its own, ranked only as a
             declared ablation).

  <out>_lengths.md, _lengths.png  the runs with config.eval_lengths or eval_depth_buckets
             (state tracking, niah, any task): accuracy against the evaluation length, a
             line per model, the seeds' spread, and the needle-depth table
             (lra/length_report.py).

  <out>_runs.jsonl  every run the tables used (lra/runs/record.py), one line each: its
             results.json without the training history (a few KB a run), and `run_dir`, its
             folder. Committed beside the tables, it is what a later machine regenerates or
             extends them from, as a source: run folders are not committed (checkpoints)
             and do not outlive the machine. A run read from several sources counts once:
             the later source wins (a cell or MAD setting holds one run per seed and tuning).

Per-example accuracy (every query of an example right) is in each run's results.json
(`test_example_accuracy`); the MQAR table is per position, as Zoology's figure.
"""
from __future__ import annotations

import collections
import csv
import json
import math
import os
import statistics
import sys

from absl import app, flags

from lra.reporting import mad_table, ranking
from lra.runs import card as card_lib
from lra.runs import cli
from lra.runs import record
from lra.runs import results as results_lib
# Re-exported under the names scripts and notebooks have used (`synthetic_report.ties`,
# `.load_sources`, `.mad_scores`, ...), from before lra/reporting/ and lra/runs/record.py
# held them.
from lra.reporting.mad_table import PUBLISHED_MAD, mad_scores  # noqa: F401
from lra.reporting.ranking import ORDER, ties  # noqa: F401
from lra.runs.record import RUNS_SUFFIX, dedupe, load_sources, write_runs  # noqa: F401

FLAGS = flags.FLAGS
# Fields that make a cell's coordinates (not its setting), and the ones derived from them
# (qkv_dim, mlp_dim from the width; the full config's batch size from L). A batch size
# given by hand is therefore not told apart: such runs merge with the config's.
_COORDS = ("max_length", "task_options.num_kv_pairs", "emb_dim", "qkv_dim", "mlp_dim",
           "model", "batch_size")
# Tuned per cell (Zoology sweeps the learning rate per width): a cell's runs at several
# values are a grid, and the values with the best validation accuracy (the seeds' mean of
# best_eval_accuracy) are the cell's; the test accuracy reported is theirs.
TUNED = ("learning_rate", "weight_decay")
SHORT = {"learning_rate": "lr", "weight_decay": "wd"}
# What a run is tested on after it trains (lengths, needle depths, other splits) is not
# its setting: a row tested at fewer lengths (hyena on niah, whose weights are shaped by
# the length) stays in its panel, '-' where it was not tested.
_SKIP = (results_lib.SEED_FIELD, *record.NOT_COMPARED, "eval_lengths", "eval_depth_buckets",
         "eval_splits")
# A variant's own presets (configs/presets.py: its hparams, parameter groups, positions,
# and the block's token counts scaled to the length): they differ between models, or
# between lengths, of one setting by design.
# The scaffold's fields and what they set (positions, convolutions, heads) are compared
# on the runs' scaffold cards instead (row_name): a cell whose card differs from its
# table's is shown, named by the field, and not ranked unless declared an ablation.
_PRESETS = ("model_hparams", "param_groups", "hybrid", "weight_decay_exempt", "pos_emb",
            "layers", "block.segment_len", "block.mem_len", "block.short_conv", "scaffold",
            "num_heads", "init_scheme", "tie_head")
def _setting(r: dict) -> tuple:
    """What the cell's runs share beyond their coordinates, as sorted (field, value)
    pairs (the model's own presets aside: model_hparams differ between variants)."""
    # A field added after a run was recorded holds its default there (IMPLIED_WHEN_ABSENT).
    flat = {**results_lib.IMPLIED_WHEN_ABSENT, **results_lib.flatten(r.get("config") or {})}
    # The data's seed is a seed like random_seed where it follows the run's (MQAR, MAD).
    seeds = ("task_options.seed",) if flat.get("data_seed_from_run") else ()
    return tuple(sorted((k, repr(v)) for k, v in flat.items()
                        if k not in _COORDS + TUNED + seeds
                        and not k.startswith(_SKIP + _PRESETS)))


def state_bytes(config: dict) -> int | None:
    """Bytes of one sequence's decoding cache for the run's model (its recorded config
    built abstractly as a causal_lm: the same encoder), or None if it has no cache."""
    import ml_collections
    from flax import nnx

    import lra.tasks
    from lra import train
    from lra.cache_memory import cache_bytes

    c = ml_collections.ConfigDict(config)
    c.objective = "causal_lm"
    try:
        model = nnx.eval_shape(lambda: train.build_model(c, lra.tasks.get(c.task)))
        return cache_bytes(model)
    except Exception:  # noqa: BLE001  (a variant without a decoding form: no state column)
        return None


_CARDS: dict[str, dict] = {}


def card_of(r: dict) -> dict:
    """The run's scaffold card (lra/runs/card.py): results.json's, or for a run recorded
    before cards were, measured on its recorded config's model ({} if it cannot be built)."""
    if r.get("scaffold_card"):
        return r["scaffold_card"]
    key = json.dumps(r["config"], sort_keys=True, default=str)
    if key not in _CARDS:
        import ml_collections

        try:
            _CARDS[key] = card_of_config(ml_collections.ConfigDict(r["config"]))
        except Exception:  # noqa: BLE001  (a config this code cannot build: no card)
            _CARDS[key] = {}
    return _CARDS[key]


def card_of_config(config, *, flops: bool = True) -> dict:
    """The scaffold card of the model `config` builds (abstractly: shapes only)."""
    from flax import nnx

    import lra.tasks
    from lra import train

    task = lra.tasks.get(config.task).with_options(**config.task_options.to_dict())
    return card_lib.card(config, nnx.eval_shape(lambda: train.build_model(config, task)),
                         flops=flops)


def reference_cards(results: list[dict]) -> dict[tuple, dict]:
    """Per setting, the card most of its models share, field by field (one vote per
    model and width, the base model's layers): what a row's name is told against."""
    from lra.runs import card as card_lib

    votes: dict[tuple, dict[str, collections.Counter]] = {}
    seen = set()
    for r in results:
        c = card_of(r)
        key = (_setting(r), r["config"].get("emb_dim"), r["model"])
        if not c or key in seen:
            continue
        seen.add(key)
        fields = votes.setdefault(key[0], {f: collections.Counter() for f in card_lib.COMPARED})
        # a knob the variant keeps against the scaffold (RetNet's heads) is not the setting's
        kept = {card_lib.KEPT_AS.get(f, f) for f in c.get("kept") or {}}
        for f in card_lib.COMPARED:
            if f not in kept:
                fields[f][json.dumps(card_lib.base_value(c, f))] += 1
    out = {setting: {f: json.loads(counter.most_common(1)[0][0])
                     for f, counter in fields.items() if counter}
           for setting, fields in votes.items()}
    # A setting whose runs name one scaffold is told against its declaration (a run that
    # overrode a scaffold field is then the one that differs, however many there are), in
    # the fields its runs do not all share: a value every run that has the field has is
    # the setting's (MAD's mini keeps 4 heads at width 64 where the scaffold declares 16
    # at MAD's 128; a mixer without heads has no say).
    from configs import scaffold

    names: dict[tuple, set] = {}
    for r in results:
        names.setdefault(_setting(r), set()).add(card_of(r).get("scaffold"))
    for setting, found in names.items():
        if len(found) == 1 and setting in out:
            declared = scaffold.declared_card(next(iter(found)) or "")
            out[setting].update({f: v for f, v in declared.items()
                                 if len(set(votes[setting].get(f) or ()) - {"null"}) != 1})
    return out


def row_name(r: dict, reference: dict | None = None) -> tuple[str, list[str]]:
    """The run's model with the scaffold card's fields in which it differs from its
    setting's reference card (`[conv 0]`, `[pos learned]`, `[own conv 4]`; a field the
    variant keeps, e.g. RetNet's heads, is not one), and those of them its config does
    not declare an ablation axis (config.scaffold.ablate): such a row is not ranked."""
    from configs import scaffold
    from lra.runs import card as card_lib

    c = card_of(r)
    if not c or not reference:
        notes = _override_notes(r, [])
        return r["model"] + (f" [{', '.join(notes)}]" if notes else ""), []
    differ = card_lib.differences(c, reference)
    notes = [card_lib.note(f, card_lib.base_value(c, f)) for f in differ]
    # A knob the variant keeps against the scaffold (RetNet's heads) names the row too,
    # where it differs (`heads 8 (kept)`); it does not keep the row out of the ranking.
    kept = {card_lib.KEPT_AS.get(f, f) for f in c.get("kept") or {}}
    notes += [card_lib.note(f, card_lib.base_value(c, f)) + " (kept)"
              for f in card_lib.COMPARED if f in kept and f in reference
              and not card_lib.agree(card_lib.base_value(c, f), reference[f])]
    notes += _capacity_notes(r, c)
    notes += _override_notes(r, notes)
    undeclared = [f for f in differ if f not in scaffold.ablated(r["config"])]
    return r["model"] + (f" [{', '.join(notes)}]" if notes else ""), undeclared


def _capacity_notes(r: dict, c: dict) -> list[str]:
    """'window 128' for a capacity hparam (card `capacity`) the run set away from its
    variant's presets at its length: the mixer's own knob, named, ranked as a model."""
    from configs import common, presets

    config, base = r["config"], r["model"].split("+")[0]
    if "+" in r["model"] or isinstance(c.get("capacity"), list):
        return []
    try:
        preset = presets.model_hparams(base, common.preset_task(config["task"]),
                                       max_length=int(config["max_length"]))
    except Exception:  # noqa: BLE001  (a variant this code no longer has: no note)
        return []
    return [f"{k} {v}" for k, v in (c.get("capacity") or {}).items()
            if k in preset and preset[k] != v]


def _override_notes(r: dict, notes: list[str]) -> list[str]:
    """'forget_gate False', 'block_counts 3' for each model_hparams override a sweep gave the
    run (`overrides`, from its sweep.json) that no note names yet: another model of the
    variant, its own row (the report would otherwise fold it into the variant's cell)."""
    named = {n.split(" ")[0] for n in notes}
    out = []
    for o in r.get("overrides") or []:
        field, _, value = o.partition("=")
        if field.startswith("model_hparams.") and "." not in field[len("model_hparams."):]:
            key = field[len("model_hparams."):]
            if key not in named:
                out.append(f"{key} {value}")
    return out


def choose_tuning(runs: list[dict], lower_loss: bool = False
                  ) -> tuple[tuple, dict, str, int]:
    """Zoology's rule for one cell's runs: per tuning (learning rate, weight decay) one run
    per seed (a rerun of a seed replaces it), and the tuning with the best validation (the
    seeds' mean of best_eval_accuracy; with `lower_loss`, of -best_eval_loss: language
    models) chosen, among the tunings run at the most seeds. Returns (tuning, {seed: run},
    a note naming the chosen values of the tuned fields that vary in the grid, e.g.
    'lr 0.001' ('' for one tuning), how many tunings ran)."""
    grid: dict[tuple, dict] = {}
    for r in runs:
        tuning = tuple(r["config"].get(k) for k in TUNED)
        grid.setdefault(tuning, {})[r["config"].get(results_lib.SEED_FIELD)] = r

    def validation(tuning):  # a run without a validation number is never chosen
        field = "best_eval_loss" if lower_loss else "best_eval_accuracy"
        vals = [-math.inf if r.get(field) is None
                else (-1 if lower_loss else 1) * float(r[field]) for r in grid[tuning].values()]
        return statistics.fmean(vals)

    # Only the tunings run at the most seeds compete: one lucky seed of a tuning tried at
    # one seed (a probe of a failing seed's lr) never outranks a tuning's seed mean.
    most = max(len(seeds) for seeds in grid.values())
    tuning = max(sorted((t for t in grid if len(grid[t]) == most), key=repr), key=validation)
    chosen = ", ".join(f"{SHORT[k]} {v:g}" for k, v in zip(TUNED, tuning)
                       if len({t[TUNED.index(k)] for t in grid}) > 1)
    return tuning, grid[tuning], chosen, len(grid)


def cells(results: list[dict]) -> list[dict]:
    """One dict per cell: its coordinates, setting, seeds' accuracies (%), params, state,
    scaffold card, and the card fields that keep it out of the ranking."""
    results = [r for r in results if r.get("task") == "mqar" and r.get("config")]
    references = reference_cards(results)
    groups: dict[tuple, list[dict]] = {}
    undeclared: dict[tuple, list[str]] = {}
    for r in results:
        c = r["config"]
        name, fields = row_name(r, references.get(_setting(r)))
        key = (_setting(r), int(c["max_length"]), int(c["task_options"]["num_kv_pairs"]),
               int(c["emb_dim"]), name)
        groups.setdefault(key, []).append(r)
        undeclared[key] = fields
    out = []
    for key, runs in sorted(groups.items()):
        setting, length, kv, width, model = key
        tuning, by_seed, chosen, tunings = choose_tuning(runs)
        # accs[i] is seeds[i]'s (scripts/mqar_extend_cells.py matches seeds by value).
        accs = [100 * float(by_seed[seed]["test_accuracy"]) for seed in sorted(by_seed)]
        first = next(iter(by_seed.values()))
        out.append({
            "setting": setting, "L": length, "kv": kv, "width": width, "model": model,
            **dict(zip(TUNED, tuning)), "tunings": tunings, "chosen": chosen,
            "seeds": sorted(by_seed), "accs": accs, "mean": statistics.fmean(accs),
            "std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
            "min": min(accs), "max": max(accs),
            "params": int(first.get("num_params") or 0),
            "majority": 100 * float(first.get("majority_baseline_accuracy") or 0.0),
            "vocab": int(first["config"]["task_options"]["vocab_size"]),
            "steps": int(first["config"]["num_train_steps"]),
            "early_stop": float(first["config"].get("early_stop_accuracy", 0.0)),
            "state_bytes": state_bytes(first["config"]),
            "card": card_of(first), "unranked": undeclared[key],
        })
    return out


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1024:.0f} KiB" if n >= 1024 else f"{n} B"


def markdown(all_cells: list[dict], source: str) -> str:
    lines = [f"# MQAR: test accuracy per queried position (%), from `{source}`", "",
             "Mean ± standard deviation over seeds (n seeds; where they span more than "
             f"{ranking.SPLIT_POINTS:g} points, each seed's, in seed order); `=` tied with "
             "the column's best (its seed range reaches the best model's worst seed), `<` below it "
             "(its best seed under the best's worst), among the models with two seeds or more; "
             "a model with one seed is not ranked. `[lr x of n]`: the cell ran n (learning "
             "rate, weight decay) settings; the one with the best validation accuracy (the "
             "seeds' mean) is shown, with the values that differed (lr, wd); `[lr x]`: the cell "
             "ran one setting, not the one most cells of its table ran. State: bytes "
             "of one sequence's decoding cache at L (lra.cache_memory), per width. Chance: "
             "one of the V/2 values.", ""]
    settings = sorted({c["setting"] for c in all_cells})
    for i, setting in enumerate(settings):
        mine = [c for c in all_cells if c["setting"] == setting]
        if len(settings) > 1:  # name what differs between the settings
            differing = {k for s in settings for k, v in s
                         if any((k, v) not in t for t in settings)}
            lines += [f"## Setting {i + 1}: " + ", ".join(
                f"{k}={v}" for k, v in setting if k in differing), ""]
        for length, kv in sorted({(c["L"], c["kv"]) for c in mine}):
            block = [c for c in mine if (c["L"], c["kv"]) == (length, kv)]
            widths = sorted({c["width"] for c in block})
            models = ranking.ordered({c["model"] for c in block})
            vocab, steps, stop = (block[0][k] for k in ("vocab", "steps", "early_stop"))
            stop = (f", early stop above {100 * stop:g}% validation accuracy" if stop
                    else "")
            lines += [f"### L = {length}, {kv} key-value pairs (V = {vocab}, {steps:,} "
                      f"steps{stop})", "",
                      "| model | " + " | ".join(f"width {w}" for w in widths)
                      + " | params | state | scaffold | capacity | MFLOP/token |",
                      "|---|" + "---|" * len(widths) + "---|---|---|---|---|"]
            marks = {w: ranking.ties([c for c in block if c["width"] == w]) for w in widths}
            # A cell run at one (lr, wd) other than most of its table's names its values, so
            # that a column tuned apart (e.g. another width's lr) does not read as the rest.
            # (A cell whose values are not recorded, an old csv's, counts for none.)
            usual = [collections.Counter(c[k] for c in block if c.get(k) is not None)
                     .most_common(1) for k in TUNED]
            usual = [u[0][0] if u else None for u in usual]
            unranked = []
            for model in models:
                row, params, state, flops = [], [], [], []
                cards = []
                for w in widths:
                    c = next((c for c in block if c["width"] == w and c["model"] == model),
                             None)
                    if c is None:
                        row.append("-")
                        continue
                    spread = f" ± {c['std']:.1f}" if len(c["accs"]) > 1 else ""
                    own = ", ".join(f"{SHORT[k]} {c[k]:g}" for k, u in zip(TUNED, usual)
                                    if c.get(k) is not None and u is not None and c[k] != u)
                    chosen = (f" [{c['chosen']} of {c['tunings']}]" if c["tunings"] > 1
                              else f" [{own}]" if own else "")
                    row.append(f"{c['mean']:.1f}{spread} {ranking.seeds_note(c['accs'])} "
                               f"{marks[w][model]}".rstrip() + chosen)
                    params.append(f"{c['params']:,}")
                    state.append(_fmt_bytes(c["state_bytes"]))
                    card = c.get("card") or {}
                    cards.append(card)
                    f = card.get("flops_per_token")
                    flops.append(f"{f / 1e6:.2f}" if f else "-")
                    if c.get("unranked") and (model, tuple(c["unranked"])) not in unranked:
                        unranked.append((model, tuple(c["unranked"])))
                first = next((k for k in cards if k), {})
                lines.append(f"| {model} | " + " | ".join(row) + " | "
                             + " / ".join(params) + " | " + " / ".join(state) + " | "
                             + (card_lib.describe(first) if first else "-") + " | "
                             + _capacity(first) + " | " + " / ".join(flops) + " |")
            majority = max(c["majority"] for c in block)
            lines.append("| majority label | " + " | ".join(
                f"{majority:.1f}" for _ in widths) + " | | | | | |")
            lines.append("| chance | " + " | ".join(
                f"{100 / (vocab // 2):.1f}" for _ in widths) + " | | | | | |")
            lines.append("")
            if unranked:
                lines += ["Not ranked (their scaffold differs from the table's in a field no "
                          "sweep declared an ablation axis, `config.scaffold.ablate`): "
                          + "; ".join(f"{m} ({', '.join(fs)})" for m, fs in unranked) + ".",
                          ""]
    return "\n".join(lines) + "\n"


def _capacity(card: dict) -> str:
    """'window 8' / 'num_features 256' from the card's capacity hparams ('-' for none)."""
    cap = card.get("capacity") or {}
    cap = cap[0] if isinstance(cap, list) and cap else cap
    return ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in cap.items()) or "-"


def write_csv(all_cells: list[dict], path: str) -> None:
    fields = ["setting", "L", "kv", "width", "model", "seeds", "mean", "std", "min", "max",
              "params", "state_bytes", *TUNED, "tunings", "vocab", "steps", "early_stop",
              "scaffold", "flops_per_token", "unranked"]
    settings = sorted({c["setting"] for c in all_cells})
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fields, extrasaction="ignore")
        w.writeheader()
        for c in all_cells:
            card = c.get("card") or {}
            w.writerow({**c, "setting": settings.index(c["setting"]) + 1,
                        "scaffold": card_lib.describe(card) if card else "",
                        "flops_per_token": card.get("flops_per_token") or "",
                        "unranked": " ".join(c.get("unranked") or ()),
                        "seeds": " ".join(map(str, c["seeds"])),
                        **{k: f"{c[k]:.2f}" for k in ("mean", "std", "min", "max")}})


# After tab10's ten: colours far from all of them (13 variants in the MQAR grid).
EXTRA_COLOURS = ("black", "gold", "navy", "lime", "magenta", "saddlebrown")


def _line_style(model: str, models: list[str]) -> dict:
    """One colour per base variant (tab10's, then EXTRA_COLOURS; cycled past them), so that a
    hybrid or a changed default shares its variant's colour; the kind is in the line:
    solid o the variant, dashed s +transformer@n, dotted ^ +local@n (another second
    mixer: dash-dot v), a bracketed change [..] a diamond."""
    import matplotlib.pyplot as plt

    base = lambda m: m.split("+")[0].split(" ")[0]  # noqa: E731
    bases = list(dict.fromkeys(base(m) for m in models))
    palette = [plt.get_cmap("tab10")(i) for i in range(10)] + list(EXTRA_COLOURS)
    colour = palette[bases.index(base(model)) % len(palette)]
    kind = model.split(" ")[0].partition("+")[2]
    line, marker = (("-", "o") if not kind else ("--", "s") if kind.startswith("transformer")
                    else (":", "^") if kind.startswith("local") else ("-.", "v"))
    if " [" in model:
        marker = "D"
    return dict(color=colour, linestyle=line, marker=marker)


def plot(all_cells: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    panels = sorted({(c["L"], c["kv"]) for c in all_cells})
    models = ranking.ordered({c["model"] for c in all_cells})
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 7.5),
                             squeeze=False)
    for j, (length, kv) in enumerate(panels):
        for model in models:
            pts = sorted((c for c in all_cells if (c["L"], c["kv"], c["model"])
                          == (length, kv, model)), key=lambda c: c["width"])
            if not pts:
                continue
            ys = [c["mean"] for c in pts]
            err = [[c["mean"] - c["min"] for c in pts], [c["max"] - c["mean"] for c in pts]]
            style = dict(ms=4, capsize=2, label=model, **_line_style(model, models))
            axes[0][j].errorbar([c["width"] for c in pts], ys, yerr=err, **style)
            with_state = [(c["state_bytes"] / 1024, c) for c in pts if c["state_bytes"]]
            if with_state:
                axes[1][j].errorbar([s for s, _ in with_state], [c["mean"] for _, c in with_state],
                                    yerr=[[c["mean"] - c["min"] for _, c in with_state],
                                          [c["max"] - c["mean"] for _, c in with_state]],
                                    **style)
        axes[0][j].set_title(f"L = {length}, {kv} kv pairs")
        widths = sorted({c["width"] for c in all_cells if (c["L"], c["kv"]) == (length, kv)})
        axes[0][j].set_xlabel("width (d_model)")
        axes[0][j].set_xscale("log", base=2)
        axes[0][j].set_xticks(widths, [str(w) for w in widths])
        axes[0][j].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axes[1][j].set_xlabel("decoding state (KiB, one sequence)")
        axes[1][j].set_xscale("log")
        axes[1][j].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        for row in (0, 1):
            axes[row][j].set_ylim(0, 102)
            axes[row][j].grid(alpha=0.3)
    axes[0][0].set_ylabel("test accuracy, queried positions (%)")
    axes[1][0].set_ylabel("test accuracy, queried positions (%)")
    # One legend for every panel's models (a panel may lack some).
    handles = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    ordered = [m for m in models if m in handles]
    fig.legend([handles[m] for m in ordered], ordered, fontsize=7, loc="center left",
               markerscale=1.4, bbox_to_anchor=(0.74, 0.5))
    fig.tight_layout(rect=(0, 0, 0.74, 1))
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the legend sits outside the axes
    plt.close(fig)


def _compute(runs: list[dict]) -> str:
    """The table's closing line: what its runs cost (lra/runs/record.py compute_line)."""
    line = record.compute_line(runs)
    return f"\n{line}\n" if line else ""


def mad_scores_by_card(runs: list[dict]) -> dict[str, dict[str, dict]]:
    """MAD's table (lra/reporting/mad_table.py) with each row named as the MQAR table's
    are (row_name): the model and the scaffold card's fields in which it differs from its
    setting's card, so that a model under two scaffolds (or initialisations) is two rows."""
    mad = [r for r in runs if r.get("task", "").startswith("mad_") and r.get("config")]
    references = reference_cards(mad)
    return mad_table.mad_scores(mad, row_of=lambda r: row_name(
        r, references.get(_setting(r))))


def report(sources: str | list[str], out: str) -> list[str]:
    sources = [sources] if isinstance(sources, str) else list(sources)
    runs, skipped = record.load_sources(sources)
    runs = record.dedupe(runs)
    all_cells = cells(runs)
    mad = mad_scores_by_card(runs)
    where = " + ".join(sources)
    from lra import length_report  # it reads this module's settings: imported here

    with_lengths = [r for r in runs if length_report.has_lengths(r)]
    if not all_cells and not mad and not with_lengths:
        # Name what was skipped: a folder of only corrupt results.json read as "no run".
        why = (f"; {len(skipped)} skipped, e.g. {skipped[0]}" if skipped else "")
        raise FileNotFoundError(f"no MQAR, MAD or length-extrapolation run's results.json "
                                f"under {where}{why}")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    paths = length_report.write(with_lengths, out, where)
    if all_cells:
        mqar = [out + ".md", out + ".csv", out + ".png"]
        paths += mqar
        with open(mqar[0], "w", encoding="utf-8") as f:
            f.write(markdown(all_cells, where))
            f.write(_compute([r for r in runs if r.get("task") == "mqar"]))
        write_csv(all_cells, mqar[1])
        plot(all_cells, mqar[2])
    if mad:
        paths.append(out + "_mad.md")
        with open(paths[-1], "w", encoding="utf-8") as f:
            f.write(mad_table.mad_markdown(mad, where, mad_table.mad_baselines(runs)))
            f.write(_compute([r for r in runs if r.get("task", "").startswith("mad_")]))
    used = [r for r in runs if (r.get("task") == "mqar" or r.get("task", "").startswith("mad_")
                                or length_report.has_lengths(r)) and r.get("config")]
    paths.append(out + record.RUNS_SUFFIX)
    record.write_runs(used, paths[-1])
    for line in skipped:
        print(f"warning: {line}", file=sys.stderr)
    return paths


def main(argv, out: str | None = None):
    if len(argv) < 2:
        print("usage: python -m lra.synthetic_report DIR_OR_RUNS_JSONL... "
              "[--out=PATH_WITHOUT_SUFFIX]", file=sys.stderr)
        return 2
    sources = argv[1:]
    if out is None:
        if not os.path.isdir(sources[0]):
            print("error: --out is needed when the first source is not a directory",
                  file=sys.stderr)
            return 2
        out = os.path.join(sources[0], "mqar")
    try:
        paths = report(sources, out)
    except FileNotFoundError as e:  # a refused input: exit 2, as from every command
        print(f"error: {e}", file=sys.stderr)
        return cli.EXIT_USER_ERROR
    print("wrote " + ", ".join(paths))
    return 0


def run() -> None:
    flags.DEFINE_string("out", None, "Output path without suffix (default DIR/mqar): "
                        "writes .md, .csv, .png, _mad.md and _runs.jsonl.")
    app.run(lambda argv: sys.exit(main(argv, FLAGS.out)),
            flags_parser=cli.parse_flags_or_refuse)


if __name__ == "__main__":
    run()

r"""Accuracy against the evaluation length (issue 72): the length-extrapolation table and
figure of `lra.synthetic_report`, from the runs' `length_accuracy` (config.eval_lengths)
and `depth_accuracy` (config.eval_depth_buckets).

  python -m lra.synthetic_report workdirs/state_tracking_grid --out=results/cpu/st
      # also writes results/cpu/st_lengths.md and _lengths.png when runs have lengths
  python -m lra.length_report workdirs/niah_mini --out=results/cpu/niah_mini
      # those two only (sources: directories and _runs.jsonl records, as synthetic_report)

A panel is one task setting (the runs' configs agreeing in everything but the model, its
presets, the seed, the width and the learning rate and weight decay: lra.synthetic_report's
settings), e.g. parity at one recipe; a row's runs at several learning rates (or weight
decays) show the one with the best validation accuracy (language models: loss), the seeds'
mean, as lra.synthetic_report chooses, named in the table ("lr 0.001 of 3"); a line is one
row name (the model, ` [neg_eig]` for the negative-eigenvalue forms, the scaffold fields a
run changed: ` [pos rotary]`), its points the seeds' mean
test accuracy at each length, error bars the seeds' min to max. For a task whose test
split is made at the training length (niah, MQAR: no `Task.at_length`), the run's own
test is the point at its training length; a state-tracking test spans lengths (40..L)
and is left out. The training length is the dashed line (state tracking: the longest
training row). Baselines per panel: the majority label's share of the test split's labels
(from the runs) and chance (one label of the task's answer set, where it has one).

Splits (config.eval_splits, flip-flop's sparse and dense tails): columns after the
lengths, at the training length.

Depths: per panel, row and length, the seeds' mean accuracy in each depth range (the
needle-in-a-haystack heat map as a table).

Language modelling (enwik8, text8: objective causal_lm): the panel is bits per token
(bits per byte on enwik8, per character on text8; lower is better), the run's
`test_bits_per_token` at its training length and each length_accuracy row's
`bits_per_token` (rows of L tokens, each target predicted from the tokens before it in its
row: lra.lm_eval's `window` context at L), against a uniform guess over the task's tokens
(log2 of their number) instead of the majority label.
"""
from __future__ import annotations

import statistics

from lra import synthetic_report as sr
from lra.reporting import ranking
from lra.runs import cli
from lra.runs import record


def has_lengths(r: dict) -> bool:
    return bool(r.get("config")) and bool(r.get("length_accuracy") or r.get("depth_accuracy")
                                          or r.get("split_accuracy"))


def row_label(r: dict, reference: dict | None = None) -> str:
    """The model, with in brackets `neg_eig` where its transitions reach [-1, 1]
    (allow_neg_eigval as the run set it, else its builder's default: gated_deltaproduct's
    is fla's True) and the scaffold card's fields in which it differs from its setting's
    `reference` card (`pos rotary`: a scaffold ablation is a row of its own, never a seed
    of the model's row), and each model_hparams override its sweep gave it
    (synthetic_report's `decay False`: another model of the variant, its own row)."""
    hparams = (r.get("config") or {}).get("model_hparams") or {}
    neg = hparams.get("allow_neg_eigval")
    if neg is None:
        from models import registry
        try:
            neg = registry.accepted_hparams(r["model"]).get("allow_neg_eigval")
        except Exception:  # noqa: BLE001  (a variant this code no longer has)
            neg = None
    notes = ["neg_eig"] if neg is True else []
    card = sr.card_of(r) if reference else {}
    if card:
        from lra.runs import card as card_lib
        notes += [card_lib.note(f, card_lib.base_value(card, f))
                  for f in card_lib.differences(card, reference)]
    notes += [n for n in sr._override_notes(r, notes)
              if not n.startswith("allow_neg_eigval ")]  # named neg_eig, or its absence
    return r["model"] + (f" [{', '.join(notes)}]" if notes else "")


def panel_name(r: dict) -> str:
    """A short name for the panel's data: the task and its defining options."""
    c = r["config"]
    o = c.get("task_options") or {}
    if r["task"] == "state_tracking":
        what = o.get("language", "parity")
    elif r["task"] == "niah":
        from lra.tasks import niah

        spec = {k: o.get(k) for k in next(iter(niah.VARIANTS.values()))}  # the row fields
        what = next((name for name, v in niah.VARIANTS.items() if v == spec), "custom")
    else:
        what = ""
    lo, hi = train_range(c)
    trained = f"L {hi}" if lo == hi else f"lengths {lo}..{hi}"
    return f"{r['task']}{' ' + what if what else ''}, trained at {trained}"


def train_range(config: dict) -> tuple[int, int]:
    """The training rows' shortest and longest length (state tracking: its options')."""
    o = config.get("task_options") or {}
    if "train_max_length" in o:
        return int(o.get("train_min_length", 1)), int(o["train_max_length"])
    return int(config["max_length"]), int(config["max_length"])


def chance(config: dict) -> float | None:
    """Accuracy (%) of a uniform guess over the task's answers, where it has a set."""
    o = config.get("task_options") or {}
    if config.get("task") == "niah":
        return 100.0 / int(o.get("num_values", 32))
    if config.get("task") == "flipflop":  # a read's bit
        return 50.0
    if config.get("task") == "state_tracking":
        from lra.tasks import state_tracking as st

        language = o.get("language", "parity")
        if language == "parity":
            return 50.0
        if language == "modular_arithmetic":
            vocab = st.vocab_size_of(language=language, vocab_size=o.get("vocab_size", 0))
            return 100.0 / (vocab - 5)
        return 100.0 / len(st.group_table(language))
    return None


def is_lm(r: dict) -> bool:
    """A language-modelling run: its length panel is bits per token, not accuracy."""
    return (r.get("objective") or (r.get("config") or {}).get("objective")) == "causal_lm"


def uniform_bits(task: str) -> float | None:
    """Bits per token of a uniform guess over the task's tokens (its vocabulary less the
    padding id): 8 for enwik8's bytes, log2 27 for text8's characters."""
    import math

    import lra.tasks

    try:
        return math.log2(lra.tasks.get(task).vocab_size - 1)
    except Exception:  # noqa: BLE001  (a task this code no longer has)
        return None


def _tested_at_training_length(task: str) -> bool:
    import lra.tasks

    try:
        return lra.tasks.get(task).at_length is None
    except Exception:  # noqa: BLE001  (a task this code no longer has)
        return False


def _stats(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "n": len(values),
            "values": list(values)}


def cells(runs: list[dict]) -> list[dict]:
    """One dict per (panel, row): its points {length: stats} and depths
    {(length, lo, hi): stats}, params, majority, chance."""
    groups: dict[tuple, list[dict]] = {}
    references = sr.reference_cards([r for r in runs if has_lengths(r)])
    for r in runs:
        if has_lengths(r):
            key = (panel_name(r), sr._setting(r), int(r["config"].get("emb_dim", 0)),
                   row_label(r, references.get(sr._setting(r))))
            groups.setdefault(key, []).append(r)
    out = []
    for (panel, setting, width, label), runs in sorted(groups.items(), key=repr):
        # Several learning rates (or weight decays) of one row: the one with the best
        # validation, as lra.synthetic_report chooses (never two tunings as two seeds).
        _, by_seed, chosen, tunings = sr.choose_tuning(runs, lower_loss=is_lm(runs[0]))
        group = [by_seed[seed] for seed in sorted(by_seed)]  # values in seed order
        by_length: dict[int, list[float]] = {}
        by_depth: dict[tuple, list[float]] = {}
        by_split: dict[str, list[float]] = {}
        extended: dict[str, None] = {}  # hparams a variant changed past its length
        train_length = train_range(group[0]["config"])[1]
        lm = is_lm(group[0])
        for r in group:
            own = r.get("test_bits_per_token") if lm else r.get("test_accuracy")
            if _tested_at_training_length(r["task"]) and own is not None:
                at = int(r["config"]["max_length"])
                by_length.setdefault(at, []).append(own if lm else 100 * own)
            for row in r.get("length_accuracy") or []:
                value = row.get("bits_per_token") if lm else 100 * row["accuracy"]
                if value is not None:
                    by_length.setdefault(int(row["length"]), []).append(value)
                for name, v in (row.get("model_hparams") or {}).items():
                    extended[f"{name} {v}"] = None
            for row in r.get("split_accuracy") or []:
                by_split.setdefault(row["split"], []).append(100 * row["accuracy"])
            for row in r.get("depth_accuracy") or []:
                key = (int(row["length"]), float(row["depth_min"]), float(row["depth_max"]))
                by_depth.setdefault(key, []).append(100 * row["accuracy"])
        out.append({
            "panel": panel, "setting": setting, "width": width, "model": label,
            "tuned": f"{chosen} of {tunings}" if tunings > 1 else "",
            "train_length": train_length, "seeds": len(group),
            "points": {n: _stats(v) for n, v in sorted(by_length.items())},
            "depths": {k: _stats(v) for k, v in sorted(by_depth.items())},
            "splits": {k: _stats(v) for k, v in by_split.items()},
            "extended": list(extended),
            "params": int(group[0].get("num_params") or 0),
            "majority": 100 * float(group[0].get("majority_baseline_accuracy") or 0.0),
            "chance": uniform_bits(group[0]["task"]) if lm else chance(group[0]["config"]),
            "metric": "bits" if lm else "accuracy", "unit": _unit(group[0]["task"]),
        })
    return out


def _unit(task: str) -> str:
    return {"enwik8": "bits per byte", "text8": "bits per character"}.get(task, "bits per token")


def _order(c: dict) -> tuple:
    base = c["model"].split(" ")[0].split("+")[0]
    return (ranking.ORDER.index(base) if base in ranking.ORDER else len(ranking.ORDER), c["model"])


def _panels(all_cells: list[dict]) -> list[tuple]:
    return list(dict.fromkeys((c["panel"], c["setting"], c["width"]) for c in all_cells))


def _titles(all_cells: list[dict]) -> dict[tuple, str]:
    """Each panel's heading: its data and width, and where another panel has the same
    ones (a run with more steps, another vocabulary: a setting of its own), the fields in
    which its setting differs from the one with the most rows (that one unmarked)."""
    panels = _panels(all_cells)
    rows = {p: sum((c["panel"], c["setting"], c["width"]) == p for c in all_cells)
            for p in panels}
    titles = {}
    for panel, setting, width in panels:
        same = [p for p in panels if (p[0], p[2]) == (panel, width)]
        main = max(same, key=lambda p: (rows[p], -panels.index(p)))
        differ = sorted(set(setting) - set(main[1]))
        titles[(panel, setting, width)] = f"{panel}, width {width}" + (
            " (" + ", ".join(f"{k} {v}" for k, v in differ) + ")" if differ else "")
    return titles


def _fmt(s: dict | None, digits: int = 1, accuracy: bool = True) -> str:
    """'mean ± std (n)'; an accuracy's seeds where they split (ranking.seeds_note)."""
    if not s:
        return "-"
    n = (ranking.seeds_note(s["values"], digits) if accuracy and "values" in s
         else f"({s['n']})")
    return (f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f} {n}" if s["n"] > 1
            else f"{s['mean']:.{digits}f} (1)")


def markdown(all_cells: list[dict], source: str) -> str:
    lines = ["# Accuracy against the evaluation length", "",
             f"From `{source}` (lra.length_report). Test accuracy (%) at each length "
             "(language modelling: bits per token), the "
             "seeds' mean ± standard deviation (n seeds; where an accuracy's seeds span "
             f"more than {ranking.SPLIT_POINTS:g} points, each seed's, in seed order); the "
             "training length is marked *. "
             "A difference inside the seeds' spread is a tie.", ""]
    titles = _titles(all_cells)
    for panel, setting, width in _panels(all_cells):
        group = [c for c in all_cells if (c["panel"], c["setting"], c["width"])
                 == (panel, setting, width)]
        lengths = sorted({n for c in group for n in c["points"]})
        splits = list(dict.fromkeys(k for c in group for k in c["splits"]))
        train = group[0]["train_length"]
        bits = group[0].get("metric") == "bits"
        digits = 3 if bits else 1
        lines += [f"## {titles[(panel, setting, width)]}", ""]
        if bits:
            lines += [f"Test {group[0]['unit']} (lower is better) at each length: rows of L "
                      "tokens, each target predicted from the tokens before it in its row.", ""]
        lines += ["| model | params | " + " | ".join(
                      [f"L {n}{'*' if n == train else ''}" for n in lengths]
                      + [f"{k} (at L {train})" for k in splits]) + " |",
                  "|---|---|" + "---|" * (len(lengths) + len(splits))]
        for c in sorted(group, key=_order):
            tuned = f" ({c['tuned']}, on validation)" if c.get("tuned") else ""
            lines.append(f"| {c['model']}{tuned} | {c['params']:,} | " + " | ".join(
                [_fmt(c["points"].get(n), digits, accuracy=not bits) for n in lengths]
                + [_fmt(c["splits"].get(k)) for k in splits]) + " |")
        extended = [f"{c['model']} ({', '.join(c['extended'])})" for c in
                    sorted(group, key=_order) if c.get("extended")]
        if extended:
            lines += ["", "Tested at other lengths in their own form for longer inputs, "
                      "the hparams set so (lra/training/lengths.py `extension`): "
                      + "; ".join(extended) + "."]
        lengths = lengths + splits  # the baseline rows' columns
        if bits:
            if group[0]["chance"] is not None:
                lines.append("| uniform over the tokens | - | " + " | ".join(
                    f"{group[0]['chance']:.3f}" for _ in lengths) + " |")
            lines.append("")
            continue
        majority = statistics.fmean(c["majority"] for c in group)
        lines.append(f"| majority label (the test split's) | - | {majority:.1f} |"
                     + " |" * (len(lengths) - 1))
        if group[0]["chance"] is not None:
            lines.append("| chance | - | " + " | ".join(
                f"{group[0]['chance']:.1f}" for _ in lengths) + " |")
        depth_keys = sorted({k for c in group for k in c["depths"]})
        if depth_keys:
            ranges = sorted({(lo, hi) for _, lo, hi in depth_keys})
            lines += ["", "Needle depth (share of the haystack before it):", "",
                      "| model | L | " + " | ".join(f"{lo:.1f}-{hi:.1f}" for lo, hi in ranges)
                      + " |", "|---|---|" + "---|" * len(ranges)]
            for c in sorted(group, key=_order):
                for n in sorted({k[0] for k in c["depths"]}):
                    lines.append(f"| {c['model']} | {n} | " + " | ".join(
                        _fmt(c["depths"].get((n, lo, hi))) for lo, hi in ranges) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(all_cells: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels, titles = _panels(all_cells), _titles(all_cells)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False)
    models = list(dict.fromkeys(c["model"] for c in all_cells))
    for ax, (panel, setting, width) in zip(axes[0], panels):
        group = [c for c in all_cells if (c["panel"], c["setting"], c["width"])
                 == (panel, setting, width)]
        for c in group:
            xs = sorted(c["points"])
            pts = [c["points"][n] for n in xs]
            ax.errorbar(xs, [p["mean"] for p in pts],
                        yerr=[[p["mean"] - p["min"] for p in pts],
                              [p["max"] - p["mean"] for p in pts]],
                        ms=4, capsize=2, label=f"{c['model']} ({c['seeds']})",
                        **sr._line_style(c["model"], models))
        ax.axvline(group[0]["train_length"], color="grey", linestyle="--", linewidth=1)
        if group[0]["chance"] is not None:
            ax.axhline(group[0]["chance"], color="black", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        if group[0].get("metric") == "bits":
            ax.set_ylim(bottom=0)
            ax.set_ylabel(f"test {group[0]['unit']} (lower is better)")
        else:
            ax.set_ylim(0, 102)
            ax.set_ylabel("test accuracy (%)")
        ax.set_title(titles[(panel, setting, width)].replace(", width ", ", d "), fontsize=9)
        ax.set_xlabel("evaluation length")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(runs: list[dict], out: str, source: str) -> list[str]:
    """<out>_lengths.md and .png for the runs that have lengths; [] if none has."""
    all_cells = cells(runs)
    if not all_cells:
        return []
    paths = [out + "_lengths.md", out + "_lengths.png"]
    with open(paths[0], "w", encoding="utf-8") as f:
        f.write(markdown(all_cells, source))
        compute = record.compute_line(runs)  # what the runs cost
        f.write(f"\n{compute}\n" if compute else "")
    plot(all_cells, paths[1])
    return paths


def main(argv: list[str], out: str | None = None) -> int:
    import sys

    if len(argv) < 2 or not out:
        print("usage: python -m lra.length_report DIR_OR_RUNS_JSONL... --out=PATH_WITHOUT_SUFFIX",
              file=sys.stderr)
        return 2
    try:
        runs, skipped = record.load_sources(argv[1:])
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in skipped:
        print(f"warning: {line}", file=sys.stderr)
    runs = [r for r in record.dedupe(runs) if has_lengths(r)]
    where = " + ".join(argv[1:])
    if not runs:
        print(f"error: no run with length_accuracy, depth_accuracy or split_accuracy under "
              f"{where}", file=sys.stderr)
        return 2  # a refused input, as from every command
    import os

    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    paths = write(runs, out, where)
    paths.append(out + record.RUNS_SUFFIX)
    record.write_runs(runs, paths[-1])
    print("wrote " + ", ".join(paths))
    return 0


if __name__ == "__main__":
    import sys

    from absl import app, flags

    flags.DEFINE_string("out", None, "Output path without suffix: writes _lengths.md, "
                        "_lengths.png and _runs.jsonl.")
    app.run(lambda argv: sys.exit(main(argv, flags.FLAGS.out)),
            flags_parser=cli.parse_flags_or_refuse)

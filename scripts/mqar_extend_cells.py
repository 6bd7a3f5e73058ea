r"""Extend an MQAR table whose runs are gone: the cells of a committed `<out>.csv` (written by
`lra.synthetic_report`) plus the cells of new runs, into a new .csv, .png and .md.

results/cpu/mqar_grid.md's cells of 2026-11-28 came from run folders on a machine that is
gone, before `lra.synthetic_report` wrote a runs record; only their summary (mean, std,
min, max per cell, in mqar_grid.csv) remains. A new run extends that table here:
- a cell only in the new runs is the report's own cell (best tuning on validation);
- a cell in both is the new runs' cell where they hold all of its seeds (the same runs read
  again: exact values and the majority label); else it takes the new runs' other seeds
  where the old cell's per-seed values are known (one seed: the csv's mean; two: its min
  and max): mean, sample std, min, max over the seeds together; new seeds for a cell of
  three seeds or more are refused (its values are not known);
  new runs whose seeds the csv's cell already holds with their values are skipped (a seed
  with another value is refused), so the extended table's csv and its runs record extend
  again with later runs;
- the new runs share one setting, but for V, steps and early stop (configs/mqar.py:mini: 2 L
  from L 256 on, and 3,600 steps with an early stop), which hold one value per length;
- an old cell keeps its numbers (its seed values for the ranking are its min and max, exact
  for two seeds; three-seed cells keep their mean and std, ranked by min and max as well).

  PYTHONPATH=. python scripts/mqar_extend_cells.py results/cpu/mqar_grid.csv \
      results/cpu/mqar_grid_runs.jsonl [workdirs/mqar_grid] --out=/tmp/mqar_grid

The old cells lack the majority label (not in the csv): the .md's majority row shows the
new runs' value only. Prints one line per new or combined cell.
"""
import argparse
import csv
import statistics

from lra import synthetic_report as sr
from lra.runs import record


def old_cells(path: str) -> list[dict]:
    out = []
    for row in csv.DictReader(open(path, encoding="utf-8")):
        seeds = [int(s) for s in row["seeds"].split()]
        mean, lo, hi = float(row["mean"]), float(row["min"]), float(row["max"])
        # Only the count and the range are used for the marks (lra.reporting.ranking.ties).
        accs = [mean] if len(seeds) == 1 else [lo, hi] if len(seeds) == 2 else [lo, mean, hi]
        out.append({
            "setting": (), "L": int(row["L"]), "kv": int(row["kv"]),
            "width": int(row["width"]), "model": row["model"], "seeds": seeds, "accs": accs,
            "mean": mean, "std": float(row["std"]), "min": lo, "max": hi,
            "params": int(row["params"]), "tunings": 1, "chosen": "", "majority": 0.0,
            # Written since 2026-11-29; the csv before holds configs/mqar.py:mini's V,
            # steps and no early stop in every cell.
            "vocab": int(row.get("vocab") or 256), "steps": int(row.get("steps") or 1200),
            "early_stop": float(row.get("early_stop") or 0.0),
            "state_bytes": int(row["state_bytes"]) if row["state_bytes"] else None,
            **{k: float(row[k]) for k in sr.TUNED if row.get(k)}})
    return out


def key(c: dict) -> tuple:
    return (c["L"], c["kv"], c["width"], c["model"])


def _combine(c: dict, n: dict, lines: list[str]) -> dict:
    """Old cell c with new cell n of the same coordinates: n's seeds that c already holds
    must carry one of c's known values (the same runs, read again); the others are added,
    which needs c's per-seed values (known for one or two seeds: its mean, or min and max)."""
    new_by_seed = dict(zip(n["seeds"], n["accs"]))
    for seed in set(new_by_seed) & set(c["seeds"]):
        v, tol = new_by_seed[seed], 0.006  # the csv has 2 decimals
        # Three seeds or more: only min and max are known, the others lie between.
        differs = (min(abs(v - a) for a in c["accs"]) > tol if len(c["seeds"]) <= 2
                   else not c["min"] - tol <= v <= c["max"] + tol)
        if differs:
            raise SystemExit(f"{key(c)}: seed {seed} is in the csv with another value "
                             f"({c['accs']}, new {v:.2f}); a rerun of a "
                             "seed cannot replace a csv cell: give it another seed")
    if set(c["seeds"]) <= set(new_by_seed):
        # Every seed of c read again from its runs: the runs' cell is exact (the csv has
        # 2 decimals, which rounded again made 99.947 show as 100.0) and has the majority.
        return n
    added = {s: a for s, a in new_by_seed.items() if s not in c["seeds"]}
    if not added:
        return c
    if len(c["seeds"]) > 2:
        raise SystemExit(f"{key(c)}: the csv holds seeds {c['seeds']} as mean, std, min and "
                         f"max only; new seeds {sorted(added)} cannot be added to them")
    accs = c["accs"] + list(added.values())
    lines.append(f"combined {key(c)}: seeds {c['seeds'] + list(added)} -> "
                 f"{[round(a, 2) for a in accs]}")
    return dict(c, seeds=sorted(c["seeds"] + list(added)), accs=accs,
                mean=statistics.fmean(accs), std=statistics.stdev(accs), min=min(accs),
                max=max(accs), majority=n["majority"])


# Fields that may differ between lengths, one value per length: configs/mqar.py:mini's V
# (256, then 2 L from L 256 on), steps and early stop (1,200 steps; 3,600 with Zoology's
# early stop from L 256); each cell keeps its own (shown per table, checked per length).
PER_LENGTH = ("task_options.vocab_size", "num_train_steps", "early_stop_accuracy")
PER_LENGTH_CELL = ("vocab", "steps", "early_stop")  # the cells' names for them


def check_lengths(cells: list[dict]) -> None:
    """One (V, steps, early stop) per length among the cells given, old and new alike."""
    seen: dict[int, tuple] = {}
    for c in cells:
        values = tuple(c[k] for k in PER_LENGTH_CELL)
        if seen.setdefault(c["L"], values) != values:
            raise SystemExit(f"L {c['L']}: cells with (V, steps, early stop) {seen[c['L']]} "
                             f"and {values} ({c['model']}); one setting per length")


def extend(old: list[dict], new: list[dict]) -> tuple[list[dict], list[str]]:
    fresh = {key(c): dict(c, setting=()) for c in new}
    if len({tuple(p for p in c["setting"] if p[0] not in PER_LENGTH) for c in new}) > 1:
        raise SystemExit("the new runs hold more than one setting; extend one at a time")
    check_lengths(old + new)
    merged, lines = [], []
    for c in old:
        n = fresh.pop(key(c), None)
        if n is not None:
            c = _combine(c, n, lines)
        merged.append(c)
    for k, n in fresh.items():
        merged.append(n)
        lines.append(f"new {k}: seeds {n['seeds']} -> {[round(a, 2) for a in n['accs']]}")
    merged.sort(key=key)
    return merged, lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old_csv")
    p.add_argument("sources", nargs="+", help="runs records (.jsonl) or run folders")
    p.add_argument("--out", required=True, help="output path without suffix")
    a = p.parse_args()
    runs, skipped = record.load_sources(a.sources)
    for line in skipped:
        print(line)
    merged, lines = extend(old_cells(a.old_csv), sr.cells(record.dedupe(runs)))
    sr.write_csv(merged, a.out + ".csv")
    sr.plot(merged, a.out + ".png")
    with open(a.out + ".md", "w", encoding="utf-8") as f:
        f.write(sr.markdown(merged, f"{a.old_csv} + {', '.join(a.sources)}"))
    print("\n".join(lines))
    print(f"wrote {a.out}.csv, .png, .md")


if __name__ == "__main__":
    main()

"""How the report tables order and rank their rows: ORDER (the grid's rows, then the 2025
ones), `ordered` (each model followed by its hybrids) and `ties` (who is tied with a
column's best by the seeds' ranges, who is below it). One rule for lra.synthetic_report's
MQAR table, lra.reporting.mad_table's MAD table and lra.length_report's lines; and
`seeds_note`, which names each seed's score where they split."""
from __future__ import annotations

# Rows in this order (the grid's: attention, then the fixed-state families), others after.
ORDER = ("transformer", "local", "linear", "performer", "s4d", "s5", "lru", "mega", "retnet",
         "gla", "deltanet", "gated_deltanet", "mamba2",
         # the 2025 rows (issue 71), Zoology's two
         "fox", "moba", "path", "kda", "gated_deltaproduct", "based", "hyena",
         "rwkv7", "nsa", "loglinear_mamba2")


def ties(column: list[dict]) -> dict[str, str]:
    """Per model of one (L, kv, width) column: among the models with two seeds or more
    and the setting's scaffold (no undeclared card difference, `unranked`), '=' tied with
    the best (by mean), '<' below it (its best seed under the best model's worst); the
    others are not ranked ('')."""
    ranked = [c for c in column if len(c["accs"]) > 1 and not c.get("unranked")]
    marks = {c["model"]: "" for c in column}
    if len(ranked) < 2:
        return marks
    best = max(ranked, key=lambda c: c["mean"])
    marks.update({c["model"]: "=" if c["max"] >= best["min"] else "<" for c in ranked})
    return marks


def ordered(models: set[str]) -> list[str]:
    """ORDER's models, each followed by its hybrids (`gla+transformer@1`, configs/hybrid.py),
    then the others by name."""
    def key(name):
        base = name.split("+")[0].split(" ")[0]
        return (ORDER.index(base) if base in ORDER else len(ORDER), base, "+" in name, name)
    return sorted(models, key=key)


# Seeds further apart than this (points of accuracy) split a cell: a mean and a standard
# deviation hide that some seeds learn the task and others do not (MQAR's delta rules at
# L 128: 99.7, 13.2, 99.5 read as 70.8 ± 49.9).
SPLIT_POINTS = 20.0


def seeds_note(values: list[float], digits: int = 1) -> str:
    """'(n)', or where the seeds span more than SPLIT_POINTS, '(n: a, b, c)': each seed's
    value in seed order."""
    return f"({len(values)}{split_values(values, digits)})"


def split_values(values: list[float], digits: int = 1) -> str:
    """': a, b, c' (each seed's value, in seed order) where the seeds span more than
    SPLIT_POINTS, else ''."""
    if len(values) < 2 or max(values) - min(values) <= SPLIT_POINTS:
        return ""
    return ": " + ", ".join(f"{v:.{digits}f}" for v in values)

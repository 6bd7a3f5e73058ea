"""The scaffold cards of a report's rows (lra/runs/card.py; issue 68): per task, each row's
positions, shared and own short convolutions, heads, capacity, parameters and flops per
token, and the rows whose scaffold differs from the task's most common one in a field
(LRA's task configs declare no scaffold: each variant brings its paper's positions and
convolutions, which this table makes visible beside the accuracies)."""
from __future__ import annotations

import collections
import json

from lra.runs import card as card_lib


def _capacity(card: dict) -> str:
    cap = card.get("capacity") or {}
    cap = cap[0] if isinstance(cap, list) and cap else cap
    return ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in cap.items()) or "-"


def card_tables(summary: dict) -> list[str]:
    """Markdown lines: per task, `| model | scaffold | capacity | params | MFLOP/token |`
    for the rows whose runs record a card, then the rows that differ from the task's most
    common card, by field; [] when no run records one."""
    by_task: dict[str, list[tuple[str, dict]]] = collections.defaultdict(list)
    for (task, label), s in sorted(summary.items()):
        cards = [r.get("scaffold_card") for r in s.get("runs", []) if r.get("scaffold_card")]
        if cards:
            by_task[task].append((label, cards[0]))
    lines: list[str] = []
    for task, rows in by_task.items():
        votes = {f: collections.Counter(json.dumps(card_lib.base_value(c, f)) for _, c in rows)
                 for f in card_lib.COMPARED}
        reference = {f: json.loads(v.most_common(1)[0][0]) for f, v in votes.items()}
        lines += [f"### Scaffold cards: {task} (measured on each row's model)", "",
                  "| row | scaffold | capacity | params | MFLOP/token |", "|---|---|---|---|---|"]
        differing = []
        for label, c in rows:
            flops = c.get("flops_per_token")
            lines.append(f"| {label} | {c.get('scaffold', 'own')}: {card_lib.describe(c)} | "
                         f"{_capacity(c)} | {c.get('params', 0):,} | "
                         + (f"{flops / 1e6:.2f}" if flops else "-") + " |")
            fields = card_lib.differences(c, reference)
            if fields:
                differing.append(f"{label} (" + ", ".join(
                    card_lib.note(f, card_lib.base_value(c, f)) for f in fields) + ")")
        lines.append("")
        if differing:
            lines += ["Rows whose scaffold differs from the task's most common one (their "
                      "accuracies compare more than the mixer): " + "; ".join(differing)
                      + ".", ""]
    return lines

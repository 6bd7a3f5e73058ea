"""Runs records: the `_runs.jsonl` files committed beside a report's tables (lra.
synthetic_report, lra.length_report), one run's results.json a line without its training
history, and `run_dir`, its folder. A later machine regenerates or extends the tables from
them: run folders (checkpoints) are not committed and do not outlive the machine.
`load_sources` reads directories of runs and records alike; `dedupe` keeps one record per
run (the later source's); `write_runs` writes one; `compute_line` says what a table's runs
cost."""
from __future__ import annotations

import json
import os
import re

from lra.runs import results as results_lib

# Config fields that do not make a run what it is (where it ran, how often it logged).
NOT_COMPARED = (*results_lib.NON_RESULT_FIELDS, "workdir", "data_dir")
RUNS_SUFFIX = "_runs.jsonl"
# Left out of the runs record: the per-step training history (the bulk of a results.json);
# the evaluations' history stays (best steps are read from it).
_NOT_RECORDED = ("train_history",)


def load_sources(sources: list[str]) -> tuple[list[dict], list[str]]:
    """(the usable runs of every source in order, one line per skipped record): a directory
    is searched for results.json files (lra.runs.results.load), a `.jsonl` file holds one
    run per line (a runs record written by `report`)."""
    runs, skipped = [], []
    for source in sources:
        if not source.endswith(".jsonl"):
            if not os.path.isdir(source):
                raise FileNotFoundError(f"{source}: neither a directory nor a .jsonl file")
            found, bad = results_lib.load(source)
            for r in found:  # a sweep's run: the overrides it was given (sweep.json)
                r.setdefault("overrides", _sweep_overrides(r["_path"]))
            runs += found
            skipped += bad
            continue
        with open(source, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{source}:{number}"
                try:
                    r = json.loads(line)
                except ValueError as e:
                    skipped.append(f"{where}: not valid JSON ({e}); skipped")
                    continue
                problem = results_lib.unusable_reason(r)
                if problem:
                    skipped.append(f"{where}: {problem}; skipped")
                    continue
                r["_path"] = r.get("run_dir") or where
                runs.append(r)
    _recover_overrides(runs)
    return runs, skipped


_HASHED = re.compile(r"seed-?\d+-([0-9a-f]{8})(?:-pretrain(?:ed)?)?$")


def _recover_overrides(runs: list[dict]) -> None:
    """A record written before runs records kept `overrides` has none; its folder's name
    (`seed<s>-<hash>`, lra.runs.plan.overrides_hash) still names them: where another run
    holds overrides of that hash (another seed of the same sweep), they are its too, so
    both name their row alike (_override_notes)."""
    from lra.runs import plan

    by_hash = {}
    for r in runs:
        m = _HASHED.search(os.path.normpath(r.get("run_dir") or r.get("_path") or ""))
        if m and r.get("overrides") and plan.overrides_hash(r["overrides"]) == m.group(1):
            by_hash[m.group(1)] = list(r["overrides"])
    for r in runs:
        if "overrides" in r:
            continue
        m = _HASHED.search(os.path.normpath(r.get("run_dir") or r.get("_path") or ""))
        if m and m.group(1) in by_hash:
            r["overrides"] = by_hash[m.group(1)]


def _sweep_overrides(run_dir: str) -> list[str]:
    try:
        with open(os.path.join(run_dir, "sweep.json"), encoding="utf-8") as f:
            return list(json.load(f).get("overrides") or [])
    except (OSError, ValueError):
        return []


def _run_key(r: dict) -> str:
    """What makes two records the same run: task, model and every config field the
    results compare (a run's folder is not: it moves between machines)."""
    flat = results_lib.flatten(r.get("config") or {})
    return repr((r.get("task"), r.get("model"), sorted(
        (k, repr(v)) for k, v in flat.items() if not k.startswith(NOT_COMPARED))))


def dedupe(runs: list[dict]) -> list[dict]:
    """One record per run, the last read (a later source's) where several are the same."""
    latest = {_run_key(r): r for r in runs}
    return list(latest.values())


def write_runs(runs: list[dict], path: str) -> None:
    """The runs record: one JSON line per run (see the module's docstring)."""
    with open(path, "w", encoding="utf-8") as f:
        for r in sorted(runs, key=lambda r: (r.get("task", ""), r.get("model", ""),
                                             _run_key(r))):
            line = {k: v for k, v in r.items()
                    if not k.startswith("_") and k not in _NOT_RECORDED}
            line["run_dir"] = r.get("run_dir") or r.get("_path")
            f.write(json.dumps(line, sort_keys=True) + "\n")


def duration(seconds: float) -> str:
    """'25 min' under an hour and a half, else '2.3 h' (the status line's and tables')."""
    if seconds < 90 * 60:
        return f"{max(1, round(seconds / 60))} min"
    return f"{seconds / 3600:.1f} h"


def resumed_unrecorded(seconds: dict) -> bool:
    """A run_seconds whose wall misses segments: resumed from a checkpoint older than the
    field (from_step), or training above the wall (train sums every segment's timed steps,
    so it exceeds the wall only where segments are missing: the records written before
    from_step existed)."""
    wall, train = seconds.get("wall"), seconds.get("train")
    return bool(seconds.get("from_step")) or (
        isinstance(wall, (int, float)) and isinstance(train, (int, float)) and train > wall)


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def jax_versions(runs: list[dict]) -> str:
    """The JAX versions the runs were made with (results.json jax_version), oldest first:
    '0.10.2', or '0.10.2 (20 runs), 0.12.1 (3 runs)' where a table mixes versions (a claim
    holds for the versions it was run on); '' where no run records one."""
    counts: dict[str, int] = {}
    for r in runs:
        if r.get("jax_version"):
            counts[str(r["jax_version"])] = counts.get(str(r["jax_version"]), 0) + 1
    if len(counts) <= 1:
        return "".join(counts)
    return ", ".join(f"{v} ({n} run{'s' if n != 1 else ''})"
                     for v, n in sorted(counts.items(), key=lambda kv: _version_key(kv[0])))


def compute_line(runs: list[dict]) -> str:
    """What the runs of a table cost, for its reader: the wall time the runs record
    (results.json run_seconds: training, validation, test, and the rest: set-up,
    compilation, checkpoint saves; over every segment), and for runs from before that
    field existed their training alone (their steps at their train_steps_per_sec)."""
    timed, untimed = [], []
    for r in runs:
        wall = (r.get("run_seconds") or {}).get("wall")
        (timed if isinstance(wall, (int, float)) else untimed).append(r)
    parts = []
    if timed:
        total = {k: sum(float((r["run_seconds"].get(k) or 0.0)) for r in timed)
                 for k in ("wall", "train", "evaluation", "test")}
        partial = sum(1 for r in timed if resumed_unrecorded(r["run_seconds"]))
        parts.append(f"{duration(total['wall'])} of wall time over {len(timed)} run"
                     f"{'s' if len(timed) != 1 else ''} ({duration(total['train'])} training, "
                     f"{duration(total['evaluation'])} validation, {duration(total['test'])} "
                     "testing, the rest set-up, compilation and checkpoints"
                     + (f"; {partial} of them counted from the step they resumed at, their "
                        "earlier segments unrecorded" if partial else "") + ")")
    if untimed:
        train = [(r.get("stopped_at_step") or r["steps"]) / r["train_steps_per_sec"]
                 for r in untimed if isinstance(r.get("train_steps_per_sec"), (int, float))
                 and r["train_steps_per_sec"] > 0 and r.get("steps")]
        parts.append(f"{len(untimed)} run{'s' if len(untimed) != 1 else ''} recorded before "
                     "run_seconds existed"
                     + (f", whose training alone took {duration(sum(train))} at their "
                        "recorded steps/s" if train else ""))
    kinds = sorted({str(r["device_kind"]) for r in runs if r.get("device_kind")})
    what = [f"devices: {', '.join(kinds)}"] if kinds else []
    if versions := jax_versions(runs):
        what.append(f"JAX {versions}")
    where = f" ({'; '.join(what)})" if what else ""
    return f"Compute{where}: " + "; ".join(parts) + "." if parts else ""


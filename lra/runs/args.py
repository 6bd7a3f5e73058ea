"""lra.sweep's command-line values as its runs take them, and the report it names: --task
(TASKS, parse_tasks), --seeds (parse_seeds), --override with --grid (grid_overrides), and
the report command a finished sweep prints (report_command; tests_lengths: whether a
task's runs are tested at other lengths)."""
from __future__ import annotations

import os

from lra.runs import cli, plan


# LRA's Table 1, in its order (lra.report.TASK_ORDER): what --task=all runs.
TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")


def parse_tasks(value: str) -> list[str]:
    """--task as a list of task names: 'all' is TASKS; a ValueError (one line) names an
    entry that has no configs/<task>.py."""
    names = [t.strip() for t in value.split(",") if t.strip()]
    if names == ["all"]:
        return list(TASKS)
    known = cli.task_names()
    if not names:
        raise ValueError(f"--task is empty; give one of {', '.join(known)}, a comma list, "
                         "or all")
    for name in names:
        if name == "all":
            raise ValueError(f"--task={value}: `all` is all the tasks, not one of a list")
        if name not in known:
            raise ValueError(f"no task config configs/{name}.py; --task is one of "
                             f"{', '.join(known)}, a comma list of them, or all")
    return list(dict.fromkeys(names))


def grid_overrides(overrides: list[str], grid: list[str]) -> list[list[str]]:
    """The --override list once per point of the --grid product (in the order given, the
    last field varying fastest); [overrides] without a grid. ValueError (one line) for a
    grid entry that is not field=v1,..., a field given twice, or one --override sets."""
    fields: list[tuple[str, list[str]]] = []
    for entry in grid:
        field, eq, values = entry.partition("=")
        field = field.strip()
        choices = [v.strip() for v in values.split(",")]
        if not eq or not field or not all(choices):
            raise ValueError(f"--grid={entry!r} is not field=v1,v2,... (e.g. "
                             "--grid=learning_rate=1e-3,3e-3)")
        if field in {f for f, _ in fields}:
            raise ValueError(f"--grid: {field} is given twice; give its values in one --grid")
        if field in {o.partition("=")[0].strip() for o in overrides}:
            raise ValueError(f"--grid={field}=... and --override={field}=...: give one")
        fields.append((field, list(dict.fromkeys(choices))))
    points = [list(overrides)]
    for field, choices in fields:
        points = [[*p, f"{field}={v}"] for p in points for v in choices]
    return points


def parse_seeds(values: list[str]) -> list[int]:
    """--seeds as integers; a ValueError names the bad entry."""
    if not values:
        raise ValueError("--seeds is empty; give a comma list of integers, e.g. --seeds=0,1")
    seeds = []
    for v in values:
        try:
            seeds.append(int(v))
        except ValueError:
            raise ValueError(f"--seeds: {v!r} is not an integer; give a comma list of "
                             "integers, e.g. --seeds=0,1") from None
    return seeds


def tests_lengths(task: str, model: str, seed: int, config_arg: str,
                   overrides: list[str]) -> bool:
    """Whether the task's runs, as this sweep configures them, are tested at other lengths,
    depths or splits (config.eval_lengths, eval_depth_buckets, eval_splits): what
    lra.length_report tabulates."""
    config = plan.expected_config(task, model, seed, config_arg, overrides)
    return bool(config.get("eval_lengths") or config.get("eval_depth_buckets")
                or config.get("eval_splits"))


def report_command(tasks: list[str], finished_in: list[str], sweep_dir: str,
                   tested_at_lengths: list[str] = ()) -> str:
    """The command that tabulates a sweep: Zoology's and MAD's tables for MQAR and MAD,
    accuracy (or bits per byte) against length when every task is tested at other lengths
    (`tested_at_lengths`; into the first record's own files, which it regenerates, else
    beside the runs), LRA's table for the rest."""
    sources = " ".join([*finished_in, sweep_dir])
    if all(t in ("mqar", "mad") for t in tasks):
        return f"python -m lra.synthetic_report {sources}"
    if all(t in tested_at_lengths for t in tasks):
        record = finished_in[0] if finished_in else ""
        out = (record[:-len("_runs.jsonl")] if record.endswith("_runs.jsonl")
               else os.path.join(sweep_dir, tasks[0]))
        return f"python -m lra.length_report {sources} --out={out}"
    return f"python -m lra.report {sources}"

"""`python -m lra.sweep ... --status`: where each run of a sweep stands, read from its
workdir without running or writing anything, and the training time left.

A run is one of:
  finished     results.json holds the config this sweep would run (its test accuracy,
               steps and training steps/s are shown), or a --finished_in runs record
               does (the file is named);
  refused      results.json holds another config (the sweep would refuse it: the fields);
  running      its run.lock is held by a live process (the step and steps/s it logged
               last);
  stopped      a checkpoint but no live owner and no results: the same command resumes it;
  failed       the last attempt failed (error.txt: its line); the next sweep retries it;
  not started  nothing in its workdir yet.

The time left: each unfinished run's steps left (num_train_steps less its last complete
checkpoint) at its own last logged steps/s, else at the mean steps/s of its model's
finished runs in this listing, else of the finished runs in its model's folder (other
seeds and overrides of the same sweep directory) and those of the same task (as the
config resolves it: MAD's compression is mad_compression) and model in the --finished_in
records, else of its model's logged runs. Only runs of its size time it (SIZE_FIELDS:
length, batch, widths, layers, heads, the model's hyperparameters): an MQAR step at L 256,
width 128 takes several times one at L 128, width 64. A run with none of these has no
estimate and is counted apart. To the training, the rest of a run's wall time as the
same finished runs recorded it (results.json's run_seconds, lra/train.py): validation per
step left, the test (the other lengths included), and the rest (set-up, compilation,
checkpoint saves) for a run not running now; where no finished run of the model records
it (runs before 2026-12-06), its runs count training only, and the line says so. Runs that
stop early (an early-stop accuracy) end sooner: an estimate, not a promise.
Of a model's finished runs, those made under the JAX version and malloc pages its runs will
get now (results.json jax_version and host_malloc: huge pages made CPU steps 1.3-1.7x
faster) time it where there are any; runs of other versions or pages otherwise.
"""
from __future__ import annotations

import json
import os
import re
from importlib import metadata

from lra.runs import cli, plan
from lra.runs.record import duration as _duration
from lra.runs.record import resumed_unrecorded
from lra.runs.results import last_complete_step

STATES = ("finished", "refused", "running", "stopped", "failed", "not started")
_PROGRESS = re.compile(r"^step\s+(\d+)/\d+ .*\|\s*([0-9.]+) steps/s", re.M)


def _logged(workdir: str) -> tuple[int | None, float | None]:
    """The step and steps/s of the last progress line in <workdir>/log.txt."""
    try:
        with open(os.path.join(workdir, "log.txt"), "rb") as f:
            f.seek(max(0, os.path.getsize(f.name) - 65536))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None, None
    lines = _PROGRESS.findall(tail)
    if not lines:
        return None, None
    step, rate = int(lines[-1][0]), float(lines[-1][1])
    return step, (rate if rate > 0 else None)


def _owner(workdir: str) -> dict | None:
    """The live process holding the workdir's run.lock, or None."""
    if not os.path.exists(os.path.join(workdir, "run.lock")):
        return None
    from lra.training import checkpoint  # orbax: only when a lock is there

    return checkpoint.WorkdirLock(workdir).live_owner()


def current_environment() -> tuple[str | None, str | None]:
    """The JAX version and malloc pages a run started now gets (lra.sweep starts every run
    with `cli.with_huge_pages`), as results.json records them."""
    try:
        version = metadata.version("jax")
    except metadata.PackageNotFoundError:
        version = None
    return version, cli.malloc_pages(cli.with_huge_pages(dict(os.environ)))


def _current(r: dict, now: tuple) -> bool:
    return (r.get("jax_version"), r.get("host_malloc")) == now


def _rate(r: dict) -> float | None:
    rate = r.get("train_steps_per_sec")
    return float(rate) if isinstance(rate, (int, float)) and rate > 0 else None


def _overhead(r: dict) -> dict | None:
    """A finished run's wall time besides its timed steps (run_seconds): validation per
    step trained, the test, and the rest (set-up, compilation); None where not recorded."""
    seconds = r.get("run_seconds") or {}
    parts = [seconds.get(k) for k in ("wall", "train", "evaluation", "test")]
    steps = r.get("stopped_at_step") or r.get("steps")
    if not steps or any(not isinstance(v, (int, float)) for v in parts) \
            or resumed_unrecorded(seconds):  # some segments unrecorded: not a whole run's
        return None
    wall, train, evaluation, test = parts
    return {"per_step": evaluation / steps, "test": test,
            "setup": max(0.0, wall - train - evaluation - test)}


# The config fields (and field prefixes) that set a training step's cost, besides the
# model: not the seed, the learning rate or the step count.
SIZE_FIELDS = ("max_length", "batch_size", "emb_dim", "qkv_dim", "mlp_dim", "num_layers",
               "num_heads", "model_hparams", "block", "hybrid", "dtype", "param_dtype",
               "task_options.vocab_size")


def _same_size(r: dict, expected: dict) -> bool:
    """Whether a finished run's config has the step cost of `expected`'s: no difference in
    SIZE_FIELDS (as plan.config_differences compares configs: a field added to the code
    since the run is not a difference)."""
    config = r.get("config")
    if not isinstance(config, dict):
        return False
    fields = [d.split(":")[0] for d in plan.config_differences(config, expected)]
    return not any(k == f or k.startswith(f + ".") for k in fields for f in SIZE_FIELDS)


def _folder_runs(workdir: str) -> list[dict]:
    """The finished runs' results beside this one (its model's folder)."""
    folder, runs = os.path.dirname(os.path.abspath(workdir)), []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        try:
            with open(os.path.join(folder, name, "results.json")) as f:
                runs.append(json.load(f))
        except (OSError, ValueError):
            continue
    return runs


def _finished(info: dict, r: dict, where: str = "") -> dict:
    rate = _rate(r)
    what = (f"test {100 * r['test_accuracy']:.2f}%" if r.get("test_accuracy") is not None
            else "tested")
    wall = (r.get("run_seconds") or {}).get("wall")
    took = f", {_duration(wall)} in all" if isinstance(wall, (int, float)) else ""
    return {**info, "state": "finished", "finished_rate": rate,
            "finished_overhead": _overhead(r),
            "finished_current": _current(r, current_environment()),
            "line": f"finished{where}: {what}, {r.get('steps', '?')} steps"
                    + (f" at {rate:.2f} steps/s" if rate else "") + took}


def inspect(*, workdir: str, task: str, model: str, seed: int, config_arg: str,
            overrides: list[str], finished_in: list | None = None) -> dict:
    """{'state', 'line' (what to print), 'model', 'steps_left', 'rate' (steps/s or None),
    'finished_rate' (a finished run's training steps/s), 'finished_overhead' (its other
    wall time, _overhead), 'folder_rates' and 'folder_overheads' (those of the finished
    runs in its model's folder and the records)} for one run of the sweep."""
    info = {"model": model, "steps_left": 0, "rate": None, "finished_rate": None,
            "finished_overhead": None, "folder_rates": [], "folder_overheads": [],
            "other_sizes": 0}
    results = os.path.join(workdir, "results.json")
    if os.path.exists(results):
        differences = plan.finished_differences(results, task, model, seed, config_arg,
                                                overrides)
        if differences:
            return {**info, "state": "refused", "line": "refused: a finished run of another "
                    f"config is there ({'; '.join(differences)})"}
        with open(results) as f:
            return _finished(info, json.load(f))
    found = finished_in and plan.recorded_run(finished_in, task, model, seed, config_arg,
                                              overrides)
    if found:
        return _finished(info, found[1], f" (recorded in {found[0]})")
    expected = plan.expected_config(task, model, seed, config_arg, overrides)
    total = int(expected["num_train_steps"])
    step = last_complete_step(workdir) or 0
    logged_step, rate = _logged(workdir)
    # Beside its model's finished runs here, those the records hold (other seeds and
    # overrides finished on other machines) time it too.
    # (A record names the task its config resolved to: `mad` with task=compression is
    # mad_compression.)
    # (A hybrid's record names it gla+transformer@1; its config's model is gla.)
    beside = _folder_runs(workdir) + [r for _, r in finished_in or ()
                                      if r.get("task") in (task, expected.get("task"))
                                      and model in (r.get("model"),
                                                    (r.get("config") or {}).get("model"))]
    # Only runs of this size time it (SIZE_FIELDS): another length or width is another
    # step time.
    same = [r for r in beside if _same_size(r, expected)]
    now = current_environment()
    same = [r for r in same if _current(r, now)] or same  # this JAX and malloc's first
    info.update(steps_left=max(0, total - step), rate=rate,
                folder_rates=[x for x in map(_rate, same) if x],
                folder_overheads=[x for x in map(_overhead, same) if x],
                other_sizes=len(beside) - len(same))
    at = f"step {step:,} of {total:,} saved" if step else f"no checkpoint yet of {total:,} steps"
    speed = f", {rate:.2f} steps/s" if rate else ""
    owner = _owner(workdir) if os.path.isdir(workdir) else None
    if owner is not None:  # it goes on from the step it logged last, not the saved one
        now = max(step, logged_step or 0)
        info["steps_left"] = max(0, total - now)
        return {**info, "state": "running",
                "line": f"running (pid {owner.get('pid')} on {owner.get('host')} since "
                        f"{owner.get('started')}; at step {now:,} of {total:,}{speed})"}
    error = os.path.join(workdir, "error.txt")
    if os.path.exists(error):
        with open(error) as f:
            first = f.readline().strip()
        return {**info, "state": "failed",
                "line": f"failed: {first} ({at}; the next sweep retries it)"}
    if step:
        return {**info, "state": "stopped",
                "line": f"stopped at {at}{speed}; the same command resumes it"}
    return {**info, "state": "not started", "line": "not started"}


def _by_model_current_first(infos: list[dict], key: str) -> dict[str, list[dict]]:
    """The finished runs with `key` set, by model: of each model's, those made under this
    JAX and malloc (finished_current) where there are any, else all."""
    runs: dict[str, list[dict]] = {}
    for i in infos:
        if i[key]:
            runs.setdefault(i["model"], []).append(i)
    return {m: [i for i in rs if i.get("finished_current")] or rs for m, rs in runs.items()}


def summary(infos: list[dict]) -> str:
    """The counts per state and the time left (module docstring)."""
    counts = [f"{sum(i['state'] == s for i in infos)} {s}" for s in STATES
              if any(i["state"] == s for i in infos)]
    by_model: dict[str, list[float]] = {}
    for m, runs in _by_model_current_first(infos, "finished_rate").items():
        by_model[m] = [i["finished_rate"] for i in runs]
    for i in infos:  # a model with no finished run here: those beside its runs
        if i["model"] not in by_model and i["folder_rates"]:
            by_model[i["model"]] = list(i["folder_rates"])
    for i in infos:  # none either: its runs' logged steps/s
        if i["rate"] and not any(j["finished_rate"] or j["folder_rates"] for j in infos
                                 if j["model"] == i["model"]):
            by_model.setdefault(i["model"], []).append(i["rate"])
    overheads: dict[str, list[dict]] = {}  # the same order of sources as the rates
    for m, runs in _by_model_current_first(infos, "finished_overhead").items():
        overheads[m] = [i["finished_overhead"] for i in runs]
    for i in infos:
        if i["model"] not in overheads and i["folder_overheads"]:
            overheads[i["model"]] = list(i["folder_overheads"])
    seconds, unknown, training_only, timed = 0.0, [], [], 0
    for i in infos:
        if i["state"] in ("finished", "refused") or not i["steps_left"]:
            continue
        rate = i["rate"] or (sum(by_model[i["model"]]) / len(by_model[i["model"]])
                             if i["model"] in by_model else None)
        if not rate:
            unknown.append(i["model"])
            continue
        seconds += i["steps_left"] / rate
        known = overheads.get(i["model"])
        if not known:
            training_only.append(i["model"])
            continue
        mean = {k: sum(o[k] for o in known) / len(known) for k in known[0]}
        seconds += (i["steps_left"] * mean["per_step"] + mean["test"]
                    + (0.0 if i["state"] == "running" else mean["setup"]))
        timed += 1
    line = f"{len(infos)} run{'s' if len(infos) != 1 else ''}: {', '.join(counts)}"
    untimed = ", ".join(dict.fromkeys(unknown))
    if any(i["other_sizes"] for i in infos if i["model"] in unknown):
        untimed += " at this size; runs of other sizes do not time it"
    if any(i["steps_left"] for i in infos) and not seconds:
        line += f"; time left: no estimate yet (no finished or logged run of {untimed})"
    elif any(i["steps_left"] for i in infos):
        line += (f"; time left: about {_duration(seconds)}, one run at a time, at the "
                 "logged and finished runs' steps/s"
                 + (", with their validation, test and set-up" if timed else "")
                 + " (early stopping ends runs sooner)")
        if training_only:
            names = ", ".join(dict.fromkeys(training_only))
            line += (f"; {len(training_only)} run{'s' if len(training_only) != 1 else ''} "
                     f"counted for training only (no finished run of {names} records "
                     "run_seconds)")
        if unknown:
            line += (f"; {len(unknown)} run{'s' if len(unknown) != 1 else ''} without an "
                     f"estimate (no finished or logged run of {untimed})")
    return line

"""The GPU suite's time-boxed ListOps stages (lra.gpu_suite plans them a call at a time):
transformer's full-size run, then the other variants' (Plan.run_models), each trained
until its deadline and tested where it stopped, in the folders lra.sweep would use
(lra.runs.plan), so that `python -m lra.report` reads them. The measuring stages are
lra/gpu/bench_stages.py's. Each stage is a function (suite, limit in seconds) ->
StageResult that ends within its limit."""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time

from lra.gpu.common import (DRY, FULL, GRACE_S, REPO, RUN_GRACE_S, StageResult, Suite, _log,
                            _size, _stop_group, display, rel)
from lra.reporting.protocol import PUBLISHED_PATH
from lra.runs.results import last_complete_step


# --- transformer, runs: full-size ListOps runs, time-boxed ------------------------------
#
# A lent GPU gives minutes, LRA's ListOps run is 5000 steps: each run here trains for the
# time its stage gives it and is then tested where it stopped. The run is launch.py in
# <out>/runs/listops/<model>/seed0 (lra.sweep's folder for it, so `lra.report` reads it);
# at its training deadline it gets SIGTERM, on which launch.py saves a checkpoint at the
# next step; a second launch.py in the same folder with --config.num_train_steps=<that
# step> resumes there, trains no step, and tests the best-on-validation weights: its
# results.json says `steps` (done) and the tables set them beside the config's (LRA's
# 5000). The learning-rate schedule (LRA's rsqrt decay) does not depend on
# num_train_steps, so these are the first steps of the 5000-step run, and running the
# stage again where the checkpoints are (--force) trains on from them.


def listops_dir(suite: Suite) -> str:
    """The ListOps folder the runs read: the config's data_dir (data/listops for the full
    runs), or, for the dry run, a tiny set of the suite's own under --out."""
    if suite.plan is DRY:
        return os.path.join(suite.out, "data", "listops")
    from lra.runs import plan as run_plan

    config = run_plan.expected_config("listops", "transformer", 0,
                                      suite.plan.run_config_arg, list(suite.plan.run_overrides))
    path = str(config["data_dir"])
    return path if os.path.isabs(path) else os.path.join(REPO, path)


def run_overrides(suite: Suite) -> list[str]:
    extra = [f"data_dir={suite.data_dir}"] if suite.plan is DRY else []
    return [*suite.plan.run_overrides, *extra]


def transformer_overrides(suite: Suite) -> list[str]:
    return [*run_overrides(suite), *suite.plan.transformer_overrides]


def start_listops_generator(suite: Suite) -> None:
    """Generates the runs' ListOps set in the background if it is missing (two minutes
    on one core for LRA's 96k expressions, while the first stages use the device), into
    <folder>.partial, renamed when complete: a stopped generator never leaves a folder
    that looks like data."""
    suite.data_dir = listops_dir(suite)
    if os.path.isfile(os.path.join(suite.data_dir, "basic_train.tsv")):
        return
    partial = suite.data_dir + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(os.path.dirname(partial), exist_ok=True)
    os.makedirs(suite.logs, exist_ok=True)
    cmd = [sys.executable, "-m", "lra.tasks.listops", f"--output_dir={partial}",
           *suite.plan.listops_args]
    _log(f"ListOps data missing in {suite.data_dir}: generating in the background: "
         f"{display(cmd)}")
    with open(os.path.join(suite.logs, "listops_data.log"), "ab") as log:
        suite.generator = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=log,
                                           start_new_session=True)


def wait_for_listops(suite: Suite, limit: float, model: str,
                     overrides: list[str]) -> str | None:
    """None once the ListOps set is in place; else why the runs cannot start."""
    if suite.generator is not None:
        try:
            code = suite.generator.wait(timeout=max(limit, 1))
        except subprocess.TimeoutExpired:
            return (f"the ListOps set was still being generated at the stage's limit "
                    f"({os.path.join(suite.logs, 'listops_data.log')}); run again")
        suite.generator = None
        if code:
            return (f"generating the ListOps set failed (exit {code}, see "
                    f"{os.path.join(suite.logs, 'listops_data.log')})")
        os.replace(suite.data_dir + ".partial", suite.data_dir)
        _log(f"ListOps data generated -> {suite.data_dir}")
    from lra.runs import plan as run_plan

    config = run_plan.expected_config("listops", model, 0, suite.plan.run_config_arg, overrides)
    return run_plan.missing_data("listops", config)


@dataclasses.dataclass
class RunReport:
    """What one time-boxed run did: `state` (one line for the tables), its commands, and
    whether it ended with a tested result (`tested`) or failed (`failed`)."""
    state: str
    commands: list[str]
    tested: bool = False
    failed: bool = False


def _training_started(log_path: str, offset: int) -> bool:
    with open(log_path, "rb") as f:
        f.seek(offset)
        return re.search(rb"^Training ", f.read(), re.M) is not None


def launch(cmd: list[str], workdir: str, *, deadline: float, max_train_s: float = 0,
           grace: float = RUN_GRACE_S, xla_flags: str = "") -> tuple[int | None, float | None]:
    """Runs one launch.py (stdout appended to <workdir>/log.txt, stderr to stderr.txt, as
    lra.sweep does) until it ends, or until `deadline` (time.monotonic()) or `max_train_s`
    seconds after its training began (its `Training ...` line), whichever is first: then
    SIGTERM to its process group (launch.py saves a checkpoint) and SIGKILL `grace`
    seconds later. Returns (exit code, None when stopped; seconds from the `Training` line to the
    end, None when it never printed it)."""
    os.makedirs(workdir, exist_ok=True)
    log_path = os.path.join(workdir, "log.txt")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if xla_flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {xla_flags}".strip()
    with open(log_path, "ab") as out, open(os.path.join(workdir, "stderr.txt"), "ab") as err:
        stamp = datetime.datetime.now().isoformat(timespec="seconds")
        err.write(f"==== {stamp}: {display(cmd)}\n".encode())
        err.flush()
        offset = out.tell()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=err, env=env,
                                start_new_session=True)
        trained_from, returncode = None, None
        try:
            while True:
                returncode = proc.poll()
                now = time.monotonic()
                if returncode is not None:
                    break
                if trained_from is None and _training_started(log_path, offset):
                    trained_from = now
                stop_at = deadline
                if max_train_s and trained_from is not None:
                    stop_at = min(stop_at, trained_from + max_train_s)
                if now >= stop_at:
                    _stop_group(proc, grace)
                    returncode = None
                    break
                time.sleep(0.25)
        except BaseException:  # Ctrl-C or SIGTERM to the suite: leave nothing running
            _stop_group(proc, grace)
            raise
    if trained_from is None and _training_started(log_path, offset):
        trained_from = now
    return returncode, (None if trained_from is None else time.monotonic() - trained_from)


def _error_line(workdir: str) -> str:
    path = os.path.join(workdir, "stderr.txt")
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read().rsplit("==== ", 1)[-1]
    # JAX's note about the frames it filtered follows the exception: not the reason.
    lines = [l.strip() for l in text.splitlines()[1:] if l.strip()
             and not l.startswith("For simplicity, JAX has removed") and set(l.strip()) != {"-"}]
    return lines[-1][:300] if lines else "no error output"


def planned_steps(suite: Suite, model: str, overrides: list[str]) -> int:
    from lra.runs import plan as run_plan

    return int(run_plan.expected_config("listops", model, 0, suite.plan.run_config_arg,
                                        overrides)["num_train_steps"])


def timed_run(suite: Suite, model: str, limit: float, overrides: list[str],
              max_train_s: float = 0) -> RunReport:
    """One ListOps run of `model` within `limit` seconds: training until the run's own end
    or its deadline (limit less the test's reserve), then, if stopped, its test at the
    step its checkpoint holds (see the section's comment)."""
    from lra.runs import plan as run_plan

    plan, start = suite.plan, time.monotonic()
    workdir = run_plan.run_dir(os.path.join(suite.out, "runs"), "listops", model, 0, overrides)
    results = os.path.join(workdir, "results.json")
    before = os.path.getmtime(results) if os.path.exists(results) else None

    def tested() -> bool:
        return os.path.exists(results) and os.path.getmtime(results) != before

    cmd = run_plan.command("listops", model, 0, plan.run_config_arg, workdir, overrides)
    # The test gets its reserve, and stopping the training (a checkpoint: seconds) 15 s.
    train_deadline = start + limit - plan.test_reserve_s - 15
    _log(f"{model}: training until {train_deadline - start:.0f} s from now"
         + (f" or {max_train_s:g} s of training" if max_train_s else "")
         + f": {display(cmd)}")
    code, trained = launch(cmd, workdir, deadline=train_deadline, max_train_s=max_train_s,
                           xla_flags=plan.xla_flags)
    commands = [display(cmd)]
    if code == 0 and tested():
        return RunReport(f"finished in {time.monotonic() - start:.0f} s", commands,
                         tested=True)
    if code is not None and code != 143:  # 143: it saved and stopped on a SIGTERM
        return RunReport(f"FAILED: exit {code}: {_error_line(workdir)}", commands,
                         failed=True)
    step = last_complete_step(workdir)
    if step is None:
        return RunReport(f"stopped after {time.monotonic() - start:.0f} s before its first "
                         "checkpoint (reading the data and compiling took the time)", commands)
    test = [*cmd, f"--config.num_train_steps={step}"]
    commands.append(display(test))
    _log(f"{model}: stopped; testing at step {step}: {display(test)}")
    code, _ = launch(test, workdir, deadline=start + limit - GRACE_S - 5, grace=GRACE_S,
                     xla_flags=plan.xla_flags)
    what = (f"time-boxed: trained {trained:.0f} s" if trained is not None else "time-boxed")
    if code == 0 and tested():
        return RunReport(f"{what}, stopped at step {step} and tested there", commands,
                         tested=True)
    if code is None:
        return RunReport(f"{what} to step {step}; its test ran out of time (run again)",
                         commands)
    return RunReport(f"{what} to step {step}; its test FAILED: exit {code}: "
                     f"{_error_line(workdir)}", commands, failed=True)


def _runs_table(suite: Suite, models: list[str], overrides_of, states: dict[str, str]) -> list[str]:
    from lra.runs import plan as run_plan

    published = _published_listops()
    rows = ["| model | state | steps done / planned | test acc | LRA (published, 5000 "
            "steps) | best val acc (step) | steps/s | input wait | device peak | folder |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for model in models:
        overrides = overrides_of(model)
        workdir = run_plan.run_dir(os.path.join(suite.out, "runs"), "listops", model, 0,
                                   overrides)
        rows.append(_run_row(model, workdir, states.get(model, ""), published.get(model),
                             planned_steps(suite, model, overrides)))
    return rows


def stage_transformer(suite: Suite, limit: float) -> StageResult:
    """One full-size ListOps run of transformer, trained for the time the stage has and
    tested where it stopped, beside LRA's 36.37."""
    from lra.runs import plan as run_plan

    start, plan = time.monotonic(), suite.plan
    overrides = transformer_overrides(suite)
    missing = wait_for_listops(suite, limit - plan.test_reserve_s - 75,
                               "transformer", overrides)
    if missing:
        return StageResult("partial", missing.split(";")[0], missing + "\n", [])
    report = timed_run(suite, "transformer", limit - (time.monotonic() - start), overrides,
                       plan.max_train_s)
    total = planned_steps(suite, "transformer", overrides)
    size = ("LRA's full size (length 2000, batch 32, 4 layers of width 512; LRA trains "
            f"{total} steps)" if plan is FULL
            else f"`{plan.run_config_arg}` with "
            f"{', '.join(run_plan.normalized_overrides(overrides))}")
    body = [f"ListOps at {size}, seed 0, from `{rel(suite.data_dir)}`, trained for the "
            "time this stage had and tested with its best-on-validation weights where it "
            f"stopped: `steps done / planned` says how far it got of the {total}. LRA's "
            "published accuracy is after all of them. Run the stage again where its "
            "checkpoints are (`--stages=transformer --force`) to train on from there.", "",
            *_runs_table(suite, ["transformer"], lambda m: overrides,
                         {"transformer": report.state}), ""]
    status = "failed" if report.failed else "complete" if report.tested else "partial"
    return StageResult(status, report.state, "\n".join(body), report.commands)


def stage_runs(suite: Suite, limit: float) -> StageResult:
    """A time-boxed run per model (Plan.run_models, the issue's order after transformer,
    at most Plan.run_seconds each) while time is left; a model with a results.json is
    done (its test accuracy, at the steps it reached)."""
    from lra.runs import plan as run_plan

    plan, start = suite.plan, time.monotonic()
    overrides = run_overrides(suite)
    missing = wait_for_listops(suite, limit - plan.test_reserve_s - 75,
                               plan.run_models[0], overrides)
    if missing:
        return StageResult("partial", missing.split(";")[0], missing + "\n", [])
    commands, states, failed = [], {}, False
    for model in plan.run_models:
        workdir = run_plan.run_dir(os.path.join(suite.out, "runs"), "listops", model, 0,
                                   overrides)
        if os.path.exists(os.path.join(workdir, "results.json")):
            continue
        left = limit - (time.monotonic() - start)
        need = max(plan.min_run_s, plan.test_reserve_s + 15)
        if left < need or left <= 0:
            states[model] = "not started: no time left (next call)"
            continue
        report = timed_run(suite, model, min(left, plan.run_seconds or left), overrides,
                           plan.max_train_s)
        states[model] = report.state
        commands += report.commands
        failed = failed or report.failed
    finished = sum(os.path.exists(os.path.join(run_plan.run_dir(
        os.path.join(suite.out, "runs"), "listops", m, 0, overrides), "results.json"))
        for m in plan.run_models)
    size = ("LRA's full size (length 2000, 5000 steps planned)" if plan is FULL
            else f"`{plan.run_config_arg}` with {', '.join(plan.run_overrides)}")
    sweep_dir = os.path.join(suite.out, "runs")
    each = (f"at most {plan.run_seconds:g} s" if plan.run_seconds else "the time left")
    body = [f"ListOps at {size}, seed 0, from `{rel(suite.data_dir)}`; each run trained for "
            f"{each} (training, then its test where it stopped: `steps done / planned`); "
            f"each run's results.json in its folder under {rel(sweep_dir)}/. Table 1: "
            f"`python -m lra.report {rel(sweep_dir)}`."]
    body += ["", *_runs_table(suite, list(plan.run_models), lambda m: overrides, states)]
    status = ("failed" if failed else "complete" if finished == len(plan.run_models)
              else "partial")
    return StageResult(status, f"{finished} of {len(plan.run_models)} runs tested",
                       "\n".join(body), commands)


def _published_listops() -> dict[str, float]:
    """LRA's (Tay et al. 2021) ListOps accuracy per registry name."""
    with open(PUBLISHED_PATH, encoding="utf-8") as f:
        results = json.load(f)["results"]
    return {r["model"]: r["accuracy"]["listops"] for r in results
            if r["source"] == "tay2021" and r["accuracy"].get("listops") is not None}


def _run_row(model: str, workdir: str, state: str, published: float | None,
             planned: int) -> str:
    path = os.path.join(workdir, "results.json")
    folder = rel(workdir)
    pub = f"{published:.2f}" if published is not None else "-"
    if not os.path.exists(path):
        progress = _last_step(os.path.join(workdir, "log.txt"))
        state = state or "not started"
        return (f"| {model} | {state}{'; ' + progress if progress else ''} | - / {planned} | "
                f"- | {pub} | - | - | - | - | {folder} |")
    with open(path) as f:
        r = json.load(f)
    peak = r.get("device_peak_bytes")
    wait = r.get("input_wait_fraction")
    steps = r.get("steps")
    state = state or ("tested earlier" if steps is not None and steps < planned
                      else "finished earlier")
    return (f"| {model} | {state} | {steps} / {planned} | {100 * r['test_accuracy']:.2f} | "
            f"{pub} | {100 * r['best_eval_accuracy']:.2f} ({r.get('best_step', '-')}) | "
            f"{r.get('train_steps_per_sec') or 0:.2f} | "
            f"{'-' if wait is None else f'{100 * wait:.0f}%'} | "
            f"{_size(peak) if peak else '-'} | {folder} |")


def _last_step(log_path: str) -> str:
    """'step 1200/5000' from a run's last progress line, or ''."""
    if not os.path.exists(log_path):
        return ""
    with open(log_path, errors="replace") as f:
        steps = re.findall(r"^step\s+(\d+/\d+)", f.read(), re.M)
    return f"reached step {steps[-1]}" if steps else ""

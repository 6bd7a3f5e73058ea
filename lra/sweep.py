r"""Run many variants (and seeds) of one task, several tasks, or all of LRA into one directory.

  python -m lra.sweep --task=listops --models=all --config_arg=mini --seeds=0,1 \
      --sweep_dir=workdirs/sweep_listops_mini [--override=num_train_steps=500 ...]
  python -m lra.sweep --task=all --models=transformer,linear --config_arg=mini \
      --seeds=0,1,2 --sweep_dir=workdirs/sweep_all_mini      # or --task=listops,text

`--task=all` is LRA's Table 1 (TASKS: listops, text, retrieval, image, pathfinder, pathx);
a comma list names some of them. Before anything runs, each task's data folder (the
config's data_dir after --config_arg and --override) is looked for; a task whose data is
missing is skipped with one line naming the command that gets it (lra.download for text,
retrieval, image and mnist; the generators lra.tasks.listops / lra.tasks.pathfinder for the
others, with the mini's own generator arguments for a mini's folder), and the other tasks
run. The sweep exits 1 when a run failed or was refused, or when no task had its data.

Each run is `python -m lra.launch --workdir=<workdir> --config=configs/<task>.py:model=<m>,<config_arg>
--config.random_seed=<s> [--config.<override> ...] [--import=<the sweep's>]` in its own process
(a crash or an out-of-memory in one variant does not stop the sweep), where <workdir> is
`<sweep_dir>/<task>/<model>/seed<s>`, or `.../seed<s>-<hash>` with `--override`s (a short
hash of them, order aside; the run's `sweep.json` lists them): another set of overrides
is another set of runs, next to the first.

`--grid=field=v1,v2,...` (repeatable) runs every model and seed at each point of the
grids' product, each point its own set of overrides (so its own seed<s>-<hash> folders),
e.g. Zoology's learning-rate sweep per width:

  python -m lra.sweep --task=mqar --models=gla,transformer --config_arg=mini,d_model=128 \
      --grid=learning_rate=3e-4,1e-3,3e-3 --seeds=0,1 --sweep_dir=workdirs/mqar_lr

`lra.synthetic_report` then keeps, per MQAR cell, the learning rate and weight decay with
the best validation accuracy. A value that holds a comma cannot be a grid value.

`--locality_baseline` adds, per task and seed, the task's locality baseline after the
models: its mixer (`local`; `local_2d` on the pixel tasks) with the config argument
`locality` (configs/common.py apply_locality: one layer whose positions see 9
consecutive tokens or a 3x3 patch, MEAN pooling), in `<sweep_dir>/<task>/locality_baseline/
seed<s>[-<hash>]`, skipped, resumed and refused like any run; `lra.report` names its row
`locality baseline`. It runs from scratch: not with --pretrain; and `locality` in
--config_arg (every run the baseline) is refused in one line.

`--finished_in=results/cpu/<name>_runs.jsonl[,...]`: the runs records committed beside a
report (lra.synthetic_report, lra.length_report) count as finished runs: a run whose
task, model and config one of them records is skipped though its workdir is empty (a
grid continued on a fresh machine does not redo the cells it has committed; the record's
folder does not matter). Give the same files to the report with the sweep directory.

A finished run (results.json present) is skipped if the config it recorded is the one this
sweep would run (fields that do not change results, lra.runs.results.NON_RESULT_FIELDS, aside);
one that differs (another --config_arg, changed presets, a run started by hand) is not
run again and not counted as done: the sweep names the differing fields and exits 1.
Unfinished runs resume from their last checkpoint. A failed run leaves `error.txt` (its
last stderr line) and `stderr.txt` (every attempt's whole stderr, appended) beside
`log.txt` (stdout) in its workdir, and is retried by the next sweep.

Two sweeps of one grid (the same command in two shells: one per core, or per machine on a
shared disk) share its runs: a run another live process holds (launch.py's workdir lock,
exit code 75) is left to it, `running in another process, left to it`, neither failed nor
retried, and the sweep goes on to the next; each finished run is then skipped by the other.

Self-pretraining (Amos, Berant and Gupta, ICLR 2024: pretrain on the task's own training
inputs, then fine-tune), at the same total number of steps as a from-scratch run:

  python -m lra.sweep --task=listops --models=all --config_arg=mini --seeds=0,1 \
      --sweep_dir=workdirs/sweep_listops_mini --pretrain [--pretrain_steps=1500]

runs, for each model and seed, a pretraining run in `.../seed<s>[-<hash>]-pretrain`
(config arguments `<config_arg>,pretrain`: masked-token prediction, or next-token with
`causal`; `num_train_steps=<pretrain_steps>`), then, once it has finished, a fine-tuning
run in `.../seed<s>[-<hash>]-pretrained` (`<config_arg>`, `init_from=<the pretraining
workdir>`, `num_train_steps=<total - pretrain_steps>`), where the total is the config's
num_train_steps after the --overrides (default pretrain_steps: half of it). The same
command without --pretrain makes the from-scratch runs beside them (`.../seed<s>[-<hash>]`).
Both phases are skipped, resumed and refused like any run; a pretraining run that fails
(or is refused) leaves its fine-tuning run unstarted, and the sweep exits 1.
Another --pretrain_steps for the same folders is a finished run of another config (refused,
naming num_train_steps): give it another --sweep_dir.

`--status` added to a sweep's command runs nothing and writes nothing: one line per run
(finished with its test accuracy; running, with the process and the step it logged last;
stopped at its last complete checkpoint, which the same command resumes; failed, with its
error line; refused; not started), then the counts and the time left: training at the
runs' logged and finished steps/s, with validation, test and set-up as finished runs
recorded them (results.json's run_seconds; lra/runs/status.py). With --finished_in, a run its
records hold is `finished (recorded in <file>)`.

The runs share XLA's persistent compilation cache, `<sweep_dir>/xla_cache` (JAX's own:
keyed on the program, its compile options and flags, and the jax / jaxlib versions), so a
model's further seeds and a resumed run load the programs its first run compiled
(lra/runs/plan.py run_environment); a JAX_COMPILATION_CACHE_DIR already set is kept;
`--compilation_cache=<folder>` names another, `--compilation_cache=none` turns it off.

Then: `python -m lra.report <sweep_dir>`.
"""
from __future__ import annotations

import collections
import datetime
import functools
import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
import time

from absl import app, flags

from lra.runs import args, cli, plan
# --task, --seeds, --grid and the report command: lra/runs/args.py (here too: the API)
from lra.runs.args import (TASKS, grid_overrides, parse_seeds,  # noqa: F401
                           parse_tasks, report_command)
from lra.runs import status as run_status


FLAGS = flags.FLAGS


def _define_flags() -> None:
    # Defined only when run as a program, so importing this module (tests, notebooks,
    # other tools) never claims global absl flag names.
    flags.DEFINE_string("task", "listops", "Task config(s): configs/<task>.py; a comma "
                        "list, or 'all' (" + ",".join(TASKS) + "). A task whose data is "
                        "missing is skipped, naming the command that gets it.")
    flags.DEFINE_list("models", ["all"], "Registry names, or 'all'.")
    flags.DEFINE_list("import", [], "Modules of your own that register variants (from this "
                      "folder or PYTHONPATH); every run imports them too (--import).")
    flags.DEFINE_string("config_arg", "", "Extra config arguments, e.g. 'mini' or 'runlocal'.")
    flags.DEFINE_list("seeds", ["0"], "Random seeds (config.random_seed), integers.")
    flags.DEFINE_string("sweep_dir", None, "Directory that receives every run.")
    flags.DEFINE_multi_string("override", [], "Config overrides field=value, for every run; "
                              "each set of overrides gets its own workdirs (seed<s>-<hash>).")
    flags.DEFINE_multi_string("grid", [], "field=v1,v2,...: run every model and seed at each "
                              "value; several --grid flags: every combination (each its own "
                              "set of overrides, seed<s>-<hash>).")
    flags.DEFINE_integer("timeout", 0, "Seconds per run before it is stopped (0 = none).")
    flags.DEFINE_bool("pretrain", False, "Per model and seed: a self-pretraining run "
                      "(<config_arg>,pretrain), then a fine-tuning run from it (init_from); "
                      "together as many steps as a from-scratch run.")
    flags.DEFINE_integer("pretrain_steps", None, "Steps of the pretraining run, below the "
                         "config's num_train_steps (the total); default half of it.")
    flags.DEFINE_bool("status", False, "Run nothing: say where each run of this sweep "
                      "stands (finished, running, stopped at a step, failed, not started) "
                      "and the time left (lra/runs/status.py); writes nothing.")
    flags.DEFINE_list("finished_in", [], "Runs records (the _runs.jsonl files "
                      "lra.synthetic_report / lra.length_report commit): a run whose config "
                      "one of them records counts as finished and is skipped (a grid "
                      "continued on another machine does not redo its committed cells).")
    flags.DEFINE_string("compilation_cache", plan.SWEEP_CACHE, "Where the runs keep XLA's "
                        "compiled programs, so that a model's further seeds and resumed runs "
                        "skip compiling: 'sweep' (<sweep_dir>/xla_cache, unless "
                        "JAX_COMPILATION_CACHE_DIR is set), a folder, or 'none'.")
    flags.DEFINE_bool("locality_baseline", False, "Per task and seed, one more run: the "
                      "task's locality baseline (config argument `locality`: one layer that "
                      "sees a short window, MEAN pooling), into <task>/locality_baseline/.")


def _last_line(path: str, offset: int) -> str:
    """The last non-empty line written to `path` after byte `offset`."""
    with open(path, "rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", "replace")
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    return lines[-1] if lines else ""


class SweepStopped(Exception):
    """The sweep got SIGTERM or SIGINT: its running launch.py got it too, saved and
    stopped; the sweep stops with 128 + the signal's number."""


def _run_forwarding_signals(cmd: list[str], out, err, timeout: int,
                            env: dict | None = None) -> tuple[int | None, str]:
    """Runs `cmd` in cli.run_root(); (exit code, or None after --timeout; the name of the SIGTERM or
    SIGINT this process received meanwhile, or ""). Either signal is forwarded to the
    child, a launch.py that saves and stops (a preempted run), and waited for: exiting at
    once would leave it training on as an orphan that writes results.json later."""
    proc = subprocess.Popen(cmd, cwd=cli.run_root(), stdout=out, stderr=err, env=env)
    received: list[str] = []

    def forward(signum, _frame):
        received.append(signal.Signals(signum).name)
        proc.send_signal(signum)

    previous = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, forward)
    except ValueError:  # not the main thread: nothing to forward from
        pass
    try:
        try:
            code = proc.wait(timeout=timeout or None)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code, (received[0] if received else "")


def _run_one(*, tag: str, workdir: str, task: str, model: str, seed: int, config_arg: str,
             overrides: list[str], record: dict, timeout: int, log,
             finished_in: list | None = None, env: dict | None = None) -> str:
    """Runs (or skips, or refuses) one launch.py run in `workdir` (in the environment `env`,
    default this process's); 'done', 'skipped', 'failed', 'refused' or 'busy' (see
    sweep)."""
    results = os.path.join(workdir, "results.json")
    found = (None if os.path.exists(results) or not finished_in else
             plan.recorded_run(finished_in, task, model, seed, config_arg, overrides))
    if found:
        log(f"{tag}: finished earlier (recorded in {found[0]}), skipped")
        return "skipped"
    if os.path.exists(results):
        differences = plan.finished_differences(results, task, model, seed, config_arg,
                                            overrides)
        if not differences:
            log(f"{tag}: finished earlier, skipped")
            return "skipped"
        log(f"{tag}: REFUSED: {workdir} holds a finished run of another config "
            f"({'; '.join(differences)}); use another --sweep_dir, or delete that "
            "folder to run this config there")
        return "refused"
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "sweep.json"), "w") as f:
        json.dump(record, f, indent=2)
    cmd = plan.command(task, model, seed, config_arg, workdir, overrides)
    stderr_path = os.path.join(workdir, "stderr.txt")
    start = time.time()
    log(f"{tag}: running in {workdir} ...")
    with open(os.path.join(workdir, "log.txt"), "a") as out, \
            open(stderr_path, "ab") as err:
        stamp = datetime.datetime.now().isoformat(timespec="seconds")
        err.write(f"==== {stamp}: {shlex.join(cmd)}\n".encode())
        err.flush()
        offset = err.tell()
        # stderr straight to the file: all of it is kept, also on a timeout
        code, stopped_by = _run_forwarding_signals(cmd, out, err, timeout, env)
        error = (None if code == 0 else f"stopped after {timeout} s (--timeout)"
                 if code is None else _last_line(stderr_path, offset) or f"exit code {code}")
    if code == cli.EXIT_WORKDIR_BUSY and not stopped_by:
        # Another sweep (another shell, core or machine on this disk) runs it: two sweeps
        # of one grid share its runs. Not a failure: no error.txt, and that run is left alone.
        log(f"{tag}: running in another process, left to it ({error})")
        return "busy"
    if stopped_by:  # the run saved and stopped (or had nothing to save): not a failure
        log(f"{tag}: stopped by {stopped_by} after {time.time() - start:.0f} s; the sweep "
            "stops too; run the same command to resume")
        raise SweepStopped(stopped_by)
    error_file = os.path.join(workdir, "error.txt")
    if error is not None:
        with open(error_file, "w") as f:
            f.write(f"{error}\nwhole stderr: {stderr_path}\n")
        log(f"{tag}: FAILED after {time.time() - start:.0f} s: {error} "
            f"(whole stderr: {stderr_path})")
        return "failed"
    if os.path.exists(error_file):
        os.remove(error_file)
    log(f"{tag}: done in {time.time() - start:.0f} s{_time_parts(workdir)}")
    return "done"


def _time_parts(workdir: str) -> str:
    """' (training 1100 s, validation 90 s, test 900 s)': where a finished run's time went
    (its results.json run_seconds), or '' where it does not say."""
    try:
        with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
            seconds = json.load(f).get("run_seconds") or {}
    except (OSError, ValueError, AttributeError):
        return ""
    parts = [(name, seconds.get(key)) for name, key in
             (("training", "train"), ("validation", "evaluation"), ("test", "test"))]
    if not all(isinstance(v, (int, float)) for _, v in parts):
        return ""
    return " (" + ", ".join(f"{name} {v:.0f} s" for name, v in parts) + ")"


def _status_one(*, tag: str, workdir: str, task: str, model: str, seed: int,
                config_arg: str, overrides: list[str], log, infos: list,
                finished_in: list | None = None, **_) -> str:
    """--status: where one run stands (lra.runs.status), said in one line, not run."""
    info = run_status.inspect(workdir=workdir, task=task, model=model, seed=seed,
                              config_arg=config_arg, overrides=overrides,
                              finished_in=finished_in)
    infos.append(info)
    log(f"{tag}: {info['line']}")
    return info["state"]


def sweep(*, task: str, models: list[str], seeds: list[int], config_arg: str, sweep_dir: str,
          overrides: list[str], timeout: int = 0, log=print, pretrain: bool = False,
          pretrain_steps: int | None = None, locality_baseline: bool = False,
          status: list | None = None,
          finished_in: list[tuple[str, dict]] | None = None,
          compilation_cache: str = plan.SWEEP_CACHE) -> dict[str, list]:
    """Runs what is not finished; returns {'done': [...], 'skipped': [...], 'failed': [...],
    'refused': [...], 'blocked': [...]} of (model, seed), or with `pretrain` of
    (model, seed, plan.PRETRAIN | plan.FINE_TUNE). 'refused': finished earlier with another
    config;
    'blocked': fine-tuning runs not started because their pretraining run failed or was
    refused; 'busy': runs another live process holds (launch.py's workdir lock: another
    sweep of the same grid runs them), left to it. `locality_baseline`: after the models,
    the task's locality baseline for each seed, as the model plan.LOCALITY_BASELINE
    (plan.run_spec). With `pretrain`, a bad split (see
    plan.pretrain_plan) raises ValueError before anything runs, as do the combinations
    plan.check_locality_args refuses.
    `status`: run nothing; each run's lra.runs.status record is appended to it and its
    state (run_status.STATES) is the outcome's key.
    `finished_in`: plan.load_finished_records' (file, record) pairs; a run one of them
    records (plan.recorded_run) is finished, 'skipped', though its workdir is empty.
    `compilation_cache`: where the runs keep XLA's compiled programs (plan.run_environment).
    """
    plan.check_locality_args(config_arg, pretrain, locality_baseline)
    # launch runs in cli.run_root(): a relative workdir (or init_from) would name another folder
    # there than the one this process creates and checks.
    sweep_dir = os.path.abspath(sweep_dir)
    run_one = functools.partial(
        functools.partial(_run_one, env=plan.run_environment(sweep_dir, compilation_cache))
        if status is None else functools.partial(_status_one, infos=status),
        finished_in=finished_in)
    seeds = list(dict.fromkeys(seeds))
    outcome = collections.defaultdict(list)  # 'done', 'skipped', ... (or --status's states)
    user_overrides = plan.normalized_overrides(overrides)
    if not pretrain:
        names = [*models, *([plan.LOCALITY_BASELINE] if locality_baseline else [])]
        runs = [(m, s) for m in names for s in seeds]
        for n, (name, seed) in enumerate(runs, 1):
            # The baseline is launched (and its finished run recognised) as what it is:
            # its mixer with the `locality` argument; only its folder and name are its own.
            model, arg, folder = plan.run_spec(task, name, config_arg)
            if folder == model:  # a hybrid's runs are in a folder of its name
                folder = plan.model_folder(task, model, arg, overrides)
            state = run_one(
                tag=f"[{n}/{len(runs)}] {task} {name} seed {seed}",
                workdir=plan.run_dir(sweep_dir, task, folder, seed, overrides), task=task,
                model=model, seed=seed, config_arg=arg, overrides=overrides,
                record={"task": task, "model": model, "seed": seed, "config_arg": arg,
                        "overrides": user_overrides},
                timeout=timeout, log=log)
            outcome[state].append((name, seed))
        return outcome

    # The split is the config's (num_train_steps, warmup, factors after the overrides),
    # built in-process as launch.py builds it (plan.expected_config): checked for every
    # model before the first run starts. The seed does not change steps or schedule.
    plans = {m: plan.pretrain_plan(
                 plan.expected_config(task, m, seeds[0], config_arg, overrides), pretrain_steps)
             for m in models}
    pretrain_arg = ",".join(filter(None, [config_arg, "pretrain"]))
    total = 2 * len(models) * len(seeds)
    n = 0
    for model in models:
        steps, fine_steps = plans[model]
        for seed in seeds:
            base = f"{task} {model} seed {seed}"
            record = {"task": task, "model": model, "seed": seed, "overrides": user_overrides,
                      "pretrain_steps": steps, "fine_tune_steps": fine_steps}
            folder = plan.model_folder(task, model, config_arg, overrides)
            pre_dir = plan.run_dir(sweep_dir, task, folder, seed, overrides, plan.PRETRAIN)
            pre_overrides = plan.normalized_overrides([*overrides, f"num_train_steps={steps}"])
            n += 1
            state = run_one(
                tag=f"[{n}/{total}] {base} pretrain ({steps} steps)", workdir=pre_dir,
                task=task, model=model, seed=seed, config_arg=pretrain_arg,
                overrides=pre_overrides,
                record={**record, "phase": plan.PRETRAIN, "config_arg": pretrain_arg,
                        "run_overrides": pre_overrides},
                timeout=timeout, log=log)
            outcome[state].append((model, seed, plan.PRETRAIN))
            n += 1
            fine_dir = plan.run_dir(sweep_dir, task, folder, seed, overrides, plan.FINE_TUNE)
            tag = f"[{n}/{total}] {base} fine-tune ({fine_steps} steps)"
            if state in ("failed", "refused"):
                outcome["blocked"].append((model, seed, plan.FINE_TUNE))
                log(f"{tag}: NOT STARTED: its pretraining run in {pre_dir} {state}")
                continue
            if state == "busy":  # the sweep pretraining it fine-tunes it after
                outcome["busy"].append((model, seed, plan.FINE_TUNE))
                log(f"{tag}: left to the process running its pretraining run")
                continue
            fine_overrides = plan.normalized_overrides(
                [*overrides, f"init_from={pre_dir}", f"num_train_steps={fine_steps}"])
            state = run_one(
                tag=tag, workdir=fine_dir, task=task, model=model, seed=seed,
                config_arg=config_arg, overrides=fine_overrides,
                record={**record, "phase": plan.FINE_TUNE, "config_arg": config_arg,
                        "run_overrides": fine_overrides},
                timeout=timeout, log=log)
            outcome[state].append((model, seed, plan.FINE_TUNE))
    return outcome


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv):
    if len(argv) > 1:
        _fail(f"unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS.sweep_dir:
        _fail("--sweep_dir is required")
    if os.path.exists(FLAGS.sweep_dir) and not os.path.isdir(FLAGS.sweep_dir):
        _fail(f"--sweep_dir={FLAGS.sweep_dir} is a file, not a folder; give a folder (it is "
              "created if missing)")
    try:
        seeds = parse_seeds(FLAGS.seeds)
    except ValueError as e:
        _fail(str(e))
    if FLAGS.timeout < 0:
        _fail(f"--timeout={FLAGS.timeout} must be >= 0 (0: no limit)")
    bad = [o for o in FLAGS.override if not o.partition("=")[0].strip() or "=" not in o]
    if bad:
        _fail(f"--override={bad[0]!r} is not field=value (e.g. --override=num_train_steps=500)")
    try:
        points = grid_overrides(FLAGS.override, FLAGS.grid)
    except ValueError as e:
        _fail(str(e))
    if FLAGS.grid and FLAGS.pretrain:
        _fail("--grid with --pretrain: run one --pretrain sweep per value (--override)")
    try:
        tasks = parse_tasks(FLAGS.task)
    except ValueError as e:
        _fail(str(e))
    cli.import_variants(cli.imported_modules(), given="LRA_IMPORTS names")
    cli.import_variants(FLAGS["import"].value)
    from models import registry

    models = registry.available() if FLAGS.models == ["all"] else FLAGS.models
    unknown = [m for m in models if m not in registry.available()]
    if unknown:
        _fail(registry.unknown_model(unknown[0]))
    try:
        plan.check_locality_args(FLAGS.config_arg, FLAGS.pretrain, FLAGS.locality_baseline)
    except ValueError as e:
        _fail(str(e))
    for task in tasks:
        on = f" of {task}" if len(tasks) > 1 else ""
        # A bad --override or --config_arg: once here, not once per run; with
        # --locality_baseline, also for the baseline's config.
        checked = [(models[0], FLAGS.config_arg, models[0])]
        if FLAGS.locality_baseline:
            baseline, arg, _ = plan.run_spec(task, plan.LOCALITY_BASELINE, FLAGS.config_arg)
            checked.append((baseline, arg, "the locality baseline"))
        for (model, arg, name), overrides in itertools.product(checked, points):
            try:
                plan.expected_config(task, model, seeds[0], arg, overrides)
            except (AttributeError, KeyError) as e:  # --config.<field> the config lacks
                _fail(f"--override: unknown config field{on} "
                      f"{str(e).strip(chr(39) + chr(34))!r}; the fields are those of "
                      "configs/common.py:base_config and the task config")
            except Exception as e:  # noqa: BLE001  (a bad value, a bad --config_arg)
                _fail(f"the config{on} for {name} cannot be built: {e}")
    if FLAGS.pretrain_steps is not None and not FLAGS.pretrain:
        _fail(f"--pretrain_steps={FLAGS.pretrain_steps} is for --pretrain runs; add --pretrain "
              "or leave it out")
    if FLAGS.pretrain:
        for task in tasks:
            _check_pretrain_args(task, models, seeds[0])
    try:
        finished_in = plan.load_finished_records(FLAGS.finished_in)
    except ValueError as e:
        _fail(str(e))
    try:
        plan.run_environment(FLAGS.sweep_dir, FLAGS.compilation_cache)
    except ValueError as e:
        _fail(str(e))
    try:  # before the data check: an unwritable --sweep_dir is said even if data is missing
        if not FLAGS.status:  # --status writes nothing
            os.makedirs(FLAGS.sweep_dir, exist_ok=True)
    except OSError as e:
        _fail(f"cannot write {e.filename or FLAGS.sweep_dir}: {e.strerror or e}; give a "
              "--sweep_dir you can write to")
    ready, missing = plan.plan_tasks(tasks, models[0], seeds[0], FLAGS.config_arg,
                                     FLAGS.override)
    for line in missing:
        print(line)
    several = len(tasks) > 1
    outcome = collections.defaultdict(list)
    infos = [] if FLAGS.status else None
    for task, (i, overrides) in itertools.product(ready, enumerate(points, 1)):
        if FLAGS.grid:
            print(f"grid point {i}/{len(points)} of {task}: "
                  + " ".join(overrides[len(FLAGS.override):]))
        try:
            done = sweep(task=task, models=models, seeds=seeds,
                         config_arg=FLAGS.config_arg, sweep_dir=FLAGS.sweep_dir,
                         overrides=overrides, timeout=FLAGS.timeout,
                         pretrain=FLAGS.pretrain, pretrain_steps=FLAGS.pretrain_steps,
                         locality_baseline=FLAGS.locality_baseline, status=infos,
                         finished_in=finished_in, compilation_cache=FLAGS.compilation_cache)
        except OSError as e:  # a read-only or full disk under --sweep_dir
            _fail(f"cannot write {e.filename or FLAGS.sweep_dir}: {e.strerror or e}; give a "
                  "--sweep_dir you can write to")
        except SweepStopped as e:
            sys.exit(128 + signal.Signals[str(e)].value)  # as the run: 143, or 130 (Ctrl-C)
        point = " ".join(overrides[len(FLAGS.override):])
        for state, runs in done.items():  # with several tasks, each run names its task
            runs = [(task, *run) for run in runs] if several else list(runs)
            if len(points) > 1:  # and with a grid, its point
                runs = [(*run, point) for run in runs]
            outcome[state] += runs
    if FLAGS.status:
        print(run_status.summary(infos) if infos else "no runs (no task had its data)")
        sys.exit(0)
    ran = len(outcome["done"])
    print(f"{ran} run{'' if ran == 1 else 's'}, {len(outcome['skipped'])} skipped, "
          f"{len(outcome['failed'])} failed"
          + (f": {outcome['failed']}" if outcome["failed"] else "")
          + (f", {len(outcome['refused'])} refused (another config finished there): "
             f"{outcome['refused']}" if outcome["refused"] else "")
          + (f", {len(outcome['blocked'])} not started (pretraining run failed or refused): "
             f"{outcome['blocked']}" if outcome["blocked"] else "")
          + (f", {len(outcome['busy'])} left to the process holding each one's lock (above)"
             if outcome["busy"] else "")
          + (f"; {len(missing)} task(s) skipped for missing data: "
             f"{', '.join(line.split(':')[0] for line in missing)} (commands above)"
             if missing else ""))
    if ready:
        # runs skipped as recorded are in their runs files only: the report reads those too
        tested_at_lengths = [t for t in ready if args.tests_lengths(
            t, models[0], seeds[0], FLAGS.config_arg, FLAGS.override)]
        print("Report: " + report_command(ready, FLAGS.finished_in, FLAGS.sweep_dir,
                                          tested_at_lengths))
    sys.exit(1 if outcome["failed"] or outcome["refused"] or outcome["blocked"] or not ready
             else 0)


def _check_pretrain_args(task: str, models: list[str], seed: int) -> None:
    """--pretrain's one-line refusals, before anything runs: overrides that --pretrain
    sets itself, a pretraining config that cannot be built, a split of the steps that
    leaves a run without steps or a cosine schedule without decay (plan.pretrain_plan)."""
    fixed = sorted({o.partition("=")[0].strip() for o in FLAGS.override}
                   & {"init_from", "objective"})
    if fixed:
        _fail(f"--override={fixed[0]}=... with --pretrain: the sweep sets {fixed[0]} itself "
              "(objective through the 'pretrain' config argument, init_from to the "
              "pretraining run's workdir); leave that override out")
    pretrain_arg = ",".join(filter(None, [FLAGS.config_arg, "pretrain"]))
    for model in models:
        try:
            config = plan.expected_config(task, model, seed, FLAGS.config_arg, FLAGS.override)
            plan.expected_config(task, model, seed, pretrain_arg, FLAGS.override)
        except Exception as e:  # noqa: BLE001  (e.g. 'causal' with CLS pooling refused)
            _fail(f"the pretraining config for {model} ({pretrain_arg}) cannot be built: {e}")
        try:
            plan.pretrain_plan(config, FLAGS.pretrain_steps)
        except ValueError as e:
            _fail(str(e))


if __name__ == "__main__":
    _define_flags()
    app.run(main, flags_parser=cli.parse_flags_or_refuse)

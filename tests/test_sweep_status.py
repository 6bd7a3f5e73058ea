"""lra.sweep --status (where each run stands, the time left), the grid scripts and their
shared queue (scripts/*_grid.sh, scripts/cpu_grids.sh), and the committed runs records a
sweep counts as finished (--finished_in)."""
import json
import os
import re
import subprocess
import sys

from lra import sweep
from lra.runs import args, plan
from lra.runs import status as run_status
from tests.fake_launch import REPO, SWEEP, fake_launch
from tests.fake_launch import cli as _cli
from tests.fake_launch import one_line_error as _one_line_error


def test_status_says_where_each_run_stands_and_writes_nothing(listops_dir, tmp_path):
    """`lra.sweep ... --status`: one line per run (finished, refused, running, stopped,
    failed, not started) and the training time left at the runs' steps/s; no file is
    written (lra/runs/status.py)."""
    from lra.training import checkpoint

    root = str(tmp_path / "sweep")
    config = plan.expected_config("listops", "transformer", 0, "runlocal", [])
    total = config["num_train_steps"]

    def workdir(seed, *parts):
        """The run's folder (or `parts` below it, as folders), created."""
        path = os.path.join(plan.run_dir(root, "listops", "transformer", seed), *parts)
        os.makedirs(path, exist_ok=True)
        return path

    def file(seed, name):
        return os.path.join(workdir(seed), name)

    def log(seed, step, rate):
        with open(file(seed, "log.txt"), "w") as f:
            f.write(f"Training transformer\nstep {step:6d}/{total} | loss 1.0 | acc 0.5 | "
                    f"lr 1e-3 | {rate:6.2f} steps/s | input 0% | ETA 1m\n")

    seed0 = dict(config, random_seed=0)
    json.dump({"config": seed0, "test_accuracy": 0.9, "steps": total,
               "train_steps_per_sec": 0.01}, open(file(0, "results.json"), "w"))
    json.dump({"config": dict(config, random_seed=1, num_train_steps=total + 1)},
              open(file(1, "results.json"), "w"))
    lock = checkpoint.WorkdirLock(workdir(2))  # held by this (live) process
    lock.acquire()
    log(2, 4, 0.02)
    workdir(3, "checkpoints", "last", "2")
    workdir(3, "checkpoints", "last", "3.orbax-checkpoint-tmp-1")  # being written: not counted
    log(3, 3, 0.04)
    with open(file(4, "error.txt"), "w") as f:
        f.write("ValueError: the reason\nwhole stderr: x\n")
    try:
        before = sorted(os.walk(root))
        infos, logged = [], []
        outcome = sweep.sweep(seeds=[0, 1, 2, 3, 4, 5], sweep_dir=root, overrides=[],
                              log=logged.append, status=infos, **SWEEP)
        assert sorted(os.walk(root)) == before  # nothing written
    finally:
        lock.release()
    assert [outcome[s] for s in ("finished", "refused", "running", "stopped", "failed",
                                 "not started")] == [[("transformer", i)] for i in range(6)]
    assert logged[0] == (f"[1/6] listops transformer seed 0: finished: test 90.00%, {total} "
                         "steps at 0.01 steps/s")
    assert "refused: a finished run of another config is there (num_train_steps" in logged[1]
    assert f"running (pid {os.getpid()}" in logged[2] and f"at step 4 of {total}" in logged[2]
    assert f"stopped at step 2 of {total} saved, 0.04 steps/s; the same command" in logged[3]
    assert "failed: ValueError: the reason (no checkpoint yet" in logged[4]
    assert logged[5].endswith("seed 5: not started")
    # Left: running (total - 4) at its 0.02 steps/s, stopped (total - 2) at 0.04, the
    # failed and unstarted runs all their steps at the finished run's 0.01.
    left = (total - 4) / 0.02 + (total - 2) / 0.04 + 2 * total / 0.01
    line = run_status.summary(infos)
    assert line.startswith("6 runs: 1 finished, 1 refused, 1 running, 1 stopped, 1 failed, "
                           "1 not started; time left: about "
                           f"{run_status._duration(left)}, one run at a time"), line
    # The finished run records no run_seconds (as runs before 2026-12-06): training only.
    assert "with their validation" not in line
    assert line.endswith("; 4 runs counted for training only (no finished run of "
                         "transformer records run_seconds)"), line
    # Where it does: validation per step left, the test, and set-up for a run not
    # running now (wall 1000 s: 600 training, 100 validation over `total` steps, 200 test).
    timed = {"steps": total, "run_seconds": {"wall": 1000.0, "train": 600.0,
                                             "evaluation": 100.0, "test": 200.0}}
    assert run_status._overhead(timed) == {"per_step": 100.0 / total, "test": 200.0,
                                           "setup": 100.0}
    assert run_status._overhead({**timed, "run_seconds": {**timed["run_seconds"],
                                                          "from_step": 5}}) is None
    with_times = [dict(infos[0], finished_overhead=run_status._overhead(timed)), *infos[1:]]
    more = (4 * total - 6) * 100.0 / total + 4 * 200.0 + 3 * 100.0
    line = run_status.summary(with_times)
    assert (f"time left: about {run_status._duration(left + more)}, one run at a time, at "
            "the logged and finished runs' steps/s, with their validation, test and "
            "set-up") in line, line
    assert "training only" not in line
    # A model with no finished or logged run: counted apart, not guessed.
    other = dict(infos[5], model="gla", folder_rates=[])
    assert run_status.summary(infos + [other]).endswith(
        "; 1 run without an estimate (no finished or logged run of gla)")
    # A sweep of seed 5 alone: the finished run beside it (its model's folder) sets the rate.
    alone = []
    sweep.sweep(seeds=[5], sweep_dir=root, overrides=[], log=lambda _: None, status=alone,
                **SWEEP)
    assert f"time left: about {run_status._duration(total / 0.01)}," in \
        run_status.summary(alone)
    # In a fresh sweep directory (another machine), a record's finished run of the model
    # (another seed) sets it.
    fresh = []
    record = ("runs.jsonl", {"task": "listops", "model": "transformer", "config": seed0,
                             "test_accuracy": 0.9, "train_steps_per_sec": 0.05})
    sweep.sweep(seeds=[5], sweep_dir=str(tmp_path / "fresh"), overrides=[],
                log=lambda _: None, status=fresh, finished_in=[record], **SWEEP)
    assert f"time left: about {run_status._duration(total / 0.05)}," in \
        run_status.summary(fresh), run_status.summary(fresh)
    # The command: nothing is created, not even --sweep_dir.
    proc = _cli("lra.sweep", "--task=listops", "--models=transformer", "--config_arg=runlocal",
                "--seeds=0,1", f"--sweep_dir={tmp_path / 'none'}", "--status",
                f"--override=data_dir={listops_dir}", cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert not os.path.exists(tmp_path / "none")
    assert "[2/2] listops transformer seed 1: not started" in proc.stdout
    assert ("2 runs: 2 not started; time left: no estimate yet (no finished or logged "
            "run of transformer)") in proc.stdout, proc.stdout


def test_status_times_runs_by_those_made_under_this_jax_and_malloc(tmp_path, monkeypatch):
    """Huge pages made CPU steps 1.3-1.7x faster and JAX versions differ too: of a model's
    finished runs, those recorded under the JAX version and malloc pages a run would get
    now (results.json jax_version, host_malloc) set the time left, in the listing and
    beside it; the others only where there is no such run."""
    from lra.runs import cli

    monkeypatch.delenv(cli.TUNABLES_VARIABLE, raising=False)
    now = run_status.current_environment()
    assert now[1] == cli.malloc_pages({cli.TUNABLES_VARIABLE: cli.HUGE_PAGES_TUNABLE})
    root = str(tmp_path / "sweep")
    config = plan.expected_config("listops", "transformer", 0, "runlocal", [])
    total = config["num_train_steps"]
    for seed, rate, (version, pages) in ((0, 0.01, now), (1, 0.04, (now[0], "4 KiB pages")),
                                         (2, 0.04, ("0.0.1", now[1]))):
        path = plan.run_dir(root, "listops", "transformer", seed)
        os.makedirs(path)
        json.dump({"config": dict(config, random_seed=seed), "test_accuracy": 0.9,
                   "steps": total, "train_steps_per_sec": rate, "jax_version": version,
                   "host_malloc": pages}, open(os.path.join(path, "results.json"), "w"))

    def left(seeds):
        infos = []
        sweep.sweep(seeds=seeds, sweep_dir=root, overrides=[], log=lambda _: None,
                    status=infos, **SWEEP)
        return run_status.summary(infos)

    # Seed 0's 0.01 steps/s, not the mean with the others' 0.04.
    assert f"time left: about {run_status._duration(total / 0.01)}," in left([3]), left([3])
    assert f"time left: about {run_status._duration(2 * total / 0.01)}," in \
        left([0, 1, 2, 3, 4])
    # Without a run of this environment, every finished run of the size counts.
    os.remove(os.path.join(plan.run_dir(root, "listops", "transformer", 0), "results.json"))
    assert f"time left: about {run_status._duration(total / 0.04)}," in left([3])


def test_a_grid_script_prints_each_sweeps_status_and_creates_nothing(tmp_path):
    """STATUS=1 on a grid script (scripts/parity_neg_eig_grid.sh, state_tracking_cpu_grid.sh;
    mqar_scaffold_grid.sh, niah_cpu_grid.sh and mad_cpu_grid.sh take it the same way) runs
    each of its sweeps with --status."""
    env = {**os.environ, "PYTHONPATH": REPO, "PYTHON": sys.executable, "STATUS": "1",
           "MODELS": "deltanet", "SEEDS": "0", "FINISHED_IN": ""}
    script = ["bash", os.path.join(REPO, "scripts", "parity_neg_eig_grid.sh"),
              str(tmp_path / "grid")]
    proc = subprocess.run(script, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("state_tracking deltanet seed 0: not started") == 2, proc.stdout
    assert not os.path.exists(tmp_path / "grid")
    # By default the committed cells (its report's runs record) count as finished: a
    # fresh machine resumes the grid where the committed results end. The committed cells
    # were made under each variant's own initialisation, which the scaffold no longer
    # declares (Grazzi et al.'s since 2026-12-07): they are not this grid's runs now.
    del env["FINISHED_IN"]
    proc = subprocess.run(script, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("state_tracking deltanet seed 0: not started") == 2, proc.stdout
    # A record of this grid's config counts (FINISHED_IN: another record), and the
    # catalogue's grid (scripts/state_tracking_cpu_grid.sh) shares the ablation's [0, 1]
    # cells through it.
    config = plan.expected_config("state_tracking", "deltanet", 0, "mini", [])
    record = tmp_path / "st_runs.jsonl"
    record.write_text(json.dumps({"task": "state_tracking", "model": "deltanet",
                                  "test_accuracy": 0.5, "config": config}) + "\n")
    env["FINISHED_IN"] = str(record)
    proc = subprocess.run(script, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(f"state_tracking deltanet seed 0: finished (recorded in "
                             f"{record})") == 1, proc.stdout  # [0, 1]; [-1, 1] is not
    script = ["bash", os.path.join(REPO, "scripts", "state_tracking_cpu_grid.sh"),
              str(tmp_path / "grid")]
    proc = subprocess.run(script, cwd=REPO, env={**env, "MODELS": "deltanet transformer"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"state_tracking deltanet seed 0: finished (recorded in {record})" in \
        proc.stdout, proc.stdout
    assert "state_tracking transformer seed 0: not started" in proc.stdout, proc.stdout
    assert not os.path.exists(tmp_path / "grid")


def test_the_queue_of_every_cpu_grid_lists_steps_that_exist(tmp_path):
    """scripts/cpu_grids.sh (one copy per core, sharing the runs): LIST=1 prints its steps
    in order, each a grid script of this checkout (or lra.sweep), and runs nothing."""
    env = {**os.environ, "LIST": "1"}
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "cpu_grids.sh")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and all(re.match(rf"{i}\. issue (68|72): ", line)
                         for i, line in enumerate(lines, 1)), lines
    for line in lines:
        scripts = re.findall(r"scripts/\S+\.sh", line)
        assert scripts or "-m lra.sweep" in line, line
        for script in scripts:
            path = os.path.join(REPO, script)
            assert os.path.exists(path), line
            assert subprocess.run(["bash", "-n", path]).returncode == 0, script
    # STATUS=1 of the last state-tracking step alone (FROM=TO; MODELS narrows the steps
    # that take their script's default): each sweep's status, then the step's and the
    # queue's sums of them.
    last = max(i for i, line in enumerate(lines, 1) if "state_tracking_cpu_grid.sh" in line)
    env = {**os.environ, "STATUS": "1", "FROM": str(last), "TO": str(last),
           "MODELS": "deltanet", "PYTHON": sys.executable, "PYTHONPATH": REPO}
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "cpu_grids.sh")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count("state_tracking deltanet seed ") == 2, out  # its 2 seeds
    left = out.count(": not started") + out.count(": running") + out.count(": stopped")
    assert out.count("\n== ") + out.startswith("== ") == 1, out  # that step alone
    step = re.search(rf"^step {last}: (\d+) runs left, about ([\d.]+) h", out, re.M)
    assert step and int(step.group(1)) == left, out
    whole = re.search(r"^every step: (\d+) runs left, about ([\d.]+) h", out, re.M)
    assert whole and whole.groups() == step.groups(), out
    # A FROM or TO that is not a step number: one line, nothing run.
    for bound in ("FROM", "TO"):
        proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "cpu_grids.sh")],
                              cwd=REPO, env={**env, bound: "x"}, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2 and proc.stderr.startswith(f"error: {bound}=x"), \
            proc.stderr
        assert not proc.stdout, proc.stdout


def test_runs_a_committed_record_holds_count_as_finished(tmp_path, monkeypatch):
    """--finished_in: a grid continued on a fresh machine (its workdirs gone) skips the
    runs whose config the committed _runs.jsonl records, whatever folder they ran in; a
    record of another config does not count; --status says where the record is."""
    root, calls, logged = str(tmp_path / "sweep"), [], []
    fake_launch(monkeypatch, calls)
    config = plan.expected_config("listops", "transformer", 0, "runlocal", [])
    record = {"task": "listops", "model": "transformer", "test_accuracy": 0.25,
              "steps": 3, "train_steps_per_sec": 2.0, "config": config,
              "run_dir": "workdirs/elsewhere/listops/transformer/seed0"}
    other = {**record, "config": {**config, "num_train_steps": 7}}
    runs = tmp_path / "grid_runs.jsonl"
    runs.write_text(json.dumps(other) + "\n" + json.dumps(record) + "\n")
    finished = plan.load_finished_records([str(runs)])
    outcome = sweep.sweep(seeds=[0, 1], sweep_dir=root, overrides=[], log=logged.append,
                          finished_in=finished, **SWEEP)
    assert outcome["skipped"] == [("transformer", 0)], logged
    assert outcome["done"] == [("transformer", 1)]  # seed 1's config is not recorded
    assert calls == [plan.run_dir(os.path.abspath(root), "listops", "transformer", 1)]
    assert f"finished earlier (recorded in {runs}), skipped" in logged[0]
    assert not os.path.exists(plan.run_dir(root, "listops", "transformer", 0))
    # Only the record of another config: seed 0 runs.
    only_other = plan.load_finished_records([str(runs)])[:1]
    again = sweep.sweep(seeds=[0], sweep_dir=str(tmp_path / "b"), overrides=[],
                        log=lambda _: None, finished_in=only_other, **SWEEP)
    assert again["done"] == [("transformer", 0)]
    infos = []
    state = sweep.sweep(seeds=[0], sweep_dir=str(tmp_path / "c"), overrides=[],
                        log=logged.append, finished_in=finished, status=infos, **SWEEP)
    assert state["finished"] == [("transformer", 0)]
    assert f"finished (recorded in {runs}): test 25.00%, 3 steps" in logged[-1]
    assert infos[0]["finished_rate"] == 2.0
    # A list that became a comma string ([] then "") is the same empty value.
    assert plan.config_differences({**config, "layers": []}, {**config, "layers": ""}) == []
    # An --override of a builder argument its preset lacks is another run, unless it sets
    # the builder's default: a record without it (the default) is not a run of use_bias=False.
    biased = {**config, "model_hparams": {"use_bias": True}}
    unbiased = {**config, "model_hparams": {"use_bias": False}}
    assert plan.config_differences(config, biased) == []
    assert plan.config_differences(config, unbiased) == [
        "model_hparams.use_bias: (absent: the builder's default) -> false"]
    assert plan.recorded_run(finished, "listops", "transformer", 0, "runlocal",
                             ["model_hparams.use_bias=False"]) is None
    assert plan.recorded_run(finished, "listops", "transformer", 0, "runlocal",
                             ["model_hparams.use_bias=True"])[1] == record


def test_a_committed_mad_record_counts_as_finished():
    """A MAD sweep (`--task=mad`, task=<name> in its config argument) finds its committed
    record, which names the resolved task (mad_in_context_recall): a fresh machine does
    not run it again (it did: the record's task was told against the sweep's `mad`). The
    committed runs were made under each variant's own initialisation: a sweep of that
    (--override=scaffold.init=own) finds them, one of MAD's own (the default since
    2026-12-07) does not."""
    records = plan.load_finished_records([os.path.join(REPO, "results", "cpu",
                                                       "mad_2025_runs.jsonl")])
    own = ["scaffold.init=own"]
    found = plan.recorded_run(records, "mad", "kda", 1, "task=in_context_recall,mini", own)
    assert found and found[1]["task"] == "mad_in_context_recall", found
    assert found[1]["config"]["random_seed"] == 1
    assert plan.recorded_run(records, "mad", "kda", 1, "task=in_context_recall,mini",
                             []) is None
    # Another MAD task's record of the same model and seed is not that run.
    other = [(p, r) for p, r in records if r["task"] != "mad_in_context_recall"]
    assert plan.recorded_run(other, "mad", "kda", 1, "task=in_context_recall,mini",
                             own) is None


def test_a_finished_in_file_that_is_not_a_runs_record_is_one_line(tmp_path):
    args = ["--task=state_tracking", "--models=deltanet", "--config_arg=runlocal",
            "--seeds=0", f"--sweep_dir={tmp_path / 'sweep'}"]
    _one_line_error(_cli("lra.sweep", *args, f"--finished_in={tmp_path / 'none.jsonl'}",
                         cwd=REPO), "none.jsonl: cannot be read")
    bad = tmp_path / "bad_runs.jsonl"
    bad.write_text('{"task": "mqar", "model": "gla", "test_accuracy": 0.5}\n{"task": 1}\n')
    _one_line_error(_cli("lra.sweep", *args, f"--finished_in={bad}", cwd=REPO),
                    "bad_runs.jsonl:2: not a run's record")
    assert not os.path.exists(tmp_path / "sweep")  # refused before anything is made


def test_the_sweep_names_its_tasks_report():
    """The `Report:` line a sweep ends with: tasks tested at other lengths (their config's
    eval_lengths, as the sweep builds it) go to lra.length_report, into the record's own
    files when the sweep continues one."""
    assert args.tests_lengths("niah", "gla", 0, "runlocal", [])
    assert args.tests_lengths("flipflop", "gla", 0, "runlocal", [])  # its tails: splits
    assert not args.tests_lengths("enwik8", "gla", 0, "runlocal", [])
    assert args.tests_lengths("enwik8", "gla", 0, "runlocal", ["eval_lengths=128"])
    assert args.report_command(["mqar"], [], "w") == "python -m lra.synthetic_report w"
    assert args.report_command(["state_tracking"], ["results/cpu/st_parity_runs.jsonl"],
                                "w/neg", ["state_tracking"]) == (
        "python -m lra.length_report results/cpu/st_parity_runs.jsonl w/neg "
        "--out=results/cpu/st_parity")
    assert args.report_command(["niah"], [], "w", ["niah"]) == \
        f"python -m lra.length_report w --out={os.path.join('w', 'niah')}"
    assert args.report_command(["listops", "niah"], [], "w", ["niah"]) == \
        "python -m lra.report w"


def test_a_record_times_the_runs_of_the_task_its_config_resolves_to(tmp_path):
    """A MAD sweep is `--task=mad` with task=<name> in its config argument; the record
    names the resolved task (mad_compression): that record times it, another task's not."""
    config = plan.expected_config("mad", "transformer", 0, "task=compression,runlocal", [])

    def record(task, rate, **size):
        return ("runs.jsonl", {"task": task, "model": "transformer", "test_accuracy": 0.5,
                               "train_steps_per_sec": rate, "config": {**config, **size}})

    def inspect(*records):
        return run_status.inspect(
            workdir=str(tmp_path / "seed1"), task="mad", model="transformer", seed=1,
            config_arg="task=compression,runlocal", overrides=[], finished_in=list(records))

    info = inspect(record("mad_compression", 2.0), record("mad_memorization", 9.0))
    assert info["state"] == "not started" and info["folder_rates"] == [2.0]
    # Only a run of its size times it: not one twice as long, twice as wide or with
    # another model hyperparameter (each another step time); another lr or seed does.
    longer = record("mad_compression", 4.0, max_length=2 * config["max_length"])
    wider = record("mad_compression", 5.0, emb_dim=2 * config["emb_dim"])
    hparams = record("mad_compression", 6.0, model_hparams={"num_kv_heads": 1})
    lr = record("mad_compression", 3.0, learning_rate=0.5, random_seed=7)
    info = inspect(longer, wider, hparams, lr)
    assert info["folder_rates"] == [3.0] and info["other_sizes"] == 3
    info = inspect(longer)
    assert info["folder_rates"] == [] and info["other_sizes"] == 1
    # A hybrid's record names it by its layers; its config names the model swept.
    hybrid = ("runs.jsonl", {**lr[1], "model": "transformer+local@1",
                             "train_steps_per_sec": 8.0})
    assert inspect(hybrid)["folder_rates"] == [8.0]
    assert run_status.summary([info]).endswith(
        "time left: no estimate yet (no finished or logged run of transformer at this "
        "size; runs of other sizes do not time it)"), run_status.summary([info])


def _script_words(script: str, name: str) -> set[str]:
    """The words of a grid script's `NAME="..."` or `NAME=${NAME:-...}` default."""
    text = open(os.path.join(REPO, "scripts", script)).read()
    m = re.search(rf'^{name}=(?:"([^"]*)"|\$\{{{name}:-([^}}]*)\}})', text, re.M)
    assert m, f"{script} has no {name}"
    return set((m.group(1) or m.group(2)).split())


def test_every_model_of_the_length_grids_is_tested_where_its_weights_can_be():
    """The niah and state-tracking grids test each model past its training length, but
    those their scripts name in AT_TRAINING_LENGTH (their eval_lengths emptied), and a
    model is named there exactly when lra.training.lengths refuses its trained weights at
    a longer length (hyena: its position table z is shaped by the length). Checked on
    each model at the runlocal sizes, so that a grid cell does not fail after the queue
    reaches it, and the list does not outlive its reason."""
    from flax import nnx

    from configs import common
    from configs import niah as niah_config
    from configs import state_tracking as st_config
    from lra import tasks, train
    from lra.errors import ConfigError
    from lra.training import lengths

    for script, make in (("niah_cpu_grid.sh", niah_config),
                         ("state_tracking_cpu_grid.sh", st_config)):
        models = _script_words(script, "GRID13") | _script_words(script, "ROWS2025")
        only = _script_words(script, "AT_TRAINING_LENGTH")
        assert only <= models, only - models
        refused = set()
        for model in sorted(models):
            config = common.resolve(make.get_config(f"model={model},runlocal"))
            task = tasks.get(config.task)
            try:
                lengths.plan(config, task,
                             lambda c: nnx.eval_shape(lambda: train.build_model(c, task)))
            except ConfigError as e:
                assert "shaped by the length" in str(e), (model, str(e))
                refused.add(model)
        assert refused == only, (script, refused, only)


def test_the_newest_jax_root_hands_every_grid_knob_to_the_grids():
    """scripts/jax_env.sh runs a command in a root with a clean environment: each knob the
    grid scripts read (STATUS, FROM, MODELS, ...) must be in its GRID_ENV, or `STATUS=1
    scripts/jax_env.sh run latest bash scripts/cpu_grids.sh` runs the queue instead of
    reporting on it. PYTHON (a host path) and TOTALS (set inside) are not handed over."""
    import glob

    knobs = set()
    for path in glob.glob(os.path.join(REPO, "scripts", "*grid*.sh")):
        knobs |= set(re.findall(r"\$\{([A-Z_]+)[:-]", open(path).read()))
    text = open(os.path.join(REPO, "scripts", "jax_env.sh")).read()
    (grid_env,) = re.findall(r"^GRID_ENV='([^']*)'", text, re.M)
    assert knobs - {"PYTHON", "TOTALS"} == set(grid_env.split("|")), (knobs, grid_env)
    assert "$GRID_ENV" in text.split("GRID_ENV=", 1)[1]

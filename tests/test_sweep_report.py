"""lra.sweep runs and skips; lra.report tabulates and plots."""
import json
import os
import re
import subprocess
import sys

import pytest

from lra import report, sweep
from lra.reporting import tables
from lra.runs import plan
from lra.runs.results import collect
from lra.training import checkpoint
from tests.fake_launch import REPO, SWEEP, fake_launch, write_run
from tests.fake_launch import cli as _cli
from tests.fake_launch import one_line_error as _one_line_error


def _write(root, task, model, seed, acc, sps=10.0, mem=1000, base=0.2):
    d = os.path.join(root, task, model, f"seed{seed}")
    os.makedirs(d)
    with open(os.path.join(d, "results.json"), "w") as f:
        json.dump({"task": task, "model": model, "test_accuracy": acc,
                   "train_steps_per_sec": sps, "train_step_temp_bytes": mem,
                   "majority_baseline_accuracy": base}, f)


def test_report_table_csv_and_plot(tmp_path):
    root = str(tmp_path)
    _write(root, "listops", "transformer", 0, 0.30)
    _write(root, "listops", "transformer", 1, 0.40)
    _write(root, "text", "transformer", 0, 0.60, base=0.5)
    _write(root, "listops", "linear", 0, 0.20, sps=20.0, mem=250)
    paths = report.report(root)
    text = open(paths["markdown"]).read()
    assert "| model | listops | text | avg |" in text
    # mean 35.00, sample std of (30, 40) = 7.07; average over both tasks = 47.50
    assert "| transformer | 35.00 ± 7.07 | 60.00 | 47.50 |" in text
    assert "| linear | 20.00 | - | 20.00* |" in text  # partial row marked
    assert "| (majority class) | 20.00 | 50.00 |  |" in text
    # What the runs cost: these record neither run_seconds nor their steps.
    assert "\nCompute: 4 runs recorded before run_seconds existed.\n" in text
    assert open(paths["csv"]).read().splitlines()[0] == "model,listops,text,avg"
    with open(paths["plot"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_figure_takes_speed_and_memory_from_a_benchmark_csv(tmp_path):
    from lra import benchmark
    bench = str(tmp_path / "bench.csv")
    old = {"mode": "train_step", "repeats": 3}
    new = {"mode": "train_step", "repeats": 5}
    benchmark.append_csv(bench, {"model": "transformer", "length": 1024, "time_s": 9.0,
                                 "temp_bytes": 9}, old)  # an earlier run: ignored
    for model, length, time_s, temp in [("transformer", 1024, 0.2, 400),
                                        ("linear", 1024, 0.05, 100),
                                        ("transformer", 2048, 0.8, 1600),
                                        ("linear", 2048, 0.1, 200)]:
        benchmark.append_csv(bench, {"model": model, "length": length, "time_s": time_s,
                                     "temp_bytes": temp}, new)
    benchmark.append_csv(bench, {"model": "transformer", "length": 4096,
                                 "error": "out of memory"}, new)
    length, ratios = report.efficiency_ratios(bench)
    assert length == 2048  # the longest with a transformer value
    assert ratios == {"transformer": (1.0, 1.0), "linear": (8.0, 0.125)}
    assert report.efficiency_ratios(bench, 1024)[1]["linear"] == (4.0, 0.25)
    with pytest.raises(ValueError, match="not measured at L=4096"):
        report.efficiency_ratios(bench, 4096)

    root = str(tmp_path / "runs")
    _write(root, "listops", "transformer", 0, 0.30, sps=10.0)
    _write(root, "listops", "linear", 0, 0.20, sps=1.0)  # a run that shared the machine
    _write(root, "listops", "lite", 0, 0.25)  # not benchmarked
    summary = report.summarize(collect(root))
    assert tables.figure_points(summary) == [("transformer", 1.0, 30.0, 1.0),
                                             ("linear", 0.1, 20.0, 1.0),
                                             ("lite", 1.0, 25.0, 1.0)]
    assert tables.figure_points(summary, (length, ratios)) == [
        ("transformer", 1.0, 30.0, 1.0), ("linear", 8.0, 20.0, 0.125),
        ("lite", None, 25.0, 1.0)]
    paths = report.report(root, out=str(tmp_path / "out"), efficiency_csv=bench)
    with open(paths["plot"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_report_without_results(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results.json"):
        report.report(str(tmp_path))


def test_sweep_runs_skips_and_records_failures(listops_dir, tmp_path):
    common = dict(task="listops", seeds=[0], config_arg="runlocal", sweep_dir=str(tmp_path),
                  overrides=[f"data_dir={listops_dir}", "max_length=48",
                             "num_train_steps=2", "eval_frequency=2"], log=lambda _: None)
    logged = []
    cache = tmp_path / "programs"
    first = sweep.sweep(models=["transformer"], compilation_cache=str(cache),
                        **dict(common, log=logged.append))
    assert first["done"] == [("transformer", 0)]
    # The run kept its compiled programs where the sweep said (the tests cache every program).
    assert cache.is_dir() and any(cache.iterdir())
    # Where the run's time went (its results.json run_seconds), in the sweep's line.
    assert re.search(r"seed 0: done in \d+ s \(training \d+ s, validation \d+ s, test \d+ s\)$",
                     logged[-1]), logged
    results = os.path.join(plan.run_dir(str(tmp_path), "listops", "transformer", 0,
                                        common["overrides"]), "results.json")
    assert json.load(open(results))["steps"] == 2
    # The config launch.py recorded is the one the sweep expects: skipped, not refused.
    again = sweep.sweep(models=["transformer"], **common)
    assert again["skipped"] == [("transformer", 0)] and not again["done"]
    assert not again["refused"]
    bad = dict(common, overrides=common["overrides"] + ["learning_rate=oops"])
    failed = sweep.sweep(models=["transformer"], **dict(bad, seeds=[1]))
    assert failed["failed"] == [("transformer", 1)]
    error = open(os.path.join(plan.run_dir(str(tmp_path), "listops", "transformer", 1,
                                           bad["overrides"]), "error.txt")).read()
    assert "learning_rate" in error


def test_report_marks_runs_that_reduce_to_dense_attention(tmp_path):
    """ListOps mini (64 tokens + CLS): the old window of 128 is dense attention."""
    root = str(tmp_path)
    runs = [("transformer", {}, 0.387), ("local", {"window": 128}, 0.387),
            ("bigbird", {"block": 2, "num_random_blocks": 3, "num_global_blocks": 2}, 0.35),
            ("nope", {}, 0.30),  # a model this checkout does not have
            ("linformer", {"k": 1}, 0.2)]  # issue 27: the old mini preset, one summary
    for model, hparams, acc in runs:
        _write(root, "listops", model, 0, acc)
        path = os.path.join(root, "listops", model, "seed0", "results.json")
        r = json.load(open(path))
        r["config"] = {"task": "listops", "model": model, "model_hparams": hparams,
                       "max_length": 64, "pooling": "CLS", "causal": False}
        json.dump(r, open(path, "w"))
    paths = report.report(root)
    text = open(paths["markdown"], encoding="utf-8").read()
    assert "| transformer | 38.70 | 38.70 |" in text
    assert f"| local | 38.70 {report.DENSE_MARK} | 38.70 |" in text
    assert "| bigbird | 35.00 | 35.00 |" in text
    assert "| nope | 30.00 | 30.00 |" in text  # no mark ...
    assert "warning: listops nope: could not check" in text  # ... and a warning line
    assert report.DENSE_NOTE in text
    assert f"| linformer | 20.00 {report.DEGENERATE_MARK} | 20.00 |" in text
    assert report.DEGENERATE_NOTE in text
    assert f"38.70 {report.DENSE_MARK}" in open(paths["csv"], encoding="utf-8").read()


# --- lra.sweep: what a failed run leaves, which finished runs count ---------------------



def _runs_write_down(variable, path, monkeypatch):
    """Each run the sweep starts appends repr(os.environ.get(variable)) to `path` and
    writes a results.json of the expected config, in place of training."""
    def command(task, model, seed, config_arg, workdir, overrides):
        config = plan.expected_config(task, model, seed, config_arg, overrides)
        return [sys.executable, "-c",
                "import json, os\n"
                f"open({str(path)!r}, 'a').write(repr(os.environ.get({variable!r})) + '\\n')\n"
                f"json.dump({{'config': {config!r}}}, open({workdir!r} + '/results.json', 'w'))"]
    monkeypatch.setattr(plan, "command", command)


def test_a_sweeps_runs_share_a_compilation_cache(tmp_path, monkeypatch):
    """Each run is started with JAX_COMPILATION_CACHE_DIR: the sweep's own folder by
    default, the user's where it is set, another folder, or none."""
    seen = []
    _runs_write_down("JAX_COMPILATION_CACHE_DIR", tmp_path / "seen", monkeypatch)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    for i, cache in enumerate(["sweep", "none", str(tmp_path / "mine")]):
        sweep_dir = tmp_path / f"sweep{i}"
        done = sweep.sweep(**SWEEP, seeds=[0], sweep_dir=str(sweep_dir), overrides=[],
                           log=lambda _: None, compilation_cache=cache)
        assert done["done"] == [("transformer", 0)]
        seen.append(str(sweep_dir / "xla_cache") if cache == "sweep" else
                    None if cache == "none" else cache)
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/elsewhere")
    sweep.sweep(**SWEEP, seeds=[0], sweep_dir=str(tmp_path / "sweep3"), overrides=[],
                log=lambda _: None)
    seen.append("/elsewhere")  # the user's cache is kept
    lines = (tmp_path / "seen").read_text().splitlines()
    assert lines == [repr(s) for s in seen]
    # A relative folder is made absolute: runs run in cli.run_root(), not here.
    env = plan.run_environment("rel", "relative_cache", environ={})
    assert env["JAX_COMPILATION_CACHE_DIR"] == os.path.abspath("relative_cache")
    # An empty value would be the folder runs start in: refused in one line, nothing run.
    _one_line_error(_cli("lra.sweep", "--compilation_cache=", "--models=transformer",
                         "--config_arg=runlocal", f"--sweep_dir={tmp_path / 'x'}", cwd=REPO),
                    "--compilation_cache is empty")
    assert not os.path.exists(tmp_path / "x")


def test_a_sweeps_runs_ask_glibc_for_huge_pages(tmp_path, monkeypatch):
    """Each run starts with glibc.malloc.hugetlb=1 in GLIBC_TUNABLES (XLA's per-step
    buffers without a page fault per 4 KiB), added to the user's other tunables; a
    hugetlb value the user set is kept."""
    _runs_write_down("GLIBC_TUNABLES", tmp_path / "seen", monkeypatch)
    for i, given in enumerate([None, "glibc.malloc.arena_max=2", "glibc.malloc.hugetlb=0"]):
        if given is None:
            monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
        else:
            monkeypatch.setenv("GLIBC_TUNABLES", given)
        done = sweep.sweep(**SWEEP, seeds=[0], sweep_dir=str(tmp_path / f"s{i}"),
                           overrides=[], log=lambda _: None)
        assert done["done"] == [("transformer", 0)]
    lines = (tmp_path / "seen").read_text().splitlines()
    assert lines == [repr("glibc.malloc.hugetlb=1"),
                     repr("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"),
                     repr("glibc.malloc.hugetlb=0")]


def test_launch_runs_itself_again_with_huge_pages(tmp_path, monkeypatch):
    """`launch.py` (lra.launch.run) first runs itself again, same pid and arguments, with
    glibc.malloc.hugetlb=1 where GLIBC_TUNABLES does not choose it (glibc reads tunables
    only at a process's start); a value the user chose is kept, and it runs once."""
    import subprocess

    from lra import launch
    from lra.runs import cli

    (tmp_path / "probe.py").write_text(
        "import os, sys\n"
        "from lra.runs import cli\n"
        "print('start', os.getpid(), flush=True)\n"
        "cli.exec_with_huge_pages('probe')\n"
        "print(repr(os.environ.get('GLIBC_TUNABLES')), os.getpid(), sys.argv[1:])\n")
    for given, expected in ((None, "glibc.malloc.hugetlb=1"),
                            ("glibc.malloc.hugetlb=0", "glibc.malloc.hugetlb=0")):
        env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), REPO])
        if given:
            env["GLIBC_TUNABLES"] = given
        out = subprocess.run([sys.executable, "-m", "probe", "a", "--b=1"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=120).stdout
        lines = out.splitlines()
        starts = [line.split()[1] for line in lines if line.startswith("start ")]
        assert lines[-1] == f"{expected!r} {starts[0]} ['a', '--b=1']", out
        assert len(starts) == (2 if given is None else 1) and len(set(starts)) == 1
    seen = []
    monkeypatch.setattr(cli, "exec_with_huge_pages", seen.append)
    monkeypatch.setattr(launch, "supervise", lambda argv: None)
    monkeypatch.setattr(launch.app, "run", lambda *a, **k: None)
    launch.run()
    assert seen == ["lra.launch"]


def test_a_run_another_process_holds_is_left_to_it(listops_dir, tmp_path):
    """Two sweeps of one grid share its runs: launch.py refuses a workdir whose lock a live
    run holds (exit code 75), and the sweep leaves that run to it, not failed."""
    common = dict(task="listops", seeds=[0], config_arg="runlocal", sweep_dir=str(tmp_path),
                  overrides=[f"data_dir={listops_dir}", "max_length=48",
                             "num_train_steps=2", "eval_frequency=2"])
    workdir = plan.run_dir(str(tmp_path), "listops", "transformer", 0, common["overrides"])
    held = checkpoint.WorkdirLock(workdir)
    held.acquire()  # this test process is the other sweep's run
    logged = []
    try:
        out = sweep.sweep(models=["transformer"], log=logged.append, **common)
    finally:
        held.release()
    assert out["busy"] == [("transformer", 0)] and not out["failed"], dict(out)
    assert "running in another process, left to it" in logged[-1], logged
    assert "in use by another run" in logged[-1], logged  # launch.py's own line, quoted
    assert not os.path.exists(os.path.join(workdir, "error.txt"))
    assert not os.path.exists(os.path.join(workdir, "results.json"))


def test_sweep_keeps_the_whole_stderr_of_a_failed_run(tmp_path, monkeypatch):
    lines = [f"warning {i}" for i in range(40)] + ["Traceback (most recent call last):",
                                                   "ValueError: the real reason"]
    logged, calls = [], []
    fake_launch(monkeypatch, calls, lines, exit_code=1)
    outcome = sweep.sweep(seeds=[0], sweep_dir=str(tmp_path), overrides=[],
                          log=logged.append, **SWEEP)
    assert outcome["failed"] == [("transformer", 0)]
    workdir = plan.run_dir(str(tmp_path), "listops", "transformer", 0)
    stderr_path = os.path.join(workdir, "stderr.txt")
    kept = open(stderr_path).read()
    assert all(line in kept for line in lines)  # all of it, beside log.txt
    assert os.path.exists(os.path.join(workdir, "log.txt"))
    failure = [l for l in logged if "FAILED" in l]
    assert len(failure) == 1 and "\n" not in failure[0]
    assert "ValueError: the real reason" in failure[0] and stderr_path in failure[0]
    assert open(os.path.join(workdir, "error.txt")).read().splitlines()[0] == \
        "ValueError: the real reason"
    # A retry appends its own stderr; the message quotes the retry's last line.
    fake_launch(monkeypatch, calls, ["error: another reason"], exit_code=2)
    logged.clear()
    sweep.sweep(seeds=[0], sweep_dir=str(tmp_path), overrides=[], log=logged.append, **SWEEP)
    kept = open(stderr_path).read()
    assert "ValueError: the real reason" in kept and kept.count("====") == 2
    assert "error: another reason" in [l for l in logged if "FAILED" in l][0]


def test_sweep_gives_each_set_of_overrides_its_own_workdirs(tmp_path, monkeypatch):
    root = str(tmp_path)
    a, b = ["num_train_steps=3", "warmup=1"], ["num_train_steps=4", "warmup=1"]
    assert plan.run_dir(root, "listops", "transformer", 0) == os.path.join(
        root, "listops", "transformer", "seed0")  # no overrides: the plain name
    dir_a = plan.run_dir(root, "listops", "transformer", 0, a)
    assert dir_a != plan.run_dir(root, "listops", "transformer", 0, b)
    assert dir_a == plan.run_dir(root, "listops", "transformer", 0, a[::-1])  # order aside
    assert os.path.basename(dir_a).startswith("seed0-")
    calls = []
    fake_launch(monkeypatch, calls)
    first = sweep.sweep(seeds=[0], sweep_dir=root, overrides=a, log=lambda _: None, **SWEEP)
    assert first["done"] == [("transformer", 0)] and calls == [dir_a]
    assert json.load(open(os.path.join(dir_a, "sweep.json")))["overrides"] == a
    # Changed overrides: not counted as done, run again next to the first.
    second = sweep.sweep(seeds=[0], sweep_dir=root, overrides=b, log=lambda _: None, **SWEEP)
    assert second["done"] == [("transformer", 0)] and not second["skipped"]
    assert calls[-1] == plan.run_dir(root, "listops", "transformer", 0, b)
    # The same overrides again (another order): finished, skipped.
    third = sweep.sweep(seeds=[0], sweep_dir=root, overrides=a[::-1], log=lambda _: None,
                        **SWEEP)
    assert third["skipped"] == [("transformer", 0)] and len(calls) == 2


def test_sweep_refuses_a_finished_run_of_another_config(tmp_path, monkeypatch):
    """A results.json in the sweep's workdir whose config is not the one the sweep would run
    (another --config_arg, a run started by hand, changed presets) is neither skipped as
    done nor overwritten: refused, naming the fields."""
    root = str(tmp_path)
    calls, logged = [], []
    fake_launch(monkeypatch, calls)
    workdir = plan.run_dir(root, "listops", "transformer", 0)
    os.makedirs(workdir)
    config = plan.expected_config("listops", "transformer", 0, "runlocal", [])
    config.update(num_train_steps=config["num_train_steps"] + 1,
                  log_every_steps=config["log_every_steps"] + 1)  # the latter changes nothing
    config["model_hparams"] = {"unused": 1}
    json.dump({"task": "listops", "model": "transformer", "config": config},
              open(os.path.join(workdir, "results.json"), "w"))
    outcome = sweep.sweep(seeds=[0], sweep_dir=root, overrides=[], log=logged.append, **SWEEP)
    assert outcome["refused"] == [("transformer", 0)]
    assert not outcome["skipped"] and not outcome["done"] and not calls
    (line,) = [l for l in logged if "REFUSED" in l]
    assert "num_train_steps" in line and workdir in line
    assert "log_every_steps" not in line  # NON_RESULT_FIELDS are not differences
    # Another --config_arg for the same folder: refused too.
    config = plan.expected_config("listops", "transformer", 0, "runlocal", [])
    json.dump({"task": "listops", "model": "transformer", "config": config},
              open(os.path.join(workdir, "results.json"), "w"))
    logged.clear()
    mini = sweep.sweep(seeds=[0], sweep_dir=root, overrides=[], log=logged.append,
                       **dict(SWEEP, config_arg="mini"))
    assert mini["refused"] == [("transformer", 0)] and not calls
    assert "max_length" in [l for l in logged if "REFUSED" in l][0]
    same = sweep.sweep(seeds=[0], sweep_dir=root, overrides=[], log=lambda _: None, **SWEEP)
    assert same["skipped"] == [("transformer", 0)]
    # Issue 35: a hand-made result with almost no config is not a finished run of it.
    json.dump({"task": "listops", "model": "transformer", "test_accuracy": 0.9,
               "config": {"model": "transformer"}},
              open(os.path.join(workdir, "results.json"), "w"))
    logged.clear()
    bare = sweep.sweep(seeds=[0], sweep_dir=root, overrides=[], log=logged.append, **SWEEP)
    assert bare["refused"] == [("transformer", 0)] and not bare["skipped"]
    assert "records no task, model_hparams" in [l for l in logged if "REFUSED" in l][0]


def test_report_counts_a_seed_once(tmp_path):
    """Two runs of one seed (a copied folder) are one seed, not '± 0.00' over two."""
    root = str(tmp_path)
    for folder, seed, acc in (("a", 0, 0.30), ("b", 0, 0.50), ("c", 1, 0.40)):
        d = os.path.join(root, folder)
        os.makedirs(d)
        json.dump({"task": "listops", "model": "transformer", "test_accuracy": acc,
                   "config": {"model": "transformer", "random_seed": seed}},
                  open(os.path.join(d, "results.json"), "w"))
    summary = report.summarize(collect(root))
    entry = summary[("listops", "transformer")]
    assert entry["seeds"] == 2 and abs(entry["accuracy"] - 0.35) < 1e-9  # a (0.30) and c
    text = open(report.report(root)["markdown"]).read()
    assert "2 runs with random_seed=0: counted as one seed" in text
    assert os.path.join(root, "a") + " kept" in text


def test_sweep_bad_seeds_is_one_line(tmp_path):
    proc = _cli("lra.sweep", "--seeds=0,a", f"--sweep_dir={tmp_path}", "--models=transformer",
                cwd=REPO)
    _one_line_error(proc, "--seeds", "'a'", "integer")
    assert not os.listdir(tmp_path)  # nothing started
    assert sweep.parse_seeds(["1", "-2"]) == [1, -2]


# --- lra.report: unusable results.json, configs that differ ---------------------------


def test_sweep_dir_that_cannot_be_a_folder_is_one_line(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    args = ["--task=listops", "--models=transformer", "--config_arg=runlocal", "--seeds=0"]
    _one_line_error(_cli("lra.sweep", *args, f"--sweep_dir={blocker}", cwd=str(tmp_path)),
                    "is a file, not a folder")
    _one_line_error(_cli("lra.sweep", *args, f"--sweep_dir={blocker}/sub", cwd=str(tmp_path)),
                    f"cannot write {blocker}/sub")


def test_report_skips_unusable_results_json_naming_each(tmp_path):
    root = str(tmp_path)
    _write(root, "listops", "transformer", 0, 0.30)
    bad = {"corrupt": '{"task": "listops", "model": "tr', "list": "[1, 2]",
           "missing": json.dumps({"task": "listops", "model": "linear"}),
           "notnumber": json.dumps({"task": "listops", "model": "linear",
                                    "test_accuracy": "high"})}
    for name, text in bad.items():
        os.makedirs(os.path.join(root, name))
        open(os.path.join(root, name, "results.json"), "w").write(text)
    skipped = []
    paths = report.report(root, skipped=skipped)
    text = open(paths["markdown"]).read()
    assert "| transformer | 30.00 | 30.00 |" in text
    assert "4 results.json skipped" in text and len(skipped) == 4
    for name, why in [("corrupt", "not valid JSON"), ("list", "a JSON list"),
                      ("missing", "missing test_accuracy"), ("notnumber", "not a number")]:
        (line,) = [l for l in text.splitlines() if os.path.join(root, name) in l]
        assert why in line
    assert collect(root)[0]["model"] == "transformer"  # warns, does not raise


def test_report_program_on_unusable_files_is_one_line(tmp_path):
    os.makedirs(tmp_path / "a")
    (tmp_path / "a" / "results.json").write_text("[]")
    proc = _cli("lra.report", str(tmp_path), cwd=REPO)
    _one_line_error(proc, "no usable results.json", "1 skipped",
                    str(tmp_path / "a" / "results.json"))


def _write_config(root, model, seed, acc, folder, **fields):
    d = os.path.join(root, "listops", model, folder)
    os.makedirs(d)
    config = {"task": "listops", "model": model, "random_seed": seed, "learning_rate": 0.05,
              "log_every_steps": 50, "model_hparams": {"window": 8}, "max_length": 64,
              "pooling": "CLS", "causal": False}
    for key, value in fields.items():
        if "." in key:
            outer, inner = key.split(".")
            config[outer] = {**config[outer], inner: value}
        else:
            config[key] = value
    with open(os.path.join(d, "results.json"), "w") as f:
        json.dump({"task": "listops", "model": model, "test_accuracy": acc,
                   "majority_baseline_accuracy": 0.2, "config": config}, f)


def test_report_averages_only_runs_of_one_config(tmp_path):
    root = str(tmp_path)
    _write_config(root, "transformer", 0, 0.30, "a")
    _write_config(root, "transformer", 1, 0.40, "b", log_every_steps=7)  # changes nothing
    _write_config(root, "transformer", 0, 0.10, "c", learning_rate=0.5)
    _write_config(root, "local", 0, 0.20, "d")
    _write_config(root, "local", 0, 0.26, "e", **{"model_hparams.window": 16})
    _write_config(root, "local", 1, 0.24, "f", **{"model_hparams.window": 16})
    summary = report.summarize(collect(root))
    assert summary[("listops", "transformer [learning_rate=0.05]")]["seeds"] == 2
    assert summary[("listops", "transformer [learning_rate=0.5]")]["accuracy"] == 0.10
    assert summary[("listops", "local [model_hparams.window=16]")]["seeds"] == 2
    text = open(report.report(root)["markdown"], encoding="utf-8").read()
    assert "| transformer [learning_rate=0.05] | 35.00 ± 7.07 | 35.00 |" in text
    assert "| transformer [learning_rate=0.5] | 10.00 | 10.00 |" in text
    assert "| local [model_hparams.window=8] | 20.00 | 20.00 |" in text
    assert "| local [model_hparams.window=16] | 25.00 ± 1.41 | 25.00 |" in text
    assert "are separate rows" in text
    # One config: the plain model name, as before.
    other = str(tmp_path / "other")
    _write_config(other, "transformer", 0, 0.30, "a")
    _write_config(other, "transformer", 1, 0.40, "b", checkpoint_freq=3, sharding="fsdp")
    assert list(report.summarize(collect(other))) == [("listops", "transformer")]
    # The same seed twice in one row is not two seeds: a warning says so.
    _write_config(other, "transformer", 1, 0.40, "copy")
    assert "2 runs with random_seed=1" in open(report.report(other)["markdown"]).read()


def test_an_override_its_preset_lacks_is_a_row_of_its_own(tmp_path):
    """A model_hparams key only some runs recorded is an --override its preset lacks, not a
    field added since: the other runs ran at the builder's default and are compared so
    (a run at the default shares their row)."""
    root = str(tmp_path)
    _write_config(root, "transformer", 0, 0.30, "a")
    _write_config(root, "transformer", 1, 0.10, "b", **{"model_hparams.use_bias": False})
    _write_config(root, "transformer", 2, 0.50, "c", **{"model_hparams.use_bias": True})
    summary = report.summarize(collect(root))
    assert summary[("listops", "transformer [model_hparams.use_bias=true]")]["seeds"] == 2
    assert summary[("listops", "transformer [model_hparams.use_bias=false]")]["seeds"] == 1


def test_a_run_recorded_before_a_field_existed_shares_the_row_of_its_config(tmp_path):
    """dtype (added later) absent from an older run's record means float32: the run and a
    new float32 run of the same config are one row of two seeds; a bfloat16 run is not."""
    root = str(tmp_path)
    new = plan.expected_config("listops", "transformer", 1, "mini", [])
    old = {k: v for k, v in plan.expected_config("listops", "transformer", 0, "mini",
                                                 []).items() if k != "dtype"}
    assert new["dtype"] == "float32"
    write_run(root, "transformer", 0, 0.38, old)
    write_run(root, "transformer", 1, 0.40, new)
    header, rows = report.table_rows(report.summarize(collect(root)))
    assert [r[0] for r in rows] == ["transformer", "(majority class)"]
    write_run(root, "transformer_bf16", 2, 0.36, {**new, "dtype": "bfloat16",
                                                   "random_seed": 2})
    header, rows = report.table_rows(report.summarize(collect(root)))
    assert [r[0] for r in rows][:2] == ["transformer [dtype=float32]",
                                        "transformer [dtype=bfloat16]"] or \
        [r[0] for r in rows][:2] == ["transformer [dtype=bfloat16]",
                                     "transformer [dtype=float32]"]


def test_sigterm_to_a_sweep_stops_its_run_and_leaves_no_orphan(listops_dir, tmp_path):
    """Issue 46, item 2: SIGTERM to lra.sweep used to exit 143 at once and leave its
    launch.py child training to the end (a re-run then called it FAILED "in use"). Now the
    signal reaches the child, which saves and stops; the sweep waits, says so in one line
    and exits 143; no error.txt, and the same command resumes the run."""
    import signal
    import time

    args = ["--task=listops", "--models=transformer", "--config_arg=runlocal", "--seeds=0",
            f"--sweep_dir={tmp_path}", f"--override=data_dir={listops_dir}",
            "--override=max_length=48", "--override=num_train_steps=100000",
            "--override=checkpoint_freq=100000", "--override=eval_frequency=100000",
            "--override=log_every_steps=5"]
    proc = subprocess.Popen([sys.executable, "-m", "lra.sweep", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": REPO})
    logs = []
    deadline = time.time() + 240
    while time.time() < deadline and not any(
            line.startswith("step") for log in logs for line in open(log)):
        time.sleep(0.2)
        logs = [os.path.join(d, "log.txt") for d, _, files in os.walk(tmp_path)
                if "log.txt" in files]
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, (out, err)
    assert "stopped by SIGTERM" in out and "Traceback" not in err, (out, err)
    (workdir,) = {os.path.dirname(log) for log in logs}
    assert "SIGTERM: saved step" in open(os.path.join(workdir, "log.txt")).read()
    assert not os.path.exists(os.path.join(workdir, "error.txt"))
    assert not os.path.exists(os.path.join(workdir, "results.json"))
    assert os.listdir(os.path.join(workdir, "checkpoints", "last"))
    # The child is gone (the sweep waited for it): no process runs in that workdir.
    running = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
        except OSError:
            continue
        if f"--workdir={workdir}" in cmdline:
            running.append(pid)
    assert not running, running


def test_older_runs_without_newer_fields_share_the_row_and_the_sweep(tmp_path):
    """Issue 46, item 8: a results.json recorded before `attention_impl`, `pos_emb` or
    `block.*` existed was a finished run of this config for lra.sweep but a separate
    row "(absent)" in lra.report. One rule for both: a field only some runs recorded is
    not compared, unless its absence means a value (results.IMPLIED_WHEN_ABSENT)."""
    root = str(tmp_path)
    _write_config(root, "local", 0, 0.20, "old")  # recorded before the newer fields
    _write_config(root, "local", 1, 0.30, "new", attention_impl="xla", pos_emb="learned",
                  block={"kind": "pre_ln", "ffn": True})
    _write_config(root, "local", 2, 0.10, "bf16", dtype="bfloat16")  # not implied: apart
    summary = report.summarize(collect(root))
    assert summary[("listops", "local [dtype=float32]")]["seeds"] == 2
    assert summary[("listops", "local [dtype=float32]")]["accuracy"] == pytest.approx(0.25)
    assert summary[("listops", "local [dtype=bfloat16]")]["seeds"] == 1
    assert not any("(absent)" in label for _, label in summary)
    # The sweep's rule, the same way: the old run is this config's finished run, the
    # bfloat16 one is not a float32 sweep's.
    old = json.load(open(os.path.join(root, "listops", "local", "old", "results.json")))
    new = json.load(open(os.path.join(root, "listops", "local", "new", "results.json")))
    assert plan.config_differences(old["config"], {**new["config"], "random_seed": 0}) == []
    assert plan.config_differences({**old["config"], "dtype": "bfloat16"},
                                   old["config"]) == ['dtype: "bfloat16" -> "float32"']


def test_a_nan_test_accuracy_is_shown_not_a_crash(tmp_path):
    """Issue 46, item 8: a NaN test_accuracy (a diverged run's) among a row's seeds
    crashed lra.report (statistics.stdev); the row shows nan instead."""
    root = str(tmp_path)
    _write(root, "listops", "transformer", 0, float("nan"))
    _write(root, "listops", "transformer", 1, 0.30)
    _write(root, "listops", "linear", 0, 0.25)
    proc = _cli("lra.report", root, cwd=REPO)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    text = open(os.path.join(root, "results.md"), encoding="utf-8").read()
    assert "| transformer | nan ± nan | nan |" in text and "| linear | 25.00 |" in text


def test_grid_is_the_product_of_its_fields_after_the_overrides(tmp_path, monkeypatch):
    points = sweep.grid_overrides(["warmup=1"], ["learning_rate=1e-3, 3e-3",
                                                 "weight_decay=0,0.1,0"])
    assert points == [["warmup=1", "learning_rate=1e-3", "weight_decay=0"],
                      ["warmup=1", "learning_rate=1e-3", "weight_decay=0.1"],
                      ["warmup=1", "learning_rate=3e-3", "weight_decay=0"],
                      ["warmup=1", "learning_rate=3e-3", "weight_decay=0.1"]]
    assert sweep.grid_overrides(["warmup=1"], []) == [["warmup=1"]]
    for grid, why in ((["learning_rate"], "not field=v1"), (["learning_rate=1e-3,"], "not"),
                      (["warmup=2"], "--override=warmup"),
                      (["learning_rate=1", "learning_rate=2"], "twice")):
        with pytest.raises(ValueError, match=why):
            sweep.grid_overrides(["warmup=1"], grid)
    # Each point is its own set of runs, as main() runs them: distinct workdirs, and a
    # second pass skips every finished point.
    calls = []
    fake_launch(monkeypatch, calls)
    for point in points:
        sweep.sweep(seeds=[0], sweep_dir=str(tmp_path), overrides=point, log=lambda _: None,
                    **SWEEP)
    assert len(set(calls)) == 4
    configs = [json.load(open(os.path.join(d, "results.json")))["config"] for d in calls]
    assert {(c["learning_rate"], c["weight_decay"]) for c in configs} == {
        (1e-3, 0.0), (1e-3, 0.1), (3e-3, 0.0), (3e-3, 0.1)}
    again = [sweep.sweep(seeds=[0], sweep_dir=str(tmp_path), overrides=p,
                         log=lambda _: None, **SWEEP)["skipped"] for p in points]
    assert again == [[("transformer", 0)]] * 4 and len(calls) == 4


def test_sweep_bad_grid_is_one_line(tmp_path):
    proc = _cli("lra.sweep", "--grid=learning_rate", f"--sweep_dir={tmp_path}",
                "--models=transformer", cwd=REPO)
    _one_line_error(proc, "--grid", "field=v1,v2")
    proc = _cli("lra.sweep", "--grid=learning_rate=1e-3", "--pretrain",
                f"--sweep_dir={tmp_path}", "--models=transformer", cwd=REPO)
    _one_line_error(proc, "--grid", "--pretrain")
    proc = _cli("lra.sweep", "--grid=no_such_field=1,2", f"--sweep_dir={tmp_path}",
                "--models=transformer", "--config_arg=runlocal", cwd=REPO)
    _one_line_error(proc, "no_such_field")
    assert not os.listdir(tmp_path)  # nothing started

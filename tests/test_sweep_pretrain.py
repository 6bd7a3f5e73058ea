"""lra.sweep --pretrain (pretrain, then fine-tune from it, at a from-scratch run's steps) and
lra.report's from-scratch vs self-pretrained tables with parameter counts."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from lra import report, sweep
from lra.runs import plan
from lra.runs.results import collect

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRE, FINE = plan.PRETRAIN, plan.FINE_TUNE


# --- the split of the steps ----------------------------------------------------------


def test_pretrain_plan_splits_the_from_scratch_steps():
    config = plan.expected_config("listops", "transformer", 0, "runlocal",
                                  ["num_train_steps=30"])
    assert plan.pretrain_plan(config, None) == (15, 15)  # default: half
    assert plan.pretrain_plan(config, 10) == (10, 20)
    for bad in (0, -1, 30, 31):
        with pytest.raises(ValueError, match=f"--pretrain_steps={bad} must be between 1 and "
                                             "29") as e:
            plan.pretrain_plan(config, bad)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="num_train_steps=1"):
        plan.pretrain_plan(dict(config, num_train_steps=1), None)
    pretraining = plan.expected_config("listops", "transformer", 0, "runlocal,pretrain", [])
    with pytest.raises(ValueError, match="pretrains already \\(objective=mlm\\)"):
        plan.pretrain_plan(pretraining, None)
    # LRA's rsqrt_decay with warmup beyond a part's steps is the schedule the from-scratch
    # run has too (retrieval: warmup 8000 of 5000 steps): allowed.
    assert config["warmup"] == 5 and plan.pretrain_plan(config, 4) == (4, 26)
    # cosine_decay: a part within its warmup would never decay; refused naming the fix.
    image = plan.expected_config("image", "transformer", 0, "runlocal", [])
    assert "cosine_decay" in image["factors"] and image["warmup"] == 5
    assert plan.pretrain_plan(image, None) == (10, 10)
    for steps, part in ((5, "pretraining run has 5"), (15, "fine-tuning run has 5")):
        with pytest.raises(ValueError) as e:
            plan.pretrain_plan(image, steps)
        message = str(e.value)
        assert part in message and "--override=warmup=<fewer than 5>" in message
        assert "config.warmup=5" in message and "\n" not in message


# --- the sweep: order, steps, skip, resume, refusal (fake launch: no training) ---------


def _fake_launch(monkeypatch, calls, fail=lambda workdir: False):
    """plan.command -> a tiny python process: exits 1 with one stderr line when
    fail(workdir), else writes the results.json launch.py would (the expected config)."""
    def command(task, model, seed, config_arg, workdir, overrides):
        calls.append((workdir, config_arg, list(overrides)))
        config = plan.expected_config(task, model, seed, config_arg, overrides)
        results = {"task": task, "model": model, "objective": config["objective"],
                   "init_from": config["init_from"] or None, "test_accuracy": 0.5,
                   "steps": config["num_train_steps"], "config": config}
        script = (f"import json, sys\nif {fail(workdir)}:\n"
                  "    print('ValueError: it broke', file=sys.stderr); sys.exit(1)\n"
                  f"json.dump({results!r}, open({workdir!r} + '/results.json', 'w'))\n")
        return [sys.executable, "-c", script]
    monkeypatch.setattr(plan, "command", command)


ARGS = dict(task="listops", config_arg="runlocal", seeds=[0])


def test_sweep_pretrain_runs_both_phases_in_order_and_skips_them(tmp_path, monkeypatch):
    root = str(tmp_path / "sweep")
    calls, logged = [], []
    _fake_launch(monkeypatch, calls)
    overrides = ["num_train_steps=12"]
    outcome = sweep.sweep(models=["transformer", "local"], sweep_dir=root,
                          overrides=overrides, log=logged.append, pretrain=True,
                          pretrain_steps=4, **ARGS)
    assert outcome["done"] == [("transformer", 0, PRE), ("transformer", 0, FINE),
                               ("local", 0, PRE), ("local", 0, FINE)]
    pre = plan.run_dir(root, "listops", "transformer", 0, overrides, PRE)
    fine = plan.run_dir(root, "listops", "transformer", 0, overrides, FINE)
    scratch = plan.run_dir(root, "listops", "transformer", 0, overrides)
    assert (pre, fine) == (scratch + "-pretrain", scratch + "-pretrained")
    assert calls[0] == (pre, "runlocal,pretrain", ["num_train_steps=4"])
    assert calls[1] == (fine, "runlocal", [f"init_from={pre}", "num_train_steps=8"])
    assert json.load(open(os.path.join(pre, "results.json")))["objective"] == "mlm"
    record = json.load(open(os.path.join(fine, "sweep.json")))
    assert record["phase"] == FINE and record["overrides"] == overrides
    assert (record["pretrain_steps"], record["fine_tune_steps"]) == (4, 8)
    assert "pretrain (4 steps)" in logged[0] and "fine-tune (8 steps)" in logged[2]
    # Again: both phases finished with the config this sweep runs: skipped, nothing run.
    again = sweep.sweep(models=["transformer", "local"], sweep_dir=root, overrides=overrides,
                        log=lambda _: None, pretrain=True, pretrain_steps=4, **ARGS)
    assert len(again["skipped"]) == 4 and not again["done"] and len(calls) == 4
    # The sweep directory moved (init_from recorded the old path): still the same runs.
    moved = str(tmp_path / "moved")
    shutil.move(root, moved)
    again = sweep.sweep(models=["transformer"], sweep_dir=moved, overrides=overrides,
                        log=lambda _: None, pretrain=True, pretrain_steps=4, **ARGS)
    assert len(again["skipped"]) == 2 and len(calls) == 4
    # Another split into the same folders: a finished run of another config, refused.
    logged.clear()
    other = sweep.sweep(models=["transformer"], sweep_dir=moved, overrides=overrides,
                        log=logged.append, pretrain=True, pretrain_steps=6, **ARGS)
    assert other["refused"] == [("transformer", 0, PRE)]
    assert other["blocked"] == [("transformer", 0, FINE)] and len(calls) == 4
    assert "num_train_steps: 4 -> 6" in [l for l in logged if "REFUSED" in l][0]
    # A plain sweep beside them makes the from-scratch run, with all the steps.
    plain = sweep.sweep(models=["transformer"], sweep_dir=moved, overrides=overrides,
                        log=lambda _: None, **ARGS)
    assert plain["done"] == [("transformer", 0)]
    assert calls[-1][2] == overrides and calls[-1][1] == "runlocal"


def test_a_failed_pretraining_run_leaves_its_fine_tune_unstarted(tmp_path, monkeypatch):
    root = str(tmp_path)
    calls, logged = [], []
    broken = {"pretrain": True, "fine": False}

    def fail(workdir):
        return broken["pretrain"] if workdir.endswith("-pretrain") else broken["fine"]

    _fake_launch(monkeypatch, calls, fail)
    first = sweep.sweep(models=["transformer"], sweep_dir=root, overrides=[],
                        log=logged.append, pretrain=True, **ARGS)
    pre = plan.run_dir(root, "listops", "transformer", 0, [], PRE)
    fine = plan.run_dir(root, "listops", "transformer", 0, [], FINE)
    assert first["failed"] == [("transformer", 0, PRE)]
    assert first["blocked"] == [("transformer", 0, FINE)]
    assert [c[0] for c in calls] == [pre] and not os.path.exists(fine)
    assert "ValueError: it broke" in open(os.path.join(pre, "error.txt")).read()
    assert any("NOT STARTED" in l and pre in l for l in logged)
    # Fixed: the pretraining run runs (default split: 10 + 10 of runlocal's 20), then its
    # fine-tuning run, which fails ...
    broken.update(pretrain=False, fine=True)
    second = sweep.sweep(models=["transformer"], sweep_dir=root, overrides=[],
                         log=lambda _: None, pretrain=True, **ARGS)
    assert second["done"] == [("transformer", 0, PRE)]
    assert second["failed"] == [("transformer", 0, FINE)]
    assert calls[1][2] == ["num_train_steps=10"] and not os.path.exists(
        os.path.join(pre, "error.txt"))
    # ... and the next sweep resumes it alone, with the same command in the same folder.
    broken["fine"] = False
    third = sweep.sweep(models=["transformer"], sweep_dir=root, overrides=[],
                        log=lambda _: None, pretrain=True, **ARGS)
    assert third["skipped"] == [("transformer", 0, PRE)]
    assert third["done"] == [("transformer", 0, FINE)]
    assert calls[3] == calls[2] == (fine, "runlocal",
                                    [f"init_from={pre}", "num_train_steps=10"])
    assert json.load(open(os.path.join(fine, "results.json")))["init_from"] == pre


def test_sweep_pretrain_trains_both_phases(listops_dir, tmp_path):
    """Through launch.py: the pretraining run and the fine-tuning run from it, with their
    steps adding up to the config's num_train_steps."""
    overrides = [f"data_dir={listops_dir}", "max_length=48", "num_train_steps=4",
                 "eval_frequency=2"]
    outcome = sweep.sweep(models=["transformer"], sweep_dir=str(tmp_path),
                          overrides=overrides, log=lambda _: None, pretrain=True, **ARGS)
    assert outcome["done"] == [("transformer", 0, PRE), ("transformer", 0, FINE)], outcome
    pre = plan.run_dir(str(tmp_path), "listops", "transformer", 0, overrides, PRE)
    fine = plan.run_dir(str(tmp_path), "listops", "transformer", 0, overrides, FINE)
    pre_results = json.load(open(os.path.join(pre, "results.json")))
    fine_results = json.load(open(os.path.join(fine, "results.json")))
    assert (pre_results["objective"], pre_results["steps"]) == ("mlm", 2)
    assert (fine_results["objective"], fine_results["steps"]) == ("classify", 2)
    assert fine_results["init_from"] == pre
    assert "Initialised" in open(os.path.join(fine, "log.txt")).read()
    again = sweep.sweep(models=["transformer"], sweep_dir=str(tmp_path), overrides=overrides,
                        log=lambda _: None, pretrain=True, **ARGS)
    assert len(again["skipped"]) == 2 and not again["done"] and not again["refused"]
    # The from-scratch run beside them, as many steps: one row of the report with both.
    plain = sweep.sweep(models=["transformer"], sweep_dir=str(tmp_path), overrides=overrides,
                        log=lambda _: None, **ARGS)
    assert plain["done"] == [("transformer", 0)]
    text = open(report.report(str(tmp_path))["markdown"], encoding="utf-8").read()
    table1, rest = text.split("### listops")
    assert "| transformer (self-pretrained) |" in table1 and "| transformer |" in table1
    (row,) = [l for l in rest.split("### Pretraining runs")[0].splitlines()
              if l.startswith("| transformer")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "transformer" and "-" not in (cells[1], cells[2], cells[3])
    assert cells[4:] == ["mlm, 2 of 4 steps", f"{fine_results['num_params']:,}", "1.000"]
    assert "| listops | transformer (mlm) | mlm | 2 |" in rest


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "lra.sweep", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": REPO})


@pytest.mark.parametrize("args, needles", [
    (["--pretrain_steps=20"], ["--pretrain_steps=20 must be between 1 and 19"]),
    (["--pretrain_steps=16", "--override=factors=constant * linear_warmup * cosine_decay"],
     ["config.warmup=5", "fine-tuning run has 4", "--override=warmup="]),
    (["--override=init_from=/somewhere"], ["--override=init_from=... with --pretrain"]),
])
def test_sweep_pretrain_refusals_are_one_line(tmp_path, args, needles):
    proc = _cli("--task=listops", "--models=transformer", "--config_arg=runlocal",
                f"--sweep_dir={tmp_path}", "--pretrain", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ")
    for needle in needles:
        assert needle in line, line
    assert not os.listdir(tmp_path)  # nothing started


# --- the report ------------------------------------------------------------------------


def _config(model, seed, steps, objective="classify", init_from="", **fields):
    config = {"task": "listops", "model": model, "random_seed": seed, "learning_rate": 0.05,
              "num_train_steps": steps, "objective": objective, "init_from": init_from,
              "log_every_steps": 5, "model_hparams": {}, "block": {"stack": "sequential"},
              "max_length": 64, "pooling": "CLS", "causal": objective == "causal_lm",
              "emb_dim": 64}
    config.update(fields)
    return config


def _run(folder, model, seed, acc, *, steps, params, objective="classify", init_from=None,
         **extra):
    os.makedirs(folder)
    results = {"task": "listops", "model": model, "test_accuracy": acc, "steps": steps,
               "num_params": params, "majority_baseline_accuracy": 0.2,
               "config": _config(model, seed, steps, objective, init_from or ""), **extra}
    if objective != "classify" or init_from:
        results.update(objective=objective, init_from=init_from)
    with open(os.path.join(folder, "results.json"), "w") as f:
        json.dump(results, f)


def _sweep_runs(root, model, params, scratch, pretrained, seeds=(0, 1), pre_steps=10,
                objective="mlm", moved_from=None):
    """A model's runs as lra.sweep --pretrain and a plain sweep lay them out (20 steps in
    all); `moved_from`: the pretraining runs' paths recorded under another root."""
    for i, seed in enumerate(seeds):
        base = os.path.join(root, "listops", model, f"seed{seed}")
        if scratch is not None:
            _run(base, model, seed, scratch[i], steps=20, params=params)
        if pretrained is not None:
            _run(base + "-pretrain", model, seed, 0.7, steps=pre_steps, params=params + 99,
                 objective=objective, best_eval_loss=1.5 + i, test_loss=1.6,
                 test_bits_per_token=2.3 if objective == "causal_lm" else None)
            source = base + "-pretrain"
            if moved_from:
                source = os.path.join(moved_from, os.path.relpath(source, root))
            _run(base + "-pretrained", model, seed, pretrained[i], steps=20 - pre_steps,
                 params=params, init_from=source)


def test_report_shows_scratch_and_self_pretrained_side_by_side(tmp_path):
    root = str(tmp_path)
    _sweep_runs(root, "transformer", 1000, [0.30, 0.40], [0.40, 0.50])
    _sweep_runs(root, "linear", 1100, [0.20, 0.30], [0.30, 0.30],  # 110%: within
                moved_from="/elsewhere/sweep")  # init_from recorded before a move
    _sweep_runs(root, "linformer", 1101, [0.25], None, seeds=(0,))  # just over 10%
    _sweep_runs(root, "performer", 899, None, [0.35], seeds=(0,))  # just under -10%
    paths = report.report(root)
    text = open(paths["markdown"], encoding="utf-8").read()
    table1, rest = text.split("### listops")
    # Table 1: classifiers only (the pretraining runs' 70% token accuracy is in no row),
    # seeds with different init_from paths averaged into one self-pretrained row.
    assert "| transformer | 35.00 ± 7.07 | 35.00 |" in table1
    assert "| transformer (self-pretrained) | 45.00 ± 7.07 | 45.00 |" in table1
    assert "| linear (self-pretrained) | 30.00 ± 0.00 | 30.00 |" in table1
    assert "70.00" not in table1 and "(mlm)" not in table1
    listops = rest.split("### Pretraining runs")[0]
    assert ("| model | from scratch | self-pretrained | Δ | pretraining | params "
            "| vs transformer |") in listops
    assert ("| transformer | 35.00 ± 7.07 | 45.00 ± 7.07 | +10.00 | mlm, 10 of 20 steps "
            "| 1,000 | 1.000 |") in listops
    assert "| linear | 25.00 ± 7.07 | 30.00 ± 0.00 | +5.00 | mlm, 10 of 20 steps | 1,100 " \
           "| 1.100 |" in listops
    assert "| linformer | 25.00 | - | - | - | 1,101 | 1.101 ! |" in listops
    assert "| performer | - | 35.00 | - | mlm, 10 of 20 steps | 899 | 0.899 ! |" in listops
    assert report.PARAMS_NOTE in text and report.PRETRAINED_NOTE in text
    pretraining = text.split("### Pretraining runs")[1]
    assert "| listops | transformer (mlm) | mlm | 10 | 2.0000 | 1.6000 | 70.00 | - | 20.00 " \
           "| 2 |" in pretraining
    assert "warning" not in text
    csv_rows = open(paths["comparison_csv"], encoding="utf-8").read().splitlines()
    assert csv_rows[0].startswith("task,model,from scratch,self-pretrained")
    assert "listops,linformer,25.00,-,-,-,\"1,101\",1.101 !" in csv_rows
    summary = report.summarize(collect(root))
    assert summary[("listops", "transformer (self-pretrained)")]["seeds"] == 2
    assert not [k for k in summary if "(mlm)" in k[1]]
    assert set(report.summarize_pretraining(collect(root))) == {
        ("listops", f"{m} (mlm)") for m in ("transformer", "linear", "performer")}


def test_report_keeps_other_step_counts_and_pretraining_runs_apart(tmp_path):
    root = str(tmp_path)
    _sweep_runs(root, "transformer", 1000, [0.30], [0.40], seeds=(0,))
    # Another split of the same 20 steps: a row of its own, named by what differs.
    _run(os.path.join(root, "listops", "transformer", "x-pretrain"), "transformer", 1, 0.6,
         steps=5, params=1099, objective="mlm")
    _run(os.path.join(root, "listops", "transformer", "x-pretrained"), "transformer", 1,
         0.45, steps=15, params=1000,
         init_from=os.path.join(root, "listops", "transformer", "x-pretrain"))
    # A causal_lm pretraining run whose fine-tuning run has not finished: its own row,
    # with bits per token, and no classifier row.
    _run(os.path.join(root, "listops", "transformer", "c-pretrain"), "transformer", 0, 0.5,
         steps=10, params=1099, objective="causal_lm", test_bits_per_token=2.25)
    # A fine-tuned run whose pretraining run is gone: shown, and warned about.
    _run(os.path.join(root, "listops", "transformer", "y-pretrained"), "transformer", 2,
         0.35, steps=10, params=1000, init_from=os.path.join(root, "gone"))
    text = open(report.report(root)["markdown"], encoding="utf-8").read()
    table1, rest = text.split("### listops")
    both = "| transformer [num_train_steps=20] (self-pretrained; pretraining num_train_steps="
    assert f"{both}10) | 40.00 | 40.00 |" in table1
    assert f"{both}5) | 45.00 | 45.00 |" in table1
    assert "| transformer [num_train_steps=20] | 30.00 | 30.00 |" in table1
    # The lost one counts only its own 10 steps: another config than the 20-step rows.
    assert "| transformer [num_train_steps=10] (self-pretrained) | 35.00 | 35.00 |" in table1
    listops, pretraining = rest.split("### Pretraining runs")
    assert f"{both}10) | 30.00 | 40.00 | +10.00 | mlm, 10 of 20 steps | 1,000 | 1.000 |" \
        in listops
    assert f"{both}5) | 30.00 | 45.00 | +15.00 | mlm, 5 of 20 steps | 1,000 | 1.000 |" \
        in listops
    assert "| transformer [num_train_steps=10] | - | 35.00 | - | not found | 1,000 |" in listops
    assert ("| listops | transformer [causal=true, num_train_steps=10, objective=causal_lm] "
            "(causal_lm) | causal_lm | 10 | - | - | 50.00 | 2.2500 | 20.00 | 1 |") in pretraining
    assert "causal_lm" not in table1 + listops and "(mlm)" not in table1 + listops
    assert f"its pretraining run (init_from={os.path.join(root, 'gone')}) has no usable " \
           "results.json" in text


def test_report_of_plain_sweeps_is_unchanged_but_for_the_parameter_table(tmp_path):
    """Results written before objective/init_from/num_params: classifiers from scratch;
    the per-task table has no self-pretrained columns and no counts to compare."""
    root = str(tmp_path)
    for model, acc in (("transformer", 0.3), ("linear", 0.2)):
        d = os.path.join(root, "listops", model, "seed0")
        os.makedirs(d)
        json.dump({"task": "listops", "model": model, "test_accuracy": acc},
                  open(os.path.join(d, "results.json"), "w"))
    text = open(report.report(root)["markdown"], encoding="utf-8").read()
    assert "| transformer | 30.00 | 30.00 |" in text and "| linear | 20.00 | 20.00 |" in text
    assert "| model | from scratch | params | vs transformer |" in text
    assert "| linear | 20.00 | - | - |" in text
    assert "self-pretrained" not in text and "Pretraining runs" not in text


def test_report_skips_an_unknown_objective(tmp_path):
    root = str(tmp_path)
    _run(os.path.join(root, "a"), "transformer", 0, 0.3, steps=20, params=10)
    _run(os.path.join(root, "b"), "transformer", 0, 0.3, steps=20, params=10,
         objective="denoise")
    skipped = []
    report.report(root, skipped=skipped)
    (line,) = skipped
    assert os.path.join(root, "b") in line and "objective is 'denoise'" in line

"""lra.sweep runs and skips; lra.report tabulates and plots."""
import json
import os

import pytest

from lra import report, sweep


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
    summary = report.summarize(report.collect(root))
    assert report.figure_points(summary) == [("transformer", 1.0, 30.0, 1.0),
                                             ("linear", 0.1, 20.0, 1.0),
                                             ("lite", 1.0, 25.0, 1.0)]
    assert report.figure_points(summary, (length, ratios)) == [
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
    first = sweep.sweep(models=["transformer"], **common)
    assert first["done"] == [("transformer", 0)]
    results = os.path.join(sweep.run_dir(str(tmp_path), "listops", "transformer", 0),
                           "results.json")
    assert json.load(open(results))["steps"] == 2
    again = sweep.sweep(models=["transformer"], **common)
    assert again["skipped"] == [("transformer", 0)] and not again["done"]
    bad = dict(common, overrides=common["overrides"] + ["learning_rate=oops"])
    failed = sweep.sweep(models=["transformer"], **dict(bad, seeds=[1]))
    assert failed["failed"] == [("transformer", 1)]
    error = open(os.path.join(sweep.run_dir(str(tmp_path), "listops", "transformer", 1),
                              "error.txt")).read()
    assert "learning_rate" in error


def test_report_marks_runs_that_reduce_to_dense_attention(tmp_path):
    """ListOps mini (64 tokens + CLS): the old window of 128 is dense attention."""
    root = str(tmp_path)
    runs = [("transformer", {}, 0.387), ("local", {"window": 128}, 0.387),
            ("bigbird", {"block": 2, "num_random_blocks": 3, "num_global_blocks": 2}, 0.35),
            ("nope", {}, 0.30)]  # a model this checkout does not have
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
    assert f"38.70 {report.DENSE_MARK}" in open(paths["csv"], encoding="utf-8").read()

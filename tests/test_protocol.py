"""Issue 32: the literature's numbers beside ours (full-size runs only), non-convergence
counted per cell, every task in one sweep command (missing data skipped in one line)."""
import json
import math
import os
import subprocess
import sys

import pytest

from lra import report, sweep
from lra.runs import plan
from lra.runs.results import collect

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(task, arg, model="transformer", extra=""):
    """The resolved config launch.py would record for configs/<task>.py:<arg> (with
    `extra` appended to the model's argument, e.g. "paper")."""
    if extra:
        arg = ",".join(a for a in (arg, extra) if a)
    return plan.expected_config(task, model, 0, arg, [])


def _write(root, folder, task, seed, acc, config, base=0.2, history=None):
    d = os.path.join(root, folder)
    os.makedirs(d)
    results = {"task": task, "model": config["model"], "test_accuracy": acc,
               "majority_baseline_accuracy": base,
               "config": dict(config, random_seed=seed)}
    if history is not None:
        results["train_history"] = history
    with open(os.path.join(d, "results.json"), "w") as f:
        json.dump(results, f)


def test_report_counts_converged_seeds_and_gives_both_means(tmp_path):
    root = str(tmp_path)
    config = {"task": "listops", "model": "transformer", "max_length": 64}
    # Seeds 3 and 4 sit at the majority baseline (20%): not converged.
    for seed, acc in enumerate([0.40, 0.42, 0.44, 0.20, 0.205]):
        _write(root, f"seed{seed}", "listops", seed, acc, config)
    entry = report.summarize(collect(root))[("listops", "transformer")]
    assert (entry["converged"], entry["seeds"]) == (3, 5)
    assert math.isclose(entry["accuracy"], 0.333)  # all five
    assert math.isclose(entry["accuracy_converged"], 0.42)  # the three that converged
    text = open(report.report(root)["markdown"], encoding="utf-8").read()
    assert "| transformer | 33.30 ± 12.00 (3/5 converged: 42.00) | 33.30 |" in text
    # The convergence table names the cell, both means and why each run failed.
    assert ("| listops | transformer | 3/5 | 33.30 | 42.00 | seed 3: test 20.00 < majority "
            "20.00 + 1 point; seed 4: test 20.50 < majority 20.00 + 1 point |") in text
    assert report.CONVERGENCE_NOTE in text
    # Published numbers: this is not a full-size run (no sizes recorded, max_length 64).
    assert "[published" not in text and "max_length 64 (full size: 2000)" in text


def test_a_training_loss_that_never_left_chance_is_not_converged(tmp_path):
    chance = math.log(10)  # ListOps: 10 classes
    stuck = [{"step": s, "loss": chance - 0.01} for s in (50, 100)]
    learned = [{"step": 50, "loss": chance}, {"step": 100, "loss": 1.2}]
    base = {"task": "listops", "model": "transformer", "test_accuracy": 0.35,
            "majority_baseline_accuracy": 0.2}
    assert "never below" in report.not_converged_reason({**base, "train_history": stuck})
    assert report.not_converged_reason({**base, "train_history": learned}) is None
    assert report.not_converged_reason(base) is None  # nothing says otherwise
    # A binary task stuck at ln 2 (Pathfinder's 0.693), test accuracy just above chance.
    flat = {"task": "pathfinder", "model": "transformer", "test_accuracy": 0.515,
            "majority_baseline_accuracy": 0.5,
            "train_history": [{"step": 100, "loss": 0.6931}]}
    assert "ln C = 0.693" in report.not_converged_reason(flat)


def test_published_numbers_beside_full_size_runs_only(tmp_path):
    full, mini = _config("listops", ""), _config("listops", "mini")
    assert full["max_length"] == 2000 and mini["max_length"] == 64
    root = str(tmp_path / "full")
    for seed, acc in enumerate([0.35, 0.37]):
        _write(root, f"seed{seed}", "listops", seed, acc, full, base=0.17)
    text = open(report.report(root)["markdown"], encoding="utf-8").read()
    # Tay et al. 2021 Table 1: Transformer 36.37 on ListOps.
    assert "| transformer | 36.00 ± 1.41 [published 36.37, ours -0.37] | 36.00 |" in text
    assert "Sources: Tay et al. 2021: arXiv 2011.04006, Table 1." in text
    # With a full-size Path-X run (tabulated without report(): its dense/degenerate check
    # would build a 16k-token model): FAIL beside it, and LRA's avg leaves Path-X out.
    _write(root, "pathx", "pathx", 0, 0.50, _config("pathx", ""), base=0.5)
    summary = report.summarize(collect(root))
    shown, withheld = report.published_cells(summary)
    assert set(shown) == {("listops", "transformer"), ("pathx", "transformer")}
    assert withheld == []
    header, rows = report.table_rows(summary, published=shown)
    assert header == ["model", "listops", "pathx", "avg", "avg incl. Path-X"]
    assert rows[0] == ["transformer", "36.00 ± 1.41 [published 36.37, ours -0.37]",
                       "50.00 [published FAIL]", "36.00", "43.00"]
    assert rows[1] == ["(majority class)", "17.00", "50.00", "", ""]
    # The same runs at the mini's sizes: no published number, and the footnote says why.
    root = str(tmp_path / "mini")
    for seed, acc in enumerate([0.35, 0.37]):
        _write(root, f"seed{seed}", "listops", seed, acc, mini, base=0.17)
    text = open(report.report(root)["markdown"], encoding="utf-8").read()
    assert "| transformer | 36.00 ± 1.41 | 36.00 |" in text and "[published" not in text
    assert ("Published numbers not shown (the runs are not of the task's full-size config; "
            "see the note on published numbers): listops transformer: max_length 64 (full "
            "size: 2000)") in text


def test_recipe_numbers_are_shown_beside_runs_of_that_recipe_only(tmp_path):
    """S5's published numbers are for its own recipe: beside a full-size run of
    `model=s5,paper`, withheld (saying why) beside LRA's setting for s5."""
    root = str(tmp_path / "paper")
    _write(root, "seed0", "listops", 0, 0.60, _config("listops", "", "s5", "paper"),
           base=0.17)
    shown, withheld = report.published_cells(report.summarize(collect(root)))
    (entry, source), = shown.values()
    assert entry["accuracy"]["listops"] == 62.15 and source["short"] == "Smith et al. 2023"
    assert withheld == []
    root = str(tmp_path / "lra")
    _write(root, "seed0", "listops", 0, 0.40, _config("listops", "", "s5"), base=0.17)
    shown, withheld = report.published_cells(report.summarize(collect(root)))
    assert shown == {}
    assert "(paper recipe: " in withheld[0] and "recipe" in withheld[0]


def test_published_table_names_a_source_for_every_number():
    from models import registry

    data = report.published()
    assert {e["model"] for e in data["results"]} == {
        "transformer", "local", "strided", "longformer", "linformer", "reformer", "sinkhorn",
        "synthesizer", "bigbird", "linear", "performer", "s5", "mega", None}
    assert all(e["model"] in registry.available() for e in data["results"] if e["model"])
    for e in data["results"]:  # each average the source states is its columns' mean
        columns = [v for t, v in e["accuracy"].items() if t != "pathx" or v is not None]
        if e["source"] != "tay2021" or e["name_in_source"] != "Sinkhorn Trans.":
            assert abs(sum(columns) / len(columns) - e["average_in_source"]) < 0.006, e
    for e in data["results"]:
        source = data["sources"][e["source"]]
        assert source["arxiv"] and source["table"]
        assert set(e["accuracy"]) == set(report.TASK_ORDER)
    header, rows = report.published_rows()
    transformer = dict(zip(header, rows[0]))
    assert transformer["avg (no Path-X)"] == "54.39"  # the paper's Avg column
    assert transformer["pathx"] == "FAIL"
    assert transformer["source"] == "Tay et al. 2021, Table 1, arXiv 2011.04006"
    text = report.published_markdown()
    assert "Sparse Trans. -> `strided`: the Sparse Transformer" in text
    assert "2310.02980" in text  # left out, and said so


def test_sweep_plans_every_task_and_skips_those_without_data(tmp_path, listops_dir):
    assert sweep.parse_tasks("all") == list(sweep.TASKS)
    assert sweep.parse_tasks("text, listops,text") == ["text", "listops"]
    for bad, needle in (("listops,nope", "configs/nope.py"), ("all,text", "not one of")):
        try:
            sweep.parse_tasks(bad)
            raise AssertionError(bad)
        except ValueError as e:
            assert needle in str(e)
    # Data where the mini config looks: only ListOps has it.
    ready, skipped = plan.plan_tasks(["listops"], "transformer", 0, "mini",
                                     [f"data_dir={listops_dir}"])
    assert ready == ["listops"] and skipped == []
    empty = str(tmp_path / "empty")
    ready, skipped = plan.plan_tasks(list(sweep.TASKS), "transformer", 0, "mini",
                                     [f"data_dir={empty}"])
    assert ready == []
    commands = dict(line.split(": ", 1) for line in skipped)
    assert list(commands) == list(sweep.TASKS)
    assert commands["listops"].endswith(
        f"get it with: python -m lra.tasks.listops --output_dir={empty}")
    assert "python -m lra.download text --data_dir=DIR, then --override=data_dir=DIR/text" \
        in commands["text"]
    assert "pathfinder32/curv_baseline not found" in commands["pathfinder"]
    assert commands["pathx"].endswith(
        f"python -m lra.tasks.pathfinder --output_dir={empty} --resolution=64 "
        "--difficulty=easy --num_images=20000")
    # The configs' own folders get the docs' commands (README.md's example and
    # docs/tasks_and_data.md; mini arguments for a mini).
    assert plan.data_command("listops", "data/listops_mini").startswith(
        "python -m lra.tasks.listops --output_dir=data/listops_mini --num_train_samples=20000")
    assert plan.data_command("retrieval", "data/retrieval") == \
        "python -m lra.download retrieval --data_dir=data"
    assert plan.data_command("mnist", "data/mnist") == \
        "python -m lra.download mnist --data_dir=data"
    options = {"resolution": 128, "difficulty": "hard"}
    assert plan.data_command("pathx", "data/pathx", options) \
        == ("python -m lra.tasks.pathfinder --output_dir=data/pathx --resolution=128 "
            "--difficulty=hard --num_images=200000 --seed=0 --workers=2")


def test_sweep_all_without_data_prints_one_line_per_task_and_runs_nothing(tmp_path):
    empty = str(tmp_path / "no_data")
    proc = subprocess.run(
        [sys.executable, "-m", "lra.sweep", "--task=all", "--models=transformer",
         "--config_arg=runlocal", "--seeds=0", f"--sweep_dir={tmp_path / 'sweep'}",
         f"--override=data_dir={empty}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stdout.strip().splitlines()
    skips = [l for l in lines if ": SKIPPED, no data in " in l]
    assert [l.split(":")[0] for l in skips] == list(sweep.TASKS)
    assert all("; get it with: python -m lra." in l for l in skips)
    assert lines[-1].endswith("6 task(s) skipped for missing data: listops, text, retrieval, "
                              "image, pathfinder, pathx (commands above)")
    assert os.listdir(tmp_path / "sweep") == []  # nothing ran


def _provenance_table(module) -> dict[str, tuple[object, str]]:
    """field -> (value, source) from the `field | value | source` table of a task
    config's docstring."""
    rows, lines = {}, module.__doc__.splitlines()
    start = next(i for i, l in enumerate(lines) if l.split("|")[0].strip() == "field")
    for line in lines[start + 1:]:
        if "|" not in line:
            break
        field, value, source = (cell.strip() for cell in line.split("|"))
        rows[field] = (json.loads(value), source)
    return rows


# Fields every task's table states, with their source (besides SIZE_FIELDS and the task's
# task_options): what makes a run LRA's, or says why it is not.
PROVENANCE_FIELDS = ("learning_rate", "factors", "warmup", "weight_decay", "adam_b1",
                     "adam_b2", "adam_eps", "grad_clip_norm", "pooling", "dropout_rate",
                     "attention_dropout_rate", "pos_emb", "num_eval_steps", "eval_frequency",
                     "random_seed")


@pytest.mark.parametrize("task", sweep.TASKS)
def test_provenance_table_matches_the_full_size_config(task):
    """configs/<task>.py's docstring table (field | value | source) against the full-size
    config: every row's value is the config's, every source cited is defined below the
    table, every note referred to exists, and the fields that make a run LRA's are all
    there (each task's own task_options, and the cosine schedule's period where there is
    one)."""
    import importlib
    import re

    from lra.runs.results import flatten

    module = importlib.import_module(f"configs.{task}")
    doc = module.__doc__
    table = _provenance_table(module)
    config = flatten(_config(task, ""))
    for field, (value, source) in table.items():
        assert field in config, field
        assert config[field] == value, (field, config[field], value)
        assert source, field
        assert source.startswith(("[", "ours")), (field, source)
        for ref in re.findall(r"\[([A-Z])\]", source):  # defined below the table
            assert f"\n  [{ref}] " in doc, (field, ref)
        for note in re.findall(r"see (\d+)\.", source):  # a note that exists
            assert f"\n  {note}. " in doc, (field, note)
        if source.startswith("ours") and field != "data_dir":  # ours, and why
            assert "(" in source, (field, source)
    required = {*report.SIZE_FIELDS, *PROVENANCE_FIELDS,
                *(k for k in config if k.startswith("task_options."))}
    if "cosine_decay" in config["factors"]:
        required.add("steps_per_cycle")
    assert required <= set(table), sorted(required - set(table))
    assert "Where LRA's code, configs and history disagree" in doc

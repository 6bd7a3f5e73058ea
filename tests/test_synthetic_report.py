"""lra.synthetic_report: MQAR cells from runs' results.json, ties against the seed spread,
the decoding state's bytes, and the files it writes."""
import csv
import json
import os

import pytest

from configs import common, mqar
from lra import synthetic_report
from lra.reporting import mad_table, ranking
from lra.runs import record
from lra.runs import results as results_lib
from tests.test_length_report import _write_length_run


def _write_run(root, model, seed, accuracy, *, length=32, width=0, lr=None, pos=None,
               short_conv=None, val=None, wd=None, ablate="", hparams=None, overrides=None):
    """A run of configs/mqar.py's runlocal; `pos`, `short_conv`: its scaffold's positions
    and shared convolution instead of the zoology scaffold's (none, 3); `overrides`: a
    sweep's run given these (its sweep.json)."""
    c = mqar.get_config(f"model={model},runlocal")
    if pos:
        c.scaffold.pos_emb = pos
    if short_conv is not None:
        c.scaffold.short_conv = short_conv
    c.scaffold.ablate = ablate
    c.model_hparams.update(hparams or {})
    config = common.resolve(c).to_dict()
    config["random_seed"] = seed
    config["max_length"] = length
    config["block"]["segment_len"] = length // 4  # scaled with the length, as presets do
    if width:
        config["emb_dim"] = config["qkv_dim"] = width
    if lr is not None:
        config["learning_rate"] = lr
    if wd is not None:
        config["weight_decay"] = wd
    folder = os.path.join(root, f"L{length}-d{width}", model,
                          f"seed{seed}-{lr}-{pos}-{short_conv}-{wd}-{len(hparams or ())}")
    folder += f"-{len(overrides or ())}"
    os.makedirs(folder)
    if overrides:
        with open(os.path.join(folder, "sweep.json"), "w") as f:
            json.dump({"task": "mqar", "model": model, "seed": seed,
                       "config_arg": "runlocal", "overrides": overrides}, f)
    with open(os.path.join(folder, "results.json"), "w") as f:
        json.dump({"task": "mqar", "model": model, "test_accuracy": accuracy,
                   "best_eval_accuracy": (accuracy if val is None
                                          else None if val == "missing" else val),
                   "majority_baseline_accuracy": 0.03, "num_params": 1000,
                   "objective": "sequence_labels", "config": config}, f)


def test_ties_follow_the_seed_ranges():
    def cell(model, accs):
        return {"model": model, "accs": accs, "mean": sum(accs) / len(accs),
                "min": min(accs), "max": max(accs)}

    column = [cell("a", [99, 100, 98]), cell("b", [97, 99, 90]), cell("c", [80, 85, 97.9])]
    assert ranking.ties(column) == {"a": "=", "b": "=", "c": "<"}
    # A model with one seed is not ranked (not even when its one number is the highest);
    # the others still are.
    assert ranking.ties(column + [cell("d", [100])]) == {
        "a": "=", "b": "=", "c": "<", "d": ""}
    assert ranking.ties([cell("a", [1, 2]), cell("d", [50])]) == {"a": "", "d": ""}


def test_report_writes_the_table_csv_and_figure(tmp_path):
    runs = tmp_path / "runs"
    for seed, (t, lin) in enumerate([(1.0, 0.60), (0.99, 0.70)]):
        _write_run(str(runs), "transformer", seed, t)
        _write_run(str(runs), "linear", seed, lin)
    _write_run(str(runs), "linear", 0, 0.5, width=48)  # another width: another column
    _write_run(str(runs), "linear", 0, 0.1, lr=0.5)  # another lr: the cell's grid
    _write_run(str(runs), "linear", 0, 0.2, length=64)  # another length: the same setting
    # The lr is chosen on validation, not test: lr 1e-3 (validation 0.85 on average, test
    # 0.55) over lr 3e-3 (validation 0.7, test 0.95).
    for seed, (val, test) in enumerate([(0.8, 0.5), (0.9, 0.6)]):
        _write_run(str(runs), "gla", seed, test, lr=1e-3, val=val)
        _write_run(str(runs), "gla", seed, 0.95, lr=3e-3, val=0.7)
    _write_run(str(runs), "linear", 0, 0.9, width=32, short_conv=0, lr=0.5)
    _write_run(str(runs), "s4d", 0, 0.4, lr=1e-3)  # one lr, not the table's usual 3e-3
    # A weight-decay grid names wd; a validation accuracy of 0 is a number, not missing.
    _write_run(str(runs), "transformer", 0, 0.3, length=64, wd=0.1, val=0.0)
    _write_run(str(runs), "transformer", 0, 0.4, length=64, wd=0.0, val="missing")
    os.rename(os.path.join(runs, "L32-d32"), os.path.join(runs, "other"))  # any folders
    # Other positions or no shared short convolution: rows of their own, named by the
    # scaffold card's field (the same seed would otherwise replace the default run's).
    _write_run(str(runs), "linear", 0, 0.97, pos="rotary")
    _write_run(str(runs), "linear", 0, 0.98, short_conv=0)
    paths = synthetic_report.report(str(runs), str(tmp_path / "out" / "mqar"))
    assert [os.path.basename(p) for p in paths] == ["mqar.md", "mqar.csv", "mqar.png",
                                                    "mqar_runs.jsonl"]
    assert os.path.getsize(paths[2]) > 10_000
    text = open(paths[0]).read()
    assert "## Setting" not in text  # one setting: the lr is tuned per cell
    # transformer 99.5 +- 0.7 over 2 seeds, the best; linear's best seed (70) is under
    # transformer's worst (99): ranked below. Width 48 has one seed: no ranking.
    row = next(line for line in text.splitlines() if line.startswith("| transformer |"))
    assert "99.5 ± 0.7 (2) =" in row
    row = next(line for line in text.splitlines() if line.startswith("| linear |"))
    assert "65.0 ± 7.1 (2) < [lr 0.003 of 2]" in row and "50.0 (1) |" in row
    assert "| transformer | 30.0 (1) [wd 0.1 of 2] |" in text
    row = next(line for line in text.splitlines() if line.startswith("| gla |"))
    assert "55.0 ± 7.1 (2) < [lr 0.001 of 2]" in row
    assert "| linear [pos rotary] | 97.0 (1) |" in text
    assert "| s4d | 40.0 (1) [lr 0.001] | - |" in text
    # lr 0.5's 90.0 validates lower: not shown
    assert "| linear [conv 0] | 98.0 (1) [lr 0.003 of 2] |" in text
    # Their scaffolds differ from the table's in fields no sweep declared: not ranked, named.
    assert ("Not ranked (their scaffold differs from the table's in a field no sweep "
            "declared an ablation axis, `config.scaffold.ablate`): linear [conv 0] "
            "(short_conv); linear [pos rotary] (positions).") in text
    assert "| majority label | 3.0 |" in text and "| chance | 1.6 |" in text  # V 128
    with open(paths[1]) as f:
        rows = list(csv.DictReader(f))
    transformer = next(r for r in rows if r["model"] == "transformer")
    assert (transformer["L"], transformer["kv"], transformer["width"]) == ("32", "2", "32")
    assert transformer["seeds"] == "0 1" and transformer["mean"] == "99.50"
    assert transformer["tunings"] == "1" and transformer["learning_rate"] == "0.003"
    gla = next(r for r in rows if r["model"] == "gla")
    assert (gla["learning_rate"], gla["tunings"], gla["mean"]) == ("0.001", "2", "55.00")
    # The decoding state: transformer's kv cache at L 32 (2 layers x k and v x 32 x 32
    # float32, and its position index) against linear attention's fixed state.
    assert int(transformer["state_bytes"]) >= 2 * 2 * 32 * 32 * 4
    linear = next(r for r in rows if r["model"] == "linear" and r["width"] == "32")
    assert 0 < int(linear["state_bytes"]) < int(transformer["state_bytes"])


def test_no_mqar_run_is_one_line(tmp_path, capsys):
    assert synthetic_report.main(["prog", str(tmp_path)]) == 2
    assert "no MQAR, MAD or length-extrapolation run" in capsys.readouterr().err


def test_a_folder_of_only_corrupt_runs_names_them(tmp_path, capsys):
    """Issue 74 probe 7: said "no MQAR or MAD run" and nothing of the files it skipped."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.json").write_text("{not json")
    assert synthetic_report.main(["prog", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "1 skipped" in err and str(tmp_path / "a" / "results.json") in err, err


def _write_mad(root, model, task, seed, macro, *, lr=5e-4, vocab=None, counted=True,
               init=None, ablate=""):
    """A MAD runlocal run; `init`: the scaffold's initialisation instead of mad-lab's."""
    from configs import mad, scaffold

    c = mad.get_config(f"task={task},model={model},runlocal")
    if init:
        c.scaffold.init, c.scaffold.ablate = init, ablate
        c = scaffold.resolve(c)
    config = c.to_dict()
    config["random_seed"], config["learning_rate"] = seed, lr
    if vocab:
        config["task_options"]["vocab_size"] = vocab
    folder = os.path.join(root, task, model, f"s{seed}-{lr}-{vocab}-{init}")
    os.makedirs(folder)
    with open(os.path.join(folder, "results.json"), "w") as f:
        json.dump({"task": config["task"], "model": model, "test_accuracy": 0.5,
                   "num_params": 1000 + (vocab or 0) if counted else None,
                   "test_macro_accuracy": macro, "objective": "sequence_labels",
                   "config": config}, f)


def test_mad_table_follows_mads_rule(tmp_path):
    """Per setting the best lr by the seeds' mean, then the mean over settings; the six
    columns and the average only when all six ran; the published rows beside."""
    runs = str(tmp_path / "runs")
    # in_context_recall, setting A (default vocab): lr 5e-4 seeds 0.9, 0.7 (mean 0.8) beats
    # lr 1e-3 (0.6); setting B (vocab 64): one lr, seeds 0.4, 0.6. Score (80 + 50) / 2.
    for seed, macro in ((0, 0.9), (1, 0.7)):
        _write_mad(runs, "gla", "in_context_recall", seed, macro)
        _write_mad(runs, "gla", "in_context_recall", seed, 0.6, lr=1e-3)
    for seed, macro in ((0, 0.4), (1, 0.6)):
        _write_mad(runs, "gla", "in_context_recall", seed, macro, vocab=64)
    # a run without its parameter count: '?', not a count of 0
    _write_mad(runs, "lru", "in_context_recall", 0, 0.3, counted=False)
    scores = mad_table.mad_scores(results_lib.load(runs)[0])
    cell = scores["gla"]["in_context_recall"]
    assert cell["settings"] == 2 and cell["seeds"] == 2
    assert abs(cell["score"] - 65.0) < 1e-9
    assert abs(cell["std"] - (14.142135623730951 + 14.142135623730951) / 2) < 1e-6
    paths = synthetic_report.report(runs, str(tmp_path / "out" / "grid"))
    assert [os.path.basename(p) for p in paths] == ["grid_mad.md", "grid_runs.jsonl"]
    text = open(paths[0]).read()
    row = next(line for line in text.splitlines() if line.startswith("| gla |"))
    assert row == "| gla | - | - | 65.0 ± 14.1 (2/2) | - | - | - | - | 1,000-1,064 |"
    assert "| lru | - | - | 30.0 (1/1) | - | - | - | - | ? |" in text
    assert "| majority label | - | - | " in text
    assert "| DeltaNet (published) | 42.2 | 35.7 | 100.0 | 52.8 | 100.0 | 100.0 | 71.8 |" in text
    # The source's Mamba is Mamba-1, named so (not our mamba2); each average is its row's.
    assert "| Mamba (Mamba-1) (published) |" in text and "2406.06484" in text
    for values in mad_table.PUBLISHED_MAD.values():
        assert sum(values[:6]) / 6 == pytest.approx(values[6], abs=0.051)


def test_mad_table_marks_ties_by_the_seeds_scores_and_shows_the_majority_label(tmp_path):
    """A seed's score is its mean over the settings; a model whose best seed is under the
    best model's worst seed is ranked below it (`<`), one whose range reaches it is tied
    (`=`), one with one seed is not ranked; the majority label's macro score is 1 / the
    number of test label classes of the runs' own data."""
    import numpy as np

    from configs import mad
    from lra.tasks import mad as mad_tasks
    from lra.training.objectives import macro_accuracy

    runs = str(tmp_path / "runs")
    for seed, a, b in ((0, 0.9, 0.4), (1, 0.7, 0.6)):  # seed scores 65, 65
        _write_mad(runs, "gla", "in_context_recall", seed, a)
        _write_mad(runs, "gla", "in_context_recall", seed, b, vocab=64)
    for seed, a, b in ((0, 0.95, 0.9), (1, 0.97, 0.92)):  # 92.5, 94.5: the best
        _write_mad(runs, "deltanet", "in_context_recall", seed, a)
        _write_mad(runs, "deltanet", "in_context_recall", seed, b, vocab=64)
    for seed, a in ((0, 0.93), (1, 0.80)):  # one setting: 93, 80, reaches 92.5
        _write_mad(runs, "linear", "in_context_recall", seed, a)
    _write_mad(runs, "retnet", "in_context_recall", 0, 0.99)  # one seed: not ranked
    for seed, a in ((0, 0.9), (1, 0.3)):  # seeds 60 points apart: each seed's score shown
        _write_mad(runs, "mamba2", "in_context_recall", seed, a)
    paths = synthetic_report.report(runs, str(tmp_path / "out" / "grid"))
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[3]
            for line in open(paths[0]).read().splitlines() if line.startswith("| ")}
    assert rows["deltanet"] == "93.5 ± 1.4 (2/2) ="
    assert rows["gla"] == "65.0 ± 14.1 (2/2) <"
    assert rows["linear"] == "86.5 ± 9.2 (1/2) ="
    # RetNet's kept knobs name its row (MAD's table names rows by the scaffold card)
    assert rows["retnet [pos rotary (kept), heads 8 (kept)]"] == "99.0 (1/1)"
    assert rows["mamba2"] == "60.0 ± 42.4 (1/2: 90.0, 30.0) <"
    config = mad.get_config("task=in_context_recall,model=gla,runlocal")
    labels = []
    for vocab in (None, 64):
        options = config.task_options.to_dict()
        if vocab:
            options["vocab_size"] = vocab
        targets = mad_tasks.read_split("in_context_recall", "test", config.max_length,
                                       **options)["targets"]
        labels.append(len(np.unique(targets[targets != -100])))
        # 1 / K is the loop's own macro accuracy of predicting the majority label everywhere
        y = targets[targets != -100]
        majority = np.bincount(y).argmax()
        per_class = np.bincount(y, minlength=y.max() + 1)
        predicted = np.zeros_like(per_class)
        predicted[majority] = len(y)
        tp = np.where(np.arange(len(per_class)) == majority, per_class, 0)
        assert abs(macro_accuracy(tp, per_class, predicted)
                   - mad_tasks.majority_macro_accuracy("in_context_recall",
                                                       config.max_length, **options)) < 1e-12
    expected = (100 / labels[0] + 100 / labels[1]) / 2
    assert labels[0] < labels[1] and rows["majority label"] == f"{expected:.1f}"


def test_runs_record_regenerates_the_tables_and_merges_with_new_runs(tmp_path, capsys):
    """The committed runs record stands in for the run folders: the tables from it alone
    equal the tables from the folders; with a folder of new runs beside it, the new runs
    join and a rerun of the same run replaces the recorded one."""
    first = str(tmp_path / "first")
    for seed, (t, lin) in enumerate([(1.0, 0.60), (0.99, 0.70)]):
        _write_run(first, "transformer", seed, t)
        _write_run(first, "linear", seed, lin)
    for seed, macro in ((0, 0.9), (1, 0.7)):
        _write_mad(first, "gla", "in_context_recall", seed, macro)
    paths = synthetic_report.report(first, str(tmp_path / "a" / "grid"))
    record = paths[-1]
    lines = open(record).read().splitlines()
    assert len(lines) == 6
    assert all("train_history" not in json.loads(line) for line in lines)
    again = synthetic_report.report(record, str(tmp_path / "b" / "grid"))
    for one, two in zip(paths[:2] + paths[3:], again[:2] + again[3:]):  # the .png aside
        if one.endswith(".md"):  # the header names the source
            assert open(one).read().split("\n", 1)[1] == open(two).read().split("\n", 1)[1]
        else:
            assert open(one).read() == open(two).read(), one
    # New runs beside the record: linear's seed 1 rerun (0.70 -> 0.95) and a third seed.
    new = str(tmp_path / "new")
    _write_run(new, "linear", 1, 0.95)
    _write_run(new, "linear", 2, 0.80)
    with open(record, "a") as f:
        f.write("not json\n")
    merged = synthetic_report.report([record, new], str(tmp_path / "c" / "grid"))
    text = open(merged[0]).read()
    row = next(line for line in text.splitlines() if line.startswith("| linear |"))
    assert "78.3 ± 17.6 (3: 60.0, 95.0, 80.0)" in row  # seeds 35 points apart: each named
    assert len(open(merged[-1]).read().splitlines()) == 7
    assert "grid_runs.jsonl:7: not valid JSON" in capsys.readouterr().err
    assert synthetic_report.main(["prog", record]) == 2  # --out needed for a record


def test_extend_cells_combines_a_one_seed_old_cell_and_refuses_the_rest(tmp_path):
    """scripts/mqar_extend_cells.py: a table whose runs are gone (only its .csv) extended
    by new runs, as results/cpu/mqar_grid.md was."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "mqar_extend_cells", os.path.join(os.path.dirname(__file__), "..", "scripts",
                                          "mqar_extend_cells.py"))
    extend_cells = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extend_cells)
    old_runs = tmp_path / "old"
    _write_run(str(old_runs), "transformer", 0, 1.0)
    _write_run(str(old_runs), "transformer", 1, 0.98)
    _write_run(str(old_runs), "linear", 0, 0.40)
    synthetic_report.report(str(old_runs), str(tmp_path / "old_table"))
    old = extend_cells.old_cells(str(tmp_path / "old_table.csv"))
    new_runs = tmp_path / "new"
    _write_run(str(new_runs), "linear", 1, 0.50)  # seed 1 beside the old seed 0
    _write_run(str(new_runs), "gla", 0, 0.2)  # a cell only in the new runs
    _write_run(str(new_runs), "gla", 1, 0.3)
    new = synthetic_report.cells(record.load_sources([str(new_runs)])[0])
    merged, lines = extend_cells.extend(old, new)
    by = {c["model"]: c for c in merged}
    assert by["linear"]["seeds"] == [0, 1] and by["linear"]["accs"] == [40.0, 50.0]
    assert round(by["linear"]["std"], 2) == 7.07 and by["linear"]["mean"] == 45.0
    assert by["transformer"]["accs"] == [98.0, 100.0]  # kept: its min and max
    assert by["gla"]["accs"] == [20.0, 30.0]
    assert len(lines) == 2 and lines[0].startswith("combined")
    # The full table from the same runs and the extended one agree cell by cell.
    text = synthetic_report.markdown(merged, "x")
    assert "| linear | 45.0 ± 7.1 (2) < |" in text and "| gla | 25.0 ± 7.1 (2) < |" in text
    assert "| transformer | 99.0 ± 1.4 (2) = |" in text
    # Extended again from its own csv and the same runs: unchanged (the runs are skipped).
    extend_cells.sr.write_csv(merged, str(tmp_path / "ext.csv"))
    again, lines = extend_cells.extend(extend_cells.old_cells(str(tmp_path / "ext.csv")), new)
    assert lines == [] and [c["accs"] for c in again] == [c["accs"] for c in merged]
    # A cell whose seeds the runs all hold again is the runs' own: exact values (not the
    # csv's 2 decimals rounded again) and the majority label the csv lacks.
    _write_run(str(old_runs), "deltanet", 0, 0.9995)
    _write_run(str(old_runs), "deltanet", 1, 0.99944)
    full = synthetic_report.cells(record.load_sources([str(old_runs)])[0])
    synthetic_report.write_csv(full, str(tmp_path / "two.csv"))
    csv_cell = next(c for c in extend_cells.old_cells(str(tmp_path / "two.csv"))
                    if c["model"] == "deltanet")
    assert csv_cell["mean"] == 99.95 and csv_cell["majority"] == 0.0
    reread, lines = extend_cells.extend(extend_cells.old_cells(str(tmp_path / "two.csv")),
                                        full)
    cell = next(c for c in reread if c["model"] == "deltanet")
    assert lines == [] and cell["accs"] == [99.95, 99.944] and cell["majority"] > 0
    assert "| deltanet | 99.9 ± 0.0 (2)" in synthetic_report.markdown(reread, "x")
    _write_run(str(tmp_path / "rerun"), "linear", 1, 0.55)  # the same seed, another value
    with pytest.raises(SystemExit, match="seed 1 is in the csv with another value"):
        extend_cells.extend(extend_cells.old_cells(str(tmp_path / "ext.csv")),
                            synthetic_report.cells(record.load_sources(
                                [str(tmp_path / "rerun")])[0]))
    # A two-seed cell (its values are its min and max) takes a third seed, given beside
    # the runs the csv already holds; a three-seed cell's values are not known: refused.
    _write_run(str(new_runs), "transformer", 2, 0.9)
    _write_run(str(new_runs), "linear", 2, 0.9)
    new = synthetic_report.cells(record.load_sources([str(new_runs)])[0])
    assert next(c for c in new if c["model"] == "linear")["accs"] == [50.0, 90.0]  # seeds 1, 2
    merged, lines = extend_cells.extend(extend_cells.old_cells(str(tmp_path / "ext.csv")), new)
    by = {c["model"]: c for c in merged}
    assert by["transformer"]["seeds"] == [0, 1, 2] and by["transformer"]["mean"] == 96.0
    assert by["linear"]["seeds"] == [0, 1, 2] and by["linear"]["accs"] == [40.0, 50.0, 90.0]
    assert sorted(lines) == ["combined (32, 2, 32, 'linear'): seeds [0, 1, 2] -> "
                             "[40.0, 50.0, 90.0]",
                             "combined (32, 2, 32, 'transformer'): seeds [0, 1, 2] -> "
                             "[98.0, 100.0, 90.0]"]
    # A new length's cells may carry their own V, steps and early stop (configs/mqar.py:
    # mini: 2 L, 3,600 steps and a stop from L 256), one of each per length; any other
    # difference of setting between the new cells is refused.
    def at_length(c, length, **changes):
        names = {"vocab": "task_options.vocab_size", "steps": "num_train_steps",
                 "early_stop": "early_stop_accuracy", "dropout": "dropout_rate"}
        fields = {names[k]: repr(v) for k, v in changes.items()}
        setting = sorted([p for p in c["setting"] if p[0] not in fields]
                         + list(fields.items()))
        return dict(c, L=length, setting=tuple(setting),
                    **{k: v for k, v in changes.items() if k != "dropout"})

    old = extend_cells.old_cells(str(tmp_path / "ext.csv"))
    long_cell = at_length(new[0], 64, vocab=512, steps=3600, early_stop=0.99)
    longer, _ = extend_cells.extend(old, new + [long_cell])
    assert [c["L"] for c in longer].count(64) == 1
    # The csv keeps them (vocab, steps, early_stop columns) and gives them back.
    extend_cells.sr.write_csv(longer, str(tmp_path / "longer.csv"))
    back = extend_cells.old_cells(str(tmp_path / "longer.csv"))
    assert [(c["vocab"], c["steps"], c["early_stop"]) for c in back if c["L"] == 64] == [
        (512, 3600, 0.99)]
    assert "(V = 512, 3,600 steps, early stop above 99% validation accuracy)" in (
        extend_cells.sr.markdown(back, "x"))
    with pytest.raises(SystemExit, match="more than one setting"):
        extend_cells.extend(old, new + [at_length(new[0], 64, dropout=0.1)])
    with pytest.raises(SystemExit, match="one setting per length"):  # 1,200 and 3,600 at L 64
        extend_cells.extend(back, [at_length(new[0], 64, vocab=512, steps=1200,
                                             early_stop=0.99)])
    with pytest.raises(SystemExit, match="one setting per length"):  # against the csv's L 32
        extend_cells.extend(old, [at_length(new[0], 32, steps=3600)])
    extend_cells.sr.write_csv(merged, str(tmp_path / "ext3.csv"))
    _write_run(str(new_runs), "linear", 3, 0.7)
    new = synthetic_report.cells(record.load_sources([str(new_runs)])[0])
    with pytest.raises(SystemExit, match=r"seeds \[0, 1, 2\] as mean, std, min and max"):
        extend_cells.extend(extend_cells.old_cells(str(tmp_path / "ext3.csv")), new)


def test_figure_styles_keep_a_variant_colour_and_mark_the_hybrids():
    """The MQAR figure's lines: 13 variants in 13 colours (tab20 repeated transformer's blue
    for mamba2 and linear's orange for a hybrid); a hybrid or a changed default in its
    variant's colour, told apart by line and marker."""
    models = ranking.ordered(set(ranking.ORDER[:13]) | {
        "gla+transformer@1", "gla+local@1", "gla+transformer@1 [pos_emb=learned]"})
    styles = {m: synthetic_report._line_style(m, models) for m in models}
    pure = [styles[m]["color"] for m in ranking.ORDER[:13]]
    assert len({str(c) for c in pure}) == 13
    assert {str(styles[m]["color"]) for m in models if m.startswith("gla")} == {
        str(styles["gla"]["color"])}
    assert [(styles[m]["linestyle"], styles[m]["marker"]) for m in (
        "gla", "gla+transformer@1", "gla+local@1", "gla+transformer@1 [pos_emb=learned]")] == [
        ("-", "o"), ("--", "s"), (":", "^"), ("--", "D")]


def test_a_cell_without_recorded_tuning_is_not_marked():
    # scripts/mqar_extend_cells.py's old csv cells carry no lr / wd: they count for none, so
    # the two recorded cells' 3e-3 is the table's usual lr and only the 1e-3 cell is marked.
    def cell(model, acc, **tuned):
        return {"setting": (), "L": 64, "kv": 4, "width": 64, "model": model, "accs": [acc],
                "mean": acc, "std": 0.0, "min": acc, "max": acc, "params": 1,
                "tunings": 1, "chosen": "", "majority": 0.5, "vocab": 256, "steps": 1200,
                "early_stop": 0.0, "state_bytes": None, **tuned}

    text = synthetic_report.markdown(
        [cell("transformer", 99.0), cell("local", 10.0),
         cell("linear", 60.0, learning_rate=3e-3, weight_decay=0.1),
         cell("gla", 20.0, learning_rate=3e-3, weight_decay=0.1),
         cell("s4d", 30.0, learning_rate=1e-3, weight_decay=0.1)], "cells")
    assert "| transformer | 99.0 (1) |" in text and "| local | 10.0 (1) |" in text
    assert "| linear | 60.0 (1) |" in text and "| gla | 20.0 (1) |" in text
    assert "| s4d | 30.0 (1) [lr 0.001] |" in text


def test_a_mad_row_under_another_initialisation_is_its_own_row(tmp_path):
    """MAD's table names a row by its scaffold card as the MQAR table does: gla's runs under
    each variant's own initialisation beside its runs under mad-lab's are two rows (they
    were one cell, the later run of a seed replacing the other), the own-init row named
    `[init own]` and ranked only where the sweep declared the ablation; a field every run
    shares (the runlocal's 2 heads, where MAD's scaffold declares 16) names no row."""
    for ablate, root in (("", "undeclared"), ("init", "declared")):
        runs = str(tmp_path / root)
        for seed in (0, 1):
            _write_mad(runs, "gla", "in_context_recall", seed, 0.9 + 0.01 * seed)
            _write_mad(runs, "deltanet", "in_context_recall", seed, 0.95 + 0.01 * seed)
            _write_mad(runs, "hyena", "in_context_recall", seed, 0.5 + 0.01 * seed)
        for seed in (0, 1):  # after the others, as a record read first would not be
            _write_mad(runs, "gla", "in_context_recall", seed, 0.3 + 0.01 * seed,
                       init="own", ablate=ablate)
        text = open(synthetic_report.report(runs, str(tmp_path / root / "g"))[0]).read()
        rows = {line.split(" | ")[0][2:]: line.split(" | ")[3]
                for line in text.splitlines() if line.startswith("| ")}
        assert rows["gla"] == "90.5 ± 0.7 (1/2) <", rows
        assert rows["gla [init own]"].startswith("30.5 ± 0.7 (1/2)"), rows
        assert rows["gla [init own]"].endswith("<") == bool(ablate), rows
        assert ("gla [init own] (init)" in text) != bool(ablate), text
        assert not any("heads" in name for name in rows), rows


def test_a_scaffold_difference_is_ranked_only_as_a_declared_ablation(tmp_path):
    """gla without the shared convolution beside the scaffold's cells: named `[conv 0]`
    and not ranked; declared an ablation axis (config.scaffold.ablate), ranked."""
    for ablate, root in (("", "undeclared"), ("short_conv", "declared")):
        runs = tmp_path / root
        for seed in (0, 1):
            _write_run(str(runs), "transformer", seed, 0.99 - 0.01 * seed)
            _write_run(str(runs), "gla", seed, 0.97 + 0.01 * seed)
            _write_run(str(runs), "gla", seed, 0.2 + 0.01 * seed, short_conv=0, ablate=ablate)
        text = open(synthetic_report.report(str(runs), str(tmp_path / root / "mqar"))[0]).read()
        row = next(line for line in text.splitlines() if line.startswith("| gla [conv 0] |"))
        assert "20.5 ± 0.7 (2)" in row
        assert ("20.5 ± 0.7 (2) <" in row) == bool(ablate)
        assert ("Not ranked" in text and "gla [conv 0] (short_conv)" in text) != bool(ablate)
        row = next(line for line in text.splitlines() if line.startswith("| gla |"))
        assert "97.5 ± 0.7 (2) =" in row  # the scaffold's own cells are ranked either way


def test_a_window_other_than_the_presets_is_named(tmp_path):
    """local's window is its own knob (a capacity on the card), not the scaffold's: a run
    at another window than its preset at the length is its own row, named by it."""
    for seed in (0, 1):
        _write_run(str(tmp_path / "runs"), "local", seed, 0.1)
        _write_run(str(tmp_path / "runs"), "local", seed, 0.9, hparams={"window": 32})
    text = open(synthetic_report.report(str(tmp_path / "runs"), str(tmp_path / "mqar"))[0]
                ).read()
    assert "| local | 10.0 ± 0.0 (2) <" in text
    assert "| local [window 32] | 90.0 ± 0.0 (2) =" in text


def test_a_model_hparams_override_is_a_row_of_its_own(tmp_path):
    """A sweep's model_hparams override that is no capacity on the card (fox's forget gate,
    NSA's block count) is another model: its own row, named by the override, not folded
    into the variant's cell; the runs record keeps the overrides, so the committed record
    regenerates the same rows."""
    runs = tmp_path / "runs"
    for seed in (0, 1):
        _write_run(str(runs), "fox", seed, 0.12)
        _write_run(str(runs), "fox", seed, 0.99, hparams={"forget_gate": False},
                   overrides=["model_hparams.forget_gate=False"])
    out = str(tmp_path / "mqar")
    text = open(synthetic_report.report(str(runs), out)[0]).read()
    assert "| fox | 12.0 ± 0.0 (2) <" in text
    assert "| fox [forget_gate False] | 99.0 ± 0.0 (2) =" in text
    again = open(synthetic_report.report(out + "_runs.jsonl", str(tmp_path / "again"))[0]
                 ).read()
    assert "| fox [forget_gate False] | 99.0 ± 0.0 (2) =" in again


def test_a_kept_knob_names_the_row_and_keeps_it_ranked(tmp_path):
    """RetNet keeps its 8 heads and its rotation against the scaffold's 2 and none: its row
    says so and is ranked; at the scaffold's heads (keep overridden) it is a row of its own."""
    for seed in (0, 1):
        _write_run(str(tmp_path / "runs"), "gla", seed, 0.5 + 0.01 * seed)
        _write_run(str(tmp_path / "runs"), "retnet", seed, 0.9 + 0.01 * seed)
    text = open(synthetic_report.report(str(tmp_path / "runs"), str(tmp_path / "mqar"))[0]
                ).read()
    assert "| retnet [pos rotary (kept), heads 8 (kept)] | 90.5 ± 0.7 (2) =" in text
    assert "| gla | 50.5 ± 0.7 (2) <" in text and "Not ranked" not in text


def test_a_record_without_overrides_takes_them_from_its_folders_hash(tmp_path):
    """Runs records written before `overrides` was kept: a run whose folder is
    seed<s>-<hash> takes the overrides of another run of that hash (another seed of the
    same sweep), so both are one row; a hash no run holds leaves the record as it was."""
    from lra.runs import plan

    overrides = ["model_hparams.block_size=16", "model_hparams.top_k=2"]
    h = plan.overrides_hash(overrides)
    base = {"task": "mqar", "model": "moba", "test_accuracy": 0.5, "config": {}}
    records = [{**base, "run_dir": f"w/mqar/moba/seed0-{h}"},
               {**base, "run_dir": f"w/mqar/moba/seed1-{h}", "overrides": overrides},
               {**base, "run_dir": "w/mqar/moba/seed0-0badc0de"}]
    path = tmp_path / "old_runs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    runs, _ = record.load_sources([str(path)])
    assert runs[0]["overrides"] == overrides
    assert "overrides" not in runs[2]


def test_a_tuning_tried_at_fewer_seeds_does_not_outrank_the_seed_mean():
    """choose_tuning: lr 1e-2 probed at seed 1 alone (validation 0.9) against lr 3e-3 at
    seeds 0-2 (mean 0.6): the tuning run at every seed is chosen; among tunings at equal
    seed counts, the best mean (language models: the lowest loss)."""
    def run(lr, seed, acc, loss=1.0):
        return {"config": {"learning_rate": lr, "weight_decay": 0.1, "random_seed": seed},
                "best_eval_accuracy": acc, "best_eval_loss": loss}

    runs = [run(3e-3, 0, 0.99), run(3e-3, 1, 0.12), run(3e-3, 2, 0.7), run(1e-2, 1, 0.9)]
    tuning, by_seed, chosen, n = synthetic_report.choose_tuning(runs)
    assert tuning == (3e-3, 0.1) and sorted(by_seed) == [0, 1, 2]
    assert (chosen, n) == ("lr 0.003", 2)
    runs += [run(1e-2, 0, 0.9), run(1e-2, 2, 0.9)]
    assert synthetic_report.choose_tuning(runs)[0] == (1e-2, 0.1)
    lm = [run(1e-3, 0, 0.5, loss=2.0), run(3e-3, 0, 0.4, loss=1.5)]
    assert synthetic_report.choose_tuning(lm, lower_loss=True)[0] == (3e-3, 0.1)
    assert synthetic_report.choose_tuning(lm)[0] == (1e-3, 0.1)


def test_mqar_and_length_runs_in_one_source_and_what_they_cost(tmp_path):
    """A folder with MQAR runs and length runs: each table in its own file (the MQAR
    table once went to <out>_lengths.md and its CSV to the figure's path), each closing
    with what its runs cost: the wall time they record (run_seconds), and for runs
    recorded before that field, their training at their steps/s."""
    runs = tmp_path / "runs"
    _write_run(runs, "gla", 0, 0.9)
    _write_length_run(runs, "deltanet", 0, {16: 1.0, 32: 0.8})
    (path,) = [os.path.join(d, "results.json") for d, _, files in os.walk(runs / "state_tracking")
               if "results.json" in files]
    timed = json.load(open(path))
    timed.update(device_kind="cpu", run_seconds={"wall": 5400.0, "train": 3600.0,
                                                 "evaluation": 720.0, "test": 900.0})
    json.dump(timed, open(path, "w"))
    (path,) = [os.path.join(d, "results.json") for d, _, files in os.walk(runs / "L32-d0")
               if "results.json" in files]
    old = json.load(open(path))
    json.dump(dict(old, steps=1200, train_steps_per_sec=2.0), open(path, "w"))
    out = tmp_path / "o" / "both"
    assert synthetic_report.main(["prog", str(runs)], out=str(out)) == 0
    mqar_text = (tmp_path / "o" / "both.md").read_text()
    lengths_text = (tmp_path / "o" / "both_lengths.md").read_text()
    assert mqar_text.startswith("# MQAR") and "| gla |" in mqar_text
    assert lengths_text.startswith("# Accuracy against the evaluation length")
    assert (tmp_path / "o" / "both.csv").read_text().startswith("setting,")
    assert (tmp_path / "o" / "both_lengths.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "o" / "both.png").read_bytes()[:4] == b"\x89PNG"
    assert lengths_text.rstrip().endswith(
        "Compute (devices: cpu): 1.5 h of wall time over 1 run (60 min training, 12 min "
        "validation, 15 min testing, the rest set-up, compilation and checkpoints).")
    # A run resumed from a checkpoint older than run_seconds: its earlier segments missing.
    resumed = dict(timed, run_seconds=dict(timed["run_seconds"], from_step=400))
    assert ("; 1 of them counted from the step they resumed at, their earlier segments "
            "unrecorded)") in record.compute_line([resumed])
    # ... as a record written before from_step was says by its training exceeding its wall.
    older = dict(timed, run_seconds=dict(timed["run_seconds"], train=6000.0))
    assert "1 of them counted from the step" in record.compute_line([older])
    assert "counted from the step" not in record.compute_line([timed])
    # The JAX versions the runs were made with: one named plainly, several with counts.
    assert record.compute_line([dict(timed, jax_version="0.10.2")]).startswith(
        "Compute (devices: cpu; JAX 0.10.2): ")
    mixed = [dict(timed, jax_version=v) for v in ("0.12.1", "0.10.2", "0.9.0", "0.10.2")]
    assert record.compute_line(mixed).startswith(
        "Compute (devices: cpu; JAX 0.9.0 (1 run), 0.10.2 (2 runs), 0.12.1 (1 run)): ")
    assert mqar_text.rstrip().endswith(
        "Compute: 1 run recorded before run_seconds existed, whose training alone took "
        "10 min at their recorded steps/s.")


def test_a_cell_whose_seeds_split_names_each_seed():
    """Seeds more than ranking.SPLIT_POINTS apart (some learn the task, some do not): the
    cell names each seed's score in seed order, in the MQAR and the length tables; not
    for bits per token, whose scale is not a percentage."""
    from lra import length_report
    from lra.reporting import ranking

    assert ranking.seeds_note([99.7, 13.2, 99.5]) == "(3: 99.7, 13.2, 99.5)"
    assert ranking.seeds_note([95.0, 75.0]) == "(2)"  # 20 points: not a split
    assert ranking.seeds_note([50.0]) == "(1)"
    split = {"mean": 50.0, "std": 56.6, "n": 2, "values": [90.0, 10.0]}
    assert length_report._fmt(split) == "50.0 ± 56.6 (2: 90.0, 10.0)"
    assert length_report._fmt(split, 3, accuracy=False) == "50.000 ± 56.600 (2)"

"""lra.length_report (through lra.synthetic_report on length runs): accuracy against the
evaluation length per row with the seeds, the rows' labels (long-input forms, scaffold
ablations, learning rates chosen on validation, eigenvalue ranges), and the panels of
other settings."""
import json
import os

from configs import common
from lra import synthetic_report


def _write_length_run(root, model, seed, lengths, *, neg_eig=False, depths=None,
                      task="state_tracking", splits=None, scaffold=None, lr=None,
                      validation=0.9, extension=None):
    """A results.json as train_and_evaluate writes it with config.eval_lengths: the
    test weights at each length (and, for niah, per depth range); `scaffold`: fields of
    config.scaffold the run overrode."""
    from configs import flipflop as ff_config
    from configs import niah as niah_config
    from configs import state_tracking as st_config

    arg = f"model={model},runlocal{',neg_eig' if neg_eig else ''}"
    make = {"state_tracking": st_config, "niah": niah_config, "flipflop": ff_config}[task]
    config = make.get_config(arg)
    for name, value in (scaffold or {}).items():
        setattr(config.scaffold, name, value)
    config = common.resolve(config).to_dict()
    config["random_seed"] = seed
    if lr is not None:
        config["learning_rate"] = lr
    folder = os.path.join(root, task, model + ("-neg" if neg_eig else "")
                          + ("-" + "-".join(map(str, scaffold.values())) if scaffold else ""),
                          f"seed{seed}" + (f"-lr{lr}" if lr is not None else ""))
    os.makedirs(folder)
    with open(os.path.join(folder, "results.json"), "w") as f:
        json.dump({"task": task, "model": model, "test_accuracy": 0.9,
                   "best_eval_accuracy": validation, "majority_baseline_accuracy": 0.5,
                   "num_params": 1234, "objective": "sequence_labels", "config": config,
                   "length_accuracy": [
                       {"length": n, "max_length": n, "accuracy": a,
                        **({"model_hparams": extension} if extension else {})}
                       for n, a in lengths.items()],
                   "depth_accuracy": depths, "split_accuracy": splits}, f)


def test_length_table_and_figure_show_each_model_per_length_with_the_seeds(tmp_path):
    runs = tmp_path / "runs"
    for seed, (a, b) in enumerate([(1.0, 0.8), (1.0, 0.9)]):
        _write_length_run(runs, "deltanet", seed, {16: a, 32: b}, neg_eig=True)
        _write_length_run(runs, "deltanet", seed, {16: 0.9, 32: 0.5})
    _write_length_run(runs, "gla", 0, {16: 0.6, 32: 0.5}, task="niah",
                      depths=[{"length": 48, "max_length": 48, "depth_min": 0.0,
                               "depth_max": 0.5, "accuracy": 0.25}])
    _write_length_run(runs, "gla", 0, {64: 0.7}, task="flipflop",
                      splits=[{"split": "sparse", "accuracy": 0.55},
                              {"split": "dense", "accuracy": 0.95}])
    out = tmp_path / "report" / "st"
    assert synthetic_report.main(["prog", str(runs)], out=str(out)) == 0
    text = (tmp_path / "report" / "st_lengths.md").read_text()
    assert (tmp_path / "report" / "st_lengths.png").stat().st_size > 0
    assert "## state_tracking parity, trained at lengths 3..12" in text
    assert "| deltanet | 1,234 | 90.0 ± 0.0 (2) | 50.0 ± 0.0 (2) |" in text
    assert "| deltanet [neg_eig] | 1,234 | 100.0 ± 0.0 (2) | 85.0 ± 7.1 (2) |" in text
    assert "| chance | - | 50.0 | 50.0 |" in text
    # niah tests at its training length: the run's own test is that point.
    assert "## niah single_2, trained at L 48" in text
    assert "| gla | 1,234 | 60.0 (1) | 50.0 (1) | 90.0 (1) |" in text
    assert "| gla | 48 | 25.0 (1) |" in text
    record = (tmp_path / "report" / "st_runs.jsonl").read_text().splitlines()
    assert "| model | params | L 32* | L 64 | sparse (at L 32) | dense (at L 32) |" in text
    assert "| gla | 1,234 | 90.0 (1) | 70.0 (1) | 55.0 (1) | 95.0 (1) |" in text
    assert len(record) == 6


def test_a_row_tested_in_its_long_input_form_says_so(tmp_path):
    from lra import length_report

    runs = tmp_path / "runs"
    _write_length_run(runs, "mega", 0, {96: 0.4}, task="niah",
                      extension={"chunk_size": 48})
    _write_length_run(runs, "gla", 0, {96: 0.5}, task="niah")
    runs, _ = length_report.record.load_sources([str(runs)])
    text = length_report.markdown(length_report.cells(runs), "runs")
    assert "their own form for longer inputs" in text and "mega (chunk_size 48)." in text
    assert "gla (" not in text


def test_length_report_command_writes_only_the_length_files(tmp_path, capsys):
    from lra import length_report

    runs = tmp_path / "runs"
    _write_length_run(runs, "gla", 0, {64: 0.7}, task="flipflop")
    assert length_report.main(["prog", str(runs)], out=str(tmp_path / "o" / "ff")) == 0
    assert sorted(os.listdir(tmp_path / "o")) == ["ff_lengths.md", "ff_lengths.png",
                                                  "ff_runs.jsonl"]
    assert length_report.main(["prog", str(tmp_path / "o")], out=str(tmp_path / "x")) == 2
    assert "no run with length_accuracy" in capsys.readouterr().err


def test_a_scaffold_ablation_is_a_row_of_its_own_in_the_length_table(tmp_path):
    """niah's transformer without positions (its scaffold's) and with rotary positions
    (`--override=scaffold.pos_emb=rotary --override=scaffold.ablate=positions`): two rows,
    not two seeds of one (the table of 2026-12-05 first showed them as one row, 73.1 ±
    37.9 at 2K)."""
    from lra import length_report

    runs = tmp_path / "runs"
    _write_length_run(runs, "transformer", 0, {96: 1.0}, task="niah")
    _write_length_run(runs, "transformer", 0, {96: 0.4}, task="niah",
                      scaffold={"pos_emb": "rotary", "ablate": "positions"})
    _write_length_run(runs, "gla", 0, {96: 0.1}, task="niah")
    assert length_report.main(["prog", str(runs)], out=str(tmp_path / "niah")) == 0
    text = (tmp_path / "niah_lengths.md").read_text()
    assert "| transformer | 1,234 | 90.0 (1) | 100.0 (1) |" in text, text
    assert "| transformer [pos rotary] | 1,234 | 90.0 (1) | 40.0 (1) |" in text, text


def test_a_rows_learning_rates_show_the_one_chosen_on_validation(tmp_path):
    """Two learning rates of one row at seeds 0 and 1: the row is the lr with the better
    validation (its two seeds), named; not four runs averaged as four seeds (as the length
    table did before 2026-12-06: lr and weight decay are not part of a panel's setting)."""
    from lra import length_report

    runs = tmp_path / "runs"
    for seed in (0, 1):
        _write_length_run(runs, "gla", seed, {96: 0.03}, task="niah", lr=3e-3,
                          validation=0.03)
        _write_length_run(runs, "gla", seed, {96: 0.8 + 0.1 * seed}, task="niah", lr=1e-3,
                          validation=0.95)
    _write_length_run(runs, "deltanet", 0, {96: 0.5}, task="niah")
    assert length_report.main(["prog", str(runs)], out=str(tmp_path / "niah")) == 0
    text = (tmp_path / "niah_lengths.md").read_text()
    assert ("| gla (lr 0.001 of 2, on validation) | 1,234 | 90.0 ± 0.0 (2) | 85.0 ± 7.1 (2) |"
            in text), text
    assert "| deltanet | 1,234 | 90.0 (1) | 50.0 (1) |" in text, text


def test_a_rows_eigenvalue_range_follows_its_builders_default():
    """gated_deltaproduct's builder defaults to allow_neg_eigval (fla's): a run that leaves
    it unset is [neg_eig], one that turns it off is not; deltanet's default is off."""
    from lra import length_report

    def run(model, hparams):
        return {"model": model, "config": {"model_hparams": hparams}}

    assert length_report.row_label(run("gated_deltaproduct", {})) == \
        "gated_deltaproduct [neg_eig]"
    assert length_report.row_label(
        run("gated_deltaproduct", {"allow_neg_eigval": False})) == "gated_deltaproduct"
    assert length_report.row_label(run("deltanet", {})) == "deltanet"
    assert length_report.row_label(run("deltanet", {"allow_neg_eigval": True})) == \
        "deltanet [neg_eig]"
    # Its sweep's override of allow_neg_eigval is named by [neg_eig] (or its absence) only;
    # another model_hparams override is another model of the variant: its own row.
    off = {**run("gated_deltaproduct", {"allow_neg_eigval": False}),
           "overrides": ["model_hparams.allow_neg_eigval=False"]}
    assert length_report.row_label(off) == "gated_deltaproduct"
    no_decay = {**run("gated_deltanet", {"decay": False}),
                "overrides": ["model_hparams.decay=False"]}
    assert length_report.row_label(no_decay) == "gated_deltanet [decay False]"


def test_a_panel_of_another_setting_names_the_fields_it_differs_in(tmp_path):
    """A run with more steps is a panel of its own: its heading names the field (the
    panel with the most rows unmarked), not a second heading identical to the first."""
    from lra import length_report

    runs = tmp_path / "runs"
    for seed in (0, 1):
        _write_length_run(runs, "deltanet", seed, {16: 0.9, 32: 0.5})
    _write_length_run(runs, "gla", 0, {16: 0.7, 32: 0.6})
    (path,) = [os.path.join(d, "results.json") for d, _, files in os.walk(runs / "state_tracking"
                                                                          / "gla")
               if "results.json" in files]
    longer = json.load(open(path))
    longer["config"]["num_train_steps"] *= 3
    json.dump(longer, open(path, "w"))
    assert length_report.main(["prog", str(runs)], out=str(tmp_path / "o" / "st")) == 0
    headings = [l for l in (tmp_path / "o" / "st_lengths.md").read_text().splitlines()
                if l.startswith("## ")]
    steps = longer["config"]["num_train_steps"]
    assert len(headings) == 2 and not headings[0].endswith(")"), headings
    assert headings[1] == f"{headings[0]} (num_train_steps {steps})", headings


def test_a_length_whose_seeds_split_names_each_seed_in_seed_order(tmp_path):
    """Seeds more than 20 points apart at a length: the cell names each seed's accuracy,
    in seed order (seed 2 before seed 10, whose folder sorts first); a length where they
    agree shows the count alone."""
    runs = tmp_path / "runs"
    _write_length_run(runs, "gla", 10, {16: 0.95, 32: 0.9})
    _write_length_run(runs, "gla", 2, {16: 0.97, 32: 0.2})
    assert synthetic_report.main(["prog", str(runs)], out=str(tmp_path / "r" / "st")) == 0
    row = next(line for line in (tmp_path / "r" / "st_lengths.md").read_text().splitlines()
               if line.startswith("| gla |"))
    assert row == "| gla | 1,234 | 96.0 ± 1.4 (2) | 55.0 ± 49.5 (2: 20.0, 90.0) |", row


def test_a_row_tested_at_its_training_length_only_shares_the_panel(tmp_path):
    """A run with eval_lengths emptied (hyena on niah: its weights are shaped by the
    length) is a row of the same panel, '-' past its training length, not a panel of its
    own: what a run is tested on after training is not its setting."""
    runs = tmp_path / "runs"
    depth = [{"length": 48, "max_length": 48, "depth_min": 0.0, "depth_max": 0.5,
              "accuracy": 0.25}]
    _write_length_run(runs, "gla", 0, {96: 0.5}, task="niah", depths=depth)
    _write_length_run(runs, "hyena", 0, {}, task="niah", depths=depth)
    (path,) = [os.path.join(d, "results.json") for d, _, files in os.walk(runs / "niah"
                                                                          / "hyena")
               if "results.json" in files]
    only = json.load(open(path))
    only["config"]["eval_lengths"] = ""
    json.dump(only, open(path, "w"))
    assert synthetic_report.main(["prog", str(runs)], out=str(tmp_path / "r" / "n")) == 0
    text = (tmp_path / "r" / "n_lengths.md").read_text()
    assert sum(line.startswith("## ") for line in text.splitlines()) == 1, text
    assert "| hyena | 1,234 | 90.0 (1) | - |" in text, text

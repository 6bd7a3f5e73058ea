"""Executes the notebooks on their tiny inputs and checks that every cell ran."""
from __future__ import annotations

import os
import pathlib

import pytest

from tests import tiers

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# The default tier runs the notebook of the comparison path (a sweep's table and plot); the
# others, 3-24 s each in a fresh kernel, run in the exhaustive tier (tests/tiers.py).
DEFAULT_NOTEBOOK = "compare_variants.ipynb"


def _tiny_sweep(sweep_dir: str, data_dir: str) -> None:
    """Two variants, two steps each, through lra.sweep (subprocesses, as a user runs it)."""
    from lra import sweep

    outcome = sweep.sweep(task="listops", models=["transformer", "linear"], seeds=[0],
                          config_arg="runlocal", sweep_dir=sweep_dir,
                          overrides=[f"data_dir={data_dir}", "max_length=48",
                                     "num_train_steps=2", "eval_frequency=2"],
                          log=lambda _: None)
    assert not outcome["failed"], outcome


def _tiny_generation_run(sweep_dir: str) -> None:
    """An MNIST generation run (linear, runlocal sizes) of 2 steps on 12 random images,
    where a sweep would put it."""
    from configs import mnist
    from lra import train
    from tests.tasks.test_mnist import write_mnist

    data_dir = os.path.join(sweep_dir, "data")
    write_mnist(data_dir, num_train=12, num_test=4)
    config = mnist.get_config("model=linear,generation,runlocal")
    config.data_dir = data_dir
    config.task_options.num_validation = 4
    for key, value in {"num_train_steps": 2, "eval_frequency": 2, "checkpoint_freq": 2,
                       "num_eval_steps": 1, "log_every_steps": 1}.items():
        config[key] = value
    train.train_and_evaluate(config, os.path.join(sweep_dir, "mnist", "linear", "seed0"))


def _tiny_enwik8_run(sweep_dir: str) -> None:
    """A transformer run of 2 steps on the tests' Wikipedia slice, where the enwik8 grid
    puts its runs (<sweep>/enwik8/transformer/seed0)."""
    from configs import enwik8
    from lra import train

    config = enwik8.get_config("runlocal")
    config.data_dir = str(ROOT / "tests" / "data" / "enwik8_slice")
    for key, value in {"num_train_steps": 2, "eval_frequency": 2, "checkpoint_freq": 2,
                       "num_eval_steps": 1, "log_every_steps": 1}.items():
        config[key] = value
    train.train_and_evaluate(config, os.path.join(sweep_dir, "enwik8", "transformer", "seed0"))


@pytest.mark.parametrize("path", [
    tiers.exhaustive(p, when=p.name != DEFAULT_NOTEBOOK, id=p.name) for p in NOTEBOOKS])
def test_notebook_runs(path, listops_dir, tmp_path, monkeypatch):
    if path.name == "compare_variants.ipynb":
        _tiny_sweep(str(tmp_path), listops_dir)
        monkeypatch.setenv("LRA_SWEEP_DIR", str(tmp_path))  # the kernel inherits it
    if path.name == "pixel_generation.ipynb":
        _tiny_generation_run(str(tmp_path))
        monkeypatch.setenv("LRA_PIXEL_SWEEP_DIR", str(tmp_path))
        monkeypatch.setenv("LRA_PIXEL_NUM_SAMPLES", "2")
    if path.name == "enwik8_samples.ipynb":
        _tiny_enwik8_run(str(tmp_path))
        monkeypatch.setenv("LRA_ENWIK8_SWEEP_DIR", str(tmp_path))
        monkeypatch.setenv("LRA_ENWIK8_NUM_SAMPLES", "1")
    nb = nbformat.read(path, as_version=4)
    # The "python3" kernel is this interpreter (ipykernel installed in the same venv).
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not [o for o in cell.outputs if o.output_type == "error"]
    if path.name == "enwik8_samples.ipynb":  # the run's sample, under its name
        printed = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
        assert "--- transformer" in printed and "--- original continuation" in printed
    if path.name == "compare_variants.ipynb":
        with open(tmp_path / "efficiency_accuracy.png", "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        table = (tmp_path / "results.md").read_text()
        assert "| transformer |" in table and "| linear |" in table

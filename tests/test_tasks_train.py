"""Every non-ListOps task's `runlocal` config trains end to end on tiny on-disk datasets
written in the real formats; the dual encoder (retrieval) is checked on its own."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lra import train
from lra.tasks import pathfinder
from models.encoder import DualClassifier, Encoder, pool

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _words(rng, n):
    return " ".join(rng.choice(["good", "bad", "plot", "film", "<br />"], size=n)).encode()


def write_imdb(root, rng):
    for split in ("train", "test"):
        for label in ("pos", "neg"):
            folder = root / "aclImdb" / split / label
            folder.mkdir(parents=True)
            for i in range(6):
                (folder / f"{i}_{rng.integers(1, 11)}.txt").write_bytes(_words(rng, 30))


def write_aan(root, rng):
    for split in ("train", "eval", "test"):
        rows = [b"\t".join([str(rng.integers(2)).encode(), b"id1", b"id2", _words(rng, 20),
                            _words(rng, 25)]) for _ in range(12)]
        (root / f"new_aan_pairs.{split}.tsv").write_bytes(b"\n".join(rows) + b"\n")


def write_cifar(root, rng):
    folder = root / "cifar-10-batches-py"
    folder.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, size=(2, 3072), dtype=np.uint8),
                 b"labels": rng.integers(0, 10, size=2).tolist()}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)


def write_pathfinder(root, rng):
    pathfinder.generate(str(root), resolution=32, num_images=20, seed=int(rng.integers(100)),
                        workers=1, images_per_folder=8, verbose=False)


# task -> (data writer, overrides of the runlocal config)
TASKS = {
    "text": (write_imdb, {"max_length": 32}),
    "retrieval": (write_aan, {"max_length": 32}),
    # 10 training images: the test set stands in for validation.
    "image": (write_cifar, {"task_options.validation": "test"}),
    "pathfinder": (write_pathfinder, {}),
    "pathx": (write_pathfinder, {}),  # runlocal reads 32x32 images
}


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory):
    rng = np.random.default_rng(0)
    dirs = {}
    for task, (writer, _) in TASKS.items():
        if task == "pathx":
            dirs[task] = dirs["pathfinder"]
            continue
        path = tmp_path_factory.mktemp(task)
        writer(path, rng)
        dirs[task] = str(path)
    return dirs


def _config(task, data_dir, **extra):
    import importlib

    config = importlib.import_module(f"configs.{task}").get_config("runlocal")
    config.data_dir = data_dir
    for key, value in {**TASKS[task][1], "num_train_steps": 2, "eval_frequency": 2,
                       "checkpoint_freq": 2, "num_eval_steps": 1, **extra}.items():
        sub, _, field = key.rpartition(".")
        (config[sub] if sub else config)[field] = value
    return config


# Every task's runlocal config trains end to end in the default suite; Retrieval's runs
# through launch.py below (byte reader, dual encoder), so its in-process twin is slow-only.
SLOW = ("retrieval",)


@pytest.mark.parametrize("task", [pytest.param(t, marks=pytest.mark.slow) if t in SLOW else t
                                  for t in TASKS])
def test_runlocal_trains(task, data_dirs, tmp_path):
    results = train.train_and_evaluate(_config(task, data_dirs[task]), str(tmp_path))
    assert results["task"] == task and results["steps"] == 2
    assert 0.0 <= results["test_accuracy"] <= 1.0
    assert np.isfinite(results["test_loss"])


def test_launch_retrieval_runlocal(data_dirs, tmp_path):
    """The documented command, end to end, in a subprocess (the dual encoder path)."""
    proc = subprocess.run(
        [sys.executable, "launch.py", "--config=configs/retrieval.py:runlocal",
         f"--config.data_dir={data_dirs['retrieval']}", "--config.max_length=32",
         "--config.num_train_steps=3", f"--workdir={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.load(open(tmp_path / "results.json"))
    assert results["task"] == "retrieval" and results["steps"] == 3


@pytest.mark.slow  # the readers' tests check the messages; this checks launch prints one line
def test_launch_missing_data_is_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "launch.py", "--config=configs/image.py:runlocal",
         f"--config.data_dir={tmp_path}/none", f"--workdir={tmp_path}/w"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "cifar-10-python.tar.gz" in proc.stderr


def _dual(seed=0):
    return DualClassifier(vocab_size=20, num_classes=2, max_len=8, emb_dim=16, num_heads=2,
                          num_layers=1, qkv_dim=16, mlp_dim=24, pooling="MEAN",
                          rngs=nnx.Rngs(seed))


def test_dual_classifier_head_on_shared_towers():
    model = _dual()
    rng = np.random.default_rng(1)
    x1, x2 = (jnp.asarray(rng.integers(1, 20, size=(3, 8))) for _ in range(2))
    m1 = jnp.arange(8)[None] < jnp.array([[8], [5], [3]])
    m2 = jnp.arange(8)[None] < jnp.array([[2], [8], [6]])

    @nnx.jit  # one compilation instead of one per eager op
    def both(model, x1, m1, x2, m2):
        logits = model(x1, m1, x2, m2, deterministic=True)
        swapped = model(x2, m2, x1, m1, deterministic=True)
        p1 = pool(*model.encoder(x1, m1, deterministic=True), "MEAN")
        p2 = pool(*model.encoder(x2, m2, deterministic=True), "MEAN")
        return logits, swapped, model.head(jnp.concatenate([p1, p2, p1 * p2, p1 - p2], -1))

    logits, swapped, expected = both(model, x1, m1, x2, m2)
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)
    # One set of tower weights: the same number of encoder params as a single classifier.
    encoders = [m for _, m in nnx.iter_graph(model) if isinstance(m, Encoder)]
    assert len(encoders) == 1
    assert model.head.hidden.kernel.shape == (4 * 16, 24)
    # Swapping the documents changes the x1 - x2 feature, so the logits differ.
    assert not np.allclose(logits, swapped)

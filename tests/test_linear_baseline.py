"""lra.linear_baseline: a logistic regression on the raw inputs, on real Fashion-MNIST
images (the tests' slice of the Debian package's files) and on token counts."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from configs import fashion_mnist
from lra import linear_baseline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLICE = os.path.join(ROOT, "tests", "data", "fashion_mnist_slice")


def _config():
    c = fashion_mnist.get_config("mini")
    c.data_dir = SLICE
    c.task_options.num_validation = 40
    return c


def test_pixels_of_real_images_beat_the_majority_label_by_far():
    s = linear_baseline.evaluate_config(_config(), steps=100)
    assert s.num_features == 784
    assert s.l2 in linear_baseline.L2_GRID
    # 160 training images of 10 classes: a linear model on pixels gets most of 50 test
    # images right (the full set: 84%); the majority label about a tenth.
    assert s.test_accuracy > 0.55 > 0.25 > s.majority_accuracy


def test_features():
    data = {"inputs": np.array([[3, 1, 0], [2, 2, 2]]), "mask": np.array([[1, 1, 0], [1, 1, 1]])}
    np.testing.assert_allclose(linear_baseline.featurize(data, "values", 4),
                               [[1.0, 1 / 3, 0.0], [2 / 3, 2 / 3, 2 / 3]])
    np.testing.assert_allclose(linear_baseline.featurize(data, "counts", 4),
                               [[0, 0.5, 0, 0.5], [0, 0, 1, 0]])
    with pytest.raises(ValueError, match="values or counts"):
        linear_baseline.featurize(data, "pixels", 4)


def test_command_line():
    out = subprocess.run(
        [sys.executable, "-m", "lra.linear_baseline", "--config=configs/fashion_mnist.py:mini",
         f"--config.data_dir={SLICE}", "--config.task_options.num_validation=40",
         "--steps=20"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "fashion_mnist linear classifier on values (784 features" in out.stdout
    out = subprocess.run(
        [sys.executable, "-m", "lra.linear_baseline",
         "--config=configs/enwik8.py:runlocal"], cwd=ROOT, capture_output=True, text=True,
        timeout=300)
    assert out.returncode != 0 and "give a classification config" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "lra.linear_baseline", "--config=configs/fashion_mnist.py:mini",
         "--config.data_dir=/nonexistent/fm"], cwd=ROOT, capture_output=True, text=True,
        timeout=300)
    assert out.returncode != 0 and out.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "Traceback" not in out.stderr

"""Fashion-MNIST (lra/tasks/mnist.py FASHION_MNIST, configs/fashion_mnist.py) on real images:
the first 120 training and 40 test images of Debian's dataset-fashion-mnist package, made by
scripts/fashion_mnist_files.py (its sha256 checks passed); no download."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from lra.errors import DataError
from lra.tasks import mnist

SLICE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "fashion_mnist_slice")


def test_the_slice_reads_as_fashion_mnist():
    import lra.tasks

    task = lra.tasks.get("fashion_mnist")
    train = task.load(SLICE, "train", 784, num_validation=20)
    val = task.load(SLICE, "val", 784, num_validation=20)
    test = task.load(SLICE, "test", 784, num_validation=20)
    assert [len(d["inputs"]) for d in (train, val, test)] == [100, 20, 40]
    # Zalando's first training image is an ankle boot (label 9), its first test image too.
    assert int(train["targets"][0]) == 9 and int(test["targets"][0]) == 9
    labels = np.concatenate([train["targets"], val["targets"], test["targets"]])
    assert set(labels.tolist()) <= set(range(10)) and len(set(labels.tolist())) == 10
    assert train["inputs"].max() <= 255 and train["mask"].all()
    # Clothing, not digits: the pixels are on a lot more than MNIST's (~19% on).
    assert (train["inputs"] > 0).mean() > 0.4


def test_missing_files_name_fashion_mnist_and_debian(tmp_path):
    import lra.tasks

    with pytest.raises(DataError, match=r"Fashion-MNIST files .*apt-get download "
                                        r"dataset-fashion-mnist"):
        lra.tasks.get("fashion_mnist").load(str(tmp_path), "test", 784)
    # MNIST's own messages are unchanged.
    with pytest.raises(DataError, match="MNIST files .* lra.download mnist"):
        lra.tasks.get("mnist").load(str(tmp_path), "test", 784)


def test_runlocal_trains_on_the_real_images(tmp_path):
    from configs import fashion_mnist
    from lra import train

    c = fashion_mnist.get_config("runlocal")
    assert c.task == "fashion_mnist" and c.data_dir == "data/fashion_mnist"
    c.data_dir = SLICE
    c.task_options.num_validation = 20
    c.num_train_steps, c.eval_frequency, c.checkpoint_freq = 4, 4, 4
    train.train_and_evaluate(c, str(tmp_path))
    saved = json.load(open(os.path.join(tmp_path, "results.json")))
    assert saved["task"] == "fashion_mnist" and 0.0 <= saved["test_accuracy"] <= 1.0
    assert mnist.FASHION_SHA256  # the files the slice came from were checked against these

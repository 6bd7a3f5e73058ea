"""MNIST (lra/tasks/mnist.py): the original IDX files (plain or gzipped, three layouts),
splits, one-line errors; a TFDS mnist folder of the same images gives the same images."""
from __future__ import annotations

import gzip
import os

import numpy as np
import pytest

import lra.tasks
from lra.errors import ConfigError, DataError
from lra.tasks import mnist, tfds_folders
from tests.tasks.tfds_builders import Mnist, prepare


def write_mnist(folder, *, num_train=12, num_test=4, seed=0, gz=True):
    """The four IDX files of random images and labels in `folder`; (train, test) as
    (images_Nx28x28, labels_N)."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    splits = {}
    for split, n in (("train", num_train), ("test", num_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        images[:, :4] = 0  # black rows, as MNIST's borders: token 0, not padding
        labels = rng.integers(0, 10, size=n).astype(np.uint8)
        names = mnist.FILES[split]
        suffix = ".gz" if gz else ""
        mnist.write_idx(os.path.join(folder, names[0] + suffix), images)
        mnist.write_idx(os.path.join(folder, names[1] + suffix), labels)
        splits[split] = (images, labels)
    return splits


def test_idx_files_round_trip_and_are_the_originals_layout(tmp_path):
    images = np.arange(2 * 28 * 28, dtype=np.int64).astype(np.uint8).reshape(2, 28, 28)
    mnist.write_idx(str(tmp_path / "x.gz"), images)
    raw = gzip.decompress((tmp_path / "x.gz").read_bytes())
    # The original's header: magic 2051, then N, rows, columns, big-endian; then the bytes.
    assert raw[:16] == bytes([0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 28, 0, 0, 0, 28])
    assert raw[16:] == images.tobytes()
    np.testing.assert_array_equal(mnist.read_idx(str(tmp_path / "x.gz"), mnist.IMAGES_MAGIC),
                                  images)


@pytest.mark.parametrize("layout", [".", "mnist", "MNIST/raw"])
@pytest.mark.parametrize("gz", [True, False])
def test_reads_pixels_row_major_with_an_all_true_mask(tmp_path, layout, gz):
    splits = write_mnist(tmp_path / layout, gz=gz)
    data = lra.tasks.get("mnist").load(str(tmp_path), "test", 800)
    images, labels = splits["test"]
    assert data["inputs"].shape == (4, 800) and data["inputs"].dtype == np.int32
    np.testing.assert_array_equal(data["inputs"][:, :784], images.reshape(4, 784))
    assert (data["inputs"][:, :28 * 4] == 0).all()  # black pixels are token 0 ...
    assert data["mask"][:, :784].all() and not data["mask"][:, 784:].any()  # ... not padding
    np.testing.assert_array_equal(data["targets"], labels)
    assert lra.tasks.get("mnist").vocab_size == 256


def test_splits(tmp_path):
    splits = write_mnist(tmp_path, num_train=5010)
    task = lra.tasks.get("mnist")
    train, val = task.load(str(tmp_path), "train", 784), task.load(str(tmp_path), "val", 784)
    assert len(train["targets"]) == 10 and len(val["targets"]) == 5000  # the last 5000
    np.testing.assert_array_equal(np.concatenate([train["targets"], val["targets"]]),
                                  splits["train"][1])
    small = task.load(str(tmp_path), "val", 784, num_validation=3)
    np.testing.assert_array_equal(small["inputs"], splits["train"][0][-3:].reshape(3, 784))
    assert len(task.load(str(tmp_path), "train", 784, num_validation=3)["targets"]) == 5007
    for bad in (0, -1, True, "5"):
        with pytest.raises(ConfigError, match="num_validation"):
            task.load(str(tmp_path), "val", 784, num_validation=bad)
    with pytest.raises(DataError, match=r"5010 training images, not more than the 6000 held"):
        task.load(str(tmp_path), "train", 784, num_validation=6000)
    with pytest.raises(ConfigError, match="shorter than an MNIST image"):
        task.load(str(tmp_path), "test", 783)


def _error(data_dir, split="test") -> str:
    with pytest.raises(DataError) as e:
        lra.tasks.get("mnist").load(str(data_dir), split, 784)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_missing_and_damaged_files_are_one_line(tmp_path):
    assert "python -m lra.download mnist --data_dir=data" in _error(tmp_path)
    write_mnist(tmp_path)
    labels = tmp_path / "t10k-labels-idx1-ubyte.gz"
    os.remove(labels)
    assert "t10k-labels-idx1-ubyte[.gz] does not exist" in _error(tmp_path)
    mnist.write_idx(str(labels), np.zeros(5, np.uint8))
    assert "5 labels for the 4 images" in _error(tmp_path)
    mnist.write_idx(str(labels), np.full(4, 10, np.uint8))
    assert "labels outside [0, 10)" in _error(tmp_path)
    images = tmp_path / "train-images-idx3-ubyte.gz"
    images.write_bytes(images.read_bytes()[:100])
    assert "train-images-idx3-ubyte.gz: cannot be read (EOFError" in _error(tmp_path, "train")
    images.write_bytes(gzip.compress(b"\x00\x00\x08\x01" + bytes(8)))
    assert "not an IDX file of MNIST images (magic 0x00000803): its magic number is " \
           "0x00000801" in _error(tmp_path, "train")
    header = b"".join(v.to_bytes(4, "big") for v in (0x803, 12, 28, 28))
    images.write_bytes(gzip.compress(header + bytes(100)))
    assert "the header says 12 items (9408 bytes), the file holds 100 bytes" in (
        _error(tmp_path, "train"))


@pytest.fixture(scope="module")
def files_and_tfds(tmp_path_factory):
    """The same images as IDX files and as a TFDS mnist folder (ArrayRecord)."""
    root = tmp_path_factory.mktemp("mnist")
    splits = write_mnist(root / "files", num_train=14, num_test=5, seed=1)
    version = prepare(Mnist, root / "tfds", root / "files")
    return str(root / "files"), str(root / "tfds"), version, splits


def test_tfds_folder_gives_the_same_images(files_and_tfds):
    files, tfds_dir, version, splits = files_and_tfds
    assert version.endswith(os.path.join("mnist", "3.0.1"))
    task = lra.tasks.get("mnist")

    def rows(data):  # (label, pixels...) rows, sorted: the images, whatever their order
        table = np.concatenate([data["targets"][:, None], data["inputs"]], axis=1)
        return table[np.lexsort(table.T[::-1])]

    for data_dir in (tfds_dir, os.path.join(tfds_dir, "mnist"), version):
        test = task.load(data_dir, "test", 784)
        np.testing.assert_array_equal(rows(test), rows(task.load(files, "test", 784)))
        assert test["mask"].all() and test["inputs"].dtype == np.int32
    # Train and val: TFDS's stored order, its last 4 images held out; together the
    # training images of the files.
    train = task.load(tfds_dir, "train", 784, num_validation=4)
    val = task.load(tfds_dir, "val", 784, num_validation=4)
    assert (len(train["targets"]), len(val["targets"])) == (10, 4)
    both = {k: np.concatenate([train[k], val[k]]) for k in ("inputs", "targets")}
    images, labels = splits["train"]
    np.testing.assert_array_equal(rows(both), rows({"inputs": images.reshape(-1, 784),
                                                    "targets": labels.astype(np.int32)}))
    examples, _ = tfds_folders.read_split(version, "train", tfds_folders.MNIST, "",
                                          undecoded=("image",))
    assert [int(e["label"]) for e in examples] != labels.tolist()  # stored shuffled
    with pytest.raises(DataError, match="holds mnist/3.0.1; the image task reads TFDS "
                                        "cifar10/3.0.2"):
        lra.tasks.get("image").load(version, "test", 1024)


def test_files_are_read_when_both_are_there(files_and_tfds, tmp_path):
    files, tfds_dir, _, splits = files_and_tfds
    both = tmp_path / "both"
    os.makedirs(both)
    for name in os.listdir(files):
        os.symlink(os.path.join(files, name), both / name)
    os.symlink(os.path.join(tfds_dir, "mnist"), both / "mnist")  # a TFDS folder beside them
    data = lra.tasks.get("mnist").load(str(both), "val", 784, num_validation=4)
    np.testing.assert_array_equal(data["inputs"], splits["train"][0][-4:].reshape(4, 784))


def test_an_empty_split_is_refused_before_training(tmp_path):
    """Issue 46, item 7: a valid 0-image t10k file passed every check, the run trained to
    the end and failed at test with a TypeError. Every split's size is checked on load
    (lra/tasks/registry.py Task.load), for every task; training reads all three first."""
    write_mnist(str(tmp_path), num_train=12, num_test=0)
    task = lra.tasks.get("mnist")
    assert len(task.load(str(tmp_path), "train", 784, num_validation=4)["inputs"]) == 8
    with pytest.raises(DataError, match="task mnist: the test split read from .* has no "
                                        "examples; run `python -m lra.download mnist"):
        task.load(str(tmp_path), "test", 784, num_validation=4)

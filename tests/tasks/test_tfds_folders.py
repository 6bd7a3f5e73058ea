"""TFDS folders (lra/tasks/tfds_folders.py) on real folders that TFDS prepares with the
catalogue's names, configs, features and versions (tests/tasks/tfds_builders.py): which
folder a data_dir names, TFRecord folders with and without TensorFlow, one-line errors.
The tokens against the archive readers: tests/tasks/test_text.py and test_image.py."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil

import numpy as np
import pytest

import lra.tasks
from lra.errors import DataError
from lra.tasks import tfds_folders
from tests.tasks.test_image import write_cifar
from tests.tasks.test_text import by_content, write_imdb
from tests.tasks.tfds_builders import Cifar10, ImdbReviews, prepare

HAS_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None


def imdb_folder(tmp_path, file_format="array_record", builder=ImdbReviews):
    """(TFDS data_dir, version folder, archive data_dir) of the reviews in test_text."""
    archive = tmp_path / "archive"
    if not archive.exists():
        archive.mkdir()
        write_imdb(archive)
    root = tmp_path / f"tfds_{file_format}"
    return root, prepare(builder, root, archive, file_format), archive


def cifar_folder(tmp_path, file_format="array_record"):
    archive = tmp_path / "cifar_archive"
    archive.mkdir()
    write_cifar(archive, per_batch=2, num_test=3)
    root = tmp_path / f"cifar_{file_format}"
    return root, prepare(Cifar10, root, archive, file_format), archive


def load_error(task, data_dir, split="train", **options) -> str:
    length = 1024 if task == "image" else 16
    with pytest.raises(DataError) as e:
        lra.tasks.get(task).load(str(data_dir), split, length, **options)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_every_folder_level_names_the_version_folder(tmp_path):
    root, version, archive = imdb_folder(tmp_path)
    assert version == str(root / "imdb_reviews" / "plain_text" / "1.0.0")
    expected = lra.tasks.get("text").load(str(root), "train", 16)
    for data_dir in (root / "imdb_reviews", root / "imdb_reviews" / "plain_text", version):
        assert tfds_folders.find(str(data_dir), tfds_folders.IMDB_REVIEWS, "") == version
        data = lra.tasks.get("text").load(str(data_dir), "train", 16)
        for key in expected:
            np.testing.assert_array_equal(data[key], expected[key])
    assert tfds_folders.find(str(archive), tfds_folders.IMDB_REVIEWS, "") is None
    assert tfds_folders.find(str(root), tfds_folders.CIFAR10, "") is None

    root, version, _ = cifar_folder(tmp_path)
    for data_dir in (root, root / "cifar10", version):
        assert tfds_folders.find(str(data_dir), tfds_folders.CIFAR10, "") == version
        data = lra.tasks.get("image").load(str(data_dir), "test", 1024)
        assert data["inputs"].shape == (3, 1024)


def test_another_version_config_or_dataset_says_which(tmp_path):
    root, version, _ = imdb_folder(tmp_path)
    _, cifar_version, _ = cifar_folder(tmp_path)
    assert "holds cifar10/3.0.2; the text task reads TFDS imdb_reviews/plain_text/1.0.0" in (
        load_error("text", cifar_version))
    assert "holds imdb_reviews/plain_text/1.0.0; the image task reads TFDS cifar10/3.0.2" in (
        load_error("image", version, "test"))

    os.rename(version, os.path.join(os.path.dirname(version), "0.1.0"))
    message = load_error("text", root)
    assert "imdb_reviews/plain_text has version(s) 0.1.0, not 1.0.0; the text task reads " \
           "TFDS imdb_reviews/plain_text/1.0.0 (or: run `python -m lra.download text" in message
    os.rename(root / "imdb_reviews" / "plain_text", root / "imdb_reviews" / "bytes")
    assert "imdb_reviews has config(s) bytes, not plain_text; the text task reads" in (
        load_error("text", root))


class TrainOnly(ImdbReviews, skip_registration=True):
    name = "imdb_reviews"  # a subclass would otherwise be named after its class
    SPLITS = {"train": "train"}


def test_missing_split(tmp_path):
    root, _, _ = imdb_folder(tmp_path, builder=TrainOnly)
    assert lra.tasks.get("text").load(str(root), "train", 16)["targets"].shape == (4,)
    assert "has split(s) train, not 'test'; the text task needs train, test" in (
        load_error("text", root, "val"))


def test_unfinished_and_damaged_folders(tmp_path):
    root, version, _ = imdb_folder(tmp_path)
    damaged = tmp_path / "damaged"
    shutil.copytree(root, damaged)
    damaged_version = damaged / "imdb_reviews" / "plain_text" / "1.0.0"
    (damaged_version / "imdb_reviews-train.array_record-00000-of-00001").unlink()
    assert "1.0.0: cannot read split 'train' (RuntimeError:" in load_error("text", damaged)
    assert lra.tasks.get("text").load(str(damaged), "test", 16)["targets"].shape == (2,)
    (damaged_version / "dataset_info.json").unlink()
    assert "1.0.0 has no dataset_info.json: not a finished TFDS preparation" in (
        load_error("text", damaged))
    # What TFDS leaves while it prepares (or after a preparation that died).
    os.rename(version, os.path.join(os.path.dirname(version), "incomplete.A1B2C3_1.0.0"))
    assert "has version(s) none and an unfinished preparation (incomplete.*), not 1.0.0" in (
        load_error("text", root))


def test_the_archive_is_read_when_both_are_there(tmp_path):
    root, version, archive = imdb_folder(tmp_path)
    shutil.copytree(archive / "aclImdb", root / "aclImdb")
    os.unlink(os.path.join(version, "dataset_info.json"))  # the TFDS folder is not opened
    data = lra.tasks.get("text").load(str(root), "train", 16)
    np.testing.assert_array_equal(data["targets"], [0, 0, 1, 1])  # the archive's order


def rewrite_info(version, **fields):
    path = os.path.join(version, "dataset_info.json")
    with open(path) as f:
        info = json.load(f)
    for key, value in fields.items():
        if value is None:
            info.pop(key, None)
        else:
            info[key] = value
    with open(path, "w") as f:
        json.dump(info, f)


def test_a_folder_from_before_tfds_recorded_the_config(tmp_path):
    root, version, _ = imdb_folder(tmp_path)
    expected = lra.tasks.get("text").load(str(root), "train", 16)
    rewrite_info(version, configName=None)  # the folder plain_text/ names it
    data = lra.tasks.get("text").load(str(root), "train", 16)
    for key in expected:
        np.testing.assert_array_equal(data[key], expected[key])
    renamed = root / "imdb_reviews" / "bytes" / "1.0.0"
    os.renames(version, renamed)
    assert "holds imdb_reviews/bytes/1.0.0; the text task reads TFDS" in (
        load_error("text", renamed))


@pytest.mark.skipif(HAS_TENSORFLOW, reason="the message for a machine without TensorFlow")
def test_tfrecord_folder_without_tensorflow_says_what_to_do(tmp_path):
    # TFRecord shards can only be written by TensorFlow, absent here: the dataset_info of
    # an ArrayRecord folder says TFRecord instead, which is all that is read before the
    # shards.
    root, version, _ = imdb_folder(tmp_path)
    expected = lra.tasks.get("text").load(str(root), "train", 16)
    rewrite_info(version, fileFormat="tfrecord")
    message = load_error("text", root)
    assert message.endswith(
        "stores tfrecord records, which only TensorFlow reads: pip install tensorflow; or add "
        "ArrayRecord shards beside them once, where pip install tensorflow apache-beam "
        "mlcroissant is done: tfds convert_format "
        f"--dataset_version_dir={version} --out_file_format=array_record")
    rewrite_info(version, fileFormat=None)  # TFDS before 4.x recorded no format: TFRecord
    assert "stores tfrecord records" in load_error("text", root)
    # `tfds convert_format` without --out_dir adds ArrayRecord shards beside the TFRecord
    # ones and lists the format as an alternative (so it did on a TFRecord folder of these
    # builders, with TensorFlow 2.21): then no TensorFlow is needed.
    rewrite_info(version, fileFormat="tfrecord", alternativeFileFormats=["array_record"])
    data = lra.tasks.get("text").load(str(root), "train", 16)
    for key in expected:
        np.testing.assert_array_equal(data[key], expected[key])


@pytest.mark.skipif(not HAS_TENSORFLOW, reason="reading TFRecord shards needs TensorFlow")
def test_tfrecord_folders_with_tensorflow(tmp_path):
    root, version, archive = imdb_folder(tmp_path, "tfrecord")
    array_root, _, _ = imdb_folder(tmp_path, "array_record")
    for split in ("train", "test"):
        data = lra.tasks.get("text").load(str(root), split, 16)
        # Shards in order, as the ArrayRecord reader: one order for both formats.
        same_order = lra.tasks.get("text").load(str(array_root), split, 16)
        by_archive = by_content(lra.tasks.get("text").load(str(archive), split, 16))
        for key in data:
            np.testing.assert_array_equal(data[key], same_order[key])
            np.testing.assert_array_equal(by_content(data)[key], by_archive[key])
    # TFDS <= 3.2.1 wrote no features.json (nor the config): the catalogue's own builder
    # reads the folder.
    os.unlink(os.path.join(version, "features.json"))
    rewrite_info(version, configName=None)
    data = lra.tasks.get("text").load(str(root), "test", 16)
    for key in data:
        np.testing.assert_array_equal(data[key], same_order[key])  # same_order: of "test"

    root, _, archive = cifar_folder(tmp_path, "tfrecord")
    for split in ("train", "val", "test"):
        data = lra.tasks.get("image").load(str(root), split, 1024, validation="test")
        expected = lra.tasks.get("image").load(str(archive), split, 1024, validation="test")
        for key in data:
            np.testing.assert_array_equal(data[key], expected[key])

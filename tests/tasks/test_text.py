"""Text (IMDB bytes): the aclImdb folder layout, byte tokens, LRA's splits, errors; a TFDS
imdb_reviews folder of the same reviews gives the same tokens."""
from __future__ import annotations

import numpy as np
import pytest

import lra.tasks
from lra.errors import DataError
from tests.tasks.tfds_builders import ImdbReviews, prepare

REVIEWS = {  # split -> label folder -> {file name: bytes}
    "train": {"pos": {"0_9.txt": b"Great film! <br /><br />Loved it.",
                      "1_7.txt": "Caf\u00e9 scene: tr\u00e8s bien".encode()},
              "neg": {"0_2.txt": b"Dull.", "10_1.txt": b"\x00\xffodd bytes kept as they are"}},
    "test": {"pos": {"3_10.txt": b" \tSuperb\r\n"},  # TFDS strips the whitespace around
             "neg": {"4_3.txt": b"Bad acting, worse plot"}},
}


def write_imdb(root, reviews=REVIEWS):
    for split, by_label in reviews.items():
        for label, files in by_label.items():
            folder = root / "aclImdb" / split / label
            folder.mkdir(parents=True)
            for name, text in files.items():
                (folder / name).write_bytes(text)
    (root / "aclImdb" / "train" / "unsup").mkdir()  # present in the real archive, ignored
    (root / "aclImdb" / "train" / "unsup" / "0_0.txt").write_bytes(b"no label")
    return str(root)


def expected_ids(text: bytes, length: int) -> np.ndarray:
    ids = np.zeros(length, np.int32)
    clipped = list(text[:length])
    ids[:len(clipped)] = [b + 1 for b in clipped]
    return ids


def test_reads_bytes_labels_in_sorted_order(tmp_path):
    data_dir = write_imdb(tmp_path)
    data = lra.tasks.get("text").load(data_dir, "train", 24)
    # neg then pos, file names sorted as strings.
    order = [("neg", "0_2.txt"), ("neg", "10_1.txt"), ("pos", "0_9.txt"), ("pos", "1_7.txt")]
    np.testing.assert_array_equal(data["targets"], [0, 0, 1, 1])
    for row, (label, name) in enumerate(order):
        text = REVIEWS["train"][label][name]
        np.testing.assert_array_equal(data["inputs"][row], expected_ids(text, 24))
        np.testing.assert_array_equal(data["mask"][row], np.arange(24) < min(len(text), 24))
    # Byte 0x00 is token 1, not padding.
    assert data["inputs"][1, 0] == 1 and data["mask"][1, 0]
    assert lra.tasks.get("text").vocab_size == 257


def test_validation_is_the_test_set_as_in_lra(tmp_path):
    data_dir = write_imdb(tmp_path)
    val = lra.tasks.get("text").load(data_dir, "val", 16)
    test = lra.tasks.get("text").load(data_dir + "/aclImdb", "test", 16)  # either folder works
    for key in ("inputs", "mask", "targets"):
        np.testing.assert_array_equal(val[key], test[key])
    np.testing.assert_array_equal(test["targets"], [0, 1])


def test_missing_data_says_what_to_download(tmp_path):
    with pytest.raises(DataError, match="aclImdb_v1.tar.gz"):
        lra.tasks.get("text").load(str(tmp_path), "train", 16)
    write_imdb(tmp_path, {"train": {"pos": {"0_9.txt": b"ok"}}, "test": {}})
    with pytest.raises(DataError, match=r"aclImdb/train/neg does not exist.*aclImdb_v1"):
        lra.tasks.get("text").load(str(tmp_path), "train", 16)


def test_empty_review_names_the_file(tmp_path):
    reviews = {"train": {"pos": {"0_9.txt": b"fine"}, "neg": {"5_1.txt": b"  \n"}},
               "test": {}}
    with pytest.raises(DataError, match=r"neg/5_1\.txt: the review is empty"):
        lra.tasks.get("text").load(write_imdb(tmp_path, reviews), "train", 16)


def test_whitespace_around_a_review_is_stripped_as_tfds_stores_it(tmp_path):
    data = lra.tasks.get("text").load(write_imdb(tmp_path), "test", 8)
    np.testing.assert_array_equal(data["inputs"][1], expected_ids(b"Superb", 8))
    np.testing.assert_array_equal(data["mask"][1], np.arange(8) < 6)


def by_content(data):
    """Rows in one order (targets, then tokens): TFDS does not keep the archive's order."""
    order = sorted(range(len(data["targets"])),
                   key=lambda i: (data["targets"][i], data["inputs"][i].tobytes()))
    return {key: value[order] for key, value in data.items()}


def test_tfds_folder_gives_the_archive_tokens(tmp_path):
    (tmp_path / "archive").mkdir()
    archive = write_imdb(tmp_path / "archive")
    prepare(ImdbReviews, tmp_path / "tfds", archive)
    for split, length in (("train", 24), ("val", 4), ("test", 24)):
        from_archive = lra.tasks.get("text").load(archive, split, length)
        from_tfds = lra.tasks.get("text").load(str(tmp_path / "tfds"), split, length)
        assert len(from_tfds["targets"]) == len(from_archive["targets"])
        for key, value in by_content(from_tfds).items():
            np.testing.assert_array_equal(value, by_content(from_archive)[key])
            assert value.dtype == from_archive[key].dtype

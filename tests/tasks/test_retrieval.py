"""Retrieval (AAN pairs): LRA's TSV format, two byte sequences per row, errors."""
from __future__ import annotations

import numpy as np
import pytest

import lra.tasks
from lra.errors import DataError

ROWS = [  # label, id1, id2, text1, text2 (quotes are ordinary bytes, as in LRA's reader)
    (b"1", b"P01-1001", b"J92-4003", b'We use "tree" kernels.', b"Parsing with\xc3\xa9 PCFGs"),
    (b"0.0", b"W03-0419", b"P05-1045", b"Named entities", b"Phrase-based translation"),
    (b"1.0", b"A00-1031", b"C96-1058", b"x" * 40, b"short"),
]


def write_aan(root, rows=ROWS, splits=("train", "eval", "test")):
    for split in splits:
        lines = [b"\t".join(r) for r in rows]
        (root / f"new_aan_pairs.{split}.tsv").write_bytes(b"\n".join(lines) + b"\n")
    return str(root)


def ids(text: bytes, length: int) -> np.ndarray:
    out = np.zeros(length, np.int32)
    out[:min(len(text), length)] = np.frombuffer(text[:length], np.uint8).astype(np.int32) + 1
    return out


def test_reads_both_documents(tmp_path):
    data = lra.tasks.get("retrieval").load(write_aan(tmp_path), "val", 32)
    assert lra.tasks.get("retrieval").dual_input
    np.testing.assert_array_equal(data["targets"], [1, 0, 1])
    for row, (_, _, _, text1, text2) in enumerate(ROWS):
        np.testing.assert_array_equal(data["inputs"][row], ids(text1, 32))
        np.testing.assert_array_equal(data["inputs2"][row], ids(text2, 32))
        np.testing.assert_array_equal(data["mask"][row], np.arange(32) < min(len(text1), 32))
        np.testing.assert_array_equal(data["mask2"][row], np.arange(32) < len(text2))


def test_split_files(tmp_path):
    write_aan(tmp_path, splits=("train",))
    write_aan(tmp_path, rows=ROWS[:1], splits=("eval",))
    assert len(lra.tasks.get("retrieval").load(str(tmp_path), "train", 8)["targets"]) == 3
    assert len(lra.tasks.get("retrieval").load(str(tmp_path), "val", 8)["targets"]) == 1
    with pytest.raises(DataError, match=r"new_aan_pairs\.test\.tsv does not exist.*lra_release"):
        lra.tasks.get("retrieval").load(str(tmp_path), "test", 8)


def test_bad_rows_name_the_file_and_line(tmp_path):
    write_aan(tmp_path, rows=ROWS[:2] + [(b"1", b"a", b"b", b"only four columns")])
    with pytest.raises(DataError, match=r"new_aan_pairs\.train\.tsv:3: expected 5"):
        lra.tasks.get("retrieval").load(str(tmp_path), "train", 8)
    write_aan(tmp_path, rows=[(b"2", b"a", b"b", b"t1", b"t2")])
    with pytest.raises(DataError, match=r"train\.tsv:1: label '2' is not 0 or 1"):
        lra.tasks.get("retrieval").load(str(tmp_path), "train", 8)


def test_missing_folder_says_what_to_download(tmp_path):
    with pytest.raises(DataError, match="lra_release.*tsv_data"):
        lra.tasks.get("retrieval").load(str(tmp_path / "nope"), "train", 8)

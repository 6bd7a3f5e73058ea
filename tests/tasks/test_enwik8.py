"""enwik8 / text8 (lra/tasks/enwik8.py): the papers' split rule, tokens, rows in which every
byte but the first is predicted once, the sources (zip member, bz2 excerpt), one-line
errors, and configs/enwik8.py:runlocal trained on real Wikipedia bytes (a slice of
gensim's dump excerpt, made by scripts/wiki_excerpt.py; no download)."""
from __future__ import annotations

import bz2
import glob
import json
import math
import os
import zipfile

import numpy as np
import pytest

from lra.errors import DataError
from lra.tasks import enwik8

SLICE_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "enwik8_slice")


def _slice_bytes():
    (path,) = glob.glob(os.path.join(SLICE_DIR, "*.bz2"))
    return bz2.open(path).read()


def test_split_is_the_papers_rule(monkeypatch):
    """prep_enwik8.py / prep_text8.py: test = the last n, validation the n before, train the
    rest; n = 5,000,000 of the published 10^8 bytes (scaled here: 50 of 1,000), else 5%."""
    monkeypatch.setattr(enwik8, "PUBLISHED_SIZE", 1000)
    monkeypatch.setattr(enwik8, "TEST_SIZE", 50)
    data = bytes(range(256)) * 3 + bytes(232)
    parts = enwik8.split_bytes(data)
    assert parts == {"train": data[:900], "val": data[900:950], "test": data[950:]}
    excerpt = _slice_bytes()  # 24,000 bytes: 5% is 1,200
    parts = enwik8.split_bytes(excerpt)
    assert [len(parts[s]) for s in ("train", "val", "test")] == [21_600, 1_200, 1_200]
    assert parts["train"] + parts["val"] + parts["test"] == excerpt


def test_rows_predict_every_byte_but_the_first_once():
    ids = enwik8.encode(_slice_bytes()[:1000], "enwik8")
    for length in (2, 7, 128, 999, 1000, 4096):
        inputs, mask = enwik8.rows(ids, length)
        assert inputs.shape[1] == length and mask.dtype == bool
        # Row i starts on row i-1's last token: its targets (positions 1..) are new.
        first = inputs[0][mask[0]]
        rest = [row[m][1:] for row, m in zip(inputs[1:], mask[1:])]
        np.testing.assert_array_equal(np.concatenate([first, *rest]), ids)
        assert int(mask.sum()) - len(inputs) == len(ids) - 1  # targets: every id but one
        assert (inputs[~mask] == 0).all()
    with pytest.raises(DataError, match="2 tokens"):
        enwik8.rows(ids, 1)


def test_tokens():
    assert enwik8.encode(b"\x00a\xff", "enwik8").tolist() == [1, 98, 256]
    assert enwik8.encode(b"az b", "text8").tolist() == [1, 26, 27, 2]
    with pytest.raises(DataError, match="byte 65 at offset 1"):
        enwik8.encode(b"aAb", "text8")


def test_sources_zip_member_and_errors(tmp_path, monkeypatch):
    import lra.tasks

    text8 = (b"anarchism originated as a term of abuse " * 50)[:2000]
    os.makedirs(tmp_path / "published")
    with zipfile.ZipFile(tmp_path / "published" / "text8.zip", "w") as z:
        z.writestr("text8", text8)
    # Under the published name a file must be the published size: not split as an excerpt.
    with pytest.raises(DataError, match="holds 2,000 bytes, not the published text8's"):
        lra.tasks.get("text8").load(str(tmp_path / "published"), "test", 16)
    monkeypatch.setattr(enwik8, "PUBLISHED_SIZE", 2000)
    monkeypatch.setattr(enwik8, "TEST_SIZE", 100)
    data = lra.tasks.get("text8").load(str(tmp_path / "published"), "test", 16)
    ids = enwik8.encode(text8[-100:], "text8")  # the last TEST_SIZE
    got = np.concatenate([data["inputs"][0][data["mask"][0]]]
                         + [r[m][1:] for r, m in zip(data["inputs"][1:], data["mask"][1:])])
    np.testing.assert_array_equal(got, ids)
    os.makedirs(tmp_path / "bad")
    with zipfile.ZipFile(tmp_path / "bad" / "enwik8.zip", "w") as z:
        z.writestr("something", b"x")
    with pytest.raises(DataError, match="has no member 'enwik8'"):
        lra.tasks.get("enwik8").load(str(tmp_path / "bad"), "train", 16)
    with pytest.raises(DataError, match="no enwik8 data in .*gensim"):
        lra.tasks.get("enwik8").load(str(tmp_path / "none"), "train", 16)


def test_runlocal_on_real_wikipedia_bytes_reports_bits_per_byte(tmp_path):
    """configs/enwik8.py:runlocal through train_and_evaluate on the slice: next-token
    prediction, results.json's bits per token = test loss / ln 2 (bits per byte)."""
    from configs import enwik8 as config
    from lra import train

    c = config.get_config("runlocal")
    c.data_dir = SLICE_DIR
    c.num_train_steps, c.eval_frequency, c.checkpoint_freq = 6, 6, 6
    train.train_and_evaluate(c, str(tmp_path))
    saved = json.load(open(os.path.join(tmp_path, "results.json")))
    assert saved["task"] == "enwik8" and saved["objective"] == "causal_lm"
    assert math.isclose(saved["test_bits_per_token"], saved["test_loss"] / math.log(2),
                        rel_tol=1e-6)
    assert 0 < saved["test_bits_per_token"] < 12

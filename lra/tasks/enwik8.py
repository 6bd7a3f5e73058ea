r"""enwik8 and text8: character-level language modelling on Wikipedia (bits per byte /
character), the benchmark of Transformer-XL, Adaptive Span, the Sparse Transformer,
Reformer and Longformer's character LM; and the same reader on a Wikipedia dump excerpt
that ships inside a public package, so that everything runs on real text on any machine.

Sources, looked for in `--config.data_dir` in this order:
  enwik8   `enwik8.zip` (member `enwik8`) or `enwik8` (Hutter Prize: the first 10^8 bytes
           of an English Wikipedia XML dump, http://mattmahoney.net/dc/enwik8.zip); else
           one `*.bz2` (or `*.xml`) dump excerpt, e.g. gensim's test file
           `enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2`
           (6,089,746 bytes of raw English Wikipedia XML, sha256 of the .bz2
           a53f4648dec40467ebdcbc7a1307eddb51fe6e28e9309f6ebde81ba0d04bea2d; in PyPI's
           gensim 4.4.0 wheel under gensim/test/test_data/):
               pip download --no-deps gensim==4.4.0 -d /tmp/gensim
               unzip -j /tmp/gensim/gensim-4.4.0-*.whl \
                   'gensim/test/test_data/enwiki-latest-pages-articles1.xml-p*' -d data/enwik8
  text8    `text8.zip` (member `text8`) or `text8` (10^8 characters of Wikipedia text
           reduced to a-z and space, http://mattmahoney.net/dc/text8.zip).

Split, as the papers' preprocessing does it: the last 5,000,000 bytes are test, the
5,000,000 before them validation, the rest (90,000,000) training (salesforce/awd-lstm-lm
data/enwik8/prep_enwik8.py@1e24cc5, which Transformer-XL's getdata.sh downloads, and
kimiyoung/transformer-xl prep_text8.py@81b1b19: `num_test_chars = 5000000`, train =
data[:-2n], valid = data[-2n:-n], test = data[-n:]). A file of another size (an excerpt)
is split by the same rule with n = 5% of its bytes (the excerpt: 5,480,772 / 304,487 /
304,487 bytes); a file named as the published one (enwik8, enwik8.zip, text8, text8.zip)
must hold its 10^8 bytes (a DataError otherwise: a truncated download would be split as an
excerpt). `python -m lra.download enwik8 text8` fetches the two zips into data/enwik8 and
data/text8 (the configs' default data_dir), checking size and sha256 (lra/download.py
ARCHIVES: the values public download scripts agree on; the site publishes none).

Tokens: enwik8 is read as bytes, byte b -> id b + 1 (id 0 is padding; 257 ids: all 256
byte values, not only the 204 that occur in enwik8, which changes no bit per byte of a
trained model); text8's 27 characters a-z -> 1-26 and space -> 27 (28 ids); any other
character in text8 is a DataError. Bits per token are bits per byte (enwik8) or per
character (text8). prep_text8.py also strips each part's leading and trailing spaces in
its tokenized file (a character or two per split); every character is kept here.

Rows: a split is cut into rows of `max_length` tokens that overlap by one token (row i
starts at i * (max_length - 1)), so that with next-token prediction (objective causal_lm:
the output at t predicts t + 1) every token of the split but its first is predicted
exactly once, with the tokens of its row before it as context (0 to max_length - 2 of
them); the last row is shorter and padded. This is the fixed-window evaluation; the papers'
numbers use longer contexts (Transformer-XL's memory of 2,100 tokens at test, Al-Rfou et
al.'s sliding window predicting only the last token), so ours are comparable in kind only
with fixed windows of the same length (docs/tasks_and_data.md, "enwik8 and text8").
"""
from __future__ import annotations

import bz2
import glob
import os
import zipfile
from typing import Any

import numpy as np

from lra.errors import DataError
from lra.tasks import registry

PUBLISHED_SIZE = 10**8  # enwik8's bytes, text8's characters
TEST_SIZE = 5_000_000  # the papers' validation and test sizes
EXCERPT_FRACTION = 0.05  # another size: 5% validation, 5% test
MAX_LENGTH = 512  # Transformer-XL base's tgt_len on enwik8
TEXT8_ALPHABET = b"abcdefghijklmnopqrstuvwxyz "
VOCAB = {"enwik8": 256 + 1, "text8": len(TEXT8_ALPHABET) + 1}
HOW_TO_GET = {
    "enwik8": ("put enwik8.zip (http://mattmahoney.net/dc/enwik8.zip) into --config.data_dir, "
               "or a Wikipedia dump excerpt (*.bz2, *.xml), e.g. gensim's: `pip download "
               "--no-deps gensim==4.4.0 -d /tmp/g && unzip -j /tmp/g/gensim-4.4.0-*.whl "
               "'gensim/test/test_data/enwiki-latest-pages-articles1.xml-p*' -d data/enwik8`"),
    "text8": "put text8.zip (http://mattmahoney.net/dc/text8.zip) into --config.data_dir",
}


def find_source(data_dir: str, corpus: str) -> str:
    """The file the corpus is read from (see the module docstring's order)."""
    names = [f"{corpus}.zip", corpus]
    if corpus == "enwik8":
        names += sorted(os.path.basename(p) for pattern in ("*.bz2", "*.xml")
                        for p in glob.glob(os.path.join(glob.escape(data_dir), pattern)))
    for name in names:
        path = os.path.join(data_dir, name)
        if os.path.isfile(path):
            return path
    raise DataError(f"no {corpus} data in {data_dir}: {HOW_TO_GET[corpus]}")


def read_bytes(path: str, corpus: str) -> bytes:
    """The corpus's bytes from a .zip (its member named like the corpus), a .bz2 or a
    plain file."""
    try:
        if path.endswith(".zip"):
            with zipfile.ZipFile(path) as z:
                if corpus not in z.namelist():
                    raise DataError(f"{path} has no member {corpus!r} (it holds "
                                    f"{', '.join(z.namelist()[:3])}); {HOW_TO_GET[corpus]}")
                return z.read(corpus)
        if path.endswith(".bz2"):
            with bz2.open(path) as f:
                return f.read()
        with open(path, "rb") as f:
            return f.read()
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise DataError(f"cannot read {path}: {e}; {HOW_TO_GET[corpus]}") from None


def split_bytes(data: bytes) -> dict[str, bytes]:
    """train / val / test: the last n bytes test, the n before validation; n = 5,000,000
    for the published 10^8-byte files, else 5% of the bytes."""
    n = TEST_SIZE if len(data) == PUBLISHED_SIZE else int(len(data) * EXCERPT_FRACTION)
    if n < 2:
        raise DataError(f"{len(data)} bytes are too few to split into train, validation "
                        "and test")
    return {"train": data[:-2 * n], "val": data[-2 * n:-n], "test": data[-n:]}


def encode(data: bytes, corpus: str) -> np.ndarray:
    """Token ids (int32) of the bytes: enwik8 b + 1; text8 a-z -> 1-26, space -> 27."""
    raw = np.frombuffer(data, np.uint8)
    if corpus == "enwik8":
        return raw.astype(np.int32) + 1
    table = np.zeros(256, np.int32)
    table[np.frombuffer(TEXT8_ALPHABET, np.uint8)] = np.arange(1, len(TEXT8_ALPHABET) + 1)
    ids = table[raw]
    bad = np.flatnonzero(ids == 0)
    if bad.size:
        raise DataError(f"text8 holds only a-z and space; byte {raw[bad[0]]} at offset "
                        f"{bad[0]} is neither (is this text8?)")
    return ids


def rows(ids: np.ndarray, max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs_NxL, mask_NxL): rows of max_length tokens, each starting on the last token
    of the row before (every token but the first is a next-token target once)."""
    if max_length < 2:
        raise DataError(f"max_length {max_length}: a row needs 2 tokens or more")
    stride = max_length - 1
    count = max(1, -(-(len(ids) - 1) // stride))
    inputs = np.zeros((count, max_length), np.int32)
    mask = np.zeros((count, max_length), bool)
    for i in range(count):
        piece = ids[i * stride:i * stride + max_length]
        inputs[i, :len(piece)] = piece
        mask[i, :len(piece)] = True
    return inputs, mask


_CACHE: dict[tuple, dict[str, bytes]] = {}


def data_identity(corpus: str, data_dir: str, archive: Any) -> dict:
    """Which data a run of `corpus` read: {"file", "bytes" (the corpus's), "sha256" (the
    file's), "published"}: published only for the published zip, `archive` (its
    `filename` and pinned `sha256`: lra/download.py ARCHIVES[corpus]), holding 10^8
    bytes. An unzipped file, an excerpt or another zip is not shown to be the published
    data (its sha256 is recorded for comparison by hand). lra.lm_eval shows published
    numbers beside published data only."""
    import hashlib

    path = find_source(data_dir, corpus)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    size = len(read_bytes(path, corpus))
    published = (os.path.basename(path) == archive.filename and size == PUBLISHED_SIZE
                 and digest.hexdigest() == archive.sha256)
    return {"file": os.path.basename(path), "bytes": size, "sha256": digest.hexdigest(),
            "published": published}


def split_ids(corpus: str, data_dir: str, split: str) -> np.ndarray:
    """The split's token ids as one stream (int32), from one read of the file for the three
    splits (lra.lm_eval evaluates on the stream itself, not on rows)."""
    path = find_source(data_dir, corpus)
    key = (os.path.abspath(path), os.path.getmtime(path), os.path.getsize(path))
    if key not in _CACHE:  # the three splits come from one read of the file
        _CACHE.clear()
        data = read_bytes(path, corpus)
        if os.path.basename(path) in (corpus, f"{corpus}.zip") and len(data) != PUBLISHED_SIZE:
            # A truncated or other file under the published name would be split as an
            # excerpt (5%), silently: numbers not comparable with the papers'.
            raise DataError(f"{path} holds {len(data):,} bytes, not the published "
                            f"{corpus}'s {PUBLISHED_SIZE:,} (truncated?); "
                            f"{HOW_TO_GET[corpus]}")
        _CACHE[key] = split_bytes(data)
    return encode(_CACHE[key][split], corpus)


def _read(corpus: str, data_dir: str, split: str, max_length: int) -> dict[str, np.ndarray]:
    inputs, mask = rows(split_ids(corpus, data_dir, split), max_length)
    return {"inputs": inputs, "mask": mask, "targets": np.zeros(len(inputs), np.int32)}


def _reader(corpus: str):
    def read(data_dir: str, split: str, max_length: int) -> dict[str, np.ndarray]:
        return _read(corpus, data_dir, split, max_length)
    return read


for _corpus in ("enwik8", "text8"):
    registry.register(registry.Task(
        name=_corpus,
        num_classes=VOCAB[_corpus],
        vocab_size=VOCAB[_corpus],
        max_length=MAX_LENGTH,
        reader=_reader(_corpus),
        default_data_dir=f"data/{_corpus}",
        how_to_get_data=HOW_TO_GET[_corpus],
    ))

"""Text (LRA): IMDB sentiment from raw bytes, from the `aclImdb` archive or a TFDS folder.

Either download `aclImdb_v1.tar.gz` (https://ai.stanford.edu/~amaas/data/sentiment/),
unpack it and point `--config.data_dir` at the folder that holds `aclImdb/` (or at
`aclImdb/` itself): the reader takes `aclImdb/{train,test}/{pos,neg}/*.txt`; `unsup/` is
ignored. Or point it at a TFDS data_dir holding `imdb_reviews/plain_text/1.0.0/` (or at any
folder down to that one), as `tfds.load("imdb_reviews")` left it: read without TensorFlow
when its shards are ArrayRecord, with TensorFlow when they are TFRecord (lra/tasks/
tfds_folders.py). `aclImdb/` is read when a data_dir holds both.

Tokens are LRA's byte-level ids (tfds `ByteTextEncoder`): byte b -> b + 1, so id 0 is
padding and the vocabulary has 257 ids. A review is stripped of leading and trailing ASCII
whitespace first, as TFDS's imdb_reviews builder stores it (LRA read IMDB through TFDS), so
both sources give the same tokens. Reviews longer than `max_length` bytes keep their first
`max_length` bytes (LRA's config uses 1000; the paper 4000).

Splits, as LRA's text task: train = `aclImdb/train`; validation and test are both
`aclImdb/test` (LRA evaluated on the test set during training); TFDS's `train` and `test`
are the same reviews. Order: from the archive, sorted file-name order, negatives then
positives; from TFDS, the order of its shards (TFDS shuffles examples by a hash of the
archive path when preparing and does not store the path, so the archive's order cannot be
recovered; the set of examples and their tokens are the same).
"""
from __future__ import annotations

import os

import numpy as np

from lra.errors import DataError
from lra.tasks import registry, tfds_folders

NUM_CLASSES = 2
BYTE_OFFSET = 1  # id 0 is padding
VOCAB_SIZE = 256 + BYTE_OFFSET
MAX_LENGTH = 1000
LABELS = {"neg": 0, "pos": 1}
HOW_TO_GET_ARCHIVE = (
    "run `python -m lra.download text --data_dir=data` (aclImdb_v1.tar.gz, unpacked into "
    "data/text/aclImdb), or download aclImdb_v1.tar.gz from "
    "https://ai.stanford.edu/~amaas/data/sentiment/, unpack it into <dir> (giving "
    "<dir>/aclImdb/{train,test}/{pos,neg}/*.txt) and set --config.data_dir=<dir>"
)
HOW_TO_GET_DATA = (f"{HOW_TO_GET_ARCHIVE}; or set it to a TFDS data_dir holding "
                   "imdb_reviews/plain_text/1.0.0/")
# LRA's text task evaluated on the test set: there is no separate validation split.
SPLIT_FOLDERS = {"train": "train", "val": "test", "test": "test"}
TFDS = tfds_folders.IMDB_REVIEWS


def encode_bytes(texts: list[bytes], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Byte strings -> (ids_NxL int32 right-padded with 0, mask_NxL), truncated."""
    inputs = np.zeros((len(texts), max_length), dtype=np.int32)
    lengths = np.zeros(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        ids = np.frombuffer(text[:max_length], dtype=np.uint8)
        inputs[i, :len(ids)] = ids.astype(np.int32) + BYTE_OFFSET
        lengths[i] = len(ids)
    return inputs, np.arange(max_length) < lengths[:, None]


def find_imdb_root(data_dir: str) -> str | None:
    """The aclImdb folder: <data_dir>/aclImdb, or data_dir itself; None if neither."""
    if os.path.isdir(os.path.join(data_dir, "aclImdb")):
        return os.path.join(data_dir, "aclImdb")
    if any(os.path.isdir(os.path.join(data_dir, s)) for s in ("train", "test")):
        return data_dir
    return None


def _read_archive(root: str, split: str) -> tuple[list[bytes], list[int]]:
    texts: list[bytes] = []
    targets: list[int] = []
    for name, label in LABELS.items():
        folder = os.path.join(root, SPLIT_FOLDERS[split], name)
        if not os.path.isdir(folder):
            raise DataError(f"IMDB folder {folder} does not exist; {HOW_TO_GET_DATA}")
        files = sorted(f for f in os.listdir(folder) if f.endswith(".txt"))
        if not files:
            raise DataError(f"IMDB folder {folder} has no .txt reviews; {HOW_TO_GET_DATA}")
        for file in files:
            path = os.path.join(folder, file)
            with open(path, "rb") as f:
                text = f.read().strip()
            if not text:
                raise DataError(f"{path}: the review is empty")
            texts.append(text)
            targets.append(label)
    return texts, targets


def _read_tfds(version_dir: str, split: str) -> tuple[list[bytes], list[int]]:
    examples, _ = tfds_folders.read_split(version_dir, SPLIT_FOLDERS[split], TFDS,
                                          HOW_TO_GET_ARCHIVE)
    texts = [bytes(e["text"]) for e in examples]
    for i, text in enumerate(texts):
        if not text:
            raise DataError(f"TFDS folder {version_dir}: review {i} of split "
                            f"{SPLIT_FOLDERS[split]!r} is empty")
    return texts, [int(e["label"]) for e in examples]


def read_split(data_dir: str, split: str, max_length: int) -> dict[str, np.ndarray]:
    """Reads one split of aclImdb, or of a TFDS imdb_reviews folder, into inputs/mask/targets."""
    if split not in registry.SPLITS:
        raise ValueError(f"split must be one of {registry.SPLITS}, got {split!r}")
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    root = find_imdb_root(data_dir)
    if root is not None:
        texts, targets = _read_archive(root, split)
    else:
        version_dir = tfds_folders.find(data_dir, TFDS, HOW_TO_GET_ARCHIVE)
        if version_dir is None:
            raise DataError(f"IMDB folder aclImdb/ (or TFDS imdb_reviews/) not found in "
                            f"{data_dir}; {HOW_TO_GET_DATA}")
        texts, targets = _read_tfds(version_dir, split)
    inputs, mask = encode_bytes(texts, max_length)
    return {"inputs": inputs, "mask": mask, "targets": np.array(targets, dtype=np.int32)}


registry.register(registry.Task(
    name="text",
    num_classes=NUM_CLASSES,
    vocab_size=VOCAB_SIZE,
    max_length=MAX_LENGTH,
    reader=read_split,
    default_data_dir="data/text",
    how_to_get_data=HOW_TO_GET_DATA,
))

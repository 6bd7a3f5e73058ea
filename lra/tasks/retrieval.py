"""Retrieval (LRA): do two AAN papers cite each other? Byte-level, one tower per document.

Read from LRA's release (`lra_release.gz` from the LRA GitHub page, folder
`lra_release/tsv_data/`): `new_aan_pairs.{train,eval,test}.tsv`, tab-separated, no header,
columns `label id1 id2 text1 text2` (label `0`/`1`, possibly written `0.0`/`1.0`; LRA read
the files with `CsvDataset(..., use_quote_delim=False)`, so quotes are ordinary bytes).
Splits: train -> `train`, val -> `eval`, test -> `test`.

Both documents become byte ids (b -> b + 1, 0 = padding), each truncated to `max_length`
(LRA: 4000): `inputs`/`mask` hold text1 and `inputs2`/`mask2` text2. The model is a dual
encoder with shared towers (`models.encoder.DualClassifier`).
"""
from __future__ import annotations

import os

import numpy as np

from lra.errors import DataError
from lra.tasks import registry
from lra.tasks.text import VOCAB_SIZE, encode_bytes

NUM_CLASSES = 2
MAX_LENGTH = 4000
FILE_PATTERN = "new_aan_pairs.{}.tsv"
SPLIT_NAMES = {"train": "train", "val": "eval", "test": "test"}
HOW_TO_GET_DATA = (
    "run `python -m lra.download retrieval --data_dir=data` (LRA's lra_release.gz, about "
    "8 GB; it unpacks data/retrieval/new_aan_pairs.{train,eval,test}.tsv), or point "
    "--config.data_dir at an unpacked release's lra_release/tsv_data"
)


def _label(text: str, where: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise DataError(f"{where}: label {text!r} is not a number") from None
    if value not in (0.0, 1.0):
        raise DataError(f"{where}: label {text!r} is not 0 or 1")
    return int(value)


def read_split(data_dir: str, split: str, max_length: int) -> dict[str, np.ndarray]:
    """Reads new_aan_pairs.<split>.tsv into inputs/mask/inputs2/mask2/targets."""
    if split not in registry.SPLITS:
        raise ValueError(f"split must be one of {registry.SPLITS}, got {split!r}")
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    if not os.path.isdir(data_dir):
        raise DataError(f"Retrieval data directory {data_dir} does not exist; {HOW_TO_GET_DATA}")
    path = os.path.join(data_dir, FILE_PATTERN.format(SPLIT_NAMES[split]))
    if not os.path.isfile(path):
        raise DataError(f"Retrieval file {path} does not exist; {HOW_TO_GET_DATA}")
    texts1: list[bytes] = []
    texts2: list[bytes] = []
    targets: list[int] = []
    # Bytes, not str: the documents are kept byte for byte, whatever their encoding.
    with open(path, "rb") as f:
        for line_number, line in enumerate(f, start=1):
            line = line.rstrip(b"\r\n")
            if not line:
                continue
            where = f"{path}:{line_number}"
            fields = line.split(b"\t")
            if len(fields) != 5:
                raise DataError(f"{where}: expected 5 tab-separated columns (label, id1, id2, "
                                f"text1, text2), got {len(fields)}")
            targets.append(_label(fields[0].decode("ascii", "replace"), where))
            texts1.append(fields[3])
            texts2.append(fields[4])
    if not targets:
        raise DataError(f"Retrieval file {path} has no rows; {HOW_TO_GET_DATA}")
    inputs, mask = encode_bytes(texts1, max_length)
    inputs2, mask2 = encode_bytes(texts2, max_length)
    return {"inputs": inputs, "mask": mask, "inputs2": inputs2, "mask2": mask2,
            "targets": np.array(targets, dtype=np.int32)}


registry.register(registry.Task(
    name="retrieval",
    num_classes=NUM_CLASSES,
    vocab_size=VOCAB_SIZE,
    max_length=MAX_LENGTH,
    reader=read_split,
    dual_input=True,
    default_data_dir="data/retrieval",
    how_to_get_data=HOW_TO_GET_DATA,
))

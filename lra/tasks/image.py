"""Image (LRA): CIFAR-10 as a sequence of 1024 grayscale pixels, read from the python batches.

Download `cifar-10-python.tar.gz` (https://www.cs.toronto.edu/~kriz/cifar.html), unpack it
and point `--config.data_dir` at the folder holding `cifar-10-batches-py/` (or at that
folder itself): pickled dicts `data_batch_1..5` and `test_batch` with b'data' (uint8
[N, 3072], the R, G and B planes of a 32x32 image, row-major) and b'labels'.

Pixels become grayscale as LRA's `tf.image.rgb_to_grayscale` does: to float32 in [0, 1],
0.2989 R + 0.5870 G + 0.1140 B, back to uint8 by `x * 255.5` truncated (TF's
`convert_image_dtype`). Tokens are the gray values 0..255 in row-major order; the padding
mask is all True (a black pixel is token 0 and is NOT padding).

Splits: LRA used TFDS `train[:90%]` / `train[90%:]` / `test`. Here train = the first
45,000 training images (data_batch_1..5 in order), val = the last 5,000 (the tail of
data_batch_5), test = `test_batch`. Same sizes as LRA; not the same images, since TFDS
stores CIFAR in its own order. `--config.task_options.validation=test` uses the test set
for validation instead.
"""
from __future__ import annotations

import os
import pickle

import numpy as np

from lra.errors import ConfigError, DataError
from lra.tasks import registry

NUM_CLASSES = 10
VOCAB_SIZE = 256
MAX_LENGTH = 1024
NUM_VALIDATION = 5000
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
GRAY_WEIGHTS = np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)
HOW_TO_GET_DATA = (
    "download cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html, unpack "
    "it into <dir> (giving <dir>/cifar-10-batches-py/data_batch_1..5, test_batch), then set "
    "--config.data_dir=<dir>"
)


def rgb_to_gray(data_Nx3072: np.ndarray) -> np.ndarray:
    """CIFAR rows (R, G, B planes) -> uint8 gray [N, 1024], as tf.image.rgb_to_grayscale."""
    rgb_Nx3xP = data_Nx3072.reshape(-1, 3, 1024).astype(np.float32) * np.float32(1 / 255)
    gray_NxP = np.einsum("ncp,c->np", rgb_Nx3xP, GRAY_WEIGHTS)
    return np.clip(gray_NxP * np.float32(255.5), 0, 255).astype(np.uint8)


def _find_root(data_dir: str) -> str:
    for root in (os.path.join(data_dir, "cifar-10-batches-py"), data_dir):
        if os.path.isfile(os.path.join(root, TEST_FILE)):
            return root
    raise DataError(f"CIFAR-10 folder cifar-10-batches-py/ not found in {data_dir}; "
                    f"{HOW_TO_GET_DATA}")


def _load_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    if not os.path.isfile(path):
        raise DataError(f"CIFAR-10 file {path} does not exist; {HOW_TO_GET_DATA}")
    try:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
        data = np.asarray(batch[b"data"])
        labels = np.asarray(batch[b"labels"])
    except Exception as e:  # noqa: BLE001  (truncated pickle, wrong object, missing key)
        raise DataError(f"{path}: not a CIFAR-10 python batch ({type(e).__name__}: {e})") from None
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DataError(f"{path}: b'data' must be uint8 [N, 3072], got {data.dtype} "
                        f"{list(data.shape)}")
    if labels.shape != (len(data),):
        raise DataError(f"{path}: {len(labels)} labels for {len(data)} images")
    if len(labels) and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise DataError(f"{path}: labels outside [0, {NUM_CLASSES})")
    return data, labels.astype(np.int32)


def read_split(data_dir: str, split: str, max_length: int, *,
               validation: str = "holdout") -> dict[str, np.ndarray]:
    """Reads one split of CIFAR-10 into inputs (gray 0..255), mask (all True), targets."""
    if split not in registry.SPLITS:
        raise ValueError(f"split must be one of {registry.SPLITS}, got {split!r}")
    if validation not in ("holdout", "test"):
        raise ConfigError(f"config.task_options.validation={validation!r}; choose 'holdout' "
                          "(the last 5000 training images) or 'test'")
    if max_length < MAX_LENGTH:
        raise ConfigError(f"config.max_length={max_length} is shorter than a CIFAR-10 image "
                          f"({MAX_LENGTH} pixels)")
    root = _find_root(data_dir)
    if split == "test" or (split == "val" and validation == "test"):
        data, labels = _load_batch(os.path.join(root, TEST_FILE))
    else:
        parts = [_load_batch(os.path.join(root, name)) for name in TRAIN_FILES]
        data = np.concatenate([p[0] for p in parts])
        labels = np.concatenate([p[1] for p in parts])
        if validation == "holdout":
            if len(data) <= NUM_VALIDATION:
                raise DataError(f"{root}: {len(data)} training images, not more than the "
                                f"{NUM_VALIDATION} held out for validation")
            keep = slice(None, -NUM_VALIDATION) if split == "train" else slice(-NUM_VALIDATION,
                                                                               None)
            data, labels = data[keep], labels[keep]
    inputs = np.zeros((len(data), max_length), dtype=np.int32)
    inputs[:, :MAX_LENGTH] = rgb_to_gray(data)
    mask = np.zeros((len(data), max_length), dtype=bool)
    mask[:, :MAX_LENGTH] = True
    return {"inputs": inputs, "mask": mask, "targets": labels}


def _read(data_dir: str, split: str, max_length: int, *,
          validation: str = "holdout") -> dict[str, np.ndarray]:
    return read_split(data_dir, split, max_length, validation=validation)


registry.register(registry.Task(
    name="image",
    num_classes=NUM_CLASSES,
    vocab_size=VOCAB_SIZE,
    max_length=MAX_LENGTH,
    reader=_read,
    default_data_dir="data/image",
    how_to_get_data=HOW_TO_GET_DATA,
))

"""Image (LRA): CIFAR-10 as a sequence of 1024 grayscale pixels (or, for pixel generation,
3072 colour sub-pixels), from the python batches or a TFDS folder.

Either download `cifar-10-python.tar.gz` (https://www.cs.toronto.edu/~kriz/cifar.html),
unpack it and point `--config.data_dir` at the folder holding `cifar-10-batches-py/` (or at
that folder itself): pickled dicts `data_batch_1..5` and `test_batch` with b'data' (uint8
[N, 3072], the R, G and B planes of a 32x32 image, row-major) and b'labels'. Or point it at
a TFDS data_dir holding `cifar10/3.0.2/` (or at `cifar10/` or the version folder), as
`tfds.load("cifar10")` left it: read without TensorFlow when its shards are ArrayRecord,
with TensorFlow when they are TFRecord (lra/tasks/tfds_folders.py).
`cifar-10-batches-py/` is read when a data_dir holds both.

Pixels become grayscale as LRA's `tf.image.rgb_to_grayscale` does: to float32 in [0, 1],
0.2989 R + 0.5870 G + 0.1140 B, back to uint8 by `x * 255.5` truncated (TF's
`convert_image_dtype`). Tokens are the gray values 0..255 in row-major order; the padding
mask is all True (a black pixel is token 0 and is NOT padding).

`--config.task_options.pixels=rgb` (the `generation` config argument sets it: pixel
generation, as Katharopoulos et al. 2020) keeps the colour instead: 3072 tokens per image,
the sub-pixels in raster order with R, G, B per pixel (pixel (0, 0)'s R, G, B, then pixel
(0, 1)'s, ...; the archive's rows hold the R plane, then G, then B, so they are
transposed), values 0..255, mask all True; max_length at least 3072. `gray` (the default)
is LRA's. `--config.task_options.test_images=N` keeps the first N test images (0, the
default: all 10,000), for the test split and for validation=test: the generation `mini`
uses 1,000, since a CPU evaluates 3072-token images slowly.

Splits: LRA used TFDS `train[:90%]` / `train[90%:]` / `test`. Here train = the first
45,000 training images (data_batch_1..5 in order), val = the last 5,000 (the tail of
data_batch_5), test = `test_batch`. Same sizes as LRA; not the same images, since TFDS
stores CIFAR in its own (shuffled) order. A TFDS folder is put back into the archive's
order by its `id` feature: TFDS's cifar10 builder numbers the images `train_00000`... in
the order of data_batch_1..5 (and `test_...` of test_batch) of the binary release, which
holds the python release's images in the same order; so both sources give the same
arrays. `--config.task_options.validation=test` uses the test set for validation instead.
"""
from __future__ import annotations

import os
import pickle

import numpy as np

from lra.errors import ConfigError, DataError
from lra.tasks import registry, tfds_folders

NUM_CLASSES = 10
VOCAB_SIZE = 256
MAX_LENGTH = 1024
PIXELS = {"gray": MAX_LENGTH, "rgb": 3 * MAX_LENGTH}  # task_options.pixels -> tokens per image
NUM_VALIDATION = 5000
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
GRAY_WEIGHTS = np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)
HOW_TO_GET_ARCHIVE = (
    "run `python -m lra.download image --data_dir=data` (cifar-10-python.tar.gz, unpacked "
    "into data/image/cifar-10-batches-py), or download cifar-10-python.tar.gz from "
    "https://www.cs.toronto.edu/~kriz/cifar.html, unpack it into <dir> (giving "
    "<dir>/cifar-10-batches-py/data_batch_1..5, test_batch) and set --config.data_dir=<dir>"
)
HOW_TO_GET_DATA = f"{HOW_TO_GET_ARCHIVE}; or set it to a TFDS data_dir holding cifar10/3.0.2/"
TFDS = tfds_folders.CIFAR10


def rgb_to_gray(data_Nx3072: np.ndarray) -> np.ndarray:
    """CIFAR rows (R, G, B planes) -> uint8 gray [N, 1024], as tf.image.rgb_to_grayscale."""
    rgb_Nx3xP = data_Nx3072.reshape(-1, 3, 1024).astype(np.float32) * np.float32(1 / 255)
    gray_NxP = np.einsum("ncp,c->np", rgb_Nx3xP, GRAY_WEIGHTS)
    return np.clip(gray_NxP * np.float32(255.5), 0, 255).astype(np.uint8)


def rgb_sub_pixels(data_Nx3072: np.ndarray) -> np.ndarray:
    """CIFAR rows (R, G, B planes) -> uint8 [N, 3072]: per pixel in raster order its R, G, B."""
    return data_Nx3072.reshape(-1, 3, 1024).transpose(0, 2, 1).reshape(-1, 3072)


def _find_root(data_dir: str) -> str | None:
    for root in (os.path.join(data_dir, "cifar-10-batches-py"), data_dir):
        if os.path.isfile(os.path.join(root, TEST_FILE)):
            return root
    return None


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


def _read_archive(root: str, tfds_split: str) -> tuple[np.ndarray, np.ndarray]:
    if tfds_split == "test":
        return _load_batch(os.path.join(root, TEST_FILE))
    parts = [_load_batch(os.path.join(root, name)) for name in TRAIN_FILES]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _archive_positions(ids: list[bytes], tfds_split: str, version_dir: str) -> np.ndarray:
    """Each example's position in the archive, from TFDS ids `<split>_<5 digits>`."""
    prefix = f"{tfds_split}_".encode()
    try:
        if not all(i.startswith(prefix) for i in ids):
            raise ValueError
        positions = np.array([int(i[len(prefix):]) for i in ids], dtype=np.int64)
    except ValueError:
        positions = None
    if positions is None or not np.array_equal(np.sort(positions), np.arange(len(ids))):
        raise DataError(f"TFDS folder {version_dir}: the ids of split {tfds_split!r} are not "
                        f"{tfds_split}_00000..{tfds_split}_{len(ids) - 1:05d}, so its images "
                        "cannot be put in the archive's order; not TFDS's cifar10 3.0.2")
    return positions


def _read_tfds(version_dir: str, tfds_split: str,
               keep: slice) -> tuple[np.ndarray, np.ndarray, int]:
    """The `keep` slice, in archive order, of a TFDS split: (data_Nx3072, labels, split size).
    Images are decoded only for the kept examples."""
    examples, features = tfds_folders.read_split(version_dir, tfds_split, TFDS,
                                                 HOW_TO_GET_ARCHIVE, undecoded=("image",))
    positions = _archive_positions([bytes(e["id"]) for e in examples], tfds_split, version_dir)
    order = np.argsort(positions)[keep]
    if len(order) == 0:
        return np.zeros((0, 3072), np.uint8), np.zeros(0, np.int32), len(examples)
    decode = features["image"].decode_example_np
    images_NxHxWxC = np.stack([decode(examples[i]["image"]) for i in order])
    if images_NxHxWxC.shape[1:] != (32, 32, 3) or images_NxHxWxC.dtype != np.uint8:
        raise DataError(f"TFDS folder {version_dir}: images are {images_NxHxWxC.dtype} "
                        f"{list(images_NxHxWxC.shape[1:])}, not uint8 [32, 32, 3]")
    # The archive's row layout: the R, G and B planes one after another.
    data_Nx3072 = images_NxHxWxC.transpose(0, 3, 1, 2).reshape(len(order), 3072)
    labels = np.array([examples[i]["label"] for i in order], dtype=np.int32)
    return data_Nx3072, labels, len(examples)


def read_split(data_dir: str, split: str, max_length: int, *, validation: str = "holdout",
               pixels: str = "gray", test_images: int = 0) -> dict[str, np.ndarray]:
    """Reads one split of CIFAR-10 into inputs (gray 0..255, or R, G, B sub-pixels 0..255
    with pixels='rgb'), mask (all True), targets."""
    if split not in registry.SPLITS:
        raise ValueError(f"split must be one of {registry.SPLITS}, got {split!r}")
    if validation not in ("holdout", "test"):
        raise ConfigError(f"config.task_options.validation={validation!r}; choose 'holdout' "
                          "(the last 5000 training images) or 'test'")
    if pixels not in PIXELS:
        raise ConfigError(f"config.task_options.pixels={pixels!r}; choose 'gray' (LRA's 1024 "
                          "grayscale pixels) or 'rgb' (3072 sub-pixels, R, G, B per pixel)")
    if isinstance(test_images, bool) or not isinstance(test_images, int) or test_images < 0:
        raise ConfigError(f"config.task_options.test_images={test_images!r}; give how many of "
                          "the first test images to use, or 0 for all of them")
    length = PIXELS[pixels]
    if max_length < length:
        what = "pixels" if pixels == "gray" else "sub-pixels with task_options.pixels=rgb"
        raise ConfigError(f"config.max_length={max_length} is shorter than a CIFAR-10 image "
                          f"({length} {what})")
    use_test = split == "test" or (split == "val" and validation == "test")
    tfds_split = "test" if use_test else "train"
    keep = slice(None, test_images or None) if use_test else slice(None)
    if not use_test and validation == "holdout":
        keep = slice(None, -NUM_VALIDATION) if split == "train" else slice(-NUM_VALIDATION, None)
    root = _find_root(data_dir)
    if root is not None:
        data, labels = _read_archive(root, tfds_split)
        where, total = root, len(data)
        data, labels = data[keep], labels[keep]
    else:
        version_dir = tfds_folders.find(data_dir, TFDS, HOW_TO_GET_ARCHIVE)
        if version_dir is None:
            raise DataError(f"CIFAR-10 folder cifar-10-batches-py/ (or TFDS cifar10/) not found "
                            f"in {data_dir}; {HOW_TO_GET_DATA}")
        data, labels, total = _read_tfds(version_dir, tfds_split, keep)
        where = version_dir
    if not use_test and validation == "holdout" and total <= NUM_VALIDATION:
        raise DataError(f"{where}: {total} training images, not more than the "
                        f"{NUM_VALIDATION} held out for validation")
    inputs = np.zeros((len(data), max_length), dtype=np.int32)
    inputs[:, :length] = rgb_to_gray(data) if pixels == "gray" else rgb_sub_pixels(data)
    mask = np.zeros((len(data), max_length), dtype=bool)
    mask[:, :length] = True
    return {"inputs": inputs, "mask": mask, "targets": labels}


def _read(data_dir: str, split: str, max_length: int, *, validation: str = "holdout",
          pixels: str = "gray", test_images: int = 0) -> dict[str, np.ndarray]:
    return read_split(data_dir, split, max_length, validation=validation, pixels=pixels,
                      test_images=test_images)


registry.register(registry.Task(
    name="image",
    num_classes=NUM_CLASSES,
    vocab_size=VOCAB_SIZE,
    max_length=MAX_LENGTH,
    reader=_read,
    default_data_dir="data/image",
    how_to_get_data=HOW_TO_GET_DATA,
))

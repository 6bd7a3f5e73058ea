"""MNIST: 28x28 handwritten digits as 784 pixel tokens, from the original IDX files or a
TFDS folder. Not an LRA task: sequential MNIST (`configs/mnist.py`, 10 classes) and pixel
generation in bits/dim (`configs/mnist.py:generation`, Katharopoulos et al. 2020).

Either the original files, gzipped (as distributed) or not: `train-images-idx3-ubyte`,
`train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte` (`.gz`),
in `--config.data_dir` itself, in its `mnist/` or in its `MNIST/raw/` (torchvision's
layout); `python -m lra.download mnist --data_dir=data` puts the four .gz files into
data/mnist. Or a TFDS data_dir holding `mnist/3.0.1/` (or `mnist/` or the version folder),
as `tfds.load("mnist")` left it (lra/tasks/tfds_folders.py). The IDX files are read when a
data_dir holds both.

IDX: a big-endian header (magic 0x00000803 and N, 28, 28 for the images; 0x00000801 and N
for the labels), then uint8 values. Tokens are the pixel values 0..255 row by row
(784 tokens, vocabulary 256); the padding mask is separate and all True (a black pixel is
token 0 and is NOT padding). Targets are the digits 0..9.

Splits: train = the first 55,000 training images, val = the last 5,000
(`--config.task_options.num_validation=N` holds out the last N instead, e.g. for a subset
of MNIST), test = the 10,000 t10k images: 55k / 5k / 10k. A TFDS folder keeps TFDS's stored
order, a fixed shuffle that its records (no `id` feature, unlike cifar10's) cannot undo:
its test split is the same 10,000 images in another order (whole-split metrics are equal),
its validation images are the last 5,000 of that order, not the files' last 5,000.
"""
from __future__ import annotations

import dataclasses
import gzip
import os
import zlib

import numpy as np

from lra.errors import ConfigError, DataError
from lra.tasks import registry, tfds_folders

NUM_CLASSES = 10
VOCAB_SIZE = 256
SIDE = 28
MAX_LENGTH = SIDE * SIDE
NUM_VALIDATION = 5000
URL = "https://storage.googleapis.com/cvdf-datasets/mnist/"
# split of the files -> (images, labels), without ".gz"
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
IMAGES_MAGIC, LABELS_MAGIC = 0x00000803, 0x00000801
HOW_TO_GET_FILES = (
    "run `python -m lra.download mnist --data_dir=data` (the four .gz files into "
    "data/mnist), or download train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
    f"t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz from {URL} into <dir> "
    "(gzipped or not) and set --config.data_dir=<dir>"
)
HOW_TO_GET_DATA = f"{HOW_TO_GET_FILES}; or set it to a TFDS data_dir holding mnist/3.0.1/"
TFDS = tfds_folders.MNIST


@dataclasses.dataclass(frozen=True)
class Dataset:
    """An MNIST-format dataset: the same four IDX files (names and format) in another folder."""
    name: str  # in messages
    folders: tuple[str, ...]  # looked in after data_dir itself
    tfds: tfds_folders.Catalogue
    how_to_get_files: str

    @property
    def how_to_get_data(self) -> str:
        return (f"{self.how_to_get_files}; or set it to a TFDS data_dir holding "
                f"{self.tfds.name}/{self.tfds.version}/")


MNIST = Dataset("MNIST", ("mnist", os.path.join("MNIST", "raw")), TFDS, HOW_TO_GET_FILES)
# Zalando's Fashion-MNIST (Xiao et al. 2017): the same IDX format, sizes and file names,
# 10 classes of clothing. Debian's dataset-fashion-mnist package (0.0~git20200523.55506a9-1)
# holds the original files in /usr/share/datasets/fashion-mnist/ (FASHION_SHA256).
FASHION_MNIST = Dataset(
    "Fashion-MNIST", ("fashion_mnist", "fashion-mnist", os.path.join("FashionMNIST", "raw")),
    tfds_folders.FASHION_MNIST,
    "take Debian's package without installing it: `apt-get download dataset-fashion-mnist && "
    "dpkg-deb -x dataset-fashion-mnist_*.deb /tmp/fm` and set --config.data_dir="
    "/tmp/fm/usr/share/datasets/fashion-mnist (or put the four .gz files of "
    "https://github.com/zalandoresearch/fashion-mnist into <dir>)")
FASHION_SHA256 = {
    "train-images-idx3-ubyte.gz": "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
    "train-labels-idx1-ubyte.gz": "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
    "t10k-images-idx3-ubyte.gz": "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
    "t10k-labels-idx1-ubyte.gz": "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
}


def _file(root: str, name: str) -> str | None:
    """The file `name` in root, plain or gzipped (the plain one first), or None."""
    for path in (os.path.join(root, name), os.path.join(root, name + ".gz")):
        if os.path.isfile(path):
            return path
    return None


def find_root(data_dir: str, dataset: Dataset = MNIST) -> str | None:
    """The folder holding the IDX files (found by the t10k images), or None."""
    for root in (data_dir, *(os.path.join(data_dir, f) for f in dataset.folders)):
        if _file(root, FILES["test"][0]):
            return root
    return None


def read_idx(path: str, magic: int, dataset: Dataset = MNIST) -> np.ndarray:
    """The uint8 array of an IDX file (plain or .gz): [N, 28, 28] images or [N] labels."""
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as e:  # a truncated or damaged .gz
        raise DataError(f"{path}: cannot be read ({type(e).__name__}: {e}); download it "
                        f"again ({dataset.how_to_get_files})") from None
    dims = 3 if magic == IMAGES_MAGIC else 1
    header = 4 * (1 + dims)
    found = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
    if found != magic or len(raw) < header:
        what = "images (magic 0x00000803)" if dims == 3 else "labels (magic 0x00000801)"
        shown = "none" if found is None else f"0x{found:08x}"
        raise DataError(f"{path}: not an IDX file of {dataset.name} {what}: its magic number is "
                        f"{shown}")
    shape = tuple(int.from_bytes(raw[4 * (i + 1):4 * (i + 2)], "big") for i in range(dims))
    if dims == 3 and shape[1:] != (SIDE, SIDE):
        raise DataError(f"{path}: images of {shape[1]}x{shape[2]} pixels, not {dataset.name}'s "
                        f"{SIDE}x{SIDE}")
    size = int(np.prod(shape))
    if len(raw) - header != size:
        raise DataError(f"{path}: the header says {shape[0]} items ({size} bytes), the file "
                        f"holds {len(raw) - header} bytes after it: truncated or damaged; "
                        f"download it again")
    return np.frombuffer(raw, np.uint8, size, header).reshape(shape)


def write_idx(path: str, array: np.ndarray) -> None:
    """Writes uint8 [N, 28, 28] images or [N] labels as an IDX file (gzipped if `path`
    ends with .gz), as the original files are: for tests and subsets of MNIST."""
    array = np.asarray(array)
    if array.dtype != np.uint8 or array.ndim not in (1, 3):
        raise ValueError(f"IDX here is uint8 [N, 28, 28] or [N], got {array.dtype} "
                         f"{list(array.shape)}")
    magic = IMAGES_MAGIC if array.ndim == 3 else LABELS_MAGIC
    header = b"".join(int(v).to_bytes(4, "big") for v in (magic, *array.shape))
    data = header + np.ascontiguousarray(array).tobytes()
    if path.endswith(".gz"):
        with gzip.GzipFile(path, "wb", mtime=0) as f:  # mtime 0: the same bytes every time
            f.write(data)
    else:
        with open(path, "wb") as f:
            f.write(data)


def _read_files(root: str, tfds_split: str,
                dataset: Dataset = MNIST) -> tuple[np.ndarray, np.ndarray]:
    paths = []
    for name in FILES[tfds_split]:
        path = _file(root, name)
        if path is None:
            raise DataError(f"{dataset.name} file {os.path.join(root, name)}[.gz] does not "
                            f"exist; {dataset.how_to_get_data}")
        paths.append(path)
    images = read_idx(paths[0], IMAGES_MAGIC, dataset).reshape(-1, MAX_LENGTH)
    labels = read_idx(paths[1], LABELS_MAGIC, dataset)
    if len(labels) != len(images):
        raise DataError(f"{paths[1]}: {len(labels)} labels for the {len(images)} images of "
                        f"{paths[0]}")
    if len(labels) and labels.max() >= NUM_CLASSES:
        raise DataError(f"{paths[1]}: labels outside [0, {NUM_CLASSES})")
    return images, labels.astype(np.int32)


def _read_tfds(version_dir: str, tfds_split: str, keep: slice,
               dataset: Dataset = MNIST) -> tuple[np.ndarray, np.ndarray, int]:
    """The `keep` slice of a TFDS split in its stored order: (images_Nx784, labels, split
    size). Images are decoded only for the kept examples."""
    examples, features = tfds_folders.read_split(version_dir, tfds_split, dataset.tfds,
                                                 dataset.how_to_get_files,
                                                 undecoded=("image",))
    kept = examples[keep]
    if not kept:
        return np.zeros((0, MAX_LENGTH), np.uint8), np.zeros(0, np.int32), len(examples)
    decode = features["image"].decode_example_np
    images = np.stack([decode(e["image"]) for e in kept])
    if images.shape[1:] != (SIDE, SIDE, 1) or images.dtype != np.uint8:
        raise DataError(f"TFDS folder {version_dir}: images are {images.dtype} "
                        f"{list(images.shape[1:])}, not uint8 [{SIDE}, {SIDE}, 1]")
    labels = np.array([e["label"] for e in kept], dtype=np.int32)
    return images.reshape(len(kept), MAX_LENGTH), labels, len(examples)


def read_split(data_dir: str, split: str, max_length: int, *,
               num_validation: int = NUM_VALIDATION,
               dataset: Dataset = MNIST) -> dict[str, np.ndarray]:
    """Reads one split of MNIST (or another Dataset of its format, e.g. FASHION_MNIST)
    into inputs (pixels 0..255), mask (all True), targets."""
    if split not in registry.SPLITS:
        raise ValueError(f"split must be one of {registry.SPLITS}, got {split!r}")
    if isinstance(num_validation, bool) or not isinstance(num_validation, int) or (
            num_validation < 1):
        raise ConfigError(f"config.task_options.num_validation={num_validation!r}; give the "
                          "number of training images (the last ones) held out for "
                          f"validation, at least 1 (default {NUM_VALIDATION})")
    if max_length < MAX_LENGTH:
        raise ConfigError(f"config.max_length={max_length} is shorter than an {dataset.name} image "
                          f"({MAX_LENGTH} pixels)")
    tfds_split = "test" if split == "test" else "train"
    keep = slice(None)
    if split != "test":
        keep = slice(None, -num_validation) if split == "train" else slice(-num_validation, None)
    root = find_root(data_dir, dataset)
    if root is not None:
        images, labels = _read_files(root, tfds_split, dataset)
        where, total = root, len(images)
        images, labels = images[keep], labels[keep]
    else:
        version_dir = tfds_folders.find(data_dir, dataset.tfds, dataset.how_to_get_files)
        if version_dir is None:
            raise DataError(f"{dataset.name} files ({FILES['test'][0]}[.gz], ...) or a TFDS "
                            f"{dataset.tfds.name}/ folder not found in {data_dir}; "
                            f"{dataset.how_to_get_data}")
        images, labels, total = _read_tfds(version_dir, tfds_split, keep, dataset)
        where = version_dir
    if split != "test" and total <= num_validation:
        raise DataError(f"{where}: {total} training images, not more than the "
                        f"{num_validation} held out for validation (set "
                        "--config.task_options.num_validation to fewer)")
    inputs = np.zeros((len(images), max_length), dtype=np.int32)
    inputs[:, :MAX_LENGTH] = images
    mask = np.zeros((len(images), max_length), dtype=bool)
    mask[:, :MAX_LENGTH] = True
    return {"inputs": inputs, "mask": mask, "targets": labels}


def _read(data_dir: str, split: str, max_length: int, *,
          num_validation: int = NUM_VALIDATION) -> dict[str, np.ndarray]:
    return read_split(data_dir, split, max_length, num_validation=num_validation)


def _read_fashion(data_dir: str, split: str, max_length: int, *,
                  num_validation: int = NUM_VALIDATION) -> dict[str, np.ndarray]:
    return read_split(data_dir, split, max_length, num_validation=num_validation,
                      dataset=FASHION_MNIST)


registry.register(registry.Task(
    name="mnist",
    num_classes=NUM_CLASSES,
    vocab_size=VOCAB_SIZE,
    max_length=MAX_LENGTH,
    reader=_read,
    default_data_dir="data/mnist",
    how_to_get_data=HOW_TO_GET_DATA,
))

registry.register(registry.Task(
    name="fashion_mnist",
    num_classes=NUM_CLASSES,
    vocab_size=VOCAB_SIZE,
    max_length=MAX_LENGTH,
    reader=_read_fashion,
    default_data_dir="data/fashion_mnist",
    how_to_get_data=FASHION_MNIST.how_to_get_data,
))

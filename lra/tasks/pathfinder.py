r"""Pathfinder and Path-X (LRA): are the two circles joined by one contour? Reader + CLI.

Images come from LRA's release (`lra_release/pathfinder{32,64,128,256}/`), from the
original generator (github.com/drewlinsley/pathfinder, unmodified), or from ours, which
follows the original's algorithm with LRA's settings (`lra.tasks.pathfinder_generator`;
given the same NumPy random stream it draws the same pixels):

  python -m lra.tasks.pathfinder --output_dir=data/pathfinder --resolution=32 \
      --difficulty=hard --num_images=200000 --seed=0 --workers=2

The layout, as LRA's release has it:

  D/pathfinder32/curv_contour_length_14/imgs/<k>/sample_<i>.png    grayscale, res x res
  D/pathfinder32/curv_contour_length_14/metadata/<k>.npy           one row per image

A metadata row has 11 fields: `imgs/<k> sample_<i>.png <i> <label> <continuity>
<contour length> <distractor length> <paddle length> <thickness> <margin> <number of paddle
contrasts>`. LRA's release stores the rows as text despite the `.npy` name; the original
generator np.save's them as an array of strings. The reader takes both, unchanged. Our
generator writes text rows and, outside the release layout, `extra/<k>.json` (marker centres
and distractors placed; for statistics, not read by the task). Difficulty folders: easy =
curv_baseline (contour length 6), intermediate = curv_contour_length_9, hard =
curv_contour_length_14.

Reader: one difficulty folder (task option `difficulty`, default hard) of one resolution
(option `resolution`: 32 for `pathfinder`, 128 for `pathx`). Metadata files in numeric order,
rows in file order; the first 80% of the rows are train, the next 10% val, the last 10% test
(LRA split TFDS `train[:80%]`/`[80%:90%]`/`[90%:]` in TFDS's own order, so the sizes match,
not the images). Tokens are the gray values 0..255 in row-major order, the padding mask is
all True (a black pixel is token 0, not padding).

`python -m lra.tasks.pathfinder --stats=<difficulty folder>` prints image statistics (ink
fraction, gray levels, components, whether a flood fill joins the markers) of any folder
in this layout, to compare a generated set with the original's.
"""
from __future__ import annotations

import json
import math
import os
import sys

import numpy as np

from lra.errors import ConfigError, DataError
from lra.tasks import registry
from lra.tasks.pathfinder_generator import DIFFICULTIES, SETTINGS, generate  # noqa: F401

NUM_CLASSES = 2
VOCAB_SIZE = 256
NPY_MAGIC = b"\x93NUMPY"
INK = 64  # gray level above which a pixel counts as ink in the statistics
HOW_TO_GET_DATA = (
    "generate it with `python -m lra.tasks.pathfinder --output_dir=<dir> --resolution=<32|128> "
    "--difficulty=hard`, or unpack LRA's release with `python -m lra.download pathfinder` "
    "(or `pathx`), then set --config.data_dir=<dir> (the folder holding pathfinder<res>/)"
)
ROW_FORM = ("rows 'imgs/<k> sample_<i>.png <i> <label 0|1> ...' (11 fields), as text (LRA's "
            "release) or as an np.save'd array of strings (the original generator)")


# --- reader --------------------------------------------------------------------------


def _metadata_rows(path: str) -> list[list[str]]:
    """The rows of one metadata file, in either form; a DataError says what else it holds."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw.startswith(NPY_MAGIC):
        import io

        try:
            table = np.load(io.BytesIO(raw), allow_pickle=False)
        except Exception as e:  # noqa: BLE001  (truncated, or an object array)
            raise DataError(f"{path}: a .npy file NumPy cannot load without pickles "
                            f"({type(e).__name__}: {e}); expected {ROW_FORM}") from None
        if table.ndim != 2 or table.dtype.kind not in "US":
            raise DataError(f"{path}: holds a NumPy array of shape {table.shape} and dtype "
                            f"{table.dtype}; expected {ROW_FORM}")
        if table.dtype.kind == "S":  # written by Python 2
            table = table.astype(str)
        return [list(row) for row in table]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise DataError(f"{path}: holds binary data that is neither text nor a .npy array; "
                        f"expected {ROW_FORM}") from None
    return [line.split() for line in text.splitlines()]


def _read_metadata(root: str) -> list[tuple[str, int, str]]:
    """(image path, label, 'metadata file:line') for every row, in order."""
    meta_dir = os.path.join(root, "metadata")
    if not os.path.isdir(meta_dir):
        raise DataError(f"Pathfinder folder {meta_dir} does not exist; {HOW_TO_GET_DATA}")
    names = [n for n in os.listdir(meta_dir) if n.endswith(".npy")]
    if not names:
        raise DataError(f"Pathfinder folder {meta_dir} has no metadata/*.npy files; "
                        f"{HOW_TO_GET_DATA}")
    names.sort(key=lambda n: (int(n[:-4]) if n[:-4].isdigit() else math.inf, n))
    rows = []
    for name in names:
        path = os.path.join(meta_dir, name)
        for line_number, fields in enumerate(_metadata_rows(path), start=1):
            if not fields:
                continue
            where = f"{path}:{line_number}"
            if len(fields) < 4:
                raise DataError(f"{where}: a row of {len(fields)} field(s); expected "
                                f"{ROW_FORM}")
            if fields[3] not in ("0", "1"):
                raise DataError(f"{where}: label {fields[3]!r} is not 0 or 1; expected "
                                f"{ROW_FORM}")
            rows.append((os.path.join(root, fields[0], fields[1]), int(fields[3]), where))
    if not rows:
        raise DataError(f"Pathfinder metadata in {meta_dir} has no rows; {HOW_TO_GET_DATA}")
    return rows


def _load_png(path: str, where: str, resolution: int) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as img:
            pixels = np.asarray(img.convert("L") if img.mode != "L" else img, dtype=np.uint8)
    except FileNotFoundError:
        raise DataError(f"{path} (listed at {where}) does not exist") from None
    except Exception as e:  # noqa: BLE001  (truncated or not a PNG)
        raise DataError(f"{path} (listed at {where}): cannot read the image "
                        f"({type(e).__name__}: {e})") from None
    if pixels.shape != (resolution, resolution):
        raise DataError(f"{path} (listed at {where}): image is {pixels.shape[1]}x"
                        f"{pixels.shape[0]}, expected {resolution}x{resolution}")
    return pixels


def split_bounds(n: int) -> dict[str, slice]:
    """LRA's 80/10/10 split of one difficulty folder, by row order."""
    a, b = n * 8 // 10, n * 9 // 10
    return {"train": slice(0, a), "val": slice(a, b), "test": slice(b, n)}


def read_split(data_dir: str, split: str, max_length: int, *, resolution: int = 32,
               difficulty: str = "hard") -> dict[str, np.ndarray]:
    """Reads one split of pathfinder<resolution>/<difficulty folder> into arrays."""
    if split not in registry.SPLITS:
        raise ValueError(f"split must be one of {registry.SPLITS}, got {split!r}")
    if difficulty not in DIFFICULTIES:
        raise ConfigError(f"config.task_options.difficulty={difficulty!r}; choose one of "
                          f"{list(DIFFICULTIES)}")
    if resolution < 1:
        raise ConfigError(f"config.task_options.resolution={resolution} must be positive")
    length = resolution * resolution
    if max_length < length:
        raise ConfigError(f"config.max_length={max_length} is shorter than a {resolution}x"
                          f"{resolution} image ({length} pixels); set --config.max_length="
                          f"{length}")
    if not os.path.isdir(data_dir):
        raise DataError(f"Pathfinder data directory {data_dir} does not exist; "
                        f"{HOW_TO_GET_DATA}")
    root = os.path.join(data_dir, f"pathfinder{resolution}", DIFFICULTIES[difficulty][0])
    rows = _read_metadata(root)
    rows = rows[split_bounds(len(rows))[split]]
    if not rows:
        raise DataError(f"Pathfinder folder {root}: the {split} split is empty "
                        f"(too few images for an 80/10/10 split)")
    inputs = np.zeros((len(rows), max_length), dtype=np.int32)
    for row, (path, _, where) in zip(inputs, rows):
        row[:length] = _load_png(path, where, resolution).reshape(-1)
    mask = np.zeros((len(rows), max_length), dtype=bool)
    mask[:, :length] = True
    return {"inputs": inputs, "mask": mask,
            "targets": np.array([label for _, label, _ in rows], dtype=np.int32)}


def _read(data_dir: str, split: str, max_length: int, *, resolution: int = 32,
          difficulty: str = "hard") -> dict[str, np.ndarray]:
    return read_split(data_dir, split, max_length, resolution=resolution,
                      difficulty=difficulty)


def _read_pathx(data_dir: str, split: str, max_length: int, *, resolution: int = 128,
                difficulty: str = "hard") -> dict[str, np.ndarray]:
    return read_split(data_dir, split, max_length, resolution=resolution,
                      difficulty=difficulty)


# --- statistics ----------------------------------------------------------------------


def statistics(root: str, limit: int | None = None) -> dict:
    """Image statistics of one difficulty folder (any source), to compare generators.

    Markers for the flood-fill check come from extra/<k>.json where a folder has it (ours,
    or a run of the original that recorded them); otherwise that entry is left out.
    """
    from scipy import ndimage

    rows = _read_metadata(root)[:limit]
    markers = {}
    extra_dir = os.path.join(root, "extra")
    if os.path.isdir(extra_dir):
        for name in os.listdir(extra_dir):
            if name.endswith(".json") and name[:-5].isdigit():
                with open(os.path.join(extra_dir, name)) as f:
                    for i, e in enumerate(json.load(f)):
                        markers[(f"imgs/{name[:-5]}", i)] = e
    ink, mean_ink, components, distractors = [], [], [], []
    joined = {0: [], 1: []}
    for path, label, where in rows:
        image = np.asarray(_load_any(path, where), dtype=np.int64)
        ink.append(np.mean(image > 0))
        mean_ink.append(image[image > 0].mean() if (image > 0).any() else 0.0)
        labels, n = ndimage.label(image > INK, structure=np.ones((3, 3)))
        components.append(n)
        folder, file = os.path.relpath(path, root).rsplit(os.sep, 1)
        e = markers.get((folder.replace(os.sep, "/"), int(file[7:-4])))
        if e is not None:
            (r1, c1), (r2, c2) = e["markers"]
            a, b = labels[r1, c1], labels[r2, c2]
            joined[label].append(bool(a and a == b))
            distractors.append(e["distractors"])
    out = {"images": len(rows), "positives": float(np.mean([r[1] for r in rows])),
           "fraction of pixels > 0": float(np.mean(ink)),
           "mean of non-zero pixels": float(np.mean(mean_ink)),
           f"8-connected components above {INK}": float(np.mean(components))}
    if distractors:
        out["distractors placed (mean)"] = float(np.mean(distractors))
        out["distractors placed (min-max)"] = f"{min(distractors)}-{max(distractors)}"
        for label, name in ((1, "positives"), (0, "negatives")):
            if joined[label]:
                out[f"flood fill joins the markers, {name}"] = float(np.mean(joined[label]))
    return out


def _load_any(path: str, where: str) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as img:
            return np.asarray(img.convert("L"), dtype=np.uint8)
    except (OSError, ValueError) as e:
        raise DataError(f"{path} (listed at {where}): cannot read the image ({e})") from None


# Under `python -m lra.tasks.pathfinder` this file runs as __main__; the copy imported as
# lra.tasks.pathfinder registers the tasks.
if __name__ != "__main__":
    registry.register(registry.Task(
        name="pathfinder", num_classes=NUM_CLASSES, vocab_size=VOCAB_SIZE, max_length=32 * 32,
        reader=_read, default_data_dir="data/pathfinder", how_to_get_data=HOW_TO_GET_DATA))
    registry.register(registry.Task(
        name="pathx", num_classes=NUM_CLASSES, vocab_size=VOCAB_SIZE, max_length=128 * 128,
        reader=_read_pathx, default_data_dir="data/pathx",
        how_to_get_data=HOW_TO_GET_DATA))


# --- command line --------------------------------------------------------------------


def _main() -> None:
    from absl import app, flags

    flags.DEFINE_string("output_dir", None, "Folder that gets pathfinder<res>/<difficulty>/.")
    flags.DEFINE_integer("resolution", 32, "Image side in pixels: 32, 64, 128 or 256.")
    flags.DEFINE_enum("difficulty", "hard", list(DIFFICULTIES),
                      "Contour length 6 (easy), 9 (intermediate) or 14 (hard).")
    flags.DEFINE_integer("num_images", 200_000, "Images to generate (LRA: 200k per level).")
    flags.DEFINE_integer("seed", 0, "Random seed; the same flags give identical images.",
                         lower_bound=0)
    flags.DEFINE_integer("workers", 2, "Processes; the output does not depend on it.",
                         lower_bound=1)
    flags.DEFINE_string("stats", None, "Print statistics of this difficulty folder (any "
                        "source) instead of generating.")
    flags.DEFINE_integer("stats_limit", None, "With --stats: the first N images only.")
    FLAGS = flags.FLAGS

    def main(argv: list[str]) -> None:
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
        try:
            if FLAGS.stats:
                for key, value in statistics(FLAGS.stats, FLAGS.stats_limit).items():
                    print(f"{key:45s} {value:.3f}" if isinstance(value, float)
                          else f"{key:45s} {value}")
                return
            if not FLAGS.output_dir:
                raise ConfigError("give --output_dir=<folder> (or --stats=<folder>)")
            path = generate(FLAGS.output_dir, resolution=FLAGS.resolution,
                            difficulty=FLAGS.difficulty, num_images=FLAGS.num_images,
                            seed=FLAGS.seed, workers=FLAGS.workers)
        except (ConfigError, DataError) as e:
            sys.exit(f"error: {e}")
        except OSError as e:  # a read-only or full disk, a file where a folder should be
            where = e.filename or FLAGS.output_dir
            sys.exit(f"error: cannot write {where}: {e.strerror or e}; give an --output_dir "
                     "you can write to")
        print(f"pathfinder: wrote {path}")

    app.run(main)


if __name__ == "__main__":
    _main()

r"""Pathfinder and Path-X (LRA): are the two circles joined by one contour? Generator + reader.

The generator follows Linsley et al. (2018) with LRA's per-resolution settings:

  python -m lra.tasks.pathfinder --output_dir=data/pathfinder --resolution=32 \
      --difficulty=hard --num_images=200000 --seed=0 --workers=2

writes LRA's release layout, which the reader takes whether generated here or downloaded
(`lra_release/pathfinder{32,64,128,256}/`):

  D/pathfinder32/curv_contour_length_14/imgs/<k>/sample_<i>.png      grayscale, res x res
  D/pathfinder32/curv_contour_length_14/metadata/<k>.npy             text, despite the name

with 1000 images per <k>. Each metadata row is `imgs/<k> sample_<i>.png <i> <label>`
followed, in generated sets, by the two marker centres `x1 y1 x2 y2` (pixel units, x =
column; LRA's reader ignores them). Difficulty folders: easy = curv_baseline (contour
length 6), intermediate = curv_contour_length_9, hard = curv_contour_length_14.

Generation of one image (seeded by (seed, resolution, contour length, index), so the output
does not depend on --workers): label ~ Bernoulli(0.5); two target contours of
`contour_length` paddles of `paddle_length` px, each paddle turning from the previous one by
an angle drawn from 15 candidates in (-pi/(2c), pi/(2c)) with weights cos^2(c * angle)
(c = continuity: larger is smoother); a paddle is rejected if it comes closer than the
clearance to another contour, a marker, an older paddle of its own contour, or the border.
Two circular markers of `marker_radius` sit on both ends of one contour (positive) or on one
end of each (negative), at least `seed_distance` apart. Then `num_distractors` contours of
contour_length // 3 paddles. Strokes are drawn 8x supersampled with PIL and box-downsampled
(anti-aliased).

Deviation from Linsley et al.: paddles abut (a contour is one unbroken curve) and different
contours keep a clearance of `thickness + margin + CLEARANCE_PX`, so that a positive's
markers are joined by one connected run of ink and a negative's are not: the label is
decidable from the binarised image (see `markers_connected`).

Reader: one difficulty folder (task option `difficulty`, default hard) of one resolution
(option `resolution`: 32 for `pathfinder`, 128 for `pathx`). Metadata files in numeric order,
rows in file order; the first 80% of the rows are train, the next 10% val, the last 10% test
(LRA split TFDS `train[:80%]`/`[80%:90%]`/`[90%:]` in TFDS's own order, so the sizes match,
not the images). Tokens are the gray values 0..255 in row-major order, the padding mask is
all True (a black pixel is token 0, not padding).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import math
import multiprocessing
import os
import sys
import time

import numpy as np

from lra.errors import ConfigError, DataError
from lra.tasks import registry

NUM_CLASSES = 2
VOCAB_SIZE = 256
DIFFICULTIES = {  # difficulty -> (folder in LRA's release, contour length in paddles)
    "easy": ("curv_baseline", 6),
    "intermediate": ("curv_contour_length_9", 9),
    "hard": ("curv_contour_length_14", 14),
}
IMAGES_PER_FOLDER = 1000
SUPERSAMPLE = 8
GRID = 4  # cells per pixel of the clearance map
NUM_TURNS = 15
# Extra clearance between the centrelines of different contours beyond thickness + margin:
# one pixel diagonal keeps their anti-aliased pixels from touching after binarisation.
CLEARANCE_PX = math.sqrt(2)
BINARY_THRESHOLD = 64  # gray level above which a pixel counts as ink in `markers_connected`
ATTEMPTS_PER_IMAGE = 200
ATTEMPTS_PER_CONTOUR = 40
HOW_TO_GET_DATA = (
    "generate it with `python -m lra.tasks.pathfinder --output_dir=<dir> --resolution=<32|128> "
    "--difficulty=hard` or download LRA's release (lra_release.gz from the LRA GitHub page; "
    "it holds pathfinder32/64/128/256), then set --config.data_dir=<dir> (the folder holding "
    "pathfinder<res>/)"
)


@dataclasses.dataclass(frozen=True)
class Settings:
    """Per-resolution drawing settings, in pixels (LRA's values where VARIANTS.md lists them)."""
    paddle_length: float
    thickness: float
    margin: float
    marker_radius: float
    seed_distance: float
    continuity: float
    num_distractors: int


# 32/64/128: LRA's thickness, marker radius, seed distance and continuity. Paddle length
# and the number of distractors are not listed for 64+: they scale with the resolution so
# contours cover the same fraction of the image.
SETTINGS = {
    32: Settings(2.0, 0.5, 1.0, 1.5, 7.0, 1.0, 5),
    64: Settings(4.0, 1.0, 1.5, 2.5, 12.0, 1.8, 10),
    128: Settings(8.0, 1.5, 2.0, 3.0, 20.0, 1.8, 20),
    256: Settings(16.0, 2.0, 3.0, 4.0, 40.0, 1.8, 40),
}


# --- generator -----------------------------------------------------------------------


class _Scene:
    """Contours (polylines) and markers placed so far, with the clearance checks."""

    def __init__(self, res: int, s: Settings):
        self.res, self.s = res, s
        self.clearance = s.thickness + s.margin + CLEARANCE_PX
        self.border = s.margin + s.thickness / 2
        self.step = 0.25  # spacing of the points that stand for a paddle in the checks
        self.points = np.zeros((0, 2))
        self.owner = np.zeros(0, dtype=np.int64)  # contour id; -1 = marker
        self.extra = np.zeros(0)  # added to the clearance (a marker's radius)
        self.contours: list[np.ndarray] = []  # vertices [n + 1, 2]
        # Cells (GRID per pixel) too close to a placed contour or marker: a candidate paddle
        # is checked by looking its points up, instead of measuring distances to all points.
        self.forbidden = np.zeros((res * GRID, res * GRID), dtype=bool)

    def _stamp(self, pts: np.ndarray, radius: float) -> None:
        """Marks the cells within `radius` (plus the grid's rounding) of any of `pts`."""
        from scipy import ndimage

        r = radius + 1.5 / GRID
        size = self.res * GRID
        lo = np.clip(np.floor((pts.min(0) - r) * GRID).astype(int), 0, size)
        hi = np.clip(np.ceil((pts.max(0) + r) * GRID).astype(int) + 1, 0, size)
        window = np.ones((hi[1] - lo[1], hi[0] - lo[0]), dtype=bool)  # rows = y
        cells = np.clip(np.floor(pts * GRID).astype(int) - lo, 0, np.array(window.shape[::-1]) - 1)
        window[cells[:, 1], cells[:, 0]] = False
        near = ndimage.distance_transform_edt(window) < r * GRID
        self.forbidden[lo[1]:hi[1], lo[0]:hi[0]] |= near

    def _blocked(self, pts_CxNx2: np.ndarray, own: np.ndarray) -> np.ndarray:
        """bool [C]: which candidate point sets break the border or a clearance."""
        outside = (pts_CxNx2 < self.border) | (pts_CxNx2 > self.res - self.border)
        blocked = outside.any((1, 2))
        cells = np.clip(np.floor(pts_CxNx2 * GRID).astype(int), 0, self.res * GRID - 1)
        blocked |= self.forbidden[cells[..., 1], cells[..., 0]].any(1)
        if len(own):  # older paddles of the same contour: no self-touching
            d2 = np.sum((pts_CxNx2[:, :, None] - own) ** 2, axis=-1)
            blocked |= (d2 < self.clearance ** 2).any((1, 2))
        return blocked

    def grow(self, num_paddles: int, rng: np.random.Generator) -> np.ndarray | None:
        """Adds a contour (returns its vertices), or None if it found no room."""
        s = self.s
        half = math.pi / (2 * s.continuity)
        turns_C = np.linspace(-half, half, NUM_TURNS + 2)[1:-1]  # cos^2 is 0 at the ends
        log_weights_C = np.log(np.cos(s.continuity * turns_C) ** 2)
        n = max(1, int(math.ceil(s.paddle_length / self.step)))
        t_N = np.arange(1, n + 1) / n * s.paddle_length
        no_points = np.zeros((0, 2))
        cid = len(self.contours)
        for _ in range(ATTEMPTS_PER_CONTOUR):
            start = rng.uniform(self.border, self.res - self.border, size=2)
            if self._blocked(start[None, None], no_points)[0]:
                continue
            heading = rng.uniform(0, 2 * math.pi)
            vertices = [start]
            own: list[np.ndarray] = [start[None]]  # points per paddle, start first
            for _ in range(num_paddles):
                h_C = heading + turns_C
                dir_Cx2 = np.stack([np.cos(h_C), np.sin(h_C)], axis=-1)
                pts_CxNx2 = vertices[-1] + t_N[None, :, None] * dir_Cx2[:, None]
                older = np.concatenate(own[:-2]) if len(own) > 2 else no_points
                # Only older points within reach of this paddle can be too close.
                reach = s.paddle_length + self.clearance
                older = older[np.sum((older - vertices[-1]) ** 2, axis=-1) < reach ** 2]
                ok_C = ~self._blocked(pts_CxNx2, older)
                if not ok_C.any():
                    break  # a dead end: start the contour again elsewhere
                # A weighted draw among the free turns (Gumbel-max: one call to the rng).
                score_C = log_weights_C + rng.gumbel(size=NUM_TURNS)
                k = int(np.argmax(np.where(ok_C, score_C, -np.inf)))
                heading = h_C[k]
                vertices.append(pts_CxNx2[k, -1])
                own.append(pts_CxNx2[k])
            if len(vertices) == num_paddles + 1:
                self._add(np.concatenate(own), cid, 0.0)
                self.contours.append(np.array(vertices))
                return self.contours[-1]
        return None

    def _add(self, pts: np.ndarray, owner: int, extra: float) -> None:
        self._stamp(pts, self.clearance + extra)
        self.points = np.concatenate([self.points, pts])
        self.owner = np.concatenate([self.owner, np.full(len(pts), owner)])
        self.extra = np.concatenate([self.extra, np.full(len(pts), extra)])

    def marker_fits(self, centre: np.ndarray, contour: int) -> bool:
        others = self.owner != contour
        d = np.linalg.norm(self.points[others] - centre, axis=-1)
        return bool((d >= self.clearance + self.s.marker_radius + self.extra[others]).all())

    def add_marker(self, centre: np.ndarray) -> None:
        self._add(centre[None], -1, self.s.marker_radius)


def render(res: int, s: Settings, contours: list[np.ndarray],
           markers: np.ndarray) -> np.ndarray:
    """uint8 [res, res]: strokes and markers drawn supersampled, box-filtered down."""
    from PIL import Image, ImageDraw

    size = res * SUPERSAMPLE
    canvas = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(canvas)
    width = max(1, round(s.thickness * SUPERSAMPLE))
    # Continuous x in image pixels (pixel j spans [j, j + 1)) -> PIL's pixel-centre coords.
    to_canvas = lambda p: p * SUPERSAMPLE - 0.5  # noqa: E731
    for vertices in contours:
        draw.line([tuple(to_canvas(v)) for v in vertices], fill=255, width=width, joint="curve")
    r = s.marker_radius * SUPERSAMPLE
    for c in markers:
        x, y = to_canvas(c)
        draw.ellipse([x - r, y - r, x + r, y + r], fill=255)
    small = np.asarray(canvas.resize((res, res), Image.Resampling.BOX), dtype=np.float32)
    # A stroke thinner than a pixel covers at most `thickness` of one: scale so that a
    # pixel crossed through its centre is white, as in LRA's images.
    return np.clip(np.round(small / min(1.0, s.thickness)), 0, 255).astype(np.uint8)


def generate_image(res: int, contour_length: int, rng: np.random.Generator,
                   settings: Settings | None = None) -> tuple[np.ndarray, int, np.ndarray]:
    """Returns (image uint8 [res, res], label, marker centres [2, 2] as (x, y))."""
    s = settings or SETTINGS[res]
    label = int(rng.integers(2))
    for _ in range(ATTEMPTS_PER_IMAGE):
        scene = _Scene(res, s)
        a = scene.grow(contour_length, rng)
        b = scene.grow(contour_length, rng) if a is not None else None
        if b is None:
            continue
        if label:
            ends = [(a[0], 0), (a[-1], 0)]
        else:
            ends = [(a[0] if rng.integers(2) else a[-1], 0),
                    (b[0] if rng.integers(2) else b[-1], 1)]
        (m1, c1), (m2, c2) = ends
        if np.linalg.norm(m1 - m2) < s.seed_distance:
            continue
        if not (scene.marker_fits(m1, c1) and scene.marker_fits(m2, c2)):
            continue
        scene.add_marker(m1)
        scene.add_marker(m2)
        # Distractors that find no room are left out (rare at LRA's densities).
        for _ in range(s.num_distractors):
            scene.grow(max(1, contour_length // 3), rng)
        markers = np.stack([m1, m2])
        return render(res, s, scene.contours, markers), label, markers
    raise RuntimeError(f"no room for two contours of {contour_length} paddles at {res}px "
                       f"after {ATTEMPTS_PER_IMAGE} attempts; settings {s}")


def markers_connected(image: np.ndarray, markers: np.ndarray,
                      threshold: int = BINARY_THRESHOLD) -> bool:
    """True if the two marker centres lie in one 8-connected component of ink."""
    from scipy import ndimage

    components, _ = ndimage.label(image > threshold, structure=np.ones((3, 3)))
    (x1, y1), (x2, y2) = np.floor(markers).astype(int)
    c1, c2 = components[y1, x1], components[y2, x2]
    return bool(c1 and c1 == c2)


def _image_rng(seed: int, res: int, contour_length: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, res, contour_length, index])


def _write_folder(args: tuple) -> list[str]:
    """Generates and writes the images of one imgs/<k> folder; returns its metadata rows."""
    from PIL import Image

    root, k, start, stop, res, contour_length, seed = args
    folder = os.path.join(root, "imgs", str(k))
    os.makedirs(folder, exist_ok=True)
    rows = []
    for index in range(start, stop):
        i = index - start
        image, label, markers = generate_image(
            res, contour_length, _image_rng(seed, res, contour_length, index))
        Image.fromarray(image, mode="L").save(os.path.join(folder, f"sample_{i}.png"))
        (x1, y1), (x2, y2) = markers
        rows.append(f"imgs/{k} sample_{i}.png {i} {label} {x1:.2f} {y1:.2f} {x2:.2f} {y2:.2f}")
    return rows


def generate(output_dir: str, *, resolution: int = 32, difficulty: str = "hard",
             num_images: int = 200_000, seed: int = 0, workers: int = 2,
             images_per_folder: int = IMAGES_PER_FOLDER, verbose: bool = True) -> str:
    """Writes one difficulty folder in LRA's layout; returns its path.

    Image `index` goes to imgs/<index // images_per_folder>/; its pixels depend only on
    (seed, resolution, difficulty, index). A folder whose metadata file is complete is
    kept (that file is written after its images), so a stopped run resumes; the settings
    are recorded in generator.json and another seed or folder size is refused.
    """
    if resolution not in SETTINGS:
        raise ConfigError(f"--resolution={resolution}; choose one of {sorted(SETTINGS)}")
    if difficulty not in DIFFICULTIES:
        raise ConfigError(f"--difficulty={difficulty!r}; choose one of {list(DIFFICULTIES)}")
    if num_images < 1:
        raise ConfigError(f"--num_images={num_images} must be >= 1")
    if images_per_folder < 1:
        raise ConfigError(f"images_per_folder={images_per_folder} must be >= 1")
    if workers < 1:
        raise ConfigError(f"--workers={workers} must be >= 1")
    folder, contour_length = DIFFICULTIES[difficulty]
    root = os.path.join(output_dir, f"pathfinder{resolution}", folder)
    os.makedirs(os.path.join(root, "metadata"), exist_ok=True)
    settings = {"seed": seed, "resolution": resolution, "contour_length": contour_length,
                "images_per_folder": images_per_folder}
    settings_path = os.path.join(root, "generator.json")
    if os.path.exists(settings_path):
        with open(settings_path) as f:
            before = json.load(f)
        if before != settings:
            raise ConfigError(f"{root} was generated with {before}, not {settings}; give "
                              "another --output_dir or delete that folder")
    with open(settings_path, "w") as f:
        json.dump(settings, f)
    jobs = [(root, k, start, min(start + images_per_folder, num_images), resolution,
             contour_length, seed)
            for k, start in enumerate(range(0, num_images, images_per_folder))]
    log = print if verbose else (lambda *_a, **_k: None)
    kept = [job for job in jobs if _complete(root, job[1], job[3] - job[2])]
    if kept:
        log(f"pathfinder: {len(kept)} of {len(jobs)} folders already complete, kept")
        jobs = [job for job in jobs if job not in kept]
    t0 = time.monotonic()
    done = kept_images = sum(job[3] - job[2] for job in kept)
    # The worker by its importable name: under `python -m` this file is __main__.
    worker = importlib.import_module("lra.tasks.pathfinder")._write_folder
    with multiprocessing.get_context("spawn").Pool(workers) if workers > 1 else _Serial() as pool:
        for job, rows in zip(jobs, pool.imap(worker, jobs)):
            path = os.path.join(root, "metadata", f"{job[1]}.npy")
            with open(path + ".tmp", "w", encoding="ascii", newline="\n") as f:
                f.write("\n".join(rows) + "\n")
            os.replace(path + ".tmp", path)  # never a plausible-looking partial file
            done += len(rows)
            log(f"pathfinder: {done}/{num_images} images, "
                f"{(done - kept_images) / (time.monotonic() - t0):.0f}/s", flush=True)
    return root


def _complete(root: str, k: int, num_rows: int) -> bool:
    """Folder k's metadata file exists with all its rows (written after the images)."""
    path = os.path.join(root, "metadata", f"{k}.npy")
    if not os.path.exists(path):
        return False
    with open(path, encoding="ascii", errors="replace") as f:
        return sum(1 for line in f if line.strip()) == num_rows


class _Serial:
    """A stand-in for multiprocessing.Pool when --workers=1."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @staticmethod
    def imap(fn, jobs):
        return map(fn, jobs)


# --- reader --------------------------------------------------------------------------


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
        with open(path, encoding="utf-8", errors="replace") as f:
            for line_number, line in enumerate(f, start=1):
                fields = line.split()
                if not fields:
                    continue
                where = f"{path}:{line_number}"
                if len(fields) < 4:
                    raise DataError(f"{where}: expected at least 4 columns (folder, file, "
                                    f"index, label), got {len(fields)}")
                if fields[3] not in ("0", "1"):
                    raise DataError(f"{where}: label {fields[3]!r} is not 0 or 1")
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


# Under `python -m lra.tasks.pathfinder` this file runs as __main__ (and, in the spawned
# workers, as __mp_main__); the copy imported as lra.tasks.pathfinder registers the tasks.
if __name__ not in ("__main__", "__mp_main__"):
    registry.register(registry.Task(
        name="pathfinder", num_classes=NUM_CLASSES, vocab_size=VOCAB_SIZE, max_length=32 * 32,
        reader=_read, default_data_dir="data/pathfinder", how_to_get_data=HOW_TO_GET_DATA))
    registry.register(registry.Task(
        name="pathx", num_classes=NUM_CLASSES, vocab_size=VOCAB_SIZE, max_length=128 * 128,
        reader=_read_pathx, default_data_dir="data/pathfinder",
        how_to_get_data=HOW_TO_GET_DATA))


# --- command line --------------------------------------------------------------------


def _main() -> None:
    from absl import app, flags

    flags.DEFINE_string("output_dir", None, "Folder that gets pathfinder<res>/<difficulty>/.",
                        required=True)
    flags.DEFINE_integer("resolution", 32, "Image side in pixels: 32, 64, 128 or 256.")
    flags.DEFINE_enum("difficulty", "hard", list(DIFFICULTIES),
                      "Contour length 6 (easy), 9 (intermediate) or 14 (hard).")
    flags.DEFINE_integer("num_images", 200_000, "Images to generate (LRA: 200k per level).")
    flags.DEFINE_integer("seed", 0, "Random seed; the same flags give identical images.")
    flags.DEFINE_integer("workers", 2, "Processes; the output does not depend on it.")
    FLAGS = flags.FLAGS

    def main(argv: list[str]) -> None:
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
        try:
            path = generate(FLAGS.output_dir, resolution=FLAGS.resolution,
                            difficulty=FLAGS.difficulty, num_images=FLAGS.num_images,
                            seed=FLAGS.seed, workers=FLAGS.workers)
        except ConfigError as e:
            sys.exit(f"error: {e}")
        print(f"pathfinder: wrote {path}")

    app.run(main)


if __name__ == "__main__":
    _main()

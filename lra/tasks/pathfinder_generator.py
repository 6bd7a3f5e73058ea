r"""Pathfinder / Path-X stimuli: the algorithm of Linsley et al.'s generator, LRA's settings.

  python -m lra.tasks.pathfinder --output_dir=data/pathfinder --resolution=32 \
      --difficulty=hard --num_images=200000 --seed=0 --workers=2

The original is `snakes2.py` (with `snakes.py`) in github.com/drewlinsley/pathfinder; LRA
generated its Pathfinder32/64/128/256 sets with it and listed its settings in
`lra_benchmarks/data/pathfinder.py`. This module follows that algorithm step by step (the
facts, not the code), so that a seeded draw gives the same image as the original would with
the same NumPy random stream (`tests/tasks/test_pathfinder.py` holds images made by the
original; the note of issue 17 has the side-by-side statistics):

- An image is two target contours and some distractor contours. A contour is a chain of
  paddles (straight strokes of `paddle_length` px). Consecutive paddles leave a gap of about
  2 x margin px between them, so a contour is dashed, not one stroke.
- Each paddle is drawn `antialias` times larger with PIL and Lanczos-downsampled; beside it a
  "mask" (the paddle dilated by `margin`) records the space it occupies. The next paddle of a
  contour starts `margin` past the end of the last one and is drawn on a circle around that
  point, with probability cos^2(continuity x turn) x (how free the mask is there); it is
  redrawn (at most `paddle_retrials` more times) if it overlaps the mask by more than 0.8.
  A contour's newest paddle joins the mask only when the next one is placed, so a contour may
  cross others that were placed earlier and come near itself; the first target contour's
  last paddle never joins it (as in the original).
- The two targets start `seed_distance` apart near the centre (no start within
  2 x seed_distance of the border), grow alternately paddle by paddle, and the whole pair is
  redrawn until both reach `contour_length` paddles.
- Distractors: (20, 22, 35, 30 at 32, 64, 128, 256 px) // distractor length contours of
  contour_length // 3 paddles, each tried `distractor_retrials` + 1 times, then skipped; so
  fewer are placed than asked, often none.
- Two disks of `marker_radius` mark one end of each target (negative, label 0) or both ends
  of one (positive, label 1). The image is scaled so its brightest pixel is 255 (what
  scipy.misc.imsave did): at 32 px the distractors (contrast 2) and markers are brighter
  than the targets (0.75 x 2).

Per resolution, LRA's values (`SETTINGS`); what LRA did not set is the original wrapper's
default (paddle length 5, contrasts 1.0; at 256 px padding 22 and seed distance 27). Python 2
integer division gave distractor lengths contour_length // 3 and counts budget // length.

Each image is drawn from its own `np.random.RandomState`, seeded by (seed, resolution,
contour length, index), so the output does not depend on --workers. Paddle renderings are
cached per orientation: that, and checking only the pixels a paddle touches, makes this
about 30x faster than the original at 32 px (see `generate`'s progress line; docs/tasks_and_data.md
has measured rates).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import multiprocessing
import os
import time

import numpy as np

from lra.errors import ConfigError

IMAGES_PER_FOLDER = 1000
DIFFICULTIES = {  # difficulty -> (folder in LRA's release, contour length in paddles)
    "easy": ("curv_baseline", 6),
    "intermediate": ("curv_contour_length_9", 9),
    "hard": ("curv_contour_length_14", 14),
}
OCCUPIED = 0.3  # a mask value above this blocks a new contour's start (original's threshold)
OVERLAP = 1.8  # a paddle whose mask adds to the mask beyond this is redrawn
MIN_FREE = 0.01  # distractors stop when less than this fraction of the image is free


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: a cache key, often
class Settings:
    """One resolution's generator settings (pixels). Types as LRA wrote them: metadata rows
    print them with str(), so thickness 1 prints `1`, continuity 1.0 prints `1.0`."""
    window: int
    padding: int
    antialias: int
    seed_distance: int
    marker_radius: float
    paddle_length: int
    thickness: float
    margins: tuple  # one drawn per image
    continuity: float
    snake_contrast: float  # distractor paddles; target paddles: times paddle_contrast
    paddle_contrast: float
    distractor_budget: int  # distractor contours = budget // (contour_length // 3)
    distractor_retrials: int = 4
    paddle_retrials: int = 2

    def distractor_length(self, contour_length: int) -> int:
        return contour_length // 3

    def num_distractors(self, contour_length: int) -> int:
        return self.distractor_budget // self.distractor_length(contour_length)


SETTINGS = {
    32: Settings(window=32, padding=1, antialias=2, seed_distance=7, marker_radius=1.5,
                 paddle_length=2, thickness=0.5, margins=(1,), continuity=1.0,
                 snake_contrast=2, paddle_contrast=0.75, distractor_budget=20),
    64: Settings(window=64, padding=1, antialias=2, seed_distance=12, marker_radius=2.5,
                 paddle_length=5, thickness=1, margins=(1,), continuity=1.8,
                 snake_contrast=0.8, paddle_contrast=1.0, distractor_budget=22),
    128: Settings(window=128, padding=1, antialias=2, seed_distance=20, marker_radius=3,
                  paddle_length=5, thickness=1.5, margins=(2, 3), continuity=1.8,
                  snake_contrast=0.9, paddle_contrast=1.0, distractor_budget=35),
    256: Settings(window=256, padding=22, antialias=2, seed_distance=27, marker_radius=5,
                  paddle_length=5, thickness=2, margins=(3,), continuity=1.8,
                  snake_contrast=1.0, paddle_contrast=1.0, distractor_budget=30),
}


# --- geometry ------------------------------------------------------------------------


@functools.lru_cache(maxsize=1 << 18)
def _step(p: tuple[int, int], angle: float, dist: float) -> tuple[int, int]:
    """(row, col) moved `dist` along `angle` (radians, row = sin), rounded up as the original."""
    return (int(np.ceil(p[0] + float(dist) * np.sin(angle))),
            int(np.ceil(p[1] + float(dist) * np.cos(angle))))


def _opposite(angle: float) -> float:
    return angle + np.pi if angle < 0 else angle - np.pi


def _disk(radius: int) -> np.ndarray:
    y, x = np.ogrid[-radius:radius + 1, -radius:radius + 1]
    return x * x + y * y <= radius * radius


def _lanczos(pixels_u8: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(pixels_u8, mode="L").resize(
        (size[1], size[0]), Image.Resampling.LANCZOS))


def _to_bytes(image: np.ndarray) -> np.ndarray:
    """Min..max -> 0..255, rounded half up: scipy.misc's bytescale, which the original's
    imresize and imsave applied to every float image."""
    lo, hi = float(image.min()), float(image.max())
    scaled = (image - lo) * (255.0 / ((hi - lo) or 1.0))
    return (scaled.clip(0, 255) + 0.5).astype(np.uint8)


@functools.lru_cache(maxsize=65536)
def _paddle(angle: float, length: int, thickness: float, margin: int, aa: int):
    """(stroke, mask), float32 [P, P] with the paddle's tail at the centre, P = 2h + 1.

    The stroke goes from the centre `length` px along `angle`, drawn `aa` times larger with
    width thickness x aa and Lanczos-downsampled; the mask is the same stroke dilated by a
    disk of margin x aa before downsampling.
    """
    from PIL import Image, ImageDraw
    from scipy import ndimage

    h = length + math.ceil(thickness) + margin
    big = 2 * h * aa + 1
    centre = h * aa
    head = _step((centre, centre), angle, length * aa)
    canvas = Image.new("L", (big, big), 0)
    ImageDraw.Draw(canvas).line([(centre, centre), (head[1], head[0])], fill=255,
                                width=int(round(thickness * aa)))
    stroke_big = np.asarray(canvas)
    mask_big = ndimage.binary_dilation(stroke_big > 0, _disk(margin * aa)).astype(np.uint8) * 255
    size = (2 * h + 1, 2 * h + 1)
    stroke = _lanczos(stroke_big, size).astype(np.float32) / 255.0
    mask = _lanczos(mask_big, size).astype(np.float32) / 255.0
    stroke.setflags(write=False)
    mask.setflags(write=False)
    return stroke, mask


@functools.lru_cache(maxsize=4096)
def _start_offsets(angle: float, length: int, thickness: float, margin: int, aa: int):
    """[K, 2] offsets o such that a contour starting at p overlaps what is at p + o.

    The original dilates the mask with the paddle's own mask (values of 1 only), read as a
    (2(length + margin) + 1)^2 kernel whose anchor is one row and column before the tail.
    """
    _, mask = _paddle(angle, length, thickness, margin, aa)
    h = length + math.ceil(thickness) + margin
    k = length + margin
    shape = (2 * k + 1, 2 * k + 1)
    img, patch = _window(shape, (k + 1, k + 1), h)
    kernel = np.zeros(shape, dtype=bool)
    kernel[img] = mask[patch] >= 1.0
    offsets = np.argwhere(kernel) - k
    # cv2.dilate gives -DBL_MAX where the kernel falls wholly outside the image, and the
    # original then finds no free pixel at all. That happens at a corner unless the kernel
    # reaches into all four (closed) quadrants around its anchor: such angles cannot start.
    quadrants = [((offsets[:, 0] * sy >= 0) & (offsets[:, 1] * sx >= 0)).any()
                 for sy in (1, -1) for sx in (1, -1)]
    if not all(quadrants):
        offsets = None
    else:
        offsets.setflags(write=False)
    return offsets


@functools.lru_cache(maxsize=1 << 17)
def _circle(pivot: tuple[int, int], radius: int, n: int, margin: int):
    """Where the next paddle's head may go: (heads [C, 2], their angles from the pivot [C],
    flat indices [C, D] of the disk of `margin` around each, n*n where outside), or None.

    One candidate per pixel of arc on the circle of `radius` around the pivot, truncated to
    pixels and deduplicated (sorted), as the original does; cached per pivot.
    """
    angles = np.arange(0, 360, 360.0 / (2 * radius * np.pi)) * np.pi / 180
    ys = pivot[0] + radius * np.sin(angles)
    xs = pivot[1] + radius * np.cos(angles)
    inside = ~((ys >= n) | (ys < 0) | (xs >= n) | (xs < 0))
    if not inside.any():
        return None
    # Truncated like astype(int); then unique rows in (row, col) order, through one code.
    code = np.unique(ys[inside].astype(int) * n + xs[inside].astype(int))
    heads = np.stack([code // n, code % n], axis=1)
    d = heads - np.array(pivot)
    turn_to = np.arctan2(d[:, 0], d[:, 1])
    around = heads[:, None, :] + (np.argwhere(_disk(margin)) - margin)[None]
    inside = ((around >= 0) & (around < n)).all(-1)
    flat = np.where(inside, around[..., 0] * n + around[..., 1], n * n)
    for a in (heads, turn_to, flat):
        a.setflags(write=False)
    return heads, turn_to, flat


@functools.lru_cache(maxsize=1 << 17)
def _smoothness(pivot: tuple[int, int], angle: float, n: int, margin: int,
                s: Settings) -> np.ndarray:
    """cos^2(continuity x turn) per candidate head (0 beyond a right angle); cached, as
    contours that are redrawn from scratch (most are) meet the same pivots and angles."""
    turn_to = _circle(pivot, s.paddle_length + margin, n, margin)[1]
    turn = np.abs(turn_to - angle)
    turn = np.minimum(np.minimum(turn, 2 * np.pi - turn) * s.continuity, 0.5 * np.pi)
    smooth = np.maximum(np.cos(turn), 0) ** 2
    smooth.setflags(write=False)
    return smooth


@functools.lru_cache(maxsize=1 << 16)
def _window(shape, centre, half: int):
    """Slices (image, patch) where a (2 half + 1)^2 patch centred at `centre` overlaps."""
    out_img, out_patch = [], []
    for c, n in zip(centre, shape):
        lo, hi = c - half, c + half
        out_img.append(slice(max(lo, 0), min(hi, n - 1) + 1))
        out_patch.append(slice(max(0, -lo), 2 * half - max(0, hi - (n - 1)) + 1))
    return tuple(out_img), tuple(out_patch)


@functools.lru_cache(maxsize=256)
def _empty_mask(n: int, padding: int) -> np.ndarray:
    mask = np.zeros((n, n))
    mask[:padding, :] = mask[-padding:, :] = mask[:, :padding] = mask[:, -padding:] = 1
    mask.setflags(write=False)
    return mask


def _free_starts(mask: np.ndarray, s: Settings, margin: int, angle: float,
                 border: int) -> np.ndarray:
    """See _Canvas.free_starts."""
    offsets = _start_offsets(angle, s.paddle_length, s.thickness, margin, s.antialias)
    if offsets is None:
        return np.zeros((0, 2), dtype=np.int64)
    taken = np.ceil(mask - OCCUPIED) != 0
    taken[:border, :] = taken[-border:, :] = True
    taken[:, :border] = taken[:, -border:] = True
    blocked = np.zeros_like(taken)
    n = len(mask)
    for dy, dx in offsets:
        # blocked[y, x] |= taken[y + dy, x + dx] where that is inside the image
        blocked[max(0, -dy):n - max(0, dy), max(0, -dx):n - max(0, dx)] |= \
            taken[max(0, dy):n - max(0, -dy), max(0, dx):n - max(0, -dx)]
    return np.argwhere(~blocked)


@functools.lru_cache(maxsize=4096)
def _free_starts_on_empty(s: Settings, margin: int, angle: float, border: int) -> np.ndarray:
    free = _free_starts(_empty_mask(s.window, s.padding), s, margin, angle, border)
    free.setflags(write=False)
    return free


# --- one image -----------------------------------------------------------------------


class _Canvas:
    """The image being drawn and its mask (space taken), float64 [window, window]."""

    def __init__(self, s: Settings, margin: int):
        self.s, self.margin = s, margin
        self.n = s.window
        self.image = None  # set once the targets are drawn
        # The mask lives in a flat buffer with one zero past its end, which the candidate
        # lookups in `extend` index for pixels outside the image.
        self.flat = np.zeros(self.n * self.n + 1)
        self.mask = self.flat[:-1].reshape(self.n, self.n)
        self.mask[...] = _empty_mask(self.n, s.padding)
        self.pristine = True  # nothing taken yet: free starts can come from a cache
        self.half = s.paddle_length + math.ceil(s.thickness) + margin

    def paddle(self, angle: float):
        s = self.s
        return _paddle(angle, s.paddle_length, s.thickness, self.margin, s.antialias)

    def inside(self, p) -> bool:
        return 0 <= p[0] < self.n and 0 <= p[1] < self.n

    def free_starts(self, angle: float, border: int) -> np.ndarray:
        """[M, 2] (row-major order) tails where a paddle at `angle` touches nothing taken,
        `border` px from the edges excluded."""
        if self.pristine:  # every first target's seed
            return _free_starts_on_empty(self.s, self.margin, angle, border)
        return _free_starts(self.mask, self.s, self.margin, angle, border)

    def take(self, mask: tuple) -> None:
        """Adds a paddle's mask (image window, values) to the mask."""
        window = self.mask[mask[0]]
        np.maximum(window, mask[1], out=window)
        self.pristine = False

    def fraction_free(self) -> float:
        return float(np.count_nonzero(np.ceil(self.mask - OCCUPIED) == 0)) / self.mask.size

    def draw(self, tail, angle: float, contrast: float, target: np.ndarray):
        """Draws a paddle into `target`; returns its mask as (image window, values)."""
        stroke, mask = self.paddle(angle)
        img, patch = _window((self.n, self.n), tail, self.half)
        target[img] = np.maximum(target[img], stroke[patch] * np.float32(contrast))
        return img, mask[patch]

    def overlaps(self, tail, angle: float) -> bool:
        _, mask = self.paddle(angle)
        img, patch = _window((self.n, self.n), tail, self.half)
        return not (self.mask[img] + mask[patch]).max() < OVERLAP

    def extend(self, rs: np.random.RandomState, snake: dict, contrast: float,
               target: np.ndarray) -> bool:
        """Adds one paddle to `snake` (pivot, angle, last mask, tip); False at a dead end."""
        s = self.s
        pivot = _step(snake["pivot"], snake["angle"], s.paddle_length + 2 * self.margin)
        circle = _circle(pivot, s.paddle_length + self.margin, self.n, self.margin)
        if circle is None:
            return False
        heads, turn_to, around = circle
        smooth = _smoothness(pivot, float(snake["angle"]), self.n, self.margin, s)
        # The mask dilated by a disk of `margin`, read at the candidates only (index n*n is
        # a zero past the end: outside the image adds nothing, as in cv2.dilate).
        taken = self.flat[around].max(1)
        pmf = (1 - taken) * smooth
        total = pmf.sum()
        if total < 1e-4:
            return False
        cmf = np.cumsum(pmf / total)
        for _ in range(s.paddle_retrials + 1):
            k = int((cmf - rs.rand() > 0).argmax())
            head = (int(heads[k, 0]), int(heads[k, 1]))
            back = _opposite(turn_to[k])
            if not self.overlaps(head, back):
                break
        else:
            return False
        new_mask = self.draw(head, back, contrast, target)
        self.take(snake["mask"])
        snake.update(pivot=pivot, angle=turn_to[k], mask=new_mask, tip=head)
        return True

    def seed(self, rs: np.random.RandomState, border: int, contrast: float,
             target: np.ndarray, stop_when_full: bool) -> dict | None:
        """Starts a contour on a free pixel; None if there is none (or no retrial fits)."""
        s = self.s
        for _ in range(s.paddle_retrials + 1):
            angle = rs.randint(low=-180, high=180) * np.pi / 180
            free = self.free_starts(angle, border)
            if stop_when_full and self.fraction_free() < MIN_FREE:
                return None
            if not len(free):
                return None
            tail = tuple(int(v) for v in free[rs.randint(low=0, high=len(free))])
            snake = self._start(tail, angle)
            if snake is not None:
                break
        else:
            return None
        snake["mask"] = self.draw(tail, angle, contrast, target)
        return snake

    def second_seed(self, rs: np.random.RandomState, first: dict, contrast: float,
                    target: np.ndarray) -> dict | None:
        """The second target starts `seed_distance` from the first (no mask check)."""
        s = self.s
        for _ in range(s.paddle_retrials + 1):
            angle = rs.randint(low=-180, high=180) * np.pi / 180
            where = rs.randint(0, 360) * np.pi / 180
            tail = (int(np.round(first["origin"][0] + s.seed_distance * np.sin(where))),
                    int(np.round(first["origin"][1] + s.seed_distance * np.cos(where))))
            snake = self._start(tail, angle)
            if snake is not None:
                break
        else:
            return None
        snake["mask"] = self.draw(tail, angle, contrast, target)
        return snake

    def _start(self, tail, angle: float) -> dict | None:
        """A contour's first paddle from `tail`, if its head and pivot are in the image."""
        head = _step(tail, angle, self.s.paddle_length)
        pivot = _step(head, _opposite(angle), self.s.paddle_length + self.margin)
        if not (self.inside(head) and self.inside(pivot)):
            return None
        return {"pivot": pivot, "angle": angle, "origin": tail, "tip": tail}


def _pick(rs: np.random.RandomState, values: tuple):
    return values[rs.randint(low=0, high=len(values))]


def _one_of_one(rs: np.random.RandomState, value: float) -> float:
    """The original picks contrasts from one-element lists, and in some places (not all) it
    draws an index even then: the draw is kept so the random stream stays in step."""
    rs.randint(low=0, high=1)
    return value


def _targets(s: Settings, margin: int, contour_length: int, rs: np.random.RandomState):
    """Two target contours grown alternately, or None (then the caller draws again)."""
    c = _Canvas(s, margin)
    contrast = s.paddle_contrast * s.snake_contrast
    strokes = [np.zeros((c.n, c.n)), np.zeros((c.n, c.n))]
    first = c.seed(rs, 2 * s.seed_distance, contrast, strokes[0], stop_when_full=False)
    if first is None:
        return None
    second = c.second_seed(rs, first, contrast, strokes[1])
    if second is None:
        return None
    snakes = [first, second]
    for _ in range(contour_length - 1):
        _one_of_one(rs, s.paddle_contrast)
        for snake, stroke in zip(snakes, strokes):
            if not c.extend(rs, snake, contrast, stroke):
                return None
    c.take(second["mask"])  # only the second's last paddle (as the original)
    c.image = np.maximum(strokes[0], strokes[1])
    return c, snakes


def _distractor(c: _Canvas, s: Settings, length: int, rs: np.random.RandomState) -> bool:
    """One distractor contour, all or nothing."""
    image, flat = c.image.copy(), c.flat.copy()
    snake = c.seed(rs, 1, _one_of_one(rs, s.snake_contrast), c.image, stop_when_full=True)
    ok = snake is not None
    for _ in range(length - 1):
        if not ok:
            break
        ok = c.extend(rs, snake, _one_of_one(rs, s.snake_contrast), c.image)
    if ok:
        c.take(snake["mask"])
    else:
        c.image[...], c.flat[...] = image, flat
    return ok


def _marker(n: int, centre, radius: float, aa: int) -> np.ndarray:
    y, x = np.ogrid[-centre[0] * aa:(n - centre[0]) * aa, -centre[1] * aa:(n - centre[1]) * aa]
    disk = ((x ** 2 + y ** 2) <= (radius * aa) ** 2).astype(np.uint8) * 255
    return _lanczos(disk, (n, n))


def draw_image(s: Settings, contour_length: int, rs: np.random.RandomState):
    """(uint8 [window, window], label, info) for one image, drawn from `rs` in the
    original's order of random draws. info: margin, markers ((row, col) x 2; origin first),
    distractors placed."""
    label = int(rs.randint(low=0, high=2))
    margin = _pick(rs, s.margins)
    drawn = None
    while drawn is None:
        drawn = _targets(s, margin, contour_length, rs)
    c, snakes = drawn
    placed = 0
    for _ in range(s.num_distractors(contour_length)):
        for _ in range(s.distractor_retrials + 1):
            if _distractor(c, s, s.distractor_length(contour_length), rs):
                placed += 1
                break
    origin = int(rs.randint(0, 2))
    end = origin if label else 1 - origin
    markers = (snakes[origin]["origin"], snakes[end]["tip"])
    disks = np.maximum(*(_marker(s.window, m, s.marker_radius, s.antialias) for m in markers))
    image = np.maximum(c.image, disks.astype(np.float32) / 255.0)
    info = {"margin": int(margin), "markers": [list(map(int, m)) for m in markers],
            "distractors": placed}
    return _to_bytes(image), label, info


def metadata_row(k: int, i: int, label: int, s: Settings, contour_length: int,
                 margin: int) -> str:
    """The 11 fields the original records per image, as LRA's release writes them."""
    fields = [f"imgs/{k}", f"sample_{i}.png", i, label, s.continuity, contour_length,
              s.distractor_length(contour_length), s.paddle_length, s.thickness, margin,
              1]  # the number of paddle contrasts
    return " ".join(str(f) for f in fields)


# --- writing a folder ----------------------------------------------------------------


def image_seed(seed: int, res: int, contour_length: int, index: int) -> np.random.RandomState:
    """Image `index`'s own random stream (independent of workers and folders)."""
    ss = np.random.SeedSequence([seed, res, contour_length, index])
    return np.random.RandomState(ss.generate_state(4))


def _write_folder(args: tuple) -> list[str]:
    """Generates and writes the images of one imgs/<k> folder; returns its metadata rows.

    Marker centres and distractor counts go to a side file, extra/<k>.json, outside the
    release layout (statistics and tests read it; the task reader does not)."""
    from PIL import Image

    root, k, start, stop, res, contour_length, seed = args
    s = SETTINGS[res]
    folder = os.path.join(root, "imgs", str(k))
    os.makedirs(folder, exist_ok=True)
    rows, extra = [], []
    for index in range(start, stop):
        i = index - start
        image, label, info = draw_image(s, contour_length,
                                        image_seed(seed, res, contour_length, index))
        Image.fromarray(image, mode="L").save(os.path.join(folder, f"sample_{i}.png"))
        rows.append(metadata_row(k, i, label, s, contour_length, info["margin"]))
        extra.append({"label": label, "markers": info["markers"],
                      "distractors": info["distractors"]})
    os.makedirs(os.path.join(root, "extra"), exist_ok=True)
    with open(os.path.join(root, "extra", f"{k}.json"), "w") as f:
        json.dump(extra, f)
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
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ConfigError(f"--output_dir={output_dir} is a file, not a folder")
    folder, contour_length = DIFFICULTIES[difficulty]
    root = os.path.join(output_dir, f"pathfinder{resolution}", folder)
    os.makedirs(os.path.join(root, "metadata"), exist_ok=True)
    settings = {"generator": "snakes2", "seed": seed, "resolution": resolution,
                "contour_length": contour_length, "images_per_folder": images_per_folder}
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
    # The worker by its importable name (spawned processes import this module).
    with multiprocessing.get_context("spawn").Pool(workers) if workers > 1 else _Serial() as pool:
        for job, rows in zip(jobs, pool.imap(_write_folder, jobs)):
            path = os.path.join(root, "metadata", f"{job[1]}.npy")
            with open(path + ".tmp", "w", encoding="ascii", newline="\n") as f:
                f.write("\n".join(rows) + "\n")
            os.replace(path + ".tmp", path)  # never a plausible-looking partial file
            done += len(rows)
            log(f"pathfinder: {done}/{num_images} images, "
                f"{(done - kept_images) / (time.monotonic() - t0):.1f}/s", flush=True)
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

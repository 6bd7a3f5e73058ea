r"""Takes the English Wikipedia dump excerpt that PyPI's gensim wheel carries (no install:
the wheel is a zip) and writes it, or a slice of it, where lra/tasks/enwik8.py reads it:

  pip download --no-deps gensim==4.4.0 -d /tmp/g
  python scripts/wiki_excerpt.py --wheel=/tmp/g/gensim-4.4.0-*.whl --output_dir=data/enwik8
      # the whole excerpt: 6,089,746 bytes (checked: sha256 of the .bz2 as below)
  python scripts/wiki_excerpt.py --wheel=... --output_dir=tests/data/enwik8_slice \
      --bytes=24000   # the tests' fixture: the excerpt's first 24,000 bytes, bz2

The member is gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-
shortened.bz2 (gensim 4.4.0; sha256 of the .bz2 a53f4648dec40467ebdcbc7a1307eddb51fe6e28e9
309f6ebde81ba0d04bea2d, checked before anything is written).
"""
from __future__ import annotations

import argparse
import bz2
import glob
import hashlib
import os
import sys
import zipfile

MEMBER = ("gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-"
          "shortened.bz2")
SHA256 = "a53f4648dec40467ebdcbc7a1307eddb51fe6e28e9309f6ebde81ba0d04bea2d"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", required=True, help="gensim's wheel (a glob is expanded)")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--bytes", type=int, default=0,
                        help="Write only the first N bytes of the excerpt (0: all of it).")
    args = parser.parse_args(argv)
    wheels = sorted(glob.glob(args.wheel))
    if not wheels:
        print(f"error: no file matches --wheel={args.wheel}", file=sys.stderr)
        return 2
    with zipfile.ZipFile(wheels[-1]) as z:
        if MEMBER not in z.namelist():
            print(f"error: {wheels[-1]} has no {MEMBER} (another gensim version?)",
                  file=sys.stderr)
            return 2
        packed = z.read(MEMBER)
    digest = hashlib.sha256(packed).hexdigest()
    if digest != SHA256:
        print(f"error: {MEMBER} has sha256 {digest}, not {SHA256}", file=sys.stderr)
        return 2
    os.makedirs(args.output_dir, exist_ok=True)
    name = os.path.basename(MEMBER)
    if args.bytes:
        packed = bz2.compress(bz2.decompress(packed)[:args.bytes], 9)
        name = name.replace("-shortened.bz2", f"-first{args.bytes}.bz2")
    path = os.path.join(args.output_dir, name)
    with open(path, "wb") as f:
        f.write(packed)
    print(f"wrote {path} ({len(packed):,} bytes compressed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

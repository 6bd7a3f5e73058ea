"""What a run prints: process 0 alone speaks, so that a multi-process run's output reads as
one run's (progress and results on stdout, warnings on stderr)."""
from __future__ import annotations

import sys

import jax


def log(msg: str) -> None:
    if jax.process_index() == 0:
        print(msg, flush=True)


def warn(msg: str) -> None:
    if jax.process_index() == 0:
        print(f"warning: {msg}", file=sys.stderr, flush=True)


def unwritable(path: str, flag: str) -> str | None:
    """None if `path` (an output file a flag names) can be written, else the one-line
    reason, said before any work. Tried by opening it (root passes every permission
    check; a read-only file system or a missing folder does not)."""
    import os

    existed = os.path.exists(path)
    try:
        open(path, "ab").close()
    except OSError as e:
        return f"{flag}={path}: cannot write there ({e.strerror or e})"
    if not existed:
        os.remove(path)
    return None

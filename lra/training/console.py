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


def parse_flags(fv, argv: list[str], doc: str) -> int | None:
    """Parses a command's own absl FlagValues (lra.generate, lra.lm_eval): None to go on,
    else the exit code: 0 after printing the help (`doc` and the flags), 2 (a user's
    mistake) after one line `error: ...` on stderr."""
    from absl import flags

    try:
        rest = fv(argv)
    except flags.Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if fv.help:
        print(doc + "\nFlags:\n" + fv.get_help())
        return 0
    if len(rest) > 1:
        print(f"error: unexpected arguments: {' '.join(rest[1:])}", file=sys.stderr)
        return 2
    return None

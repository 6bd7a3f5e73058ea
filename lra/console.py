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

"""How a run is stopped from outside: SIGTERM (a preemption, `kill`) or Ctrl-C saves a
checkpoint at the next step and raises `Preempted` (lra/train.py's loop checks the
signal); a loss that diverged raises `TrainingDiverged`. launch.py turns both into one
line and an exit code."""
from __future__ import annotations

import os
import signal

from lra.errors import UserError


class Preempted(Exception):
    """SIGTERM (or SIGINT, see interrupt_as_preemption) arrived; the state was saved.
    Re-run the same command to resume."""


# Ctrl-C's notes (interrupt_as_preemption): a SIGTERM that follows one is the user's.
_INTERRUPTED: list[bool] = []


def interrupt_as_preemption() -> None:
    """From now on SIGINT (Ctrl-C) does what SIGTERM does: the run saves at its next step
    and stops with one line (launch.py: exit 130). It is turned into a SIGTERM to this
    process, so that the one-process handler below and jax's preemption sync point of a
    multi-process run (which listens to SIGTERM) both see it; before the training loop
    SIGTERM's default, ending the process, applies to it too, with nothing to save. A
    KeyboardInterrupt raised inside compilation could crash the process (a segmentation
    fault was seen)."""
    def on_sigint(*_):
        _INTERRUPTED.append(True)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGINT, on_sigint)


def interrupted() -> bool:
    """Whether a Preempted run was stopped by Ctrl-C (SIGINT) rather than SIGTERM."""
    return bool(_INTERRUPTED)


class TrainingDiverged(UserError):
    """The training loss became NaN, infinite or exploded."""

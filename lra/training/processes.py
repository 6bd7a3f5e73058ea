"""What the processes of one multi-process run must agree on, and how they agree.

Every function here is a collective when `jax.process_count() > 1`: every process of the
run calls it at the same point, or the run waits (and, after the heartbeat timeout, stops
as a lost peer). With one process each is a no-op or a plain local answer.

- `agree_on(what, values)`: every process holds the same values (the resolved config, the
  data fingerprint), else every process raises one ConfigError naming the fields that
  differ and which process had which value. Two processes of one run given different
  settings (`--config.data_dir` on one, another learning rate) trained one model on a mix
  and recorded process 0's settings (issue 35).
- `agree_on_error(error)`: process 0's outcome (an error or None) raised everywhere.
- `any_process(flag)`: True on every process when it is True on one.
- `preemption_sync_point(step)`: jax's preemption sync point, or None.
- `PreemptionNotice`: whether a SIGTERM has reached the run, asked at every step.
- `check_peers()`: raises (a failed collective) if another process has died.
- `lock_workdir(workdir)`: one run per workdir, the lock taken by process 0 for all.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import zlib
from typing import Any, Mapping

import jax
import numpy as np

from lra.errors import CheckpointError, ConfigError, UserError, WorkdirBusy

_BROADCAST_BYTES = 2048
# The compressed JSON of one process's values, when they differ (a resolved config is a
# few KiB of JSON, well under 1 KiB compressed).
_VALUES_BYTES = 1 << 16
_SHOWN = 4  # differing fields named in the message


def _allgather(array: np.ndarray) -> np.ndarray:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array))


def agree_on(what: str, values: Mapping[str, Any]) -> None:
    """Raises the same ConfigError on every process if `values` (field -> JSON-able value)
    differ between processes: '<what> differs between the processes of this run: field
    (process 0: a, process 1: b); ...'."""
    if jax.process_count() == 1:
        return
    text = json.dumps(dict(values), sort_keys=True, default=str)
    digest = np.frombuffer(hashlib.blake2b(text.encode(), digest_size=16).digest(), np.uint8)
    digests = _allgather(digest)
    if (digests == digests[0]).all():
        return
    packed = zlib.compress(text.encode())
    if len(packed) > _VALUES_BYTES - 4:
        packed = zlib.compress(b"{}")  # too large to show: the message names no field
    buffer = np.zeros(_VALUES_BYTES, np.uint8)
    buffer[:4] = np.frombuffer(len(packed).to_bytes(4, "little"), np.uint8)
    buffer[4:4 + len(packed)] = np.frombuffer(packed, np.uint8)
    everyone = [json.loads(zlib.decompress(bytes(row[4:4 + int.from_bytes(bytes(row[:4]),
                                                                           "little")])))
                for row in _allgather(buffer)]
    fields = sorted({k for v in everyone for k in v})
    differ = [k for k in fields if len({json.dumps(v.get(k), sort_keys=True)
                                        for v in everyone}) > 1]
    shown = "; ".join(
        f"{k} (" + ", ".join(f"process {p}: {json.dumps(v.get(k))}"
                             for p, v in enumerate(everyone)) + ")" for k in differ[:_SHOWN])
    more = f"; and {len(differ) - _SHOWN} more" if len(differ) > _SHOWN else ""
    raise ConfigError(f"{what} differs between the processes of this run: "
                      f"{shown or 'values too large to show'}{more}; start every process "
                      "with the same command and data")


def agree_on_error(error: UserError | None) -> None:
    """Process 0's outcome (None or an error) raised on every process of the run."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        kinds = [type(None), WorkdirBusy, ConfigError, CheckpointError, UserError]
        kind = next(i for i, k in enumerate(kinds) if type(error) is k or
                    (i == len(kinds) - 1 and error is not None))
        payload = np.zeros(_BROADCAST_BYTES, np.uint8)
        text = str(error or "").encode()[:_BROADCAST_BYTES - 1]
        payload[0] = kind
        payload[1:1 + len(text)] = np.frombuffer(text, np.uint8)
        got = np.asarray(multihost_utils.broadcast_one_to_all(payload))
        if got[0]:
            raise kinds[int(got[0])](bytes(got[1:]).rstrip(b"\0").decode(errors="replace"))
    elif error is not None:
        raise error


WORKDIR_PROBE = ".process0_probe"  # written by process 0, read by the others


_PATH_BYTES = 4096  # PATH_MAX on Linux


def check_shared_workdir(workdir: str) -> None:
    """Raises the same ConfigError on every process unless all of them see one workdir:
    process 0 writes a random token into it, every other process reads it back from its
    own --workdir. Processes given different folders (a local disk per host instead of
    shared storage) used to block in their first checkpoint save for orbax's 10 minutes,
    ignoring SIGTERM, one of them writing checkpoints without the run's lock."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    path = os.path.join(workdir, WORKDIR_PROBE)
    # The token, then process 0's workdir (UTF-8, zero-padded): the error names process
    # 0's folder on every process (each printed its own as process 0's before).
    message = np.zeros(16 + _PATH_BYTES, np.uint8)
    if jax.process_index() == 0:
        token = np.frombuffer(os.urandom(16), np.uint8)
        with open(path, "wb") as f:
            f.write(token.tobytes())
        name = os.path.abspath(workdir).encode()[:_PATH_BYTES]
        message[:16] = token
        message[16:16 + len(name)] = np.frombuffer(name, np.uint8)
    message = np.asarray(multihost_utils.broadcast_one_to_all(message))
    token = message[:16]
    first = message[16:].tobytes().rstrip(b"\0").decode("utf-8", "replace")
    try:
        with open(path, "rb") as f:
            sees = f.read() == token.tobytes()
    except OSError:
        sees = False
    seen_P = _allgather(np.int32(sees)).reshape(-1)
    blind = [i for i, v in enumerate(seen_P) if not v]
    if blind:
        raise ConfigError(
            f"the workdir is not one folder that every process sees: process"
            f"{'es' if len(blind) > 1 else ''} {', '.join(map(str, blind))} cannot read the "
            f"file process 0 wrote in its --workdir ({first} on process 0"
            f"{'' if first == os.path.abspath(workdir) else f'; this process was given {os.path.abspath(workdir)}'}"
            "); give every process the same --workdir on a shared file system that every "
            "host mounts (NFS, a bucket through gcsfuse)")


def any_process(flag: bool) -> bool:
    return bool(np.any(_allgather(np.int32(flag))))


def preemption_sync_point(step: int):
    """jax's preemption sync point (a multi-process run): the coordination service hears
    of a SIGTERM to any process and names one step at which every process sees True.
    None when unavailable (one process, or the service disabled)."""
    if jax.process_count() == 1:
        return None
    try:
        from jax.experimental import multihost_utils

        reached = multihost_utils.reached_preemption_sync_point
        reached(step)
        return reached
    except (ImportError, AttributeError, RuntimeError):
        return None


def check_peers() -> None:
    """A collective that fails at once if another process of the run has died (its
    connections closed): to tell a lost process from bad files before advising anything
    about them. Every process must call it at the same point."""
    if jax.process_count() > 1:
        any_process(False)


class PreemptionNotice:
    """Asked at every step of the train loop whether the run must save and stop. With
    jax's preemption sync point (`preemption_sync`, several processes) its own SIGTERM
    handler decides the step; else a SIGTERM handler notes the signal here (restored by
    `close`), and several processes without the sync point agree at the next log step
    (an all-gather of the flags)."""

    def __init__(self, preemption_sync, log_every_steps: int):
        self.sync, self.log_every_steps = preemption_sync, log_every_steps
        self.noted: list[bool] = []
        self.previous_handler = None
        if preemption_sync is None:
            try:
                self.previous_handler = signal.signal(signal.SIGTERM,
                                                      lambda *_: self.noted.append(True))
            except ValueError:  # not the main thread (a notebook worker): no preemption hook
                pass

    def __call__(self, step: int) -> bool:
        if self.sync is not None:
            return bool(self.sync(step))
        if jax.process_count() == 1:
            return bool(self.noted)
        return step % self.log_every_steps == 0 and any_process(bool(self.noted))

    def close(self) -> None:
        """The SIGTERM handler of before, back."""
        if self.previous_handler is not None:
            signal.signal(signal.SIGTERM, self.previous_handler)
            self.previous_handler = None


def lock_workdir(workdir: str):
    """One run per workdir (checkpoint.WorkdirLock, held until its release()); in a
    multi-process run process 0 takes the lock for all."""
    from lra.training import checkpoint  # orbax; only here

    lock = checkpoint.WorkdirLock(workdir)
    error = None
    if jax.process_index() == 0:
        try:
            lock.acquire()
        except UserError as e:
            error = e
    agree_on_error(error)
    if jax.process_index() != 0:
        os.makedirs(workdir, exist_ok=True)
    try:
        check_shared_workdir(workdir)
    except UserError:
        lock.release()
        raise
    return lock

"""Checkpoints: the last training state (for resuming) and the best weights (for testing),
and the workdir lock.

Two orbax managers under `<workdir>/checkpoints/`:
  last/<step>/  {state: params + rest + optimizer + step, loop: JSON (data iterator,
                best-so-far, timing, config, data fingerprint)}; written every
                `checkpoint_freq` steps, at each evaluation and on SIGTERM. The newest two
                are kept: if the newest cannot be read, a run resumes from the one before.
  best/<step>/  {weights: params + rest, info: JSON (step, eval accuracy)}; written when
                the validation accuracy improves. The newest three are kept, so that the
                best step a kept `last` checkpoint names is still there (between two `last`
                checkpoints there is at most one best; see `train.py` for the rule that
                keeps best and last describing the same run).
orbax writes into a temporary folder and renames it when complete, so a run killed while
saving leaves the previous checkpoint intact.

  checksums/<last|best>/<step>.json  the SHA-256 of every file of that step, written (by
                process 0) once the step is complete, and checked before the step is
                read: a file changed on disk since (a flipped bit, a truncation, another
                run's file copied in) makes the step unreadable, like a missing one, so a
                run falls back to the checkpoint before it instead of resuming from (or
                testing) silently wrong numbers. A step without a record (written before
                checksums existed, or killed between the two writes) is read unchecked.

`<workdir>/run.lock` (WorkdirLock) keeps two runs out of one workdir.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import io
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
import warnings
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from lra.training import console
from lra.errors import CheckpointError, ConfigError, WorkdirBusy

LAST_TO_KEEP = 2
BEST_TO_KEEP = 3


def _manager(path: str, max_to_keep: int) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False
    )
    return ocp.CheckpointManager(path, options=options)


def abstract(tree: Any) -> Any:
    """Shapes, dtypes and shardings of `tree`, the template orbax restores into."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def _first_line(error: BaseException, limit: int = 200) -> str:
    """'Type: the first line of the message', cut at a word boundary after at most
    `limit` characters, with '...' where cut (a warning must not end mid-word)."""
    text = (str(error).strip().splitlines() or [""])[0]
    if len(text) > limit:
        cut = text[:limit].rsplit(" ", 1)[0] if " " in text[:limit] else text[:limit]
        text = cut.rstrip(" ,;:(") + " ..."
    return f"{type(error).__name__}: {text}"


# What orbax/tensorstore say (as ValueError, RuntimeError) when the file system refuses a
# write; such an error is the disk's, not a lost peer's.
_STORAGE_FAILURES = {"No space left on device": "No space left on device",
                     "os_error_code='28'": "No space left on device",
                     "Disk quota exceeded": "Disk quota exceeded",
                     "Read-only file system": "Read-only file system",
                     "Permission denied": "Permission denied"}


def storage_failure(error: BaseException) -> str | None:
    """The reason, when `error` (any type) is the file system refusing a write."""
    if isinstance(error, OSError):
        return error.strerror or _first_line(error)
    text = str(error)
    return next((reason for needle, reason in _STORAGE_FAILURES.items() if needle in text),
                None)


def _write_error(what: str, path: str, error: BaseException) -> CheckpointError:
    reason = storage_failure(error) or _first_line(error)
    return CheckpointError(f"cannot write {what} to {path}: {reason}; free space or fix "
                           "the folder, then re-run the same command to resume")


@contextlib.contextmanager
def _stderr_held():
    """Holds what is written to sys.stderr meanwhile (orbax's writer threads) and passes it
    on afterwards, unless the block failed for the file system: a full disk made orbax's
    threads print ~400 lines of tracebacks ("Event loop is closed") before the one line
    that says what happened (issue 35)."""
    held, real, records = io.StringIO(), sys.stderr, []
    logger = logging.getLogger("absl")  # orbax logs its threads' exceptions there

    def hold(record):
        records.append(record)
        return False

    def release(failure):
        sys.stderr = real
        logger.removeFilter(hold)
        if failure is None or not storage_failure(failure):
            real.write(held.getvalue())
            for record in records:
                logger.handle(record)

    sys.stderr = held
    logger.addFilter(hold)
    try:
        yield
    except Exception as e:  # noqa: BLE001
        release(e)
        raise
    release(None)


def _raise_if_storage(what: str, path: str, error: BaseException) -> None:
    """A write that failed for the file system: CheckpointError in one line. Anything else
    (in a multi-process run: a lost peer) propagates as it is."""
    if storage_failure(error):
        _silence_failed_writers()
        raise _write_error(what, path, error) from None


def _silence_failed_writers() -> None:
    """After a save failed for the disk, orbax's abandoned writer threads and tasks still
    report the same failure until the process exits ("Task exception was never retrieved",
    "coroutine ... was never awaited", "Exception ignored in ...", absl's "_SignalingThread
    .run() raised an exception", tensorstore's callbacks into closed event loops: "Event
    loop is closed"): dozens of tracebacks before or after the one line that says it, 1 run
    in 6 to 30 on a busy machine. The run is stopping; what threads other than the main one
    print or log from now on is dropped, and the failed writes' own reports."""
    if _silenced:
        return

    def not_a_failed_write(record):
        error = record.exc_info[1] if record.exc_info else None
        return not (error is not None and storage_failure(error))

    def main_thread_only(record):
        return threading.current_thread() is threading.main_thread()

    previous_hook, previous_stderr = sys.unraisablehook, sys.stderr

    def hook(unraisable):
        if not (storage_failure(unraisable.exc_value)
                or "serializ" in repr(unraisable.object)):  # orbax's write coroutines
            previous_hook(unraisable)

    asyncio_logger, absl_logger = logging.getLogger("asyncio"), logging.getLogger("absl")
    asyncio_logger.addFilter(not_a_failed_write)
    absl_logger.addFilter(main_thread_only)  # orbax logs its threads' exceptions there
    warnings.filterwarnings("ignore", message="coroutine .* was never awaited",
                            category=RuntimeWarning)
    sys.unraisablehook, sys.stderr = hook, _MainThreadOnly(previous_stderr)

    def undo():
        asyncio_logger.removeFilter(not_a_failed_write)
        absl_logger.removeFilter(main_thread_only)
        sys.unraisablehook, sys.stderr = previous_hook, previous_stderr
    _silenced.append(undo)


_silenced: list = []  # the undo of _silence_failed_writers, once it ran (tests call it)


def _unsilence() -> None:
    """Undoes _silence_failed_writers: for tests that fail a save in their own process."""
    while _silenced:
        _silenced.pop()()


class _MainThreadOnly:
    """sys.stderr once the disk failed: what the main thread writes passes, what other
    threads write (tracebacks printed from tensorstore's callbacks) is dropped."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        if threading.current_thread() is threading.main_thread():
            return self._stream.write(text)
        return len(text)

    def __getattr__(self, name):  # flush, fileno, encoding, isatty, ...
        return getattr(self._stream, name)


class CorruptCheckpoint(CheckpointError):
    """A checkpoint's files differ from the checksums recorded when it was saved."""


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(folder: str) -> list[str]:
    """Paths of every file below `folder`, relative to it, sorted."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        found += [os.path.relpath(os.path.join(root, f), folder) for f in sorted(files)]
    return found


class Checkpoints:
    """The two managers, created (with their folders) on first use: a run that stops on a
    config or data error writes no checkpoints folder."""

    def __init__(self, workdir: str):
        self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
        self.last_dir = os.path.join(self.directory, "last")
        self.best_dir = os.path.join(self.directory, "best")
        self._managers: dict[str, ocp.CheckpointManager] = {}

    def _get(self, name: str) -> ocp.CheckpointManager:
        if name not in self._managers:
            path, keep = ((self.last_dir, LAST_TO_KEEP) if name == "last"
                          else (self.best_dir, BEST_TO_KEEP))
            try:
                self._managers[name] = _manager(path, keep)
            except OSError as e:
                raise _write_error("checkpoints", path, e) from None
        return self._managers[name]

    @property
    def _last(self) -> ocp.CheckpointManager:
        return self._get("last")

    @property
    def _best(self) -> ocp.CheckpointManager:
        return self._get("best")

    def _exists(self, name: str) -> bool:
        return name in self._managers or os.path.isdir(
            self.last_dir if name == "last" else self.best_dir)

    # -------------------------------------------------------------------- checksums

    def _step_dir(self, kind: str, step: int) -> str:
        return os.path.join(self.last_dir if kind == "last" else self.best_dir, str(step))

    def _checksum_path(self, kind: str, step: int) -> str:
        return os.path.join(self.directory, "checksums", kind, f"{step}.json")

    def record_checksums(self, kind: str, step: int) -> None:
        """Writes the checksums of `kind` ('last'|'best') step `step` (process 0 only: the
        files are shared), and drops the records of steps orbax has deleted since."""
        if jax.process_index() != 0:
            return
        folder = self._step_dir(kind, step)
        sums = {name: _sha256(os.path.join(folder, name)) for name in _files(folder)}
        path = self._checksum_path(kind, step)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump({"step": step, "sha256": sums}, f)
        os.replace(path + ".tmp", path)
        kept = set(self._get(kind).all_steps())
        for name in os.listdir(os.path.dirname(path)):
            stem = name.split(".")[0]
            if stem.isdigit() and int(stem) not in kept:
                os.remove(os.path.join(os.path.dirname(path), name))

    def _forget_checksums(self, kind: str, step: int) -> None:
        if jax.process_index() == 0:
            try:
                os.remove(self._checksum_path(kind, step))
            except FileNotFoundError:
                pass

    def verify(self, kind: str, step: int) -> None:
        """Raises CorruptCheckpoint (one line, naming the file) if `kind` step `step`
        differs from its recorded checksums; a step without a record passes."""
        try:
            with open(self._checksum_path(kind, step)) as f:
                recorded = json.load(f)["sha256"]
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as e:
            # A bad record says nothing about the files it describes: deleting a good
            # checkpoint for it lost work. The files are then checked by reading them
            # (the restore fails on a truncated or unparseable one, and callers fall back).
            console.warn(f"the checksum record of {kind} step {step} cannot be read "
                         f"({_first_line(e, 80)}); checking that checkpoint by reading it")
            return
        folder = self._step_dir(kind, step)
        for name, digest in recorded.items():
            path = os.path.join(folder, name)
            where = os.path.join(kind, str(step), name)  # short: warnings quote 120 chars
            if not os.path.exists(path):
                raise CorruptCheckpoint(f"checksum check: {where} is missing")
            if _sha256(path) != digest:
                raise CorruptCheckpoint(f"checksum check: {where} changed since it was saved "
                                        "(corrupt or altered)")

    # -------------------------------------------------------------------- last

    def last_step(self) -> int | None:
        return self._last.latest_step() if self._exists("last") else None

    def last_steps(self) -> list[int]:
        """Steps of the kept `last` checkpoints, newest first."""
        return sorted(self._last.all_steps(), reverse=True) if self._exists("last") else []

    def save_last(self, step: int, state: Any, loop: dict) -> None:
        if step in self._last.all_steps():  # e.g. a finished run started again
            return
        self._forget_checksums("last", step)  # a deleted step's record, if one is left
        try:
            with _stderr_held():
                saved = self._last.save(step, args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state), loop=ocp.args.JsonSave(loop)))
                self._last.wait_until_finished()
        except Exception as e:  # noqa: BLE001  a full disk (tensorstore: a ValueError)
            _raise_if_storage(f"checkpoint step {step}", self.last_dir, e)
            raise
        if not saved:
            raise CheckpointError(f"orbax did not save step {step} to {self.last_dir} "
                                  f"(it holds steps {self.last_steps()}); delete "
                                  f"{self.directory} to start the run again")
        try:
            self.record_checksums("last", step)
        except OSError as e:
            raise _write_error(f"checksums of step {step}", self.directory, e) from None

    def last_loop(self, step: int | None = None) -> dict:
        """The JSON part of a `last` checkpoint (cheap: no arrays are read)."""
        step = self._last.latest_step() if step is None else step
        return self._last.restore(step, args=ocp.args.Composite(loop=ocp.args.JsonRestore()))["loop"]

    def restore_last(self, template: Any, step: int | None = None) -> tuple[Any, dict]:
        step = self._last.latest_step() if step is None else step
        self.verify("last", step)
        restored = self._last.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract(template)), loop=ocp.args.JsonRestore()))
        return restored["state"], restored["loop"]

    def delete_last(self, step: int) -> None:
        self._last.delete(step)
        self._forget_checksums("last", step)

    # -------------------------------------------------------------------- best

    def best_steps(self) -> list[int]:
        return sorted(self._best.all_steps()) if self._exists("best") else []

    def delete_best(self, step: int) -> None:
        self._best.delete(step)
        self._forget_checksums("best", step)

    def save_best(self, step: int, weights: Any, info: dict) -> None:
        # A resumed run re-evaluates steps after its last checkpoint and may reach a step
        # whose best weights were already written: the new ones are the same, rewrite them.
        if step in self._best.all_steps():
            self._best.delete(step)
        self._forget_checksums("best", step)
        try:
            with _stderr_held():
                saved = self._best.save(step, args=ocp.args.Composite(
                    weights=ocp.args.StandardSave(weights), info=ocp.args.JsonSave(info)))
                self._best.wait_until_finished()
        except Exception as e:  # noqa: BLE001  (as save_last)
            _raise_if_storage(f"best weights of step {step}", self.best_dir, e)
            raise
        if not saved:  # orbax skips a step lower than its newest one, silently
            raise CheckpointError(
                f"orbax did not save the best weights of step {step} to {self.best_dir} "
                f"(it holds steps {self.best_steps()}, newer than the run); delete "
                f"{self.directory} to start the run again")
        try:
            self.record_checksums("best", step)
        except OSError as e:
            raise _write_error(f"checksums of best step {step}", self.directory, e) from None

    def restore_best(self, template: Any, step: int | None = None) -> tuple[Any, dict]:
        step = self._best.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no best checkpoint under {self.best_dir}; delete "
                                  f"{self.directory} to start the run again")
        self.verify("best", step)
        restored = self._best.restore(step, args=ocp.args.Composite(
            weights=ocp.args.StandardRestore(abstract(template)), info=ocp.args.JsonRestore()))
        return restored["weights"], restored["info"]

    def restore_params(self, step: int, kind: str) -> Any:
        """The `params` of a best (`kind='best'`) or last checkpoint as nested dicts of
        numpy arrays, read without a template: another run's weights (config.init_from),
        whatever model that run built."""
        return self.restore_weights(step, kind)["params"]

    def restore_weights(self, step: int, kind: str) -> dict:
        """{"params", "rest"} of a best or last checkpoint as nested dicts of numpy arrays
        (as restore_params): `rest` holds the model's state that is not trained by the
        optimizer but is part of the model (performer's random features, routing's
        centroids, the fixed synthesizer's logits) and its RNG streams."""
        self.verify(kind, step)
        item = "weights" if kind == "best" else "state"
        path = os.path.join(self._step_dir(kind, step), item)
        checkpointer = ocp.PyTreeCheckpointer()
        quiet = logging.getLogger("absl")  # orbax warns that a per-item file is absent
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            tree = checkpointer.metadata(path).item_metadata
            tree = getattr(tree, "tree", tree)
            # As numpy: the arrays' saved shardings need not fit this run's devices.
            as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
            restored = checkpointer.restore(path, args=ocp.args.PyTreeRestore(
                restore_args=as_numpy))
        finally:
            quiet.setLevel(level)
        return {"params": restored["params"], "rest": restored.get("rest", {})}

    def close(self) -> None:
        for manager in self._managers.values():
            manager.close()


# ----------------------------------------------------------------------------- the lock


def _process_start_ticks(pid: int) -> str | None:
    """When `pid` started (Linux /proc), to tell a live owner from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start_ticks: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    if start_ticks is not None:
        now = _process_start_ticks(pid)
        if now is not None and now != start_ticks:
            return False  # the pid was reused by another process
    return True


# Seconds after which a run.lock that is empty or not JSON is taken over (see _stale).
UNREADABLE_LOCK_GRACE_S = 10.0


class WorkdirLock:
    """One run per workdir: `<workdir>/run.lock` holds the owner's host, pid and start.

    Created with O_EXCL (atomic on local disks and NFS). A lock whose owner is a dead
    process on this host is taken over; a lock from another host cannot be checked from
    here and is refused, with the command to remove it if that run is dead. In a
    multi-process run only process 0 takes it (train.py), for the whole run.
    """

    NAME = "run.lock"

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.path = os.path.join(os.path.abspath(workdir), self.NAME) if workdir else ""
        self.token = uuid.uuid4().hex
        self.held = False

    def _prepare_workdir(self) -> None:
        workdir = self.workdir
        if not workdir or not workdir.strip():
            raise ConfigError("--workdir is empty; give a folder for checkpoints and results")
        if os.path.exists(workdir) and not os.path.isdir(workdir):
            raise ConfigError(f"--workdir={workdir} is a file, not a folder; give a folder "
                              "(it is created if missing)")
        try:
            os.makedirs(workdir, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot create --workdir={workdir}: {e.strerror or e}; give a "
                              "folder you can write to") from None
        if not os.access(workdir, os.W_OK | os.X_OK):
            raise ConfigError(f"--workdir={workdir} is not writable; give a folder you can "
                              "write to")

    def _read(self) -> dict | None:
        try:
            with open(self.path) as f:
                return json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # being written, or garbage: treated as held by an unknown run

    def acquire(self) -> None:
        self._prepare_workdir()
        info = {"host": socket.gethostname(), "pid": os.getpid(),
                "start_ticks": _process_start_ticks(os.getpid()), "token": self.token,
                "started": datetime.datetime.now().isoformat(timespec="seconds")}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self._read()
                if owner is None:
                    continue  # released meanwhile: try again
                if not self._stale(owner):
                    raise WorkdirBusy(self._busy_message(owner))
                # Take over: rename the stale file first (only one contender can), then
                # create ours.
                stale = f"{self.path}.stale.{self.token}"
                try:
                    os.rename(self.path, stale)
                    os.remove(stale)
                except FileNotFoundError:
                    pass
                continue
            except OSError as e:
                raise ConfigError(f"cannot create {self.path}: {e.strerror or e}; give a "
                                  "--workdir you can write to") from None
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(info, f)
            except OSError as e:
                os.remove(self.path)
                raise ConfigError(f"cannot write {self.path}: {e.strerror or e}") from None
            self.held = True
            return
        raise WorkdirBusy(self._busy_message(self._read() or {}))

    def live_owner(self) -> dict | None:
        """The record of the run holding this lock (host, pid, started), or None when
        no lock is there or its owner is dead (lra.sweep --status)."""
        owner = self._read()
        return None if owner is None or self._stale(owner) else owner

    def _stale(self, owner: dict) -> bool:
        if not owner:
            # Empty or not JSON: a run is writing it this instant, or one died between
            # creating it and writing it (a few bytes, never done): stale once it is older
            # than any write takes.
            try:
                return time.time() - os.path.getmtime(self.path) > UNREADABLE_LOCK_GRACE_S
            except OSError:
                return False
        if owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
            return False
        return not _alive(owner["pid"], owner.get("start_ticks"))

    def _busy_message(self, owner: dict) -> str:
        if not owner:
            return (f"--workdir={self.workdir} has a run.lock that is empty or not JSON and "
                    f"was written less than {UNREADABLE_LOCK_GRACE_S:g} s ago (a run starting "
                    "now); try again in a moment, or use another --workdir")
        who = (f"pid {owner.get('pid')} on host {owner.get('host')}, started "
               f"{owner.get('started')}")
        here = owner.get("host") == socket.gethostname()
        advice = ("wait for it or stop it" if here else
                  f"if that run is dead (this host cannot check another host's processes), "
                  f"delete {self.path}")
        return (f"--workdir={self.workdir} is in use by another run ({who}); {advice}, "
                f"or use another --workdir")

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        owner = self._read()
        if owner and owner.get("token") == self.token:
            try:
                os.remove(self.path)
            except OSError:
                pass

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


class _Tee:
    """A text stream that writes to the console stream and to the run's log file."""

    def __init__(self, stream, log_file):
        self._stream, self._log = stream, log_file

    def write(self, text):
        n = self._stream.write(text)
        try:
            self._log.write(text)
        except (OSError, ValueError):  # a full disk or a closed log must not stop the run
            pass
        return n

    def flush(self):
        self._stream.flush()
        try:
            self._log.flush()
        except (OSError, ValueError):
            pass

    def __getattr__(self, name):  # isatty, fileno, encoding, ... are the console's
        return getattr(self._stream, name)


def tee_to_log(workdir: str, command: str) -> None:
    """From here on, what this process prints (stdout and stderr, Python's writes: the
    progress lines, warnings and errors) is appended to `<workdir>/log.txt` as well, after
    a line naming the command. Nothing is done when stdout already is that file (lra.sweep
    and the GPU suite send a run's stdout there, its stderr to stderr.txt) or on a process
    other than 0 (jax.process_index), and a workdir that cannot be written is left to the run to report."""
    import datetime
    import os

    if jax.process_index() != 0:
        return
    path = os.path.join(workdir, "log.txt")
    try:
        if os.path.exists(path) and os.path.samestat(os.stat(path),
                                                      os.fstat(sys.stdout.fileno())):
            return
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor
        pass
    try:
        os.makedirs(workdir, exist_ok=True)
        log_file = open(path, "a", encoding="utf-8", buffering=1)
    except OSError:
        return
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    log_file.write(f"==== {stamp}: {command}\n")
    sys.stdout = _Tee(sys.stdout, log_file)
    sys.stderr = _Tee(sys.stderr, log_file)

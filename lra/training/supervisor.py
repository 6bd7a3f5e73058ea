"""A multi-process run's process, watched by a thin parent that turns jaxlib's aborts into
the one-line error and exit code every other lost-peer failure gets.

When a peer dies, or a second process connects with a --process_id already taken, JAX's
coordination service marks the run as failed and jaxlib *aborts* every process it can
reach: SIGABRT, exit 134, a C++ check-failure stack and a Python fatal-error dump of every
thread (issue 35, items 7 and 9), before any Python `except` can run. Neither a Python
heartbeat callback (jaxlib cannot hand its status to Python) nor the coordination
service's recoverable mode (it leaves processes waiting on a dead peer) gives a clean way
out, so `launch.py` runs a multi-process run's work in a child process and this parent:

- passes the child's stdout through untouched (the same file) and relays its stderr line
  by line, until jaxlib's fatal line ("Terminating process because the JAX distributed
  service detected fatal errors"); what follows it (the stack dumps) is held back;
- forwards SIGTERM and SIGINT to the child (a scheduler's preemption notice reaches the
  training loop as before), and the child dies with the parent (PR_SET_PDEATHSIG on
  Linux), so a SIGKILL to the parent still kills the whole process, as before;
- exits with the child's code (or dies of its signal), except after jaxlib's abort (SIGABRT,
  or a segfault during it, after the fatal line): then one line says what
  happened, where the last complete checkpoint is, and how to resume, with exit 3
  (EXIT_LOST_PEER, as a failed collective gives). An abort without that fatal line is
  shown whole (its held-back text included) with the child's own code. A child that exits
  3 on its own (a failed collective) after jaxlib's fatal line, before the abort landed,
  keeps its own one-line error; the stack after the fatal line stays held back. The
  child's "error:" lines are shown when it has exited: if it exits 3 and its log (process
  0's holds the coordinator's) names a task that connected twice, the line says so
  instead of "a collective failed".

The child is the same command with LRA_SUPERVISED=1 in its environment; setting that
variable yourself runs without the parent (jaxlib's abort is then what you see).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading

ENV = "LRA_SUPERVISED"
EXIT_LOST_PEER = 3
# jaxlib's fatal log line when the coordination service reports an error to a process
# (xla/pjrt/distributed/client.h, jax 0.4-0.11).
_FATAL = re.compile(r"Terminating process because the JAX distributed service detected "
                    r"fatal errors")
# The coordinator's log of a second connection of one task (a duplicate --process_id, or
# a process restarted while the others ran).
_REINCARNATION = re.compile(r"\] (\d+) unexpectedly tried to connect with a different "
                            r"incarnation")
# How a child dies of jaxlib's abort once its fatal line is out: SIGABRT, or SIGSEGV / SIGBUS
# when another thread (orbax's checkpoint thread, in CI on 2026-12-05) crashes while the
# process is being torn down, before the abort lands.
_ABORT_SIGNALS = (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS)
# A process the coordinator never registered: its RegisterTask call ran out of time (a
# duplicate --process_id, whose arrival stops the run it joins, or no process 0 there).
_NOT_REGISTERED = re.compile(r"DEADLINE_EXCEEDED[\s\S]*CoordinationService/RegisterTask")


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the parent dies (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def last_checkpoint(workdir: str | None) -> str:
    """'the last complete checkpoint is step N in <dir>' or 'no checkpoint was completed'
    (orbax writes a step under a temporary name and renames it when complete)."""
    from lra.runs.results import last_complete_step

    step = last_complete_step(workdir)
    if step is None:
        return "no checkpoint was completed"
    last = os.path.join(os.path.abspath(workdir), "checkpoints", "last")
    return f"the last complete checkpoint is step {step} in {last}"


def abort_message(who: str, log: str, workdir: str | None) -> str:
    """The one line for a child that jaxlib aborted; `log` is its stderr up to the fatal
    line and after it (the coordinator's own log names a task that connected twice;
    jaxlib's status names the call that failed)."""
    twice = _REINCARNATION.search(log)
    if not twice and _NOT_REGISTERED.search(log):
        why = ("it could not join the run: process 0's coordinator did not register it "
               "in the time allowed (another process already has this --process_id, and a "
               "duplicate stops the run it joins; or process 0 is not running, or "
               "--coordinator_address is not process 0's host and port)")
        resume = ("give every process its own --process_id and process 0's address, then "
                  "start every process again")
    elif twice:
        task = twice.group(1)
        why = (f"process {task} connected a second time while the run was going (two "
               f"processes were given --process_id={task}, or process {task} was "
               f"restarted), and the distributed runtime stopped the run")
        resume = "start every process again, each with its own --process_id, to resume"
    else:
        why = ("the distributed runtime reported a failed or silent process and stopped "
               "this one; another process probably died, or a second process was given "
               "one of the run's --process_ids (the coordinator's log names a duplicate of "
               "process 1 and up, not one of process 0), see their logs")
        resume = "run the same command on every process to resume"
    return f"error: {who} stopped: {why}; {last_checkpoint(workdir)}; {resume}."


def run_child(argv: list[str], who: str, workdir: str | None) -> int:
    """Runs `python argv...` as the supervised child; returns the exit code to use."""
    env = dict(os.environ, **{ENV: "1"})
    child = subprocess.Popen([sys.executable, *argv], env=env, stderr=subprocess.PIPE,
                             preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    forwarded = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        forwarded[sig] = signal.signal(sig, lambda s, _: child.send_signal(s))
    seen: list[str] = []
    held: list[str] = []
    own: list[str] = []  # the child's "error:" lines, shown (or replaced) once it has exited
    fatal = threading.Event()

    def relay():
        for raw in iter(child.stderr.readline, b""):
            line = raw.decode("utf-8", "replace")
            if not fatal.is_set() and _FATAL.search(line):
                fatal.set()
            if line.startswith("error:"):
                own.append(line)
                continue
            if fatal.is_set():
                held.append(line)
                continue
            seen.append(line)
            sys.stderr.write(line)
            sys.stderr.flush()

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    code = child.wait()  # SIGTERM / SIGINT to this process are the child's now
    reader.join(timeout=10)
    for sig, previous in forwarded.items():
        signal.signal(sig, previous)
    log = "".join(seen + held + own)
    if -code in _ABORT_SIGNALS and fatal.is_set():
        sys.stdout.flush()
        # jaxlib's status (which call failed) comes after its fatal line: held back.
        print(abort_message(who, log, workdir), file=sys.stderr, flush=True)
        return EXIT_LOST_PEER
    if code == EXIT_LOST_PEER and (fatal.is_set() or _REINCARNATION.search(log)):
        # A race: the child's failed collective gave its own one-line error and exit 3
        # (launch.py's os._exit) before jaxlib's abort landed: after its fatal line and
        # check-failure stack (held back, as after an abort: CI, 2026-12-04), or before
        # it, with this process's coordinator having logged a second connection of a
        # task, which its collective failed because of (CI, 2026-12-06, stop 85). The
        # coordinator's log names the cause; else the child's line says it all.
        sys.stdout.flush()
        sys.stderr.write(abort_message(who, log, workdir) + "\n"
                         if _REINCARNATION.search(log) or not own else "".join(own))
        sys.stderr.flush()
        return EXIT_LOST_PEER
    if own:
        sys.stderr.write("".join(own))
    if held:  # not jaxlib's abort after all: show everything
        sys.stderr.write("".join(held))
    sys.stderr.flush()
    if code < 0:  # die of the child's signal, so that callers see what they saw before
        sys.stdout.flush()
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # no handler to reset (OSError)
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return 128 - code if code < 0 else code

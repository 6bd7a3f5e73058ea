"""Fault injection: random SIGKILL, SIGTERM or SIGINT (Ctrl-C) to one or both processes of a
2-process runlocal run, or SIGKILL to the worker child a process's supervisor runs (what the
OOM killer does), at random moments (while starting, connecting, restoring, training, saving), then the
same command again until the run finishes; the finished run must equal an uninterrupted one
(losses, evaluations, test numbers), and no process may advise deleting checkpoints.

Slow (about a minute a trial on 2 CPU cores), so behind the slow marker:

  LRA_FAULT_TRIALS=20 .venv/bin/pytest -m slow tests/test_fault_injection.py -s

prints one line per trial and a summary (exit codes seen, how many restarts each needed,
where each fault landed). LRA_FAULT_SEED picks another random sequence; LRA_FAULT_STEPS
(default 40) lengthens the run, so that more faults land inside training: the fault's
moment is drawn from 1 s to the uninterrupted run's wall time. Where a fault landed is
read from the workdir right after it (landing): before the first checkpoint, mid-save (a
checkpoint under orbax's temporary name), between saves, or after the end (results.json
written, or the last step saved), at the fault's moment (a SIGTERM's save comes after). Exit codes a fault may cause: 0 (finished
before the fault), 3 (the lost-peer line), 143 (SIGTERM: saved and stopped), 130 (SIGINT:
the same), -9 / -15 (the process the fault hit; SIGINT before training ends a process as
SIGTERM does). -6 (SIGABRT: jaxlib aborting a survivor when the coordination
service declares a peer dead) is counted apart and must not occur: launch.py's watcher
(lra/training/supervisor.py) turns it into the lost-peer line and exit 3
(docs/distributed.md, "Faults in a multi-process run").
"""
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.test_multihost import _env, _flags, _free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = int(os.environ.get("LRA_FAULT_STEPS", "40"))
EXTRA = ("--config.checkpoint_freq=2", "--config.eval_frequency=8")


def _start(workdir, flags):
    port = _free_port()
    return [subprocess.Popen(
        [sys.executable, os.path.join(REPO, "launch.py"), f"--workdir={workdir}", *flags,
         f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
         f"--process_id={pid}", "--heartbeat_timeout=10"],
        cwd=REPO, env=_env(2), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for pid in range(2)]


def _finish(procs, timeout=300):
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout))
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate())
    return [p.returncode for p in procs], outs


def _children(pid):
    """The pids of `pid`'s child processes (the supervised worker of a launch.py)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def landing(workdir, steps) -> str:
    """Where a fault landed, from what it left in `workdir` (see the module docstring)."""
    if os.path.exists(os.path.join(workdir, "results.json")):
        return "after the end"
    saved, partial = [], False
    for kind in ("last", "best"):
        folder = os.path.join(workdir, "checkpoints", kind)
        for name in os.listdir(folder) if os.path.isdir(folder) else ():
            if name.isdigit():
                saved.append(int(name))
            elif "tmp" in name:
                partial = True
    if partial:
        return "mid-save"
    if not saved:
        log = os.path.join(workdir, "log.txt")  # process 0's console (lra.launch tees it)
        started = os.path.exists(log) and "\nTraining " in open(log, errors="replace").read()
        return ("before the first checkpoint (training)" if started else
                "before the first checkpoint (starting: connecting, compiling)")
    return "after the end" if max(saved) >= steps else "between saves"


def _numbers(results):
    return {k: results[k] for k in ("eval_history", "best_step", "test_accuracy",
                                    "test_loss")} | {
        "losses": [h["loss"] for h in results["train_history"]]}


@pytest.mark.slow
def test_random_faults_leave_the_same_run(listops_dir, tmp_path):
    trials = int(os.environ.get("LRA_FAULT_TRIALS", "20"))
    rng = random.Random(int(os.environ.get("LRA_FAULT_SEED", "0")))
    flags = _flags(listops_dir, STEPS, *EXTRA)
    began = time.time()
    codes, ok = _finish(_start(tmp_path / "reference", flags))
    took = time.time() - began
    assert codes == [0, 0], ok[0][1][-2000:]
    reference = _numbers(json.load(open(tmp_path / "reference" / "results.json")))
    seen, restarts, aborts, bad_advice = collections.Counter(), [], 0, []
    landed = collections.Counter()
    print(f"uninterrupted run: {STEPS} steps in {took:.1f} s", flush=True)
    for trial in range(trials):
        workdir = tmp_path / f"trial{trial}"
        victims = rng.choice([[0], [1], [0, 1]])
        sig = rng.choice([signal.SIGKILL, signal.SIGTERM, signal.SIGINT, "child SIGKILL"])
        # From before the processes connect to the end of the uninterrupted run's time
        # (40 steps: about 20 s on 2 CPU cores, its first 8 connecting and compiling).
        delay = rng.uniform(1.0, max(18.0, took))
        procs = _start(workdir, flags)
        time.sleep(delay)
        # Where it lands: the workdir at the fault's moment (after it, a SIGTERM or SIGINT
        # has saved: that is the handling, not the moment).
        where = landing(workdir, STEPS)
        landed[where] += 1
        for v in victims:
            if procs[v].poll() is None:
                if sig == "child SIGKILL":
                    for child in _children(procs[v].pid):
                        os.kill(child, signal.SIGKILL)
                else:
                    procs[v].send_signal(sig)
        codes, outs = _finish(procs)
        first = codes
        seen.update(codes)
        aborts += codes.count(-6)
        bad_advice += [trial for _, err in outs if "delete" in err and "to start" in err]
        runs = 1
        while not os.path.exists(workdir / "results.json"):  # the same command again
            assert runs < 5, f"trial {trial}: not finished after {runs} runs: {outs}"
            codes, outs = _finish(_start(workdir, flags))
            runs += 1
            bad_advice += [trial for _, err in outs if "delete" in err and "to start" in err]
        restarts.append(runs - 1)
        got = _numbers(json.load(open(workdir / "results.json")))
        same = got == reference or (
            got["eval_history"] == reference["eval_history"]
            and np.allclose(got["losses"], reference["losses"], rtol=1e-6))
        print(f"trial {trial}: {getattr(sig, 'name', sig)} to {victims} after {delay:.1f} s "
              f"({where}): exit {first}; {runs - 1} restart(s); "
              f"{'same as uninterrupted' if same else 'DIFFERENT'}", flush=True)
        assert same, f"trial {trial}: {got} != {reference}"
        shutil.rmtree(workdir)
    print(f"{trials} trials: exit codes {dict(seen)}, restarts {collections.Counter(restarts)}"
          f", SIGABRT survivors {aborts}, 'delete' advice {len(bad_advice)}; landed "
          f"{dict(landed)}")
    assert not bad_advice, f"trials {bad_advice} advised deleting checkpoints"
    assert aborts == 0, f"{aborts} survivors aborted (SIGABRT) instead of exit 3"
    assert set(seen) <= {0, 2, 3, 130, 143, -9, -15}, seen


def test_landing_reads_the_workdir(tmp_path):
    assert landing(tmp_path, 40).startswith("before the first checkpoint (starting")
    (tmp_path / "log.txt").write_text("==== ...\nTraining transformer on listops: ...\n")
    assert landing(tmp_path, 40) == "before the first checkpoint (training)"
    last = tmp_path / "checkpoints" / "last"
    (last / "4").mkdir(parents=True)
    assert landing(tmp_path, 40) == "between saves"
    (last / "6.orbax-checkpoint-tmp-1733").mkdir()
    assert landing(tmp_path, 40) == "mid-save"
    (last / "6.orbax-checkpoint-tmp-1733").rmdir()
    (last / "40").mkdir()
    assert landing(tmp_path, 40) == "after the end"
    (last / "40").rmdir()
    (tmp_path / "results.json").write_text("{}")
    assert landing(tmp_path, 40) == "after the end"

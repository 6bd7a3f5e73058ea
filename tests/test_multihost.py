"""Multi-process runs on this machine: 2 processes x 2 CPU devices over gloo, coordinator on
127.0.0.1, against 1-process runs; FSDP and head parallelism against data parallelism; a
process that dies mid-run."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests import tiers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RTOL = 1e-4  # the gradient all-reduce sums in another order on other meshes


def _flags(data_dir, steps, *extra):
    return ["--config=configs/listops.py:runlocal", f"--config.data_dir={data_dir}",
            "--config.max_length=32", "--config.emb_dim=16", "--config.qkv_dim=16",
            "--config.mlp_dim=32", "--config.num_layers=1", "--config.num_heads=2",
            f"--config.num_train_steps={steps}", "--config.eval_frequency=3",
            "--config.checkpoint_freq=3", "--config.log_every_steps=1", *extra]


def _env(devices):
    return dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu",
                XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "
                          f"--xla_force_host_platform_device_count={devices}")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(workdir, flags, *, devices, processes=1, port=None):
    cmd = [sys.executable, os.path.join(REPO, "launch.py"), f"--workdir={workdir}", *flags]
    procs = []
    for pid in range(processes):
        dist = ([f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={processes}",
                 f"--process_id={pid}", "--heartbeat_timeout=10"] if processes > 1 else [])
        procs.append(subprocess.Popen(cmd + dist, cwd=REPO, env=_env(devices), text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return procs


def _run(workdir, flags, *, devices, processes=1, timeout=400):
    procs = _start(workdir, flags, devices=devices, processes=processes, port=_free_port())
    outs = [p.communicate(timeout=timeout) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"exit {p.returncode}\n{out}\n{err[-3000:]}"
    return json.load(open(os.path.join(workdir, "results.json"))), outs


def _losses(results, steps=None):
    history = {h["step"]: h["loss"] for h in results["train_history"]}
    return np.array([history[s] for s in (steps or sorted(history))])


def test_two_processes_match_one_process_and_resume(listops_dir, tmp_path):
    one, _ = _run(tmp_path / "one", _flags(listops_dir, 8), devices=1)
    four, _ = _run(tmp_path / "four", _flags(listops_dir, 6), devices=4)
    two, outs = _run(tmp_path / "two", _flags(listops_dir, 6), devices=2, processes=2)
    assert (two["num_processes"], two["num_devices"]) == (2, 4)
    assert (four["num_processes"], four["num_devices"]) == (1, 4)
    first6 = list(range(1, 7))
    np.testing.assert_allclose(_losses(four), _losses(one, first6), rtol=RTOL)
    np.testing.assert_allclose(_losses(two), _losses(one, first6), rtol=RTOL)
    np.testing.assert_allclose([h["accuracy"] for h in two["eval_history"]],
                               [h["accuracy"] for h in one["eval_history"][:2]])
    # Only process 0 prints progress and the results table.
    assert "step      6/6" in outs[0][0] and "step" not in outs[1][0]

    # The same 2-process command, 2 more steps: it resumes from its own checkpoint and
    # continues exactly as the uninterrupted 1-device run.
    resumed, outs = _run(tmp_path / "two", _flags(listops_dir, 8), devices=2, processes=2)
    assert "Resumed from" in outs[0][0] and "at step 6" in outs[0][0]
    np.testing.assert_allclose(_losses(resumed, [7, 8]), _losses(one, [7, 8]), rtol=RTOL)
    assert resumed["best_eval_accuracy"] == pytest.approx(one["best_eval_accuracy"])


@tiers.EXHAUSTIVE  # a long process test whose path the first test covers (tests/tiers.py)
def test_fsdp_and_head_parallel_match_data_parallel(listops_dir, tmp_path):
    data, _ = _run(tmp_path / "data", _flags(listops_dir, 4), devices=4)
    fsdp, _ = _run(tmp_path / "fsdp", _flags(listops_dir, 4, "--config.sharding=fsdp"),
                   devices=2, processes=2)
    heads, _ = _run(tmp_path / "heads",
                    _flags(listops_dir, 4, "--config.sharding=heads",
                           "--config.mesh_shape=(2,2)"), devices=4)
    assert heads["mesh_shape"] == {"data": 2, "model": 2}
    np.testing.assert_allclose(_losses(fsdp), _losses(data), rtol=RTOL)
    np.testing.assert_allclose(_losses(heads), _losses(data), rtol=RTOL)
    # Data parallel: every device holds all parameters. FSDP over 4 devices: each holds
    # its quarter of every `embed`-named dimension, plus the few unnamed-dim parameters
    # (classifier logits, LayerNorm-free leftovers) that stay whole.
    assert data["param_bytes_per_device"] == data["param_bytes"]
    assert fsdp["param_bytes_per_device"] < 0.45 * fsdp["param_bytes"]
    assert heads["param_bytes_per_device"] < data["param_bytes"]


@pytest.mark.slow  # ~25 s; per-shard kernels are also checked in tests/kernels (default)
def test_pallas_attention_with_dropout_is_the_same_on_any_mesh(listops_dir, tmp_path):
    """The Pallas kernels run per shard (shard_map) under data x head parallelism, and
    their hashed attention-dropout mask uses global batch and head indices, so training
    follows the one-device run."""
    flags = _flags(listops_dir, 3, "--config.model=local", "--config.attention_impl=pallas",
                   "--config.dropout_rate=0", "--config.attention_dropout_rate=0.2")
    one, _ = _run(tmp_path / "one", flags, devices=1)
    heads, _ = _run(tmp_path / "heads", flags + ["--config.sharding=heads",
                                                 "--config.mesh_shape=(2,2)"], devices=4)
    assert heads["mesh_shape"] == {"data": 2, "model": 2}
    np.testing.assert_allclose(_losses(heads), _losses(one), rtol=RTOL)
    no_dropout, _ = _run(tmp_path / "plain", flags + ["--config.attention_dropout_rate=0"],
                         devices=1)
    assert not np.allclose(_losses(no_dropout)[1:], _losses(one)[1:], rtol=RTOL)


@tiers.EXHAUSTIVE  # a long process test whose path the first test covers (tests/tiers.py)
def test_dead_process_stops_the_others_and_run_resumes(listops_dir, tmp_path):
    workdir = tmp_path / "run"
    flags = _flags(listops_dir, 400, "--config.checkpoint_freq=2",
                   "--config.eval_frequency=1000")
    procs = _start(workdir, flags, devices=2, processes=2, port=_free_port())
    try:
        # Wait until process 0 has trained a few steps (checkpoints every 2), then kill 1.
        seen = ""
        deadline = time.time() + 300
        while "step      6/" not in seen:
            line = procs[0].stdout.readline()
            assert line or procs[0].poll() is None, procs[0].stderr.read()[-3000:]
            assert time.time() < deadline, "process 0 made no progress"
            seen += line
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.time()
        _, err = procs[0].communicate(timeout=120)
        stopped_after = time.time() - killed_at
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert procs[0].returncode == 3, err[-3000:]
    assert "another process probably died" in err
    assert "the last complete checkpoint is step" in err
    assert stopped_after < 60  # bounded: a failed collective or the 10 s heartbeat
    last = sorted(int(d) for d in os.listdir(workdir / "checkpoints" / "last")
                  if d.isdigit())[-1]
    assert last >= 4  # step 6 may have been mid-save: then 4 is the intact one

    # The same command resumes from that checkpoint and finishes.
    resumed, outs = _run(workdir, _flags(listops_dir, last + 2, "--config.checkpoint_freq=2",
                                         "--config.eval_frequency=1000"),
                         devices=2, processes=2)
    assert f"at step {last}" in outs[0][0]
    assert resumed["steps"] == last + 2 and np.isfinite(resumed["test_loss"])


def _read_until(proc, needle, deadline):
    seen = ""
    while needle not in seen:
        line = proc.stdout.readline()
        assert line or proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.time() < deadline, f"no {needle!r} in time:\n{seen[-2000:]}"
        seen += line
    return seen


# ~45 s; the fault-injection trials (slow) send SIGTERM to one or both processes at random
# moments and compare with an uninterrupted run; tests/test_train.py covers one process.
@pytest.mark.slow
def test_sigterm_to_processes_at_different_moments_saves_one_step_and_resumes(
        listops_dir, tmp_path):
    """Process 1 is preempted first, process 0 a moment later: both agree on one step
    (jax's preemption sync point), save it together, exit 143; the same commands
    resume and follow the uninterrupted run."""
    workdir = tmp_path / "run"
    extra = ("--config.checkpoint_freq=1000", "--config.eval_frequency=1000")
    procs = _start(workdir, _flags(listops_dir, 100000, *extra), devices=2, processes=2,
                   port=_free_port())
    try:
        _read_until(procs[0], "step      5/", time.time() + 300)
        procs[1].send_signal(signal.SIGTERM)
        time.sleep(0.5)
        procs[0].send_signal(signal.SIGTERM)
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [143, 143], [o[1][-2000:] for o in outs]
    saved = sorted(int(d) for d in os.listdir(workdir / "checkpoints" / "last") if d.isdigit())
    assert len(saved) == 1 and saved[0] >= 5, saved
    step = saved[0]
    assert f"SIGTERM: saved step {step}" in outs[0][0]

    # The same commands (2 more steps) resume from that step and follow a run that was
    # never interrupted.
    resumed, outs = _run(workdir, _flags(listops_dir, step + 2, *extra), devices=2,
                         processes=2)
    assert f"at step {step}" in outs[0][0]
    straight, _ = _run(tmp_path / "straight", _flags(listops_dir, step + 2, *extra),
                       devices=4)
    np.testing.assert_allclose(_losses(resumed, [step + 1, step + 2]),
                               _losses(straight, [step + 1, step + 2]), rtol=RTOL)
    assert resumed["best_eval_accuracy"] == pytest.approx(straight["best_eval_accuracy"])
    assert resumed["test_accuracy"] == pytest.approx(straight["test_accuracy"])


def test_one_of_two_processes_says_what_it_waits_for(listops_dir, tmp_path):
    cmd = [sys.executable, os.path.join(REPO, "launch.py"), f"--workdir={tmp_path / 'w'}",
           *_flags(listops_dir, 4), f"--coordinator_address=127.0.0.1:{_free_port()}",
           "--num_processes=2", "--process_id=0"]  # process 1 is never started
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(1), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        import select

        ready, _, _ = select.select([proc.stderr], [], [], 60)
        assert ready, "process 0 said nothing for 60 s"
        line = proc.stderr.readline()  # the first thing it says is why it waits
        time.sleep(3)
        assert proc.poll() is None  # still waiting for process 1
    finally:
        proc.kill()
        proc.communicate()
    assert "process 0 of 2: connecting to the coordinator at 127.0.0.1:" in line
    assert "waiting until every process has started (up to 5 minutes)" in line


def test_a_failure_in_a_multi_process_run_is_one_line_and_exit_3(tmp_path):
    """gloo raises plain ValueErrors when a peer dies during a checkpoint save (orbax's
    barriers and array writes): docs/distributed.md's one-line error and exit code 3, whatever
    the exception type."""
    script = (
        "import sys, jax\n"
        "from lra import launch\n"
        "from absl import flags\n"
        "from lra import train\n"
        f"flags.FLAGS(['launch.py', '--config=configs/listops.py:runlocal', "
        f"'--workdir={tmp_path}'])\n"
        "jax.process_count = lambda: 2\n"
        "def save_fails(*args):\n"
        "    raise ValueError('Gloo AllGather failed: Connection closed by peer')\n"
        "train.train_and_evaluate = save_fails\n"
        "launch.main(['launch.py'])\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=_env(1),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and "ValueError: Gloo AllGather failed" in lines[0]
    assert "another process probably died" in lines[0]


@pytest.mark.slow  # ~40 s; pretraining resume (1 process) and 2-process resume are default
def test_pretraining_two_processes_resume_exactly_after_sigkill(listops_dir, tmp_path):
    """Self-pretraining (masked tokens drawn in the step from the step number) on two
    processes: both SIGKILLed mid-run, the same commands resume from the last checkpoint
    and follow the run that was never interrupted, step for step."""
    def flags(steps):
        return ["--config=configs/listops.py:runlocal,pretrain", *_flags(listops_dir, steps)[1:],
                "--config.checkpoint_freq=2", "--config.eval_frequency=1000"]

    workdir = tmp_path / "run"
    procs = _start(workdir, flags(400), devices=2, processes=2, port=_free_port())
    try:
        _read_until(procs[0], "step      7/", time.time() + 300)
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.communicate(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    last = sorted(int(d) for d in os.listdir(workdir / "checkpoints" / "last")
                  if d.isdigit())[-1]
    assert last >= 4
    resumed, outs = _run(workdir, flags(last + 3), devices=2, processes=2)
    assert f"at step {last}" in outs[0][0]
    straight, _ = _run(tmp_path / "straight", flags(last + 3), devices=4)
    assert resumed["objective"] == straight["objective"] == "mlm"
    after = [last + 1, last + 2, last + 3]
    np.testing.assert_allclose(_losses(resumed, after), _losses(straight, after), rtol=RTOL)
    assert resumed["test_loss"] == pytest.approx(straight["test_loss"], rel=RTOL)
    assert resumed["test_accuracy"] == pytest.approx(straight["test_accuracy"])


@tiers.EXHAUSTIVE  # a long process test whose path the first test covers (tests/tiers.py)
def test_processes_given_different_settings_or_data_all_stop_in_one_line(
        listops_dir, tmp_path):
    """Issue 35: one process given another learning rate (or another data set at the same
    path) trained a mix and exited 0 recording process 0's settings. Now every process
    exits 2 with one line naming what differs and which process had which."""
    import shutil

    def run_pair(extra, cwds):
        port = _free_port()
        procs = []
        for pid in range(2):
            cmd = [sys.executable, os.path.join(REPO, "launch.py"),
                   f"--workdir={tmp_path / 'w'}",
                   *[f.replace("configs/", f"{REPO}/configs/") for f in _flags("data", 4)],
                   *extra[pid], f"--coordinator_address=127.0.0.1:{port}",
                   "--num_processes=2", f"--process_id={pid}", "--heartbeat_timeout=10"]
            procs.append(subprocess.Popen(cmd, cwd=cwds[pid], env=_env(1), text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        outs = [p.communicate(timeout=300) for p in procs]
        for p, (_, err) in zip(procs, outs):
            assert p.returncode == 2, err[-3000:]
            assert "Traceback" not in err
        return [[l for l in err.splitlines() if l.startswith("error:")] for _, err in outs]

    # Each process runs in its own folder, where `data` is a ListOps set: the same set...
    for name in ("a", "b"):
        os.makedirs(tmp_path / name)
        shutil.copytree(listops_dir, tmp_path / name / "data")
    cwds = [str(tmp_path / "a"), str(tmp_path / "b")]
    lines = run_pair([[], ["--config.learning_rate=0.01"]], cwds)
    for (line,) in lines:
        assert ("the config differs between the processes of this run: learning_rate "
                "(process 0: 0.05, process 1: 0.01)") in line
    # ... then another set at the same relative path: the config agrees, the data not.
    test_file = tmp_path / "b" / "data" / "basic_test.tsv"
    rows = test_file.read_text().splitlines()
    test_file.write_text("\n".join(rows[:1] + rows[2:]) + "\n")  # one example fewer
    lines = run_pair([[], []], cwds)
    for (line,) in lines:
        assert "the data read from config.data_dir=data differs between the processes" in line
        assert "test split (hash)" in line and "train split" not in line


def test_processes_given_different_workdirs_stop_in_one_line_before_training(
        listops_dir, tmp_path):
    """Issue 46, item 1: processes of one run given different --workdirs (a local disk per
    host) both blocked in the first checkpoint save for orbax's 600 s, ignoring SIGTERM;
    process 1 wrote checkpoints without the lock. Now every process exits 2 with one line
    before any training step."""
    port = _free_port()
    procs = []
    for pid in range(2):
        cmd = [sys.executable, os.path.join(REPO, "launch.py"),
               f"--workdir={tmp_path / f'host{pid}'}", *_flags(listops_dir, 4),
               f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
               f"--process_id={pid}", "--heartbeat_timeout=10"]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=_env(1), text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    start = time.time()
    outs = [p.communicate(timeout=300) for p in procs]
    assert time.time() - start < 120
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 2, err[-3000:]
        assert "Traceback" not in err and "step" not in out, (out, err)
        (line,) = [l for l in err.splitlines() if l.startswith("error:")]
        assert ("the workdir is not one folder that every process sees: process 1 cannot "
                "read the file process 0 wrote") in line, line
        # Process 0's folder on every process (issue 74 probe 7: process 1 gave its own).
        assert f"({tmp_path / 'host0'} on process 0" in line, line
    assert f"this process was given {tmp_path / 'host1'}" in outs[1][1]
    assert not os.path.exists(tmp_path / "host1" / "checkpoints")
    assert not os.path.exists(tmp_path / "host0" / "run.lock")


# ~25 s a case, slow: test_a_taken_process_id_stops_the_run_in_one_line_per_process and
# test_dead_process_stops_the_others_and_run_resumes check the survivor's exit 3 by default,
# and the fault-injection trials (slow) kill peers at random moments, restores included.
@pytest.mark.slow
@pytest.mark.parametrize("delay", [2.0, 4.0])
def test_a_peer_dying_during_a_resume_is_not_called_a_bad_checkpoint(listops_dir, tmp_path,
                                                                    delay):
    """Issue 35: a peer killed 2-6 s after connecting, while the survivor restored, was
    reported as 'cannot restore any checkpoint ... delete .../checkpoints'. The checkpoints
    were fine. Now: never that advice, and the checkpoints are all kept."""
    workdir = tmp_path / "run"
    _run(workdir, _flags(listops_dir, 6), devices=2, processes=2)
    last = workdir / "checkpoints" / "last"
    before = sorted(d for d in os.listdir(last) if d.isdigit())
    procs = _start(workdir, _flags(listops_dir, 40), devices=2, processes=2,
                   port=_free_port())
    try:
        deadline = time.time() + 120
        seen = ""
        while "all processes connected" not in seen:
            line = procs[1].stderr.readline()
            assert line or procs[1].poll() is None
            assert time.time() < deadline
            seen += line
        time.sleep(delay)
        procs[1].send_signal(signal.SIGKILL)
        out, err = procs[0].communicate(timeout=180)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert "cannot restore any checkpoint" not in err and "delete" not in err, err[-2000:]
    assert procs[0].returncode == 3, err[-2000:]  # not jaxlib's abort (-6): issue 35 item 7
    assert "Check failure stack trace" not in err and "Fatal Python error" not in err
    assert set(before) <= set(d for d in os.listdir(last) if d.isdigit())


@tiers.EXHAUSTIVE  # a long process test whose path the first test covers (tests/tiers.py)
def test_a_taken_process_id_stops_the_run_in_one_line_per_process(listops_dir, tmp_path):
    """Issue 35 item 9: a second process given --process_id=1 made jaxlib abort (134, stack
    dumps) processes 0 and 1. Now each says so in one line and exits 3; process 0 (the
    coordinator, whose log names the task) says which --process_id was given twice."""
    port, dup = _free_port(), []
    procs = _start(tmp_path / "run", _flags(listops_dir, 400), devices=1, processes=2,
                   port=port)
    try:
        _read_until(procs[0], "step ", time.time() + 120)
        dup = [subprocess.Popen(
            [sys.executable, os.path.join(REPO, "launch.py"), f"--workdir={tmp_path / 'dup'}",
             *_flags(listops_dir, 400), f"--coordinator_address=127.0.0.1:{port}",
             "--num_processes=2", "--process_id=1", "--heartbeat_timeout=10"],
            cwd=REPO, env=_env(1), text=True, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)]
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs + dup:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 3, err[-2000:]
        assert "Check failure stack trace" not in err and "Fatal Python error" not in err
    errors = [[l for l in err.splitlines() if l.startswith("error:")] for _, err in outs]
    assert len(errors[0]) == len(errors[1]) == 1, errors
    assert "process 1 connected a second time" in errors[0][0]
    assert "--process_id=1" in errors[0][0]
    assert "another process probably died" in errors[1][0]


def test_a_second_process_0_stops_at_once_and_names_the_duplicate(listops_dir, tmp_path):
    """Issue 46 item 6: the same process 0 command run twice started a second coordinator on
    the shared port and both waited 5 minutes, neither naming the duplicate. Now the second
    stops before connecting, in one line, exit 2; the first keeps waiting for process 1."""
    port = _free_port()
    cmd = [sys.executable, os.path.join(REPO, "launch.py"), *_flags(listops_dir, 4),
           f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", "--process_id=0"]
    first = subprocess.Popen(cmd + [f"--workdir={tmp_path / 'a'}"], cwd=REPO, env=_env(1),
                             text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 90
        while not _listening(port):  # its coordination service is up
            assert first.poll() is None and time.time() < deadline, "process 0 did not start"
            time.sleep(0.5)
        start = time.time()
        second = subprocess.run(cmd + [f"--workdir={tmp_path / 'b'}"], cwd=REPO, env=_env(1),
                                text=True, capture_output=True, timeout=120)
        took = time.time() - start
        assert first.poll() is None  # the first still waits for its process 1
    finally:
        first.kill()
        first.communicate()
    assert second.returncode == 2 and took < 60, (second.returncode, took, second.stderr)
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    # The coordinator's port lock (issue 74) speaks before the port check.
    assert lines[0].startswith(f"error: process 0 of 2: another process 0 with a "
                               f"coordinator on port {port} is running on this host")
    assert "--process_id=0" in lines[0]


def _listening(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_port_taken_sees_a_listener_not_a_closed_port():
    from lra import launch

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.listen()
        assert launch._port_taken(port)
    assert not launch._port_taken(port)


def test_a_process_never_registered_is_named_so():
    """jaxlib's abort when RegisterTask runs out of time (a duplicate --process_id whose
    arrival stopped the run, or no process 0): the status follows the fatal line (the text
    below is jax 0.10.2's, from a duplicate process 1); it said 'another process probably
    died'."""
    from lra.training import supervisor

    log = ("process 1 of 2: connecting to the coordinator at 127.0.0.1:1234 and waiting ...\n"
           "F1128 03:24:59.244230   22583 client.h:80] Terminating process because the JAX "
           "distributed service detected fatal errors. This most likely indicates that "
           "another task died; see the other task logs for more details. absl::Status: "
           "DEADLINE_EXCEEDED: Deadline Exceeded\n\n"
           "RPC: /xla.coordination.CoordinationService/RegisterTask\n"
           "*** Check failure stack trace: ***\n")
    line = supervisor.abort_message("process 1 of 2", log, None)
    assert line.startswith("error: process 1 of 2 stopped: it could not join the run")
    assert "another process already has this --process_id" in line
    assert "probably died" not in line
    # A peer that died (no RegisterTask) keeps its message.
    died = log.replace("RegisterTask", "PollForError").replace("DEADLINE_EXCEEDED", "UNAVAILABLE")
    assert "another process probably died" in supervisor.abort_message("p", died, None)


def _until_one_exits(procs, limit):
    """Waits until one of `procs` has exited (None after `limit` seconds)."""
    deadline = time.time() + limit
    while time.time() < deadline:
        for p in procs:
            if p.poll() is not None:
                return p
        time.sleep(0.2)
    return None


@pytest.mark.parametrize("same_workdir", [True, False])
def test_two_process_0s_started_together_one_stops_at_once(tmp_path, same_workdir):
    """Issue 74 probe 3: two process 0s started at the same moment both passed the port
    check and hung 4 minutes without a line. Now one of them holds the coordinator's port
    lock (and the workdir's process 0 lock): the other stops in one line, exit 2, in
    seconds; the first goes on waiting for its process 1."""
    port = _free_port()
    cmd = [sys.executable, os.path.join(REPO, "launch.py"), *_flags(tmp_path / "data", 4),
           f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", "--process_id=0"]
    procs = [subprocess.Popen(
        cmd + [f"--workdir={tmp_path / ('w' if same_workdir else f'w{i}')}"], cwd=REPO,
        env=_env(1), text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for i in range(2)]
    try:
        stopped = _until_one_exits(procs, 60)
        assert stopped is not None, "neither process 0 stopped"
        time.sleep(1)
        waiting = [p for p in procs if p is not stopped]
        assert waiting[0].poll() is None  # the first still waits for its process 1
    finally:
        for p in procs:
            p.kill()
    err = stopped.communicate()[1]
    lines = err.strip().splitlines()
    assert stopped.returncode == 2 and len(lines) == 1, (stopped.returncode, err)
    assert lines[0].startswith("error: process 0 of 2: another process") and (
        "--process_id=0" in lines[0]), lines


def test_a_duplicate_process_id_on_the_same_workdir_stops_at_once(tmp_path):
    """Issue 74 probe 3: a second process given a --process_id that a waiting (or running)
    process holds waited out the 5-minute connect timeout. Now it stops in one line, exit
    2, in seconds, before connecting (the run it would have joined is left alone)."""
    port = _free_port()  # nobody listens: process 1 waits for its coordinator
    cmd = [sys.executable, os.path.join(REPO, "launch.py"), *_flags(tmp_path / "data", 4),
           f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", "--process_id=1",
           f"--workdir={tmp_path / 'w'}"]
    first = subprocess.Popen(cmd, cwd=REPO, env=_env(1), text=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        lock = tmp_path / "w" / ".process_1.lock"
        deadline = time.time() + 60
        while not lock.exists():  # the first holds it
            assert first.poll() is None and time.time() < deadline, "process 1 did not start"
            time.sleep(0.2)
        start = time.time()
        second = subprocess.run(cmd, cwd=REPO, env=_env(1), text=True, capture_output=True,
                                timeout=120)
        took = time.time() - start
        assert first.poll() is None
    finally:
        first.kill()
        first.communicate()
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 2 and took < 30 and len(lines) == 1, (took, second.stderr)
    assert lines[0].startswith("error: process 1 of 2: another process with "
                               "--process_id=1 is running on --workdir="), lines


def test_an_unrecognised_abort_does_not_promise_process_0_names_a_duplicate():
    """Issue 74 probe 7: the line said "process 0's log names it" after a duplicate process
    0, whose log names nothing (the coordinator names duplicates of process 1 and up)."""
    from lra.training import supervisor

    line = supervisor.abort_message("process 0 of 2", "F1128 fatal: UNAVAILABLE\n", None)
    assert "process 0's log names it" not in line
    assert "not one of process 0" in line and "another process probably died" in line

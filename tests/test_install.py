"""Installed as a library (issue 74, section 1): after a plain `pip install .` (not
editable) the commands run from any directory, find the task configs, and write their runs
there; in a checkout nothing changes (lra/runs/cli.py).

The fresh-venv test builds the wheel, installs it (no dependencies: the venv sees this
environment's packages through a .pth file, so nothing is downloaded but the build
backend) and runs lra.sweep, lra.report, lra-launch and `python -m lra.train` from a folder
outside the checkout. It is slow-marked (about a minute):

  python -m pytest -m slow tests/test_install.py
"""
import os
import subprocess
import sys
import sysconfig

import pytest

from lra.runs import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_in_the_checkout_runs_run_in_the_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.checkout() == REPO and cli.run_root() == REPO
    assert cli.CONFIGS_DIR == os.path.join(REPO, "configs")


def test_config_paths_are_found_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    listops = os.path.join(REPO, "configs", "listops.py")
    assert cli.config_file("configs/listops.py") == listops
    assert cli.config_file("./configs/listops.py") == listops
    argv = ["x", "--config=configs/mqar.py:mini,model=gla", "--config.seq_len=64",
            "-config", "configs/text.py", "--workdir=w", "--", "--config=configs/no.py"]
    assert cli.with_config_paths(argv) == [
        "x", f"--config={REPO}/configs/mqar.py:mini,model=gla", "--config.seq_len=64",
        "-config", f"{REPO}/configs/text.py", "--workdir=w", "--", "--config=configs/no.py"]
    # A file of that path here is the one meant.
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "listops.py").write_text("")
    assert cli.config_file("configs/listops.py") == "configs/listops.py"


def test_a_config_file_that_exists_nowhere_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.config_file(str(tmp_path / "nope.py"))
    assert e.value.code == cli.EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err and "listops" in err
    assert "hybrid" not in cli.task_names() and "mqar" in cli.task_names()


def test_relative_config_paths_outside_the_checkout_and_a_bad_one(tmp_path):
    """Probe finding 2 of issue 74: `lra.ngram --config=configs/enwik8.py:...` from another
    folder gave an OSError traceback; a config that is nowhere is one line, exit 2."""
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = subprocess.run([sys.executable, "-m", "lra.ngram", "--config=configs/nope.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: --config=configs/nope.py: no such file")
    proc = subprocess.run([sys.executable, "-m", "lra.ngram",
                           "--config=configs/listops.py:runlocal"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    # Found: the refusal is about the config's objective, not its path.
    assert proc.returncode == 2 and "lra.ngram scores next-token" in proc.stderr, proc.stderr


def _run(cmd, cwd, timeout=300):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, (cmd, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


@pytest.mark.slow
def test_a_plain_install_runs_sweep_report_and_launch_outside_the_checkout(tmp_path):
    wheels = tmp_path / "wheel"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), REPO],
         cwd=tmp_path)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    python = str(venv / "bin" / "python")
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                cwd=tmp_path).stdout.strip()
    with open(os.path.join(site, "deps.pth"), "w") as f:  # this environment's packages
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    wheel = next(wheels.glob("*.whl"))
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
          str(wheel)], cwd=tmp_path)
    user = tmp_path / "user"
    user.mkdir()
    where = _run([python, "-c", "import lra, configs; print(lra.__file__, configs.__file__)"],
                 cwd=user).stdout
    assert REPO not in where and site in where

    proc = _run([python, "-m", "lra.sweep", "--task=mqar", "--models=transformer",
                 "--config_arg=runlocal", "--seeds=0", "--override=num_train_steps=2",
                 "--sweep_dir=sw"], cwd=user)
    assert "1 run, 0 skipped, 0 failed" in proc.stdout, proc.stdout
    runs = list((user / "sw" / "mqar" / "transformer").glob("seed0*/results.json"))
    assert len(runs) == 1
    proc = _run([python, "-m", "lra.report", "sw", "--out=rep"], cwd=user)
    assert "| transformer |" in proc.stdout and (user / "rep").is_dir()
    assert "Unable to initialize backend" not in proc.stderr

    proc = _run([str(venv / "bin" / "lra-launch"), "--config=configs/mqar.py:runlocal",
                 "--config.num_train_steps=2", "--workdir=w1"], cwd=user)
    assert (user / "w1" / "results.json").exists()
    assert "mqar" in (user / "w1" / "log.txt").read_text()
    _run([python, "-m", "lra.train", "--config=configs/mqar.py:runlocal",
          "--config.num_train_steps=2", "--workdir=w2"], cwd=user)
    assert (user / "w2" / "results.json").exists()


@pytest.mark.parametrize("args, says", [
    (["lra.report", "{tmp}"], "no results.json"),
    (["lra.synthetic_report", "{tmp}"], "no MQAR, MAD or length-extrapolation run"),
    (["lra.download", "nosuchtask", "--data_dir={tmp}"], ""),
    (["lra.sweep", "--task=mqar", "--models=transformer", "--bogus_flag=1"], "Unknown"),
])
def test_every_command_refuses_an_input_with_exit_2(tmp_path, args, says):
    """Issue 74 probe 8: a refused input was exit 1 from some commands (lra.download,
    lra.report, lra.synthetic_report, absl's flag errors) and 2 from others: now 2 and one
    `error:` line everywhere (docs/running.md, "Exit codes")."""
    cmd = [sys.executable, "-m", *[a.format(tmp=tmp_path) for a in args]]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert lines[-1].startswith("error: ") and says in lines[-1], lines
    assert "Traceback" not in proc.stderr

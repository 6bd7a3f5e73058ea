"""lra.sweep and lra.report without training, for the sweep tests: plan.command replaced
by a tiny python process (fake_launch) and results.json files written by hand
(write_run); a module run as a program (cli) and its one-line error (one_line_error)."""
import json
import os
import subprocess
import sys

from lra.runs import plan

SWEEP = dict(task="listops", config_arg="runlocal", models=["transformer"])


def fake_launch(monkeypatch, calls, stderr_lines=(), exit_code=0):
    """plan.command -> a tiny python process (no training): prints `stderr_lines`, exits
    with `exit_code`, and on success writes a results.json with the expected config."""
    def command(task, model, seed, config_arg, workdir, overrides):
        calls.append(workdir)
        config = plan.expected_config(task, model, seed, config_arg, overrides)
        script = ("import json, sys\n"
                  f"for line in {list(stderr_lines)!r}: print(line, file=sys.stderr)\n"
                  f"if {exit_code}: sys.exit({exit_code})\n"
                  f"json.dump({{'config': {config!r}}}, open({workdir!r} + '/results.json', 'w'))\n")
        return [sys.executable, "-c", script]
    monkeypatch.setattr(plan, "command", command)


def write_run(root, folder, seed, acc, config):
    d = os.path.join(root, "listops", folder, f"seed{seed}")
    os.makedirs(d)
    with open(os.path.join(d, "results.json"), "w") as f:
        json.dump({"task": "listops", "model": config["model"], "test_accuracy": acc,
                   "majority_baseline_accuracy": 0.17,
                   "config": dict(config, random_seed=seed)}, f)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(module, *args, cwd):
    """`python -m <module> <args>` from `cwd`, this checkout importable."""
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": REPO})


def one_line_error(proc, *needles):
    """The process failed with one `error: ...` line holding every needle, no traceback."""
    assert proc.returncode not in (0, None), proc
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]

r"""Run many variants (and seeds) of one task into one directory.

  python -m lra.sweep --task=listops --models=all --config_arg=mini --seeds=0,1 \
      --sweep_dir=workdirs/sweep_listops_mini [--override=num_train_steps=500 ...]

Each run is `launch.py --config=configs/<task>.py:model=<m>,<config_arg>
--config.random_seed=<s> --workdir=<sweep_dir>/<task>/<model>/seed<s>` in its own process
(a crash or an out-of-memory in one variant does not stop the sweep). Finished runs
(results.json present) are skipped; unfinished ones resume from their last checkpoint.
A failed run leaves `error.txt` in its workdir and is retried by the next sweep.
Then: `python -m lra.report <sweep_dir>`.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLAGS = flags.FLAGS


def _define_flags() -> None:
    # Defined only when run as a program, so importing this module (tests, notebooks,
    # other tools) never claims global absl flag names.
    flags.DEFINE_string("task", "listops", "Task config: configs/<task>.py.")
    flags.DEFINE_list("models", ["all"], "Registry names, or 'all'.")
    flags.DEFINE_string("config_arg", "", "Extra config arguments, e.g. 'mini' or 'runlocal'.")
    flags.DEFINE_list("seeds", ["0"], "Random seeds (config.random_seed).")
    flags.DEFINE_string("sweep_dir", None, "Directory that receives every run.")
    flags.DEFINE_multi_string("override", [], "Config overrides field=value, for every run.")
    flags.DEFINE_integer("timeout", 0, "Seconds per run before it is stopped (0 = none).")


def run_dir(sweep_dir: str, task: str, model: str, seed: int) -> str:
    return os.path.join(sweep_dir, task, model, f"seed{seed}")


def command(task: str, model: str, seed: int, config_arg: str, workdir: str,
            overrides: list[str]) -> list[str]:
    arg = ",".join(filter(None, [f"model={model}", config_arg]))
    return [sys.executable, os.path.join(REPO, "launch.py"),
            f"--config={os.path.join(REPO, 'configs', task + '.py')}:{arg}",
            f"--config.random_seed={seed}", f"--workdir={workdir}",
            *[f"--config.{o}" for o in overrides]]


def sweep(*, task: str, models: list[str], seeds: list[int], config_arg: str, sweep_dir: str,
          overrides: list[str], timeout: int = 0, log=print) -> dict[str, list]:
    """Runs what is not finished; returns {'done': [...], 'skipped': [...], 'failed': [...]}."""
    runs = [(m, s) for m in models for s in seeds]
    outcome = {"done": [], "skipped": [], "failed": []}
    for n, (model, seed) in enumerate(runs, 1):
        workdir = run_dir(sweep_dir, task, model, seed)
        tag = f"[{n}/{len(runs)}] {task} {model} seed {seed}"
        if os.path.exists(os.path.join(workdir, "results.json")):
            outcome["skipped"].append((model, seed))
            log(f"{tag}: finished earlier, skipped")
            continue
        os.makedirs(workdir, exist_ok=True)
        start = time.time()
        log(f"{tag}: running ...")
        with open(os.path.join(workdir, "log.txt"), "a") as out:
            try:
                proc = subprocess.run(
                    command(task, model, seed, config_arg, workdir, overrides), cwd=REPO,
                    stdout=out, stderr=subprocess.PIPE, text=True, timeout=timeout or None)
                error = proc.stderr.strip().splitlines()[-1:] if proc.returncode else None
            except subprocess.TimeoutExpired:
                error = [f"stopped after {timeout} s (--timeout)"]
        error_file = os.path.join(workdir, "error.txt")
        if error is not None:
            with open(error_file, "w") as f:
                f.write((error[0] if error else "failed") + "\n")
            outcome["failed"].append((model, seed))
            log(f"{tag}: FAILED after {time.time() - start:.0f} s: {error[0] if error else ''}")
        else:
            if os.path.exists(error_file):
                os.remove(error_file)
            outcome["done"].append((model, seed))
            log(f"{tag}: done in {time.time() - start:.0f} s")
    return outcome


def main(argv):
    del argv
    if not FLAGS.sweep_dir:
        raise app.UsageError("--sweep_dir is required")
    from models import registry

    models = registry.available() if FLAGS.models == ["all"] else FLAGS.models
    unknown = [m for m in models if m not in registry.available()]
    if unknown:
        raise app.UsageError(f"unknown models {unknown}; available: "
                             f"{', '.join(registry.available())}")
    outcome = sweep(task=FLAGS.task, models=models, seeds=[int(s) for s in FLAGS.seeds],
                    config_arg=FLAGS.config_arg, sweep_dir=FLAGS.sweep_dir,
                    overrides=FLAGS.override, timeout=FLAGS.timeout)
    print(f"{len(outcome['done'])} run, {len(outcome['skipped'])} skipped, "
          f"{len(outcome['failed'])} failed: {outcome['failed'] or ''}")
    print(f"Report: python -m lra.report {FLAGS.sweep_dir}")
    sys.exit(1 if outcome["failed"] else 0)


if __name__ == "__main__":
    _define_flags()
    app.run(main)

r"""Train and evaluate one model on one task (the same command as `python -m lra.launch`,
whose docstring says more).

  python launch.py --config=configs/listops.py:model=transformer,runlocal \
      --workdir=workdirs/listops_runlocal

Any config field can be overridden: `--config.learning_rate=0.01`. Re-running the same
command with the same workdir resumes from the last checkpoint.
"""
from lra.launch import run

if __name__ == "__main__":
    run()

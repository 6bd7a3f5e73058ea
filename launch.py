r"""Train and evaluate one model on one LRA task.

  python launch.py --config=configs/listops.py:model=transformer,runlocal \
      --workdir=workdirs/listops_runlocal

Any config field can be overridden: `--config.learning_rate=0.01`. Re-running the same
command with the same workdir resumes from the last checkpoint.
"""
import sys

from absl import app, flags, logging
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/listops.py:runlocal.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and results.json.")
flags.mark_flags_as_required(["config", "workdir"])


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with config mistakes reported in one line instead of a traceback."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        message = str(e)
    except (AttributeError, KeyError) as e:  # --config.<field> that the config lacks
        field = str(e).strip("'\"")
        message = (f"unknown config field {field!r}; the fields are those of "
                   f"configs/common.py:base_config and the task config")
    except Exception as e:  # noqa: BLE001  (get_config errors, bad override values)
        message = f"{type(e).__name__}: {e}" if type(e).__name__ != "ConfigError" else str(e)
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not flags.FLAGS["verbosity"].present:
        # orbax logs every save/restore at INFO; the progress lines are what users read.
        logging.set_verbosity(logging.WARNING)
    from lra import train  # after flag parsing, so --help is fast
    from lra.errors import UserError
    from models.registry import RegistryError

    try:
        train.train_and_evaluate(flags.FLAGS.config, flags.FLAGS.workdir)
    except (UserError, RegistryError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except train.Preempted:
        sys.exit(143)  # 128 + SIGTERM, so schedulers see a preempted job


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)

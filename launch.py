r"""Train and evaluate one model on one LRA task.

  python launch.py --config=configs/listops.py:model=transformer,runlocal \
      --workdir=workdirs/listops_runlocal

Any config field can be overridden: `--config.learning_rate=0.01`. Re-running the same
command with the same workdir resumes from the last checkpoint.

Multi-host (a TPU pod, several GPU hosts): every process runs the same command plus
`--multihost` (coordinator found automatically on TPU pods, SLURM, Open MPI, ...) or the
explicit `--coordinator_address=host:port --num_processes=N --process_id=i`. The workdir
must be on storage every process sees; only process 0 logs and writes results.json.
"""
import argparse
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/listops.py:runlocal.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and results.json.")
flags.mark_flags_as_required(["config", "workdir"])
flags.DEFINE_bool("multihost", False, "Start JAX's distributed runtime, detecting the cluster "
                  "(TPU pod, SLURM, Open MPI, ...) automatically.")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0's coordinator "
                    "(implies --multihost).")
flags.DEFINE_integer("num_processes", None, "Number of processes (with --coordinator_address).")
flags.DEFINE_integer("process_id", None, "This process's index, 0..num_processes-1.")
flags.DEFINE_integer("heartbeat_timeout", 100, "Seconds without a heartbeat after which the "
                     "other processes treat a process as dead and stop.")

_DISTRIBUTED_FLAGS = ("multihost", "coordinator_address", "num_processes", "process_id",
                      "heartbeat_timeout")


def init_distributed(argv: list[str]) -> None:
    """Starts jax.distributed before anything touches a device.

    Read from argv ahead of absl's parsing because parsing --config builds the config,
    and nothing JAX does may precede jax.distributed.initialize.
    """
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--multihost", nargs="?", const="true", default="false")
    parser.add_argument("--nomultihost", dest="multihost", action="store_const", const="false")
    parser.add_argument("--coordinator_address")
    parser.add_argument("--num_processes", type=int)
    parser.add_argument("--process_id", type=int)
    parser.add_argument("--heartbeat_timeout", type=int, default=100)
    args, _ = parser.parse_known_args(argv[1:])
    explicit = (args.coordinator_address, args.num_processes, args.process_id)
    if not (args.multihost.lower() in ("true", "1") or any(v is not None for v in explicit)):
        return
    if any(v is not None for v in explicit) and any(v is None for v in explicit):
        print("error: --coordinator_address, --num_processes and --process_id go together "
              "(or use --multihost alone for automatic detection)", file=sys.stderr)
        sys.exit(2)
    import jax

    try:
        jax.distributed.initialize(
            coordinator_address=args.coordinator_address, num_processes=args.num_processes,
            process_id=args.process_id, heartbeat_timeout_seconds=args.heartbeat_timeout)
    except (RuntimeError, ValueError) as e:
        print(f"error: cannot start the distributed runtime: {e}", file=sys.stderr)
        sys.exit(2)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with config mistakes reported in one line instead of a traceback."""
    init_distributed(argv)
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
    except Exception as e:  # noqa: BLE001
        import jax

        if jax.process_count() == 1 or not isinstance(e, jax.errors.JaxRuntimeError):
            raise
        _lost_peer(e, flags.FLAGS.workdir)


def _lost_peer(error: Exception, workdir: str) -> None:
    """A collective failed in a multi-process run: almost always another process died."""
    import jax

    last = os.path.join(os.path.abspath(workdir), "checkpoints", "last")
    steps = sorted(int(d) for d in (os.listdir(last) if os.path.isdir(last) else ())
                   if d.isdigit())
    where = (f"the last complete checkpoint is step {steps[-1]} in {last}" if steps
             else "no checkpoint was completed")
    first_line = str(error).strip().splitlines()[0][:300]
    print(f"error: process {jax.process_index()} of {jax.process_count()} stopped: a "
          f"collective with the other processes failed ({first_line}); another process "
          f"probably died, see its log. {where}; run the same command on every process to "
          f"resume.", file=sys.stderr, flush=True)
    sys.stdout.flush()
    # Skip interpreter exit: jax.distributed's shutdown barrier would wait for the dead
    # process and then abort with a core dump.
    os._exit(3)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)

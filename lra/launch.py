r"""Train and evaluate one model on one task: `python -m lra.launch` (or `python launch.py`
in a checkout, the same command; `lra-launch` once the package is installed).

  python -m lra.launch --config=configs/listops.py:model=transformer,runlocal \
      --workdir=workdirs/listops_runlocal

Any config field can be overridden: `--config.learning_rate=0.01`. Re-running the same
command with the same workdir resumes from the last checkpoint. `configs/<task>.py` is
found from any directory (lra/runs/cli.py: a file of that path here, else the installed
task config). What the run prints is also appended to `<workdir>/log.txt`.

Multi-host (a TPU pod, several GPU hosts): every process runs the same command plus
`--multihost` (coordinator found automatically on TPU pods, SLURM, Open MPI, ...) or the
explicit `--coordinator_address=host:port --num_processes=N --process_id=i`. The workdir
must be on storage every process sees; only process 0 logs and writes results.json.
"""
import argparse
import os
import shlex
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from lra.runs import cli, hparams
from lra.training import supervisor

config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/listops.py:runlocal.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and results.json.")
flags.DEFINE_list("import", [], "Modules of your own that register variants, imported "
                  "(from this folder or PYTHONPATH) before the config is read.")
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

# Exit codes (docs/running.md, "Resuming, preemption, divergence"): 0 done; 1 a bug (traceback);
# 2 a user error (one line: config, data, workdir, checkpoints, divergence); 3 another
# process of a multi-process run died; 75 the workdir is in use by another run
# (EX_TEMPFAIL); 143 preempted by SIGTERM after saving (128 + 15); 130 the same after
# Ctrl-C (SIGINT, 128 + 2).
EXIT_USER_ERROR = cli.EXIT_USER_ERROR
EXIT_LOST_PEER = 3
EXIT_WORKDIR_BUSY = cli.EXIT_WORKDIR_BUSY
EXIT_PREEMPTED = 143
EXIT_INTERRUPTED = 130


def _distributed_args(argv: list[str]) -> argparse.Namespace | None:
    """The distributed flags in argv, or None when this is a 1-process run."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--multihost", nargs="?", const="true", default="false")
    parser.add_argument("--nomultihost", dest="multihost", action="store_const", const="false")
    parser.add_argument("--coordinator_address")
    parser.add_argument("--num_processes", type=int)
    parser.add_argument("--process_id", type=int)
    parser.add_argument("--heartbeat_timeout", type=int, default=100)
    parser.add_argument("--workdir")
    args, _ = parser.parse_known_args(argv[1:])
    explicit = (args.coordinator_address, args.num_processes, args.process_id)
    if not (args.multihost.lower() in ("true", "1") or any(v is not None for v in explicit)):
        return None
    return args


def supervise(argv: list[str]) -> None:
    """A multi-process run's work runs in a child process (lra/training/supervisor.py): jaxlib
    aborts a process whose peer died (SIGABRT, stack dumps); the parent turns that into
    one line and exit 3. Returns in the child and in 1-process runs."""
    args = _distributed_args(argv)
    if args is None or os.environ.get(supervisor.ENV):
        return
    who = (f"process {args.process_id} of {args.num_processes}"
           if args.process_id is not None else "this process")
    # The child is this command as a module, whichever way it was started (launch.py,
    # -m lra.launch, lra-launch), with the packages' folder on its path.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [cli.PACKAGES_ROOT, os.environ.get("PYTHONPATH")]))
    sys.exit(supervisor.run_child(["-m", "lra.launch", *argv[1:]], who, args.workdir))


def init_distributed(argv: list[str]) -> None:
    """Starts jax.distributed before anything touches a device.

    Read from argv ahead of absl's parsing because parsing --config builds the config,
    and nothing JAX does may precede jax.distributed.initialize.
    """
    args = _distributed_args(argv)
    if args is None:
        return
    explicit = (args.coordinator_address, args.num_processes, args.process_id)
    if any(v is not None for v in explicit) and any(v is None for v in explicit):
        print("error: --coordinator_address, --num_processes and --process_id go together "
              "(or use --multihost alone for automatic detection)", file=sys.stderr)
        sys.exit(2)
    if args.coordinator_address is not None:
        bad = _bad_address(args.coordinator_address)
        if bad:
            print(f"error: --coordinator_address={args.coordinator_address}: {bad}",
                  file=sys.stderr)
            sys.exit(2)
    if args.process_id is not None:
        _hold_process_locks(args)
    if args.process_id == 0 and args.coordinator_address is not None:
        port = int(args.coordinator_address.rpartition(":")[2])
        if _port_taken(port):
            # A second process 0 (the same command run twice) used to start a second
            # coordinator on the port (gRPC shares it), and both waited 5 minutes.
            print(f"error: process 0 of {args.num_processes}: port {port} is already in use "
                  "on this host: another process 0 of this run is running (two processes "
                  "given --process_id=0?) or another program holds the port; give each "
                  f"process its own --process_id (0 to {args.num_processes - 1}), or choose "
                  "another port", file=sys.stderr)
            sys.exit(EXIT_USER_ERROR)
    import jax

    if "JAX_ENABLE_PREEMPTION_SERVICE" not in os.environ:
        # The coordination service's preemption sync point (all processes agree on the
        # step at which to save after a SIGTERM); on by default in jax 0.10, asked for
        # explicitly in case a later version turns it off.
        try:
            jax.config.update("jax_enable_preemption_service", True)
        except (AttributeError, KeyError, ValueError):
            pass
    who = (f"process {args.process_id} of {args.num_processes}"
           if args.process_id is not None else "this process")
    where = (f"the coordinator at {args.coordinator_address}" if args.coordinator_address
             else "the coordinator (found from the cluster's environment)")
    print(f"{who}: connecting to {where} and waiting until every process has started "
          f"(up to 5 minutes)...", file=sys.stderr, flush=True)
    try:
        jax.distributed.initialize(
            coordinator_address=args.coordinator_address, num_processes=args.num_processes,
            process_id=args.process_id, heartbeat_timeout_seconds=args.heartbeat_timeout)
    except (RuntimeError, ValueError) as e:
        first = (str(e).strip().splitlines() or [""])[0][:300]
        print(f"error: cannot start the distributed runtime: {first}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    print(f"process {jax.process_index()} of {jax.process_count()}: all processes connected.",
          file=sys.stderr, flush=True)


# Lock files held for the life of a process of a multi-process run (_hold_process_locks).
_LOCKS: list = []


def _hold_process_locks(args: argparse.Namespace) -> None:
    """Refuses, in one line and within a second, a second process with a --process_id that
    a running process of the run holds: an flock on `<workdir>/.process_<id>.lock` (the
    workdir every process shares) and, for process 0, on a lock file of the coordinator's
    port on this host. Before them a duplicate waited out the 5-minute connect timeout
    (a duplicate process 1 also stopped the run it joined), and two process 0s started
    together both passed the port check and hung. The locks go with the process, however
    it ends; the files stay (empty)."""
    import fcntl
    import tempfile

    who = f"process {args.process_id} of {args.num_processes}"
    paths = []
    if args.workdir:
        paths.append((os.path.join(os.path.abspath(args.workdir),
                                   f".process_{args.process_id}.lock"),
                      f"another process with --process_id={args.process_id} is running on "
                      f"--workdir={args.workdir}"))
    if args.process_id == 0 and args.coordinator_address is not None:
        port = args.coordinator_address.rpartition(":")[2]
        paths.append((os.path.join(tempfile.gettempdir(), f"lra-coordinator-{port}.lock"),
                      f"another process 0 with a coordinator on port {port} is running on "
                      "this host"))
    for path, holder in paths:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            handle = open(path, "a")
        except OSError:
            continue  # an unwritable workdir is reported by the run itself
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            cli.refuse(f"{who}: {holder} (two processes given --process_id="
                       f"{args.process_id}?); give each process its own --process_id (0 to "
                       f"{args.num_processes - 1}), or wait for the other run to end")
        _LOCKS.append(handle)


def _port_taken(port: int) -> bool:
    """True when a program on this host listens on `port` (process 0's coordination
    service binds it on every interface). SO_REUSEADDR: an earlier run's connections left
    in TIME_WAIT do not count, a listener does."""
    import errno
    import socket

    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this host
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    return True
    return False


def _bad_address(address: str) -> str | None:
    """Why `address` is not host:port (a traceback from jaxlib before), or None."""
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        return "give host:port, e.g. 10.0.0.1:1234 (process 0's host, any free port)"
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"port {port!r} is not a port number (1 to 65535)"
    return None


def _flag(arg: str) -> tuple[str | None, str | None]:
    """(name, inline value or None) of a flag in any spelling absl accepts: `--name=v`,
    `-name=v`, `--name`, `-name`; (None, None) for anything else."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return None, None
    name, eq, value = arg[2 if arg.startswith("--") else 1:].partition("=")
    return name, value if eq else None


def _flags_end(argv: list[str]) -> int:
    """Index of absl's `--` terminator (arguments after it are not flags), or len(argv)."""
    return argv.index("--") if "--" in argv else len(argv)


def _config_arg_index(argv: list[str]) -> tuple[int, bool] | None:
    """Where `--config=<file>[:<args>]` (or `--config <file>`, one dash or two) is."""
    for i, a in enumerate(argv[:_flags_end(argv)]):
        name, value = _flag(a)
        if name == "config":
            if value is not None:
                return i, True
            if i + 1 < len(argv):
                return i + 1, False
    return None


def fold_model_override(argv: list[str]) -> list[str]:
    """`--config.model=X` means `--config=<file>:model=X`: a task config builds the model's
    presets (model_hparams, block) from the model it is given, so overriding the name
    after it would build X with another variant's settings. Every spelling absl accepts
    (`-config.model=X`, `--config.model X`, ...) is folded."""
    model, rest, i, end = None, [], 0, _flags_end(argv)
    while i < len(argv):
        a = argv[i]
        name, value = _flag(a) if i < end else (None, None)
        if name == "config.model" and value is not None:
            model = value
        elif name == "config.model" and i + 1 < len(argv):
            model, i = argv[i + 1], i + 1
        else:
            rest.append(a)
        i += 1
    if model is None:
        return argv
    found = _config_arg_index(rest)
    if found is None:
        return argv  # absl reports the missing --config
    index, inline = found
    value = _flag(rest[index])[1] if inline else rest[index]
    path, colon, config_args = value.partition(":")
    items = [s for s in config_args.split(",") if s]
    given = [s.partition("=")[2] for s in items if s.partition("=")[0].strip() == "model"]
    if given and given[-1] != model:
        from lra.errors import ConfigError

        raise ConfigError(f"--config.model={model} contradicts model={given[-1]} in "
                         f"--config={value}; give the model once, as "
                         f"--config={path}:model={model}")
    items = [s for s in items if s.partition("=")[0].strip() != "model"] + [f"model={model}"]
    value = f"{path}:{','.join(items)}"
    rest[index] = f"--config={value}" if inline else value
    return rest


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with config mistakes reported in one line instead of a traceback."""
    init_distributed(argv)
    # Before the config builds their presets; LRA_IMPORTS' modules too, so that one that
    # cannot be imported is one line here, not a traceback inside the config's parse.
    cli.import_variants(cli.imported_modules(), given="LRA_IMPORTS names")
    cli.import_variants(cli.import_flag(argv))
    try:
        argv = cli.with_config_paths(fold_model_override(argv))
        argv, new_hparams = hparams.split(argv)
        # ml_collections reads a config's overrides from sys.argv when the flag is parsed:
        # the ones split off must not be there then (the log's command line keeps them).
        given, sys.argv = sys.argv, argv
        try:
            argv = flags.FLAGS(argv)
        finally:
            sys.argv = given
        hparams.apply(flags.FLAGS.config, new_hparams)
        return argv
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
        cli.refuse(f"unexpected arguments: {' '.join(argv[1:])}")
    if not flags.FLAGS["verbosity"].present:
        # orbax logs every save/restore at INFO; the progress lines are what users read.
        logging.set_verbosity(logging.WARNING)
    from lra import train  # after flag parsing, so --help is fast
    from lra.errors import UserError, WorkdirBusy
    from lra.training import console
    from models.registry import RegistryError

    train.interrupt_as_preemption()  # Ctrl-C saves and stops as SIGTERM does
    command = shlex.join(["python", "-m", "lra.launch", *sys.argv[1:]])
    console.tee_to_log(flags.FLAGS.workdir, command)
    try:
        train.train_and_evaluate(flags.FLAGS.config, flags.FLAGS.workdir)
    except WorkdirBusy as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_WORKDIR_BUSY)
    except (UserError, RegistryError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    except train.Preempted:
        # 128 + SIGTERM, so schedulers see a preempted job; 128 + SIGINT after Ctrl-C.
        sys.exit(EXIT_INTERRUPTED if train.interrupted() else EXIT_PREEMPTED)
    except Exception as e:  # noqa: BLE001
        import jax

        if jax.process_count() > 1:
            # A collective, a barrier or a checkpoint write failed (gloo's ValueError, a
            # JaxRuntimeError, ...): almost always another process died.
            logging.info("the exception, for debugging", exc_info=True)
            _lost_peer(e, flags.FLAGS.workdir)
        if isinstance(e, OSError):  # the file system: full, read-only, gone
            print(f"error: {e}", file=sys.stderr)
            sys.exit(EXIT_USER_ERROR)
        raise


def _lost_peer(error: Exception, workdir: str) -> None:
    """A collective failed in a multi-process run: almost always another process died."""
    import jax

    from lra.training.supervisor import last_checkpoint

    where = last_checkpoint(workdir)
    first_line = (str(error).strip().splitlines() or [""])[0][:300]
    if not isinstance(error, jax.errors.JaxRuntimeError):
        first_line = f"{type(error).__name__}: {first_line}"
    print(f"error: process {jax.process_index()} of {jax.process_count()} stopped: a "
          f"collective with the other processes failed ({first_line}); another process "
          f"probably died, see its log (--verbosity=0 prints this one's traceback). "
          f"{where}; run the same command on every process to resume.",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    # Skip interpreter exit: jax.distributed's shutdown barrier would wait for the dead
    # process and then abort with a core dump. (train_and_evaluate has already
    # released the workdir lock on the way out.)
    os._exit(EXIT_LOST_PEER)


def run() -> None:
    """The command: `python -m lra.launch`, `python launch.py`, `lra-launch`; run again
    with glibc's malloc on huge pages where it is not (cli.exec_with_huge_pages)."""
    cli.exec_with_huge_pages("lra.launch")
    supervise(sys.argv)
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()

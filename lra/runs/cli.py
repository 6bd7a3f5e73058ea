"""What every command (`python -m lra.<command>`) shares: where it runs from, how a
`--config=configs/<task>.py` path is found outside the checkout, the exit code of a refused
input, and the quiet logging users read.

Where runs run (run_root): in a checkout (`launch.py` beside the packages, `pip install
-e .` or none) the repository, as always: relative data folders (`data/<task>`) and
workdirs are the checkout's. After a plain `pip install .` the packages live in
site-packages, which is nobody's project folder: runs then run in the current directory,
and `data/<task>` is the one under it.

Task configs (config_file): `--config=configs/listops.py:mini` names a file. Where no such
file is under the current directory, `configs/<name>.py` is the installed package's task
config (the `configs` package is installed with `lra` and `models`), so the README's
commands work from any directory. A config file that exists nowhere is refused in one line.

Variants of the user's own (import_variants): `--import=<module>[,<module>]` on lra.launch and
lra.sweep imports the user's modules, from the current directory or PYTHONPATH, before the
config is read (a task config builds the model's presets from the registry), and exports
them (LRA_IMPORTS, PYTHONPATH) to the processes the command starts; a sweep's runs get the
flag too. LRA_IMPORTS=<module>[,...] alone makes every command's registry import them
(models/registry.py). docs/variants.md#adding-a-variant.

Exit codes (docs/running.md, "Exit codes"): 0 done; 1 a bug (a traceback) or, for
lra.sweep, a run that failed; 2 a refused input (one line, `error: ...`, from every
command: a bad flag, a config, data, a workdir).
"""
from __future__ import annotations

import os
import sys
from typing import NoReturn, Sequence

EXIT_USER_ERROR = 2
# launch.py's exit code when another live run holds the workdir's lock (lra.sweep leaves
# that run to the process running it).
EXIT_WORKDIR_BUSY = 75

# The folder holding the packages lra, models and configs: the checkout, or site-packages.
PACKAGES_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS_DIR = os.path.join(PACKAGES_ROOT, "configs")


# glibc's malloc (2.35 and later) asks for transparent huge pages for its heap and its
# mmapped chunks. XLA on CPU allocates and frees its large temporary buffers every step;
# with 4 KiB pages each new buffer is page-faulted in and zeroed again, a third of a run's
# CPU time in the kernel on the lab's machine. With this tunable niah's training steps
# ran 1.3-1.7x faster (results/cpu/malloc_huge_pages.md); results are unchanged (memory
# placement only). Older glibc, non-glibc systems and THP set to never ignore it.
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"
TUNABLES_VARIABLE = "GLIBC_TUNABLES"


def _hugetlb(env: dict) -> str | None:
    """The glibc.malloc.hugetlb value GLIBC_TUNABLES sets in `env` (the last counts), or
    None where it sets none."""
    value = None
    for item in env.get(TUNABLES_VARIABLE, "").split(":"):
        name, _, setting = item.partition("=")
        if name == "glibc.malloc.hugetlb":
            value = setting
    return value


def with_huge_pages(env: dict) -> dict:
    """`env` with HUGE_PAGES_TUNABLE added to GLIBC_TUNABLES, unless the user chose a
    glibc.malloc.hugetlb value there already (kept, e.g. =0 to turn this off)."""
    tunables = env.get(TUNABLES_VARIABLE, "")
    if _hugetlb(env) is not None:
        return env
    env[TUNABLES_VARIABLE] = ":".join(filter(None, [tunables, HUGE_PAGES_TUNABLE]))
    return env


def malloc_pages(env: dict) -> str | None:
    """The pages glibc's malloc gives a process started with `env`: 'huge pages' where
    GLIBC_TUNABLES sets glibc.malloc.hugetlb to 1 or 2 (the last setting counts), else the
    machine's base page ('4 KiB pages'); None off Linux. results.json records it
    (host_malloc) beside its steps/s, lra.benchmark names it in its header, and
    lra.sweep --status times a run by the finished runs made under the pages it will get."""
    if not sys.platform.startswith("linux"):
        return None
    if _hugetlb(env) in ("1", "2"):
        return "huge pages"
    return f"{os.sysconf('SC_PAGE_SIZE') // 1024} KiB pages"


def exec_with_huge_pages(module: str) -> None:
    """On Linux, when GLIBC_TUNABLES does not choose glibc.malloc.hugetlb, runs this
    command again as `python -m <module> <argv>` in this process (exec: same pid, nothing
    printed yet) with `with_huge_pages`' environment: glibc reads its tunables only when
    a process starts. Returns where there is nothing to do or exec fails."""
    env = with_huge_pages(dict(os.environ))
    if not sys.platform.startswith("linux") or env == dict(os.environ):
        return
    # As a module, whichever way it was started (a script, -m, a console script).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGES_ROOT, env.get("PYTHONPATH")]))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], env)
    except OSError:  # not fatal: the run goes on with 4 KiB pages
        return


def checkout() -> str | None:
    """The repository checkout the packages are imported from (launch.py beside them),
    or None for a plain `pip install .`."""
    return PACKAGES_ROOT if os.path.isfile(os.path.join(PACKAGES_ROOT, "launch.py")) else None


def run_root() -> str:
    """The folder runs run in and relative paths (data_dir, workdirs) are taken from: the
    checkout, else the current directory (see the module docstring)."""
    return checkout() or os.getcwd()


def config_file(path: str) -> str:
    """`path` if it is a file (relative to the current directory, as given), else the
    installed task config it names (`configs/<name>.py`, `./configs/<name>.py`); refuses a
    path that is neither in one line (exit 2)."""
    if os.path.isfile(path):
        return path
    norm = os.path.normpath(path)
    head, sep, rest = norm.partition(os.sep)
    if head == "configs" and sep and os.path.isfile(os.path.join(CONFIGS_DIR, rest)):
        return os.path.join(CONFIGS_DIR, rest)
    refuse(f"--config={path}: no such file here ({os.getcwd()}) nor among the task configs "
           f"(configs/<task>.py: {', '.join(task_names())})")


# Modules of configs/ that are not a task's config (what the task configs build on).
_NOT_TASKS = ("__init__", "common", "hybrid", "presets", "recipes", "scaffold")


def task_names() -> list[str]:
    """The tasks that have a config, configs/<task>.py."""
    return sorted(f[:-3] for f in os.listdir(CONFIGS_DIR)
                  if f.endswith(".py") and f[:-3] not in _NOT_TASKS)


def with_config_paths(argv: list[str], flag: str = "config") -> list[str]:
    """argv with each `--<flag>=<file>[:<args>]` (or `--<flag> <file>...`, one dash or
    two, before absl's `--`) pointing at the file config_file finds. Dotted overrides
    (`--config.learning_rate=...`) are left alone."""
    out, i = list(argv), 1
    end = out.index("--") if "--" in out else len(out)
    while i < end:
        arg = out[i]
        for prefix in (f"--{flag}=", f"-{flag}="):
            if arg.startswith(prefix):
                out[i] = prefix + _with_file(arg[len(prefix):])
                break
        else:
            if arg in (f"--{flag}", f"-{flag}") and i + 1 < end:
                out[i + 1] = _with_file(out[i + 1])
                i += 1
        i += 1
    return out


def _with_file(value: str) -> str:
    path, colon, args = value.partition(":")
    return config_file(path) + colon + args


IMPORTS_ENV = "LRA_IMPORTS"  # models/registry.py reads it too


def import_flag(argv: list[str]) -> list[str]:
    """The modules of every `--import=a,b` (or `--import a,b`, one dash or two, repeatable)
    in argv before absl's `--`."""
    names, i, end = [], 1, (argv.index("--") if "--" in argv else len(argv))
    while i < end:
        arg = argv[i]
        for prefix in ("--import=", "-import="):
            if arg.startswith(prefix):
                names += arg[len(prefix):].split(",")
                break
        else:
            if arg in ("--import", "-import") and i + 1 < end:
                names += argv[i + 1].split(",")
                i += 1
        i += 1
    return [n.strip() for n in names if n.strip()]


def imported_modules() -> list[str]:
    """The user's modules this process imported (import_variants) or was given in
    LRA_IMPORTS: what a command forwards to the runs it starts."""
    return [m for m in os.environ.get(IMPORTS_ENV, "").split(",") if m.strip()]


def import_variants(modules: Sequence[str], given: str = "--import") -> None:
    """Imports the user's modules, whose `@registry.register(...)` adds their variants,
    with the current directory on the path (as `python -m` has it); exports them in
    LRA_IMPORTS and the directory in PYTHONPATH, so that child processes (a sweep's runs,
    which run in the checkout) import them as well. A module that is not found, or that
    registers what the registry refuses, is refused in one line naming how it was
    `given` (`--import`, or LRA_IMPORTS); any other error in it is the user's code's (a
    traceback)."""
    if not modules:
        return
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [here, os.environ.get("PYTHONPATH")]))
    os.environ[IMPORTS_ENV] = ",".join(dict.fromkeys([*imported_modules(), *modules]))
    from models import registry  # flax: only when a user's module is imported

    for name in modules:
        try:
            registry.import_user_module(name, given)
        except registry.RegistryError as e:  # not found, or a refused registration
            refuse(str(e) if str(e).startswith(f"{given} ") else f"{given} {name!r}: {e}")


def refuse(message: str) -> NoReturn:
    """A refused input: `error: <message>` on stderr and exit 2, the same from every
    command."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USER_ERROR)


def quiet_logs(argv: list[str] | None = None) -> None:
    """absl at WARNING unless --verbosity was given: jax's `Unable to initialize backend
    'tpu'` and matplotlib's font-manager lines are INFO records, not what a user reads.
    Called in a command's main, after absl has parsed the flags."""
    import logging as std_logging

    from absl import flags, logging

    given = any(a.startswith(("--verbosity", "-verbosity", "-v=", "--v="))
                for a in (argv if argv is not None else sys.argv)[1:])
    if flags.FLAGS.is_parsed() and flags.FLAGS["verbosity"].present:
        given = True
    if not given:
        logging.set_verbosity(logging.WARNING)
        std_logging.getLogger("matplotlib").setLevel(std_logging.WARNING)


def parse_flags_or_refuse(argv: list[str]) -> list[str]:
    """absl's flag parsing for app.run(flags_parser=...), a bad flag refused as every other
    input is (one line, exit 2; absl's own parser exits 1 with 'FATAL Flags parsing
    error'); `--config=configs/...` paths found as config_file finds them; then
    quiet_logs."""
    from absl import flags

    argv = with_config_paths(argv)
    try:
        rest = flags.FLAGS(argv)
    except flags.Error as e:
        refuse(str(e))
    except Exception as e:  # noqa: BLE001  (a config file's get_config raising)
        refuse(str(e) if type(e).__name__ == "ConfigError" else f"{type(e).__name__}: {e}")
    quiet_logs(argv)
    return rest

"""A sweep's runs, planned (lra.sweep runs them; lra.gpu's run stages plan theirs the same
way): which command gets a task's data and whether it is there (data_command,
missing_data), a run's folder (run_dir: `<sweep_dir>/<task>/<model>/seed<s>[-<hash>]`,
`-pretrain` / `-pretrained` for --pretrain's phases), its launch.py command line
(command), the config launch.py will build and results.json record (expected_config), and
why a finished run is not this sweep's run (config_differences, finished_differences);
which committed runs record counts one as finished (recorded_run).
The locality baseline's run (run_spec), a hybrid's folder (model_folder) and the split of
a self-pretraining run's steps (pretrain_plan) and the runs' environment (run_environment:
their compilation cache) too. See lra/sweep.py for the protocol."""
from __future__ import annotations

import hashlib
import json
import os
import sys

from lra.runs import cli, hparams

# Where the packages are (the checkout, or site-packages after `pip install .`): the task
# configs are imported from there; runs run in cli.run_root().
REPO = cli.PACKAGES_ROOT


# What fills each task's data folder (docs/tasks_and_data.md, "Getting the data"): LRA's
# archives for the tasks that have no generator, the generators for the others. A mini's
# folder gets the mini's own generator arguments (configs/<task>.py docstrings).
DOWNLOADED = ("text", "retrieval", "image", "mnist")
LISTOPS_MINI_ARGS = ("--num_train_samples=20000 --num_valid_samples=1000 "
                     "--num_test_samples=1000 --min_length=10 --max_length=60 --max_depth=4")


def data_command(task: str, data_dir: str, task_options: dict | None = None) -> str:
    """The command that puts `task`'s data into `data_dir` (as the config names it)."""
    options = task_options or {}
    if task in DOWNLOADED:
        parent, name = os.path.split(os.path.normpath(data_dir))
        if name == task:
            return f"python -m lra.download {task} --data_dir={parent or '.'}"
        return (f"python -m lra.download {task} --data_dir=DIR, then "
                f"--override=data_dir=DIR/{task}")
    if task == "listops":
        mini = os.path.basename(os.path.normpath(data_dir)) == "listops_mini"
        return (f"python -m lra.tasks.listops --output_dir={data_dir}"
                + (f" {LISTOPS_MINI_ARGS}" if mini else ""))
    if task in ("pathfinder", "pathx"):
        resolution = options.get("resolution", 32 if task == "pathfinder" else 128)
        difficulty = options.get("difficulty", "hard")
        size = ("--num_images=20000" if difficulty == "easy"
                else "--num_images=200000 --seed=0 --workers=2")
        return (f"python -m lra.tasks.pathfinder --output_dir={data_dir} "
                f"--resolution={resolution} --difficulty={difficulty} {size}")
    return f"put {task}'s data into {data_dir}"


def missing_data(task: str, config: dict) -> str | None:
    """None when `config`'s data folder holds `task`'s data (what the reader opens first:
    ListOps' and Retrieval's training file, Pathfinder's difficulty folder at the
    resolution, Text's and Image's unpacked archive or TFDS folder), else one line: the
    task is skipped, what is missing, and the command that gets it (data_command).
    Relative data_dirs are taken from where the runs run (cli.run_root: the checkout, or
    the current directory outside one)."""
    data_dir = str(config.get("data_dir", f"data/{task}"))
    options = config.get("task_options") or {}
    path = data_dir if os.path.isabs(data_dir) else os.path.join(cli.run_root(), data_dir)
    if task == "listops":
        need = os.path.join(path, f"{options.get('task_prefix', 'basic')}_train.tsv")
        present = os.path.isfile(need)
    elif task == "retrieval":
        need = os.path.join(path, "new_aan_pairs.train.tsv")
        present = os.path.isfile(need)
    elif task in ("pathfinder", "pathx"):
        from lra.tasks.pathfinder_generator import DIFFICULTIES

        folder = DIFFICULTIES.get(options.get("difficulty", "hard"), ("?",))[0]
        need = os.path.join(path, f"pathfinder{options.get('resolution', '?')}", folder)
        present = os.path.isdir(need)
    elif task in ("text", "image"):
        need = path
        present = os.path.isdir(path) and _archive_or_tfds(task, path)
    else:
        need = path
        present = os.path.isdir(path) and bool(os.listdir(path))
    if present:
        return None
    what = "" if need == path else f": {os.path.relpath(need, path)} not found"
    return (f"{task}: SKIPPED, no data in {data_dir}{what}; get it with: "
            f"{data_command(task, data_dir, options)}")


def _archive_or_tfds(task: str, path: str) -> bool:
    """Whether `path` holds what the text / image reader looks for: the unpacked archive
    (aclImdb/, cifar-10-batches-py/) or a TFDS folder of the dataset (one of another
    version counts: the run then says what is wrong with it)."""
    from lra.errors import DataError
    from lra.tasks import image, text, tfds_folders

    if (text.find_imdb_root(path) if task == "text" else image._find_root(path)):
        return True
    try:
        return tfds_folders.find(path, (text if task == "text" else image).TFDS, "") is not None
    except DataError:
        return True


def plan_tasks(tasks: list[str], model: str, seed: int, config_arg: str,
               overrides: list[str]) -> tuple[list[str], list[str]]:
    """(the tasks whose data is there, one skip line per task whose data is missing: see
    missing_data), from each task's config for `model` after `config_arg` and
    `overrides` (the data folder does not depend on the model or seed)."""
    ready, skipped = [], []
    for task in tasks:
        line = missing_data(task, expected_config(task, model, seed, config_arg, overrides))
        if line:
            skipped.append(line)
        else:
            ready.append(task)
    return ready, skipped


def normalized_overrides(overrides: list[str]) -> list[str]:
    """`field=value` strings as launch.py applies them: the last value of a field wins;
    sorted by field, so the order they were given in does not matter."""
    last = {}
    for o in overrides:
        field, _, value = o.strip().partition("=")
        last[field.strip()] = value
    return [f"{f}={v}" for f, v in sorted(last.items())]


def overrides_hash(overrides: list[str]) -> str:
    """8 hex digits naming a set of overrides ('' for none)."""
    norm = normalized_overrides(overrides)
    if not norm:
        return ""
    return hashlib.sha256(json.dumps(norm).encode()).hexdigest()[:8]


# --pretrain's two runs per model and seed: the folder suffix of each (beside the
# from-scratch run's `seed<s>[-<hash>]`), as hand-made runs use them too.
PRETRAIN, FINE_TUNE = "pretrain", "fine-tune"
PHASE_SUFFIX = {PRETRAIN: "-pretrain", FINE_TUNE: "-pretrained"}


def run_dir(sweep_dir: str, task: str, model: str, seed: int,
            overrides: list[str] = (), phase: str | None = None) -> str:
    """`<sweep_dir>/<task>/<model>/seed<seed>`, with `-<overrides_hash>` when overridden,
    and `-pretrain` / `-pretrained` for --pretrain's phases (PRETRAIN, FINE_TUNE)."""
    suffix = overrides_hash(list(overrides))
    name = f"seed{seed}" + (f"-{suffix}" if suffix else "") + PHASE_SUFFIX.get(phase, "")
    return os.path.join(sweep_dir, task, model, name)


# --locality_baseline's runs: a name among the models (outcomes, log lines) and the folder
# <sweep_dir>/<task>/locality_baseline/, whatever the baseline's mixer is on the task.
LOCALITY_BASELINE = "locality_baseline"
LOCALITY_ARG = "locality"


def run_spec(task: str, name: str, config_arg: str) -> tuple[str, str, str]:
    """(registry model, config argument, folder name) of the run the sweep calls `name`: a
    model is itself; LOCALITY_BASELINE is the task's locality baseline, i.e. its mixer
    (configs/common.py locality_model: `local`, or `local_2d` on pixels) with the config
    argument `locality` added, in the folder LOCALITY_BASELINE."""
    if name != LOCALITY_BASELINE:
        return name, config_arg, name
    if REPO not in sys.path:  # task configs import `configs.common`
        sys.path.insert(0, REPO)
    from configs import common

    return (common.locality_model(task), ",".join(filter(None, [config_arg, LOCALITY_ARG])),
            LOCALITY_BASELINE)


def model_folder(task: str, model: str, config_arg: str, overrides: list[str]) -> str:
    """The folder of a model's runs: its name, or where the config argument `hybrid=` or
    the --override's of config.hybrid / config.layers make a hybrid stack, the hybrid's
    name (configs/hybrid.py), e.g. `gla+transformer@1,3`."""
    if "hybrid=" not in config_arg and not any(
            o.startswith(("hybrid.", "layers=")) for o in overrides):
        return model
    from configs import hybrid

    return hybrid.name(expected_config(task, model, 0, config_arg, overrides))


def check_locality_args(config_arg: str, pretrain: bool, locality_baseline: bool) -> None:
    """ValueError (one line) for a sweep that would mix the locality baseline into other
    runs: `locality` in --config_arg (every model's runs would be the baseline, in the
    models' folders), or --locality_baseline with --pretrain (the baseline is a
    from-scratch run; the pretraining protocol is for the models)."""
    if LOCALITY_ARG in [a.strip().partition("=")[0] for a in config_arg.split(",")]:
        raise ValueError(f"--config_arg={config_arg}: `{LOCALITY_ARG}` makes every run the "
                         "locality baseline; use --locality_baseline, which adds its runs "
                         f"beside the models' (<task>/{LOCALITY_BASELINE}/)")
    if pretrain and locality_baseline:
        raise ValueError("--locality_baseline adds from-scratch runs; give it in the same "
                         "command without --pretrain")


def pretrain_plan(config: dict, pretrain_steps: int | None) -> tuple[int, int]:
    """(pretraining steps, fine-tuning steps) that add up to `config`'s num_train_steps
    (the from-scratch run's, after the overrides); default: half each. ValueError (one
    line) for a split that leaves a phase without steps, or one that a cosine_decay
    schedule cannot take; also for a config that is not a classifier's (the fine-tuning
    run's arguments are the sweep's, without `pretrain`)."""
    if config.get("objective", "classify") != "classify":
        raise ValueError(
            f"--pretrain with a config that pretrains already (objective="
            f"{config['objective']}); --pretrain adds the 'pretrain' argument to the "
            "pretraining runs itself: leave it out of --config_arg and --override")
    total = config["num_train_steps"]
    steps = total // 2 if pretrain_steps is None else pretrain_steps
    if not 0 < steps < total:
        raise ValueError(
            f"--pretrain_steps={steps} must be between 1 and {total - 1}: the pretraining "
            f"and fine-tuning runs share the config's num_train_steps={total} (a from-scratch "
            "run's steps); give fewer --pretrain_steps or --override=num_train_steps=<more>")
    parts = {"pretraining": steps, "fine-tuning": total - steps}
    warmup = config.get("warmup", 0)
    if "cosine_decay" in config.get("factors", ""):
        # Each run has its own schedule. With warmup >= its steps the loop's cosine phase
        # never starts (optim.learning_rate_schedule: the rate only ramps up, never reaching
        # its peak when warmup > steps, and never decays), unlike the from-scratch run's.
        short = [f"{name} run has {n}" for name, n in parts.items() if warmup >= n]
        if short:
            raise ValueError(
                f"config.warmup={warmup} is not below each run's steps (the "
                f"{' and the '.join(short)}), so its cosine_decay schedule would never "
                f"decay; give --override=warmup=<fewer than {min(parts.values())}> (applies "
                "to every run, from-scratch ones too), or other --pretrain_steps")
    return steps, total - steps


def config_flags_of(task: str, model: str, seed: int, config_arg: str,
                    overrides: list[str]) -> list[str]:
    """launch.py's --config flags for one run."""
    arg = ",".join(filter(None, [f"model={model}", config_arg]))
    return [f"--config={os.path.join(cli.CONFIGS_DIR, task + '.py')}:{arg}",
            f"--config.random_seed={seed}", *[f"--config.{o}" for o in overrides]]


# XLA's persistent compilation cache for a sweep's runs (JAX's own, keyed on the program,
# the compile options and flags, and the jax / jaxlib versions): a model's runs at other
# seeds compile the same train, validation and test programs, and a resumed run those of
# its first segment. Measured under JAX 0.12.1 on one core: a 4-step MAD mini of kda (or
# nsa) took 28 s (29 s) from an empty cache, 17 s (19 s) from a warm one. Per run that is
# 1-3% of a 10-30 minute mini; more where a run tests at several lengths.
SWEEP_CACHE = "sweep"
CACHE_VARIABLE = "JAX_COMPILATION_CACHE_DIR"


def run_environment(sweep_dir: str, compilation_cache: str = SWEEP_CACHE,
                    environ: dict | None = None) -> dict:
    """The environment of a sweep's runs: this process's (`environ`), with
    JAX_COMPILATION_CACHE_DIR set by `compilation_cache`: 'sweep' is `<sweep_dir>/xla_cache`
    unless the variable is set already (the user's cache is kept); 'none' runs without a
    cache; anything else is a folder (made absolute: runs run in cli.run_root()). JAX
    creates the folder when it first writes. ValueError (one line) for an empty value.
    glibc's malloc is asked for huge pages (`cli.with_huge_pages`)."""
    if not compilation_cache.strip():  # abspath("") would be the folder runs start in
        raise ValueError("--compilation_cache is empty; give 'sweep' (<sweep_dir>/xla_cache), "
                         "a folder, or 'none'")
    env = cli.with_huge_pages(dict(os.environ if environ is None else environ))
    if compilation_cache == "none":
        env.pop(CACHE_VARIABLE, None)
    elif compilation_cache == SWEEP_CACHE:
        env.setdefault(CACHE_VARIABLE, os.path.join(os.path.abspath(sweep_dir), "xla_cache"))
    else:
        env[CACHE_VARIABLE] = os.path.abspath(os.path.expanduser(compilation_cache))
    return env


def command(task: str, model: str, seed: int, config_arg: str, workdir: str,
            overrides: list[str]) -> list[str]:
    """The run's command line: `python -m lra.launch`, to run in cli.run_root() (where
    `lra` is importable: the checkout, or anywhere once installed); with `--import` of
    the user's modules this process imported (cli.import_variants)."""
    imports = cli.imported_modules()
    return [sys.executable, "-m", "lra.launch", f"--workdir={workdir}",
            *config_flags_of(task, model, seed, config_arg, overrides),
            *([f"--import={','.join(imports)}"] if imports else [])]


def expected_config(task: str, model: str, seed: int, config_arg: str,
                    overrides: list[str]) -> dict:
    """The resolved config launch.py builds for this run, as results.json records it
    (JSON types). Raises what parsing the config raises (a bad override value, ...)."""
    if REPO not in sys.path:  # task configs import `configs.common`
        sys.path.insert(0, REPO)
    argv = ["launch.py", *config_flags_of(task, model, seed, config_arg, overrides)]
    argv, new_hparams = hparams.split(argv)
    config = hparams.parse_config(argv)
    hparams.apply(config, new_hparams)
    from configs import common  # as lra/train.py resolves it before the run is built

    config = common.resolve(config)
    return json.loads(json.dumps(config.to_dict(), default=str))


def config_differences(recorded: dict, expected: dict) -> list[str]:
    """'field: recorded -> expected' for each field (dotted, nested) whose values differ,
    fields that do not change results (results.NON_RESULT_FIELDS) aside. A field only one
    side has is not compared (a field added to the code since the run), unless its
    absence means a value (results.IMPLIED_WHEN_ABSENT). lra.report groups runs into rows
    by the same rule."""
    from lra.runs.results import (IMPLIED_WHEN_ABSENT, NON_RESULT_FIELDS, builder_default,
                                  flatten, same_run_folder)

    # As lra.report groups runs: a field added since the run with the old behaviour as
    # its default (IMPLIED_WHEN_ABSENT) is that default when unrecorded.
    old = {**IMPLIED_WHEN_ABSENT, **flatten(recorded)}
    new = {**IMPLIED_WHEN_ABSENT, **flatten(expected)}

    def differ(k):
        if k == "init_from":  # a moved sweep directory moves its pretraining runs too
            return not same_run_folder(old[k], new[k])
        return k not in NON_RESULT_FIELDS and old[k] != new[k]

    found = [f"{k}: {json.dumps(old[k])} -> {json.dumps(new[k])}"
             for k in sorted(old.keys() & new.keys()) if differ(k)]
    # model_hparams are the builder's keyword arguments: a key only one side has (an
    # --override=model_hparams.<k> its preset lacks) is that side's value against the
    # builder's default on the other, not a field added since the run.
    absent = "(absent: the builder's default)"
    for k in sorted((old.keys() ^ new.keys())):
        if not k.startswith("model_hparams."):
            continue
        default = builder_default(new.get("model", old.get("model")), k.partition(".")[2])
        given = old[k] if k in old else new[k]
        if default is None or json.dumps(default[0]) != json.dumps(given):
            found.append(f"{k}: {json.dumps(old[k]) if k in old else absent} -> "
                         f"{json.dumps(new[k]) if k in new else absent}")
    return found


# Fields of every config launch.py has recorded in results.json: a recorded config that
# lacks one of them does not count as a finished run of the sweep's config.
RUN_DEFINING_FIELDS = ("task", "model", "model_hparams", "data_dir", "max_length",
                       "batch_size", "learning_rate", "num_train_steps", "random_seed",
                       "emb_dim", "num_heads", "num_layers", "qkv_dim", "mlp_dim")


def finished_differences(results_path: str, task: str, model: str, seed: int,
                          config_arg: str, overrides: list[str]) -> list[str]:
    """Why the finished run in `results_path` is not this sweep's run ([] when it is)."""
    try:
        with open(results_path, encoding="utf-8") as f:
            recorded = json.load(f).get("config")
    except (OSError, ValueError, AttributeError) as e:
        return [f"its results.json cannot be read ({type(e).__name__}: {e})"]
    try:
        expected = expected_config(task, model, seed, config_arg, overrides)
    except (Exception, SystemExit) as e:  # noqa: BLE001  (bad override, bad config_arg)
        return [f"this sweep's config cannot be built ({type(e).__name__}: {e})"]
    return _record_differences(recorded, expected, "its results.json")


def _record_differences(recorded, expected: dict, what: str) -> list[str]:
    if not isinstance(recorded, dict):
        return [f"{what} records no config"]
    missing = [k for k in RUN_DEFINING_FIELDS if k not in recorded]
    if missing:
        # A field added to the code since a run may be missing from its record; these are
        # not: every run launch.py has recorded has them. A result without them (written
        # by hand, by another tool) is not shown to be this config's run.
        return [f"{what} records no {', '.join(missing)}"]
    return config_differences(recorded, expected)


def load_finished_records(paths: list[str]) -> list[tuple[str, dict]]:
    """(file, record) for each run in the runs records `paths` (the `_runs.jsonl` files
    lra.synthetic_report and lra.length_report commit beside their tables).
    A ValueError (one line) names a file that cannot be read or a line that is not a
    results record: a sweep told to trust a record must not half-read it."""
    from lra.runs.results import unusable_reason

    records = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError as e:
            raise ValueError(f"--finished_in={path}: cannot be read ({e.strerror or e})") \
                from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError as e:
                raise ValueError(f"--finished_in={path}:{n}: not valid JSON ({e})") from None
            problem = unusable_reason(r)
            if problem:
                raise ValueError(f"--finished_in={path}:{n}: not a run's record ({problem})")
            records.append((path, r))
    return records


def recorded_run(records: list[tuple[str, dict]], task: str, model: str, seed: int,
                 config_arg: str, overrides: list[str]) -> tuple[str, dict] | None:
    """The (file, record) of `records` that is this sweep's run, finished on another
    machine or in a workdir since deleted, or None. A record is the run when its task and
    model are the run's and its config is the one launch.py would build, fields that do
    not change results aside (config_differences): its folder does not count, runs move
    between machines. A record without a config is never the run."""
    candidates = [(p, r) for p, r in records if r.get("model") == model]
    if not candidates:
        return None
    expected = expected_config(task, model, seed, config_arg, overrides)
    # A record names the task its config resolved to (MAD's `mad_in_context_recall` for
    # the sweep's `--task=mad --config_arg=task=in_context_recall`).
    candidates = [(p, r) for p, r in candidates if r.get("task") in (task, expected["task"])]
    for path, r in candidates:
        if not _record_differences(r.get("config"), expected, "the record"):
            return path, r
    return None

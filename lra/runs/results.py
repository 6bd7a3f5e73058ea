"""The runs under a directory, as `lra.report` and `lra.sweep` read them: every usable
`results.json` (a file that is not one is skipped with a line naming it and why), what kind
of run each is (a classifier from scratch, a self-pretrained classifier, a pretraining run),
and which config fields do not change a run's results."""
from __future__ import annotations

import functools
import json
import os
import sys

# Config fields that do not change a run's results (up to float summation order): runs that
# differ only in these (and in the seed) are averaged together. Everything else, data_dir
# included (another path may be other data), keeps runs apart. lra.sweep uses the same list
# to decide that a finished run is the one it would start.
SEED_FIELD = "random_seed"
# eval_attention_impl: the tests at other lengths in another form of the same attention
# (lra/training/lengths.py), equal within float rounding as sharding is.
NON_RESULT_FIELDS = ("log_every_steps", "checkpoint_freq", "mesh_shape", "sharding",
                     "eval_attention_impl")
# Config fields added after runs were recorded, with the value a run that does not record
# one had: it ran before the field existed, i.e. as the default does. lra.report fills
# them in, so that an older run and a new one of the same config share a row (a missing
# field is otherwise a difference). Only fields whose default is the old behaviour.
# Flattened names (lra.runs.results.flatten), as the report compares them.
IMPLIED_WHEN_ABSENT = {"dtype": "float32", "param_dtype": "float32", "recipe": "",
                       "profile_steps": "", "block.ffn": True, "start_token": False,
                       "early_stop_accuracy": 0.0, "test_weights": "best",
                       "macro_accuracy": "pooled", "data_seed_from_run": False,
                       # hybrid stacks (configs/hybrid.py): unset = one mixer in every layer
                       "hybrid.mixer": "", "hybrid.layers": "", "hybrid.period": 0,
                       "hybrid.offset": 0, "hybrid.pattern": "", "layers": "",  # flatten: ""
                       # where the test weights are tested again (lra/training/lengths.py)
                       "eval_lengths": "", "eval_depth_buckets": 0, "eval_splits": "",
                       "eval_attention_impl": "",
                       # a benchmark's initialisation and tied head (configs/scaffold.py)
                       "init_scheme": "own", "tie_head": False, "scaffold.init": "own",
                       "scaffold.tie_head": False}
REQUIRED_KEYS = ("task", "model", "test_accuracy")
_NUMERIC_KEYS = ("test_accuracy", "train_steps_per_sec", "train_step_temp_bytes",
                 "majority_baseline_accuracy", "num_params", "steps", "best_eval_loss",
                 "test_loss", "test_bits_per_token")

# What a run is (results.json `objective` and `init_from`; runs written before these
# existed are classifiers from scratch). Pretraining runs' test_accuracy is masked-token
# (or next-token) accuracy: they have their own table and are never averaged with
# classifiers.
OBJECTIVES = ("classify", "mlm", "causal_lm", "sequence_labels")

# sequence_labels (MQAR, MAD) is a task's own metric, a run from scratch like a classifier's.
PRETRAINING_OBJECTIVES = ("mlm", "causal_lm")
SCRATCH, SELF_PRETRAINED, PRETRAINING = "from scratch", "self-pretrained", "pretraining"


def last_complete_step(workdir: str | None) -> int | None:
    """The newest step in <workdir>/checkpoints/last, or None: orbax writes a step under a
    temporary name and renames it to the step's number when it is complete."""
    last = os.path.join(workdir or "", "checkpoints", "last")
    if not workdir or not os.path.isdir(last):
        return None
    return max((int(d) for d in os.listdir(last) if d.isdigit()), default=None)


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _json_type(v) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean",
            type(None): "null", dict: "object"}.get(type(v), type(v).__name__)


def unusable_reason(r) -> str | None:
    """What makes a parsed results.json unusable, or None."""
    if not isinstance(r, dict):
        return f"a JSON {_json_type(r)}, not an object with {', '.join(REQUIRED_KEYS)}"
    missing = [k for k in REQUIRED_KEYS if k not in r]
    if missing:
        return f"missing {', '.join(missing)}"
    for k in ("task", "model"):
        if not isinstance(r[k], str) or not r[k]:
            return f"{k} is {r[k]!r}, not a name"
    for k in _NUMERIC_KEYS:
        if k in r and not (is_number(r[k]) or (r[k] is None and k != "test_accuracy")):
            return f"{k} is {r[k]!r}, not a number"
    if r.get("config") is not None and not isinstance(r["config"], dict):
        return f"config is a JSON {_json_type(r['config'])}, not an object"
    if r.get("objective") is not None and r["objective"] not in OBJECTIVES:
        return f"objective is {r['objective']!r}, not one of {', '.join(OBJECTIVES)}"
    if r.get("init_from") is not None and not isinstance(r["init_from"], str):
        return f"init_from is {r['init_from']!r}, not a path"
    return None


def objective(r: dict) -> str:
    """The run's objective: results.json's, else its config's, else classify."""
    value = r.get("objective")
    if value is None and isinstance(r.get("config"), dict):
        value = r["config"].get("objective")
    return value or "classify"


def init_source(r: dict) -> str | None:
    """The workdir the run's encoder was initialised from (config.init_from), or None."""
    value = r.get("init_from")
    if value is None and isinstance(r.get("config"), dict):
        value = r["config"].get("init_from")
    return value or None


def kind(r: dict) -> str:
    """PRETRAINING (objective mlm or causal_lm), SELF_PRETRAINED (a classifier started from
    an earlier run) or SCRATCH."""
    if objective(r) in PRETRAINING_OBJECTIVES:
        return PRETRAINING
    return SELF_PRETRAINED if init_source(r) else SCRATCH


def _tail(path: str, n: int = 3) -> list[str]:
    return os.path.normpath(path).split(os.sep)[-n:]


def same_run_folder(a: str | None, b: str | None) -> bool:
    """Whether two init_from values name the same run: the same path, or the same last
    three components (<task>/<model>/<seed folder> in a sweep directory that was moved or
    named by another relative path)."""
    if not a or not b:
        return not a and not b
    return (os.path.normpath(a) == os.path.normpath(b)
            or (len(_tail(a)) == 3 and _tail(a) == _tail(b)))


def annotate(results: list[dict]) -> None:
    """Sets r['_source'] on each self-pretrained run: the results of the pretraining run its
    init_from names (among `results`, by path or by the path's tail, else read from the
    folder itself); none when there are none (the run was deleted, or had not finished;
    looked for again on the next call, which may have the pretraining runs among its
    `results`)."""
    pretraining = [r for r in results if kind(r) == PRETRAINING and "_path" in r]
    for r in results:
        if kind(r) != SELF_PRETRAINED or r.get("_source"):
            continue
        path = init_source(r)
        found = next((p for p in pretraining
                      if os.path.normpath(p["_path"]) == os.path.normpath(path)), None)
        found = found or next((p for p in pretraining if same_run_folder(p["_path"], path)),
                              None)
        if found is None:
            try:
                with open(os.path.join(path, "results.json"), encoding="utf-8") as f:
                    other = json.load(f)
                if not unusable_reason(other) and kind(other) == PRETRAINING:
                    found = {**other, "_path": path}
            except (OSError, ValueError):
                pass
        if found:
            r["_source"] = found


def pretraining_steps(r: dict) -> int | None:
    source = r.get("_source")
    if not source:
        return None
    steps = source.get("steps")
    if steps is None and isinstance(source.get("config"), dict):
        steps = source["config"].get("num_train_steps")
    return steps


def pretraining_warnings(results: list[dict]) -> list[str]:
    """One line per self-pretrained run whose pretraining run has no usable results."""
    annotate(results)
    return [f"{r.get('_path', '?')}: its pretraining run (init_from={init_source(r)}) has no "
            "usable results.json; its row's steps count the fine-tuning steps only"
            for r in results if kind(r) == SELF_PRETRAINED and not r.get("_source")]


def load(root: str) -> tuple[list[dict], list[str]]:
    """(every usable results.json under `root`, one line per skipped file naming it and
    why: unreadable, not JSON, not an object, required keys missing)."""
    found, skipped = [], []
    for dirpath, dirnames, files in os.walk(root):
        dirnames.sort()
        if "results.json" not in files:
            continue
        path = os.path.join(dirpath, "results.json")
        try:
            with open(path, encoding="utf-8") as f:
                r = json.load(f)
        except (OSError, UnicodeDecodeError) as e:
            skipped.append(f"{path}: cannot be read ({e}); skipped")
            continue
        except ValueError as e:
            skipped.append(f"{path}: not valid JSON ({e}); skipped")
            continue
        problem = unusable_reason(r)
        if problem:
            skipped.append(f"{path}: {problem}; skipped")
            continue
        r["_path"] = dirpath
        found.append(r)
    return found, skipped


def collect(root: str) -> list[dict]:
    """Every usable results.json under `root`; a skipped one gets a warning line on stderr
    (see load)."""
    found, skipped = load(root)
    for line in skipped:
        print(f"warning: {line}", file=sys.stderr)
    if not found:
        raise FileNotFoundError(nothing_found(root, skipped))
    return found


def nothing_found(root: str, skipped: list[str]) -> str:
    if not skipped:
        return f"no results.json under {root}; run launch.py or lra.sweep first"
    return (f"no usable results.json under {root}: {len(skipped)} skipped (first: "
            f"{skipped[0]})")


@functools.lru_cache(maxsize=None)
def builder_default(model: str, hparam: str) -> tuple | None:
    """(the default,) of a registered builder's keyword argument, JSON-normalised, or None
    where it is unknown (a model this process has not registered, a required argument).
    A model_hparams key one run's config lacks is that default there: an override its
    preset lacks makes another run, not a field added since (plan.config_differences, the
    report's rows). Imports the model registry (jax) only when asked."""
    import inspect

    from models import registry

    try:
        default = registry.accepted_hparams(model).get(hparam, inspect.Parameter.empty)
    except Exception:  # noqa: BLE001  (not registered here)
        return None
    if default is inspect.Parameter.empty:
        return None
    return (json.loads(json.dumps(default, default=str)),)


def flatten(d: dict, prefix: str = "") -> dict:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists stay values, but an empty one is "": a
    field that held a list and now holds a comma string (scaffold.ablate) says "none"
    either way, and runs recorded before and after compare equal."""
    flat = {}
    for k, v in d.items():
        if isinstance(v, dict):
            flat.update(flatten(v, f"{prefix}{k}."))
        else:
            flat[f"{prefix}{k}"] = "" if isinstance(v, (list, tuple)) and not v else v
    return flat

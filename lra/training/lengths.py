"""Length extrapolation as a protocol (issue 72): `config.eval_lengths` ("128,256,512")
tests the run's test weights again on the test split made at each of those lengths, after
the usual test; results.json `length_accuracy` holds one row per length, the training
length first.

How a split is made at a length is the task's (`Task.at_length`): the state-tracking rows
get that length inside the same model length where they fit (their protocol: variable
lengths in one context); the other tasks are regenerated at max_length = length with the
same options. Where the model's length changes, the model is built again at the new
length with the run's resolved hparams (config.model_hparams were scaled to the training
length once, by configs/common.py finalize: a window or block stays what was trained) and
takes the trained weights as they are. A variant whose parameters or state depend on the
length (learned positions: a table per position) cannot be, and the run says so before
it trains, naming the parameters; rotary and sinusoidal positions and none extend as they
are. A variant with its own form for longer inputs runs in it (`extension`, from
`Capabilities.span_hparam`: Mega as Mega-chunk), and the rows tested so say which
hparams changed (`model_hparams`).

`config.eval_depth_buckets` (n > 0; NIAH) tests the same weights again at each length
(the training length first) on test splits whose needles all lie in one of n equal depth
ranges of the context (`Task.at_depth`): results.json `depth_accuracy`, one row per
(length, bucket), the heat map of needle-in-a-haystack papers.

`config.eval_splits` ("sparse:test_p_ignore=0.98;dense:test_p_ignore=0.1") tests them on
test splits made with other task options (flip-flop's tails): `split_accuracy`, one row
per named split, at the training length.

`config.eval_attention_impl` (e.g. "flash") runs all of these tests in another form of the
same attention than the run trained in (`test_impl`, `graphdef_at_training_length`): the
O(L)-memory form at long lengths, checked before training to take the weights as they are.

`plan`, `depth_plan` and `split_plan` are made before training (a length the weights
cannot take is refused then); `test` runs them after the usual test. Each entry's metrics
go to <workdir>/length_tests.jsonl as it is tested, keyed by the test weights' digest: a
run stopped during these tests (they take most of a niah run) resumes them where it
stopped, and says which rows it took from the file (`tested_before`).
"""
from __future__ import annotations

import ast
import copy
import hashlib
import json
import os
from typing import Any, Callable

import jax
import numpy as np
from flax import nnx

from lra.errors import ConfigError
from lra.training.objectives import label_slots


def parse(config) -> list[int]:
    """config.eval_lengths as ints (empty: no extrapolation)."""
    text = str(config.get("eval_lengths", "") or "").strip()
    if not text:
        return []
    try:
        lengths = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ConfigError(f"config.eval_lengths={text!r}: comma-separated lengths, e.g. "
                          "'128,256,512'") from None
    if any(n < 2 for n in lengths):
        raise ConfigError(f"config.eval_lengths={text!r}: every length must be at least 2")
    return lengths


def _options(config) -> dict:
    return config.task_options.to_dict() if "task_options" in config else {}


def depth_buckets(config, task) -> int:
    """config.eval_depth_buckets as an int, refused for a task without needles."""
    n = int(config.get("eval_depth_buckets", 0) or 0)
    if n < 0:
        raise ConfigError(f"config.eval_depth_buckets={n} must be 0 (off) or more")
    if n and task.at_depth is None:
        raise ConfigError(f"config.eval_depth_buckets={n}: task {task.name} has no needle "
                          "depth (niah has); set it to 0")
    return n


def depth_plan(config, task, length_plan: list[dict]) -> list[dict]:
    """One entry per (length, depth bucket): the training length's, then each of
    length_plan's, with the task's options at that depth range."""
    n = depth_buckets(config, task)
    if not n:
        return []
    options = _options(config)
    at = [{"length": config.max_length, "max_length": config.max_length,
           "options": options, "graphdef": None}] + length_plan
    return [{**entry, "depth": (b / n, (b + 1) / n),
             "options": task.at_depth(entry["options"], b / n, (b + 1) / n)}
            for entry in at for b in range(n)]


def parse_splits(config) -> dict[str, dict]:
    """config.eval_splits as {name: {option: value}}."""
    text = str(config.get("eval_splits", "") or "").strip()
    out = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, body = part.partition(":")
        changes = {}
        for item in filter(None, (x.strip() for x in body.split(","))):
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                changes = None
                break
            try:
                changes[key.strip()] = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                changes[key.strip()] = value.strip()
        if not sep or not name.strip() or not changes or name.strip() in out:
            raise ConfigError(f"config.eval_splits={text!r}: name:option=value[,option="
                              "value] per split, splits separated by ';', each name once, "
                              "e.g. 'sparse:test_p_ignore=0.98;dense:test_p_ignore=0.1'")
        out[name.strip()] = changes
    return out


def split_plan(config, task) -> list[dict]:
    """One entry per config.eval_splits split, at the training length; an option the
    task's reader does not take is refused before training."""
    splits = parse_splits(config)
    options = _options(config)
    accepted = set(task.option_names())
    for name, changes in splits.items():
        unknown = sorted(set(changes) - accepted)
        if unknown:
            raise ConfigError(f"config.eval_splits: split {name!r} sets {', '.join(unknown)}, "
                              f"not an option of task {task.name} (its options: "
                              f"{', '.join(sorted(accepted)) or 'none'})")
    return [{"length": config.max_length, "max_length": config.max_length,
             "options": {**options, **changes}, "graphdef": None, "split": name}
            for name, changes in splits.items()]


def extension(config, max_length: int) -> dict:
    """model_hparams a variant changes to run at another length in its own long-input
    form, the trained weights as they are ({} for most: they extend as they are).

    A variant whose `Capabilities.span_hparam` is <= 0 spans its whole input, weights
    shaped by max_len; at another length it runs with that hparam at the training length.
    Mega (chunk_size <= 0: one chunk of max_len, its relative bias 2 max_len - 1 entries)
    so runs as Mega-chunk with chunks of the training length: the form Mega's paper and
    code use past the span the bias was trained for (facebookresearch/mega, `chunk_size`).
    Inside the training length that is still one chunk, the same function as trained."""
    if max_length == config.max_length:
        return {}
    from models import registry

    try:
        knob = registry.capabilities(config.model).span_hparam
    except Exception:  # noqa: BLE001  (an unknown model is refused where it is built)
        return {}
    hparams = config.get("model_hparams") or {}
    if knob and int(hparams.get(knob, registry.accepted_hparams(config.model)[knob])) <= 0:
        return {knob: int(config.max_length)}
    return {}


def test_impl(config) -> str:
    """The attention_impl the tests here run in: config.eval_attention_impl, else the
    run's own."""
    return str(config.get("eval_attention_impl", "") or config.attention_impl)


def config_at(config, max_length: int):
    """The run's config with the model at another length, its hparams as resolved (and
    `extension`'s changes), in the tests' attention_impl (`test_impl`)."""
    c = copy.deepcopy(config)
    changes = extension(config, max_length)
    with c.unlocked():
        c.max_length = max_length
        c.attention_impl = test_impl(config)
        for name, value in changes.items():
            c.model_hparams[name] = value
    return c


def split_at(task, config, length: int) -> tuple[int, dict]:
    """(model length, task options) of the test split with rows `length` long."""
    options = _options(config)
    if task.at_length is not None:
        return task.at_length(options, config.max_length, length)
    return length, options


def _shapes(tree) -> dict[str, tuple]:
    return {jax.tree_util.keystr(path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
            if hasattr(leaf, "shape")}


def plan(config, task, abstract_model_at: Callable[[Any], nnx.Module]) -> list[dict]:
    """One entry per config.eval_lengths: {length, max_length, options, graphdef}. The
    model at each new length is built abstractly and checked to hold the trained
    weights' shapes; if not, a ConfigError before anything trains."""
    lengths = parse(config)
    if not lengths:
        return []
    trained = None
    out = []
    for length in lengths:
        max_length, options = split_at(task, config, length)
        graphdef = None
        if max_length != config.max_length:
            if trained is None:
                trained = _shapes(nnx.state(abstract_model_at(config)))
            model = abstract_model_at(config_at(config, max_length))
            graphdef = nnx.split(model, nnx.Param, ...)[0]
            moved = {k: (v, trained.get(k)) for k, v in _shapes(nnx.state(model)).items()
                     if trained.get(k) != v}
            if moved:
                names = ", ".join(f"{k} {b} -> {a}" for k, (a, b) in list(moved.items())[:3])
                # Learned positions are the embeddings'; anything else is the mixer's own
                # weights (Synthesizer's dense logits), which no positions flag changes.
                positions = all("['embeddings']" in k for k in moved)
                # Every length past the trained one meets the same parameters.
                only = (f"drop every length past {config.max_length} from "
                        "config.eval_lengths (--config.eval_lengths= tests at the training "
                        "length only)")
                fix = ("learned positions: use --config.pos_emb=rotary, sinusoidal or "
                       f"none, or {only}" if positions else
                       f"the mixer's own weights are shaped by the length: {only}")
                raise ConfigError(
                    f"config.eval_lengths: {config.model} at length {max_length} has "
                    f"parameters or state shaped by the length ({names}): its trained "
                    f"weights cannot be tested there ({fix})")
        out.append({"length": length, "max_length": max_length, "options": options,
                    "graphdef": graphdef})
    return out


def graphdef_at_training_length(config, abstract_model_at: Callable[[Any], nnx.Module]):
    """The graphdef the entries at the training length (graphdef None) are tested with
    when config.eval_attention_impl changes the form (None: the run's own), checked
    before training to hold the trained weights as they are."""
    if test_impl(config) == config.attention_impl:
        return None
    trained = _shapes(nnx.state(abstract_model_at(config)))
    try:
        model = abstract_model_at(config_at(config, config.max_length))
    except ValueError as e:  # the builder's refusal: the variant has no such form
        raise ConfigError(f"config.eval_attention_impl={test_impl(config)!r}: "
                          f"{config.model} cannot be built so ({e}); set it to ''") from None
    shapes = _shapes(nnx.state(model))
    moved = sorted(k for k in trained.keys() | shapes.keys() if trained.get(k) != shapes.get(k))
    if moved:
        raise ConfigError(
            f"config.eval_attention_impl={test_impl(config)!r}: {config.model} has other "
            f"parameters in that form than in config.attention_impl="
            f"{config.attention_impl!r} ({', '.join(moved[:3])}); set it to ''")
    return nnx.split(model, nnx.Param, ...)[0]


TESTED_FILE = "length_tests.jsonl"  # in the workdir: each entry's metrics as tested


def fingerprint(weights) -> str:
    """A digest of the test weights' values (dtypes and shapes too): an entry tested
    before is taken again only from the same weights, not from the same step of another
    training in the same workdir."""
    digest = hashlib.blake2b(digest_size=16)
    for leaf in jax.tree.leaves(weights):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):  # dropout's rngs
            leaf = jax.random.key_data(leaf)
        a = np.asarray(jax.device_get(leaf))
        digest.update(f"{a.dtype}{a.shape}".encode())
        digest.update(np.ascontiguousarray(a).tobytes())
    return digest.hexdigest()


def tested_before(workdir: str, weights_id: str
                  ) -> tuple[dict[str, dict], Callable[[str, dict], None]]:
    """(`test`'s known, remember) kept in <workdir>/length_tests.jsonl, a line per entry
    tested: a run stopped during its tests at lengths (the 2K niah tests take most of a
    run's time) resumes them where they stopped. Lines of other weights are ignored, an
    unreadable line too (a line cut by the stop)."""
    path = os.path.join(workdir, TESTED_FILE)
    known = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    item = json.loads(line)
                except ValueError:
                    continue
                if isinstance(item, dict) and item.get("weights") == weights_id:
                    known[item["entry"]] = item["metrics"]

    def remember(entry_id: str, metrics: dict) -> None:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"weights": weights_id, "entry": entry_id,
                                "metrics": {k: float(v) for k, v in metrics.items()}})
                    + "\n")
    return known, remember


def entry_key(entry: dict) -> str:
    """What makes an entry's test split and the model it runs: its length, model length,
    depth range or split name and task options, as one string (the `known` keys)."""
    return json.dumps({k: entry.get(k) for k in ("length", "max_length", "depth", "split",
                                                 "options")}, sort_keys=True, default=str)


def test(plans: list[dict], config, task, *, compile_step: Callable[..., Callable],
         evaluate: Callable[[dict, Callable], dict], log: Callable[[str], None],
         known: dict[str, dict] | None = None,
         remember: Callable[[str, dict], None] | None = None) -> dict[str, list]:
    """Each entry of the plans (plan + depth_plan + split_plan) on its test split:
    {"length_accuracy", "depth_accuracy", "split_accuracy"}, lists of rows.
    compile_step(graphdef or None (the run's, in the tests' form), config at the length,
    label slots) -> the jitted test step, compiled once per (model length, label slots);
    evaluate(rows, step) -> the metrics. known: metrics of entries already tested with
    these weights, by entry_key (a run stopped during its tests: lra.train keeps them in
    the workdir), used as they are and said so; remember(key, metrics) is told each entry
    tested here."""
    out = {"length_accuracy": [], "depth_accuracy": [], "split_accuracy": []}
    steps_at = {}
    known = known or {}
    for entry in plans:
        entry_id = entry_key(entry)
        if entry_id in known:
            got, earlier = known[entry_id], " (tested before the run was resumed)"
        else:
            rows = task.load(config.data_dir, "test", entry["max_length"], **entry["options"])
            at = config_at(config, entry["max_length"])
            key = (entry["max_length"], label_slots({"test": rows}, at))
            if key not in steps_at:
                steps_at[key] = compile_step(entry["graphdef"], at, key[1])
            got, earlier = evaluate(rows, steps_at[key]), ""
            if remember is not None:
                remember(entry_id, got)
        row = {"length": entry["length"], "max_length": entry["max_length"], **got}
        changed = extension(config, entry["max_length"])
        if changed:
            row["model_hparams"] = changed
        if "split" in entry:
            out["split_accuracy"].append({"split": entry["split"], **row})
            log(f"split {entry['split']:>12} | test acc {got['accuracy']:.4f}{earlier}")
        elif "depth" not in entry:
            out["length_accuracy"].append(row)
            log(f"length {entry['length']:>6} | test acc {got['accuracy']:.4f}{earlier}")
        else:
            lo, hi = entry["depth"]
            out["depth_accuracy"].append({**row, "depth_min": lo, "depth_max": hi})
            log(f"length {entry['length']:>6} depth [{lo:.2f}, {hi:.2f}) | test acc "
                f"{got['accuracy']:.4f}{earlier}")
    return out

"""`config.init_from`: start a run from an earlier run's embeddings and encoder.

The earlier run is usually a self-pretraining run (`configs/<task>.py:pretrain`), whose
model (models/pretrain.py) has the classifier's `encoder/...` with the same names and
shapes. Its best weights are used (lowest validation loss for pretraining, best accuracy
for a classifier), else its last state. Only the parameters under `encoder/` are copied,
with the encoder's non-RNG state (performer's random features, routing's centroids); the
classifier head starts as initialised. Everything a user can point at wrongly (a missing
folder, no checkpoints, another model, other sizes or architecture) is one ConfigError
line, raised before anything is compiled where the config says enough.

Hybrid stacks (configs/hybrid.py): a run may start from a run with another layer list,
e.g. `gla+transformer@1,3` from a pure `gla` run (or the reverse), when the sizes agree.
What is copied: the embeddings, the final norm and every layer whose mixer is the same in
both runs, whole (its mixer, norms and feed-forward; names and shapes must agree, else one
line); a layer whose mixer differs starts as initialised, and the log line names both
sets. No layer in common is refused.
"""
from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from lra.training import checkpoint
from lra.training.resume import same
from lra.training.console import log as _log
from lra.training.console import warn as _warn
from lra.errors import ConfigError

if TYPE_CHECKING:
    from lra.runs.spec import Layers, RunSpec


# Fields of the earlier run that must equal this config's for its encoder to be loaded;
# a difference is named in one line (shapes alone would name a parameter, not the cause).
INIT_FROM_SAME_FIELDS = ("model", "emb_dim", "num_heads", "num_layers", "qkv_dim", "mlp_dim",
                         "pos_emb")


def _resolve(config: Any) -> RunSpec:
    from lra.runs.spec import resolve  # the layer forms (configs/hybrid.py); only here

    return resolve(config)


def _layers(saved: dict) -> Layers:
    """The earlier run's mixers (its config as it was saved)."""
    from lra.runs.spec import layers_of

    return layers_of(saved)


def find_source(config, spec: RunSpec | None = None
                ) -> tuple[checkpoint.Checkpoints, int, str]:
    """(checkpoints, step, 'best'|'last') of the run config.init_from names: its best
    weights, else its last state. A missing folder, a folder without checkpoints, a run of
    another model or other sizes: ConfigError. `spec`: the config's RunSpec
    (lra/runs/spec.py), resolved here when not given."""
    path = config.init_from
    where = f"config.init_from={path}"
    if not os.path.isdir(path):
        raise ConfigError(f"{where}: no such folder; give the --workdir of an earlier run "
                          "(e.g. a pretraining run: --config=configs/<task>.py:pretrain)")
    ckpts = checkpoint.Checkpoints(path)
    candidates = ([(ckpts.best_steps()[-1], "best")] if ckpts.best_steps() else []) + [
        (s, "last") for s in ckpts.last_steps()]
    if not candidates:
        raise ConfigError(f"{where} holds no checkpoints ({ckpts.directory} is missing or "
                          "empty); give the --workdir of a run that trained at least "
                          "checkpoint_freq steps")
    # The best weights, else the newest last state, whose files match their checksums: a
    # corrupt one is passed over in one line (lra/training/checkpoint.py, "checksums").
    failures = []
    for step, kind in candidates:
        try:
            ckpts.verify(kind, step)
        except checkpoint.CorruptCheckpoint as e:
            failures.append(f"{kind} step {step}: {e}")
            continue
        break
    else:
        raise ConfigError(f"{where}: no checkpoint there can be used ({'; '.join(failures)})")
    if failures:
        _warn(f"{where}: {'; '.join(failures)}; using its {kind} checkpoint of step {step}")
    saved = _saved_config(ckpts, path)
    if saved:
        # Hybrid stacks (configs/hybrid.py) are compared by their layers below: a hybrid
        # may start from a pure run of any of its mixers, and the reverse.
        spec = spec or _resolve(config)
        saved_spec = _layers(saved)
        mixed = saved_spec.is_hybrid or spec.is_hybrid
        differ = [k for k in INIT_FROM_SAME_FIELDS
                  if k in saved and not same(saved[k], config[k])
                  and not (mixed and k == "model")]
        copied = _copied(spec, saved_spec)
        if mixed and not differ and copied is not None and not any(copied):
            raise ConfigError(f"{where} is a run of {saved_spec.description}; this config "
                              f"builds {spec.description}: no layer has the same mixer "
                              "in both; point config.init_from at a run with one")
        if differ:
            was = ", ".join(f"{k}={saved[k]!r}" for k in differ)
            now = ", ".join(f"{k}={config[k]!r}" for k in differ)
            raise ConfigError(f"{where} is a run with {was}; this config has {now}; point "
                              "config.init_from at a run of the same model and sizes")
        if saved.get("task") != config.task:
            _warn(f"{where} was trained on task {saved.get('task')!r}; this run is "
                  f"{config.task!r} (its encoder is loaded all the same)")
    return ckpts, step, kind


def _saved_config(ckpts: checkpoint.Checkpoints, path: str) -> dict | None:
    """The earlier run's config: its last checkpoint's, else its results.json's."""
    saved = None
    if ckpts.last_steps():
        try:
            saved = ckpts.last_loop()["config"]
        except Exception:  # noqa: BLE001  (the weights are compared below anyway)
            saved = None
    if saved is None and os.path.exists(os.path.join(path, "results.json")):
        with open(os.path.join(path, "results.json")) as f:
            saved = json.load(f).get("config")
    return saved


def _copied(spec: RunSpec, saved_spec: Layers) -> list[bool] | None:
    here, there = spec.names, saved_spec.names
    if here == there:
        return None
    return [l < len(there) and m == there[l] for l, m in enumerate(here)]


def copied_layers(config: Any, saved: dict | None,
                  spec: RunSpec | None = None) -> list[bool] | None:
    """Per layer of this config's stack, whether the earlier run's layer there has the same
    mixer (its whole block is copied) or not (the block starts as initialised); None when
    the two layer lists name the same mixers (every encoder parameter is copied, as for
    single-mixer runs). `spec`: the config's RunSpec, resolved here when not given."""
    if not saved:
        return None
    return _copied(spec or _resolve(config), _layers(saved))


_BLOCK = re.compile(r"^encoder/stack/blocks/(\d+)/")


def _path_str(path) -> str:
    """'encoder/embeddings/token/embedding' (the Variable's own `value` leaf left out)."""
    keys = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
    return "/".join(keys[:-1] if keys and keys[-1] == "value" else keys)


def read(config, source: tuple[checkpoint.Checkpoints, int, str]) -> dict:
    """The earlier run's {"params", "rest"} (numpy), read once and given to load_encoder and
    load_encoder_state; an unreadable file: one line."""
    ckpts, step, kind = source
    try:
        return ckpts.restore_weights(step, kind)
    except Exception as e:  # noqa: BLE001  (a truncated or unreadable file)
        raise ConfigError(f"config.init_from={config.init_from}: its {kind} checkpoint of step "
                          f"{step} cannot be read ({checkpoint._first_line(e, 160)}); point "
                          "config.init_from at a run whose checkpoints are intact") from None


def load_encoder_state(config, rest: Any, source: tuple[checkpoint.Checkpoints, int, str],
                       saved: dict | None = None, spec: RunSpec | None = None) -> Any:
    """`rest` (the model's state that is not a parameter) with the encoder's non-RNG state
    taken from the earlier run where it holds it, in the layers load_encoder copies:
    performer's and rfa's random features and their redraw counters, routing's centroids,
    the fixed synthesizer's logits. The encoder was trained with these; a fresh draw would
    make its copied weights meet features they never saw. RNG streams stay this run's.
    `saved`: read(config, source), when the caller has it; `spec`: the config's RunSpec."""
    saved = (saved or read(config, source)).get("rest") or {}
    saved_flat = {_path_str(p): v for p, v in jax.tree_util.tree_leaves_with_path(saved)}
    copied = copied_layers(config, _saved_config(source[0], config.init_from), spec)

    def take(path, target):
        name = _path_str(path)
        if not name.startswith("encoder/") or "/rngs/" in f"/{name}/":
            return target
        layer = _BLOCK.match(name)
        if copied is not None and layer and not copied[int(layer.group(1))]:
            return target
        value = saved_flat.get(name)
        if value is None or tuple(value.shape) != tuple(target.shape):
            return target  # load_encoder has checked the architecture: nothing to copy
        value = np.asarray(value, dtype=target.dtype)
        return jax.make_array_from_callback(value.shape, target.sharding, lambda i: value[i])

    return jax.tree_util.tree_map_with_path(take, rest)


def load_encoder(config, params: Any, source: tuple[checkpoint.Checkpoints, int, str],
                 saved: dict | None = None, spec: RunSpec | None = None) -> Any:
    """`params` with every parameter under `encoder/` taken from the earlier run (the
    embeddings and the stack); the rest (the head) stays as initialised. A parameter the
    earlier run lacks, or holds with another shape: ConfigError naming it. `saved`:
    read(config, source), when the caller has it; `spec`: the config's RunSpec."""
    ckpts, step, kind = source
    saved = (saved or read(config, source))["params"]
    saved_flat = {_path_str(p): v for p, v in jax.tree_util.tree_leaves_with_path(saved)}
    where = f"config.init_from={config.init_from} ({kind} checkpoint, step {step})"
    loaded = 0
    # A hybrid from a pure run (or another layer list): the layers whose mixer agrees.
    spec = spec or _resolve(config)
    copied = copied_layers(config, _saved_config(ckpts, config.init_from), spec)

    def take(path, target):
        nonlocal loaded
        name = _path_str(path)
        if not name.startswith("encoder/"):
            return target
        layer = _BLOCK.match(name)
        if copied is not None and layer and not copied[int(layer.group(1))]:
            return target  # another mixer there: this layer starts as initialised
        if name not in saved_flat:
            raise ConfigError(f"{where} has no parameter {name}; it is a run of another "
                              "architecture (block, stack or hparams); point "
                              "config.init_from at a run built like this one")
        value = saved_flat[name]
        if tuple(value.shape) != tuple(target.shape):
            raise ConfigError(f"{where}: parameter {name} has shape {tuple(value.shape)} "
                              f"there and {tuple(target.shape)} here; the runs differ in "
                              "size (vocabulary, max_length, widths): use the same config")
        loaded += 1
        value = np.asarray(value, dtype=target.dtype)
        # Each process fills its own shards (a multi-process run has no global device_put).
        return jax.make_array_from_callback(value.shape, target.sharding, lambda i: value[i])

    out = jax.tree_util.tree_map_with_path(take, params)
    fresh = ""
    if copied is not None:
        names = spec.names
        same_layers = [l for l, c in enumerate(copied) if c]
        other = [l for l, c in enumerate(copied) if not c]
        fresh = (f" (the embeddings, the final norm and layers "
                 f"{', '.join(f'{l} ({names[l]})' for l in same_layers)}, whose mixer is "
                 f"the same there; layers {', '.join(f'{l} ({names[l]})' for l in other)} "
                 "start as initialised)")
    _log(f"Initialised {loaded} encoder parameter arrays from {where}{fresh}; the head "
         "starts fresh.")
    return out


"""What a resumed run (the same command, the same workdir) may change, and where it
resumes from: a config that the checkpointed run cannot honour, or other data, is one
ConfigError naming every difference; the newest readable `last` checkpoint is the point."""
from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

import ml_collections
import numpy as np

from lra.training import checkpoint, processes
from lra.training.console import warn as _warn
from lra.errors import CheckpointError, ConfigError
from lra.runs.results import flatten

if TYPE_CHECKING:
    from lra.runs.spec import RunSpec

# Resuming (re-running a workdir): every config field must be as the run has it, except
# these, which change neither the model, the data order nor the optimisation
# (eval_lengths, eval_depth_buckets, eval_splits: where the test weights are tested
# after training; eval_attention_impl: in which form):
RESUME_FREE_FIELDS = ("data_dir", "log_every_steps", "checkpoint_freq", "mesh_shape",
                      "sharding", "eval_lengths", "eval_depth_buckets", "eval_splits",
                      "eval_attention_impl")
# num_train_steps may change while it is not below the step the run resumes from and the
# schedule does not depend on it (cosine_decay with steps_per_cycle=0 does): a longer or
# shorter run of the same trajectory. The data's content is compared too (a fingerprint),
# so data_dir may point elsewhere.
# After a divergence (`<workdir>/diverged.json`), the optimisation may change so that the
# run continues from its last good checkpoint with, e.g., a lower learning rate:
AFTER_DIVERGENCE_FIELDS = ("learning_rate", "warmup", "factors", "steps_per_cycle",
                           "adam_b1", "adam_b2", "adam_eps", "weight_decay",
                           "grad_clip_norm", "param_groups")


def data_fingerprint(data: dict[str, dict[str, np.ndarray]]) -> dict[str, str]:
    """Per split, a hash of the arrays the model sees (their content, not the file paths):
    a resumed run must train on the data its checkpoint was trained on."""
    out = {}
    for split in sorted(data):
        h = hashlib.blake2b(digest_size=16)
        for key in sorted(data[split]):
            a = np.ascontiguousarray(data[split][key])
            h.update(f"{key}:{a.dtype.str}:{a.shape};".encode())
            h.update(a.reshape(-1).view(np.uint8))
        out[split] = h.hexdigest()
    return out


def same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == b


def check_compatible(saved: dict, config: ml_collections.ConfigDict, workdir: str, *,
                     step: int, diverged: bool, spec: RunSpec | None = None) -> None:
    """Refuses (ConfigError, naming every field) a config that the run in `workdir`, at
    `step`, cannot honour: see RESUME_FREE_FIELDS above. `spec`: the config's RunSpec
    (lra/runs/spec.py), resolved here when not given."""
    old, new = flatten(saved), flatten(config.to_dict())
    free = set(RESUME_FREE_FIELDS) | {"num_train_steps"}
    if diverged:
        free |= set(AFTER_DIVERGENCE_FIELDS)
    _check_same_layers(saved, spec or _resolve(config), workdir, step)
    changed = [k for k in sorted(set(old) | set(new))
               if k.split(".")[0] not in free and k in old and not same(old[k], new.get(k))
               and not _layer_field(k, diverged)]
    if changed:
        was = ", ".join(f"{k}={old[k]!r}" for k in changed)
        now = ", ".join(f"{k}={new.get(k)!r}" for k in changed)
        hint = ("" if diverged else "; only " + ", ".join(RESUME_FREE_FIELDS)
                + " and num_train_steps may change when a run resumes")
        raise ConfigError(f"{workdir} holds a run (at step {step}) with {was}, but this config "
                          f"has {now}{hint}; use another --workdir to start a new run")
    if config.num_train_steps != old.get("num_train_steps", config.num_train_steps):
        if config.num_train_steps < step:
            raise ConfigError(f"{workdir} holds a run at step {step}; config.num_train_steps="
                              f"{config.num_train_steps} is lower; use another --workdir to "
                              "start a new run")
        spanning = ("linear_decay" if "linear_decay" in config.factors
                    else "cosine_decay" if ("cosine_decay" in config.factors
                                            and not config.steps_per_cycle) else None)
        if spanning:
            raise ConfigError(f"{workdir} holds a run with num_train_steps="
                              f"{old['num_train_steps']}, and its {spanning} schedule spans "
                              "num_train_steps, so it cannot change; use another --workdir "
                              "to start a new run")
    if diverged and (old.get("grad_clip_norm", 0) > 0) != (config.grad_clip_norm > 0):
        raise ConfigError(f"config.grad_clip_norm can change on resume only between positive "
                          f"values (clipping adds optimizer state); {workdir} has "
                          f"{old.get('grad_clip_norm')!r}; use another --workdir to start over "
                          "with clipping")
    if diverged and bool(old_groups := saved.get("param_groups")) != bool(
            config.get("param_groups")):
        raise ConfigError(f"config.param_groups can change on resume only in its values "
                          f"(groups add optimizer transformations); {workdir} has "
                          f"{old_groups!r}; use another --workdir to start over with "
                          "other groups")


def _layer_field(key: str, diverged: bool) -> bool:
    """A flattened field of the layer-list forms (configs/hybrid.py), compared as the
    resolved layer list instead (`_check_same_layers`): two forms of one list (layers
    1,3 or period 2 offset 1) are one model. The hybrid layers' param_groups are
    optimisation, free after a divergence like config.param_groups."""
    if key.startswith("hybrid.param_groups."):
        return diverged
    return key == "layers" or key.startswith("hybrid.")


def _resolve(config: Any) -> RunSpec:
    from lra.runs.spec import resolve  # the layer forms (configs/hybrid.py); only here

    return resolve(config)


def _layers_of(spec: RunSpec) -> list[dict] | None:
    """The layer list as the model is built from it (param_groups are optimisation)."""
    return None if spec.layers is None else [
        {k: v for k, v in layer.items() if k != "param_groups"} for layer in spec.layers]


def _check_same_layers(saved: dict, spec: RunSpec, workdir: str, step: int) -> None:
    """A resume with another layer list (mixers, their hparams or blocks) is refused in
    one line naming both lists."""
    try:
        saved_spec = _resolve(ml_collections.ConfigDict(saved))
    except ConfigError:  # the saved run's forms no longer resolve: compare the fields
        return
    before, after = _layers_of(saved_spec), _layers_of(spec)
    key = lambda x: json.dumps(x, sort_keys=True, default=str)  # noqa: E731
    if key(before) == key(after):
        return
    was, now = saved_spec.description, spec.description
    if was == now:  # the same mixers: name the layers whose hparams or block differ
        diffs = []
        for l, (a, b) in enumerate(zip(before, after)):
            for part in ("model_hparams", "block"):
                fa, fb = flatten(a[part]), flatten(b[part])
                diffs += [f"layer {l} {part}.{k}={fa.get(k)!r} -> {fb.get(k)!r}"
                          for k in sorted(set(fa) | set(fb)) if not same(fa.get(k), fb.get(k))]
        now += f" with {', '.join(diffs)}"
    raise ConfigError(f"{workdir} holds a run (at step {step}) of {was}, but this config "
                      f"builds {now}; the layers cannot change when a run resumes: use "
                      "another --workdir to start a new run")


def check_same_data(saved: dict | None, data: dict, config, workdir: str) -> None:
    if not saved:  # checkpoints written before fingerprints existed
        return
    now = data_fingerprint(data)
    differ = [s for s in sorted(now) if saved.get(s) != now[s]]
    if differ:
        raise ConfigError(f"the data in config.data_dir={config.data_dir} differs from the data "
                          f"the run in {workdir} was trained on (split(s) "
                          f"{', '.join(differ)}); resume with that data, or use another "
                          "--workdir to start a new run")


def resume_point(ckpts: checkpoint.Checkpoints, config, workdir: str, diverged: bool,
                 spec: RunSpec | None = None
                 ) -> tuple[list[tuple[int, BaseException]], int | None, dict]:
    """The newest `last` checkpoint whose JSON reads (checked against the config and its
    RunSpec), and the newer ones that did not read."""
    unreadable = []
    for step in ckpts.last_steps():
        try:
            loop = ckpts.last_loop(step)
        except Exception as e:  # noqa: BLE001  (corrupt or partial files)
            unreadable.append((step, e))
            continue
        check_compatible(loop["config"], config, workdir, step=step, diverged=diverged,
                         spec=spec)
        return unreadable, step, loop
    return unreadable, None, {}


def unrestorable(ckpts: checkpoint.Checkpoints, failures) -> CheckpointError:
    detail = "; ".join(f"step {s}: {checkpoint._first_line(e, 120)}" for s, e in failures)
    return CheckpointError(f"cannot restore any checkpoint in {ckpts.last_dir} ({detail}); "
                           f"delete {ckpts.directory} to start the run again, or use another "
                           "--workdir")


def clean_up(ckpts: checkpoint.Checkpoints, unreadable: list, resume_step: int | None,
             restored_step: int | None, best_step: int) -> None:
    """After the restore (lra.train): refuses a resume whose checkpoints all failed to
    read; deletes the unreadable newer `last` checkpoints and the `best` ones newer than
    the restored state (`best_step`: the best step it knows, -1 for none), so that best
    and last describe the same run."""
    if unreadable:
        # In a multi-process run a restore also fails when another process died meanwhile
        # (orbax's reads are collectives): that is not a bad file, and its advice (delete
        # the checkpoints) would be the worst possible. A collective tells: it fails at once
        # if a process is gone (launch.py: the lost-peer line, exit 3), else the files are
        # bad for every process alike.
        processes.check_peers()
    if resume_step is not None and restored_step is None:
        raise unrestorable(ckpts, unreadable)
    for step, error in unreadable:
        _warn(f"checkpoint step {step} in {ckpts.last_dir} cannot be read "
              f"({checkpoint._first_line(error, 120)}); resuming from step {restored_step}, "
              f"the one before; step {step} is deleted")
        ckpts.delete_last(step)
    stale_best = [b for b in ckpts.best_steps() if b > best_step]
    if stale_best:
        _warn(f"deleting best checkpoint(s) {stale_best} in {ckpts.best_dir}: newer than the "
              f"state this run starts from (step {restored_step or 0}; an interrupted or "
              f"earlier run left them), so this run redoes those steps")
        for b in stale_best:
            ckpts.delete_best(b)
    if best_step >= 0 and best_step not in ckpts.best_steps():
        raise CheckpointError(f"{ckpts.best_dir} lacks step {best_step}, the best step "
                              f"that the last checkpoint (step {restored_step}) names; delete "
                              f"{ckpts.directory} to start the run again")

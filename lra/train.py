"""The LRA training loop: `train_and_evaluate(config, workdir)`, top to bottom.

One plain `jax.jit` train step over split NNX state (params, the rest of the model state
such as RNG counters, optimizer state), donated, with explicit shardings over a `data`
mesh axis even on one device. Evaluation every `eval_frequency` steps on the validation
split; the test split is evaluated once, with the best-on-validation weights.

A run is resumable: the same command with the same workdir restores the last checkpoint
(model, optimizer, data-iterator position, best-so-far) and ends with the metrics an
uninterrupted run gets. SIGTERM saves a checkpoint, then raises `Preempted`.
"""
from __future__ import annotations

import math
import os
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import lra.tasks
from configs import common
from lra.training import (checkpoint, init_from, input_pipeline, lengths, processes, record,
                          resume, sharding)
# train_and_evaluate looks them up here, so a test can swap the schedule in this module.
from lra.training.optim import learning_rate_schedule, make_optimizer
from lra.runs import card
from lra.runs.spec import RunSpec, resolve
from lra.runs.results import flatten
from lra.training.console import log as _log
from lra.training.console import warn as _warn
from lra.errors import CheckpointError, ConfigError, UserError
from models import precision, registry
from models.encoder import Classifier, DualClassifier
from lra.training.objectives import add_eval_masks, label_slots, macro_accuracy, make_steps
from models.autoencoder import SequenceAutoEncoder
from models.pretrain import TokenPredictor

# Written when the loss diverges; re-running the workdir may then also change the
# optimisation (resume.AFTER_DIVERGENCE_FIELDS) and goes on from the last good checkpoint.
DIVERGED_FILE = "diverged.json"

# A training loss above this many times max(1, ln(num_classes)) (a classifier's loss at
# initialisation is ln(num_classes)) counts as diverged, like a NaN: logits hundreds of
# nats apart are weights that blew up, and the next steps are NaN.
EXPLODED_LOSS_FACTOR = 100.0


# Steps the host may dispatch ahead of the device: enough to overlap input and compute.
MAX_STEPS_AHEAD = 2


class Preempted(Exception):
    """SIGTERM (or SIGINT, see interrupt_as_preemption) arrived; the state was saved.
    Re-run the same command to resume."""


# Ctrl-C's notes (interrupt_as_preemption): a SIGTERM that follows one is the user's.
_INTERRUPTED: list[bool] = []


def interrupt_as_preemption() -> None:
    """From now on SIGINT (Ctrl-C) does what SIGTERM does: the run saves at its next step
    and stops with one line (launch.py: exit 130). It is turned into a SIGTERM to this
    process, so that the one-process handler below and jax's preemption sync point of a
    multi-process run (which listens to SIGTERM) both see it; before the training loop
    SIGTERM's default, ending the process, applies to it too, with nothing to save. A
    KeyboardInterrupt raised inside compilation could crash the process (a segmentation
    fault was seen)."""
    def on_sigint(*_):
        _INTERRUPTED.append(True)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGINT, on_sigint)


def interrupted() -> bool:
    """Whether a Preempted run was stopped by Ctrl-C (SIGINT) rather than SIGTERM."""
    return bool(_INTERRUPTED)


class TrainingDiverged(UserError):
    """The training loss became NaN, infinite or exploded."""


# ----------------------------------------------------------------------------- model


def build_model(config: ml_collections.ConfigDict, task: lra.tasks.Task,
                spec: RunSpec | None = None) -> Classifier:
    """The classifier, or for a pretraining objective (mlm, causal_lm) the same encoder
    with a per-position head (models/pretrain.py); retrieval's two documents go through
    that one encoder in turn. config.start_token adds one id, vocab_size, to the
    embedding table (and the head, whose logit for it the losses drop:
    lra/training/objectives.py). `spec`: the config's RunSpec (lra/runs/spec.py; its
    layer list), resolved here when not given."""
    vocab_size = task.vocab_size
    if config.objective == "sequence_labels" and task.autoencoder:
        model_class, head = SequenceAutoEncoder, {}  # MAD's compression
    elif config.objective != "classify":
        model_class, head = TokenPredictor, {"objective": config.objective,
                                              "lm_loss": config.lm_loss}
        vocab_size += int(bool(config.get("start_token", False)))
    else:
        model_class = DualClassifier if task.dual_input else Classifier
        head = {"num_classes": task.num_classes}
    return model_class(
        vocab_size=vocab_size, **head, max_len=config.max_length,
        model=config.model, model_hparams=config.model_hparams.to_dict(),
        emb_dim=config.emb_dim, num_heads=config.num_heads, num_layers=config.num_layers,
        qkv_dim=config.qkv_dim, mlp_dim=config.mlp_dim, dropout_rate=config.dropout_rate,
        attention_dropout_rate=config.attention_dropout_rate,
        attention_impl=config.attention_impl, pooling=config.pooling,
        pos_emb=config.pos_emb, causal=config.causal,
        block=config.block.to_dict() if "block" in config else None,
        # A hybrid stack's layers (configs/hybrid.py); None: config.model in every layer.
        layers=(spec or resolve(config)).layer_list(),
        rngs=nnx.Rngs(params=config.random_seed, dropout=config.random_seed + 1),
    )


# ----------------------------------------------------------------------------- helpers
# (the input's: lra/training/input_pipeline.py; what a run records: lra/training/record.py)


def _bound_steps_in_flight(pending: list[tuple[int, Any]]) -> None:
    """Waits for all but the newest MAX_STEPS_AHEAD dispatched steps. JAX dispatches
    without limit: unchecked, the host queues every step up to the next log line (with
    their batches), and SIGTERM's checkpoint then waits for all of them."""
    if len(pending) > MAX_STEPS_AHEAD:
        jax.block_until_ready(pending[-1 - MAX_STEPS_AHEAD][1])


def _lock_workdir(workdir: str) -> checkpoint.WorkdirLock:
    """One run per workdir; in a multi-process run process 0 takes the lock for all."""
    lock = checkpoint.WorkdirLock(workdir)
    error = None
    if jax.process_index() == 0:
        try:
            lock.acquire()
        except UserError as e:
            error = e
    processes.agree_on_error(error)
    if jax.process_index() != 0:
        os.makedirs(workdir, exist_ok=True)
    try:
        processes.check_shared_workdir(workdir)
    except UserError:
        lock.release()
        raise
    return lock


# ----------------------------------------------------------------------------- the loop


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Trains, evaluates, tests with the best checkpoint; returns and writes results.json.

    Holds `<workdir>/run.lock` while it runs (a second run is refused at once)."""
    # 1. Everything the user can get wrong is checked before anything is written; first,
    # that every process of the run was given the same settings.
    processes.agree_on("the config", flatten(config.to_dict()))
    # After the command line's overrides: the data's seed where it is the run's, and a
    # benchmark's scaffold (configs/scaffold.py) into the fields the model is built from
    # (--config.scaffold.short_conv=0 reaches every layer).
    common.resolve(config)
    common.validate(config)
    # Generated tasks take their vocabulary from their options (MQAR's vocab_size).
    task = lra.tasks.get(config.task).with_options(**config.task_options.to_dict())
    if task.sequence_labels and config.objective != "sequence_labels":
        raise ConfigError(f"task {config.task!r} has a label per position; "
                          f"config.objective={config.objective!r} does not read them: use "
                          "objective sequence_labels (its config file sets it)")
    if config.objective == "sequence_labels" and not task.sequence_labels:
        raise ConfigError(f"config.objective='sequence_labels' needs a task with a label per "
                          f"position (mqar, mad_*); {config.task!r} has one per example")
    caps = registry.capabilities(config.model)  # unknown model -> error listing them
    if config.causal and not caps.causal:
        causal = [m for m in registry.available() if registry.capabilities(m).causal]
        raise ConfigError(f"model {config.model!r} is not causal (it cannot hide later "
                          f"positions), so config.causal=True"
                          f"{' (objective causal_lm)' if config.objective == 'causal_lm' else ''}"
                          f" is impossible; causal models: {', '.join(causal)}")
    sharding.validate(config, config.num_heads)
    # What the config builds, resolved once (lra/runs/spec.py): the layer list, the model's
    # name, the parameter groups; everything below reads it rather than the config's forms.
    spec = resolve(config)
    lock = _lock_workdir(workdir)
    try:
        return _train_and_evaluate(config, workdir, task, spec)
    finally:
        lock.release()


def _train_and_evaluate(config, workdir: str, task, spec: RunSpec) -> dict:
    diverged_path = os.path.join(workdir, DIVERGED_FILE)
    diverged = os.path.exists(diverged_path)
    ckpts = checkpoint.Checkpoints(workdir)
    # Resume point and config check before the data is read and the step compiled.
    unreadable, resume_step, resume_loop = resume.resume_point(ckpts, config, workdir, diverged,
                                                                spec)
    if ckpts.last_steps() and resume_step is None:
        processes.check_peers()  # as below: a lost process, not bad files
        raise resume.unrestorable(ckpts, unreadable)
    # The run to start from (config.init_from), checked before anything is compiled; a
    # resumed run has its weights in its own checkpoint already.
    source = init_from.find_source(config, spec) if config.init_from and resume_step is None else None
    preemption_sync = processes.preemption_sync_point(resume_step or 0)
    data = input_pipeline.load_data(config, task)
    fingerprint = resume.data_fingerprint(data)
    processes.agree_on(f"the data read from config.data_dir={config.data_dir}",
                       {f"{split} split (hash)": h for split, h in fingerprint.items()})
    if resume_step is not None:
        resume.check_same_data(resume_loop.get("data_fingerprint"), data, config, workdir)
    if config.objective == "mlm":
        add_eval_masks(data, config)
    # Per-position predictions (pretraining, or a task's labels per position); only
    # pretraining keeps the lowest validation loss and counts tokens for its baseline.
    token_level = config.objective != "classify"
    pretraining = config.objective in ("mlm", "causal_lm")
    schedule = learning_rate_schedule(config)
    tx = make_optimizer(config, schedule, spec)

    def init_state() -> dict:
        _, params, rest = nnx.split(build_model(config, task, spec), nnx.Param, ...)
        # config.param_dtype: the parameters (and so the optimizer's state) as stored.
        params = precision.cast_params(params, precision.dtype_of(config.param_dtype))
        return {"step": jnp.int32(0), "params": params, "rest": rest,
                "opt_state": tx.init(params)}

    # 2. State, optimizer, shardings. The model is first built abstractly (shapes and
    # logical axis names only); then every device initialises just its own shards, which
    # is also how a multi-process run gets global arrays without copying host values.
    try:
        graphdef = nnx.split(nnx.eval_shape(lambda: build_model(config, task, spec)), nnx.Param,
                             ...)[0]
        abstract_state = jax.eval_shape(init_state)
    except ValueError as e:  # unknown hparams, impossible combinations (causal + CLS, ...)
        raise ConfigError(f"cannot build model {spec.name!r}: {e}") from None
    num_params = sum(x.size for x in jax.tree.leaves(abstract_state["params"]))
    # What the model shares with the other mixers of a comparison, measured on it.
    scaffold_card = card.card(config, nnx.eval_shape(lambda: build_model(config, task, spec)),
                              spec=spec)
    # config.eval_lengths: the model at each length, checked now to take these weights.
    length_plan = lengths.plan(config, task,
                               lambda c: nnx.eval_shape(lambda: build_model(c, task)))
    depth_plan = lengths.depth_plan(config, task, length_plan)  # config.eval_depth_buckets
    split_plan = lengths.split_plan(config, task)  # config.eval_splits
    # A (data, model) mesh; parameters and optimizer state placed by config.sharding's
    # rules on their logical axis names (lra/training/sharding.py). Auto axes: XLA propagates
    # shardings from these inputs (GSPMD), guided by the model's activation constraints.
    mesh = sharding.make_mesh(config)
    replicated = NamedSharding(mesh, P())
    batch_sharding = sharding.batch_sharding(mesh)
    state_shardings = sharding.state_shardings(abstract_state, config.sharding, mesh)
    state = jax.jit(init_state, out_shardings=state_shardings)()
    param_bytes, param_bytes_per_device = record.param_bytes(state["params"])
    weights_shardings = {"params": state_shardings["params"], "rest": state_shardings["rest"]}

    # 3. Resume from the newest readable `last` checkpoint, if there is one (before
    # compiling: a refusal comes at once). Newer unreadable ones are removed, and so are
    # best checkpoints that the restored state does not know of: best and last always
    # describe the same run.
    train_iter = input_pipeline.train_iterator(
        data["train"], global_batch_size=config.batch_size, seed=config.random_seed,
        rows=input_pipeline.process_rows(batch_sharding, config.batch_size))
    loop = {"best_eval_accuracy": -1.0, "best_eval_loss": None, "best_step": -1,
            "eval_history": [],
            "train_history": [], "train_seconds": 0.0, "timed_steps": 0,
            "input_seconds": 0.0,
            "config": config.to_dict(), "data_fingerprint": fingerprint}
    restored_step = None
    for step in [s for s in ckpts.last_steps() if resume_step is not None and s <= resume_step]:
        try:
            if step != resume_step:
                resume.check_compatible(ckpts.last_loop(step)["config"], config, workdir,
                                         step=step, diverged=diverged)
            state, saved_loop = ckpts.restore_last(state, step)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001  (corrupt or partial files)
            unreadable.append((step, e))
            continue
        restored_step = step
        train_iter.set_state(saved_loop.pop("train_iter"))
        loop.update(saved_loop, config=config.to_dict(), data_fingerprint=fingerprint)
        break
    if unreadable:
        # In a multi-process run a restore also fails when another process died meanwhile
        # (orbax's reads are collectives): that is not a bad file, and its advice (delete
        # the checkpoints) would be the worst possible. A collective tells: it fails at once
        # if a process is gone (launch.py: the lost-peer line, exit 3), else the files are
        # bad for every process alike.
        processes.check_peers()
    if resume_step is not None and restored_step is None:
        raise resume.unrestorable(ckpts, unreadable)
    for step, error in unreadable:
        _warn(f"checkpoint step {step} in {ckpts.last_dir} cannot be read "
              f"({checkpoint._first_line(error, 120)}); resuming from step {restored_step}, "
              f"the one before; step {step} is deleted")
        ckpts.delete_last(step)
    stale_best = [b for b in ckpts.best_steps() if b > loop["best_step"]]
    if stale_best:
        _warn(f"deleting best checkpoint(s) {stale_best} in {ckpts.best_dir}: newer than the "
              f"state this run starts from (step {restored_step or 0}; an interrupted or "
              f"earlier run left them), so this run redoes those steps")
        for b in stale_best:
            ckpts.delete_best(b)
    if loop["best_step"] >= 0 and loop["best_step"] not in ckpts.best_steps():
        raise CheckpointError(f"{ckpts.best_dir} lacks step {loop['best_step']}, the best step "
                              f"that the last checkpoint (step {restored_step}) names; delete "
                              f"{ckpts.directory} to start the run again")
    if restored_step is None and diverged and jax.process_index() == 0:
        os.remove(diverged_path)  # no good checkpoint was kept: this is a new run
        diverged = False
    if restored_step is not None:
        _log(f"Resumed from {ckpts.directory}/last at step {int(state['step'])}.")
    start_step = int(state["step"])

    if restored_step is None and config.init_from:
        saved = init_from.read(config, source)  # the earlier run's weights, read once
        state["params"] = init_from.load_encoder(config, state["params"], source, saved,
                                                  spec)
        state["rest"] = init_from.load_encoder_state(config, state["rest"], source, saved,
                                                      spec)
    train_step, eval_step = make_steps(graphdef, tx, schedule, task.num_classes, config,
                                       task.vocab_size, label_slots=label_slots(data, config))
    activation_rules = sharding.activation_rules(config.sharding)

    def in_mesh(jitted):
        # Traced under these, models.layers.constrain pins the activations' sharding.
        def call(*args):
            with jax.set_mesh(mesh), nnx.logical_axis_rules(activation_rules):
                return jitted(*args)
        return call

    # The train step is compiled ahead of time: one compilation, and XLA's memory
    # analysis of it goes into results.json (train_step_temp_bytes).
    abstract_batch = {
        k: jax.ShapeDtypeStruct((config.batch_size, *v.shape[1:]), v.dtype,
                                sharding=batch_sharding)
        for k, v in data["train"].items()}
    with jax.set_mesh(mesh), nnx.logical_axis_rules(activation_rules):
        train_step = jax.jit(train_step, in_shardings=(state_shardings, batch_sharding),
                             out_shardings=(state_shardings, replicated),
                             donate_argnums=0).lower(state, abstract_batch).compile()
    memory = train_step.memory_analysis()
    train_step_temp_bytes = int(memory.temp_size_in_bytes) if memory is not None else None
    eval_step = in_mesh(jax.jit(eval_step, in_shardings=(weights_shardings, batch_sharding),
                                out_shardings=replicated))

    writer = None
    if jax.process_index() == 0:
        from tensorboardX import SummaryWriter  # imported late: slow, and process 0 only
        writer = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def evaluate(weights, split: str, num_batches: int = -1, *, rows=None,
                 step=None) -> dict[str, float]:
        """Sums over a split (`rows`: other data in its place, with `step`)."""
        eval_bs = config.eval_batch_size or config.batch_size
        sums = None
        batch_macros = []  # (macro, examples) per batch: config.macro_accuracy batch_mean
        per_batch = config.get("macro_accuracy", "pooled") == "batch_mean"
        mine = input_pipeline.process_rows(batch_sharding, eval_bs)
        for batch in input_pipeline.eval_batches(data[split] if rows is None else rows,
                                                 global_batch_size=eval_bs,
                                                 num_batches=num_batches, rows=mine):
            out = (step or eval_step)(weights, input_pipeline.to_global(batch, batch_sharding))
            sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
            if per_batch and "class_tp" in out:
                b = jax.device_get(out)
                batch_macros.append((macro_accuracy(b["class_tp"], b["class_target"],
                                                    b["class_predicted"]),
                                     float(b["example_count"])))
        sums = jax.device_get(sums)
        count = max(float(sums["count"]), 1.0)
        out = {"accuracy": float(sums["correct"]) / count,
               "loss": float(sums["loss_sum"]) / count}
        if config.objective == "causal_lm" and config.lm_loss == "xent":
            out["bits_per_token"] = out["loss"] / math.log(2)
        if "example_count" in sums:  # sequence_labels: all labelled positions right
            out["example_accuracy"] = (float(sums["example_correct"])
                                       / max(float(sums["example_count"]), 1.0))
        if "class_tp" in sums:  # sequence_labels: MAD's (torchmetrics') macro accuracy
            out["macro_accuracy"] = macro_accuracy(sums["class_tp"], sums["class_target"],
                                                   sums["class_predicted"])
            if batch_macros:  # mad-lab's: each batch's macro, weighted by its examples
                out["pooled_macro_accuracy"] = out["macro_accuracy"]
                total = max(sum(n for _, n in batch_macros), 1.0)
                out["macro_accuracy"] = sum(m * n for m, n in batch_macros) / total
        return out

    def weights_of(s):
        return {"params": s["params"], "rest": s["rest"]}

    def save_last(s, step):
        nonlocal diverged
        ckpts.save_last(step, s, {**loop, "train_iter": train_iter.get_state()})
        if diverged:  # the run went on past its divergence with the new config
            if jax.process_index() == 0 and os.path.exists(diverged_path):
                os.remove(diverged_path)
            diverged = False

    # 4. Train. SIGTERM: one process notes it (signal handler) and saves at the next step;
    # several processes agree on the step through jax's preemption sync point (its own
    # SIGTERM handler), or else at the next log step (an all-gather of the flags).
    preempted = []
    previous_handler = None
    if preemption_sync is None:
        try:
            previous_handler = signal.signal(signal.SIGTERM,
                                             lambda *_: preempted.append(True))
        except ValueError:  # not the main thread (e.g. a notebook worker): no preemption hook
            pass

    def preemption_notice(step: int) -> bool:
        if preemption_sync is not None:
            return bool(preemption_sync(step))
        if jax.process_count() == 1:
            return bool(preempted)
        return step % config.log_every_steps == 0 and processes.any_process(bool(preempted))

    pending: list[tuple[int, dict]] = []  # per-step metrics not yet fetched from the device
    clock, steps_since_clock, first_step_of_segment = time.perf_counter(), 0, True
    what = ("" if not token_level else f" (pretraining: {config.objective}, {config.lm_loss})"
            if pretraining else f" ({config.objective})")
    # A run that stopped early (config.early_stop_accuracy) and is run again resumes at
    # its stopping step: nothing is left to train.
    end_step = loop.get("stopped_at_step") or config.num_train_steps
    stopped = " (stopped early there)" if loop.get("stopped_at_step") else ""
    _log(f"Training {spec.description if spec.is_hybrid else config.model} "
         f"on {config.task}{what}: {num_params:,} parameters, "
         f"steps {start_step}..{end_step}{stopped}, {jax.device_count()} device(s).")
    # A fresh model's loss: ln(classes), ln(vocabulary) for token prediction, under 1 for L1.
    loss_scale = (task.num_classes if not token_level
                  else task.vocab_size if config.lm_loss == "xent" else 1)
    loss_limit = EXPLODED_LOSS_FACTOR * max(1.0, math.log(loss_scale))

    def stop_diverged(step: int, loss: float) -> None:
        """The weights after step-1 updates gave a diverged loss at `step`: every
        checkpoint from step-1 on holds them (or worse); delete those, keep the others."""
        bad = [c for c in ckpts.last_steps() if c >= step - 1]
        for c in bad:
            ckpts.delete_last(c)
        good = ckpts.last_step()
        if jax.process_index() == 0:
            record.write_json(diverged_path, {"step": step, "loss": loss, "last_good_step": good,
                                        "learning_rate": config.learning_rate})
        removed = (f" (deleted checkpoint step(s) {bad}: their weights gave this loss)"
                   if bad else "")
        where = (f"the last good checkpoint (step {good}) is kept in {ckpts.last_dir}{removed}; "
                 f"re-run the same command with a lower config.learning_rate (or a longer "
                 f"config.warmup) to continue from it"
                 if good is not None else
                 f"no good checkpoint was kept{removed}; re-run with a lower "
                 f"config.learning_rate (or a longer config.warmup) to start again")
        raise TrainingDiverged(
            f"training loss is {loss:.4g} at step {step} (diverged: not finite or above "
            f"{loss_limit:.0f}); stopped, {where}, or use another --workdir")

    def flush() -> None:
        """Fetch pending metrics, stop on a diverged loss, log a progress line."""
        if not pending:
            return
        fetched = jax.device_get([m for _, m in pending])
        steps = [s for s, _ in pending]
        pending.clear()
        for s, m in zip(steps, fetched):
            total = float(m["loss"]) + float(m["aux_loss"])
            if not math.isfinite(total) or float(m["loss"]) > loss_limit:
                stop_diverged(s, total if not math.isfinite(total) else float(m["loss"]))
        mean = {k: float(np.mean([m[k] for m in fetched])) for k in fetched[0]}
        step = steps[-1]
        loop["train_history"].append({"step": step, **mean})
        rate = loop["timed_steps"] / loop["train_seconds"] if loop["train_seconds"] else 0.0
        eta = (config.num_train_steps - step) / rate if rate else float("nan")
        _log(f"step {step:>6}/{config.num_train_steps} | loss {mean['loss']:.4f} "
             f"| acc {mean['accuracy']:.3f} | lr {mean['learning_rate']:.2e} "
             f"| {rate:6.2f} steps/s | input {100 * record.input_fraction(loop):.0f}% "
             f"| ETA {record.format_duration(eta) if math.isfinite(eta) else '?'}")
        if writer:
            for k, v in mean.items():
                writer.add_scalar(f"train/{k}", v, step)
            writer.add_scalar("train/steps_per_sec", rate, step)

    profile = common.parse_profile_steps(config.get("profile_steps", ""))
    profile_dir = os.path.join(workdir, "profile")
    tracing = False
    input_since_clock = 0.0  # host time spent waiting for batches in the timed window
    try:
        for step in range(start_step + 1, end_step + 1):
            if profile and step == profile[0] and jax.process_index() == 0:
                jax.profiler.start_trace(profile_dir)
                tracing = True
            waited = time.perf_counter()
            batch = input_pipeline.to_global(next(train_iter), batch_sharding)
            input_since_clock += time.perf_counter() - waited
            state, metrics = train_step(state, batch)
            if tracing and step == profile[1]:
                jax.block_until_ready(metrics)
                jax.profiler.stop_trace()
                tracing = False
                _log(f"profile of steps {profile[0]}..{profile[1]} written to {profile_dir} "
                     f"(tensorboard --logdir={profile_dir}; or trace.json.gz in Perfetto)")
            pending.append((step, metrics))
            _bound_steps_in_flight(pending)
            is_last = step == config.num_train_steps
            if first_step_of_segment:
                # The first step of a process compiles: keep it out of steps/s.
                jax.block_until_ready(metrics)
                clock, first_step_of_segment = time.perf_counter(), False
                input_since_clock = 0.0
            else:
                steps_since_clock += 1
            notice = preemption_notice(step)
            do_eval = step % config.eval_frequency == 0 or is_last
            do_save = do_eval or step % config.checkpoint_freq == 0 or is_last or notice
            if step % config.log_every_steps == 0 or do_save:
                jax.block_until_ready(metrics)
                loop["train_seconds"] += time.perf_counter() - clock
                loop["timed_steps"] += steps_since_clock
                loop["input_seconds"] = loop.get("input_seconds", 0.0) + input_since_clock
                flush()
                steps_since_clock, clock, input_since_clock = 0, time.perf_counter(), 0.0
            if do_eval:
                result = evaluate(weights_of(state), "val", config.num_eval_steps)
                loop["eval_history"].append({"step": step, **result})
                bits = (f" | val bits/token {result['bits_per_token']:.4f}"
                        if "bits_per_token" in result else "")
                if "example_accuracy" in result:
                    bits += f" | val example acc {result['example_accuracy']:.4f}"
                _log(f"eval  {step:>6} | val loss {result['loss']:.4f} "
                     f"| val acc {result['accuracy']:.4f}{bits}")
                if writer:
                    writer.add_scalar("eval/accuracy", result["accuracy"], step)
                    writer.add_scalar("eval/loss", result["loss"], step)
                    writer.flush()
                # Classification keeps the most accurate weights; pretraining the lowest
                # validation loss (accuracy of masked tokens says little about L1 pixels).
                best_loss = loop.get("best_eval_loss")
                if (result["loss"] < best_loss if pretraining and best_loss is not None
                        else result["accuracy"] > loop["best_eval_accuracy"]):
                    loop["best_eval_accuracy"], loop["best_step"] = result["accuracy"], step
                    loop["best_eval_loss"] = result["loss"]
                    ckpts.save_best(step, weights_of(state),
                                    {"step": step, "eval_accuracy": result["accuracy"],
                                     "eval_loss": result["loss"]})
                # Zoology's early stop (valid accuracy > 0.99): the schedule still spans
                # num_train_steps, as Zoology's cosine spans max_epochs.
                threshold = config.get("early_stop_accuracy", 0.0)
                if threshold and result["accuracy"] > threshold:
                    loop["stopped_at_step"] = step
            if do_save:
                save_last(state, step)
                clock = time.perf_counter()  # evaluation and saving are not training time
                input_since_clock = 0.0
            if loop.get("stopped_at_step") == step:
                _log(f"val acc {result['accuracy']:.4f} > early_stop_accuracy {threshold}: "
                     f"stopped at step {step} of {config.num_train_steps}.")
                break
            if notice:
                why = "SIGINT (Ctrl-C)" if interrupted() else "SIGTERM"
                _log(f"{why}: saved step {step} to {ckpts.directory}/last; "
                     f"re-run the same command to resume.")
                raise Preempted(step)
        flush()
    finally:
        if tracing:  # a run stopped inside the traced steps still writes its trace
            jax.profiler.stop_trace()
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)
        if writer:
            writer.close()

    # 5. Test with the best-on-validation weights; if they cannot be read (a corrupt or
    # truncated file), with the last weights, said in one line and in results.json: the
    # run's training is not lost to one bad file, and a re-run would meet the same file.
    best_step = loop["best_step"] if loop["best_step"] >= 0 else None
    test_weights = "best"
    try:
        if config.get("test_weights", "best") == "last":  # MAD's: the last epoch's weights
            best_weights, best_info = weights_of(state), {"step": int(state["step"])}
            test_weights = f"last (step {best_info['step']}): config.test_weights"
        else:
            best_weights, best_info = ckpts.restore_best(weights_of(state), best_step)
    except Exception as e:  # noqa: BLE001  (CorruptCheckpoint, orbax's read errors)
        best_weights, best_info = weights_of(state), {"step": int(state["step"])}
        test_weights = (f"last (step {best_info['step']}): the best checkpoint (step "
                        f"{best_step}) cannot be read")
        _warn(f"{test_weights} ({checkpoint._first_line(e, 160)}); testing the last weights "
              "instead")
    test = evaluate(best_weights, "test")
    ckpts.close()
    length_accuracy, depth_accuracy, split_accuracy = [], [], []  # lra/training/lengths.py
    steps_at = {}  # the test step per (model length, label slots), compiled once
    for entry in length_plan + depth_plan + split_plan:
        rows = task.load(config.data_dir, "test", entry["max_length"], **entry["options"])
        at = lengths.config_at(config, entry["max_length"])
        key = (entry["max_length"], label_slots({"test": rows}, at))
        if key not in steps_at:
            _, step = make_steps(entry["graphdef"] or graphdef, tx, schedule,
                                 task.num_classes, at, task.vocab_size, label_slots=key[1])
            steps_at[key] = in_mesh(jax.jit(
                step, in_shardings=(weights_shardings, batch_sharding),
                out_shardings=replicated))
        got = evaluate(best_weights, "test", rows=rows, step=steps_at[key])
        row = {"length": entry["length"], "max_length": entry["max_length"], **got}
        if "split" in entry:
            split_accuracy.append({"split": entry["split"], **row})
            _log(f"split {entry['split']:>12} | test acc {got['accuracy']:.4f}")
        elif "depth" not in entry:
            length_accuracy.append(row)
            _log(f"length {entry['length']:>6} | test acc {got['accuracy']:.4f}")
        else:
            lo, hi = entry["depth"]
            depth_accuracy.append({**row, "depth_min": lo, "depth_max": hi})
            _log(f"length {entry['length']:>6} depth [{lo:.2f}, {hi:.2f}) | test acc "
                 f"{got['accuracy']:.4f}")
    if pretraining:
        # The most frequent training token's share of the test tokens: what predicting
        # one token everywhere would score.
        def tokens(split):  # every real token, of both documents for retrieval
            return np.concatenate([data[split][i][data[split][m].astype(bool)]
                                   for i, m in (("inputs", "mask"), ("inputs2", "mask2"))
                                   if i in data[split]])

        majority = int(np.bincount(tokens("train"), minlength=task.vocab_size).argmax())
        test_tokens = tokens("test")
    elif token_level:
        # sequence_labels: the most frequent training label, at the test's labelled positions
        def labels(split):
            y = data[split]["targets"]
            return y[(y != -100) & data[split]["mask"].astype(bool)]

        majority = int(np.bincount(labels("train"), minlength=task.vocab_size).argmax())
        test_tokens = labels("test")
    else:
        majority = int(np.bincount(data["train"]["targets"],
                                   minlength=task.num_classes).argmax())
        test_tokens = data["test"]["targets"]
    results = {
        "task": config.task,
        # A hybrid's name, e.g. gla+transformer@1,3 (its resolved layers below).
        "model": spec.name,
        "objective": config.objective,
        "init_from": config.init_from or None,
        "num_params": int(num_params),
        "steps": int(config.num_train_steps),
        # The step an early stop ended training at (config.early_stop_accuracy), else None.
        "stopped_at_step": loop.get("stopped_at_step"),
        "best_eval_accuracy": loop["best_eval_accuracy"],
        # The best step on validation (its accuracy beside it), and the step whose weights
        # were tested: the last one when the best checkpoint could not be read.
        "best_step": best_step if best_step is not None else best_info["step"],
        "test_step": best_info["step"],
        "test_weights": test_weights,
        "test_accuracy": test["accuracy"],
        "test_loss": test["loss"],
        "best_eval_loss": loop.get("best_eval_loss"),
        "test_bits_per_token": test.get("bits_per_token"),
        # sequence_labels: test_accuracy is per labelled position; this, per example (every
        # labelled position of the example right).
        "test_example_accuracy": test.get("example_accuracy"),
        # config.eval_lengths: the test weights on the test split made at each length.
        "length_accuracy": length_accuracy or None,
        # config.eval_depth_buckets: the same per (length, needle depth range).
        "depth_accuracy": depth_accuracy or None,
        # config.eval_splits: the same on test splits made with other task options.
        "split_accuracy": split_accuracy or None,
        # Zoology's BASED recipe: the kernel of the short convolution before every mixer
        # (config.block.short_conv; 0 = none).
        "short_conv": int(config.block.get("short_conv", 0)) if "block" in config else 0,
        # Positions, convolutions, heads, capacity, params, flops per token, measured on
        # the model (lra/runs/card.py); the reports rank only cells whose cards agree.
        "scaffold_card": scaffold_card,
        # sequence_labels: the mean over classes of per-class accuracy, torchmetrics'
        # MulticlassAccuracy(average='macro') as MAD logs it (test_accuracy is micro).
        "test_macro_accuracy": test.get("macro_accuracy"),
        # ... by config.macro_accuracy's rule; with batch_mean, the pooled one beside it.
        "macro_accuracy_rule": config.get("macro_accuracy", "pooled"),
        "test_pooled_macro_accuracy": test.get("pooled_macro_accuracy",
                                               test.get("macro_accuracy")),
        "majority_class": majority,
        "majority_baseline_accuracy": float(np.mean(test_tokens == majority)),
        "train_steps_per_sec": (loop["timed_steps"] / loop["train_seconds"]
                                if loop["train_seconds"] else 0.0),
        # Share of the timed training wall time the host spent getting batches (reading,
        # batching, placing on devices): near 1, the run is input-bound.
        "input_wait_fraction": record.input_fraction(loop),
        "eval_history": loop["eval_history"],
        "train_history": loop["train_history"],
        "num_devices": jax.device_count(),
        "mesh_shape": dict(mesh.shape),
        "param_bytes": param_bytes,
        "param_bytes_per_device": param_bytes_per_device,
        "train_step_temp_bytes": train_step_temp_bytes,
        "device_peak_bytes": record.device_peak_bytes(),
        "num_processes": jax.process_count(),
        "jax_version": jax.__version__,
        "data_fingerprint": fingerprint,
        "config": config.to_dict(),
    }
    if spec.is_hybrid:  # every layer's mixer, hparams, block and groups
        results["layers"] = spec.layer_list()
    if jax.process_index() == 0:
        record.write_json(os.path.join(workdir, "results.json"), results)
        _log(record.results_table(results))
    return results


if __name__ == "__main__":  # `python -m lra.train ...` is the command, lra.launch
    import runpy

    runpy.run_module("lra.launch", run_name="__main__", alter_sys=True)

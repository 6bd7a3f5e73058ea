"""The LRA training loop: `train_and_evaluate(config, workdir)`, top to bottom.

One plain `jax.jit` train step over split NNX state (params, the rest of the model state
such as RNG counters, optimizer state), donated, with explicit shardings over a `data`
mesh axis even on one device. Evaluation every `eval_frequency` steps on the validation
split; the test split is evaluated once, with the best-on-validation weights.

A run is resumable: the same command with the same workdir restores the last checkpoint
(model, optimizer, data-iterator position, best-so-far) and ends with the metrics an
uninterrupted run gets. SIGTERM saves a checkpoint, then raises `Preempted`.

The steps, in the order train_and_evaluate takes them (each a function below):
  _check      everything the user can get wrong, before anything is written; the task and
              the RunSpec (lra/runs/spec.py: the config resolved once into the layer list,
              the model's name and the parameter groups, which every later step reads)
  _set_up     resume point, warm start (init_from), data, optimizer; _init_state: the
              model built abstractly, the scaffold card, the length plans, the mesh, and
              the state initialised shard by shard where it lives
  _restore    the newest readable `last` checkpoint (lra/training/resume.py), else
              config.init_from's encoder
  _compile    the train step, ahead of time, and the eval step
  _train      the train loop: progress lines (_flush), a diverged loss stops it
              (_stop_diverged), validation and the best weights (_validate), `last`
              checkpoints (_save_last), preemption (processes.PreemptionNotice)
  _evaluate   metrics over a split (lra/training/objectives.py evaluate)
  _test       the best weights on the test split, then at config.eval_lengths, depths
              and splits (_test_at_lengths, lra/training/lengths.py)
  _write      results.json (lra/training/record.py results) and the results table
"""
from __future__ import annotations

import math
import os
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
from lra.errors import ConfigError
from models import precision, registry
from lra.training.objectives import add_eval_masks, evaluate, label_slots, make_steps
# Preempted, interrupt_as_preemption, TrainingDiverged and build_model are lra.train's API
# (launch.py, lra.generate, lra.benchmark, the tests): defined in those modules.
from lra.training.interrupts import (  # noqa: F401
    Preempted, TrainingDiverged, interrupt_as_preemption, interrupted)
from lra.training.model import build_model

# Written when the loss diverges; re-running the workdir may then also change the
# optimisation (resume.AFTER_DIVERGENCE_FIELDS) and goes on from the last good checkpoint.
DIVERGED_FILE = "diverged.json"

# A training loss above this many times max(1, ln(num_classes)) (a classifier's loss at
# initialisation is ln(num_classes)) counts as diverged, like a NaN: logits hundreds of
# nats apart are weights that blew up, and the next steps are NaN.
EXPLODED_LOSS_FACTOR = 100.0


# Steps the host may dispatch ahead of the device: enough to overlap input and compute.
MAX_STEPS_AHEAD = 2


# ----------------------------------------------------------------------------- helpers
# (the input's: lra/training/input_pipeline.py; what a run records: lra/training/record.py)


def _bound_steps_in_flight(pending: list[tuple[int, Any]]) -> None:
    """Waits for all but the newest MAX_STEPS_AHEAD dispatched steps. JAX dispatches
    without limit: unchecked, the host queues every step up to the next log line (with
    their batches), and SIGTERM's checkpoint then waits for all of them."""
    if len(pending) > MAX_STEPS_AHEAD:
        jax.block_until_ready(pending[-1 - MAX_STEPS_AHEAD][1])


# ----------------------------------------------------------------------------- the steps


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Trains, evaluates, tests with the best checkpoint; returns and writes results.json.

    Holds `<workdir>/run.lock` while it runs (a second run is refused at once)."""
    task, spec = _check(config)
    lock = processes.lock_workdir(workdir)
    try:
        started = time.perf_counter()
        run = _set_up(config, workdir, task, spec)
        _restore(run)
        # Wall time over every segment of the run (a resumed run adds its earlier ones'):
        # what a queue of runs plans with (lra.sweep --status).
        before = run.loop.get("wall_seconds", 0.0)
        if run.start_step and "wall_seconds" not in run.loop:
            # A checkpoint from before run_seconds existed: its segments are not counted.
            run.loop.setdefault("wall_from_step", run.start_step)
        run.wall_clock = lambda: before + time.perf_counter() - started
        _compile(run)
        _train(run)
        return _write(run, *_test(run))
    finally:
        lock.release()


def _check(config: ml_collections.ConfigDict) -> tuple[lra.tasks.Task, RunSpec]:
    """Everything the user can get wrong, checked before anything is written; the task
    and the RunSpec."""
    # First, that every process of the run was given the same settings.
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
    # name, the parameter groups; every step below reads it rather than the config's forms.
    return task, resolve(config)


class _Run:
    """What the steps share: the config, task and spec, then what _set_up, _restore and
    _compile make (checkpoints, data, optimizer, shardings, state, loop record, steps)."""

    def __init__(self, **fields: Any):
        self.__dict__.update(fields)

    def weights(self, state: dict | None = None) -> dict:
        """The model's weights ({"params", "rest"}) of `state` (the run's by default)."""
        state = self.state if state is None else state
        return {"params": state["params"], "rest": state["rest"]}

    def in_mesh(self, jitted):
        """`jitted` called under the mesh and activation rules: traced under these,
        models.layers.constrain pins the activations' sharding."""
        def call(*args):
            with jax.set_mesh(self.mesh), nnx.logical_axis_rules(self.activation_rules):
                return jitted(*args)
        return call


def _set_up(config, workdir: str, task, spec: RunSpec) -> _Run:
    """Resume point, warm start, data and optimizer, each checked before the step is
    compiled; then the state, initialised where it lives (_init_state)."""
    run = _Run(config=config, workdir=workdir, task=task, spec=spec,
               diverged_path=os.path.join(workdir, DIVERGED_FILE),
               ckpts=checkpoint.Checkpoints(workdir))
    run.diverged = os.path.exists(run.diverged_path)
    # Resume point and config check before the data is read and the step compiled.
    run.unreadable, run.resume_step, resume_loop = resume.resume_point(
        run.ckpts, config, workdir, run.diverged, spec)
    if run.ckpts.last_steps() and run.resume_step is None:
        processes.check_peers()  # as in _restore: a lost process, not bad files
        raise resume.unrestorable(run.ckpts, run.unreadable)
    # The run to start from (config.init_from), checked before anything is compiled; a
    # resumed run has its weights in its own checkpoint already.
    run.source = (init_from.find_source(config, spec)
                  if config.init_from and run.resume_step is None else None)
    run.preemption_sync = processes.preemption_sync_point(run.resume_step or 0)
    run.data = input_pipeline.load_data(config, task)
    run.fingerprint = resume.data_fingerprint(run.data)
    processes.agree_on(f"the data read from config.data_dir={config.data_dir}",
                       {f"{split} split (hash)": h for split, h in run.fingerprint.items()})
    if run.resume_step is not None:
        resume.check_same_data(resume_loop.get("data_fingerprint"), run.data, config, workdir)
    if config.objective == "mlm":
        add_eval_masks(run.data, config)
    # Per-position predictions (pretraining, or a task's labels per position); only
    # pretraining keeps the lowest validation loss and counts tokens for its baseline.
    run.token_level = config.objective != "classify"
    run.pretraining = config.objective in ("mlm", "causal_lm")
    run.schedule = learning_rate_schedule(config)
    run.tx = make_optimizer(config, run.schedule, spec)
    _init_state(run)
    return run


def _init_state(run: _Run) -> None:
    """State, optimizer, shardings. The model is first built abstractly (shapes and
    logical axis names only); then every device initialises just its own shards, which
    is also how a multi-process run gets global arrays without copying host values."""
    config, task, spec = run.config, run.task, run.spec

    def init_state() -> dict:
        _, params, rest = nnx.split(build_model(config, task, spec), nnx.Param, ...)
        # config.param_dtype: the parameters (and so the optimizer's state) as stored.
        params = precision.cast_params(params, precision.dtype_of(config.param_dtype))
        return {"step": jnp.int32(0), "params": params, "rest": rest,
                "opt_state": run.tx.init(params)}

    try:
        run.graphdef = nnx.split(nnx.eval_shape(lambda: build_model(config, task, spec)),
                                 nnx.Param, ...)[0]
        abstract_state = jax.eval_shape(init_state)
    except ValueError as e:  # unknown hparams, impossible combinations (causal + CLS, ...)
        raise ConfigError(f"cannot build model {spec.name!r}: {e}") from None
    run.num_params = sum(x.size for x in jax.tree.leaves(abstract_state["params"]))
    # What the model shares with the other mixers of a comparison, measured on it.
    run.scaffold_card = card.card(
        config, nnx.eval_shape(lambda: build_model(config, task, spec)), spec=spec)
    # config.eval_lengths: the model at each length, checked now to take these weights
    # (first in config.eval_attention_impl's form, where that is another one).
    def abstract_model_at(c):
        return nnx.eval_shape(lambda: build_model(c, task))

    run.test_graphdef = lengths.graphdef_at_training_length(config, abstract_model_at)
    run.length_plan = lengths.plan(config, task, abstract_model_at)
    run.depth_plan = lengths.depth_plan(config, task, run.length_plan)  # eval_depth_buckets
    run.split_plan = lengths.split_plan(config, task)  # config.eval_splits
    # A (data, model) mesh; parameters and optimizer state placed by config.sharding's
    # rules on their logical axis names (lra/training/sharding.py). Auto axes: XLA propagates
    # shardings from these inputs (GSPMD), guided by the model's activation constraints.
    run.mesh = sharding.make_mesh(config)
    run.activation_rules = sharding.activation_rules(config.sharding)
    run.replicated = NamedSharding(run.mesh, P())
    run.batch_sharding = sharding.batch_sharding(run.mesh)
    run.state_shardings = sharding.state_shardings(abstract_state, config.sharding, run.mesh)
    run.state = jax.jit(init_state, out_shardings=run.state_shardings)()
    run.param_bytes = record.param_bytes(run.state["params"])
    run.weights_shardings = {"params": run.state_shardings["params"],
                             "rest": run.state_shardings["rest"]}


def _restore(run: _Run) -> None:
    """Resume from the newest readable `last` checkpoint, if there is one (before
    compiling: a refusal comes at once), with the data iterator's position and the loop's
    record; else start from config.init_from's encoder, if given. Newer unreadable
    checkpoints are removed, and so are best checkpoints that the restored state does not
    know of: best and last always describe the same run."""
    config, ckpts = run.config, run.ckpts
    run.train_iter = input_pipeline.train_iterator(
        run.data["train"], global_batch_size=config.batch_size, seed=config.random_seed,
        rows=input_pipeline.process_rows(run.batch_sharding, config.batch_size))
    run.loop = {"best_eval_accuracy": -1.0, "best_eval_loss": None, "best_step": -1,
                "eval_history": [],
                "train_history": [], "train_seconds": 0.0, "timed_steps": 0,
                "input_seconds": 0.0,
                "config": config.to_dict(), "data_fingerprint": run.fingerprint}
    restored_step = None
    for step in [s for s in ckpts.last_steps()
                 if run.resume_step is not None and s <= run.resume_step]:
        try:
            if step != run.resume_step:
                resume.check_compatible(ckpts.last_loop(step)["config"], config, run.workdir,
                                        step=step, diverged=run.diverged, spec=run.spec)
            run.state, saved_loop = ckpts.restore_last(run.state, step)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001  (corrupt or partial files)
            run.unreadable.append((step, e))
            continue
        restored_step = step
        run.train_iter.set_state(saved_loop.pop("train_iter"))
        run.loop.update(saved_loop, config=config.to_dict(), data_fingerprint=run.fingerprint)
        break
    resume.clean_up(ckpts, run.unreadable, run.resume_step, restored_step,
                    run.loop["best_step"])
    if restored_step is None and run.diverged and jax.process_index() == 0:
        os.remove(run.diverged_path)  # no good checkpoint was kept: this is a new run
        run.diverged = False
    if restored_step is not None:
        _log(f"Resumed from {ckpts.directory}/last at step {int(run.state['step'])}.")
    run.start_step = int(run.state["step"])
    if restored_step is None and config.init_from:
        saved = init_from.read(config, run.source)  # the earlier run's weights, read once
        run.state["params"] = init_from.load_encoder(config, run.state["params"], run.source,
                                                     saved, run.spec)
        run.state["rest"] = init_from.load_encoder_state(config, run.state["rest"],
                                                         run.source, saved, run.spec)


def _compile(run: _Run) -> None:
    """The train step, compiled ahead of time: one compilation, and XLA's memory analysis
    of it goes into results.json (train_step_temp_bytes); the eval step, jitted."""
    config, data = run.config, run.data
    train_step, eval_step = make_steps(run.graphdef, run.tx, run.schedule,
                                       run.task.num_classes, config, run.task.vocab_size,
                                       label_slots=label_slots(data, config))
    abstract_batch = {
        k: jax.ShapeDtypeStruct((config.batch_size, *v.shape[1:]), v.dtype,
                                sharding=run.batch_sharding)
        for k, v in data["train"].items()}
    with jax.set_mesh(run.mesh), nnx.logical_axis_rules(run.activation_rules):
        run.train_step = jax.jit(
            train_step, in_shardings=(run.state_shardings, run.batch_sharding),
            out_shardings=(run.state_shardings, run.replicated),
            donate_argnums=0).lower(run.state, abstract_batch).compile()
    memory = run.train_step.memory_analysis()
    run.train_step_temp_bytes = (int(memory.temp_size_in_bytes) if memory is not None
                                 else None)
    run.eval_step = run.in_mesh(jax.jit(
        eval_step, in_shardings=(run.weights_shardings, run.batch_sharding),
        out_shardings=run.replicated))


def _evaluate(run: _Run, weights, split: str, num_batches: int = -1, *, rows=None,
              step=None) -> dict[str, float]:
    """Metrics over a split (`rows`: other data in its place, with `step`)."""
    return evaluate(step or run.eval_step, weights, run.data[split] if rows is None else rows,
                    run.config, run.batch_sharding, num_batches)


# ----------------------------------------------------------------------------- train loop


def _save_last(run: _Run, step: int) -> None:
    run.loop["wall_seconds"] = run.wall_clock()
    run.ckpts.save_last(step, run.state, {**run.loop, "train_iter": run.train_iter.get_state()})
    if run.diverged:  # the run went on past its divergence with the new config
        if jax.process_index() == 0 and os.path.exists(run.diverged_path):
            os.remove(run.diverged_path)
        run.diverged = False


def _loss_limit(run: _Run) -> float:
    """A fresh model's loss is ln(classes), ln(vocabulary) for token prediction, under 1
    for L1: EXPLODED_LOSS_FACTOR times that (at least 1) counts as diverged."""
    config, task = run.config, run.task
    loss_scale = (task.num_classes if not run.token_level
                  else task.vocab_size if config.lm_loss == "xent" else 1)
    return EXPLODED_LOSS_FACTOR * max(1.0, math.log(loss_scale))


def _stop_diverged(run: _Run, step: int, loss: float) -> None:
    """The weights after step-1 updates gave a diverged loss at `step`: every
    checkpoint from step-1 on holds them (or worse); delete those, keep the others."""
    ckpts, config = run.ckpts, run.config
    bad = [c for c in ckpts.last_steps() if c >= step - 1]
    for c in bad:
        ckpts.delete_last(c)
    good = ckpts.last_step()
    if jax.process_index() == 0:
        record.write_json(run.diverged_path, {"step": step, "loss": loss,
                                              "last_good_step": good,
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
        f"{_loss_limit(run):.0f}); stopped, {where}, or use another --workdir")


def _flush(run: _Run, pending: list[tuple[int, Any]], writer) -> None:
    """Fetch pending metrics, stop on a diverged loss, log a progress line."""
    if not pending:
        return
    config, loop, loss_limit = run.config, run.loop, _loss_limit(run)
    fetched = jax.device_get([m for _, m in pending])
    steps = [s for s, _ in pending]
    pending.clear()
    for s, m in zip(steps, fetched):
        total = float(m["loss"]) + float(m["aux_loss"])
        if not math.isfinite(total) or float(m["loss"]) > loss_limit:
            _stop_diverged(run, s, total if not math.isfinite(total) else float(m["loss"]))
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


def _validate(run: _Run, step: int, writer) -> dict[str, float]:
    """Evaluation on the validation split; the best weights so far saved as `best`, and
    an early stop noted (config.early_stop_accuracy)."""
    config, loop = run.config, run.loop
    result = _evaluate(run, run.weights(), "val", config.num_eval_steps)
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
    # Classification keeps the most accurate weights; pretraining the lowest validation
    # loss (accuracy of masked tokens says little about L1 pixels).
    best_loss = loop.get("best_eval_loss")
    if (result["loss"] < best_loss if run.pretraining and best_loss is not None
            else result["accuracy"] > loop["best_eval_accuracy"]):
        loop["best_eval_accuracy"], loop["best_step"] = result["accuracy"], step
        loop["best_eval_loss"] = result["loss"]
        run.ckpts.save_best(step, run.weights(),
                            {"step": step, "eval_accuracy": result["accuracy"],
                             "eval_loss": result["loss"]})
    # Zoology's early stop (valid accuracy > 0.99): the schedule still spans
    # num_train_steps, as Zoology's cosine spans max_epochs.
    threshold = config.get("early_stop_accuracy", 0.0)
    if threshold and result["accuracy"] > threshold:
        loop["stopped_at_step"] = step
    return result


def _train(run: _Run) -> None:
    """The train loop, from the restored step: a progress line every log_every_steps,
    validation every eval_frequency steps, a `last` checkpoint every checkpoint_freq.
    SIGTERM: one process notes it (signal handler) and saves at the next step; several
    processes agree on the step through jax's preemption sync point (its own SIGTERM
    handler), or else at the next log step (an all-gather of the flags)."""
    config, loop, workdir = run.config, run.loop, run.workdir
    writer = None
    if jax.process_index() == 0:
        from tensorboardX import SummaryWriter  # imported late: slow, and process 0 only
        writer = SummaryWriter(os.path.join(workdir, "tensorboard"))
    pending: list[tuple[int, dict]] = []  # per-step metrics not yet fetched from the device
    clock, steps_since_clock, first_step_of_segment = time.perf_counter(), 0, True
    what = ("" if not run.token_level else f" (pretraining: {config.objective}, "
            f"{config.lm_loss})" if run.pretraining else f" ({config.objective})")
    # A run that stopped early (config.early_stop_accuracy) and is run again resumes at
    # its stopping step: nothing is left to train.
    end_step = loop.get("stopped_at_step") or config.num_train_steps
    stopped = " (stopped early there)" if loop.get("stopped_at_step") else ""
    _log(f"Training {run.spec.description if run.spec.is_hybrid else config.model} "
         f"on {config.task}{what}: {run.num_params:,} parameters, "
         f"steps {run.start_step}..{end_step}{stopped}, {jax.device_count()} device(s).")
    profile = common.parse_profile_steps(config.get("profile_steps", ""))
    profile_dir = os.path.join(workdir, "profile")
    tracing = False
    input_since_clock = 0.0  # host time spent waiting for batches in the timed window
    notice = processes.PreemptionNotice(run.preemption_sync, config.log_every_steps)
    try:
        for step in range(run.start_step + 1, end_step + 1):
            if profile and step == profile[0] and jax.process_index() == 0:
                jax.profiler.start_trace(profile_dir)
                tracing = True
            waited = time.perf_counter()
            batch = input_pipeline.to_global(next(run.train_iter), run.batch_sharding)
            input_since_clock += time.perf_counter() - waited
            run.state, metrics = run.train_step(run.state, batch)
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
            preempted = notice(step)
            do_eval = step % config.eval_frequency == 0 or is_last
            do_save = do_eval or step % config.checkpoint_freq == 0 or is_last or preempted
            if step % config.log_every_steps == 0 or do_save:
                jax.block_until_ready(metrics)
                loop["train_seconds"] += time.perf_counter() - clock
                loop["timed_steps"] += steps_since_clock
                loop["input_seconds"] = loop.get("input_seconds", 0.0) + input_since_clock
                _flush(run, pending, writer)
                steps_since_clock, clock, input_since_clock = 0, time.perf_counter(), 0.0
            paused = time.perf_counter()
            if do_eval:
                result = _validate(run, step, writer)
            if do_save:
                # Validation's time (the save's own is left in the wall: the checkpoint
                # holds the loop record as it was before it was written).
                loop["evaluation_seconds"] = (loop.get("evaluation_seconds", 0.0)
                                              + time.perf_counter() - paused)
                _save_last(run, step)
                clock = time.perf_counter()  # evaluation and saving are not training time
                input_since_clock = 0.0
            if loop.get("stopped_at_step") == step:
                _log(f"val acc {result['accuracy']:.4f} > early_stop_accuracy "
                     f"{config.get('early_stop_accuracy')}: stopped at step {step} of "
                     f"{config.num_train_steps}.")
                break
            if preempted:
                why = "SIGINT (Ctrl-C)" if interrupted() else "SIGTERM"
                _log(f"{why}: saved step {step} to {run.ckpts.directory}/last; "
                     f"re-run the same command to resume.")
                raise Preempted(step)
        _flush(run, pending, writer)
    finally:
        if tracing:  # a run stopped inside the traced steps still writes its trace
            jax.profiler.stop_trace()
        notice.close()
        if writer:
            writer.close()


# ----------------------------------------------------------------------------- test, write


def _test(run: _Run) -> tuple[dict, dict, str]:
    """Test with the best-on-validation weights; if they cannot be read (a corrupt or
    truncated file), with the last weights, said in one line and in results.json: the
    run's training is not lost to one bad file, and a re-run would meet the same file.
    Then the same weights at config.eval_lengths, eval_depth_buckets and eval_splits
    (lra/training/lengths.py). (test metrics, the tested step's info, which weights)."""
    config, state, loop = run.config, run.state, run.loop
    started = time.perf_counter()
    best_step = loop["best_step"] if loop["best_step"] >= 0 else None
    test_weights = "best"
    try:
        if config.get("test_weights", "best") == "last":  # MAD's: the last epoch's weights
            best_weights, best_info = run.weights(), {"step": int(state["step"])}
            test_weights = f"last (step {best_info['step']}): config.test_weights"
        else:
            best_weights, best_info = run.ckpts.restore_best(run.weights(), best_step)
    except Exception as e:  # noqa: BLE001  (CorruptCheckpoint, orbax's read errors)
        best_weights, best_info = run.weights(), {"step": int(state["step"])}
        test_weights = (f"last (step {best_info['step']}): the best checkpoint (step "
                        f"{best_step}) cannot be read")
        _warn(f"{test_weights} ({checkpoint._first_line(e, 160)}); testing the last weights "
              "instead")
    test = _evaluate(run, best_weights, "test")
    run.ckpts.close()
    test.update(_test_at_lengths(run, best_weights))
    loop["test_seconds"] = time.perf_counter() - started
    loop["wall_seconds"] = run.wall_clock()
    return test, best_info, test_weights


def _test_at_lengths(run: _Run, weights) -> dict[str, list]:
    """The test weights on the test split made at each config.eval_lengths length, per
    needle depth range (eval_depth_buckets) and with other task options (eval_splits)."""
    def compile_step(graphdef, at, slots):
        _, step = make_steps(graphdef or run.test_graphdef or run.graphdef, run.tx,
                             run.schedule, run.task.num_classes, at, run.task.vocab_size,
                             label_slots=slots)
        return run.in_mesh(jax.jit(step, in_shardings=(run.weights_shardings,
                                                       run.batch_sharding),
                                   out_shardings=run.replicated))

    plans = run.length_plan + run.depth_plan + run.split_plan
    if plans and run.test_graphdef is not None:
        _log(f"tested in attention_impl={lengths.test_impl(run.config)} "
             "(config.eval_attention_impl; trained in "
             f"attention_impl={run.config.attention_impl})")
    known, remember = {}, None
    # One process: with several, each would read its own host's file and the collectives
    # of the tests it skips would not match.
    if plans and jax.process_count() == 1:
        known, remember = lengths.tested_before(run.workdir, lengths.fingerprint(weights))
    return lengths.test(plans, run.config, run.task, compile_step=compile_step, log=_log,
                        evaluate=lambda rows, step: _evaluate(run, weights, "test",
                                                              rows=rows, step=step),
                        known=known, remember=remember)


def _write(run: _Run, test: dict, best_info: dict, test_weights: str) -> dict:
    """results.json (process 0) and the results table; returns the results."""
    results = record.results(
        run.config, run.loop, test, model=run.spec.name, layers=run.spec.layer_list(),
        best_info=best_info, test_weights=test_weights, num_params=run.num_params,
        scaffold_card=run.scaffold_card,
        majority=record.majority_baseline(run.data, run.task, token_level=run.token_level,
                                          pretraining=run.pretraining),
        mesh_shape=dict(run.mesh.shape), param_bytes=run.param_bytes,
        train_step_temp_bytes=run.train_step_temp_bytes, fingerprint=run.fingerprint)
    if jax.process_index() == 0:
        record.write_json(os.path.join(run.workdir, "results.json"), results)
        _log(record.results_table(results))
    return results


if __name__ == "__main__":  # `python -m lra.train ...` is the command, lra.launch
    import runpy

    runpy.run_module("lra.launch", run_name="__main__", alter_sys=True)

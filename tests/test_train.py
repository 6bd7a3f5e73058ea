"""The training loop end to end: results, resume after SIGKILL, SIGTERM, divergence, errors."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra import train
from lra.runs import cli
from lra.training import optim
from lra.errors import ConfigError, DataError
from models import registry

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIRED_RESULT_KEYS = ("task", "model", "num_params", "steps", "best_eval_accuracy",
                        "test_accuracy", "train_steps_per_sec", "config")


def _launch(workdir, *flags, devices=1, **popen):
    # Keep the caller's XLA_FLAGS (e.g. --xla_gpu_deterministic_ops=true on a GPU).
    xla_flags = os.environ.get("XLA_FLAGS", "")
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               XLA_FLAGS=f"{xla_flags} --xla_force_host_platform_device_count={devices}")
    cmd = [sys.executable, os.path.join(REPO, "launch.py"), f"--workdir={workdir}", *flags]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def _run(workdir, *flags, devices=1, timeout=300):
    proc = _launch(workdir, *flags, devices=devices)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _metrics(results):
    keys = ("best_eval_accuracy", "best_step", "test_accuracy", "test_loss", "eval_history")
    return {k: results[k] for k in keys}


def test_train_and_evaluate_writes_results(tiny_listops_config, listops_dir, tmp_path):
    config = tiny_listops_config(listops_dir, num_train_steps=12, eval_frequency=4,
                                 profile_steps="5,6")
    results = train.train_and_evaluate(config, str(tmp_path))
    on_disk = json.load(open(tmp_path / "results.json"))
    # The profiler switch: a trace of steps 5..6 (TensorBoard's xplane and Perfetto's json).
    traces = [f for _, _, files in os.walk(tmp_path / "profile") for f in files]
    assert any(f.endswith(".xplane.pb") for f in traces), traces
    assert 0.0 <= on_disk["input_wait_fraction"] <= 1.0
    # Where the wall time went: each part measured, inside the whole.
    seconds = on_disk["run_seconds"]
    assert all(seconds[k] > 0 for k in ("wall", "train", "evaluation", "test")), seconds
    assert seconds["train"] + seconds["evaluation"] + seconds["test"] < seconds["wall"]
    assert on_disk["device_kind"] == jax.devices()[0].device_kind  # "cpu" here
    # The malloc pages this process has (steps/s compare only under the same pages).
    assert on_disk["host_malloc"] == cli.malloc_pages(dict(os.environ))
    assert on_disk["host_malloc"] is None or re.fullmatch(r"huge pages|\d+ KiB pages",
                                                           on_disk["host_malloc"])
    for key in REQUIRED_RESULT_KEYS:
        assert key in on_disk, key
    assert on_disk["test_accuracy"] == results["test_accuracy"]
    assert on_disk["config"]["model"] == "transformer"
    assert [h["step"] for h in on_disk["eval_history"]] == [4, 8, 12]
    best = max(on_disk["eval_history"], key=lambda h: h["accuracy"])
    assert on_disk["best_eval_accuracy"] == best["accuracy"]
    assert on_disk["best_step"] == best["step"]
    assert 0.0 <= on_disk["test_accuracy"] <= 1.0
    assert os.listdir(tmp_path / "tensorboard")
    # A finished run started again changes nothing.
    from lra.training import checkpoint

    saved = checkpoint.Checkpoints(str(tmp_path)).last_loop()["wall_seconds"]
    assert 0 < saved < seconds["wall"]  # the last save came before the test
    again = train.train_and_evaluate(config, str(tmp_path))
    assert _metrics(again) == _metrics(results)
    # ... but its wall time is the first segment's (to its last save) and this one's.
    assert again["run_seconds"]["wall"] >= saved + again["run_seconds"]["test"]


def test_test_accuracy_uses_best_checkpoint_not_last(tiny_listops_config, listops_dir, tmp_path,
                                                     monkeypatch):
    """After the best step, destroy the weights: the test must still use the best ones."""
    # The first 4 steps of both runs are identical: same data order, same learning rates.
    reference = train.train_and_evaluate(
        tiny_listops_config(listops_dir, num_train_steps=4, eval_frequency=4),
        str(tmp_path / "a"))
    config = tiny_listops_config(listops_dir, num_train_steps=8, eval_frequency=4)
    real_schedule = train.learning_rate_schedule

    def wrecking_schedule(cfg):
        inner = real_schedule(cfg)
        # Gradient ascent after step 4: the last weights are worse than the best.
        return lambda step: inner(step) * jnp.where(step >= 4, -100.0, 1.0)

    monkeypatch.setattr(train, "learning_rate_schedule", wrecking_schedule)
    # The ascent drives the loss past the divergence limit (100 x ln 10): not what this
    # test is about.
    monkeypatch.setattr(train, "EXPLODED_LOSS_FACTOR", float("inf"))
    results = train.train_and_evaluate(config, str(tmp_path / "b"))
    history = {h["step"]: h["accuracy"] for h in results["eval_history"]}
    losses = {h["step"]: h["loss"] for h in results["eval_history"]}
    assert history[8] <= history[4] and losses[8] > 100 * losses[4]  # ties keep the earlier
    assert results["best_step"] == 4
    # Test metrics are those of the step-4 weights, not of the ruined last ones.
    assert results["test_accuracy"] == reference["test_accuracy"]
    assert results["test_loss"] == pytest.approx(reference["test_loss"], rel=1e-6)


def test_host_stays_at_most_two_steps_ahead(tiny_listops_config, listops_dir, tmp_path,
                                            monkeypatch):
    """JAX dispatches asynchronously without limit. With a device slower than the host,
    the loop used to queue every step up to the next log line; SIGTERM then waited for
    all of them (a Pathfinder run at 5 s a step ignored it for minutes)."""
    import jax
    real_make_steps, real_bound = train.make_steps, train._bound_steps_in_flight

    def slow_device_steps(*args, **kwargs):
        train_step, eval_step = real_make_steps(*args, **kwargs)

        def slow_train_step(state, batch):
            state, metrics = train_step(state, batch)
            x = jnp.full((400, 400), 1e-3)
            busy = jax.lax.fori_loop(0, 40, lambda _, y: jnp.tanh(y @ x), x)
            return state, {**metrics, "busy": jnp.sum(busy)}

        return slow_train_step, eval_step

    not_done = []

    def watching_bound(pending):
        real_bound(pending)
        not_done.append(sum(not m["loss"].is_ready() for _, m in pending))

    monkeypatch.setattr(train, "make_steps", slow_device_steps)
    monkeypatch.setattr(train, "_bound_steps_in_flight", watching_bound)
    config = tiny_listops_config(listops_dir, num_train_steps=30, eval_frequency=30)
    config.log_every_steps = 30
    train.train_and_evaluate(config, str(tmp_path))
    assert len(not_done) == 30
    assert max(not_done) <= train.MAX_STEPS_AHEAD, not_done


def test_resume_after_sigkill_matches_uninterrupted(listops_dir, tmp_path):
    flags = ["--config=configs/listops.py:runlocal", f"--config.data_dir={listops_dir}",
             "--config.max_length=48", "--config.num_train_steps=300",
             "--config.checkpoint_freq=20", "--config.eval_frequency=50",
             "--config.log_every_steps=10", "--config.num_eval_steps=-1"]
    # Two devices: the batch is sharded over a 2-device data mesh.
    code, out, err = _run(tmp_path / "straight", *flags, devices=2)
    assert code == 0, err
    straight = json.load(open(tmp_path / "straight" / "results.json"))

    workdir = tmp_path / "killed"
    proc = _launch(workdir, *flags, devices=2)
    last = workdir / "checkpoints" / "last"
    deadline = time.time() + 240
    while time.time() < deadline:
        steps = [int(d) for d in os.listdir(last) if d.isdigit()] if last.exists() else []
        if steps and max(steps) >= 40:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert not (workdir / "results.json").exists(), "the run finished before the kill"
    code, out, err = _run(workdir, *flags, devices=2)
    assert code == 0, err
    assert "Resumed from" in out
    resumed = json.load(open(workdir / "results.json"))
    assert _metrics(resumed) == _metrics(straight)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_sigterm_saves_and_resumes(listops_dir, tmp_path, sig):
    """SIGTERM (preemption) and SIGINT (Ctrl-C, issue 46 item 3: it used to exit 130 with
    no checkpoint and a temporary orbax folder left behind) both save and stop in one
    line."""
    flags = ["--config=configs/listops.py:runlocal", f"--config.data_dir={listops_dir}",
             "--config.max_length=48", "--config.num_train_steps=100000",
             "--config.checkpoint_freq=100000", "--config.eval_frequency=100000",
             "--config.log_every_steps=5"]
    proc = _launch(tmp_path, *flags)
    # Wait for training to be under way (a progress line), then preempt.
    for line in proc.stdout:
        if line.startswith("step"):
            break
    proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == {"SIGTERM": 143, "SIGINT": 130}[sig], err
    assert {"SIGTERM": "SIGTERM: saved step",
            "SIGINT": "SIGINT (Ctrl-C): saved step"}[sig] in out
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    last = tmp_path / "checkpoints" / "last"
    saved = [int(d) for d in os.listdir(last) if d.isdigit()]
    assert len(saved) == 1 and 5 <= saved[0] < 100000
    assert not [d for d in os.listdir(last) if "tmp" in d]
    assert not (tmp_path / "results.json").exists()


def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(tiny_listops_config, listops_dir,
                                                             tmp_path, monkeypatch):
    real_schedule = train.learning_rate_schedule

    def poisoned_schedule(cfg):
        inner = real_schedule(cfg)
        return lambda step: inner(step) * jnp.where(step >= 12, jnp.nan, 1.0)

    monkeypatch.setattr(train, "learning_rate_schedule", poisoned_schedule)
    config = tiny_listops_config(listops_dir, num_train_steps=40, checkpoint_freq=5,
                                 eval_frequency=1000, log_every_steps=5)
    with pytest.raises(train.TrainingDiverged, match=r"step 1[34].*last good checkpoint "
                                                     r"\(step 10\)"):
        train.train_and_evaluate(config, str(tmp_path))
    last = tmp_path / "checkpoints" / "last"
    # The previous `last` checkpoint is kept too (checkpoint.LAST_TO_KEEP).
    assert sorted(int(d) for d in os.listdir(last) if d.isdigit()) == [5, 10]
    # The kept checkpoint is finite and restorable: resuming without the poison finishes.
    monkeypatch.setattr(train, "learning_rate_schedule", real_schedule)
    results = train.train_and_evaluate(config, str(tmp_path))
    assert np.isfinite(results["test_loss"])


@pytest.mark.slow  # ~15-20 s per variant; the conformance suite covers the mixers themselves
@pytest.mark.parametrize("name", registry.available())
def test_every_variant_trains_two_steps(name, tiny_listops_config, listops_dir, tmp_path):
    config = tiny_listops_config(listops_dir, model=name, num_train_steps=2, eval_frequency=2,
                                 checkpoint_freq=2, num_eval_steps=1)
    results = train.train_and_evaluate(config, str(tmp_path))
    assert results["steps"] == 2 and results["model"] == name
    assert np.isfinite(results["test_loss"]) and 0.0 <= results["test_accuracy"] <= 1.0


def test_learning_rate_schedule_matches_lra():
    from configs import listops

    config = listops.get_config()
    schedule = optim.learning_rate_schedule(config)
    for step in (0, 1, 500, 1000, 4000):
        expected = 0.05 * min(1.0, step / 1000) / np.sqrt(max(step, 1000))
        np.testing.assert_allclose(float(schedule(step)), expected, rtol=1e-6)
    config.factors = "constant * linear_warmup * cosine_decay"
    config.warmup, config.num_train_steps = 10, 110
    schedule = optim.learning_rate_schedule(config)
    np.testing.assert_allclose(float(schedule(60)), 0.05 * 0.5 * (1 + np.cos(np.pi * 0.5)),
                               rtol=1e-6)
    # fairseq's linear_decay (Mega's recipes): 1 through the warmup, then linearly to 0.
    config.factors = "constant * linear_warmup * linear_decay"
    schedule = optim.learning_rate_schedule(config)
    for step, expected in ((5, 0.025), (10, 0.05), (60, 0.025), (110, 0.0), (200, 0.0)):
        np.testing.assert_allclose(float(schedule(step)), expected, rtol=1e-6, atol=1e-9)
    config.factors = "constant * warmup"
    with pytest.raises(ConfigError, match="unknown factor 'warmup'"):
        optim.learning_rate_schedule(config)


@pytest.mark.parametrize("grad_clip_norm", [0.0, 1.0])
def test_optimizer_state_of_unmarked_models_keeps_the_plain_layout(grad_clip_norm):
    """Checkpoints written before parameters could carry bounds/no_weight_decay hold the
    plain (clip +) AdamW state; a model without such marks must still restore them."""
    import jax
    import ml_collections
    import optax
    from flax import nnx

    model = registry.build("transformer", dim=8, num_heads=2, max_len=4, rngs=nnx.Rngs(0))
    _, params, _ = nnx.split(model, nnx.Param, ...)
    config = ml_collections.ConfigDict(dict(adam_b1=0.9, adam_b2=0.98, adam_eps=1e-9,
                                            weight_decay=0.1, grad_clip_norm=grad_clip_norm))
    plain = optax.adamw(lambda step: 0.1, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.1)
    if grad_clip_norm:
        plain = optax.chain(optax.clip_by_global_norm(grad_clip_norm), plain)
    got = jax.tree.structure(optim.make_optimizer(config, lambda step: 0.1).init(params))
    assert got == jax.tree.structure(plain.init(params))


@pytest.mark.parametrize("grad_clip_norm", [0.0, 1.0])
def test_optimizer_clamps_bounded_params_and_does_not_decay_them(grad_clip_norm):
    """adaptive_span's span (Param metadata bounds=(0, 1), no_weight_decay) is clamped
    after every step, as the paper's `clamp_param`, and AdamW's weight decay leaves it
    alone; every other parameter is decayed."""
    import jax
    import ml_collections
    import optax
    from flax import nnx

    model = registry.build("adaptive_span", dim=9, num_heads=3, max_len=8, causal=False,
                           rngs=nnx.Rngs(0))
    model.span_fraction[...] = jnp.array([0.05, 0.5, 0.97])
    _, params, _ = nnx.split(model, nnx.Param, ...)
    mask = optim.weight_decay_mask(params)
    assert mask["span_fraction"] is False and mask["query"]["kernel"] is True
    config = ml_collections.ConfigDict(dict(adam_b1=0.9, adam_b2=0.98, adam_eps=1e-9,
                                            weight_decay=0.5, grad_clip_norm=grad_clip_norm))
    tx = optim.make_optimizer(config, lambda step: 0.1)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state):
        # The span's gradient pushes head 0 below 0 and head 2 above 1; head 1 and the
        # other parameters get none, so only weight decay can move them.
        grads = jax.tree.map(jnp.zeros_like, params)
        grads["span_fraction"][...] = jnp.array([1.0, 0.0, -1.0])
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    kernel0 = np.asarray(params["query"]["kernel"][...])
    for _ in range(4):
        params, opt_state = step(params, opt_state)
        span = np.asarray(params["span_fraction"][...])
        assert 0.0 <= span.min() and span.max() <= 1.0
    # Adam moves each step by ~lr = 0.1: without the clamp head 0 would be at -0.35.
    np.testing.assert_array_equal(np.asarray(params["span_fraction"][...]), [0.0, 0.5, 1.0])
    kernel = np.asarray(params["query"]["kernel"][...])
    np.testing.assert_allclose(kernel, kernel0 * (1 - 0.1 * 0.5) ** 4, rtol=1e-5)


def test_train_step_keeps_the_adaptive_span_in_range():
    """The loop's train step: an L1 weight that drives every span below 0 leaves them at 0."""
    import jax
    from flax import nnx

    import lra.tasks
    from configs import listops

    config = listops.get_config("model=adaptive_span,runlocal")
    config.update(num_layers=1, emb_dim=16, qkv_dim=16, mlp_dim=16, num_heads=2,
                  max_length=16, batch_size=2)
    config.model_hparams.l1_weight = 10.0
    config.model_hparams.span_init = 0.01
    task = lra.tasks.get(config.task)
    graphdef, params, rest = nnx.split(train.build_model(config, task), nnx.Param, ...)
    schedule = optim.learning_rate_schedule(config)
    tx = optim.make_optimizer(config, lambda step: 0.05)
    train_step, _ = train.make_steps(graphdef, tx, schedule, task.num_classes)
    rng = np.random.default_rng(0)
    batch = {"inputs": jnp.asarray(rng.integers(1, task.vocab_size, (2, 16)), jnp.int32),
             "mask": jnp.ones((2, 16), jnp.bool_), "targets": jnp.asarray([1, 2], jnp.int32)}
    state = {"step": jnp.int32(0), "params": params, "rest": rest,
             "opt_state": tx.init(params)}
    step = jax.jit(train_step)
    for _ in range(3):
        state, metrics = step(state, batch)
        assert float(metrics["aux_loss"]) >= 0.0
    spans = [np.asarray(v[...]) for path, v in nnx.to_flat_state(state["params"])
             if path[-1] == "span_fraction"]
    assert spans
    for span in spans:
        np.testing.assert_array_equal(span, 0.0)


# ----------------------------------------------------------------------------- bad input


def _assert_nothing_written(workdir):
    assert not os.path.exists(os.path.join(workdir, "checkpoints"))


def test_missing_data_dir(tiny_listops_config, tmp_path):
    config = tiny_listops_config(str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="nowhere.*python -m lra.tasks.listops"):
        train.train_and_evaluate(config, str(tmp_path / "w"))
    _assert_nothing_written(tmp_path / "w")


@pytest.mark.parametrize("bad_row, message", [
    ("[MAX 1 2 ] 3", r"basic_val.tsv:3:"),  # no tab
    ("( ( [MAX 1 ) 2 ) ] )\t12", r"basic_val.tsv:3: label 12 is outside \[0, 10\)"),
])
def test_bad_rows(tiny_listops_config, listops_dir, tmp_path, bad_row, message):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val", "test"):
        lines = open(os.path.join(listops_dir, f"basic_{split}.tsv")).read().splitlines()
        if split == "val":
            lines[2] = bad_row
        (data / f"basic_{split}.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=message):
        train.train_and_evaluate(tiny_listops_config(str(data)), str(tmp_path / "w"))
    _assert_nothing_written(tmp_path / "w")


def test_unknown_model_lists_available():
    from configs import listops

    with pytest.raises(ConfigError, match="unknown model 'nope'; available: .*transformer"):
        listops.get_config("model=nope")


def test_unknown_task_option(tiny_listops_config, listops_dir, tmp_path):
    config = tiny_listops_config(listops_dir)
    config.task_options.colour = "red"
    with pytest.raises(ConfigError, match="task_options.colour"):
        train.train_and_evaluate(config, str(tmp_path))
    _assert_nothing_written(tmp_path)


def test_resume_with_other_shapes_is_refused(tiny_listops_config, listops_dir, tmp_path):
    train.train_and_evaluate(tiny_listops_config(listops_dir, num_train_steps=2), str(tmp_path))
    with pytest.raises(ConfigError, match="emb_dim=32.*emb_dim=16.*another --workdir"):
        train.train_and_evaluate(
            tiny_listops_config(listops_dir, num_train_steps=2, emb_dim=16, qkv_dim=16),
            str(tmp_path))


@pytest.mark.parametrize("flag, message", [
    ("--config.no_such_field=1", "no_such_field"),
    ("--config=configs/listops.py:model=nope", "unknown model 'nope'"),
    ("--config.data_dir=/nonexistent/listops", "/nonexistent/listops"),
])
def test_launch_reports_errors_in_one_line(tmp_path, flag, message):
    flags = ["--config=configs/listops.py:runlocal", flag]
    code, out, err = _run(tmp_path / "w", *flags, timeout=120)
    assert code != 0
    lines = [l for l in err.splitlines() if l.strip() and "WARNING" not in l]
    assert any(message in l for l in lines), err
    assert "Traceback" not in err, err
    _assert_nothing_written(tmp_path / "w")

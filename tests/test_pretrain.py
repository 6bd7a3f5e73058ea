"""Self-pretraining (config.objective mlm / causal_lm) through the task configs and the one
training loop, and fine-tuning from it (config.init_from)."""
from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

import lra.tasks
from configs import common
from lra import train
from lra.training import checkpoint, init_from, objectives, optim
from lra.errors import ConfigError
from tests.test_tasks_train import write_aan, write_cifar, write_imdb

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(task: str, data_dir: str, arg: str = "runlocal,pretrain", **extra):
    config = importlib.import_module(f"configs.{task}").get_config(arg)
    config.data_dir = data_dir
    settings = {"num_train_steps": 4, "eval_frequency": 2, "checkpoint_freq": 2,
                "num_eval_steps": 1, "log_every_steps": 2}
    if task != "image":
        settings["max_length"] = 32
    for key, value in {**settings, **extra}.items():
        sub, _, field = key.rpartition(".")
        (config[sub] if sub else config)[field] = value
    return config


def test_pretrain_argument_sets_the_papers_objective_per_task():
    for task, ratio, loss in (("listops", 0.10, "xent"), ("text", 0.15, "xent"),
                              ("retrieval", 0.15, "xent"), ("image", 0.5, "l1"),
                              ("pathfinder", 0.5, "l1"), ("pathx", 0.5, "xent")):
        c = importlib.import_module(f"configs.{task}").get_config("pretrain")
        assert (c.objective, c.mask_ratio, c.lm_loss) == ("mlm", ratio, loss), task
        plain = importlib.import_module(f"configs.{task}").get_config("")
        assert plain.objective == "classify" and plain.init_from == ""
    c = importlib.import_module("configs.listops").get_config("pretrain,causal")
    assert (c.objective, c.causal, c.pooling) == ("causal_lm", True, "MEAN")


def test_mlm_trains_and_its_eval_masks_are_the_ratio_of_real_tokens(listops_dir, tmp_path):
    config = _config("listops", listops_dir)
    results = train.train_and_evaluate(config, str(tmp_path))
    assert results["objective"] == "mlm" and results["init_from"] is None
    assert results["config"]["objective"] == "mlm"
    assert np.isfinite(results["test_loss"]) and 0 <= results["test_accuracy"] <= 1
    # The best weights are those of the lowest validation loss.
    best = min(results["eval_history"], key=lambda h: h["loss"])
    assert results["best_step"] == best["step"]
    assert results["best_eval_loss"] == pytest.approx(best["loss"])
    # A fresh model's token loss is about ln(vocabulary), far below ln(10) * 100.
    assert results["train_history"][0]["loss"] < 2 * math.log(lra.tasks.get("listops").vocab_size)

    data = {s: lra.tasks.get("listops").load(listops_dir, s, 32) for s in ("val", "test")}
    objectives.add_eval_masks(data, config)
    for split in data:
        real = data[split]["mask"]
        assert not np.any(data[split]["masked"] & ~real)  # only real tokens are masked
        assert data[split]["masked"].sum() / real.sum() == pytest.approx(0.10, abs=0.03)


def test_train_masks_change_every_step_and_follow_the_step():
    """Dynamic masking: each step draws its own positions, from the step number."""
    config = importlib.import_module("configs.listops").get_config("runlocal,pretrain")
    config.max_length = 16
    task = lra.tasks.get("listops")
    model = train.build_model(config, task)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optim.make_optimizer(config, optim.learning_rate_schedule(config))
    seen = {}  # the `masked` positions each step passes to the model
    real_losses = objectives._token_losses

    def spy(model, tokens, mask, masked, **kw):
        seen.setdefault("masks", []).append(masked)
        return real_losses(model, tokens, mask, masked, **kw)

    objectives._token_losses = spy
    try:
        train_step, _ = objectives.make_steps(graphdef, tx, optim.learning_rate_schedule(config),
                                              task.num_classes, config, task.vocab_size)
        batch = {"inputs": np.ones((4, 16), np.int32) * 3, "mask": np.ones((4, 16), bool),
                 "targets": np.zeros(4, np.int32)}
        state = {"step": np.int32(0), "params": params, "rest": rest,
                 "opt_state": tx.init(params)}
        masks = []
        for step in (0, 1, 0):
            seen.clear()
            train_step(dict(state, step=np.int32(step)), batch)
            masks.append(np.asarray(seen["masks"][0]))
    finally:
        objectives._token_losses = real_losses
    assert not np.array_equal(masks[0], masks[1])
    np.testing.assert_array_equal(masks[0], masks[2])
    assert 0 < masks[0].sum() < masks[0].size


def test_causal_lm_reports_bits_per_token(listops_dir, tmp_path):
    config = _config("listops", listops_dir, "runlocal,pretrain,causal")
    results = train.train_and_evaluate(config, str(tmp_path))
    assert results["objective"] == "causal_lm"
    assert results["test_bits_per_token"] == pytest.approx(results["test_loss"] / math.log(2))
    assert all("bits_per_token" in h for h in results["eval_history"])


@pytest.mark.parametrize("task", ["text", "retrieval", "image"])
def test_other_tasks_pretrain(task, tmp_path):
    rng = np.random.default_rng(0)
    writer = {"text": write_imdb, "retrieval": write_aan, "image": write_cifar}[task]
    writer(tmp_path, rng)
    extra = {"task_options.validation": "test"} if task == "image" else {}
    results = train.train_and_evaluate(_config(task, str(tmp_path), **extra),
                                       str(tmp_path / "w"))
    assert results["objective"] == "mlm" and np.isfinite(results["test_loss"])
    if task == "image":
        # L1 on intensities in [0, 1]: a fresh model's loss is below 1, not ln(256).
        assert results["config"]["lm_loss"] == "l1" and results["test_loss"] < 1.5


def test_retrieval_pretrains_on_both_documents(tmp_path):
    """The eval count of predicted tokens covers the masked tokens of both documents."""
    write_aan(tmp_path, np.random.default_rng(0))
    config = _config("retrieval", str(tmp_path))
    task = lra.tasks.get("retrieval")
    data = {"val": task.load(str(tmp_path), "val", 32)}
    objectives.add_eval_masks(data, config)
    model = train.build_model(config, task)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optim.make_optimizer(config, optim.learning_rate_schedule(config))
    _, eval_step = objectives.make_steps(graphdef, tx, optim.learning_rate_schedule(config),
                                         task.num_classes, config, task.vocab_size)
    batch = dict(data["val"], weights=np.ones(len(data["val"]["targets"]), np.float32))
    sums = eval_step({"params": params, "rest": rest}, batch)
    both = data["val"]["masked"].sum() + data["val"]["masked2"].sum()
    assert data["val"]["masked2"].sum() > 0
    assert float(sums["count"]) == both


def test_init_from_loads_the_encoder_and_leaves_the_head(listops_dir, tmp_path):
    pre = _config("listops", listops_dir)
    train.train_and_evaluate(pre, str(tmp_path / "pre"))
    fine = _config("listops", listops_dir, "runlocal", init_from=str(tmp_path / "pre"))
    task = lra.tasks.get("listops")
    _, fresh, _ = nnx.split(train.build_model(fine, task), nnx.Param, ...)
    fresh = jax.tree.map(lambda x: x, fresh)
    source = init_from.find_source(fine)
    assert source[2] == "best"
    loaded = init_from.load_encoder(fine, fresh, source)
    saved = checkpoint.Checkpoints(str(tmp_path / "pre")).restore_params(source[1], "best")
    saved_flat = {init_from._path_str(p): v
                  for p, v in jax.tree_util.tree_leaves_with_path(saved)}
    n_encoder = 0
    for path, value in jax.tree_util.tree_leaves_with_path(loaded):
        name = init_from._path_str(path)
        fresh_value = dict((init_from._path_str(p), v)
                           for p, v in jax.tree_util.tree_leaves_with_path(fresh))[name]
        if name.startswith("encoder/"):
            n_encoder += 1
            np.testing.assert_array_equal(np.asarray(value), saved_flat[name])
        else:  # the head: as initialised, and absent from the pretraining run
            assert name.startswith("head/") and name not in saved_flat
            np.testing.assert_array_equal(np.asarray(value), np.asarray(fresh_value))
    assert n_encoder > 5
    assert "mask_vector" in saved_flat and "lm_head/kernel" in saved_flat

    results = train.train_and_evaluate(fine, str(tmp_path / "fine"))
    assert results["init_from"] == str(tmp_path / "pre") and results["objective"] == "classify"


def test_init_from_carries_the_encoders_random_features(listops_dir, tmp_path):
    """performer's encoder is fine-tuned with the random features it was pretrained with
    (state, not parameters): a fresh draw would meet weights adapted to another one."""
    from models.attention import features

    pre = _config("listops", listops_dir, "model=performer,runlocal,pretrain",
                  **{"model_hparams.redraw_interval": 1})  # redrawn: not any run's first draw
    train.train_and_evaluate(pre, str(tmp_path / "pre"))
    fine = _config("listops", listops_dir, "model=performer,runlocal",
                   init_from=str(tmp_path / "pre"), num_train_steps=2,
                   **{"model_hparams.redraw_interval": 1000})  # no redraw while fine-tuning
    train.train_and_evaluate(fine, str(tmp_path / "fine"))
    source = init_from.find_source(fine)

    def feature_leaves(run, step, kind):
        rest = checkpoint.Checkpoints(run).restore_weights(step, kind)["rest"]
        return {init_from._path_str(p): v for p, v in jax.tree_util.tree_leaves_with_path(rest)
                if init_from._path_str(p).endswith("projection/features")}

    pretrained = feature_leaves(str(tmp_path / "pre"), source[1], source[2])
    tuned = feature_leaves(str(tmp_path / "fine"), 2, "last")
    assert len(pretrained) == fine.num_layers and set(tuned) == set(pretrained)
    for name, value in pretrained.items():
        np.testing.assert_array_equal(tuned[name], value)
    fresh = nnx.state(train.build_model(fine, lra.tasks.get("listops")),
                      features.RandomFeatures)
    assert not np.allclose(np.asarray(jax.tree.leaves(fresh)[0]),
                           next(iter(pretrained.values())))


@pytest.fixture(scope="module")
def pretrained(listops_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("pretrained")
    train.train_and_evaluate(_config("listops", listops_dir, num_train_steps=2), str(path))
    return str(path)


@pytest.mark.parametrize("change, message", [
    ({"init_from": "/nonexistent/run"}, "no such folder"),
    ({"model": "linformer"}, "is a run with model='transformer'; this config has "
                             "model='linformer'"),
    ({"emb_dim": 64, "qkv_dim": 64}, "emb_dim=32"),
    ({"block.stack": "universal"}, "has no parameter encoder/stack/"),
    ({"max_length": 24}, "parameter encoder/embeddings/position has shape (33, 32) there "
                         "and (25, 32) here"),
])
def test_init_from_bad_runs_are_one_line(pretrained, listops_dir, tmp_path, change, message):
    extra = {"init_from": pretrained, **change}
    if "model" in change:
        config = _config("listops", listops_dir, f"runlocal,model={change['model']}",
                         init_from=pretrained)
    else:
        config = _config("listops", listops_dir, "runlocal", **extra)
    with pytest.raises(ConfigError) as e:
        train.train_and_evaluate(config, str(tmp_path / "w"))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_init_from_a_folder_without_checkpoints(listops_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    config = _config("listops", listops_dir, "runlocal", init_from=str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="holds no checkpoints"):
        train.train_and_evaluate(config, str(tmp_path / "w"))
    assert not os.path.exists(tmp_path / "empty" / "checkpoints")  # nothing written there


@pytest.mark.parametrize("arg, change, message", [
    ("runlocal,pretrain,causal,model=linformer", {}, "model 'linformer' is not causal"),
    ("runlocal,pretrain,causal", {"pooling": "CLS"}, "config.pooling='CLS'"),
    ("runlocal,pretrain", {"causal": True}, "objective='mlm' is bidirectional"),
    ("runlocal", {"objective": "causal_lm"}, "needs config.causal=True"),
    ("runlocal,pretrain", {"lm_loss": "l1"}, "task 'listops' has symbolic tokens"),
    ("runlocal,pretrain", {"mask_ratio": 0.0}, "config.mask_ratio=0.0 must be > 0.0"),
])
def test_bad_objective_configs_are_one_line(listops_dir, tmp_path, arg, change, message):
    config = _config("listops", listops_dir, arg, **change)
    with pytest.raises(ConfigError) as e:
        train.train_and_evaluate(config, str(tmp_path / "w"))
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "w" / "checkpoints")


def test_launch_pretrain_then_finetune_and_a_bad_init_from(listops_dir, tmp_path):
    """The documented commands, in a subprocess: pretrain, fine-tune from it; init_from
    at a missing folder is one line on stderr and exit 2."""
    def run(arg, *flags):
        return subprocess.run(
            [sys.executable, "launch.py", f"--config=configs/listops.py:{arg}",
             f"--config.data_dir={listops_dir}", "--config.max_length=32",
             "--config.num_train_steps=2", "--config.eval_frequency=2", *flags],
            cwd=REPO, capture_output=True, text=True, timeout=300)

    pre = run("runlocal,pretrain", f"--workdir={tmp_path}/pre")
    assert pre.returncode == 0, pre.stderr[-2000:]
    assert "(pretraining: mlm, xent)" in pre.stdout and "transformer (mlm)" in pre.stdout
    fine = run("runlocal", f"--config.init_from={tmp_path}/pre", f"--workdir={tmp_path}/fine")
    assert fine.returncode == 0, fine.stderr[-2000:]
    assert "Initialised" in fine.stdout and "the head starts fresh" in fine.stdout
    assert "warning" not in fine.stderr.lower(), fine.stderr
    assert json.load(open(tmp_path / "fine" / "results.json"))["init_from"] == f"{tmp_path}/pre"
    bad = run("runlocal", f"--config.init_from={tmp_path}/none", f"--workdir={tmp_path}/bad")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "no such folder" in bad.stderr


def test_pretraining_resumes_exactly(listops_dir, tmp_path):
    whole = train.train_and_evaluate(_config("listops", listops_dir, num_train_steps=6),
                                     str(tmp_path / "whole"))
    train.train_and_evaluate(_config("listops", listops_dir, num_train_steps=2),
                             str(tmp_path / "parts"))
    resumed = train.train_and_evaluate(_config("listops", listops_dir, num_train_steps=6),
                                       str(tmp_path / "parts"))
    assert [h["loss"] for h in resumed["train_history"]] == pytest.approx(
        [h["loss"] for h in whole["train_history"]], rel=1e-6)
    assert resumed["test_loss"] == pytest.approx(whole["test_loss"], rel=1e-6)


def test_validate_rejects_an_unknown_objective():
    c = importlib.import_module("configs.listops").get_config("runlocal")
    c.objective = "contrastive"
    with pytest.raises(ConfigError, match="config.objective='contrastive'"):
        common.validate(c)

"""Pixel generation in bits/dim (issue 34, section 2): the `generation` config argument of
configs/image.py (CIFAR-10 in colour, 3072 sub-pixels) and configs/mnist.py (784 pixels);
the start token (config.start_token) that makes every pixel a target, so that
test_bits_per_token is bits per dim over ALL dims of the image; lra.generate on such a run.
"""
from __future__ import annotations

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import lra.tasks
from configs import common, image
from configs import mnist as mnist_config
from lra import generate, train
from lra.reporting import samples as samples_lib
from lra.training import objectives
from lra.errors import ConfigError
from tests.tasks.test_mnist import write_mnist

START = 256  # the start token's id: the vocabulary's size


def _config(arg="model=linear,generation,runlocal"):
    c = mnist_config.get_config(arg)
    common.validate(c)
    return c


def _eval_step(config, model):
    task = lra.tasks.get(config.task)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    _, eval_step = objectives.make_steps(graphdef, optax.sgd(0.0), lambda step: 0.0,
                                         task.num_classes, config, vocab_size=task.vocab_size)
    return jax.jit(eval_step), {"params": params, "rest": rest}


def _images(n=3, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(n, 784)).astype(np.int32)


@pytest.mark.parametrize("bias", ["uniform", "random"])
def test_bits_per_dim_counts_every_pixel_and_matches_a_hand_computation(bias):
    """A head whose kernel is 0 predicts the same distribution p (softmax of its bias over
    the 256 values) at every position, so bits/dim is the pixels' mean -log2 p[pixel]: by
    hand from the pixel values, over all 784 of each image (the first one too)."""
    config = _config()
    model = train.build_model(config, lra.tasks.get("mnist"))
    assert model.lm_head.kernel.shape[-1] == START + 1  # one more id: the start token
    model.lm_head.kernel[...] = jnp.zeros_like(model.lm_head.kernel[...])
    logits = np.zeros(START + 1, np.float32)
    if bias == "random":
        logits[:START] = np.random.default_rng(1).normal(size=START)
    logits[START] = 30.0  # the start id's logit: not in the 256-way softmax
    model.lm_head.bias[...] = jnp.asarray(logits)
    eval_step, weights = _eval_step(config, model)
    images = _images()
    batch = {"inputs": images, "mask": np.ones_like(images, bool),
             "targets": np.zeros(3, np.int32), "weights": np.ones(3, np.float32)}
    sums = jax.device_get(eval_step(weights, batch))
    assert float(sums["count"]) == 3 * 784  # every dim of every image is a target
    bits = float(sums["loss_sum"]) / float(sums["count"]) / math.log(2)
    if bias == "uniform":
        assert bits == pytest.approx(8.0, abs=1e-5)  # log2 256; with the start id: 8.0056
    log2_p = (logits[:START] - np.log(np.exp(logits[:START].astype(np.float64)).sum())) / (
        math.log(2))
    assert bits == pytest.approx(-log2_p[images].mean(), abs=1e-5)
    # A padding row (weight 0) counts nothing.
    batch["weights"] = np.array([1, 1, 0], np.float32)
    assert float(eval_step(weights, batch)["count"]) == 2 * 784


def test_every_pixel_is_predicted_from_the_pixels_before_it_only():
    config = _config("model=transformer,generation,runlocal")
    model = train.build_model(config, lra.tasks.get("mnist"))
    graphdef, state = nnx.split(model)

    @jax.jit
    def predictions(state, images):  # what the loss scores: output t predicts pixel t
        inputs, mask = objectives.shift_right(images, jnp.ones(images.shape, bool), START)
        return nnx.merge(graphdef, state)(inputs, mask, deterministic=True)[..., :START]

    images = _images(2)
    out = np.asarray(predictions(state, images))
    assert out.shape == (2, 784, START)
    # Pixel 0 is predicted from the start token alone: the same for every image.
    np.testing.assert_allclose(out[0, 0], out[1, 0], atol=1e-6)
    assert not np.allclose(out[0, 1], out[1, 1], atol=1e-3)
    changed = images.copy()
    changed[:, 400] = 255 - changed[:, 400]
    out2 = np.asarray(predictions(state, changed))
    np.testing.assert_allclose(out2[:, :401], out[:, :401], atol=1e-5)  # pixel 400: unseen
    assert not np.allclose(out2[:, 401], out[:, 401], atol=1e-3)


def test_generation_configs():
    c = image.get_config("generation")
    assert (c.task_options.pixels, c.max_length, c.objective, c.causal, c.start_token,
            c.lm_loss, c.pooling) == ("rgb", 3072, "causal_lm", True, True, "xent", "MEAN")
    assert image.get_config("model=local_2d,generation").model_hparams.width == 96
    assert image.get_config("model=local_2d").model_hparams.get("width") is None
    m = mnist_config.get_config("generation")
    assert (m.task, m.max_length, m.objective, m.start_token, m.lm_loss) == (
        "mnist", 784, "causal_lm", True, "xent")
    assert (m.num_layers, m.num_heads, m.emb_dim, m.mlp_dim) == (8, 8, 256, 1024)
    for module, arg in ((image, "generation"), (mnist_config, "generation"),
                        (mnist_config, "")):
        for size in ("mini", "runlocal"):
            small = module.get_config(f"model=linear,{','.join(filter(None, [arg, size]))}")
            common.validate(small)
            assert small.max_length == module.get_config(arg).max_length  # whole images
    assert mnist_config.get_config("").objective == "classify"
    # LRA's image config is unchanged by the option.
    assert image.get_config("").task_options.to_dict() == {"validation": "holdout"}
    for bad in ("generation,pretrain", "generation,locality"):
        with pytest.raises(ConfigError, match="'generation' .*does not combine with"):
            mnist_config.get_config(bad)
    with pytest.raises(ConfigError, match="MNIST has no published recipes"):
        mnist_config.get_config("paper")
    c = mnist_config.get_config("runlocal")
    c.start_token = True
    with pytest.raises(ConfigError, match="start_token=True makes causal_lm predict the "
                                          "first token too; config.objective='classify'"):
        common.validate(c)


def test_colour_samples_are_drawn_in_colour(tmp_path):
    rgb = np.arange(3072) % 256
    sample = {"length": 3072, "prompt": rgb[:1536], "generated": rgb[1536:],
              "original": rgb[1536:]}
    rows = samples_lib.pixel_rows([sample], colour=True)
    assert [a.shape for a in rows[0]] == [(32, 32, 3)] * 3
    np.testing.assert_array_equal(rows[0][0], rgb.reshape(32, 32, 3))
    assert (rows[0][1][16:] == samples_lib.BLANK).all()  # the bottom half: not given
    grid = samples_lib.png_grid(rows)
    assert grid.shape == (96 + 8, 3 * 96 + 16, 3)
    samples_lib.write_png(str(tmp_path / "c.png"), grid)
    from PIL import Image

    with Image.open(tmp_path / "c.png") as png:
        assert png.mode == "RGB"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """An MNIST generation run (linear, runlocal sizes, 784 pixels), 2 steps."""
    data = str(tmp_path_factory.mktemp("mnist"))
    write_mnist(data, num_train=12, num_test=4)
    config = _config()
    config.data_dir = data
    config.task_options.num_validation = 4
    for key, value in {"num_train_steps": 2, "eval_frequency": 2, "checkpoint_freq": 2,
                       "num_eval_steps": 1, "log_every_steps": 1}.items():
        config[key] = value
    workdir = str(tmp_path_factory.mktemp("run"))
    train.train_and_evaluate(config, workdir)
    return workdir


def test_a_run_reports_bits_per_dim_and_generates_whole_images(run, tmp_path):
    results = json.load(open(os.path.join(run, "results.json")))
    assert results["test_bits_per_token"] == pytest.approx(results["test_loss"] / math.log(2))
    assert results["config"]["start_token"] and results["objective"] == "causal_lm"
    # Whole images from the start token alone (--prompt_len=0), never the start id.
    whole = generate.generate(run, num_samples=2, prompt_len=0, output=str(tmp_path / "w"))
    for s in whole["samples"]:
        assert len(s["prompt"]) == 0 and len(s["generated"]) == 784
        assert s["generated"].max() < START
    # The cache held the start token and every pixel but the last (never fed).
    np.testing.assert_array_equal(whole["timing"]["tokens_held_B"], [784, 784])
    from PIL import Image

    with Image.open(whole["path"]) as png:  # 28 x 28 scaled by 4 (>= 96)
        assert png.size == (3 * 112 + 4 * 4, 2 * 112 + 3 * 4)


def test_greedy_completions_are_the_parallel_forwards_argmax(run, tmp_path):
    """Top half given (the default prompt: 392 of 784 pixels), bottom half generated; the
    greedy tokens are what the parallel forward on the growing sequence predicts, read
    behind the start token."""
    result = generate.generate(run, num_samples=2, temperature=0, output=str(tmp_path))
    config, _ = generate.load_config(run)
    model = generate.build(config, lra.tasks.get("mnist"))
    generate.restore(model, run)
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda state, t, m: nnx.merge(graphdef, state)(t, m, deterministic=True))
    for s in result["samples"]:
        assert len(s["prompt"]) == len(s["generated"]) == 392
        seq = [START, *(int(t) for t in s["prompt"])]
        for k in range(6):
            tokens = np.zeros((1, 784), np.int32)
            tokens[0, :len(seq)] = seq
            out = np.asarray(forward(state, tokens, np.arange(784)[None] < len(seq)))
            logits = out[0, len(seq) - 1, :START]
            top2 = np.sort(logits)[-2:]
            if top2[1] - top2[0] < 1e-4:  # a tie within float noise: either is right
                break
            assert int(s["generated"][k]) == int(np.argmax(logits)), k
            seq.append(int(s["generated"][k]))

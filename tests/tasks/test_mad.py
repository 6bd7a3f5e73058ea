"""MAD's tasks (lra/tasks/mad.py): rows pinned to mad-lab's, each generator's invariants,
the readers, configs/mad.py, and a runlocal run per registered task."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from lra.errors import ConfigError
from lra.tasks import mad

# The first three training rows of each task at MAD's baseline, as mad-lab's own
# generate_data gave them in its train.py order (athms/mad-lab @ 0f49a45; every row of the
# baseline train and test sets is identical: results/cpu/mqar_mad_generators.md):
# (row 0's last ten tokens, the three rows' token sums, their label sums).
MAD_TRAIN_ROWS = {
    "in_context_recall": ([15, 5, 15, 6, 13, 5, 15, 7, 13, 3], [1024, 916, 949], [1037, 922, 959]),
    "fuzzy_in_context_recall": ([11, 9, 12, 2, 8, 10, 11, 2, 8, 10], [937, 922, 907],
                                [933, 916, 899]),
    "noisy_in_context_recall": ([12, 1, 9, 0, 8, 18, 19, 3, 12, 6], [1250, 1612, 1348],
                                [1264, 1617, 1341]),
    "selective_copying": ([14] * 10, [3470, 3474, 3450], [-23891, -23887, -23911]),
    "compression": ([13, 14, 10, 10, 1, 1, 3, 6, 1, 15], [240, 200, 270], [240, 200, 270]),
    "memorization": ([87, 255, 84, 255, 124, 255, 105, 255, 71, 255], [5087, 5082, 5323],
                     [1459, 1455, 1548]),
}


@pytest.mark.parametrize("task", sorted(MAD_TRAIN_ROWS))
def test_rows_pinned_to_mad(task):
    tail, sums, label_sums = MAD_TRAIN_ROWS[task]
    x, y = getattr(mad, f"generate_{task}")(num_examples=3, is_training=True)
    assert x[0, -10:].tolist() == tail
    assert x.sum(1).tolist() == sums and y.sum(1).tolist() == label_sums


def _lengths(task, seq_len):
    multi = mad.baseline(task)["multi_query"]
    return seq_len - 1 if task in ("in_context_recall", "noisy_in_context_recall") and multi \
        else seq_len


@pytest.mark.parametrize("task", sorted(mad.TASKS))
def test_shapes_ranges_determinism(task):
    b = mad.baseline(task)
    fn = getattr(mad, f"generate_{task}")
    x, y = fn(num_examples=20, seed=3)
    assert x.shape == y.shape == (20, _lengths(task, b["seq_len"]))
    assert x.min() >= 0 and x.max() < b["vocab_size"]
    labelled = y[y != mad.IGNORE]
    assert labelled.size and labelled.min() >= 0 and labelled.max() < b["vocab_size"]
    x2, y2 = fn(num_examples=20, seed=3)
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert not np.array_equal(x, fn(num_examples=20, seed=4)[0])


def test_in_context_recall_labels():
    """Test set: a value is labelled where its key appeared before with it (the label on
    the key's position, after the shift); training: the next token everywhere."""
    x, y = mad.generate_in_context_recall(num_examples=30, seq_len=64)
    for row in range(30):
        seen = {}
        for t in range(0, 62, 2):
            k, v = x[row, t], x[row, t + 1]
            if k in seen:
                assert seen[k] == v and y[row, t] == v
            else:
                assert y[row, t] == mad.IGNORE
            seen[k] = v
            assert y[row, t + 1] == mad.IGNORE
    xt, yt = mad.generate_in_context_recall(num_examples=5, seq_len=64, is_training=True)
    assert np.array_equal(xt[:, 1:], yt[:, :-1])


def test_selective_copying_labels():
    x, y = mad.generate_selective_copying(num_examples=10)
    n = 16
    for row in range(10):
        tokens = x[row, :-n - 1][x[row, :-n - 1] != 14]  # the blanks are vocab_size - 2
        assert len(tokens) == n and x[row, -n - 1] == 15  # the copy token
        assert y[row, -n:].tolist() == tokens.tolist() and np.all(y[row, :-n] == mad.IGNORE)


def test_memorization_is_one_map():
    x, y = mad.generate_memorization(num_examples=50)
    keys, values = x[:, 0::2], y[:, 1::2]
    assert np.all(x[:, 1::2] == 255) and np.all(y[:, 0::2] == mad.IGNORE)
    mapping = {}
    for k, v in zip(keys.ravel(), values.ravel()):
        assert mapping.setdefault(k, v) == v
    assert keys.max() < 127 and values.min() >= 127


def test_noise_and_refusals():
    x, y = mad.generate_noisy_in_context_recall(num_examples=20, frac_noise=0.6)
    assert (x >= 16).mean() > 0.3  # the noise tokens, 16..31
    assert np.all(y[x >= 16] == mad.IGNORE)
    with pytest.raises(ConfigError, match="frac_noise"):
        mad.generate_noisy_in_context_recall(num_examples=2, frac_noise=1.0)
    with pytest.raises(ConfigError, match="num_tokens_to_copy"):
        mad.generate_selective_copying(num_examples=2, seq_len=32)
    # Issue 74 probe 5: 0 tokens to copy was numpy's "high <= 0" traceback.
    with pytest.raises(ConfigError, match="num_tokens_to_copy=0 must be at least 1"):
        mad.generate_selective_copying(num_examples=2, seq_len=32, num_tokens_to_copy=0)
    with pytest.raises(ConfigError, match="k_motif_size=0"):
        mad.generate_fuzzy_in_context_recall(num_examples=2, k_motif_size=0)
    with pytest.raises(TypeError, match="unexpected settings"):
        mad.generate_memorization(num_examples=2, k_motif_size=3)


def test_splits_follow_mads_order():
    """Train then test from one stream (MAD's generate_data), then our validation."""
    s = mad.generate_splits("in_context_recall", num_train_examples=5, num_test_examples=4,
                            num_valid_examples=3, seq_len=32)
    train, _ = mad.generate_in_context_recall(num_examples=5, seq_len=32, is_training=True)
    assert np.array_equal(s["train"][0], train)
    assert [len(s[k][0]) for k in ("train", "test", "val")] == [5, 4, 3]
    assert not np.array_equal(s["test"][0][:3], s["val"][0])


def test_reader_pads_and_vocab():
    from lra import tasks

    task = tasks.get("mad_in_context_recall").with_options(vocab_size=32)
    assert task.vocab_size == 32 and task.sequence_labels
    d = task.load("", "test", 32, vocab_size=32, num_train_examples=8, num_test_examples=4,
                  num_valid_examples=4)
    assert d["inputs"].shape == (4, 32) and not d["mask"][:, -1].any() and d["mask"][:, :-1].all()
    assert np.all(d["targets"][:, -1] == mad.IGNORE)
    with pytest.raises(ConfigError, match="not an option"):
        task.load("", "test", 32, seq_len=32)


def test_config():
    from configs import mad as mad_config

    c = mad_config.get_config("task=noisy_in_context_recall")
    assert c.task == "mad_noisy_in_context_recall" and c.max_length == 128
    assert (c.task_options.vocab_size, c.task_options.noise_vocab_size,
            c.task_options.frac_noise) == (32, 16, 0.2)
    assert c.batch_size == 128 and c.num_train_steps == 200 * 100
    assert c.objective == "sequence_labels" and c.causal
    # MAD's test and early stop (train.py), and its seed for the data too.
    assert (c.test_weights, c.macro_accuracy, c.early_stop_accuracy) == (
        "last", "batch_mean", 0.999)
    assert c.data_seed_from_run and c.task_options.seed == c.random_seed == 12345
    assert mad_config.get_config("task=compression").task == "mad_compression"
    with pytest.raises(ConfigError, match="MAD's tasks"):
        mad_config.get_config("task=copying")


@pytest.mark.parametrize("task", ["in_context_recall", "fuzzy_in_context_recall",
                                  "noisy_in_context_recall", "selective_copying",
                                  "compression", "memorization"])
def test_runlocal_trains(task, tmp_path):
    from configs import mad as mad_config
    from lra import train

    c = mad_config.get_config(f"task={task},runlocal")
    c.num_train_steps, c.eval_frequency, c.checkpoint_freq = 4, 4, 4
    train.train_and_evaluate(c, str(tmp_path))
    r = json.load(open(os.path.join(tmp_path, "results.json")))
    assert r["task"] == f"mad_{task}" and r["objective"] == "sequence_labels"
    assert 0.0 <= r["test_example_accuracy"] <= r["test_accuracy"] <= 1.0
    # MAD's evaluation: the last weights, the batch mean of per-batch macro accuracies
    # (two test batches of 8 here), the pooled macro beside it.
    assert r["test_step"] == 4 and r["test_weights"].startswith("last")
    assert r["macro_accuracy_rule"] == "batch_mean"
    assert 0.0 <= r["test_macro_accuracy"] <= 1.0 and 0.0 <= r["test_pooled_macro_accuracy"] <= 1


def test_one_test_batch_makes_the_batch_mean_the_pooled_macro(tmp_path):
    from configs import mad as mad_config
    from lra import train

    c = mad_config.get_config("task=in_context_recall,runlocal")
    c.num_train_steps, c.eval_frequency, c.checkpoint_freq = 4, 4, 4
    c.eval_batch_size = 16  # the whole test split in one batch
    r = train.train_and_evaluate(c, str(tmp_path))
    assert r["test_macro_accuracy"] == pytest.approx(r["test_pooled_macro_accuracy"])


def test_autoencoder_decodes_from_the_last_position():
    """MAD's auto-encoder (models/autoencoder.py): BxLxV logits from the last real
    position's code alone, with MAD's sin-cos table."""
    import jax.numpy as jnp
    from flax import nnx

    from models.autoencoder import SequenceAutoEncoder, sincos_positions

    half, L, D = 4, 6, 8
    freq = np.exp(np.arange(half) * -(np.log(10000) / (half - 1)))
    angle = np.arange(L)[:, None] * freq[None]
    mad_table = np.concatenate([np.sin(angle), np.cos(angle)], 1)  # posemb_sincos_1d
    np.testing.assert_allclose(sincos_positions(L, D), mad_table, rtol=1e-5, atol=1e-6)

    model = SequenceAutoEncoder(vocab_size=16, max_len=L, emb_dim=D, num_heads=2,
                                num_layers=1, qkv_dim=D, mlp_dim=16, causal=True,
                                pooling="MEAN", rngs=nnx.Rngs(0))
    x = jnp.array([[1, 2, 3, 4, 5, 15], [1, 2, 3, 4, 5, 15]])
    mask = jnp.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]], bool)
    from tests.models.helpers import apply  # jitted: one compile instead of one per op

    out = apply(model, x, mask)
    assert out.shape == (2, L, 16) and out.dtype == jnp.float32
    # row 1's code is position 4's output: that of row 0 with inputs[:5] (causal)
    alone = apply(model, x[:1, :5], mask[:1, :5])
    np.testing.assert_allclose(out[1, :5], alone[0], rtol=1e-5, atol=1e-5)

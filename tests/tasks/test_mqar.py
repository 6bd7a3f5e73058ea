"""MQAR (lra/tasks/mqar.py): the generator's invariants, its readers and config, the
sequence_labels objective's accounting (only labelled positions count), and a runlocal
run through train_and_evaluate."""
from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from lra.training import objectives
from lra.errors import ConfigError
from lra.tasks import mqar

SETTINGS = [(8192, 64, 4), (8192, 128, 8), (512, 256, 16), (1024, 512, 64), (64, 16, 4)]


@pytest.mark.parametrize("vocab_size,seq_len,kv", SETTINGS)
@pytest.mark.parametrize("random_non_queries", [False, True])
def test_generator_invariants(vocab_size, seq_len, kv, random_non_queries):
    n = 200
    x, y = mqar.generate(vocab_size=vocab_size, seq_len=seq_len, num_kv_pairs=kv,
                         num_examples=n, seed=3, random_non_queries=random_non_queries)
    assert x.shape == y.shape == (n, seq_len) and x.dtype == y.dtype == np.int32
    keys, values = x[:, :2 * kv:2], x[:, 1:2 * kv:2]
    half = vocab_size // 2
    assert keys.min() >= 1 and keys.max() < half  # keys from [1, V/2)
    assert values.min() >= half and values.max() < vocab_size  # values from [V/2, V)
    for row in range(n):
        assert len(set(keys[row])) == kv and len(set(values[row])) == kv  # no replacement
        labelled = np.flatnonzero(y[row] != mqar.IGNORE)
        assert len(labelled) == kv
        # after the pairs, at even offsets 2 * gap from the end of the pairs
        assert labelled.min() >= 2 * kv and np.all((labelled - 2 * kv) % 2 == 0)
        # the token there is a key, each key queried once, the label its value
        queried = x[row, labelled]
        assert sorted(queried) == sorted(keys[row])
        value_of = dict(zip(keys[row], values[row]))
        assert [value_of[k] for k in queried] == list(y[row, labelled])
        rest = np.ones(seq_len, bool)
        rest[:2 * kv] = False
        rest[labelled] = False
        if not random_non_queries:
            assert np.all(x[row, rest] == 0)  # the filler
    assert set(np.unique(y)) <= {mqar.IGNORE} | set(range(half, vocab_size))
    if random_non_queries:
        # the filler is random tokens from [0, V): (almost) no zeros left, both halves used
        filler = x[:, 2 * kv:][y[:, 2 * kv:] == mqar.IGNORE]
        assert (filler < half).mean() == pytest.approx(0.5, abs=0.1)


def test_deterministic_per_seed():
    kw = dict(vocab_size=8192, seq_len=64, num_kv_pairs=4, num_examples=50)
    a = mqar.generate(seed=7, **kw)
    b = mqar.generate(seed=7, **kw)
    c = mqar.generate(seed=8, **kw)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])
    # the same draws as Zoology: random_non_queries only fills the zeros
    d = mqar.generate(seed=7, random_non_queries=False, **kw)
    assert np.array_equal(d[1], a[1]) and np.array_equal(a[0][d[0] != 0], d[0][d[0] != 0])


def test_zoology_rows_pinned():
    """The first and last rows of figure 2's (64, 4) test split (3,000 rows from seed
    123's test seed), as Zoology's multiquery_ar gave them (all rows of each figure-2
    setting are identical: results/cpu/mqar_mad_generators.md)."""
    seeds = mqar.split_seeds(123)
    assert seeds == {"train": 843828734, "val": 3376442750, "test": 3062119789}
    x, y = mqar.generate(vocab_size=8192, seq_len=64, num_kv_pairs=4, num_examples=3000,
                         seed=seeds["test"], random_non_queries=False)
    for row, (kv, queries) in ZOOLOGY_TEST_ROWS.items():
        assert x[row, :8].tolist() == kv
        assert np.flatnonzero(y[row] != -100).tolist() == queries


def test_gap_power_law():
    """Query gaps follow p(i) ∝ (i + 1)^(a - 1): with a = 0.01 near gaps are far likelier
    than far ones; with a = 1 uniform."""
    kw = dict(vocab_size=8192, seq_len=256, num_kv_pairs=1, num_examples=2000, seed=0,
              random_non_queries=False)
    for a in (0.01, 1.0):
        _, y = mqar.generate(power_a=a, **kw)
        gaps = (np.nonzero(y != -100)[1] - 2) // 2
        space = (256 - 2) // 2
        p = mqar.gap_probabilities(space, a)
        hist = np.bincount(gaps, minlength=space) / len(gaps)
        # compare the mass of the first 4 gaps and of the rest
        assert hist[:4].sum() == pytest.approx(p[:4].sum(), abs=0.03)


@pytest.mark.parametrize("kwargs,match", [
    (dict(seq_len=63), "even"),
    (dict(vocab_size=64), "larger than seq_len"),
    (dict(num_kv_pairs=17), "positions"),
    (dict(num_examples=0), "num_examples"),
    (dict(power_a=0.0), "power_a"),
])
def test_generator_refuses(kwargs, match):
    kw = dict(vocab_size=8192, seq_len=64, num_kv_pairs=4, num_examples=2, seed=0)
    with pytest.raises(ConfigError, match=match):
        mqar.generate(**{**kw, **kwargs})


def test_reader_splits_and_vocab():
    from lra import tasks

    task = tasks.get("mqar").with_options(vocab_size=256)
    assert task.vocab_size == task.num_classes == 256 and task.sequence_labels
    opts = dict(vocab_size=256, num_kv_pairs=2, num_train_examples=20, num_valid_examples=6,
                num_test_examples=5, seed=1)
    splits = {s: task.load("", s, 16, **opts) for s in ("train", "val", "test")}
    assert [len(splits[s]["inputs"]) for s in ("train", "val", "test")] == [20, 6, 5]
    for d in splits.values():
        assert d["targets"].shape == d["inputs"].shape == d["mask"].shape == (len(d["inputs"]), 16)
        assert d["mask"].all()
    assert not np.array_equal(splits["val"]["inputs"][:5], splits["test"]["inputs"])
    with pytest.raises(ConfigError, match="not an option"):
        task.load("", "train", 16, vocab=3)


def test_config_defaults_and_errors():
    from configs import mqar as mqar_config

    c = mqar_config.get_config("seq_len=256,d_model=64")
    assert (c.task_options.vocab_size, c.task_options.num_kv_pairs) == (8192, 16)
    # Heads: Zoology's MQAR models' 2 (configs/scaffold.py); figure 2's 1 under `own`.
    assert (c.max_length, c.emb_dim, c.num_layers, c.num_heads) == (256, 64, 2, 2)
    assert mqar_config.get_config("seq_len=256,scaffold=own").num_heads == 1
    assert c.block.ffn is False and c.causal and c.objective == "sequence_labels"
    assert c.batch_size == 256 and c.num_train_steps == 64 * (100_000 // 256)
    assert c.factors == "constant * cosine_decay" and c.weight_decay == 0.1
    assert c.task_options.random_non_queries is False and c.task_options.seed == 123
    with pytest.raises(ConfigError, match="published recipe"):
        mqar_config.get_config("paper")
    # The width: 128 by default, 64 in mini, and d_model= sets it in either (the CPU grid
    # sweeps mini at 64 and 128).
    assert mqar_config.get_config("").emb_dim == 128
    assert mqar_config.get_config("mini").emb_dim == 64
    mini = mqar_config.get_config("mini,d_model=128,seq_len=128")
    assert (mini.emb_dim, mini.qkv_dim, mini.max_length, mini.task_options.num_kv_pairs,
            mini.task_options.vocab_size) == (128, 128, 128, 8, 256)
    # From L 256 on, V is twice L: Zoology's assert (V > L) holds, the run starts.
    long = mqar_config.get_config("mini,seq_len=256")
    assert (long.task_options.num_kv_pairs, long.task_options.vocab_size) == (16, 512)
    # ... and the schedule is 3,600 steps with Zoology's early stop (attention forms the
    # binding after 1,200 steps there); the shorter lengths keep 1,200 steps, no stop.
    assert (long.num_train_steps, long.early_stop_accuracy) == (3600, 0.99)
    assert (mini.num_train_steps, mini.early_stop_accuracy) == (1200, 0.0)
    assert c.early_stop_accuracy == 0.99  # the full config: zoology/train.py's
    split = mqar.read_split("test", 256, **long.task_options.to_dict())
    assert split["inputs"].shape == (1_000, 256)
    assert (split["targets"] != mqar.IGNORE).sum(1).tolist() == [16] * 1_000


class _Fake:
    """A stand-in model: its 'encoder' returns the logits given, its head is the identity."""

    class _Encoder:
        cls_token = False

        def __init__(self, logits):
            self.logits = logits

        def __call__(self, inputs, mask, deterministic):
            return self.logits, None

    def __init__(self, logits):
        self.encoder = self._Encoder(logits)

    def _head(self, x):
        return x

    def __call__(self, inputs, mask, deterministic):
        return self.encoder.logits


@pytest.mark.parametrize("label_slots", [None, 2, 3])
def test_accuracy_counts_labelled_positions_only(label_slots):
    """Predictions at unlabelled (-100) or padded positions never count; per-example
    accuracy needs every labelled position of the row right."""
    V = 5
    labels = jnp.array([[-100, 3, -100, 4],    # two labels, both right
                        [-100, 2, 1, -100],    # two labels, one right
                        [-100, -100, -100, -100],  # none: not an example that counts
                        [0, -100, -100, 2]])   # two labels; position 3 padded
    mask = jnp.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]], bool)
    predicted = jnp.array([[0, 3, 0, 4], [1, 2, 3, 0], [0, 0, 0, 0], [0, 1, 1, 1]])
    logits = 10.0 * jax_one_hot(predicted, V)
    batch = {"inputs": jnp.zeros_like(labels), "mask": mask, "targets": labels}
    loss, correct, weight = objectives._label_losses(_Fake(logits), batch, True, label_slots)
    sums = objectives.label_sums(correct, weight)
    assert float(sums["count"]) == 5  # 2 + 2 + 0 + 1 (the padded label does not count)
    assert float(sums["correct"]) == 4  # 2 + 1 + 0 + 1
    assert float(sums["example_count"]) == 3 and float(sums["example_correct"]) == 2
    assert float(jnp.sum(loss * (1 - weight))) == 0.0


def test_macro_accuracy_as_torchmetrics():
    """MAD's metric: torchmetrics' MulticlassAccuracy(num_classes=5, ignore_index=-100)
    gives 0.4 here (torchmetrics 1.9.0): classes 0 and 1 half right, 3 right, 2 and 4
    only predicted (wrongly) count as 0; ignored positions do not count at all. (On
    random data of 5, 16 and 300 classes it agreed with torchmetrics to 1e-7.)"""
    preds = jnp.array([[0, 1, 2, 3, 3, 4, 4]])
    target = jnp.array([[0, 1, 1, -100, 3, 0, -100]])
    weight = target != -100
    s = objectives.class_sums(preds, jnp.where(weight, target, 0), weight, 5)
    assert objectives.macro_accuracy(**s) == pytest.approx(0.4)


def jax_one_hot(x, n):
    import jax

    return jax.nn.one_hot(x, n)


def _recall_by_pair():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "mqar_recall_by_pair", os.path.join(os.path.dirname(__file__), "..", "..", "scripts",
                                            "mqar_recall_by_pair.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recall_by_pair_counts():
    """scripts/mqar_recall_by_pair.py's table: a prediction right on the rows' last pair
    only, another row's value elsewhere, counts as 1 / kv right, all in the last pair,
    and "in row" only where the predicted value is one of the row's."""
    recall = _recall_by_pair()
    kv = 4
    inputs, labels = mqar.generate(vocab_size=256, seq_len=64, num_kv_pairs=kv,
                                   num_examples=50, seed=0)
    predicted = np.zeros_like(labels)
    rows, positions = np.nonzero(labels != mqar.IGNORE)
    for r, p in zip(rows, positions):
        last_key = inputs[r, 2 * (kv - 1)]
        if inputs[r, p] == last_key:
            predicted[r, p] = labels[r, p]
        elif r % 2:  # another pair's value: wrong, but in the row
            predicted[r, p] = inputs[r, 1] if inputs[r, p] == inputs[r, 2] else inputs[r, 3]
        else:  # a value of no pair of this row
            predicted[r, p] = next(v for v in range(128, 256) if v not in inputs[r, 1:8:2])
    table = recall.recall_table(inputs, labels, predicted, kv)
    assert table["labels"] == 50 * kv
    assert table["by_pair"].tolist() == [[50, 0], [50, 0], [50, 0], [50, 50]]
    assert table["in_row"] == 50 + 25 * (kv - 1)  # the right ones and the odd rows' others
    assert table["by_distance"][:, 0].sum() == 50 * kv and table["bin_width"] == 8
    distance = np.array([p - 2 * list(inputs[r, 0:8:2]).index(inputs[r, p])
                         for r, p in zip(rows, positions)])
    assert table["by_distance"][0, 0] == int((distance < 8).sum())
    text = recall.to_markdown([{"model": "m", "seed": 0, "seq_len": 64, "width": 8,
                                "num_kv_pairs": kv, "test_accuracy": 0.25, "recorded": 0.25,
                                **table}])
    assert "| m width 8 seed 0 | 25.00 (25.00) | 62.5 | 40.0 | 0.0 | 0.0 | 0.0 | 100.0 |" in text
    with pytest.raises(ValueError, match="not one of the row's keys"):
        recall.recall_table(inputs, labels, predicted, kv - 1)


def test_runlocal_trains(tmp_path):
    """configs/mqar.py:runlocal through train_and_evaluate: results.json has both
    accuracies and the sizes the task options gave; scripts/mqar_recall_by_pair.py
    restores the run's best checkpoint and recounts its test accuracy exactly."""
    from configs import mqar as mqar_config
    from lra import train

    c = mqar_config.get_config("runlocal")
    c.num_train_steps, c.eval_frequency, c.checkpoint_freq = 8, 8, 8
    results = train.train_and_evaluate(c, str(tmp_path))
    scored = _recall_by_pair().score_run(str(tmp_path))
    assert scored["test_accuracy"] == pytest.approx(results["test_accuracy"], abs=1e-6)
    assert scored["by_pair"][:, 0].sum() == scored["labels"]
    saved = json.load(open(os.path.join(tmp_path, "results.json")))
    assert saved["objective"] == "sequence_labels"
    assert 0.0 <= saved["test_accuracy"] <= 1.0
    assert 0.0 <= saved["test_example_accuracy"] <= saved["test_accuracy"] + 1e-9
    assert "example_accuracy" in saved["eval_history"][-1]
    assert 0.0 <= saved["test_macro_accuracy"] <= 1.0 and saved["short_conv"] == 3
    assert results["majority_baseline_accuracy"] > 0
    assert saved["config"]["task_options"]["vocab_size"] == 128


def test_early_stop_ends_training_and_a_rerun_keeps_it(tmp_path):
    """config.early_stop_accuracy (Zoology's early stop): training ends after the first
    evaluation above it, results.json says where, the best checkpoint there is tested, and
    running the same workdir again trains no further. The threshold is set just under
    a full run's best validation accuracy, so the stop falls before the last step."""
    from configs import mqar as mqar_config
    from lra import train

    def config(stop):
        c = mqar_config.get_config("runlocal")
        c.num_train_steps, c.eval_frequency, c.checkpoint_freq = 40, 4, 4
        c.task_options.num_valid_examples = 256  # 512 labels: an accuracy above 0 early
        c.early_stop_accuracy = stop
        return c

    full = train.train_and_evaluate(config(0.0), str(tmp_path / "full"))
    assert full["stopped_at_step"] is None
    accs = [(e["accuracy"], e["step"]) for e in full["eval_history"]]
    best = max(a for a, _ in accs)
    assert best > 0
    first = next(step for a, step in accs if a >= best)
    assert first < 40, "the full run's best came at its last step; nothing to stop before"
    workdir = str(tmp_path / "stopped")
    stopped = train.train_and_evaluate(config(best - 1e-6), workdir)
    assert stopped["stopped_at_step"] == first
    assert stopped["eval_history"][-1]["step"] == first
    assert max(h["step"] for h in stopped["train_history"]) <= first
    assert stopped["best_step"] == stopped["test_step"] == first
    # The same steps as the full run's until the stop (the schedule spans 40 in both).
    assert [e["accuracy"] for e in stopped["eval_history"]] == pytest.approx(
        [a for a, step in accs if step <= first], abs=1e-6)
    again = train.train_and_evaluate(config(best - 1e-6), workdir)
    assert again["stopped_at_step"] == first and len(again["eval_history"]) == len(
        stopped["eval_history"])
    assert again["test_accuracy"] == stopped["test_accuracy"]
    with pytest.raises(ConfigError, match="early_stop_accuracy"):
        train.train_and_evaluate(config(1.0), str(tmp_path / "bad"))


def test_objective_must_match_the_task(tmp_path):
    from configs import mqar as mqar_config
    from lra import train

    c = mqar_config.get_config("runlocal")
    c.objective = "causal_lm"
    with pytest.raises(ConfigError, match="sequence_labels"):
        train.train_and_evaluate(c, str(tmp_path))


# Zoology's multiquery_ar(vocab_size=8192, num_examples=3_000, input_seq_len=64, seed=the test
# seed of DataConfig.seed 123, num_kv_pairs=4, random_non_queries=False): row -> (its key-value
# prefix, its query positions).
ZOOLOGY_TEST_ROWS = {0: ([2698, 4262, 1271, 4541, 2415, 5908, 2683, 7850], [10, 26, 36, 52]),
                     -1: ([2529, 4764, 2924, 5032, 95, 8144, 1276, 4282], [8, 10, 16, 22])}


def test_the_hybrid_argument_reaches_mqar_and_mad_configs():
    """hybrid=<mixer> (a shared config argument) was accepted and ignored by the
    synthetic tasks' configs."""
    from configs import mad, mqar

    for module in (mqar, mad):
        c = module.get_config("model=gla,runlocal,hybrid=local")
        assert (c.model, c.hybrid.mixer) == ("gla", "local"), module.__name__
        assert "window" in c.hybrid.model_hparams


def test_runlocal_yields_to_the_sizes_given_and_refuses_what_mqar_cannot_hold():
    """Issue 74 probe 1: `runlocal,seq_len=1000000` ran at L 32 (runlocal overrode the
    arguments given with it, silently), exit 0."""
    from configs import mqar as mqar_config

    c = mqar_config.get_config("runlocal")
    assert (c.max_length, c.task_options.num_kv_pairs, c.emb_dim) == (32, 2, 32)
    c = mqar_config.get_config("runlocal,seq_len=128")
    assert (c.max_length, c.task_options.num_kv_pairs) == (128, 8)  # figure 2's pairs
    assert c.task_options.vocab_size > 128  # Zoology's vocab_size > seq_len
    c = mqar_config.get_config("runlocal,num_kv_pairs=4,d_model=48")
    assert (c.max_length, c.task_options.num_kv_pairs, c.emb_dim) == (32, 4, 48)
    with pytest.raises(ConfigError, match="seq_len=1000001 must be even"):
        mqar_config.get_config("runlocal,seq_len=1000001")
    with pytest.raises(ConfigError, match="more than seq_len=32"):
        mqar_config.get_config("runlocal,num_kv_pairs=9")


@pytest.mark.parametrize("name", ["niah", "flipflop", "state_tracking"])
def test_runlocal_keeps_the_width_given(name):
    import importlib

    config = importlib.import_module(f"configs.{name}")
    assert config.get_config("runlocal,d_model=48").emb_dim == 48
    assert config.get_config("runlocal").emb_dim == 32

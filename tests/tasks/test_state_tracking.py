"""State tracking (lra/tasks/state_tracking.py, configs/state_tracking.py) and the length
protocol (config.eval_lengths, lra/training/lengths.py): rows pinned to Grazzi et al.'s
generator, labels recomputed from the rows, word problems against explicit permutation
products, the config's arguments, and runs through train_and_evaluate."""
import itertools
import json
import os

import numpy as np
import pytest

from configs import state_tracking as st_config
from lra.errors import ConfigError
from lra.tasks import state_tracking as st

# Their first rows (automl/unlocking_state_tracking df8f840 FormLangDatasetGenerator,
# parity_delta_net_2.yaml / mod_arithmetic_delta_net_2.yaml settings; scripts/
# state_tracking_comparison/theirs.py): the input tokens up to the answer's position, the
# answer. results/cpu/state_tracking_generators.md compares 12,000 rows.
THEIRS = {
    ("parity", "train", 0): ([2, 1, 2, 1, 2, 2, 2, 2, 2, 1, 2, 1, 1, 2, 1], 2),
    ("parity", "train", 1): ([1, 1, 1, 2, 1, 1, 1, 1, 2, 1, 1, 2, 2, 1, 2, 2, 2, 1, 2, 2, 1,
                              1, 2, 1, 1], 1),
    ("modular_arithmetic", "train", 0): ([9, 3, 5, 2, 5, 2, 8, 3, 7, 1, 7, 2, 7, 4], 9),
}
THEIR_SETTINGS = dict(train_min_length=3, train_max_length=40, val_min_length=40,
                      val_max_length=256, test_min_length=40, test_max_length=256, seed=42)


@pytest.mark.parametrize("key", list(THEIRS))
def test_rows_are_theirs(key):
    language, split, i = key
    d = st.read_split(split, 255, language=language, num_train_examples=2,
                      num_valid_examples=2, num_test_examples=2, **THEIR_SETTINGS)
    tokens, answer = THEIRS[key]
    n = len(tokens)
    assert d["inputs"][i, :n].tolist() == tokens and not d["inputs"][i, n:].any()
    # The answer is predicted at the last input token (their shift 1); -100 elsewhere.
    assert d["targets"][i, n - 1] == answer
    assert (np.delete(d["targets"][i], n - 1) == st.IGNORE).all()
    assert d["mask"][i].tolist() == [True] * n + [False] * (255 - n)  # the sequence


def _modular_value(tokens, modulus):
    """The expression's value mod `modulus` with * before + and -, from the tokens."""
    ops = {1: "+", 2: "-", 3: "*"}
    expr = " ".join(str(t - 5) if t >= 5 else ops[t] for t in tokens[:-1])  # drop `=`
    return eval(expr) % modulus  # noqa: S307 (digits and + - * only)


@pytest.mark.parametrize("language", ["parity", "modular_arithmetic"])
def test_labels_are_the_answers_of_the_rows(language):
    d = st.read_split("test", 63, language=language, test_min_length=5, test_max_length=64,
                      num_test_examples=200)
    for inputs, targets in zip(d["inputs"], d["targets"]):
        (pos,) = np.nonzero(targets != st.IGNORE)[0]
        tokens = inputs[:pos + 1].tolist()
        assert not inputs[pos + 1:].any()
        if language == "parity":
            assert targets[pos] == 1 + tokens.count(2) % 2
        else:
            assert tokens[-1] == 4  # `=`
            assert targets[pos] == 5 + _modular_value(tokens, 5)


def _compose(p, q):  # apply p, then q
    return tuple(q[p[i]] for i in range(len(p)))


@pytest.mark.parametrize("group,order", [("S3", 6), ("A4", 12), ("S4", 24), ("A5", 60),
                                         ("Z5", 5)])
def test_word_problem_labels_are_prefix_products(group, order):
    table = st.group_table(group)
    assert table.shape == (order, order)
    assert (np.sort(table, axis=1) == np.arange(order)).all()  # a Latin square
    if group[0] != "Z":
        n = int(group[1:])
        perms = list(itertools.permutations(range(n)))
        if group[0] == "A":
            perms = [p for p in perms if sum(p[i] > p[j] for i, j in
                                             itertools.combinations(range(n), 2)) % 2 == 0]
        assert perms[0] == tuple(range(n))  # identity = 0
    d = st.read_split("train", 20, language=group, train_min_length=4, train_max_length=20,
                      num_train_examples=50)
    for inputs, targets, mask in zip(d["inputs"], d["targets"], d["mask"]):
        size = int(mask.sum())
        elements = (inputs[:size] - 1).tolist()
        if group[0] == "Z":
            expected = np.cumsum(elements) % order
        else:
            state, expected = perms[elements[0]], []
            for t, e in enumerate(elements):
                state = perms[e] if t == 0 else _compose(state, perms[e])
                expected.append(perms.index(state))
        assert targets[:size].tolist() == list(expected)
        assert (targets[size:] == st.IGNORE).all() and not inputs[size:].any()
    assert st.vocab_size_of(language=group) == order + 1


@pytest.mark.parametrize("kwargs,match", [
    (dict(language="parity", test_min_length=40, test_max_length=300), "min <= max <= 32"),
    (dict(language="modular_arithmetic", test_min_length=2, test_max_length=10),
     "at least 3"),
    (dict(language="Q8"), "unknown group"),
])
def test_reader_refuses(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        st.read_split("test", 31, num_test_examples=4, **kwargs)


def test_at_length_gives_rows_of_that_length_inside_the_model():
    options = {"language": "parity", "test_min_length": 40, "test_max_length": 0}
    assert st.at_length(options, 255, 64) == (255, {**options, "test_min_length": 64,
                                                     "test_max_length": 64})
    assert st.at_length(options, 127, 256)[0] == 255  # a parity row holds its answer
    assert st.at_length({"language": "S5"}, 127, 256)[0] == 256


def test_config_arguments():
    c = st_config.get_config("model=deltanet")
    assert (c.max_length, c.batch_size, c.num_train_steps, c.learning_rate, c.warmup) == (
        255, 256, 20_000, 1e-3, 2000)
    assert c.scaffold.name == "grazzi_state_tracking" and c.block.short_conv == 4
    assert c.eval_lengths == "40,64,128,256" and c.objective == "sequence_labels"
    assert "allow_neg_eigval" not in c.model_hparams or not c.model_hparams.allow_neg_eigval
    assert st_config.get_config("model=mamba2,neg_eig").model_hparams.allow_neg_eigval
    with pytest.raises(ConfigError, match="no negative-eigenvalue form"):
        st_config.get_config("model=linear,neg_eig")
    with pytest.raises(ConfigError, match="scaffold='zoology'"):
        st_config.get_config("scaffold=zoology")
    with pytest.raises(ConfigError, match="no published recipe"):
        st_config.get_config("paper")


def test_runlocal_trains_and_tests_at_every_length(tmp_path):
    from lra import train

    c = st_config.get_config("model=deltanet,neg_eig,runlocal")
    c.num_train_steps, c.eval_frequency, c.checkpoint_freq = 4, 4, 4
    train.train_and_evaluate(c, str(tmp_path))
    r = json.load(open(os.path.join(tmp_path, "results.json")))
    assert r["task"] == "state_tracking" and r["objective"] == "sequence_labels"
    rows = r["length_accuracy"]
    assert [(x["length"], x["max_length"]) for x in rows] == [(16, 31), (32, 31), (48, 47)]
    assert all(0.0 <= x["accuracy"] <= 1.0 for x in rows)


def test_learned_positions_are_refused_before_training(tmp_path):
    from lra import train

    c = st_config.get_config("model=transformer,runlocal,scaffold=own")
    assert c.pos_emb in ("learned", "own")
    with pytest.raises(ConfigError, match="shaped by the length.*learned positions: use"):
        train.train_and_evaluate(c, str(tmp_path))
    assert not os.path.exists(os.path.join(tmp_path, "results.json"))


def test_a_mixer_shaped_by_the_length_is_refused_without_a_positions_hint(tmp_path):
    from configs import niah as niah_config
    from lra import train

    c = niah_config.get_config("model=synthesizer,runlocal")  # dense logits: L x L
    with pytest.raises(ConfigError, match="dense_logits.*the mixer's own weights") as e:
        train.train_and_evaluate(c, str(tmp_path))
    assert "pos_emb" not in str(e.value)


def test_eval_lengths_at_the_training_length_is_the_test(tmp_path):
    """A task without at_length (MQAR) regenerates its test split at each length: at the
    training length that is the test split itself, so the accuracy is the test's."""
    from configs import mqar
    from lra import train

    c = mqar.get_config("model=linear,runlocal")
    c.num_train_steps, c.eval_frequency, c.checkpoint_freq = 4, 4, 4
    c.eval_lengths = f"{c.max_length},64"
    train.train_and_evaluate(c, str(tmp_path))
    r = json.load(open(os.path.join(tmp_path, "results.json")))
    same, longer = r["length_accuracy"]
    assert same["accuracy"] == pytest.approx(r["test_accuracy"], abs=1e-6)
    assert (longer["length"], longer["max_length"]) == (64, 64)


def test_eval_lengths_is_checked():
    from lra.training import lengths

    class C(dict):
        get = dict.get
    with pytest.raises(ConfigError, match="comma-separated"):
        lengths.parse(C(eval_lengths="64;128"))
    with pytest.raises(ConfigError, match="at least 2"):
        lengths.parse(C(eval_lengths="1"))
    assert lengths.parse(C(eval_lengths=" 64, 128")) == [64, 128]

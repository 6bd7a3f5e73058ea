"""Flip-flop language modelling (lra/tasks/flipflop.py, configs/flipflop.py) and
config.eval_splits: every read's label recomputed by running the flip-flop over the
string, the instruction shares of FFL(p), the errors, and a run through train_and_evaluate
with the sparse and dense tails."""
import json
import os

import numpy as np
import pytest

from configs import flipflop as ff_config
from lra.errors import ConfigError
from lra.tasks import flipflop as ff


@pytest.mark.parametrize("p", [0.8, 0.98, 0.1])
def test_reads_return_the_last_written_bit_and_shares_follow_p(p):
    data = ff.generate(num_examples=300, length=256, p_ignore=p, seed=1)
    x, y = data["inputs"], data["targets"]
    assert x.shape == (300, 256) and data["mask"].all()
    for row, labels in zip(x, y):
        assert row[0] == ff.WRITE and row[-2] == ff.READ  # w first, r last
        state, want = None, np.full(256, ff.IGNORE)
        for t in range(0, 256, 2):
            op, bit = row[t], row[t + 1]
            assert op in (ff.WRITE, ff.READ, ff.SKIP) and bit in (ff.ZERO, ff.ONE)
            if op == ff.WRITE:
                state = bit
            elif op == ff.READ:
                assert bit == state
                want[t] = bit  # predicted at the r, the next token
        assert (labels == want).all()
    middle = x[:, 2:-2:2]  # the i.i.d. instructions
    assert abs((middle == ff.SKIP).mean() - p) < 0.02
    assert abs((middle == ff.WRITE).mean() - (1 - p) / 2) < 0.02


def test_errors_and_the_test_tail():
    with pytest.raises(ConfigError, match="even and at least 4"):
        ff.generate(num_examples=1, length=7, p_ignore=0.8, seed=0)
    with pytest.raises(ConfigError, match=r"\[0, 1\)"):
        ff.generate(num_examples=1, length=8, p_ignore=1.0, seed=0)
    test = ff.read_split("test", 512, test_p_ignore=0.98, num_test_examples=200)
    assert ((test["inputs"][:, 2:-2:2] == ff.SKIP).mean()) > 0.95
    train = ff.read_split("train", 512, test_p_ignore=0.98, num_train_examples=200)
    assert ((train["inputs"][:, 2:-2:2] == ff.SKIP).mean()) < 0.85


def test_eval_splits_is_checked():
    from lra.training import lengths

    class C(dict):
        get = dict.get
    assert lengths.parse_splits(C(eval_splits=ff_config.TAILS)) == {
        "sparse": {"test_p_ignore": 0.98}, "dense": {"test_p_ignore": 0.1}}
    for bad in ("sparse", "sparse:", "sparse:p", "a:x=1;a:x=2"):
        with pytest.raises(ConfigError, match="name:option=value"):
            lengths.parse_splits(C(eval_splits=bad))


def test_runlocal_tests_the_tails_and_the_longer_length(tmp_path):
    from lra import train

    c = ff_config.get_config("model=gla,runlocal")
    c.num_train_steps, c.eval_frequency, c.checkpoint_freq = 4, 4, 4
    train.train_and_evaluate(c, str(tmp_path))
    r = json.load(open(os.path.join(tmp_path, "results.json")))
    assert r["task"] == "flipflop" and c.scaffold.name == "grazzi_state_tracking"
    assert [s["split"] for s in r["split_accuracy"]] == ["sparse", "dense"]
    assert [x["length"] for x in r["length_accuracy"]] == [64]


def test_an_unknown_split_option_is_refused_before_training(tmp_path):
    from lra import train

    c = ff_config.get_config("runlocal")
    c.eval_splits = "sparse:p_ignor=0.98"
    with pytest.raises(ConfigError, match="not an option of task flipflop"):
        train.train_and_evaluate(c, str(tmp_path))
    assert not os.path.exists(os.path.join(tmp_path, "results.json"))

"""lra/ngram.py: the count n-gram baseline of causal_lm rows (issue 41, section 4)."""
import math

import numpy as np
import pytest

from lra import ngram


def test_trigram_on_a_hand_example():
    # Rows "1 2 3 1 2 3" and "1 2 4" (padding 0). Targets: every real token but the first.
    tokens = np.array([[1, 2, 3, 1, 2, 3], [1, 2, 4, 0, 0, 0]])
    mask = tokens > 0
    counts = ngram.fit_counts(tokens, mask, order=3, vocab_size=5)
    base = 6  # vocab_size + the boundary id 5
    # (1, 2) -> 3 twice, -> 4 once; (boundary, 1) -> 2 twice.
    np.testing.assert_array_equal(counts[1 * base + 2], [0, 0, 0, 2, 1])
    np.testing.assert_array_equal(counts[5 * base + 1], [0, 0, 2, 0, 0])
    s = ngram.score(counts, tokens, mask, order=3, vocab_size=5, add_k=1.0)
    assert s.num_targets == 5 + 2
    # add-1 over 5 ids: (1,2)->3: 3/8 (twice), (1,2)->4: 2/8, (b,1)->2: 3/7 (twice),
    # (2,3)->1: 2/6, (3,1)->2: 2/6.
    p = [3 / 8, 3 / 8, 2 / 8, 3 / 7, 3 / 7, 2 / 6, 2 / 6]
    assert s.bits_per_token == pytest.approx(np.mean([-math.log2(x) for x in p]))
    # argmax: (1,2) -> 3 is right twice, wrong once; the others right.
    assert s.accuracy == pytest.approx(6 / 7)


def test_targets_are_the_causal_lm_objectives():
    tokens = np.array([[3, 1, 2, 0], [2, 2, 0, 0]])
    mask = tokens > 0
    contexts, targets = ngram._contexts_and_targets(tokens, mask, order=2, vocab_size=4)
    # lra.training.objectives without a start token: tokens[:, 1:] where mask[:, 1:].
    np.testing.assert_array_equal(targets, tokens[:, 1:][mask[:, 1:]])
    np.testing.assert_array_equal(contexts, [3, 1, 2])  # the previous token
    _, with_start = ngram._contexts_and_targets(tokens, mask, order=2, vocab_size=4,
                                                start_token=True)
    np.testing.assert_array_equal(with_start, tokens[mask])  # every real token


def test_unigram_is_the_frequency_model():
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 6, (50, 20))
    mask = np.ones_like(tokens, bool)
    counts = ngram.fit_counts(tokens, mask, order=1, vocab_size=6)
    freq = np.bincount(tokens[:, 1:].ravel(), minlength=6)
    np.testing.assert_array_equal(counts[0], freq)
    s = ngram.score(counts, tokens, mask, order=1, vocab_size=6, add_k=1e-9)
    p = freq / freq.sum()
    assert s.bits_per_token == pytest.approx(-(p[1:] * np.log2(p[1:])).sum(), rel=1e-6)


def test_refuses_bad_input():
    tokens = np.array([[1, 7]])
    with pytest.raises(ValueError, match="token ids"):
        ngram.fit_counts(tokens, tokens > 0, order=2, vocab_size=5)
    with pytest.raises(ValueError, match="add_k"):
        ngram.score({}, np.array([[1, 2]]), np.ones((1, 2), bool), order=2, vocab_size=5,
                    add_k=0.0)


def test_evaluate_config_reads_the_runs_data(listops_dir, tiny_listops_config):
    from lra.tasks import registry as tasks

    config = tiny_listops_config(listops_dir, objective="causal_lm", causal=True,
                                 pooling="MEAN")
    task = tasks.get("listops")
    load = lambda split: task.load(listops_dir, split, config.max_length)  # noqa: E731
    train, test = load("train"), load("test")
    s = ngram.evaluate_config(config, order=3)
    counts = ngram.fit_counts(train["inputs"], train["mask"], order=3, vocab_size=16)
    assert s == ngram.score(counts, test["inputs"], test["mask"], order=3, vocab_size=16)
    assert s.num_targets == test["mask"][:, 1:].sum() > 0
    assert 0 < s.bits_per_token < math.log2(16) + 1


@pytest.mark.parametrize("flag, says", [
    ("--order=0", "--order=0: give n >= 1"), ("--add_k=nan", "--add_k=nan: give a positive"),
    ("--add_k=0", "--add_k=0: give a positive"), ("--split=bogus", "--split=bogus: give one")])
def test_command_refuses_bad_flags_in_one_line(flag, says):
    """Issue 74 probes 4 and 5: --add_k=nan printed "bits/token nan" and exit 0; --order=0,
    --add_k=0 and --split=bogus were tracebacks. Refused before any data is read."""
    import os
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "lra.ngram",
                           "--config=configs/listops.py:pretrain,causal,runlocal", flag],
                          cwd=repo, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: {says}"), proc.stderr

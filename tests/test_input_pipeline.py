"""Input pipeline: resumable training order, full-coverage evaluation batches."""
import numpy as np
import pytest

from lra.training import input_pipeline


def _arrays(n: int, length: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"inputs": rng.integers(1, 9, (n, length)).astype(np.int32),
            "mask": rng.random((n, length)) < 0.8,
            "targets": np.arange(n, dtype=np.int32)}  # targets identify the example


def test_epochs_are_permutations_and_reshuffled():
    it = input_pipeline.train_iterator(_arrays(12), global_batch_size=4, seed=3)
    epoch1 = np.concatenate([next(it)["targets"] for _ in range(3)])
    epoch2 = np.concatenate([next(it)["targets"] for _ in range(3)])
    assert sorted(epoch1) == list(range(12)) and sorted(epoch2) == list(range(12))
    assert list(epoch1) != list(epoch2)
    assert list(epoch1) != list(range(12))  # shuffled


def test_rows_stay_together():
    arrays = _arrays(10)
    batch = next(input_pipeline.train_iterator(arrays, global_batch_size=5, seed=0))
    np.testing.assert_array_equal(batch["inputs"], arrays["inputs"][batch["targets"]])
    np.testing.assert_array_equal(batch["mask"], arrays["mask"][batch["targets"]])


def test_restored_state_continues_identically():
    arrays = _arrays(10)
    it = input_pipeline.train_iterator(arrays, global_batch_size=4, seed=1)
    for _ in range(4):
        next(it)
    state = it.get_state()
    expected = [next(it)["targets"] for _ in range(5)]
    fresh = input_pipeline.train_iterator(arrays, global_batch_size=4, seed=1)
    fresh.set_state(state)
    for want in expected:
        np.testing.assert_array_equal(next(fresh)["targets"], want)


def test_too_few_examples_for_a_batch():
    from lra.errors import DataError  # a one-line error through launch.py, not a traceback

    with pytest.raises(DataError, match="fewer than one batch"):
        input_pipeline.train_iterator(_arrays(3), global_batch_size=4, seed=0)


@pytest.mark.parametrize("num_batches", [-1, 2])
def test_eval_batches_cover_each_example_once(num_batches):
    arrays = _arrays(10)
    seen, weight = [], 0.0
    for batch in input_pipeline.eval_batches(arrays, global_batch_size=4,
                                             num_batches=num_batches):
        assert batch["inputs"].shape == (4, 5)
        seen += list(batch["targets"][batch["weights"] > 0])
        weight += batch["weights"].sum()
    expected = list(range(10)) if num_batches == -1 else list(range(8))
    assert seen == expected and weight == len(expected)

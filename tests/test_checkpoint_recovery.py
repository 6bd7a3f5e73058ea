"""Reliability of the training path (issue 21), checkpoints: a corrupt or unreadable
checkpoint falls back to the previous one, or says which folder to delete; a best
checkpoint of an earlier run is not used; a resume refuses what it cannot honour (other
data, fields it cannot change). The lock and one-line errors: tests/test_reliability.py."""
import os
import shutil

import numpy as np
import pytest

from lra import train
from lra.errors import CheckpointError, ConfigError
from lra.training import checkpoint
from tests.test_reliability import _copy_data


def _metrics(results):
    keys = ("best_eval_accuracy", "best_step", "test_accuracy", "test_loss", "eval_history")
    return {k: results[k] for k in keys}


# ----------------------------------------------------------------- (b) checkpoints


def _corrupt(step_dir, arrays_only):
    for root, _, files in os.walk(step_dir):
        if arrays_only and os.sep + "loop" in root + os.sep:
            continue
        for name in files:
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"\x00garbage")


@pytest.mark.parametrize("arrays_only", [False, True])
def test_unreadable_newest_checkpoint_falls_back_to_the_previous(
        tiny_listops_config, listops_dir, tmp_path, capsys, arrays_only):
    def config(steps):
        return tiny_listops_config(listops_dir, num_train_steps=steps, eval_frequency=4,
                                   checkpoint_freq=2)

    straight = train.train_and_evaluate(config(8), str(tmp_path / "straight"))
    train.train_and_evaluate(config(6), str(tmp_path / "run"))
    last = tmp_path / "run" / "checkpoints" / "last"
    assert sorted(int(d) for d in os.listdir(last) if d.isdigit()) == [4, 6]  # two kept
    _corrupt(last / "6", arrays_only)
    capsys.readouterr()
    resumed = train.train_and_evaluate(config(8), str(tmp_path / "run"))
    err = capsys.readouterr().err
    warnings = [l for l in err.splitlines() if l.startswith("warning: checkpoint step 6")]
    assert len(warnings) == 1 and "resuming from step 4" in warnings[0], err
    assert _metrics(resumed) == _metrics(straight)


def _flip(step_dir, item="state"):
    """Eight bytes of 0xff in the middle of the largest file of a step's `item`: same size,
    still parseable, other numbers (issue 35)."""
    files = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(step_dir, item))
             for f in fs]
    largest = max(files, key=os.path.getsize)
    with open(largest, "r+b") as f:
        f.seek(os.path.getsize(largest) // 2)
        f.write(b"\xff" * 8)
    return largest


def test_bit_flipped_checkpoint_is_detected_and_the_run_falls_back(
        tiny_listops_config, listops_dir, tmp_path, capsys):
    """A changed array file in the newest `last` step was resumed from (NaN at once, the
    divergence guard blaming the learning rate): its checksum now rejects it, in one line,
    and the run resumes from the step before, as an uninterrupted run."""
    def config(steps):
        return tiny_listops_config(listops_dir, num_train_steps=steps, eval_frequency=4,
                                   checkpoint_freq=2)

    straight = train.train_and_evaluate(config(8), str(tmp_path / "straight"))
    train.train_and_evaluate(config(6), str(tmp_path / "run"))
    ckpts = tmp_path / "run" / "checkpoints"
    assert sorted(os.listdir(ckpts / "checksums" / "last")) == ["4.json", "6.json"]
    flipped = _flip(ckpts / "last" / "6")
    capsys.readouterr()
    resumed = train.train_and_evaluate(config(8), str(tmp_path / "run"))
    err = capsys.readouterr().err
    (warning,) = [l for l in err.splitlines() if l.startswith("warning: checkpoint step 6")]
    assert "checksum check: last/6/state/" in warning and "resuming from step 4" in warning
    assert os.path.basename(flipped)[:8] in warning
    assert _metrics(resumed) == _metrics(straight)


def test_corrupt_best_checkpoint_tests_the_last_weights_in_one_line(
        tiny_listops_config, listops_dir, tmp_path, capsys):
    """A changed best file gave test_loss NaN and exit 0 (a truncated one: a traceback after
    training, on every re-run): now the last weights are tested, said in one line and in
    results.json."""
    config = tiny_listops_config(listops_dir, num_train_steps=4, eval_frequency=4)
    first = train.train_and_evaluate(config, str(tmp_path))
    assert first["test_weights"] == "best" and first["best_step"] == 4
    _flip(tmp_path / "checkpoints" / "best" / "4", item="weights")
    os.remove(tmp_path / "results.json")
    capsys.readouterr()
    again = train.train_and_evaluate(config, str(tmp_path))  # resumes at its end: tests
    err = capsys.readouterr().err
    (warning,) = [l for l in err.splitlines() if "best checkpoint (step 4)" in l]
    assert "checksum check: best/4/weights/" in warning and "testing the last weights" in warning
    assert again["test_weights"].startswith("last (step 4)")
    # The last weights of step 4 are the best weights of step 4: the same test numbers.
    assert again["test_loss"] == first["test_loss"] and np.isfinite(again["test_loss"])


def test_init_from_passes_over_a_corrupt_checkpoint(tiny_listops_config, listops_dir,
                                                    tmp_path, capsys):
    from lra.training import init_from

    source = str(tmp_path / "source")
    train.train_and_evaluate(tiny_listops_config(listops_dir, num_train_steps=4,
                                                 eval_frequency=4), source)
    _flip(tmp_path / "source" / "checkpoints" / "best" / "4", item="weights")
    config = tiny_listops_config(listops_dir, init_from=source)
    capsys.readouterr()
    _, step, kind = init_from.find_source(config)
    assert (step, kind) == (4, "last")
    assert "best step 4:" in capsys.readouterr().err
    # Without checksum records (a run saved before them), a truncated file is one line.
    shutil.rmtree(tmp_path / "source" / "checkpoints" / "checksums")
    for root, _, files in os.walk(tmp_path / "source" / "checkpoints" / "best"):
        for name in files:
            open(os.path.join(root, name), "wb").close()
    found = init_from.find_source(config)
    assert found[1:] == (4, "best")
    with pytest.raises(ConfigError, match=r"its best checkpoint of step 4 cannot be read"):
        init_from.load_encoder(config, None, found)


def test_no_readable_checkpoint_says_which_folder_to_delete(tiny_listops_config, listops_dir,
                                                           tmp_path):
    config = tiny_listops_config(listops_dir, num_train_steps=4, checkpoint_freq=2,
                                 eval_frequency=4)
    train.train_and_evaluate(config, str(tmp_path))
    for step in ("2", "4"):
        _corrupt(tmp_path / "checkpoints" / "last" / step, arrays_only=False)
    with pytest.raises(CheckpointError, match=r"cannot restore any checkpoint in .*last "
                                              r"\(step 4: .*step 2: .*\); delete "
                                              rf"{tmp_path}/checkpoints to start"):
        train.train_and_evaluate(config, str(tmp_path))


def test_best_of_an_earlier_run_is_not_used(tiny_listops_config, listops_dir, tmp_path):
    """`last` deleted, `best` of the earlier run left at a higher step: orbax skipped the
    new run's lower best steps silently and the test used the earlier run's weights."""
    earlier = tiny_listops_config(listops_dir, num_train_steps=8, eval_frequency=8)
    train.train_and_evaluate(earlier, str(tmp_path / "run"))
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "last")
    new = tiny_listops_config(listops_dir, num_train_steps=4, eval_frequency=4,
                              random_seed=1)
    straight = train.train_and_evaluate(new, str(tmp_path / "straight"))
    again = train.train_and_evaluate(new, str(tmp_path / "run"))
    assert _metrics(again) == _metrics(straight)
    assert checkpoint.Checkpoints(str(tmp_path / "run")).best_steps() == [4]


def test_save_best_below_a_newer_best_is_an_error_not_a_no_op(tmp_path):
    import jax.numpy as jnp

    ckpts = checkpoint.Checkpoints(str(tmp_path))
    weights = {"w": jnp.ones(3)}
    ckpts.save_best(8, weights, {"step": 8})
    with pytest.raises(CheckpointError, match="did not save the best weights of step 4"):
        ckpts.save_best(4, weights, {"step": 4})


# --------------------------------------------------------- (d) what a resume refuses


def test_resume_with_other_data_is_refused_and_same_data_elsewhere_resumes(
        tiny_listops_config, listops_dir, tmp_path, monkeypatch):
    train.train_and_evaluate(tiny_listops_config(listops_dir, num_train_steps=4),
                             str(tmp_path / "run"))
    other = _copy_data(listops_dir, tmp_path / "other",
                       edit=("val", 1, b"( [MAX 1 2 ] )\t2"))
    same = _copy_data(listops_dir, tmp_path / "same")

    def not_before_refusal(*args, **kwargs):
        raise AssertionError("compiled before refusing")

    with monkeypatch.context() as m:
        m.setattr(train, "make_steps", not_before_refusal)
        with pytest.raises(ConfigError, match=r"data in config.data_dir=.*other differs .*"
                                              r"split\(s\) val\)"):
            train.train_and_evaluate(tiny_listops_config(other, num_train_steps=6),
                                     str(tmp_path / "run"))
    results = train.train_and_evaluate(tiny_listops_config(same, num_train_steps=6),
                                       str(tmp_path / "run"))
    assert results["steps"] == 6 and results["config"]["data_dir"] == same
    assert set(results["data_fingerprint"]) == {"train", "val", "test"}


def test_resume_refuses_every_field_it_cannot_honour_before_compiling(
        tiny_listops_config, listops_dir, tmp_path, monkeypatch):
    config = tiny_listops_config(listops_dir, num_train_steps=4, eval_frequency=4)
    train.train_and_evaluate(config, str(tmp_path))

    def not_before_refusal(*args, **kwargs):
        raise AssertionError("compiled before refusing")

    monkeypatch.setattr(train, "make_steps", not_before_refusal)

    def refused(match, **changes):
        changed = tiny_listops_config(listops_dir, **{"num_train_steps": 4,
                                                      "eval_frequency": 4, **changes})
        with pytest.raises(ConfigError, match=match):
            train.train_and_evaluate(changed, str(tmp_path))

    refused(r"dropout_rate=0\.1, learning_rate=0\.05, but this config has dropout_rate=0\.3, "
            r"learning_rate=0\.01; only .*may change", dropout_rate=0.3, learning_rate=0.01)
    refused(r"eval_frequency=4.*eval_frequency=2", eval_frequency=2)
    refused(r"model_hparams|model=", model="local")
    refused(r"at step 4; config\.num_train_steps=3 is lower", num_train_steps=3)
    monkeypatch.undo()
    # Free fields: logging and checkpoint cadence, devices.
    again = train.train_and_evaluate(
        tiny_listops_config(listops_dir, num_train_steps=4, eval_frequency=4,
                            log_every_steps=1, checkpoint_freq=3), str(tmp_path))
    assert again["steps"] == 4


def test_cosine_schedule_run_cannot_change_its_length(tiny_listops_config, listops_dir,
                                                      tmp_path):
    cosine = "constant * linear_warmup * cosine_decay"
    train.train_and_evaluate(tiny_listops_config(listops_dir, num_train_steps=4,
                                                 eval_frequency=4, factors=cosine),
                             str(tmp_path))
    with pytest.raises(ConfigError, match="cosine_decay schedule spans num_train_steps"):
        train.train_and_evaluate(tiny_listops_config(listops_dir, num_train_steps=8,
                                                     eval_frequency=4, factors=cosine),
                                 str(tmp_path))

def test_an_unreadable_best_checkpoint_keeps_the_best_step_in_results(
        tiny_listops_config, listops_dir, tmp_path, capsys):
    """Issue 46, item 9: results.json gave best_step = the last step (the tested one)
    beside the real best's accuracy. best_step stays the best on validation, test_step
    says which weights were tested."""
    config = tiny_listops_config(listops_dir, num_train_steps=6, eval_frequency=1,
                                 learning_rate=0.5)
    first = train.train_and_evaluate(config, str(tmp_path))
    best = first["best_step"]
    assert best < 6 and first["test_step"] == best, first  # this config peaks early
    _flip(tmp_path / "checkpoints" / "best" / str(best), item="weights")
    os.remove(tmp_path / "results.json")
    again = train.train_and_evaluate(config, str(tmp_path))
    assert (again["best_step"], again["test_step"]) == (best, 6)
    assert again["best_eval_accuracy"] == first["best_eval_accuracy"]
    assert again["test_weights"].startswith("last (step 6)")


def test_a_corrupt_checksum_record_keeps_the_good_checkpoint(
        tiny_listops_config, listops_dir, tmp_path, capsys):
    """Issue 46, item 9: an unreadable checksum record made its (good) checkpoint count as
    corrupt, and it was deleted. Now the checkpoint is checked by reading it: a resume
    from it continues as an uninterrupted run, with one warning."""
    config = tiny_listops_config(listops_dir, num_train_steps=4, checkpoint_freq=2,
                                 eval_frequency=4)
    straight = train.train_and_evaluate(config, str(tmp_path / "straight"))
    run = tmp_path / "run"
    train.train_and_evaluate(config, str(run))
    os.remove(run / "results.json")
    records = [os.path.join(r, f) for r, _, fs in os.walk(run / "checkpoints" / "checksums")
               for f in fs if "last" in os.path.join(r, f) and "4" in f]
    assert records, os.listdir(run / "checkpoints" / "checksums")
    for path in records:
        with open(path, "w") as f:
            f.write("{not json")
    capsys.readouterr()
    resumed = train.train_and_evaluate(config, str(run))
    err = capsys.readouterr().err
    assert "cannot be read" in err and "checking that checkpoint by reading it" in err
    assert 4 in [int(d) for d in os.listdir(run / "checkpoints" / "last") if d.isdigit()]
    assert _metrics(resumed) == _metrics(straight)

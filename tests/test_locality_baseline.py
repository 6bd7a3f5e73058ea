"""The locality baseline (issue 32, section 4): `locality` in every task config, what its
layer sees, lra.sweep's --locality_baseline and its row in lra.report."""
import json
import os

import numpy as np
import pytest

from lra import report, sweep
from lra.runs import plan
from lra.runs.results import collect
from tests.fake_launch import SWEEP, fake_launch, write_run

def test_locality_argument_builds_each_tasks_baseline():
    """`locality` in every task config: its mixer, a window that stays short at any length,
    one layer, MEAN pooling, rotary positions, what it sees recorded; the rest of the
    task's config (width, optimiser, steps, data) unchanged."""
    import importlib

    from configs import common
    from lra.errors import ConfigError
    from lra.runs.results import flatten

    expected = {"local": {"window": 4},
                "local_2d": {"query_height": 1, "query_width": 1, "flange_height": 2,
                             "flange_width": 1}}
    own = ("model", "pooling", "num_layers", "pos_emb", "locality_baseline")
    for task in sweep.TASKS:
        module = importlib.import_module(f"configs.{task}")
        model = "local_2d" if task in ("image", "pathfinder", "pathx") else "local"
        assert common.locality_model(task) == model
        for arg in ("", "mini", "runlocal"):
            plain = module.get_config(arg or None)
            c = module.get_config(",".join(filter(None, [arg, "locality"])))
            common.validate(c)
            assert (c.model, dict(c.model_hparams)) == (model, expected[model]), (task, arg)
            assert (c.pooling, c.num_layers, c.pos_emb) == ("MEAN", 1, "rotary"), (task, arg)
            assert c.locality_baseline == common.locality_receptive_field(task)
            differing = {k for k, v in flatten(c.to_dict()).items()
                         if flatten(plain.to_dict()).get(k, "(absent)") != v}
            assert {k for k in differing if not k.startswith(("model_hparams.", "block."))} \
                <= set(own), (task, arg, differing)
        assert module.get_config(f"model={model},locality").model == model
        with pytest.raises(ConfigError, match="leave model= out"):
            module.get_config("model=linear,locality")
    assert common.locality_receptive_field("text").startswith("9 consecutive tokens")
    assert common.locality_receptive_field("image").startswith("a 3x3 patch of pixels")


def _stack_field(config) -> np.ndarray:
    """[i, j]: the stack's output at position i changes when the embedded input at position
    j moves (the classifier's encoder as launch.py builds it, all its layers). Example j of
    one batch has position j moved; compared with a batch of unmoved copies at the same
    batch position (as tests/models/test_fidelity.py)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import lra.tasks
    from lra import train

    model = train.build_model(config, lra.tasks.get(config.task))
    graphdef, state = nnx.split(model)
    n = config.max_length
    x = model.encoder.embeddings(jnp.arange(1, n + 1, dtype=jnp.int32)[None] % 7 + 1,
                                 deterministic=True)
    moved = x + jnp.eye(n)[:, :, None] * jax.random.normal(jax.random.key(1), (n, 1, x.shape[-1]))
    mask = jnp.ones((n, n), bool)

    @jax.jit
    def stack(state, x):
        return nnx.merge(graphdef, state).encoder.stack(x, mask, deterministic=True)

    h, h0 = stack(state, moved), stack(state, jnp.broadcast_to(x, moved.shape))
    return np.asarray(jnp.any(h != h0, axis=-1)).T


def test_locality_baseline_sees_its_window_and_nothing_else():
    """The receptive field the configs state (9 consecutive tokens; a 3x3 patch: the pixel,
    two rows above, a column each side), measured two ways: per layer by lra.dense_check's
    key fraction at the run's own length, and for the whole stack by perturbing one input
    position at a time."""
    from configs import image, listops
    from lra import dense_check

    # One layer, by dense_check, at ListOps mini's 64 tokens and Image's 32 x 32 pixels.
    def expected_fraction(length, seen):
        rows = np.unique(np.linspace(0, length - 1, min(dense_check.FRACTION_ROWS, length))
                         .astype(int))
        return float(np.mean([seen(i) / length for i in rows]))

    tokens = listops.get_config("mini,locality").to_dict()
    assert tokens["max_length"] == 64
    assert dense_check.run_key_fraction(tokens) == pytest.approx(expected_fraction(
        64, lambda i: min(i + 4, 63) - max(i - 4, 0) + 1))
    pixels = image.get_config("runlocal,locality").to_dict()
    assert pixels["max_length"] == 1024

    def patch(i, width=32):
        r, c = divmod(i, width)
        return (r - max(r - 2, 0) + 1) * (min(c + 1, width - 1) - max(c - 1, 0) + 1)

    assert dense_check.run_key_fraction(pixels) == pytest.approx(expected_fraction(1024, patch))
    assert not dense_check.run_reduces_to_dense(tokens)
    assert dense_check.run_degenerate(tokens) is None

    # The whole stack: 24 tokens, and an 8 x 8 image.
    config = listops.get_config("runlocal,locality")
    config.max_length = 24
    i, j = np.divmod(np.arange(24 * 24), 24)
    assert (_stack_field(config) == (np.abs(i - j) <= 4).reshape(24, 24)).all()
    config = image.get_config("runlocal,locality")
    config.max_length = 64
    (ri, ci), (rj, cj) = np.divmod(np.arange(64)[:, None], 8), np.divmod(np.arange(64)[None], 8)
    assert (_stack_field(config) == ((rj <= ri) & (rj >= ri - 2) & (np.abs(cj - ci) <= 1))).all()


def test_sweep_schedules_the_locality_baseline_and_skips_it_when_done(tmp_path, monkeypatch):
    root, calls, logged = str(tmp_path), [], []
    fake_launch(monkeypatch, calls)
    outcome = sweep.sweep(seeds=[0, 1], sweep_dir=root, overrides=[], log=logged.append,
                          locality_baseline=True, **SWEEP)
    assert outcome["done"] == [("transformer", 0), ("transformer", 1),
                               (plan.LOCALITY_BASELINE, 0), (plan.LOCALITY_BASELINE, 1)]
    workdir = plan.run_dir(root, "listops", "locality_baseline", 0)
    assert calls[2] == workdir and os.path.basename(os.path.dirname(workdir)) == \
        "locality_baseline"
    # Launched as what it is: `local` with the `locality` argument, after config_arg.
    assert json.load(open(os.path.join(workdir, "sweep.json")))["config_arg"] == \
        "runlocal,locality"
    recorded = json.load(open(os.path.join(workdir, "results.json")))["config"]
    assert recorded["model"] == "local" and recorded["num_layers"] == 1
    assert recorded["locality_baseline"].startswith("9 consecutive tokens")
    model, arg, _ = plan.run_spec("listops", "locality_baseline", "runlocal")
    assert plan.config_flags_of("listops", model, 0, arg, [])[0].endswith(
        "configs/listops.py:model=local,runlocal,locality")
    assert plan.run_spec("pathfinder", "locality_baseline", "mini") == \
        ("local_2d", "mini,locality", "locality_baseline")
    assert plan.run_spec("pathfinder", "linear", "mini") == ("linear", "mini", "linear")
    # Finished: skipped like any run, nothing launched.
    again = sweep.sweep(seeds=[0, 1], sweep_dir=root, overrides=[], log=lambda _: None,
                        locality_baseline=True, **SWEEP)
    assert (plan.LOCALITY_BASELINE, 1) in again["skipped"] and len(calls) == 4
    # Without the flag, no baseline run.
    plain = sweep.sweep(seeds=[2], sweep_dir=root, overrides=[], log=lambda _: None, **SWEEP)
    assert plain["done"] == [("transformer", 2)] and len(calls) == 5
    with pytest.raises(ValueError, match="use --locality_baseline"):
        sweep.sweep(seeds=[0], sweep_dir=root, overrides=[], log=lambda _: None,
                    **dict(SWEEP, config_arg="runlocal,locality"))
    with pytest.raises(ValueError, match="without --pretrain"):
        sweep.sweep(seeds=[0], sweep_dir=root, overrides=[], log=lambda _: None,
                    pretrain=True, locality_baseline=True, **SWEEP)
    assert len(calls) == 5


def test_report_names_the_locality_baseline_row_and_says_what_it_sees(tmp_path):
    root = str(tmp_path)
    runs = {"transformer": ("transformer", "mini", [0.38, 0.40]),
            "local": ("local", "mini", [0.30]),  # the variant, not the baseline
            "locality_baseline": ("local", "mini,locality", [0.24, 0.26])}
    for folder, (model, arg, accs) in runs.items():
        for seed, acc in enumerate(accs):
            write_run(root, folder, seed, acc,
                       plan.expected_config("listops", model, seed, arg, []))
    summary = report.summarize(collect(root))
    assert set(summary) == {("listops", "transformer"), ("listops", "local"),
                            ("listops", report.LOCALITY_LABEL)}
    header, rows = report.table_rows(summary)
    assert [r[0] for r in rows] == ["transformer", "local", "locality baseline",
                                    "(majority class)"]
    assert rows[2][:2] == ["locality baseline", "25.00 ± 1.41"]
    text = open(report.report(root)["markdown"], encoding="utf-8").read()
    assert "| locality baseline | 25.00 ± 1.41 | 25.00 |" in text
    assert "| local | 30.00 | 30.00 |" in text  # no [field=...] label: separate rows
    assert (report.LOCALITY_NOTE + " listops: 9 consecutive tokens (the token and 4 on each "
            "side: `local`, window 4), 1 layer.") in text
    # local and transformer have published numbers (withheld at mini's sizes); the
    # baseline is never compared with `local`'s.
    (withheld,) = [l for l in text.splitlines() if l.startswith("Published numbers not shown")]
    assert "listops local" in withheld and "locality" not in withheld
    assert "| locality baseline |" in text.split("### listops: test accuracy")[1]

"""Small configs still compute each variant's method (issue 27).

Every variant, built with the sizes a task's `mini` and `runlocal` configs give it
(configs/presets.py scales them to the config's length), must not degenerate: no mixer
whose output is the same vector at every position (a softmax over one summary), no query or
key projection without gradient (a softmax over one key). The check is
`lra.dense_check.run_degenerate` on the resolved config, the one `lra.report` marks runs
with. On the presets before issue 27 (sizes scaled linearly to 1) it fails for linformer,
set_transformer, luna and sac at ListOps mini (shown in test_linear_scaling_degenerated).
"""
import importlib

import pytest

from configs import presets
from lra import dense_check
from models import registry
from tests import tiers

# (task, config argument). ListOps mini (64 tokens) is where the linear rule reached one
# summary for all four bottleneck variants: every variant, about a second a check (one per
# models/ module in the default tier, the others in the exhaustive one). The other configs
# whose length differs from the task's reference (sizes scaled; Retrieval runlocal, 128 of
# 4000 tokens, also had all four at one), and those of Image and Pathfinder (1024
# positions, nothing scaled) and Path-X (1024 and 4096), run behind the slow marker (~10
# minutes):
#   pytest -m slow tests/test_degenerate.py
FAST = [("listops", "mini")]
SLOW = [("retrieval", "runlocal"), ("listops", "runlocal"), ("text", "mini"),
        ("text", "runlocal"), ("retrieval", "mini"), ("image", "mini"), ("image", "runlocal"),
        ("pathfinder", "mini"), ("pathfinder", "runlocal"), ("pathx", "runlocal"),
        ("pathx", "mini")]


def _config(task: str, arg: str, model: str) -> dict:
    return importlib.import_module(f"configs.{task}").get_config(
        f"model={model},{arg}").to_dict()


def _cases(configs, *, tiered: bool = False):
    """(task, arg, model) params; `tiered`: one variant per models/ module in the default
    tier, the others exhaustive (tests/tiers.py)."""
    keep = tiers.representatives(registry.available()) if tiered else None
    return [pytest.param(task, arg, model, id=f"{task}-{arg}-{model}",
                         marks=[tiers.EXHAUSTIVE] if keep is not None and model not in keep
                         else [])
            for task, arg in configs for model in registry.available()]


@pytest.mark.parametrize("task,arg,model", _cases(FAST, tiered=True))
def test_small_configs_do_not_degenerate(task, arg, model):
    assert dense_check.run_degenerate(_config(task, arg, model)) is None


@pytest.mark.slow
@pytest.mark.parametrize("task,arg,model", _cases(SLOW))
def test_other_small_configs_do_not_degenerate(task, arg, model):
    assert dense_check.run_degenerate(_config(task, arg, model)) is None


def test_bottlenecks_keep_a_floor_and_stay_a_compression():
    """A rank or bottleneck is not scaled with the length; it is capped at L / 4 (at
    least MIN_SUMMARIES) so that a short input is still compressed."""
    at = lambda model, task, length: presets.model_hparams(model, task, max_length=length)
    assert at("linformer", "listops", 64)["k"] == 16  # min(32, max(8, 64 // 4))
    assert at("linformer", "listops", 128)["k"] == 32
    assert at("linformer", "listops", 2000)["k"] == 32  # the stated value at full length
    assert at("linformer", "retrieval", 16)["k"] == presets.MIN_SUMMARIES
    assert at("luna", "retrieval", 128)["packed_len"] == 16
    assert at("set_transformer", "listops", 64)["num_inducing"] == 16
    assert at("sac", "listops", 64)["k"] == 16
    assert at("clustered", "listops", 64)["num_clusters"] == 16
    # A window is a fraction of the keys: still scaled linearly.
    assert at("local", "listops", 64)["window"] == 4
    for model, keys in presets.LENGTH_SCALED.items():
        for key, rule in keys.items():
            assert rule in ("linear", "sqrt", "summaries", "blocks"), (model, key, rule)


def test_selected_blocks_keep_a_floor():
    """MoBA's and NSA's blocks (and NSA's window) scale with the length but keep at least
    presets.MIN_BLOCK tokens: at MAD's 32 tokens the linear rule gave blocks of one token
    (top-k token attention) and a window of 2; the stated values at the reference."""
    at = lambda model, length: presets.model_hparams(model, "listops", max_length=length)
    assert presets.MIN_BLOCK == 4
    assert at("moba", 32) == {"block_size": 4, "top_k": 3}
    assert at("nsa", 32) == {"block_size": 4, "block_counts": 6, "window_size": 4}
    assert at("nsa", 256)["block_size"] == 8 and at("nsa", 256)["window_size"] == 16
    assert at("moba", 2000)["block_size"] == 64 and at("nsa", 2000)["window_size"] == 128
    mad = importlib.import_module("configs.mad").get_config(
        "model=moba,task=memorization,mini")
    assert mad.max_length == 32 and mad.model_hparams.block_size == 4


def test_linear_scaling_degenerated():
    """The old rule (every size scaled linearly, at least 1) at ListOps mini: the check
    finds what the issue measured, and each reason says which kind."""
    old = {"linformer": {"k": 1}, "set_transformer": {"num_inducing": 1},
           "luna": {"packed_len": 1}, "sac": {"k": 1, "rank": 16}}
    for model, hparams in old.items():
        reason = dense_check.degenerate(model, hparams, 65, prefix_len=1)
        assert reason is not None, model
    assert "same output" in dense_check.degenerate("linformer", {"k": 1}, 65, prefix_len=1)
    assert "no gradient" in dense_check.degenerate("sac", {"k": 1}, 65, prefix_len=1)
    assert dense_check.degenerate("sac", {"k": 2}, 65, prefix_len=1) is None
    assert dense_check.degenerate("linformer", {"k": 2}, 65, prefix_len=1) is None
    # A window of 0 without a CLS slot: every query sees only itself, its q.k never weighs
    # anything. (With a CLS slot each query weighs itself against the global slot.)
    assert "no gradient" in dense_check.degenerate("local", {"window": 0}, 64)
    assert dense_check.degenerate("local", {"window": 1}, 64) is None


def test_key_fraction_measures_what_a_mixer_reads():
    frac = lambda *a, **k: dense_check.key_fraction(*a, **k)
    assert frac("transformer", {}, 33) == 1.0
    assert frac("transformer", {}, 33, causal=True) == 1.0  # of the i + 1 it may see
    # local |i - j| <= 4 and the CLS slot: 10 of 65 positions, fewer at the edges.
    assert 0.12 < frac("local", {"window": 4}, 65, prefix_len=1) <= 10 / 65
    assert frac("linformer", {"k": 8}, 65, prefix_len=1) == 1.0  # a summary of everything


def test_command_line_table(capsys):
    assert dense_check.main(["--config=configs/listops.py:mini",
                             "--models=linformer,local", "--fractions"]) == 0
    out = capsys.readouterr().out
    assert "| listops:mini | linformer | 65 | k=16 | no | no | 100.0% |" in out
    assert "| listops:mini | local | 65 | window=4 | no | no |" in out


def test_command_line_mistakes_are_one_line(capsys):
    for args, needle in ((["--config=configs/nope.py:mini"], "no task config configs/nope.py"),
                         (["--config=configs/listops.py:mini", "--models=nope"],
                          "unknown model 'nope'")):
        with pytest.raises(SystemExit) as exit_info:
            dense_check.main(args)
        assert exit_info.value.code == 2
        assert needle in capsys.readouterr().err


def test_too_long_to_check_is_refused_before_building():
    """A full-size Path-X run: the check says it cannot (the report warns) instead of
    taking more than 12 GB for a quadratic mixer's gradient."""
    from lra import dense_check

    with pytest.raises(ValueError, match="degeneracy check: length 16385"):
        dense_check.degenerate("transformer", {}, 16385)

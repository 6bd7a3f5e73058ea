"""The `paper` config argument (configs/recipes.py): the variants' published LRA recipes.

Config building and abstract model construction only; the spot-checked values are the
original files' (named in each test), so a table entry that drifts from its source fails.
"""
import importlib

import jax
import pytest
from flax import nnx

import lra.tasks
import lra.train
from configs import common, recipes
from lra.errors import ConfigError
from models import registry


def _config(task: str, arg: str):
    return importlib.import_module(f"configs.{task}").get_config(arg)


@pytest.mark.parametrize("model,task", sorted(recipes.RECIPES))
def test_every_recipe_builds_validates_and_its_model_builds(model, task):
    r = recipes.RECIPES[(model, task)]
    c = _config(task, f"model={model},paper")
    common.validate(c)
    assert (c.model, c.task, c.recipe) == (model, task, r["source"])
    for key, value in r["fields"].items():
        assert c[key] == value, key
    for key, value in r["block"].items():
        assert c.block[key] == value, key
    # finalize rebuilds model_hparams from the presets: the recipe's must survive it.
    for key, value in r["model_hparams"].items():
        assert c.model_hparams[key] == value, key
    assert c.param_groups.to_dict() == r["param_groups"]
    built = nnx.eval_shape(lambda: lra.train.build_model(c, lra.tasks.get(task)))
    params = jax.tree.leaves(nnx.state(built, nnx.Param))
    assert sum(p.size for p in params) > 0


def test_recipe_entries_are_complete_and_name_real_settings():
    """A misspelt field would become a new ConfigDict key that nothing reads, and a
    misspelt hparam would fail only when the model is built: both are caught here."""
    base = common.base_config(task="listops", model="transformer")
    for (model, task), r in recipes.RECIPES.items():
        assert set(r) == {"source", "fields", "block", "model_hparams", "param_groups",
                          "deviations"}, (model, task)
        assert "@" in r["source"] and r["deviations"], (model, task)
        assert set(r["fields"]) <= set(base), (model, task, set(r["fields"]) - set(base))
        assert set(r["model_hparams"]) <= set(registry.accepted_hparams(model)), (model, task)
        if task in recipes.PIXEL_TASKS:  # the embedding-table deviation is stated
            assert "embedding table" in r["deviations"], (model, task)


def test_s5_listops_is_run_lra_listops_sh():
    # lindermanlab/S5@3c18fdb bin/run_experiments/run_lra_listops.sh: --n_layers=8
    # --d_model=128 --ssm_size_base=16 --blocks=8 --bsz=50 --epochs=40 --lr_factor=3
    # --ssm_lr_base=0.001 --weight_decay=0.04 --warmup_end=1 --C_init=lecun_normal
    # --activation_fn=half_glu2 --p_dropout=0 --opt_config=BfastandCdecay.
    c = _config("listops", "model=s5,paper")
    assert (c.num_layers, c.emb_dim, c.qkv_dim, c.batch_size) == (8, 128, 128, 50)
    assert (c.model_hparams.d_state, c.model_hparams.blocks) == (16, 8)
    assert (c.model_hparams.c_init, c.model_hparams.activation) == ("lecun_normal",
                                                                    "half_glu2")
    assert c.num_train_steps == 76_800 and c.warmup == 1_920  # 40 and 1 x 96,000 / 50
    assert c.learning_rate == pytest.approx(0.003) and c.weight_decay == 0.04
    ssm = {"lr_scale": pytest.approx(1 / 3), "weight_decay": 0.0}
    assert c.param_groups.to_dict() == {"ssm": ssm, "ssm_step": ssm}  # B with the rest
    assert (c.adam_b1, c.adam_b2, c.adam_eps, c.grad_clip_norm) == (0.9, 0.999, 1e-8, 0.0)
    assert c.factors == "constant * linear_warmup * cosine_decay"
    assert (c.block.kind, c.block.ffn, c.pooling) == ("pre_ln", False, "MEAN")
    assert (c.dropout_rate, c.attention_dropout_rate) == (0.0, 0.0)


@pytest.mark.parametrize("task", sorted(recipes._S5_SCRIPTS))
def test_s5_groups_train_at_ssm_lr_base_as_its_opt_config_says(task):
    """S5's ssm group runs at ssm_lr_base: config.learning_rate (lr_factor x ssm_lr_base)
    times the group's lr_scale (configs/presets.py). B ("ssm_b") is with the rest under
    BfastandCdecay, at the ssm rate without decay under standard, at the ssm rate with the
    config's decay under BandCdecay (s5/train_helpers.py create_train_state)."""
    _, flags = recipes._S5_SCRIPTS[task]
    c = _config(task, "model=s5,paper")
    groups = c.param_groups.to_dict()
    assert c.learning_rate * groups["ssm"]["lr_scale"] == pytest.approx(flags["ssm_lr_base"])
    assert groups["ssm"]["weight_decay"] == 0.0
    opt = flags["opt_config"]
    assert ("ssm_b" in groups) == (opt != "BfastandCdecay"), opt
    if "ssm_b" in groups:
        assert groups["ssm_b"]["lr_scale"] == groups["ssm"]["lr_scale"]
        assert ("weight_decay" in groups["ssm_b"]) == (opt == "standard"), opt
    # dt_global: log_step ("ssm_step") trains with the rest, else at the ssm rate.
    assert ("ssm_step" in groups) == (not flags.get("dt_global")), task
    if "ssm_step" in groups:
        assert groups["ssm_step"] == groups["ssm"]
    # S5's p_dropout is the mixer's two dropouts only (module docstring of recipes._s5).
    assert (c.dropout_rate, c.attention_dropout_rate) == (0.0, flags["p_dropout"])


def test_s5_warmup_end_0_means_no_warmup():
    # run_lra_imdb.sh --warmup_end=0: cosine annealing from the first step.
    c = _config("text", "model=s5,paper")
    assert c.warmup == 0 and c.num_train_steps == 35 * 500
    # --dt_global=True: log_step trains with the rest (no ssm_step group).
    assert "ssm_step" not in c.param_groups


def test_s4_listops_is_s4_listops_yaml():
    # state-spaces/s4@e757cef configs/experiment/lra/s4-listops.yaml: prenorm false,
    # 6 x 256, d_state 4, batch 32, lr 0.01 (A, B 0.001), 120,000 steps, 12,000 warmup.
    c = _config("listops", "model=s4d,paper")
    assert (c.block.kind, c.block.ffn) == ("post_ln", False)
    assert (c.num_layers, c.emb_dim, c.batch_size) == (6, 256, 32)
    assert (c.num_train_steps, c.warmup, c.learning_rate) == (120_000, 12_000, 0.01)
    assert c.param_groups.ssm.lr_scale == pytest.approx(0.1)
    assert c.model_hparams.d_state == 4


def test_mega_recipes_are_readme_lra_commands():
    # facebookresearch/mega@aeaa4b4 examples/mega/README.lra.md, mega_lra_listop: 6
    # layers, embed 80, hidden/FFN 160, z 64, layernorm after the sums, lr 0.001, wd 0.01,
    # batch 64, 90,000 updates, 3,000 warmup, clip-norm 1.0, betas (0.9, 0.98).
    c = _config("listops", "model=mega,paper")
    assert (c.block.kind, c.block.ffn) == ("post_ln", True)
    assert (c.num_layers, c.emb_dim, c.mlp_dim, c.num_heads) == (6, 80, 160, 1)
    assert (c.model_hparams.z_dim, c.model_hparams.hidden_dim) == (64, 160)
    assert (c.learning_rate, c.weight_decay, c.batch_size) == (0.001, 0.01, 64)
    assert (c.num_train_steps, c.warmup, c.grad_clip_norm) == (90_000, 3_000, 1.0)
    assert (c.adam_b2, c.adam_eps, c.pooling) == (0.98, 1e-8, "MEAN")
    assert c.factors == "constant * linear_warmup * linear_decay"  # --lr-scheduler
    assert (c.dropout_rate, c.model_hparams.dropout, c.attention_dropout_rate) == (0.1, 0.1,
                                                                                    0.0)
    # mega_lra_pf128 (Path-X): 4 layers of 64, z 32, truncation 4096, prenorm, laplace;
    # batch 2 x update-freq 8 x 8 GPUs.
    c = _config("pathx", "model=mega,paper")
    assert (c.block.kind, c.num_layers, c.emb_dim, c.batch_size) == ("mega_pre_ln", 4, 64,
                                                                     128)
    assert (c.model_hparams.z_dim, c.model_hparams.truncation) == (32, 4096)
    assert c.model_hparams.attention_activation == "laplace"
    assert "warmup-power 2" in recipes.RECIPES[("mega", "pathx")]["deviations"]


def test_text_recipes_have_the_papers_length_and_unscaled_hparams():
    """The papers read 4096 (S4, S5) or 4000 (Mega) bytes of a review, LRA's config 1000;
    finalize would scale Mega's truncation (a window) with the length, the recipe keeps
    mega_lra_imdb's 1024."""
    assert _config("text", "model=transformer").max_length == 1000
    assert _config("text", "model=s4d,paper").max_length == 4096
    assert _config("text", "model=s5,paper").max_length == 4096
    c = _config("text", "model=mega,paper")
    assert c.max_length == 4000 and c.model_hparams.truncation == 1024


def test_without_paper_the_task_config_is_lras():
    c = _config("listops", "model=s5")
    assert c.recipe == "" and (c.num_layers, c.emb_dim, c.batch_size) == (4, 512, 32)
    assert "d_state" not in c.model_hparams


@pytest.mark.parametrize("arg,match", [
    ("model=s5,paper,mini", "'paper'.*does not combine with 'mini'"),
    ("model=s4d,paper,runlocal", "'paper'.*does not combine with 'runlocal'"),
    ("model=s5,paper,locality", "'paper'.*does not combine with 'locality'"),
    ("model=transformer,paper", "no published recipe for model=transformer on task=listops"
                                ".*recipes exist for mega, s4d, s5"),
    ("model=lru,paper", "no published recipe for model=lru"),
])
def test_paper_refusals(arg, match):
    with pytest.raises(ConfigError, match=match):
        _config("listops", arg)


def test_steps_count_the_last_partial_batch():
    assert recipes.steps("listops", 40, 50) == 76_800
    assert recipes.steps("retrieval", 1, 32) == 4_597  # 147,086 / 32 = 4,596.4

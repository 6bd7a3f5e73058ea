"""The `paper` config argument (configs/recipes.py): the variants' published LRA recipes.

Config building and abstract model construction, and for the s4d recipe the built model
and one optimiser update; the spot-checked values are the original files' (named in each
test), so a table entry that drifts from its source fails.
"""
import importlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lra.tasks
import lra.train
from configs import common, recipes
from lra.training import optim
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
    # state-spaces/s4@e757cef configs/experiment/lra/s4-listops.yaml: prenorm false (:11),
    # 6 x 256 (:9-10), d_state 4 (:14), batch 32 (:29), lr 0.01 (:32), 120,000 steps,
    # 12,000 warmup (:36-37), dt_min 0.001, dt_max 0.1 (:19-20).
    c = _config("listops", "model=s4d,paper")
    assert (c.block.kind, c.block.ffn) == ("post_ln", False)
    assert (c.num_layers, c.emb_dim, c.batch_size) == (6, 256, 32)
    assert (c.num_train_steps, c.warmup, c.learning_rate) == (120_000, 12_000, 0.01)
    assert (c.model_hparams.d_state, c.model_hparams.dt_min, c.model_hparams.dt_max) == (
        4, 0.001, 0.1)


# S4's optimiser, per parameter: state-spaces/s4 at e757cef57d89e448c413de7325ed5601aceaac13.
# - configs/experiment/lra/s4-<task>.yaml, `optimizer: {lr, weight_decay}` and
#   `model.layer.lr`:
#     s4-listops.yaml:15-18 lr {dt: null, A: 0.001, B: 0.001}, :32-33 lr 0.01, wd 0.05
#     s4-imdb.yaml:18-21    lr {dt: null, A: 0.001, B: 0.001}, :36-37 lr 0.01, wd 0.05
#     s4-aan.yaml:18-21     lr {dt: null, A: 0.001, B: 0.001}, :32-33 lr 0.01, wd 0.05
#     s4-cifar.yaml:16      lr: 0.001,                         :30-31 lr 0.01, wd 0.05
#     s4-pathfinder.yaml:19 lr: 0.001,                         :33-34 lr 0.004, wd 0.05
#     s4-pathx.yaml:19      lr: 0.001,                         :30-31 lr 0.001, wd 0.05
# - configs/model/layer/s4.yaml:26-30: default lr {dt, A, B: 0.001} (the yamls' dict
#   merges over it, so dt: null wins), wd: 0.0.
# - src/models/sequence/kernels/kernel.py:82-94: a number gives every registered
#   parameter that lr, a dict the listed ones (the rest None); register() (:111-122) sets
#   `_optim` lr only if not None and weight_decay only if not None.
# - src/models/sequence/kernels/ssm.py:524-534: inv_dt (dt), A_real/A_imag (A), B
#   registered with wd_dict (0.0); C with lr_dict['C'] and wd None.
# - train.py:482-493: each `_optim` dict is a group {**optimizer, **_optim}: lr None means
#   the optimizer's, no weight_decay key the optimizer's 0.05.
# - configs/config.yaml:42-44 bias_weight_decay False, normalization_weight_decay False ->
#   train.py:460 add_optimizer_hooks(self.model) (src/utils/optim_groups.py:25-38): weight
#   decay 0 for *bias and norm-module parameters of the backbone (self.model) only; the
#   encoder (nn.Embedding / nn.Linear) and decoder (train.py:191-192) keep 0.05.
S4_LR = {  # role -> the learning rate S4 trains it with
    "listops": dict(dt=0.01, A=0.001, B=0.001, C=0.01, rest=0.01),
    "text": dict(dt=0.01, A=0.001, B=0.001, C=0.01, rest=0.01),
    "retrieval": dict(dt=0.01, A=0.001, B=0.001, C=0.01, rest=0.01),
    "image": dict(dt=0.001, A=0.001, B=0.001, C=0.001, rest=0.01),
    "pathfinder": dict(dt=0.001, A=0.001, B=0.001, C=0.001, rest=0.004),
    "pathx": dict(dt=0.001, A=0.001, B=0.001, C=0.001, rest=0.001),
}
S4_WD = dict(dt=0.0, A=0.0, B=0.0, C=0.05, D=0.05, out_kernel=0.05, out_bias=0.0,
             norm=0.0, encoder=0.05, decoder=0.05)  # every task
S4_N_SSM = {"listops": 1, "text": 1, "retrieval": 1, "image": 1,  # s4-*.yaml n_ssm: 1
            "pathfinder": None, "pathx": None}  # s4-pathfinder.yaml:24, s4-pathx.yaml:24
_MIXER_ROLES = {"log_dt": "dt", "log_a_real": "A", "a_imag": "A", "b": "B", "c": "C",
                "d": "D", "head/glu/kernel": "out_kernel", "head/glu/bias": "out_bias"}
_MIXER_GROUPS = {"log_dt": "ssm_step", "log_a_real": "ssm", "a_imag": "ssm", "b": "ssm_b",
                 "c": "ssm_c"}


def _s4_role(path: str, norm_paths: set) -> str:
    """The part of S4's model a parameter of ours stands for."""
    if path.rsplit("/", 1)[0] in norm_paths:
        return "norm"
    if path.startswith("encoder/embeddings/"):
        return "encoder"
    if path.startswith("head/"):
        return "decoder"
    if "/mixer/" in path:
        role = _MIXER_ROLES.get(path.split("/mixer/", 1)[1])
        if role:
            return role
    raise AssertionError(f"no S4 counterpart known for {path}")


def _measured_lr_and_decay(tx, params):
    """{path: (learning rate, weight decay)} that the optimiser's first update applies:
    with zero gradients Adam's step is 0 and p moves by -lr * wd * p; with gradients of 1
    it moves by a further -lr (Adam's first step is g / |g|)."""
    is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    params = jax.tree.map(lambda v: v.replace(v[...] + 1.0), params, is_leaf=is_var)
    state = tx.init(params)
    u0, _ = tx.update(jax.tree.map(lambda v: v.replace(jnp.zeros_like(v[...])), params,
                                   is_leaf=is_var), state, params)
    u1, _ = tx.update(jax.tree.map(lambda v: v.replace(jnp.ones_like(v[...])), params,
                                   is_leaf=is_var), state, params)
    out = {}
    for (path, p), a, b in zip(jax.tree_util.tree_leaves_with_path(params, is_leaf=is_var),
                               jax.tree.leaves(u0, is_leaf=is_var),
                               jax.tree.leaves(u1, is_leaf=is_var)):
        p, a, b = (np.asarray(x[...], np.float64) for x in (p, a, b))
        lr = float(np.median(a - b))
        big = np.abs(p) > 0.1
        wd = float(np.median(-a[big] / (lr * p[big])))
        out[optim.param_path(path)] = (lr, wd)
    return out


@pytest.mark.parametrize("task", sorted(S4_LR))
def test_s4d_recipe_trains_each_parameter_as_s4s_yaml(task):
    """Through the config the user builds (configs/<task>.py `model=s4d,paper`) and the
    optimiser lra/training/optim.py makes of it: every parameter's learning rate and weight decay
    in the first update are S4's for its counterpart (S4_LR, S4_WD above), and the s4d
    mixer's SSM parameters carry the groups that set them."""
    c = _config(task, "model=s4d,paper")
    model = lra.train.build_model(c, lra.tasks.get(task))
    norm_paths = {"/".join(map(str, path)) for path, node in nnx.iter_graph(model)
                  if isinstance(node, nnx.LayerNorm)}
    assert norm_paths
    params = nnx.split(model, nnx.Param, ...)[1]
    tx = optim.make_optimizer(c, lambda step: c.learning_rate)
    seen = set()
    for path, (lr, wd) in _measured_lr_and_decay(tx, params).items():
        role = _s4_role(path, norm_paths)
        seen.add(role)
        want_lr = S4_LR[task].get(role, S4_LR[task]["rest"])
        assert lr == pytest.approx(want_lr, rel=1e-5), (path, role)
        assert wd == pytest.approx(S4_WD[role], rel=1e-4, abs=1e-7), (path, role)
    assert seen == set(S4_WD), seen
    groups = {optim.param_path(path): v.get_metadata().get("param_group")
              for path, v in jax.tree_util.tree_leaves_with_path(
                  params, is_leaf=lambda x: isinstance(x, nnx.Variable))}
    for path, group in groups.items():
        name = path.split("/mixer/", 1)[-1]
        if "/mixer/" in path and name in _MIXER_GROUPS:
            assert group == _MIXER_GROUPS[name], path


@pytest.mark.parametrize("task", sorted(S4_N_SSM))
def test_s4d_recipe_has_s4s_kernel_options(task):
    """n_ssm (s4-*.yaml: 1 ties A and B across the channels; null gives each its own),
    dt_transform softplus (configs/model/layer/s4.yaml:25; no experiment overrides it), and
    on CIFAR dropout 0.1 (s4-cifar.yaml:8) in FFTConv (untied, before the GELU:
    fftconv.py:78-79, :136) and after the GELU (s4block.py:118-119, :176; tie_dropout
    s4-cifar.yaml:9)."""
    c = _config(task, "model=s4d,paper")
    mixer = lra.train.build_model(c, lra.tasks.get(task)).encoder.stack.blocks[0].mixer
    copies = c.emb_dim if S4_N_SSM[task] is None else S4_N_SSM[task]
    assert mixer.log_a_real.shape[0] == mixer.a_imag.shape[0] == mixer.b.shape[0] == copies
    assert mixer.log_dt.shape == (c.emb_dim,)
    assert mixer.dt_transform == "softplus"
    np.testing.assert_allclose(mixer.dt(), jax.nn.softplus(mixer.log_dt[...]), rtol=1e-6)
    dropout = 0.1 if task == "image" else 0.0
    assert (mixer.conv_dropout.rate if mixer.conv_dropout else 0.0) == dropout
    assert mixer.head.dropout.rate == dropout and mixer.head.dropout.broadcast_dims == (-2,)


@pytest.mark.parametrize("task,epochs,batch,updates", [
    ("text", 32, 16, 49_984),  # s4-imdb.yaml:33 batch 16, :44 max_epochs 32; 25,000 reviews
    ("retrieval", 20, 64, 45_960),  # s4-aan.yaml:29 batch 64, :40 max_epochs 20; 147,086
])
def test_s4d_text_recipes_stop_at_max_epochs_inside_a_50000_step_cosine(task, epochs,
                                                                       batch, updates):
    """S4 trains trainer.max_epochs epochs of floor(N / batch) updates
    (configs/loader/default.yaml:4 drop_last: True) under HF's
    get_cosine_schedule_with_warmup(5,000, 50,000) (s4-imdb.yaml:39-41, s4-aan.yaml:35-37):
    the run ends before the cosine does."""
    c = _config(task, "model=s4d,paper")
    assert c.num_train_steps == updates == epochs * (recipes.TRAIN_EXAMPLES[task] // batch)
    schedule = optim.learning_rate_schedule(c)

    def hf(step):  # transformers get_cosine_schedule_with_warmup, num_cycles 0.5
        if step < 5_000:
            return step / 5_000
        progress = (step - 5_000) / (50_000 - 5_000)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

    # (a cosine spanning num_train_steps would be 2-10% off at 45,000 and 0 at the end)
    for step in (0, 1_000, 5_000, 20_000, 45_000, updates - 1, updates):
        assert float(schedule(step)) == pytest.approx(0.01 * hf(step), rel=1e-5, abs=1e-9)


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

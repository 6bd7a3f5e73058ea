"""Parameter groups (lra/training/optim.py, config.param_groups): a group trains as the originals'
optax.multi_transform does (Adam at a scaled learning rate, its own weight decay), the
chain equals AdamW when the groups change nothing, and a config that names a group no
parameter carries, or a bad setting, is refused in one line."""
import jax
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from configs import common, presets
from lra.training import optim
from lra.errors import ConfigError
from models import registry

LR = 0.01


def _config(**groups):
    return ml_collections.ConfigDict(dict(
        model="s4d", adam_b1=0.9, adam_b2=0.98, adam_eps=1e-9, weight_decay=0.05,
        grad_clip_norm=0.0, param_groups=ml_collections.ConfigDict(groups)))


def _params(name="s4d"):
    model = registry.build(name, dim=6, num_heads=2, max_len=8, causal=False,
                           rngs=nnx.Rngs(0), **registry.capabilities(name).test_hparams)
    return nnx.split(model, nnx.Param, ...)[1]


def _run(tx, params, steps=3):
    """`steps` updates with fixed random gradients; the parameter values after each."""
    state = tx.init(params)
    leaves, treedef = jax.tree.flatten(params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    keys = jax.random.split(jax.random.key(1), len(leaves))
    grads = jax.tree.unflatten(treedef, [
        v.replace(jax.random.normal(k, v[...].shape)) for v, k in zip(leaves, keys)])
    out = []
    for _ in range(steps):
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        out.append(params)
    return out


def _values(params):
    return [np.asarray(v[...]) for v in jax.tree.leaves(
        params, is_leaf=lambda x: isinstance(x, nnx.Variable))]


SSM = ("ssm", "ssm_b", "ssm_step")  # s4d's A, B and log_dt (C, "ssm_c", with the rest)


def test_groups_train_as_the_originals_multi_transform():
    """S4 / minimal-LRU: optax.multi_transform({"ssm": adam(lr * scale), "regular":
    adamw(lr, wd)}) by parameter label; ours gives the same parameters step by step."""
    params = _params()
    labels = jax.tree.map(
        lambda v: "ssm" if v.get_metadata().get("param_group") in SSM else "regular",
        params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    assert {"ssm", "regular"} <= set(jax.tree.leaves(labels))
    original = optax.multi_transform(
        {"ssm": optax.adam(LR * 0.1, b1=0.9, b2=0.98, eps=1e-9),
         "regular": optax.adamw(LR, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.05)},
        jax.tree.map(lambda v: v, labels))
    ours = optim.make_optimizer(
        _config(**{g: {"lr_scale": 0.1, "weight_decay": 0.0} for g in SSM}), lambda step: LR)
    for a, b in zip(_run(ours, params), _run(original, params)):
        for x, y in zip(_values(a), _values(b)):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_groups_that_change_nothing_are_adamw():
    """lr_scale 1 and the config's weight decay: the grouped chain equals the one of a
    config without groups (AdamW, no decay where no_weight_decay)."""
    params = _params()
    grouped = optim.make_optimizer(_config(ssm={"lr_scale": 1.0}), lambda step: LR)
    plain = optim.make_optimizer(_config(), lambda step: LR)
    for a, b in zip(_run(grouped, params), _run(plain, params)):
        for x, y in zip(_values(a), _values(b)):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_a_group_no_parameter_carries_is_refused():
    tx = optim.make_optimizer(_config(ssn={"lr_scale": 0.1}), lambda step: LR)
    with pytest.raises(ConfigError, match=r"names ssn, which no parameter of model 's4d' "
                                          r"carries \(its groups: ssm, ssm_b, ssm_c, "
                                          r"ssm_step\)"):
        tx.init(_params())
    tx = optim.make_optimizer(_config(ssm={"lr_scale": 0.1}), lambda step: LR)
    with pytest.raises(ConfigError, match="its groups: none"):
        tx.init(_params("transformer"))


@pytest.mark.parametrize("settings, message", [
    ({"lr": 0.1}, "unknown setting"), ({"lr_scale": 0.0}, r"lr_scale=0.0 must be finite and > 0"),
    ({"lr_scale": float("inf")}, "must be finite"),
    ({"weight_decay": -1.0}, r"weight_decay=-1.0 must be finite and >= 0")])
def test_bad_group_settings_are_refused_by_validate(settings, message):
    config = common.base_config(task="listops", model="s4d")
    config.param_groups.ssm = ml_collections.ConfigDict(settings)
    with pytest.raises(ConfigError, match=message):
        common.validate(config)


def test_task_configs_give_the_papers_groups():
    """Through the task configs: s4d's and lru's SSM groups as their code; a variant
    without groups gets none; --config.param_groups.ssm.lr_scale reaches the optimiser."""
    from configs import listops, pathfinder

    assert listops.get_config("model=s4d,mini").param_groups.to_dict() == {
        g: {"lr_scale": 0.1, "weight_decay": 0.0} for g in SSM}
    assert {g: s["lr_scale"] for g, s in pathfinder.get_config(
        "model=s4d").param_groups.to_dict().items()} == {g: 0.25 for g in SSM}
    assert listops.get_config("model=lru").param_groups.ssm.lr_scale == 0.5
    assert listops.get_config("model=transformer").param_groups.to_dict() == {}
    for model, groups in presets.PARAM_GROUPS.items():
        carried = optim.groups_of(_params(model))
        assert set(groups) <= carried, (model, carried)
    config = listops.get_config("model=s4d,runlocal")
    config.param_groups.ssm.lr_scale = 0.5
    assert optim.group_settings(config)["ssm"] == {"lr_scale": 0.5, "weight_decay": 0.0}


def test_after_a_divergence_group_values_may_change_but_not_whether_there_are_groups():
    """Resuming a diverged run (lra/training/resume.py): a lower lr_scale is a lower learning
    rate and is allowed; dropping every group changes the optimizer state's layout."""
    from configs import listops
    from lra.training import resume

    saved = listops.get_config("model=s4d,runlocal").to_dict()
    config = listops.get_config("model=s4d,runlocal")
    config.param_groups.ssm.lr_scale = 0.05
    resume.check_compatible(saved, config, "w", step=10, diverged=True)
    with pytest.raises(ConfigError, match="param_groups.ssm.lr_scale"):
        resume.check_compatible(saved, config, "w", step=10, diverged=False)
    config.param_groups = ml_collections.ConfigDict()
    with pytest.raises(ConfigError, match="param_groups can change on resume only in"):
        resume.check_compatible(saved, config, "w", step=10, diverged=True)


def test_a_linear_decay_run_cannot_change_its_length():
    """linear_decay reaches 0 at num_train_steps: a longer resumed run would change the
    schedule of the steps already taken (as cosine_decay over the whole run)."""
    from configs import listops
    from lra.training import resume

    config = listops.get_config("model=transformer,runlocal")
    config.factors = "constant * linear_warmup * linear_decay"
    saved = config.to_dict()
    config.num_train_steps = saved["num_train_steps"] * 2
    with pytest.raises(ConfigError, match="linear_decay schedule spans num_train_steps"):
        resume.check_compatible(saved, config, "w", step=10, diverged=False)
    config.factors = saved["factors"] = "constant * linear_warmup * rsqrt_decay"
    resume.check_compatible(saved, config, "w", step=10, diverged=False)


def _decay_per_parameter(tx, params, lr):
    """{path: the weight decay one update applies}, from the actual update with zero
    gradients (Adam's step is then 0 and p moves by -lr * lr_scale * wd * p)."""
    zeros = jax.tree.map(lambda v: v.replace(np.zeros(v[...].shape, np.float32)), params,
                         is_leaf=lambda x: isinstance(x, nnx.Variable))
    updates, _ = tx.update(zeros, tx.init(params), params)
    is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    out = {}
    for (path, p), u in zip(jax.tree_util.tree_leaves_with_path(params, is_leaf=is_var),
                            jax.tree.leaves(updates, is_leaf=is_var)):
        p, u = np.asarray(p[...], np.float64), np.asarray(u[...], np.float64)
        big = np.abs(p) > 1e-3
        out[optim.param_path(path)] = (float(np.median(-u[big] / (lr * p[big])))
                                       if big.any() else 0.0)
    return out


@pytest.mark.parametrize("groups", [{}, {g: {"lr_scale": 0.5} for g in SSM}])
def test_weight_decay_exempt_patterns_leave_matching_parameters_undecayed(groups):
    """config.weight_decay_exempt (S4's bias_weight_decay / normalization_weight_decay
    False): parameters whose path matches a pattern are not decayed, in the chain without
    groups and in the grouped one; the rest keep their decay (no_weight_decay marks too)."""
    params = jax.tree.map(lambda v: v.replace(v[...] + 1.0), _params(),  # no zero biases
                          is_leaf=lambda x: isinstance(x, nnx.Variable))
    paths = optim.param_paths(params)
    assert "head/glu/bias" in paths and "log_dt" in paths
    config = _config(**groups)
    config.weight_decay_exempt = ("*bias", "d")
    decay = _decay_per_parameter(optim.make_optimizer(config, lambda step: LR), params, LR)
    for path, wd in decay.items():
        scale = 0.5 if groups and path in ("log_a_real", "a_imag", "b", "log_dt") else 1.0
        marked = path in ("log_dt", "log_a_real", "a_imag", "b")  # no_weight_decay
        want = 0.0 if marked or path in ("head/glu/bias", "d") else 0.05
        assert wd == pytest.approx(want * scale, rel=1e-4, abs=1e-9), path
    # without the patterns the bias and d are decayed: the patterns are what exempts them
    plain = _decay_per_parameter(optim.make_optimizer(_config(**groups), lambda step: LR),
                                 params, LR)
    assert plain["head/glu/bias"] == pytest.approx(0.05, rel=1e-4)
    assert plain["d"] == pytest.approx(0.05, rel=1e-4)


def test_weight_decay_exempt_refuses_patterns_that_match_nothing_and_bad_values():
    config = _config()
    config.weight_decay_exempt = ("*bias", "encoder/stack/*bias")
    tx = optim.make_optimizer(config, lambda step: LR)
    with pytest.raises(ConfigError, match=r"'encoder/stack/\*bias' matches no parameter of "
                                          r"model 's4d'"):
        tx.init(_params())
    for bad in (("*bias", ""), (3,)):  # ml_collections refuses a str for the tuple
        config = common.base_config(task="listops", model="s4d")
        config.weight_decay_exempt = bad
        with pytest.raises(ConfigError, match="weight_decay_exempt=.*must be a tuple"):
            common.validate(config)

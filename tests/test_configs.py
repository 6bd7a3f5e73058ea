"""Config files: argument parsing, LRA defaults, presets."""
import importlib

import pytest

from configs import common, listops, presets
from lra.errors import ConfigError
from models import registry

TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")


def test_parse_arg_types_and_errors():
    arg = common.parse_arg("model=performer,runlocal,steps=7", model="x", runlocal=False,
                           steps=1)
    assert (arg.model, arg.runlocal, arg.steps) == ("performer", True, 7)
    with pytest.raises(ConfigError, match="unknown config argument 'modle'.*known: model"):
        common.parse_arg("modle=x", model="x")
    with pytest.raises(ConfigError, match="not a boolean"):
        common.parse_arg("runlocal=maybe", runlocal=False)


def test_listops_defaults_are_lras():
    c = listops.get_config()
    assert (c.batch_size, c.learning_rate, c.warmup, c.num_train_steps) == (32, 0.05, 1000, 5000)
    assert (c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim) == (512, 8, 4, 512, 1024)
    assert c.factors == "constant * linear_warmup * rsqrt_decay"
    assert (c.pooling, c.max_length, c.weight_decay) == ("CLS", 2000, 0.1)
    common.validate(c)


@pytest.mark.parametrize("task", TASKS)
def test_every_task_has_small_modes_smaller_than_lras(task):
    module = importlib.import_module(f"configs.{task}")
    full = module.get_config()
    for arg in ("runlocal", "mini"):
        small = module.get_config(arg)
        common.validate(small)
        assert small.max_length <= full.max_length, arg
        assert small.num_train_steps < full.num_train_steps, arg
        assert small.emb_dim * small.num_layers <= full.emb_dim * full.num_layers, arg
    mini = module.get_config("model=linear,mini")
    assert mini.model == "linear" and mini.dropout_rate == 0.0


def test_every_registered_model_has_a_config():
    for name in registry.available():
        c = listops.get_config(f"model={name}")
        assert c.model == name
        accepted = registry.accepted_hparams(name)
        for key in c.model_hparams:
            assert key in accepted, f"preset {name}.{key} is not a hyperparameter of {name}"


def test_presets_name_registered_models_only():
    assert set(presets.PRESETS) <= set(registry.available())


def test_validate_rejects_bad_values():
    c = listops.get_config("runlocal")
    c.attention_impl = "fast"
    with pytest.raises(ConfigError, match="attention_impl"):
        common.validate(c)
    c = listops.get_config("runlocal")
    c.num_heads = 3
    with pytest.raises(ConfigError, match="divisible by config.num_heads"):
        common.validate(c)


def test_mesh_shape_resolves_and_rejects_impossible_shapes():
    from lra import sharding

    assert sharding.mesh_shape((-1, 1), 8) == (8, 1)
    assert sharding.mesh_shape((2, -1), 8) == (2, 4)
    with pytest.raises(ConfigError, match="needs a multiple of 3 devices; there are 8"):
        sharding.mesh_shape((3, -1), 8)
    with pytest.raises(ConfigError, match="at most one -1"):
        sharding.mesh_shape((-1, -1), 8)
    with pytest.raises(ConfigError, match="uses 2 devices, but there are 8"):
        sharding.mesh_shape((2, 1), 8)
    with pytest.raises(ConfigError, match="2 entries"):
        sharding.mesh_shape((8,), 8)

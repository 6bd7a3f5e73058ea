"""Config files: argument parsing, LRA defaults, presets."""
import importlib

import pytest

from configs import common, listops, presets
from lra.errors import ConfigError
from models import registry

# LRA's six tasks and MNIST (not LRA: sequential MNIST and pixel generation, issue 34),
# whose variant presets are Image's (configs/common.py PRESET_TASK).
TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx", "mnist")


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
    for bad in ("10", "3,2", "0,4", "a,b", "1,2,3"):
        c = listops.get_config("runlocal")
        c.profile_steps = bad
        if bad == "10":  # one step is allowed
            common.validate(c)
            continue
        with pytest.raises(ConfigError, match="profile_steps"):
            common.validate(c)


def test_mesh_shape_resolves_and_rejects_impossible_shapes():
    from lra.training import sharding

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


# ----------------------------------------------------------------------------------
# Presets relative to the length: the same fraction of keys at any max_length.

# Today's (full-size) values of every length-scaled preset: unchanged at each task's
# reference length.
FULL_SIZE = {
    "linformer": {"k": 32}, "set_transformer": {"num_inducing": 32}, "luna": {"packed_len": 16},
    "poolingformer": {"window1": 64, "window2": 256, "pool_size": 5, "pool_stride": 4},
    "local": {"window": 128}, "fixed": {"block": 128, "c": 8}, "dilated": {"window": 64},
    "random": {"num_random": 8}, "block_local": {"block": 128, "memory": 128},
    "local_2d": {"query_height": 8, "query_width": 16, "flange_height": 8, "flange_width": 8},
    "longformer": {"window": 256}, "bigbird": {"block": 64}, "sinkhorn": {"block_size": 64},
    "reformer": {"n_buckets": 32, "n_hashes": 2, "chunk_len": 64},
    "sac": {"k": 32}, "clustered": {"num_clusters": 100, "topk": 32},
    "adaptive_span": {"ramp": 32.0}, "moba": {"block_size": 64, "top_k": 3},
    "nsa": {"block_size": 64, "block_counts": 6, "window_size": 128},
    # truncation 1024 (4096 on Path-X): task-dependent, checked against the presets above.
    "mega": {"ndim": 16},
}


def test_reference_lengths_are_the_full_size_configs():
    for task in TASKS:
        full = importlib.import_module(f"configs.{task}").get_config()
        if task in common.PRESET_TASK:  # presets stated at another task's length
            assert task not in presets.REFERENCE_LENGTHS, task
            assert common.preset_task(task) in presets.REFERENCE_LENGTHS, task
            continue
        assert presets.REFERENCE_LENGTHS[task] == full.max_length, task


@pytest.mark.parametrize("task", TASKS)
def test_presets_at_full_size_are_unchanged(task):
    module = importlib.import_module(f"configs.{task}")
    assert set(presets.LENGTH_SCALED) <= set(FULL_SIZE)
    if task in common.PRESET_TASK:  # MNIST: Image's presets scaled from 1024 to 784 tokens
        source = common.preset_task(task)
        for name in registry.available():
            c = module.get_config(f"model={name}")
            assert c.model_hparams.to_dict() == presets.model_hparams(
                name, source, max_length=c.max_length), name
        assert module.get_config("model=local").model_hparams.window == 98  # 128 * 784/1024
        assert module.get_config("model=transformer_xl").block.segment_len == 196
        return
    for name in registry.available():
        c = module.get_config(f"model={name}")
        assert c.model_hparams.to_dict() == {**presets.PRESETS.get(name, {}),
                                             **presets.TASK_OVERRIDES.get((name, task), {})}
        for key, value in FULL_SIZE.get(name, {}).items():
            assert c.model_hparams[key] == value, (name, key)
        assert c.block.segment_len == 256  # models/blocks.py BLOCK_DEFAULTS


@pytest.mark.parametrize("task", TASKS)
def test_configs_scale_the_presets_to_their_final_length(task):
    """mini/runlocal set max_length first; the hparams follow it."""
    module = importlib.import_module(f"configs.{task}")
    for arg in ("", "mini", "runlocal"):
        for name in ("local", "bigbird", "reformer", "linformer", "local_2d"):
            c = module.get_config(",".join(filter(None, [f"model={name}", arg])))
            assert c.model_hparams.to_dict() == presets.model_hparams(
                name, common.preset_task(task), max_length=c.max_length), (arg, name)


def test_listops_mini_presets_keep_the_fraction_of_keys_and_the_bottlenecks():
    def mini(name):
        return listops.get_config(f"model={name},mini").model_hparams.to_dict()

    assert listops.get_config("mini").max_length == 64  # 64 / 2000 of the full length
    assert mini("local")["window"] == 4  # 128 * 64 / 2000 = 4.1
    assert mini("longformer")["window"] == 8
    assert mini("bigbird") == {"block": 2, "num_random_blocks": 3, "num_global_blocks": 2}
    # Ranks and bottlenecks are not scaled: at most L / 4 (issue 27: scaled, they were 1).
    assert mini("linformer")["k"] == 16 and mini("sac")["k"] == 16
    # chunks of 2; buckets of about a chunk (64 / 32 = 2), as 2000 / 32 ~ 64 at full size
    assert mini("reformer") == {"n_buckets": 32, "n_hashes": 2, "chunk_len": 2}
    assert mini("sinkhorn")["block_size"] == 2
    assert (mini("fixed")["block"], mini("fixed")["c"]) == (4, 1)
    assert (mini("block_local")["block"], mini("block_local")["memory"]) == (4, 4)
    assert (mini("clustered")["num_clusters"], mini("clustered")["topk"]) == (16, 16)
    assert mini("luna")["packed_len"] == 16 and mini("set_transformer")["num_inducing"] == 16
    assert mini("poolingformer") == {"window1": 2, "window2": 8, "pool_size": 5,
                                     "pool_stride": 4}
    assert mini("adaptive_span")["ramp"] == 1.0
    # 2-D sizes follow sqrt(L): 8 x 16 query blocks become 1 x 3 on a 9-wide raster
    assert mini("local_2d") == {"query_height": 1, "query_width": 3, "flange_height": 1,
                                "flange_width": 1}
    # config.block's token counts follow too, and a segment-recurrent model pools by MEAN
    xl = listops.get_config("model=transformer_xl,mini")
    assert (xl.block.segment_len, xl.pooling) == (8, "MEAN")


def test_scaling_keeps_the_builders_constraints():
    for length in (1, 7, 16, 64, 100, 513, 4096, 50_000):
        fixed = presets.model_hparams("fixed", "listops", max_length=length)
        assert 1 <= fixed["c"] <= fixed["block"]
        reformer = presets.model_hparams("reformer", "listops", max_length=length)
        assert reformer["n_buckets"] >= 2 and reformer["n_buckets"] % 2 == 0
        for name, keys in presets.LENGTH_SCALED.items():
            hparams = presets.model_hparams(name, "text", max_length=length)
            assert all(hparams[k] >= 1 for k in keys), (name, length)
    with pytest.raises(ConfigError, match="no reference length for task 'nope'"):
        presets.model_hparams("local", "nope", max_length=64)


# The dense check (lra/dense_check.py): which variants compute dense attention at a length.

SPARSE_AT_SOME_LENGTH = [n for n in registry.available()
                         if registry.capabilities(n).dense_equivalent]


@pytest.mark.parametrize("name", SPARSE_AT_SOME_LENGTH)
def test_no_variant_reduces_to_dense_at_listops_mini(name):
    from lra import dense_check

    c = listops.get_config(f"model={name},mini")
    assert dense_check.run_length(c.to_dict()) == (65, 1)  # 64 tokens and the CLS slot
    assert not dense_check.run_reduces_to_dense(c.to_dict())


def test_dense_check_finds_sizes_that_cover_the_sequence():
    from lra import dense_check

    L = 65  # ListOps mini: 64 tokens and the CLS slot (prefix_len=1)
    dense = dict(length=L, prefix_len=1)
    assert dense_check.reduces_to_dense("local", {"window": 128}, **dense)  # the old preset
    assert dense_check.reduces_to_dense("local", {"window": 63}, **dense)
    assert not dense_check.reduces_to_dense("local", {"window": 62}, **dense)  # 2 pairs miss
    assert dense_check.reduces_to_dense("bigbird", {"block": 64}, **dense)
    assert dense_check.reduces_to_dense("reformer", {"n_buckets": 32, "n_hashes": 2,
                                                     "chunk_len": 64}, length=64)
    # Each chunk also sees the one before it (the first wraps around): 2 chunks see all.
    assert dense_check.reduces_to_dense("reformer", {"n_buckets": 2, "n_hashes": 1,
                                                     "chunk_len": 32}, length=64)
    assert not dense_check.reduces_to_dense("reformer", {"n_buckets": 4, "n_hashes": 1,
                                                         "chunk_len": 16}, length=64)
    assert dense_check.reduces_to_dense("sac", {"k": L}, **dense)
    assert dense_check.reduces_to_dense("linformer", {"k": L, "projection_init": "identity"},
                                        **dense)
    assert not dense_check.reduces_to_dense("linformer", {"k": 32}, **dense)
    assert dense_check.reduces_to_dense("transformer", {}, **dense)
    assert not dense_check.reduces_to_dense("performer", {}, **dense)  # no dense limit
    with pytest.raises(registry.RegistryError, match="unknown model"):
        dense_check.reduces_to_dense("nope", {}, **dense)


def test_unscaled_presets_were_dense_at_listops_mini():
    """The issue: at 64 tokens the full-size sizes cover the whole input."""
    from lra import dense_check

    for name in ("local", "longformer", "bigbird", "fixed", "block_local", "local_2d",
                 "reformer", "clustered"):
        assert dense_check.reduces_to_dense(name, presets.model_hparams(name, "listops"),
                                            65, prefix_len=1), name


@pytest.mark.slow
@pytest.mark.parametrize("task", [t for t in TASKS if t != "listops"])
def test_no_variant_reduces_to_dense_at_any_mini(task):
    from lra import dense_check

    module = importlib.import_module(f"configs.{task}")
    dense = [n for n in SPARSE_AT_SOME_LENGTH
             if dense_check.run_reduces_to_dense(module.get_config(f"model={n},mini").to_dict())]
    assert not dense


def test_relative_position_variants_get_no_absolute_positions():
    """Transformer-XL and GTrXL use relative positions only (their papers); the task
    configs give them pos_emb='none' (Capabilities.pos_emb), the others 'learned'."""
    for name in ("transformer_xl", "gtrxl"):
        assert listops.get_config(f"model={name}").pos_emb == "none", name
        assert listops.get_config(f"model={name},mini").pos_emb == "none", name
    assert listops.get_config("model=transformer").pos_emb == "learned"
    from models.encoder import Embeddings
    from flax import nnx
    import jax.numpy as jnp

    emb = Embeddings(vocab_size=5, emb_dim=4, max_len=3, pos_emb="none", rngs=nnx.Rngs(0))
    tokens = jnp.array([[1, 1, 1]])
    x = emb(tokens, deterministic=True)
    assert emb.position is None and bool((x == x[:, :1]).all())  # same token, same vector


def test_configs_without_dropout_have_no_weight_dropout_either():
    assert listops.get_config("model=lite").model_hparams.weight_dropout == 0.1
    for task in TASKS:
        module = importlib.import_module(f"configs.{task}")
        c = module.get_config("model=lite,mini")
        assert c.dropout_rate == 0.0 and c.model_hparams.weight_dropout == 0.0, task

"""Hybrid stacks (issue 45): a model is a list of layers, each a registered mixer with its
own hparams, built through the task configs (configs/hybrid.py) and the one model tree
(registry -> blocks -> stacks -> encoder). The single-mixer model is that list with one
name repeated; everything a single mixer has works per layer: decoding with mixed caches,
causal_lm and lra.generate, bidirectional classifiers, bfloat16 and keep_float32,
parameter groups, attention_impl, resume refusals, reports."""
from __future__ import annotations

import functools
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

import lra.tasks
from configs import common, hybrid, listops
from lra import train
from lra.runs import spec
from lra.training import optim, resume
from lra.errors import ConfigError
from models import precision
from tests.models.helpers import apply, randomize_params
from tests.models.test_decoding import check_equal

LISTOPS = lra.tasks.get("listops")


def config_of(arg: str = "model=gla,runlocal", num_layers: int = 4, **fields):
    """configs/listops.py:<arg> with num_layers and `hybrid.<field>` / top-level fields,
    set as --config overrides would set them (tuples of strings are split at commas)."""
    c = listops.get_config(arg)
    c.num_layers = num_layers
    for key, value in fields.items():
        if key == "layers_list":
            c.layers = value
        elif key in ("max_length", "causal", "attention_impl", "dtype", "pooling"):
            c[key] = value
        else:
            c.hybrid[key] = value
    return c


def _variables(state) -> dict[str, nnx.Variable]:
    """{'encoder/stack/blocks/0/mixer_norm/scale': its Variable, ...}"""
    return {optim.param_path(p): v for p, v in jax.tree_util.tree_leaves_with_path(
        state, is_leaf=lambda x: isinstance(x, nnx.Variable))}


def _params(model) -> dict[str, np.ndarray]:
    return {p: np.asarray(v[...]) for p, v in _variables(nnx.state(model, nnx.Param)).items()}


# ----------------------------------------------------------------------------- the forms


def test_the_concise_forms_and_the_full_list_are_one_layer_list():
    forms = {
        "fla (layers)": config_of(mixer="transformer", layers=(1, 3)),
        "Jamba (period, offset)": config_of(mixer="transformer", period=2, offset=1),
        "RecurrentGemma (pattern)": config_of(pattern=("gla,transformer",)),
        "full list": config_of(layers_list=("gla,transformer,gla,transformer",)),
        "full list of dicts": config_of(layers_list=(
            "gla", {"model": "transformer"}, "gla", {"model": "transformer"})),
    }
    lists = {k: hybrid.layer_list(c) for k, c in forms.items()}
    first = lists["fla (layers)"]
    assert [l["model"] for l in first] == ["gla", "transformer", "gla", "transformer"]
    for form, layers in lists.items():
        assert layers == first, form
        assert hybrid.name(forms[form]) == "gla+transformer@1,3", form
    # A pattern is cut at num_layers (RecurrentGemma's block_types cycled over the depth).
    c = config_of(num_layers=5, pattern=("gla,gla,local",))
    assert hybrid.layer_names(c) == ["gla", "gla", "local", "gla", "gla"]
    assert hybrid.name(c) == "gla+local@2"
    # Several other mixers: each named with its layers.
    c = config_of(layers_list=("gla,transformer,local,transformer",))
    assert hybrid.name(c) == "gla+transformer@1,3+local@2"
    # No hybrid field: the single-mixer model, named as before.
    assert hybrid.layer_list(config_of()) is None and hybrid.name(config_of()) == "gla"


def test_each_layer_gets_its_mixers_presets_block_and_groups():
    # `hybrid=local` puts local's presets, scaled to runlocal's 128 tokens, into
    # hybrid.model_hparams (a field to override); the base keeps config.model_hparams.
    c = config_of("model=gla,runlocal,hybrid=local", mixer="local", layers=(1,))
    assert c.hybrid.model_hparams.window == 8  # 128 of 2000 tokens at 128 tokens
    c.hybrid.model_hparams.window = 3
    c.hybrid.block.ffn = False
    c.hybrid.block.short_conv = 3  # Zoology's short convolution, in local's layers only
    gla, local = hybrid.layer_list(c)[:2]
    assert gla["model_hparams"] == c.model_hparams.to_dict() and gla["block"] == {}
    assert local["model_hparams"] == {"window": 3}
    assert local["block"] == {"ffn": False, "short_conv": 3}
    blocks = train.build_model(c, LISTOPS).encoder.stack.blocks
    assert blocks[0].mlp is not None and blocks[0].short_conv is None
    assert blocks[1].mlp is None and blocks[1].short_conv is not None
    # Set on the command line only (no `hybrid=` argument): the presets at build time.
    c = config_of(mixer="local", layers=(1,))
    assert hybrid.layer_list(c)[1]["model_hparams"] == {"window": 8}
    # s4d's groups come with it, for its layers only.
    c = config_of("model=gla,runlocal,hybrid=s4d", layers=(1,))
    groups = [l["param_groups"] for l in hybrid.layer_list(c)]
    assert groups[0] == {} and set(groups[1]) == {"ssm", "ssm_b", "ssm_step"}
    model = train.build_model(c, LISTOPS)
    blocks = model.encoder.stack.blocks
    assert type(blocks[0].mixer).__name__ != type(blocks[1].mixer).__name__
    assert blocks[1].mlp is not None  # config.block's ffn, the model's


@pytest.mark.parametrize("fields, message", [
    (dict(mixer="nope", layers=(1,)), "unknown mixer config.hybrid.mixer='nope'"),
    (dict(pattern=("gla,atention",)), "unknown mixer 'atention' at layer 1"),
    (dict(layers_list=("gla,gla,gla,transfomer",)), "unknown mixer 'transfomer' at layer 3"),
    (dict(mixer="transformer", layers=(1, 4)), "4 out of range for config.num_layers=4"),
    (dict(mixer="transformer", layers=(-1,)), "-1 out of range"),
    (dict(mixer="transformer", layers=(0, 1, 2, 3)), "leave no layer of config.model='gla'"),
    (dict(mixer="transformer", period=1), "leave no layer of config.model='gla'"),
    (dict(pattern=("transformer,local",)), "leave no layer of config.model='gla'"),
    (dict(mixer="transformer"), "selects no layer"),
    (dict(layers=(1,)), "config.hybrid.mixer, which is not set"),
    (dict(mixer="transformer", layers=(1,), period=2), "set one of them"),
    (dict(mixer="transformer", period=2, offset=2), "0 <= offset < period"),
    (dict(mixer="gla", layers=(1,)), "config.hybrid.mixer is config.model"),
    (dict(mixer="transformer", layers=(1,), layers_list=("gla,gla",)), "set one of them"),
    (dict(layers_list=("gla,transformer",)), "config.layers lists 2 layers but "
                                             "config.num_layers=4"),
    (dict(layers_list=("gla", {"model": "local", "window": 3}, "gla", "gla")),
     "an entry is a name or a dict"),
    (dict(mixer="local", layers=(1,), block={"stack": "reversible"}),
     "a layer may set only kind, ffn, ffn_chunks, gate_bias, short_conv"),
    (dict(mixer="transformer", layers=(1,), param_groups={"ssm": {"lr_scal": 1.0}}),
     "unknown setting(s) lr_scal"),
    (dict(mixer="luna", layers=(1,), causal=True), "layer 1 (luna) is not causal"),
])
def test_what_cannot_be_a_layer_list_is_one_line_before_anything_runs(fields, message):
    config = config_of(**fields)
    with pytest.raises(ConfigError) as e:
        common.validate(config)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_stacks_that_take_no_layer_list_say_so():
    config = config_of(mixer="transformer", layers=(1,))
    config.block.stack = "universal"
    with pytest.raises(ConfigError, match="universal stack applies one shared block"):
        common.validate(config)
    config = config_of("model=transformer_xl,runlocal", mixer="transformer", layers=(1,))
    with pytest.raises(ValueError, match="takes memory.*in every layer; 'transformer'"):
        train.build_model(config, LISTOPS)


# ------------------------------------------------------------- one model tree, unchanged


@pytest.mark.parametrize("name", ["transformer", "gla", "s4d", "luna", "reformer",
                                  "transformer_xl"])
def test_the_single_mixer_model_is_the_list_with_one_name_repeated(name):
    """The same parameter paths and values at a fixed seed, through the sequential,
    reversible (reformer) and segment_recurrent (transformer_xl) stacks and a mixer that
    carries state between layers (luna); named as before. (Before issue 45's change the
    single-mixer trees of 21 model/objective pairs were recorded and compared equal after
    it; checkpoints written before it resume: docs/hybrids.md.)"""
    plain = config_of(f"model={name},runlocal", num_layers=2)
    listed = config_of(f"model={name},runlocal", num_layers=2,
                       layers_list=(f"{name},{name}",))
    assert hybrid.name(listed) == hybrid.name(plain) == name
    a = _params(train.build_model(plain, LISTOPS))
    b = _params(train.build_model(listed, LISTOPS))
    assert list(a) == list(b)
    for path in a:
        np.testing.assert_array_equal(a[path], b[path], err_msg=path)


def test_a_hybrid_is_built_in_place_with_the_same_random_stream():
    """Layer i of a hybrid is the pure model's layer i where the mixers agree up to the
    first one that differs (the embeddings and layer 0 here), so the tree is the one tree."""
    pure = _params(train.build_model(config_of(num_layers=2), LISTOPS))
    mixed = _params(train.build_model(config_of(mixer="transformer", layers=(1,),
                                                num_layers=2), LISTOPS))
    layer0 = [p for p in pure if p.startswith(("encoder/embeddings", "encoder/stack/blocks/0/"))]
    assert layer0
    for path in layer0:
        np.testing.assert_array_equal(pure[path], mixed[path], err_msg=path)
    assert "encoder/stack/blocks/1/mixer/query/bias" in mixed
    assert "encoder/stack/blocks/1/mixer/query/bias" not in pure


# ----------------------------------------------------------------------- decoding


@pytest.mark.parametrize("arg, fields", [
    # a recurrent state, a kv ring (local's window), a recurrent state
    ("model=gla,runlocal,causal,pretrain,hybrid=local", dict(num_layers=3, layers=(1,))),
    # a full kv cache (learned positions), a recurrent state, a convolution + kv cache
    ("model=transformer,runlocal,causal,pretrain",
     dict(num_layers=3, layers_list=("transformer,mamba2,lite",))),
])
def test_decoding_with_mixed_caches_equals_the_parallel_causal_forward(arg, fields):
    """tests/models/test_decoding.py's contract for a hybrid through the configs: prefill
    of right-padded prompts of three lengths, then one token at a time, equals the
    parallel causal forward at every position (each layer keeps its own cache form)."""
    config = config_of(arg, max_length=32, **fields)
    model = randomize_params(train.build_model(config, LISTOPS), seed=5, scale=0.3)
    forms = [b.decode_form for b in model.encoder.stack.blocks]
    assert len(set(forms)) > 1, forms
    cache = model.init_cache(2)["stack"]
    assert len({json.dumps(jax.tree.map(lambda x: list(x.shape), c), sort_keys=True)
                for c in cache}) > 1  # each layer its own cache form
    check_equal(model, LISTOPS.vocab_size)


# ----------------------------------------------------------- classifiers and precision


def test_a_bidirectional_hybrid_classifier_ignores_padding():
    """s4d's bidirectional form beside softmax attention, pooled from the CLS slot (every
    layer sees the prefix): padded positions change no logit."""
    config = config_of("model=s4d,runlocal,hybrid=transformer", num_layers=2, layers=(1,),
                       max_length=32)
    assert config.pooling == "CLS" and not config.causal
    model = randomize_params(train.build_model(config, LISTOPS), seed=2, scale=0.3)
    tokens = jax.random.randint(jax.random.key(1), (2, 32), 1, LISTOPS.vocab_size)
    mask = jnp.arange(32)[None] < jnp.array([[20], [27]])
    other = jnp.where(mask, tokens, (tokens * 7) % LISTOPS.vocab_size)
    a, b = apply(model, tokens, mask), apply(model, other, mask)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_bfloat16_casts_per_parameter_and_keeps_each_layers_float32_marks():
    config = config_of("model=gla,runlocal,hybrid=s4d", num_layers=2, layers=(1,),
                       max_length=32)
    model = randomize_params(train.build_model(config, LISTOPS), seed=5, scale=0.3)
    view = precision.compute_view(model, jnp.bfloat16)
    dtypes = {p: v[...].dtype for p, v in _variables(nnx.state(view, nnx.Param)).items()}
    marked = {p for p, v in _variables(nnx.state(model, nnx.Param)).items()
              if v.get_metadata().get(precision.KEEP_FLOAT32)}
    assert marked and all(p.startswith("encoder/stack/blocks/1/mixer/") for p in marked)
    for path, dtype in dtypes.items():
        assert dtype == (jnp.float32 if path in marked else jnp.bfloat16), path
    tokens = jax.random.randint(jax.random.key(0), (2, 32), 1, LISTOPS.vocab_size)
    f32 = np.asarray(apply(model, tokens, None))
    bf16 = np.asarray(apply(view, tokens, None), np.float32)
    assert np.abs(bf16 - f32).max() <= 3e-2 * np.abs(f32).max()


# --------------------------------------------------------------- parameter groups


def _update(tx, params, grad: float) -> dict[str, np.ndarray]:
    grads = jax.tree.map(lambda v: v.replace(np.full(v[...].shape, grad, np.float32)), params,
                         is_leaf=lambda x: isinstance(x, nnx.Variable))
    updates, _ = tx.update(grads, tx.init(params), params)
    return {p: np.asarray(u[...], np.float64) for p, u in _variables(updates).items()}


def test_an_ssm_layers_group_applies_to_that_layer_only():
    """lru's layer 0 and s4d's layer 1 both mark parameters "ssm" (lru: lr_scale 0.5, s4d:
    0.1, their papers'); each trains with its own layer's group, per parameter, read off
    the optimiser's first update: with zero gradients it is -lr * s * wd * p, with unit
    gradients -lr * s * (1 + wd * p) (Adam's first step is the gradient's sign)."""
    lr = 0.01
    config = config_of("model=lru,runlocal,hybrid=s4d", num_layers=2, layers=(1,))
    config.hybrid.param_groups.ssm_c = {"weight_decay": 0.3}  # s4d's C, its layer only
    config.factors = "constant"
    config.learning_rate = lr
    common.validate(config)
    model = train.build_model(config, LISTOPS)
    params = jax.tree.map(lambda v: v.replace(v[...] + 0.5), nnx.state(model, nnx.Param),
                          is_leaf=lambda x: isinstance(x, nnx.Variable))  # no zeros
    meta = {p: v.get_metadata() for p, v in _variables(params).items()}
    values = {p: np.asarray(v[...], np.float64) for p, v in _variables(params).items()}
    tx = optim.make_optimizer(config, optim.learning_rate_schedule(config),
                              spec.resolve(config))
    u0, u1 = _update(tx, params, 0.0), _update(tx, params, 1.0)
    seen = set()
    for path, m in meta.items():
        group, layer = m.get("param_group"), optim.layer_of(path)
        scale = {(0, "ssm"): 0.5, (1, "ssm"): 0.1, (1, "ssm_b"): 0.1,
                 (1, "ssm_step"): 0.1}.get((layer, group), 1.0)
        decay = (0.0 if m.get("no_weight_decay") else 0.3 if (layer, group) == (1, "ssm_c")
                 else config.weight_decay)
        s = np.median((u0[path] - u1[path]) / lr)
        wd = np.median(-u0[path] / (lr * s * values[path]))
        assert s == pytest.approx(scale, rel=1e-4), path
        assert wd == pytest.approx(decay, rel=1e-4, abs=1e-7), path
        seen.add((layer, group))
    assert {(0, "ssm"), (1, "ssm"), (1, "ssm_c")} <= seen
    # A group a layer does not carry is refused like config.param_groups' misspellings.
    config.hybrid.param_groups.ssm_x = {"lr_scale": 0.5}
    tx = optim.make_optimizer(config, optim.learning_rate_schedule(config),
                              spec.resolve(config))
    with pytest.raises(ConfigError, match=r"layer 1 \(s4d\) name ssm_x, which no parameter"):
        tx.init(params)


# ------------------------------------------------------------------- attention_impl


def test_attention_impl_per_layer():
    """A kernel in the layers that have one: the transformer layer's own hparams choose
    blocksparse (an exact form of its attention: the logits equal the dense model's);
    config.attention_impl goes to every layer whose mixer has the choice; none: refused."""
    dense = config_of("model=s4d,runlocal,hybrid=transformer", num_layers=2, layers=(1,),
                      max_length=32)
    sparse = config_of("model=s4d,runlocal,hybrid=transformer", num_layers=2, layers=(1,),
                       max_length=32)
    sparse.hybrid.model_hparams.attention_impl = "blocksparse"
    a = randomize_params(train.build_model(dense, LISTOPS), seed=1, scale=0.3)
    b = randomize_params(train.build_model(sparse, LISTOPS), seed=1, scale=0.3)
    assert b.encoder.stack.blocks[1].mixer.attention_impl == "blocksparse"
    tokens = jax.random.randint(jax.random.key(0), (2, 32), 1, LISTOPS.vocab_size)
    np.testing.assert_allclose(np.asarray(apply(a, tokens, None)),
                               np.asarray(apply(b, tokens, None)), rtol=1e-5, atol=1e-5)
    dense.attention_impl = "blocksparse"  # s4d has one form; the transformer layer takes it
    model = train.build_model(dense, LISTOPS)
    assert model.encoder.stack.blocks[1].mixer.attention_impl == "blocksparse"
    refused = config_of("model=lru,runlocal,hybrid=s4d", num_layers=2, layers=(1,),
                        attention_impl="pallas")
    with pytest.raises(ValueError, match="no layer's mixer \\(lru, s4d\\) has a choice"):
        train.build_model(refused, LISTOPS)


def _flags(*argv: str) -> ml_collections.ConfigDict:
    """The config the command line makes (ml_collections' --config overrides, as launch)."""
    from absl import flags
    from ml_collections import config_flags

    listops_py = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs",
                              "listops.py")
    argv = ["launch", f"--config={listops_py}:{argv[0]}", *argv[1:]]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values,
                                    lock_config=True, sys_argv=argv)
    values(argv)
    return values.config


def test_attention_impl_in_the_hybrid_layers_only_from_the_command_line():
    """docs/hybrids.md's way: --config.hybrid.model_hparams.attention_impl=<kernel> puts
    the kernel in hybrid.mixer's layers only (it was refused: no such field); unset, the
    layers take config.attention_impl, and the resolved layer list is as before."""
    c = _flags("model=s4d,runlocal,hybrid=transformer", "--config.num_layers=2",
               "--config.hybrid.layers=1",
               "--config.hybrid.model_hparams.attention_impl=blocksparse")
    assert hybrid.layer_list(c)[1]["model_hparams"]["attention_impl"] == "blocksparse"
    model = train.build_model(c, LISTOPS)
    assert model.encoder.stack.blocks[1].mixer.attention_impl == "blocksparse"
    plain = _flags("model=s4d,runlocal,hybrid=transformer", "--config.num_layers=2",
                   "--config.hybrid.layers=1", "--config.attention_impl=blocksparse")
    assert "attention_impl" not in hybrid.layer_list(plain)[1]["model_hparams"]
    assert train.build_model(plain, LISTOPS).encoder.stack.blocks[1].mixer.attention_impl \
        == "blocksparse"


def test_an_empty_layer_list_is_one_config_error():
    """--config.layers= (an empty full list) was an IndexError traceback."""
    c = _flags("model=gla,runlocal", "--config.layers=")
    with pytest.raises(ConfigError, match=r"config.layers is empty.*one mixer per layer"):
        hybrid.layer_list(c)
    with pytest.raises(ConfigError, match=r"config.layers is empty"):
        common.validate(c)


# ------------------------------------------------------ a causal_lm run of a hybrid


@pytest.fixture(scope="module")
def run(listops_dir, tmp_path_factory):
    """gla with local attention at layer 1 of 2, causal_lm on ListOps, 8 steps."""
    from tests.test_generate import _train

    config = config_of("model=gla,runlocal,causal,pretrain,hybrid=local", num_layers=2,
                       layers=(1,), max_length=32)
    return _train(config, listops_dir, str(tmp_path_factory.mktemp("hybrid_run")), 8)


def test_a_hybrid_run_is_named_by_its_layers(run):
    with open(os.path.join(run, "results.json")) as f:
        results = json.load(f)
    assert results["model"] == "gla+local@1"
    assert [l["model"] for l in results["layers"]] == ["gla", "local"]
    assert results["layers"][1]["model_hparams"] == {"window": 8}
    from lra import report
    from lra.runs.results import collect

    assert report.labels(collect(run)) == ["gla+local@1 (causal_lm)"]


def test_generate_samples_a_hybrid_run_as_its_parallel_forward(run, tmp_path):
    from lra import generate
    from tests.test_generate import _greedy_by_parallel_forward, _restored

    out = generate.generate(run, num_samples=2, temperature=0, output=str(tmp_path / "g"))
    model = _restored(run)
    assert [type(b.mixer).__name__ for b in model.encoder.stack.blocks] == [
        "GatedLinearAttention", "PatternAttention"]
    for s in out["samples"]:
        expected, clear = _greedy_by_parallel_forward(
            model, s["prompt"], len(s["generated"]), max_len=32, l1=False,
            vocab_size=LISTOPS.vocab_size)
        assert clear >= 3
        assert list(s["generated"][:clear]) == expected[:clear]


def test_a_resume_with_another_layer_list_is_refused_naming_both(run):
    with open(os.path.join(run, "results.json")) as f:
        saved = json.load(f)["config"]
    same_list = config_of("model=gla,runlocal,causal,pretrain,hybrid=local", num_layers=2,
                          period=2, offset=1, max_length=32)  # the same list, another form
    for key in ("num_train_steps", "eval_frequency", "checkpoint_freq", "num_eval_steps",
                "log_every_steps", "data_dir"):
        same_list[key] = saved[key]
    resume.check_compatible(saved, same_list, run, step=8, diverged=False)
    other = ml_collections.ConfigDict(same_list.to_dict())
    other.hybrid.period, other.hybrid.offset, other.hybrid.layers = 0, 0, (0,)
    with pytest.raises(ConfigError) as e:
        resume.check_compatible(saved, other, run, step=8, diverged=False)
    assert ("of gla+local@1 (layers: gla, local), but this config builds gla+local@0 "
            "(layers: local, gla)") in str(e.value) and "\n" not in str(e.value)
    window = ml_collections.ConfigDict(same_list.to_dict())
    window.hybrid.model_hparams.window = 4
    with pytest.raises(ConfigError, match=r"with layer 1 model_hparams.window=8 -> 4"):
        resume.check_compatible(saved, window, run, step=8, diverged=False)


# ------------------------------------------------------------ dense and degeneracy checks


def test_dense_and_degeneracy_checks_run_per_layer():
    """lra.dense_check (and lra.report's marks) on a hybrid run's config: it reduces to
    dense attention when every layer does, and degenerates where one layer does (named)."""
    from lra import dense_check

    windowed = config_of("model=local,runlocal,hybrid=transformer", num_layers=2,
                         layers=(1,), max_length=32)
    windowed.model_hparams.window = 64  # covers the 33 positions: dense in both layers
    assert dense_check.run_reduces_to_dense(windowed.to_dict())
    windowed.model_hparams.window = 2
    assert not dense_check.run_reduces_to_dense(windowed.to_dict())
    bottleneck = config_of("model=gla,runlocal,hybrid=linformer", num_layers=2, layers=(1,),
                           max_length=32)
    assert dense_check.run_degenerate(bottleneck.to_dict()) is None
    bottleneck.hybrid.model_hparams.k = 1
    why = dense_check.run_degenerate(bottleneck.to_dict())
    assert why.startswith("layer 1 (linformer): ")


def test_init_from_copies_the_layers_whose_mixer_agrees(run, capsys):
    """A pure gla classifier from the gla+local@1 run: the embeddings, the final norm and
    layer 0 (gla there too) are copied; layer 1 (local there) starts as initialised."""
    from lra.training import checkpoint, init_from

    fine = config_of("model=gla,runlocal,causal", num_layers=2, max_length=32)
    fine.init_from = run
    _, fresh, _ = nnx.split(train.build_model(fine, LISTOPS), nnx.Param, ...)
    source = init_from.find_source(fine)
    loaded = init_from.load_encoder(fine, fresh, source)
    assert "layers 0 (gla), whose mixer is the same there; layers 1 (gla) start as " \
           "initialised" in capsys.readouterr().out
    saved = checkpoint.Checkpoints(run).restore_params(source[1], source[2])
    saved = {init_from._path_str(p): np.asarray(v)
             for p, v in jax.tree_util.tree_leaves_with_path(saved)}
    fresh = {init_from._path_str(p): np.asarray(v)
             for p, v in jax.tree_util.tree_leaves_with_path(fresh)}
    kinds = set()
    for path, value in jax.tree_util.tree_leaves_with_path(loaded):
        name = init_from._path_str(path)
        copied = name.startswith(("encoder/embeddings/", "encoder/norm/",
                                  "encoder/stack/blocks/0/"))
        np.testing.assert_array_equal(np.asarray(value),
                                      saved[name] if copied else fresh[name], err_msg=name)
        kinds.add((copied, name.split("/")[1]))
    assert {(True, "embeddings"), (True, "stack"), (False, "stack"), (False, "hidden")} <= kinds


def test_a_sweep_puts_a_hybrids_runs_in_a_folder_of_its_name():
    from lra.runs import plan

    assert plan.model_folder("listops", "gla", "runlocal", ["num_layers=4"]) == "gla"
    assert plan.model_folder("listops", "gla", "runlocal,hybrid=transformer",
                             ["num_layers=4", "hybrid.layers=1,3"]) == "gla+transformer@1,3"
    assert plan.model_folder("listops", "gla", "runlocal",
                             ["num_layers=3", "layers=gla,local,gla"]) == "gla+local@1"


# ------------------------------------------------ lra.benchmark, bench_generate, cache_memory


def test_the_measuring_tools_take_a_hybrid_by_its_name():
    from configs import hybrid as h
    from lra import bench_generate, benchmark, cache_memory

    assert h.split_models(["gla", "gla+transformer@1", "3", "local"]) == [
        "gla", "gla+transformer@1,3", "local"]
    assert h.parse_name("gla+transformer@1,3+local@2") == (
        "gla", [("transformer", [1, 3]), ("local", [2])])
    with pytest.raises(ConfigError, match="not a hybrid's name"):
        h.parse_name("gla+transformer")
    rows = cache_memory.measure("listops", "mini", ["gla", "local", "gla+local@1"], [32, 64])
    by = {r["model"]: r for r in rows}
    assert by["gla+local@1"]["form"] == "recurrent_state+kv_cache"
    # one layer of each of mini's two: a recurrent state and a window ring
    assert by["gla+local@1"]["bytes"][0] not in (by["gla"]["bytes"][0],
                                                 by["local"]["bytes"][0])
    # Each layer's presets at the config's own length, at every measured length, as the
    # base model's: the hybrid's local layer keeps the pure local's window ring (it grew
    # with the length when list layers took their presets at the changed max_length).
    rows = cache_memory.measure("listops", "mini", ["gla", "local", "gla+local@1"],
                                [64, 1024])
    by = {r["model"]: r for r in rows}
    for i in range(2):
        assert 2 * by["gla+local@1"]["bytes"][i] == (by["gla"]["bytes"][i]
                                                     + by["local"]["bytes"][i])
    assert by["gla+local@1"]["per_token"] == by["local"]["per_token"] / 2
    with pytest.raises(ConfigError, match="layer 2 out of range for num_layers=2"):
        cache_memory.config_for("listops", "gla+local@2", "mini")
    seconds, size = bench_generate.time_decoding(
        "gla+local@1", 24, 4, 1, 1, {"emb_dim": 16, "num_layers": 0, "num_heads": 2})
    assert seconds > 0 and size > 0
    row = benchmark.measure_train_step("gla+local@1", 32, task="listops",
                                       config_arg="runlocal", num_layers=2, repeats=0)
    assert row["model"] == "gla+local@1" and row["temp_bytes"] > 0
    with pytest.raises(ValueError, match="--mode=train_step"):
        benchmark.measure("gla+local@1", 32, batch_size=1, dim=16, num_heads=2, repeats=0)


def test_pallas_in_the_layers_that_have_a_kernel_lowered_for_cuda():
    """attention_impl=pallas on s4d+local@1: local's layer embeds the block-sparse Triton
    kernel (a forward and two backward calls), s4d's layer its one form; with gla as the
    base, gla's layer adds the decayed kernel's three. Lowered from this CPU for an
    abstract H100 (tests/test_model_lowering.py's way): nothing runs on a GPU."""
    from lra.training import objectives
    from tests.kernels import lowering

    counts = {}
    for base in ("s4d", "gla"):
        config = config_of(f"model={base},runlocal,hybrid=local", num_layers=2, layers=(1,),
                           max_length=64, attention_impl="pallas")
        config.batch_size = 2
        schedule = optim.learning_rate_schedule(config)
        tx = optim.make_optimizer(config, schedule, spec.resolve(config))

        def init_state(config=config, tx=tx):
            _, params, rest = nnx.split(train.build_model(config, LISTOPS), nnx.Param, ...)
            return {"step": jnp.int32(0), "params": params, "rest": rest,
                    "opt_state": tx.init(params)}

        graphdef = nnx.split(nnx.eval_shape(lambda: train.build_model(config, LISTOPS)),
                             nnx.Param, ...)[0]
        batch = {"inputs": jax.ShapeDtypeStruct((2, 64), jnp.int32),
                 "mask": jax.ShapeDtypeStruct((2, 64), jnp.bool_),
                 "targets": jax.ShapeDtypeStruct((2,), jnp.int32)}
        step, _ = objectives.make_steps(graphdef, tx, schedule, LISTOPS.num_classes, config,
                                        LISTOPS.vocab_size)
        calls = lowering.custom_calls(lowering.for_cuda(step, jax.eval_shape(init_state),
                                                        batch))
        counts[base] = calls.count(lowering.TRITON)
    assert counts["s4d"] >= 3 and counts["s4d"] % 3 == 0
    assert counts["gla"] >= counts["s4d"] + 3 and counts["gla"] % 3 == 0

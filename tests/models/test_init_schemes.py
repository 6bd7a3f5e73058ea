"""models/init_schemes.py through the MQAR config (configs/mqar.py: the zoology_mqar
scaffold declares Zoology's initialisation and tied head): what each rule redraws, what
it keeps, the tied head, the refusals, and the runs recorded before the field."""
import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lra.tasks
from configs import mad, mqar, niah, scaffold
from lra.errors import ConfigError
from lra.runs import card, plan
from lra.training import model as model_lib


def _build(config):
    return model_lib.build_model(config, lra.tasks.get(config.task).with_options(
        **config.task_options.to_dict()))


def _params(model):
    return {tuple(p): np.asarray(v) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _own(arg):
    config = mqar.get_config(arg)
    config.scaffold.init, config.scaffold.tie_head = "own", False
    return scaffold.resolve(config)


def _near(x, std, what):
    error = 5 * std / np.sqrt(x.size)  # 5 standard errors of the mean and the sd
    assert abs(x.mean()) < error and abs(x.std() - std) < 2 * error, (what, x.std(), std)


def _zero_bias(linear, path, redrawn):
    if linear.bias is not None:
        assert not np.asarray(linear.bias[...]).any(), path
        redrawn.add(path + ("bias",))


def _embedding_redrawn(embed, path, redrawn):
    _near(np.asarray(embed.embedding[...]), 0.02, path)
    redrawn.add(path + ("embedding",))


def _rest_kept(before, after, redrawn):
    """The parameters a scheme does not redraw: bitwise our own build's."""
    kept = [p for p in after if p not in redrawn]
    assert kept and all(np.array_equal(before[p], after[p]) for p in kept)
    return kept


@pytest.mark.parametrize("model", ["transformer", "gated_deltanet"])
def test_zoology_redraws_linears_and_embeddings_and_rescales_out_proj(model):
    """TransformerBlock's rule: every Linear N(0, 0.02) with zero biases, the embedding
    N(0, 0.02), the output projection of a Zoology mixer named out_proj (MHA's, not fla's
    o_proj) N(0, 0.02 / sqrt(2 * 2 layers)); everything else as our own build."""
    arg = f"model={model},mini,seq_len=128"
    zoo, own = _build(mqar.get_config(arg)), _build(_own(arg))
    before, after = _params(own), _params(zoo)
    redrawn = set()
    for path, node in nnx.iter_graph(zoo):
        path = tuple(path)
        if isinstance(node, nnx.Linear):
            out = model == "transformer" and path[-2:] == ("mixer", "out")
            _near(np.asarray(node.kernel[...]), 0.01 if out else 0.02, path)
            redrawn.add(path + ("kernel",))
            _zero_bias(node, path, redrawn)
        elif isinstance(node, nnx.Embed):
            _embedding_redrawn(node, path, redrawn)
    kept = _rest_kept(before, after, redrawn)
    # The head is the embedding's transpose: no lm_head parameters, own build has them.
    assert zoo.lm_head is None and any(p[0] == "lm_head" for p in before)
    assert not any(p[0] == "lm_head" for p in after)
    if model == "gated_deltanet":  # its decay's parameters are not Linear: kept
        assert any("a_log" in "/".join(map(str, p)).lower() for p in kept)


def test_zoology_mamba2_keeps_torchs_linear_draw():
    """Mamba2Block's rule: the Linear weights are torch's U(+-1/sqrt(fan_in)) (Zoology
    does not redraw them), biases 0, out_proj's divided by sqrt(n_layers)."""
    zoo = _build(mqar.get_config("model=mamba2,mini,seq_len=128"))
    for path, node in nnx.iter_graph(zoo):
        if isinstance(node, nnx.Linear):
            kernel = np.asarray(node.kernel[...])
            bound = 1 / np.sqrt(kernel.shape[0]) / (np.sqrt(2) if path[-1] == "out" else 1)
            assert np.abs(kernel).max() <= bound + 1e-7, path
            _near(kernel, bound / np.sqrt(3), path)
        elif isinstance(node, nnx.Embed):
            _near(np.asarray(node.embedding[...]), 0.02, path)


def test_tied_head_logits_are_the_embedding_transpose():
    config = mqar.get_config("model=deltanet,runlocal")
    model = _build(config)
    tokens = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 7
    logits = model(tokens, deterministic=True)
    encoded, _ = model.encoder(tokens, None, deterministic=True)
    table = model.encoder.embeddings.token.embedding[...]
    np.testing.assert_allclose(logits, encoded @ table.T, rtol=1e-5, atol=1e-6)
    assert logits.shape[-1] == table.shape[0]


def test_init_is_seeded_and_on_the_card():
    a = _build(mqar.get_config("model=gla,runlocal"))
    c = mqar.get_config("model=gla,runlocal")
    c.random_seed = 1
    b = _build(c)
    assert not np.array_equal(a.encoder.embeddings.token.embedding[...],
                              b.encoder.embeddings.token.embedding[...])
    again = _build(mqar.get_config("model=gla,runlocal"))
    assert all(np.array_equal(x, y) for x, y in zip(_params(a).values(),
                                                     _params(again).values()))
    got = card.card(mqar.get_config("model=gla,runlocal"), a, flops=False)
    assert (got["init"], got["head"]) == ("zoology", "tied")
    assert "init zoology, tied head" in card.describe(got)
    own = _own("model=gla,runlocal")
    got_own = card.card(own, _build(own), flops=False)
    assert (got_own["init"], got_own["head"]) == ("own", "untied")
    # A report does not rank the two unless the sweep declares the axis.
    assert card.differences(got, got_own) == ["init", "head"]
    assert card.differences(got, got_own, allowed=("init", "head")) == []
    # A card recorded before the field was own-initialised (and its head not named).
    before = {k: v for k, v in got_own.items() if k not in ("init", "head")}
    assert card.base_value(before, "init") == "own"
    assert card.differences(before, got) == ["init"]


def test_scaffold_init_fields_resolve_and_refuse():
    c = mqar.get_config("model=gla,runlocal")
    assert (c.init_scheme, c.tie_head) == ("zoology", True)
    c.scaffold.init = "own"  # an ablation reaches the config
    scaffold.resolve(c)
    assert c.init_scheme == "own"
    c = mqar.get_config("model=gla,runlocal")
    c.init_scheme = "own"  # by hand, against the scaffold
    with pytest.raises(ConfigError, match="scaffold.init"):
        scaffold.resolve(c)
    c = mqar.get_config("model=gla,runlocal")
    c.scaffold.init = "xavier"
    with pytest.raises(ConfigError, match="scaffold.init='xavier'"):
        scaffold.resolve(c)
    c = mad.get_config("task=in_context_recall,model=gla")
    assert (c.init_scheme, c.tie_head) == ("mad", False)
    from configs import listops  # a classifier has no vocabulary head to tie
    lc = listops.get_config("model=transformer,runlocal")
    lc.tie_head = True
    with pytest.raises(ConfigError, match="tie_head"):
        _build(lc)
    # niah keeps each variant's own initialisation under the recall scaffold
    n = niah.get_config("model=gla,runlocal")
    assert (n.scaffold.name, n.init_scheme, n.tie_head) == ("zoology_mqar", "own", False)


def test_runs_recorded_before_the_field_resume_or_rerun_as_they_should():
    """A committed flip-flop or niah run (recorded before `init` existed) is still its
    sweep's run (own initialisation, as those configs declare): the queue does not run it
    again. A committed MQAR scaffold, state-tracking or MAD run is not (their scaffolds
    now declare Zoology's, Grazzi et al.'s and mad-lab's initialisations)."""
    import os

    results = os.path.join(os.path.dirname(__file__), "..", "..", "results", "cpu")
    mini = lambda c: "mini"  # noqa: E731
    for name, arg, want in (
            ("mad_2025_runs.jsonl", lambda c: f"task={c['task'][4:]},mini",
             'scaffold.init: "own" -> "mad"'),
            ("flipflop_mini_runs.jsonl", mini, None),
            ("niah_mini_runs.jsonl", mini, None),
            ("mqar_scaffold_cells_runs.jsonl", lambda c: "mini,seq_len=128",
             'scaffold.init: "own" -> "zoology"'),
            ("state_tracking_parity_runs.jsonl", mini, 'scaffold.init: "own" -> "grazzi"')):
        with open(os.path.join(results, name), encoding="utf-8") as f:
            # a run of the config argument alone (no override, no switch), recorded
            # before the field (the records hold later runs too)
            recorded = next(r for r in map(json.loads, f) if not {
                "allow_neg_eigval", "decay"} & set(r["config"]["model_hparams"])
                and r["config"]["learning_rate"] in (1e-3, 3e-3)
                and "init_scheme" not in r["config"])
        config = recorded["config"]
        assert "init" not in config["scaffold"]
        task = "mad" if name.startswith("mad") else config["task"]
        new = plan.expected_config(task, recorded["model"], config["random_seed"], arg(config),
                                   [])
        found = plan.config_differences(config, new)
        assert (found == []) if want is None else (want in found), found


def test_the_comparison_with_zoologys_model_finds_every_role_and_can_fail():
    """scripts/zoology_init/compare.py (results/cpu/zoology_init_vs_zoology.md): each of
    its roles names parameters of our model (a renamed parameter would leave a role
    empty), and its test tells one law from another."""
    import importlib.util
    import os
    import re

    spec = importlib.util.spec_from_file_location("zoology_init_compare", os.path.join(
        os.path.dirname(__file__), "..", "..", "scripts", "zoology_init", "compare.py"))
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    for row, roles in compare.ROLES.items():
        params, tied = compare.ours(row, [0])
        assert tied, row
        for role, _, pattern in compare.COMMON + roles + [compare.SHARED_CONV] * (
                row != "hyena"):
            assert any(re.search(pattern + "$", k) for k in params), (row, role)
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 0.02, 8192), rng.normal(0, 0.02, 8192)
    assert compare.agrees(a, b) and not compare.agrees(a, rng.normal(0, 0.125, 8192))
    assert not compare.agrees(a, rng.normal(0, 0.01, 8192))


def _st(model, **scaffold_fields):
    from configs import state_tracking

    config = state_tracking.get_config(f"model={model},mini")
    for k, v in scaffold_fields.items():
        config.scaffold[k] = v
    return scaffold.resolve(config)


def test_grazzi_draws_as_their_fla_deltanet():
    """Grazzi et al.'s DeltaNet LM (their fla's _init_weights): every Linear and Conv1d
    weight N(0, 0.02) (the shared short convolution and the variant's own), biases 0, the
    embedding N(0, 0.02), o_proj and down_proj (our mixer's out, the MLP's fc2) N(0, 0.02 /
    sqrt(2 * 2 layers)), the head untied; the delta rule's other parameters kept."""
    config = _st("deltanet", builtin_conv=-1)  # its own convolutions on, to see them drawn
    assert (config.init_scheme, config.tie_head) == ("grazzi", False)
    model = _build(config)
    own = _build(_st("deltanet", builtin_conv=-1, init="own"))
    before, after = _params(own), _params(model)
    redrawn = set()
    for path, value in after.items():
        name = "/".join(map(str, path))
        if name.endswith("bias") and ("short_conv" in name or isinstance(
                path[-2], str) and path[-2] in ("fc1", "fc2", "lm_head")):
            assert not value.any(), name
            redrawn.add(path)
        elif name.endswith(("kernel", "embedding")) or "conv" in name:
            rescaled = name.endswith(("mixer/out/kernel", "mlp/fc2/kernel"))
            _near(value, 0.01 if rescaled else 0.02, name)
            redrawn.add(path)
    assert any("conv_q" in "/".join(map(str, p)) for p in redrawn)
    assert any(p[0] == "lm_head" for p in redrawn)
    _rest_kept(before, after, redrawn)


def test_grazzi_draws_mamba2_as_mamba_ssm():
    """Their Mamba LM (mamba_ssm's _init_weights): torch's Linear draw kept, biases 0, the
    embedding N(0, 0.02), out_proj and fc2 over sqrt(2 residuals x 2 layers) (a block with
    a feed-forward branch); the shared convolution keeps its own draw."""
    model = _build(_st("mamba2"))
    own = _build(_st("mamba2", init="own"))
    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Linear):
            kernel = np.asarray(node.kernel[...])
            rescaled = tuple(path[-2:]) in (("mixer", "out"), ("mlp", "fc2"))
            bound = 1 / np.sqrt(kernel.shape[0]) / (2 if rescaled else 1)
            assert np.abs(kernel).max() <= bound + 1e-7, path
            _near(kernel, bound / np.sqrt(3), path)
    conv = [p for p in _params(model) if "short_conv" in "/".join(map(str, p))]
    assert conv and all(np.array_equal(_params(model)[p], _params(own)[p]) for p in conv)


def test_which_tasks_take_which_initialisation():
    """State tracking takes Grazzi et al.'s (their scaffold), MAD mad-lab's; flip-flop and
    niah, whose committed runs were made under each variant's own, declare `own`."""
    from configs import flipflop

    assert _st("gla").init_scheme == "grazzi"
    assert flipflop.get_config("model=gla,mini").init_scheme == "own"
    assert niah.get_config("model=gla,mini").init_scheme == "own"
    assert mqar.get_config("model=gla,mini").init_scheme == "zoology"
    assert mad.get_config("task=compression,model=gla").init_scheme == "mad"


def _mad(arg, init="mad"):
    config = mad.get_config(arg)
    config.scaffold.init = init
    return _build(scaffold.resolve(config))


@pytest.mark.parametrize("model", ["gla", "hyena"])
def test_mad_keeps_each_layers_draw_and_gives_torchs_to_the_rest(model):
    """mad-lab's LanguageModel: the Linears a layer leaves to the framework (layers.dense's
    framework_kernel) and the unembedding get torch's U(+-1/sqrt(fan_in)); mad-lab's own
    GLA draws its seven projections xavier-uniform with gain 2^-2.5; a layer's own law
    (Hyena's torch draw, GLA's gate under ours) is kept bitwise where mad-lab has none;
    every Linear bias 0, the embedding N(0, 0.02), everything else ours."""
    arg = f"task=in_context_recall,model={model}"
    ours, own = _mad(arg), _mad(arg, "own")
    before, after = _params(own), _params(ours)
    redrawn, xaviers, torch_draws = set(), 0, 0
    for path, node in nnx.iter_graph(ours):
        path = tuple(path)
        if isinstance(node, nnx.Linear):
            kernel = np.asarray(node.kernel[...])
            fan_in, fan_out = kernel.shape
            if model == "gla" and path[-2:-1] == ("mixer",):  # mad-lab's GLA: all seven
                bound = 2 ** -2.5 * np.sqrt(6 / (fan_in + fan_out))
                xaviers += 1
            elif node.framework_kernel or path == ("lm_head",):
                bound = 1 / np.sqrt(fan_in)
                torch_draws += 1
            else:
                bound = None
            if bound is not None:
                assert np.abs(kernel).max() <= bound + 1e-7, path
                _near(kernel, bound / np.sqrt(3), path)
                redrawn.add(path + ("kernel",))
            _zero_bias(node, path, redrawn)
        elif isinstance(node, nnx.Embed):
            _embedding_redrawn(node, path, redrawn)
    assert torch_draws >= 5 and xaviers == (14 if model == "gla" else 0)
    kept = _rest_kept(before, after, redrawn)
    if model == "hyena":  # its Linears are the original's torch draw: kept
        assert ("encoder", "stack", "blocks", 0, "mixer", "in_proj", "kernel") in kept


def test_mad_compression_draws_every_linear_as_the_autoencoder():
    """mad-lab's AutoEncoder (compression): every Linear N(0, 0.02), the layers' too,
    biases 0, the embedding N(0, 0.02); seeded by the run's seed."""
    model = _mad("task=compression,model=hyena")
    linears = 0
    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Linear):
            linears += 1
            if node.kernel[...].size >= 1024:  # the small filter layers: too few draws
                _near(np.asarray(node.kernel[...]), 0.02, path)
            if node.bias is not None:
                assert not np.asarray(node.bias[...]).any(), path
        elif isinstance(node, nnx.Embed):
            _near(np.asarray(node.embedding[...]), 0.02, path)
    assert linears >= 10
    again, other = _params(_mad("task=compression,model=hyena")), _params(model)
    assert all(np.array_equal(again[p], other[p]) for p in other)


def test_a_dense_kernel_is_marked_left_to_the_framework_only_without_its_own_law():
    from models import layers

    rngs = nnx.Rngs(0)
    assert layers.dense(4, 3, ("embed", "qkv"), rngs=rngs).framework_kernel
    assert not layers.dense(4, 3, ("embed", "qkv"), rngs=rngs,
                            kernel_init=layers.xavier_uniform).framework_kernel

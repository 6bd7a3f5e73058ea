"""Benchmark scaffolds (configs/scaffold.py, lra/runs/card.py; issue 68): every mixer of a
benchmark config gets the same positions, shared short convolution, own convolutions
and heads, counted on the built model's parameters and modules (not on config fields);
command-line overrides reach every layer; a hand-set field is refused; hybrid layers are
position-aware by default; the data's seed is the run's."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from flax import nnx

import lra.tasks
from configs import common, hybrid, mqar, scaffold
from lra import train
from lra.errors import ConfigError
from lra.runs import card, plan

# The MQAR grid's variants (results/cpu/mqar_grid.md).
GRID = ("transformer", "local", "linear", "performer", "s4d", "s5", "lru", "mega", "retnet",
        "gla", "deltanet", "gated_deltanet", "mamba2",
        "fox", "moba", "path", "kda", "gated_deltaproduct", "based", "hyena",
        "rwkv7", "nsa", "loglinear_mamba2")


def _model(config):
    task = lra.tasks.get(config.task).with_options(**config.task_options.to_dict())
    return nnx.eval_shape(lambda: train.build_model(config, task))


def _card(config) -> dict:
    return card.card(config, _model(config), flops=False)


def _params(model) -> dict[str, tuple]:
    return {"/".join(map(str, p)): tuple(v.shape if hasattr(v, "shape") else v[...].shape)
            for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _measured(config) -> dict:
    """What the built model has, from its parameters and modules alone."""
    model = _model(config)
    params = _params(model)
    blocks = card._blocks(model)
    return {
        "position_table": any("embeddings/position" in p for p in params),
        "shared_conv": sorted({shape[0] for p, shape in params.items()
                               if p.endswith("short_conv/weight")}),
        "shared_conv_layers": sum(p.endswith("short_conv/weight") for p in params),
        "own_conv": sorted({p.split("/")[-1] for p in params
                            if "/mixer/" in p and p.split("/")[-1].startswith("conv")}),
        "heads": [getattr(b.mixer, "num_heads", None) for b in blocks],
        "rotary": [getattr(b.mixer, "rotary", None) is True for b in blocks],
        "mlp": any("/mlp/" in p for p in params),
    }


@pytest.mark.parametrize("name", GRID)
def test_every_mqar_mixer_gets_the_zoology_scaffold(name):
    """configs/mqar.py (the default scaffold, zoology): no position table, the shared
    convolution of 3 taps in both layers, no convolution of the mixer's own, 2 heads
    (RetNet: its 8, and its rotation, kept), no MLP."""
    config = mqar.get_config(f"model={name},mini")
    m = _measured(config)
    assert not m["position_table"] and not m["mlp"]
    assert (m["shared_conv"], m["shared_conv_layers"]) == ([3], 2)
    assert m["own_conv"] == []
    want_heads = 8 if name == "retnet" else 2
    assert all(h in (None, want_heads) for h in m["heads"]), m["heads"]
    assert m["rotary"] == [name == "retnet"] * 2


def test_the_cards_of_the_mqar_mixers_agree_and_the_own_scaffold_s_do_not():
    cards = {n: _card(mqar.get_config(f"model={n},mini")) for n in GRID}
    for a, b in itertools.combinations(GRID, 2):
        assert card.differences(cards[a], cards[b]) == [], (a, b)
    assert cards["retnet"]["kept"].keys() == {"num_heads", "pos_emb"}
    own = {n: _card(mqar.get_config(f"model={n},mini,scaffold=own"))
           for n in ("transformer", "gla", "deltanet", "mamba2")}
    # Before the scaffold: transformer alone had positions, deltanet and mamba2 their
    # own 4-tap convolutions; gla neither.
    assert card.differences(own["transformer"], own["gla"]) == ["positions"]
    assert card.differences(own["deltanet"], own["gla"]) == ["builtin_conv"]
    assert own["mamba2"]["builtin_conv"] == 4 and own["gla"]["builtin_conv"] == 0
    # Declared as an ablation axis, the field no longer keeps them apart.
    assert card.differences(own["deltanet"], own["gla"], allowed=("builtin_conv",)) == []


@pytest.mark.parametrize("name", ["gla", "deltanet", "mamba2"])
def test_a_command_line_scaffold_override_reaches_every_layer(name):
    """What lra.sweep computes for --override=scaffold.short_conv=0 (and what launch.py
    then runs, lra/train.py resolving the same way): no convolution anywhere; builtin_conv
    -1 gives deltanet and mamba2 back their own 4 taps."""
    expected = plan.expected_config("mqar", name, 0, "mini",
                                    ["scaffold.short_conv=0", "scaffold.builtin_conv=-1"])
    m = _measured(common.resolve(_config_from(expected)))
    assert m["shared_conv"] == [] and m["shared_conv_layers"] == 0
    assert (m["own_conv"] != []) == (name != "gla")
    off = plan.expected_config("mqar", name, 0, "mini", ["scaffold.short_conv=0"])
    assert _measured(_config_from(off))["own_conv"] == []


def _config_from(recorded: dict):
    import ml_collections

    return ml_collections.ConfigDict(recorded)


def test_a_field_the_scaffold_sets_by_hand_is_refused_naming_the_scaffold_field():
    config = mqar.get_config("model=gla,mini")
    config.block.short_conv = 4
    with pytest.raises(ConfigError, match=r"block.short_conv=4 is set by hand.*"
                                          r"scaffold.short_conv"):
        common.resolve(config)
    config = mqar.get_config("model=gla,mini")
    config.num_heads = 4
    with pytest.raises(ConfigError, match="scaffold.num_heads"):
        common.resolve(config)
    # Leaving the scaffold keeps the hand-set value; setting the scaffold's own field is
    # the way to change it for every mixer.
    config.scaffold.name = ""
    assert common.resolve(config).num_heads == 4
    config = mqar.get_config("model=gla,mini")
    config.scaffold.num_heads = 4
    assert common.resolve(config).num_heads == 4
    config.scaffold.ablate = "window"
    with pytest.raises(ConfigError, match="ablation axis is a scaffold card field"):
        common.resolve(config)


def test_the_hybrid_attention_layer_rotates_by_default_with_its_own_heads_and_window():
    """gla+local@1 from configs/mqar.py: the local layer rotates queries and keys (gla has
    no positions, the scaffold adds none), with hybrid.num_heads and hybrid.window;
    `inherit` is the old behaviour: no positions in that layer."""
    config = mqar.get_config("model=gla,mini,hybrid=local")
    config.hybrid.layers = (1,)
    config.hybrid.num_heads, config.hybrid.window = 4, 32
    model = _model(config)
    blocks = card._blocks(model)
    assert [getattr(b.mixer, "rotary", None) is True for b in blocks] == [False, True]
    assert [b.mixer.num_heads for b in blocks] == [2, 4]
    assert hybrid.layer_list(config)[1]["model_hparams"]["window"] == 32
    c = card.card(config, model, flops=False)
    assert c["positions"] == ["none", "rotary"] and c["base_layers"] == [0]
    # The hybrid's own layer does not make its scaffold another one: the base layers agree.
    pure = _card(mqar.get_config("model=gla,mini"))
    assert card.differences(c, pure) == []
    config.hybrid.pos_emb = "inherit"
    assert [getattr(b.mixer, "rotary", None) is True
            for b in card._blocks(_model(config))] == [False, False]
    config.hybrid.window = 0
    config.hybrid.pos_emb = "rotary"
    config.hybrid.mixer, config.hybrid.window = "transformer", 8
    with pytest.raises(ConfigError, match="has no window"):
        hybrid.layer_list(config)


def test_the_data_seed_is_the_runs():
    """lra.sweep --seeds=0,1 draws other rows, not only other weights (MQAR, MAD), and
    data_seed_from_run=false holds them."""
    rows = {}
    for seed in (0, 1):
        c = _config_from(plan.expected_config("mqar", "gla", seed, "runlocal", []))
        assert c.task_options.seed == seed
        task = lra.tasks.get("mqar").with_options(**c.task_options.to_dict())
        rows[seed] = task.load("", "train", c.max_length, **c.task_options.to_dict())["inputs"]
    assert not np.array_equal(rows[0], rows[1])
    held = plan.expected_config("mqar", "gla", 1, "runlocal",
                                ["data_seed_from_run=false", "task_options.seed=7"])
    assert (held["random_seed"], held["task_options"]["seed"]) == (1, 7)
    mad = plan.expected_config("mad", "gla", 3, "runlocal", [])
    assert mad["task_options"]["seed"] == 3


def test_results_record_the_card(tmp_path):
    """The path users take: configs/mqar.py -> train_and_evaluate -> results.json."""
    config = mqar.get_config("model=deltanet,runlocal")
    config.num_train_steps = 2
    results = train.train_and_evaluate(config, str(tmp_path))
    recorded = json.loads((tmp_path / "results.json").read_text())["scaffold_card"]
    assert recorded == json.loads(json.dumps(results["scaffold_card"]))
    assert (recorded["scaffold"], recorded["positions"], recorded["short_conv"],
            recorded["builtin_conv"], recorded["num_heads"]) == (
        scaffold.ZOOLOGY_MQAR["name"], "none", 3, 0, 2)
    assert recorded["params"] == results["num_params"] and recorded["flops_per_token"] > 0


@pytest.mark.parametrize("name", ["transformer", "local", "gla", "deltanet", "mamba2",
                                  "retnet", "s5"])
def test_every_mad_mixer_gets_the_mad_scaffold(name):
    """configs/mad.py (scaffold mad, mad-lab's benchmark.py): no position table, rotary in
    the attention layers only (mh-attention's), no convolution shared or own, 16 heads
    (RetNet 8), a feed-forward branch in every layer."""
    from configs import mad

    m = _measured(mad.get_config(f"task=in_context_recall,model={name}"))
    assert not m["position_table"] and m["mlp"]
    assert m["shared_conv"] == [] and m["own_conv"] == []
    assert m["rotary"] == [name in ("transformer", "local", "retnet")] * 2
    want = 8 if name == "retnet" else 16
    assert all(h in (None, want) for h in m["heads"]), m["heads"]


def test_the_lra_report_shows_each_rows_card_and_names_a_differing_scaffold():
    """lra.report's card section (lra/reporting/cards.py) on ListOps, which declares no
    scaffold: transformer and linear carry learned positions (their papers'), deltanet
    none but its own 4-tap convolutions; the odd row is named by its fields."""
    from configs import listops
    from lra.reporting.cards import card_tables

    summary = {("listops", m): {"runs": [{"scaffold_card": _card(
        listops.get_config(f"model={m},runlocal"))}]}
        for m in ("transformer", "linear", "deltanet")}
    text = "\n".join(card_tables(summary))
    assert "| transformer | own: pos learned, conv 0, own conv 0, heads 2 |" in text
    assert "deltanet (pos none, own conv 4)" in text
    assert card_tables({("listops", "x"): {"runs": [{}]}}) == []


@pytest.mark.parametrize("form", ["mixer", "pattern"])
def test_a_hybrid_layers_own_convolution_follows_the_scaffold(form):
    """gla with a mamba2 layer from configs/mqar.py, as hybrid.mixer or a pattern: the mamba2
    layer has no convolution of its own under the zoology scaffold, its 4 taps with
    builtin_conv -1; the shared convolution sits before both layers."""
    config = mqar.get_config("model=gla,mini" + (",hybrid=mamba2" if form == "mixer" else ""))
    if form == "mixer":
        config.hybrid.layers = (1,)
    else:
        config.hybrid.pattern = ("gla", "mamba2")
    assert _measured(config)["own_conv"] == []
    assert _card(config)["builtin_conv"] == 0
    config.scaffold.builtin_conv = -1
    common.resolve(config)
    assert _card(config)["builtin_conv"] == [0, 4]

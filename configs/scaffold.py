"""Benchmark scaffolds (issue 68): what every mixer of one comparison shares, declared once
per benchmark as its original code builds it, so that a table compares mixers and not the
positions, short convolutions or heads each variant happens to bring.

A task config that has a scaffold sets `config.scaffold` (`declare`); `resolve` then writes
it into the fields the model is built from, for config.model and a hybrid's mixer alike:

  pos_emb       every layer's positions: none | learned | sinusoidal | rotary, or `own`
                (each variant's paper's, Capabilities.pos_emb) -> config.pos_emb
  short_conv    taps of one short causal depthwise convolution on the input of every
                layer's mixer (models/blocks.py ShortConv; 0 = none) -> config.block.short_conv
  builtin_conv  the variants' own short convolutions (deltanet, gated_deltanet, kda,
                gated_deltaproduct, mamba2, loglinear_mamba2, hyena, path; rwkv7's token shift:
                Capabilities.short_conv_hparam): 0 = off (fla's use_short_conv=False), -1 =
                each variant's own (4), k = k taps -> model_hparams.<its hparam>
  num_heads     heads of every layer (0 = the task config's) -> config.num_heads
  init          the benchmark's redraw of every mixer's built parameters
                (models/init_schemes.py): own (each variant's) | zoology | grazzi | mad
                -> config.init_scheme
  tie_head      the vocabulary head is the token embedding's transpose (Zoology's
                LanguageModel ties them) -> config.tie_head
  keep          per variant, a knob its method lives in, kept at its paper's value against
                the scaffold (KEEP_REASONS says why; the card shows it): RetNet's heads
                carry its multi-scale decays, gamma_h = 1 - 2^(-5-h)
  ablate        card fields (comma separated) a sweep varies on purpose: `lra.sweep
                --override=scaffold.short_conv=0 --override=scaffold.ablate=short_conv`;
                the reports rank such cells with the others (cells whose cards differ in
                a field nobody declared are shown, not ranked; lra/runs/card.py)

`resolve` runs before a run is built (lra/train.py) and when the sweep computes the config
it would run (lra/runs/plan.py), so `--config.scaffold.short_conv=0` reaches every layer.
A field the scaffold sets that was also changed by hand (`--config.block.short_conv=4`) is
refused in one line naming the scaffold's field: the scaffold is the benchmark's, every
mixer's. `--config.scaffold.name=` (empty) leaves the fields as they are.

What each run was built with is measured on its model, not read from these fields:
lra/runs/card.py (results.json `scaffold_card`, a column of the reports).
"""
from __future__ import annotations

import json
from typing import Any, Mapping

import ml_collections

from lra.errors import ConfigError

POS_EMBS = ("none", "learned", "sinusoidal", "rotary", "own")
# The scaffold card's fields (lra/runs/card.py) two cells of one ranking agree on (the
# width is a coordinate of the tables: cells of one column share it).
CARD_FIELDS = ("positions", "short_conv", "builtin_conv", "num_heads", "ffn", "layers",
               "init", "head")
KEEP_FIELDS = ("num_heads", "pos_emb")
# Why a variant keeps a knob against the scaffold (shown on its card).
KEEP_REASONS = {
    ("retnet", "num_heads"): "RetNet's multi-scale decay lives in its heads (gamma_h = "
                             "1 - 2^(-5-h), h < heads); fla's RetNet and the paper's use 8; "
                             "the parameters do not depend on the heads",
    ("retnet", "pos_emb"): "RetNet's retention rotates queries and keys by position (the "
                           "e^(in theta) of its recurrence; fla's RetNet: rotary)",
    ("transformer", "pos_emb"): "MAD's attention layers rotate queries and keys (mad-lab "
                                "mh-attention: rotary_emb_dim 8, a head's 8 dims)",
    ("local", "pos_emb"): "MAD's sliding-window attention rotates queries and keys "
                          "(mad-lab mh-sliding-attention: rotary_emb_dim 8)",
    ("nsa", "pos_emb"): "softmax attention, as MAD's attention layers: rotated (fla's NSA "
                        "layer always rotates queries and keys)",
    ("moba", "pos_emb"): "softmax attention, as MAD's attention layers: rotated (MoBA runs "
                         "inside RoPE attention, MoonshotAI/MoBA)",
}

# Zoology's MQAR models (HazyResearch/zoology at d88d6f5474f36998d82d5c3bd58a190248d0a669,
# 2026-01-11: zoology/experiments/models_repo.py, used by mqar_example_configs/
# original_mqar_configs.py, last changed in dbcb60d): every model has
# max_position_embeddings=0 (no positions, attention included); MHA, DeltaNet, Gated
# DeltaNet, GLA, NSA and TTT have num_heads=2; every mixer but Mamba-2 sits behind the
# shared `conv_mixer`, BaseConv(kernel_size=3) (zoology/mixers/base_conv.py: a depthwise
# short convolution times a linear projection, plus its input), as layer 0 of 2 (Hybrid
# picks configs[layer_idx % 2]); the state mixer is Identity (no MLP). Ours: the shared
# convolution of 3 taps before the mixer in both layers (ShortConv, Zoology's
# ShortConvolution, without BaseConv's projection gate), so that the two layers stay the
# variant's; the variants' own convolutions off (Zoology keeps DeltaNet's and Gated
# DeltaNet's conv_size 4 beside its BaseConv layer, and Mamba-2's d_conv 4 in place of
# it: there, the scaffold differs between rows, which is what this one removes). Zoology's
# initialisation (zoology/model.py _init_weights after the mixers are built: Linear and
# Embedding N(0, 0.02), out_proj rescaled; Mamba2Block's own rule for mamba2) and its LM
# head tied to the embedding (LanguageModel: lm_head.weight = word_embeddings.weight).
ZOOLOGY_MQAR = {
    "name": "zoology_mqar",
    "source": "HazyResearch/zoology d88d6f5 zoology/experiments/models_repo.py, "
              "mqar_example_configs/original_mqar_configs.py",
    "pos_emb": "none",
    "short_conv": 3,
    "builtin_conv": 0,
    "num_heads": 2,
    "init": "zoology",
    "tie_head": True,
    "keep": {"retnet": {"num_heads": 8, "pos_emb": "rotary"}},
    "ablate": "",
}
# MAD's models (athms/mad-lab at 0f49a45: benchmark.py's default layers mh-attention,
# swiglu, mh-attention, swiglu; configs/layers/*.yml): dim 128; mh-attention 16 heads with
# rotary on all of a head's 8 dims (rotary_emb_dim 8), mh-sliding-attention likewise;
# the other mixers (mh-linear-attention, mh-hyena, mamba, GLA) no positions (issue 71's
# softmax-attention rows NSA and MoBA rotate as the attention layers do; FoX's forget gate
# and PaTH's Householder transforms are their positions, so they get none); no shared
# convolution (Mamba keeps its d_conv 4 and Hyena its short filter there: here the
# variants' own are off, so that none has one); a pre-norm stack (RMSNorm there, LayerNorm
# here) with a SwiGLU channel mixer after every mixer (a GELU MLP of 4x here).
MAD = {
    "name": "mad",
    "source": "athms/mad-lab 0f49a45 benchmark.py, configs/layers/mh-attention.yml",
    "pos_emb": "none",
    "short_conv": 0,
    "builtin_conv": 0,
    "num_heads": 16,
    # mad-lab's initialisation (since 2026-12-07; models/init_schemes.py `mad`): its
    # LanguageModel (0f49a45 mad/model/language_model.py _init_weights, lines 73-79)
    # zeroes every Linear bias (but `_no_reinit` ones), draws the embedding from N(0,
    # 0.02) and keeps each Linear weight as its layer drew it: torch's U(+-1/sqrt(fan_in))
    # where the layer leaves it to torch (layers.dense's framework_kernel; xavier under
    # `own`), the layer's own law where it has one; the AutoEncoder of compression draws
    # every Linear from N(0, 0.02). Head untied. The MAD runs committed before (mad_2025,
    # mad_grid) were made under `own` (results/cpu/mad_init_probe.md: what it changes).
    "init": "mad",
    "tie_head": False,
    "keep": {"transformer": {"pos_emb": "rotary"}, "local": {"pos_emb": "rotary"},
             "nsa": {"pos_emb": "rotary"}, "moba": {"pos_emb": "rotary"},
             "retnet": {"num_heads": 8, "pos_emb": "rotary"}},
    "ablate": "",
}
# Grazzi et al.'s state-tracking models (automl/unlocking_state_tracking at df8f840:
# xlstm/experiments/parity_delta_net_2.yaml, parity_mamba_2.yaml; their LMs are fla's
# *ForCausalLM): 2 layers, d_model 128, DeltaNet with n_heads 4 and use_short_conv (fla's
# conv_size 4), Mamba with its own d_conv 4; no positions anywhere; a gated MLP after every
# mixer. Ours: one shared short convolution of 4 taps before every mixer, the variants'
# own off (there DeltaNet's and Mamba's own convolutions are the only ones: the rows differ
# in it), 4 heads, no positions, the feed-forward block on.
GRAZZI_STATE_TRACKING = {
    "name": "grazzi_state_tracking",
    "source": "automl/unlocking_state_tracking df8f840 xlstm/experiments/"
              "parity_delta_net_2.yaml, parity_mamba_2.yaml",
    "pos_emb": "none",
    "short_conv": 4,
    "builtin_conv": 0,
    "num_heads": 4,
    # Grazzi et al.'s initialisation (since 2026-12-07; models/init_schemes.py `grazzi`):
    # their DeltaNet (flash-linear-attention_mod/fla/models/delta_net/modeling_delta_net.py
    # _init_weights, lines 150-181) draws every Linear and Conv1d weight (the short
    # convolutions too) and the embedding from N(0, 0.02), zeroes biases, divides o_proj
    # and down_proj by sqrt(2 n_layers); their Mamba (mamba_dev/mamba_ssm/models/
    # mixer_seq_simple.py _init_weights) keeps torch's Linear draw, zeroes biases, draws
    # the embedding from N(0, 0.02), out_proj / fc2 over sqrt(residuals n_layers). Head
    # untied in both (tie_word_embeddings False; the yaml's tie_weights: false).
    "init": "grazzi",
    "tie_head": False,
    "keep": {"retnet": {"num_heads": 8, "pos_emb": "rotary"}},
    "ablate": "",
}
# The scaffolds by their names (a card names its run's).
SCAFFOLDS = {s["name"]: s for s in (ZOOLOGY_MQAR, MAD, GRAZZI_STATE_TRACKING)}
APPLIED = "applied"  # what resolve last wrote (JSON): tells a hand-set field from its own
# ... for the fields added later (init, tie_head): apart, so that `applied` reads as it did
# in the runs recorded before them (a recorded config is compared field by field).
APPLIED_LATER = "applied_init"
LATER_TARGETS = ("init_scheme", "tie_head")


def declare(c: ml_collections.ConfigDict, scaffold: Mapping[str, Any], **changes: Any
            ) -> ml_collections.ConfigDict:
    """Sets c.scaffold (the declaration, with `changes` over it) and resolves it."""
    spec = {**scaffold, **changes}
    keep = ml_collections.ConfigDict({m: dict(v) for m, v in spec["keep"].items()})
    c.scaffold = ml_collections.ConfigDict({**spec, "keep": keep, APPLIED: "{}",
                                            APPLIED_LATER: "{}"})
    return resolve(c)


def has_scaffold(config: Any) -> bool:
    s = config.get("scaffold") if hasattr(config, "get") else None
    return bool(s) and bool(s.get("name"))


def _get(config: Any, dotted: str) -> Any:
    node = config
    for part in dotted.split("."):
        node = node[part]
    return node


def _set(config: Any, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node[part]
    if last in node:
        node[last] = value
    else:  # a variant hparam its presets leave out (a locked config takes it too)
        with node.unlocked():
            node[last] = value


def _targets(config: Any) -> dict[str, Any]:
    """The fields the scaffold sets, dotted, with their values for this config."""
    from models import registry  # imports jax; only when a config is resolved

    s = config.scaffold
    if s.pos_emb not in POS_EMBS:
        raise ConfigError(f"config.scaffold.pos_emb={s.pos_emb!r}; choose one of {POS_EMBS}")
    for name, value in (("short_conv", s.short_conv), ("num_heads", s.num_heads)):
        if not isinstance(value, int) or value < 0:
            raise ConfigError(f"config.scaffold.{name}={value!r} must be an integer >= 0")
    if not isinstance(s.builtin_conv, int) or s.builtin_conv < -1:
        raise ConfigError(f"config.scaffold.builtin_conv={s.builtin_conv!r}: 0 (off), -1 "
                          "(each variant's own) or the taps")
    init, tie_head = s.get("init", "own"), s.get("tie_head", False)
    from models.init_schemes import SCHEMES
    if init not in SCHEMES:
        raise ConfigError(f"config.scaffold.init={init!r}; choose one of {SCHEMES}")
    if not isinstance(tie_head, bool):
        raise ConfigError(f"config.scaffold.tie_head={tie_head!r} must be True or False")
    bad = sorted(set(ablated(config)) - set(CARD_FIELDS))
    if bad:
        raise ConfigError(f"config.scaffold.ablate names {', '.join(bad)}; an ablation axis "
                          f"is a scaffold card field: {', '.join(CARD_FIELDS)}")
    model = config.model
    keep = dict(s.keep.get(model) or {}) if s.get("keep") else {}
    bad = sorted(set(keep) - set(KEEP_FIELDS))
    if bad:
        raise ConfigError(f"config.scaffold.keep.{model} sets {', '.join(bad)}; a variant may "
                          f"keep only {', '.join(KEEP_FIELDS)}")
    out: dict[str, Any] = {}
    pos_emb = keep.get("pos_emb") or s.pos_emb
    if pos_emb not in POS_EMBS:
        raise ConfigError(f"config.scaffold.keep.{model}.pos_emb={pos_emb!r}; choose one of "
                          f"{POS_EMBS}")
    if pos_emb != "own":
        out["pos_emb"] = pos_emb
    out["block.short_conv"] = int(s.short_conv)
    out["init_scheme"], out["tie_head"] = init, tie_head
    heads = int(keep.get("num_heads") or s.num_heads)
    if heads:
        out["num_heads"] = heads
    # config.model's own convolutions; a hybrid's other layers take builtin_conv in
    # configs/hybrid.py's layer_list, whichever form made the list.
    knob = registry.capabilities(model).short_conv_hparam
    if knob:  # -1: the builder's own default (fla's and mamba_ssm's 4)
        out[f"model_hparams.{knob}"] = (int(s.builtin_conv) if s.builtin_conv >= 0
                                        else registry.accepted_hparams(model)[knob])
    return out


def resolve(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Writes the scaffold into the fields it sets (in place; the config is returned).
    ConfigError in one line when one of them was set by hand to something else."""
    if not has_scaffold(config):
        return config
    applied = {**json.loads(config.scaffold.get(APPLIED) or "{}"),
               **json.loads(config.scaffold.get(APPLIED_LATER) or "{}")}
    targets = _targets(config)
    for field, value in targets.items():
        try:
            current = _get(config, field)
        except (KeyError, AttributeError):
            if ".model_hparams." not in f".{field}" and field not in LATER_TARGETS:
                raise ConfigError(f"the {config.scaffold.name} scaffold sets config.{field}, "
                                  "which this config lacks") from None
            current = None  # an hparam the presets leave at the builder's default
        if current != value and field in applied and current != applied[field]:
            raise ConfigError(
                f"config.{field}={current!r} is set by hand, but the {config.scaffold.name} "
                f"scaffold sets it for every mixer ({value!r}): change its config.scaffold "
                f"field instead (e.g. --config.scaffold.{_scaffold_field(field)}=...), or "
                "leave the scaffold with --config.scaffold.name=")
        _set(config, field, value)
    first = {k: v for k, v in targets.items() if k not in LATER_TARGETS}
    later = {k: v for k, v in targets.items() if k in LATER_TARGETS}
    config.scaffold[APPLIED] = json.dumps(first, sort_keys=True)
    with config.scaffold.unlocked():
        config.scaffold[APPLIED_LATER] = json.dumps(later, sort_keys=True)
    return config


def _scaffold_field(field: str) -> str:
    if field.startswith("model_hparams."):
        return "builtin_conv"
    return {"block.short_conv": "short_conv", "init_scheme": "init"}.get(field, field)


def kept(config: Any) -> dict[str, str]:
    """{field: why} for the knobs config.model keeps against its scaffold."""
    if not has_scaffold(config):
        return {}
    keep = config.scaffold.get("keep") or {}
    own = keep.get(config.model) or {}
    return {f: KEEP_REASONS.get((config.model, f), "the variant's own value")
            for f in own}


def ablated(config: Any) -> tuple[str, ...]:
    """The card fields config.scaffold.ablate declares varied on purpose."""
    s = config.get("scaffold") if hasattr(config, "get") else None
    value = (s or {}).get("ablate") or ""
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(v.strip() for v in items if v.strip())


def declared_card(name: str) -> dict[str, Any]:
    """The scaffold card fields the scaffold `name` declares (its defaults, before any
    override): what a report tells a run's card against. {} for an unknown name. Not
    init and head: a task may declare a scaffold with its own (configs/niah.py), so the
    reports take those two from the most common card of a setting's runs."""
    spec = SCAFFOLDS.get(name)
    if spec is None:
        return {}
    out: dict[str, Any] = {"short_conv": int(spec["short_conv"])}
    if spec["pos_emb"] != "own":
        out["positions"] = spec["pos_emb"]
    if spec["builtin_conv"] >= 0:
        out["builtin_conv"] = int(spec["builtin_conv"])
    if spec["num_heads"]:
        out["num_heads"] = int(spec["num_heads"])
    return out

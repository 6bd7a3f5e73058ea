"""A run's scaffold card (issue 68): what its model shares with, or has beyond, the other
mixers of a comparison, measured on the built model (abstractly: shapes only), not read
from config fields. results.json records it (`scaffold_card`); lra.synthetic_report shows
it per row and ranks only cells whose cards agree (COMPARED) but in a declared ablation.

  scaffold      the config's scaffold (configs/scaffold.py), or `own` without one
  positions     per layer: learned / sinusoidal (added to the tokens), rotary (the layer's
                mixer rotates queries and keys), none
  short_conv    per layer, taps of the shared convolution before the mixer (0: none)
  builtin_conv  per layer, taps of the mixer's own short convolution(s) (its parameters
                named conv*, e.g. deltanet's conv_q, or RWKV-7's token shift: 2; 0: none)
  num_heads     per layer, the mixer's heads (None for a mixer without heads)
  ffn           per layer, whether the block has a feed-forward branch
  layers, width the stack's depth and width
  capacity      the mixer's capacity hparams it has (window, state_size, num_features, ...)
  init          the benchmark's redraw of the built parameters (config.init_scheme,
                models/init_schemes.py: own, zoology, grazzi, mad); read from the config
  head          tied (the token embedding's transpose) or untied for a vocabulary head
                (MAD's autoencoder: untied), None for a model without one (classifiers)
  kept          the knobs the variant keeps against its scaffold, and why
  params        parameter count; flops_per_token: XLA's count for one forward pass of one
                sequence at config.max_length (the head included), over its length

A per-layer field is one value when every layer has it.
"""
from __future__ import annotations

from typing import Any

# Fields two cells of one ranking agree on (a None, a mixer without heads, agrees with
# any value), unless a sweep declares a field its ablation axis (config.scaffold.ablate),
# or the variant keeps the field (card `kept`).
from configs.scaffold import CARD_FIELDS as COMPARED

CAPACITY_HPARAMS = ("window", "state_size", "num_features", "feature_dim", "num_landmarks",
                    "num_clusters", "block_size", "num_random_blocks", "num_global_tokens",
                    "expand", "expand_k", "expand_v", "d_state", "state_dim")


# The card field a kept config field shows in.
KEPT_AS = {"pos_emb": "positions"}
# Card fields added after runs recorded cards, with the value those runs had.
IMPLIED_WHEN_ABSENT = {"init": "own"}


def _collapse(values: list[Any]) -> Any:
    return values[0] if values and all(v == values[0] for v in values) else values


def _blocks(model: Any) -> list[Any]:
    """The model's blocks in order (the modules that hold a `mixer`)."""
    from flax import nnx

    found = []
    for _, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Module) and isinstance(getattr(node, "mixer", None),
                                                       nnx.Module):
            found.append(node)
    return found


def _builtin_conv(mixer: Any) -> int:
    """Taps of the mixer's own short convolution: the longest first axis of its parameters
    named conv* (bias aside), or its `token_shift` (RWKV-7's shift, a 2-tap convolution
    with no parameters of that name); 0 when it has none."""
    from flax import nnx

    taps = [int(v.shape[0]) if hasattr(v, "shape") else int(v[...].shape[0])
            for path, v in nnx.to_flat_state(nnx.state(mixer, nnx.Param))
            if str(path[-1]).startswith("conv") and "bias" not in str(path[-1])]
    shift = getattr(mixer, "token_shift", 0)
    if isinstance(shift, int) and not isinstance(shift, bool):
        taps.append(shift)
    return max(taps, default=0)


def _heads(mixer: Any) -> int | None:
    heads = getattr(mixer, "num_heads", None)
    return int(heads) if isinstance(heads, int) and not isinstance(heads, bool) else None


def _head(model: Any) -> str | None:
    """tied / untied for a model with a vocabulary head (models/pretrain.py), else None."""
    if not hasattr(model, "lm_head") or getattr(model, "lm_loss", "xent") != "xent":
        return None
    return "tied" if model.lm_head is None else "untied"


def flops_per_token(model: Any, length: int) -> float | None:
    """XLA's flop count of one forward pass of one sequence of `length` tokens, over
    `length` (None where the cost analysis gives none)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, state = nnx.split(model)

    def forward(state, x_1xL):
        return nnx.merge(graphdef, state)(x_1xL, deterministic=True)

    try:
        cost = jax.jit(forward).lower(state, jax.ShapeDtypeStruct((1, length), jnp.int32)
                                      ).cost_analysis()
    except Exception:  # noqa: BLE001  (a model whose forward takes other inputs)
        return None
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    flops = (cost or {}).get("flops")
    return float(flops) / length if flops else None


def card(config: Any, model: Any, *, flops: bool = True, spec: Any = None) -> dict[str, Any]:
    """The card of the run `config` describes, measured on `model`, built from it (or its
    shapes, nnx.eval_shape(lambda: lra.train.build_model(config, task))); `spec`: the
    config's RunSpec (lra/runs/spec.py), resolved here when not given."""
    import jax
    from flax import nnx

    from configs import scaffold
    from lra.runs.spec import resolve

    blocks = _blocks(model)
    table = config.pos_emb if config.pos_emb in ("learned", "sinusoidal") else None
    positions = []
    for block in blocks:
        rotary = getattr(block.mixer, "rotary", None) is True or config.pos_emb == "rotary"
        positions.append("+".join(p for p in (table, "rotary" if rotary else None) if p)
                         or "none")
    layers = (spec or resolve(config)).layers
    hparams = [spec["model_hparams"] for spec in layers] if layers else (
        [config.model_hparams.to_dict()] * len(blocks))
    capacity = [{k: h[k] for k in CAPACITY_HPARAMS if k in h} for h in hparams]
    params = sum(int(x.size) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    names = [spec["model"] for spec in layers] if layers else [config.model] * len(blocks)
    return {
        "scaffold": config.scaffold.name if scaffold.has_scaffold(config) else "own",
        # The layers of config.model (a hybrid's other mixers bring their own positions
        # and heads: the comparison is of the base model's layers).
        "base_layers": [i for i, n in enumerate(names) if n == config.model],
        "positions": _collapse(positions),
        "short_conv": _collapse([int(b.short_conv.kernel_size) if getattr(
            b, "short_conv", None) is not None else 0 for b in blocks]),
        "builtin_conv": _collapse([_builtin_conv(b.mixer) for b in blocks]),
        "num_heads": _collapse([_heads(b.mixer) for b in blocks]),
        "ffn": _collapse([getattr(b, "mlp", None) is not None for b in blocks]),
        "layers": len(blocks),
        "width": int(config.emb_dim),
        "capacity": _collapse(capacity),
        "init": config.get("init_scheme") or "own",
        "head": _head(model),
        "kept": scaffold.kept(config),
        "params": params,
        "flops_per_token": flops_per_token(model, int(config.max_length)) if flops else None,
    }


def _per_layer(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def base_value(card: dict, field: str) -> Any:
    """The field at the card's base_layers (all of them without a per-layer list)."""
    value = card.get(field, IMPLIED_WHEN_ABSENT.get(field))
    base = card.get("base_layers")
    if not isinstance(value, list) or not base or field in ("layers", "width"):
        return value
    return _collapse([value[i] for i in base if i < len(value)])


def agree(a: Any, b: Any) -> bool:
    la, lb = _per_layer(a), _per_layer(b)
    if len(la) == 1 or len(lb) == 1:  # a uniform value against each layer's
        la, lb = la * max(len(lb), 1), lb * max(len(la), 1)
    return len(la) == len(lb) and all(x is None or y is None or x == y
                                      for x, y in zip(la, lb))


def differences(a: dict, b: dict, allowed: tuple[str, ...] = ()) -> list[str]:
    """The COMPARED fields in which cards a and b differ, those in `allowed` (a declared
    ablation axis) and those either variant keeps aside."""
    kept = {KEPT_AS.get(f, f) for f in (*(a.get("kept") or {}), *(b.get("kept") or {}))}
    return [f for f in COMPARED if f not in allowed and f not in kept
            and not agree(base_value(a, f), base_value(b, f))]


def note(field: str, value: Any) -> str:
    """'conv 0', 'pos learned', 'own conv 4', 'heads 1' for a row's name."""
    label = {"positions": "pos", "short_conv": "conv", "builtin_conv": "own conv",
             "num_heads": "heads", "ffn": "ffn", "layers": "layers", "width": "width",
             "init": "init", "head": "head"}[field]
    shown = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    return f"{label} {shown}"


def describe(c: dict) -> str:
    """'pos none, conv 3, own conv 0, heads 2, no ffn' for a table cell."""
    def show(v):
        return ",".join(map(str, v)) if isinstance(v, list) else str(v)

    heads = c.get("num_heads")
    parts = [f"pos {show(c.get('positions'))}", f"conv {show(c.get('short_conv'))}",
             f"own conv {show(c.get('builtin_conv'))}",
             "heads -" if heads is None else f"heads {show(heads)}"]
    kept = c.get("kept") or {}
    if "pos_emb" in kept:
        parts[0] += " (kept)"
    if "num_heads" in kept:
        parts[-1] += " (kept)"
    if c.get("init", "own") != "own":
        parts.append(f"init {c['init']}")
    if c.get("head") == "tied":
        parts.append("tied head")
    return ", ".join(parts)

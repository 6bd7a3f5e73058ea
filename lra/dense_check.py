"""Does a variant, with given hyperparameters, reduce to dense attention at a length?

  reduces_to_dense("local", {"window": 128}, 65)   -> True  (the window covers 65)
  reduces_to_dense("local", {"window": 4}, 65)     -> False
  run_reduces_to_dense(results["config"])          -> the same for a run's resolved config
  degenerate("linformer", {"k": 1}, 65)            -> "every position gets the same output ..."
  key_fraction("local", {"window": 4}, 65)         -> 0.15 (of the keys reach an output)

From the shell, per run of a sweep directory or per variant of a task config (a table;
`--fractions` adds the measured fraction of the keys, a second or so per row):

  python -m lra.dense_check workdirs/sweep_listops_mini [--fractions]
  python -m lra.dense_check --config=configs/listops.py:mini [--models=linformer,sac]

A numerical check, the same for every variant: a variant whose
`registry.capabilities(name).dense_equivalent` is not None declares that under some
hyperparameters it computes exactly what `transformer` computes with the same `query`,
`key`, `value` and `out` weights. The check builds the variant at a small width (dim 16,
2 heads) with the given hyperparameters and `max_len` = the length, copies those four
projections into a `transformer` built alike, runs both on one random input of that
length and compares. The input is scaled up so that the softmax is sharp: a query that
misses keys then differs by O(1), not by O(1/L).

- Variants whose dense_equivalent is None (no dense limit: kernels, memories, mixers)
  never reduce; `transformer` and the variants that are `transformer`'s mixer by
  construction (dense_equivalent {}, e.g. `universal`) always do (see `always_dense`).
- Settings that choose how attention is computed, not how much of the sequence it sees,
  are ignored or set to their dense-equivalent values: attention_impl (all give the same
  numbers), dropout, qkv_dim, and the variant's `Capabilities.dense_form` (reformer and
  routing with one chunk / one cluster are full attention on shared queries and keys:
  the check compares them with separate keys; longformer's global tokens with their own
  projections likewise).
- A variant with a `pattern` (models.masks) is decided by the pattern where it can be:
  a pattern that misses a key is not dense (however few keys it misses, which one random
  input may not show), and plain `PatternAttention` with a pattern that keeps every key
  is a masked softmax that masks nothing. The others (axial's two passes, global's extra
  tokens) are compared numerically.
- `prefix_len`: with CLS pooling the encoder gives the mixers max_length + 1 positions,
  the first one the CLS slot; `run_reduces_to_dense` checks at that length.

Results are cached. A check takes about a second at ListOps mini's 65 positions and 1-5 s
at 4001 on a CPU (bp_transformer 15 s: it builds its mask on the host); pattern variants
are decided from their mask in milliseconds. Lengths above `MAX_LENGTH` are refused (a
ValueError): the dense reference needs L x L logits.
"""
from __future__ import annotations

import functools
import json
from typing import Any, Mapping

# Hyperparameters that do not change which keys a query sees (attention_impl: every
# implementation gives the same numbers; the check uses the masked dense one).
IGNORED = ("attention_impl", "attention_dropout", "qkv_dim")
DIM, HEADS = 16, 2
INPUT_SCALE = 4.0  # x ~ 4 N(0, 1): logits of a few tens, a sharp softmax
TOLERANCE = 1e-3  # relative to the largest output
MAX_LENGTH = 8193  # mixer positions (8192 tokens and a CLS slot)
DENSE_PARAMS = ("query", "key", "value", "out")


def always_dense(model: str) -> bool:
    """`model`'s mixer is `transformer`'s at any length (dense_equivalent == {})."""
    from models import registry

    return registry.capabilities(model).dense_equivalent == {}


def reduces_to_dense(model: str, hparams: Mapping[str, Any], length: int, *,
                     causal: bool = False, prefix_len: int = 0) -> bool:
    """True when `model` built with `hparams` for `length` positions (the first
    `prefix_len` of them a CLS slot) computes dense attention.

    Raises what building the variant raises (RegistryError for an unknown model or
    hparam, ValueError for a bad value), and ValueError above MAX_LENGTH.
    """
    return _check(model, _key(hparams), int(length), bool(causal), int(prefix_len))


def run_length(config: Mapping[str, Any]) -> tuple[int, int]:
    """(positions the mixers see, prefix_len) for a run's resolved config."""
    cls = config.get("pooling", "CLS") == "CLS"
    return int(config["max_length"]) + int(cls), int(cls)


def _of_run(check, config: Mapping[str, Any]):
    """`check` (reduces_to_dense, degenerate, key_fraction) for a run's resolved config
    (results.json's `config`)."""
    length, prefix_len = run_length(config)
    return check(config["model"], config.get("model_hparams") or {}, length,
                 causal=bool(config.get("causal", False)), prefix_len=prefix_len)


def run_layers(config: Mapping[str, Any]) -> list[tuple[str, dict]] | None:
    """(mixer, hparams) of every layer of a hybrid run (configs/hybrid.py); None for a
    single-mixer run, whose checks are its model's."""
    from configs import hybrid

    if not hybrid.is_hybrid(config):
        return None
    return [(l["model"], l["model_hparams"]) for l in hybrid.layer_list(config)]


def _of_layers(check, config: Mapping[str, Any]) -> list:
    """`check` per layer of a hybrid run (run_layers), each at the run's length."""
    length, prefix_len = run_length(config)
    return [check(model, hparams, length, causal=bool(config.get("causal", False)),
                  prefix_len=prefix_len) for model, hparams in run_layers(config)]


def _key(hparams: Mapping[str, Any]) -> str:
    """`hparams` as a cache key."""
    return json.dumps(dict(hparams), sort_keys=True, default=repr)


def run_reduces_to_dense(config: Mapping[str, Any]) -> bool:
    """`reduces_to_dense` for a run's resolved config (results.json's `config`); a hybrid
    run reduces when every layer does."""
    if run_layers(config) is not None:
        return all(_of_layers(reduces_to_dense, config))
    return _of_run(reduces_to_dense, config)


@functools.lru_cache(maxsize=None)
def _check(model: str, hparams_json: str, length: int, causal: bool,
           prefix_len: int) -> bool:
    import jax
    import numpy as np
    from flax import nnx

    from models import masks, registry

    caps = registry.capabilities(model)
    if caps.dense_equivalent is None:
        return False
    if caps.dense_equivalent == {}:
        return True
    if length > MAX_LENGTH:
        raise ValueError(f"dense check: length {length} > {MAX_LENGTH} (L x L logits)")
    hparams = {k: v for k, v in json.loads(hparams_json).items() if k not in IGNORED}
    for name in caps.dense_form:  # the form of attention, not its extent
        hparams[name] = caps.dense_equivalent[name]
    variant = _build(model, hparams, length, causal, prefix_len)
    if not all(isinstance(getattr(variant, p, None), nnx.Linear) for p in DENSE_PARAMS):
        return False  # e.g. synthesizer's dense mode: no keys at all
    pattern = getattr(variant, "pattern", None)
    if isinstance(pattern, masks.Pattern):
        # A pattern that misses a few keys (a window of L - 2) may not show in one random
        # input; its mask says it exactly.
        allowed = pattern.dense_np(length, length)
        needed = np.tri(length, dtype=bool) if causal else np.ones((length, length), bool)
        if not np.all(allowed | ~needed):
            return False
        from models.attention.sparse import PatternAttention

        if type(variant) is PatternAttention:
            return True  # a masked dense softmax whose mask keeps every key
    dense = _transformer(length, causal, variant.query.out_features,
                         bool(variant.query.use_bias))
    for p in DENSE_PARAMS:
        nnx.update(getattr(dense, p), nnx.state(getattr(variant, p), nnx.Param))
    x = INPUT_SCALE * jax.random.normal(jax.random.key(0), (1, length, DIM))
    kwargs = {"carry": None} if caps.carries_state else {}
    y_variant = _apply(variant, x, **kwargs)
    if caps.carries_state:
        y_variant = y_variant[0]
    y_dense = np.asarray(_apply(dense, x))
    err = float(np.max(np.abs(np.asarray(y_variant) - y_dense)))
    return err <= TOLERANCE * max(float(np.max(np.abs(y_dense))), 1e-6)


def _build(model: str, hparams: Mapping[str, Any], length: int, causal: bool,
           prefix_len: int):
    """`model` at the checks' size (DIM, HEADS) for `length` positions, without dropout."""
    from flax import nnx

    from models import registry

    hparams = {k: v for k, v in hparams.items() if k not in IGNORED}
    if "attention_dropout" in registry.accepted_hparams(model):
        hparams["attention_dropout"] = 0.0
    return registry.build(model, dim=DIM, num_heads=HEADS, max_len=length, causal=causal,
                          prefix_len=prefix_len, rngs=nnx.Rngs(params=0, dropout=1),
                          **hparams)


@functools.lru_cache(maxsize=8)
def _transformer(length: int, causal: bool, qkv_dim: int, use_bias: bool):
    """`transformer` at the check's size; each check copies its projections in."""
    from flax import nnx

    from models import registry

    return registry.build("transformer", dim=DIM, num_heads=HEADS, max_len=length,
                          causal=causal, rngs=nnx.Rngs(params=1, dropout=1), qkv_dim=qkv_dim,
                          use_bias=use_bias, attention_dropout=0.0)


def _apply(module, x, **kwargs):
    """module(x) under jit (one compilation is faster than running a variant's many small
    operations one by one), compiled once per module structure and shapes."""
    import jax
    from flax import nnx

    graphdef, state = nnx.split(module)
    key = (graphdef, tuple((a.shape, str(a.dtype)) for a in jax.tree.leaves(state)),
           x.shape, tuple(sorted(kwargs.items())))
    if key not in _COMPILED:
        if len(_COMPILED) >= 32:
            _COMPILED.clear()
        fn = jax.jit(lambda state, x: nnx.merge(graphdef, state)(
            x, padding_mask=None, deterministic=True, **kwargs))
        # Masks built on the host (bp_transformer's) are constants of the program: folding
        # operations on them takes XLA a minute at L = 4000.
        _COMPILED[key] = fn.lower(state, x).compile(
            {"xla_disable_hlo_passes": "constant_folding"})
    return _COMPILED[key](state, x)


_COMPILED: dict = {}


# ----------------------------------------------------------------------------- degenerate

# A mixer whose output varies across positions by less than this (relative to its largest
# value) gives every position the same vector: a per-sequence broadcast, not a mixer.
SPREAD_TOLERANCE = 1e-4


def degenerate(model: str, hparams: Mapping[str, Any], length: int, *,
               causal: bool = False, prefix_len: int = 0) -> str | None:
    """Why `model` built with `hparams` for `length` positions no longer computes its
    method (one line), or None when it does.

    Numerical, the same for every variant (at DIM, HEADS, on one random input):
    - the output is the same vector at every content position (relative spread below
      SPREAD_TOLERANCE): e.g. Linformer, Set Transformer or Luna with one summary, whose
      softmax over one key always weighs 1;
    - a query or key projection gets an all-zero gradient (a softmax over one key, a
      window of 0, SAC's hard gather of k=1): the attention is not learned at all.
    """
    return _degenerate(model, _key(hparams), int(length), bool(causal), int(prefix_len))


def run_degenerate(config: Mapping[str, Any]) -> str | None:
    """`degenerate` for a run's resolved config (results.json's `config`)."""
    if run_layers(config) is not None:  # a hybrid: the first layer that degenerates
        for l, ((model, _), why) in enumerate(zip(run_layers(config),
                                                  _of_layers(degenerate, config))):
            if why:
                return f"layer {l} ({model}): {why}"
        return None
    return _of_run(degenerate, config)


def _is_projection(path: tuple) -> str | None:
    """'query'/'key'/'key2'/... when `path` is the kernel of such an nnx.Linear."""
    names = [str(p) for p in path]
    if names[-1] != "kernel" or len(names) < 2:
        return None
    owner = names[-2]
    return owner if owner.startswith(("query", "key")) else None


@functools.lru_cache(maxsize=None)
def _degenerate(model: str, hparams_json: str, length: int, causal: bool,
                prefix_len: int) -> str | None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from models import registry

    if length > MAX_LENGTH:
        # A full-size Path-X run (16385 positions) took more than 12 GB for the gradient
        # of a quadratic mixer: the report says "could not check" instead.
        raise ValueError(f"degeneracy check: length {length} > {MAX_LENGTH} (L x L logits "
                         "in the gradient)")
    variant = _build(model, json.loads(hparams_json), length, causal, prefix_len)
    carries = registry.capabilities(model).carries_state
    graphdef, params, rest = nnx.split(variant, nnx.Param, ...)
    x = jax.random.normal(jax.random.key(0), (1, length, DIM))
    cotangent = jax.random.normal(jax.random.key(1), (1, length, DIM))

    def loss(params, rest, x, cotangent):
        module = nnx.merge(graphdef, params, rest)
        y = module(x, padding_mask=None, deterministic=True,
                   **({"carry": None} if carries else {}))
        y = y[0] if carries else y
        return jnp.sum(y * cotangent), y

    grad = jax.jit(jax.value_and_grad(loss, has_aux=True)).lower(
        params, rest, x, cotangent).compile({"xla_disable_hlo_passes": "constant_folding"})
    (_, y), grads = grad(params, rest, x, cotangent)
    y = np.asarray(y[0, prefix_len:], np.float64)
    if y.shape[0] > 1:
        spread = float(np.max(y.max(0) - y.min(0)) / max(np.max(np.abs(y)), 1e-30))
        if spread < SPREAD_TOLERANCE:
            return (f"every position gets the same output (relative spread {spread:.1e}): "
                    "a softmax over one summary or key")
    flat, _ = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(grads))
    dead = sorted({name for path, g in flat
                   if (name := _is_projection(tuple(getattr(p, "key", p) for p in path)))
                   and not np.any(np.asarray(g))})
    if dead:
        return (f"the {'/'.join(dead)} projection gets no gradient: attention over one key "
                "(nothing to weigh)")
    return None


# ----------------------------------------------------------------------------- fractions

FRACTION_ROWS = 16  # query rows sampled per check


def key_fraction(model: str, hparams: Mapping[str, Any], length: int, *,
                 causal: bool = False, prefix_len: int = 0) -> float:
    """Mean fraction of the positions a content output can see (all L, or its i+1 with
    causal) that reach it in one layer: the rows of d y_i / d x that are not exactly zero,
    over FRACTION_ROWS query rows evenly spaced, on one random input.

    It measures what a mixer reads, whatever its mechanism (a window, a pattern, buckets,
    clusters, a low-rank summary: a summary of everything reads everything, 1.0). Masked
    keys weigh exactly 0 and give exactly zero derivatives."""
    return _key_fraction(model, _key(hparams), int(length), bool(causal), int(prefix_len))


def run_key_fraction(config: Mapping[str, Any]) -> float:
    """`key_fraction` for a run's resolved config (results.json's `config`)."""
    if run_layers(config) is not None:  # a hybrid: the layer that sees the fewest keys
        return min(_of_layers(key_fraction, config))
    return _of_run(key_fraction, config)


@functools.lru_cache(maxsize=None)
def _key_fraction(model: str, hparams_json: str, length: int, causal: bool,
                  prefix_len: int) -> float:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from models import registry

    if length > MAX_LENGTH:
        raise ValueError(f"key fraction: length {length} > {MAX_LENGTH}")
    if length > MAX_LENGTH:
        # A full-size Path-X run (16385 positions) took more than 12 GB for the gradient
        # of a quadratic mixer: the report says "could not check" instead.
        raise ValueError(f"degeneracy check: length {length} > {MAX_LENGTH} (L x L logits "
                         "in the gradient)")
    variant = _build(model, json.loads(hparams_json), length, causal, prefix_len)
    carries = registry.capabilities(model).carries_state
    graphdef, state = nnx.split(variant)
    rows = np.unique(np.linspace(prefix_len, length - 1,
                                 min(FRACTION_ROWS, length - prefix_len)).astype(int))
    x = jax.random.normal(jax.random.key(0), (1, length, DIM))

    def reach(state, x, row_cotangents_RxLxD):
        def forward(x):
            y = nnx.merge(graphdef, state)(x, padding_mask=None, deterministic=True,
                                            **({"carry": None} if carries else {}))
            return y[0] if carries else y

        _, vjp = jax.vjp(forward, x)
        g = jax.lax.map(lambda c: vjp(c[None])[0][0], row_cotangents_RxLxD)
        return jnp.any(g != 0, axis=-1)  # R x L: input j reaches output row r

    direction = jax.random.normal(jax.random.key(1), (DIM,))
    cotangents = jnp.zeros((len(rows), length, DIM)).at[np.arange(len(rows)), rows].set(
        direction)
    # Everything an argument, and no constant folding: host-built masks (bp_transformer)
    # and a folded forward pass (SAC's top-k at L = 2000) would take XLA minutes.
    reach = jax.jit(reach).lower(state, x, cotangents).compile(
        {"xla_disable_hlo_passes": "constant_folding"})
    reached = np.asarray(reach(state, x, cotangents))
    seen = rows + 1 if causal else np.full(len(rows), length)
    return float(np.mean(reached.sum(-1) / seen))


# ----------------------------------------------------------------------------- command line


def _config_rows(spec: str, models: list[str]) -> list[dict]:
    """Resolved configs of `models` from a task config spec 'configs/<task>.py[:args]'."""
    import importlib
    import os

    path, _, arg = spec.partition(":")
    name = os.path.splitext(os.path.basename(path))[0]
    try:
        module = importlib.import_module(f"configs.{name}")
    except ModuleNotFoundError:
        raise ValueError(f"--config={spec}: no task config configs/{name}.py") from None
    rows = []
    for model in models:
        config = module.get_config(",".join(filter(None, [f"model={model}", arg])))
        rows.append({"config": config.to_dict(), "run": f"{config.task}:{arg or 'full'}"})
    return rows


def _sizes(config: Mapping[str, Any]) -> str:
    """The run's length-dependent sizes (configs.presets.LENGTH_SCALED keys), 'k=16 ...'."""
    from configs import presets

    hparams = config.get("model_hparams") or {}
    keys = presets.LENGTH_SCALED.get(config["model"], {})
    return " ".join(f"{k}={hparams[k]:g}" for k in keys if k in hparams) or "-"


def table(rows: list[dict], fractions: bool = False) -> list[str]:
    """Markdown lines: per run, its length, sizes, whether it is dense-equivalent or
    degenerate, and (fractions) the fraction of the keys that reach an output."""
    header = ["run", "model", "positions", "sizes", "dense", "degenerate"]
    header += ["keys seen"] if fractions else []
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        config = row["config"]
        from configs import hybrid

        cells = [row["run"], hybrid.name(config), str(run_length(config)[0]), _sizes(config)]
        try:
            cells.append("yes" if (always_dense(config["model"])
                                   or run_reduces_to_dense(config)) else "no")
            cells.append(run_degenerate(config) or "no")
            if fractions:
                cells.append(f"{100 * run_key_fraction(config):.1f}%")
        except Exception as e:  # noqa: BLE001  (a run this code cannot build: say why)
            cells += [f"cannot check: {type(e).__name__}: {e}"] + [""] * (
                len(header) - len(cells) - 1)
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1] if len(lines) > 3 else "\n".join(lines), flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    import argparse
    import os

    parser = argparse.ArgumentParser(
        prog="python -m lra.dense_check",
        description="Per run (results.json below DIR) or per variant of a task config: does "
                    "it reduce to dense attention, is it degenerate, and what fraction of "
                    "the keys reaches an output.")
    parser.add_argument("dirs", nargs="*", help="directories of runs (results.json)")
    parser.add_argument("--config", action="append", default=[],
                        help="a task config, e.g. configs/listops.py:mini (repeatable)")
    parser.add_argument("--models", default="all",
                        help="with --config: comma-separated names, or 'all'")
    parser.add_argument("--fractions", action="store_true",
                        help="also measure the fraction of the keys that reach an output")
    args = parser.parse_args(argv)
    if not args.dirs and not args.config:
        parser.error("give a directory of runs or --config=configs/<task>.py[:args]")
    from lra.errors import UserError
    from lra.runs.results import load
    from models import registry

    models = (registry.available() if args.models == "all"
              else [m for m in args.models.split(",") if m])
    rows = []
    for spec in args.config:
        try:
            rows += _config_rows(spec, models)
        except (ValueError, UserError) as e:  # no such config, unknown model or argument
            parser.error(str(e))
    for root in args.dirs:
        results, skipped = load(root)
        for line in skipped:
            print(f"warning: {line}")
        rows += [{"run": os.path.relpath(r["_path"], root), "config": r["config"]}
                 for r in results if r.get("config", {}).get("model")]
    if not rows:
        print("no runs with a recorded config found")
        return 1
    table(rows, fractions=args.fractions)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())

"""Does a variant, with given hyperparameters, reduce to dense attention at a length?

  reduces_to_dense("local", {"window": 128}, 65)   -> True  (the window covers 65)
  reduces_to_dense("local", {"window": 4}, 65)     -> False
  run_reduces_to_dense(results["config"])          -> the same for a run's resolved config

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
    key = json.dumps(dict(hparams), sort_keys=True, default=repr)
    return _check(model, key, int(length), bool(causal), int(prefix_len))


def run_length(config: Mapping[str, Any]) -> tuple[int, int]:
    """(positions the mixers see, prefix_len) for a run's resolved config."""
    cls = config.get("pooling", "CLS") == "CLS"
    return int(config["max_length"]) + int(cls), int(cls)


def run_reduces_to_dense(config: Mapping[str, Any]) -> bool:
    """`reduces_to_dense` for a run's resolved config (results.json's `config`)."""
    length, prefix_len = run_length(config)
    return reduces_to_dense(config["model"], config.get("model_hparams") or {}, length,
                            causal=bool(config.get("causal", False)), prefix_len=prefix_len)


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
    accepted = registry.accepted_hparams(model)
    if "attention_dropout" in accepted:
        hparams["attention_dropout"] = 0.0
    variant = registry.build(model, dim=DIM, num_heads=HEADS, max_len=length, causal=causal,
                             prefix_len=prefix_len, rngs=nnx.Rngs(params=0, dropout=1),
                             **hparams)
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

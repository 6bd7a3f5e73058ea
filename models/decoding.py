"""Autoregressive decoding for causal mixers (DESIGN.md 10): the contract and its forms.

Katharopoulos et al. ("Transformers are RNNs", one of our seeds): causal attention can be
run one token at a time from a cache of what the past left behind. A causal mixer decodes
through three functions of this module, which dispatch on its `Capabilities.decode`:

    cache = init_cache(mixer, form, batch=, max_len=, dim=)
    y_BxLxD, cache = prefill(mixer, form, cache, x_BxLxD, padding_mask_BxL)
    y_BxD, cache = step(mixer, form, cache, x_BxD)

`cache` is a dict of arrays (a pytree: it goes through `jax.lax.scan` and is donated),
always with "pos" int32[B], the number of tokens row b holds (the position of its next
token). `prefill` takes a right-padded prompt (row b's tokens are positions < its number
of real tokens), returns the parallel form's outputs there and the cache of that prompt,
in one parallel call. `step` appends one token per row, each row at its own position.
The contract's test: prefill + steps equal the parallel causal forward at every position
(tests/models/test_decoding.py, through the task configs).

Forms (what each costs per token and per layer, L = position, M = max_len):
  kv_cache         softmax attention over the keys and values of the positions the pattern
                   can still reach: a ring buffer of `reach` + 1 slots when the causal
                   pattern never looks further back than `reach` < M positions (local,
                   dilated, block_local, local_2d: memory O(reach)), else every earlier
                   position (transformer: memory O(M)), masked by the pattern. Time O(slots).
  recurrent_state  the linear family's state, e.g. (S, z) per head: memory O(d_k d_v) at
                   every position, time O(d_k d_v). The mixer implements
                   `init_cache(batch, max_len)`, `prefill(cache, x, mask)`, `step(cache, x)`.
  conv_kv          lite: a kv cache for the attention half, the last kernel_size - 1
                   convolution inputs for the other (memory O(M) + O(kernel_size)).
  gate_cache       gmlp: the gate inputs LN(Z2) of every earlier position; a token takes
                   its row of the spatial matrix W (memory and time O(M ffn_dim / 2)).
  recompute        the mixer's inputs at every earlier position (memory O(M d)); each
                   step runs the parallel mixer over them and keeps the new row, exact by
                   the tested causality and padding claims (future positions are masked
                   and cannot reach the past). Time: one parallel call, O(M^2) or the
                   variant's own cost, per token. For variants whose selection rule
                   (sorting, clustering, pooling, sampling) has no cheaper exact form here.
A mixer with its own `init_cache` / `prefill` / `step` is decoded by them whatever form it
names (the synthesizer's kv cache: values, and keys in its dot mode).
The segment memory of Transformer-XL (`segment_recurrent` stack) is the stack's: see
`models.stacks.SegmentRecurrentStack.step`.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from models import masks

Cache = dict[str, Any]

# This module implements "kv_cache" and "recompute" for any mixer of the right kind; every
# other form (recurrent_state, conv_kv, gate_cache: models.registry.DECODE_FORMS) is the
# mixer's own init_cache / prefill / step.


class DecodingError(ValueError):
    """A model or mixer that cannot decode, said in one line."""


def require_causal(mixer: Any, name: str) -> None:
    """A mixer's own decoding methods (fox, moba, path) start here: only the causal form
    reads one token at a time."""
    if not mixer.causal:
        raise DecodingError(f"{name} was built with causal=False; only the causal form "
                            "decodes token by token")


def lengths_of(padding_mask_BxL: jax.Array | None, batch: int, length: int) -> jax.Array:
    """Real tokens per row of a right-padded prompt (all of them without a mask)."""
    if padding_mask_BxL is None:
        return jnp.full((batch,), length, jnp.int32)
    return jnp.sum(padding_mask_BxL.astype(jnp.int32), axis=1)


def row_at(x_BxLxF: jax.Array, pos_B: jax.Array) -> jax.Array:
    """x[b, pos[b]] for every row (BxF...)."""
    index = pos_B.reshape(-1, *([1] * (x_BxLxF.ndim - 1)))
    return jnp.take_along_axis(x_BxLxF, index, axis=1)[:, 0]


def write_row(buffer_BxSxF: jax.Array, slot_B: jax.Array, x_BxF: jax.Array) -> jax.Array:
    """buffer with row b's slot slot[b] replaced by x[b] (a select, no scatter)."""
    hit_BxS = jnp.arange(buffer_BxSxF.shape[1])[None] == slot_B[:, None]
    hit = hit_BxS.reshape(*hit_BxS.shape, *([1] * (buffer_BxSxF.ndim - 2)))
    return jnp.where(hit, x_BxF[:, None].astype(buffer_BxSxF.dtype), buffer_BxSxF)


def split(model: Any) -> tuple[Any, Any]:
    """nnx.split of (a copy of) a model for a jitted decoding loop, without the values its
    last calls sowed (aux losses): a loop body merges the model afresh and may sow its own.
    Merge with nnx.merge."""
    from flax import nnx

    model = nnx.clone(model)
    nnx.pop(model, nnx.Intermediate)
    return nnx.split(model)


# ----------------------------------------------------------------------------- dispatch


def _own(mixer: Any, form: str) -> None:
    if not hasattr(mixer, "init_cache"):
        raise DecodingError(f"{type(mixer).__name__} declares the decoding form {form!r} "
                            "but has no init_cache/prefill/step of its own")


def init_cache(mixer: Any, form: str, *, batch: int, max_len: int, dim: int) -> Cache:
    # A mixer's own methods come first: e.g. the synthesizer's kv cache holds values (and
    # keys only in its dot mode) and synthesizes the logits row of each new token.
    if hasattr(mixer, "init_cache"):
        return mixer.init_cache(batch, max_len)
    if form == "kv_cache":
        return kv_init(mixer, batch, max_len)
    if form == "recompute":
        return {"pos": jnp.zeros((batch,), jnp.int32),
                "x": jnp.zeros((batch, max_len, dim), jnp.float32)}
    _own(mixer, form)  # recurrent_state and the forms of one variant
    return mixer.init_cache(batch, max_len)


def prefill(mixer: Any, form: str, cache: Cache, x_BxLxD: jax.Array,
            padding_mask_BxL: jax.Array | None) -> tuple[jax.Array, Cache]:
    if hasattr(mixer, "prefill"):
        return mixer.prefill(cache, x_BxLxD, padding_mask_BxL)
    batch, length, _ = x_BxLxD.shape
    pos_B = lengths_of(padding_mask_BxL, batch, length)
    if form == "kv_cache":
        y_BxLxD = mixer(x_BxLxD, padding_mask=padding_mask_BxL, deterministic=True)
        return y_BxLxD, kv_fill(mixer, cache, x_BxLxD, pos_B)
    if form != "recompute":
        _own(mixer, form)
    # At the buffer's length, as every step: some selection rules depend on the length
    # (routing's group size ceil(L / k)), and training saw max_len (padded batches).
    x_BxMxD = jax.lax.dynamic_update_slice(cache["x"], x_BxLxD.astype(cache["x"].dtype),
                                           (0, 0, 0))
    real_BxM = jnp.arange(x_BxMxD.shape[1])[None] < pos_B[:, None]
    y_BxMxD = mixer(x_BxMxD.astype(x_BxLxD.dtype), padding_mask=real_BxM, deterministic=True)
    return y_BxMxD[:, :length], {"pos": pos_B, "x": x_BxMxD}


def step(mixer: Any, form: str, cache: Cache, x_BxD: jax.Array) -> tuple[jax.Array, Cache]:
    if hasattr(mixer, "init_cache"):
        return mixer.step(cache, x_BxD)
    if form == "kv_cache":
        return kv_step(mixer, cache, x_BxD)
    if form != "recompute":
        _own(mixer, form)
    pos_B = cache["pos"]
    x_BxMxD = write_row(cache["x"], pos_B, x_BxD)
    seen_BxM = jnp.arange(x_BxMxD.shape[1])[None] <= pos_B[:, None]
    y_BxMxD = mixer(x_BxMxD.astype(x_BxD.dtype), padding_mask=seen_BxM, deterministic=True)
    return row_at(y_BxMxD, pos_B), {"pos": pos_B + 1, "x": x_BxMxD}


# ----------------------------------------------------------------------------- kv cache


def pattern_of(mixer: Any) -> masks.Pattern:
    """The causal pattern a softmax mixer attends by (`transformer`: every earlier key)."""
    pattern = getattr(mixer, "pattern", None)
    return masks.causal() if pattern is None else pattern


@functools.lru_cache(maxsize=64)
def reach(pattern: masks.Pattern, max_len: int) -> int:
    """How far back a query of the causal `pattern` ever looks: max over i of i - j for
    allowed (i, j), over every head; max_len - 1 when some query sees position 0 from
    the end. Computed once on the host (patterns are hashable)."""
    allowed = np.asarray(pattern.dense_np(max_len, max_len)).reshape(-1, max_len, max_len)
    i = np.arange(max_len)[:, None]
    j = np.arange(max_len)[None, :]
    if np.any(allowed & (j > i)):
        raise DecodingError("the pattern lets a query see later keys; a kv cache needs a "
                            "causal pattern")
    behind = np.where(allowed, i - j, -1)
    return int(behind.max())


def cache_slots(mixer: Any, max_len: int) -> int:
    """Slots of the kv cache: the pattern's reach + 1 (or the mixer's own `decode_reach`,
    e.g. adaptive_span's largest possible span), at most max_len."""
    own = getattr(mixer, "decode_reach", None)
    far = own(max_len) if own is not None else reach(pattern_of(mixer), max_len)
    return min(far + 1, max_len)


def kv_init(mixer: Any, batch: int, max_len: int) -> Cache:
    if getattr(mixer, "prefix_len", 0):
        raise DecodingError("a decoding mixer has no prefix (CLS) slot")
    slots = cache_slots(mixer, max_len)
    shape = (batch, mixer.num_heads, slots, mixer.head_dim)
    return {"pos": jnp.zeros((batch,), jnp.int32), "k": jnp.zeros(shape, jnp.float32),
            "v": jnp.zeros(shape, jnp.float32)}


def slot_positions(pos_B: jax.Array, slots: int) -> jax.Array:
    """Position each ring slot holds once position pos (the newest) is written: the latest
    p <= pos with p = slot (mod slots); negative where no such position exists yet."""
    slot_S = jnp.arange(slots)
    return pos_B[:, None] - jnp.mod(pos_B[:, None] - slot_S[None], slots)


def kv_fill(mixer: Any, cache: Cache, x_BxLxD: jax.Array, pos_B: jax.Array) -> Cache:
    """The prompt's keys and values (rotated at their positions) into the ring: slot s of
    row b gets its latest prompt position p = s (mod slots), p < pos_b."""
    _, k_BxHxLxK, v_BxHxLxK = mixer.project_qkv(x_BxLxD)
    slots, length = cache["k"].shape[2], x_BxLxD.shape[1]
    held_BxS = slot_positions(pos_B - 1, slots)
    index_Bx1xSx1 = jnp.clip(held_BxS, 0, length - 1)[:, None, :, None]
    valid_Bx1xSx1 = (held_BxS >= 0)[:, None, :, None]

    def gather(t_BxHxLxK):
        taken = jnp.take_along_axis(t_BxHxLxK.astype(jnp.float32), index_Bx1xSx1, axis=2)
        return jnp.where(valid_Bx1xSx1, taken, 0.0)

    return {"pos": pos_B, "k": gather(k_BxHxLxK), "v": gather(v_BxHxLxK)}


def kv_step(mixer: Any, cache: Cache, x_BxD: jax.Array) -> tuple[jax.Array, Cache]:
    # Imported here: models.attention imports this module's siblings, not the reverse.
    from models.attention.dense import attend_logits, dot_product_attention

    pos_B = cache["pos"]
    slots = cache["k"].shape[2]
    x_Bx1xD = x_BxD[:, None]
    q_BxHx1xK, k_BxHx1xK, v_BxHx1xK = (mixer.split_heads(proj(x_Bx1xD)) for proj in
                                       (mixer.query, mixer.key, mixer.value))
    positions_Bx1x1 = pos_B[:, None, None]
    q_BxHx1xK = mixer.rotate(q_BxHx1xK, positions_Bx1x1)
    k_BxHx1xK = mixer.rotate(k_BxHx1xK, positions_Bx1x1)
    slot_B = jnp.mod(pos_B, slots)
    # Written as BxSxHxK rows, so that write_row's slot axis is axis 1.
    k_BxHxSxK = write_row(cache["k"].transpose(0, 2, 1, 3), slot_B,
                          k_BxHx1xK[:, :, 0]).transpose(0, 2, 1, 3)
    v_BxHxSxK = write_row(cache["v"].transpose(0, 2, 1, 3), slot_B,
                          v_BxHx1xK[:, :, 0]).transpose(0, 2, 1, 3)
    held_BxS = slot_positions(pos_B, slots)
    allowed = pattern_of(mixer).mask(pos_B[:, None], held_BxS, jnp)  # BxS or HxBxS
    allowed = allowed & (held_BxS >= 0)
    if allowed.ndim == 3:  # per-head pattern: HxBxS
        mask_BxHx1xS = allowed.transpose(1, 0, 2)[:, :, None]
    else:
        mask_BxHx1xS = allowed[:, None, None]
    k_BxHxSxK_, v_BxHxSxK_ = (t.astype(q_BxHx1xK.dtype) for t in (k_BxHxSxK, v_BxHxSxK))
    key_weights = getattr(mixer, "key_weights", None)
    if key_weights is None:
        o_BxHx1xK = dot_product_attention(q_BxHx1xK, k_BxHxSxK_, v_BxHxSxK_,
                                          mask=mask_BxHx1xS)
    else:
        # Softmax weights times m(distance), renormalised (adaptive_span's soft span):
        # softmax(logits + log m) over the keys with m > 0.
        m_BxHx1xS = key_weights((pos_B[:, None] - held_BxS)[:, None, None].astype(
            jnp.float32))
        mask_BxHx1xS = mask_BxHx1xS & (m_BxHx1xS > 0)
        logits_BxHx1xS = jnp.einsum("bhqk,bhsk->bhqs", q_BxHx1xK, k_BxHxSxK_,
                                    preferred_element_type=jnp.float32)
        logits_BxHx1xS = (logits_BxHx1xS / np.sqrt(q_BxHx1xK.shape[-1])
                          + jnp.log(jnp.where(mask_BxHx1xS, m_BxHx1xS, 1.0)))
        o_BxHx1xK = attend_logits(logits_BxHx1xS, v_BxHxSxK_, mask=mask_BxHx1xS)
    y_BxD = mixer.out(mixer.merge_heads(o_BxHx1xK))[:, 0]
    return y_BxD, {"pos": pos_B + 1, "k": k_BxHxSxK, "v": v_BxHxSxK}

"""Fused softmax attention (`attention_impl=flash`): the attention a 2026 Transformer runs.

One call, three forms, chosen per lowering platform (`lax.platform_dependent`, as the
block-sparse kernels in `models/kernels/targets.py`), so a program traced here and lowered
for another platform holds that platform's form:

- cuda: cuDNN's fused flash attention through `jax.nn.dot_product_attention(
  implementation="cudnn")` (custom call `__cudnn$fmha...`). cuDNN takes fp16/bf16 only:
  float32 inputs take the chunked form below instead (said once on stderr), so a float32
  run is not silently computed in bf16; `--config.dtype=bfloat16` gets cuDNN. Causal and
  causal sliding windows are cuDNN's own masks (tiles above the diagonal or outside the
  window skipped); any other pattern is a static additive bias of its dense mask (cuDNN
  still fuses, but the T x S bias is in memory). Padding is cuDNN's per-row key lengths:
  the valid keys of a row must be a prefix, as every task's right-padded batches are
  (lra/tasks/registry.py's contract). Where this JAX finds no cuDNN (a CPU host lowering
  for CUDA without `jax-cuda12-plugin`), cuda takes the chunked form, said once.
- tpu: the splash attention kernel (`jax.experimental.pallas.ops.tpu.splash_attention`):
  our pattern becomes splash's mask (FullMask, CausalMask, LocalMask, or a NumpyMask of the
  pattern's dense mask for the rest: only its non-empty blocks are computed), padding its
  segment ids (every query in segment 1, padded keys in 0: padded queries see the real keys,
  as in the dense path), the length padded to splash's 128 blocks. A query with no key gets
  splash's average of masked keys rather than 0 (no such row arises from right padding).
- cpu, rocm: `models.kernels.chunked_attention` (Rabe and Staats 2021 in plain JAX, custom
  VJP): O(L) memory, the pattern's empty tiles skipped.

Attention dropout: the chunked form takes it (the hashed keep mask of the Pallas kernels).
cuDNN's dropout is not exposed by `jax.nn.dot_product_attention` (and its private form
takes a static seed, the same mask every step) and splash has none: with dropout > 0 a
run on a GPU (bf16, cuDNN) or a TPU is refused in one line, and a program lowered for one
from elsewhere has no branch for it (JAX refuses to lower it).
`backend=` fixes one form everywhere ("chunked", "cudnn", "splash").
"""
from __future__ import annotations

import functools
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax.sharding import PartitionSpec as P

from models import layers, masks
from models.kernels.chunked_attention import chunked_attention

BACKENDS = ("chunked", "cudnn", "splash")
_SPLASH_BLOCK = 128
_SAID: set[str] = set()


class FlashError(ValueError):
    """A fused-attention configuration a backend cannot run (one line, says what to do)."""


def _say_once(line: str) -> None:
    if line not in _SAID:
        _SAID.add(line)
        print(f"models.kernels.flash_attention: {line}", file=sys.stderr, flush=True)


@functools.cache
def cudnn_missing() -> str | None:
    """Why this JAX cannot emit cuDNN's fused attention, or None when it can."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fa
        version = fa.check_cudnn_version()
    except Exception as e:  # noqa: BLE001  (ImportError, RuntimeError: no cuDNN)
        return f"{type(e).__name__}: {e}"
    if version < 8904:
        return f"cuDNN {version} is older than 8.9.4 (flash attention)"
    return None


def flash_attention(q_BxHxQxK: jax.Array, k_BxHxKvxK: jax.Array, v_BxHxKvxD: jax.Array,
                    pattern: masks.Pattern | None = None, *,
                    padding_mask: jax.Array | None = None, dropout_rate: float = 0.0,
                    dropout_seed: jax.Array | None = None, backend: str | None = None
                    ) -> jax.Array:
    """softmax(q k^T / sqrt(K)) v restricted to `pattern` (None: all keys; causal is the
    caller's `& masks.causal()`) and to the keys with `padding_mask` (bool BxKv) True;
    BxHxQxD in v's dtype. The queries are the last Q of the Kv positions."""
    if backend not in (None, *BACKENDS):
        raise FlashError(f"flash backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    pattern = masks.all_() if pattern is None else pattern
    args = (q_BxHxQxK, k_BxHxKvxK, v_BxHxKvxD)
    common = dict(pattern=pattern, padding_mask=padding_mask, dropout_rate=dropout_rate,
                  dropout_seed=dropout_seed)
    if backend is not None:
        return _FORMS[backend](*args, **common)
    forms = {"cpu": "chunked", "rocm": "chunked", "cuda": _cuda_form(q_BxHxQxK.dtype),
             "tpu": "splash"}
    if dropout_rate > 0:  # neither cuDNN (as JAX exposes it) nor splash drops weights
        here = {"gpu": "cuda", "tpu": "tpu"}.get(jax.default_backend())
        if here and forms[here] != "chunked":
            _refuse(forms[here], dropout_rate)
        # Lowered for such a platform from elsewhere: no branch, JAX refuses to lower.
        forms = {p: f for p, f in forms.items() if f == "chunked"}
    fns = {name: functools.partial(_FORMS[name], **common) for name in set(forms.values())}
    if len(fns) == 1 and len(forms) == 4:
        return next(iter(fns.values()))(*args)
    return lax.platform_dependent(*args, **{p: fns[f] for p, f in forms.items()})


def _cuda_form(dtype) -> str:
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        if jax.default_backend() == "gpu":
            _say_once(f"attention_impl=flash on GPU: cuDNN's fused attention takes fp16/bf16, "
                      f"these inputs are {jnp.dtype(dtype).name}: the chunked XLA form runs "
                      "(--config.dtype=bfloat16 for cuDNN)")
        return "chunked"
    missing = cudnn_missing()
    if missing:
        if jax.default_backend() == "gpu":
            _say_once(f"attention_impl=flash on GPU: no cuDNN fused attention ({missing}): "
                      "the chunked XLA form runs")
        return "chunked"
    return "cudnn"


def _refuse(form: str, dropout_rate: float):
    raise FlashError(
        f"attention_impl=flash: {'cuDNN' if form == 'cudnn' else 'splash'} attention has no "
        f"attention-weight dropout (attention_dropout_rate={dropout_rate}); set "
        "--config.attention_dropout_rate=0, or use attention_impl=dense or blocksparse")


def _chunked(q, k, v, *, pattern, padding_mask, dropout_rate, dropout_seed):
    return chunked_attention(q, k, v, pattern, valid_BxKv=padding_mask,
                             dropout_rate=dropout_rate, dropout_seed=dropout_seed)


def _flatten(pattern: masks.Pattern) -> list[masks.Pattern]:
    if isinstance(pattern, masks.Intersection):
        return [p for part in pattern.parts for p in _flatten(part)]
    return [] if isinstance(pattern, masks.All) else [pattern]


def cudnn_mask(pattern: masks.Pattern) -> tuple[bool, int | None] | None:
    """(is_causal, left window) when `pattern` is one of cuDNN's own masks (all, causal,
    a causal band), else None (then a dense bias)."""
    parts = _flatten(pattern)
    causal = any(isinstance(p, masks.Causal) for p in parts)
    bands = [p for p in parts if isinstance(p, masks.Local)]
    if len(parts) != causal + len(bands) or len(bands) > 1:
        return None
    if not bands:
        return causal, None
    band = bands[0]
    if causal or band.after == 0:
        return True, band.before
    return None


def _cudnn(q, k, v, *, pattern, padding_mask, dropout_rate, dropout_seed):
    del dropout_seed
    if dropout_rate > 0:
        _refuse("cudnn", dropout_rate)
    b, _, q_len, _ = q.shape
    kv_len = k.shape[2]
    # JAX's cuDNN training rule counts a bias as present even when there is none, and
    # cuDNN takes no odd length with a bias: pad both lengths to even, the padded keys
    # beyond every row's key length, the padded queries dropped.
    pad_q, pad_k = q_len % 2, kv_len % 2
    own = cudnn_mask(pattern)
    kwargs = {}
    if own is None:
        allowed = np.pad(pattern.dense_np(q_len, kv_len),
                         [(0, 0)] * (pattern.num_heads is not None) + [(0, pad_q), (0, pad_k)])
        kwargs["mask"] = jnp.asarray(allowed[None, None] if allowed.ndim == 2 else allowed[None])
    else:
        is_causal, window = own
        if q_len != kv_len and is_causal:
            raise FlashError("attention_impl=flash (cuDNN): causal attention with fewer "
                             "queries than keys; the fused path is for training and prefill")
        kwargs["is_causal"] = is_causal
        if window is not None:
            kwargs["local_window_size"] = (window, 0)
    if padding_mask is not None:
        kwargs["key_value_seq_lengths"] = padding_mask.astype(jnp.int32).sum(-1)
    elif pad_k:
        kwargs["key_value_seq_lengths"] = jnp.full((b,), kv_len, jnp.int32)
    q = jnp.pad(q, [(0, 0), (0, 0), (0, pad_q), (0, 0)])
    k, v = (jnp.pad(x, [(0, 0), (0, 0), (0, pad_k), (0, 0)]) for x in (k, v))
    o = jax.nn.dot_product_attention(*(x.transpose(0, 2, 1, 3) for x in (q, k, v)),
                                     implementation="cudnn", **kwargs)
    return o.transpose(0, 2, 1, 3)[:, :, :q_len]


def splash_mask(pattern: masks.Pattern, length: int, num_heads: int):
    """`pattern` at `length` (a multiple of 128) as splash's MultiHeadMask."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    shape = (length, length)
    parts = _flatten(pattern)
    own = cudnn_mask(pattern)
    if not parts:
        head = sm.FullMask(shape)
    elif own is not None and own[1] is None:
        head = sm.CausalMask(shape)
    elif own is not None:
        head = sm.LocalMask(shape, window_size=(own[1], 0), offset=0)
    elif len(parts) == 1 and isinstance(parts[0], masks.Local):
        head = sm.LocalMask(shape, window_size=(parts[0].before, parts[0].after), offset=0)
    else:
        dense = pattern.dense_np(length, length)
        if dense.ndim == 3:
            return sm.MultiHeadMask([sm.NumpyMask(d) for d in dense])
        head = sm.NumpyMask(dense)
    return sm.MultiHeadMask([head] * num_heads)


def _splash_kernel(pattern: masks.Pattern, length: int, num_heads: int, interpret: bool):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    # Built per trace, not cached: a kernel made in one trace holds its block tables as
    # arrays, which a later trace captures as constants, and jax.export (JAX 0.10.2)
    # fails on those ("Too many leaves"). Building costs 0.05 s at 4K, 3 s at 16K.
    return sk.make_splash_mha(splash_mask(pattern, length, num_heads), head_shards=1,
                              q_seq_shards=1, interpret=interpret)


def _splash(q, k, v, *, pattern, padding_mask, dropout_rate, dropout_seed,
            interpret: bool = False):
    del dropout_seed
    if dropout_rate > 0:
        _refuse("splash", dropout_rate)
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    b, h, q_len, dk = q.shape
    kv_len = k.shape[2]
    if q_len != kv_len:
        raise FlashError("attention_impl=flash (splash): fewer queries than keys; the fused "
                         "path is for training and prefill")
    length = -(-q_len // _SPLASH_BLOCK) * _SPLASH_BLOCK
    # Padded positions (and padded keys): segment 0 for keys, every query in segment 1.
    keys_BxL = lax.broadcasted_iota(jnp.int32, (b, length), 1) < q_len  # (no constant)
    if padding_mask is not None:
        keys_BxL = keys_BxL & jnp.pad(padding_mask.astype(jnp.bool_),
                                      ((0, 0), (0, length - q_len)))
    pad = [(0, 0), (0, 0), (0, length - q_len), (0, 0)]
    # Splash scales nothing: the 1/sqrt(K) goes on the queries.
    q = q * jnp.asarray(1.0 / math.sqrt(dk), q.dtype)
    q, k, v = (jnp.pad(x, pad) for x in (q, k, v))

    def local(q, k, v, keys_BxL):
        segments = sk.SegmentIds(q=jnp.ones(keys_BxL.shape, jnp.int32),
                                 kv=keys_BxL.astype(jnp.int32))
        kernel = _splash_kernel(pattern, length, q.shape[1], interpret)
        return jax.vmap(kernel)(q, k, v, segment_ids=segments)

    # XLA cannot partition a Pallas call: each device runs splash on its batch rows (and
    # heads, for a pattern shared by the heads), as the block-sparse kernels do.
    axes = layers.mesh_axes(("batch", "act_heads" if pattern.num_heads is None else None),
                            (b, h))
    if axes is None:
        o = local(q, k, v, keys_BxL)
    else:
        spec = P(*axes, None, None)
        o = layers.manual_shards(local, (q, k, v, keys_BxL),
                                 (spec, spec, spec, P(axes[0], None)), spec, q)
    return o[:, :, :q_len].astype(v.dtype)


_FORMS = {"chunked": _chunked, "cudnn": _cudnn, "splash": _splash}

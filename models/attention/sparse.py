"""Position-based sparse attention: one module parameterised by a `models.masks` pattern.

`PatternAttention` is `MultiHeadAttention` (same query/key/value/out) whose softmax
is restricted to a pattern, computed either densely (`attention_impl="dense"`: the
full masked L x L softmax), block-sparsely (`"blocksparse"`: only the non-empty
blocks, `models.kernels.block_sparse_attention`; `"pallas"`: the same blocks through its
flash-attention kernels, interpreted on CPU; attention dropout by a hashed mask;
`"pallas_mosaic"`: as "pallas" with the forward as a Mosaic GPU kernel on a GPU,
`models.kernels.block_sparse_mgpu`, where it takes the call), or by the
platform's fused attention (`"flash"`: cuDNN on GPU, splash on TPU, an O(L)-memory chunked
form on CPU; `models.kernels.flash_attention`). The builders
below turn each paper's hyperparameters into a pattern; only `global` with extra
learned tokens, `longformer`'s global projections and `axial` in its two-pass form need
code of their own.

With causal=True every pattern is intersected with `masks.causal()`. The Sparse
Transformer patterns are not causal by themselves in a classifier (LRA forced them
causal: `lra_causal=True` reproduces that).
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers, masks, registry
from models.attention.dense import MultiHeadAttention, dot_product_attention
from models.kernels import block_sparse_attention
from models.kernels.flash_attention import flash_attention

IMPLS = ("dense", "blocksparse", "pallas", "pallas_mosaic", "flash")


class PatternAttention(MultiHeadAttention):
    """Multi-head attention restricted to `pattern` (& causal when causal=True)."""

    def __init__(self, *, pattern: masks.Pattern, dim: int, num_heads: int, causal: bool,
                 qkv_dim: int | None, attention_dropout: float, use_bias: bool,
                 attention_impl: str, block_size: int | None, rngs: nnx.Rngs,
                 prefix_len: int = 0, rotary: bool = False):
        super().__init__(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=use_bias,
                         rotary=rotary, rngs=rngs)
        if attention_impl not in IMPLS:
            raise registry.RegistryError(
                f"attention_impl={attention_impl!r} is not available for pattern attention; "
                f"valid: {', '.join(IMPLS)}")
        if pattern.num_heads not in (None, num_heads):
            raise registry.RegistryError(
                f"per-head pattern has {pattern.num_heads} heads, the model {num_heads}")
        # The pattern is stated for the content; the prefix (CLS) positions are global.
        pattern = masks.prefixed(pattern, prefix_len)
        self.pattern = pattern & masks.causal() if causal else pattern
        self.attention_impl = attention_impl
        self.block_size = block_size

    def attend(self, pattern: masks.Pattern, q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array,
               v_BxHxLxK: jax.Array, padding_mask: jax.Array | None,
               deterministic: bool) -> jax.Array:
        dropout_fn = self.dropout_fn(deterministic)
        if self.attention_impl == "flash":
            rate = 0.0 if deterministic else self.attention_dropout.rate
            seed = self.dropout_seed() if rate > 0 else None
            return flash_attention(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, pattern,
                                   padding_mask=padding_mask, dropout_rate=rate,
                                   dropout_seed=seed)
        if self.attention_impl in ("pallas", "pallas_mosaic"):
            # The kernels hash their own keep mask from one seed per call.
            rate = 0.0 if deterministic else self.attention_dropout.rate
            seed = self.dropout_seed() if rate > 0 else None
            return block_sparse_attention(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, pattern,
                                          padding_mask=padding_mask, backend="pallas",
                                          block_q=self.block_size, block_k=self.block_size,
                                          dropout_rate=rate, dropout_seed=seed,
                                          gpu_form="mosaic" if self.attention_impl
                                          == "pallas_mosaic" else "triton")
        if self.attention_impl == "blocksparse":
            return block_sparse_attention(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, pattern,
                                          padding_mask=padding_mask, block_q=self.block_size,
                                          block_k=self.block_size, dropout_fn=dropout_fn)
        seq_len = q_BxHxLxK.shape[2]
        allowed = pattern.dense(seq_len, seq_len)
        mask = allowed[None, None] if allowed.ndim == 2 else allowed[None]
        if padding_mask is not None:
            mask = mask & padding_mask.astype(jnp.bool_)[:, None, None, :]
        return dot_product_attention(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, mask=mask,
                                     dropout_fn=dropout_fn)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        q, k, v = self.project_qkv(x_BxLxD)
        o_BxHxLxK = self.attend(self.pattern, q, k, v, padding_mask, deterministic)
        return self.out(self.merge_heads(o_BxHxLxK))


class GlobalTokenAttention(PatternAttention):
    """Prepends `num_tokens` learned global tokens, attends, and drops them again."""

    def __init__(self, *, num_tokens: int, dim: int, rngs: nnx.Rngs, **kwargs):
        super().__init__(dim=dim, rngs=rngs, **kwargs)
        self.num_tokens = num_tokens
        self.global_embedding = layers.param(layers.normal(0.02), (None, "embed"),
                                             (num_tokens, dim), rngs=rngs)

    def __call__(self, x_BxLxD, padding_mask=None, deterministic=True):
        b, _, d = x_BxLxD.shape
        g = self.num_tokens
        g_BxGxD = jnp.broadcast_to(self.global_embedding[...][None].astype(x_BxLxD.dtype),
                                   (b, g, d))
        x_BxLxD = jnp.concatenate([g_BxGxD, x_BxLxD], axis=1)
        if padding_mask is not None:
            padding_mask = jnp.concatenate(
                [jnp.ones((b, g), jnp.bool_), padding_mask.astype(jnp.bool_)], axis=1)
        return super().__call__(x_BxLxD, padding_mask, deterministic)[:, g:]



def _fresh_copy(module: nnx.Module) -> nnx.Module:
    """A copy of `module` whose arrays are new buffers. nnx.clone shares the (immutable)
    arrays, and a state holding one buffer twice cannot be donated to a jitted step
    ("Attempt to donate the same buffer twice")."""
    graphdef, state = nnx.split(nnx.clone(module))
    return nnx.merge(graphdef, jax.tree.map(jnp.copy, state))

class LongformerAttention(PatternAttention):
    """Longformer (Beltagy et al. 2020, section 3.1): two sets of projections.

    The global rows (the first `num_global_rows` positions: the prefix (CLS) and the
    first num_global content positions) attend to every key with their own
    `query_global`, `key_global`, `value_global`; every other row attends by `pattern`
    (window, dilated on some heads, and the global keys) with `query`, `key`, `value`,
    also to the global keys. As the paper's code, the global projections start as
    copies of the local ones (separate parameters from then on). The global rows are few:
    they are computed densely; `attention_impl` (block-sparse, Pallas) computes the rest.
    With global_projections=False every row uses query/key/value (plain PatternAttention).
    """

    def __init__(self, *, num_global_rows: int, global_projections: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.num_global_rows = num_global_rows
        self.global_projections = global_projections
        if global_projections:
            self.query_global = _fresh_copy(self.query)
            self.key_global = _fresh_copy(self.key)
            self.value_global = _fresh_copy(self.value)

    def __call__(self, x_BxLxD, padding_mask=None, deterministic=True):
        q, k, v = self.project_qkv(x_BxLxD)
        o_BxHxLxK = self.attend(self.pattern, q, k, v, padding_mask, deterministic)
        seq_len = x_BxLxD.shape[1]
        g = min(self.num_global_rows, seq_len)
        if self.global_projections and g > 0:
            q_BxHxGxK = self.rotate(self.split_heads(self.query_global(x_BxLxD[:, :g])))
            k_BxHxLxK = self.rotate(self.split_heads(self.key_global(x_BxLxD)))
            v_BxHxLxK = self.split_heads(self.value_global(x_BxLxD))
            # The pattern's own rows for these positions (every key; & causal if causal).
            allowed = self.pattern.mask(jnp.arange(g)[:, None], jnp.arange(seq_len)[None],
                                        jnp)
            if self.pattern.num_heads is None:
                mask = jnp.broadcast_to(allowed, (g, seq_len))[None, None]
            else:
                mask = jnp.broadcast_to(allowed, (self.num_heads, g, seq_len))[None]
            if padding_mask is not None:
                mask = mask & padding_mask.astype(jnp.bool_)[:, None, None, :]
            o_BxHxGxK = dot_product_attention(q_BxHxGxK, k_BxHxLxK, v_BxHxLxK, mask=mask,
                                              dropout_fn=self.dropout_fn(deterministic))
            o_BxHxLxK = jnp.concatenate([o_BxHxGxK.astype(o_BxHxLxK.dtype),
                                         o_BxHxLxK[:, :, g:]], axis=2)
        return self.out(self.merge_heads(o_BxHxLxK))


@dataclasses.dataclass(frozen=True)
class _ApartFromPrefix(masks.Pattern):
    """Content positions see content only; a prefix position sees only itself."""

    prefix: int

    def _mask(self, i, j, xp):
        return ((i >= self.prefix) & (j >= self.prefix)) | (i == j)


class AxialSumAttention(PatternAttention):
    """Axial attention as two passes (row softmax, column softmax) over the same
    projections, summed: each position mixes its row and its column.

    A CLS slot (prefix_len) takes part in the row pass only: there it sees, and is seen by,
    every position. Global in both passes, its value would be added twice to every
    position (once per softmax) and its own output would be the sum of two identical
    full-attention passes."""

    def __init__(self, *, width: int, prefix_len: int = 0, **kwargs):
        # `pattern` (which positions reach which) is the union of the passes.
        super().__init__(pattern=masks.axial(width, 0) | masks.axial(width, 1),
                         prefix_len=prefix_len, **kwargs)
        rows = masks.prefixed(masks.axial(width, 0), prefix_len)
        columns = masks.axial(width, 1)
        if prefix_len:
            columns = masks.prefixed(columns, prefix_len) & _ApartFromPrefix(prefix_len)
        self.passes = (rows, columns)
        self.prefix_len = prefix_len

    def __call__(self, x_BxLxD, padding_mask=None, deterministic=True):
        q, k, v = self.project_qkv(x_BxLxD)
        rows, columns = (self.attend(p, q, k, v, padding_mask, deterministic)
                         for p in self.passes)
        if self.prefix_len:  # the prefix rows of the column pass saw only themselves
            content_L = jnp.arange(columns.shape[2]) >= self.prefix_len
            columns = columns * content_L[:, None].astype(columns.dtype)
        return self.out(self.merge_heads(rows + columns))


# ----------------------------------------------------------------------------------
# `transformer` lives here, not in dense.py: its block-sparse and Pallas forms are the
# full pattern through PatternAttention (and dense.py must not import this module).


@registry.register("transformer", capabilities=registry.Capabilities(
    description="softmax multi-head attention over all positions (the reference)",
    causal=True, padding=True, variable_length=True, dense_equivalent={}, rotary=True,
    decode="kv_cache"))
def build_transformer(*, dim: int, num_heads: int, max_len: int, causal: bool,
                      rngs: nnx.Rngs, rotary: bool = False, qkv_dim: int | None = None,
                      attention_dropout: float = 0.1, use_bias: bool = True,
                      attention_impl: str = "dense") -> MultiHeadAttention:
    del max_len  # any length works
    if attention_impl in ("blocksparse", "pallas", "pallas_mosaic", "flash"):  # full pattern
        # pallas: the kernel's own default tile (64 on GPU, 128 on TPU); flash: the fused
        # attention of the platform (models/kernels/flash_attention.py).
        return PatternAttention(pattern=masks.all_(), dim=dim, num_heads=num_heads,
                                causal=causal, qkv_dim=qkv_dim,
                                attention_dropout=attention_dropout, use_bias=use_bias,
                                attention_impl=attention_impl,
                                block_size=64 if attention_impl == "blocksparse" else None,
                                rotary=rotary, rngs=rngs)
    if attention_impl != "dense":
        raise registry.RegistryError(
            f"transformer: attention_impl={attention_impl!r} is not available; use 'dense', "
            "'blocksparse', 'pallas' or 'flash'")
    return MultiHeadAttention(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                              attention_dropout=attention_dropout, use_bias=use_bias,
                              rotary=rotary, rngs=rngs)


# ----------------------------------------------------------------------------------
# Builders: the paper's hyperparameters -> a pattern.

def _common(dim, num_heads, causal, rngs, qkv_dim, attention_dropout, use_bias,
            attention_impl, block_size, prefix_len, rotary):
    return dict(dim=dim, num_heads=num_heads, causal=causal, rngs=rngs, qkv_dim=qkv_dim,
                attention_dropout=attention_dropout, use_bias=use_bias,
                attention_impl=attention_impl, block_size=block_size,
                prefix_len=prefix_len, rotary=rotary)


def _caps(description: str, *, causal: bool, test_hparams: dict,
          dense_equivalent: dict | None, dense_form: tuple[str, ...] = ()
          ) -> registry.Capabilities:
    # Every pattern variant rotates the q, k of its (masked) products under rotary.
    return registry.Capabilities(description=description, causal=causal, padding=True,
                                 variable_length=True, dense_equivalent=dense_equivalent,
                                 dense_form=dense_form, test_hparams=test_hparams,
                                 receptive_field="pattern", rotary=True,
                                 decode="kv_cache" if causal else "")


def _build(pattern, *, causal, **common):
    return PatternAttention(pattern=pattern, causal=causal, **common)


@registry.register("local", capabilities=_caps(
    "sliding-window attention |i-j| <= window", causal=True,
    test_hparams=dict(window=2, block_size=4), dense_equivalent=dict(window=16)))
def build_local(*, dim, num_heads, max_len, causal, rngs, rotary: bool = False, prefix_len=0,
                window: int = 128,
                qkv_dim=None, attention_dropout=0.1, use_bias=True,
                attention_impl="dense", block_size=64):
    del max_len
    return _build(masks.local(window), **_common(
        dim, num_heads, causal, rngs, qkv_dim, attention_dropout, use_bias, attention_impl,
        block_size, prefix_len, rotary))


def _head_split(a: masks.Pattern, b: masks.Pattern, heads: str,
                num_heads: int) -> masks.Pattern:
    if heads == "union":
        return a | b
    if heads == "split":
        return masks.per_head([a, b], num_heads)
    raise registry.RegistryError(f"heads must be 'union' or 'split', got {heads!r}")


@registry.register("strided", capabilities=_caps(
    "Sparse Transformer strided: A1 (previous stride; both sides when not causal) and A2 "
    "(every stride-th), union or split over heads", causal=True,
    test_hparams=dict(stride=4, heads="split", block_size=4),
    dense_equivalent=dict(stride=1, heads="union")))
def build_strided(*, dim, num_heads, max_len, causal, rngs, rotary: bool = False,
                  prefix_len=0, stride: int | None = None,
                  heads: str = "union", lra_causal: bool = False, qkv_dim=None,
                  attention_dropout=0.1, use_bias=True, attention_impl="dense",
                  block_size=64):
    stride = stride or max(1, round(math.sqrt(max_len - prefix_len)))  # l ~ sqrt(n)
    # A2 is two-sided; A1 is the paper's {i-l, ..., i} when causal (or LRA's forced
    # causal), and its bidirectional form {i-l, ..., i+l} in a non-causal classifier.
    a1 = masks.sparse_a1(stride, two_sided=not (causal or lra_causal))
    pattern = _head_split(a1, masks.strided(stride), heads, num_heads)
    return _build(pattern, **_common(dim, num_heads, causal or lra_causal, rngs, qkv_dim,
                                     attention_dropout, use_bias, attention_impl,
                                     block_size, prefix_len, rotary))


@registry.register("fixed", capabilities=_caps(
    "Sparse Transformer fixed: own block (A1) and the last c of every block (A2)",
    causal=True, test_hparams=dict(block=4, c=1, heads="split", block_size=4),
    dense_equivalent=dict(block=16, c=1, heads="union")))
def build_fixed(*, dim, num_heads, max_len, causal, rngs, rotary: bool = False,
                prefix_len=0, block: int = 128, c: int = 8,
                heads: str = "union", lra_causal: bool = False, qkv_dim=None,
                attention_dropout=0.1, use_bias=True, attention_impl="dense",
                block_size=64):
    del max_len
    masks.fixed(block, c)  # validates
    pattern = _head_split(masks.SameBlock(block), masks.Summary(block, c), heads, num_heads)
    return _build(pattern, **_common(dim, num_heads, causal or lra_causal, rngs, qkv_dim,
                                     attention_dropout, use_bias, attention_impl,
                                     block_size, prefix_len, rotary))


@registry.register("dilated", capabilities=_caps(
    "dilated window: j = i + k*dilation for |k| <= window", causal=True,
    test_hparams=dict(window=2, dilation=2, block_size=4),
    dense_equivalent=dict(window=16, dilation=1)))
def build_dilated(*, dim, num_heads, max_len, causal, rngs, rotary: bool = False,
                  prefix_len=0, window: int = 64,
                  dilation: int = 2, qkv_dim=None, attention_dropout=0.1, use_bias=True,
                  attention_impl="dense", block_size=64):
    del max_len
    return _build(masks.dilated(window, dilation), **_common(
        dim, num_heads, causal, rngs, qkv_dim, attention_dropout, use_bias, attention_impl,
        block_size, prefix_len, rotary))


@registry.register("global", capabilities=_caps(
    "global tokens attend to and are attended by all: the first num_global content "
    "positions (and the CLS slot) or extra learned tokens", causal=False,
    test_hparams=dict(num_global=2, block_size=4),
    dense_equivalent=dict(num_global=16, extra_tokens=False)))
def build_global(*, dim, num_heads, max_len, causal, rngs, rotary: bool = False,
                 prefix_len=0, num_global: int = 1,
                 extra_tokens: bool = False, qkv_dim=None, attention_dropout=0.1,
                 use_bias=True, attention_impl="dense", block_size=64):
    del max_len
    common = _common(dim, num_heads, causal, rngs, qkv_dim, attention_dropout, use_bias,
                     attention_impl, block_size, prefix_len, rotary)
    if extra_tokens:
        # The learned tokens go before everything: they and the prefix are global, and
        # every content token sees itself, so no row is empty.
        common["prefix_len"] = num_global + prefix_len
        return GlobalTokenAttention(num_tokens=num_global, pattern=masks.local(0), **common)
    # Every token also sees itself, so no row is empty.
    return _build(masks.global_tokens(range(num_global)) | masks.local(0), **common)


@registry.register("random", capabilities=_caps(
    "each query attends to itself and exactly num_random other random keys (seeded, "
    "Floyd's sampling per row)",
    causal=True, test_hparams=dict(num_random=4, block_size=4),
    dense_equivalent=dict(num_random=16)))
def build_random(*, dim, num_heads, max_len, causal, rngs, rotary: bool = False,
                 prefix_len=0, num_random: int = 8,
                 seed: int = 0, qkv_dim=None, attention_dropout=0.1, use_bias=True,
                 attention_impl="dense", block_size=64):
    # Every row: itself and exactly num_random distinct other keys, drawn (uniformly, per
    # row) from the max_len - prefix_len content positions, so that a shorter input sees
    # the same pattern (keys past its end are absent). Under causal they are drawn from
    # the keys before the row (row i: min(num_random, i) of them), not drawn from all and
    # then masked, which would leave row i about num_random * i / L.
    pattern = (masks.random(num_keys=num_random, kv_len=max_len - prefix_len, seed=seed,
                            skip_window=0, causal=causal)
               | masks.local(0))
    return _build(pattern, **_common(dim, num_heads, causal, rngs, qkv_dim,
                                     attention_dropout, use_bias, attention_impl,
                                     block_size, prefix_len, rotary))


@registry.register("block_local", capabilities=_caps(
    "Image Transformer 1D: query blocks see their block plus `memory` preceding positions",
    causal=True, test_hparams=dict(block=4, memory=2, block_size=4),
    dense_equivalent=dict(block=16, memory=0)))
def build_block_local(*, dim, num_heads, max_len, causal, rngs, rotary: bool = False,
                      prefix_len=0, block: int = 128,
                      memory: int = 128, qkv_dim=None, attention_dropout=0.1,
                      use_bias=True, attention_impl="dense", block_size=64):
    del max_len
    return _build(masks.block_local(block, memory), **_common(
        dim, num_heads, causal, rngs, qkv_dim, attention_dropout, use_bias, attention_impl,
        block_size, prefix_len, rotary))


def _width(width: int | None, max_len: int) -> int:
    return width or max(1, math.isqrt(max_len - 1) + 1)  # ceil(sqrt(max_len))


@registry.register("local_2d", capabilities=_caps(
    "Image Transformer 2D: query rectangles on the raster with a memory flange "
    "up, left and right", causal=True,
    test_hparams=dict(width=4, query_height=2, query_width=2, flange_height=1,
                      flange_width=1, block_size=4),
    dense_equivalent=dict(width=4, query_height=4, query_width=4, flange_height=0,
                          flange_width=0)))
def build_local_2d(*, dim, num_heads, max_len, causal, rngs, rotary: bool = False,
                   prefix_len=0, width: int | None = None,
                   query_height: int = 8, query_width: int = 16, flange_height: int = 8,
                   flange_width: int = 8, qkv_dim=None, attention_dropout=0.1,
                   use_bias=True, attention_impl="dense", block_size=64):
    # The raster is the content's: the CLS slot (prefix) is a global token, not a pixel.
    pattern = masks.local_2d(_width(width, max_len - prefix_len), (query_height, query_width),
                             (flange_height, flange_width))
    return _build(pattern, **_common(dim, num_heads, causal, rngs, qkv_dim,
                                     attention_dropout, use_bias, attention_impl,
                                     block_size, prefix_len, rotary))


@registry.register("longformer", capabilities=_caps(
    "Longformer: sliding window (dilated on some heads) plus global tokens, whose rows "
    "use their own query/key/value projections", causal=False,
    test_hparams=dict(window=2, num_global=1, dilation=2, dilated_heads=1, block_size=4),
    dense_equivalent=dict(window=16, dilation=1, global_projections=False),
    dense_form=("global_projections",)))
def build_longformer(*, dim, num_heads, max_len, causal, rngs, rotary: bool = False,
                     prefix_len=0, window: int = 256,
                     num_global: int = 1, dilation: int = 1, dilated_heads: int = 0,
                     global_projections: bool = True, qkv_dim=None, attention_dropout=0.1,
                     use_bias=True, attention_impl="dense", block_size=64):
    del max_len
    if not 0 <= dilated_heads <= num_heads:
        raise registry.RegistryError(f"dilated_heads must be in [0, {num_heads}]")
    glob = masks.global_tokens(range(num_global))
    plain, dilated = masks.local(window), masks.dilated(window, dilation)
    if dilated_heads and dilation > 1:
        pattern = masks.per_head([dilated] * dilated_heads
                                 + [plain] * (num_heads - dilated_heads)) | glob
    else:
        pattern = plain | glob
    # The global tokens: the prefix (CLS) and the first num_global content positions.
    return LongformerAttention(
        pattern=pattern, num_global_rows=prefix_len + num_global,
        global_projections=global_projections, **_common(
            dim, num_heads, causal, rngs, qkv_dim, attention_dropout, use_bias,
            attention_impl, block_size, prefix_len, rotary))


@registry.register("bigbird", capabilities=_caps(
    "BigBird ITC: window of 3 blocks, num_global_blocks global blocks (first and last), "
    "num_random_blocks random blocks per block row outside window and globals",
    causal=False,
    test_hparams=dict(block=4, num_random_blocks=1, num_global_blocks=1, block_size=4),
    dense_equivalent=dict(block=16)))
def build_bigbird(*, dim, num_heads, max_len, causal, rngs, rotary: bool = False,
                  prefix_len=0, block: int = 64,
                  num_random_blocks: int = 3, num_global_blocks: int = 2, seed: int = 0,
                  qkv_dim=None, attention_dropout=0.1, use_bias=True,
                  attention_impl="dense", block_size: int | None = None):
    # Blocks of the content (max_len - prefix_len positions, as the reference's padded
    # length): the first ceil(g/2) and the last floor(g/2) blocks are global.
    pattern = masks.bigbird(block, max_len - prefix_len, num_global_blocks=num_global_blocks,
                            num_random_blocks=num_random_blocks, seed=seed)
    # The pattern is made of `block` tiles, so the kernel uses them by default.
    return _build(pattern, **_common(dim, num_heads, causal, rngs, qkv_dim,
                                     attention_dropout, use_bias, attention_impl,
                                     block_size or block, prefix_len, rotary))


@registry.register("axial", capabilities=_caps(
    "axial attention on a raster of `width` columns: row and column passes summed, "
    "or heads split between rows and columns", causal=False,
    test_hparams=dict(width=4, block_size=4), dense_equivalent=None))
def build_axial(*, dim, num_heads, max_len, causal, rngs, rotary: bool = False,
                prefix_len=0, width: int | None = None,
                mode: str = "sum", qkv_dim=None, attention_dropout=0.1, use_bias=True,
                attention_impl="dense", block_size=64):
    width = _width(width, max_len - prefix_len)  # the content's raster, not the CLS slot
    common = _common(dim, num_heads, causal, rngs, qkv_dim, attention_dropout, use_bias,
                     attention_impl, block_size, prefix_len, rotary)
    if mode == "sum":
        return AxialSumAttention(width=width, **common)
    if mode == "split":
        return _build(masks.per_head([masks.axial(width, 0), masks.axial(width, 1)],
                                     num_heads), **common)
    raise registry.RegistryError(f"axial: mode must be 'sum' or 'split', got {mode!r}")


# ----------------------------------------------------------------------------------
# Star-Transformer: not one mask (an extra relay node, updated in turns).


class StarAttention(MultiHeadAttention):
    """Star-Transformer (Guo et al. 2019), `cycles` rounds with shared weights.

    Satellite i attends to [h_{i-1}, h_i, h_{i+1}, e_i, s] (ring neighbours, wrapping
    within the real tokens, its input embedding e_i and the relay s); then the relay
    attends to [s, h_1..h_n]. Each update is followed by LayerNorm(ReLU(.)), as in the
    paper; h^0 = e, s^0 = mean of the real e. The satellites use query/key/value/out,
    the relay its own projections. Padding is assumed at the end (as the loaders pad).

    rotary: a satellite's query and its context keys are rotated by their own positions
    (the ring's wrap-around neighbour keeps its true position, n-1 or 0), its embedding
    key e_i by i, and the relay's key by the query's own position i: the relay is
    everywhere at once, so its score does not depend on i. The relay's own attention
    (its query has no position) is not rotated.
    """

    def __init__(self, *, dim: int, num_heads: int, cycles: int, qkv_dim: int | None,
                 attention_dropout: float, use_bias: bool, rotary: bool, rngs: nnx.Rngs):
        super().__init__(dim=dim, num_heads=num_heads, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=use_bias,
                         rotary=rotary, rngs=rngs)
        if cycles < 1:
            raise registry.RegistryError(f"star: cycles must be >= 1, got {cycles}")
        self.cycles = cycles
        self.relay = MultiHeadAttention(dim=dim, num_heads=num_heads, qkv_dim=qkv_dim,
                                        attention_dropout=attention_dropout,
                                        use_bias=use_bias, rngs=rngs)
        self.satellite_norm = layers.layer_norm(dim, rngs=rngs)
        self.relay_norm = layers.layer_norm(dim, rngs=rngs)

    def __call__(self, x_BxLxD, padding_mask=None, deterministic=True):
        b, length, _ = x_BxLxD.shape
        real_BxL = layers.valid_mask(padding_mask, b, length)
        n_Bx1 = jnp.maximum(real_BxL.sum(-1, keepdims=True), 1)
        pos_1xL = jnp.arange(length)[None]
        prev_BxL = jnp.where(pos_1xL == 0, n_Bx1 - 1, pos_1xL - 1)
        next_BxL = jnp.where(pos_1xL >= n_Bx1 - 1, 0, pos_1xL + 1)
        dropout_fn = self.dropout_fn(deterministic)

        def neighbour(t_BxHxLxK, idx_BxL):
            return jnp.take_along_axis(t_BxHxLxK, idx_BxL[:, None, :, None], axis=2)

        e_BxLxD = x_BxLxD
        h_BxLxD = x_BxLxD
        s_Bx1xD = ((x_BxLxD * real_BxL[..., None]).sum(1, keepdims=True)
                   / n_Bx1[..., None].astype(x_BxLxD.dtype))
        ke = self.rotate(self.split_heads(self.key(e_BxLxD)))
        ve = self.split_heads(self.value(e_BxLxD))
        for _ in range(self.cycles):
            q, kh, vh = self.project_qkv(h_BxLxD)
            ks, vs = self.split_heads(self.key(s_Bx1xD)), self.split_heads(self.value(s_Bx1xD))
            ks, vs = (jnp.broadcast_to(t, kh.shape) for t in (ks, vs))
            ks = self.rotate(ks)  # at each query's own position: offset 0
            # The 5 context keys of every satellite: B x H x L x 5 x K.
            k5 = jnp.stack([neighbour(kh, prev_BxL), kh, neighbour(kh, next_BxL), ke, ks], 3)
            v5 = jnp.stack([neighbour(vh, prev_BxL), vh, neighbour(vh, next_BxL), ve, vs], 3)
            logits = jnp.einsum("bhlk,bhlck->bhlc", q, k5,
                                preferred_element_type=jnp.float32) / math.sqrt(q.shape[-1])
            weights = jax.nn.softmax(logits, axis=-1)
            if dropout_fn is not None:
                weights = dropout_fn(weights)
            o = jnp.einsum("bhlc,bhlck->bhlk", weights.astype(v5.dtype), v5)
            h_BxLxD = self.satellite_norm(jax.nn.relu(self.out(self.merge_heads(o))))
            # Relay: attends to itself and the real satellites.
            hs_BxLxD = jnp.concatenate([s_Bx1xD, h_BxLxD], axis=1)
            q_s, k_s, v_s = self.relay.project_qkv(hs_BxLxD)
            mask = jnp.concatenate([jnp.ones((b, 1), jnp.bool_), real_BxL], 1)
            o_s = dot_product_attention(q_s[:, :, :1], k_s, v_s,
                                        mask=mask[:, None, None, :], dropout_fn=dropout_fn)
            s_Bx1xD = self.relay_norm(jax.nn.relu(self.relay.out(self.relay.merge_heads(o_s))))
        return h_BxLxD


@registry.register("star", capabilities=registry.Capabilities(
    description="Star-Transformer: ring neighbours, own embedding and a relay node that "
    "attends to all", causal=False, padding=True, variable_length=True, rotary=True,
    test_hparams=dict(cycles=2)))  # global: every satellite reaches the relay
def build_star(*, dim, num_heads, max_len, causal, rngs, rotary: bool = False,
               cycles: int = 2, qkv_dim=None, attention_dropout=0.1, use_bias=True):
    del max_len, causal  # any length; causal=True is refused by the registry
    return StarAttention(dim=dim, num_heads=num_heads, cycles=cycles, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=use_bias,
                         rotary=rotary, rngs=rngs)

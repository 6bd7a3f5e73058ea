"""Attention patterns as data: which key positions each query position may see.

A pattern is a frozen (hashable) dataclass, so it can be a static argument of a
jitted function. Every pattern is a predicate on (query position i, key position j)
evaluated by broadcasting integer arrays, so

    pattern.dense(q_len, kv_len)            -> bool [q, kv]   ([H, q, kv] for per_head)
    pattern.blocks(q_len, kv_len, bq, bk)   -> BlockLayout (numpy, on the host)

are built without Python loops over positions, and the same predicate evaluated on
gathered tiles gives the element mask of the block-sparse kernel. Patterns compose
with `|` (union), `&` (intersection) and `per_head([...])` (head h uses pattern
h mod len). As in `models.attention.dense.make_attention_mask`, the queries are the
last q_len of the kv_len positions (query index i is position i + kv_len - q_len).

The sets follow the papers (seeds/001, seeds/004): Sparse Transformer strided
A1 = {max(0, i-l), ..., i} (`sparse_a1`; `sparse_a1(l, two_sided=True)` is its
bidirectional form {i-l, ..., i+l} for non-causal classifiers), A2 = {j : (i-j) mod l ==
0}; fixed A1 = {j : floor(j/l) == floor(i/l)}, A2 = {j : j mod l in {l-c, ..., l-1}}; none
is forced causal (combine with `causal()` for that).

Random keys come in two forms: `random(rate)` keeps each (block x block) tile
independently with probability `rate` (a density, e.g. for kernel benchmarks), and
`random(num_keys=r, kv_len=n)` gives every row (block row) EXACTLY r distinct key
(blocks) out of the n positions (ceil(n / block) blocks), uniformly at random: Floyd's
algorithm run elementwise on the row index (r steps), still a pure predicate of (i, j).
Its candidates can leave out a window around the row's block and blocks at the ends
(BigBird draws its random blocks outside the window and the global blocks).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

Array = Any  # numpy or jax array: predicates run on both (xp is the array module)

EMPTY, PARTIAL, FULL = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class BlockLayout:
    """Block structure of a pattern for (bq x bk) tiles; padding past the ends is empty.

    `layout` int8 [nq, nk] (or [H, nq, nk]): 0 empty, 1 partial, 2 full.
    `kv_indices` int32 [..., nq, max_nonempty]: the non-empty kv blocks of each query block
    in increasing order, padded with the last valid index (0 for an empty row).
    `kv_counts` int32 [..., nq]: how many entries of `kv_indices` are real.
    """

    layout: np.ndarray
    kv_indices: np.ndarray
    kv_counts: np.ndarray
    block_q: int
    block_k: int

    @property
    def num_nonempty(self) -> int:
        return int(self.kv_counts.sum())


class Pattern:
    """Base: subclasses define `_mask(i, j, xp)` on broadcastable int arrays."""

    num_heads: int | None = None  # set by per_head patterns

    def _mask(self, i: Array, j: Array, xp: Any) -> Array:
        raise NotImplementedError

    def mask(self, q_pos: Array, k_pos: Array, xp: Any = jnp) -> Array:
        """Bool predicate on broadcastable absolute positions (a leading H axis if per_head)."""
        return self._mask(q_pos, k_pos, xp)

    def dense(self, q_len: int, kv_len: int) -> jnp.ndarray:
        """bool [q_len, kv_len] ([H, q_len, kv_len] for per_head), True = attend."""
        return _dense(self, q_len, kv_len, jnp)

    def dense_np(self, q_len: int, kv_len: int) -> np.ndarray:
        """`dense` computed on the host with numpy."""
        return np.asarray(_dense(self, q_len, kv_len, np))

    def blocks(self, q_len: int, kv_len: int, block_q: int, block_k: int) -> BlockLayout:
        return _blocks(self, q_len, kv_len, block_q, block_k)

    def __or__(self, other: Pattern) -> Pattern:
        return Union((self, other))

    def __and__(self, other: Pattern) -> Pattern:
        return Intersection((self, other))


def _dense(pattern: Pattern, q_len: int, kv_len: int, xp: Any) -> Array:
    offset = kv_len - q_len
    i = xp.arange(q_len, dtype=xp.int32)[:, None] + offset
    j = xp.arange(kv_len, dtype=xp.int32)[None, :]
    shape = (q_len, kv_len) if pattern.num_heads is None else (pattern.num_heads, q_len,
                                                                 kv_len)
    return xp.broadcast_to(pattern.mask(i, j, xp), shape)


# Host layouts are recomputed for every trace otherwise; patterns are hashable.
@functools.lru_cache(maxsize=256)
def _blocks(pattern: Pattern, q_len: int, kv_len: int, bq: int, bk: int) -> BlockLayout:
    if min(q_len, kv_len, bq, bk) <= 0:
        raise ValueError(f"lengths and block sizes must be positive, got "
                         f"{(q_len, kv_len, bq, bk)}")
    nq, nk = -(-q_len // bq), -(-kv_len // bk)
    offset = kv_len - q_len
    q_idx = np.arange(nq * bq, dtype=np.int64)
    k_idx = np.arange(nk * bk, dtype=np.int64)
    q_valid = (q_idx < q_len).reshape(nq, bq, 1, 1)
    k_valid = (k_idx < kv_len)[None, :]
    # Row chunks bound the host memory to ~16M booleans at a time.
    rows = max(1, (1 << 24) // (bq * nk * bk))
    layouts = []
    for start in range(0, nq, rows):
        stop = min(nq, start + rows)
        i = q_idx[start * bq:stop * bq, None] + offset
        m = np.asarray(pattern.mask(i, k_idx[None, :], np)) & k_valid
        m = m.reshape(m.shape[:-2] + (stop - start, bq, nk, bk))
        valid = q_valid[start:stop]
        # Padded query rows neither make a block non-empty nor keep it from being full.
        any_ = (m & valid).any(axis=(-3, -1))
        all_ = (m | ~valid).all(axis=(-3, -1))
        layouts.append(np.where(all_, FULL, np.where(any_, PARTIAL, EMPTY)).astype(np.int8))
    layout = np.concatenate(layouts, axis=-2)
    nonempty = layout != EMPTY
    counts = nonempty.sum(-1).astype(np.int32)
    width = max(1, int(counts.max()))
    # Stable sort puts the non-empty block indices first, in increasing order.
    order = np.argsort(~nonempty, axis=-1, kind="stable")[..., :width].astype(np.int32)
    slot = np.arange(width)
    last = np.take_along_axis(order, np.maximum(counts - 1, 0)[..., None], axis=-1)
    kv_indices = np.where(slot < counts[..., None], order, np.where(counts[..., None] > 0,
                                                                     last, 0))
    return BlockLayout(layout, kv_indices.astype(np.int32), counts, bq, bk)


# ----------------------------------------------------------------------------------
# Composition.


@dataclasses.dataclass(frozen=True)
class Union(Pattern):
    parts: tuple[Pattern, ...]

    @property
    def num_heads(self) -> int | None:
        return _heads(self.parts)

    def _mask(self, i, j, xp):
        return functools.reduce(lambda a, b: a | b, (p.mask(i, j, xp) for p in self.parts))


@dataclasses.dataclass(frozen=True)
class Intersection(Pattern):
    parts: tuple[Pattern, ...]

    @property
    def num_heads(self) -> int | None:
        return _heads(self.parts)

    def _mask(self, i, j, xp):
        return functools.reduce(lambda a, b: a & b, (p.mask(i, j, xp) for p in self.parts))


@dataclasses.dataclass(frozen=True)
class Prefixed(Pattern):
    """`pattern` over the positions after the first `prefix` (in their own coordinates,
    counted from 0), and the first `prefix` positions global (they see, and are seen
    by, every position).

    The encoder puts a CLS token before the content; a pattern stated for the content
    (a window, a 2-D raster) must not be shifted by it, and the CLS slot is a summary
    token of its own (global, as Longformer and BigBird treat it), never a pixel.
    """

    pattern: Pattern
    prefix: int

    @property
    def num_heads(self) -> int | None:
        return self.pattern.num_heads

    def _mask(self, i, j, xp):
        n = self.prefix
        return self.pattern.mask(i - n, j - n, xp) | (i < n) | (j < n)


def prefixed(pattern: Pattern, prefix: int) -> Pattern:
    """`pattern` on the content after `prefix` global positions (`prefix` 0: unchanged)."""
    _check(prefix=prefix)
    return pattern if prefix == 0 else Prefixed(pattern, int(prefix))


def _heads(parts: Sequence[Pattern]) -> int | None:
    heads = {p.num_heads for p in parts} - {None}
    if len(heads) > 1:
        raise ValueError(f"cannot combine per-head patterns with different head counts "
                         f"{sorted(heads)}")
    return heads.pop() if heads else None


@dataclasses.dataclass(frozen=True)
class PerHead(Pattern):
    """Head h uses patterns[h]; the mask gets a leading head axis."""

    patterns: tuple[Pattern, ...]

    def __post_init__(self):
        if not self.patterns or any(p.num_heads is not None for p in self.patterns):
            raise ValueError("per_head takes a non-empty list of shared (not per-head) "
                             "patterns")

    @property
    def num_heads(self) -> int:
        return len(self.patterns)

    def _mask(self, i, j, xp):
        shape = xp.broadcast_shapes(np.shape(i), np.shape(j))
        return xp.stack([xp.broadcast_to(p.mask(i, j, xp), shape) for p in self.patterns])


def per_head(patterns: Sequence[Pattern], num_heads: int | None = None) -> Pattern:
    """Head h attends with patterns[h % len(patterns)]; num_heads defaults to len(patterns)."""
    patterns = tuple(patterns)
    num_heads = len(patterns) if num_heads is None else num_heads
    return PerHead(tuple(patterns[h % len(patterns)] for h in range(num_heads)))


# ----------------------------------------------------------------------------------
# Primitives.


@dataclasses.dataclass(frozen=True)
class All(Pattern):
    def _mask(self, i, j, xp):
        return xp.ones(xp.broadcast_shapes(np.shape(i), np.shape(j)), bool)


@dataclasses.dataclass(frozen=True)
class Causal(Pattern):
    def _mask(self, i, j, xp):
        return j <= i


@dataclasses.dataclass(frozen=True)
class Local(Pattern):
    """Band: i - before <= j <= i + after."""

    before: int
    after: int

    def _mask(self, i, j, xp):
        return (j >= i - self.before) & (j <= i + self.after)


@dataclasses.dataclass(frozen=True)
class Strided(Pattern):
    """Sparse Transformer A2: (i - j) mod stride == 0 (both directions)."""

    stride: int

    def _mask(self, i, j, xp):
        return (i - j) % self.stride == 0


@dataclasses.dataclass(frozen=True)
class SameBlock(Pattern):
    """floor(i/block) and floor(j/block) differ by at most `radius` blocks."""

    block: int
    radius: int = 0

    def _mask(self, i, j, xp):
        return xp.abs(i // self.block - j // self.block) <= self.radius


@dataclasses.dataclass(frozen=True)
class Summary(Pattern):
    """Sparse Transformer fixed A2: j mod block in {block - c, ..., block - 1}."""

    block: int
    c: int

    def _mask(self, i, j, xp):
        return xp.broadcast_to(j % self.block >= self.block - self.c,
                               xp.broadcast_shapes(np.shape(i), np.shape(j)))


@dataclasses.dataclass(frozen=True)
class Dilated(Pattern):
    """j = i + k * dilation for |k| <= window."""

    window: int
    dilation: int

    def _mask(self, i, j, xp):
        d = i - j
        return (xp.abs(d) <= self.window * self.dilation) & (d % self.dilation == 0)


@dataclasses.dataclass(frozen=True)
class Global(Pattern):
    """Tokens in `idx` attend to all positions and are attended by all."""

    idx: tuple[int, ...]

    def _mask(self, i, j, xp):
        shape = xp.broadcast_shapes(np.shape(i), np.shape(j))
        out = xp.zeros(shape, bool)
        for g in self.idx:  # a loop over the few global tokens, not over positions
            out = out | (i == g) | (j == g)
        return out


@dataclasses.dataclass(frozen=True)
class GlobalRange(Pattern):
    """Positions start <= g < stop attend to all positions and are attended by all
    (a contiguous run of global tokens, e.g. BigBird's global blocks)."""

    start: int
    stop: int

    def _mask(self, i, j, xp):
        return ((i >= self.start) & (i < self.stop)) | ((j >= self.start) & (j < self.stop))


def _fmix32(h, xp):
    """murmur3's finaliser on uint32: every input bit reaches every output bit."""
    u32 = xp.uint32
    h = h ^ (h >> u32(16))
    h = h * u32(0x85EBCA6B)
    h = h ^ (h >> u32(13))
    h = h * u32(0xC2B2AE35)
    return h ^ (h >> u32(16))


@dataclasses.dataclass(frozen=True)
class Random(Pattern):
    """Each (block of i, block of j) pair kept independently with probability `rate`
    (a Bernoulli density: rows get `rate` of the keys on average, not a fixed count).

    The coin is a hash of (i // block, j // block, seed), so the pattern is fixed,
    needs no state, and is the same under jit, vmap and on the host.
    """

    rate: float
    seed: int = 0
    block: int = 1

    def _mask(self, i, j, xp):
        if self.rate >= 1.0:
            return All()._mask(i, j, xp)
        u32 = xp.uint32
        h = ((i // self.block).astype(u32) * u32(0x9E3779B1)) ^ (
            (j // self.block).astype(u32) * u32(0x85EBCA77)) ^ u32(
                (self.seed * 0xC2B2AE3D + 0x27D4EB2F) & 0xFFFFFFFF)
        return _fmix32(h, xp) < u32(min(int(self.rate * 2.0**32), 0xFFFFFFFF))


@dataclasses.dataclass(frozen=True)
class RandomKeys(Pattern):
    """Every block row sees exactly `num_keys` distinct random key blocks.

    Key blocks are b = j // block of the `length` positions 0..length-1, i.e. blocks
    0..nb-1 with nb = ceil(length / block). The candidates of row block a = i // block
    are the blocks skip_first <= b < nb - skip_last, less those with |a - b| <=
    skip_window (skip_window -1: none); with m candidates the row gets min(num_keys, m)
    of them, each r-subset equally likely (Floyd's algorithm: for t = m-r, ..., m-1
    draw x uniform in [0, t], take t instead if x was already taken). The draws are
    hashes of (a, step, seed), computed elementwise on the row index in r steps of at
    most r comparisons, so the pattern is a pure predicate of (i, j): fixed, stateless,
    the same under jit, vmap, on the host and on kernel tiles.
    """

    num_keys: int
    length: int
    seed: int = 0
    block: int = 1
    skip_window: int = -1
    skip_first: int = 0
    skip_last: int = 0
    causal: bool = False  # candidates only up to the row's own block (blocks b <= a)

    def key_blocks(self, a: Array, xp: Any) -> list[Array]:
        """The chosen key blocks of row blocks `a` (int arrays, -1 = none): num_keys
        arrays shaped like `a`, distinct where >= 0."""
        u32, i32 = xp.uint32, xp.int32
        a = xp.asarray(a).astype(i32)
        nb = -(-self.length // self.block)
        lo, hi = self.skip_first, max(self.skip_first, nb - self.skip_last)
        if self.causal:  # draw among the blocks a row may see, not among all then mask
            hi = xp.clip(a + 1, lo, hi)
        if self.skip_window >= 0:  # the excluded window [w_lo, w_lo + w) within [lo, hi)
            w_lo = xp.clip(a - self.skip_window, lo, hi)
            w = xp.clip(a + self.skip_window + 1, lo, hi) - w_lo
        else:
            w_lo, w = hi, 0
        m = (hi - lo) - w  # candidates of each row
        r = self.num_keys
        base = _fmix32(a.astype(u32) * u32(0x9E3779B1)
                       ^ u32((self.seed * 0xC2B2AE3D + 0x27D4EB2F) & 0xFFFFFFFF), xp)
        ranks: list[Array] = []
        for s in range(r):  # Floyd's steps: a loop over r, not over positions
            t = m - r + s  # draw a rank in [0, t]; t < 0: this step does not happen
            h = _fmix32(base ^ u32((s * 0x85EBCA77 + 0x165667B1) & 0xFFFFFFFF), xp)
            x = (h % xp.asarray(xp.maximum(t + 1, 1)).astype(u32)).astype(i32)
            taken = functools.reduce(lambda acc, c: acc | (c == x), ranks,
                                     xp.zeros(xp.shape(x), bool))
            ranks.append(xp.where(t < 0, -1, xp.where(taken, t, x)).astype(i32))
        # Rank k -> the k-th candidate: lo + k, stepping over the window.
        return [xp.where(k < 0, -1, lo + k + xp.where(lo + k >= w_lo, w, 0)) for k in ranks]

    def _mask(self, i, j, xp):
        shape = xp.broadcast_shapes(np.shape(i), np.shape(j))
        b = j // self.block
        with np.errstate(over="ignore"):  # uint32 hashing wraps (numpy scalars warn)
            chosen = self.key_blocks(i // self.block, xp)
        return functools.reduce(lambda acc, c: acc | (b == c), chosen, xp.zeros(shape, bool))


@dataclasses.dataclass(frozen=True)
class BlockLocal(Pattern):
    """Image Transformer 1D: query block [s, s+block) sees [s - memory, s + block)."""

    block: int
    memory: int

    def _mask(self, i, j, xp):
        start = (i // self.block) * self.block
        return (j >= start - self.memory) & (j < start + self.block)


@dataclasses.dataclass(frozen=True)
class Local2D(Pattern):
    """Image Transformer 2D on a raster of `width` columns.

    Query blocks are query_shape rectangles; each sees its block extended by
    flange[0] rows above and flange[1] columns left and right.
    """

    width: int
    query_shape: tuple[int, int]
    flange: tuple[int, int]

    def _mask(self, i, j, xp):
        (qh, qw), (fh, fw) = self.query_shape, self.flange
        ri, ci, rj, cj = i // self.width, i % self.width, j // self.width, j % self.width
        r0, c0 = (ri // qh) * qh, (ci // qw) * qw
        return ((rj >= r0 - fh) & (rj < r0 + qh) & (cj >= c0 - fw) & (cj < c0 + qw + fw))


@dataclasses.dataclass(frozen=True)
class Axial(Pattern):
    """Same row (axis 0: attend along the row) or same column (axis 1) of a raster."""

    width: int
    axis: int

    def _mask(self, i, j, xp):
        if self.axis == 0:
            return i // self.width == j // self.width
        return i % self.width == j % self.width


def all_() -> Pattern:
    return All()


def causal() -> Pattern:
    return Causal()


def local(window: int, *, before: int | None = None, after: int | None = None) -> Pattern:
    """|i - j| <= window; `before`/`after` override either side (e.g. after=0)."""
    _check(window=window)
    return Local(window if before is None else before, window if after is None else after)


def strided(stride: int) -> Pattern:
    """Sparse Transformer A2 = {j : (i - j) mod stride == 0}."""
    _check(stride=(stride, 1))
    return Strided(stride)


def sparse_a1(stride: int, *, two_sided: bool = False) -> Pattern:
    """Sparse Transformer strided A1 = {max(0, i - stride), ..., i} (the paper's, causal);
    two_sided: {i - stride, ..., i + stride}, its bidirectional form for a non-causal
    model (A2 = `strided` is two-sided already)."""
    _check(stride=(stride, 1))
    return local(stride) if two_sided else local(stride, after=0)


def fixed(block: int, c: int) -> Pattern:
    """Sparse Transformer fixed pattern A1 | A2 (own block, plus the last c of every block)."""
    _check(block=(block, 1), c=(c, 1))
    if c > block:
        raise ValueError(f"fixed: c ({c}) must be <= block ({block})")
    return SameBlock(block) | Summary(block, c)


def dilated(window: int, dilation: int) -> Pattern:
    _check(window=window, dilation=(dilation, 1))
    return Dilated(window, dilation)


def global_tokens(idx: Sequence[int]) -> Pattern:
    return Global(tuple(int(g) for g in idx))


def global_range(start: int, stop: int) -> Pattern:
    """Positions start, ..., stop - 1 global (see and are seen by every position)."""
    _check(start=start, stop=stop)
    return GlobalRange(int(start), int(stop))


def random(rate: float | None = None, *, num_keys: int | None = None,
           kv_len: int | None = None, seed: int = 0, block: int = 1,
           skip_window: int = -1, skip_first: int = 0, skip_last: int = 0,
           causal: bool = False) -> Pattern:
    """Random keys: a density `rate`, or exactly `num_keys` per row out of kv_len.

    rate: each (block x block) tile kept independently with probability rate (rows get
    rate * kv_len keys on average). num_keys: every row (block row) gets exactly
    min(num_keys, candidates) distinct keys (key blocks), a uniformly random subset of
    the ceil(kv_len / block) blocks, leaving out those within `skip_window` blocks of
    the row's block (-1: none; 0: the row's own block) and the first `skip_first` and
    last `skip_last` blocks (`RandomKeys`). With block > 1 whole (block x block) tiles
    are chosen (BigBird's random blocks). `causal` (num_keys): the candidates of a row
    are the blocks up to its own, so that row i gets min(num_keys, its candidates) keys
    it can use, not num_keys drawn from all blocks of which a causal mask keeps ~i/L.
    """
    if (rate is None) == (num_keys is None):
        raise ValueError("random: give exactly one of rate and num_keys")
    _check(block=(block, 1))
    if num_keys is not None:
        if kv_len is None:
            raise ValueError("random: num_keys needs kv_len")
        _check(num_keys=num_keys, kv_len=kv_len, skip_window=(skip_window, -1),
               skip_first=skip_first, skip_last=skip_last)
        nb = -(-kv_len // block)
        if num_keys >= nb and skip_window < 0 and skip_first == skip_last == 0:
            return All()  # every key (block)
        return RandomKeys(int(num_keys), int(kv_len), int(seed), int(block), int(skip_window),
                          int(skip_first), int(skip_last), bool(causal))
    if skip_window != -1 or skip_first or skip_last:
        raise ValueError("random: skip_window, skip_first and skip_last need num_keys")
    if rate < 0:
        raise ValueError(f"random: rate must be >= 0, got {rate}")
    return Random(float(min(rate, 1.0)), int(seed), int(block))


def bigbird(block: int, length: int, *, num_global_blocks: int, num_random_blocks: int,
            seed: int = 0) -> Pattern:
    """BigBird ITC on `length` positions, in blocks of `block` (nb = ceil(length/block)).

    As `bigbird_block_sparse_attention` (google-research/bigbird): a window of 3 blocks;
    g global blocks, the first ceil(g/2) and the last floor(g/2) of the nb blocks (the
    reference's g = 2: the first and the last block), whose rows see every key and whose
    keys every row sees; and in every block row exactly r random blocks drawn from the
    blocks outside its window and outside the global blocks (fewer when fewer remain).
    """
    _check(block=(block, 1), length=(length, 1), num_global_blocks=num_global_blocks,
           num_random_blocks=num_random_blocks)
    nb = -(-length // block)
    first, last = -(-num_global_blocks // 2), num_global_blocks // 2
    pattern = block_window(block, 1) | global_range(0, min(first * block, length))
    if last:
        pattern = pattern | global_range(max(0, (nb - last) * block), length)
    return pattern | random(num_keys=num_random_blocks, kv_len=length, seed=seed,
                            block=block, skip_window=1, skip_first=first, skip_last=last)


def block_local(block: int, memory: int = 0) -> Pattern:
    _check(block=(block, 1), memory=memory)
    return BlockLocal(block, memory)


def block_window(block: int, radius: int = 1) -> Pattern:
    """Key blocks within `radius` blocks of the query's block (BigBird's window of 3)."""
    _check(block=(block, 1), radius=radius)
    return SameBlock(block, radius)


def local_2d(width: int, query_shape: tuple[int, int], flange: tuple[int, int]) -> Pattern:
    _check(width=(width, 1), query_height=(query_shape[0], 1),
           query_width=(query_shape[1], 1), flange_height=flange[0], flange_width=flange[1])
    return Local2D(int(width), tuple(map(int, query_shape)), tuple(map(int, flange)))


def axial(width: int, axis: int) -> Pattern:
    _check(width=(width, 1))
    if axis not in (0, 1):
        raise ValueError(f"axial: axis must be 0 (rows) or 1 (columns), got {axis}")
    return Axial(int(width), axis)


def _check(**values: int | tuple[int, int]) -> None:
    for name, value in values.items():
        value, low = value if isinstance(value, tuple) else (value, 0)
        if not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")

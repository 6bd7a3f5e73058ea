"""models.masks: every primitive against its set definition, composition, block layouts."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models import masks

L = 23  # not a multiple of the block sizes below


def from_sets(allowed, q_len: int = L, kv_len: int = L) -> np.ndarray:
    """bool [q, kv] from a Python predicate on (i, j): the explicit O(L^2) construction."""
    offset = kv_len - q_len
    return np.array([[bool(allowed(i + offset, j)) for j in range(kv_len)]
                     for i in range(q_len)])


def assert_pattern(pattern: masks.Pattern, allowed, q_len: int = L, kv_len: int = L):
    expected = from_sets(allowed, q_len, kv_len)
    np.testing.assert_array_equal(np.asarray(pattern.dense(q_len, kv_len)), expected)
    np.testing.assert_array_equal(pattern.dense_np(q_len, kv_len), expected)


@pytest.mark.parametrize("w", [0, 1, 3])
def test_local(w):
    assert_pattern(masks.local(w), lambda i, j: abs(i - j) <= w)
    assert_pattern(masks.local(w, after=0), lambda i, j: i - w <= j <= i)


@pytest.mark.parametrize("stride", [1, 3, 5])
def test_sparse_transformer_strided_sets(stride):
    # seeds/001: A1 = {max(0, i-l), ..., i}, A2 = {j : (i-j) mod l == 0}.
    assert_pattern(masks.sparse_a1(stride),
                   lambda i, j: j in range(max(0, i - stride), i + 1))
    assert_pattern(masks.strided(stride), lambda i, j: (i - j) % stride == 0)
    # Its bidirectional form (non-causal classifiers): {i-l, ..., i+l}.
    assert_pattern(masks.sparse_a1(stride, two_sided=True),
                   lambda i, j: j in range(i - stride, i + stride + 1))


@pytest.mark.parametrize("block,c", [(4, 1), (5, 2), (6, 6)])
def test_sparse_transformer_fixed_sets(block, c):
    # A1 = {j : floor(j/l) == floor(i/l)}, A2 = {j : j mod l in {l-c, ..., l-1}}.
    a1 = lambda i, j: j // block == i // block  # noqa: E731
    a2 = lambda i, j: j % block in range(block - c, block)  # noqa: E731
    assert_pattern(masks.fixed(block, c), lambda i, j: a1(i, j) or a2(i, j))
    assert_pattern(masks.SameBlock(block), a1)
    assert_pattern(masks.Summary(block, c), a2)


@pytest.mark.parametrize("window,dilation", [(1, 1), (2, 3), (3, 2)])
def test_dilated(window, dilation):
    assert_pattern(masks.dilated(window, dilation),
                   lambda i, j: j in {i + k * dilation for k in range(-window, window + 1)})


def test_global_tokens():
    idx = (0, 7)
    assert_pattern(masks.global_tokens(idx), lambda i, j: i in idx or j in idx)


@pytest.mark.parametrize("block,memory", [(4, 0), (4, 3), (5, 7)])
def test_block_local(block, memory):
    def allowed(i, j):
        start = i - i % block
        return j in range(start - memory, start + block)
    assert_pattern(masks.block_local(block, memory), allowed)


def test_block_window():
    assert_pattern(masks.block_window(4, 1), lambda i, j: abs(i // 4 - j // 4) <= 1)


@pytest.mark.parametrize("width,qs,fl", [(5, (2, 2), (1, 1)), (4, (1, 3), (2, 0))])
def test_local_2d(width, qs, fl):
    def allowed(i, j):
        (ri, ci), (rj, cj) = divmod(i, width), divmod(j, width)
        r0, c0 = ri - ri % qs[0], ci - ci % qs[1]
        rows = range(r0 - fl[0], r0 + qs[0])
        cols = range(c0 - fl[1], c0 + qs[1] + fl[1])
        return rj in rows and cj in cols
    assert_pattern(masks.local_2d(width, qs, fl), allowed)


def test_axial():
    assert_pattern(masks.axial(5, 0), lambda i, j: i // 5 == j // 5)
    assert_pattern(masks.axial(5, 1), lambda i, j: i % 5 == j % 5)


def test_causal_with_fewer_queries_than_keys():
    # The queries are the last q_len positions, as in dense.make_attention_mask.
    assert_pattern(masks.causal(), lambda i, j: j <= i, q_len=7, kv_len=L)
    assert_pattern(masks.local(2) & masks.causal(), lambda i, j: i - 2 <= j <= i,
                   q_len=7, kv_len=L)


def test_composition_and_per_head():
    a, b = masks.local(2), masks.strided(4)
    da, db = a.dense_np(L, L), b.dense_np(L, L)
    np.testing.assert_array_equal((a | b).dense_np(L, L), da | db)
    np.testing.assert_array_equal((a & b).dense_np(L, L), da & db)
    heads = masks.per_head([a, b], num_heads=3)
    assert heads.num_heads == 3
    np.testing.assert_array_equal(np.asarray(heads.dense(L, L)), np.stack([da, db, da]))
    np.testing.assert_array_equal((heads & masks.causal()).dense_np(L, L),
                                  np.stack([da, db, da]) & np.tri(L, dtype=bool))
    with pytest.raises(ValueError, match="head counts"):
        _ = (heads | masks.per_head([a, b])).num_heads


def test_random_rate_is_deterministic_seeded_and_jit_vmap_friendly():
    """random(rate): a Bernoulli density (each tile kept with probability rate)."""
    pattern = masks.random(0.3, seed=5)
    m = pattern.dense_np(64, 64)
    assert 0.2 < m.mean() < 0.4
    np.testing.assert_array_equal(m, masks.random(0.3, seed=5).dense_np(64, 64))
    assert (m != masks.random(0.3, seed=6).dense_np(64, 64)).any()
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda: pattern.dense(64, 64))()), m)
    rows = jax.vmap(lambda i: pattern.mask(i, jnp.arange(64)))(jnp.arange(64))
    np.testing.assert_array_equal(np.asarray(rows), m)
    # Block-level coins: each (block x block) tile is all in or all out.
    tiles = masks.random(0.3, seed=1, block=8).dense_np(64, 64)
    t = tiles.reshape(8, 8, 8, 8)
    assert (t.all(axis=(1, 3)) | ~t.any(axis=(1, 3))).all()


@pytest.mark.parametrize("n,r", [(64, 5), (23, 1), (10, 9), (7, 0)])
def test_random_num_keys_gives_every_row_exactly_r_distinct_keys(n, r):
    """random(num_keys=r): exactly r keys per row (Floyd's algorithm on the row index)."""
    pattern = masks.random(num_keys=r, kv_len=n, seed=5)
    m = pattern.dense_np(n, n)
    assert (m.sum(1) == r).all()
    np.testing.assert_array_equal(np.asarray(pattern.dense(n, n)), m)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda: pattern.dense(n, n))()), m)
    rows = jax.vmap(lambda i: pattern.mask(i, jnp.arange(n)))(jnp.arange(n))
    np.testing.assert_array_equal(np.asarray(rows), m)
    if 0 < r < n - 1:
        assert len({row.tobytes() for row in m}) > n // 2  # rows draw their own keys
        assert (m != masks.random(num_keys=r, kv_len=n, seed=6).dense_np(n, n)).any()
    # skip_window=0: the row's own key is never drawn, so r others (+ itself if unioned).
    own = masks.random(num_keys=min(r, n - 1), kv_len=n, seed=5, skip_window=0)
    m = (own | masks.local(0)).dense_np(n, n)
    assert (m.sum(1) == min(r, n - 1) + 1).all() and m.diagonal().all()


def test_random_num_keys_is_uniform_and_blockwise():
    # Over many rows every key is drawn about r / n of the time (a uniform r-subset).
    m = masks.random(num_keys=3, kv_len=10, seed=2).dense_np(20000, 10)
    assert (m.sum(1) == 3).all()
    np.testing.assert_allclose(m.mean(0), 0.3, atol=0.02)
    # Blocks: exactly r key blocks per block row, whole tiles in or out.
    tiles = masks.random(num_keys=2, kv_len=64, seed=1, block=8).dense_np(64, 64)
    t = tiles.reshape(8, 8, 8, 8)
    assert (t.all(axis=(1, 3)) | ~t.any(axis=(1, 3))).all()
    assert (t.all(axis=(1, 3)).sum(1) == 2).all()
    assert masks.random(num_keys=64, kv_len=64).dense_np(64, 64).all()
    # A short last block (kv_len not a multiple of block) is a block like the others.
    short = masks.random(num_keys=3, kv_len=22, seed=0, block=4)
    assert (short.dense_np(22, 22)[::4].reshape(6, 22).sum(1) >= 3 * 4 - 2).all()


def test_random_num_keys_skips_window_and_end_blocks():
    n, block, r = 48, 4, 3  # 12 blocks
    p = masks.random(num_keys=r, kv_len=n, seed=3, block=block, skip_window=1,
                     skip_first=1, skip_last=2)
    chosen = np.stack(p.key_blocks(np.arange(12), np))  # r x 12
    for a in range(12):
        candidates = [b for b in range(1, 10) if abs(a - b) > 1]
        got = chosen[:, a]
        assert len(set(got)) == r and set(got) <= set(candidates), (a, got)
    # Fewer candidates than r: all of them, the other slots empty (-1).
    few = masks.random(num_keys=5, kv_len=16, block=4, skip_window=1)  # 4 blocks
    chosen = np.stack(few.key_blocks(np.arange(4), np))
    assert sorted(chosen[:, 0]) == [-1, -1, -1, 2, 3]
    assert sorted(chosen[:, 1]) == [-1, -1, -1, -1, 3]


@pytest.mark.parametrize("length,block,g,r", [(40, 4, 2, 2), (23, 4, 3, 1), (64, 8, 1, 3),
                                              (30, 5, 0, 2)])
def test_bigbird_sets(length, block, g, r):
    """BigBird ITC: window of 3 blocks; g global blocks, the first ceil(g/2) and the last
    floor(g/2) (google-research/bigbird's first and last for g = 2); exactly r random
    blocks per other block row, outside its window and the global blocks."""
    pattern = masks.bigbird(block, length, num_global_blocks=g, num_random_blocks=r, seed=1)
    m = pattern.dense_np(length, length)
    np.testing.assert_array_equal(np.asarray(pattern.dense(length, length)), m)
    nb = -(-length // block)
    glob = set(range(-(-g // 2))) | set(range(nb - g // 2, nb))
    blk = np.arange(length) // block
    for a in range(nb):
        rows = m[blk == a]
        assert (rows == rows[0]).all()  # a block row shares its keys
        seen = {b for b in range(nb) if rows[0][blk == b].all()}
        assert not any(rows[0][blk == b].any() for b in range(nb) if b not in seen)
        if a in glob:
            assert seen == set(range(nb))
            continue
        window = {b for b in range(nb) if abs(a - b) <= 1}
        assert window | glob <= seen
        candidates = set(range(nb)) - window - glob
        assert len(seen - window - glob) == min(r, len(candidates))
    for b in glob:
        assert m[:, blk == b].all()


def test_bigbird_reference_layout():
    """g = 2, as the reference: block 0 and the last block global."""
    m = masks.bigbird(2, 16, num_global_blocks=2, num_random_blocks=1).dense_np(16, 16)
    blocks = m[::2, ::2]
    assert blocks[0].all() and blocks[-1].all() and blocks[:, 0].all() and blocks[:, -1].all()
    assert not blocks[1:-1, 1:-1].all()
    assert (blocks[2:-2].sum(1) == 3 + 2 + 1).all()  # window, 2 global blocks, 1 random


def test_patterns_are_hashable_static_args():
    p = masks.local(2) | masks.per_head([masks.causal(), masks.strided(3)])
    assert hash(p) == hash(masks.local(2) | masks.per_head([masks.causal(), masks.strided(3)]))
    f = jax.jit(lambda x, pat: x * pat.dense(8, 8).sum(), static_argnums=1)
    assert float(f(1.0, p)) == float(p.dense_np(8, 8).sum())


@pytest.mark.parametrize("bad", [lambda: masks.local(-1), lambda: masks.strided(0),
                                 lambda: masks.fixed(4, 5), lambda: masks.axial(4, 2),
                                 lambda: masks.random(),
                                 lambda: masks.random(num_keys=2),
                                 lambda: masks.random(0.5, skip_window=0),
                                 lambda: masks.random(num_keys=-1, kv_len=4),
                                 lambda: masks.sparse_a1(0),
                                 lambda: masks.bigbird(0, 16, num_global_blocks=1,
                                                       num_random_blocks=1),
                                 lambda: masks.block_local(0)])
def test_invalid_parameters_are_rejected(bad):
    with pytest.raises(ValueError):
        bad()


# ----------------------------------------------------------------------------------
# Block layouts agree with the dense pattern.

def reference_layout(dense: np.ndarray, bq: int, bk: int) -> np.ndarray:
    """Python loops over tiles; only real (non-padding) positions count."""
    q_len, kv_len = dense.shape
    nq, nk = -(-q_len // bq), -(-kv_len // bk)
    layout = np.zeros((nq, nk), np.int8)
    for a in range(nq):
        for b in range(nk):
            tile = dense[a * bq:(a + 1) * bq, b * bk:(b + 1) * bk]
            full = tile.all() and tile.shape[1] == bk
            layout[a, b] = 2 if full else (1 if tile.any() else 0)
    return layout


def assert_blocks_match(pattern: masks.Pattern, q_len, kv_len, bq, bk):
    dense = pattern.dense_np(q_len, kv_len)
    lay = pattern.blocks(q_len, kv_len, bq, bk)
    per_head = dense if dense.ndim == 3 else dense[None]
    layouts = lay.layout if lay.layout.ndim == 3 else lay.layout[None]
    idx = lay.kv_indices.reshape(layouts.shape[0], layouts.shape[1], -1)
    counts = lay.kv_counts.reshape(layouts.shape[:2])
    assert lay.layout.dtype == np.int8
    for d, layout, ind, cnt in zip(per_head, layouts, idx, counts):
        np.testing.assert_array_equal(layout, reference_layout(d, bq, bk))
        for row in range(layout.shape[0]):
            nonempty = np.flatnonzero(layout[row])
            assert cnt[row] == len(nonempty)
            np.testing.assert_array_equal(ind[row, :cnt[row]], nonempty)
            assert (ind[row] >= 0).all() and (ind[row] < layout.shape[1]).all()


def patterns_strategy():
    small = st.integers(1, 6)
    prim = st.one_of(
        st.builds(masks.local, st.integers(0, 6)),
        st.builds(masks.strided, small),
        st.builds(masks.sparse_a1, small),
        st.builds(lambda b, c: masks.fixed(b, min(b, c)), small, small),
        st.builds(masks.dilated, st.integers(0, 3), small),
        st.builds(lambda g: masks.global_tokens(g), st.lists(st.integers(0, 20), max_size=3)),
        st.builds(lambda r, s, b: masks.random(r, seed=s, block=b), st.floats(0, 1),
                  st.integers(0, 9), small),
        st.builds(lambda r, n, s, b, w: masks.random(num_keys=r, kv_len=n, seed=s, block=b,
                                                     skip_window=w),
                  st.integers(0, 4), st.integers(1, 30), st.integers(0, 9), small,
                  st.integers(-1, 1)),
        st.builds(lambda b, n, g, r: masks.bigbird(b, n, num_global_blocks=g,
                                                   num_random_blocks=r),
                  small, st.integers(1, 30), st.integers(0, 3), st.integers(0, 3)),
        st.builds(masks.block_local, small, st.integers(0, 6)),
        st.builds(lambda w, a, b: masks.local_2d(w, (a, b), (1, 1)), small, small, small),
        st.builds(masks.axial, small, st.integers(0, 1)),
        st.just(masks.causal()),
    )
    combined = st.one_of(prim, st.builds(lambda a, b: a | b, prim, prim),
                         st.builds(lambda a, b: a & b, prim, prim))
    return st.one_of(combined, st.builds(lambda a, b: masks.per_head([a, b]), prim, prim))


@settings(max_examples=60, deadline=None)
@given(pattern=patterns_strategy(), q_len=st.integers(1, 30), extra_kv=st.integers(0, 6),
       bq=st.integers(1, 8), bk=st.integers(1, 8))
def test_blocks_agree_with_dense(pattern, q_len, extra_kv, bq, bk):
    assert_blocks_match(pattern, q_len, q_len + extra_kv, bq, bk)


def test_blocks_count_only_nonempty_tiles():
    lay = masks.local(64).blocks(4096, 4096, 64, 64)
    assert lay.kv_indices.shape == (64, 3)  # the band touches 3 key blocks per query block
    assert lay.num_nonempty == 64 * 3 - 2
    assert set(np.unique(lay.layout)) == {0, 1, 2}

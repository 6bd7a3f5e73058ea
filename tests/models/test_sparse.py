"""Block-sparse kernel and the pattern variants against explicit O(L^2) references."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import masks, registry
from models.attention import sparse
from models.attention.dense import dot_product_attention
from models.kernels import block_sparse_attention
from tests.models.helpers import normal

B, H, D = 2, 2, 8
TOL = dict(rtol=2e-5, atol=2e-5)
PATTERN_VARIANTS = ["local", "strided", "fixed", "dilated", "global", "random",
                    "block_local", "local_2d", "longformer", "bigbird", "axial"]


def reference_attention(q, k, v, allowed_HxQxKv, key_mask_BxKv=None) -> np.ndarray:
    """Softmax over the allowed keys of each query, one query at a time (numpy, float64)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b, h, q_len, d = q.shape
    out = np.zeros((b, h, q_len, v.shape[-1]))
    for bi in range(b):
        for hi in range(h):
            for i in range(q_len):
                keys = np.flatnonzero(allowed_HxQxKv[hi, i] & (
                    True if key_mask_BxKv is None else np.asarray(key_mask_BxKv[bi])))
                if keys.size == 0:
                    continue  # no key: output 0, as dot_product_attention
                s = q[bi, hi, i] @ k[bi, hi, keys].T / np.sqrt(d)
                w = np.exp(s - s.max())
                out[bi, hi, i] = (w / w.sum()) @ v[bi, hi, keys]
    return out


def heads(allowed, h=H):
    allowed = np.asarray(allowed)
    return allowed if allowed.ndim == 3 else np.broadcast_to(allowed, (h,) + allowed.shape)


KERNEL_CASES = [
    ("local", masks.local(3), 8, 4),
    ("fixed", masks.fixed(8, 2), 8, 8),
    ("strided_union", masks.sparse_a1(5) | masks.strided(5), 4, 8),
    ("per_head_causal", masks.per_head([masks.local(2), masks.strided(4)]) & masks.causal(),
     8, 4),
    ("random_blocks", masks.random(0.3, seed=3, block=4) | masks.global_tokens([0]), 4, 4),
    ("random_keys", masks.random(num_keys=5, kv_len=37, seed=3, skip_window=0)
     | masks.local(0), 4, 8),
    ("bigbird", masks.bigbird(4, 37, num_global_blocks=2, num_random_blocks=2, seed=1), 4, 4),
    ("local_2d", masks.local_2d(6, (2, 3), (1, 1)), 6, 6),
    ("empty_rows", masks.strided(4) & masks.local(2), 4, 4),  # rows with no key at all
]


@pytest.mark.parametrize("name,pattern,bq,bk", KERNEL_CASES, ids=[c[0] for c in KERNEL_CASES])
def test_kernel_matches_reference(name, pattern, bq, bk):
    del name
    q_len = kv_len = 37
    q, k, v = (normal(s, (B, H, q_len, D)) for s in range(3))
    key_mask = jnp.arange(kv_len)[None] < jnp.array([[kv_len], [29]])
    out = jax.jit(lambda q, k, v, m: block_sparse_attention(
        q, k, v, pattern, padding_mask=m, block_q=bq, block_k=bk))(q, k, v, key_mask)
    expected = reference_attention(q, k, v, heads(pattern.dense_np(q_len, kv_len)), key_mask)
    np.testing.assert_allclose(np.asarray(out), expected, **TOL)


def test_kernel_fewer_queries_than_keys():
    pattern = masks.local(4) & masks.causal()
    q = normal(0, (B, H, 7, D))
    k, v = normal(1, (B, H, 21, D)), normal(2, (B, H, 21, D))
    out = jax.jit(lambda q, k, v: block_sparse_attention(q, k, v, pattern, block_q=4,
                                                         block_k=4))(q, k, v)
    expected = reference_attention(q, k, v, heads(pattern.dense_np(7, 21)))
    np.testing.assert_allclose(np.asarray(out), expected, **TOL)


GRAD_CASES = [KERNEL_CASES[0], KERNEL_CASES[3]]  # the variants' test covers the others


@pytest.mark.parametrize("name,pattern,bq,bk", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_kernel_gradients_match_dense(name, pattern, bq, bk):
    del name
    length = 29
    q, k, v = (normal(s, (B, H, length, D)) for s in range(3))
    w = normal(9, (B, H, length, D))
    key_mask = jnp.arange(length)[None] < jnp.array([[length], [20]])
    allowed = jnp.asarray(heads(pattern.dense_np(length, length)))[None]
    dense_mask = allowed & key_mask[:, None, None, :]

    def loss_sparse(q, k, v):
        return jnp.sum(w * block_sparse_attention(q, k, v, pattern, padding_mask=key_mask,
                                                  block_q=bq, block_k=bk))

    def loss_dense(q, k, v):
        return jnp.sum(w * dot_product_attention(q, k, v, mask=dense_mask))

    g_sparse = jax.jit(jax.grad(loss_sparse, argnums=(0, 1, 2)))(q, k, v)
    g_dense = jax.jit(jax.grad(loss_dense, argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(g_sparse, g_dense):
        assert np.abs(np.asarray(b)).max() > 0
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL)


def test_kernel_work_grows_with_nonempty_blocks():
    """The gathered logits are Nq x Bq x (M x Bk): linear in L for a band."""
    def logits_elements(length):
        q = jax.ShapeDtypeStruct((1, 1, length, 16), jnp.float32)
        jaxpr = jax.make_jaxpr(lambda q, k, v: block_sparse_attention(
            q, k, v, masks.local(32), block_q=32, block_k=32))(q, q, q)
        return max(int(np.prod(e.aval.shape)) for e in jaxpr.jaxpr.outvars + [
            v for eqn in jaxpr.eqns for v in eqn.outvars] if e.aval.dtype == jnp.float32)
    # At most 3 key blocks of 32 per query; an L x L array would be 32x larger.
    assert 1024 * 2 * 32 < logits_elements(1024) <= 1024 * 3 * 32
    assert logits_elements(2048) == 2 * logits_elements(1024) + 2 * 3 * 32 * 32  # nq - 2 rows


def test_dense_rows_do_not_widen_the_others():
    """Global rows need every key block; the other rows still gather only their own."""
    pattern = masks.local(8) | masks.global_tokens([0])
    q = jax.ShapeDtypeStruct((1, 1, 512, 8), jnp.float32)
    jaxpr = jax.make_jaxpr(lambda q, k, v: block_sparse_attention(
        q, k, v, pattern, block_q=8, block_k=8))(q, q, q)
    biggest = max(int(np.prod(v.aval.shape)) for eqn in jaxpr.eqns for v in eqn.outvars)
    assert biggest <= 512 * 4 * 8 + 8 * 512  # banded rows (<= 4 blocks) + the global row


def test_unknown_backend_raises():
    q = normal(0, (1, 1, 8, 4))
    with pytest.raises(ValueError, match="backend"):
        block_sparse_attention(q, q, q, masks.local(1), backend="cuda")


# ----------------------------------------------------------------------------------
# Variants.

LEN, DIM = 16, 32


def build(name, **overrides):
    hparams = {**registry.capabilities(name).test_hparams, **overrides}
    causal = hparams.pop("causal", False)
    return registry.build(name, dim=DIM, num_heads=H, max_len=LEN, causal=causal,
                          rngs=nnx.Rngs(params=0, dropout=1), **hparams)


def key_mask():
    return jnp.arange(LEN)[None] < jnp.array([[LEN], [11]])


def _outputs_and_grads(name, impl, causal, prefix_len=0):
    model = build(name, attention_impl=impl, causal=causal, prefix_len=prefix_len)
    x, w, mask = normal(0, (B, LEN, DIM)), normal(1, (B, LEN, DIM)), key_mask()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(params, x):
        y = nnx.merge(graphdef, params, rest)(x, padding_mask=mask)
        return jnp.sum(jnp.where(mask[..., None], y * w, 0.0)), y

    lowered = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)).lower(params, x)
    # The interpreted Pallas kernels compile twice as fast without backend optimisation.
    options = {"xla_backend_optimization_level": 0} if impl == "pallas" else None
    (_, y), grads = lowered.compile(options)(params, x)
    return y, grads


def _assert_agree(name, impl, causal=None, prefix_len=0):
    """Same weights, `impl` against dense: outputs and gradients (causal where supported,
    unless `causal` says otherwise)."""
    causal = registry.capabilities(name).causal if causal is None else causal
    (y_d, g_d), (y_s, g_s) = (_outputs_and_grads(name, i, causal, prefix_len)
                              for i in ("dense", impl))
    real = np.asarray(key_mask())
    np.testing.assert_allclose(np.asarray(y_s)[real], np.asarray(y_d)[real], **TOL)
    leaves_s, leaves_d = jax.tree.leaves(g_s), jax.tree.leaves(g_d)
    assert len(leaves_s) == len(leaves_d)
    for a, b in zip(leaves_s, leaves_d):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL)


@pytest.mark.parametrize("name", PATTERN_VARIANTS)
def test_dense_and_blocksparse_agree(name):
    _assert_agree(name, "blocksparse")


@pytest.mark.parametrize("name", ["local", "local_2d", "axial", "bigbird", "longformer"])
def test_dense_and_blocksparse_agree_after_a_cls_slot(name):
    """The pattern shifted past a global CLS slot (the classifier's prefix)."""
    _assert_agree(name, "blocksparse", prefix_len=1)


def test_dense_and_pallas_agree_after_a_cls_slot():
    _assert_agree("local_2d", "pallas", prefix_len=1)


# The Pallas kernels run interpreted on CPU (~5 s to compile each pass): by default the full
# pattern (transformer, not causal: causal rows never reach the padded keys at the end) and
# per-head strided (causal, heads split), the rest under slow.
@pytest.mark.parametrize("name,causal", [("transformer", False), ("strided", None)] + [
    pytest.param(n, None, marks=pytest.mark.slow) for n in PATTERN_VARIANTS if n != "strided"])
def test_dense_and_pallas_agree(name, causal):
    _assert_agree(name, "pallas", causal)


def test_pallas_attention_dropout_in_training():
    """The kernels' own dropout (numerics: tests/kernels): on in training only, a fresh
    mask every call, and about `rate` of the weights dropped."""
    model = build("local", attention_impl="pallas", attention_dropout=0.5)
    x = normal(0, (B, LEN, DIM))
    run = nnx.jit(lambda m, x, det: m(x, deterministic=det), static_argnums=2)
    y_eval, y_eval2 = run(model, x, True), run(model, x, True)
    y1, y2 = run(model, x, False), run(model, x, False)
    np.testing.assert_array_equal(y_eval, y_eval2)
    assert np.all(np.isfinite(np.asarray(y1)))
    assert not np.allclose(y1, y_eval, atol=1e-3) and not np.allclose(y1, y2, atol=1e-3)
    # Dropout is unbiased: the mean over many masks approaches the eval output.
    mean = np.mean([np.asarray(run(model, x, False)) for _ in range(40)], axis=0)
    assert np.abs(mean - y_eval).mean() < 0.3 * np.abs(np.asarray(y1) - y_eval).mean()


def from_sets(allowed, length=LEN):
    return np.array([[bool(allowed(i, j)) for j in range(length)] for i in range(length)])


# The test_hparams patterns written out as sets (per head when the variant splits heads).
EXPECTED = {
    "local": lambda i, j: abs(i - j) <= 2,
    # Not causal: A1 both sides, {i-4, ..., i+4} (the causal A1 is the paper's one side).
    "strided": [lambda i, j: abs(i - j) <= 4, lambda i, j: (i - j) % 4 == 0],
    "fixed": [lambda i, j: i // 4 == j // 4, lambda i, j: j % 4 == 3],
    "dilated": lambda i, j: abs(i - j) <= 4 and (i - j) % 2 == 0,
    "global": lambda i, j: i < 2 or j < 2 or i == j,
    "block_local": lambda i, j: i - i % 4 - 2 <= j < i - i % 4 + 4,
    "local_2d": lambda i, j: (i // 4 - i // 4 % 2 - 1 <= j // 4 < i // 4 - i // 4 % 2 + 2
                              and i % 4 - i % 4 % 2 - 1 <= j % 4 < i % 4 - i % 4 % 2 + 3),
    "longformer": [lambda i, j: i == 0 or j == 0 or (abs(i - j) <= 4 and (i - j) % 2 == 0),
                   lambda i, j: i == 0 or j == 0 or abs(i - j) <= 2],
}


def pattern_reference(model, x, allowed_HxLxL, key_mask_BxL):
    q, k, v = model.project_qkv(x)
    o = reference_attention(q, k, v, allowed_HxLxL, key_mask_BxL)
    return model.out(model.merge_heads(jnp.asarray(o, jnp.float32)))


# blocksparse == dense is test_dense_and_blocksparse_agree; the rest run under `slow`.
@pytest.mark.parametrize("impl", ["dense", pytest.param("blocksparse", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_variant_matches_its_set_definition(name, impl):
    spec = EXPECTED[name]
    allowed = np.stack([from_sets(f) for f in (spec if isinstance(spec, list) else [spec] * H)])
    model = build(name, attention_impl=impl)
    x, mask = normal(3, (B, LEN, DIM)), key_mask()
    y = model(x, padding_mask=mask)
    expected = pattern_reference(model, x, allowed, mask)
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(y)[real], np.asarray(expected)[real], **TOL)


def test_causal_variant_is_pattern_and_causal():
    model = build("strided", causal=True)
    x = normal(4, (B, LEN, DIM))
    tri = np.tri(LEN, dtype=bool)
    allowed = np.stack([from_sets(f) for f in EXPECTED["strided"]]) & tri
    np.testing.assert_allclose(np.asarray(model(x)),
                               np.asarray(pattern_reference(model, x, allowed, None)), **TOL)
    # LRA's behaviour (always causal) is an explicit option; the default is not causal.
    lra = build("strided", lra_causal=True)
    np.testing.assert_allclose(np.asarray(lra(x)),
                               np.asarray(pattern_reference(lra, x, allowed, None)), **TOL)
    assert not np.allclose(np.asarray(build("strided")(x)), np.asarray(lra(x)), **TOL)


def test_strided_a1_is_two_sided_only_when_not_causal():
    """Sparse Transformer A1 = {i-l, ..., i} is the paper's (causal) set; a non-causal
    classifier uses its bidirectional form {i-l, ..., i+l}; LRA's forced-causal option and
    causal=True keep the one-sided A1 (A2, every l-th, is two-sided in all cases)."""
    a1_two = from_sets(lambda i, j: abs(i - j) <= 4)
    a1_one = from_sets(lambda i, j: i - 4 <= j <= i)
    a2 = from_sets(lambda i, j: (i - j) % 4 == 0)
    tri = np.tri(LEN, dtype=bool)
    for hparams, expected in [({}, [a1_two, a2]), ({"causal": True}, [a1_one & tri, a2 & tri]),
                              ({"lra_causal": True}, [a1_one & tri, a2 & tri])]:
        got = np.asarray(build("strided", **hparams).pattern.dense_np(LEN, LEN))
        np.testing.assert_array_equal(got, np.stack(expected), err_msg=str(hparams))
    union = build("strided", heads="union").pattern.dense_np(LEN, LEN)
    np.testing.assert_array_equal(union, a1_two | a2)


def test_random_variant_sees_itself_and_exactly_num_random_keys():
    def pattern(seed=0, max_len=256, prefix_len=0):
        return sparse.build_random(dim=DIM, num_heads=H, max_len=max_len, causal=False,
                                   rngs=nnx.Rngs(0), num_random=8, seed=seed,
                                   prefix_len=prefix_len).pattern
    m = pattern().dense_np(256, 256)
    assert (m.sum(1) == 8 + 1).all() and m.diagonal().all()
    assert len({row.tobytes() for row in m}) == 256  # rows draw their own keys
    assert (pattern(seed=1).dense_np(256, 256) != m).any()
    # With a CLS slot: the CLS row and column are global, each content row sees CLS,
    # itself and exactly 8 other content positions.
    m = pattern(max_len=257, prefix_len=1).dense_np(257, 257)
    assert m[0].all() and m[:, 0].all()
    assert (m[1:, 1:].sum(1) == 8 + 1).all()


def test_causal_random_draws_its_keys_among_the_earlier_positions():
    """Row i keeps itself and min(num_random, i) earlier keys (issue 27: drawn from all
    positions and then masked, row i kept about num_random * i / L of them)."""
    model = sparse.build_random(dim=DIM, num_heads=H, max_len=64, causal=True,
                                rngs=nnx.Rngs(0), num_random=8)
    m = model.pattern.dense_np(64, 64)
    assert not np.triu(m, 1).any()
    np.testing.assert_array_equal(m.sum(1), np.minimum(np.arange(64), 8) + 1)
    assert len({row.tobytes() for row in m[20:]}) == 44  # rows still draw their own


def test_bigbird_global_blocks_are_first_and_last_of_the_content():
    """g = 2 global blocks: the first and the last block of the max_len - prefix_len
    content (google-research/bigbird), not the first two; the CLS slot is global too."""
    model = registry.build("bigbird", dim=DIM, num_heads=H, max_len=33, causal=False,
                           rngs=nnx.Rngs(0), prefix_len=1, block=4, num_random_blocks=1,
                           num_global_blocks=2)
    m = model.pattern.dense_np(33, 33)
    content = m[1:, 1:]  # 8 blocks of 4
    assert m[0].all() and m[:, 0].all()
    for b in (0, 7):
        assert content[4 * b:4 * b + 4].all() and content[:, 4 * b:4 * b + 4].all()
    for b in range(1, 7):
        assert not content[4 * b].all()
        blocks = content[4 * b, ::4]
        # 2 global blocks, the window's others, and 1 random block outside both.
        assert blocks.sum() == 2 + len({b - 1, b, b + 1} - {0, 7}) + 1
    pattern = masks.bigbird(4, 32, num_global_blocks=2, num_random_blocks=1)
    np.testing.assert_array_equal(content, pattern.dense_np(32, 32))


def longformer_reference(model, x, mask, num_global_rows):
    """Local rows: the pattern with query/key/value; global rows: every real key with
    query_global/key_global/value_global (Beltagy et al. 2020, section 3.1)."""
    spec = EXPECTED["longformer"]
    allowed = np.stack([from_sets(f) for f in spec])
    q, k, v = model.project_qkv(x)
    o = reference_attention(q, k, v, allowed, mask)
    qg = model.split_heads(model.query_global(x))
    kg = model.split_heads(model.key_global(x))
    vg = model.split_heads(model.value_global(x))
    og = reference_attention(qg, kg, vg, np.ones((H, LEN, LEN), bool), mask)
    o[:, :, :num_global_rows] = og[:, :, :num_global_rows]
    return model.out(model.merge_heads(jnp.asarray(o, jnp.float32)))


def _perturb(module, seed):
    rng = np.random.default_rng(seed)
    nnx.update(module, jax.tree.map(
        lambda leaf: leaf + jnp.asarray(0.5 * rng.standard_normal(leaf.shape), leaf.dtype),
        nnx.state(module, nnx.Param)))


@pytest.mark.parametrize("impl", ["dense", "blocksparse"])
def test_longformer_global_rows_use_their_own_projections(impl):
    model = build("longformer", attention_impl=impl)  # num_global 1: row 0 is global
    for name in ("query", "key", "value"):  # the global ones start as copies
        np.testing.assert_array_equal(getattr(model, f"{name}_global").kernel[...],
                                      getattr(model, name).kernel[...])
    x, mask = normal(9, (B, LEN, DIM)), key_mask()
    real = np.asarray(mask)
    y0 = np.asarray(model(x, padding_mask=mask))
    _perturb(model.query_global, 0)  # Q_g changes the global rows only
    y1 = np.asarray(model(x, padding_mask=mask))
    assert np.abs(y1[:, 0] - y0[:, 0]).min() > 1e-4
    np.testing.assert_array_equal(y1[:, 1:], y0[:, 1:])
    _perturb(model.key_global, 1)
    _perturb(model.value_global, 2)
    y = model(x, padding_mask=mask)
    expected = longformer_reference(model, x, mask, 1)
    np.testing.assert_allclose(np.asarray(y)[real], np.asarray(expected)[real], **TOL)
    np.testing.assert_array_equal(np.asarray(y)[:, 1:], y0[:, 1:])


def test_longformer_global_rows_include_the_prefix():
    """With a CLS slot the global rows are CLS and the first num_global content tokens;
    global_projections=False: one set of projections (the dense limit's form)."""
    model = registry.build("longformer", dim=DIM, num_heads=H, max_len=LEN, causal=False,
                           rngs=nnx.Rngs(0), prefix_len=1, window=2, num_global=2)
    assert model.num_global_rows == 3
    x = normal(10, (B, LEN, DIM))
    y0 = np.asarray(model(x))
    _perturb(model.query_global, 3)
    y1 = np.asarray(model(x))
    assert (np.abs(y1 - y0).max(axis=(0, 2)) > 0).tolist() == [True] * 3 + [False] * (LEN - 3)
    plain = build("longformer", global_projections=False)
    assert not hasattr(plain, "query_global")
    expected = pattern_reference(plain, x, np.stack([from_sets(f) for f in
                                                     EXPECTED["longformer"]]), None)
    np.testing.assert_allclose(np.asarray(plain(x)), np.asarray(expected), **TOL)


def test_global_extra_tokens_reference():
    model = build("global", extra_tokens=True, num_global=2)
    x, mask = normal(5, (B, LEN, DIM)), key_mask()
    g = jnp.broadcast_to(model.global_embedding[...][None], (B, 2, DIM))
    x_ext = jnp.concatenate([g, x], axis=1)
    mask_ext = jnp.concatenate([jnp.ones((B, 2), bool), mask], axis=1)
    allowed = heads(from_sets(lambda i, j: i < 2 or j < 2 or i == j, LEN + 2))
    expected = pattern_reference(model, x_ext, allowed, mask_ext)[:, 2:]
    y = model(x, padding_mask=mask)
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(y)[real], np.asarray(expected)[real], **TOL)


@pytest.mark.parametrize("impl", ["dense", "blocksparse"])
def test_axial_sum_is_row_pass_plus_column_pass(impl):
    model = build("axial", attention_impl=impl)  # width 4: a 4 x 4 raster
    x, mask = normal(6, (B, LEN, DIM)), key_mask()
    q, k, v = model.project_qkv(x)
    rows = heads(from_sets(lambda i, j: i // 4 == j // 4))
    cols = heads(from_sets(lambda i, j: i % 4 == j % 4))
    o = (reference_attention(q, k, v, rows, mask) + reference_attention(q, k, v, cols, mask))
    expected = model.out(model.merge_heads(jnp.asarray(o, jnp.float32)))
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(model(x, padding_mask=mask))[real],
                               np.asarray(expected)[real], **TOL)
    split = build("axial", mode="split", attention_impl=impl)
    q, k, v = split.project_qkv(x)
    o = reference_attention(q, k, v, np.stack([rows[0], cols[0]]), mask)
    expected = split.out(split.merge_heads(jnp.asarray(o, jnp.float32)))
    np.testing.assert_allclose(np.asarray(split(x, padding_mask=mask))[real],
                               np.asarray(expected)[real], **TOL)


@pytest.mark.parametrize("impl", ["dense"])  # blocksparse: ..._agree_after_a_cls_slot
def test_axial_sum_counts_the_cls_slot_once(impl):
    """With a CLS slot (prefix_len=1) the slot is in the row pass only: its row is one
    full-attention pass (not two summed), and a content row is its row pass with the
    slot plus its column pass without it (issue 27)."""
    model = registry.build("axial", dim=DIM, num_heads=H, max_len=LEN + 1, prefix_len=1,
                           rngs=nnx.Rngs(params=0, dropout=1),
                           **{**registry.capabilities("axial").test_hparams,
                              "attention_impl": impl})
    x = normal(8, (B, LEN + 1, DIM))
    q, k, v = model.project_qkv(x)
    rows = heads(from_sets(lambda i, j: i == 0 or j == 0 or (i - 1) // 4 == (j - 1) // 4,
                           length=LEN + 1))
    cols = np.array(heads(from_sets(
        lambda i, j: i > 0 and j > 0 and (i - 1) % 4 == (j - 1) % 4, length=LEN + 1)))
    o_cols = reference_attention(q, k, v, cols, None)
    o_cols[:, :, 0] = 0.0
    o = reference_attention(q, k, v, rows, None) + o_cols
    expected = model.out(model.merge_heads(jnp.asarray(o, jnp.float32)))
    np.testing.assert_allclose(np.asarray(model(x)), np.asarray(expected), **TOL)


def test_transformer_blocksparse_equals_dense():
    x, mask = normal(7, (B, LEN, DIM)), key_mask()
    dense = registry.build("transformer", dim=DIM, num_heads=H, max_len=LEN,
                           rngs=nnx.Rngs(0), attention_dropout=0.0)
    blocky = registry.build("transformer", dim=DIM, num_heads=H, max_len=LEN,
                            rngs=nnx.Rngs(0), attention_dropout=0.0,
                            attention_impl="blocksparse")
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(blocky(x, padding_mask=mask))[real],
                               np.asarray(dense(x, padding_mask=mask))[real], **TOL)


def test_bad_hparams_are_clear_errors():
    with pytest.raises(registry.RegistryError, match="attention_impl"):
        build("local", attention_impl="flashy")
    with pytest.raises(registry.RegistryError, match="heads"):
        build("strided", heads="both")
    with pytest.raises(registry.RegistryError, match="causal"):
        build("bigbird", causal=True)


@pytest.mark.slow  # ~20 s each; launch.py runs of every variant are in the issue log
@pytest.mark.parametrize("name", PATTERN_VARIANTS)
def test_trains_two_steps(name, listops_dir, tiny_listops_config, tmp_path):
    from lra import train

    config = tiny_listops_config(listops_dir, model=name, num_train_steps=2,
                                 eval_frequency=2, checkpoint_freq=2, num_eval_steps=1)
    config.attention_impl = "blocksparse"
    results = train.train_and_evaluate(config, str(tmp_path))
    assert results["steps"] == 2 and np.isfinite(results["test_accuracy"])


def softmax_attend(q_K, keys_NxK, values_NxD):
    s = keys_NxK @ q_K / np.sqrt(q_K.shape[-1])
    w = np.exp(s - s.max())
    return (w / w.sum()) @ values_NxD


def star_reference(model, x_LxD: np.ndarray, n: int) -> np.ndarray:
    """Star-Transformer on the first n (real) tokens, one node at a time."""
    def lin(layer, a):
        return np.asarray(layer(jnp.asarray(a, jnp.float32)), np.float64)

    def per_head(layer, a):  # L x D -> H x L x K
        p = lin(layer, a)
        return p.reshape(p.shape[0], H, -1).transpose(1, 0, 2)

    def norm(layer, a):
        return np.asarray(layer(jnp.asarray(np.maximum(a, 0.0), jnp.float32)), np.float64)

    e = np.asarray(x_LxD[:n], np.float64)
    h, s = e.copy(), e.mean(0, keepdims=True)
    ke, ve = per_head(model.key, e), per_head(model.value, e)
    for _ in range(model.cycles):
        q, kh, vh = per_head(model.query, h), per_head(model.key, h), per_head(model.value, h)
        ks, vs = per_head(model.key, s), per_head(model.value, s)
        o = np.zeros((n, H, q.shape[-1]))
        for i in range(n):
            ctx = [(i - 1) % n, i, (i + 1) % n]
            for hd in range(H):
                keys = np.concatenate([kh[hd, ctx], ke[hd, [i]], ks[hd]])
                vals = np.concatenate([vh[hd, ctx], ve[hd, [i]], vs[hd]])
                o[i, hd] = softmax_attend(q[hd, i], keys, vals)
        h = norm(model.satellite_norm, lin(model.out, o.reshape(n, -1)))
        hs = np.concatenate([s, h])
        qs, kr, vr = (per_head(getattr(model.relay, p), hs) for p in ("query", "key", "value"))
        o_s = np.stack([softmax_attend(qs[hd, 0], kr[hd], vr[hd]) for hd in range(H)])
        s = norm(model.relay_norm, lin(model.relay.out, o_s.reshape(1, -1)))
    return h


def test_star_matches_reference():
    model = build("star")
    x, mask = normal(8, (B, LEN, DIM)), key_mask()
    y = np.asarray(model(x, padding_mask=mask))
    for b, n in enumerate(np.asarray(mask).sum(1)):
        np.testing.assert_allclose(y[b, :n], star_reference(model, np.asarray(x[b]), n),
                                   rtol=1e-4, atol=1e-4)


def test_global_projections_start_equal_in_buffers_of_their_own():
    """Longformer's global q/k/v start as copies of the local ones (equal values) but in
    new buffers: nnx.clone shared them, and a train step donating a state that holds one
    buffer twice fails ("Attempt to donate the same buffer twice": lra.benchmark's cells)."""
    mixer = registry.build("longformer", dim=16, num_heads=2, max_len=32, causal=False,
                           rngs=nnx.Rngs(0))
    for local, glob in ((mixer.query, mixer.query_global), (mixer.key, mixer.key_global),
                        (mixer.value, mixer.value_global)):
        np.testing.assert_array_equal(local.kernel.value, glob.kernel.value)
    leaves = jax.tree_util.tree_leaves(nnx.state(mixer))
    assert len({id(x) for x in leaves}) == len(leaves)
    state = nnx.state(mixer, nnx.Param)
    jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s), donate_argnums=0)(state)

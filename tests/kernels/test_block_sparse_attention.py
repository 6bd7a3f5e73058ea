"""Block-sparse flash attention kernels against the O(L^2) reference: values, gradients,
unwritten blocks, lowering.

On CPU both flavours (Triton, Mosaic) run in the Pallas interpreter; the lowering tests
check that the same kernels compile to Triton calls for CUDA and Mosaic calls for TPU.
"""
import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import masks
from models.kernels import reference, targets
from tests.kernels import lowering
from tests.kernels.interpreters import TPU_INTERPRETER

# The package re-exports the function under the module's name; fetch the module itself.
bsa = importlib.import_module("models.kernels.block_sparse_attention")
pallas = importlib.import_module("models.kernels.block_sparse_pallas")
tiles = importlib.import_module("models.kernels.block_sparse_tiles")

# Relative to the reference's largest magnitude: f32 differs by summation order only; bf16
# rounds the inputs and the matmul operands (probabilities, dS) to 8 bits of mantissa.
TOLERANCE = {jnp.float32: 2e-5, jnp.bfloat16: 4e-2}

PATTERNS = {
    "local": masks.local(5),
    "causal": masks.causal(),
    "strided_local": masks.strided(6) | masks.local(3),
    "random": masks.random(0.3, seed=2, block=4) | masks.global_tokens([1]),
    "per_head_causal": masks.per_head([masks.local(2), masks.strided(5)], 3) & masks.causal(),
    # j in [i - 6, i - 2], in random 16 x 16 tiles: rows 0 and 1 and (with the seed) whole
    # query blocks have no key at all.
    "empty_rows": masks.Local(6, -2) & masks.random(0.5, seed=1, block=16),
}


# The interpreted kernels are large XLA programs: optimising them costs twice the compile
# time that it saves in running them at these sizes.
_FAST_COMPILE = {"xla_backend_optimization_level": 0}


def _run_fast(fn, *args):
    """jit(fn)(*args), compiled without backend optimisation."""
    return jax.jit(fn).lower(*args).compile(_FAST_COMPILE)(*args)


def _interpret(platform):
    if platform == "tpu":  # Mosaic's TPU interpreter, race detection on (conftest.py)
        return TPU_INTERPRETER if jax.default_backend() != "tpu" else False
    return jax.default_backend() != "gpu"


def _inputs(seed, b, h, q_len, kv_len, dim, dtype):
    rng = np.random.default_rng(seed)
    q, do = (jnp.asarray(rng.standard_normal((b, h, q_len, dim)), jnp.float32)
             for _ in range(2))
    k, v = (jnp.asarray(rng.standard_normal((b, h, kv_len, dim)), jnp.float32)
            for _ in range(2))
    # Batch row 1 has 9 real keys: with a band pattern most of its rows see no key at all.
    padding = jnp.arange(kv_len)[None] < jnp.array([[kv_len], [9]])
    return q.astype(dtype), k.astype(dtype), v.astype(dtype), do, padding


def _allowed(pattern, b, h, q_len, kv_len, padding):
    dense = jnp.broadcast_to(pattern.dense(q_len, kv_len), (h, q_len, kv_len))
    return dense[None] & padding[:, None, None, :]


def _reference(pattern, q, k, v, do, padding):
    b, h, q_len, _ = q.shape
    allowed = _allowed(pattern, b, h, q_len, k.shape[2], padding)

    def run(q, k, v, do):
        out, vjp = jax.vjp(functools.partial(reference.masked_softmax_attention,
                                             allowed_BxHxQxKv=allowed), q, k, v)
        return out, vjp(do)

    return _run_fast(run, *(x.astype(jnp.float32) for x in (q, k, v)), do)


def _assert_close(actual, expected, dtype, what):
    expected = np.asarray(expected, np.float32)
    actual = np.asarray(jnp.asarray(actual, jnp.float32))
    assert np.all(np.isfinite(actual)), f"{what}: non-finite values"
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(actual, expected, rtol=0,
                               atol=TOLERANCE[dtype] * scale + 1e-6, err_msg=what)


def _poisoned_run(pattern, platform, q, k, v, do, padding, block):
    """Forward and both backward passes with every output aliased to a NaN buffer; returns
    the padded outputs (all must be written) and the unpadded gradients."""
    cfg = tiles.make_config(q, k, pattern, block_q=block, block_k=block, platform=platform,
                            interpret=_interpret(platform))
    qp, kp, vp = pallas._padded_qkv(q, k, v, cfg)
    valid = pallas.key_validity(padding, q.shape[0], k.shape[2], cfg)

    def nan(x, dim=None, dtype=jnp.float32):
        return jnp.full(x.shape[:3] + (dim or x.shape[3],), jnp.nan, dtype)

    seed = jnp.array([0, 0, 0, q.shape[1]], jnp.int32)  # seed, offsets, heads

    def run(q, k, v, do, valid):
        out, lse = pallas._fwd_padded(q, k, v, valid, seed, cfg,
                                      (nan(qp, vp.shape[3], q.dtype), nan(qp, 1)))
        grads = pallas._bwd_padded(q, k, v, valid, seed, out, lse, do.astype(q.dtype), cfg,
                                   (nan(qp), nan(kp), nan(vp)))
        return out, lse, grads

    return _run_fast(run, q, k, v, do, valid), cfg


# Interpret mode compiles slowly (~5 s a pass on CPU): by default five cases cover both
# flavours, both dtypes and every pattern kind (empty rows in both flavours: their write
# paths differ); the full matrix is marked slow. (local, with global tokens, runs in
# test_public_entry_point_and_custom_vjp.)
DEFAULT_CASES = {("gpu", jnp.float32): {"strided_local", "per_head_causal", "empty_rows"},
                 ("gpu", jnp.bfloat16): {"random"},
                 ("tpu", jnp.float32): {"empty_rows"},
                 ("tpu", jnp.bfloat16): set()}


def _cases():
    for platform, flavour in (("gpu", "triton"), ("tpu", "mosaic")):
        for dtype in (jnp.float32, jnp.bfloat16):
            for name in PATTERNS:
                default = name in DEFAULT_CASES[(platform, dtype)]
                yield pytest.param(name, platform, dtype,
                                   id=f"{flavour}-{jnp.dtype(dtype).name}-{name}",
                                   marks=[] if default else [pytest.mark.slow])


@pytest.mark.parametrize("name,platform,dtype", list(_cases()))
def test_values_and_gradients_match_reference(name, platform, dtype):
    """3 heads, L = 40 (two and a half 16-blocks), padding; every output buffer poisoned."""
    pattern = PATTERNS[name]
    q, k, v, do, padding = _inputs(0, 2, 3, 40, 40, 8, dtype)
    (out_p, lse_p, grads), cfg = _poisoned_run(pattern, platform, q, k, v, do, padding, 16)
    # Every block of every buffer was written, the padded rows and columns included.
    assert np.all(np.isfinite(np.asarray(out_p, np.float32))), "unwritten output block"
    assert np.all(np.isfinite(np.asarray(lse_p))), "unwritten lse block"
    ref_out, ref_grads = _reference(pattern, q, k, v, do, padding)
    assert out_p.dtype == dtype
    _assert_close(out_p[:, :, :40, :8], ref_out, dtype, "out")
    for what, grad, ref_grad in zip("qkv", grads, ref_grads):
        assert grad.dtype == dtype
        _assert_close(grad, ref_grad, dtype, f"d{what}")
    if name == "empty_rows":
        allowed = np.asarray(_allowed(pattern, 2, 3, 40, 40, padding))
        empty = ~allowed.any(-1)  # B x H x Q
        lay = pattern.blocks(40, 40, cfg.block_q, cfg.block_k).layout
        assert empty[0, :, :2].all() and (lay == masks.EMPTY).all(-1).any(), \
            "the case must have empty rows and a whole empty query block"
        assert np.all(np.asarray(out_p[:, :, :40])[empty] == 0)
        assert np.all(np.asarray(grads[0])[empty] == 0)


@pytest.mark.parametrize("platform", ["gpu", pytest.param("tpu", marks=pytest.mark.slow)],
                         ids=["triton", "mosaic"])
def test_public_entry_point_and_custom_vjp(platform):
    """`block_sparse_attention(backend="pallas")` and jax.grad through its custom VJP, with
    fewer queries than keys (the queries are the last positions) and a default tile."""
    pattern = masks.local(4) | masks.global_tokens([0])
    q, _, _, do, _ = _inputs(1, 1, 2, 20, 20, 8, jnp.float32)
    _, k, v, _, padding = _inputs(2, 2, 2, 20, 33, 8, jnp.float32)
    q = jnp.concatenate([q, q[:, :, ::-1]])
    do = jnp.concatenate([do, do])

    def loss(fn, q, k, v):
        return jnp.sum(fn(q, k, v) * do)

    kernel = functools.partial(bsa.block_sparse_attention, pattern=pattern,
                               padding_mask=padding, backend="pallas", platform=platform,
                               interpret=_interpret(platform))
    allowed = _allowed(pattern, 2, 2, 20, 33, padding)
    ref = functools.partial(reference.masked_softmax_attention, allowed_BxHxQxKv=allowed)
    out, grads = _run_fast(jax.value_and_grad(functools.partial(loss, kernel), (0, 1, 2)),
                           q, k, v)
    ref_out, ref_grads = _run_fast(jax.value_and_grad(functools.partial(loss, ref), (0, 1, 2)),
                                   q, k, v)
    np.testing.assert_allclose(out, ref_out, rtol=1e-5)
    for grad, ref_grad in zip(grads, ref_grads):
        _assert_close(grad, ref_grad, jnp.float32, "grad")


def _dropout_multipliers(seed, b, h, q_len, kv_len, rate):
    """The kernels' keep mask for every (batch, head, query, key), built outside them."""
    bh = (jnp.arange(b)[:, None] * h + jnp.arange(h)[None, :])[:, :, None, None]
    i = jnp.arange(q_len)[None, None, :, None]
    j = jnp.arange(kv_len)[None, None, None, :]
    return tiles.dropout_multiplier(seed, bh, i, j, rate)


@pytest.mark.parametrize("platform", ["gpu", "tpu"], ids=["triton", "mosaic"])
def test_dropout_matches_reference_with_the_same_mask(platform):
    """Forward and all three gradients with dropout equal the O(L^2) reference that drops
    the same weights (`dropout_multiplier` on the whole index grid)."""
    pattern = masks.local(4) | masks.global_tokens([0])
    q, _, _, do, _ = _inputs(3, 2, 2, 20, 20, 8, jnp.float32)
    _, k, v, _, padding = _inputs(4, 2, 2, 20, 33, 8, jnp.float32)
    rate, seed = 0.3, jnp.int32(1234)

    def loss(fn, q, k, v):
        return jnp.sum(fn(q, k, v) * do)

    kernel = functools.partial(bsa.block_sparse_attention, pattern=pattern,
                               padding_mask=padding, backend="pallas", block_q=16,
                               block_k=16, dropout_rate=rate, dropout_seed=seed,
                               platform=platform, interpret=_interpret(platform))
    multiplier = _dropout_multipliers(seed, 2, 2, 20, 33, rate)
    ref = functools.partial(reference.masked_softmax_attention,
                            allowed_BxHxQxKv=_allowed(pattern, 2, 2, 20, 33, padding),
                            multiplier_BxHxQxKv=multiplier)
    out, grads = _run_fast(jax.value_and_grad(functools.partial(loss, kernel), (0, 1, 2)),
                           q, k, v)
    ref_out, ref_grads = _run_fast(jax.value_and_grad(functools.partial(loss, ref), (0, 1, 2)),
                                   q, k, v)
    np.testing.assert_allclose(out, ref_out, rtol=1e-5)
    for what, grad, ref_grad in zip("qkv", grads, ref_grads):
        _assert_close(grad, ref_grad, jnp.float32, f"d{what}")
    # The mask matters: without it the reference is another function.
    plain = functools.partial(reference.masked_softmax_attention,
                              allowed_BxHxQxKv=_allowed(pattern, 2, 2, 20, 33, padding))
    assert not np.allclose(loss(plain, q, k, v), ref_out, rtol=1e-3)


def test_dropout_multiplier_statistics():
    rate = 0.1
    m = np.asarray(_dropout_multipliers(jnp.int32(7), 2, 4, 256, 512, rate))
    assert set(np.unique(m)) == {0.0, np.float32(1 / (1 - rate))}
    dropped = m == 0
    # 1M draws: the fraction is within 5 standard deviations (3e-4) of the rate.
    assert abs(dropped.mean() - rate) < 5 * np.sqrt(rate * (1 - rate) / dropped.size)
    # No structure along rows, columns or heads: every slice drops about `rate`.
    for axis in (1, 2, 3):
        per_slice = dropped.mean(axis=tuple(a for a in range(4) if a != axis))
        assert np.all(np.abs(per_slice - rate) < 0.05), axis
    # Neighbouring weights, heads and seeds are (nearly) uncorrelated.
    def corr(a, b):
        return np.corrcoef(a.ravel().astype(np.float64), b.ravel().astype(np.float64))[0, 1]
    assert abs(corr(dropped[..., 1:], dropped[..., :-1])) < 0.01
    assert abs(corr(dropped[:, :, 1:], dropped[:, :, :-1])) < 0.01
    assert abs(corr(dropped[:, 1:], dropped[:, :-1])) < 0.01
    other = np.asarray(_dropout_multipliers(jnp.int32(8), 2, 4, 256, 512, rate)) == 0
    assert abs(corr(dropped, other)) < 0.01
    # The same seed gives the same mask (the backward passes rely on it).
    again = np.asarray(_dropout_multipliers(jnp.int32(7), 2, 4, 256, 512, rate)) == 0
    assert np.array_equal(dropped, again)


def test_block_lists_are_the_layout_and_its_transpose():
    pattern = masks.per_head([masks.local(20), masks.strided(24)]) & masks.causal()
    cfg = tiles._Config(pattern, 100, 130, 16, 32, 1.0, "gpu", True)
    by_q, by_k = tiles._lists(cfg)
    layout = pattern.blocks(100, 130, 16, 32).layout  # H x Nq x Nk
    for lists, lay in ((by_q, layout), (by_k, layout.transpose(0, 2, 1))):
        rows = lay.shape[1]
        idx = lists.indices.reshape(2, rows, lists.width)
        counts = lists.counts.reshape(2, rows)
        full = lists.full.reshape(2, rows, lists.width)
        for p in range(2):
            for r in range(rows):
                nonempty = np.flatnonzero(lay[p, r] != masks.EMPTY)
                c = counts[p, r]
                assert c == len(nonempty) and list(idx[p, r, :c]) == list(nonempty)
                # Padded slots repeat the last valid block: the TPU pipeline fetches nothing.
                assert np.all(idx[p, r, c:] == (nonempty[-1] if c else 0))
                assert list(full[p, r, :c]) == list(lay[p, r, nonempty] == masks.FULL)


# Lowering: the kernels compile for the real targets, forward and backward, at a realistic
# size (L = 1000: not a multiple of the 128 tile), with padding.
LOWERING_PATTERNS = ["local", "causal", "strided_local", "random", "per_head_causal"]


def _forward_and_backward(pattern, platform, dropout_rate=0.0):
    def fn(q, k, v, g, padding):
        out, vjp = jax.vjp(functools.partial(
            bsa.block_sparse_attention, pattern=pattern, padding_mask=padding,
            backend="pallas", block_q=128, block_k=128, platform=platform, interpret=False,
            dropout_rate=dropout_rate, dropout_seed=jnp.int32(5) if dropout_rate else None),
            q, k, v)
        return out, vjp(g)
    return fn


def _lowering_args(dtype, heads=3):
    x = jax.ShapeDtypeStruct((2, heads, 1000, 64), dtype)
    return x, x, x, x, jax.ShapeDtypeStruct((2, 1000), jnp.bool_)


def _lowering_cases(names):
    for name in names:
        slow = name not in ("local", "random", "per_head_causal")
        yield pytest.param(name, jnp.float32, id=f"f32-{name}",
                           marks=[pytest.mark.slow] if slow else [])
    yield pytest.param("local", jnp.bfloat16, id="bf16-local")


def _pattern(name):
    # As the variants build them inside the classifier: content patterns after a CLS slot.
    if name == "prefixed_local":
        return masks.prefixed(masks.local(100), 1)
    if name == "random_keys":
        return masks.prefixed(masks.random(num_keys=8, kv_len=999, seed=0, skip_window=0)
                              | masks.local(0), 1)
    if name == "bigbird":
        return masks.prefixed(masks.bigbird(64, 999, num_global_blocks=2,
                                            num_random_blocks=3), 1)
    if name == "per_head_causal":
        return masks.per_head([masks.local(100), masks.strided(50)], 3) & masks.causal()
    return {"local": masks.local(100), "causal": masks.causal(),
            "strided_local": masks.strided(32) | masks.local(64),
            "random": masks.random(0.2, seed=0, block=128) | masks.global_tokens([0])}[name]


def _with_dropout(cases):
    return [*cases, pytest.param("local", jnp.bfloat16, 0.1, id="bf16-local-dropout")]


@pytest.mark.parametrize("name,dtype,dropout_rate", _with_dropout(
    pytest.param(*c.values, 0.0, id=c.id, marks=c.marks)
    for c in _lowering_cases(LOWERING_PATTERNS)))
def test_triton_kernels_lower_for_cuda(name, dtype, dropout_rate):
    _lower_for_cuda(name, dtype, dropout_rate)


@pytest.mark.parametrize("name", ["prefixed_local", "random_keys", "bigbird"])
def test_classifier_patterns_lower_for_cuda(name):
    """The CLS prefix, exactly-r random keys (a per-row uint32 modulus) and BigBird's
    first/last global blocks in Triton (lowering on this host; not a GPU run)."""
    _lower_for_cuda(name, jnp.float32, 0.0)


def _lower_for_cuda(name, dtype, dropout_rate):
    text = lowering.for_cuda(_forward_and_backward(_pattern(name), "gpu", dropout_rate),
                             *_lowering_args(dtype))
    # forward, backward dQ, backward dK/dV: three Triton calls.
    assert text.count(lowering.TRITON) == 3


# Predicates with integer floor division (random, fixed, bigbird, local_2d) lower too, but
# Mosaic's `sign` rule asks the attached TPU for its generation, so they cannot be exported
# from a host without one.
@pytest.mark.parametrize("name,dtype,dropout_rate", _with_dropout(
    pytest.param(*c.values, 0.0, id=c.id, marks=c.marks)
    for c in _lowering_cases([n for n in LOWERING_PATTERNS if n != "random"])))
def test_mosaic_kernels_export_for_tpu(name, dtype, dropout_rate):
    _export_for_tpu(name, dtype, dropout_rate)


def test_prefixed_pattern_exports_for_tpu():
    """The CLS prefix around a content pattern in Mosaic (export on this host)."""
    _export_for_tpu("prefixed_local", jnp.float32, 0.0)


def _export_for_tpu(name, dtype, dropout_rate):
    text = lowering.for_tpu(_forward_and_backward(_pattern(name), "tpu", dropout_rate),
                            *_lowering_args(dtype))
    assert text.count(lowering.MOSAIC_TPU) == 3


def _default_forward_and_backward(dropout_rate):
    """The defaults, as the pattern variants call it: the form follows the platform."""
    def fn(q, k, v, g, padding):
        out, vjp = jax.vjp(functools.partial(
            bsa.block_sparse_attention, pattern=_pattern("local"), padding_mask=padding,
            backend="pallas", block_q=128, block_k=128, dropout_rate=dropout_rate,
            dropout_seed=jnp.int32(5) if dropout_rate else None), q, k, v)
        return out, vjp(g)
    return fn


def test_default_form_follows_the_lowering_platform():
    """Traced on this CPU: Triton when lowered for CUDA, Mosaic when exported for TPU,
    the interpreter for the CPU."""
    fn, args = _default_forward_and_backward(0.1), _lowering_args(jnp.float32)
    cuda = lowering.custom_calls(lowering.for_cuda(fn, *args))
    assert cuda.count(lowering.TRITON) == 3 and lowering.MOSAIC_TPU not in cuda, cuda
    tpu = lowering.custom_calls(lowering.for_tpu(fn, *args))
    assert tpu.count(lowering.MOSAIC_TPU) == 3 and lowering.TRITON not in tpu, tpu
    cpu = jax.jit(fn).trace(*args).lower(
        lowering_platforms=("cpu",)).as_text()  # for the CPU on any machine
    assert lowering.TRITON not in cpu and lowering.MOSAIC_TPU not in cpu


@pytest.mark.parametrize("dropout_rate", [0.0, 0.3], ids=["no-dropout", "dropout"])
def test_gpu_without_triton_falls_back_without_a_kernel(dropout_rate, monkeypatch, capsys):
    """A JAX without Pallas's Triton backend: on a GPU the same function without a kernel
    (the XLA block-sparse path; with dropout the same hashed mask, densely), said in one
    line. Checked here by running the fallback on the CPU against the interpreted kernel."""
    pattern = masks.local(4) | masks.global_tokens([0])
    q, _, _, do, _ = _inputs(3, 2, 2, 20, 20, 8, jnp.float32)
    _, k, v, _, padding = _inputs(4, 2, 2, 20, 33, 8, jnp.float32)

    def loss(q, k, v, **kw):
        return jnp.sum(bsa.block_sparse_attention(
            q, k, v, pattern, padding_mask=padding, backend="pallas", block_q=16, block_k=16,
            dropout_rate=dropout_rate, dropout_seed=jnp.int32(7) if dropout_rate else None,
            **kw) * do)

    # Both at full float32: on a real GPU the XLA path's matmuls would otherwise take
    # JAX's default precision, TF32 (1e-4-relative on this loss, measured on an H100),
    # while the compiled kernel computes float32 at HIGHEST.
    with jax.default_matmul_precision("highest"):
        kernel = _run_fast(jax.value_and_grad(loss, (0, 1, 2)), q, k, v)
        monkeypatch.setattr(targets, "gpu_backend", lambda: None)
        monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
        monkeypatch.setattr(targets, "_SAID", set())
        fallback = _run_fast(jax.value_and_grad(functools.partial(loss, interpret=False),
                                                (0, 1, 2)), q, k, v)
    np.testing.assert_allclose(fallback[0], kernel[0], rtol=1e-5)
    for what, grad, ref_grad in zip("qkv", fallback[1], kernel[1]):
        _assert_close(grad, ref_grad, jnp.float32, f"d{what}")
    line = capsys.readouterr().err.strip()
    assert line.count("\n") == 0 and "no Triton backend" in line and "XLA path" in line


def test_bad_arguments_raise():
    q = jnp.ones((1, 1, 8, 4))
    with pytest.raises(ValueError, match="dropout_rate and dropout_seed"):
        bsa.block_sparse_attention(q, q, q, masks.local(1), backend="pallas",
                                   dropout_fn=lambda w: w)
    with pytest.raises(ValueError, match="needs a dropout_seed"):
        bsa.block_sparse_attention(q, q, q, masks.local(1), backend="pallas",
                                   dropout_rate=0.1)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        bsa.block_sparse_attention(q, q, q, masks.local(1), backend="pallas",
                                   dropout_rate=1.0, dropout_seed=0)
    with pytest.raises(ValueError, match="takes dropout_fn"):
        bsa.block_sparse_attention(q, q, q, masks.local(1), dropout_rate=0.1)
    with pytest.raises(ValueError, match="platform"):
        bsa.block_sparse_attention(q, q, q, masks.local(1), backend="pallas", platform="cpu")
    with pytest.raises(ValueError, match="backend"):
        bsa.block_sparse_attention(q, q, q, masks.local(1), backend="cuda")


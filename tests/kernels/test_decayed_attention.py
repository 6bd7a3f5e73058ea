"""Decayed linear attention kernels (models/kernels/decayed_attention.py) against
`models.attention.retention.chunked_retention`: values, gradients (q, k, v and log a: the
kernels' d log a comes from the identity dB_t = q_t dq_t - k_t dk_t and a reverse cumsum,
checked here against jax.grad of the reference), long sequences, lowering.

On CPU the Pallas kernels run in interpret mode; on a GPU the Triton flavour runs compiled
(the Mosaic flavour stays interpreted anywhere but a TPU).
"""
import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention.retention import chunked_retention
from models.kernels import targets
from tests.kernels import lowering
from tests.kernels.interpreters import TPU_INTERPRETER

# The package re-exports the function under the module's name; fetch the module itself.
da = importlib.import_module("models.kernels.decayed_attention")

IMPLS = {"xla": ("xla", None), "triton": ("pallas", "gpu"), "mosaic": ("pallas", "tpu")}
# Relative to the reference's largest magnitude. float32: the same algorithm up to the
# summation order (measured <= 1.1e-6). bfloat16: the inputs and every matmul operand
# (q exp(b), the state) rounded to 8 bits of mantissa, float32 accumulation (measured
# <= 6.5e-3).
TOLERANCE = {jnp.float32: 2e-5, jnp.bfloat16: 2e-2}
B, H, L, K, V = 2, 2, 37, 8, 12  # L: two chunks of 16 and a ragged third


def _interpret(platform):
    if platform == "tpu":  # Mosaic's TPU interpreter, race detection on (conftest.py)
        return TPU_INTERPRETER if jax.default_backend() != "tpu" else False
    return None  # the default: interpret on CPU only


def _inputs(seed, gates, length=L, strength=3.0):
    """Normal q, k, v and cotangent; log a = logsigmoid(3 x normal): decays from ~1 to
    ~e^-10, so that they matter. numpy draws (jax.random compiles per shape)."""
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((B, H, length, K), np.float32) for _ in range(2))
    v, g = (rng.standard_normal((B, H, length, V), np.float32) for _ in range(2))
    logits = strength * rng.standard_normal((B, H, length, gates), np.float32)
    return tuple(map(jnp.asarray, (q, k, v, jax.nn.log_sigmoid(logits), g)))


def _value_and_grads(fn, q, k, v, log_a, g):
    """fn(q, k, v, log a) and its VJP with cotangent g (the gradient of sum(o * g)), one
    program; on CPU compiled without backend optimisation (the interpreted kernels
    compile about twice as fast)."""
    def run(q, k, v, log_a, g):
        out, vjp = jax.vjp(fn, q, k, v, log_a)
        return out, vjp(g.astype(out.dtype))

    args = (q, k, v, log_a, g)
    options = ({"xla_backend_optimization_level": 0} if jax.default_backend() == "cpu"
               else None)
    return jax.jit(run).lower(*args).compile(options)(*args)


def _chunked(q, k, v, log_a, *, strict, chunk_size):
    # The reference's matmuls at full float32: the models' form takes JAX's default
    # precision, which on an Ampere-or-later GPU is TF32 (10-bit mantissa; 1e-3-relative
    # differences, measured on an H100: results/gpu/NOTES.md), while the kernels compute
    # float32 at HIGHEST. On CPU the default already is full float32.
    with jax.default_matmul_precision("highest"):
        return chunked_retention(q, k, v, log_a, chunk_size=chunk_size, strict=strict)[0]


@functools.lru_cache(maxsize=None)
def _reference(seed, gates, strict):
    fn = functools.partial(_chunked, strict=strict, chunk_size=5)
    return _value_and_grads(fn, *_inputs(seed, gates))


def _assert_close(actual, expected, dtype, what, scale=None):
    """Within TOLERANCE[dtype] of `scale`, by default the expected largest magnitude."""
    expected = np.asarray(expected, np.float32)
    actual = np.asarray(jnp.asarray(actual, jnp.float32))
    assert np.all(np.isfinite(actual)), f"{what}: non-finite values"
    scale = float(np.abs(expected).max()) if scale is None else scale
    np.testing.assert_allclose(actual, expected, rtol=0, atol=TOLERANCE[dtype] * scale,
                               err_msg=what)


def _assert_grads_close(grads, ref_grads, q, dtype):
    """dq, dk, dv, d log a. d log a is a difference q dq - k dk summed backwards: its
    rounding is relative to q dq, not to itself (at L = 1 it is 0 up to that)."""
    for name, grad, ref_grad in zip(("q", "k", "v", "log_a"), grads, ref_grads):
        assert grad.shape == ref_grad.shape
        scale = None
        if name == "log_a":
            scale = max(float(jnp.max(jnp.abs(ref_grad))),
                        float(jnp.max(jnp.abs(q.astype(jnp.float32) * ref_grads[0]))))
        _assert_close(grad, ref_grad, dtype, f"d{name}", scale)


def _cases():
    """float32: the XLA and Triton flavours for both decay kinds, strict or not; Mosaic
    for two of the four (the rest under slow). bfloat16: one case per decay kind."""
    for impl in IMPLS:
        for gates in ("scalar", "gate"):
            for strict in (False, True):
                for dtype in (jnp.float32, jnp.bfloat16):
                    default = (impl != "mosaic" or (gates == "gate") == strict) \
                        if dtype == jnp.float32 else (impl, gates) in (
                            ("xla", "scalar"), ("triton", "gate"))
                    name = (f"{impl}-{gates}-{'strict' if strict else 'inclusive'}-"
                            f"{jnp.dtype(dtype).name}")
                    yield pytest.param(impl, gates, strict, dtype, id=name,
                                       marks=[] if default else [pytest.mark.slow])


@pytest.mark.parametrize("impl,gates,strict,dtype", list(_cases()))
def test_values_and_gradients_match_chunked_retention(impl, gates, strict, dtype):
    backend, platform = IMPLS[impl]
    q, k, v, log_a, g = _inputs(1, 1 if gates == "scalar" else K)
    fn = functools.partial(da.decayed_linear_attention, strict=strict, backend=backend,
                           platform=platform, chunk_size=16, interpret=_interpret(platform))
    out, grads = _value_and_grads(fn, q.astype(dtype), k.astype(dtype), v.astype(dtype),
                                  log_a, g)
    ref_out, ref_grads = _reference(1, 1 if gates == "scalar" else K, strict)
    assert out.dtype == dtype and out.shape == v.shape
    assert [x.dtype for x in grads] == [dtype] * 3 + [jnp.float32]
    _assert_close(out, ref_out, dtype, "out")
    _assert_grads_close(grads, ref_grads, q, dtype)


def test_default_chunks_and_one_position():
    """L = 1 (one real row in a padded chunk) and the default chunk sizes, Triton."""
    for gates in (1, K):
        q, k, v, log_a, g = (x[:, :, :1] for x in _inputs(2, gates))
        fn = functools.partial(da.decayed_linear_attention, platform="gpu")
        out, grads = _value_and_grads(fn, q, k, v, log_a, g)
        ref_out, ref_grads = _value_and_grads(
            functools.partial(_chunked, strict=False, chunk_size=4), q, k, v, log_a, g)
        _assert_close(out, ref_out, jnp.float32, "out")
        _assert_grads_close(grads, ref_grads, q, jnp.float32)


@pytest.mark.parametrize("platform,gates", [("gpu", 1), ("tpu", K)],
                         ids=["triton-scalar", "mosaic-gate"])
def test_every_output_block_is_written(platform, gates):
    """Outputs alias NaN-filled buffers: a chunk left unwritten shows up (strict, ragged)."""
    q, k, v, log_a, g = _inputs(3, gates)
    cfg = da.make_config(q, k, v, log_a, strict=True, chunk_size=16, platform=platform,
                         interpret=_interpret(platform))
    length = -(-L // 16) * 16

    def nan(dim):
        return jnp.full((B, H, length, da._width(dim, cfg)), jnp.nan, jnp.float32)

    out = jax.jit(da._forward, static_argnums=4)(q, k, v, log_a, cfg, (nan(V),))
    grads = jax.jit(da._backward, static_argnums=5)(q, k, v, log_a, g, cfg,
                                                    (nan(K), nan(K), nan(V)))
    ref_out, ref_grads = _reference(3, gates, True)
    _assert_close(out, ref_out, jnp.float32, "out")
    _assert_grads_close(grads, ref_grads, q, jnp.float32)


@pytest.mark.parametrize("gates", [1, 4], ids=["scalar", "gate"])
def test_long_sequence_with_strong_decays_stays_finite(gates):
    """L = 16384 with log a ~ -5 (b reaches about -640 inside a 128-chunk and the whole
    row's cumulative sum -82000: exp(-B) would overflow): the XLA flavour's forward and
    gradients are finite and the forward equals the reference; a short interpreted Triton
    run (L = 512, 32 chunks of 16) too."""
    rng = np.random.default_rng(4)
    shape = (1, 2, 16384, 4)
    q, k, v, g = (jnp.asarray(rng.standard_normal(shape, np.float32)) for _ in range(4))
    log_a = jnp.asarray(np.minimum(-5.0 + 0.5 * rng.standard_normal(
        shape[:3] + (gates,)), 0.0), jnp.float32)
    fn = functools.partial(da.decayed_linear_attention, backend="xla")
    out, grads = _value_and_grads(fn, q, k, v, log_a, g)
    # The exponents b_i - b_j are differences of sums near -640: float32 keeps them to
    # ~4e-5, in the reference as here.
    ref = _chunked(q, k, v, log_a, strict=False, chunk_size=64)
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-4 * float(jnp.max(jnp.abs(ref))))
    for grad in grads:
        assert np.all(np.isfinite(np.asarray(grad)))
    short = tuple(x[:, :, :512] for x in (q, k, v, log_a))
    out = jax.jit(functools.partial(da.decayed_linear_attention, platform="gpu",
                                    chunk_size=16))(*short)
    np.testing.assert_allclose(out, ref[:, :, :512], rtol=0,
                               atol=2e-5 * float(jnp.max(jnp.abs(ref))))


def _forward_and_backward(strict, platform):
    def fn(q, k, v, log_a, g):
        out, vjp = jax.vjp(functools.partial(
            da.decayed_linear_attention, strict=strict, platform=platform, interpret=False),
            q, k, v, log_a)
        return out, vjp(g)
    return fn


def _lowering_args(dtype, gates):
    q = jax.ShapeDtypeStruct((2, 4, 300, 64), dtype)
    v = jax.ShapeDtypeStruct((2, 4, 300, 32), dtype)
    return q, q, v, jax.ShapeDtypeStruct((2, 4, 300, gates), jnp.float32), v


LOWERING = pytest.mark.parametrize("dtype,gates,strict", [
    (jnp.float32, 1, False), (jnp.float32, 64, True), (jnp.bfloat16, 1, True),
    (jnp.bfloat16, 64, False)], ids=["f32-scalar", "f32-gate-strict", "bf16-scalar-strict",
                                     "bf16-gate"])


@LOWERING
def test_triton_kernels_lower_for_cuda(dtype, gates, strict):
    text = lowering.for_cuda(_forward_and_backward(strict, "gpu"),
                             *_lowering_args(dtype, gates))
    # forward, backward-dq, backward-dkv: three Triton calls.
    assert text.count(lowering.TRITON) == 3, text[:2000]


@LOWERING
def test_mosaic_kernels_export_for_tpu(dtype, gates, strict):
    text = lowering.for_tpu(_forward_and_backward(strict, "tpu"), *_lowering_args(dtype, gates))
    assert text.count(lowering.MOSAIC_TPU) == 3


def _default_forward_and_backward(q, k, v, log_a, g):
    """The defaults, as retnet, gla and mamba2 call it."""
    out, vjp = jax.vjp(da.decayed_linear_attention, q, k, v, log_a)
    return out, vjp(g)


def test_default_form_follows_the_lowering_platform():
    """Traced on this CPU (which used to pick the interpreter for every target): Triton
    when lowered for CUDA, Mosaic when exported for TPU, the interpreter for the CPU."""
    args = _lowering_args(jnp.float32, 1)
    cuda = lowering.custom_calls(lowering.for_cuda(_default_forward_and_backward, *args))
    assert cuda.count(lowering.TRITON) == 3 and lowering.MOSAIC_TPU not in cuda, cuda
    tpu = lowering.custom_calls(lowering.for_tpu(_default_forward_and_backward, *args))
    assert tpu.count(lowering.MOSAIC_TPU) == 3 and lowering.TRITON not in tpu, tpu
    cpu = jax.jit(_default_forward_and_backward).trace(*args).lower(
        lowering_platforms=("cpu",)).as_text()  # for the CPU on any machine
    assert lowering.TRITON not in cpu and lowering.MOSAIC_TPU not in cpu


def test_gpu_without_triton_falls_back_to_the_xla_path(monkeypatch, capsys):
    """A JAX without Pallas's Triton backend: on a GPU the XLA path, said in one line."""
    monkeypatch.setattr(targets, "gpu_backend", lambda: None)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(targets, "_SAID", set())
    fresh = lambda *args: _default_forward_and_backward(*args)  # noqa: E731 (no trace cache)
    assert lowering.custom_calls(lowering.for_cuda(fresh, *_lowering_args(jnp.float32, 1))) == []
    line = capsys.readouterr().err.strip()
    assert line.count("\n") == 0 and "no Triton backend" in line and "XLA path" in line


def test_bad_arguments_raise():
    q = jnp.ones((1, 1, 8, 4))
    log_a = jnp.zeros((1, 1, 8, 1))
    with pytest.raises(ValueError, match="backend"):
        da.decayed_linear_attention(q, q, q, log_a, backend="cuda")
    with pytest.raises(ValueError, match="power of two"):
        da.decayed_linear_attention(q, q, q, log_a, platform="gpu", chunk_size=24)
    with pytest.raises(ValueError, match="multiple of 8"):
        da.decayed_linear_attention(q, q, q, log_a, platform="tpu", chunk_size=12)
    with pytest.raises(ValueError, match="log_a"):
        da.decayed_linear_attention(q, q, q, jnp.zeros((1, 1, 8, 3)))
    with pytest.raises(ValueError, match="q and k"):
        da.decayed_linear_attention(q, q[..., :2], q, log_a)

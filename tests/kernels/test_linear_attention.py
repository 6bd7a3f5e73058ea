"""Linear attention kernels against the O(L^2) reference: values, gradients, lowering.

On CPU the Pallas kernels run in interpret mode; on a GPU the Triton flavour runs compiled
(the Mosaic flavour stays interpreted anywhere but a TPU).
"""
import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.kernels import reference, targets
from tests.kernels import lowering
from tests.kernels.interpreters import TPU_INTERPRETER

# The package re-exports the function under the module's name; fetch the module itself.
la = importlib.import_module("models.kernels.linear_attention")

# (backend, platform): the plain-JAX chunked scan, the Triton kernels, the Mosaic kernels.
IMPLS = [("xla", None), ("pallas", "gpu"), ("pallas", "tpu")]
IMPL_IDS = ["xla", "triton", "mosaic"]
# Relative to the reference's largest magnitude: f32 is exact up to summation order; bf16
# rounds inputs and the matmul operands (the states are kept in f32).
TOLERANCE = {jnp.float32: 2e-5, jnp.bfloat16: 3e-2}


def _interpret(platform):
    if platform == "tpu":  # Mosaic's TPU interpreter, race detection on (conftest.py)
        return TPU_INTERPRETER if jax.default_backend() != "tpu" else False
    return None  # the default: interpret on CPU only


def _inputs(seed, shape_q, value_dim, dtype):
    """Positive features (elu + 1 of normals), normal values and a normal cotangent."""
    # numpy's generator: jax.random would add seconds of compilation to every run.
    rng = np.random.default_rng(seed)
    shape_v = shape_q[:3] + (value_dim,)
    q, k = (jax.nn.elu(rng.standard_normal(shape_q, np.float32)) + 1.0 for _ in range(2))
    v, g = (jnp.asarray(rng.standard_normal(shape_v, np.float32)) for _ in range(2))
    return tuple(x.astype(dtype) for x in (q, k, v)) + (g,)


def _assert_close(actual, expected, dtype, what):
    expected = np.asarray(expected, np.float32)
    actual = np.asarray(jnp.asarray(actual, jnp.float32))
    assert np.all(np.isfinite(actual)), f"{what}: non-finite values"
    scale = float(np.abs(expected).max())
    # The floor covers gradients that cancel to ~0 (one position: out_i = v_i - O(eps)).
    np.testing.assert_allclose(actual, expected, rtol=0,
                               atol=TOLERANCE[dtype] * scale + 1e-6, err_msg=what)


def _value_and_grads(fn, q, k, v, g):
    """fn(q, k, v) and its VJP with cotangent g, compiled as one program."""
    @jax.jit
    def run(q, k, v, g):
        out, vjp = jax.vjp(fn, q, k, v)
        return out, vjp(g.astype(out.dtype))

    return run(q, k, v, g)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_references_agree(causal):
    q, k, v, _ = _inputs(0, (2, 3, 37, 5), 7, jnp.float32)
    _assert_close(reference.linear_attention_cumsum(q, k, v, causal=causal),
                  reference.linear_attention_quadratic(q, k, v, causal=causal),
                  jnp.float32, "cumsum vs quadratic")


def _cases():
    """Every flavour in f32, both modes; bf16 by default only where the chunk math is not
    already covered (XLA and Triton, causal: the state and intra-chunk paths)."""
    for (backend, platform), impl_id in zip(IMPLS, IMPL_IDS):
        for dtype, causal in [(jnp.float32, False), (jnp.float32, True),
                              (jnp.bfloat16, True), (jnp.bfloat16, False)]:
            slow = dtype == jnp.bfloat16 and (not causal or platform == "tpu")
            name = f"{impl_id}-{jnp.dtype(dtype).name}-{'causal' if causal else 'full'}"
            yield pytest.param(backend, platform, causal, dtype, id=name,
                               marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("backend,platform,causal,dtype", list(_cases()))
def test_values_and_gradients_match_reference(backend, platform, causal, dtype):
    # 3 heads, L = 40 (two and a half 16-chunks), key dim 8 and value dim 12 (both padded
    # for Triton).
    q, k, v, g = _inputs(1, (2, 3, 40, 8), 12, dtype)
    fn = functools.partial(la.linear_attention, causal=causal, backend=backend,
                           platform=platform, chunk_size=16, interpret=_interpret(platform))
    out, grads = _value_and_grads(fn, q, k, v, g)
    ref_fn = functools.partial(reference.linear_attention_quadratic, causal=causal)
    ref_out, ref_grads = _value_and_grads(ref_fn, *(x.astype(jnp.float32) for x in (q, k, v)),
                                          g)
    assert out.dtype == dtype and out.shape == v.shape
    _assert_close(out, ref_out, dtype, "out")
    for name, grad, ref_grad, x in zip("qkv", grads, ref_grads, (q, k, v)):
        assert grad.dtype == x.dtype
        _assert_close(grad, ref_grad, dtype, f"d{name}")


def test_one_position():
    """L = 1: one real row in a padded chunk (Triton flavour, causal)."""
    q, k, v, g = _inputs(2, (1, 2, 1, 4), 4, jnp.float32)
    fn = functools.partial(la.linear_attention, causal=True, chunk_size=16, platform="gpu")
    out, grads = _value_and_grads(fn, q, k, v, g)
    ref_out, ref_grads = _value_and_grads(
        functools.partial(reference.linear_attention_quadratic, causal=True), q, k, v, g)
    _assert_close(out, ref_out, jnp.float32, "out")
    for grad, ref_grad in zip(grads, ref_grads):
        _assert_close(grad, ref_grad, jnp.float32, "grad")


# By default each flavour's trickiest write path: Triton's causal loop (the same loop writes
# non-causal outputs) and Mosaic's two-phase non-causal grid (causal maps step c to block c).
@pytest.mark.parametrize("platform,causal", [
    ("gpu", True), pytest.param("gpu", False, marks=pytest.mark.slow),
    pytest.param("tpu", True, marks=pytest.mark.slow), ("tpu", False)],
    ids=["triton-causal", "triton-full", "mosaic-causal", "mosaic-full"])
def test_every_output_block_is_written(platform, causal):
    """Outputs alias NaN-filled buffers: any grid step or chunk left unwritten shows up."""
    q, k, v, g = _inputs(3, (2, 2, 32, 8), 16, jnp.float32)
    cfg = la.make_config(q, causal=causal, chunk_size=16, platform=platform,
                         interpret=_interpret(platform))
    length, key_dim = la._padded_sizes(q, cfg)
    value_dim = la._padded_sizes(v, cfg)[1]

    def nan(dim):
        return jnp.full(q.shape[:2] + (length, dim), jnp.nan, jnp.float32)

    out = jax.jit(la._forward, static_argnums=3)(q, k, v, cfg, (nan(value_dim),))
    dq, dk, dv = jax.jit(la._backward, static_argnums=5)(
        q, k, v, out, g, cfg, (nan(key_dim), nan(value_dim), nan(key_dim), nan(value_dim)))
    ref_fn = functools.partial(reference.linear_attention_quadratic, causal=causal)
    ref_out, ref_grads = _value_and_grads(ref_fn, q, k, v, g)
    _assert_close(out, ref_out, jnp.float32, "out")
    for name, grad, ref_grad in zip("qkv", (dq, dk, dv), ref_grads):
        _assert_close(grad, ref_grad, jnp.float32, f"d{name}")


@pytest.mark.slow
@pytest.mark.skipif(jax.default_backend() == "cpu", reason="the interpreter takes minutes")
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_compiled_kernels_at_benchmark_shape(causal, dtype):
    """Default chunk size, D = 64, L = 4000 (not a multiple of the chunk): on a device."""
    q, k, v, g = _inputs(4, (2, 4, 4000, 64), 64, dtype)
    fn = functools.partial(la.linear_attention, causal=causal)
    out, grads = _value_and_grads(fn, q, k, v, g)
    ref_fn = functools.partial(reference.linear_attention_cumsum, causal=causal)
    ref_out, ref_grads = _value_and_grads(ref_fn, *(x.astype(jnp.float32) for x in (q, k, v)),
                                          g)
    _assert_close(out, ref_out, dtype, "out")
    for name, grad, ref_grad in zip("qkv", grads, ref_grads):
        _assert_close(grad, ref_grad, dtype, f"d{name}")


def _forward_and_backward(causal, platform):
    def fn(q, k, v, g):
        out, vjp = jax.vjp(functools.partial(
            la.linear_attention, causal=causal, platform=platform, interpret=False), q, k, v)
        return out, vjp(g)
    return fn


def _lowering_args(dtype):
    q = jax.ShapeDtypeStruct((2, 4, 300, 64), dtype)
    v = jax.ShapeDtypeStruct((2, 4, 300, 32), dtype)
    return q, q, v, v


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_triton_kernels_lower_for_cuda(causal, dtype):
    text = lowering.for_cuda(_forward_and_backward(causal, "gpu"), *_lowering_args(dtype))
    # forward, backward-dq, backward-dkv: three Triton calls.
    assert text.count(lowering.TRITON) == 3, text[:2000]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_mosaic_kernels_export_for_tpu(causal, dtype):
    text = lowering.for_tpu(_forward_and_backward(causal, "tpu"), *_lowering_args(dtype))
    assert text.count(lowering.MOSAIC_TPU) == 3


def _default_forward_and_backward(q, k, v, g):
    """The defaults, as the models call it: the form follows the lowering platform."""
    out, vjp = jax.vjp(functools.partial(la.linear_attention, causal=True), q, k, v)
    return out, vjp(g)


def test_default_form_follows_the_lowering_platform():
    """Traced on this CPU: Triton when lowered for CUDA, Mosaic when exported for TPU,
    nothing but the interpreter's plain HLO when lowered for the CPU."""
    args = _lowering_args(jnp.float32)
    cuda = lowering.custom_calls(lowering.for_cuda(_default_forward_and_backward, *args))
    assert cuda.count(lowering.TRITON) == 3 and lowering.MOSAIC_TPU not in cuda, cuda
    tpu = lowering.custom_calls(lowering.for_tpu(_default_forward_and_backward, *args))
    assert tpu.count(lowering.MOSAIC_TPU) == 3 and lowering.TRITON not in tpu, tpu
    cpu = jax.jit(_default_forward_and_backward).trace(*args).lower(
        lowering_platforms=("cpu",)).as_text()  # for the CPU on any machine
    assert lowering.TRITON not in cpu and lowering.MOSAIC_TPU not in cpu


def test_gpu_without_triton_falls_back_to_the_xla_path(monkeypatch, capsys):
    """A JAX without Pallas's Triton backend (deprecated since 0.11): on a GPU the XLA
    path, said in one line; the CPU keeps the interpreted kernel."""
    monkeypatch.setattr(targets, "gpu_backend", lambda: None)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(targets, "_SAID", set())
    fresh = lambda *args: _default_forward_and_backward(*args)  # noqa: E731 (no trace cache)
    assert lowering.custom_calls(lowering.for_cuda(fresh, *_lowering_args(jnp.float32))) == []
    line = capsys.readouterr().err.strip()
    assert line.count("\n") == 0 and "no Triton backend" in line and "XLA path" in line


def test_bad_arguments_raise():
    q = jnp.ones((1, 1, 8, 4))
    with pytest.raises(ValueError, match="backend"):
        la.linear_attention(q, q, q, causal=True, backend="cuda")
    with pytest.raises(ValueError, match="power of two"):
        la.linear_attention(q, q, q, causal=True, platform="gpu", chunk_size=24)

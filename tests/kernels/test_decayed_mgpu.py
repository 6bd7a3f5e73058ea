"""Decayed linear attention with a scalar decay (retnet, mamba2) or a gate per key feature
(gla) as Mosaic GPU kernels (models/kernels/decayed_mgpu.py), checked on this CPU: the
three passes in the Mosaic GPU interpreter (race detection on) against the Triton passes,
with gradients (d log a included), through configs/listops.py
(`model=retnet|gla,attention_impl=pallas_mosaic`), the gate's float16 fallback, and the
bf16 training step lowered for sm_90. Needs JAX's Mosaic GPU interpreter (0.12: CI's
newest-JAX stage). Nothing here runs on a GPU."""
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.kernels import decayed_mgpu, mgpu_common
from tests.kernels import lowering
from tests.kernels.interpreters import (assert_pallas_mosaic_equals_pallas, gpu_races_found,
                                        mosaic_calls_in_train_step, needs_mgpu,
                                        reset_gpu_interpreter)

da = importlib.import_module("models.kernels.decayed_attention")


@pytest.fixture(autouse=True)
def _fresh():
    reset_gpu_interpreter()
    yield


_races_found = gpu_races_found


def _inputs(length, gates=1, seed=0, dtype="bfloat16"):
    ks = jax.random.split(jax.random.key(seed), 5)
    q, k, v, g = (jax.random.normal(kk, (2, 2, length, 64)).astype(dtype) for kk in ks[:4])
    log_a = jax.nn.log_sigmoid(3 * jax.random.normal(ks[4], (2, 2, length, gates)))
    return q, k, v, log_a, g


@needs_mgpu
@pytest.mark.parametrize("strict", [False, True], ids=["inclusive", "strict"])
def test_passes_in_the_interpreter_equal_the_triton_passes(strict):
    """Forward, dq and dk/dv on padded rows (L 150, decays from ~1 to ~e^-10) against the
    Triton passes on the same inputs; no races."""
    q, k, v, log_a, g = _inputs(150)
    cfg = da.make_config(q, k, v, log_a, strict=strict, chunk_size=64, platform="gpu",
                         interpret=True)
    got = (da._forward(q, k, v, log_a, cfg._replace(gpu_form="mosaic")),
           *da._backward(q, k, v, log_a, g, cfg._replace(gpu_form="mosaic")))
    assert not _races_found()
    ref = (da._forward(q, k, v, log_a, cfg), *da._backward(q, k, v, log_a, g, cfg))
    for name, a, r in zip(["o", "dq", "dk", "dv", "dlog_a"], got, ref):
        assert a.shape == r.shape and a.dtype == r.dtype, name
        a, r = np.asarray(a, np.float32), np.asarray(r, np.float32)
        assert np.max(np.abs(a - r)) <= 1e-3 * np.max(np.abs(r)), name


@needs_mgpu
@pytest.mark.parametrize("strict", [False, True], ids=["inclusive", "strict"])
def test_gate_passes_in_the_interpreter_equal_the_triton_passes(strict):
    """A gate per key feature (gla), keys and values 64 and 128 wide, L 150 padded, gates
    from ~1 to ~e^-10 a position: o and dv within one bfloat16 rounding of the Triton
    passes (their scores are rounded to bf16 before the matmul in both), dq, dk and
    d log a (float32, the split products' 16 bits of mantissa) within 2e-4; no races.
    Measured when written: o 1.8e-3, dv 3.7e-3 (one bf16 ulp), dq 4.5e-5, dk 1.0e-5,
    d log a 3.2e-5 of each output's largest entry."""
    ks = jax.random.split(jax.random.key(3), 6)
    q, k = (jax.random.normal(kk, (1, 2, 150, 128)).astype("bfloat16") for kk in ks[:2])
    v, g = (jax.random.normal(kk, (1, 2, 150, 64)).astype("bfloat16") for kk in ks[2:4])
    log_a = jax.nn.log_sigmoid(3 * jax.random.normal(ks[4], (1, 2, 150, 128)))
    cfg = da.make_config(q, k, v, log_a, strict=strict, chunk_size=64, platform="gpu",
                         interpret=True)
    got = (da._forward(q, k, v, log_a, cfg._replace(gpu_form="mosaic")),
           *da._backward(q, k, v, log_a, g, cfg._replace(gpu_form="mosaic")))
    assert not _races_found()
    ref = (da._forward(q, k, v, log_a, cfg), *da._backward(q, k, v, log_a, g, cfg))
    for name, a, r, tol in zip(["o", "dq", "dk", "dv", "dlog_a"], got, ref,
                               [8e-3, 2e-4, 2e-4, 8e-3, 2e-4]):
        assert a.shape == r.shape and a.dtype == r.dtype, name
        a, r = np.asarray(a, np.float32), np.asarray(r, np.float32)
        assert np.max(np.abs(a - r)) <= tol * np.max(np.abs(r)), name


def test_gpu_form_mosaic_with_gradients_and_the_gate_fallback(capfd):
    """Through `decayed_linear_attention`: equal to the Triton form with gradients of all
    four inputs, for a scalar decay and for a gate; a float16 gate keeps the Triton form
    and says why (under a JAX without the Mosaic GPU interpreter, all are the fallback)."""
    q, k, v, log_a, g = _inputs(100, seed=1)
    gate = _inputs(100, gates=64, seed=2)[3]

    def run(form, log_a, dtype="bfloat16"):
        xs = [x.astype(dtype) for x in (q, k, v)]
        out, vjp = jax.vjp(lambda *xs: da.decayed_linear_attention(
            *xs, backend="pallas", chunk_size=64, gpu_form=form), *xs, log_a)
        return (out, *vjp(g.astype(dtype)))

    with mgpu_common.interpreted():
        ref, got = run("triton", log_a), run("mosaic", log_a)
        gate_ref, gate_got = run("triton", gate), run("mosaic", gate)
        np.testing.assert_array_equal(run("mosaic", gate, "float16")[0],
                                      run("triton", gate, "float16")[0])
    err = capfd.readouterr().err
    if mgpu_common.available():
        assert "decayed attention: Mosaic GPU kernels (interpreted)" in err
        assert "a diagonal gate's split scores need bfloat16's exponent range" in err
    for a, b in zip(ref + gate_ref, got + gate_got):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.max(np.abs(a - b)) <= 1e-2 * np.max(np.abs(a))
    with pytest.raises(ValueError, match="gpu_form must be one of triton, mosaic"):
        da.decayed_linear_attention(q, k, v, log_a, gpu_form="cutlass")


@needs_mgpu
def test_pallas_mosaic_equals_pallas_through_the_task_config():
    """configs/listops.py:model=retnet,...,pretrain,causal in bfloat16: the loss and every
    gradient under attention_impl=pallas_mosaic against attention_impl=pallas."""
    assert_pallas_mosaic_equals_pallas("model=retnet,runlocal,pretrain,causal", head_dim=64)


@needs_mgpu
def test_train_step_lowered_for_cuda_holds_the_mosaic_gpu_kernels():
    """The bf16 training step of configs/listops.py:model=retnet,runlocal,
    attention_impl=pallas_mosaic (bidirectional: two scans a layer) lowered for sm_90:
    three Mosaic GPU calls per scan, no Triton call."""
    mosaic, triton, layers = mosaic_calls_in_train_step("model=retnet,runlocal,attention_impl=pallas_mosaic", head_dim=64)
    assert (mosaic, triton) == (2 * 3 * layers, 0)
    assert decayed_mgpu.supports(jnp.bfloat16, 64, 64, False) is None


@needs_mgpu
def test_gla_pallas_mosaic_equals_pallas_through_the_task_config():
    """configs/listops.py:model=gla,...,pretrain,causal in bfloat16 (a gate per key feature;
    128 features a head: GLA's keys are half as wide, 64): the loss and every gradient
    under attention_impl=pallas_mosaic against pallas."""
    assert_pallas_mosaic_equals_pallas("model=gla,runlocal,pretrain,causal", head_dim=128)


@needs_mgpu
def test_gla_train_step_lowered_for_cuda_holds_the_mosaic_gpu_kernels():
    """The bf16 training step of configs/listops.py:model=gla,runlocal,pretrain,causal,
    attention_impl=pallas_mosaic lowered for sm_90: three Mosaic GPU calls a layer (the
    forward, dq, dk/dv), no Triton call."""
    mosaic, triton, layers = mosaic_calls_in_train_step(
        "model=gla,runlocal,pretrain,causal,attention_impl=pallas_mosaic", head_dim=128)
    assert (mosaic, triton) == (3 * layers, 0)
    assert decayed_mgpu.supports(jnp.bfloat16, 64, 64, True) is None


@needs_mgpu
@pytest.mark.parametrize("strict", [False, True], ids=["inclusive", "strict"])
def test_each_pass_lowers_for_sm90(strict):
    """Mosaic GPU's layout inference runs at lowering, not in the interpreter: every pass
    lowered for an abstract H100, one Mosaic GPU call each."""
    q = jax.ShapeDtypeStruct((1, 2, 128, 64), jnp.bfloat16)
    la = jax.ShapeDtypeStruct((1, 2, 128), jnp.float32)
    for fn, calls in ((lambda q, la: decayed_mgpu.forward(q, q, q, la, strict=strict), 1),
                      (lambda q, la: decayed_mgpu.backward(q, q, q, la, q, strict=strict), 2)):
        found = lowering.custom_calls(lowering.for_cuda(fn, q, la))
        assert sum(c.startswith(lowering.MOSAIC_GPU) for c in found) == calls, found
    b = jax.ShapeDtypeStruct((1, 2, 128, 64), jnp.float32)  # a gate's chunk sums
    for fn, calls in ((lambda q, b: decayed_mgpu.gate_forward(q, q, q, b, strict=strict), 1),
                      (lambda q, b: decayed_mgpu.gate_backward(q, q, q, b, q, strict=strict),
                       2)):
        found = lowering.custom_calls(lowering.for_cuda(fn, q, b))
        assert sum(c.startswith(lowering.MOSAIC_GPU) for c in found) == calls, found
